/* test_package.c — compiled packages (tf_program_save / tf_program_load,
 * runtime/package.c):
 *
 *   - a package round-trips: the program loads without running a pass (its
 *     final IR read back with the memory plan); a session of it, in a fresh
 *     context (its own JIT, an empty disk cache), runs three steps that are
 *     bit-identical (outputs, params and buffers) to a session of the program
 *     compiled from source with the same seed; it compiles no kernel (every
 *     one comes from the package: tf_session_info.jit_package); with
 *     --no-params the sessions run the initializers with their own seed;
 *     with params the loaded session's initializers draw nothing (the
 *     package's state is copied once, from the package's bytes, into the
 *     session); the objects compiled on 1 thread and on 3 make the same
 *     package, byte for byte;
 *     the package's state leaves out what a zeros() initializer makes (a
 *     bias, the optimizer's moments), and the session still starts them at
 *     zero (the bit-for-bit check of the initial state);
 *     an interp-target package round-trips too; settings in the loading
 *     process's environment (TFUSE_LLVM_PIPELINE) do not change it;
 *   - a package is refused, with a message and no crash, when: any byte is
 *     flipped, it is truncated at any of a set of lengths, its code is for
 *     another CPU (the message names both), it was made by another tfuse
 *     version, or its model no longer compiles to the final IR it records;
 *   - the container itself: sections round-trip, repeated and bad names are
 *     refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "check.h"
#include "package.h"
#include "runtime.h"
#include "target_cases.h"
#include "tensorio.h"
#include "testutil.h"
#include "tfuse.h"

static uint64_t g_seed;
static char g_dir[256];

static const char *MLP =
    "module pkgmlp\ndim B = 6\ninput x : f32[B, 5]\ninput y : i64[B]\nparam w1 : f32[5, 7] = kaiming_uniform()\n"
    "param b1 : f32[7] = zeros()\nparam w2 : f32[7, 3] = normal(std=0.1)\nh = linear(x, w1, b1)\na = gelu(h)\n"
    "lg = linear(a, w2)\nloss = cross_entropy(lg, y)\noutput loss\noutput logits = lg\n"
    "train {\n  optimizer = adamw(lr=0.01, weight_decay=0.01)\n  clip_grad_norm = 1.0\n}\n";

static tf_program_t *compile_text(tf_context_t *ctx, const char *text, tf_mode mode, tf_target target)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode, o.target = target;
    if (tf_model_parse_string(ctx, "pkg.ir", text, strlen(text), NULL, 0, &m) || tf_program_compile(ctx, m, &o, &p))
        CHECK(0, "compile: %s", tf_context_last_error(ctx));
    tf_model_free(m);
    return p;
}

/* Bind the same seeded inputs (labels in [0, 3)) and run. */
static bool step(tf_session_t *s, const tf_program_t *p, uint64_t round)
{
    static float x[6 * 5];
    static int64_t y[6];
    uint64_t r = g_seed ^ (round * 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < 30; i++) x[i] = (float)(4 * test_rnd(&r) - 2);
    for (int i = 0; i < 6; i++) y[i] = (int64_t)(3 * test_rnd(&r)) % 3;
    int64_t xs[2] = {6, 5}, ys[1] = {6};
    bool ok = true;
    for (size_t i = 0; i < tf_program_io_count(p, TF_IO_INPUT); i++) {
        const char *name;
        tf_program_io(p, TF_IO_INPUT, i, &name, NULL, NULL, NULL);
        if (!strcmp(name, "x")) ok = ok && !tf_session_bind(s, "x", TF_DTYPE_F32, xs, 2, x);
        if (!strcmp(name, "y")) ok = ok && !tf_session_bind(s, "y", TF_DTYPE_I64, ys, 1, y);
    }
    return ok && !tf_session_run(s);
}

