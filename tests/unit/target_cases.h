/* target_cases.h — what the target tests (tests/unit/test_cpu.c for cpu,
 * tests/gpu/test_gpu.c for cuda) share: the models every target must compute
 * as the interpreter does, and how results are compared with it.
 *
 * The models cover every op family at odd sizes (1, primes, not multiples of
 * a vector width): every pointwise op, reductions (short rows, long rows,
 * columns), norms, GEMMs batched/transposed/broadcast, conv with stride,
 * padding, dilation, groups and bias, pooling, layout ops, gathers,
 * attention, losses; the training ones take one optimizer step, so every
 * backward kernel, the optimizers and dropout are in it. Inference models are
 * written in f32; a test narrows them to bf16/f16 to check 16-bit storage. */
#ifndef TF_TESTS_TARGET_CASES_H
#define TF_TESTS_TARGET_CASES_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "autodiff.h"
#include "runtime.h"
#include "tfuse.h"

typedef struct target_case {
    const char *label, *text;
    tf_mode mode;
} target_case;

#define TC_TRAIN_SGD "train {\n  optimizer = sgd(lr=0.1, momentum=0.9)\n}\n"

static const target_case target_cases[] = {
    {"unary", "input x : f32[7, 13]\n"
     "a = neg(x)\nb = abs(x)\nc = exp(x)\nl1 = add(b, 1.0)\nd = log(l1)\ne = sqrt(b)\nf = rsqrt(l1)\ng = tanh(x)\n"
     "h = sigmoid(x)\ni = relu(x)\nj = sin(x)\nk = cos(x)\nm = erf(x)\nn = silu(x)\no = gelu(x)\n"
     "output a\noutput b\noutput c\noutput d\noutput e\noutput f\noutput g\noutput h\noutput i\noutput j\noutput k\n"
     "output m\noutput n\noutput o\n", TF_MODE_INFER},
    {"binary", "input x : f32[3, 1, 17]\ninput y : f32[5, 17]\nb = abs(x)\nl = add(b, 0.5)\n"
     "a = sub(x, y)\nc = div(x, l)\nd = pow(l, y)\ne = maximum(x, y)\nf = minimum(x, y)\ng = lt(x, y)\n"
     "h = where(g, x, y)\ni = ge(x, 0.25)\nj = cast(i, to=f32)\nk = mul(j, y)\n"
     "output a\noutput c\noutput d\noutput e\noutput f\noutput h\noutput k\n", TF_MODE_INFER},
    {"reductions", "input x : f32[5, 1, 19]\n"
     "a = reduce_sum(x, axes=[2])\nb = reduce_mean(x, axes=[0], keepdims=true)\nc = reduce_max(x, axes=[0, 2])\n"
     "d = sum(x, axes=[0, 1, 2])\ne = softmax(x)\nf = log_softmax(x, axis=0)\ng = max(x, axes=[1, 2])\n"
     "output a\noutput b\noutput c\noutput d\noutput e\noutput f\noutput g\n", TF_MODE_INFER},
    /* reductions long enough to be split over blocks (cuda: a block per share, the last folds the partials) */
    /* ... and column reductions over few 32-wide tiles and many rows (cuda: the rows split too) */
    {"long reductions", "input x : f32[3, 70000]\ninput y : f32[300, 260]\ninput z : f32[4100, 40]\ninput w : f32[3, 1500, 70]\n"
     "a = reduce_sum(x, axes=[1])\nb = reduce_max(y, axes=[0, 1])\nc = reduce_mean(y, axes=[0, 1])\n"
     "d = reduce_sum(z, axes=[0])\ne = reduce_max(z, axes=[0])\nf = reduce_mean(w, axes=[0, 1])\n"
     "output a\noutput b\noutput c\noutput d\noutput e\noutput f\n", TF_MODE_INFER},
    {"gemm", "input a : f32[3, 7, 5]\ninput b : f32[5, 11]\ninput c : f32[1, 11, 5]\ninput d : f32[7, 3]\n"
     "x = matmul(a, b)\ny = matmul(a, c, transpose_b=true)\nz = matmul(d, a, transpose_a=true)\n"
     "output x\noutput y\noutput z\n", TF_MODE_INFER},
    {"gemm, larger and batched", "input a : f32[4, 67, 96]\ninput b : f32[96, 130]\ninput c : f32[4, 130, 96]\n"
     "input d : f32[2, 1, 33, 40]\ninput e : f32[3, 40, 24]\n"
     "x = matmul(a, b)\ny = matmul(a, c, transpose_b=true)\nz = matmul(d, e)\nt = matmul(a, a, transpose_a=true)\n"
     "output x\noutput y\noutput z\noutput t\n", TF_MODE_INFER},
    {"conv", "input x : f32[2, 4, 7, 6]\ninput w : f32[6, 2, 3, 3]\ninput b : f32[6]\n"
     "y = conv2d(x, w, b, stride=2, padding=1, dilation=[1, 2], groups=2)\nz = conv2d(x, w, padding=[0, 1], groups=2)\n"
     "output y\noutput z\n", TF_MODE_INFER},
    {"pool and layout", "input x : f32[2, 3, 7, 5]\n"
     "a = maxpool2d(x, kernel=3, stride=2, padding=1)\nb = avgpool2d(x, kernel=2)\nc = global_avgpool(x)\n"
     "d = transpose(x, perm=[3, 1, 0, 2])\ne = slice(x, axis=2, start=1, end=-1, step=2)\nf = concat(x, x, axis=1)\n"
     "g = broadcast(c, shape=[5, 2, 3])\nh = reshape(x, shape=[6, 35])\nk = flatten(x)\n"
     "output a\noutput b\noutput c\noutput d\noutput e\noutput f\noutput g\noutput h\noutput k\n", TF_MODE_INFER},
    {"gather and norms", "input i : i64[3, 5]\ninput t : f32[11, 7]\ninput g : f32[7]\ninput bb : f32[7]\n"
     "e = embedding(i, t)\nn = layernorm(e, g, bb)\no = one_hot(i, depth=11)\nr = gather(i, t)\n"
     "output n\noutput o\noutput r\n", TF_MODE_INFER},
    /* reductions fused with broadcast operands: each operand is read along the
     * axes of the reduced result it meets (the cpu and CUDA kernels once read
     * t[3] along the reduced axis, and only t[0]); g2 is read along the axis
     * NumPy aligns it with, not the one it was reduced onto, so it cannot
     * share the reduction's kernel */
    {"reductions with broadcast operands", "input x : f32[2, 3, 4]\ninput t : f32[3]\ninput u : f32[1, 3]\ninput v : f32[2, 1]\n"
     "input y : f32[2, 3, 4, 5]\ninput c : f32[3]\ninput s : f32[4, 4]\n"
     "g = reduce_sum(x, axes=[2])\na = add(g, t)\nb = add(g, u)\nd = mul(g, v)\nm = reduce_sum(x, axes=[1])\ne = sub(m, v)\n"
     "f = mean(x, axes=[-1])\nh = add(f, t)\np = global_avgpool(y)\nq = add(p, c)\n"
     "g2 = reduce_sum(s, axes=[1])\no = add(s, g2)\nr = reduce_max(o, axes=[1])\n"
     "k = reduce_sum(x, axes=[0, 2], keepdims=true)\nl = mul(x, k)\n"
     "output a\noutput b\noutput d\noutput e\noutput h\noutput q\noutput o\noutput r\noutput l\n", TF_MODE_INFER},
    {"train reductions with broadcast operands", "input x : f32[2, 3, 4]\ninput z : f32[2]\nparam t : f32[3] = uniform()\n"
     "param w : f32[2, 1] = uniform()\nparam bb : f32[3] = uniform()\n"
     "g = mean(x, axes=[-1])\na = add(g, t)\nd = mul(a, w)\ny = global_avgpool(x)\nq = add(y, bb)\n"
     "e = mul(d, q)\ns = reduce_sum(e, axes=[1])\nloss = mse_loss(s, z)\noutput loss\n" TC_TRAIN_SGD, TF_MODE_TRAIN},
    {"attention", "input q : f32[2, 3, 5, 4]\ninput k : f32[2, 3, 5, 4]\ninput v : f32[2, 3, 5, 4]\n"
     "a = attention(q, k, v, causal=true)\nb = attention(q, k, v)\noutput a\noutput b\n", TF_MODE_INFER},
    /* fused attention's cases: grouped-query (4 query heads on 2 and on 1 key/value heads), cross-attention
     * (5 queries, 9 keys), a bool mask whose first row sees no key (its output is 0), an additive mask with
     * causal and a scale, a head dim of 80 for the values; and odd T with head dims 256 and 16 */
    {"attention: masks, groups, cross", "input q : f32[2, 4, 5, 16]\ninput k : f32[2, 2, 9, 16]\ninput v : f32[2, 2, 9, 80]\n"
     "input bias : f32[1, 4, 5, 9]\ncol = iota(shape=[2, 1, 5, 9], axis=3)\nrow = iota(shape=[2, 1, 5, 9], axis=2)\n"
     "keep = lt(col, row)\na = attention(q, k, v, keep)\nb = attention(q, k, v, bias, causal=true, scale=0.3)\n"
     "k1 = slice(k, axis=1, start=0, end=1)\nv1 = slice(v, axis=1, start=0, end=1)\nc = attention(q, k1, v1)\n"
     "output a\noutput b\noutput c\n", TF_MODE_INFER},
    {"attention: odd T, head dims", "input q : f32[1, 2, 13, 256]\ninput k : f32[1, 2, 13, 256]\ninput v : f32[1, 2, 13, 16]\n"
     "a = attention(q, k, v, causal=true)\nq2 = slice(q, axis=3, start=0, end=16)\nk2 = slice(k, axis=3, start=0, end=16)\n"
     "b = attention(q2, k2, v)\noutput a\noutput b\n", TF_MODE_INFER},
    {"long rows and columns", "input x : f32[3, 5000]\ninput y : f32[3000, 7]\n"
     "a = softmax(x)\nb = reduce_sum(y, axes=[0])\nc = reduce_max(x, axes=[1])\n"
     "output a\noutput b\noutput c\n", TF_MODE_INFER},
    {"train conv, pools, bias", "input x : f32[2, 4, 7, 6]\nparam w : f32[6, 2, 3, 3] = uniform()\nparam b : f32[6] = uniform()\n"
     "y = conv2d(x, w, b, stride=2, padding=1, dilation=[1, 2], groups=2)\np = maxpool2d(y, kernel=3, stride=2, padding=1)\n"
     "q = avgpool2d(y, kernel=2)\ns = mul(p, p)\nt = mean(s, axes=[0, 1, 2, 3])\nu = mean(q, axes=[0, 1, 2, 3])\n"
     "loss = add(t, u)\noutput loss\n" TC_TRAIN_SGD, TF_MODE_TRAIN},
    /* a conv whose input is computed: the gradient reaches it (conv2d_grad_input) */
    {"train conv chain", "input x : f32[2, 3, 6, 5]\nparam w1 : f32[4, 3, 3, 3] = uniform()\n"
     "param w2 : f32[2, 4, 3, 3] = uniform()\nc1 = conv2d(x, w1, padding=1)\nr = relu(c1)\n"
     "c2 = conv2d(r, w2, stride=2, padding=[1, 0])\ns = mul(c2, c2)\nloss = mean(s, axes=[0, 1, 2, 3])\noutput loss\n"
     TC_TRAIN_SGD, TF_MODE_TRAIN},
    {"train gemm, norms, gathers", "input i : i64[3, 5]\ninput y : i64[3, 5]\nparam t : f32[11, 7] = normal()\n"
     "param w : f32[7, 11] = uniform()\nparam g : f32[7] = ones()\nparam bb : f32[7] = zeros()\n"
     "e = embedding(i, t)\nn = layernorm(e, g, bb)\nh = gelu(n)\nl = linear(h, w)\nloss = cross_entropy(l, y)\n"
     "output loss\ntrain {\n  optimizer = adamw(lr=0.01)\n}\n", TF_MODE_TRAIN},
    /* over 1024 rows the gradients' broadcasts (cross-entropy's, layernorm's) are loads with zero strides in
     * the kernels that read them, and a reduction kernel's result may take a dying operand's memory */
    {"train losses over many rows", "input x : f32[1030, 13]\ninput y : i64[1030]\nparam w : f32[13, 11] = uniform()\n"
     "param g : f32[11] = ones()\nparam bb : f32[11] = zeros()\nh = linear(x, w)\nn = layernorm(h, g, bb)\n"
     "loss = cross_entropy(n, y)\noutput loss\n" TC_TRAIN_SGD, TF_MODE_TRAIN},
    {"train batchnorm, slice, concat", "input x : f32[3, 4, 5, 5]\ninput z : f32[3]\nparam w : f32[4, 4, 3, 3] = uniform()\n"
     "param g : f32[4] = ones()\nparam b : f32[4] = zeros()\nbuffer rm : f32[4] = zeros()\nbuffer rv : f32[4] = ones()\n"
     "c = conv2d(x, w, padding=1)\nn = batchnorm(c, g, b, rm, rv)\ns = slice(n, axis=1, start=1, end=3)\n"
     "k = concat(s, n, axis=1)\nr = relu(k)\nt = reduce_sum(r, axes=[1, 2, 3])\nloss = mse_loss(t, z)\n"
     "output loss\n" TC_TRAIN_SGD, TF_MODE_TRAIN},
    {"train attention", "input x : f32[2, 5, 8]\nparam wq : f32[8, 8] = uniform()\nparam wv : f32[8, 8] = uniform()\n"
     "q = linear(x, wq)\nv = linear(x, wv)\nq4 = reshape(q, shape=[2, 5, 2, 4])\nv4 = reshape(v, shape=[2, 5, 2, 4])\n"
     "qh = transpose(q4, perm=[0, 2, 1, 3])\nvh = transpose(v4, perm=[0, 2, 1, 3])\n"
     "a = attention(qh, qh, vh, causal=true)\ns = mul(a, a)\nloss = mean(s, axes=[0, 1, 2, 3])\noutput loss\n" TC_TRAIN_SGD,
     TF_MODE_TRAIN},
    /* the fused backward: 4 query heads on 2 key/value heads, a key-padding mask (the last two keys of the
     * second sequence hidden, and a query row that sees none), dropout on the probabilities */
    {"train attention: groups, mask, dropout", "input x : f32[2, 7, 8]\ninput z : f32[2, 4, 7, 2]\n"
     "param wq : f32[8, 8] = uniform()\nparam wk : f32[8, 4] = uniform()\nparam wv : f32[8, 4] = uniform()\n"
     "q = linear(x, wq)\nk = linear(x, wk)\nv = linear(x, wv)\nq4 = reshape(q, shape=[2, 7, 4, 2])\n"
     "k4 = reshape(k, shape=[2, 7, 2, 2])\nv4 = reshape(v, shape=[2, 7, 2, 2])\nqh = transpose(q4, perm=[0, 2, 1, 3])\n"
     "kh = transpose(k4, perm=[0, 2, 1, 3])\nvh = transpose(v4, perm=[0, 2, 1, 3])\n"
     "col = iota(shape=[2, 1, 7, 7], axis=3)\nrow = iota(shape=[2, 1, 7, 7], axis=2)\nbat = iota(shape=[2, 1, 7, 7], axis=0)\n"
     "lim = mul(bat, 2)\nvis = sub(7, lim)\nk1 = lt(col, vis)\nk2 = ne(row, 3)\nkeep = where(k2, k1, k2)\n"
     "a = attention(qh, kh, vh, keep, dropout=0.3, salt=5)\nloss = mse_loss(a, z)\noutput loss\n" TC_TRAIN_SGD,
     TF_MODE_TRAIN},
    /* allreduce without a communicator: one rank, a copy; in a forward pass its gradient is an
     * allreduce of its own (tests/mpi checks the ranks' means) */
    {"allreduce, one rank", "input x : f32[3, 5]\ny = allreduce(x, bucket=2)\nz = mul(y, y)\nw = allreduce(z)\noutput w\n",
     TF_MODE_INFER},
    /* shard and allgather over one rank: the whole value, padded to nothing; tests/mpi checks them on 2
     * and 3 ranks through shard_optimizer */
    {"shard, allgather, one rank", "input x : f32[3, 5]\ns = shard(x, ranks=1)\nt = mul(s, 2.0)\n"
     "g = allgather(t, ranks=1, shape=[3, 5])\noutput g\noutput s\n", TF_MODE_INFER},
    {"train allreduce in the forward pass", "input x : f32[4, 6]\nparam w : f32[6, 3] = uniform()\n"
     "h = linear(x, w)\na = allreduce(h, bucket=1)\ns = tanh(a)\nloss = mean(s, axes=[0, 1])\noutput loss\n" TC_TRAIN_SGD,
     TF_MODE_TRAIN},
    /* the library ops the cuda target generates a kernel for, at odd shapes: windows with padding,
     * strides 2x1, a 4x4 window at stride 3 (mostly padding), the gradients written directly, ids
     * repeated (20 ids, 11 rows), concat along a middle and the last axis with an operand twice,
     * slice_grad with a step (scatter_add in 16-bit storage, which the cpu target leaves to the
     * interpreter, is test_gpu's own case) */
    {"library ops at odd shapes", "input x : f32[2, 3, 7, 9]\ninput w : f32[3, 1, 4, 11]\ninput ids : i64[4, 5]\n"
     "input t : f32[11, 6]\ninput a : f32[2, 3, 5]\ninput b : f32[2, 1, 5]\n"
     "p = maxpool2d(x, kernel=[3, 2], stride=[2, 1], padding=[1, 1])\nq = avgpool2d(x, kernel=3, stride=1, padding=1)\n"
     "g = maxpool2d_grad(x, p, kernel=[3, 2], stride=[2, 1], padding=[1, 1])\n"
     "h = avgpool2d_grad(q, kernel=3, stride=1, padding=1, shape=[2, 3, 7, 9])\n"
     "r = maxpool2d(w, kernel=4, stride=3, padding=2)\nrg = maxpool2d_grad(w, r, kernel=4, stride=3, padding=2)\n"
     "e = gather(ids, t)\n"
     "c = concat(a, b, a, axis=1)\nc2 = concat(a, a, axis=-1)\nz = slice_grad(a, axis=2, start=1, end=10, step=2, size=10)\n"
     "output p\noutput q\noutput g\noutput h\noutput rg\noutput e\noutput c\noutput c2\noutput z\n", TF_MODE_INFER},
    {"train dropout, fp16 scaling", "input x : f32[4, 9]\ninput y : i64[4]\nparam w : f32[9, 5] = uniform()\n"
     "param b : f32[5] = zeros()\nh = linear(x, w, b)\nd = dropout(h, p=0.3)\nloss = cross_entropy(d, y)\noutput loss\n"
     "train {\n  optimizer = adam(lr=0.01)\n}\n", TF_MODE_TRAIN},
};

