/* cpu_objects.c — the cpu target's compiled kernels outside the process.
 * One kernel's object code travels as a record under its disk key (the
 * kernel's key with the pipeline and the target: cpu_jit.c's tf_cpu_kernel_sym):
 * a file of the disk cache, $TFUSE_CACHE_DIR/cpu/SYM.o, or a package's
 * section cpu/SYM.o. A record is checked whole (its magic, its sizes, its
 * checksum and its key) before its object is handed out, so a torn or
 * foreign one is simply a miss. A package holds every kernel of its
 * program as such a record beside cpu/target, the target id its code was
 * built for, which the loading machine's must equal. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_file.h"
#include "cpu_backend.h"
#include "package.h"
#ifdef TFUSE_HAVE_LLVM
#include "llvm.h"
#endif

#ifdef TFUSE_HAVE_LLVM

/* ---- the record ---------------------------------------------------------- */

/* The disk cache's file: MAGIC, the key's and the object's byte counts
 * (8 bytes each, little-endian), the key, the object, and the FNV-1a 64 of
 * all of it before (8 bytes). */
static const char DISK_MAGIC[16] = "TFUSE-CPUOBJ-01\n";

/* The object code a record (a disk cache file, or a package's section)
 * holds under key, malloc'd into *obj (*n bytes); false when it is torn,
 * foreign or another key's. */
bool tf_cpu_record_parse(const unsigned char *b, size_t size, const char *key, void **obj, size_t *n)
{
    *obj = NULL;
    size_t kl = strlen(key);
    if (size < 40) return false;
    uint64_t klen = tf_le64_get(b + 16), olen = tf_le64_get(b + 24);
    bool ok = memcmp(b, DISK_MAGIC, 16) == 0 && klen == kl && olen > 0 && olen < (uint64_t)size &&
              32 + klen + olen + 8 == (uint64_t)size && tf_le64_get(b + size - 8) == tf_fnv1a(TF_FNV_BASIS, b, size - 8) &&
              memcmp(b + 32, key, kl) == 0;
    if (ok && (*obj = tf_malloc((size_t)olen))) {
        memcpy(*obj, b + 32 + kl, (size_t)olen);
        *n = (size_t)olen;
    }
    return ok && *obj;
}

/* The object code stored under key in path (tf_cpu_record_parse); false when
 * there is none, or it is torn, foreign or another key's. */
bool tf_cpu_disk_read(const char *path, const char *key, void **obj, size_t *n)
{
    *obj = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char *b = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    bool ok = size >= 40 && size < (1L << 30) && fseek(f, 0, SEEK_SET) == 0 && (b = tf_malloc((size_t)size)) &&
              fread(b, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    ok = ok && tf_cpu_record_parse(b, (size_t)size, key, obj, n);
    tf_free(b);
    if (ok) tf_cache_touch(path);   /* used now: the last to be evicted (cache_file.h) */
    return ok;
}

/* The record of obj under key (malloc'd, *total bytes), or NULL. */
static unsigned char *record_make(const char *key, const void *obj, size_t n, size_t *total)
{
    size_t kl = strlen(key);
    *total = 32 + kl + n + 8;
    unsigned char *b = tf_malloc(*total);
    if (!b) return NULL;
    memcpy(b, DISK_MAGIC, 16);
    tf_le64_put(b + 16, kl);
    tf_le64_put(b + 24, n);
    memcpy(b + 32, key, kl);
    memcpy(b + 32 + kl, obj, n);
    tf_le64_put(b + *total - 8, tf_fnv1a(TF_FNV_BASIS, b, *total - 8));
    return b;
}

void tf_cpu_disk_write(const char *path, const char *key, const void *obj, size_t n)
{
    size_t total;
    unsigned char *b = record_make(key, obj, n, &total);
    if (!b) return;   /* the cache is an optimization: no room, no file */
    tf_cache_put(path, b, total, key);   /* counted against the bound (cache_file.h) */
    tf_free(b);
}

/* ---- packages ------------------------------------------------------------ */

/* Every kernel a session compiles, as object code for this machine: from
 * the disk cache where it is there, else compiled (and left in the disk
 * cache), on the program's threads (tf_program_set_threads; 0: one per
 * core) as a session compiles its misses (tf_jit_object: the bytes
 * tf_jit_compile_object makes, whatever the thread count), then added in
 * kernel order, so that the package's bytes do not depend on the threads.
 * A kernel the emitter cannot compile runs the reference in a session, so
 * it has no object. */
typedef struct pkg_obj {
    const tf_kernel *k;
    char *dkey, sym[32], path[4200];
    bool from_disk;
    void *obj;
    size_t nobj;
    tf_ir_status st;
    tf_diag d;
} pkg_obj;

typedef struct pkg_work {
    pkg_obj *os;
    int n, next;
    const char *pipe;
    pthread_mutex_t mu;
} pkg_work;

static void pkg_compile_piece(void *arg, int64_t lo, int64_t hi)
{
    pkg_work *w = arg;
    (void)lo, (void)hi;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int i = w->next++;
        while (i < w->n && (w->os[i].obj || w->os[i].from_disk)) i = w->next++;
        pthread_mutex_unlock(&w->mu);
        if (i >= w->n) return;
        pkg_obj *o = &w->os[i];
        o->st = tf_jit_object(o->k, o->sym, w->pipe, &o->obj, &o->nobj, &o->d);
    }
}

