/* fake_libcuda.c — a stand-in for libcuda.so.1 on machines without a GPU,
 * for test_cuda_host.c: "device" memory is host memory, so everything the
 * cuda target does around its kernels (placing values, copies, the host
 * fallback, updates, outputs, state, events, the cubin cache and module
 * loading) runs and can be checked against the interpreter. It runs no
 * kernel: cuLaunchKernel fails with CUDA_ERROR_NOT_SUPPORTED, so the test
 * runs the sessions with TFUSE_CUDA_FALLBACK=all.
 *
 * It is strict where a real driver would fault or leak: every copy and
 * memset must lie inside one live allocation (else CUDA_ERROR_INVALID_VALUE,
 * and fake_cuda_errors() counts it), cuModuleLoadData takes only ELF
 * images, cuModuleGetFunction finds only names the image contains, and
 * fake_cuda_live() says how many allocations, modules, streams and events
 * are still alive. FAKE_CUDA_MEMORY (bytes, default 1 GiB) is the device's
 * size, for out-of-memory tests.
 *
 * Built as a shared library named libcuda.so.1 in a directory the test puts
 * first in TFUSE_CUDA_LIBS, and with no SONAME: NVRTC and cuBLASLt dlopen
 * "libcuda.so.1" themselves, and would be handed this one if it carried
 * that soname (NVRTC then crashes calling what it lacks). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_IMAGE = 200, NOT_FOUND = 500, NOT_SUPPORTED = 801,
};

typedef struct block { unsigned char *p; size_t n; bool host; } block;
static block g_blocks[4096];
static int g_nblocks, g_modules, g_streams, g_events, g_errors, g_launches;
static size_t g_used;
static int g_ctx_refs;

static size_t capacity(void)
{
    const char *v = getenv("FAKE_CUDA_MEMORY");
    return v && *v ? (size_t)strtoull(v, NULL, 10) : (size_t)1 << 30;
}

static CUresult bad(void)
{
    g_errors++;
    return INVALID_VALUE;
}

/* The allocation holding [p, p + n), or NULL. */
static block *holding(const void *p, size_t n)
{
    const unsigned char *q = p;
    for (int i = 0; i < g_nblocks; i++)
        if (q >= g_blocks[i].p && q + n <= g_blocks[i].p + g_blocks[i].n) return &g_blocks[i];
    return NULL;
}

static CUresult alloc(void **out, size_t n, bool host)
{
    if (!out || !n) return bad();
    if (!host && g_used + n > capacity()) return OUT_OF_MEMORY;
    if (g_nblocks == (int)(sizeof g_blocks / sizeof *g_blocks)) return OUT_OF_MEMORY;
    void *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!p) return OUT_OF_MEMORY;
    memset(p, 0xa5, n);   /* garbage, as real memory is */
    g_blocks[g_nblocks++] = (block){p, n, host};
    if (!host) g_used += n;
    *out = p;
    return OK;
}

static CUresult release(void *p, bool host)
{
    for (int i = 0; i < g_nblocks; i++)
        if (g_blocks[i].p == p && g_blocks[i].host == host) {
            if (!host) g_used -= g_blocks[i].n;
            free(p);
            g_blocks[i] = g_blocks[--g_nblocks];
            return OK;
        }
    return bad();
}

/* the test's view */
int fake_cuda_live(void) { return g_nblocks + g_modules + g_streams + g_events + g_ctx_refs; }
int fake_cuda_errors(void) { return g_errors; }
int fake_cuda_launches(void) { return g_launches; }

