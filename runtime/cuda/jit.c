/* jit.c — emitted CUDA C to loaded functions, through the disk cache and
 * NVRTC (see cuda_jit.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_file.h"
#include "cuda_jit.h"

enum {
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,   /* cuda.h */
    STATIC_SMEM_LIMIT = 48 * 1024,                         /* dynamic shared memory above this needs the attribute */
};
static const unsigned MAX_GRID = 0x7fffffffu;              /* gridDim.x */
static const char MAGIC[8] = {'T', 'F', 'C', 'U', 'B', 'I', 'N', '1'};

/* ---- the disk cache ----------------------------------------------------------- */

typedef struct cache_header {
    char magic[8];
    uint64_t key;               /* hash of (source, arch, NVRTC version) */
    uint64_t size;              /* cubin bytes after the header */
    uint64_t sum;               /* FNV-1a 64 of those bytes */
    char name[24];              /* the kernel's entry point */
    char arch[16];
} cache_header;

static void cache_open(tf_cuda_jit *j)
{
    char dir[4096];
    if (tf_cache_subdir("cuda", dir, sizeof dir)) snprintf(j->cache_dir, sizeof j->cache_dir, "%s", dir);
}

static uint64_t cache_key(const char *src, const char *arch, const tf_cuda_libs *l)
{
    char ver[64];
    snprintf(ver, sizeof ver, "nvrtc %d.%d", l->nvrtc_major, l->nvrtc_minor);
    uint64_t h = tf_fnv1a(TF_FNV_BASIS, src, strlen(src) + 1);
    h = tf_fnv1a(h, arch, strlen(arch) + 1);
    return tf_fnv1a(h, ver, strlen(ver) + 1);
}

static void cache_path(const tf_cuda_jit *j, uint64_t key, char *out, size_t n)
{
    snprintf(out, n, "%.4000s/%016llx.cubin", j->cache_dir, (unsigned long long)key);
}

/* The cached cubin for key, or NULL. */
static void *cache_read(const tf_cuda_jit *j, uint64_t key, const char *name, const char *arch, size_t *size)
{
    if (!j->cache_dir[0]) return NULL;
    char path[4200];
    cache_path(j, key, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    cache_header h;
    void *bin = NULL;
    if (fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, MAGIC, sizeof MAGIC) && h.key == key && h.size > 0 &&
        h.size < ((uint64_t)1 << 31) && !strncmp(h.name, name, sizeof h.name) && !strncmp(h.arch, arch, sizeof h.arch) &&
        (bin = tf_malloc(h.size))) {
        int extra = 0;
        if (fread(bin, 1, h.size, f) != h.size || fread(&extra, 1, 1, f) != 0 || tf_fnv1a(TF_FNV_BASIS, bin, h.size) != h.sum) {
            tf_free(bin);
            bin = NULL;
        } else {
            *size = h.size;
        }
    }
    fclose(f);
    if (bin) tf_cache_touch(path);   /* used now: the last to be evicted (cache_file.h) */
    return bin;
}

/* Written atomically (cache_file.h): the header, then the cubin. */
static void cache_write(const tf_cuda_jit *j, uint64_t key, const char *name, const char *arch, const void *bin, size_t size)
{
    if (!j->cache_dir[0]) return;
    char path[4200];
    cache_path(j, key, path, sizeof path);
    cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    h.key = key;
    h.size = size;
    h.sum = tf_fnv1a(TF_FNV_BASIS, bin, size);
    snprintf(h.name, sizeof h.name, "%s", name);
    snprintf(h.arch, sizeof h.arch, "%s", arch);
    unsigned char *all = tf_malloc(sizeof h + size);
    if (!all) return;
    memcpy(all, &h, sizeof h);
    memcpy(all + sizeof h, bin, size);
    tf_cache_put(path, all, sizeof h + size, bin);   /* counted against the bound (cache_file.h) */
    tf_free(all);
}

void *tf_cuda_cubin_cache_read(const tf_cuda_libs *l, const char *src, const char *name, const char *arch, size_t *size)
{
    tf_cuda_jit j;
    memset(&j, 0, sizeof j);
    cache_open(&j);
    return cache_read(&j, cache_key(src, arch, l), name, arch, size);
}

