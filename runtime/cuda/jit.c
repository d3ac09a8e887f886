/* jit.c — emitted CUDA C to loaded functions: kernels grouped into NVRTC
 * programs, taken from the package, the disk cache or NVRTC (see
 * cuda_jit.h). */
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
    PROGRAM_WEIGHT = 1024 * 1024,                          /* the most source a program takes, if the cores leave more */
    KERNEL_WEIGHT = 3000,                                  /* a kernel's fixed share of a program's compile, in source bytes */
    MAX_PROGRAMS = 256,
};
static const unsigned MAX_GRID = 0x7fffffffu;              /* gridDim.x */
static const char MAGIC[8] = {'T', 'F', 'C', 'U', 'B', 'I', 'N', '2'};

/* ---- the disk cache ----------------------------------------------------------- */

typedef struct cache_header {
    char magic[8];
    uint64_t key;               /* hash of (the program's source, arch, NVRTC version) */
    uint64_t size;              /* cubin bytes after the names */
    uint64_t sum;               /* tf_hash64 of the names and the cubin */
    uint32_t nkernels;          /* names of 24 bytes after the header */
    uint32_t pad;
    char arch[16];
} cache_header;

static uint64_t cache_key(const char *src, const char *arch, const tf_cuda_libs *l)
{
    char ver[64];
    snprintf(ver, sizeof ver, "nvrtc %d.%d", l->nvrtc_major, l->nvrtc_minor);
    uint64_t h = tf_fnv1a(TF_FNV_BASIS, src, strlen(src) + 1);
    h = tf_fnv1a(h, arch, strlen(arch) + 1);
    return tf_fnv1a(h, ver, strlen(ver) + 1);
}

static void program_path(const char *dir, uint64_t key, char *out, size_t n)
{
    snprintf(out, n, "%.4000s/%016llx.cubin", dir, (unsigned long long)key);
}

static void kernel_path(const char *dir, uint64_t kkey, char *out, size_t n)
{
    snprintf(out, n, "%.4000s/%016llx.kernel", dir, (unsigned long long)kkey);
}

static int find_cubin(const tf_cuda_cubins *o, const char *name)
{
    for (int c = 0; c < o->n; c++)
        if (!strcmp(o->c[c].name, name)) return c;
    return -1;
}

static bool holds(const tf_cuda_cubin *c, const char *kernel)
{
    for (int i = 0; i < c->nkernels; i++)
        if (!strncmp(c->kernels[i], kernel, sizeof c->kernels[i])) return true;
    return false;
}

/* A cubin into o (which owns bin and names from then on); its index, or
 * -1 (both freed) when out of memory. */
static int add_cubin(tf_cuda_cubins *o, const char *name, void *bin, size_t size, char (*names)[24], int nnames, tf_cubin_from from)
{
    tf_cuda_cubin *c = tf_realloc(o->c, (size_t)(o->n + 1) * sizeof *c);
    if (!c) {
        tf_free(bin);
        tf_free(names);
        return -1;
    }
    o->c = c;
    c = &o->c[o->n];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->bin = bin, c->size = size, c->kernels = names, c->nkernels = nnames, c->from = from;
    return o->n++;
}

/* The cached program key for arch into o: its index, or -1 (missing, torn,
 * another key or architecture, out of memory). */
static int cache_read(const char *dir, uint64_t key, const char *arch, tf_cuda_cubins *o)
{
    char path[4200], name[24];
    program_path(dir, key, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    cache_header h;
    unsigned char *all = NULL;
    size_t names = 0;
    bool bad = true;   /* the file is not what this key names: torn, corrupted, or another's */
    if (fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, MAGIC, sizeof MAGIC) && h.key == key && h.size > 0 &&
        h.size < ((uint64_t)1 << 31) && h.nkernels > 0 && h.nkernels < 1u << 20 && !strncmp(h.arch, arch, sizeof h.arch)) {
        names = (size_t)h.nkernels * 24;
        all = tf_malloc(names + h.size);
        bad = all != NULL;   /* out of memory says nothing about the file */
    }
    int extra = 0;
    bool ok = all && fread(all, 1, names + h.size, f) == names + h.size && fread(&extra, 1, 1, f) == 0 &&
              tf_hash64(all, names + h.size) == h.sum;
    fclose(f);
    if (!ok) {   /* files are renamed into place whole: a bad one goes now, not left for the bound to find */
        tf_free(all);
        if (bad) remove(path);
        return -1;
    }
    char(*kn)[24] = tf_malloc(names);
    void *bin = tf_malloc(h.size);
    if (!kn || !bin) {
        tf_free(kn);
        tf_free(bin);
        tf_free(all);
        return -1;
    }
    memcpy(kn, all, names);
    for (uint32_t i = 0; i < h.nkernels; i++) kn[i][23] = 0;
    memcpy(bin, all + names, h.size);
    tf_free(all);
    snprintf(name, sizeof name, "tfp_%016llx", (unsigned long long)key);
    return add_cubin(o, name, bin, h.size, kn, (int)h.nkernels, TF_CUBIN_CACHED);
}