CUresult cuInit(unsigned flags) { return flags ? bad() : OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuGetErrorName(CUresult r, const char **s)
{
    *s = r == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : r == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
       : r == INVALID_IMAGE ? "CUDA_ERROR_INVALID_IMAGE" : r == NOT_FOUND ? "CUDA_ERROR_NOT_FOUND"
       : r == NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED" : "CUDA_ERROR_UNKNOWN";
    return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == NOT_SUPPORTED ? "the fake driver runs no kernels" : "fake driver error";
    return OK;
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int i) { if (i) return bad(); *d = 0; return OK; }
CUresult cuDeviceGetName(char *name, int len, int d) { (void)d; snprintf(name, (size_t)len, "Fake GPU"); return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d)
{
    (void)d;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 4 : attr == 97 ? 232448 : 0;
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = capacity(); return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; *ctx = (void *)&g_ctx_refs; g_ctx_refs++; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; if (!g_ctx_refs) return bad(); g_ctx_refs--; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == (void *)&g_ctx_refs ? OK : bad(); }
CUresult cuCtxSynchronize(void) { return OK; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *t = capacity(); *f = capacity() - g_used; return OK; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    void *q = NULL;
    CUresult r = alloc(&q, n, false);
    *p = (CUdeviceptr)(uintptr_t)q;
    return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return release((void *)(uintptr_t)p, false); }
CUresult cuMemAllocHost_v2(void **p, size_t n) { return alloc(p, n, true); }
CUresult cuMemFreeHost(void *p) { return release(p, true); }

static CUresult copy(void *dst, const void *src, size_t n, bool dst_dev, bool src_dev)
{
    if ((dst_dev && !holding(dst, n)) || (src_dev && !holding(src, n))) return bad();
    memmove(dst, src, n);
    return OK;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return copy((void *)(uintptr_t)d, s, n, true, false); }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return copy(d, (const void *)(uintptr_t)s, n, false, true); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { (void)st; return cuMemcpyHtoD_v2(d, s, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoH_v2(d, s, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st)
{
    (void)st;
    return copy((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, true, true);
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *st)
{
    (void)st;
    if (!holding((void *)(uintptr_t)d, n)) return bad();
    memset((void *)(uintptr_t)d, v, n);
    return OK;
}
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = (void *)&g_streams; g_streams++; return OK; }
CUresult cuStreamDestroy_v2(void *s) { if (s != &g_streams || !g_streams) return bad(); g_streams--; return OK; }
CUresult cuStreamSynchronize(void *s) { return s == &g_streams ? OK : bad(); }

typedef struct module { unsigned char *image; size_t n; } module;
CUresult cuModuleLoadData(void **m, const void *image)
{
    if (memcmp(image, "\x7f" "ELF", 4)) return INVALID_IMAGE;
    /* an ELF64 image's size: section headers end it (e_shoff + e_shnum * e_shentsize) */
    const unsigned char *e = image;
    uint64_t shoff;
    uint16_t shentsize, shnum;
    memcpy(&shoff, e + 0x28, 8);
    memcpy(&shentsize, e + 0x3a, 2);
    memcpy(&shnum, e + 0x3c, 2);
    module *mod = malloc(sizeof *mod);
    mod->n = shoff + (uint64_t)shentsize * shnum;
    mod->image = malloc(mod->n);
    memcpy(mod->image, image, mod->n);
    *m = mod;
    g_modules++;
    return OK;
}
CUresult cuModuleUnload(void *m)
{
    module *mod = m;
    if (!mod || !g_modules) return bad();
    free(mod->image);
    free(mod);
    g_modules--;
    return OK;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
    module *mod = m;
    if (!memmem(mod->image, mod->n, name, strlen(name) + 1)) return NOT_FOUND;
    *f = mod;
    return OK;
}
CUresult cuFuncSetAttribute(void *f, int attr, int v) { (void)f; (void)attr; return v < 0 ? bad() : OK; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem,
                        void *s, void **params, void **extra)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)s, (void)params, (void)extra;
    g_launches++;
    return NOT_SUPPORTED;
}
CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = malloc(8); g_events++; return OK; }
CUresult cuEventDestroy_v2(void *e) { if (!g_events) return bad(); free(e); g_events--; return OK; }
CUresult cuEventRecord(void *e, void *s) { (void)s; return e ? OK : bad(); }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = a && b ? 0.001f : 0; return a && b ? OK : bad(); }
/* everything runs at once: an event is always complete, a wait never waits */
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) { return s == &g_streams && e && !flags ? OK : bad(); }
CUresult cuEventSynchronize(void *e) { return e ? OK : bad(); }
CUresult cuEventQuery(void *e) { return e ? OK : bad(); }
/* graphs: the fake driver runs no kernel, so it captures nothing either */
CUresult cuStreamBeginCapture_v2(void *s, int mode) { (void)s, (void)mode; return NOT_SUPPORTED; }
CUresult cuStreamEndCapture(void *s, void **g) { (void)s; *g = NULL; return NOT_SUPPORTED; }
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) { (void)g, (void)f; *e = NULL; return NOT_SUPPORTED; }
CUresult cuGraphLaunch(void *e, void *s) { (void)e, (void)s; return NOT_SUPPORTED; }
CUresult cuGraphExecDestroy(void *e) { return e ? bad() : OK; }
CUresult cuGraphDestroy(void *g) { return g ? bad() : OK; }
