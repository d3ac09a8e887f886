/* test_cuda_programs.c — several kernels to an NVRTC program, and the cubin
 * cache of programs and per-kernel links (runtime/cuda/jit.c, cuda_jit.h).
 *
 * Seven small kernels (each defines a helper of the same name, two include
 * cuda_fp16.h, one has a second entry point) through tf_cuda_cubins_get,
 * with $TFUSE_CACHE_DIR in a fresh directory:
 *   - cold: every kernel compiled, in as many programs as compiling threads
 *     (two here, whatever the machine), each an ELF cubin that defines its kernels' entry
 *     points; one .cubin file per program and one .kernel link per kernel;
 *   - again: every kernel from the cache, the same programs, the same bytes;
 *     a subset of the kernels: from the cache, through their links;
 *   - a program file with a flipped byte, or cut short: its kernels are
 *     compiled again (the others still come from the cache) and the file
 *     replaced; a link that points at a program without the kernel is a
 *     miss; links lost while the program file stays: found by the
 *     program's own key, and the links written again;
 *   - TF_CUBINS_FRESH compiles everything; a kernel that does not compile
 *     fails the call with NVRTC's words naming that kernel, not the program;
 *   - a package's sections (cuda/ARCH/PROGRAM.cubin and the cuda/ARCH/kernels
 *     index) are taken before the cache; an architecture the package lacks
 *     is not.
 * NVRTC missing is a failure, unless TFUSE_NO_NVRTC=1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_file.h"
#include "check.h"
#include "cuda.h"
#include "cuda_jit.h"
#include "cuda_libs.h"

enum { NK = 7, THREADS = 2 };   /* two compiling threads, whatever the machine: programs of several kernels */
static tf_cuda_kernel g_ks[NK + 1];   /* the last: one that does not compile */
static const tf_cuda_kernel *g_p[NK + 1];
static char g_dir[4096];

static void make_kernel(tf_cuda_kernel *k, int i, const char *body, bool half, bool second)
{
    char src[2048];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "tf_%016llx", 0x1000ull + (unsigned long long)i);
    int n = snprintf(src, sizeof src,
                     "// test kernel %d\n%s"
                     "__device__ __forceinline__ float tf_twice(float x) { return x * %d.0f; }\n"
                     "extern \"C\" __global__ void __launch_bounds__(128) %s(float *__restrict__ b0)\n{\n    %s\n}\n",
                     i, half ? "#include <cuda_fp16.h>\n" : "", i + 2, k->name, body);
    if (second)
        snprintf(src + n, sizeof src - (size_t)n,
                 "extern \"C\" __global__ void __launch_bounds__(128) %s_b(float *__restrict__ b0) { b0[threadIdx.x] = 0.0f; }\n", k->name);
    if (second) snprintf(k->name2, sizeof k->name2, "%.19s_b", k->name);
    k->src = strdup(src);
    k->hash = tf_fnv1a(TF_FNV_BASIS, k->src, strlen(k->src));
    k->grid = 1, k->block = 128;
}

static bool defines(const tf_cuda_cubin *c, const char *name)
{
    const unsigned char *p = c->bin;
    size_t n = strlen(name) + 1;   /* with its NUL: the symbol, not a prefix of another */
    if (c->size < 64 || memcmp(p, "\177ELF", 4) != 0) return false;
    for (size_t i = 0; i + n <= c->size; i++)
        if (memcmp(p + i, name, n) == 0) return true;
    return false;
}

static bool holds_kernel(const tf_cuda_cubin *c, const char *name)
{
    for (int q = 0; q < c->nkernels; q++)
        if (!strcmp(c->kernels[q], name)) return true;
    return false;
}

static int count_files(const char *suffix)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "ls %s/cuda | grep -c '%s$'", g_dir, suffix);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f && fscanf(f, "%d", &n) != 1) n = -1;
    if (f) pclose(f);
    return n;
}

/* The cache file of program `name` ("tfp_<key>"). */
static void program_file(const char *name, char *out, size_t n) { snprintf(out, n, "%s/cuda/%s.cubin", g_dir, name + 4); }

static bool same_cubins(const tf_cuda_cubins *a, const tf_cuda_cubins *b)
{
    if (a->n != b->n) return false;
    for (int c = 0; c < a->n; c++)
        if (strcmp(a->c[c].name, b->c[c].name) || a->c[c].size != b->c[c].size || memcmp(a->c[c].bin, b->c[c].bin, a->c[c].size))
            return false;
    for (int i = 0; i < NK; i++)
        if (strcmp(a->c[a->of[i]].name, b->c[b->of[i]].name)) return false;
    return true;
}

