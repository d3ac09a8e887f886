/* test_loader.c — tf_loader_t and the training facts of the API: batch
 * order in order and shuffled, the same batches for any number of worker
 * threads, a resumed position giving the batches of the uninterrupted run,
 * clear messages for bad data, batches bound to a session; the train block
 * as tf_model_train_config/tf_program_train_config report it; checkpoint
 * metadata; precision and checkpoint names; tf_view_element. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tfuse.h"

enum { N = 10, B = 4 };

static const char *model =
    "module tl\ndim B = 4\ninput x : f32[B, 3]\ninput y : i64[B]\n"
    "param w : f32[3, 10] = zeros()\nparam b : f32[10] = zeros()\n"
    "lg = linear(x, w, b)\nloss = cross_entropy(lg, y)\nx2 = mul(x, 2.0)\noutput loss\noutput x2\n"
    "train {\n  optimizer = adam(lr=0.01)\n  schedule = cosine(total_steps=100, warmup_steps=5)\n"
    "  precision = fp16\n  clip_grad_norm = 0.5\n  accumulate = 2\n}\n";

static char dir[64], px[128], py[128], py32[128], py9[128], px4[128], px3[128], py3[128];

/* x[i] = {i, i + 0.5, -i}, y[i] = i: a batch's y says which samples it holds. */
static void write_data(tf_context_t *ctx)
{
    float x[N * 4];
    int64_t y[N];
    int32_t y32[N];
    for (int i = 0; i < N; i++) {
        x[3 * i] = (float)i, x[3 * i + 1] = (float)i + 0.5f, x[3 * i + 2] = (float)-i;
        y[i] = i, y32[i] = i;
    }
    for (int i = 0; i < N * 4; i++) x[i] = i < 3 * N ? x[i] : 0;
    snprintf(px, sizeof px, "%s/x.npy", dir);
    snprintf(py, sizeof py, "%s/y.npy", dir);
    snprintf(py32, sizeof py32, "%s/y32.npy", dir);
    snprintf(py9, sizeof py9, "%s/y9.npy", dir);
    snprintf(px4, sizeof px4, "%s/x4.npy", dir);
    snprintf(px3, sizeof px3, "%s/x3.npy", dir);
    snprintf(py3, sizeof py3, "%s/y3.npy", dir);
    tf_tensor_view vx = {TF_DTYPE_F32, 2, {N, 3}, x}, vy = {TF_DTYPE_I64, 1, {N}, y}, vy32 = {TF_DTYPE_I32, 1, {N}, y32};
    tf_tensor_view vy9 = {TF_DTYPE_I64, 1, {N - 1}, y}, vx4 = {TF_DTYPE_F32, 2, {N, 4}, x};
    tf_tensor_view vx3 = {TF_DTYPE_F32, 2, {3, 3}, x}, vy3 = {TF_DTYPE_I64, 1, {3}, y};
    CHECK(!tf_array_save_npy(ctx, px, &vx) && !tf_array_save_npy(ctx, py, &vy) && !tf_array_save_npy(ctx, py32, &vy32) &&
              !tf_array_save_npy(ctx, py9, &vy9) && !tf_array_save_npy(ctx, px4, &vx4) &&
              !tf_array_save_npy(ctx, px3, &vx3) && !tf_array_save_npy(ctx, py3, &vy3),
          "writing the data: %s", tf_context_last_error(ctx));
}

static tf_loader_t *make(tf_context_t *ctx, const tf_program_t *p, const char *xpath, const char *ypath, int shuffle,
                         uint64_t seed, int workers)
{
    tf_data_source src[2] = {{"x", xpath}, {"y", ypath}};
    tf_loader_options o;
    tf_loader_options_init(&o);
    o.shuffle = shuffle;
    o.seed = seed;
    o.workers = workers;
    tf_loader_t *L = NULL;
    CHECK(tf_loader_create(ctx, p, src, 2, &o, &L) == TF_OK, "create: %s", tf_context_last_error(ctx));
    return L;
}