static void write_links(const char *dir, uint64_t key, const uint64_t *kkeys, int n);

/* A program NVRTC just made, and a link to it for each of its kernels
 * (kkeys[i]: the cache key of kernel i's own source); written atomically
 * (cache_file.h) and counted against the bound. */
static void cache_write(const char *dir, uint64_t key, const char *arch, const tf_cuda_cubin *c, const uint64_t *kkeys)
{
    char path[4200];
    program_path(dir, key, path, sizeof path);
    size_t names = (size_t)c->nkernels * 24;
    cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, sizeof MAGIC);
    h.key = key;
    h.size = c->size;
    h.nkernels = (uint32_t)c->nkernels;
    snprintf(h.arch, sizeof h.arch, "%s", arch);
    unsigned char *all = tf_malloc(sizeof h + names + c->size);
    if (!all) return;
    memcpy(all + sizeof h, c->kernels, names);
    memcpy(all + sizeof h + names, c->bin, c->size);
    h.sum = tf_hash64(all + sizeof h, names + c->size);
    memcpy(all, &h, sizeof h);
    bool ok = tf_cache_put(path, all, sizeof h + names + c->size, c->bin);
    tf_free(all);
    if (ok) write_links(dir, key, kkeys, c->nkernels);
}

/* A link to program key for each of n kernels (kkeys: the cache keys of
 * their own sources), each replaced atomically. */
static void write_links(const char *dir, uint64_t key, const uint64_t *kkeys, int n)
{
    char link[4200], tmp[4400], target[40];
    snprintf(target, sizeof target, "%016llx.cubin", (unsigned long long)key);
    for (int i = 0; i < n; i++) {
        kernel_path(dir, kkeys[i], link, sizeof link);
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", link, (long)getpid());
        remove(tmp);
        if (symlink(target, tmp) != 0) continue;
        if (rename(tmp, link) != 0) remove(tmp);
        else tf_cache_added(link, strlen(target));
    }
}

/* Kernel ks through its link: the index of the cached program that holds
 * it (read now, or already in o), or -1. */
static int cache_find(const char *dir, const tf_cuda_libs *l, const char *arch, const tf_cuda_kernel *k, tf_cuda_cubins *o)
{
    char link[4200], target[64];
    kernel_path(dir, cache_key(k->src, arch, l), link, sizeof link);
    ssize_t len = readlink(link, target, sizeof target - 1);   /* "KEY.cubin" */
    if (len != 22) return -1;
    target[len] = 0;
    if (strcmp(target + 16, ".cubin") != 0) return -1;
    char *end = NULL;
    unsigned long long key = strtoull(target, &end, 16);
    if (end != target + 16) return -1;
    char name[24];
    snprintf(name, sizeof name, "tfp_%016llx", key);
    int c = find_cubin(o, name);   /* read already, or the package's copy of it */
    if (c >= 0 && !holds(&o->c[c], k->name)) {
        /* a package lists only its model's kernels of a program: the file says which the program defines */
        int d = cache_read(dir, key, arch, o);
        bool more = d >= 0 && holds(&o->c[d], k->name);
        char(*names)[24] = more ? tf_realloc(o->c[c].kernels, (size_t)(o->c[c].nkernels + 1) * sizeof *names) : NULL;
        if (names) {
            o->c[c].kernels = names;
            snprintf(names[o->c[c].nkernels++], sizeof *names, "%s", k->name);
        }
        if (d >= 0) {   /* the copy just read goes again: it is the last */
            tf_free(o->c[d].bin);
            tf_free(o->c[d].kernels);
            o->n--;
        }
        if (!names) return -1;
    }
    if (c < 0) c = cache_read(dir, key, arch, o);
    if (c < 0 || !holds(&o->c[c], k->name)) return -1;
    tf_cache_touch(link);   /* used now, and its program: the last to be evicted (cache_file.h) */
    return c;
}