/* Every param and buffer, and the outputs once a step ran, bit for bit. */
static void same_bits(const char *label, tf_session_t *a, tf_session_t *b, const tf_program_t *p, bool outputs)
{
    for (size_t i = 0; outputs && i < tf_program_io_count(p, TF_IO_OUTPUT); i++) {
        const char *name;
        tf_tensor_view x, y;
        tf_program_io(p, TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
        if (tf_session_output(a, name, &x) || tf_session_output(b, name, &y)) {
            CHECK(0, "%s: output %s", label, name);
            continue;
        }
        size_t n = (size_t)tc_numel(&x) * (size_t)tf_dtype_size(x.dtype);
        CHECK(tc_numel(&x) == tc_numel(&y) && !memcmp(x.data, y.data, n), "%s: output %s differs (seed %llu)", label, name,
              (unsigned long long)g_seed);
    }
    tf_io_kind kinds[2] = {TF_IO_PARAM, TF_IO_BUFFER};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < tf_program_io_count(p, kinds[k]); i++) {
            const char *name;
            static unsigned char ba[1 << 16], bb[1 << 16];
            tf_tensor_view x = {.data = ba}, y = {.data = bb};
            tf_program_io(p, kinds[k], i, &name, NULL, NULL, NULL);
            if (tf_session_get_state(a, name, &x, sizeof ba) || tf_session_get_state(b, name, &y, sizeof bb)) {
                CHECK(0, "%s: state %s", label, name);
                continue;
            }
            size_t n = (size_t)tc_numel(&x) * (size_t)tf_dtype_size(x.dtype);
            CHECK(!memcmp(ba, bb, n), "%s: state %s differs (seed %llu)", label, name, (unsigned long long)g_seed);
        }
}

