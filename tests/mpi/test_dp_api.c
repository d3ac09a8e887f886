/* test_dp_api.c — data parallel through the C API, run as an Open MPI job of
 * 2 or 3 ranks (tests/mpi/run.sh):
 *   - allreduce is the mean over the ranks, bit for bit what a sum in rank
 *     order in float64 rounded once gives, on the interp and cpu targets;
 *   - a training step compiled with data_parallel and buckets small enough
 *     that there are several (the cpu target sends each while the backward
 *     pass goes on): each rank binds its own batch, and after three steps
 *     the cpu session agrees with the interpreter, every rank holds the same
 *     bits, and the params are those of one process stepping on the
 *     concatenated batch (within float rounding);
 *   - a train program compiled without data_parallel is refused by a job of
 *     several ranks; allgather and broadcast move what they say. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tfuse.h"

enum { B = 4, F = 6, STEPS = 3 };

/* with batch norm, whose statistics are each rank's own (as PyTorch's DDP) */
static const char *model_bn =
    "dim B = 4\ninput x : f32[B, 6]\ninput y : i64[B]\nparam w1 : f32[6, 8] = kaiming_uniform()\nparam g : f32[8] = ones()\n"
    "param b : f32[8] = zeros()\nbuffer rm : f32[8] = zeros()\nbuffer rv : f32[8] = ones()\nparam w2 : f32[8, 3] = kaiming_uniform()\n"
    "h = linear(x, w1)\nh4 = reshape(h, shape=[B, 8, 1, 1])\nn = batchnorm(h4, g, b, rm, rv)\nr = relu(n)\nf = reshape(r, shape=[B, 8])\n"
    "lg = linear(f, w2)\nloss = cross_entropy(lg, y)\noutput loss\ntrain {\n  optimizer = adam(lr=0.01)\n  precision = fp32\n}\n";

/* without: one process on the concatenated batch computes the same step */
static const char *model_plain =
    "dim B = 4\ninput x : f32[B, 6]\ninput y : i64[B]\nparam w1 : f32[6, 8] = kaiming_uniform()\nparam b1 : f32[8] = zeros()\n"
    "param w2 : f32[8, 3] = kaiming_uniform()\nh = linear(x, w1, b1)\nr = tanh(h)\nlg = linear(r, w2)\nloss = cross_entropy(lg, y)\n"
    "output loss\ntrain {\n  optimizer = adam(lr=0.01)\n  precision = fp32\n}\n";

static double rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0;
}

/* rank r's batch of step k: B rows of x and y */
static void batch(int r, int k, float *x, int64_t *y)
{
    uint64_t s = 1000003u * (uint64_t)(r + 1) + 7919u * (uint64_t)k;
    for (int i = 0; i < B * F; i++) x[i] = (float)(4 * rnd(&s) - 2);
    for (int i = 0; i < B; i++) y[i] = (int64_t)(rnd(&s) * 3);
}

static tf_program_t *compile(tf_context_t *ctx, const char *text, int64_t b, tf_mode mode, bool dp, const char *bucket)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_dim_override dim = {"B", b};
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = tf_default_target();
    o.data_parallel = dp;
    o.allreduce_bucket = bucket;
    if (tf_model_parse_string(ctx, "dp", text, strlen(text), &dim, strstr(text, "[B") ? 1 : 0, &m) ||
        tf_program_compile(ctx, m, &o, &p))
        CHECK(0, "compile: %s", tf_context_last_error(ctx));
    tf_model_free(m);
    return p;
}

/* Every param and buffer of s, concatenated as doubles (n of them). */
static double *state_of(tf_session_t *s, const tf_program_t *p, size_t *n)
{
    double *all = NULL;
    *n = 0;
    for (int kind = TF_IO_PARAM; kind <= TF_IO_BUFFER; kind++)
        for (size_t i = 0; i < tf_program_io_count(p, (tf_io_kind)kind); i++) {
            const char *name;
            tf_dtype dt;
            int rank;
            int64_t shape[8], e = 1;
            tf_program_io(p, (tf_io_kind)kind, i, &name, &dt, &rank, shape);
            for (int k = 0; k < rank; k++) e *= shape[k];
            if (dt != TF_DTYPE_F32) continue;   /* the step counter */
            float *f = malloc((size_t)e * sizeof *f);
            tf_tensor_view v = {.data = f};
            CHECK(!tf_session_get_state(s, name, &v, (size_t)e * sizeof *f), "get %s", name);
            all = realloc(all, (*n + (size_t)e) * sizeof *all);
            for (int64_t j = 0; j < e; j++) all[*n + (size_t)j] = f[j];
            *n += (size_t)e;
            free(f);
        }
    return all;
}

static double rel_diff(const double *a, const double *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) d += (a[i] - b[i]) * (a[i] - b[i]), s += b[i] * b[i];
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

