/* backend_cpu.c — the `cpu` target: the kernel plan run as compiled code.
 *
 * A session takes the program's kernel IR (codegen/kernel.c, built once by
 * tf_program_compile), compiles
 * each elementwise, reduction and epilogue kernel with the LLVM emitter
 * (codegen/llvm.c) and runs the plan in order over:
 *
 *   - one arena of memplan's size: every value memplan placed lives at its
 *     offset (so in-place reuse and the planned peak are what runs); values
 *     it did not place (with memplan disabled, say) get their own block;
 *   - one block per input, param and buffer;
 *   - reshapes as aliases of their operand.
 *
 * Library kernels: matmul (batched, transposed, broadcast), conv2d with its
 * two gradients, pooling and its gradients through cpu_ops.c (OpenBLAS GEMM,
 * im2col), in fp32 with f16/bf16 operands widened and results rounded to
 * their storage dtype; gather and scatter_add directly on storage. The rest
 * (concat, slice_grad, f64 GEMMs, an out-of-range id so that the error
 * names the op) run the interpreter's kernel on widened copies of their
 * operands — correct, and counted as `fallback` in the profile and in
 * `tfuse bench` so they are visible. Elementwise work splits over the pool along each kernel's split
 * axis.
 *
 * Compiled kernels are kept in the context's tf_cache_t (one per context, or
 * shared between contexts), keyed by tf_kernel_key and the LLVM pipeline: a
 * second session of the same program compiles nothing. The cache's mutex
 * guards its JIT and slots. Sessions hold a reference on the cache and on
 * the kernels they run; of the kernels no session holds, the most recently
 * used `limit` stay (tf_cache_set_limit; default $TFUSE_JIT_CACHE_KERNELS,
 * else 2048), and older ones give their code and memory back, so a process
 * that compiles model after model (a server, tfuse_difftest) stays bounded:
 * every JIT'd module costs memory mappings, and a process has at most
 * vm.max_map_count.
 * Below that, a disk cache outlives the process: each kernel's object code,
 * as LLVM emitted it for this CPU, in $TFUSE_CACHE_DIR/cpu (default
 * ~/.cache/tfuse/cpu), keyed by the kernel's key, the pipeline and the
 * target (LLVM's version, the triple, the host CPU and its features); a
 * second process links those objects and compiles nothing
 * (tf_session_info.jit_disk). A file that is torn, foreign or for another
 * key is ignored and written again.
 * Initial state comes from the interpreter's initializers with the session's
 * seed, so a cpu session starts from exactly the params an interp session
 * starts from, and dropout draws the interpreter's masks. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cache_file.h"
#include "package.h"
#include "conv_dnnl.h"
#include "cpu_ops.h"
#include "gemm_dnnl.h"
#include "interp.h"
#include "lowp.h"
#include "kernel.h"
#include "pool.h"
#include "runtime.h"
#ifdef TFUSE_HAVE_LLVM
#include "llvm.h"
#include "objload.h"
#include "env.h"
#endif

#ifdef TFUSE_HAVE_LLVM

/* ---- the JIT and its kernels, kept in a tf_cache_t ------------------------- */

/* What the cpu backend keeps in a cache (c->cpu), under c->mu. Slots stay
 * where they are while a session refers to them (by index); a slot whose
 * key is NULL is free. */
typedef struct jit_cache {
    tf_jit *jit;           /* made when a kernel must be compiled through it (NULL until then) */
    char *target;          /* tf_jit_target_id, for the disk cache's keys (NULL until needed: host_target) */
    struct jit_entry {
        char *key;
        tf_kernel_fn fn;
        tf_jit_code *code;     /* its code in the JIT, or */
        tf_obj *obj;           /* the object objload.c loaded */
        int refs;              /* sessions running it */
        uint64_t used;         /* when a session last took it */
    } *e;
    int n, cap;
    uint64_t clock;
} jit_cache;

/* A kernel's code given back: the JIT's, or objload's mapping. */
static void code_release(jit_cache *jc, tf_jit_code *code, tf_obj *obj)
{
    tf_obj_free(obj);
    if (code) {
        tf_diag d;
        d.status = TF_IR_OK;
        tf_jit_release(jc->jit, code, &d);   /* its memory is gone either way; nothing to report to */
    }
}

/* Give back the code of the least recently used kernels no session holds
 * until at most c->limit remain. Under c->mu. */
static void cpu_cache_trim(tf_cache_t *c)
{
    jit_cache *jc = c->cpu;
    while (jc && c->unused > c->limit) {
        int old = -1;
        for (int i = 0; i < jc->n; i++)
            if (jc->e[i].key && !jc->e[i].refs && (old < 0 || jc->e[i].used < jc->e[old].used)) old = i;
        if (old < 0) return;
        code_release(jc, jc->e[old].code, jc->e[old].obj);
        tf_free(jc->e[old].key);
        jc->e[old] = (struct jit_entry){0};
        c->unused--;
        c->kernels--;
        c->evicted++;
    }
}

static void cpu_cache_free(tf_cache_t *c)
{
    jit_cache *jc = c->cpu;
    if (!jc) return;
    for (int i = 0; i < jc->n; i++) {
        code_release(jc, jc->e[i].code, jc->e[i].obj);
        tf_free(jc->e[i].key);
    }
    tf_jit_free(jc->jit);
    tf_free(jc->target);
    tf_free(jc->e);
    tf_free(jc);
    c->cpu = NULL;
}

/* The disk cache's file: MAGIC, the key's and the object's byte counts
 * (8 bytes each, little-endian), the key, the object, and the FNV-1a 64 of
 * all of it before (8 bytes). */
static const char DISK_MAGIC[16] = "TFUSE-CPUOBJ-01\n";

/* The object code a record (a disk cache file, or a package's section)
 * holds under key, malloc'd into *obj (*n bytes); false when it is torn,
 * foreign or another key's. */
static bool record_parse(const unsigned char *b, size_t size, const char *key, void **obj, size_t *n)
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

/* The object code stored under key in path (record_parse); false when
 * there is none, or it is torn, foreign or another key's. */
static bool disk_read(const char *path, const char *key, void **obj, size_t *n)
{
    *obj = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char *b = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    bool ok = size >= 40 && size < (1L << 30) && fseek(f, 0, SEEK_SET) == 0 && (b = tf_malloc((size_t)size)) &&
              fread(b, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    ok = ok && record_parse(b, (size_t)size, key, obj, n);
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

static void disk_write(const char *path, const char *key, const void *obj, size_t n)
{
    size_t total;
    unsigned char *b = record_make(key, obj, n, &total);
    if (!b) return;   /* the cache is an optimization: no room, no file */
    tf_cache_put(path, b, total, key);   /* counted against the bound (cache_file.h) */
    tf_free(b);
}

/* A kernel's name in object code and on disk: "tf_" + the FNV-1a of its disk
 * key ("tfuse cpu kernel 2", the target, the kernel's key), malloc'd into
 * *dkey; false when out of memory. */
static bool kernel_sym(const char *target, const char *key, char **dkey, char sym[32])
{
    size_t n = strlen(target) + strlen(key) + 64;
    if (!(*dkey = tf_malloc(n))) return false;
    snprintf(*dkey, n, "tfuse cpu kernel 2\n%s\n%s", target, key);
    snprintf(sym, 32, "tf_%016llx", (unsigned long long)tf_fnv1a(TF_FNV_BASIS, *dkey, strlen(*dkey)));
    return true;
}

/* Object code linked: by objload.c, without LLVM (a package's or the
 * cache's kernels start with no LLVM loaded at all), into *obj; an object
 * it does not take (another architecture) through the JIT's ORC, into
 * *code. Under c->mu. */
static tf_ir_status link_object(jit_cache *jc, const char *sym, const void *bytes, size_t n, tf_kernel_fn *fn, tf_jit_code **code,
                                tf_obj **obj, tf_diag *d)
{
    *fn = NULL;
    *code = NULL;
    *obj = NULL;
    char why[256];
    void *addr = NULL;
    tf_obj_status os = tf_obj_load(bytes, n, sym, tf_kernel_runtime_symbol, NULL, obj, &addr, why, sizeof why);
    if (os == TF_OBJ_OK) {
        union { void *p; tf_kernel_fn f; } u;
        u.p = addr;
        *fn = u.f;
        return TF_IR_OK;
    }
    if (os == TF_OBJ_NOMEM) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "loading the object code of %s: %s", sym, why);
    if (os != TF_OBJ_UNSUPPORTED) return tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "cannot load the object code of %s: %s", sym, why);
    if (!jc->jit && tf_jit_create(&jc->jit, d)) return d->status;
    return tf_jit_load_object(jc->jit, sym, bytes, n, fn, code, d);
}

/* The first processor's identity in /proc/cpuinfo (vendor, family, model,
 * name, stepping, flags) with this build's LLVM, hashed; false where
 * there is no /proc/cpuinfo. */
static bool host_signature(uint64_t *h)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    static const char *const keys[] = {"vendor_id", "cpu family", "model", "model name", "stepping", "flags"};
    char line[8192];
    uint64_t x = TF_FNV_BASIS;
    int found = 0;
    static const char build[] = "tfuse cpu host 1\n" TF_LLVM_API_VERSION "\nllvm " TFUSE_LLVM_VERSION "\n";
    x = tf_fnv1a(x, build, sizeof build - 1);
    while (fgets(line, sizeof line, f) && line[0] != '\n') {
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            size_t kl = strlen(keys[k]), at = kl;
            if (strncmp(line, keys[k], kl) != 0) continue;
            while (line[at] == ' ' || line[at] == '\t') at++;
            if (line[at] == ':') {
                x = tf_fnv1a(x, line, strlen(line));
                found++;
            }
        }
    }
    fclose(f);
    *h = x;
    return found >= 2;
}

/* This machine's target id (tf_jit_target_id: LLVM's version, the triple,
 * the host CPU and its features), which keys the disk cache and checks a
 * package's code. Asking LLVM means loading it (libtfuse-llvm.so, 15-20
 * ms), which a process that only links cached or packaged code otherwise
 * never does; so the answer is kept in the disk cache, $TFUSE_CACHE_DIR/
 * cpu/host-HASH, under a hash of the processor's identity in /proc/cpuinfo
 * and this build's LLVM (a record with its checksum: a torn or foreign
 * file is asked again). NULL with d filled when LLVM cannot be asked.
 * Under c->mu. */
static const char *host_target(jit_cache *jc, tf_diag *d)
{
    if (jc->target) return jc->target;
    uint64_t h = 0;
    char dir[4096], path[4200], key[64];
    bool memo = host_signature(&h) && tf_cache_subdir("cpu", dir, sizeof dir);
    if (memo) {
        snprintf(path, sizeof path, "%s/host-%016llx", dir, (unsigned long long)h);
        snprintf(key, sizeof key, "tfuse cpu host %016llx", (unsigned long long)h);
        void *t = NULL;
        size_t n = 0;
        if (disk_read(path, key, &t, &n)) {
            char *id = tf_malloc(n + 1);
            if (id && n > 5 && memcmp(t, "llvm ", 5) == 0 && !memchr(t, 0, n)) {
                memcpy(id, t, n);
                id[n] = 0;
                jc->target = id;
            } else {
                tf_free(id);
            }
            tf_free(t);
            if (jc->target) return jc->target;
        }
    }
    if (!jc->jit && tf_jit_create(&jc->jit, d)) return NULL;
    if (!(jc->target = tf_jit_target_id(jc->jit))) {
        tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
        return NULL;
    }
    if (memo) disk_write(path, key, jc->target, strlen(jc->target));
    return jc->target;
}

/* The object code of k an earlier process (the disk cache) or a package
 * left for key, linked into the JIT: TF_IR_OK with *fn and *code, or a
 * miss (*code NULL) for the caller to compile, *sym, *dkey and *path
 * (malloc'd; NULL without a cache directory) saying under what name and where.
 * Without a target id (out of memory, or LLVM cannot be opened to ask),
 * *dkey stays NULL: compile with tf_jit_compile (which says why it cannot).
 * Under c->mu. */
