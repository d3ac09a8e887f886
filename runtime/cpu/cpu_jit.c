/* cpu_jit.c — the cpu target's compiled kernels: each session's kernels
 * found in the process's JIT cache, a package or the disk cache, and the
 * rest compiled through LLVM on the session's threads (cpu_backend.h lists
 * the target's other files).
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
 *
 * Below that, a disk cache outlives the process: each kernel's object code,
 * as LLVM emitted it for this CPU, in $TFUSE_CACHE_DIR/cpu (default
 * ~/.cache/tfuse/cpu), keyed by the kernel's key, the pipeline and the
 * target (LLVM's version, the triple, the host CPU and its features); a
 * second process links those objects and compiles nothing
 * (tf_session_info.jit_disk). A file that is torn, foreign or for another
 * key is ignored and written again (the file's format: cpu_objects.c). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_file.h"
#include "cpu_backend.h"
#include "package.h"
#ifdef TFUSE_HAVE_LLVM
#include "llvm.h"
#include "objload.h"
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
void tf_cpu_cache_trim(tf_cache_t *c)
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

void tf_cpu_cache_free(tf_cache_t *c)
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

/* A kernel's name in object code and on disk: "tf_" + the FNV-1a of its disk
 * key ("tfuse cpu kernel 3": bumped when llvm.c emits other code for the same
 * kernel key; the target; the kernel's key), malloc'd into
 * *dkey; false when out of memory. */
bool tf_cpu_kernel_sym(const char *target, const char *key, char **dkey, char sym[32])
{
    size_t n = strlen(target) + strlen(key) + 64;
    if (!(*dkey = tf_malloc(n))) return false;
    snprintf(*dkey, n, "tfuse cpu kernel 3\n%s\n%s", target, key);
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
        if (tf_cpu_disk_read(path, key, &t, &n)) {
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
    if (memo) tf_cpu_disk_write(path, key, jc->target, strlen(jc->target));
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
    if (!host_target(jc, &d) || !tf_cpu_kernel_sym(jc->target, key, dkey, sym)) return;
    void *obj = NULL;
    size_t on = 0;
    if (pkg) {   /* a package's object code (tf_program_load checked its target) */
        char name[64];
        snprintf(name, sizeof name, "cpu/%s.o", sym);
        const tf_pkg_section *sec = tf_pkg_find(pkg, name);
        if (sec && tf_cpu_record_parse(sec->data, sec->len, *dkey, &obj, &on) && !link_object(jc, sym, obj, on, fn, code, lo, &d))
            *from_pkg = true;
        tf_free(obj);
        if (*fn) return;
        obj = NULL;
    }
    if (!tf_cache_subdir("cpu", dir, sizeof dir) || !(*path = tf_malloc(strlen(dir) + 40))) return;
    snprintf(*path, strlen(dir) + 40, "%s/%s.o", dir, sym);
    if (tf_cpu_disk_read(*path, *dkey, &obj, &on) && !link_object(jc, sym, obj, on, fn, code, lo, &d)) *from_disk = true;
    tf_free(obj);
}

/* The JIT cache's key of k under pipeline pipe (NULL: tfuse's own),
 * malloc'd; NULL when out of memory. */
char *tf_cpu_jit_key(const tf_kernel *k, const char *pipe)
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

/* r's kernel from the process's cache, a package or the disk; a miss
 * leaves r->slot -1 for tf_cpu_jit_compile_all. */
tf_ir_status tf_cpu_jit_lookup(tf_cache_t *c, const char *pipe, const tf_pkg *pkg, jit_req *r, tf_diag *d)
{
    r->slot = -1;
    r->same = -1;
    if (!(r->key = tf_cpu_jit_key(r->k, pipe))) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
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

void tf_cpu_jit_compile_all(tf_cache_t *c, tf_pool *pool, const char *pipe, jit_req *rs, int n)
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
        if (!r->st && r->obj && r->path) tf_cpu_disk_write(r->path, r->dkey, r->obj, r->nobj);
    }
}

void tf_cpu_jit_req_free(jit_req *r)
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
void tf_cpu_jit_put(tf_cache_t *c, int slot)
{
    if (slot < 0) return;
    pthread_mutex_lock(&c->mu);
    jit_cache *jc = c->cpu;
    if (--jc->e[slot].refs == 0) {
        c->unused++;
        tf_cpu_cache_trim(c);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- for packages (cpu_objects.c) ---------------------------------------- */

/* This machine's target id, through the context cache's JIT (made if need
 * be), malloc'd; NULL with *d filled when the JIT cannot be made. */
char *tf_cpu_cache_target(tf_cache_t *c, tf_diag *d)
{
    char *t = NULL;
    pthread_mutex_lock(&c->mu);
    jit_cache *jc = c->cpu;
    if (!jc && !(jc = c->cpu = tf_calloc(1, sizeof *jc))) tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    else if (host_target(jc, d) && !(t = tf_strdup(jc->target))) tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    pthread_mutex_unlock(&c->mu);
    return t;
}

#endif /* TFUSE_HAVE_LLVM */