/* Cases generated from the op table, so that a pointwise op added to ops.def
 * runs on every target without anyone writing a case for it: for every core
 * pointwise op of one or two operands without attributes, an inference
 * model (raw operands, NaNs included, and positive ones) and, when the op
 * has a gradient rule, a training step through it. Fills buf with the
 * model and *mode; false for an op this cannot generate a case for. */
static inline bool tc_generated(int op, bool train, char *buf, size_t n, tf_mode *mode)
{
    const tf_op_info *in = tf_op_info_of(op);
    if (in->kind != TF_OPK_POINTWISE || tf_op_has(op, TF_OPF_LAYER) || in->nattrs || in->min_in != in->max_in ||
        in->min_in < 1 || in->min_in > 2)
        return false;
    bool two = in->min_in == 2;
    /* positive operands: q = (x0^2 + 0.5) * w, r = x1^2 + 0.5 */
    const char *q = "p = mul(x0, x0)\nh = add(p, 0.5)\nq = mul(h, w)\n", *r = "t = mul(x1, x1)\nr = add(t, 0.5)\n";
    const char *nm = in->name;
    if (train) {
        if (!tf_grad_rule(op)) return false;
        snprintf(buf, n,
                 "input x0 : f32[7, 13]\n%sparam w : f32[13] = ones()\n%s%sy = %s(q%s)\ns = mul(y, y)\n"
                 "loss = mean(s, axes=[0, 1])\noutput loss\n" TC_TRAIN_SGD,
                 two ? "input x1 : f32[13]\n" : "", q, two ? r : "", nm, two ? ", r" : "");
        *mode = TF_MODE_TRAIN;
    } else if (two) {
        snprintf(buf, n,
                 "input x0 : f32[7, 13]\ninput x1 : f32[13]\ninput x2 : f32[7, 1]\nparam w : f32[13] = ones()\n%s%s"
                 "y = %s(x0, x2)\nz = %s(q, r)\noutput y\noutput z\n", q, r, nm, nm);
        *mode = TF_MODE_INFER;
    } else {
        snprintf(buf, n,
                 "input x0 : f32[7, 13]\ninput x1 : f32[13]\nparam w : f32[13] = ones()\n%s%s"
                 "y = %s(x0)\nz = %s(q)\nu = %s(r)\noutput y\noutput z\noutput u\n", q, r, nm, nm, nm);
        *mode = TF_MODE_INFER;
    }
    return true;
}