static void the_op(tf_context_t *ctx, tf_comm_t *comm, int rank, int size)
{
    const char *text = "input x : f32[5, 7]\ny = allreduce(x, bucket=3)\noutput y\n";
    tf_program_t *p = compile(ctx, text, 0, TF_MODE_INFER, false, NULL);
    float x[35], want[35];
    for (int i = 0; i < 35; i++) {
        double sum = 0;
        for (int r = 0; r < size; r++) sum += (double)(float)(0.1 * (i + 1) * (r + 1) + 1.0 / (r + 3));
        want[i] = (float)(sum / size);
        x[i] = (float)(0.1 * (i + 1) * (rank + 1) + 1.0 / (rank + 3));
    }
    const tf_target targets[] = {TF_TARGET_INTERP, tf_default_target()};   /* cpu, or interp in a build without LLVM */
    for (int t = 0; p && t < 2; t++) {
        tf_session_t *s = NULL;
        int64_t shape[2] = {5, 7};
        tf_tensor_view out;
        if (tf_session_create(ctx, p, targets[t], 1, &s) || tf_session_set_comm(s, comm) ||
            tf_session_bind(s, "x", TF_DTYPE_F32, shape, 2, x) || tf_session_run(s) || tf_session_output(s, "y", &out)) {
            CHECK(0, "allreduce on target %d: %s", t, tf_context_last_error(ctx));
        } else {
            CHECK(!memcmp(out.data, want, sizeof want), "target %d: allreduce is not the mean in rank order (y[0] %.9g, want %.9g)", t,
                  ((float *)out.data)[0], want[0]);
        }
        tf_session_free(s);
    }
    tf_program_free(p);
}

static void training(tf_context_t *ctx, tf_comm_t *comm, int rank, int size, const char *model, bool bn)
{
    tf_program_t *p = compile(ctx, model, B, TF_MODE_TRAIN, true, "128"), *one = compile(ctx, model, (int64_t)B * size, TF_MODE_TRAIN, false, NULL);
    tf_session_t *ref = NULL, *cpu = NULL, *whole = NULL;
    if (!p || !one || tf_session_create(ctx, p, TF_TARGET_INTERP, 5, &ref) || tf_session_create(ctx, p, tf_default_target(), 5, &cpu) ||
        tf_session_create(ctx, one, TF_TARGET_INTERP, 5, &whole) || tf_session_set_comm(ref, comm) || tf_session_set_comm(cpu, comm)) {
        CHECK(0, "training sessions: %s", tf_context_last_error(ctx));
        goto out;
    }
    float x[B * F], X[16 * B * F];
    int64_t y[B], Y[16 * B];
    int64_t xs[2] = {B, F}, ys[1] = {B}, Xs[2] = {(int64_t)B * size, F}, Ys[1] = {(int64_t)B * size};
    for (int k = 0; k < STEPS; k++) {
        batch(rank, k, x, y);
        for (int r = 0; r < size; r++) batch(r, k, X + r * B * F, Y + r * B);
        bool ok = !tf_session_bind(ref, "x", TF_DTYPE_F32, xs, 2, x) && !tf_session_bind(ref, "y", TF_DTYPE_I64, ys, 1, y) &&
                  !tf_session_bind(cpu, "x", TF_DTYPE_F32, xs, 2, x) && !tf_session_bind(cpu, "y", TF_DTYPE_I64, ys, 1, y) &&
                  !tf_session_bind(whole, "x", TF_DTYPE_F32, Xs, 2, X) && !tf_session_bind(whole, "y", TF_DTYPE_I64, Ys, 1, Y) &&
                  !tf_session_run(ref) && !tf_session_run(cpu) && !tf_session_run(whole);
        CHECK(ok, "step %d: %s", k, tf_context_last_error(ctx));
        if (!ok) goto out;
    }
    size_t n, n2, n3;
    double *a = state_of(ref, p, &n), *c = state_of(cpu, p, &n2), *w = state_of(whole, one, &n3);
    CHECK(n == n2 && n == n3 && n > 0, "state sizes %zu %zu %zu", n, n2, n3);
    if (n == n2 && n == n3) {
        double e = rel_diff(c, a, n), e1 = rel_diff(a, w, n);
        CHECK(e <= 1e-5, "rank %d: cpu against the interpreter after %d data-parallel steps: relative L2 %.3g", rank, STEPS, e);
        if (getenv("DP_API_VERBOSE")) printf("rank %d: cpu-interp %.3g, dp-one %.3g\n", rank, e, e1);
        /* with batch norm the step differs from one process's (each rank's own statistics) but not by much */
        CHECK(bn ? e1 <= 0.2 && e1 > 1e-4 : e1 <= 1e-6, "rank %d: %s: against one process on the concatenated batch: relative L2 %.3g",
              rank, bn ? "batch norm" : "no batch norm", e1);
        /* every rank the same bits: rank 0's state broadcast and compared */
        double *r0 = malloc(n * sizeof *r0);
        memcpy(r0, c, n * sizeof *r0);
        CHECK(!tf_comm_broadcast(ctx, comm, r0, n * sizeof *r0, 0), "broadcast: %s", tf_context_last_error(ctx));
        CHECK(!memcmp(r0, c, n * sizeof *r0), "rank %d's cpu state differs from rank 0's", rank);
        memcpy(r0, a, n * sizeof *r0);
        CHECK(!tf_comm_broadcast(ctx, comm, r0, n * sizeof *r0, 0), "broadcast: %s", tf_context_last_error(ctx));
        CHECK(!memcmp(r0, a, n * sizeof *r0), "rank %d's interpreter state differs from rank 0's", rank);
        free(r0);
    }
    free(a), free(c), free(w);
    /* one process's program in a job of several ranks: refused, and why */
    tf_session_t *alone = NULL;
    if (!tf_session_create(ctx, one, tf_default_target(), 5, &alone)) {
        tf_status st = tf_session_set_comm(alone, comm);
        CHECK(size == 1 ? st == TF_OK : st == TF_ERR_INVALID_ARG && strstr(tf_context_last_error(ctx), "without data_parallel"),
              "set_comm on a program without data_parallel: %d %s", (int)st, tf_context_last_error(ctx));
    }
    tf_session_free(alone);
out:
    tf_session_free(ref), tf_session_free(cpu), tf_session_free(whole);
    tf_program_free(p), tf_program_free(one);
}