static void round_trip(tf_target target, bool params)
{
    char label[128], path[400];
    snprintf(label, sizeof label, "round trip [%s%s]", target == TF_TARGET_CPU ? "cpu" : "interp", params ? "" : ", --no-params");
    snprintf(path, sizeof path, "%s/rt.tfp", g_dir);
    tf_context_t *ca = NULL, *cb = NULL;
    tf_context_create(&ca);
    tf_context_create(&cb);   /* its own JIT: nothing compiled by the first is there */
    tf_program_t *pa = compile_text(ca, MLP, TF_MODE_TRAIN, target), *pb = NULL;
    tf_package_info info;
    uint64_t seed = g_seed % 1000 + 1;
    if (pa && tf_program_save(ca, pa, path, params, seed, NULL, &info)) CHECK(0, "%s: save: %s", label, tf_context_last_error(ca));
    else if (pa) {
        CHECK(info.has_params == params && info.bytes > 0, "%s: info has_params %d bytes %lld", label, info.has_params,
              (long long)info.bytes);
        if (target == TF_TARGET_CPU) CHECK(info.objects > 0, "%s: no compiled kernels in the package", label);
        if (params) {   /* the state section: w1 and w2, not b1 (zeros()) nor AdamW's moments */
            tf_pkg pk = {0};
            bool oom = false;
            char why[256];
            const tf_pkg_section *sec = tf_pkg_read(&pk, path, &oom, why, sizeof why) ? tf_pkg_find(&pk, "state.safetensors") : NULL;
            tio_tensor *ts = NULL;
            size_t nts = 0;
            char err[512];
            if (sec && !tio_safetensors_view_mem("state", sec->data, sec->len, &ts, &nts, err, sizeof err)) {
                bool w1 = false, w2 = false, zero = false;
                for (size_t i = 0; i < nts; i++) {
                    w1 |= !strcmp(ts[i].name, "w1"), w2 |= !strcmp(ts[i].name, "w2");
                    zero |= !strcmp(ts[i].name, "b1") || !strncmp(ts[i].name, "opt.", 4);
                }
                CHECK(w1 && w2 && !zero && nts == 2, "%s: the package's state holds %zu tensors: w1 %d, w2 %d, a zeros() one %d", label,
                      nts, w1, w2, zero);
                tio_views_free(ts, nts);
            } else {
                CHECK(0, "%s: no readable state section in the package", label);
            }
            tf_pkg_free(&pk);
        }
        /* the loading process's environment does not change what the package holds */
        setenv("TFUSE_LLVM_PIPELINE", "default<O1>", 1);
        if (tf_program_load(cb, path, &pb)) CHECK(0, "%s: load: %s", label, tf_context_last_error(cb));
        unsetenv("TFUSE_LLVM_PIPELINE");
        /* no pass ran: the program is the package's final IR read back, with its memory plan */
        if (pb) CHECK(pb->from_final, "%s: the loaded program was compiled again from the model, not read back", label);
    }
    tf_session_t *sa = NULL, *sb = NULL;
    /* with params the package's state wins over the session's seed; without, the seed draws them */
    if (pb && (tf_session_create(ca, pa, target, seed, &sa) || tf_session_create(cb, pb, target, params ? seed + 17 : seed, &sb)))
        CHECK(0, "%s: sessions: %s / %s", label, tf_context_last_error(ca), tf_context_last_error(cb));
    if (sa && sb) {
        tf_session_info ib;
        tf_session_get_info(sb, &ib);
        if (target == TF_TARGET_CPU)
            CHECK(ib.jit_package == info.objects && ib.jit_compiled == 0 && ib.jit_disk == 0,
                  "%s: the loaded session compiled %d, took %d from disk and %d of %d from the package", label, ib.jit_compiled,
                  ib.jit_disk, ib.jit_package, info.objects);
        /* the package's session takes its state from the package and draws nothing; a session of source draws */
        if (target == TF_TARGET_CPU)
            CHECK(params ? sb->init_elements == 0 && sa->init_elements > 0 : sb->init_elements == sa->init_elements,
                  "%s: the initializers drew %lld elements in the package's session, %lld in the source's", label,
                  (long long)sb->init_elements, (long long)sa->init_elements);
        same_bits(label, sa, sb, pa, false);   /* the initial state */
        for (uint64_t r = 0; r < 3; r++) {
            if (!step(sa, pa, r) || !step(sb, pb, r)) {
                CHECK(0, "%s: step %llu: %s / %s", label, (unsigned long long)r, tf_context_last_error(ca), tf_context_last_error(cb));
                break;
            }
            same_bits(label, sa, sb, pa, true);
        }
    }
    tf_session_free(sa);
    tf_session_free(sb);
    tf_program_free(pa);
    tf_program_free(pb);
    tf_context_free(ca);
    tf_context_free(cb);
}

static unsigned char *slurp(const char *path, size_t *n);

/* The package's objects are compiled on the program's threads: on 1 and on
 * 3, each from an empty disk cache, the package is the same file, byte
 * for byte (objects, their order, everything). */
static void parallel_build(void)
{
    static const char *label = "package built on 1 and 3 threads";
    char path[2][400], cache[2][400];
    unsigned char *b[2] = {0};
    size_t n[2] = {0};
    const char *old = getenv("TFUSE_CACHE_DIR");
    char keep[400];
    snprintf(keep, sizeof keep, "%s", old ? old : "");
    for (int t = 0; t < 2; t++) {
        snprintf(path[t], sizeof path[t], "%s/par%d.tfp", g_dir, t);
        snprintf(cache[t], sizeof cache[t], "%s/cache-par%d", g_dir, t);
        setenv("TFUSE_CACHE_DIR", cache[t], 1);   /* empty: every object compiled now */
        tf_context_t *ctx = NULL;
        tf_context_create(&ctx);
        tf_program_t *p = compile_text(ctx, MLP, TF_MODE_TRAIN, TF_TARGET_CPU);
        tf_package_info info = {0};
        if (p && (tf_program_set_threads(p, t ? 3 : 1) || tf_program_save(ctx, p, path[t], 1, 5, NULL, &info)))
            CHECK(0, "%s: save: %s", label, tf_context_last_error(ctx));
        CHECK(info.objects > 2 && info.objects_cached == 0, "%s: %d objects, %d from the cache", label, info.objects,
              info.objects_cached);
        b[t] = slurp(path[t], &n[t]);
        tf_program_free(p);
        tf_context_free(ctx);
    }
    if (old) setenv("TFUSE_CACHE_DIR", keep, 1);
    else unsetenv("TFUSE_CACHE_DIR");
    CHECK(b[0] && b[1] && n[0] > 0 && n[0] == n[1] && !memcmp(b[0], b[1], n[0]), "%s: the files differ (%zu and %zu bytes)", label,
          n[0], n[1]);
    free(b[0]);
    free(b[1]);
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = b && fread(b, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) fwrite(b, 1, n, f), fclose(f);
}