static void jit_load(jit_cache *jc, const char *key, const tf_pkg *pkg, tf_kernel_fn *fn, tf_jit_code **code, tf_obj **lo,
                     bool *from_disk, bool *from_pkg, char sym[32], char **dkey, char **path)
{
    *from_disk = *from_pkg = false;
    *code = NULL;
    *lo = NULL;
    *dkey = NULL;
    *path = NULL;
    char dir[4096];
    tf_diag d;   /* no target id, or an object that does not link: the kernel is compiled */
    d.status = TF_IR_OK;
    if (!host_target(jc, &d) || !kernel_sym(jc->target, key, dkey, sym)) return;
    void *obj = NULL;
    size_t on = 0;
    if (pkg) {   /* a package's object code (tf_program_load checked its target) */
        char name[64];
        snprintf(name, sizeof name, "cpu/%s.o", sym);
        const tf_pkg_section *sec = tf_pkg_find(pkg, name);
        if (sec && record_parse(sec->data, sec->len, *dkey, &obj, &on) && !link_object(jc, sym, obj, on, fn, code, lo, &d))
            *from_pkg = true;
        tf_free(obj);
        if (*fn) return;
        obj = NULL;
    }
    if (!tf_cache_subdir("cpu", dir, sizeof dir) || !(*path = tf_malloc(strlen(dir) + 40))) return;
    snprintf(*path, strlen(dir) + 40, "%s/%s.o", dir, sym);
    if (disk_read(*path, *dkey, &obj, &on) && !link_object(jc, sym, obj, on, fn, code, lo, &d)) *from_disk = true;
    tf_free(obj);
}

/* The JIT cache's key of k under pipeline pipe (NULL: tfuse's own),
 * malloc'd; NULL when out of memory. */
static char *jit_key(const tf_kernel *k, const char *pipe)
{
    char *kkey = tf_kernel_key(k), *key = NULL;
    if (kkey && pipe) {   /* another pipeline compiles other code */
        size_t n = strlen(pipe) + strlen(kkey) + 16;
        if ((key = tf_malloc(n))) snprintf(key, n, "pipeline %s\n%s", pipe, kkey);
        tf_free(kkey);
    } else {
        key = kkey;
    }
    return key;
}

/* The slot of key in the cache, or -1. Under c->mu. */
static int jit_find(const jit_cache *jc, const char *key, int *free_slot)
{
    *free_slot = -1;
    for (int i = 0; i < jc->n; i++) {
        if (!jc->e[i].key) {
            if (*free_slot < 0) *free_slot = i;
        } else if (strcmp(jc->e[i].key, key) == 0) {
            return i;
        }
    }
    return -1;
}

/* A new entry for key (taken) with fn and code; its slot, or -1 when out of memory. Under c->mu. */
static int jit_insert(tf_cache_t *c, jit_cache *jc, int free_slot, char *key, tf_kernel_fn fn, tf_jit_code *code, tf_obj *obj)
{
    if (free_slot < 0 && jc->n == jc->cap) {
        int cap = jc->cap ? 2 * jc->cap : 64;
        struct jit_entry *e = tf_realloc(jc->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        jc->e = e, jc->cap = cap;
    }
    int slot = free_slot >= 0 ? free_slot : jc->n++;
    jc->e[slot] = (struct jit_entry){.key = key, .fn = fn, .code = code, .obj = obj};
    c->kernels++;
    return slot;
}

/* A reference on slot for a session, and its function. Under c->mu. */
static tf_kernel_fn jit_take(tf_cache_t *c, jit_cache *jc, int slot, bool fresh)
{
    if (!fresh && !jc->e[slot].refs) c->unused--;
    jc->e[slot].refs++;
    jc->e[slot].used = ++jc->clock;
    return jc->e[slot].fn;
}

/* What a session asks of the cache for one kernel, and what it got. */
typedef struct jit_req {
    const tf_kernel *k;
    char *key;             /* jit_key (taken by the cache when the kernel is added) */
    tf_kernel_fn fn;
    int slot;              /* its reference in the cache, -1 until it has one */
    bool hit, disk, pkg;   /* where it came from: the process's cache, the disk, a package; else compiled */
    /* a miss, compiled by jit_compile_all (path and d allocated for
     * misses only: a package's hundreds of hits touch a few pages): */
    char sym[32];
    char *path;            /* where the disk cache keeps it; NULL: no cache directory */
    char *dkey;            /* NULL: no target id, tf_jit_compile under the mutex */
    int same;              /* an earlier request with the same key (that one compiles), or -1 */
    void *obj;
    size_t nobj;
    tf_ir_status st;
    tf_diag *d;            /* st's message; NULL when st is TF_IR_ERR_OOM for want of it */
} jit_req;

/* r's kernel from the process's cache, a package or the disk; a miss
 * leaves r->slot -1 for jit_compile_all. */
static tf_ir_status jit_lookup(tf_cache_t *c, const char *pipe, const tf_pkg *pkg, jit_req *r, tf_diag *d)
{
    r->slot = -1;
    r->same = -1;
    if (!(r->key = jit_key(r->k, pipe))) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    tf_ir_status st = TF_IR_OK;
    pthread_mutex_lock(&c->mu);
    jit_cache *jc = c->cpu;
    if (!jc && !(jc = c->cpu = tf_calloc(1, sizeof *jc))) st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    int free_slot = -1, slot = st ? -1 : jit_find(jc, r->key, &free_slot);
    if (slot >= 0) {
        r->hit = true;
        r->slot = slot;
        r->fn = jit_take(c, jc, slot, false);
    } else if (!st) {
        tf_jit_code *code = NULL;
        tf_obj *lo = NULL;
        tf_kernel_fn fn = NULL;
        jit_load(jc, r->key, pkg, &fn, &code, &lo, &r->disk, &r->pkg, r->sym, &r->dkey, &r->path);
        if (fn && (r->slot = jit_insert(c, jc, free_slot, r->key, fn, code, lo)) < 0) {
            code_release(jc, code, lo);
            st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
        } else if (fn) {
            r->key = NULL;
            r->fn = jit_take(c, jc, r->slot, true);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* The misses' object code, on up to nthreads threads at once (tf_jit_object:
 * the same bytes tf_jit_compile_object makes), then linked one by one
 * under the mutex (a session that added the same kernel meanwhile wins)
 * and written to the disk cache. Each request's own failure is in its st
 * and d. */
typedef struct compile_work {
    jit_req **todo;
    int n;
    const char *pipe;
    int next;
    pthread_mutex_t mu;
} compile_work;

static void compile_piece(void *arg, int64_t lo, int64_t hi)
{
    compile_work *w = arg;
    (void)lo, (void)hi;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int i = w->next++;
        pthread_mutex_unlock(&w->mu);
        if (i >= w->n) return;
        jit_req *r = w->todo[i];
        r->st = tf_jit_object(r->k, r->sym, w->pipe, &r->obj, &r->nobj, r->d);
    }
}

static void jit_compile_all(tf_cache_t *c, tf_pool *pool, const char *pipe, jit_req *rs, int n)
{
    int nmiss = 0, ntodo = 0;
    for (int i = 0; i < n; i++) nmiss += rs[i].slot < 0 && rs[i].key;
    if (!nmiss) return;
    jit_req **todo = tf_calloc((size_t)nmiss, sizeof *todo);
    for (int i = 0; i < n; i++) {
        jit_req *r = &rs[i];
        if (r->slot >= 0 || !r->key) continue;
        if (!(r->d = tf_malloc(sizeof *r->d))) {
            r->st = TF_IR_ERR_OOM;
            continue;
        }
        r->d->status = TF_IR_OK;
        r->d->msg[0] = 0;
        for (int q = 0; q < i && r->same < 0; q++)
            if (rs[q].slot < 0 && rs[q].key && rs[q].same < 0 && strcmp(rs[q].key, r->key) == 0) r->same = q;
        if (r->same < 0 && r->dkey && todo) todo[ntodo++] = r;
    }
    compile_work w = {.todo = todo, .n = ntodo, .pipe = pipe};
    pthread_mutex_init(&w.mu, NULL);
    int threads = tf_pool_threads(pool);
    tf_pool_run(pool, threads < ntodo ? threads : ntodo, compile_piece, &w);
    pthread_mutex_destroy(&w.mu);
    tf_free(todo);
    for (int i = 0; i < n; i++) {
        jit_req *r = &rs[i];
        if (r->slot >= 0 || !r->key || !r->d) continue;
        pthread_mutex_lock(&c->mu);
        jit_cache *jc = c->cpu;
        int free_slot = -1, slot = jit_find(jc, r->key, &free_slot);
        if (slot >= 0) {   /* compiled by an earlier request of this session, or by another session meanwhile */
            r->hit = true;
            r->slot = slot;
            r->fn = jit_take(c, jc, slot, false);
        } else if (r->same >= 0 && rs[r->same].st) {
            r->st = rs[r->same].st;
            if (rs[r->same].d) *r->d = *rs[r->same].d;
            else tf_diag_error(r->d, r->st, NULL, "out of memory");
        } else if (r->dkey && !r->obj && !r->st) {   /* not compiled: out of memory for the list */
            r->st = tf_diag_error(r->d, TF_IR_ERR_OOM, NULL, "out of memory");
        } else if (!r->st) {
            tf_jit_code *code = NULL;
            tf_obj *lo = NULL;
            tf_kernel_fn fn = NULL;
            if (r->dkey) r->st = link_object(jc, r->sym, r->obj, r->nobj, &fn, &code, &lo, r->d);
            else if (!jc->jit && tf_jit_create(&jc->jit, r->d)) r->st = r->d->status;
            else if (tf_jit_set_pipeline(jc->jit, pipe)) r->st = tf_diag_error(r->d, TF_IR_ERR_OOM, NULL, "out of memory");
            else r->st = tf_jit_compile(jc->jit, r->k, &fn, &code, r->d);
            if (!r->st && (r->slot = jit_insert(c, jc, free_slot, r->key, fn, code, lo)) < 0) {
                code_release(jc, code, lo);
                r->st = tf_diag_error(r->d, TF_IR_ERR_OOM, NULL, "out of memory");
            } else if (!r->st) {
                r->key = NULL;
                r->fn = jit_take(c, jc, r->slot, true);
            }
        }
        pthread_mutex_unlock(&c->mu);
        if (!r->st && r->obj && r->path) disk_write(r->path, r->dkey, r->obj, r->nobj);
    }
}

static void jit_req_free(jit_req *r)
{
    tf_free(r->key);
    tf_free(r->dkey);
    tf_free(r->obj);
    tf_free(r->path);
    tf_free(r->d);
    r->key = r->dkey = r->path = NULL;
    r->obj = NULL;
    r->d = NULL;
}

/* A session is done with the kernel in slot (-1: none). */
static void jit_put(tf_cache_t *c, int slot)
{
    if (slot < 0) return;
    pthread_mutex_lock(&c->mu);
    jit_cache *jc = c->cpu;
    if (--jc->e[slot].refs == 0) {
        c->unused++;
        cpu_cache_trim(c);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- session state ------------------------------------------------------- */

typedef enum how {
    RUN_JIT, RUN_VIEW, RUN_MATMUL, RUN_MATMUL_BF16, RUN_CONV, RUN_CONV_GI, RUN_CONV_GW, RUN_POOL, RUN_POOL_GRAD, RUN_GATHER, RUN_SCATTER,
    RUN_CONCAT, RUN_SLICE_GRAD, RUN_FALLBACK, RUN_NOTHING
} how;
static const char *how_names[] = {"jit", "view", "gemm", "gemm_bf16", "conv", "conv_grad_input", "conv_grad_weight", "pool", "pool_grad",
                                  "gather", "scatter_add", "concat", "slice_grad", "fallback", "-"};

typedef struct ckernel {
    const tf_kernel *k;
    how how;
    tf_kernel_fn fn;       /* the elementwise part (all of it, or the epilogue) */
    int jit_slot;          /* its reference in the JIT cache, -1 none */
    void **bufs;           /* storage per k->bufs */
    int64_t extent;        /* of the split axis; 1 when none */
    int64_t work;          /* elements of the index space, to decide threading */
    double ns;             /* profile: total time */
    int64_t calls;
    int label_expr;        /* a one_hot whose labels load an integer buffer (checked before the kernel), or -1 */
    tf_dnnl_conv *dnnl;    /* RUN_CONV*: oneDNN's primitives, or NULL: im2col (conv_why says why) */
    bool epi_in_conv;      /* RUN_CONV: the primitive writes the region's epilogue (bias, ReLU): fn does not run */
    int epi_bias, epi_out; /* then: the bias's buffer and the stored result's (indices into k->bufs) */
    char conv_why[320];
    tf_dnnl_gemm *dgemm;   /* RUN_MATMUL: oneDNN with the weights packed (gemm_choose), or NULL: OpenBLAS (gemm_why) */
    void *packed;          /* then: the packed weights, current as of write generation packed_gen */
    uint64_t packed_gen;
    char gemm_why[200];
} ckernel;

typedef struct cpu {
    const tf_kernel_plan *plan;   /* the program's (s->p->plan) */
    ckernel *ks;
    void **ptr;            /* per value id: its storage */
    unsigned char *arena;
    void **owned;          /* blocks besides the arena */
    int64_t arena_bytes;   /* the arena's size (memplan's) */
    int64_t state_bytes;   /* the blocks of inputs, params and buffers, each its value's size */
    int64_t unplanned_bytes;   /* the blocks of values memplan did not place (0 after memplan) */
    int nowned;
    tf_pool *pool;
    tf_interp_ctx *ip;     /* the fallback kernels' tensors (made on first use); initializers run in a
                            * temporary one */
    uint64_t rt[2];        /* seed, step: what dropout draws from */
    float *scratch;        /* grows to the largest kernel's need */
    size_t nscratch;
    float **wide;          /* per value id: the f32 copy of an f16/bf16 value that several GEMMs read, or NULL */
    uint64_t *wide_gen;    /* the run whose values the copy holds */
    uint64_t gen;          /* runs started: copies from an earlier one are stale */
    size_t wide_bytes;     /* what the copies take */
    uint64_t state_gen;    /* state writes from outside (load, set): packed weights older than this are repacked */
    size_t packed_bytes;   /* what packed weights take */
    void *gemm_scratch;    /* the oneDNN GEMMs' scratchpads (the largest need) */
    size_t gemm_scratch_bytes;
    bool profile;
    int jit_compiled, jit_cached, jit_disk, jit_package;
    double jit_ms;
    tf_cache_t *cache;     /* where its kernels are (the context's at the start), referenced */
} cpu;

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int64_t numel(const tf_value *v) { return tf_type_numel(&v->type); }

static size_t value_bytes(const tf_value *v) { return (size_t)tf_type_numel(&v->type) * (size_t)tf_dtype_bytes(v->type.dtype); }

/* The value whose storage v uses: through views (ops.c). */
static const tf_value *root_of(const tf_value *v) { return tf_value_storage(v); }

/* Large blocks (the arena, params, optimizer moments) on transparent huge
 * pages where the kernel offers them on request (THP "madvise" mode, the
 * common default): their first touch then costs a fault per 2 MiB, not per
 * 4 KiB, which is most of a package's state copy and of a first training
 * step's arena touch. Only the 2 MiB-aligned interior is advised; a hint,
 * so failure (no THP) changes nothing. */
static void huge_pages(void *p, size_t n)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t H = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + H - 1) & ~(H - 1), hi = ((uintptr_t)p + n) & ~(H - 1);
    if (n >= 2 * H && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

static void *own(cpu *c, size_t bytes)
{
    void **o = tf_realloc(c->owned, (size_t)(c->nowned + 1) * sizeof *o);
    if (!o) return NULL;
    c->owned = o;
    size_t n = (bytes + 63) / 64 * 64;
    void *p = tf_calloc_aligned(64, n ? n : 64);
    if (p) c->owned[c->nowned++] = p;
    if (p) huge_pages(p, n);
    return p;
}

static float *scratch(cpu *c, size_t floats)
{
    if (floats > c->nscratch) {
        tf_free_aligned(c->scratch);
        c->scratch = tf_malloc_aligned(64, (floats * sizeof(float) + 63) / 64 * 64);
        c->nscratch = c->scratch ? floats : 0;
    }
    return c->scratch;
}

static void *storage(cpu *c, const tf_value *v) { return v->kind == TF_VAL_CONST ? NULL : c->ptr[root_of(v)->id]; }

/* A block of its own for a value memplan did not place, counted. */
static void *unplanned(cpu *c, const tf_value *v)
{
    void *p = own(c, value_bytes(v));
    if (p) c->unplanned_bytes += (int64_t)value_bytes(v);
    return p;
}

/* Give every value a kernel, an output or an update touches its storage. */
static tf_status place_values(tf_session_t *s, cpu *c)
{
    const tf_module *m = s->p->m;
    int V = m->next_id > 0 ? m->next_id : 1;
    c->ptr = tf_calloc((size_t)V, sizeof *c->ptr);
    if (!c->ptr) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    if (m->plan.planned && m->plan.arena_bytes > 0) {
        size_t n = ((size_t)m->plan.arena_bytes + 63) / 64 * 64;
        if (!(c->arena = tf_calloc_aligned(64, n)))   /* zero, and only the pages a step touches are ever written */
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory allocating the %lld-byte activation arena",
                                (long long)m->plan.arena_bytes);
        c->arena_bytes = (int64_t)n;
        huge_pages(c->arena, n);
    }
    for (int i = 0; i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        if (!(c->ptr[v->id] = own(c, value_bytes(v)))) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        c->state_bytes += (int64_t)value_bytes(v);
    }
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        const tf_value *v = n->out;
        if (root_of(v) != v) continue;
        if (v->home) c->ptr[v->id] = c->ptr[v->home->id];   /* an update memplan writes in place */
        else if (c->arena && v->offset >= 0) c->ptr[v->id] = c->arena + v->offset;
    }
    /* what memplan left unplaced but something reads or writes */
    for (int i = 0; i < c->plan->nkernels; i++)
        for (int b = 0; b < c->plan->kernels[i].nbufs; b++) {
            const tf_value *v = root_of(c->plan->kernels[i].bufs[b].value);
            if (!c->ptr[v->id] && !(c->ptr[v->id] = unplanned(c, v)))
                return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        }
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *k = &c->plan->kernels[i];
        if (k->kind == TF_K_VIEW || !k->lib) continue;
        const tf_value *v = root_of(k->lib->out);
        if (!c->ptr[v->id] && !(c->ptr[v->id] = unplanned(c, v)))
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    }
    for (int i = 0; i < m->noutputs + m->nupdates; i++) {
        const tf_value *v = root_of(i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value);
        if (v->kind != TF_VAL_CONST && !c->ptr[v->id] && !(c->ptr[v->id] = unplanned(c, v)))
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    }
    return TF_OK;
}

static bool is_float16(tf_dt t) { return t == TF_DT_F16 || t == TF_DT_BF16; }
static bool gemm_dtype(tf_dt t) { return t == TF_DT_F32 || is_float16(t); }

static bool ids_dtype(tf_dt t) { return t == TF_DT_I64 || t == TF_DT_I32; }

static how library_how(const tf_node *n)
{
    tf_op_exec ex = tf_op_exec_of(n->op);
    for (int q = 0; q < n->nin; q++)
        if (n->in[q]->kind == TF_VAL_CONST) return RUN_FALLBACK;
    switch (ex) {
    case TF_OPX_GATHER: return ids_dtype(n->in[0]->type.dtype) ? RUN_GATHER : RUN_FALLBACK;
    case TF_OPX_SCATTER:
        return ids_dtype(n->in[0]->type.dtype) && n->out->type.dtype == TF_DT_F32 && n->in[1]->type.dtype == TF_DT_F32
                   ? RUN_SCATTER : RUN_FALLBACK;
    case TF_OPX_CONCAT: case TF_OPX_SLICE_GRAD:   /* copies of any dtype */
        for (int q = 0; q < n->nin; q++)
            if (n->in[q]->type.dtype != n->out->type.dtype) return RUN_FALLBACK;
        return ex == TF_OPX_CONCAT ? RUN_CONCAT : RUN_SLICE_GRAD;
    default: break;
    }
    for (int q = 0; q < n->nin; q++)
        if (!gemm_dtype(n->in[q]->type.dtype)) return RUN_FALLBACK;
    if (!gemm_dtype(n->out->type.dtype)) return RUN_FALLBACK;
    switch (ex) {
    case TF_OPX_GEMM: return RUN_MATMUL;
    case TF_OPX_CONV:   /* conv2d's forward takes 2-d images only; its gradients exist only for those */
        return n->op == TF_OP_CONV2D_GRAD_INPUT ? RUN_CONV_GI : n->op == TF_OP_CONV2D_GRAD_WEIGHT ? RUN_CONV_GW
               : n->in[0]->type.rank == 4 ? RUN_CONV : RUN_FALLBACK;
    case TF_OPX_POOL: return n->in[0]->type.rank == 4 ? RUN_POOL : RUN_FALLBACK;
    case TF_OPX_POOL_GRAD: return n->out->type.rank == 4 ? RUN_POOL_GRAD : RUN_FALLBACK;
    default: return RUN_FALLBACK;
    }
}

static void conv_choose(tf_session_t *s, cpu *c, ckernel *ck);
/* bf16 x bf16 matmuls go to tf_cpu_gemm_bf16 where this machine has one;
 * the f16/bf16 operands still widened that two or more GEMMs of a run read
 * get a float32 copy of their own (gemm_operand), made once per run, up to
 * $TFUSE_CPU_WIDE_CACHE_MB MiB in all (default 256; 0: none), in the
 * order the plan first reads them. */
/* $name in MiB (a number, 0 or more; 0: none), else dflt, as bytes; a value
 * that is no such number is an error, not a silent default. */
static tf_status env_mib(tf_session_t *s, const char *name, double dflt, double *bytes)
{
    const char *e = tf_env(name);
    double v = dflt;
    if (e && *e) {
        char *end;
        errno = 0;
        v = strtod(e, &end);
        if (errno || *end || !(v >= 0) || v > 1e9)
            return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: %s=%.100s: expected a number of MiB, 0 or more (e.g. %s=512)",
                                name, e, name);
    }
    *bytes = v * 1048576.0;
    return TF_OK;
}

