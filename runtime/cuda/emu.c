/* emu.c — cuda-emu's driver (see emu.h): device memory in host memory,
 * copies and memsets checked against the live allocations, the device,
 * context and error calls, and the tables tf_cuda_emu_load fills. The
 * rest of the driver: emu_stream.c (streams, events and graphs: when
 * queued work runs), emu_nvrtc.c (NVRTC's stand-in; modules compiled from
 * their CUDA C with the host C++ compiler against emu_prelude.cuh) and
 * emu_launch.c (launches, run thread by thread); emu_internal.h is what
 * they share. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "emu.h"
#include "emu_internal.h"
#include "env.h"

/* ---- state ------------------------------------------------------------------ */

typedef struct emu_alloc { unsigned char *p; size_t n; bool host; } emu_alloc;

pthread_mutex_t tf_emu_mu = PTHREAD_MUTEX_INITIALIZER;   /* the state below, and what emu_internal.h says */
static emu_alloc *g_allocs;
static int g_nallocs, g_cap_allocs;
static size_t g_used;
_Thread_local char tf_emu_msg[2048];   /* the last failure's words, for cuGetErrorString */

/* ---- device memory ------------------------------------------------------------ */

static size_t capacity(void)
{
    const char *v = tf_env("TFUSE_EMU_MEMORY");
    if (v && *v) return (size_t)strtoull(v, NULL, 10);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)16 << 30;
}

/* The allocation holding [p, p + n), or NULL (tf_emu_mu held). */
static emu_alloc *holding(const void *p, size_t n)
{
    const unsigned char *q = p;
    for (int i = 0; i < g_nallocs; i++)
        if (q >= g_allocs[i].p && q + n <= g_allocs[i].p + g_allocs[i].n && q + n >= q) return &g_allocs[i];
    return NULL;
}

static int do_alloc(void **out, size_t n, bool host)
{
    if (!out || !n) return fail(INVALID_VALUE, "an allocation of 0 bytes");
    pthread_mutex_lock(&tf_emu_mu);
    int r = OK;
    if (!host && g_used + n > capacity()) r = fail(OUT_OF_MEMORY, "cuda-emu's device holds %zu bytes (TFUSE_EMU_MEMORY)", capacity());
    if (!r && g_nallocs == g_cap_allocs) {
        int cap = g_cap_allocs ? 2 * g_cap_allocs : 64;
        emu_alloc *a = tf_realloc(g_allocs, (size_t)cap * sizeof *a);
        if (!a) r = fail(OUT_OF_MEMORY, "out of host memory");
        else g_allocs = a, g_cap_allocs = cap;
    }
    void *p = NULL;
    if (!r && !(p = tf_malloc_aligned(256, (n + 255) / 256 * 256))) r = fail(OUT_OF_MEMORY, "out of host memory for %zu bytes", n);
    if (!r) {
        memset(p, 0xa5, n);   /* garbage, as fresh device memory holds */
        g_allocs[g_nallocs++] = (emu_alloc){p, n, host};
        if (!host) g_used += n;
        *out = p;
    }
    pthread_mutex_unlock(&tf_emu_mu);
    return r;
}

static int do_free(void *p, bool host)
{
    tf_emu_flush_all();   /* a GPU finishes the work that may still use it */
    pthread_mutex_lock(&tf_emu_mu);
    int r = fail(INVALID_VALUE, "freeing %p, which is not a live %s allocation", p, host ? "pinned host" : "device");
    for (int i = 0; i < g_nallocs; i++)
        if (g_allocs[i].p == p && g_allocs[i].host == host) {
            if (!host) g_used -= g_allocs[i].n;
            g_allocs[i] = g_allocs[--g_nallocs];
            tf_free_aligned(p);
            r = OK;
            break;
        }
    pthread_mutex_unlock(&tf_emu_mu);
    return r;
}

/* Every byte of [p, p + n) inside one live allocation (device, or pinned host when host_ok). */
static int check_range(const void *p, size_t n, bool host_ok, const char *what)
{
    if (!n) return OK;
    pthread_mutex_lock(&tf_emu_mu);
    emu_alloc *a = holding(p, n);
    int r = a && (host_ok || !a->host) ? OK
                                       : fail(INVALID_VALUE, "%s: %zu bytes at %p are not inside one live device allocation", what, n, p);
    pthread_mutex_unlock(&tf_emu_mu);
    return r;
}

/* ---- copies -------------------------------------------------------------------------- */

typedef struct copy_arg { void *dst; const void *src; size_t n; int value; bool set; } copy_arg;

static int run_copy(void *argp)
{
    copy_arg *c = argp;
    if (c->set) memset(c->dst, c->value, c->n);
    else memmove(c->dst, c->src, c->n);
    return OK;
}

