/* test_cuda_attention.c — flash_attention and flash_attention_grad run as
 * the cuda target's generated kernels (codegen/cuda_attention.c), on
 * cuda-emu, and compute what the interpreter computes (ir/attention.c).
 *
 * Each case is a small model compiled once and run by two sessions with the
 * same seed and the same random inputs: the interpreter (float64) and
 * cuda-emu. Inference cases compare every output; training cases take one
 * SGD step (lr = 1, no momentum) on params q, k, v and a loss sum(O * w),
 * so each param's change is minus its gradient: the loss and the three
 * gradients are compared. The shapes cover odd lengths (13), cross
 * attention (7 queries, 19 keys), grouped-query heads (H = 4 over Hk = 2
 * and Hk = 1), a bool key-padding mask [B, 1, 1, Tk] whose last batch
 * masks every key (rows that see nothing: O = 0, the log-sum-exp -inf, no
 * gradient), an additive mask [1, H, Tq, Tk] broadcast over the batch
 * (with -inf entries), causal masks, head dims 16, 80 and 256 (and
 * Dv != D), f32, bf16, f16 and f64 storage, dropout p = 0.3 in train mode
 * (the interpreter's draw) and a hand-written flash_attention with dropout
 * in infer mode (no dropout: the interpreter's rule). Every case demands no
 * host fallback, and a second run of the same inputs gives the same bits
 * (no atomics). Where NVRTC loads, every distinct attention kernel also
 * compiles for sm_80 without a warning.
 *
 * Tolerances, elementwise on the tensor's scale (|got - want| <= tol
 * (|want| + 0.05 max |want|)): f32 1e-4 (the kernels sum in float, the
 * interpreter in double) and f64 1e-9, every element within it. bf16 1/64
 * and f16 1/512 (two units in the last place: a sum in float rather than
 * double may round to the neighbouring 16-bit number) hold in relative L2,
 * and no element may pass 4 x its bound, test_gpu's rule for 16-bit steps:
 * for 16-bit storage the probabilities that multiply v are rounded to 16
 * bits (ir/attention.c), the kernel's against the running max of an online
 * softmax, the interpreter's against the row's max, so where a later key
 * tile raises the max the two differ by one 16-bit rounding of P_ij, and
 * an output that nearly cancels (sum P v with v of either sign) can move
 * several 16-bit units of itself. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda.h"
#include "cuda_libs.h"
#include "runtime.h"
#include "testutil.h"
#include "tfuse.h"

static const uint64_t g_seed = 20250611;

typedef struct acase {
    const char *label;
    const char *text;
    tf_mode mode;
    const char *precision;   /* NULL: the model's */
    double tol;
    bool lowp;               /* 16-bit storage: held to tol in relative L2, no element past 4 x its bound */
    int mma;                 /* which kernels run on tensor cores (mma.sync), the others scalar: MMA_FWD, MMA_BWD */
} acase;

enum { MMA_FWD = 1, MMA_BWD = 2 };

#define SGD "train {\n  optimizer = sgd(lr=1.0)\n}\n"