static tf_status plan_gemm_operands(tf_session_t *s, cpu *c)
{
    const tf_module *m = s->p->m;
    int V = m->next_id > 0 ? m->next_id : 1;
    bool bf16_gemm = tf_cpu_bf16_gemm_kind() != TF_BF16_GEMM_NONE;
    double budget;
    tf_status st = env_mib(s, "TFUSE_CPU_WIDE_CACHE_MB", 256.0, &budget);
    if (st) return st;
    unsigned char *uses = tf_calloc((size_t)V, 1);
    if (!uses) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    bool any = false;
    for (int i = 0; i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        if (ck->how != RUN_MATMUL) continue;
        const tf_node *n = ck->k->lib;
        if (bf16_gemm && n->in[0]->type.dtype == TF_DT_BF16 && n->in[1]->type.dtype == TF_DT_BF16) {
            ck->how = RUN_MATMUL_BF16;
            continue;
        }
        for (int q = 0; q < 2; q++) {
            const tf_value *r = root_of(n->in[q]);
            if (is_float16(n->in[q]->type.dtype) && r->kind != TF_VAL_CONST && uses[r->id] < 2) any |= ++uses[r->id] == 2;
        }
    }
    if (any && budget > 0) {
        c->wide = tf_calloc((size_t)V, sizeof *c->wide);
        c->wide_gen = tf_calloc((size_t)V, sizeof *c->wide_gen);
        if (!c->wide || !c->wide_gen) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        for (int i = 0; !st && i < c->plan->nkernels; i++) {
            if (c->ks[i].how != RUN_MATMUL) continue;
            for (int q = 0; !st && q < 2; q++) {
                const tf_value *v = c->ks[i].k->lib->in[q], *r = root_of(v);
                if (!is_float16(v->type.dtype) || r->kind == TF_VAL_CONST || uses[r->id] < 2 || c->wide[r->id]) continue;
                size_t bytes = (size_t)numel(v) * sizeof(float);
                if ((double)(c->wide_bytes + bytes) > budget) continue;
                if (!(c->wide[r->id] = own(c, bytes))) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
                c->wide_bytes += bytes;
            }
        }
    }
    tf_free(uses);
    return st;
}

/* Whether state value r is ever written by the step (an update's target). */
static bool step_writes(const tf_module *m, const tf_value *r)
{
    for (int i = 0; i < m->nupdates; i++)
        if (m->updates[i].buffer == r) return true;
    return false;
}

/* Packed weights: an f32 GEMM whose right operand is a param or buffer the
 * step never writes (inference) runs through oneDNN with that operand
 * packed once into the kernel's layout (gemm_dnnl.h), up to
 * $TFUSE_CPU_PACKED_MB MiB of packed copies in all (default 1024; 0: none),
 * in plan order. A training step rewrites its weights every step, so its
 * GEMMs stay on OpenBLAS. */