void tf_cuda_cubin_cache_write(const tf_cuda_libs *l, const char *src, const char *name, const char *arch, const void *bin,
                               size_t size)
{
    tf_cuda_jit j;
    memset(&j, 0, sizeof j);
    cache_open(&j);
    cache_write(&j, cache_key(src, arch, l), name, arch, bin, size);
}

/* ---- building ----------------------------------------------------------------- */

typedef struct unique {
    const tf_cuda_kernel *k;    /* the first job with this source */
    uint64_t key;
    void *cubin;
    size_t size;
    bool from_cache, from_package;
} unique;

static tf_cuda_status load_one(tf_cuda_jit_fn *f, const tf_cuda_libs *l, const unique *u, const char *arch, char *err, size_t n)
{
    char why[1024];
    if (tf_cuda_check(l, l->cu.ModuleLoadData(&f->module, u->cubin), "cuModuleLoadData", __FILE__, __LINE__, why, sizeof why)) {
        f->module = NULL;
        snprintf(err, n, "loading the cubin of %s: %s (NVRTC %d.%d made it for %s; the driver is CUDA %d.%d, and needs to be at "
                 "least as new as NVRTC)", u->k->name, why, l->nvrtc_major, l->nvrtc_minor, arch,
                 l->driver_version / 1000, l->driver_version % 1000 / 10);
        return TF_CUDA_ERR_DRIVER;
    }
    if (tf_cuda_check(l, l->cu.ModuleGetFunction(&f->function, f->module, u->k->name), "cuModuleGetFunction", __FILE__, __LINE__,
                      why, sizeof why)) {
        snprintf(err, n, "finding %s in its cubin: %s", u->k->name, why);
        return TF_CUDA_ERR_DRIVER;
    }
    if (u->k->name2[0] &&
        tf_cuda_check(l, l->cu.ModuleGetFunction(&f->function2, f->module, u->k->name2), "cuModuleGetFunction", __FILE__, __LINE__,
                      why, sizeof why)) {
        snprintf(err, n, "finding %s in its cubin: %s", u->k->name2, why);
        return TF_CUDA_ERR_DRIVER;
    }
    if (f->smem > STATIC_SMEM_LIMIT &&
        tf_cuda_check(l, l->cu.FuncSetAttribute(f->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)f->smem),
                      "cuFuncSetAttribute", __FILE__, __LINE__, why, sizeof why)) {
        snprintf(err, n, "kernel %s needs %u bytes of shared memory: %s", u->k->name, f->smem, why);
        return TF_CUDA_ERR_DRIVER;
    }
    return TF_CUDA_OK;
}

static tf_cuda_status compile(const tf_cuda_libs *l, const char *arch, unique *us, int *idx, int nidx, int *compiled, char *err,
                              size_t n)
{
    if (!nidx) return TF_CUDA_OK;
    tf_nvrtc_job *jobs = tf_calloc((size_t)nidx, sizeof *jobs);
    if (!jobs) {
        snprintf(err, n, "out of memory");
        return TF_CUDA_ERR_OOM;
    }
    for (int i = 0; i < nidx; i++) {
        jobs[i].src = us[idx[i]].k->src;
        jobs[i].name = us[idx[i]].k->name;
        jobs[i].arch = arch;
    }
    tf_cuda_status st = tf_nvrtc_compile_jobs(l, jobs, nidx, 0);
    for (int i = 0; i < nidx; i++) {
        if (jobs[i].status) {
            if (!st) st = jobs[i].status;
            continue;
        }
        us[idx[i]].cubin = jobs[i].cubin;
        us[idx[i]].size = jobs[i].cubin_size;
        jobs[i].cubin = NULL;
        (*compiled)++;
    }
    if (st)
        for (int i = 0; i < nidx; i++)
            if (jobs[i].status) {
                snprintf(err, n, "NVRTC could not compile kernel %s for %s: %s", jobs[i].name, arch, jobs[i].err);
                break;
            }
    for (int i = 0; i < nidx; i++) tf_nvrtc_job_free(&jobs[i]);
    tf_free(jobs);
    return st;
}