static tf_cuda_status get(const tf_cuda_libs *l, const char *arch, const tf_pkg *pkg, tf_cubins_mode mode, const tf_cuda_kernel *const *ks,
                          int n, tf_cuda_cubins *out, char *err, size_t en)
{
    tf_cuda_status st = tf_cuda_cubins_get(l, arch, pkg, mode, THREADS, ks, n, out, err, en);
    if (st) fprintf(stderr, "tf_cuda_cubins_get: %s\n", err);
    return st;
}

int main(void)
{
    char tmpl[] = "/tmp/tfuse-programs-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    snprintf(g_dir, sizeof g_dir, "%s", tmpl);
    setenv("TFUSE_CACHE_DIR", g_dir, 1);

    tf_cuda_libs libs;
    char err[4096];
    if (tf_cuda_libs_load(&libs, TF_CUDA_LIB_NVRTC, NULL, err, sizeof err)) {
        const char *skip = getenv("TFUSE_NO_NVRTC");
        if (skip && !strcmp(skip, "1")) printf("SKIPPED: no NVRTC (TFUSE_NO_NVRTC=1): %s\n", err);
        else CHECK(0, "NVRTC is needed (set TFUSE_NO_NVRTC=1 to skip): %s", err);
        return check_report();
    }
    make_kernel(&g_ks[0], 0, "b0[threadIdx.x] = tf_twice(b0[threadIdx.x]);", false, false);
    make_kernel(&g_ks[1], 1, "b0[threadIdx.x] = tf_twice(b0[threadIdx.x]) + 1.0f;", false, true);
    make_kernel(&g_ks[2], 2, "b0[threadIdx.x] = __half2float(__float2half_rn(tf_twice(b0[threadIdx.x])));", true, false);
    make_kernel(&g_ks[3], 3, "b0[threadIdx.x] = __half2float(__float2half_rn(b0[threadIdx.x])) - tf_twice(1.0f);", true, false);
    make_kernel(&g_ks[4], 4, "for (int i = 0; i < 4; i++) b0[threadIdx.x + 128 * i] = tf_twice((float)i);", false, false);
    make_kernel(&g_ks[5], 5, "b0[blockIdx.x] = tf_twice(b0[blockIdx.x]) * b0[threadIdx.x];", false, false);
    make_kernel(&g_ks[6], 6, "if (threadIdx.x == 0) b0[0] = tf_twice(3.0f);", false, false);
    make_kernel(&g_ks[NK], NK, "b0[threadIdx.x] = tf_undeclared_thing(b0[threadIdx.x]);", false, false);
    for (int i = 0; i <= NK; i++) g_p[i] = &g_ks[i];

    /* cold */
    tf_cuda_cubins a = {0}, b = {0}, c = {0};
    CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &a, err, sizeof err), "cold: compiled");
    CHECK(a.compiled == NK && a.cached == 0 && a.packaged == 0, "cold: every kernel compiled (%d, %d cached)", a.compiled, a.cached);
    CHECK(a.n == THREADS, "%d programs for %d small kernels on %d threads", a.n, NK, THREADS);
    int most = 0;
    for (int q = 0; q < a.n; q++) most = a.c[q].nkernels > most ? a.c[q].nkernels : most;
    CHECK(most >= (NK + THREADS - 1) / THREADS, "programs of several kernels (the largest holds %d)", most);
    int held = 0;
    for (int i = 0; i < NK; i++) {
        const tf_cuda_cubin *cb = &a.c[a.of[i]];
        bool listed = false;
        for (int q = 0; q < cb->nkernels; q++) listed |= !strcmp(cb->kernels[q], g_ks[i].name);
        CHECK(listed && defines(cb, g_ks[i].name) && (!g_ks[i].name2[0] || defines(cb, g_ks[i].name2)),
              "%s: its program %s lists it and its ELF cubin defines it", g_ks[i].name, cb->name);
    }
    for (int q = 0; q < a.n; q++) held += a.c[q].nkernels;
    CHECK(held == NK, "each kernel in one program (%d in all)", held);
    CHECK(count_files(".cubin") == a.n && count_files(".kernel") == NK, "cached: %d program files, %d kernel links", count_files(".cubin"),
          count_files(".kernel"));

    /* again, and a subset */
    CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &b, err, sizeof err), "again");
    CHECK(b.compiled == 0 && b.cached == NK, "again: every kernel from the cache (%d compiled, %d cached)", b.compiled, b.cached);
    CHECK(same_cubins(&a, &b), "again: the same programs, byte for byte");
    tf_cuda_cubins_free(&b);
    const tf_cuda_kernel *sub[2] = {g_p[4], g_p[1]};
    CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, sub, 2, &b, err, sizeof err), "subset");
    CHECK(b.cached == 2 && b.compiled == 0 && b.n >= 1 && b.n <= 2 && !strcmp(b.c[b.of[0]].name, a.c[a.of[4]].name) &&
              !strcmp(b.c[b.of[1]].name, a.c[a.of[1]].name),
          "a subset: from the programs that hold them (%d cubins, %d cached)", b.n, b.cached);
    tf_cuda_cubins_free(&b);

    /* links lost, program files kept: found by the programs' own keys */
    char path[4400], cmd[20000];
    snprintf(cmd, sizeof cmd, "rm -f %s/cuda/*.kernel", g_dir);
    CHECK(system(cmd) == 0 && count_files(".kernel") == 0, "removing the links");
    CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &b, err, sizeof err), "no links");
    CHECK(b.compiled == 0 && b.cached == NK && same_cubins(&a, &b), "links lost: each program found by its key (%d compiled, %d cached)",
          b.compiled, b.cached);
    CHECK(count_files(".kernel") == NK, "and the links written again (%d)", count_files(".kernel"));
    tf_cuda_cubins_free(&b);

    /* a flipped byte, then a file cut short: that program's kernels compiled again, the bad file gone */
    for (int round = 0; round < 2; round++) {
        const char *what = round ? "a file cut short" : "a flipped byte";
        tf_cuda_cubins cur = {0};
        CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &cur, err, sizeof err) && cur.cached == NK, "%s: before", what);
        program_file(cur.c[cur.of[0]].name, path, sizeof path);
        int in0 = cur.c[cur.of[0]].nkernels;
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && sb.st_size > 200, "the program file of kernel 0: %s", path);
        if (round == 0) {
            FILE *f = fopen(path, "r+b");
            if (f) {
                fseek(f, sb.st_size / 2, SEEK_SET);
                int ch = fgetc(f);
                fseek(f, sb.st_size / 2, SEEK_SET);
                fputc(ch ^ 0x40, f);
                fclose(f);
            }
        } else {
            snprintf(cmd, sizeof cmd, "head -c 100 '%s' > '%s.x' && mv '%s.x' '%s'", path, path, path, path);
            CHECK(system(cmd) == 0, "cutting %s short", path);
        }
        CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &b, err, sizeof err), "%s", what);
        CHECK(b.compiled == in0 && b.cached == NK - in0, "%s: its %d kernels compiled again, the rest cached (%d compiled, %d cached)", what,
              in0, b.compiled, b.cached);
        bool ok = true;
        for (int i = 0; i < NK; i++) ok &= defines(&b.c[b.of[i]], g_ks[i].name);
        CHECK(ok && stat(path, &sb) != 0, "%s: every kernel in its cubin, the bad file removed", what);
        tf_cuda_cubins_free(&b);
        CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &b, err, sizeof err) && b.cached == NK,
              "%s: then all from the cache (%d cached)", what, b.cached);
        tf_cuda_cubins_free(&b);
        tf_cuda_cubins_free(&cur);
    }

    /* a link to a program without the kernel: a miss */
    tf_cuda_cubins cur = {0};
    CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &cur, err, sizeof err), "before relinking");
    char link[4700], other[64];
    snprintf(cmd, sizeof cmd, "cd %s/cuda && for l in *.kernel; do [ \"$(readlink $l)\" = %s.cubin ] && echo $l && break; done", g_dir,
             cur.c[cur.of[0]].name + 4);
    FILE *f = popen(cmd, "r");
    char lname[256] = "";
    if (f && !fgets(lname, sizeof lname, f)) lname[0] = 0;
    if (f) pclose(f);
    lname[strcspn(lname, "\n")] = 0;
    CHECK(lname[0], "a link to kernel 0's program");
    /* a program that does not hold kernel 0 (another one, when there is one), else one that does not exist */
    int oc = -1;
    for (int q = 0; q < cur.n && oc < 0; q++)
        if (q != cur.of[0]) oc = q;
    snprintf(other, sizeof other, "%s.cubin", oc >= 0 ? cur.c[oc].name + 4 : "0123456789abcdef");
    snprintf(link, sizeof link, "%s/cuda/%s", g_dir, lname);
    CHECK(remove(link) == 0 && symlink(other, link) == 0, "relinking %s to %s", lname, other);
    tf_cuda_cubins_free(&cur);
    CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_STORED, g_p, NK, &b, err, sizeof err), "a wrong link");
    char target[64] = "";
    ssize_t tl = readlink(link, target, sizeof target - 1);
    if (tl > 0) target[tl] = 0;
    CHECK(b.compiled + b.cached == NK && holds_kernel(&b.c[b.of[0]], g_ks[0].name) && strcmp(target, other) != 0 &&
              !strncmp(target, b.c[b.of[0]].name + 4, 16),
          "a link to a program without the kernel is a miss: kernel 0 compiled or found by its program's key, and linked to it "
          "(%d compiled, %d cached, now -> %s)", b.compiled, b.cached, target);
    tf_cuda_cubins_free(&b);

    /* fresh: compiled whatever the cache holds */
    CHECK(!get(&libs, "sm_90", NULL, TF_CUBINS_FRESH, g_p, NK, &b, err, sizeof err), "fresh");
    CHECK(b.compiled == NK && b.cached == 0 && same_cubins(&a, &b), "TF_CUBINS_FRESH compiles every kernel (%d)", b.compiled);
    tf_cuda_cubins_free(&b);

    /* a kernel that does not compile: the error names it */
    tf_cuda_status st = tf_cuda_cubins_get(&libs, "sm_90", NULL, TF_CUBINS_FRESH, THREADS, g_p, NK + 1, &b, err, sizeof err);
    CHECK(st == TF_CUDA_ERR_COMPILE && strstr(err, g_ks[NK].name) && strstr(err, "tf_undeclared_thing"),
          "a broken kernel among good ones: the error names it: %s", err);
    tf_cuda_cubins_free(&b);

    /* a package's programs first; another architecture's are not taken */
    tf_pkg pkg;
    memset(&pkg, 0, sizeof pkg);
    char sec[160], why[256], index[2048] = "";
    size_t at = 0;
    for (int q = 0; q < a.n; q++) {
        snprintf(sec, sizeof sec, "cuda/sm_90/%s.cubin", a.c[q].name);
        CHECK(tf_pkg_add(&pkg, sec, a.c[q].bin, a.c[q].size, why, sizeof why), "package: %s", why);
    }
    for (int i = 0; i < NK - 1; i++)   /* the last kernel is not in the package */
        at += (size_t)snprintf(index + at, sizeof index - at, "%s %s\n", g_ks[i].name, a.c[a.of[i]].name);
    CHECK(tf_pkg_add(&pkg, "cuda/sm_90/kernels", index, strlen(index), why, sizeof why), "package index: %s", why);
    CHECK(!get(&libs, "sm_90", &pkg, TF_CUBINS_STORED, g_p, NK, &c, err, sizeof err), "from a package");
    /* the kernel the index leaves out is found through its cache link, in a program the package holds too: its bytes are the package's */
    CHECK(c.packaged >= NK - 1 && c.packaged + c.cached == NK && c.compiled == 0,
          "the package's kernels from it, the other through the cache (%d packaged, %d cached, %d compiled)", c.packaged, c.cached,
          c.compiled);
    bool same = true;
    for (int i = 0; i < NK; i++) {
        const tf_cuda_cubin *x = &c.c[c.of[i]], *y = &a.c[a.of[i]];
        same &= x->size == y->size && !memcmp(x->bin, y->bin, x->size) && !strcmp(x->name, y->name);
    }
    CHECK(same, "the package's cubins are the programs' bytes");
    tf_cuda_cubins_free(&c);
    CHECK(!get(&libs, "sm_80", &pkg, TF_CUBINS_STORED, g_p, 2, &c, err, sizeof err), "sm_80 with an sm_90 package");
    CHECK(c.packaged == 0 && c.compiled == 2, "an architecture the package lacks is compiled (%d packaged, %d compiled)", c.packaged,
          c.compiled);
    tf_cuda_cubins_free(&c);
    tf_pkg_free(&pkg);

    tf_cuda_cubins_free(&a);
    for (int i = 0; i <= NK; i++) free(g_ks[i].src);
    tf_cuda_libs_free(&libs);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return check_report();
}