tf_status tf_cpu_package_code(tf_context_t *ctx, const tf_program_t *p, const char *archs, tf_pkg *pkg, int *nobjects,
                              int *cached)
{
    (void)archs;
    *nobjects = *cached = 0;
    if (!p->has_plan) return TF_OK;
    tf_diag d = {0};
    tf_status st = TF_OK;
    char *target = tf_cpu_cache_target(ctx->cache, &d), why[256], dir[4096], name[64];
    if (!target) return tf_from_diag(ctx, &d);
    bool have_dir = tf_cache_subdir("cpu", dir, sizeof dir);
    pkg_obj *os = tf_calloc((size_t)(p->plan.nkernels ? p->plan.nkernels : 1), sizeof *os);
    int n = 0;
    if (!os || !tf_pkg_add(pkg, "cpu/target", target, strlen(target), why, sizeof why))
        st = tf_set_error(ctx, TF_ERR_OOM, "error: %s", os ? why : "out of memory");
    /* the kernels with code, each key once, and what the disk cache has of them */
    for (int i = 0; !st && i < p->plan.nkernels; i++) {
        const tf_kernel *k = &p->plan.kernels[i];
        if (!k->nexprs || k->kind == TF_K_VIEW || (k->lib && tf_cpu_library_how(k->lib) == RUN_FALLBACK)) continue;
        pkg_obj *o = &os[n];
        char *key = tf_cpu_jit_key(k, p->settings.llvm_pipeline);
        bool ok = key && tf_cpu_kernel_sym(target, key, &o->dkey, o->sym);
        tf_free(key);
        if (!ok) {
            st = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
            break;
        }
        bool seen = false;
        for (int q = 0; q < n && !seen; q++) seen = !strcmp(os[q].sym, o->sym);
        snprintf(name, sizeof name, "cpu/%s.o", o->sym);
        if (seen || tf_pkg_find(pkg, name)) {
            tf_free(o->dkey);
            memset(o, 0, sizeof *o);
            continue;
        }
        o->k = k;
        if (have_dir) snprintf(o->path, sizeof o->path, "%s/%s.o", dir, o->sym);
        o->from_disk = have_dir && tf_cpu_disk_read(o->path, o->dkey, &o->obj, &o->nobj);
        n++;
    }
    /* the rest compiled on the pool, each its own LLVM context */
    int to_compile = 0;
    for (int i = 0; i < n; i++) to_compile += !os[i].from_disk;
    if (!st && to_compile) {
        int threads = p->threads > 0 ? p->threads : tf_cpu_count();
        if (threads > to_compile) threads = to_compile;
        tf_pool *pool = tf_pool_create(threads);
        pkg_work w = {.os = os, .n = n, .pipe = p->settings.llvm_pipeline};
        pthread_mutex_init(&w.mu, NULL);
        if (!pool) st = tf_set_error(ctx, TF_ERR_OOM, "error: cannot start %d threads", threads);
        else tf_pool_run(pool, tf_pool_threads(pool), pkg_compile_piece, &w);
        pthread_mutex_destroy(&w.mu);
        tf_pool_free(pool);
    }
    /* in kernel order: the package's bytes are the same on any number of threads */
    for (int i = 0; !st && i < n; i++) {
        pkg_obj *o = &os[i];
        if (o->st) {
            if (o->d.status != TF_IR_ERR_RUNTIME) st = tf_from_diag(ctx, &o->d);
            continue;   /* the emitter cannot: the reference runs it */
        }
        if (!o->from_disk && o->path[0]) tf_cpu_disk_write(o->path, o->dkey, o->obj, o->nobj);
        size_t total;
        unsigned char *rec = record_make(o->dkey, o->obj, o->nobj, &total);
        snprintf(name, sizeof name, "cpu/%s.o", o->sym);
        if (!rec || !tf_pkg_add(pkg, name, rec, total, why, sizeof why)) st = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
        tf_free(rec);
        ++*nobjects;
        *cached += o->from_disk;
    }
    for (int i = 0; os && i < n; i++) {
        tf_free(os[i].obj);
        tf_free(os[i].dkey);
    }
    tf_free(os);
    tf_free(target);
    return st;
}

tf_status tf_cpu_package_check(tf_context_t *ctx, const tf_pkg *pkg, const char *path)
{
    const tf_pkg_section *t = tf_pkg_find(pkg, "cpu/target");
    if (!t) return tf_set_error(ctx, TF_ERR_FORMAT, "%s: error: the package has no cpu code (no section cpu/target)", path);
    tf_diag d = {0};
    char *here = tf_cpu_cache_target(ctx->cache, &d);
    if (!here) return tf_from_diag(ctx, &d);
    tf_status st = TF_OK;
    if (strcmp(here, (const char *)t->data)) {
        char a[600], b[600];
        tf_cache_key_field((const char *)t->data, a, sizeof a);
        tf_cache_key_field(here, b, sizeof b);
        st = tf_set_error(ctx, TF_ERR_UNAVAILABLE,
                          "%s: error: the package's code was built for another CPU or LLVM: built for '%s'; this machine is '%s': "
                          "compile the model here (tfuse compile MODEL.ir)", path, a, b);
    }
    tf_free(here);
    return st;
}

#endif /* TFUSE_HAVE_LLVM */