static tf_cu_result copy_on(tf_cu_stream s, void *dst, const void *src, size_t n, bool dst_dev, bool src_dev, const char *what)
{
    int r = OK;
    if (!s && tf_emu_capturing()) return fail(STREAM_CAPTURE_UNSUPPORTED, "%s: a synchronous copy while a stream captures a graph", what);
    if (dst_dev && (r = check_range(dst, n, false, what))) return r;
    if (src_dev && (r = check_range(src, n, false, what))) return r;
    if (!n) return OK;
    copy_arg c = {dst, src, n, 0, false};
    return tf_cuda_emu_submit(s, run_copy, &c, sizeof c);
}

static tf_cu_result emu_memcpy_htod(tf_cu_deviceptr d, const void *h, size_t n)
{
    return copy_on(NULL, (void *)(uintptr_t)d, h, n, true, false, "cuMemcpyHtoD");
}
static tf_cu_result emu_memcpy_dtoh(void *h, tf_cu_deviceptr d, size_t n)
{
    return copy_on(NULL, h, (const void *)(uintptr_t)d, n, false, true, "cuMemcpyDtoH");
}
static tf_cu_result emu_memcpy_htod_async(tf_cu_deviceptr d, const void *h, size_t n, tf_cu_stream s)
{
    return copy_on(s, (void *)(uintptr_t)d, h, n, true, false, "cuMemcpyHtoDAsync");
}
static tf_cu_result emu_memcpy_dtoh_async(void *h, tf_cu_deviceptr d, size_t n, tf_cu_stream s)
{
    return copy_on(s, h, (const void *)(uintptr_t)d, n, false, true, "cuMemcpyDtoHAsync");
}
static tf_cu_result emu_memcpy_dtod_async(tf_cu_deviceptr d, tf_cu_deviceptr src, size_t n, tf_cu_stream s)
{
    return copy_on(s, (void *)(uintptr_t)d, (const void *)(uintptr_t)src, n, true, true, "cuMemcpyDtoDAsync");
}
static tf_cu_result emu_memset_async(tf_cu_deviceptr d, unsigned char v, size_t n, tf_cu_stream s)
{
    int r = check_range((void *)(uintptr_t)d, n, false, "cuMemsetD8Async");
    if (r || !n) return r;
    copy_arg c = {(void *)(uintptr_t)d, NULL, n, v, true};
    return tf_cuda_emu_submit(s, run_copy, &c, sizeof c);
}

/* ---- the driver's other calls ------------------------------------------------------------ */

static tf_cu_result emu_init(unsigned flags) { return flags ? fail(INVALID_VALUE, "cuInit takes flags 0") : OK; }
static tf_cu_result emu_driver_version(int *v) { *v = 13000; return OK; }

static const char *code_name(int r)
{
    switch (r) {
    case OK: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case NOT_READY: return "CUDA_ERROR_NOT_READY";
    case ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case STREAM_CAPTURE_INVALIDATED: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case STREAM_CAPTURE_ISOLATION: return "CUDA_ERROR_STREAM_CAPTURE_ISOLATION";
    default: return "CUDA_ERROR_UNKNOWN";
    }
}
static tf_cu_result emu_error_name(tf_cu_result r, const char **s) { *s = code_name(r); return OK; }
static tf_cu_result emu_error_string(tf_cu_result r, const char **s)
{
    *s = r && tf_emu_msg[0] ? tf_emu_msg : code_name(r);
    return OK;
}
static tf_cu_result emu_device_count(int *n) { *n = 1; return OK; }
static tf_cu_result emu_device_get(tf_cu_device *d, int i) { *d = 0; return i == 0 ? OK : fail(INVALID_VALUE, "cuda-emu has one device"); }
static tf_cu_result emu_device_name(char *name, int len, tf_cu_device d)
{
    (void)d;
    if (len > 0) snprintf(name, (size_t)len, "cuda-emu (the host CPU)");
    return OK;
}
static tf_cu_result emu_device_attr(int *v, int attr, tf_cu_device d)
{
    (void)d;
    switch (attr) {
    case 1: *v = MAX_THREADS; break;           /* MAX_THREADS_PER_BLOCK */
    case 2: *v = MAX_THREADS; break;           /* MAX_BLOCK_DIM_X */
    case 5: *v = 0x7fffffff; break;            /* MAX_GRID_DIM_X */
    case 8: *v = STATIC_SMEM; break;           /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: *v = 32; break;                   /* WARP_SIZE */
    case 16: *v = SMS; break;                  /* MULTIPROCESSOR_COUNT */
    case 75: *v = 9; break;                    /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = 0; break;                    /* MINOR */
    case 97: *v = SMEM_OPTIN; break;           /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default: *v = 0; break;
    }
    return OK;
}
static tf_cu_result emu_total_mem(size_t *b, tf_cu_device d) { (void)d; *b = capacity(); return OK; }
static int g_ctx_token;
static tf_cu_result emu_ctx_retain(tf_cu_context *c, tf_cu_device d) { (void)d; *c = (tf_cu_context)&g_ctx_token; return OK; }
static tf_cu_result emu_ctx_release(tf_cu_device d) { (void)d; return OK; }
static tf_cu_result emu_ctx_set(tf_cu_context c) { return c == (tf_cu_context)&g_ctx_token ? OK : fail(INVALID_HANDLE, "not cuda-emu's context"); }
static tf_cu_result emu_ctx_sync(void)
{
    if (tf_emu_capturing()) return fail(STREAM_CAPTURE_UNSUPPORTED, "cuCtxSynchronize while a stream captures a graph");
    tf_emu_flush_all();
    return tf_emu_settle();
}
static tf_cu_result emu_mem_info(size_t *f, size_t *t)
{
    pthread_mutex_lock(&tf_emu_mu);
    *t = capacity();
    *f = g_used < *t ? *t - g_used : 0;
    pthread_mutex_unlock(&tf_emu_mu);
    return OK;
}
static tf_cu_result emu_mem_alloc(tf_cu_deviceptr *p, size_t n)
{
    void *q = NULL;
    int r = do_alloc(&q, n, false);
    *p = (tf_cu_deviceptr)(uintptr_t)q;
    return r;
}
static tf_cu_result emu_mem_free(tf_cu_deviceptr p) { return do_free((void *)(uintptr_t)p, false); }
static tf_cu_result emu_host_alloc(void **p, size_t n) { return do_alloc(p, n, true); }
static tf_cu_result emu_host_free(void *p) { return do_free(p, true); }