static tf_status plan_packed_gemms(tf_session_t *s, cpu *c)
{
    const tf_module *m = s->p->m;
    double budget;
    tf_status st = env_mib(s, "TFUSE_CPU_PACKED_MB", 1024.0, &budget);
    if (st) return st;
    size_t scratch = 0;
    c->state_gen = 1;
    for (int i = 0; i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        if (ck->how != RUN_MATMUL) continue;
        const tf_node *n = ck->k->lib;
        const tf_value *av = n->in[0], *bv = n->in[1], *ov = n->out, *r = root_of(bv);
        bool ta = tf_node_bool(n, "transpose_a"), tb = tf_node_bool(n, "transpose_b");
        int ra = av->type.rank - 2, rk = ov->type.rank - 2;
        bool a_full = ra == rk;
        for (int d = 0; a_full && d < rk; d++) a_full = av->type.dims[d].n == ov->type.dims[d].n;
        char *why = ck->gemm_why;
        size_t wn = sizeof ck->gemm_why;
        if (s->p->settings.cpu_gemm_openblas) snprintf(why, wn, "--cpu-gemm=openblas");
        else if (av->type.dtype != TF_DT_F32 || bv->type.dtype != TF_DT_F32 || ov->type.dtype != TF_DT_F32)
            snprintf(why, wn, "not all f32");
        else if (r->kind != TF_VAL_PARAM && r->kind != TF_VAL_BUFFER)
            snprintf(why, wn, "the right operand is computed in the step, not a weight");
        else if (step_writes(m, r)) snprintf(why, wn, "the step updates its weights (%s)", r->name ? r->name : "?");
        else if (bv->type.rank != 2 || (rk > 0 && (ta || !a_full))) snprintf(why, wn, "a batched GEMM");
        else {
            int64_t N = ov->type.dims[rk + 1].n, K = av->type.dims[ta ? ra : ra + 1].n, M = numel(ov) / (N ? N : 1);
            bool oom = false;
            if (!(ck->dgemm = tf_dnnl_gemm_create(M, N, K, ta, tb, tf_pool_threads(c->pool), &oom, why, wn))) {
                if (oom) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
                continue;
            }
            size_t bytes = tf_dnnl_gemm_packed_bytes(ck->dgemm);
            if ((double)(c->packed_bytes + bytes) > budget) {
                snprintf(why, wn, "packed weights over $TFUSE_CPU_PACKED_MB (%.0f MiB)", budget / 1048576.0);
                tf_dnnl_gemm_free(ck->dgemm);
                ck->dgemm = NULL;
                continue;
            }
            if (!(ck->packed = own(c, bytes))) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            c->packed_bytes += bytes;
            if (tf_dnnl_gemm_scratch_bytes(ck->dgemm) > scratch) scratch = tf_dnnl_gemm_scratch_bytes(ck->dgemm);
        }
    }
    if (scratch && !(c->gemm_scratch = tf_malloc_aligned(64, (scratch + 63) / 64 * 64)))
        return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    c->gemm_scratch_bytes = scratch ? (scratch + 63) / 64 * 64 : 0;
    return TF_OK;
}

static tf_status prepare(tf_session_t *s, cpu *c)
{
    c->ks = tf_calloc((size_t)(c->plan->nkernels ? c->plan->nkernels : 1), sizeof *c->ks);
    if (!c->ks) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < c->plan->nkernels; i++) c->ks[i].jit_slot = -1;
    double t0 = now_ns();
    /* the kernels' code: what the process, a package or the disk has, then the rest compiled on the pool's threads */
    jit_req *rs = tf_calloc((size_t)(c->plan->nkernels ? c->plan->nkernels : 1), sizeof *rs);
    if (!rs) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < c->plan->nkernels; i++) rs[i].slot = -1;   /* none yet, also for those a failure leaves unvisited */
    tf_status st = TF_OK;
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *k = &c->plan->kernels[i];
        ckernel *ck = &c->ks[i];
        ck->k = k;
        rs[i].slot = -1;
        ck->bufs = tf_calloc((size_t)(k->nbufs ? k->nbufs : 1), sizeof *ck->bufs);
        if (!ck->bufs) {
            st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            break;
        }
        for (int b = 0; b < k->nbufs; b++) ck->bufs[b] = storage(c, k->bufs[b].value);
        int ax = tf_kernel_split_axis(k);
        ck->extent = ax < 0 ? 1 : k->dims[ax];
        ck->work = 1;
        for (int a = 0; a < k->rank; a++) ck->work *= k->dims[a];
        if (k->kind == TF_K_VIEW) ck->how = RUN_VIEW;
        else if (k->lib) ck->how = library_how(k->lib);
        else ck->how = k->nexprs ? RUN_JIT : RUN_NOTHING;
        ck->label_expr = -1;
        for (int e = 0; e < k->nexprs && ck->how == RUN_JIT; e++) {
            const tf_kexpr *x = &k->exprs[e], *a = x->kind == TF_KX_OP && x->op == TF_OP_ONE_HOT ? &k->exprs[x->args[0]] : NULL;
            tf_dt t = a && a->kind == TF_KX_LOAD ? k->bufs[a->buf].value->type.dtype : TF_DT_F32;
            if (t == TF_DT_I64 || t == TF_DT_I32) ck->label_expr = e;
        }
        if (!k->nexprs || ck->how == RUN_VIEW || ck->how == RUN_FALLBACK) continue;
        tf_diag d;   /* (not zeroed: 6 KiB for each of hundreds of kernels) */
        d.status = TF_IR_OK;
        rs[i].k = k;
        if (jit_lookup(c->cache, s->p->settings.llvm_pipeline, s->p->pkg, &rs[i], &d)) {
            st = tf_from_diag(s->ctx, &d);
            break;
        }
    }
    if (!st) jit_compile_all(c->cache, c->pool, s->p->settings.llvm_pipeline, rs, c->plan->nkernels);
    for (int i = 0; !st && i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        jit_req *r = &rs[i];
        if (!r->k) continue;
        ck->jit_slot = r->slot;
        if (r->st) {
            if (!r->d) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            else if (r->d->status != TF_IR_ERR_RUNTIME) st = tf_from_diag(s->ctx, r->d);
            ck->how = RUN_FALLBACK;   /* the emitter says it cannot: the reference runs it */
            ck->fn = NULL;
            continue;
        }
        ck->fn = r->fn;
        c->jit_cached += r->hit;
        c->jit_disk += !r->hit && r->disk;
        c->jit_package += !r->hit && r->pkg;
        c->jit_compiled += !r->hit && !r->disk && !r->pkg;
    }
    for (int i = 0; i < c->plan->nkernels; i++) {
        if (c->ks[i].jit_slot < 0 && rs[i].slot >= 0) c->ks[i].jit_slot = rs[i].slot;   /* given back with the session */
        jit_req_free(&rs[i]);
    }
    tf_free(rs);
    if (st) return st;
    c->jit_ms = (now_ns() - t0) / 1e6;
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_CONV || c->ks[i].how == RUN_CONV_GI || c->ks[i].how == RUN_CONV_GW) conv_choose(s, c, &c->ks[i]);
    st = plan_gemm_operands(s, c);
    return st ? st : plan_packed_gemms(s, c);
}

/* ---- running ------------------------------------------------------------- */

typedef struct jit_job { tf_kernel_fn fn; void **bufs; const uint64_t *rt; } jit_job;

static void jit_piece(void *arg, int64_t lo, int64_t hi)
{
    const jit_job *j = arg;
    j->fn(j->bufs, lo, hi, j->rt);
}

static void run_fn(cpu *c, ckernel *ck)
{
    jit_job j = {ck->fn, ck->bufs, c->rt};
    if (ck->work < 16384 || ck->extent < 2) jit_piece(&j, 0, ck->extent);   /* threads would cost more than they save */
    else tf_pool_run(c->pool, ck->extent, jit_piece, &j);
}

/* f16/bf16 <-> f32 over n elements, split over the pool when long enough
 * to be worth it (lowp.c's vector code; every element converted alone, so
 * the split changes nothing). */
typedef struct conv_job { tf_dt t; bool widen; const void *src; void *dst; } conv_job;
enum { CONV_CHUNK = 1 << 15 };

static void convert_range(const conv_job *j, int64_t i0, int64_t n)
{
    if (j->widen) {
        const uint16_t *h = (const uint16_t *)j->src + i0;
        float *f = (float *)j->dst + i0;
        if (j->t == TF_DT_BF16) tf_cpu_bf16_to_f32(h, f, n);
        else tf_cpu_f16_to_f32(h, f, n);
    } else {
        const float *f = (const float *)j->src + i0;
        uint16_t *h = (uint16_t *)j->dst + i0;
        if (j->t == TF_DT_BF16) tf_cpu_f32_to_bf16(f, h, n);
        else tf_cpu_f32_to_f16(f, h, n);
    }
}

typedef struct conv_chunks_job { const conv_job *j; int64_t n; } conv_chunks_job;

/* chunks [lo, hi) of CONV_CHUNK elements (the last one short) */
static void conv_chunks(void *arg, int64_t lo, int64_t hi)
{
    const conv_chunks_job *cj = arg;
    int64_t i0 = lo * CONV_CHUNK, i1 = hi * CONV_CHUNK < cj->n ? hi * CONV_CHUNK : cj->n;
    if (i1 > i0) convert_range(cj->j, i0, i1 - i0);
}

static void convert(cpu *c, tf_dt t, bool widen, const void *src, void *dst, int64_t n)
{
    conv_job j = {t, widen, src, dst};
    if (n < 2 * CONV_CHUNK || tf_pool_threads(c->pool) < 2) {
        convert_range(&j, 0, n);
        return;
    }
    conv_chunks_job cj = {&j, n};
    tf_pool_run(c->pool, (n + CONV_CHUNK - 1) / CONV_CHUNK, conv_chunks, &cj);
}

/* A float32 view of a value: its storage, or a widened copy in dst. */
static const float *as_f32(cpu *c, const tf_value *v, float *dst)
{
    void *p = storage(c, v);
    tf_dt t = v->type.dtype;
    if (t == TF_DT_F32) return p;
    convert(c, t, true, p, dst, tf_type_numel(&v->type));
    return dst;
}

/* Round a float32 result into a value's storage (f16/bf16: nearest even). */
static void from_f32(cpu *c, const tf_value *v, const float *src)
{
    void *p = storage(c, v);
    if (v->type.dtype == TF_DT_F32) {
        if (p != src) memcpy(p, src, value_bytes(v));
        return;
    }
    convert(c, v->type.dtype, false, src, p, tf_type_numel(&v->type));
}

/* A GEMM operand as float32: as_f32, except that an f16/bf16 value several
 * GEMMs read is widened once per run into its own copy, which the later
 * GEMMs reuse (a weight read by the forward GEMM and the input-gradient
 * GEMM, an activation read by the next layer's GEMM and a weight-gradient
 * GEMM). A value is written once per run, so a copy made this run is current. */
static const float *gemm_operand(cpu *c, const tf_value *v, float *dst)
{
    const tf_value *r = root_of(v);
    float *w = r->kind != TF_VAL_CONST && c->wide ? c->wide[r->id] : NULL;
    if (!w) return as_f32(c, v, dst);
    if (c->wide_gen[r->id] != c->gen) {
        convert(c, v->type.dtype, true, storage(c, v), w, tf_type_numel(&v->type));
        c->wide_gen[r->id] = c->gen;
    }
    return w;
}


/* Batched matmul: batch indices [lo, hi), each GEMM on the pool (pool set)
 * or on the calling thread (pool NULL: the batches are what is split). */
typedef struct batch_job {
    tf_pool *pool;
    bool ta, tb, bf16;   /* bf16: A and B are bf16 bits, through tf_cpu_gemm_bf16 */
    int64_t M, N, K;
    int r;
    int64_t sa[TF_MAX_RANK], sb[TF_MAX_RANK], dims[TF_MAX_RANK];
    const void *A, *B;
    float *C;
} batch_job;

