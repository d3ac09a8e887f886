/* test_alloc_fail.c — an embedder's allocator sees every allocation, and
 * every allocation can fail cleanly.
 *
 * A counting allocator (tf_context_create_with_allocator) runs a whole
 * session of use: parse, compile for training, a session, a data loader
 * feeding two training steps, an output, a state read, a checkpoint saved
 * and loaded, an inference program run. Then, for every k, the same with
 * the k-th allocation refused: the scenario must stop with TF_ERR_OOM and a
 * message, freeing what it made; the same context must then run the whole
 * scenario without a failure (it is still usable); and once the context is
 * freed, no block and no byte may be left in the allocator (nothing
 * leaked, whatever failed). Runs on the cpu target when this build has
 * LLVM (kernels come from a cache warmed beforehand and shared, so the loop
 * exercises tfuse's code, not LLVM's compiles), else on interp. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tfuse.h"

typedef struct counter {
    long calls, fail_at;   /* fail the fail_at-th allocation or growth (0: none) */
    long blocks;
    long long bytes;
    bool failed;
} counter;

static void *counting(void *ud, void *p, size_t osize, size_t nsize)
{
    counter *c = ud;
    if (nsize == 0) {
        if (p) c->blocks--, c->bytes -= (long long)osize;
        free(p);
        return NULL;
    }
    if (++c->calls == c->fail_at) {
        c->failed = true;
        return NULL;
    }
    void *q = realloc(p, nsize);
    if (!q) return NULL;
    if (!p) c->blocks++;
    c->bytes += (long long)nsize - (p ? (long long)osize : 0);
    return q;
}

static const char *model =
    "module af\ninput x : f32[4, 6]\ninput y : i64[4]\n"
    "param w1 : f32[6, 8] = kaiming_uniform()\nparam b1 : f32[8] = zeros()\nparam w2 : f32[8, 3] = uniform()\n"
    "h = linear(x, w1, b1)\nr = relu(h)\nd = dropout(r, p=0.1)\nl = linear(d, w2)\nloss = cross_entropy(l, y)\n"
    "output loss\ntrain {\n  optimizer = adam(lr=0.01)\n}\n";

static char dir[64], px[128], py[128], pst[128];
static tf_target target;
static tf_cache_t *shared;

/* The scenario; frees everything it made. TF_OK, or the first failure. */
static tf_status scenario(tf_context_t *ctx)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL, *pi = NULL;
    tf_session_t *s = NULL, *si = NULL;
    tf_loader_t *L = NULL;
    char *text = NULL;
    tf_status st;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.target = target;
    if ((st = tf_model_parse_string(ctx, "af.ir", model, strlen(model), NULL, 0, &m))) goto done;
    if ((st = tf_program_compile(ctx, m, &o, &p))) goto done;
    if ((st = tf_session_create(ctx, p, target, 7, &s))) goto done;
    tf_data_source src[2] = {{"x", px}, {"y", py}};
    tf_loader_options lo;
    tf_loader_options_init(&lo);
    lo.shuffle = 1;
    lo.workers = 1;
    if ((st = tf_loader_create(ctx, p, src, 2, &lo, &L))) goto done;
    for (int step = 0; step < 2; step++)
        if ((st = tf_loader_next(L, s, NULL)) || (st = tf_session_run(s))) goto done;
    tf_tensor_view v;
    float w[48];
    if ((st = tf_session_output(s, "loss", &v))) goto done;
    v.data = w;
    if ((st = tf_session_get_state(s, "w1", &v, sizeof w))) goto done;
    if ((st = tf_session_save_state_meta(s, pst, "{\"step\":\"2\"}"))) goto done;
    char *meta = NULL;
    st = tf_session_load_state_meta(s, pst, &meta);
    free(meta);
    if (st) goto done;
    if ((st = tf_program_print(ctx, p, &text))) goto done;
    o.mode = TF_MODE_INFER;
    if ((st = tf_program_compile(ctx, m, &o, &pi))) goto done;
    if ((st = tf_session_create(ctx, pi, target, 7, &si))) goto done;
    if ((st = tf_session_load_state(si, pst))) goto done;
    float x[24] = {0};
    int64_t y[4] = {0, 1, 2, 0}, shape[2] = {4, 6};
    if ((st = tf_session_bind(si, "x", TF_DTYPE_F32, shape, 2, x)) || (st = tf_session_bind(si, "y", TF_DTYPE_I64, shape, 1, y)) ||
        (st = tf_session_run(si)))
        goto done;