/* ---- the package -------------------------------------------------------------- */

/* Kernel k through the package's index "cuda/ARCH/kernels": the index of
 * its program in o (copied out now, or already there), or -1. */
static int package_find(const tf_pkg *pkg, const char *arch, const tf_cuda_kernel *k, tf_cuda_cubins *o)
{
    char sec[160];
    snprintf(sec, sizeof sec, "cuda/%.40s/kernels", arch);
    const tf_pkg_section *ix = tf_pkg_find(pkg, sec);
    if (!ix) return -1;
    const char *text = (const char *)ix->data, *at = text;
    size_t nl = strlen(k->name);
    while ((at = strstr(at, k->name)) && ((at > text && at[-1] != '\n') || at[nl] != ' ')) at += nl;
    if (!at) return -1;
    char prog[24];
    size_t plen = strcspn(at + nl + 1, "\n");
    if (plen == 0 || plen >= sizeof prog) return -1;
    memcpy(prog, at + nl + 1, plen);
    prog[plen] = 0;
    int c = find_cubin(o, prog);
    if (c >= 0) return holds(&o->c[c], k->name) ? c : -1;
    snprintf(sec, sizeof sec, "cuda/%.40s/%s.cubin", arch, prog);
    const tf_pkg_section *s = tf_pkg_find(pkg, sec);
    if (!s || !s->len) return -1;
    /* the kernels the index puts in this program */
    int nn = 0;
    for (const char *p = text; (p = strstr(p, prog)); p += plen) nn++;
    char(*names)[24] = tf_calloc((size_t)(nn ? nn : 1), sizeof *names);
    void *bin = tf_malloc(s->len);
    if (!names || !bin) {
        tf_free(names);
        tf_free(bin);
        return -1;
    }
    memcpy(bin, s->data, s->len);
    nn = 0;
    for (const char *line = text; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] == '\n')) {
        size_t a = strcspn(line, " \n");
        if (line[a] != ' ' || a >= 24 || strncmp(line + a + 1, prog, plen) || (line[a + 1 + plen] != '\n' && line[a + 1 + plen]))
            continue;
        memcpy(names[nn], line, a);
        names[nn++][a] = 0;
    }
    return add_cubin(o, prog, bin, s->len, names, nn, TF_CUBIN_PACKAGE);
}

/* ---- programs ----------------------------------------------------------------- */

typedef struct program {
    int *members;               /* indexes into ks, in the order of their names */
    int n;
    size_t weight;
    char *src;
    uint64_t key;
} program;

static size_t weight_of(const tf_cuda_kernel *k) { return strlen(k->src) + KERNEL_WEIGHT; }

typedef struct ranked {
    int idx;                    /* into ks */
    size_t weight;
    const char *name;
} ranked;

static int heaviest_first(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    return x->weight != y->weight ? (x->weight < y->weight ? 1 : -1) : strcmp(x->name, y->name);
}

static int by_name(const void *a, const void *b) { return strcmp(((const ranked *)a)->name, ((const ranked *)b)->name); }

/* One program's source (see cuda_jit.h): the #include lines of its
 * kernels once each, then each kernel in its namespace. NULL when out of
 * memory. */