static void batch_piece(void *arg, int64_t lo, int64_t hi)
{
    const batch_job *j = arg;
    for (int64_t bi = lo; bi < hi; bi++) {
        int64_t oa = 0, ob = 0, rest = bi;
        for (int i = j->r - 1; i >= 0; i--) {
            int64_t ix = rest % j->dims[i];
            rest /= j->dims[i];
            oa += ix * j->sa[i], ob += ix * j->sb[i];
        }
        if (j->bf16)
            tf_cpu_gemm_bf16(j->pool, j->ta, j->tb, j->M, j->N, j->K, (const uint16_t *)j->A + oa, j->ta ? j->M : j->K,
                             (const uint16_t *)j->B + ob, j->tb ? j->K : j->N, j->C + bi * j->M * j->N, j->N, false);
        else
            tf_cpu_gemm(j->pool, j->ta, j->tb, j->M, j->N, j->K, (const float *)j->A + oa, j->ta ? j->M : j->K,
                        (const float *)j->B + ob, j->tb ? j->K : j->N, j->C + bi * j->M * j->N, j->N, false);
    }
}

/* A GEMM with packed weights: repacked first when they are older than the
 * last state write. false when oneDNN failed. */
static bool run_packed(cpu *c, ckernel *ck)
{
    const tf_node *n = ck->k->lib;
    if (ck->packed_gen != c->state_gen) {
        if (!tf_dnnl_gemm_pack(ck->dgemm, storage(c, n->in[1]), ck->packed)) return false;
        ck->packed_gen = c->state_gen;
    }
    return tf_dnnl_gemm_run(ck->dgemm, c->pool, storage(c, n->in[0]), ck->packed, storage(c, n->out), c->gemm_scratch);
}

/* bf16: both operands bf16, multiplied as they are stored (RUN_MATMUL_BF16). */
static void run_matmul(cpu *c, const tf_node *n, bool bf16)
{
    const tf_value *av = n->in[0], *bv = n->in[1], *ov = n->out;
    bool ta = tf_node_bool(n, "transpose_a"), tb = tf_node_bool(n, "transpose_b");
    int ra = av->type.rank - 2, rb = bv->type.rank - 2, r = ov->type.rank - 2;
    int64_t M = ov->type.dims[r].n, N = ov->type.dims[r + 1].n, K = av->type.dims[ta ? ra : ra + 1].n;
    bool wa = !bf16 && av->type.dtype != TF_DT_F32, wb = !bf16 && bv->type.dtype != TF_DT_F32;   /* widened here */
    size_t need = (size_t)((wa ? numel(av) : 0) + (wb ? numel(bv) : 0) + (ov->type.dtype != TF_DT_F32 ? numel(ov) : 0));
    float *sc = scratch(c, need ? need : 1), *at = sc;
    const void *A = storage(c, av), *B = storage(c, bv);
    if (wa) {
        A = gemm_operand(c, av, at);
        if (A == at) at += numel(av);
    }
    if (wb) {
        B = gemm_operand(c, bv, at);
        if (B == at) at += numel(bv);
    }
    float *C = ov->type.dtype == TF_DT_F32 ? storage(c, ov) : at;
    int64_t nb = 1;
    for (int i = 0; i < r; i++) nb *= ov->type.dims[i].n;
    bool a_full = ra == r;   /* a has every batch axis, unbroadcast */
    for (int i = 0; a_full && i < r; i++) a_full = av->type.dims[i].n == ov->type.dims[i].n;
    if (rb == 0 && !ta && a_full) {   /* [.., M, K] x [K, N]: one GEMM of nb*M rows */
        if (bf16) tf_cpu_gemm_bf16(c->pool, false, tb, nb * M, N, K, A, K, B, tb ? K : N, C, N, false);
        else tf_cpu_gemm(c->pool, false, tb, nb * M, N, K, A, K, B, tb ? K : N, C, N, false);
    } else {
        batch_job j = {.ta = ta, .tb = tb, .bf16 = bf16, .M = M, .N = N, .K = K, .r = r, .A = A, .B = B, .C = C};
        int64_t s = M * K;
        for (int i = ra - 1, k = r - 1; i >= 0; i--, k--) {
            j.sa[k] = av->type.dims[i].n == 1 ? 0 : s;
            s *= av->type.dims[i].n;
        }
        s = K * N;
        for (int i = rb - 1, k = r - 1; i >= 0; i--, k--) {
            j.sb[k] = bv->type.dims[i].n == 1 ? 0 : s;
            s *= bv->type.dims[i].n;
        }
        for (int i = 0; i < r; i++) j.dims[i] = ov->type.dims[i].n;
        /* many small GEMMs (attention's heads): whole GEMMs per thread; few
         * big ones: each GEMM split over the threads */
        if (nb >= 2 * tf_pool_threads(c->pool) && M * N * K < (int64_t)1 << 22) {
            tf_pool_run(c->pool, nb, batch_piece, &j);
        } else {
            j.pool = c->pool;
            batch_piece(&j, 0, nb);
        }
    }
    if (ov->type.dtype != TF_DT_F32) from_f32(c, ov, C);
}

static void conv_geom(const tf_node *n, const tf_type *x, const tf_type *w, const tf_type *y, tf_conv_geom *g)
{
    tf_node_pair(n, "stride", 1, 1, g->s);
    tf_node_pair(n, "padding", 0, 0, g->p);
    tf_node_pair(n, "dilation", 1, 1, g->dl);
    g->G = tf_node_int(n, "groups");
    if (g->G < 1) g->G = 1;
    g->N = x->dims[0].n, g->C = x->dims[1].n, g->H = x->dims[2].n, g->W = x->dims[3].n;
    g->O = w->dims[0].n, g->Cg = w->dims[1].n, g->KH = w->dims[2].n, g->KW = w->dims[3].n;
    g->Ho = y->dims[2].n, g->Wo = y->dims[3].n, g->Og = g->O / g->G;
}

static void run_conv(cpu *c, ckernel *ck)
{
    const tf_node *n = ck->k->lib;
    how h = ck->how;
    const tf_value *xv, *wv, *yv, *ov = n->out;
    if (h == RUN_CONV) xv = n->in[0], wv = n->in[1], yv = ov;
    else if (h == RUN_CONV_GI) xv = ov, wv = n->in[1], yv = n->in[0];
    else xv = n->in[0], wv = ov, yv = n->in[1];
    tf_conv_geom g;
    conv_geom(n, &xv->type, &wv->type, &yv->type, &g);
    int T = tf_pool_threads(c->pool);
    int64_t wsize = numel(wv);
    size_t need = 16;
    for (int q = 0; q < n->nin; q++) need += n->in[q]->type.dtype != TF_DT_F32 ? (size_t)numel(n->in[q]) : 0;
    need += ov->type.dtype != TF_DT_F32 ? (size_t)numel(ov) : 0;
    size_t lib = ck->dnnl ? (tf_dnnl_conv_scratch_bytes(ck->dnnl) + 3) / 4
                          : (size_t)T * (size_t)tf_conv_scratch(&g) + (h == RUN_CONV_GW ? (size_t)tf_conv_grad_weight_groups(&g) * (size_t)wsize : 0);
    size_t im2col_need = (size_t)T * (size_t)tf_conv_scratch(&g) + (h == RUN_CONV_GW ? (size_t)tf_conv_grad_weight_groups(&g) * (size_t)wsize : 0);
    float *at = scratch(c, need + (lib > im2col_need ? lib : im2col_need));   /* room for im2col too, should oneDNN fail */
    const float *in[3] = {0};
    for (int q = 0; q < n->nin; q++) {
        in[q] = as_f32(c, n->in[q], at);
        if (in[q] == at) at += numel(n->in[q]);
    }
    float *out = ov->type.dtype == TF_DT_F32 ? storage(c, ov) : at;
    if (out == at) at += numel(ov);
    at = (float *)(((uintptr_t)at + 63) / 64 * 64);   /* 64-byte aligned for oneDNN's scratch */
    if (ck->dnnl) {
        const float *bias = n->nin > 2 ? in[2] : NULL;
        float *dst = out;
        if (ck->epi_in_conv) bias = ck->bufs[ck->epi_bias], dst = ck->bufs[ck->epi_out];
        if (tf_dnnl_conv_run(ck->dnnl, c->pool, in[0], in[1], bias, dst, at)) {
            if (ov->type.dtype != TF_DT_F32 && !ck->epi_in_conv) from_f32(c, ov, out);
            return;
        }
        /* a primitive failed at run time: im2col from now on (said by --cpu-explain) */
        tf_dnnl_conv_free(ck->dnnl);
        ck->dnnl = NULL;
        ck->epi_in_conv = false;
        snprintf(ck->conv_why, sizeof ck->conv_why, "a oneDNN primitive failed when it ran; im2col since");
    }
    float *col = at;
    at += (size_t)T * (size_t)tf_conv_scratch(&g);
    if (h == RUN_CONV) tf_cpu_conv2d(c->pool, &g, in[0], in[1], n->nin > 2 ? in[2] : NULL, out, col);
    else if (h == RUN_CONV_GI) tf_cpu_conv2d_grad_input(c->pool, &g, in[0], in[1], out, col);
    else tf_cpu_conv2d_grad_weight(c->pool, &g, in[0], in[1], out, col, at);
    if (ov->type.dtype != TF_DT_F32) from_f32(c, ov, out);
}

/* Whether storage of a and b overlaps. */
static bool overlap(cpu *c, const tf_value *a, const tf_value *b)
{
    const unsigned char *pa = storage(c, a), *pb = storage(c, b);
    return pa && pb && pa < pb + value_bytes(b) && pb < pa + value_bytes(a);
}

/* A forward convolution's region epilogue that oneDNN can write instead:
 * exactly y = conv + bias[o] in f32, over the convolution's whole output,
 * stored once, with the convolution's own result read by nothing else (it
 * is then never written). relu(conv + bias[o]) is recognized but not
 * handed over: oneDNN's ReLU post-op loses NaN (relu(NaN) is NaN here, as
 * in the interpreter), so the epilogue kernel keeps it. The bias and the
 * result's buffers go to *bias and *out; why says why not. */
static bool conv_epilogue(cpu *c, const tf_module *m, const tf_kernel *k, const tf_conv_geom *g, int *bias, int *out, bool *relu, char *why, size_t n)
{
    const tf_node *nd = k->lib;
    const tf_value *cv = root_of(nd->out);
    if (!k->nexprs) return false;
    snprintf(why, n, "its epilogue is not conv + bias[channel] (+ ReLU) in f32");
    if (nd->nin > 2 || k->nstores != 1 || k->nreds || k->rank != 4 || cv->type.dtype != TF_DT_F32) return false;
    int64_t dims[4] = {g->N, g->O, g->Ho, g->Wo}, contig[4] = {g->O * g->Ho * g->Wo, g->Ho * g->Wo, g->Wo, 1}, chan[4] = {0, 1, 0, 0};
    for (int a = 0; a < 4; a++)
        if (k->dims[a] != dims[a]) return false;
    int conv_e = -1, bias_e = -1, add_e = -1, relu_e = -1;
    for (int e = 0; e < k->nexprs; e++) {
        const tf_kexpr *x = &k->exprs[e];
        if (x->dtype != TF_DT_F32) return false;
        if (x->kind == TF_KX_LOAD) {
            const tf_value *v = root_of(k->bufs[x->buf].value);
            bool is_conv = v == cv && !memcmp(x->strides, contig, sizeof contig) && x->offset == 0 && conv_e < 0;
            bool is_bias = !is_conv && !memcmp(x->strides, chan, sizeof chan) && x->offset == 0 && numel(v) == g->O &&
                           v->type.dtype == TF_DT_F32 && bias_e < 0;
            if (is_conv) conv_e = e;
            else if (is_bias) bias_e = e;
            else return false;
        } else if (x->kind == TF_KX_OP && x->op == TF_OP_ADD && add_e < 0 && x->nargs == 2 && conv_e >= 0 && bias_e >= 0 &&
                   ((x->args[0] == conv_e && x->args[1] == bias_e) || (x->args[0] == bias_e && x->args[1] == conv_e))) {
            add_e = e;
        } else if (x->kind == TF_KX_OP && x->op == TF_OP_RELU && relu_e < 0 && add_e >= 0 && x->args[0] == add_e) {
            relu_e = e;
        } else {
            return false;
        }
    }
    int last = relu_e >= 0 ? relu_e : add_e;
    if (add_e < 0 || last != k->nexprs - 1 || k->stores[0].expr != last || k->stores[0].reduced_domain) return false;
    if (relu_e >= 0)   /* test_cpu_conv's NaN case: oneDNN 2.6's post-op gave 0 where relu(NaN) is NaN */
        return snprintf(why, n, "ReLU stays in the epilogue kernel: oneDNN's ReLU post-op turns NaN into 0, tfuse's relu keeps NaN"),
               false;
    const tf_value *yv = k->bufs[k->stores[0].buf].value, *bv = k->bufs[k->exprs[bias_e].buf].value;
    if (yv->type.dtype != TF_DT_F32 || numel(yv) != numel(cv)) return false;
    /* the convolution's own result: read by no other kernel, not an output */
    for (int i = 0; i < c->plan->nkernels; i++) {
        const tf_kernel *o = &c->plan->kernels[i];
        if (o == k) continue;
        for (int b = 0; b < o->nbufs; b++)
            if (root_of(o->bufs[b].value) == cv) return snprintf(why, n, "kernel %s reads the convolution's result", o->name), false;
        if (o->lib)
            for (int q = 0; q < o->lib->nin; q++)
                if (o->lib->in[q]->kind != TF_VAL_CONST && root_of(o->lib->in[q]) == cv)
                    return snprintf(why, n, "kernel %s reads the convolution's result", o->name), false;
    }
    for (int i = 0; i < m->noutputs + m->nupdates; i++) {
        const tf_value *v = i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value;
        if (v->kind != TF_VAL_CONST && root_of(v) == cv) return snprintf(why, n, "the convolution's result is an output"), false;
    }
    for (int q = 0; q < 2; q++)
        if (overlap(c, yv, nd->in[q]) || overlap(c, bv, yv))
            return snprintf(why, n, "the epilogue's result shares memory with the convolution's operands"), false;
    *bias = k->exprs[bias_e].buf;
    *out = k->stores[0].buf;
    *relu = relu_e >= 0;
    return true;
}