done:
    free(text);
    tf_session_free(si);
    tf_program_free(pi);
    tf_loader_free(L);
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    return st;
}

static void write_data(void)
{
    float x[12 * 6];
    int64_t y[12];
    for (int i = 0; i < 12 * 6; i++) x[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
    for (int i = 0; i < 12; i++) y[i] = i % 3;
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_tensor_view vx = {TF_DTYPE_F32, 2, {12, 6}, x}, vy = {TF_DTYPE_I64, 1, {12}, y};
    CHECK(!tf_array_save_npy(ctx, px, &vx) && !tf_array_save_npy(ctx, py, &vy), "data: %s", tf_context_last_error(ctx));
    tf_context_free(ctx);
}

/* A context on a counting allocator, sharing the warmed cache. */
static tf_status make_ctx(counter *c, tf_context_t **ctx)
{
    tf_status st = tf_context_create_with_allocator(counting, c, ctx);
    if (!st && shared) st = tf_context_set_cache(*ctx, shared);
    return st;
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tfuse_af_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    snprintf(px, sizeof px, "%s/x.npy", dir);
    snprintf(py, sizeof py, "%s/y.npy", dir);
    snprintf(pst, sizeof pst, "%s/s.safetensors", dir);
    write_data();
    target = tf_default_target() == TF_TARGET_INTERP ? TF_TARGET_INTERP : TF_TARGET_CPU;

    /* warm-up on the C library's allocator: one-time process state, and the
     * shared cache's kernels */
    tf_context_t *warm;
    tf_context_create(&warm);
    CHECK(tf_cache_create(&shared) == TF_OK && !tf_context_set_cache(warm, shared), "cache");
    CHECK(scenario(warm) == TF_OK, "the scenario runs: %s", tf_context_last_error(warm));
    tf_context_free(warm);

    /* a clean run: every allocation is seen, and all come back */
    counter c = {0};
    tf_context_t *ctx = NULL;
    CHECK(make_ctx(&c, &ctx) == TF_OK && scenario(ctx) == TF_OK, "the scenario runs on the counting allocator: %s",
          ctx ? tf_context_last_error(ctx) : "no context");
    tf_context_free(ctx);
    long total = c.calls;
    CHECK(total > 100 && c.blocks == 0 && c.bytes == 0, "%ld allocations, all freed (%ld blocks, %lld bytes left)", total,
          c.blocks, c.bytes);
    printf("a scenario makes %ld allocations\n", total);

    /* every allocation fails in turn */
    int bad_status = 0, leaks = 0, unusable = 0, silent = 0;
    for (long k = 1; k <= total + 5; k++) {
        counter f = {.fail_at = k};
        ctx = NULL;
        tf_status st = make_ctx(&f, &ctx);
        if (!st) {
            st = scenario(ctx);
            if (st != TF_OK && !tf_context_last_error(ctx)[0] && silent++ < 3)
                CHECK(0, "allocation %ld: %s without a message", k, tf_status_name(st));
        }
        if (f.failed && st != TF_ERR_OOM && bad_status++ < 5)
            CHECK(0, "allocation %ld failed: the scenario returned %s (%s), not out of memory", k, tf_status_name(st),
                  ctx ? tf_context_last_error(ctx) : "");
        if (!f.failed && st != TF_OK && bad_status++ < 5)
            CHECK(0, "allocation %ld: no allocation failed, yet %s: %s", k, tf_status_name(st), ctx ? tf_context_last_error(ctx) : "");
        if (ctx) {   /* still usable: the whole scenario, nothing failing */
            f.fail_at = 0;
            tf_status again = scenario(ctx);
            if (again != TF_OK && unusable++ < 5)
                CHECK(0, "allocation %ld failed, then the context could not run the scenario: %s", k, tf_context_last_error(ctx));
        }
        tf_context_free(ctx);
        if ((f.blocks || f.bytes) && leaks++ < 5)
            CHECK(0, "allocation %ld failed: %ld blocks (%lld bytes) never freed", k, f.blocks, f.bytes);
    }
    CHECK(bad_status == 0 && leaks == 0 && unusable == 0 && silent == 0,
          "of %ld failing allocations: %d wrong statuses, %d leaks, %d unusable contexts, %d without a message", total,
          bad_status, leaks, unusable, silent);
    if (!bad_status && !leaks && !unusable && !silent)
        printf("each of the %ld allocations failed in turn: a clean error, nothing leaked, the context usable\n", total);
    tf_cache_free(shared);
    unlink(px), unlink(py), unlink(pst);
    rmdir(dir);
    return check_report();
}