static char *program_source(const tf_cuda_kernel *const *ks, const program *p)
{
    tf_strbuf s = {0};
    tf_strbuf_printf(&s, "// tfuse: %d kernels in one NVRTC program, each in a namespace of its own (runtime/cuda/jit.c)\n", p->n);
    char incs[8][64];
    int ninc = 0;
    for (int m = 0; m < p->n; m++)   /* the includes, once each */
        for (const char *at = ks[p->members[m]]->src; (at = strstr(at, "#include ")); at++) {
            if (at != ks[p->members[m]]->src && at[-1] != '\n') continue;
            size_t len = strcspn(at, "\n");
            bool seen = len >= sizeof incs[0];
            for (int i = 0; i < ninc && !seen; i++) seen = !strncmp(incs[i], at, len) && !incs[i][len];
            if (seen || ninc == 8) continue;
            memcpy(incs[ninc], at, len);
            incs[ninc][len] = 0;
            tf_strbuf_printf(&s, "%s\n", incs[ninc++]);
        }
    for (int m = 0; m < p->n; m++) {
        const tf_cuda_kernel *k = ks[p->members[m]];
        tf_strbuf_printf(&s, "\nnamespace %s_ns {\n", k->name);
        for (const char *line = k->src; *line;) {   /* the source but its #include lines, which are above */
            const char *inc = strstr(line, "#include ");
            while (inc && inc != line && inc[-1] != '\n') inc = strstr(inc + 1, "#include ");
            size_t len = inc ? (size_t)(inc - line) : strlen(line);
            tf_strbuf_append(&s, line, len);
            line += len;
            if (inc) line += strcspn(line, "\n"), line += *line == '\n';
        }
        if (s.n && s.p[s.n - 1] != '\n') tf_strbuf_append(&s, "\n", 1);
        tf_strbuf_printf(&s, "}\nusing %s_ns::%s;\n", k->name, k->name);
        if (k->name2[0]) tf_strbuf_printf(&s, "using %s_ns::%s;\n", k->name, k->name2);
    }
    if (s.oom) {
        tf_free(s.p);
        return NULL;
    }
    return s.p;
}

/* ks[idx[0..n)] dealt into programs (see cuda_jit.h); their count, or -1
 * when out of memory. */
static int make_programs(const tf_cuda_kernel *const *ks, const int *idx, int n, int threads_asked, program **out)
{
    ranked *r = tf_malloc((size_t)n * sizeof *r);
    int *owner = tf_malloc((size_t)n * sizeof *owner), *slots = tf_malloc((size_t)n * sizeof *slots);
    if (!r || !owner || !slots) {
        tf_free(r), tf_free(owner), tf_free(slots);
        return -1;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        r[i] = (ranked){idx[i], weight_of(ks[idx[i]]), ks[idx[i]]->name};
        total += r[i].weight;
    }
    long cpus = threads_asked > 0 ? threads_asked : sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = cpus > 0 ? (size_t)cpus : 1, np = threads, by_size = (total + PROGRAM_WEIGHT - 1) / PROGRAM_WEIGHT;
    if (by_size > np) np = (by_size + threads - 1) / threads * threads;   /* a whole number of programs per thread */
    if (np > (size_t)n) np = (size_t)n;
    if (np > MAX_PROGRAMS) np = MAX_PROGRAMS;
    program *ps = tf_calloc(np, sizeof *ps);
    if (!ps) {
        tf_free(r), tf_free(owner), tf_free(slots);
        return -1;
    }
    qsort(r, (size_t)n, sizeof *r, heaviest_first);
    for (int i = 0; i < n; i++) {   /* largest first, each to the lightest program */
        size_t best = 0;
        for (size_t q = 1; q < np; q++)
            if (ps[q].weight < ps[best].weight) best = q;
        ps[best].weight += r[i].weight;
        ps[best].n++;
        owner[i] = (int)best;
    }
    /* each program's kernels in the order of their names: the source, and so the key, depends on the set alone */
    ranked *mine = tf_malloc((size_t)n * sizeof *mine);
    if (!mine) {
        tf_free(r), tf_free(owner), tf_free(slots), tf_free(ps);
        return -1;
    }
    int at = 0;
    for (size_t q = 0; q < np; q++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (owner[i] == (int)q) mine[k++] = r[i];
        qsort(mine, (size_t)k, sizeof *mine, by_name);
        ps[q].members = slots + at;
        for (int i = 0; i < k; i++) ps[q].members[i] = mine[i].idx;
        at += k;
    }
    tf_free(mine), tf_free(r), tf_free(owner);
    *out = ps;
    return (int)np;
}

static void free_programs(program *ps, int np)
{
    if (!ps) return;
    if (np > 0) tf_free(ps[0].members);   /* one block for all */
    for (int q = 0; q < np; q++) tf_free(ps[q].src);
    tf_free(ps);
}

