/* emu.c — cuda-emu's driver and NVRTC (see emu.h): device memory in host
 * memory, kernels compiled from their CUDA C with the host C++ compiler
 * against emu_prelude.cuh and run thread by thread, streams that queue
 * their work until something waits for it (or record it into a graph).
 *
 * Streams. Work on a stream the caller created is queued, in order, and
 * runs only when something waits for it: cuStreamSynchronize, a
 * cuEventSynchronize of an event recorded after it, another stream's queued
 * cuStreamWaitEvent when that stream runs, a synchronous call (a copy
 * without a stream, cuCtxSynchronize) or a call that would pull memory,
 * an event, a graph or a module from under it (frees and destroys: a GPU
 * finishes the work first). So work runs as late as a GPU may run it: a
 * host buffer changed before the copy that reads it has run, or a stream
 * that reads what another writes without waiting for its event, computes
 * the wrong thing here too, where a GPU would only sometimes. cuEventQuery
 * does not make work progress (pending work stays NOT_READY). Work on the
 * legacy stream (NULL) runs at the call, after every queued stream. A
 * failure while queued work runs (an illegal address, a deadlock) is
 * reported as a GPU reports a fault: the call that queued it succeeded, and
 * the next wait for it (cuStreamSynchronize, cuEventSynchronize or
 * cuEventQuery of an event recorded after it, and every later one) returns
 * it; the stream then runs nothing more, and a stream that waits for an
 * event recorded after the failure fails with it.
 *
 * Compiling. A module is registered when it is loaded and compiled when a
 * kernel of it is first needed (a launch, or a stream or context
 * synchronization, which is where a session's start waits): every module
 * still waiting then is compiled at once, in as many translation units as
 * there are CPUs, each module in a namespace of its own after one copy of
 * the prelude, by concurrent compiler processes. The shared objects are
 * cached in $TFUSE_CACHE_DIR/cuda-emu (default ~/.cache/tfuse/cuda-emu), one
 * name per module (a hash of the prelude, the compiler and the source; a
 * module is an NVRTC program, several kernels each in a namespace of its
 * own: cuda_jit.h) that links to the object holding it, each written to a temporary name and
 * renamed; files being compiled carry ".tmp." in their names, which the
 * cache's bound (cache_file.h) leaves alone while they are young. A module
 * found there is touched, so that the bound evicts what was used least
 * recently; a link whose object was evicted is a miss. The compiler is $TFUSE_EMU_CXX, else the first of c++, g++,
 * clang++ on PATH.
 *
 * Running. Launches run one at a time in the process (a mutex), on stacks
 * of 64 KiB per thread with a guard page below each; a fault inside a
 * kernel (a wild address, a stack overflow) fails the launch (on a created
 * stream: the next wait for it, as above) with the
 * kernel, the block, the thread and the address instead of killing the
 * process, as CUDA reports an illegal address. A launch's geometry is
 * checked as the driver does: at most 1024 threads a block and no more
 * than the kernel's __launch_bounds__, dynamic shared memory above 48 KiB
 * only after cuFuncSetAttribute allowed it. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "cache_file.h"
#include "emu.h"
#include "env.h"

extern char **environ;

/* The prelude's text (emu_prelude.cuh), linked in by emu_prelude.S. */
extern const char tf_cuda_emu_prelude[] __attribute__((visibility("hidden")));

enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_IMAGE = 200, INVALID_HANDLE = 400,
    NOT_FOUND = 500, NOT_READY = 600, ILLEGAL_ADDRESS = 700, LAUNCH_OUT_OF_RESOURCES = 701, LAUNCH_FAILED = 719,
    STREAM_CAPTURE_UNSUPPORTED = 900, STREAM_CAPTURE_INVALIDATED = 901, STREAM_CAPTURE_ISOLATION = 905, NOT_SUPPORTED = 801, EMU_UNKNOWN = 999,
};
enum { MAX_THREADS = 1024, STATIC_SMEM = 48 * 1024, SMEM_OPTIN = 232448, SMS = 132 };
enum { MAX_PARAMS = 4096 };   /* CUDA 12.1+ takes 32 KiB of kernel parameters: 4096 pointers */
static const size_t STACK = 64 * 1024;
static const char IMAGE_MAGIC[] = "TFEMU-CUDA-C 1\n";

/* ---- state ------------------------------------------------------------------ */

typedef struct emu_alloc { unsigned char *p; size_t n; bool host; } emu_alloc;

typedef struct emu_func {
    char name[64];
    unsigned bound;              /* __launch_bounds__, 0: none */
    unsigned max_smem;           /* dynamic shared memory allowed */
    int nparams;
    unsigned char psize[MAX_PARAMS];   /* bytes of each parameter */
    void (*entry)(void **);
    struct emu_module *mod;
} emu_func;

typedef enum { MOD_PENDING, MOD_COMPILING, MOD_READY, MOD_FAILED } mod_state;

typedef struct emu_module {
    char *src;
    uint64_t key;
    char so[4200];               /* the cached object for this kernel (a link) */
    mod_state state;
    char *error;                 /* MOD_FAILED: the compiler's words */
    void *handle;
    int (*launch)(void (*)(void **), void **, const unsigned *, const unsigned *, unsigned, char *, unsigned long, char *,
                  unsigned long);
    emu_func *fns;
    int nfns;
    struct emu_module *next_pending;
} emu_module;

typedef struct work {
    tf_cuda_emu_work fn;
    void *arg;
    size_t bytes;
} work;

typedef struct emu_graph {
    work *w;
    int n, cap;
} emu_graph;

typedef struct emu_stream {
    bool capturing;
    emu_graph *graph;            /* being recorded */
    int error;                   /* a capture that went wrong */
    work *q;                     /* queued work, q[qhead..qn) not yet run */
    int qn, qcap, qhead;
    uint64_t enq, done;          /* work items queued, and run (or dropped after a fault), since the stream began */
    int fault;                   /* the first failure of queued work (sticky), 0: none */
    uint64_t fault_at;           /* its position (1 + items before it) */
    char msg[2048];              /* its words */
} emu_stream;

/* An event: the position of its last record in a stream's queue (complete
 * once the stream has run that far), or a record inside a capture. */
typedef struct emu_event {
    double ms;
    emu_stream *st;              /* the stream of the last record while pending; NULL once that stream is gone */
    uint64_t seq;                /* the record's position in st */
    emu_graph *graph;            /* the capture the last record went into, NULL: none */
    int fault;                   /* st gone: the failure the record came after, 0: none */
    char msg[2048];
    struct emu_event *next;      /* every live event */
} emu_event;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;          /* the state below */
static pthread_mutex_t g_launch_mu = PTHREAD_MUTEX_INITIALIZER;   /* one launch at a time */
static emu_alloc *g_allocs;
static int g_nallocs, g_cap_allocs;
static size_t g_used;
static int g_live_modules, g_live_streams, g_live_events, g_live_graphs;
static int g_capturing;      /* streams capturing: synchronous calls are errors meanwhile, as on a GPU */
/* the queues: every live stream and event; recursive, since running a stream's
 * wait runs the stream it waits for */