/* Loading path must fail with status want and a message containing each of
 * the NULL-terminated strings. */
static void refused(const char *label, const char *path, tf_status want, const char *const *says)
{
    tf_context_t *ctx = NULL;
    tf_context_create(&ctx);
    tf_program_t *p = NULL;
    tf_status st = tf_program_load(ctx, path, &p);
    const char *msg = tf_context_last_error(ctx);
    CHECK(st == want && !p, "%s: load gave status %d (want %d): %s", label, (int)st, (int)want, msg);
    for (int i = 0; says && says[i]; i++) CHECK(strstr(msg, says[i]) != NULL, "%s: the message lacks '%s': %s", label, says[i], msg);
    tf_program_free(p);
    tf_context_free(ctx);
}

/* Loading path succeeds, the program read back from its final IR or not. */
static void loads(const char *label, const char *path, bool from_final)
{
    tf_context_t *ctx = NULL;
    tf_context_create(&ctx);
    tf_program_t *p = NULL;
    tf_status st = tf_program_load(ctx, path, &p);
    CHECK(!st && p && p->from_final == from_final, "%s: load gave status %d, %s: %s", label, (int)st,
          p && p->from_final ? "read back" : "compiled", tf_context_last_error(ctx));
    tf_program_free(p);
    tf_context_free(ctx);
}

/* The package at src with section `name`'s text edited (from -> to), its
 * checksums made right again, written to dst. */
static bool edit_section(const char *src, const char *dst, const char *name, const char *from, const char *to)
{
    tf_pkg in = {0}, out = {0};
    bool oom;
    char why[256];
    if (!tf_pkg_read(&in, src, &oom, why, sizeof why)) return false;
    bool ok = true, found = false;
    for (int i = 0; ok && i < in.n; i++) {
        const tf_pkg_section *s = &in.s[i];
        if (strcmp(s->name, name)) {
            ok = tf_pkg_add(&out, s->name, s->data, s->len, why, sizeof why);
            continue;
        }
        const char *at = from ? strstr((const char *)s->data, from) : NULL;
        if (from && !at) ok = false;
        size_t pre = at ? (size_t)(at - (const char *)s->data) : 0, fl = from ? strlen(from) : s->len;
        size_t n = pre + strlen(to) + (s->len - pre - fl);
        char *t = malloc(n + 1);
        if (!t) ok = false;
        if (ok) {
            memcpy(t, s->data, pre);
            memcpy(t + pre, to, strlen(to));
            memcpy(t + pre + strlen(to), s->data + pre + fl, s->len - pre - fl);
            ok = tf_pkg_add(&out, s->name, t, n, why, sizeof why);
            found = true;
        }
        free(t);
    }
    ok = ok && found && tf_pkg_write(&out, dst, NULL, why, sizeof why);
    tf_pkg_free(&in);
    tf_pkg_free(&out);
    return ok;
}