/* ks[idx[0..n)] compiled into programs; each cubin into o, of[] set. */
static tf_cuda_status compile_missing(const tf_cuda_libs *l, const char *arch, const char *dir, tf_cubins_mode mode, int threads,
                                      const tf_cuda_kernel *const *ks, int *idx, int n, tf_cuda_cubins *o, char *err, size_t en)
{
    program *ps = NULL;
    int np = make_programs(ks, idx, n, threads, &ps);
    tf_nvrtc_job *jobs = np > 0 ? tf_calloc((size_t)np, sizeof *jobs) : NULL;
    int *which = np > 0 ? tf_calloc((size_t)np, sizeof *which) : NULL;
    char(*names)[24] = np > 0 ? tf_calloc((size_t)np, sizeof *names) : NULL;
    tf_cuda_status st = TF_CUDA_OK;
    if (np < 0 || !jobs || !which || !names) {
        snprintf(err, en, "out of memory");
        st = TF_CUDA_ERR_OOM;
    }
    int njobs = 0;
    for (int q = 0; !st && q < np; q++) {
        program *p = &ps[q];
        if (!(p->src = program_source(ks, p))) {
            snprintf(err, en, "out of memory");
            st = TF_CUDA_ERR_OOM;
            break;
        }
        p->key = cache_key(p->src, arch, l);
        int c = mode == TF_CUBINS_STORED && dir[0] ? cache_read(dir, p->key, arch, o) : -1;   /* the same program, its links lost */
        bool all = c >= 0;
        for (int m = 0; all && m < p->n; m++) all = holds(&o->c[c], ks[p->members[m]]->name);
        uint64_t *kkeys = all ? tf_calloc((size_t)p->n, sizeof *kkeys) : NULL;
        if (all) {
            for (int m = 0; m < p->n; m++) {
                o->of[p->members[m]] = c;
                if (kkeys) kkeys[m] = cache_key(ks[p->members[m]]->src, arch, l);
            }
            if (kkeys) write_links(dir, p->key, kkeys, p->n);   /* found again through them next time */
            tf_free(kkeys);
            o->cached += p->n;
            continue;
        }
        snprintf(names[q], sizeof names[q], "tfp_%016llx", (unsigned long long)p->key);
        jobs[njobs] = (tf_nvrtc_job){.src = p->src, .name = names[q], .arch = arch};
        which[njobs++] = q;
    }
    if (!st && njobs) tf_nvrtc_compile_jobs(l, jobs, njobs, threads);
    for (int j = 0; !st && j < njobs; j++) {
        program *p = &ps[which[j]];
        if (jobs[j].status) {   /* which kernel: each of the program alone */
            st = jobs[j].status;
            tf_nvrtc_job *one = tf_calloc((size_t)p->n, sizeof *one);
            bool named = false;
            if (one) {
                for (int m = 0; m < p->n; m++)
                    one[m] = (tf_nvrtc_job){.src = ks[p->members[m]]->src, .name = ks[p->members[m]]->name, .arch = arch};
                tf_nvrtc_compile_jobs(l, one, p->n, threads);
                for (int m = 0; m < p->n && !named; m++)
                    if (one[m].status) {
                        snprintf(err, en, "NVRTC could not compile kernel %s for %s: %s", one[m].name, arch, one[m].err);
                        st = one[m].status;
                        named = true;
                    }
                for (int m = 0; m < p->n; m++) tf_nvrtc_job_free(&one[m]);
                tf_free(one);
            }
            if (!named)
                snprintf(err, en, "NVRTC could not compile program %s (%d kernels, each of which compiles alone) for %s: %s", names[which[j]],
                         p->n, arch, jobs[j].err);
            break;
        }
        char(*kn)[24] = tf_calloc((size_t)p->n, sizeof *kn);
        uint64_t *kkeys = tf_calloc((size_t)p->n, sizeof *kkeys);
        if (!kn || !kkeys) {
            tf_free(kn);
            tf_free(kkeys);
            snprintf(err, en, "out of memory");
            st = TF_CUDA_ERR_OOM;
            break;
        }
        for (int m = 0; m < p->n; m++) {
            snprintf(kn[m], sizeof kn[m], "%s", ks[p->members[m]]->name);
            if (dir[0]) kkeys[m] = cache_key(ks[p->members[m]]->src, arch, l);
        }
        int c = add_cubin(o, names[which[j]], jobs[j].cubin, jobs[j].cubin_size, kn, p->n, TF_CUBIN_COMPILED);
        jobs[j].cubin = NULL;
        if (c < 0) {
            tf_free(kkeys);
            snprintf(err, en, "out of memory");
            st = TF_CUDA_ERR_OOM;
            break;
        }
        if (dir[0]) cache_write(dir, p->key, arch, &o->c[c], kkeys);
        tf_free(kkeys);
        for (int m = 0; m < p->n; m++) o->of[p->members[m]] = c;
        o->compiled += p->n;
    }
    for (int j = 0; jobs && j < njobs; j++) tf_nvrtc_job_free(&jobs[j]);
    tf_free(jobs);
    tf_free(which);
    tf_free(names);
    free_programs(ps, np);
    return st;
}

