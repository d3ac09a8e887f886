/* ops_attrs.h — attribute schemas of the ops, initializers and train-block
 * functions. Included by ops.c only; listed here so a reader finds every
 * op's attributes, their defaults and their ranges in one screen.
 *
 * A default is written in the text format itself and parsed by the same code
 * as the user's value. NULL default: the attribute is required. Ranges are
 * inclusive; NR (min > max) means unchecked. Each list ends with {0}. */
#ifndef TF_IR_OPS_ATTRS_H
#define TF_IR_OPS_ATTRS_H

#include "ir.h"

#define NR 1, 0
#define BIG 1e300

/*                               name           kind           default   min     max      choices */
static const tf_attr_spec tf_attrs_none[1] = {{0}};
static const tf_attr_spec tf_attrs_batchnorm[] = {
    {"momentum",  TF_ATTR_FLOAT, "0.1",    0, 1, NULL},
    {"eps",       TF_ATTR_FLOAT, "1e-05",  1e-30, 1, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_layernorm[] = {
    {"eps",       TF_ATTR_FLOAT, "1e-05",  1e-30, 1, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_axis[] = {
    {"axis",      TF_ATTR_INT,   "-1",     -TF_MAX_RANK, TF_MAX_RANK - 1, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_axis0[] = {
    {"axis",      TF_ATTR_INT,   "0",      -TF_MAX_RANK, TF_MAX_RANK - 1, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_gelu[] = {
    {"approx",    TF_ATTR_STR,   "\"none\"", NR, "none|tanh"},
    {0},
};
/* attention: scale left unset is 1/sqrt(D); dropout is on the probabilities
 * (train mode), drawn from the stream `salt` names, as dropout's. The fused
 * ops carry the scale `lower` resolved; flash_attention's lse adds the
 * per-row log-sum-exp as a last column (an f32 result) for the backward. */
static const tf_attr_spec tf_attrs_attention[] = {
    {"causal",    TF_ATTR_BOOL,  "false",  NR, NULL},
    {"scale",     TF_ATTR_FLOAT, "0",      -1e30, 1e30, NULL},
    {"dropout",   TF_ATTR_FLOAT, "0",      0, 0.999, NULL},
    {"salt",      TF_ATTR_INT,   "0",      0, 2147483647.0, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_flash_attention[] = {
    {"causal",    TF_ATTR_BOOL,  "false",  NR, NULL},
    {"scale",     TF_ATTR_FLOAT, NULL,     -1e30, 1e30, NULL},
    {"dropout",   TF_ATTR_FLOAT, "0",      0, 0.999, NULL},
    {"salt",      TF_ATTR_INT,   "0",      0, 2147483647.0, NULL},
    {"lse",       TF_ATTR_BOOL,  "false",  NR, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_flash_attention_grad[] = {
    {"causal",    TF_ATTR_BOOL,  "false",  NR, NULL},
    {"scale",     TF_ATTR_FLOAT, NULL,     -1e30, 1e30, NULL},
    {"dropout",   TF_ATTR_FLOAT, "0",      0, 0.999, NULL},
    {"salt",      TF_ATTR_INT,   "0",      0, 2147483647.0, NULL},
    {0},
};
/* p < 1: dropping everything is not dropout. salt picks the random stream, so
 * two dropouts draw different masks and lowering keeps each one's mask. */
static const tf_attr_spec tf_attrs_dropout[] = {
    {"p",         TF_ATTR_FLOAT, "0.1",    0, 0.999, NULL},
    {"salt",      TF_ATTR_INT,   "0",      0, 2147483647.0, NULL},
    {0},
};
/* axes=[] reduces every axis. */
static const tf_attr_spec tf_attrs_reduce[] = {
    {"axes",      TF_ATTR_INTS,  NULL,     -TF_MAX_RANK, TF_MAX_RANK - 1, NULL},
    {"keepdims",  TF_ATTR_BOOL,  "false",  NR, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_cast[] = {
    {"to",        TF_ATTR_DTYPE, NULL,     NR, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_matmul[] = {
    {"transpose_a", TF_ATTR_BOOL, "false", NR, NULL},
    {"transpose_b", TF_ATTR_BOOL, "false", NR, NULL},
    {0},
};
/* stride/padding/dilation: one int for both spatial axes, or [h, w]. */
static const tf_attr_spec tf_attrs_conv2d[] = {
    {"stride",    TF_ATTR_INTS,  "1",      1, 1 << 20, NULL},
    {"padding",   TF_ATTR_INTS,  "0",      0, 1 << 20, NULL},
    {"dilation",  TF_ATTR_INTS,  "1",      1, 1 << 20, NULL},
    {"groups",    TF_ATTR_INT,   "1",      1, 1 << 20, NULL},
    {0},
};
/* stride=[] (the default) means stride = kernel, as in PyTorch. avgpool2d
 * divides by the full window, padding included (PyTorch's count_include_pad). */
static const tf_attr_spec tf_attrs_pool[] = {
    {"kernel",    TF_ATTR_INTS,  NULL,     1, 1 << 20, NULL},
    {"stride",    TF_ATTR_INTS,  "[]",     1, 1 << 20, NULL},
    {"padding",   TF_ATTR_INTS,  "0",      0, 1 << 20, NULL},
    {0},
};
/* One entry may be -1 (inferred from the element count). */
static const tf_attr_spec tf_attrs_reshape[] = {
    {"shape",     TF_ATTR_INTS,  NULL,     -1, TF_MAX_DIM, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_transpose[] = {
    {"perm",      TF_ATTR_INTS,  NULL,     0, TF_MAX_RANK - 1, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_shape[] = {
    {"shape",     TF_ATTR_INTS,  NULL,     1, TF_MAX_DIM, NULL},
    {0},
};
/* Python slicing on one axis: negative start/end count from the end and are
 * clamped; the result may not be empty. */
static const tf_attr_spec tf_attrs_slice[] = {
    {"axis",      TF_ATTR_INT,   NULL,     -TF_MAX_RANK, TF_MAX_RANK - 1, NULL},
    {"start",     TF_ATTR_INT,   NULL,     -TF_MAX_DIM, TF_MAX_DIM, NULL},
    {"end",       TF_ATTR_INT,   NULL,     -TF_MAX_DIM, TF_MAX_DIM, NULL},
    {"step",      TF_ATTR_INT,   "1",      1, TF_MAX_DIM, NULL},
    {0},
};
/* embedding and gather: padding_idx names the table row that gets no
 * gradient (PyTorch's nn.Embedding padding_idx); -1, ATen's own default, names
 * none. The forward pass reads that row like any other. */
static const tf_attr_spec tf_attrs_embedding[] = {
    {"padding_idx", TF_ATTR_INT, "-1",     -1, TF_MAX_DIM, NULL},
    {0},
};
/* PyTorch's cross_entropy: a row whose label is ignore_index adds nothing
 * and is not counted by the mean (HF's labels use -100, PyTorch's default);
 * reduction="none" gives each row's loss (0 for an ignored row). */
static const tf_attr_spec tf_attrs_cross_entropy[] = {
    {"ignore_index", TF_ATTR_INT, "-100",  -TF_MAX_DIM, TF_MAX_DIM, NULL},
    {"reduction", TF_ATTR_STR,   "\"mean\"", NR, "mean|sum|none"},
    {0},
};
static const tf_attr_spec tf_attrs_one_hot[] = {
    {"depth",     TF_ATTR_INT,   NULL,     1, 1 << 24, NULL},
    {"dtype",     TF_ATTR_DTYPE, "f32",    NR, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_iota[] = {
    {"shape",     TF_ATTR_INTS,  NULL,     1, TF_MAX_DIM, NULL},
    {"axis",      TF_ATTR_INT,   "0",      -TF_MAX_RANK, TF_MAX_RANK - 1, NULL},
    {"dtype",     TF_ATTR_DTYPE, "i64",    NR, NULL},
    {0},
};

/* Backward ops: the forward op's attributes plus the shape of the gradient
 * they produce (the forward operand's shape, which dy alone does not fix). */
static const tf_attr_spec tf_attrs_conv2d_grad[] = {
    {"stride",    TF_ATTR_INTS,  "1",      1, 1 << 20, NULL},
    {"padding",   TF_ATTR_INTS,  "0",      0, 1 << 20, NULL},
    {"dilation",  TF_ATTR_INTS,  "1",      1, 1 << 20, NULL},
    {"groups",    TF_ATTR_INT,   "1",      1, 1 << 20, NULL},
    {"shape",     TF_ATTR_INTS,  NULL,     1, TF_MAX_DIM, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_pool_grad[] = {
    {"kernel",    TF_ATTR_INTS,  NULL,     1, 1 << 20, NULL},
    {"stride",    TF_ATTR_INTS,  "[]",     1, 1 << 20, NULL},
    {"padding",   TF_ATTR_INTS,  "0",      0, 1 << 20, NULL},
    {"shape",     TF_ATTR_INTS,  NULL,     1, TF_MAX_DIM, NULL},
    {0},
};
/* allreduce: the bucket its operand is sent in (autodiff numbers them in the
 * order the backward pass completes them); ops of one bucket travel as one
 * message, so a bucket is a unit of overlap and of latency. -1: alone and at
 * once, for a value its readers need right away (synchronized batch norm's
 * statistics in the forward pass) */
static const tf_attr_spec tf_attrs_allreduce[] = {
    {"bucket",    TF_ATTR_INT,   "0",      -1, 1 << 20, NULL},
    {0},
};
/* shard and allgather (ZeRO-1): the number of ranks the value is split over,
 * rank r holding the flat elements [r c, (r + 1) c), c = ceil(n / ranks);
 * allgather's shape is the whole value's */
static const tf_attr_spec tf_attrs_shard[] = {
    {"ranks",     TF_ATTR_INT,   NULL,     1, 65536, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_allgather[] = {
    {"ranks",     TF_ATTR_INT,   NULL,     1, 65536, NULL},
    {"shape",     TF_ATTR_INTS,  NULL,     1, TF_MAX_DIM, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_slice_grad[] = {
    {"axis",      TF_ATTR_INT,   NULL,     -TF_MAX_RANK, TF_MAX_RANK - 1, NULL},
    {"start",     TF_ATTR_INT,   NULL,     -TF_MAX_DIM, TF_MAX_DIM, NULL},
    {"end",       TF_ATTR_INT,   NULL,     -TF_MAX_DIM, TF_MAX_DIM, NULL},
    {"step",      TF_ATTR_INT,   "1",      1, TF_MAX_DIM, NULL},
    {"size",      TF_ATTR_INT,   NULL,     1, TF_MAX_DIM, NULL},
    {0},
};

/* ---- initializers -------------------------------------------------------
 * Fans: a rank-2 weight is [in, out] (linear's layout); rank >= 3 is a conv
 * weight [out, in/groups, kh, kw]: fan_in = in/groups*kh*kw. kaiming_uniform
 * draws from U(-b, b), b = gain*sqrt(3/fan_in), gain sqrt(2) (ReLU);
 * xavier_uniform b = gain*sqrt(6/(fan_in+fan_out)). */
static const tf_attr_spec tf_attrs_init_const[] = {
    {"value",     TF_ATTR_FLOAT, NULL,     -INFINITY, INFINITY, NULL},   /* inf and -inf too; not nan */
    {0},
};
static const tf_attr_spec tf_attrs_init_normal[] = {
    {"std",       TF_ATTR_FLOAT, "1.0",    0, BIG, NULL},
    {"mean",      TF_ATTR_FLOAT, "0.0",    NR, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_init_uniform[] = {
    {"low",       TF_ATTR_FLOAT, "-1.0",   NR, NULL},
    {"high",      TF_ATTR_FLOAT, "1.0",    NR, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_init_gain[] = {
    {"gain",      TF_ATTR_FLOAT, "1.4142135623730951", 0, BIG, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_init_xavier[] = {
    {"gain",      TF_ATTR_FLOAT, "1.0",    0, BIG, NULL},
    {0},
};

/* ---- train block -------------------------------------------------------- */
static const tf_attr_spec tf_attrs_sgd[] = {
    {"lr",        TF_ATTR_FLOAT, NULL,     0, BIG, NULL},
    {"momentum",  TF_ATTR_FLOAT, "0.0",    0, 1, NULL},
    {"nesterov",  TF_ATTR_BOOL,  "false",  NR, NULL},
    {"weight_decay", TF_ATTR_FLOAT, "0.0", 0, BIG, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_adam[] = {
    {"lr",        TF_ATTR_FLOAT, "0.001",  0, BIG, NULL},
    {"beta1",     TF_ATTR_FLOAT, "0.9",    0, 0.999999, NULL},
    {"beta2",     TF_ATTR_FLOAT, "0.999",  0, 0.999999999, NULL},
    {"eps",       TF_ATTR_FLOAT, "1e-08",  0, 1, NULL},
    {"weight_decay", TF_ATTR_FLOAT, "0.0", 0, BIG, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_adamw[] = {
    {"lr",        TF_ATTR_FLOAT, "0.001",  0, BIG, NULL},
    {"beta1",     TF_ATTR_FLOAT, "0.9",    0, 0.999999, NULL},
    {"beta2",     TF_ATTR_FLOAT, "0.999",  0, 0.999999999, NULL},
    {"eps",       TF_ATTR_FLOAT, "1e-08",  0, 1, NULL},
    {"weight_decay", TF_ATTR_FLOAT, "0.01", 0, BIG, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_lamb[] = {
    {"lr",        TF_ATTR_FLOAT, "0.001",  0, BIG, NULL},
    {"beta1",     TF_ATTR_FLOAT, "0.9",    0, 0.999999, NULL},
    {"beta2",     TF_ATTR_FLOAT, "0.999",  0, 0.999999999, NULL},
    {"eps",       TF_ATTR_FLOAT, "1e-06",  0, 1, NULL},
    {"weight_decay", TF_ATTR_FLOAT, "0.01", 0, BIG, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_sched_step[] = {
    {"step_size", TF_ATTR_INT,   NULL,     1, 1e15, NULL},
    {"gamma",     TF_ATTR_FLOAT, "0.1",    0, BIG, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_sched_cosine[] = {
    {"total_steps",  TF_ATTR_INT,   NULL,  1, 1e15, NULL},
    {"warmup_steps", TF_ATTR_INT,   "0",   0, 1e15, NULL},
    {"min_lr",       TF_ATTR_FLOAT, "0.0", 0, BIG, NULL},
    {0},
};
static const tf_attr_spec tf_attrs_sched_onecycle[] = {
    {"max_lr",       TF_ATTR_FLOAT, NULL,  0, BIG, NULL},
    {"total_steps",  TF_ATTR_INT,   NULL,  1, 1e15, NULL},
    {"pct_start",    TF_ATTR_FLOAT, "0.3", 0, 1, NULL},
    {"div_factor",   TF_ATTR_FLOAT, "25.0", 1e-30, BIG, NULL},
    {"final_div_factor", TF_ATTR_FLOAT, "10000.0", 1e-30, BIG, NULL},
    {0},
};

#undef NR
#undef BIG
#endif