/* The next batch's samples (its y values) into ids[B]; checks x agrees. */
static bool next_ids(tf_loader_t *L, int64_t ids[B], tf_batch_info *bi)
{
    tf_tensor_view vx, vy;
    if (tf_loader_next(L, NULL, bi) || tf_loader_view(L, "y", &vy) || tf_loader_view(L, "x", &vx)) return false;
    CHECK(vy.rank == 1 && vy.shape[0] == B && vx.rank == 2 && vx.shape[0] == B && vx.shape[1] == 3, "batch shapes");
    for (int j = 0; j < B; j++) {
        ids[j] = ((const int64_t *)vy.data)[j];
        const float *row = (const float *)vx.data + 3 * j;
        CHECK(row[0] == (float)ids[j] && row[1] == (float)ids[j] + 0.5f && row[2] == (float)-ids[j],
              "x row %d of the batch is sample %lld's", j, (long long)ids[j]);
    }
    return true;
}

static void test_in_order(tf_context_t *ctx, const tf_program_t *p)
{
    tf_loader_t *L = make(ctx, p, px, py, 0, 0, 2);
    if (!L) return;
    CHECK(tf_loader_samples(L) == N && tf_loader_batch_size(L) == B && tf_loader_epoch_batches(L) == 3, "sizes");
    static const int64_t want[4][B] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 0, 1}, {0, 1, 2, 3}};
    static const int64_t real[4] = {4, 4, 2, 4}, epoch[4] = {0, 0, 0, 1}, after[4] = {4, 8, 12, 4};
    for (int k = 0; k < 4; k++) {
        int64_t ids[B];
        tf_batch_info bi;
        if (!next_ids(L, ids, &bi)) {
            CHECK(0, "batch %d: %s", k, tf_context_last_error(ctx));
            break;
        }
        CHECK(!memcmp(ids, want[k], sizeof ids), "in order, batch %d: %lld %lld %lld %lld", k, (long long)ids[0],
              (long long)ids[1], (long long)ids[2], (long long)ids[3]);
        CHECK(bi.samples == real[k] && bi.epoch == (uint64_t)epoch[k] && bi.next.epoch == bi.epoch &&
                  bi.next.offset == after[k],
              "batch %d: %lld real samples, epoch %llu, then offset %lld", k, (long long)bi.samples,
              (unsigned long long)bi.epoch, (long long)bi.next.offset);
        tf_loader_position pos;
        CHECK(!tf_loader_get_position(L, &pos) && pos.epoch == bi.next.epoch && pos.offset == bi.next.offset,
              "get_position after batch %d", k);
    }
    tf_loader_free(L);
}

/* `count` batches of a shuffled loader, as sample ids. */
static void shuffled_run(tf_context_t *ctx, const tf_program_t *p, uint64_t seed, int workers,
                         const tf_loader_position *from, int count, int64_t (*ids)[B], tf_loader_position *end)
{
    tf_loader_t *L = make(ctx, p, px, py, 1, seed, workers);
    if (!L) return;
    if (from) CHECK(tf_loader_set_position(L, from) == TF_OK, "set_position: %s", tf_context_last_error(ctx));
    for (int k = 0; k < count; k++) {
        tf_batch_info bi;
        if (!next_ids(L, ids[k], &bi)) {
            CHECK(0, "batch %d: %s", k, tf_context_last_error(ctx));
            break;
        }
    }
    if (end) tf_loader_get_position(L, end);
    tf_loader_free(L);
}