/* ---- filling the tables ------------------------------------------------------------------------ */

void tf_cuda_emu_lt_fill(tf_cublaslt_api *api);

void tf_cuda_emu_load(tf_cuda_libs *l, unsigned which)
{
    static const char where[] = "cuda-emu (stand-in on the host, built into libtfuse)";
    if (which & TF_CUDA_LIB_NVRTC) {
        tf_emu_nvrtc_fill(&l->nvrtc);
        l->nvrtc_major = 0, l->nvrtc_minor = 1;
        l->archs[0] = 90, l->narchs = 1;
        snprintf(l->nvrtc_path, sizeof l->nvrtc_path, "%s", where);
        l->loaded |= TF_CUDA_LIB_NVRTC;
    }
    if (which & TF_CUDA_LIB_DRIVER) {
        tf_cu_api *c = &l->cu;
        memset(c, 0, sizeof *c);
        c->Init = emu_init, c->DriverGetVersion = emu_driver_version, c->GetErrorName = emu_error_name;
        c->GetErrorString = emu_error_string, c->DeviceGetCount = emu_device_count, c->DeviceGet = emu_device_get;
        c->DeviceGetName = emu_device_name, c->DeviceGetAttribute = emu_device_attr, c->DeviceTotalMem = emu_total_mem;
        c->DevicePrimaryCtxRetain = emu_ctx_retain, c->DevicePrimaryCtxRelease = emu_ctx_release;
        c->CtxSetCurrent = emu_ctx_set, c->CtxSynchronize = emu_ctx_sync, c->MemGetInfo = emu_mem_info;
        c->MemAlloc = emu_mem_alloc, c->MemFree = emu_mem_free, c->MemcpyHtoD = emu_memcpy_htod, c->MemcpyDtoH = emu_memcpy_dtoh;
        c->MemcpyHtoDAsync = emu_memcpy_htod_async, c->MemcpyDtoHAsync = emu_memcpy_dtoh_async;
        c->MemcpyDtoDAsync = emu_memcpy_dtod_async, c->MemsetD8Async = emu_memset_async;
        c->MemAllocHost = emu_host_alloc, c->MemFreeHost = emu_host_free;
        tf_emu_stream_fill(c);   /* streams, events and graphs (emu_stream.c) */
        tf_emu_module_fill(c);   /* modules (emu_nvrtc.c) */
        tf_emu_launch_fill(c);   /* launches (emu_launch.c) */
        l->driver_version = 13000;
        snprintf(l->driver_path, sizeof l->driver_path, "%s", where);
        l->loaded |= TF_CUDA_LIB_DRIVER;
    }
    if (which & TF_CUDA_LIB_CUBLASLT) {
        tf_cuda_emu_lt_fill(&l->lt);
        l->cublaslt_version = l->lt.GetVersion();
        snprintf(l->cublaslt_path, sizeof l->cublaslt_path, "%s", where);
        l->loaded |= TF_CUDA_LIB_CUBLASLT;
    }
    if (which & TF_CUDA_LIB_NCCL) {
        tf_cuda_emu_nccl_fill(&l->nccl);
        l->nccl_version = 0;
        snprintf(l->nccl_path, sizeof l->nccl_path, "%s", where);
        l->loaded |= TF_CUDA_LIB_NCCL;
    }
    if (which & TF_CUDA_LIB_CUDNN) {
        tf_cuda_emu_dnn_fill(&l->dnn);
        l->cudnn_version = l->dnn.GetVersion();
        snprintf(l->cudnn_path, sizeof l->cudnn_path, "%s", where);
        l->loaded |= TF_CUDA_LIB_CUDNN;
    }
}

int tf_cuda_emu_live(void)
{
    pthread_mutex_lock(&tf_emu_mu);
    int n = g_nallocs + tf_emu_live_modules() + tf_emu_live_queues();
    pthread_mutex_unlock(&tf_emu_mu);
    return n;
}
