/* emu_nvrtc.c — cuda-emu's NVRTC and modules (see emu.h, emu.c). The
 * NVRTC stand-in compiles nothing: the "cubin" it hands back is the CUDA C
 * source behind a magic line (IMAGE_MAGIC), and cuModuleLoadData reads
 * the name, launch bound and parameter sizes of each __global__ function
 * from that source; the host C++ compiler makes the code.
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
 * clang++ on PATH. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "cache_file.h"
#include "emu.h"
#include "emu_internal.h"
#include "env.h"

extern char **environ;

/* The prelude's text (emu_prelude.cuh), linked in by emu_prelude.S. */
extern const char tf_cuda_emu_prelude[] __attribute__((visibility("hidden")));

static const char IMAGE_MAGIC[] = "TFEMU-CUDA-C 1\n";

static int g_live_modules;    /* (tf_emu_mu) */
static emu_module *g_pending;

static uint64_t fnv(uint64_t h, const void *p, size_t n) { return tf_fnv1a(h, p, n); }
#define FNV0 TF_FNV_BASIS

/* ---- compiling modules ------------------------------------------------------------- */

static pthread_once_t g_tool_once = PTHREAD_ONCE_INIT;
static long g_cache_hits, g_cache_compiled;   /* kernels found in the cache, and compiled (tf_emu_mu) */
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
    pthread_mutex_lock(&tf_emu_mu);
    *hits = g_cache_hits;
    *compiled = g_cache_compiled;
    pthread_mutex_unlock(&tf_emu_mu);
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

/* Compile every pending module (tf_emu_mu held). */
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

/* Whether module m defines a kernel some module of batch b defines. */
static bool shares_kernel(const batch *b, const emu_module *m)
{
    for (int i = 0; i < b->n; i++)
        for (int j = 0; j < b->mods[i]->nfns; j++)
            for (int k = 0; k < m->nfns; k++)
                if (!strcmp(b->mods[i]->fns[j].name, m->fns[k].name)) return true;
    return false;
}

/* Load waiting[0..n) from the cache or compile them (tf_emu_mu held). */
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
    /* the same kernel twice (two modules of one source, loaded before either compiled): compiled once, in
     * one batch, or the batch would define its symbols twice; the others load its object after */
    int uniq = 0, ndup = 0;
    emu_module **dups = miss ? tf_malloc((size_t)miss * sizeof *dups) : NULL;
    for (int i = 0; i < miss; i++) {
        bool seen = false;
        for (int j = 0; j < uniq && !seen; j++) seen = !strcmp(waiting[j]->so, waiting[i]->so);
        if (seen && dups) dups[ndup++] = waiting[i];
        else waiting[uniq++] = waiting[i];
    }
    miss = uniq;
    if (!miss) {
        tf_free(dups);
        return first_failure(waiting, n);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nb = cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus;
    if (nb > miss) nb = miss;
    /* kernels dealt out in turn, so batches are alike in size; but two modules that define a kernel of the same
     * name (the cuda target's modules may share kernels) never share a batch, whose one translation unit would
     * define it twice (their kernels are extern "C") */
    enum { MAX_BATCHES = 64 };
    batch bs[MAX_BATCHES];
    memset(bs, 0, sizeof bs);
    int used = nb;
    bool oom_batches = false;
    for (int b = 0; b < used; b++) oom_batches |= !(bs[b].mods = tf_calloc((size_t)miss, sizeof *bs[b].mods));
    for (int i = 0; i < miss && !oom_batches; i++) {
        int pick = -1;
        for (int t = 0; t < used && pick < 0; t++) {
            int b = (i + t) % used;
            if (!shares_kernel(&bs[b], waiting[i])) pick = b;
        }
        if (pick < 0 && used < MAX_BATCHES) {
            pick = used++;
            oom_batches |= !(bs[pick].mods = tf_calloc((size_t)miss, sizeof *bs[pick].mods));
            if (oom_batches) break;
        }
        if (pick < 0) {
            waiting[i]->state = MOD_FAILED;
            waiting[i]->error = tf_strdup("cuda-emu: more than 64 modules to compile share a kernel");
            continue;
        }
        bs[pick].mods[bs[pick].n++] = waiting[i];
    }
    if (oom_batches) {
        for (int b = 0; b < used; b++) tf_free(bs[b].mods);
        for (int i = 0; i < miss; i++) waiting[i]->state = MOD_FAILED, waiting[i]->error = NULL;
        tf_free(dups);
        return first_failure(waiting, miss);
    }
    nb = used;
    for (int b = 0; b < nb; b++)
        if (bs[b].n) start_batch(&bs[b]);
    for (int b = 0; b < nb; b++)
        if (bs[b].n) finish_batch(&bs[b]);
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
    for (int b = 0; b < nb; b++) tf_free(bs[b].mods);
    for (int i = 0; i < ndup; i++) {   /* the copies: the object their twin left (or its failure) */
        emu_module *m = dups[i];
        emu_module *twin = NULL;
        for (int j = 0; j < miss && !twin; j++)
            if (!strcmp(waiting[j]->so, m->so)) twin = waiting[j];
        if (twin && twin->state == MOD_READY && load_so(m, m->so)) continue;
        m->error = tf_strdup(twin && twin->error ? twin->error : "cuda-emu: its twin kernel did not compile");
        m->state = MOD_FAILED;
    }
    int r = first_failure(waiting, miss);
    if (!r && ndup) r = first_failure(dups, ndup);
    tf_free(dups);
    return r;
}