static const acase g_cases[] = {
    /* grouped-query heads, causal, 67 rows (5 query tiles, 2 key tiles); a hand-written flash_attention, and one
     * with dropout in infer mode */
    {"f32 gqa causal T=67 D=16",
     "input q : f32[2, 4, 67, 16]\ninput k : f32[2, 2, 67, 16]\ninput v : f32[2, 2, 67, 16]\n"
     "a = attention(q, k, v, causal=true)\nb = flash_attention(q, k, v, scale=0.3)\n"
     "c = flash_attention(q, k, v, scale=0.25, causal=true, dropout=0.3, salt=3)\noutput a\noutput b\noutput c\n",
     TF_MODE_INFER, NULL, 1e-4, false, 0},
    /* cross attention, one key/value head, key padding with a batch that sees nothing; lse's -inf */
    {"f32 cross mqa key padding Tq=7 Tk=19 D=80",
     "input q : f32[2, 4, 7, 80]\ninput k : f32[2, 1, 19, 80]\ninput v : f32[2, 1, 19, 80]\ninput keep : bool[2, 1, 1, 19]\n"
     "a = attention(q, k, v, keep)\nf = flash_attention(q, k, v, keep, scale=0.125, lse=true)\noutput a\noutput f\n",
     TF_MODE_INFER, NULL, 1e-4, false, 0},
    /* an additive mask over heads and positions, broadcast over the batch, with causal; the widest head dim */
    {"bf16 additive mask causal D=256",
     "input q : bf16[2, 2, 13, 256]\ninput k : bf16[2, 2, 13, 256]\ninput v : bf16[2, 2, 13, 256]\ninput bias : f32[1, 2, 13, 13]\n"
     "a = attention(q, k, v, bias, causal=true)\noutput a\n",
     TF_MODE_INFER, NULL, 1.0 / 64, true, 0},
    /* f16 storage, bool mask and causal together, Dv != D, over two key tiles */
    {"f16 bool mask causal T=67 D=16 Dv=24",
     "input q : f16[2, 4, 67, 16]\ninput k : f16[2, 4, 67, 16]\ninput v : f16[2, 4, 67, 24]\ninput keep : bool[2, 1, 1, 67]\n"
     "a = attention(q, k, v, keep, causal=true)\noutput a\n",
     TF_MODE_INFER, NULL, 1.0 / 512, true, 0},
    {"f64 causal T=9 D=16",
     "input q : f64[1, 2, 9, 16]\ninput k : f64[1, 2, 9, 16]\ninput v : f64[1, 2, 9, 16]\n"
     "a = flash_attention(q, k, v, scale=0.25, causal=true)\noutput a\n",
     TF_MODE_INFER, NULL, 1e-9, false, 0},
    /* the tensor-core forward: grouped-query heads, causal, 67 rows (two query tiles of 64, key tiles of 64), the
     * log-sum-exp */
    {"bf16 mma gqa causal lse T=67 D=64",
     "input q : bf16[2, 4, 67, 64]\ninput k : bf16[2, 2, 67, 64]\ninput v : bf16[2, 2, 67, 64]\n"
     "a = attention(q, k, v, causal=true)\nf = flash_attention(q, k, v, scale=0.125, causal=true, lse=true)\noutput a\noutput f\n",
     TF_MODE_INFER, NULL, 1.0 / 64, true, MMA_FWD},
    /* cross attention with key padding (a batch that sees nothing), Dv != D, one key/value head */
    {"f16 mma cross mqa key padding Tq=7 Tk=19 D=32 Dv=48",
     "input q : f16[2, 4, 7, 32]\ninput k : f16[2, 1, 19, 32]\ninput v : f16[2, 1, 19, 48]\ninput keep : bool[2, 1, 1, 19]\n"
     "a = attention(q, k, v, keep)\nf = flash_attention(q, k, v, keep, scale=0.2, lse=true)\noutput a\noutput f\n",
     TF_MODE_INFER, NULL, 1.0 / 512, true, MMA_FWD},
    /* head dim 128 (key tiles of 32: three of them), an additive mask with -inf entries over heads and positions */
    {"bf16 mma additive mask T=70 D=128",
     "input q : bf16[1, 2, 70, 128]\ninput k : bf16[1, 2, 70, 128]\ninput v : bf16[1, 2, 70, 128]\ninput bias : f32[1, 2, 70, 70]\n"
     "a = attention(q, k, v, bias)\noutput a\n",
     TF_MODE_INFER, NULL, 1.0 / 64, true, MMA_FWD},
    /* training: the forward with its log-sum-exp, then flash_attention_grad */
    {"train f32 gqa causal dropout T=67 D=16",
     "input w : f32[2, 4, 67, 16]\nparam q : f32[2, 4, 67, 16] = normal()\nparam k : f32[2, 2, 67, 16] = normal()\n"
     "param v : f32[2, 2, 67, 16] = normal()\na = attention(q, k, v, causal=true, dropout=0.3, salt=5)\n"
     "s = mul(a, w)\nloss = sum(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, NULL, 1e-4, false, 0},
    {"train f32 cross mqa key padding Tq=7 Tk=19 D=80",
     "input w : f32[2, 4, 7, 80]\ninput keep : bool[2, 1, 1, 19]\nparam q : f32[2, 4, 7, 80] = normal()\n"
     "param k : f32[2, 1, 19, 80] = normal()\nparam v : f32[2, 1, 19, 80] = normal()\na = attention(q, k, v, keep)\n"
     "s = mul(a, w)\nloss = sum(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, NULL, 1e-4, false, 0},
    {"train bf16 additive mask causal D=256",
     "input w : f32[2, 2, 13, 256]\ninput bias : f32[1, 2, 13, 13]\nparam q : f32[2, 2, 13, 256] = normal()\n"
     "param k : f32[2, 2, 13, 256] = normal()\nparam v : f32[2, 2, 13, 256] = normal()\n"
     "a = attention(q, k, v, bias, causal=true)\ns = mul(a, w)\nloss = sum(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, "bf16", 1.0 / 64, true, 0},
    /* a mean, so that dO (the loss scale, 65536, times w / 1664) fits f16 */
    {"train f16 gqa causal dropout T=13 D=16",
     "input w : f32[2, 4, 13, 16]\nparam q : f32[2, 4, 13, 16] = normal()\nparam k : f32[2, 1, 13, 16] = normal()\n"
     "param v : f32[2, 1, 13, 16] = normal()\na = attention(q, k, v, causal=true, dropout=0.3, salt=9)\n"
     "s = mul(a, w)\nloss = mean(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, "fp16", 1.0 / 512, true, MMA_FWD},
    /* both directions on tensor cores: dO in bf16 (a matmul reads the attention), grouped-query heads, causal, dropout,
     * two key tiles and three query tiles of the backward's first kernel */
    {"train bf16 mma both gqa causal dropout T=67 D=32",
     "input w : f32[2, 4, 67, 16]\nparam q : f32[2, 4, 67, 32] = normal()\nparam k : f32[2, 2, 67, 32] = normal()\n"
     "param v : f32[2, 2, 67, 32] = normal()\nparam p : f32[32, 16] = normal()\n"
     "a = attention(q, k, v, causal=true, dropout=0.3, salt=5)\no = matmul(a, p)\n"
     "s = mul(o, w)\nloss = sum(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, "bf16", 1.0 / 64, true, MMA_FWD | MMA_BWD},
    /* cross attention with key padding (a batch that sees nothing: no gradient), Dv != D, f16 (a mean, so that dO fits) */
    {"train f16 mma both cross mqa key padding Tq=7 Tk=19 D=16 Dv=32",
     "input w : f32[2, 4, 7, 16]\ninput keep : bool[2, 1, 1, 19]\nparam q : f32[2, 4, 7, 16] = normal()\n"
     "param k : f32[2, 1, 19, 16] = normal()\nparam v : f32[2, 1, 19, 32] = normal()\nparam p : f32[32, 16] = normal()\n"
     "a = attention(q, k, v, keep)\no = matmul(a, p)\ns = mul(o, w)\nloss = mean(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, "fp16", 1.0 / 512, true, MMA_FWD | MMA_BWD},
    /* an additive mask with -inf entries broadcast over the batch, head dim 64, 70 rows (3 query tiles of the first
     * kernel, 2 key tiles) */
    {"train bf16 mma both additive mask T=70 D=64",
     "input w : f32[2, 2, 70, 16]\ninput bias : f32[1, 2, 70, 70]\nparam q : f32[2, 2, 70, 64] = normal()\n"
     "param k : f32[2, 2, 70, 64] = normal()\nparam v : f32[2, 2, 70, 64] = normal()\nparam p : f32[64, 16] = normal()\n"
     "a = attention(q, k, v, bias)\no = matmul(a, p)\ns = mul(o, w)\nloss = sum(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, "bf16", 1.0 / 64, true, MMA_FWD | MMA_BWD},
    /* the tensor-core forward with dropout, under the scalar backward (dO in f32) */
    {"train bf16 mma gqa causal dropout T=67 D=32",
     "input w : f32[2, 4, 67, 32]\nparam q : f32[2, 4, 67, 32] = normal()\nparam k : f32[2, 2, 67, 32] = normal()\n"
     "param v : f32[2, 2, 67, 32] = normal()\na = attention(q, k, v, causal=true, dropout=0.3, salt=5)\n"
     "s = mul(a, w)\nloss = sum(s, axes=[0, 1, 2, 3])\noutput loss\n" SGD,
     TF_MODE_TRAIN, "bf16", 1.0 / 64, true, MMA_FWD},
};

/* ---- comparing ---- */

/* The worst error as a multiple of what is allowed: |got - want| <= tol (|want| + 0.05 max |want|), NaN matching
 * NaN and infinities equal (INFINITY where not). */
static double worst_error(tf_dt gt, const void *got, tf_dt wt, const void *want, int64_t n, double tol)
{
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = tf_elem_load(wt, want, i);
        if (isfinite(w) && fabs(w) > scale) scale = fabs(w);
    }
    for (int64_t i = 0; i < n; i++) {
        double g = tf_elem_load(gt, got, i), w = tf_elem_load(wt, want, i);
        if (!isfinite(g) || !isfinite(w)) {
            if (!((isnan(g) && isnan(w)) || g == w)) return INFINITY;
            continue;
        }
        double r = fabs(g - w) / (tol * (fabs(w) + 0.05 * scale) + 1e-300);
        if (r > worst) worst = r;
    }
    return worst;
}

/* sqrt(sum (got - want)^2 / sum want^2), equal infinities left out. */
static double rel_l2(tf_dt gt, const void *got, tf_dt wt, const void *want, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = tf_elem_load(gt, got, i), w = tf_elem_load(wt, want, i);
        if (g == w) continue;
        num += (g - w) * (g - w);
        den += w * w;
    }
    return num == 0 ? 0 : den > 0 ? sqrt(num / den) : INFINITY;
}

/* Whether got is within the case's tolerance of want (the worst element's error and the relative L2 error into *worst,
 * *l2). */
static bool close_enough(const acase *c, tf_dt gt, const void *got, tf_dt wt, const void *want, int64_t n, double *worst, double *l2)
{
    *worst = worst_error(gt, got, wt, want, n, c->tol);
    *l2 = rel_l2(gt, got, wt, want, n);
    return c->lowp ? *l2 <= c->tol && *worst <= 4 : *worst <= 1;
}

static int64_t numel_of(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int a = 0; a < rank; a++) n *= shape[a];
    return n;
}

/* ---- a case ---- */

typedef struct run {
    tf_context_t *ctx;
    tf_model_t *m;
    tf_program_t *p;
    tf_session_t *ref, *dev;
    void *data[8];
} run;

static void run_free(run *r)
{
    for (int i = 0; i < 8; i++) free(r->data[i]);
    tf_session_free(r->ref);
    tf_session_free(r->dev);
    tf_program_free(r->p);
    tf_model_free(r->m);
    tf_context_free(r->ctx);
}

/* An input's data: floats in [-2, 2] (an additive mask `bias`: one entry in 8 -inf), bool masks true 3 times in 4
 * but all false in the last batch. */
static void *input_data(const char *name, tf_dtype dt, int rank, const int64_t *shape, uint64_t *s)
{
    int64_t n = numel_of(rank, shape), per_batch = n / shape[0];
    void *d = calloc((size_t)n, (size_t)tf_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        double u = test_rnd(s), x;
        if (dt == TF_DTYPE_BOOL) x = i / per_batch == shape[0] - 1 ? 0 : u < 0.75;
        else if (!strcmp(name, "bias") && u < 0.125) x = -INFINITY;
        else x = 4 * test_rnd(s) - 2;
        tf_elem_store((tf_dt)dt, d, i, x);
    }
    return d;
}

static bool run_make(run *r, const acase *c)
{
    memset(r, 0, sizeof *r);
    tf_context_create(&r->ctx);
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = c->mode;
    o.target = TF_TARGET_CUDA_EMU;
    if (c->precision) tf_precision_parse(c->precision, &o.precision);
    if (tf_model_parse_string(r->ctx, c->label, c->text, strlen(c->text), NULL, 0, &r->m) || tf_program_compile(r->ctx, r->m, &o, &r->p) ||
        tf_session_create(r->ctx, r->p, TF_TARGET_INTERP, g_seed, &r->ref) ||
        tf_session_create(r->ctx, r->p, TF_TARGET_CUDA_EMU, g_seed, &r->dev)) {
        CHECK(0, "%s: %s", c->label, tf_context_last_error(r->ctx));
        return false;
    }
    uint64_t s = g_seed;
    for (size_t i = 0; i < tf_program_io_count(r->p, TF_IO_INPUT) && i < 8; i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8];
        tf_program_io(r->p, TF_IO_INPUT, i, &name, &dt, &rank, shape);
        r->data[i] = input_data(name, dt, rank, shape, &s);
        if (tf_session_bind(r->ref, name, dt, shape, rank, r->data[i]) || tf_session_bind(r->dev, name, dt, shape, rank, r->data[i])) {
            CHECK(0, "%s: bind %s: %s", c->label, name, tf_context_last_error(r->ctx));
            return false;
        }
    }
    return true;
}

/* Every output of both sessions; the device's bytes of output 0 into *keep (malloc'd) when keep. */
static void compare_outputs(run *r, const acase *c, void **keep, size_t *keep_bytes)
{
    for (size_t i = 0; i < tf_program_io_count(r->p, TF_IO_OUTPUT); i++) {
        const char *name;
        tf_tensor_view a, b;
        tf_program_io(r->p, TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
        if (tf_session_output(r->ref, name, &a) || tf_session_output(r->dev, name, &b)) {
            CHECK(0, "%s: output %s: %s", c->label, name, tf_context_last_error(r->ctx));
            continue;
        }
        int64_t n = numel_of(a.rank, a.shape);
        double e, l2;
        CHECK(close_enough(c, (tf_dt)b.dtype, b.data, (tf_dt)a.dtype, a.data, n, &e, &l2),
              "%s: output %s (%s): error %.3g x the element tolerance %.3g, relative L2 error %.3g", c->label, name,
              tf_dtype_str(a.dtype), e, c->tol, l2);
        printf("  %-48s output %-4s %-4s worst %.3f x tol, relative L2 %.2g\n", c->label, name, tf_dtype_str(a.dtype), e, l2);
        if (keep && i == 0) {
            *keep_bytes = (size_t)n * (size_t)tf_dtype_size(b.dtype);
            *keep = malloc(*keep_bytes);
            memcpy(*keep, b.data, *keep_bytes);
        }
    }
}

/* A param's values from a session (malloc'd doubles). */
static double *state_of(run *r, tf_session_t *s, const char *name, int64_t *n)
{
    tf_tensor_view v = {0};
    tf_session_get_state(s, name, &v, 0);
    *n = numel_of(v.rank, v.shape);
    size_t bytes = (size_t)*n * (size_t)tf_dtype_size(v.dtype);
    v.data = malloc(bytes);
    double *out = malloc((size_t)*n * sizeof *out);
    if (tf_session_get_state(s, name, &v, bytes)) CHECK(0, "state %s: %s", name, tf_context_last_error(r->ctx));
    for (int64_t i = 0; i < *n; i++) out[i] = tf_elem_load((tf_dt)v.dtype, v.data, i);
    free(v.data);
    return out;
}

/* A training step: the loss, and each param's change (minus its gradient) on both sessions. */
static void train_case(run *r, const acase *c)
{
    static const char *params[] = {"q", "k", "v"};
    double *before[3][2];
    int64_t n[3];
    for (int p = 0; p < 3; p++)
        for (int s = 0; s < 2; s++) before[p][s] = state_of(r, s ? r->dev : r->ref, params[p], &n[p]);
    if (tf_session_run(r->ref) || tf_session_run(r->dev)) {
        CHECK(0, "%s: run: %s", c->label, tf_context_last_error(r->ctx));
    } else {
        compare_outputs(r, c, NULL, NULL);
        for (int p = 0; p < 3; p++) {
            double *after[2], *grad[2];
            for (int s = 0; s < 2; s++) {
                after[s] = state_of(r, s ? r->dev : r->ref, params[p], &n[p]);
                grad[s] = malloc((size_t)n[p] * sizeof(double));
                for (int64_t i = 0; i < n[p]; i++) grad[s][i] = before[p][s][i] - after[s][i];
            }
            CHECK(!memcmp(before[p][0], before[p][1], (size_t)n[p] * sizeof(double)), "%s: %s starts equal", c->label, params[p]);
            double e, l2, big = 0;
            bool ok = close_enough(c, TF_DT_F64, grad[1], TF_DT_F64, grad[0], n[p], &e, &l2);
            for (int64_t i = 0; i < n[p]; i++) big = fmax(big, fabs(grad[0][i]));
            CHECK(ok && big > 0, "%s: gradient of %s: error %.3g x the element tolerance %.3g, relative L2 error %.3g (largest %.3g)",
                  c->label, params[p], e, c->tol, l2, big);
            printf("  %-48s grad   d%-3s      worst %.3f x tol, relative L2 %.2g\n", c->label, params[p], e, l2);
            for (int s = 0; s < 2; s++) free(after[s]), free(grad[s]);
        }
    }
    for (int p = 0; p < 3; p++)
        for (int s = 0; s < 2; s++) free(before[p][s]);
}

/* The attention kernels of the program: generated (no host fallback); their sources gathered for NVRTC. */
static void check_plan(run *r, const acase *c, tf_cuda_kernel *srcs, int *nsrc, int cap)
{
    const tf_kernel_plan *plan = NULL;
    if (tf_program_plan(r->ctx, r->p, &plan)) {
        CHECK(0, "%s: plan: %s", c->label, tf_context_last_error(r->ctx));
        return;
    }
    int fwd = 0, bwd = 0;
    for (int i = 0; i < plan->nkernels; i++) {
        const tf_kernel *k = &plan->kernels[i];
        if (!k->lib || tf_op_exec_of(k->lib->op) != TF_OPX_ATTENTION) continue;
        char why[256] = "";
        CHECK(tf_cuda_library_supports(k, why, sizeof why), "%s: %s has a generated kernel: %s", c->label, k->name, why);
        fwd += k->lib->op == TF_OP_FLASH_ATTENTION, bwd += k->lib->op == TF_OP_FLASH_ATTENTION_GRAD;
        tf_cuda_kernel ck;
        tf_diag d = {0};
        if (tf_cuda_emit_library_mode(k, c->mode == TF_MODE_TRAIN ? TF_IR_TRAIN : TF_IR_INFER, &ck, &d)) {
            CHECK(0, "%s: %s: %s", c->label, k->name, d.msg);
            continue;
        }
        bool grad = k->lib->op == TF_OP_FLASH_ATTENTION_GRAD;
        CHECK(ck.library && ck.block == 128 && ck.smem > 0 && ck.smem <= 48 * 1024 && ck.shape == TF_CUDA_ATTENTION &&
                  !ck.name2[0] == !grad && (!grad || (ck.smem2 == ck.smem && ck.block2 == 128 && ck.grid2 >= 1)),
              "%s: %s: geometry grid %u block %u smem %u, second entry '%s'", c->label, k->name, ck.grid, ck.block, ck.smem, ck.name2);
        bool drop = tf_node_float(k->lib, "dropout") > 0 && c->mode == TF_MODE_TRAIN;
        CHECK(ck.rng == drop && !strstr(ck.src, "atomic"), "%s: %s: rng %d, no atomics", c->label, k->name, ck.rng);
        bool mma = strstr(ck.src, "mma.sync.aligned.m16n8k16") != NULL;
        CHECK(mma == !!(c->mma & (grad ? MMA_BWD : MMA_FWD)), "%s: %s: %s kernel", c->label, k->name, mma ? "a tensor-core" : "a scalar");
        bool seen = false;
        for (int j = 0; j < *nsrc && !seen; j++) seen = !strcmp(srcs[j].name, ck.name);
        if (!seen && *nsrc < cap) srcs[(*nsrc)++] = ck;
        else tf_cuda_kernel_free(&ck);
    }
    CHECK(fwd >= 1 && bwd == (c->mode == TF_MODE_TRAIN), "%s: %d flash_attention, %d flash_attention_grad kernels", c->label, fwd, bwd);
}

static void one_case(const acase *c, tf_cuda_kernel *srcs, int *nsrc, int cap)
{
    run r;
    if (!run_make(&r, c)) {
        run_free(&r);
        return;
    }
    check_plan(&r, c, srcs, nsrc, cap);
    if (c->mode == TF_MODE_TRAIN) {
        train_case(&r, c);
    } else if (tf_session_run(r.ref) || tf_session_run(r.dev)) {
        CHECK(0, "%s: run: %s", c->label, tf_context_last_error(r.ctx));
    } else {
        void *first = NULL;
        size_t bytes = 0;
        compare_outputs(&r, c, &first, &bytes);
        tf_tensor_view again;
        const char *name;
        tf_program_io(r.p, TF_IO_OUTPUT, 0, &name, NULL, NULL, NULL);
        CHECK(first && !tf_session_run(r.dev) && !tf_session_output(r.dev, name, &again) && !memcmp(first, again.data, bytes),
              "%s: a second run gives the same bits", c->label);
        free(first);
    }
    tf_session_info info;
    CHECK(!tf_session_get_info(r.dev, &info) && info.fallbacks == 0, "%s: no kernel runs on the host (%d fallbacks)", c->label,
          info.fallbacks);
    run_free(&r);
}

/* Every distinct attention source compiles for sm_80 without a warning, where NVRTC loads. */
static void nvrtc_compiles(tf_cuda_kernel *srcs, int nsrc)
{
    tf_cuda_libs libs;
    char err[4096];
    if (tf_cuda_libs_load(&libs, TF_CUDA_LIB_NVRTC, NULL, err, sizeof err)) {
        printf("SKIPPED: the NVRTC compiles (no NVRTC here): %.200s\n", err);
        return;
    }
    tf_nvrtc_job jobs[32];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < nsrc; i++) jobs[i] = (tf_nvrtc_job){.src = srcs[i].src, .name = srcs[i].name, .arch = "sm_80"};
    tf_nvrtc_compile_jobs(&libs, jobs, nsrc, 0);
    for (int i = 0; i < nsrc; i++) {
        bool warns = jobs[i].log && (strstr(jobs[i].log, "warning") || strstr(jobs[i].log, "Warning"));
        CHECK(jobs[i].status == TF_CUDA_OK && !warns, "%s compiles for sm_80 without a warning: %s\n%s", jobs[i].name, jobs[i].err,
              jobs[i].log ? jobs[i].log : "");
        tf_nvrtc_job_free(&jobs[i]);
    }
    printf("nvrtc: %d distinct attention kernels compiled for sm_80\n", nsrc);
    tf_cuda_libs_free(&libs);
}

/* What the cuda target says it runs the ops with. */
static void op_support(void)
{
    static const char *const ops[] = {"flash_attention", "flash_attention_grad"};
    tf_context_t *ctx;
    tf_context_create(&ctx);
    for (int i = 0; i < 2; i++) {
        const char *how = NULL;
        char why[1024] = "";
        CHECK(!tf_target_op_support(ctx, TF_TARGET_CUDA, ops[i], &how, why, sizeof why) && how && !strcmp(how, "jit") &&
                  strstr(why, "generated flash-attention kernel"),
              "cuda: %s runs as the generated flash-attention kernel (%s: %s)", ops[i], how ? how : "NULL", why);
    }
    tf_context_free(ctx);
}

int main(void)
{
    if (!getenv("TFUSE_CACHE_DIR")) setenv("TFUSE_CACHE_DIR", "emu-cache", 1);   /* the compiled kernels, beside the tests */
    const char *why = tf_backend_for(TF_TARGET_CUDA_EMU) ? tf_backend_for(TF_TARGET_CUDA_EMU)->unavailable() : "no cuda-emu backend";
    if (why) {
        printf("SKIPPED: cuda-emu cannot run here: %s\n", why);
        return 0;
    }
    tf_cuda_kernel srcs[32];
    int nsrc = 0;
    for (size_t i = 0; i < sizeof g_cases / sizeof *g_cases; i++) one_case(&g_cases[i], srcs, &nsrc, 32);
    nvrtc_compiles(srcs, nsrc);
    op_support();
    for (int i = 0; i < nsrc; i++) tf_cuda_kernel_free(&srcs[i]);
    return check_report();
}