/* How a convolution node runs: oneDNN's primitives, made now, or im2col
 * (conv_why says why). */
static void conv_choose(tf_session_t *s, cpu *c, ckernel *ck)
{
    const tf_node *n = ck->k->lib;
    const tf_value *xv, *wv, *yv, *ov = n->out;
    if (ck->how == RUN_CONV) xv = n->in[0], wv = n->in[1], yv = ov;
    else if (ck->how == RUN_CONV_GI) xv = ov, wv = n->in[1], yv = n->in[0];
    else xv = n->in[0], wv = ov, yv = n->in[1];
    if (s->p->settings.cpu_conv_im2col) {
        snprintf(ck->conv_why, sizeof ck->conv_why, "--cpu-conv=im2col");
        return;
    }
    if (!tf_dnnl_available()) {
        snprintf(ck->conv_why, sizeof ck->conv_why, "this build has no oneDNN");
        return;
    }
    tf_conv_geom g;
    conv_geom(n, &xv->type, &wv->type, &yv->type, &g);
    bool relu = false, fuse = false;
    char epi_why[200] = "";
    if (ck->how == RUN_CONV) fuse = conv_epilogue(c, s->p->m, ck->k, &g, &ck->epi_bias, &ck->epi_out, &relu, epi_why, sizeof epi_why);
    tf_dnnl_dir dir = ck->how == RUN_CONV ? TF_DNNL_FWD : ck->how == RUN_CONV_GI ? TF_DNNL_BWD_DATA : TF_DNNL_BWD_WEIGHTS;
    /* oneDNN picks its layout (blocked nChw16c, or nhwc for brgconv) and each
     * piece reorders into it and back: on bench/models/resnet.ir that beat
     * tfuse's NCHW handed to oneDNN as is (its gemm implementation, no faster
     * than im2col) by about 2x (bench/RESULTS.md, 2026-11-24) */
    bool blocked = true;
    ck->dnnl = tf_dnnl_conv_create(dir, &g, fuse || n->nin > 2, relu, blocked, tf_pool_threads(c->pool), ck->conv_why,
                                   sizeof ck->conv_why);
    if (ck->dnnl && fuse) ck->epi_in_conv = true;
    else if (ck->dnnl && epi_why[0]) snprintf(ck->conv_why, sizeof ck->conv_why, "epilogue kept: %s", epi_why);
}

static void run_pool(cpu *c, const tf_node *n, bool grad)
{
    const tf_value *big = grad ? n->out : n->in[0], *small = grad ? n->in[n->nin - 1] : n->out, *ov = n->out;
    tf_pool_geom g = {.planes = big->type.dims[0].n * big->type.dims[1].n, .H = big->type.dims[2].n, .W = big->type.dims[3].n,
                      .Ho = small->type.dims[2].n, .Wo = small->type.dims[3].n};
    tf_node_pair(n, "kernel", 1, 1, g.k);
    tf_node_pair(n, "stride", g.k[0], g.k[1], g.s);
    tf_node_pair(n, "padding", 0, 0, g.p);
    bool is_max = n->op == TF_OP_MAXPOOL2D || n->op == TF_OP_MAXPOOL2D_GRAD;
    size_t need = 1;
    for (int q = 0; q < n->nin; q++) need += n->in[q]->type.dtype != TF_DT_F32 ? (size_t)numel(n->in[q]) : 0;
    need += ov->type.dtype != TF_DT_F32 ? (size_t)numel(ov) : 0;
    float *at = scratch(c, need);
    const float *in[2] = {0};
    for (int q = 0; q < n->nin; q++) {
        in[q] = as_f32(c, n->in[q], at);
        if (in[q] == at) at += numel(n->in[q]);
    }
    float *out = ov->type.dtype == TF_DT_F32 ? storage(c, ov) : at;
    if (!grad) tf_cpu_pool2d(c->pool, &g, is_max, in[0], out);
    else tf_cpu_pool2d_grad(c->pool, &g, is_max, is_max ? in[0] : NULL, in[n->nin - 1], out);
    if (ov->type.dtype != TF_DT_F32) from_f32(c, ov, out);
}

static int64_t id_at(const tf_value *ids, const void *p, int64_t i)
{
    return ids->type.dtype == TF_DT_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* gather (embedding): rows of the table by id; scatter_add: its gradient.
 * false when an id is out of range: the reference then runs the kernel and
 * reports it, with the op's location. */
static bool run_gather(cpu *c, const tf_node *n, bool scatter)
{
    const tf_value *ids = n->in[0], *tab = scatter ? n->out : n->in[1];
    int64_t V = tab->type.rank ? tab->type.dims[0].n : 1, rows = numel(ids);
    int64_t row = V > 0 ? numel(tab) / V : 0;
    const void *ip = storage(c, ids);
    for (int64_t i = 0; i < rows; i++)
        if (id_at(ids, ip, i) < 0 || id_at(ids, ip, i) >= V) return false;
    if (!scatter) {
        size_t rb = (size_t)row * (size_t)tf_dtype_bytes(tab->type.dtype);
        const char *src = storage(c, tab);
        char *dst = storage(c, n->out);
        for (int64_t i = 0; i < rows; i++) memcpy(dst + (size_t)i * rb, src + (size_t)id_at(ids, ip, i) * rb, rb);
        return true;
    }
    float *dst = storage(c, n->out);
    const float *dy = storage(c, n->in[1]);
    memset(dst, 0, value_bytes(n->out));
    for (int64_t i = 0; i < rows; i++) {
        float *d = dst + id_at(ids, ip, i) * row;
        const float *s = dy + i * row;
        for (int64_t j = 0; j < row; j++) d[j] += s[j];
    }
    return true;
}

/* concat: out as [outer, len, inner], operand i as [outer, len_i, inner]
 * placed at its offset along the axis. slice_grad: zeros, dy's rows at
 * start + j * step. Both move bytes, so any dtype; false for an axis the
 * verifier should have refused. */
static bool run_copy(cpu *c, const tf_node *n)
{
    const tf_value *out = n->out;
    int rank = out->type.rank, ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), rank, &ax)) return false;
    size_t es = (size_t)tf_dtype_bytes(out->type.dtype);
    int64_t outer = 1, inner = 1, len = out->type.dims[ax].n;
    for (int i = 0; i < ax; i++) outer *= out->type.dims[i].n;
    for (int i = ax + 1; i < rank; i++) inner *= out->type.dims[i].n;
    char *dst = storage(c, out);
    if (n->op == TF_OP_CONCAT) {
        int64_t pos = 0;
        for (int q = 0; q < n->nin; q++) {
            int64_t m = n->in[q]->type.dims[ax].n;
            const char *src = storage(c, n->in[q]);
            for (int64_t o = 0; o < outer; o++)
                memcpy(dst + (size_t)((o * len + pos) * inner) * es, src + (size_t)(o * m * inner) * es, (size_t)(m * inner) * es);
            pos += m;
        }
        return true;
    }
    int64_t m = n->in[0]->type.dims[ax].n, start = tf_node_int(n, "start"), step = tf_node_int(n, "step");
    tf_slice_bounds(len, start, len, &start, NULL);
    if (m > 0 && start + (m - 1) * step >= len) return false;
    const char *src = storage(c, n->in[0]);
    memset(dst, 0, value_bytes(out));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < m; j++)
            memcpy(dst + (size_t)((o * len + start + j * step) * inner) * es, src + (size_t)((o * m + j) * inner) * es,
                   (size_t)inner * es);
    return true;
}

/* The reference runs the kernel on widened copies of its buffers. */
static tf_status run_fallback(tf_session_t *s, cpu *c, const tf_kernel *k)
{
    tf_diag d = {0};
    if (!c->ip && !(c->ip = tf_interp_create(s->p->m, s->p->mode, s->seed)))   /* its tensors: only what fallbacks touch */
        return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    tf_interp_set_step(c->ip, c->rt[1]);
    for (int b = 0; b < k->nbufs; b++) {
        const tf_value *v = k->bufs[b].value;
        tf_tensor *t = tf_interp_tensor(c->ip, v, &d);
        if (!t) return tf_from_diag(s->ctx, &d);
        const void *p = storage(c, v);
        for (int64_t i = 0; i < t->numel; i++) t->data[i] = tf_elem_load(v->type.dtype, p, i);
    }
    tf_kernel_plan one = {.kernels = (tf_kernel *)k, .nkernels = 1};
    if (tf_kernels_eval(&one, c->ip, &d)) return tf_from_diag(s->ctx, &d);
    for (int b = 0; b < k->nbufs; b++) {
        const tf_value *v = k->bufs[b].value;
        if (!k->bufs[b].written) continue;
        tf_tensor *t = tf_interp_tensor(c->ip, v, &d);
        if (!t) return tf_from_diag(s->ctx, &d);
        void *p = storage(c, v);
        for (int64_t i = 0; i < t->numel; i++) tf_elem_store(v->type.dtype, p, i, t->data[i]);
    }
    return TF_OK;
}

/* A one_hot's labels, when they come from a computed buffer (inputs are
 * checked by the API before the step): out of range is an error with the
 * op's place, as the interpreter reports it, not a row of zeros. */
static tf_status check_labels(tf_session_t *s, cpu *c, const ckernel *ck)
{
    const tf_kernel *k = ck->k;
    const tf_kexpr *x = &k->exprs[ck->label_expr], *a = &k->exprs[x->args[0]];
    const tf_value *v = k->bufs[a->buf].value;
    const void *p = storage(c, v);
    int64_t depth = tf_node_int(x->node, "depth"), n = numel(v);
    for (int64_t i = 0; i < n; i++) {
        int64_t y = v->type.dtype == TF_DT_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
        if (y >= 0 && y < depth) continue;
        tf_diag d = {0};
        tf_diag_error(&d, TF_IR_ERR_RUNTIME, &x->node->loc, "one_hot: label %lld at position %lld is out of range [0, %lld)",
                      (long long)y, (long long)i, (long long)depth);
        return tf_from_diag(s->ctx, &d);
    }
    return TF_OK;
}