static void test_shuffled(tf_context_t *ctx, const tf_program_t *p)
{
    enum { K = 7 };
    int64_t a[K][B], b[K][B], c[K][B];
    memset(a, 0xff, sizeof a);
    memset(b, 0, sizeof b);
    memset(c, 0, sizeof c);
    shuffled_run(ctx, p, 7, 1, NULL, K, a, NULL);
    shuffled_run(ctx, p, 7, 5, NULL, K, b, NULL);
    CHECK(!memcmp(a, b, sizeof a), "the same seed gives the same batches with 1 and 5 workers");
    /* an epoch is 2 batches (10 / 4: 2 samples left out), each sample at most once in it */
    for (int e = 0; e < K / 2; e++) {
        int seen[N] = {0};
        for (int k = 2 * e; k < 2 * e + 2; k++)
            for (int j = 0; j < B; j++)
                if (a[k][j] >= 0 && a[k][j] < N) seen[a[k][j]]++;
        int distinct = 0, twice = 0;
        for (int i = 0; i < N; i++) distinct += seen[i] == 1, twice += seen[i] > 1;
        CHECK(distinct == 2 * B && !twice, "epoch %d visits %d distinct samples, %d more than once", e, distinct, twice);
    }
    CHECK(memcmp(a[0], a[2], sizeof a[0]) || memcmp(a[1], a[3], sizeof a[1]), "epochs 0 and 1 have different orders");
    bool in_order = true;
    for (int j = 0; j < B; j++) in_order &= a[0][j] == j;
    CHECK(!in_order, "shuffled: the first batch is not 0 1 2 3");
    shuffled_run(ctx, p, 8, 2, NULL, K, c, NULL);
    CHECK(memcmp(a, c, sizeof a), "another seed, another order");

    /* resume: 3 batches, then a new loader from that position gives batches 3.. */
    int64_t first[3][B], rest[K - 3][B];
    tf_loader_position pos;
    shuffled_run(ctx, p, 7, 3, NULL, 3, first, &pos);
    CHECK(pos.epoch == 1 && pos.offset == 4 && pos.seed == 7, "position after 3 batches: epoch %llu offset %lld seed %llu",
          (unsigned long long)pos.epoch, (long long)pos.offset, (unsigned long long)pos.seed);
    shuffled_run(ctx, p, 0, 2, &pos, K - 3, rest, NULL);   /* the position carries the seed */
    CHECK(!memcmp(first, a, sizeof first) && !memcmp(rest, a[3], sizeof rest),
          "3 batches + resume gives the uninterrupted run's batches");

    /* set_position on a loader in use, back to the start */
    tf_loader_t *L = make(ctx, p, px, py, 1, 7, 2);
    if (L) {
        int64_t ids[B];
        tf_batch_info bi;
        for (int k = 0; k < 3; k++) next_ids(L, ids, &bi);
        CHECK(tf_loader_set_position(L, &(tf_loader_position){0, 0, 7}) == TF_OK, "rewind");
        tf_tensor_view v;
        CHECK(tf_loader_view(L, "y", &v) == TF_ERR_INVALID_ARG, "no batch to view after set_position");
        CHECK(next_ids(L, ids, &bi) && !memcmp(ids, a[0], sizeof ids), "rewound: batch 0 again");
        CHECK(tf_loader_set_position(L, &(tf_loader_position){0, -1, 7}) == TF_ERR_INVALID_ARG &&
                  strstr(tf_context_last_error(ctx), "offset -1"),
              "a negative offset: %s", tf_context_last_error(ctx));
        tf_loader_free(L);
    }
}

/* Batches bound to a session: the step sees them. */
static void test_bind(tf_context_t *ctx, const tf_program_t *p)
{
    tf_session_t *s = NULL;
    tf_loader_t *L = make(ctx, p, px, py, 0, 0, 1);
    if (!L || tf_session_create(ctx, p, TF_TARGET_INTERP, 1, &s)) {
        CHECK(0, "session: %s", tf_context_last_error(ctx));
        tf_loader_free(L);
        return;
    }
    for (int k = 0; k < 2; k++) {
        tf_tensor_view out;
        CHECK(!tf_loader_next(L, s, NULL) && !tf_session_run(s) && !tf_session_output(s, "x2", &out),
              "step %d: %s", k, tf_context_last_error(ctx));
        CHECK(tf_view_element(&out, 3) == 2.0 * (4 * k + 1), "x2[1][0] of batch %d is %g", k, tf_view_element(&out, 3));
    }
    tf_session_free(s);
    tf_loader_free(L);
}