/* Dropout: every rank draws its own masks (the same input, different rows dropped), rank 0 those of a
 * session without a communicator; the initial params are the seed's on every rank. */
static void dropout_masks(tf_context_t *ctx, tf_comm_t *comm, int rank, int size)
{
    const char *text = "input x : f32[8, 16]\nparam w : f32[16] = uniform()\nd = dropout(x, p=0.5)\ny = mul(d, w)\n"
                       "loss = mean(y, axes=[0, 1])\noutput loss\noutput d\ntrain {\n  optimizer = sgd(lr=0.1)\n  precision = fp32\n}\n";
    tf_program_t *p = compile(ctx, text, 0, TF_MODE_TRAIN, true, NULL);
    tf_session_t *s = NULL, *alone = NULL;
    float x[128], w0[16], wr[16 * 16];
    for (int i = 0; i < 128; i++) x[i] = 1.0f + (float)i;
    int64_t shape[2] = {8, 16};
    tf_tensor_view d, a, wv = {.data = w0};
    if (!p || tf_session_create(ctx, p, tf_default_target(), 9, &s) || tf_session_create(ctx, p, tf_default_target(), 9, &alone) ||
        tf_session_get_state(s, "w", &wv, sizeof w0) || tf_session_set_comm(s, comm) ||
        tf_session_bind(s, "x", TF_DTYPE_F32, shape, 2, x) || tf_session_bind(alone, "x", TF_DTYPE_F32, shape, 2, x) ||
        tf_session_run(s) || tf_session_run(alone) || tf_session_output(s, "d", &d) || tf_session_output(alone, "d", &a)) {
        CHECK(0, "dropout sessions: %s", tf_context_last_error(ctx));
    } else {
        uint64_t h = 1469598103934665603ull, all[16] = {0};
        for (int i = 0; i < 128; i++) h = (h ^ (((const float *)d.data)[i] != 0)) * 1099511628211ull;
        CHECK(!tf_comm_allgather(ctx, comm, &h, all, sizeof h), "allgather: %s", tf_context_last_error(ctx));
        CHECK(!tf_comm_allgather(ctx, comm, w0, wr, sizeof w0), "allgather: %s", tf_context_last_error(ctx));
        for (int r = 1; r < size && r < 16; r++) {
            CHECK(all[r] != all[0], "ranks 0 and %d dropped the same elements of the same input", r);
            CHECK(!memcmp(wr + 16 * r, wr, sizeof w0), "rank %d's initial params differ from rank 0's", r);
        }
        CHECK(rank != 0 || !memcmp(d.data, a.data, sizeof x), "rank 0's dropout is not a single session's");
    }
    tf_session_free(s), tf_session_free(alone);
    tf_program_free(p);
}

int main(void)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_comm_t *comm = NULL;
    if (tf_comm_create_mpi(ctx, NULL, &comm)) {
        fprintf(stderr, "%s\n", tf_context_last_error(ctx));
        return 1;
    }
    int rank = tf_comm_rank(comm), size = tf_comm_size(comm);
    CHECK(size >= 2 && size <= 16, "a job of %d ranks", size);
    int ranks[16] = {0};
    CHECK(!tf_comm_allgather(ctx, comm, &rank, ranks, sizeof rank), "allgather: %s", tf_context_last_error(ctx));
    for (int r = 0; r < size && r < 16; r++) CHECK(ranks[r] == r, "allgather: slot %d holds %d", r, ranks[r]);
    the_op(ctx, comm, rank, size);
    training(ctx, comm, rank, size, model_bn, true);
    training(ctx, comm, rank, size, model_plain, false);
    dropout_masks(ctx, comm, rank, size);
    tf_comm_totals t;
    tf_comm_stats(comm, &t);
    CHECK(t.bytes_reduced > 0 && t.comm_ms > 0, "totals: %lld bytes, %.3f ms", (long long)t.bytes_reduced, t.comm_ms);
    tf_comm_free(comm);
    tf_context_free(ctx);
    printf("rank %d of %d: ", rank, size);
    return check_report();
}