tf_cuda_status tf_cuda_cubins_get(const tf_cuda_libs *l, const char *arch, const tf_pkg *pkg, tf_cubins_mode mode, int threads,
                                  const tf_cuda_kernel *const *ks, int nk, tf_cuda_cubins *o, char *err, size_t n)
{
    memset(o, 0, sizeof *o);
    o->of = tf_malloc((size_t)(nk ? nk : 1) * sizeof *o->of);
    int *miss = tf_malloc((size_t)(nk ? nk : 1) * sizeof *miss), nmiss = 0;
    if (!o->of || !miss) {
        tf_free(miss);
        snprintf(err, n, "out of memory");
        return TF_CUDA_ERR_OOM;
    }
    char dir[4096] = "";
    if (!tf_cache_subdir("cuda", dir, sizeof dir)) dir[0] = 0;
    for (int i = 0; i < nk; i++) {
        int c = -1;
        if (mode == TF_CUBINS_STORED && pkg) c = package_find(pkg, arch, ks[i], o);
        if (c < 0 && mode == TF_CUBINS_STORED && dir[0]) c = cache_find(dir, l, arch, ks[i], o);
        if (c < 0) miss[nmiss++] = i;
        else if (o->c[c].from == TF_CUBIN_PACKAGE) o->packaged++;   /* the program's bytes, wherever the lookup went */
        else o->cached++;
        o->of[i] = c;
    }
    tf_cuda_status st = nmiss ? compile_missing(l, arch, dir, mode, threads, ks, miss, nmiss, o, err, n) : TF_CUDA_OK;
    tf_free(miss);
    /* only the programs that hold a kernel asked for (a file read and found not to is dropped), in the order first needed */
    int *to = st ? NULL : tf_malloc((size_t)(o->n ? o->n : 1) * sizeof *to), kept = 0;
    tf_cuda_cubin *nc = st ? NULL : tf_calloc((size_t)(o->n ? o->n : 1), sizeof *nc);
    if (!st && (!to || !nc)) {
        tf_free(to);
        tf_free(nc);
        snprintf(err, n, "out of memory");
        return TF_CUDA_ERR_OOM;
    }
    if (st) return st;
    for (int c = 0; c < o->n; c++) to[c] = -1;
    for (int i = 0; i < nk; i++) {
        int c = o->of[i];
        if (to[c] < 0) nc[to[c] = kept++] = o->c[c];
        o->of[i] = to[c];
    }
    for (int c = 0; c < o->n; c++)
        if (to[c] < 0) tf_free(o->c[c].bin), tf_free(o->c[c].kernels);
    tf_free(o->c);
    o->c = nc;
    o->n = kept;
    tf_free(to);
    return st;
}

void tf_cuda_cubins_free(tf_cuda_cubins *o)
{
    for (int c = 0; o->c && c < o->n; c++) {
        tf_free(o->c[c].bin);
        tf_free(o->c[c].kernels);
    }
    tf_free(o->c);
    tf_free(o->of);
    memset(o, 0, sizeof *o);
}

/* ---- loading ------------------------------------------------------------------ */