static void expect_bad(tf_context_t *ctx, const tf_program_t *p, const tf_data_source *src, size_t n, int shuffle,
                       tf_status want, const char *msg)
{
    tf_loader_options o;
    tf_loader_options_init(&o);
    o.shuffle = shuffle;
    o.name = "--data";
    tf_loader_t *L = (tf_loader_t *)1;
    tf_status st = tf_loader_create(ctx, p, src, n, &o, &L);
    CHECK(st == want && !L && strstr(tf_context_last_error(ctx), msg), "want %s with '%s', got %s: %s", tf_status_name(want),
          msg, tf_status_name(st), tf_context_last_error(ctx));
    if (st == TF_OK) tf_loader_free(L);
}

static void test_bad(tf_context_t *ctx, const tf_program_t *p)
{
    char nope[128];
    snprintf(nope, sizeof nope, "%s/nope.npy", dir);
    tf_data_source a[3] = {{"x", px}, {"y", py32}};
    expect_bad(ctx, p, a, 2, 1, TF_ERR_INVALID_ARG, "y32.npy: the array is i32, input 'y' is i64 (no silent conversion");
    a[1] = (tf_data_source){"y", py9};
    expect_bad(ctx, p, a, 2, 1, TF_ERR_INVALID_ARG, "x.npy has 10 samples but");
    a[1] = (tf_data_source){"y", py};
    a[2] = (tf_data_source){"z", py};
    expect_bad(ctx, p, a, 3, 1, TF_ERR_INVALID_ARG, "--data: the model has no input named 'z' (its inputs: x, y)");
    expect_bad(ctx, p, a, 1, 1, TF_ERR_INVALID_ARG, "--data gives no data for input 'y' (i64[4]): add y=FILE.npy");
    a[1] = (tf_data_source){"x", py};
    expect_bad(ctx, p, a, 2, 1, TF_ERR_INVALID_ARG, "--data: input 'x' is given twice");
    a[0] = (tf_data_source){"x", px4};
    a[1] = (tf_data_source){"y", py};
    expect_bad(ctx, p, a, 2, 1, TF_ERR_INVALID_ARG,
               "x4.npy: the array is f32[10, 4], so its samples are [4]; input 'x' is f32[4, 3], so each sample must be [3]");
    a[0] = (tf_data_source){"x", nope};
    expect_bad(ctx, p, a, 2, 1, TF_ERR_IO, "nope.npy");
    CHECK(strstr(tf_context_last_error(ctx), "(--data)"), "the data set is named: %s", tf_context_last_error(ctx));
    a[0] = (tf_data_source){"x", px3};
    a[1] = (tf_data_source){"y", py3};
    expect_bad(ctx, p, a, 2, 1, TF_ERR_INVALID_ARG, "--data has 3 samples, fewer than one batch of 4");
    /* unshuffled, 3 samples make one padded batch */
    tf_loader_t *L = make(ctx, p, px3, py3, 0, 0, 1);
    if (L) {
        int64_t ids[B];
        tf_batch_info bi;
        CHECK(tf_loader_epoch_batches(L) == 1 && next_ids(L, ids, &bi) && bi.samples == 3 && ids[3] == 0,
              "3 samples, in order: one batch, 3 real, padded with sample 0");
        tf_loader_free(L);
    }
    tf_loader_options o;
    tf_loader_options_init(&o);
    o.workers = 0;
    L = NULL;
    CHECK(tf_loader_create(ctx, p, a, 2, &o, &L) == TF_ERR_INVALID_ARG && strstr(tf_context_last_error(ctx), "workers"),
          "0 workers: %s", tf_context_last_error(ctx));
    CHECK(tf_loader_create(ctx, p, a, 0, NULL, &L) == TF_ERR_INVALID_ARG && strstr(tf_context_last_error(ctx), "no arrays"),
          "no sources: %s", tf_context_last_error(ctx));
}

