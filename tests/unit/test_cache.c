/* test_cache.c — the compiled-kernel cache as an object (tf_cache_t): two
 * contexts sharing one reuse each other's kernels, contexts with their own
 * do not, and the limit (tf_cache_set_limit) evicts the kernels no session
 * holds, while a kernel a live session runs stays. Below it, the disk cache
 * ($TFUSE_CACHE_DIR/cpu, here a fresh directory): what one cache compiled,
 * another links from the disk without compiling, computing the same bits;
 * torn or foreign files are compiled again. Passes, saying so, in a build
 * without LLVM (no cpu target). */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tfuse.h"

static const char *text = "input x : f32[33]\nh = mul(x, 0.25)\ny = tanh(h)\noutput y\n";

typedef struct run { tf_model_t *m; tf_program_t *p; tf_session_t *s; tf_session_info info; } run;

static bool start(tf_context_t *ctx, const char *model, run *r)
{
    memset(r, 0, sizeof *r);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_CPU;
    o.threads = 1;
    if (tf_model_parse_string(ctx, "cache.ir", model, strlen(model), NULL, 0, &r->m) || tf_program_compile(ctx, r->m, &o, &r->p) ||
        tf_session_create(ctx, r->p, TF_TARGET_CPU, 1, &r->s) || tf_session_get_info(r->s, &r->info)) {
        CHECK(0, "session: %s", tf_context_last_error(ctx));
        return false;
    }
    return true;
}

static void stop(run *r)
{
    tf_session_free(r->s);
    tf_program_free(r->p);
    tf_model_free(r->m);
    memset(r, 0, sizeof *r);
}

/* y of the model on x = 0, 0.1, 0.2, ... from a session of a fresh context
 * (its own cache: the disk or the compiler), and how it got its kernels. */
static bool outputs(const char *model, float *y, tf_session_info *info)
{
    tf_context_t *ctx;
    run r;
    if (tf_context_create(&ctx)) return false;
    bool ok = start(ctx, model, &r);
    float x[33];
    int64_t shape[1] = {33};
    for (int i = 0; i < 33; i++) x[i] = 0.1f * (float)i;
    tf_tensor_view v;
    ok = ok && !tf_session_bind(r.s, "x", TF_DTYPE_F32, shape, 1, x) && !tf_session_run(r.s) && !tf_session_output(r.s, "y", &v);
    if (ok) {
        memcpy(y, v.data, sizeof(float) * 33);
        *info = r.info;
    }
    CHECK(ok, "a session runs: %s", tf_context_last_error(ctx));
    if (r.s) stop(&r);
    tf_context_free(ctx);
    return ok;
}

/* Every object file in dir/cpu spoiled: cut to half, or its bytes flipped. */
static int spoil(const char *dir, bool truncate_them)
{
    char sub[600], path[1200];
    snprintf(sub, sizeof sub, "%s/cpu", dir);
    DIR *d = opendir(sub);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, ".o")) continue;
        snprintf(path, sizeof path, "%s/%s", sub, e->d_name);
        FILE *f = fopen(path, "r+b");
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        if (truncate_them) {
            n += truncate(path, size / 2) == 0;
        } else {
            fseek(f, size / 2, SEEK_SET);
            int ch = fgetc(f);
            fseek(f, size / 2, SEEK_SET);
            fputc(ch ^ 0x5a, f);
            n++;
        }
        fclose(f);
    }
    if (d) closedir(d);
    return n;
}

static void disk_cache(const char *dir)
{
    static const char *model = "input x : f32[33]\nh = mul(x, 0.75)\ny = sigmoid(h)\nz = add(y, x)\noutput y\noutput z\n";
    float y1[33], y2[33], y3[33];
    tf_session_info i1, i2, i3;
    if (!outputs(model, y1, &i1) || !outputs(model, y2, &i2)) return;
    CHECK(i1.jit_compiled > 0 && i1.jit_disk == 0, "a fresh disk cache: the kernels compile (%d compiled, %d from the disk)",
          i1.jit_compiled, i1.jit_disk);
    CHECK(i2.jit_compiled == 0 && i2.jit_disk == i1.jit_compiled,
          "a cache of its own links what the first left on the disk (%d compiled, %d from the disk)", i2.jit_compiled, i2.jit_disk);
    CHECK(memcmp(y1, y2, sizeof y1) == 0, "the object code from the disk computes the same bits");
    for (int torn = 1; torn >= 0; torn--) {
        int n = spoil(dir, torn);
        CHECK(n > 0, "spoiled %d files", n);
        if (!outputs(model, y3, &i3)) return;
        CHECK(i3.jit_compiled == i1.jit_compiled && i3.jit_disk == 0, "%s files compile again (%d compiled, %d from the disk)",
              torn ? "torn" : "corrupted", i3.jit_compiled, i3.jit_disk);
        CHECK(memcmp(y1, y3, sizeof y1) == 0, "and compute the same bits");
    }
    if (!outputs(model, y3, &i3)) return;
    CHECK(i3.jit_compiled == 0 && i3.jit_disk == i1.jit_compiled, "written again whole (%d compiled, %d from the disk)",
          i3.jit_compiled, i3.jit_disk);
}