static void refusals(void)
{
    char good[400], bad[400];
    snprintf(good, sizeof good, "%s/good.tfp", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.tfp", g_dir);
    tf_context_t *ctx = NULL;
    tf_context_create(&ctx);
    tf_program_t *p = compile_text(ctx, MLP, TF_MODE_INFER, TF_TARGET_CPU);
    if (!p || tf_program_save(ctx, p, good, 1, 1, NULL, NULL)) {
        CHECK(0, "save: %s", tf_context_last_error(ctx));
        tf_program_free(p);
        tf_context_free(ctx);
        return;
    }
    tf_program_free(p);
    tf_context_free(ctx);
    size_t n = 0;
    unsigned char *b = slurp(good, &n);
    CHECK(b && n > 64, "read back %zu bytes", n);
    if (!b) return;
    /* a byte flipped anywhere */
    uint64_t r = g_seed;
    for (int t = 0; t < 12; t++) {
        size_t at = t == 0 ? 0 : t == 1 ? n - 1 : (size_t)(test_rnd(&r) * (double)n) % n;
        b[at] ^= 0x20;
        spit(bad, b, n);
        b[at] ^= 0x20;
        char label[64];
        snprintf(label, sizeof label, "byte %zu of %zu flipped", at, n);
        static const char *const says[] = {"error", NULL};
        refused(label, bad, TF_ERR_FORMAT, says);
    }
    /* truncated */
    size_t cuts[] = {0, 1, 15, 16, 24, 31, 32, 100, n / 2, n - 9, n - 8, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        spit(bad, b, cuts[i]);
        char label[64];
        snprintf(label, sizeof label, "truncated to %zu of %zu bytes", cuts[i], n);
        refused(label, bad, TF_ERR_FORMAT, NULL);
    }
    /* appended junk */
    unsigned char *longer = malloc(n + 5);
    memcpy(longer, b, n);
    memcpy(longer + n, "junk", 5);
    spit(bad, longer, n + 5);
    refused("5 bytes appended", bad, TF_ERR_FORMAT, NULL);
    free(longer);
    free(b);
    /* foreign CPU: the code's target edited, the checksums made right */
    CHECK(edit_section(good, bad, "cpu/target", NULL, "llvm 14\nriscv64-unknown-linux-gnu\nsifive-u74\n+m,+a"), "edit cpu/target");
    static const char *const foreign[] = {"built for", "riscv64", "this machine is", NULL};
    refused("foreign CPU", bad, TF_ERR_UNAVAILABLE, foreign);
    /* another tfuse */
    CHECK(edit_section(good, bad, "manifest", "tfuse: " TFUSE_VERSION, "tfuse: 0.0.9"), "edit the version");
    static const char *const version[] = {"tfuse 0.0.9", "this is tfuse " TFUSE_VERSION, NULL};
    refused("another version", bad, TF_ERR_UNAVAILABLE, version);
    /* the final IR edited: it no longer hashes to the manifest's, so the program is compiled from the packaged
     * model instead, which gives the package's program again: it loads, through the passes */
    CHECK(edit_section(good, bad, "final.ir", "erf(", "tanh("), "edit the final IR");
    loads("edited final IR", bad, false);
    /* the model edited too: it compiles to another program than the one the manifest records */
    char bad2[400];
    snprintf(bad2, sizeof bad2, "%s/bad2.tfp", g_dir);
    CHECK(edit_section(bad, bad2, "model.ir", "gelu(h)", "relu(h)"), "edit the model");
    static const char *const model[] = {"final IR hash", NULL};
    refused("edited model and final IR", bad2, TF_ERR_FORMAT, model);
    /* the model alone edited: the program is the final IR's, which is intact (read back, no pass) */
    CHECK(edit_section(good, bad2, "model.ir", "gelu(h)", "relu(h)"), "edit the model");
    loads("edited model", bad2, true);
    /* a manifest field missing */
    CHECK(edit_section(good, bad, "manifest", "threads: ", "thread: "), "edit the manifest");
    static const char *const field[] = {"manifest", NULL};
    refused("manifest without threads", bad, TF_ERR_FORMAT, field);
    /* no such file, a directory, not a package */
    static const char *const nofile[] = {"cannot open", NULL};
    refused("no such file", "/nonexistent/x.tfp", TF_ERR_FORMAT, nofile);
    refused("a directory", g_dir, TF_ERR_FORMAT, NULL);
    spit(bad, MLP, strlen(MLP));
    static const char *const text[] = {"not a tfuse package", NULL};
    refused("a model file", bad, TF_ERR_FORMAT, text);
}

static void container(void)
{
    tf_pkg p = {0}, q = {0};
    char why[256];
    CHECK(tf_pkg_add(&p, "a", "xyz", 3, why, sizeof why) && tf_pkg_add(&p, "empty", "", 0, why, sizeof why), "add: %s", why);
    CHECK(!tf_pkg_add(&p, "a", "w", 1, why, sizeof why) && strstr(why, "twice"), "a repeated name is refused: %s", why);
    CHECK(!tf_pkg_add(&p, "bad name", "w", 1, why, sizeof why), "a name with a space is refused");
    CHECK(!tf_pkg_add(&p, "", "w", 1, why, sizeof why), "an empty name is refused");
    unsigned char *b = NULL;
    size_t n = 0;
    bool oom;
    CHECK(tf_pkg_serialize(&p, &b, &n, why, sizeof why) && tf_pkg_parse(&q, b, n, &oom, why, sizeof why), "round trip: %s", why);
    const tf_pkg_section *a = tf_pkg_find(&q, "a"), *e = tf_pkg_find(&q, "empty");
    CHECK(q.n == 2 && a && a->len == 3 && !memcmp(a->data, "xyz", 3) && e && e->len == 0, "sections round-trip");
    /* an owned section (the params' bytes, not copied), and the streaming writer: the serializer's bytes exactly */
    unsigned char *big = tf_malloc(100001);
    for (int i = 0; big && i < 100000; i++) big[i] = (unsigned char)(i * 7);
    CHECK(big && tf_pkg_add_owned(&p, "big", big, 100000, why, sizeof why), "add_owned: %s", why);
    unsigned char *b2 = NULL;
    size_t n2 = 0, written = 0;
    char path[400];
    snprintf(path, sizeof path, "%s/streamed.tfp", g_dir);
    CHECK(tf_pkg_serialize(&p, &b2, &n2, why, sizeof why) && tf_pkg_write(&p, path, &written, why, sizeof why), "write: %s", why);
    FILE *f = fopen(path, "rb");
    unsigned char *got = tf_malloc(n2 + 1);
    size_t rd = f && got ? fread(got, 1, n2 + 1, f) : 0;
    if (f) fclose(f);
    CHECK(rd == n2 && written == n2 && got && !memcmp(got, b2, n2), "tf_pkg_write's file (%zu bytes, %zu said) is tf_pkg_serialize's %zu bytes",
          rd, written, n2);
    tf_free(got);
    tf_free(b2);
    CHECK(!tf_pkg_add_owned(&p, "big", tf_malloc(2), 1, why, sizeof why) && strstr(why, "twice"), "a repeated owned name is refused (and freed)");
    tf_pkg_free(&p);
    tf_pkg_free(&q);
    tf_free(b);
}

int main(void)
{
    g_seed = test_seed();
    snprintf(g_dir, sizeof g_dir, "/tmp/tfuse-test-package-%ld", (long)getpid());
    CHECK(mkdir(g_dir, 0777) == 0, "mkdir %s", g_dir);
    char cache[300];
    snprintf(cache, sizeof cache, "%s/cache", g_dir);
    setenv("TFUSE_CACHE_DIR", cache, 1);   /* an empty disk cache: the loaded session has only the package */
    container();
    round_trip(TF_TARGET_INTERP, true);
    if (tf_backend_cpu.unavailable()) {
        printf("cpu target unavailable in this build: the cpu packages are not tested\n");
    } else {
        round_trip(TF_TARGET_CPU, true);
        round_trip(TF_TARGET_CPU, false);
        parallel_build();
        refusals();
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", g_dir);
    return check_report();
}