/* Every module compiled; the first failure's words. */
int tf_emu_settle(void)
{
    pthread_mutex_lock(&tf_emu_mu);
    int r = compile_pending();
    pthread_mutex_unlock(&tf_emu_mu);
    return r;
}

int tf_emu_module_ready(emu_module *m)
{
    pthread_mutex_lock(&tf_emu_mu);
    if (m->state == MOD_PENDING) compile_pending();
    int r = m->state == MOD_READY ? OK
                                  : fail(INVALID_IMAGE, "cuda-emu: kernel %s does not compile on the host: %s", m->fns[0].name,
                                         m->error ? m->error : "out of memory");
    pthread_mutex_unlock(&tf_emu_mu);
    return r;
}

/* ---- the driver's module calls -------------------------------------------------------- */

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
    pthread_mutex_lock(&tf_emu_mu);
    m->next_pending = g_pending;
    g_pending = m;
    g_live_modules++;
    pthread_mutex_unlock(&tf_emu_mu);
    *out = (tf_cu_module)m;
    return OK;
}

static tf_cu_result emu_module_unload(tf_cu_module mod)
{
    emu_module *m = (emu_module *)mod;
    if (!m) return fail(INVALID_HANDLE, "no module");
    tf_emu_flush_all();   /* queued launches of its kernels run first */
    pthread_mutex_lock(&tf_emu_mu);
    for (emu_module **p = &g_pending; *p; p = &(*p)->next_pending)
        if (*p == m) {
            *p = m->next_pending;
            break;
        }
    g_live_modules--;
    pthread_mutex_unlock(&tf_emu_mu);
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

/* ---- what emu.c asks ------------------------------------------------------------------- */

int tf_emu_live_modules(void) { return g_live_modules; }

void tf_emu_module_fill(tf_cu_api *c)
{
    c->ModuleLoadData = emu_module_load, c->ModuleUnload = emu_module_unload, c->ModuleGetFunction = emu_module_func;
}

void tf_emu_nvrtc_fill(tf_nvrtc_api *api)
{
    *api = (tf_nvrtc_api){nv_error, nv_version, nv_narchs, nv_archs, nv_create, nv_destroy, nv_compile,
                           nv_log_size, nv_log, nv_cubin_size, nv_cubin};
}