static tf_status run_kernel(tf_session_t *s, cpu *c, ckernel *ck)
{
    const tf_kernel *k = ck->k;
    if (ck->label_expr >= 0) {
        tf_status st = check_labels(s, c, ck);
        if (st) return st;
    }
    switch (ck->how) {
    case RUN_NOTHING: return TF_OK;
    case RUN_VIEW: {
        const tf_value *src = k->lib->in[0], *dst = k->lib->out;
        void *to = storage(c, dst);
        if (src->kind == TF_VAL_CONST) {
            for (int64_t i = 0; i < numel(dst); i++) tf_elem_store(dst->type.dtype, to, i, tf_dtype_round(src->type.dtype, src->cval));
        } else if (storage(c, src) != to) {
            memmove(to, storage(c, src), value_bytes(dst));
        }
        return TF_OK;
    }
    case RUN_FALLBACK: return run_fallback(s, c, k);
    case RUN_MATMUL: case RUN_MATMUL_BF16:
        if (ck->dgemm && !run_packed(c, ck))
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: kernel %s: oneDNN's matmul failed (--cpu-gemm=openblas avoids it)",
                                k->name);
        if (!ck->dgemm) run_matmul(c, k->lib, ck->how == RUN_MATMUL_BF16);
        break;
    case RUN_CONV: case RUN_CONV_GI: case RUN_CONV_GW:
        run_conv(c, ck);
        if (ck->epi_in_conv) return TF_OK;   /* the primitive wrote the epilogue's result */
        break;
    case RUN_POOL: case RUN_POOL_GRAD: run_pool(c, k->lib, ck->how == RUN_POOL_GRAD); break;
    case RUN_GATHER: case RUN_SCATTER:
        if (!run_gather(c, k->lib, ck->how == RUN_SCATTER)) return run_fallback(s, c, k);
        break;
    case RUN_CONCAT: case RUN_SLICE_GRAD:
        if (!run_copy(c, k->lib)) return run_fallback(s, c, k);
        break;
    case RUN_JIT: break;
    }
    if (ck->fn) run_fn(c, ck);
    return TF_OK;
}

static tf_status cpu_run(tf_session_t *s)
{
    cpu *c = s->impl;
    const tf_program_t *p = s->p;
    const tf_module *m = p->m;
    for (int i = 0; i < p->inputs.n; i++) {
        const tf_value *v = p->inputs.items[i];
        memcpy(c->ptr[v->id], s->bound[i], value_bytes(v));
    }
    if (c->nscratch == 0 && !scratch(c, 1)) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    c->gen++;
    for (int i = 0; i < c->plan->nkernels; i++) {
        ckernel *ck = &c->ks[i];
        double t0 = c->profile ? now_ns() : 0;
        tf_status st = run_kernel(s, c, ck);
        if (st) return st;
        if (c->profile) {
            ck->ns += now_ns() - t0;
            ck->calls++;
        }
    }
    /* updates: read every new value before writing any state */
    void **staged = tf_calloc((size_t)(m->nupdates ? m->nupdates : 1), sizeof *staged);
    if (!staged) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < m->nupdates; i++) {
        const tf_value *v = root_of(m->updates[i].value);
        if (v->kind == TF_VAL_NODE) continue;   /* activations are not state: safe to read late */
        if ((staged[i] = tf_malloc(value_bytes(v) ? value_bytes(v) : 1))) memcpy(staged[i], storage(c, v), value_bytes(v));
    }
    for (int i = 0; i < m->nupdates; i++) {
        const tf_value *v = m->updates[i].value, *dst = m->updates[i].buffer;
        void *src = staged[i] ? staged[i] : storage(c, v);
        if (v->kind == TF_VAL_CONST) {
            for (int64_t j = 0; j < numel(dst); j++) tf_elem_store(dst->type.dtype, storage(c, dst), j, tf_dtype_round(v->type.dtype, v->cval));
        } else if (src && src != storage(c, dst)) {
            memcpy(storage(c, dst), src, value_bytes(dst));
        }
        tf_free(staged[i]);
    }
    tf_free(staged);
    for (int i = 0; i < m->noutputs; i++) {
        const tf_value *v = m->outputs[i].value;
        if (v->kind == TF_VAL_CONST) {
            for (int64_t j = 0; j < numel(v); j++) tf_elem_store(v->type.dtype, s->out[i], j, tf_dtype_round(v->type.dtype, v->cval));
        } else {
            memcpy(s->out[i], storage(c, v), value_bytes(v));
        }
    }
    c->rt[1]++;
    return TF_OK;
}

/* ---- packages ------------------------------------------------------------ */

/* This machine's target id, through the context cache's JIT (made if need
 * be), malloc'd; NULL with *d filled when the JIT cannot be made. */
static char *cache_target(tf_cache_t *c, tf_diag *d)
{
    char *t = NULL;
    pthread_mutex_lock(&c->mu);
    jit_cache *jc = c->cpu;
    if (!jc && !(jc = c->cpu = tf_calloc(1, sizeof *jc))) tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    else if (host_target(jc, d) && !(t = tf_strdup(jc->target))) tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    pthread_mutex_unlock(&c->mu);
    return t;
}

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