/* Every written case, then every case tc_generated makes, to fn (label, text,
 * mode); returns how many were generated. */
/* fp16 training cases: the loss scale starts at 65536, which overflows these
 * small models' 16-bit gradients, so a first step would be skipped in both
 * sessions (states unchanged, nothing compared). Both start from 64 instead;
 * false when that cannot be set. */
static inline bool tc_small_loss_scale(tf_session_t *a, tf_session_t *b)
{
    float scale = 64;
    tf_tensor_view sv = {.data = &scale, .dtype = TF_DTYPE_F32, .rank = 0};
    return !tf_session_set_state(a, "train.loss_scale", &sv) && !tf_session_set_state(b, "train.loss_scale", &sv);
}

/* A training session's step counter (-1 when it cannot be read): 1 after a
 * first step that was taken. */
static inline int64_t tc_train_step(tf_session_t *s)
{
    int64_t step = -1;
    tf_tensor_view st = {.data = &step, .dtype = TF_DTYPE_I64, .rank = 0};
    return tf_session_get_state(s, "train.step", &st, sizeof step) ? -1 : step;
}

static inline int tc_each_case(void (*fn)(const char *label, const char *text, tf_mode mode))
{
    for (size_t i = 0; i < sizeof target_cases / sizeof *target_cases; i++)
        fn(target_cases[i].label, target_cases[i].text, target_cases[i].mode);
    int generated = 0;
    for (int op = 0; op < TF_OP_COUNT; op++)
        for (int train = 0; train < 2; train++) {
            char text[2048], label[128];
            tf_mode mode;
            if (!tc_generated(op, train, text, sizeof text, &mode)) continue;
            snprintf(label, sizeof label, "generated %s [%s]", tf_op_info_of(op)->name, train ? "train" : "infer");
            fn(label, text, mode);
            generated++;
        }
    return generated;
}