static pthread_mutex_t g_q_mu;
static pthread_once_t g_q_once = PTHREAD_ONCE_INIT;
static emu_stream **g_streams;
static int g_nstreams, g_cap_streams;
static emu_event *g_events;
static int g_inject;         /* tf_cuda_emu_inject_fault: launches until the one that faults, 0: none */
static emu_module *g_pending;
static char *g_stacks;
static _Thread_local char g_msg[2048];   /* the last failure's words, for cuGetErrorString */

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return code;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) { return tf_fnv1a(h, p, n); }
#define FNV0 TF_FNV_BASIS

/* ---- device memory ------------------------------------------------------------ */

static size_t capacity(void)
{
    const char *v = tf_env("TFUSE_EMU_MEMORY");
    if (v && *v) return (size_t)strtoull(v, NULL, 10);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)16 << 30;
}

/* The allocation holding [p, p + n), or NULL (g_mu held). */
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
    pthread_mutex_lock(&g_mu);
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
    pthread_mutex_unlock(&g_mu);
    return r;
}

static void flush_all(void);

static int do_free(void *p, bool host)
{
    flush_all();   /* a GPU finishes the work that may still use it */
    pthread_mutex_lock(&g_mu);
    int r = fail(INVALID_VALUE, "freeing %p, which is not a live %s allocation", p, host ? "pinned host" : "device");
    for (int i = 0; i < g_nallocs; i++)
        if (g_allocs[i].p == p && g_allocs[i].host == host) {
            if (!host) g_used -= g_allocs[i].n;
            g_allocs[i] = g_allocs[--g_nallocs];
            tf_free_aligned(p);
            r = OK;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Every byte of [p, p + n) inside one live allocation (device, or pinned host when host_ok). */
static int check_range(const void *p, size_t n, bool host_ok, const char *what)
{
    if (!n) return OK;
    pthread_mutex_lock(&g_mu);
    emu_alloc *a = holding(p, n);
    int r = a && (host_ok || !a->host) ? OK
                                       : fail(INVALID_VALUE, "%s: %zu bytes at %p are not inside one live device allocation", what, n, p);
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ---- streams and graphs ---------------------------------------------------------- */

static void graph_free(emu_graph *g);

static void q_init(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_q_mu, &a);
    pthread_mutexattr_destroy(&a);
}
static void q_lock(void)
{
    pthread_once(&g_q_once, q_init);
    pthread_mutex_lock(&g_q_mu);
}
static void q_unlock(void) { pthread_mutex_unlock(&g_q_mu); }

static int run_event(void *argp);
static int run_wait(void *argp);

/* Run st's queued work up to position upto (q held). A failure is kept, and
 * what follows it is dropped. */
static void flush_until(emu_stream *st, uint64_t upto)
{
    while (st->done < upto && st->qhead < st->qn) {
        work w = st->q[st->qhead++];
        uint64_t at = ++st->done;
        if (!st->fault) {
            int r = w.fn(w.arg);
            if (r && !st->fault) {
                st->fault = r;
                st->fault_at = at;
                snprintf(st->msg, sizeof st->msg, "%s", g_msg);
            }
        }
        tf_free(w.arg);
    }
    if (st->qhead == st->qn) st->qhead = st->qn = 0;
}

static void flush_all(void)
{
    q_lock();
    for (int i = 0; i < g_nstreams; i++) flush_until(g_streams[i], g_streams[i]->enq);
    q_unlock();
}

/* The failure queued work met at or before position at of st, 0: none. */
static int fault_by(const emu_stream *st, uint64_t at) { return st->fault && st->fault_at <= at ? st->fault : 0; }

int tf_cuda_emu_submit(tf_cu_stream s, tf_cuda_emu_work fn, const void *arg, size_t arg_bytes)
{
    emu_stream *st = (emu_stream *)s;
    if (!st) {   /* the legacy stream: after everything queued, at once */
        flush_all();
        return fn((void *)arg);
    }
    void *copy = tf_malloc(arg_bytes ? arg_bytes : 1);
    if (!copy) {
        if (st->capturing) st->error = OUT_OF_MEMORY;
        return fail(OUT_OF_MEMORY, "out of host memory queueing work");
    }
    memcpy(copy, arg, arg_bytes);
    q_lock();
    int r = OK;
    if (st->capturing) {
        emu_graph *g = st->graph;
        if (g->n == g->cap) {
            int cap = g->cap ? 2 * g->cap : 64;
            work *w = tf_realloc(g->w, (size_t)cap * sizeof *w);
            if (w) g->w = w, g->cap = cap;
        }
        if (g->n < g->cap) g->w[g->n++] = (work){fn, copy, arg_bytes};
        else st->error = r = fail(OUT_OF_MEMORY, "out of host memory recording a graph");
    } else {
        if (st->qn == st->qcap) {
            int cap = st->qcap ? 2 * st->qcap : 64;
            work *w = tf_realloc(st->q, (size_t)cap * sizeof *w);
            if (w) st->q = w, st->qcap = cap;
        }
        if (st->qn < st->qcap) {
            st->q[st->qn++] = (work){fn, copy, arg_bytes};
            st->enq++;
        } else {
            r = fail(OUT_OF_MEMORY, "out of host memory queueing work");
        }
    }
    q_unlock();
    if (r) tf_free(copy);
    return r;
}

void tf_cuda_emu_inject_fault(int after)
{
    pthread_mutex_lock(&g_launch_mu);
    g_inject = after > 0 ? after : 0;
    pthread_mutex_unlock(&g_launch_mu);
}

/* ---- compiling modules ------------------------------------------------------------- */

static pthread_once_t g_tool_once = PTHREAD_ONCE_INIT;
static long g_cache_hits, g_cache_compiled;   /* kernels found in the cache, and compiled (g_mu) */
static char g_cxx[4096], g_cxx_id[512], g_cache[4096], g_tool_why[1024];
static uint64_t g_tool_key;

static bool find_on_path(const char *name, char *out, size_t n)
{
    if (strchr(name, '/')) {
        snprintf(out, n, "%s", name);
        return access(out, X_OK) == 0;
    }
    const char *path = tf_env("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *e = strchr(path, ':');
        size_t len = e ? (size_t)(e - path) : strlen(path);
        snprintf(out, n, "%.*s/%s", (int)len, path, name);
        if (len && access(out, X_OK) == 0) return true;
        path += len + (e ? 1 : 0);
    }
    return false;
}

/* Run argv, stdout and stderr into log_path; the exit status, or -1. */
static int run_tool(char *const *argv, const char *log_path, pid_t *pid_out)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int r = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r) return -1;
    if (pid_out) {
        *pid_out = pid;
        return 0;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void read_text(const char *path, char *out, size_t n)
{
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t k = fread(out, 1, n - 1, f);
    out[k] = 0;
    fclose(f);
}

static void tool_init(void)
{
    const char *want = tf_env("TFUSE_EMU_CXX");
    static const char *const names[] = {"c++", "g++", "clang++"};
    bool found = false;
    if (want && *want && !find_on_path(want, g_cxx, sizeof g_cxx)) {   /* asked for by name: that one or none */
        snprintf(g_tool_why, sizeof g_tool_why, "TFUSE_EMU_CXX=%.300s: no such executable (on PATH or as a path)", want);
        return;
    }
    found = want && *want;
    for (int i = 0; !found && i < 3; i++) found = find_on_path(names[i], g_cxx, sizeof g_cxx);
    if (!found) {
        snprintf(g_tool_why, sizeof g_tool_why, "cuda-emu compiles kernels with a host C++ compiler and found none (c++, g++, clang++ on PATH); "
                 "install g++ (Debian: apt-get install g++) or set TFUSE_EMU_CXX to one");
        return;
    }
    char dir[4096] = "(no $TFUSE_CACHE_DIR or $HOME)";
    bool made = tf_cache_subdir("cuda-emu", dir, sizeof dir);
    if (!made && !tf_env("TFUSE_CACHE_DIR") && (!tf_env("HOME") || !*tf_env("HOME"))) {   /* no home: a directory of this user's */
        snprintf(dir, sizeof dir, "/tmp/tfuse-cuda-emu-%ld", (long)getuid());
        made = tf_make_dirs(dir);
    }
    if (!made) {
        snprintf(g_tool_why, sizeof g_tool_why, "cuda-emu cannot create its kernel cache %.700s: %.200s (set TFUSE_CACHE_DIR)", dir, strerror(errno));
        return;
    }
    snprintf(g_cache, sizeof g_cache, "%s", dir);
    /* the headers the emitted sources include: the prelude defines what they would */
    char inc[4200];
    snprintf(inc, sizeof inc, "%s/include", g_cache);
    tf_make_dirs(inc);
    static const char *const hdrs[] = {"cuda_fp16.h", "cuda_bf16.h"};
    for (int i = 0; i < 2; i++) {
        char p[4300];
        snprintf(p, sizeof p, "%s/%s", inc, hdrs[i]);
        FILE *f = fopen(p, "ab");
        if (f) fclose(f);
    }
    /* the compiler's identity keys the cache */
    char logp[4300];
    snprintf(logp, sizeof logp, "%s/version.tmp.%ld.txt", g_cache, (long)getpid());
    char *argv[] = {g_cxx, "--version", NULL};
    if (run_tool(argv, logp, NULL) != 0) {
        snprintf(g_tool_why, sizeof g_tool_why, "cuda-emu's compiler %.900s does not run (--version failed)", g_cxx);
        remove(logp);
        return;
    }
    read_text(logp, g_cxx_id, sizeof g_cxx_id);
    remove(logp);
    char *nl = strchr(g_cxx_id, '\n');
    if (nl) *nl = 0;
    g_tool_key = fnv(fnv(fnv(FNV0, tf_cuda_emu_prelude, strlen(tf_cuda_emu_prelude)), g_cxx, strlen(g_cxx)), g_cxx_id,
                     strlen(g_cxx_id));
}

void tf_cuda_emu_cache_counts(long *hits, long *compiled)
{
    pthread_mutex_lock(&g_mu);
    *hits = g_cache_hits;
    *compiled = g_cache_compiled;
    pthread_mutex_unlock(&g_mu);
}

const char *tf_cuda_emu_unavailable(void)
{
    pthread_once(&g_tool_once, tool_init);
    return g_tool_why[0] ? g_tool_why : NULL;
}

void tf_cuda_emu_describe(tf_strbuf *sb)
{
    const char *why = tf_cuda_emu_unavailable();
    if (why) tf_strbuf_printf(sb, "cuda-emu: cannot run: %s\n", why);
    else tf_strbuf_printf(sb, "cuda-emu: kernels compiled by %s (%s), cached in %s\n", g_cxx, g_cxx_id, g_cache);
}

/* What the source declares: each __global__ function's name, launch bound
 * and parameter sizes. false (with why) when it is not something the
 * prelude can take. */
static bool parse_kernels(emu_module *m, char *why, size_t n)
{
    const char *p = m->src;
    int cap = 0;
    if (strstr(m->src, "extern __shared__") && !strstr(m->src, "unsigned char tf_smem[]")) {
        snprintf(why, n, "cuda-emu gives dynamic shared memory the name tf_smem (unsigned char), as the emitter declares it");
        return false;
    }
    while ((p = strstr(p, "__global__"))) {
        p += strlen("__global__");
        emu_func f;
        memset(&f, 0, sizeof f);
        f.max_smem = STATIC_SMEM;
        while (*p == ' ') p++;
        if (strncmp(p, "void", 4)) continue;
        p += 4;
        while (*p == ' ') p++;
        if (!strncmp(p, "__launch_bounds__(", 18)) {
            f.bound = (unsigned)strtoul(p + 18, NULL, 10);
            p = strchr(p, ')');
            if (!p) break;
            p++;
            while (*p == ' ') p++;
        }
        size_t len = 0;
        while (p[len] == '_' || (p[len] >= 'a' && p[len] <= 'z') || (p[len] >= 'A' && p[len] <= 'Z') || (p[len] >= '0' && p[len] <= '9'))
            len++;
        if (!len || len >= sizeof f.name || p[len] != '(') {
            snprintf(why, n, "a __global__ function whose name cuda-emu cannot read");
            return false;
        }
        memcpy(f.name, p, len);
        p += len + 1;
        const char *close = strchr(p, ')');
        if (!close) break;
        /* parameters: split at commas */
        while (p < close) {
            const char *e = p;
            while (e < close && *e != ',') e++;
            char par[256];
            snprintf(par, sizeof par, "%.*s", (int)(e - p), p);
            if (strspn(par, " ") != strlen(par)) {
                if (f.nparams == (int)sizeof f.psize) {
                    snprintf(why, n, "kernel %s has more than %d parameters", f.name, (int)sizeof f.psize);
                    return false;
                }
                unsigned char sz = strchr(par, '*') || strstr(par, "double") || strstr(par, "long long") || strstr(par, "size_t") ? 8
                                   : strstr(par, "short")                                                                   ? 2
                                   : strstr(par, "char") || strstr(par, "bool")                                             ? 1
                                                                                                                            : 4;
                f.psize[f.nparams++] = sz;
            }
            p = e < close ? e + 1 : close;
        }
        if (m->nfns == cap) {
            cap = cap ? 2 * cap : 2;
            emu_func *nf = tf_realloc(m->fns, (size_t)cap * sizeof *nf);
            if (!nf) {
                snprintf(why, n, "out of memory");
                return false;
            }
            m->fns = nf;
        }
        f.mod = m;
        m->fns[m->nfns++] = f;
    }
    if (!m->nfns) {
        snprintf(why, n, "the source defines no __global__ function");
        return false;
    }
    return true;
}

/* Compile a batch of modules into one shared object; link each module's
 * cached name to it. Returns the spawned compiler's pid (0 when none). */
typedef struct batch {
    emu_module **mods;
    int n;
    char so[4200], tu[4200], log[4200];
    pid_t pid;
    bool ok;                     /* compiled, its object and links in the cache */
} batch;

static bool write_tu(batch *b)
{
    uint64_t h = g_tool_key;
    for (int i = 0; i < b->n; i++) h = fnv(h, &b->mods[i]->key, sizeof b->mods[i]->key);
    snprintf(b->tu, sizeof b->tu, "%s/batch-%016llx.tmp.%ld.cc", g_cache, (unsigned long long)h, (long)getpid());
    snprintf(b->so, sizeof b->so, "%s/batch-%016llx.so", g_cache, (unsigned long long)h);
    snprintf(b->log, sizeof b->log, "%s/batch-%016llx.tmp.%ld.log", g_cache, (unsigned long long)h, (long)getpid());
    FILE *f = fopen(b->tu, "wb");
    if (!f) return false;
    fputs(tf_cuda_emu_prelude, f);
    for (int i = 0; i < b->n; i++) {
        emu_module *m = b->mods[i];
        fprintf(f, "\nnamespace tfemu_k%d {\n#line 1 \"%s.cu\"\n%s\n", i, m->fns[0].name, m->src);
        for (int j = 0; j < m->nfns; j++) fprintf(f, "TFEMU_ENTRY(%s)\n", m->fns[j].name);
        fprintf(f, "}\n");
    }
    return fclose(f) == 0;
}

static void start_batch(batch *b)
{
    b->pid = 0;
    if (!write_tu(b)) return;
    char tmp[4300], inc[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", b->so, (long)getpid());
    snprintf(inc, sizeof inc, "-I%s/include", g_cache);
    char *argv[] = {g_cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-fno-strict-aliasing", "-fvisibility=hidden",
                    "-fPIC", "-shared", "-w", inc, "-o", tmp, b->tu, NULL};
    pid_t pid = 0;
    if (run_tool(argv, b->log, &pid) == 0) b->pid = pid;
}

/* Wait for a batch; point each module at its object (or its error). */
static void finish_batch(batch *b)
{
    int status = -1;
    if (b->pid) {
        while (waitpid(b->pid, &status, 0) < 0 && errno == EINTR) {}
    }
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", b->so, (long)getpid());
    bool ok = b->pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && rename(tmp, b->so) == 0;
    b->ok = ok;
    char log[4096] = "";
    if (!ok) {
        read_text(b->log, log, sizeof log);
        remove(tmp);
    }
    for (int i = 0; i < b->n; i++) {
        emu_module *m = b->mods[i];
        if (!ok) {
            char msg[4600];
            snprintf(msg, sizeof msg, "the host compiler (%.300s) rejected it%s%s%.3000s (the translation unit is %.1000s)", g_cxx,
                     b->pid ? "" : ": it did not start", log[0] ? ":\n" : "", log, b->tu);
            m->error = tf_strdup(msg);
            m->state = MOD_FAILED;
            continue;
        }
        /* the kernel's own cached name links to the batch's object */
        char lnk[4300];
        snprintf(lnk, sizeof lnk, "%s.tmp.%ld", m->so, (long)getpid());
        remove(lnk);
        const char *base = strrchr(b->so, '/');
        if (symlink(base ? base + 1 : b->so, lnk) == 0 && rename(lnk, m->so) != 0) remove(lnk);
        m->state = MOD_COMPILING;   /* compiled; loaded next */
    }
    if (ok) {
        remove(b->tu);
        remove(b->log);
    }
}

static bool load_so(emu_module *m, const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    void *launch = dlsym(h, "tfemu_launch");
    bool ok = launch != NULL;
    for (int j = 0; ok && j < m->nfns; j++) {
        char sym[96];
        snprintf(sym, sizeof sym, "tfemu_entry_%s", m->fns[j].name);
        void *e = dlsym(h, sym);
        ok = e != NULL;
        if (ok) memcpy(&m->fns[j].entry, &e, sizeof e);
    }
    if (!ok) {
        dlclose(h);
        return false;
    }
    m->handle = h;
    memcpy(&m->launch, &launch, sizeof launch);
    m->state = MOD_READY;
    return true;
}

static int first_failure(emu_module **ms, int n)
{
    for (int i = 0; i < n; i++)
        if (ms[i]->state == MOD_FAILED)
            return fail(INVALID_IMAGE, "cuda-emu: kernel %s does not compile on the host: %s", ms[i]->fns[0].name,
                        ms[i]->error ? ms[i]->error : "out of memory");
    return OK;
}

/* Compile every pending module (g_mu held). */
static int compile_modules(emu_module **waiting, int n);

static int compile_pending(void)
{
    int n = 0;
    for (emu_module *m = g_pending; m; m = m->next_pending) n++;
    if (!n) return OK;
    emu_module **waiting = tf_malloc((size_t)n * sizeof *waiting);
    if (!waiting) {   /* each stays pending, and says so when it is needed */
        return fail(OUT_OF_MEMORY, "cuda-emu: out of host memory compiling %d kernels", n);
    }
    n = 0;
    for (emu_module *m = g_pending; m; m = m->next_pending) waiting[n++] = m;
    g_pending = NULL;
    int r = compile_modules(waiting, n);
    tf_free(waiting);
    return r;
}

/* Load waiting[0..n) from the cache or compile them (g_mu held). */
static int compile_modules(emu_module **waiting, int n)
{
    pthread_once(&g_tool_once, tool_init);
    /* from the cache, where it is there */
    int miss = 0;
    for (int i = 0; i < n; i++) {
        emu_module *m = waiting[i];
        if (g_tool_why[0]) {
            m->error = tf_strdup(g_tool_why);
            m->state = MOD_FAILED;
            continue;
        }
        snprintf(m->so, sizeof m->so, "%s/%016llx.so", g_cache, (unsigned long long)fnv(g_tool_key, &m->key, sizeof m->key));
        if (access(m->so, R_OK) == 0 && load_so(m, m->so)) {
            tf_cache_touch(m->so);   /* the link and the object it shares: used now */
            g_cache_hits++;
            continue;
        }
        waiting[miss++] = m;
    }
    if (!miss) return first_failure(waiting, n);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nb = cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus;
    if (nb > miss) nb = miss;
    batch bs[16];
    memset(bs, 0, sizeof bs);
    emu_module **mods = tf_calloc((size_t)miss, sizeof *mods);
    if (!mods) {
        for (int i = 0; i < miss; i++) waiting[i]->state = MOD_FAILED, waiting[i]->error = NULL;
        return first_failure(waiting, miss);
    }
    int at = 0;
    for (int b = 0; b < nb; b++) {   /* kernels dealt out in turn, so batches are alike in size */
        bs[b].mods = mods + at;
        for (int i = b; i < miss; i += nb) mods[at++] = waiting[i];
        bs[b].n = (int)(mods + at - bs[b].mods);
        start_batch(&bs[b]);
    }
    for (int b = 0; b < nb; b++) finish_batch(&bs[b]);
    for (int i = 0; i < miss; i++) {
        emu_module *m = waiting[i];
        if (m->state != MOD_COMPILING) continue;
        g_cache_compiled++;
        if (!load_so(m, m->so)) {
            char msg[5400];
            snprintf(msg, sizeof msg, "cuda-emu could not load its compiled kernel %s: %.1000s", m->so, dlerror());
            m->error = tf_strdup(msg);
            m->state = MOD_FAILED;
        }
    }
    /* counted against the cache's bound once loaded: an eviction now takes nothing this process needs */
    for (int b = 0; b < nb; b++) {
        struct stat st;
        if (!bs[b].ok || lstat(bs[b].so, &st) != 0) continue;
        uint64_t bytes = (uint64_t)st.st_size;
        for (int i = 0; i < bs[b].n; i++)
            if (lstat(bs[b].mods[i]->so, &st) == 0) bytes += (uint64_t)st.st_size;
        tf_cache_added(bs[b].so, bytes);
    }
    tf_free(mods);
    return first_failure(waiting, miss);
}

/* Every module compiled; the first failure's words. */
static int settle(void)
{
    pthread_mutex_lock(&g_mu);
    int r = compile_pending();
    pthread_mutex_unlock(&g_mu);
    return r;
}

static int module_ready(emu_module *m)
{
    pthread_mutex_lock(&g_mu);
    if (m->state == MOD_PENDING) compile_pending();
    int r = m->state == MOD_READY ? OK
                                  : fail(INVALID_IMAGE, "cuda-emu: kernel %s does not compile on the host: %s", m->fns[0].name,
                                         m->error ? m->error : "out of memory");
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ---- launching ------------------------------------------------------------------------ */

typedef struct launch_arg {
    emu_func *f;
    unsigned grid[3], block[3], smem;
    _Alignas(16) unsigned char params[];   /* each parameter's bytes at its natural alignment (param_offset) */
} launch_arg;

/* Where parameter i's bytes go in launch_arg.params; the end after the last. */
static size_t param_offset(const emu_func *f, int i)
{
    size_t at = 0;
    for (int q = 0; q < i; q++) at = (at + f->psize[q] - 1) / f->psize[q] * f->psize[q] + f->psize[q];
    return i < f->nparams ? (at + f->psize[i] - 1) / f->psize[i] * f->psize[i] : at;
}

static sigjmp_buf g_fault_jmp;
static volatile sig_atomic_t g_in_kernel;
static volatile uintptr_t g_fault_addr;

static void on_fault(int sig, siginfo_t *info, void *uc)
{
    (void)uc;
    if (!g_in_kernel) {   /* not ours: the default action */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_fault_addr = (uintptr_t)info->si_addr;
    siglongjmp(g_fault_jmp, sig);
}

static bool stacks_ready(void)
{
    if (g_stacks) return true;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, STACK * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    for (int i = 0; i < MAX_THREADS; i++) mprotect(p + (size_t)i * STACK, page, PROT_NONE);   /* guard pages */
    g_stacks = p;
    return true;
}

static int run_launch(void *argp)
{
    launch_arg *a = argp;
    emu_func *f = a->f;
    void **params = tf_malloc((size_t)(f->nparams ? f->nparams : 1) * sizeof *params);
    if (!params) return fail(OUT_OF_MEMORY, "out of host memory");
    size_t at = 0;
    for (int i = 0; i < f->nparams; i++) {
        at = (at + f->psize[i] - 1) / f->psize[i] * f->psize[i];
        params[i] = a->params + at;
        at += f->psize[i];
    }
    pthread_mutex_lock(&g_launch_mu);
    if (!stacks_ready()) {
        pthread_mutex_unlock(&g_launch_mu);
        tf_free(params);
        return fail(OUT_OF_MEMORY, "cuda-emu: no memory for the threads' stacks");
    }
    static char alt[64 * 1024];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt}, old_ss;
    struct sigaction sa, old_segv, old_bus;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaltstack(&ss, &old_ss);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    char err[1024] = "";
    int r = OK;
    int sig = sigsetjmp(g_fault_jmp, 1);
    if (!sig && g_inject > 0 && --g_inject == 0) {   /* a test's fault (tf_cuda_emu_inject_fault) */
        r = fail(ILLEGAL_ADDRESS, "cuda-emu: kernel %s (grid %u, block %u): an illegal memory access (injected by "
                 "tf_cuda_emu_inject_fault)", f->name, a->grid[0], a->block[0]);
    } else if (!sig) {
        g_in_kernel = 1;
        if (f->mod->launch(f->entry, params, a->grid, a->block, a->smem, g_stacks, STACK, err, sizeof err))
            r = fail(LAUNCH_FAILED, "cuda-emu: kernel %s: %s", f->name, err);
        g_in_kernel = 0;
    } else {
        g_in_kernel = 0;
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        uintptr_t at = g_fault_addr, lo = (uintptr_t)g_stacks, hi = lo + STACK * MAX_THREADS;
        bool overflow = at >= lo && at < hi && (at - lo) % STACK < page;
        r = fail(ILLEGAL_ADDRESS, "cuda-emu: kernel %s (grid %u, block %u): %s at address 0x%llx",
                 f->name, a->grid[0], a->block[0], overflow ? "a thread overflowed its stack" : "an illegal memory access",
                 (unsigned long long)at);
        /* the kernel's scheduler state is abandoned; its next launch starts it afresh */
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    sigaltstack(&old_ss, NULL);
    pthread_mutex_unlock(&g_launch_mu);
    tf_free(params);
    return r;
}

static tf_cu_result emu_launch(tf_cu_function fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned smem, tf_cu_stream s, void **params, void **extra)
{
    emu_func *f = (emu_func *)fn;
    if (!f) return fail(INVALID_HANDLE, "cuLaunchKernel: no function");
    if (extra) return fail(NOT_SUPPORTED, "cuda-emu takes kernel parameters as kernelParams, not extra");
    unsigned long threads = (unsigned long)bx * by * bz;
    if (!gx || !gy || !gz || !threads || threads > MAX_THREADS || gx > 0x7fffffffu || gy > 65535 || gz > 65535)
        return fail(INVALID_VALUE, "cuLaunchKernel(%s): grid (%u, %u, %u) x block (%u, %u, %u) is outside the device's limits", f->name,
                    gx, gy, gz, bx, by, bz);
    if (f->bound && threads > f->bound)
        return fail(LAUNCH_OUT_OF_RESOURCES, "cuLaunchKernel(%s): %lu threads a block, and its __launch_bounds__ is %u", f->name, threads,
                    f->bound);
    if (smem > f->max_smem)
        return fail(INVALID_VALUE, "cuLaunchKernel(%s): %u bytes of dynamic shared memory, %u allowed (cuFuncSetAttribute raises it)",
                    f->name, smem, f->max_smem);
    if (f->nparams && !params) return fail(INVALID_VALUE, "cuLaunchKernel(%s): no parameters for %d", f->name, f->nparams);
    int r = module_ready(f->mod);
    if (r) return r;
    size_t bytes = sizeof(launch_arg) + param_offset(f, f->nparams);
    launch_arg *a = tf_calloc(1, bytes);
    if (!a) return fail(OUT_OF_MEMORY, "out of host memory");
    a->f = f;
    a->grid[0] = gx, a->grid[1] = gy, a->grid[2] = gz;
    a->block[0] = bx, a->block[1] = by, a->block[2] = bz;
    a->smem = smem;
    for (int i = 0, at = 0; i < f->nparams; i++) {
        at = (at + f->psize[i] - 1) / f->psize[i] * f->psize[i];
        memcpy(a->params + at, params[i], f->psize[i]);
        at += f->psize[i];
    }
    r = tf_cuda_emu_submit(s, run_launch, a, bytes);
    tf_free(a);
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
    if (!s && g_capturing) return fail(STREAM_CAPTURE_UNSUPPORTED, "%s: a synchronous copy while a stream captures a graph", what);
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
    *s = r && g_msg[0] ? g_msg : code_name(r);
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
    if (g_capturing) return fail(STREAM_CAPTURE_UNSUPPORTED, "cuCtxSynchronize while a stream captures a graph");
    flush_all();
    return settle();
}
static tf_cu_result emu_mem_info(size_t *f, size_t *t)
{
    pthread_mutex_lock(&g_mu);
    *t = capacity();
    *f = g_used < *t ? *t - g_used : 0;
    pthread_mutex_unlock(&g_mu);
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

static tf_cu_result emu_stream_create(tf_cu_stream *s, unsigned flags)
{
    (void)flags;
    emu_stream *st = tf_calloc(1, sizeof *st);
    if (!st) return fail(OUT_OF_MEMORY, "out of host memory");
    q_lock();
    if (g_nstreams == g_cap_streams) {
        int cap = g_cap_streams ? 2 * g_cap_streams : 16;
        emu_stream **a = tf_realloc(g_streams, (size_t)cap * sizeof *a);
        if (a) g_streams = a, g_cap_streams = cap;
    }
    bool ok = g_nstreams < g_cap_streams;
    if (ok) g_streams[g_nstreams++] = st;
    q_unlock();
    if (!ok) {
        tf_free(st);
        return fail(OUT_OF_MEMORY, "out of host memory");
    }
    pthread_mutex_lock(&g_mu);
    g_live_streams++;
    pthread_mutex_unlock(&g_mu);
    *s = (tf_cu_stream)st;
    return OK;
}
static tf_cu_result emu_stream_destroy(tf_cu_stream s)
{
    emu_stream *st = (emu_stream *)s;
    if (!st) return fail(INVALID_HANDLE, "no stream");
    if (st->capturing) {
        pthread_mutex_lock(&g_mu);
        g_capturing--;
        pthread_mutex_unlock(&g_mu);
    }
    /* its work finishes first (and the work of streams waiting for it); its events keep how it ended */
    flush_all();
    q_lock();
    for (int i = 0; i < g_nstreams; i++)
        if (g_streams[i] == st) {
            g_streams[i] = g_streams[--g_nstreams];
            break;
        }
    for (emu_event *e = g_events; e; e = e->next)
        if (e->st == st) {
            e->fault = fault_by(st, e->seq);
            snprintf(e->msg, sizeof e->msg, "%s", e->fault ? st->msg : "");
            e->st = NULL;
        }
    q_unlock();
    graph_free(st->graph);
    tf_free(st->q);
    tf_free(st);
    pthread_mutex_lock(&g_mu);
    g_live_streams--;
    pthread_mutex_unlock(&g_mu);
    return OK;
}
static tf_cu_result emu_stream_sync(tf_cu_stream s)
{
    emu_stream *st = (emu_stream *)s;
    if (st && st->capturing) return fail(STREAM_CAPTURE_UNSUPPORTED, "cuStreamSynchronize on a stream that is capturing a graph");
    if (!st) {
        flush_all();
        return settle();
    }
    q_lock();
    flush_until(st, st->enq);
    int fault = st->fault;
    char msg[sizeof st->msg];
    snprintf(msg, sizeof msg, "%s", st->msg);
    q_unlock();
    int r = settle();
    return fault ? fail(fault, "%s", msg) : r;
}

static tf_cu_result emu_module_load(tf_cu_module *out, const void *image)
{
    const char *img = image;
    if (!img || strncmp(img, IMAGE_MAGIC, strlen(IMAGE_MAGIC)))
        return fail(INVALID_IMAGE, "cuda-emu loads the images its NVRTC stand-in makes (CUDA C source), not cubins");
    emu_module *m = tf_calloc(1, sizeof *m);
    if (!m || !(m->src = tf_strdup(img + strlen(IMAGE_MAGIC)))) {
        tf_free(m);
        return fail(OUT_OF_MEMORY, "out of host memory");
    }
    char why[512];
    if (!parse_kernels(m, why, sizeof why)) {
        tf_free(m->fns);
        tf_free(m->src);
        tf_free(m);
        return fail(INVALID_IMAGE, "cuda-emu: %s", why);
    }
    m->key = fnv(FNV0, m->src, strlen(m->src));
    pthread_mutex_lock(&g_mu);
    m->next_pending = g_pending;
    g_pending = m;
    g_live_modules++;
    pthread_mutex_unlock(&g_mu);
    *out = (tf_cu_module)m;
    return OK;
}

static tf_cu_result emu_module_unload(tf_cu_module mod)
{
    emu_module *m = (emu_module *)mod;
    if (!m) return fail(INVALID_HANDLE, "no module");
    flush_all();   /* queued launches of its kernels run first */
    pthread_mutex_lock(&g_mu);
    for (emu_module **p = &g_pending; *p; p = &(*p)->next_pending)
        if (*p == m) {
            *p = m->next_pending;
            break;
        }
    g_live_modules--;
    pthread_mutex_unlock(&g_mu);
    if (m->handle) dlclose(m->handle);
    tf_free(m->fns);
    tf_free(m->src);
    tf_free(m->error);
    tf_free(m);
    return OK;
}

static tf_cu_result emu_module_func(tf_cu_function *f, tf_cu_module mod, const char *name)
{
    emu_module *m = (emu_module *)mod;
    for (int i = 0; m && i < m->nfns; i++)
        if (!strcmp(m->fns[i].name, name)) {
            *f = (tf_cu_function)&m->fns[i];
            return OK;
        }
    return fail(NOT_FOUND, "the module has no kernel named %s", name);
}

static tf_cu_result emu_func_attr(tf_cu_function fn, int attr, int value)
{
    emu_func *f = (emu_func *)fn;
    if (attr != 8) return fail(NOT_SUPPORTED, "cuda-emu sets only CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES");
    if (value < 0 || value > SMEM_OPTIN) return fail(INVALID_VALUE, "%d bytes of dynamic shared memory: the device has %d", value, SMEM_OPTIN);
    f->max_smem = (unsigned)value;
    return OK;
}

typedef struct event_arg { emu_event *e; } event_arg;
static int run_event(void *argp) { ((event_arg *)argp)->e->ms = now_ms(); return OK; }
static tf_cu_result emu_event_create(tf_cu_event *e, unsigned flags)
{
    if (flags & ~3u) return fail(INVALID_VALUE, "cuEventCreate: flags %#x (cuda-emu takes DEFAULT, BLOCKING_SYNC, DISABLE_TIMING)", flags);
    emu_event *ev = tf_calloc(1, sizeof *ev);
    if (!ev) return fail(OUT_OF_MEMORY, "out of host memory");
    q_lock();
    ev->next = g_events;
    g_events = ev;
    q_unlock();
    pthread_mutex_lock(&g_mu);
    g_live_events++;
    pthread_mutex_unlock(&g_mu);
    *e = (tf_cu_event)ev;
    return OK;
}
/* A live event (q held), or NULL. */
static emu_event *live_event(tf_cu_event e)
{
    for (emu_event *v = g_events; v; v = v->next)
        if (v == (emu_event *)e) return v;
    return NULL;
}
static tf_cu_result emu_event_destroy(tf_cu_event e)
{
    flush_all();   /* a record still queued runs first */
    q_lock();
    emu_event **p = &g_events;
    while (*p && *p != (emu_event *)e) p = &(*p)->next;
    bool found = *p != NULL;
    if (found) *p = (*p)->next;
    q_unlock();
    if (!found) return fail(INVALID_HANDLE, "cuEventDestroy: %p is not a live event", (void *)e);
    tf_free(e);
    pthread_mutex_lock(&g_mu);
    g_live_events--;
    pthread_mutex_unlock(&g_mu);
    return OK;
}
static tf_cu_result emu_event_record(tf_cu_event e, tf_cu_stream s)
{
    emu_stream *st = (emu_stream *)s;
    q_lock();
    emu_event *ev = live_event(e);
    if (!ev) {
        q_unlock();
        return fail(INVALID_HANDLE, "cuEventRecord: %p is not a live event", (void *)e);
    }
    event_arg a = {ev};
    int r = tf_cuda_emu_submit(s, run_event, &a, sizeof a);
    if (!r) {
        ev->graph = st && st->capturing ? st->graph : NULL;
        ev->st = st && !st->capturing ? st : NULL;
        ev->seq = ev->st ? st->enq : 0;
        ev->fault = 0;
    }
    q_unlock();
    return r;
}
/* Whether the event's last record has run (q held); *fault: the failure it came after. */
static bool event_done(const emu_event *e, int *fault, const char **msg)
{
    *fault = e->st ? fault_by(e->st, e->seq) : e->fault;
    *msg = e->st ? e->st->msg : e->msg;
    return !e->st || e->st->done >= e->seq;
}
static tf_cu_result emu_event_sync(tf_cu_event e)
{
    q_lock();
    emu_event *ev = live_event(e);
    if (!ev) {
        q_unlock();
        return fail(INVALID_HANDLE, "cuEventSynchronize: %p is not a live event", (void *)e);
    }
    if (ev->st) flush_until(ev->st, ev->seq);
    int fault;
    const char *m;
    event_done(ev, &fault, &m);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", m);
    q_unlock();
    return fault ? fail(fault, "%s", msg) : OK;
}
static tf_cu_result emu_event_query(tf_cu_event e)
{
    q_lock();
    emu_event *ev = live_event(e);
    if (!ev) {
        q_unlock();
        return fail(INVALID_HANDLE, "cuEventQuery: %p is not a live event", (void *)e);
    }
    int fault;
    const char *m;
    bool done = event_done(ev, &fault, &m);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", m);
    q_unlock();
    return !done ? NOT_READY : fault ? fail(fault, "%s", msg) : OK;
}

/* A stream's queued wait: the stream it waits for runs up to the record. */
typedef struct wait_arg { emu_stream *st; uint64_t seq; } wait_arg;
static int run_wait(void *argp)
{
    wait_arg *w = argp;
    flush_until(w->st, w->seq);   /* q held: this runs inside a flush */
    return fault_by(w->st, w->seq) ? fail(w->st->fault, "%s", w->st->msg) : OK;
}
typedef struct fail_arg { int code; char msg[2048]; } fail_arg;
static int run_fail(void *argp) { return fail(((fail_arg *)argp)->code, "%s", ((fail_arg *)argp)->msg); }

static tf_cu_result emu_stream_wait_event(tf_cu_stream s, tf_cu_event e, unsigned flags)
{
    emu_stream *st = (emu_stream *)s;
    if (flags) return fail(INVALID_VALUE, "cuStreamWaitEvent: flags %u (cuda-emu takes 0)", flags);
    q_lock();
    emu_event *ev = live_event(e);
    int r = OK;
    if (!ev) {
        r = fail(INVALID_HANDLE, "cuStreamWaitEvent: %p is not a live event", (void *)e);
    } else if (st && st->capturing) {
        /* inside a capture, only an event recorded into the same capture orders work (a recorded graph runs in
         * order, so that is already so); one from outside would cross the capture's boundary */
        if (ev->graph != st->graph) {
            st->error = STREAM_CAPTURE_ISOLATION;
            r = fail(STREAM_CAPTURE_ISOLATION, "cuStreamWaitEvent: a capturing stream waits for an event recorded outside the capture");
        }
    } else if (ev->st && ev->st->done < ev->seq) {   /* pending: the wait runs it when this stream gets there */
        if (ev->st != st) {
            wait_arg w = {ev->st, ev->seq};
            r = tf_cuda_emu_submit(s, run_wait, &w, sizeof w);
        }
    } else {
        int fault;
        const char *m;
        event_done(ev, &fault, &m);
        if (fault) {   /* it came after a failure: so does this stream's next work */
            fail_arg f = {fault, ""};
            snprintf(f.msg, sizeof f.msg, "%s", m);
            r = tf_cuda_emu_submit(s, run_fail, &f, sizeof f);
        }
    }
    q_unlock();
    return r;
}

static tf_cu_result emu_event_elapsed(float *ms, tf_cu_event a, tf_cu_event b)
{
    q_lock();
    emu_event *ea = live_event(a), *eb = live_event(b);
    int fa = 0, fb = 0;
    const char *m;
    bool done = ea && eb && event_done(ea, &fa, &m) && event_done(eb, &fb, &m);
    if (done) *ms = (float)(eb->ms - ea->ms);
    q_unlock();
    if (!ea || !eb) return fail(INVALID_HANDLE, "cuEventElapsedTime: not a live event");
    return done ? OK : NOT_READY;
}

/* ---- graphs: what a capture recorded, replayed in order ------------------------------ */

static void graph_free(emu_graph *g)
{
    if (!g) return;
    for (int i = 0; i < g->n; i++) tf_free(g->w[i].arg);
    tf_free(g->w);
    tf_free(g);
}

static tf_cu_result emu_begin_capture(tf_cu_stream s, int mode)
{
    emu_stream *st = (emu_stream *)s;
    (void)mode;
    if (!st) return fail(STREAM_CAPTURE_UNSUPPORTED, "the legacy stream cannot capture a graph");
    if (st->capturing) return fail(INVALID_VALUE, "cuStreamBeginCapture: the stream is capturing already");
    if (!(st->graph = tf_calloc(1, sizeof *st->graph))) return fail(OUT_OF_MEMORY, "out of host memory");
    st->capturing = true;
    st->error = 0;
    pthread_mutex_lock(&g_mu);
    g_capturing++;
    pthread_mutex_unlock(&g_mu);
    return OK;
}

static tf_cu_result emu_end_capture(tf_cu_stream s, tf_cu_graph *out)
{
    emu_stream *st = (emu_stream *)s;
    *out = NULL;
    if (!st || !st->capturing) return fail(INVALID_VALUE, "cuStreamEndCapture: the stream is not capturing");
    st->capturing = false;
    pthread_mutex_lock(&g_mu);
    g_capturing--;
    pthread_mutex_unlock(&g_mu);
    emu_graph *g = st->graph;
    st->graph = NULL;
    if (st->error) {
        graph_free(g);
        return fail(STREAM_CAPTURE_INVALIDATED, "the capture was invalidated by a failed call inside it");
    }
    pthread_mutex_lock(&g_mu);
    g_live_graphs++;
    pthread_mutex_unlock(&g_mu);
    *out = (tf_cu_graph)g;
    return OK;
}

/* An executable graph: its own copy of the recorded work. */
static tf_cu_result emu_instantiate(tf_cu_graph_exec *out, tf_cu_graph gg, unsigned long long flags)
{
    emu_graph *g = (emu_graph *)gg, *e = tf_calloc(1, sizeof *e);
    (void)flags;
    *out = NULL;
    if (!g) return fail(INVALID_HANDLE, "no graph");
    if (!e || !(e->w = tf_calloc((size_t)(g->n ? g->n : 1), sizeof *e->w))) {
        tf_free(e);
        return fail(OUT_OF_MEMORY, "out of host memory");
    }
    for (int i = 0; i < g->n; i++) {
        e->w[i] = g->w[i];
        e->w[i].arg = NULL;
    }
    e->n = e->cap = g->n;
    /* the work's arguments are copied: the graph may be destroyed before its executable */
    for (int i = 0; i < g->n; i++) {
        size_t bytes = g->w[i].bytes;
        if (!(e->w[i].arg = tf_malloc(bytes ? bytes : 1))) {
            graph_free(e);
            return fail(OUT_OF_MEMORY, "out of host memory");
        }
        memcpy(e->w[i].arg, g->w[i].arg, bytes);
    }
    pthread_mutex_lock(&g_mu);
    g_live_graphs++;
    pthread_mutex_unlock(&g_mu);
    *out = (tf_cu_graph_exec)e;
    return OK;
}

typedef struct graph_arg { emu_graph *e; } graph_arg;
static int run_graph(void *argp)
{
    emu_graph *e = ((graph_arg *)argp)->e;
    for (int i = 0; i < e->n; i++) {
        int r = e->w[i].fn(e->w[i].arg);
        if (r) return r;
    }
    return OK;
}

static tf_cu_result emu_graph_launch(tf_cu_graph_exec ge, tf_cu_stream s)
{
    emu_graph *e = (emu_graph *)ge;
    emu_stream *st = (emu_stream *)s;
    if (!e) return fail(INVALID_HANDLE, "no graph");
    if (st && st->capturing) return fail(NOT_SUPPORTED, "cuda-emu does not capture a graph launch into another graph");
    graph_arg a = {e};
    return tf_cuda_emu_submit(s, run_graph, &a, sizeof a);
}

static tf_cu_result graph_destroy(void *g)
{
    if (!g) return fail(INVALID_HANDLE, "no graph");
    graph_free(g);
    pthread_mutex_lock(&g_mu);
    g_live_graphs--;
    pthread_mutex_unlock(&g_mu);
    return OK;
}
static tf_cu_result emu_gexec_destroy(tf_cu_graph_exec e)
{
    flush_all();   /* a queued launch of it runs first */
    return graph_destroy(e);
}
static tf_cu_result emu_graph_destroy(tf_cu_graph g) { return graph_destroy(g); }

/* ---- NVRTC ----------------------------------------------------------------------------------- */

typedef struct emu_prog { char *image; size_t size; } emu_prog;

static const char *nv_error(tf_nvrtc_result r) { return r ? "NVRTC_ERROR (cuda-emu)" : "NVRTC_SUCCESS"; }
static tf_nvrtc_result nv_version(int *a, int *b) { *a = 0; *b = 1; return 0; }
static tf_nvrtc_result nv_narchs(int *n) { *n = 1; return 0; }
static tf_nvrtc_result nv_archs(int *a) { a[0] = 90; return 0; }
static tf_nvrtc_result nv_create(tf_nvrtc_prog *p, const char *src, const char *name, int nh, const char *const *h, const char *const *hn)
{
    (void)name, (void)nh, (void)h, (void)hn;
    emu_prog *q = tf_calloc(1, sizeof *q);
    size_t len = strlen(IMAGE_MAGIC) + strlen(src) + 1;
    if (!q || !(q->image = tf_malloc(len))) {
        tf_free(q);
        return 1;
    }
    snprintf(q->image, len, "%s%s", IMAGE_MAGIC, src);
    q->size = len;
    *p = (tf_nvrtc_prog)q;
    return 0;
}
static tf_nvrtc_result nv_destroy(tf_nvrtc_prog *p)
{
    emu_prog *q = (emu_prog *)*p;
    if (q) tf_free(q->image);
    tf_free(q);
    *p = NULL;
    return 0;
}
static tf_nvrtc_result nv_compile(tf_nvrtc_prog p, int n, const char *const *o) { (void)p, (void)n, (void)o; return 0; }
static tf_nvrtc_result nv_log_size(tf_nvrtc_prog p, size_t *n) { (void)p; *n = 1; return 0; }
static tf_nvrtc_result nv_log(tf_nvrtc_prog p, char *log) { (void)p; log[0] = 0; return 0; }
static tf_nvrtc_result nv_cubin_size(tf_nvrtc_prog p, size_t *n) { *n = ((emu_prog *)p)->size; return 0; }
static tf_nvrtc_result nv_cubin(tf_nvrtc_prog p, char *out) { memcpy(out, ((emu_prog *)p)->image, ((emu_prog *)p)->size); return 0; }

/* ---- filling the tables ------------------------------------------------------------------------ */

void tf_cuda_emu_lt_fill(tf_cublaslt_api *api);

void tf_cuda_emu_load(tf_cuda_libs *l, unsigned which)
{
    static const char where[] = "cuda-emu (stand-in on the host, built into libtfuse)";
    if (which & TF_CUDA_LIB_NVRTC) {
        l->nvrtc = (tf_nvrtc_api){nv_error, nv_version, nv_narchs, nv_archs, nv_create, nv_destroy, nv_compile,
                                  nv_log_size, nv_log, nv_cubin_size, nv_cubin};
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
        c->StreamCreate = emu_stream_create, c->StreamDestroy = emu_stream_destroy, c->StreamSynchronize = emu_stream_sync;
        c->ModuleLoadData = emu_module_load, c->ModuleUnload = emu_module_unload, c->ModuleGetFunction = emu_module_func;
        c->FuncSetAttribute = emu_func_attr, c->LaunchKernel = emu_launch;
        c->MemcpyHtoDAsync = emu_memcpy_htod_async, c->MemcpyDtoHAsync = emu_memcpy_dtoh_async;
        c->MemcpyDtoDAsync = emu_memcpy_dtod_async, c->MemsetD8Async = emu_memset_async;
        c->MemAllocHost = emu_host_alloc, c->MemFreeHost = emu_host_free;
        c->EventCreate = emu_event_create, c->EventDestroy = emu_event_destroy, c->EventRecord = emu_event_record;
        c->EventElapsedTime = emu_event_elapsed;
        c->StreamWaitEvent = emu_stream_wait_event, c->EventSynchronize = emu_event_sync, c->EventQuery = emu_event_query;
        c->StreamBeginCapture = emu_begin_capture, c->StreamEndCapture = emu_end_capture, c->GraphInstantiate = emu_instantiate;
        c->GraphLaunch = emu_graph_launch, c->GraphExecDestroy = emu_gexec_destroy, c->GraphDestroy = emu_graph_destroy;
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
    if (which & TF_CUDA_LIB_CUDNN) {
        tf_cuda_emu_dnn_fill(&l->dnn);
        l->cudnn_version = l->dnn.GetVersion();
        snprintf(l->cudnn_path, sizeof l->cudnn_path, "%s", where);
        l->loaded |= TF_CUDA_LIB_CUDNN;
    }
}

int tf_cuda_emu_live(void)
{
    pthread_mutex_lock(&g_mu);
    int n = g_nallocs + g_live_modules + g_live_streams + g_live_events + g_live_graphs;
    pthread_mutex_unlock(&g_mu);
    return n;
}