/* The package's cubin of kernel `name` for arch, malloc'd, or NULL. */
static void *package_cubin(const tf_pkg *pkg, const char *name, const char *arch, size_t *size)
{
    char sec[160];
    snprintf(sec, sizeof sec, "cuda/%.40s/%.64s.cubin", arch, name);
    const tf_pkg_section *s = pkg ? tf_pkg_find(pkg, sec) : NULL;
    void *b = s && s->len ? tf_malloc(s->len) : NULL;
    if (b) memcpy(b, s->data, s->len), *size = s->len;
    return b;
}

tf_cuda_status tf_cuda_jit_build(tf_cuda_jit *j, const tf_cuda_libs *l, const char *arch, const tf_pkg *pkg, tf_cuda_jit_job *jobs,
                                 int njobs, char *err, size_t n)
{
    memset(j, 0, sizeof *j);
    if (!njobs) return TF_CUDA_OK;
    cache_open(j);
    unique *us = tf_calloc((size_t)njobs, sizeof *us);
    int *miss = tf_calloc((size_t)njobs, sizeof *miss), nus = 0, nmiss = 0;
    j->fns = tf_calloc((size_t)njobs, sizeof *j->fns);
    tf_cuda_status st = TF_CUDA_OK;
    if (!us || !miss || !j->fns) {
        snprintf(err, n, "out of memory");
        st = TF_CUDA_ERR_OOM;
    }
    /* one entry per distinct source: equal names are equal hashes; the text decides */
    for (int i = 0; !st && i < njobs; i++) {
        const tf_cuda_kernel *k = &jobs[i].kernel;
        int u = 0;
        while (u < nus && !(us[u].k->hash == k->hash && strcmp(us[u].k->src, k->src) == 0)) u++;
        jobs[i].fn = u;
        if (u < nus) continue;
        us[nus].k = k;
        us[nus].key = cache_key(k->src, arch, l);
        if ((us[nus].cubin = package_cubin(pkg, k->name, arch, &us[nus].size))) us[nus].from_package = true;
        else if ((us[nus].cubin = cache_read(j, us[nus].key, k->name, arch, &us[nus].size))) us[nus].from_cache = true;
        else miss[nmiss++] = nus;
        nus++;
    }
    if (!st) st = compile(l, arch, us, miss, nmiss, &j->compiled, err, n);
    for (int i = 0; !st && i < nmiss; i++) cache_write(j, us[miss[i]].key, us[miss[i]].k->name, arch, us[miss[i]].cubin, us[miss[i]].size);
    for (int u = 0; !st && u < nus; u++) {
        tf_cuda_jit_fn *f = &j->fns[u];
        const tf_cuda_kernel *k = us[u].k;
        snprintf(f->name, sizeof f->name, "%s", k->name);
        f->grid = k->grid < 1 ? 1 : k->grid > MAX_GRID ? MAX_GRID : k->grid;
        f->block = k->block;
        f->smem = k->smem;
        f->align = k->align;
        f->rng = k->rng;
        f->scratch = k->scratch;
        f->grid2 = k->grid2 < 1 ? 1 : k->grid2 > MAX_GRID ? MAX_GRID : k->grid2;
        f->block2 = k->block2;
        j->nfns = u + 1;
        st = load_one(f, l, &us[u], arch, err, n);
        if (st && (us[u].from_cache || us[u].from_package)) {   /* a stored cubin the driver refuses: compile it again */
            tf_free(us[u].cubin);
            us[u].cubin = NULL;
            us[u].from_cache = us[u].from_package = false;
            int one = u;
            if (!(st = compile(l, arch, us, &one, 1, &j->compiled, err, n))) {
                cache_write(j, us[u].key, k->name, arch, us[u].cubin, us[u].size);
                st = load_one(f, l, &us[u], arch, err, n);
            }
        }
        j->cached += !st && us[u].from_cache;
        j->packaged += !st && us[u].from_package;
    }
    for (int u = 0; us && u < nus; u++) tf_free(us[u].cubin);
    tf_free(us);
    tf_free(miss);
    if (st) tf_cuda_jit_free(j, l);
    return st;
}

void tf_cuda_jit_free(tf_cuda_jit *j, const tf_cuda_libs *l)
{
    for (int i = 0; j->fns && i < j->nfns; i++)
        if (j->fns[i].module) l->cu.ModuleUnload(j->fns[i].module);
    tf_free(j->fns);
    j->fns = NULL;
    j->nfns = 0;
}