static tf_cuda_status load_module(tf_cuda_jit *j, const tf_cuda_libs *l, const tf_cuda_cubin *c, const char *arch, tf_cu_module *out,
                                  char *err, size_t n)
{
    char why[1024];
    if (tf_cuda_check(l, l->cu.ModuleLoadData(out, c->bin), "cuModuleLoadData", __FILE__, __LINE__, why, sizeof why)) {
        *out = NULL;
        snprintf(err, n, "loading the cubin of %s (kernels %s%s): %s (NVRTC %d.%d made it for %s; the driver is CUDA %d.%d, and needs "
                 "to be at least as new as NVRTC)", c->name, c->nkernels ? c->kernels[0] : "?", c->nkernels > 1 ? ", ..." : "", why,
                 l->nvrtc_major, l->nvrtc_minor, arch, l->driver_version / 1000, l->driver_version % 1000 / 10);
        return TF_CUDA_ERR_DRIVER;
    }
    j->modules[j->nmodules++] = *out;
    return TF_CUDA_OK;
}

static tf_cuda_status find_functions(tf_cuda_jit_fn *f, const tf_cuda_libs *l, const tf_cuda_kernel *k, char *err, size_t n)
{
    char why[1024];
    if (tf_cuda_check(l, l->cu.ModuleGetFunction(&f->function, f->module, k->name), "cuModuleGetFunction", __FILE__, __LINE__, why,
                      sizeof why)) {
        snprintf(err, n, "finding %s in its cubin: %s", k->name, why);
        return TF_CUDA_ERR_DRIVER;
    }
    if (k->name2[0] &&
        tf_cuda_check(l, l->cu.ModuleGetFunction(&f->function2, f->module, k->name2), "cuModuleGetFunction", __FILE__, __LINE__, why,
                      sizeof why)) {
        snprintf(err, n, "finding %s in its cubin: %s", k->name2, why);
        return TF_CUDA_ERR_DRIVER;
    }
    if (f->smem > STATIC_SMEM_LIMIT &&
        tf_cuda_check(l, l->cu.FuncSetAttribute(f->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)f->smem),
                      "cuFuncSetAttribute", __FILE__, __LINE__, why, sizeof why)) {
        snprintf(err, n, "kernel %s needs %u bytes of shared memory: %s", k->name, f->smem, why);
        return TF_CUDA_ERR_DRIVER;
    }
    if (f->function2 && f->smem2 > STATIC_SMEM_LIMIT &&
        tf_cuda_check(l, l->cu.FuncSetAttribute(f->function2, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)f->smem2),
                      "cuFuncSetAttribute", __FILE__, __LINE__, why, sizeof why)) {
        snprintf(err, n, "kernel %s needs %u bytes of shared memory: %s", k->name2, f->smem2, why);
        return TF_CUDA_ERR_DRIVER;
    }
    return TF_CUDA_OK;
}

/* The modules of cb's programs loaded; mod[c] each one's, NULL where the
 * driver refused a stored cubin (its kernels are compiled again) — a
 * refused cubin NVRTC just made is the error. */
static tf_cuda_status load_all(tf_cuda_jit *j, const tf_cuda_libs *l, const tf_cuda_cubins *cb, const char *arch, tf_cu_module *mod,
                               char *err, size_t n)
{
    for (int c = 0; c < cb->n; c++) {
        tf_cuda_status st = load_module(j, l, &cb->c[c], arch, &mod[c], err, n);
        if (st && cb->c[c].from == TF_CUBIN_COMPILED) return st;
    }
    return TF_CUDA_OK;
}