static bool param_is(const tf_train_param *ps, size_t n, const char *name, double v)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ps[i].name, name)) return ps[i].value == v;
    return false;
}

static void test_train_config(tf_context_t *ctx, const tf_model_t *m)
{
    tf_train_config c;
    CHECK(tf_model_train_config(ctx, m, &c) == TF_OK, "model config");
    CHECK(c.has_block && !strcmp(c.optimizer, "adam") && c.lr == 0.01 && !strcmp(c.schedule, "cosine") &&
              c.precision == TF_PRECISION_FP16 && c.clip_grad_norm == 0.5 && c.accumulate == 2,
          "the train block: %s lr %g, %s, %s, clip %g, accumulate %lld", c.optimizer, c.lr, c.schedule,
          tf_precision_name(c.precision), c.clip_grad_norm, (long long)c.accumulate);
    CHECK(c.noptimizer_params == 5 && param_is(c.optimizer_params, 5, "lr", 0.01) &&
              param_is(c.optimizer_params, 5, "beta1", 0.9) && param_is(c.optimizer_params, 5, "eps", 1e-8),
          "adam's parameters, defaults filled in (%zu)", c.noptimizer_params);
    CHECK(c.nschedule_params == 3 && param_is(c.schedule_params, 3, "total_steps", 100) &&
              param_is(c.schedule_params, 3, "warmup_steps", 5) && param_is(c.schedule_params, 3, "min_lr", 0),
          "cosine's parameters (%zu)", c.nschedule_params);
    /* a program: the precision it was compiled in */
    static const tf_precision asked[] = {TF_PRECISION_DEFAULT, TF_PRECISION_BF16, TF_PRECISION_FP32};
    static const tf_precision got[] = {TF_PRECISION_FP16, TF_PRECISION_BF16, TF_PRECISION_FP32};
    for (int i = 0; i < 3; i++) {
        tf_compile_options o;
        tf_compile_options_init(&o);
        o.target = TF_TARGET_INTERP;
        o.precision = asked[i];
        tf_program_t *p = NULL;
        CHECK(!tf_program_compile(ctx, m, &o, &p) && !tf_program_train_config(ctx, p, &c) && c.precision == got[i] &&
                  !strcmp(c.optimizer, "adam"),
              "compiled with precision %s: %s (%s)", tf_precision_name(asked[i]), tf_precision_name(c.precision),
              tf_context_last_error(ctx));
        tf_program_free(p);
    }
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.precision = (tf_precision)42;
    tf_program_t *p = NULL;
    CHECK(tf_program_compile(ctx, m, &o, &p) == TF_ERR_INVALID_ARG && !p, "precision out of range");
    /* no train block: what autodiff uses */
    tf_model_t *plain = NULL;
    const char *t = "input x : f32[2]\ny = relu(x)\noutput y\n";
    CHECK(!tf_model_parse_string(ctx, "plain.ir", t, strlen(t), NULL, 0, &plain) && !tf_model_train_config(ctx, plain, &c),
          "plain model");
    CHECK(!c.has_block && !strcmp(c.optimizer, "sgd") && c.lr == 0.01 && !strcmp(c.schedule, "constant") &&
              c.nschedule_params == 0 && c.precision == TF_PRECISION_FP32 && c.clip_grad_norm == 0 && c.accumulate == 1 &&
              param_is(c.optimizer_params, c.noptimizer_params, "lr", 0.01) &&
              param_is(c.optimizer_params, c.noptimizer_params, "momentum", 0),
          "defaults: %s lr %g %s %s", c.optimizer, c.lr, c.schedule, tf_precision_name(c.precision));
    tf_model_free(plain);
}