int main(void)
{
    /* a disk cache of this test's own, empty */
    char dir[] = "/tmp/tfuse-test-cache-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("TFUSE_CACHE_DIR", dir, 1);
    tf_context_t *a, *b, *c;
    CHECK(!tf_context_create(&a) && !tf_context_create(&b) && !tf_context_create(&c), "contexts");
    const char *how = NULL;
    tf_target_op_support(a, TF_TARGET_CPU, "tanh", &how, NULL, 0);
    if (!how) {
        printf("cache: no cpu target in this build (no LLVM); nothing to check\n");
        tf_context_free(a);
        tf_context_free(b);
        tf_context_free(c);
        rmdir(dir);
        return check_report();
    }
    CHECK(tf_context_cache(a) && tf_context_cache(a) != tf_context_cache(b), "every context has a cache of its own");
    tf_cache_t *shared;
    CHECK(!tf_cache_create(&shared), "tf_cache_create");
    CHECK(!tf_context_set_cache(a, shared) && !tf_context_set_cache(b, shared), "attach one cache to two contexts");
    tf_cache_free(shared);   /* the contexts hold it now */
    CHECK(tf_context_cache(a) == tf_context_cache(b), "a and b share it");

    run r1, r2, r3;
    if (start(a, text, &r1))
        CHECK(r1.info.jit_compiled > 0 && r1.info.jit_cached == 0, "the first session compiles (%d compiled, %d cached)",
              r1.info.jit_compiled, r1.info.jit_cached);
    if (start(b, text, &r2))
        CHECK(r2.info.jit_compiled == 0 && r2.info.jit_cached > 0,
              "a session of another context sharing the cache compiles nothing (%d compiled, %d cached)", r2.info.jit_compiled,
              r2.info.jit_cached);
    if (start(c, text, &r3))
        CHECK(r3.info.jit_compiled == 0 && r3.info.jit_cached == 0 && r3.info.jit_disk > 0,
              "a context with its own cache takes the object code from the disk (%d compiled, %d cached, %d from the disk)",
              r3.info.jit_compiled, r3.info.jit_cached, r3.info.jit_disk);
    stop(&r3);

    tf_cache_info ci;
    CHECK(!tf_cache_get_info(tf_context_cache(a), &ci) && ci.kernels > 0 && ci.in_use == ci.kernels && ci.evicted == 0,
          "the shared cache holds the kernels the live sessions run (%d held, %d in use)", ci.kernels, ci.in_use);
    CHECK(getenv("TFUSE_JIT_CACHE_KERNELS") || ci.limit == 2048, "the default limit: 2048 (TFUSE_JIT_CACHE_KERNELS unset): %d", ci.limit);

    /* the bound: with limit 0, a kernel no session holds is given back at once */
    CHECK(!tf_cache_set_limit(tf_context_cache(a), 0), "set the limit to 0");
    CHECK(!tf_cache_get_info(tf_context_cache(a), &ci) && ci.evicted == 0 && ci.kernels > 0,
          "kernels live sessions hold stay (%d held, %lld evicted)", ci.kernels, (long long)ci.evicted);
    stop(&r1);
    CHECK(!tf_cache_get_info(tf_context_cache(a), &ci) && ci.evicted == 0, "still held by b's session");
    stop(&r2);
    CHECK(!tf_cache_get_info(tf_context_cache(a), &ci) && ci.kernels == 0 && ci.evicted > 0,
          "the last session gone, the limit evicts them (%d held, %lld evicted)", ci.kernels, (long long)ci.evicted);
    if (start(b, text, &r2))
        CHECK(r2.info.jit_compiled == 0 && r2.info.jit_cached == 0 && r2.info.jit_disk > 0,
              "evicted kernels come back from the disk (%d compiled, %d cached, %d from the disk)", r2.info.jit_compiled,
              r2.info.jit_cached, r2.info.jit_disk);
    stop(&r2);

    /* a limit that keeps them: the next session reads the cache */
    CHECK(!tf_cache_set_limit(tf_context_cache(a), 16), "set the limit to 16");
    if (start(a, text, &r1)) stop(&r1);
    if (start(b, text, &r2))
        CHECK(r2.info.jit_compiled == 0 && r2.info.jit_cached > 0, "kept within the limit (%d compiled, %d cached)",
              r2.info.jit_compiled, r2.info.jit_cached);
    /* a session outlives its context's switch to another cache */
    CHECK(!tf_context_set_cache(b, NULL), "b back to a cache of its own");
    CHECK(tf_context_cache(b) != tf_context_cache(a), "b's own");
    tf_session_info again;
    float x[33] = {0};
    int64_t shape[1] = {33};
    CHECK(!tf_session_bind(r2.s, "x", TF_DTYPE_F32, shape, 1, x) && !tf_session_run(r2.s) && !tf_session_get_info(r2.s, &again),
          "the session still runs: %s", tf_context_last_error(b));
    stop(&r2);
    CHECK(tf_cache_set_limit(tf_context_cache(a), -1) == TF_ERR_INVALID_ARG, "a negative limit is refused");
    tf_context_free(a);
    tf_context_free(b);
    tf_context_free(c);
    disk_cache(dir);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "remove %s", dir);
    return check_report();
}