tf_cuda_status tf_cuda_jit_build(tf_cuda_jit *j, const tf_cuda_libs *l, const char *arch, const tf_pkg *pkg, tf_cuda_jit_job *jobs,
                                 int njobs, char *err, size_t n)
{
    memset(j, 0, sizeof *j);
    if (!njobs) return TF_CUDA_OK;
    const tf_cuda_kernel **us = tf_calloc((size_t)njobs, sizeof *us);
    j->fns = tf_calloc((size_t)njobs, sizeof *j->fns);
    int nus = 0;
    tf_cuda_status st = TF_CUDA_OK;
    if (!us || !j->fns) {
        snprintf(err, n, "out of memory");
        st = TF_CUDA_ERR_OOM;
    }
    /* one entry per distinct source: equal names are equal hashes; the text decides */
    for (int i = 0; !st && i < njobs; i++) {
        const tf_cuda_kernel *k = &jobs[i].kernel;
        int u = 0;
        while (u < nus && !(us[u]->hash == k->hash && strcmp(us[u]->src, k->src) == 0)) u++;
        jobs[i].fn = u;
        if (u == nus) us[nus++] = k;
    }
    tf_cuda_cubins cb = {0}, again = {0};
    tf_cu_module *mod = NULL, *mod2 = NULL;
    if (!st) st = tf_cuda_cubins_get(l, arch, pkg, TF_CUBINS_STORED, 0, us, nus, &cb, err, n);
    if (!st && (!(j->modules = tf_calloc((size_t)2 * (size_t)cb.n + 1, sizeof *j->modules)) || !(mod = tf_calloc((size_t)cb.n + 1, sizeof *mod)))) {
        snprintf(err, n, "out of memory");
        st = TF_CUDA_ERR_OOM;
    }
    if (!st) st = load_all(j, l, &cb, arch, mod, err, n);
    /* stored cubins the driver refused: their kernels compiled again, the cache's files replaced */
    const tf_cuda_kernel **redo = NULL;
    int *redo_of = NULL, nredo = 0;
    for (int u = 0; !st && u < nus; u++)
        if (!mod[cb.of[u]]) {
            if (!redo && (!(redo = tf_calloc((size_t)nus, sizeof *redo)) || !(redo_of = tf_calloc((size_t)nus, sizeof *redo_of)))) {
                snprintf(err, n, "out of memory");
                st = TF_CUDA_ERR_OOM;
                break;
            }
            redo_of[u] = nredo;
            redo[nredo++] = us[u];
        }
    if (!st && nredo) {
        st = tf_cuda_cubins_get(l, arch, NULL, TF_CUBINS_FRESH, 0, redo, nredo, &again, err, n);
        tf_cu_module *more = st ? NULL : tf_realloc(j->modules, (size_t)(j->nmodules + again.n + 1) * sizeof *more);
        if (!st && !more) {
            snprintf(err, n, "out of memory");
            st = TF_CUDA_ERR_OOM;
        }
        if (more) j->modules = more;
        if (!st && !(mod2 = tf_calloc((size_t)again.n + 1, sizeof *mod2))) {
            snprintf(err, n, "out of memory");
            st = TF_CUDA_ERR_OOM;
        }
        if (!st) st = load_all(j, l, &again, arch, mod2, err, n);
    }
    for (int u = 0; !st && u < nus; u++) {
        tf_cuda_jit_fn *f = &j->fns[u];
        const tf_cuda_kernel *k = us[u];
        bool redone = !mod[cb.of[u]];
        tf_cubin_from from = redone ? TF_CUBIN_COMPILED : cb.c[cb.of[u]].from;
        snprintf(f->name, sizeof f->name, "%s", k->name);
        f->module = redone ? mod2[again.of[redo_of[u]]] : mod[cb.of[u]];
        f->grid = k->grid < 1 ? 1 : k->grid > MAX_GRID ? MAX_GRID : k->grid;
        f->block = k->block;
        f->smem = k->smem;
        f->align = k->align;
        f->rng = k->rng;
        f->scratch = k->scratch;
        f->grid2 = k->grid2 < 1 ? 1 : k->grid2 > MAX_GRID ? MAX_GRID : k->grid2;
        f->block2 = k->block2;
        f->smem2 = k->smem2;
        j->nfns = u + 1;
        st = find_functions(f, l, k, err, n);
        j->compiled += !st && from == TF_CUBIN_COMPILED;
        j->cached += !st && from == TF_CUBIN_CACHED;
        j->packaged += !st && from == TF_CUBIN_PACKAGE;
    }
    tf_free(redo);
    tf_free(redo_of);
    tf_free(mod);
    tf_free(mod2);
    tf_cuda_cubins_free(&cb);
    tf_cuda_cubins_free(&again);
    tf_free(us);
    if (st) tf_cuda_jit_free(j, l);
    return st;
}

void tf_cuda_jit_free(tf_cuda_jit *j, const tf_cuda_libs *l)
{
    for (int i = 0; j->modules && i < j->nmodules; i++)
        if (j->modules[i]) l->cu.ModuleUnload(j->modules[i]);
    tf_free(j->modules);
    tf_free(j->fns);
    j->modules = NULL;
    j->nmodules = 0;
    j->fns = NULL;
    j->nfns = 0;
}