/* The text of the case with this label (NULL if none). */
static inline const char *tc_text(const char *label)
{
    for (size_t i = 0; i < sizeof target_cases / sizeof *target_cases; i++)
        if (!strcmp(target_cases[i].label, label)) return target_cases[i].text;
    return NULL;
}

static inline int64_t tc_numel(const tf_tensor_view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->rank; i++) n *= v->shape[i];
    return n;
}

/* Elementwise against want, on the tensor's scale (max finite |want|):
 * |got - want| <= tol * (|want| + 0.05 * scale), NaN matching NaN and
 * infinities equal. Returns the worst error as a multiple of what is
 * allowed (INFINITY for a NaN or infinity mismatch); 0 when identical. */
static inline double tc_compare_elems(const tf_tensor_view *got, const tf_tensor_view *want, double tol)
{
    int64_t n = tc_numel(want);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = tf_elem_load((tf_dt)want->dtype, want->data, i);
        if (isfinite(w) && fabs(w) > scale) scale = fabs(w);
    }
    for (int64_t i = 0; i < n; i++) {
        double g = tf_elem_load((tf_dt)got->dtype, got->data, i), w = tf_elem_load((tf_dt)want->dtype, want->data, i);
        if (isnan(w) || isnan(g) || isinf(w) || isinf(g)) {
            if (!((isnan(w) && isnan(g)) || g == w)) return INFINITY;
            continue;
        }
        if (g == w) continue;
        double r = fabs(g - w) / (tol * (fabs(w) + scale * 0.05) + 1e-300);
        if (r > worst) worst = r;
    }
    return worst;
}

/* ||got - want|| / max(||want||, floor * sqrt(n)): relative, but never finer
 * than `floor` per element (floor 1 and a tensor of elements below 1: the RMS
 * difference). An infinity both sides hold at the same place (an fp16 step
 * whose scaled gradients overflowed: both skip it, and its accumulator holds
 * the inf) counts as agreement and is left out of both norms; any other
 * non-finite element makes the error infinite or NaN. */
static inline double tc_rel_l2_floor(const tf_tensor_view *got, const tf_tensor_view *want, double floor)
{
    int64_t n = tc_numel(want);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = tf_elem_load((tf_dt)got->dtype, got->data, i), w = tf_elem_load((tf_dt)want->dtype, want->data, i);
        if (g == w && isinf(w)) continue;
        num += (g - w) * (g - w);
        den += w * w;
    }
    if (den < floor * floor * (double)n) den = floor * floor * (double)n;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline double tc_rel_l2(const tf_tensor_view *got, const tf_tensor_view *want) { return tc_rel_l2_floor(got, want, 0); }

#endif