static tf_status cpu_package_code(tf_context_t *ctx, const tf_program_t *p, const char *archs, tf_pkg *pkg, int *nobjects,
                                  int *cached)
{
    (void)archs;
    *nobjects = *cached = 0;
    if (!p->has_plan) return TF_OK;
    tf_diag d = {0};
    tf_status st = TF_OK;
    char *target = cache_target(ctx->cache, &d), why[256], dir[4096], name[64];
    if (!target) return tf_from_diag(ctx, &d);
    bool have_dir = tf_cache_subdir("cpu", dir, sizeof dir);
    pkg_obj *os = tf_calloc((size_t)(p->plan.nkernels ? p->plan.nkernels : 1), sizeof *os);
    int n = 0;
    if (!os || !tf_pkg_add(pkg, "cpu/target", target, strlen(target), why, sizeof why))
        st = tf_set_error(ctx, TF_ERR_OOM, "error: %s", os ? why : "out of memory");
    /* the kernels with code, each key once, and what the disk cache has of them */
    for (int i = 0; !st && i < p->plan.nkernels; i++) {
        const tf_kernel *k = &p->plan.kernels[i];
        if (!k->nexprs || k->kind == TF_K_VIEW || (k->lib && library_how(k->lib) == RUN_FALLBACK)) continue;
        pkg_obj *o = &os[n];
        char *key = jit_key(k, p->settings.llvm_pipeline);
        bool ok = key && kernel_sym(target, key, &o->dkey, o->sym);
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
        o->from_disk = have_dir && disk_read(o->path, o->dkey, &o->obj, &o->nobj);
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
        if (!o->from_disk && o->path[0]) disk_write(o->path, o->dkey, o->obj, o->nobj);
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

static tf_status cpu_package_check(tf_context_t *ctx, const tf_pkg *pkg, const char *path)
{
    const tf_pkg_section *t = tf_pkg_find(pkg, "cpu/target");
    if (!t) return tf_set_error(ctx, TF_ERR_FORMAT, "%s: error: the package has no cpu code (no section cpu/target)", path);
    tf_diag d = {0};
    char *here = cache_target(ctx->cache, &d);
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

/* ---- the backend interface ------------------------------------------------ */

static void cpu_free(tf_session_t *s)
{
    cpu *c = s->impl;
    if (!c) return;
    for (int i = 0; c->ks && i < c->plan->nkernels; i++) {
        tf_free(c->ks[i].bufs);
        jit_put(c->cache, c->ks[i].jit_slot);
        tf_dnnl_conv_free(c->ks[i].dnnl);
        tf_dnnl_gemm_free(c->ks[i].dgemm);
    }
    tf_free_aligned(c->gemm_scratch);
    tf_cache_release(c->cache);
    tf_free(c->ks);
    for (int i = 0; i < c->nowned; i++) tf_free_aligned(c->owned[i]);
    tf_free(c->owned);
    tf_free_aligned(c->arena);
    tf_free(c->ptr);
    tf_free_aligned(c->scratch);
    tf_free(c->wide);
    tf_free(c->wide_gen);
    tf_pool_free(c->pool);
    tf_interp_free(c->ip);
    tf_free(c);
    s->impl = NULL;
}

/* --cpu-explain: how each convolution runs. */
static void explain_convs(FILE *f, const cpu *c)
{
    char lib[256], how[1024];
    tf_dnnl_describe(lib, sizeof lib);
    fprintf(f, "cpu: %d threads; convolutions and packed GEMMs: %s\n", tf_pool_threads(c->pool), lib);
    for (int i = 0; i < c->plan->nkernels; i++) {
        const ckernel *ck = &c->ks[i];
        if (ck->how == RUN_MATMUL || ck->how == RUN_MATMUL_BF16) {
            const tf_value *ov = ck->k->lib->out;
            int64_t N = ov->type.dims[ov->type.rank - 1].n, M = numel(ov) / (N ? N : 1);
            if (ck->dgemm) tf_dnnl_gemm_explain(ck->dgemm, how, sizeof how);
            else snprintf(how, sizeof how, "%s: %s", ck->how == RUN_MATMUL_BF16 ? "the bf16 GEMM" : tf_cpu_blas_name(),
                          ck->how == RUN_MATMUL_BF16 ? "bf16 operands" : ck->gemm_why);
            fprintf(f, "cpu: kernel %s: matmul (%lld x %lld) through %s\n", ck->k->name, (long long)M, (long long)N, how);
            continue;
        }
        if (ck->how != RUN_CONV && ck->how != RUN_CONV_GI && ck->how != RUN_CONV_GW) continue;
        const char *op = tf_op_info_of(ck->k->lib->op)->name;
        if (!ck->dnnl) {
            fprintf(f, "cpu: kernel %s: %s through im2col + GEMM (%s): %s\n", ck->k->name, op, tf_cpu_blas_name(), ck->conv_why);
            continue;
        }
        tf_dnnl_conv_explain(ck->dnnl, how, sizeof how);
        fprintf(f, "cpu: kernel %s: %s through %s%s%s%s\n", ck->k->name, op, how,
                ck->epi_in_conv ? "; the region's epilogue is in the primitive (no epilogue kernel)" : "",
                ck->conv_why[0] ? "; " : "", ck->conv_why);
    }
}

/* A param's or buffer's initial value into storage, INIT_CHUNK elements
 * at a time: f32 and f16/bf16 through float (exact: the values are
 * already rounded to dt), the rest through tf_elem_store. */
enum { INIT_CHUNK = 1024 };
typedef struct init_job {
    const tf_value *v;
    uint64_t seed;
    void *dst;
    int64_t n;
} init_job;

static void init_chunks(void *arg, int64_t lo, int64_t hi)
{
    const init_job *j = arg;
    tf_dt dt = j->v->type.dtype;
    double x[INIT_CHUNK];
    float f[INIT_CHUNK];
    for (int64_t c = lo; c < hi; c++) {
        int64_t k0 = c * INIT_CHUNK, n = j->n - k0 < INIT_CHUNK ? j->n - k0 : INIT_CHUNK;
        tf_interp_init_range(j->v, j->seed, k0, k0 + n, x);
        if (dt != TF_DT_F32 && !is_float16(dt)) {
            for (int64_t k = 0; k < n; k++) tf_elem_store(dt, j->dst, k0 + k, x[k]);
            continue;
        }
        float *to = dt == TF_DT_F32 ? (float *)j->dst + k0 : f;
        for (int64_t k = 0; k < n; k++) to[k] = (float)x[k];
        if (dt == TF_DT_BF16) tf_cpu_f32_to_bf16(f, (uint16_t *)j->dst + k0, n);
        else if (dt == TF_DT_F16) tf_cpu_f32_to_f16(f, (uint16_t *)j->dst + k0, n);
    }
}

static tf_status cpu_create(tf_session_t *s)
{
    static const tf_kernel_plan no_plan;
    cpu *c = tf_calloc(1, sizeof *c);
    if (!c) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    s->impl = c;
    c->plan = &no_plan;
    c->cache = s->ctx->cache;
    tf_cache_retain(c->cache);
    tf_status st = TF_OK;
    c->rt[0] = s->seed;
    tf_cpu_blas_init();
    int threads = s->p->threads > 0 ? s->p->threads : tf_cpu_count();
    st = tf_program_plan(s->ctx, s->p, &c->plan);
    if (!st && !(c->pool = tf_pool_create(threads))) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: cannot start %d threads", threads);
    if (!st) st = place_values(s, c);
    if (!st) st = prepare(s, c);
    /* the interpreter's initial state (tf_interp_init_range: the same bits), straight into storage, on the pool;
     * not when a package gives it (api.c writes it next). zeros() needs nothing: place_values's storage is
     * calloc'd (own), so optimizer moments and the like are not written twice, nor their pages touched before
     * the first step uses them. */
    for (int i = 0; !st && !s->state_given && i < s->p->m->decls.n; i++) {
        const tf_value *v = s->p->m->decls.items[i];
        if (v->kind == TF_VAL_INPUT || tf_interp_init_is_zero(v)) continue;
        init_job j = {.v = v, .seed = s->seed, .dst = c->ptr[v->id], .n = numel(v)};
        tf_pool_run(c->pool, (j.n + INIT_CHUNK - 1) / INIT_CHUNK, init_chunks, &j);
        s->init_elements += j.n;
    }
    if (!st && tf_cpu_blas_warning()) {   /* once a process: GEMMs without OpenBLAS */
        static atomic_flag said = ATOMIC_FLAG_INIT;
        if (!atomic_flag_test_and_set(&said))
            fprintf(tf_context_diag(s->ctx), "tfuse: warning: cpu GEMMs run through %s, many times slower than OpenBLAS\n",
                    tf_cpu_blas_name());
    }
    if (!st && s->p->settings.cpu_explain) explain_convs(tf_context_diag(s->ctx), c);
    if (st) cpu_free(s);
    return st;
}

static tf_status cpu_state_read(tf_session_t *s, const tf_value *v, void *dst)
{
    cpu *c = s->impl;
    memcpy(dst, c->ptr[v->id], value_bytes(v));
    return TF_OK;
}

/* A copy of n bytes split over the pool in COPY_CHUNK pieces: a package's
 * params go into fresh storage, whose first touch (a page fault per page)
 * costs more than the copy; two threads take half each. */
enum { COPY_CHUNK = 1 << 18 };
typedef struct copy_job { unsigned char *dst; const unsigned char *src; size_t n; } copy_job;

static void copy_chunks(void *arg, int64_t lo, int64_t hi)
{
    const copy_job *j = arg;
    size_t a = (size_t)lo * COPY_CHUNK, b = (size_t)hi * COPY_CHUNK < j->n ? (size_t)hi * COPY_CHUNK : j->n;
    memcpy(j->dst + a, j->src + a, b - a);
}

static tf_status cpu_state_write(tf_session_t *s, const tf_value *v, const void *src)
{
    cpu *c = s->impl;
    copy_job j = {c->ptr[v->id], src, value_bytes(v)};
    tf_pool_run(c->pool, (int64_t)((j.n + COPY_CHUNK - 1) / COPY_CHUNK), copy_chunks, &j);
    c->state_gen++;   /* packed weights repack before their next use */
    return TF_OK;
}

/* tf_session_copy_bandwidth: 128 MiB, far past any cache, copied over the
 * session's threads as its kernels' work is; one untimed copy (which also
 * faults the pages in), then the median of seven. */
static tf_status cpu_copy_bandwidth(tf_session_t *s, double *gbps)
{
    cpu *c = s->impl;
    enum { BYTES = 128 << 20, TIMED = 7 };
    unsigned char *a = tf_malloc(BYTES), *b = tf_malloc(BYTES);
    if (!a || !b) {
        tf_free(a), tf_free(b);
        return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory: measuring a copy's bandwidth takes two blocks of %d MiB", BYTES >> 20);
    }
    memset(a, 1, BYTES);
    double ns[TIMED];
    copy_job j = {b, a, BYTES};
    for (int r = -1; r < TIMED; r++) {
        double t0 = now_ns();
        tf_pool_run(c->pool, (BYTES + COPY_CHUNK - 1) / COPY_CHUNK, copy_chunks, &j);
        if (r >= 0) ns[r] = now_ns() - t0;
    }
    tf_free(a), tf_free(b);
    *gbps = 2.0 * BYTES / tf_median(ns, TIMED);
    return TF_OK;
}

static uint64_t cpu_step_get(tf_session_t *s) { return ((cpu *)s->impl)->rt[1]; }
static void cpu_step_set(tf_session_t *s, uint64_t step) { ((cpu *)s->impl)->rt[1] = step; }

static const char *cpu_unavailable(void) { return tf_jit_unavailable(); }   /* libtfuse.so: its LLVM module is there */

static void cpu_set_profiling(tf_session_t *s, bool on)
{
    cpu *c = s->impl;
    c->profile = on;
    for (int i = 0; i < c->plan->nkernels; i++) c->ks[i].ns = 0, c->ks[i].calls = 0;
}

static size_t cpu_profile_count(tf_session_t *s) { return (size_t)((cpu *)s->impl)->plan->nkernels; }

static void cpu_profile_get(tf_session_t *s, size_t i, tf_kernel_profile *out)
{
    cpu *c = s->impl;
    const ckernel *ck = &c->ks[i];
    out->name = ck->k->name;
    static const char *dnnl_names[] = {"conv.onednn", "conv_grad_input.onednn", "conv_grad_weight.onednn"};
    out->how = ck->dnnl ? dnnl_names[ck->how - RUN_CONV] : ck->dgemm ? "gemm.onednn" : how_names[ck->how];
    out->total_ms = ck->ns / 1e6;
    out->calls = ck->calls;
    out->elements = ck->work;
    out->bytes = tf_kernel_bytes(ck->k);
}

static void cpu_info(tf_session_t *s, tf_session_info *out)
{
    cpu *c = s->impl;
    out->threads = tf_pool_threads(c->pool);
    out->kernels = tf_kernels_count(c->plan);
    out->jit_compiled = c->jit_compiled;
    out->jit_cached = c->jit_cached;
    out->jit_disk = c->jit_disk;
    out->jit_package = c->jit_package;
    out->disk_hits = c->jit_disk;
    out->disk_misses = c->jit_compiled;
    out->jit_ms = c->jit_ms;
    out->fallbacks = 0;
    for (int i = 0; i < c->plan->nkernels; i++) out->fallbacks += c->ks[i].how == RUN_FALLBACK;
    out->library = tf_cpu_blas_name();
    out->arena_bytes = c->arena_bytes;
    out->value_bytes = c->arena_bytes + c->state_bytes + c->unplanned_bytes;
    out->unplanned_bytes = c->unplanned_bytes;
    out->aux_bytes = (int64_t)(c->wide_bytes + c->packed_bytes + c->gemm_scratch_bytes + c->nscratch * sizeof(float));
}

/* --dump-llvm=DIR: DIR/kernels.ll, the optimized LLVM IR of every kernel
 * (one module per kernel, one after another). */
static tf_status cpu_dump_code(tf_context_t *ctx, const tf_program_t *p, const char *dir)
{
    const tf_kernel_plan *plan;
    tf_status st = tf_program_plan(ctx, p, &plan);
    if (st) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels.ll", dir);
    FILE *f = fopen(path, "w");
    bool ok = f != NULL;
    for (int i = 0; ok && i < plan->nkernels; i++) {
        char why[512];
        if (!tf_jit_supports(&plan->kernels[i], why, sizeof why)) {
            ok = fprintf(f, "; %s: not compiled: %s\n\n", plan->kernels[i].name, why) >= 0;
            continue;
        }
        char *ir = tf_jit_print_pipeline(&plan->kernels[i], p->settings.llvm_pipeline);
        ok = ir && fprintf(f, "; ---- kernel %s\n%s\n", plan->kernels[i].name, ir) >= 0;
        tf_free(ir);
    }
    if (f && fclose(f) != 0) ok = false;
    return ok ? TF_OK : tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot write: %s", path, strerror(errno));
}

static bool cpu_jit_supports(const tf_kernel *k, char *why, size_t n) { return tf_jit_supports(k, why, n); }

#else /* !TFUSE_HAVE_LLVM */

static const char *cpu_unavailable(void)
{
    return "this build has no LLVM (configured with -DTFUSE_WITH_LLVM=OFF or without llvm-config); "
           "use --target=interp, or rebuild with LLVM 14 installed";
}
static tf_status cpu_create(tf_session_t *s) { return tf_set_error(s->ctx, TF_ERR_UNAVAILABLE, "error: %s", cpu_unavailable()); }
static void cpu_free(tf_session_t *s) { (void)s; }
static tf_status cpu_run(tf_session_t *s) { (void)s; return TF_ERR_UNAVAILABLE; }
static tf_status cpu_state_read(tf_session_t *s, const tf_value *v, void *dst) { (void)s; (void)v; (void)dst; return TF_ERR_UNAVAILABLE; }
static tf_status cpu_state_write(tf_session_t *s, const tf_value *v, const void *src) { (void)s; (void)v; (void)src; return TF_ERR_UNAVAILABLE; }
static uint64_t cpu_step_get(tf_session_t *s) { (void)s; return 0; }
static void cpu_step_set(tf_session_t *s, uint64_t step) { (void)s; (void)step; }
static void cpu_set_profiling(tf_session_t *s, bool on) { (void)s; (void)on; }
static size_t cpu_profile_count(tf_session_t *s) { (void)s; return 0; }
static void cpu_profile_get(tf_session_t *s, size_t i, tf_kernel_profile *out) { (void)s; (void)i; (void)out; }
static void cpu_info(tf_session_t *s, tf_session_info *out) { (void)s; (void)out; }
static tf_status cpu_dump_code(tf_context_t *ctx, const tf_program_t *p, const char *dir)
{
    (void)p;
    (void)dir;
    return tf_set_error(ctx, TF_ERR_UNAVAILABLE, "error: --dump-llvm needs a build with LLVM (this one has none)");
}
static bool cpu_jit_supports(const tf_kernel *k, char *why, size_t n)
{
    (void)k;
    snprintf(why, n, "%s", cpu_unavailable());
    return false;
}

#endif

static void cpu_doctor(tf_strbuf *out)
{
    char conv[256];
    tf_dnnl_describe(conv, sizeof conv);
#ifdef TFUSE_HAVE_LLVM
    char jit[1300];
    tf_strbuf_printf(out, "cpu: LLVM JIT %s\n", tf_jit_where(jit, sizeof jit));
#endif
    tf_strbuf_printf(out, "cpu: gemm %s, %d threads by default\n", tf_cpu_blas_name(), tf_cpu_count());
    if (tf_dnnl_available()) tf_strbuf_printf(out, "cpu: convolutions through %s\n", conv);
    else tf_strbuf_printf(out, "cpu: convolutions through im2col + GEMM (%s)\n", conv);
}

static const char *cpu_op_support(tf_op op, char *detail, size_t n)
{
    const char *name = tf_op_info_of(op)->name;
    if (cpu_unavailable()) {
        snprintf(detail, n, "%s", cpu_unavailable());
        return NULL;
    }
    bool library;
    const char *how = tf_op_support_plan(op, cpu_jit_supports, "an alias of its operand's memory",
                                         "compiled by LLVM into its kernel (fused with its neighbours)",
                                         "the interpreter's kernel on widened copies", detail, n, &library);
    if (!library) return how;
    switch (tf_op_exec_of(op)) {
    case TF_OPX_GEMM:
        snprintf(detail, n, "GEMM through %s (f32, f16, bf16; f64 runs the interpreter's kernel)", tf_cpu_blas_name());
        return "library";
    case TF_OPX_CONV:
        if (tf_dnnl_available())
            snprintf(detail, n, "oneDNN's convolution primitives (2-d images in f32, f16, bf16; --cpu-conv=im2col: im2col + GEMM through %s)",
                     tf_cpu_blas_name());
        else
            snprintf(detail, n, "im2col + GEMM through %s (2-d images in f32, f16, bf16)", tf_cpu_blas_name());
        return "library";
    case TF_OPX_POOL: case TF_OPX_POOL_GRAD:
        snprintf(detail, n, "the runtime's pooling loops (2-d images in f32, f16, bf16)");
        return "library";
    case TF_OPX_GATHER: case TF_OPX_SCATTER:
        snprintf(detail, n, "rows copied or added on storage (i64/i32 ids)");
        return "library";
    case TF_OPX_CONCAT: case TF_OPX_SLICE_GRAD:
        snprintf(detail, n, "copies on storage (any dtype)");
        return "library";
    default:
        snprintf(detail, n, "%s has no cpu implementation: the interpreter's kernel runs it on widened copies", name);
        return "fallback";
    }
}

const tf_backend tf_backend_cpu = {
    .name = "cpu",
    .unavailable = cpu_unavailable,
    .session_create = cpu_create,
    .session_free = cpu_free,
    .run = cpu_run,
    .state_read = cpu_state_read,
    .state_write = cpu_state_write,
    .step_get = cpu_step_get,
    .step_set = cpu_step_set,
    .set_profiling = cpu_set_profiling,
    .profile_count = cpu_profile_count,
    .profile_get = cpu_profile_get,
    .info = cpu_info,
#ifdef TFUSE_HAVE_LLVM
    .copy_bandwidth = cpu_copy_bandwidth,
#endif
    .doctor = cpu_doctor,
    .dump_code = cpu_dump_code,
    .op_support = cpu_op_support,
#ifdef TFUSE_HAVE_LLVM
    .cache_trim = cpu_cache_trim,
    .cache_free = cpu_cache_free,
    .package_code = cpu_package_code,
    .package_check = cpu_package_check,
#endif
};