static void test_metadata(tf_context_t *ctx)
{
    char *j = NULL, *v = NULL;
    CHECK(!tf_metadata_set(ctx, &j, "a", "1") && !tf_metadata_set(ctx, &j, "b", "x\"y\\z") &&
              !tf_metadata_set(ctx, &j, "a", "2"),
          "set: %s", tf_context_last_error(ctx));
    CHECK(j && !strcmp(j, "{\"a\":\"2\",\"b\":\"x\\\"y\\\\z\"}"), "text: %s", j ? j : "(null)");
    CHECK(!tf_metadata_get(ctx, j, "b", &v) && v && !strcmp(v, "x\"y\\z"), "get b: %s", v ? v : "(null)");
    free(v);
    v = (char *)1;
    CHECK(!tf_metadata_get(ctx, j, "c", &v) && !v, "an absent key is NULL");
    CHECK(tf_metadata_get(ctx, "{\"a\":1}", "a", &v) == TF_ERR_FORMAT && !v &&
              strstr(tf_context_last_error(ctx), "values must be strings"),
          "not an object of strings: %s", tf_context_last_error(ctx));
    char *before = j;
    CHECK(tf_metadata_set(ctx, &j, "k", "\xff") == TF_ERR_INVALID_ARG && j == before, "a value that is not UTF-8");
    free(j);
}

static void test_names(void)
{
    tf_precision p = TF_PRECISION_FP32;
    CHECK(!tf_precision_parse("bf16", &p) && p == TF_PRECISION_BF16, "parse bf16");
    CHECK(tf_precision_parse("fp64", &p) == TF_ERR_INVALID_ARG && p == TF_PRECISION_BF16, "parse fp64 fails, unchanged");
    CHECK(!strcmp(tf_precision_name(TF_PRECISION_DEFAULT), "default") && !strcmp(tf_precision_name((tf_precision)9), "?"),
          "names");
    tf_checkpoint c = TF_CHECKPOINT_NONE;
    CHECK(!tf_checkpoint_parse("auto", &c) && c == TF_CHECKPOINT_AUTO && !strcmp(tf_checkpoint_name(c), "auto") &&
              tf_checkpoint_parse("some", &c) == TF_ERR_INVALID_ARG,
          "checkpoint names");
    uint16_t h[2] = {0x3c00, 0xc000}, bf[1] = {0x4040};
    tf_tensor_view vh = {TF_DTYPE_F16, 1, {2}, h}, vb = {TF_DTYPE_BF16, 0, {0}, bf};
    CHECK(tf_view_element(&vh, 0) == 1.0 && tf_view_element(&vh, 1) == -2.0 && tf_view_element(&vb, 0) == 3.0 &&
              isnan(tf_view_element(&vh, 2)) && isnan(tf_view_element(&vh, -1)),
          "tf_view_element");
}

int main(void)
{
    tf_context_t *ctx;
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    snprintf(dir, sizeof dir, "/tmp/tfuse_loader_XXXXXX");
    if (tf_context_create(&ctx) || !mkdtemp(dir)) return 1;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_INTERP;
    o.precision = TF_PRECISION_FP32;
    CHECK(!tf_model_parse_string(ctx, "tl.ir", model, strlen(model), NULL, 0, &m) && !tf_program_compile(ctx, m, &o, &p),
          "model: %s", tf_context_last_error(ctx));
    if (p) {
        write_data(ctx);
        test_in_order(ctx, p);
        test_shuffled(ctx, p);
        test_bind(ctx, p);
        test_bad(ctx, p);
        test_train_config(ctx, m);
    }
    test_metadata(ctx);
    test_names();
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
    const char *files[] = {px, py, py32, py9, px4, px3, py3};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        if (files[i][0]) unlink(files[i]);
    rmdir(dir);
    return check_report();
}
