/* ops.c — the op table (an expansion of ops.def), shape rules, scalar math
 * and the tables of initializers and train-block functions.
 *
 * A shape rule sees a node whose operands are typed, whose arity and
 * operand dtype class (TF_OPF_FLOATIN) the verifier already checked, and
 * whose attributes are filled and range-checked. It computes the result
 * type or reports, at the node, what it expected and what it found. */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "interp.h"
#include "ops_attrs.h"

/* ---- scalar functions of the pointwise ops (float64) ---- */

static double sf_neg(double a, double b) { (void)b; return -a; }
static double sf_abs(double a, double b) { (void)b; return fabs(a); }
static double sf_exp(double a, double b) { (void)b; return tf_exp(a); }
static double sf_log(double a, double b) { (void)b; return log(a); }
static double sf_sqrt(double a, double b) { (void)b; return sqrt(a); }
static double sf_rsqrt(double a, double b) { (void)b; return 1.0 / sqrt(a); }
static double sf_tanh(double a, double b) { (void)b; return tf_tanh(a); }
static double sf_sigmoid(double a, double b) { (void)b; return 1.0 / (1.0 + tf_exp(-a)); }
static double sf_relu(double a, double b) { (void)b; return a > 0 || a != a ? a : 0.0; }   /* NaN stays NaN */
static double sf_erf(double a, double b) { (void)b; return erf(a); }
static double sf_sin(double a, double b) { (void)b; return sin(a); }
static double sf_cos(double a, double b) { (void)b; return cos(a); }
static double sf_silu(double a, double b) { (void)b; return a / (1.0 + tf_exp(-a)); }
/* log(1 + e^a), without overflow for large a */
static double sf_softplus(double a, double b) { (void)b; return a > 0 ? a + log1p(tf_exp(-a)) : log1p(tf_exp(a)); }
static double sf_add(double a, double b) { return a + b; }
static double sf_sub(double a, double b) { return a - b; }
static double sf_mul(double a, double b) { return a * b; }
static double sf_div(double a, double b) { return a / b; }
static double sf_pow(double a, double b) { return pow(a, b); }
/* NaN propagates through maximum/minimum, as in PyTorch. */
static double sf_max(double a, double b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
static double sf_min(double a, double b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
static double sf_eq(double a, double b) { return a == b; }
static double sf_ne(double a, double b) { return a != b; }
static double sf_lt(double a, double b) { return a < b; }
static double sf_le(double a, double b) { return a <= b; }
static double sf_gt(double a, double b) { return a > b; }
static double sf_ge(double a, double b) { return a >= b; }
static double sf_isfinite(double a, double b) { (void)b; return isfinite(a); }
#define sf_none NULL

/* ---- prototypes: shape rules here, kernels in interp_kernels.c ---- */

#define TF_OP(E, NAME, MIN, MAX, KIND, EXEC, FLAGS, ATTRS, SHAPE, INTERP, SCALAR, LOWER, AMP, GRAD) \
    tf_ir_status sh_##SHAPE(tf_module *m, tf_node *n, tf_type *out, tf_diag *d); \
    tf_ir_status ik_##INTERP(tf_interp_ctx *ip, const tf_node *n, const tf_tensor *const *in, tf_tensor *out);
#include "ops.def"
#undef TF_OP

#define NATTRS(x) ((int)(sizeof tf_attrs_##x / sizeof tf_attrs_##x[0]) - 1)

const tf_op_info tf_op_table[TF_OP_COUNT] = {
#define TF_OP(E, NAME, MIN, MAX, KIND, EXEC, FLAGS, ATTRS, SHAPE, INTERP, SCALAR, LOWER, AMP, GRAD) \
    [TF_OP_##E] = {NAME, MIN, MAX, TF_OPK_##KIND, TF_OPX_##EXEC, FLAGS, tf_attrs_##ATTRS, NATTRS(ATTRS), \
                   sh_##SHAPE, ik_##INTERP, sf_##SCALAR, LOWER, TF_AMP_##AMP},
#include "ops.def"
#undef TF_OP
};

const tf_fn_info tf_init_fns[TF_INIT_COUNT] = {
    [TF_INIT_ZEROS] = {"zeros", tf_attrs_none, 0},
    [TF_INIT_ONES] = {"ones", tf_attrs_none, 0},
    [TF_INIT_CONST] = {"const", tf_attrs_init_const, NATTRS(init_const)},
    [TF_INIT_NORMAL] = {"normal", tf_attrs_init_normal, NATTRS(init_normal)},
    [TF_INIT_UNIFORM] = {"uniform", tf_attrs_init_uniform, NATTRS(init_uniform)},
    [TF_INIT_KAIMING_UNIFORM] = {"kaiming_uniform", tf_attrs_init_gain, NATTRS(init_gain)},
    [TF_INIT_XAVIER_UNIFORM] = {"xavier_uniform", tf_attrs_init_xavier, NATTRS(init_xavier)},
};
const tf_fn_info tf_optimizer_fns[TF_OPT_COUNT] = {
    [TF_OPT_SGD] = {"sgd", tf_attrs_sgd, NATTRS(sgd)},
    [TF_OPT_ADAM] = {"adam", tf_attrs_adam, NATTRS(adam)},
    [TF_OPT_ADAMW] = {"adamw", tf_attrs_adamw, NATTRS(adamw)},
    [TF_OPT_LAMB] = {"lamb", tf_attrs_lamb, NATTRS(lamb)},
};
const tf_fn_info tf_schedule_fns[TF_SCHED_COUNT] = {
    [TF_SCHED_CONSTANT] = {"constant", tf_attrs_none, 0},
    [TF_SCHED_STEP] = {"step", tf_attrs_sched_step, NATTRS(sched_step)},
    [TF_SCHED_COSINE] = {"cosine", tf_attrs_sched_cosine, NATTRS(sched_cosine)},
    [TF_SCHED_ONECYCLE] = {"onecycle", tf_attrs_sched_onecycle, NATTRS(sched_onecycle)},
};

const char *tf_exec_name(tf_op_exec x)
{
    static const char *const names[TF_OPX_COUNT] = {
        [TF_OPX_LAYER] = "layer", [TF_OPX_EXPR] = "expr", [TF_OPX_INDEX] = "index", [TF_OPX_REDUCE] = "reduce",
        [TF_OPX_VIEW] = "view", [TF_OPX_BCAST] = "broadcast", [TF_OPX_COPY] = "copy", [TF_OPX_GEMM] = "gemm",
        [TF_OPX_CONV] = "conv", [TF_OPX_POOL] = "pool", [TF_OPX_POOL_GRAD] = "pool_grad", [TF_OPX_GATHER] = "gather",
        [TF_OPX_SCATTER] = "scatter_add", [TF_OPX_CONCAT] = "concat", [TF_OPX_SLICE_GRAD] = "slice_grad",
        [TF_OPX_ATTENTION] = "attention", [TF_OPX_COMM] = "allreduce",
    };
    return x >= 0 && x < TF_OPX_COUNT ? names[x] : "?";
}

bool tf_node_is_view(const tf_node *n)
{
    return tf_op_exec_of(n->op) == TF_OPX_VIEW && n->in[0]->kind != TF_VAL_CONST;
}

const tf_value *tf_value_storage(const tf_value *v)
{
    while (v->kind == TF_VAL_NODE && tf_node_is_view(v->def)) v = v->def->in[0];
    return v;
}

int tf_op_lookup(const char *name, size_t len)
{
    for (int i = 0; i < TF_OP_COUNT; i++)
        if (strlen(tf_op_table[i].name) == len && memcmp(tf_op_table[i].name, name, len) == 0) return i;
    return -1;
}

int tf_fn_lookup(const tf_fn_info *fns, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(fns[i].name) == len && memcmp(fns[i].name, name, len) == 0) return i;
    return -1;
}

static int spec_index(const tf_attr_spec *specs, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0) return i;
    return -1;
}

int tf_op_attr_index(int op, const char *name)
{
    return spec_index(tf_op_table[op].attrs, tf_op_table[op].nattrs, name);
}

double tf_call_float(const tf_fn_info *fns, const tf_call *c, const char *name)
{
    int i = spec_index(fns[c->fn].attrs, fns[c->fn].nattrs, name);
    if (i < 0) return 0;
    const tf_attr *a = &c->attrs[i];
    if (a->kind == TF_ATTR_BOOL) return a->u.b ? 1.0 : 0.0;   /* (nesterov) */
    return a->kind == TF_ATTR_INT ? (double)a->u.i.v : a->u.f;
}

const tf_attr *tf_node_attr_named(const tf_node *n, const char *name)
{
    int i = tf_op_attr_index(n->op, name);
    return i < 0 ? NULL : &n->attrs[i];
}
int64_t tf_node_int(const tf_node *n, const char *name)
{
    const tf_attr *a = tf_node_attr_named(n, name);
    return a && a->kind == TF_ATTR_INT ? a->u.i.v : 0;
}
double tf_node_float(const tf_node *n, const char *name)
{
    const tf_attr *a = tf_node_attr_named(n, name);
    return a && a->kind == TF_ATTR_FLOAT ? a->u.f : 0.0;
}
bool tf_node_bool(const tf_node *n, const char *name)
{
    const tf_attr *a = tf_node_attr_named(n, name);
    return a && a->kind == TF_ATTR_BOOL && a->u.b;
}
const char *tf_node_str(const tf_node *n, const char *name)
{
    const tf_attr *a = tf_node_attr_named(n, name);
    return a && a->kind == TF_ATTR_STR ? a->u.s : "";
}

void tf_node_pair(const tf_node *n, const char *name, int64_t d0, int64_t d1, int64_t v[2])
{
    const tf_attr *a = tf_node_attr_named(n, name);
    v[0] = d0;
    v[1] = d1;
    if (!a || a->kind != TF_ATTR_INTS || a->u.ints.n == 0) return;
    v[0] = a->u.ints.v[0].v;
    v[1] = a->u.ints.n >= 2 ? a->u.ints.v[1].v : v[0];
}

void tf_slice_bounds(int64_t len, int64_t start, int64_t end, int64_t *lo, int64_t *hi)
{
    if (start < 0) start += len;
    if (end < 0) end += len;
    *lo = start < 0 ? 0 : start > len ? len : start;
    if (hi) *hi = end < 0 ? 0 : end > len ? len : end;
}

bool tf_axis_norm(int64_t axis, int rank, int *out)
{
    if (axis < -rank || axis >= rank) return false;
    *out = (int)(axis < 0 ? axis + rank : axis);
    return true;
}

/* ---- shape rules ---- */

#define ERR(...) tf_diag_error(d, TF_IR_ERR_VERIFY, &n->loc, __VA_ARGS__)
#define OPNAME (tf_op_table[n->op].name)
#define IN(i) (&n->in[i]->type)

static const char *tstr(tf_module *m, const tf_type *t, char buf[256]) { return tf_type_str(m, t, buf); }

static tf_ir_status need_rank(tf_module *m, tf_node *n, int i, int lo, int hi, const char *what, tf_diag *d)
{
    const tf_type *t = IN(i);
    if (t->rank >= lo && t->rank <= hi) return TF_IR_OK;
    char b[256];
    if (lo == hi)
        return ERR("%s: %s must have rank %d, found %s", OPNAME, what, lo, tstr(m, t, b));
    return ERR("%s: %s must have rank %d..%d, found %s", OPNAME, what, lo, hi, tstr(m, t, b));
}

static tf_ir_status need_int(tf_module *m, tf_node *n, int i, const char *what, tf_diag *d)
{
    tf_dt t = IN(i)->dtype;
    if (t == TF_DT_I64 || t == TF_DT_I32) return TF_IR_OK;
    char b[256];
    return ERR("%s: %s must be i64 or i32, found %s", OPNAME, what, tstr(m, IN(i), b));
}

static tf_ir_status need_dtype(tf_module *m, tf_node *n, int i, tf_dt want, const char *what, tf_diag *d)
{
    if (IN(i)->dtype == want) return TF_IR_OK;
    char b[256];
    return ERR("%s: %s must be %s like the first operand, found %s", OPNAME, what, tf_dtype_name(want),
               tstr(m, IN(i), b));
}

/* operand i must be exactly [dim] (a per-channel vector). */
static tf_ir_status need_vec(tf_module *m, tf_node *n, int i, tf_dim dim, const char *what, tf_diag *d)
{
    const tf_type *t = IN(i);
    if (t->rank == 1 && t->dims[0].n == dim.n) return TF_IR_OK;
    char b[256];
    return ERR("%s: %s must have shape [%lld], found %s", OPNAME, what, (long long)dim.n, tstr(m, t, b));
}

tf_ir_status sh_shard(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m, (void)d;
    int64_t r = tf_node_int(n, "ranks"), numel = tf_type_numel(IN(0));
    *out = (tf_type){.dtype = IN(0)->dtype, .rank = 1};
    out->dims[0] = (tf_dim){(numel + r - 1) / r, -1};
    return TF_IR_OK;
}

tf_ir_status sh_allgather(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    const tf_attr *a = tf_node_attr_named(n, "shape");
    int64_t r = tf_node_int(n, "ranks"), numel = 1;
    if (a->u.ints.n > TF_MAX_RANK) return ERR("allgather: shape has %d axes, at most %d", a->u.ints.n, TF_MAX_RANK);
    *out = (tf_type){.dtype = IN(0)->dtype, .rank = a->u.ints.n};
    for (int i = 0; i < a->u.ints.n; i++) {
        out->dims[i] = (tf_dim){a->u.ints.v[i].v, a->u.ints.v[i].sym};
        if (numel > TF_MAX_NUMEL / a->u.ints.v[i].v) return ERR("allgather: shape's element count overflows");
        numel *= a->u.ints.v[i].v;
    }
    if (IN(0)->rank != 1 || IN(0)->dims[0].n != (numel + r - 1) / r)
        return ERR("allgather: each of %lld ranks holds %lld of the %lld elements of shape, so the operand is [%lld], found %s",
                   (long long)r, (long long)((numel + r - 1) / r), (long long)numel, (long long)((numel + r - 1) / r),
                   tstr(m, IN(0), b));
    return TF_IR_OK;
}

tf_ir_status sh_same(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m; (void)d;
    *out = *IN(0);
    return TF_IR_OK;
}

/* A float in, a bool of the same shape out (isfinite). */
tf_ir_status sh_boolean(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m; (void)d;
    *out = *IN(0);
    out->dtype = TF_DT_BOOL;
    return TF_IR_OK;
}

/* Unary math: numbers in, the same type out (bool has no arithmetic). */
tf_ir_status sh_unary(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    if (IN(0)->dtype == TF_DT_BOOL) return ERR("%s: operand must be numeric, found %s", OPNAME, tstr(m, IN(0), b));
    *out = *IN(0);
    return TF_IR_OK;
}

/* NumPy broadcasting of k operands into out (dtype left to the caller). */
static tf_ir_status broadcast_shapes(tf_module *m, tf_node *n, int first, int k, tf_type *out, tf_diag *d)
{
    int rank = 0;
    for (int i = first; i < first + k; i++)
        if (IN(i)->rank > rank) rank = IN(i)->rank;
    out->rank = rank;
    for (int ax = 0; ax < rank; ax++) {
        tf_dim r = {1, -1};
        for (int i = first; i < first + k; i++) {
            const tf_type *t = IN(i);
            int j = ax - (rank - t->rank);
            if (j < 0) continue;
            tf_dim x = t->dims[j];
            if (x.n == 1) continue;
            if (r.n != 1 && r.n != x.n) {
                char b1[256], b2[256];
                return ERR("%s: operands do not broadcast: %s and %s differ at axis %d (%lld vs %lld)", OPNAME,
                           tstr(m, IN(first), b1), tstr(m, IN(i), b2), ax, (long long)r.n, (long long)x.n);
            }
            if (r.n == 1 || r.sym < 0) r = x;
        }
        out->dims[ax] = r;
    }
    return TF_IR_OK;
}

tf_ir_status sh_broadcast(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    if ((st = need_dtype(m, n, 1, IN(0)->dtype, "the second operand", d))) return st;
    if (IN(0)->dtype == TF_DT_BOOL && !tf_op_has(n->op, TF_OPF_BOOLOUT) )
        return ERR("%s: operands must be numeric, found bool", OPNAME);
    if ((st = broadcast_shapes(m, n, 0, 2, out, d))) return st;
    out->dtype = tf_op_has(n->op, TF_OPF_BOOLOUT) ? TF_DT_BOOL : IN(0)->dtype;
    return TF_IR_OK;
}

tf_ir_status sh_where(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b[256];
    if (IN(0)->dtype != TF_DT_BOOL)
        return ERR("where: condition must be bool, found %s", tstr(m, IN(0), b));
    if ((st = need_dtype(m, n, 2, IN(1)->dtype, "the third operand", d))) return st;
    if ((st = broadcast_shapes(m, n, 0, 3, out, d))) return st;
    out->dtype = IN(1)->dtype;
    return TF_IR_OK;
}

tf_ir_status sh_cast(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m; (void)d;
    *out = *IN(0);
    out->dtype = tf_node_attr_named(n, "to")->u.dt;
    return TF_IR_OK;
}

tf_ir_status sh_linear(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b1[256], b2[256];
    if ((st = need_rank(m, n, 0, 1, TF_MAX_RANK, "input", d))) return st;
    if ((st = need_rank(m, n, 1, 2, 2, "weight [in, out]", d))) return st;
    if ((st = need_dtype(m, n, 1, IN(0)->dtype, "weight", d))) return st;
    const tf_type *x = IN(0), *w = IN(1);
    if (x->dims[x->rank - 1].n != w->dims[0].n)
        return ERR("linear: input's last axis (%lld) must equal weight's first (%lld): input %s, weight %s [in, out]",
                   (long long)x->dims[x->rank - 1].n, (long long)w->dims[0].n, tstr(m, x, b1), tstr(m, w, b2));
    if (n->nin == 3) {
        if ((st = need_dtype(m, n, 2, IN(0)->dtype, "bias", d))) return st;
        if ((st = need_vec(m, n, 2, w->dims[1], "bias", d))) return st;
    }
    *out = *x;
    out->dims[x->rank - 1] = w->dims[1];
    return TF_IR_OK;
}

tf_ir_status sh_batchnorm(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    static const char *what[] = {"", "gamma", "beta", "running_mean", "running_var"};
    tf_ir_status st;
    if ((st = need_rank(m, n, 0, 2, TF_MAX_RANK, "input [N, C, ...]", d))) return st;
    for (int i = 1; i < 5; i++) {
        if ((st = need_dtype(m, n, i, IN(0)->dtype, what[i], d))) return st;
        if ((st = need_vec(m, n, i, IN(0)->dims[1], what[i], d))) return st;
    }
    *out = *IN(0);
    return TF_IR_OK;
}

tf_ir_status sh_layernorm(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    if ((st = need_rank(m, n, 0, 1, TF_MAX_RANK, "input", d))) return st;
    tf_dim last = IN(0)->dims[IN(0)->rank - 1];
    for (int i = 1; i < 3; i++) {
        if ((st = need_dtype(m, n, i, IN(0)->dtype, i == 1 ? "gamma" : "beta", d))) return st;
        if ((st = need_vec(m, n, i, last, i == 1 ? "gamma" : "beta", d))) return st;
    }
    *out = *IN(0);
    return TF_IR_OK;
}

tf_ir_status sh_embedding(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b[256];
    if ((st = need_int(m, n, 0, "ids", d))) return st;
    if ((st = need_rank(m, n, 1, 1, TF_MAX_RANK, "table", d))) return st;
    const tf_type *ids = IN(0), *tab = IN(1);
    if (ids->rank + tab->rank - 1 > TF_MAX_RANK)
        return ERR("%s: result would have rank %d, more than %d (ids %s)", OPNAME, ids->rank + tab->rank - 1,
                   TF_MAX_RANK, tstr(m, ids, b));
    int64_t pad = tf_node_int(n, "padding_idx");
    if (pad >= tab->dims[0].n)
        return ERR("%s: padding_idx=%lld is not a row of the table %s", OPNAME, (long long)pad, tstr(m, tab, b));
    out->dtype = tab->dtype;
    out->rank = ids->rank + tab->rank - 1;
    for (int i = 0; i < ids->rank; i++) out->dims[i] = ids->dims[i];
    for (int i = 1; i < tab->rank; i++) out->dims[ids->rank + i - 1] = tab->dims[i];
    return TF_IR_OK;
}

tf_ir_status sh_global_pool(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    if ((st = need_rank(m, n, 0, 3, TF_MAX_RANK, "input [N, C, ...]", d))) return st;
    out->dtype = IN(0)->dtype;
    out->rank = 2;
    out->dims[0] = IN(0)->dims[0];
    out->dims[1] = IN(0)->dims[1];
    return TF_IR_OK;
}

tf_ir_status sh_flatten(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    if ((st = need_rank(m, n, 0, 2, TF_MAX_RANK, "input", d))) return st;
    int64_t p = 1;
    for (int i = 1; i < IN(0)->rank; i++) p *= IN(0)->dims[i].n;   /* bounded by TF_MAX_NUMEL */
    out->dtype = IN(0)->dtype;
    out->rank = 2;
    out->dims[0] = IN(0)->dims[0];
    out->dims[1] = (tf_dim){p, IN(0)->rank == 2 ? IN(0)->dims[1].sym : -1};
    return TF_IR_OK;
}

static tf_dt loss_dtype(tf_dt t) { return t == TF_DT_F64 ? TF_DT_F64 : TF_DT_F32; }

tf_ir_status sh_cross_entropy(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b1[256], b2[256];
    if (!tf_dtype_is_float(IN(0)->dtype))
        return ERR("cross_entropy: logits must be floating, found %s", tstr(m, IN(0), b1));
    if ((st = need_rank(m, n, 0, 1, TF_MAX_RANK, "logits [..., classes]", d))) return st;
    if ((st = need_int(m, n, 1, "labels (class indices)", d))) return st;
    const tf_type *lg = IN(0), *lb = IN(1);
    bool ok = lb->rank == lg->rank - 1;
    for (int i = 0; ok && i < lb->rank; i++) ok = lb->dims[i].n == lg->dims[i].n;
    if (!ok)
        return ERR("cross_entropy: labels must have the logits' shape without its last axis: logits %s, labels %s",
                   tstr(m, lg, b1), tstr(m, lb, b2));
    *out = *lb;
    out->dtype = loss_dtype(lg->dtype);
    if (strcmp(tf_node_str(n, "reduction"), "none")) out->rank = 0;   /* mean, sum: a scalar */
    return TF_IR_OK;
}

tf_ir_status sh_mse_loss(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b1[256], b2[256];
    if ((st = need_dtype(m, n, 1, IN(0)->dtype, "target", d))) return st;
    if (!tf_type_same_shape(IN(0), IN(1)))
        return ERR("mse_loss: prediction and target must have one shape: %s vs %s", tstr(m, IN(0), b1),
                   tstr(m, IN(1), b2));
    out->dtype = loss_dtype(IN(0)->dtype);
    out->rank = 0;
    return TF_IR_OK;
}

tf_ir_status sh_reduce(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m;
    const tf_type *x = IN(0);
    if (x->dtype == TF_DT_BOOL) return ERR("%s: operand must be numeric, found bool", OPNAME);
    const tf_attr *axes = tf_node_attr_named(n, "axes");
    bool keep = tf_node_bool(n, "keepdims");
    bool red[TF_MAX_RANK] = {0};
    if (axes->u.ints.n == 0)
        for (int i = 0; i < x->rank; i++) red[i] = true;
    for (int i = 0; i < axes->u.ints.n; i++) {
        int ax;
        if (!tf_axis_norm(axes->u.ints.v[i].v, x->rank, &ax))
            return ERR("%s: axis %lld is out of range for rank %d", OPNAME, (long long)axes->u.ints.v[i].v, x->rank);
        if (red[ax]) return ERR("%s: axis %d is listed twice in axes", OPNAME, ax);
        red[ax] = true;
    }
    out->dtype = x->dtype;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (!red[i]) out->dims[out->rank++] = x->dims[i];
        else if (keep) out->dims[out->rank++] = (tf_dim){1, -1};
    }
    return TF_IR_OK;
}

tf_ir_status sh_matmul(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b1[256], b2[256];
    if ((st = need_rank(m, n, 0, 2, TF_MAX_RANK, "a", d))) return st;
    if ((st = need_rank(m, n, 1, 2, TF_MAX_RANK, "b", d))) return st;
    if ((st = need_dtype(m, n, 1, IN(0)->dtype, "b", d))) return st;
    const tf_type *a = IN(0), *b = IN(1);
    bool ta = tf_node_bool(n, "transpose_a"), tb = tf_node_bool(n, "transpose_b");
    tf_dim am = a->dims[a->rank - (ta ? 1 : 2)], ak = a->dims[a->rank - (ta ? 2 : 1)];
    tf_dim bk = b->dims[b->rank - (tb ? 1 : 2)], bn = b->dims[b->rank - (tb ? 2 : 1)];
    if (ak.n != bk.n)
        return ERR("matmul: contraction sizes differ: a %s%s has K=%lld, b %s%s has K=%lld", tstr(m, a, b1),
                   ta ? " (transposed)" : "", (long long)ak.n, tstr(m, b, b2), tb ? " (transposed)" : "",
                   (long long)bk.n);
    /* batch axes broadcast */
    int ra = a->rank - 2, rb = b->rank - 2, r = ra > rb ? ra : rb;
    out->dtype = a->dtype;
    out->rank = r + 2;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - ra), ib = i - (r - rb);
        tf_dim da = ia >= 0 ? a->dims[ia] : (tf_dim){1, -1}, db = ib >= 0 ? b->dims[ib] : (tf_dim){1, -1};
        if (da.n != db.n && da.n != 1 && db.n != 1)
            return ERR("matmul: batch axes do not broadcast: a %s, b %s", tstr(m, a, b1), tstr(m, b, b2));
        out->dims[i] = da.n == 1 ? db : da;
    }
    out->dims[r] = am;
    out->dims[r + 1] = bn;
    return TF_IR_OK;
}

/* An INTS attribute given as one value or [h, w]: the two spatial values. */
static tf_ir_status pair_attr(tf_node *n, const char *name, int64_t dflt, int64_t v[2], tf_diag *d)
{
    const tf_attr *a = tf_node_attr_named(n, name);
    if (a->u.ints.n == 0) { v[0] = v[1] = dflt; return TF_IR_OK; }
    if (a->u.ints.n == 1) { v[0] = v[1] = a->u.ints.v[0].v; return TF_IR_OK; }
    if (a->u.ints.n == 2) { v[0] = a->u.ints.v[0].v; v[1] = a->u.ints.v[1].v; return TF_IR_OK; }
    return ERR("%s: %s must be one int or [h, w], found a list of %d", OPNAME, name, a->u.ints.n);
}

/* floor((in + 2p - dil*(k-1) - 1)/s) + 1, or an error if the window does not fit. */
static tf_ir_status window_out(tf_node *n, const char *axis, int64_t in, int64_t k, int64_t s, int64_t p, int64_t dil,
                               int64_t *out, tf_diag *d)
{
    int64_t span = dil * (k - 1) + 1;
    if (in + 2 * p < span)
        return ERR("%s: window %lld (dilated %lld) does not fit the %s extent %lld with padding %lld", OPNAME,
                   (long long)k, (long long)span, axis, (long long)in, (long long)p);
    *out = (in + 2 * p - span) / s + 1;
    return TF_IR_OK;
}

tf_ir_status sh_conv2d(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b1[256], b2[256];
    if ((st = need_rank(m, n, 0, 4, 4, "input [N, C, H, W]", d))) return st;
    if ((st = need_rank(m, n, 1, 4, 4, "weight [out, in/groups, kh, kw]", d))) return st;
    if ((st = need_dtype(m, n, 1, IN(0)->dtype, "weight", d))) return st;
    const tf_type *x = IN(0), *w = IN(1);
    int64_t g = tf_node_int(n, "groups"), C = x->dims[1].n, O = w->dims[0].n;
    int64_t s[2] = {0}, p[2] = {0}, dl[2] = {0};
    if ((st = pair_attr(n, "stride", 1, s, d)) || (st = pair_attr(n, "padding", 0, p, d)) ||
        (st = pair_attr(n, "dilation", 1, dl, d)))
        return st;
    if (C % g || O % g || w->dims[1].n * g != C)
        return ERR("conv2d: channels do not agree: input %s has %lld channels, weight %s with groups=%lld expects "
                   "%lld (and out channels divisible by groups)",
                   tstr(m, x, b1), (long long)C, tstr(m, w, b2), (long long)g, (long long)(w->dims[1].n * g));
    if (n->nin == 3) {
        if ((st = need_dtype(m, n, 2, x->dtype, "bias", d))) return st;
        if ((st = need_vec(m, n, 2, w->dims[0], "bias", d))) return st;
    }
    int64_t ho = 0, wo = 0;
    if ((st = window_out(n, "height", x->dims[2].n, w->dims[2].n, s[0], p[0], dl[0], &ho, d)) ||
        (st = window_out(n, "width", x->dims[3].n, w->dims[3].n, s[1], p[1], dl[1], &wo, d)))
        return st;
    out->dtype = x->dtype;
    out->rank = 4;
    out->dims[0] = x->dims[0];
    out->dims[1] = w->dims[0];
    out->dims[2] = (tf_dim){ho, ho == x->dims[2].n ? x->dims[2].sym : -1};
    out->dims[3] = (tf_dim){wo, wo == x->dims[3].n ? x->dims[3].sym : -1};
    return TF_IR_OK;
}

tf_ir_status sh_pool(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    if ((st = need_rank(m, n, 0, 4, 4, "input [N, C, H, W]", d))) return st;
    const tf_type *x = IN(0);
    int64_t k[2] = {0}, s[2] = {0}, p[2] = {0};
    if ((st = pair_attr(n, "kernel", 1, k, d))) return st;
    if ((st = pair_attr(n, "stride", 0, s, d)) || (st = pair_attr(n, "padding", 0, p, d))) return st;
    if (s[0] == 0) { s[0] = k[0]; s[1] = k[1]; }
    for (int i = 0; i < 2; i++)
        if (2 * p[i] > k[i])
            return ERR("%s: padding %lld is more than half the kernel %lld", OPNAME, (long long)p[i],
                       (long long)k[i]);
    int64_t ho = 0, wo = 0;
    if ((st = window_out(n, "height", x->dims[2].n, k[0], s[0], p[0], 1, &ho, d)) ||
        (st = window_out(n, "width", x->dims[3].n, k[1], s[1], p[1], 1, &wo, d)))
        return st;
    *out = *x;
    out->dims[2] = (tf_dim){ho, -1};
    out->dims[3] = (tf_dim){wo, -1};
    return TF_IR_OK;
}

tf_ir_status sh_reshape(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    const tf_attr *a = tf_node_attr_named(n, "shape");
    int64_t numel = tf_type_numel(IN(0)), known = 1;
    int infer = -1;
    if (a->u.ints.n > TF_MAX_RANK) return ERR("reshape: shape has %d axes, at most %d", a->u.ints.n, TF_MAX_RANK);
    out->dtype = IN(0)->dtype;
    out->rank = a->u.ints.n;
    for (int i = 0; i < a->u.ints.n; i++) {
        tf_ival v = a->u.ints.v[i];
        if (v.v == -1) {
            if (infer >= 0) return ERR("reshape: only one axis may be -1, found two (axes %d and %d)", infer, i);
            infer = i;
            continue;
        }
        if (v.v == 0) return ERR("reshape: axis %d has size 0; sizes must be positive (or one -1)", i);
        out->dims[i] = (tf_dim){v.v, v.sym};
        if (known > TF_MAX_NUMEL / v.v) return ERR("reshape: shape's element count overflows");
        known *= v.v;
    }
    if (infer >= 0) {
        if (numel % known)
            return ERR("reshape: cannot infer the -1 axis: %lld elements of %s are not a multiple of %lld",
                       (long long)numel, tstr(m, IN(0), b), (long long)known);
        out->dims[infer] = (tf_dim){numel / known, -1};
        known = numel;
    }
    if (known != numel)
        return ERR("reshape: %s has %lld elements, shape asks for %lld", tstr(m, IN(0), b), (long long)numel,
                   (long long)known);
    return TF_IR_OK;
}

tf_ir_status sh_transpose(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    const tf_attr *a = tf_node_attr_named(n, "perm");
    const tf_type *x = IN(0);
    if (a->u.ints.n != x->rank)
        return ERR("transpose: perm has %d entries, operand %s has rank %d", a->u.ints.n, tstr(m, x, b), x->rank);
    bool seen[TF_MAX_RANK] = {0};
    *out = *x;
    for (int i = 0; i < x->rank; i++) {
        int64_t p = a->u.ints.v[i].v;
        if (p >= x->rank || seen[p])
            return ERR("transpose: perm must be a permutation of 0..%d, found %lld at position %d", x->rank - 1,
                       (long long)p, i);
        seen[p] = true;
        out->dims[i] = x->dims[p];
    }
    return TF_IR_OK;
}

tf_ir_status sh_broadcast_to(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    const tf_attr *a = tf_node_attr_named(n, "shape");
    const tf_type *x = IN(0);
    if (a->u.ints.n > TF_MAX_RANK || a->u.ints.n < x->rank)
        return ERR("broadcast: target has %d axes; it needs between the operand's rank %d and %d", a->u.ints.n,
                   x->rank, TF_MAX_RANK);
    out->dtype = x->dtype;
    out->rank = a->u.ints.n;
    for (int i = 0; i < out->rank; i++) {
        out->dims[i] = (tf_dim){a->u.ints.v[i].v, a->u.ints.v[i].sym};
        int j = i - (out->rank - x->rank);
        if (j >= 0 && x->dims[j].n != 1 && x->dims[j].n != out->dims[i].n)
            return ERR("broadcast: %s cannot broadcast to axis %d of size %lld", tstr(m, x, b), i,
                       (long long)out->dims[i].n);
    }
    return TF_IR_OK;
}

tf_ir_status sh_slice(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    const tf_type *x = IN(0);
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), x->rank, &ax))
        return ERR("slice: axis %lld is out of range for %s", (long long)tf_node_int(n, "axis"), tstr(m, x, b));
    int64_t len = x->dims[ax].n, st, en, step = tf_node_int(n, "step");
    tf_slice_bounds(len, tf_node_int(n, "start"), tf_node_int(n, "end"), &st, &en);
    if (en <= st)
        return ERR("slice: empty result: [%lld:%lld] of axis %d (size %lld)", (long long)tf_node_int(n, "start"),
                   (long long)tf_node_int(n, "end"), ax, (long long)len);
    *out = *x;
    out->dims[ax] = (tf_dim){(en - st + step - 1) / step, -1};
    if (out->dims[ax].n == len) out->dims[ax].sym = x->dims[ax].sym;
    return TF_IR_OK;
}

tf_ir_status sh_concat(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b1[256], b2[256];
    tf_ir_status st;
    const tf_type *x = IN(0);
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), x->rank, &ax))
        return ERR("concat: axis %lld is out of range for %s", (long long)tf_node_int(n, "axis"), tstr(m, x, b1));
    *out = *x;
    for (int i = 1; i < n->nin; i++) {
        const tf_type *y = IN(i);
        if ((st = need_dtype(m, n, i, x->dtype, "every operand", d))) return st;
        bool ok = y->rank == x->rank;
        for (int k = 0; ok && k < x->rank; k++) ok = k == ax || y->dims[k].n == x->dims[k].n;
        if (!ok)
            return ERR("concat: operand %d ('%s', %s) does not match operand 1 ('%s', %s) outside axis %d", i + 1,
                       n->in[i]->name ? n->in[i]->name : "?", tstr(m, y, b2), n->in[0]->name ? n->in[0]->name : "?", tstr(m, x, b1), ax);
        out->dims[ax].n += y->dims[ax].n;
        out->dims[ax].sym = -1;
        if (out->dims[ax].n > TF_MAX_DIM) return ERR("concat: axis %d grows beyond %lld", ax, (long long)TF_MAX_DIM);
    }
    return TF_IR_OK;
}

tf_ir_status sh_one_hot(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    if ((st = need_int(m, n, 0, "labels", d))) return st;
    if (IN(0)->rank >= TF_MAX_RANK) return ERR("one_hot: labels have rank %d; the result would exceed %d", IN(0)->rank, TF_MAX_RANK);
    *out = *IN(0);
    out->dtype = tf_node_attr_named(n, "dtype")->u.dt;
    out->dims[out->rank++] = (tf_dim){tf_node_int(n, "depth"), tf_node_attr_named(n, "depth")->u.i.sym};
    return TF_IR_OK;
}

tf_ir_status sh_iota(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m;
    const tf_attr *a = tf_node_attr_named(n, "shape");
    if (a->u.ints.n < 1 || a->u.ints.n > TF_MAX_RANK)
        return ERR("iota: shape must have 1..%d axes, found %d", TF_MAX_RANK, a->u.ints.n);
    out->dtype = tf_node_attr_named(n, "dtype")->u.dt;
    out->rank = a->u.ints.n;
    for (int i = 0; i < out->rank; i++) out->dims[i] = (tf_dim){a->u.ints.v[i].v, a->u.ints.v[i].sym};
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), out->rank, &ax))
        return ERR("iota: axis %lld is out of range for rank %d", (long long)tf_node_int(n, "axis"), out->rank);
    if (out->dtype == TF_DT_BOOL) return ERR("iota: dtype must be numeric, found bool");
    return TF_IR_OK;
}

tf_ir_status sh_softmax(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), IN(0)->rank, &ax))
        return ERR("%s: axis %lld is out of range for %s", OPNAME, (long long)tf_node_int(n, "axis"), tstr(m, IN(0), b));
    *out = *IN(0);
    return TF_IR_OK;
}

/* ---- backward ops: the gradient has the forward operand's shape (the
 * `shape` attribute); the rule checks that the forward op maps that shape
 * onto dy's, so a wrongly built backward graph fails here. */

static tf_ir_status shape_attr(tf_node *n, tf_dt dt, tf_type *out, tf_diag *d)
{
    const tf_attr *a = tf_node_attr_named(n, "shape");
    if (a->u.ints.n < 1 || a->u.ints.n > TF_MAX_RANK)
        return ERR("%s: shape must have 1..%d axes, found %d", OPNAME, TF_MAX_RANK, a->u.ints.n);
    out->dtype = dt;
    out->rank = a->u.ints.n;
    for (int i = 0; i < out->rank; i++) out->dims[i] = (tf_dim){a->u.ints.v[i].v, a->u.ints.v[i].sym};
    return TF_IR_OK;
}

static tf_ir_status conv_forward_shape(tf_node *n, const tf_type *x, const tf_type *w, const tf_type *dy, tf_diag *d)
{
    int64_t s[2] = {0}, p[2] = {0}, dl[2] = {0}, ho = 0, wo = 0, g = tf_node_int(n, "groups");
    tf_ir_status st;
    if (x->rank != 4 || w->rank != 4 || dy->rank != 4)
        return ERR("%s: input, weight and dy must have rank 4", OPNAME);
    if ((st = pair_attr(n, "stride", 1, s, d)) || (st = pair_attr(n, "padding", 0, p, d)) ||
        (st = pair_attr(n, "dilation", 1, dl, d)))
        return st;
    if (x->dims[1].n != w->dims[1].n * g || w->dims[0].n % g)
        return ERR("%s: channels do not agree with groups=%lld", OPNAME, (long long)g);
    if ((st = window_out(n, "height", x->dims[2].n, w->dims[2].n, s[0], p[0], dl[0], &ho, d)) ||
        (st = window_out(n, "width", x->dims[3].n, w->dims[3].n, s[1], p[1], dl[1], &wo, d)))
        return st;
    if (dy->dims[0].n != x->dims[0].n || dy->dims[1].n != w->dims[0].n || dy->dims[2].n != ho || dy->dims[3].n != wo)
        return ERR("%s: dy is not the forward conv's output shape [%lld, %lld, %lld, %lld]", OPNAME,
                   (long long)x->dims[0].n, (long long)w->dims[0].n, (long long)ho, (long long)wo);
    return TF_IR_OK;
}

tf_ir_status sh_conv2d_grad_input(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m;
    tf_ir_status st;
    if ((st = shape_attr(n, IN(0)->dtype, out, d))) return st;
    return conv_forward_shape(n, out, IN(1), IN(0), d);
}

tf_ir_status sh_conv2d_grad_weight(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m;
    tf_ir_status st;
    if ((st = shape_attr(n, IN(1)->dtype, out, d))) return st;
    return conv_forward_shape(n, IN(0), out, IN(1), d);
}

static tf_ir_status pool_forward_shape(tf_node *n, const tf_type *x, const tf_type *dy, tf_diag *d)
{
    int64_t k[2] = {0}, s[2] = {0}, p[2] = {0}, ho = 0, wo = 0;
    tf_ir_status st;
    if (x->rank != 4 || dy->rank != 4) return ERR("%s: input and dy must have rank 4", OPNAME);
    if ((st = pair_attr(n, "kernel", 1, k, d)) || (st = pair_attr(n, "stride", 0, s, d)) ||
        (st = pair_attr(n, "padding", 0, p, d)))
        return st;
    if (s[0] == 0) { s[0] = k[0]; s[1] = k[1]; }
    if ((st = window_out(n, "height", x->dims[2].n, k[0], s[0], p[0], 1, &ho, d)) ||
        (st = window_out(n, "width", x->dims[3].n, k[1], s[1], p[1], 1, &wo, d)))
        return st;
    if (dy->dims[0].n != x->dims[0].n || dy->dims[1].n != x->dims[1].n || dy->dims[2].n != ho || dy->dims[3].n != wo)
        return ERR("%s: dy is not the forward pool's output shape", OPNAME);
    return TF_IR_OK;
}

tf_ir_status sh_maxpool2d_grad(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m;
    tf_ir_status st;
    if ((st = need_dtype(m, n, 1, IN(0)->dtype, "dy", d))) return st;
    *out = *IN(0);
    return pool_forward_shape(n, IN(0), IN(1), d);
}

tf_ir_status sh_avgpool2d_grad(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    (void)m;
    tf_ir_status st;
    if ((st = shape_attr(n, IN(0)->dtype, out, d))) return st;
    return pool_forward_shape(n, out, IN(0), d);
}

tf_ir_status sh_scatter_add(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    tf_ir_status st;
    char b[256];
    if ((st = need_int(m, n, 0, "ids", d))) return st;
    if ((st = shape_attr(n, IN(1)->dtype, out, d))) return st;
    const tf_type *ids = IN(0), *dy = IN(1);
    bool ok = dy->rank == ids->rank + out->rank - 1;
    for (int i = 0; ok && i < ids->rank; i++) ok = dy->dims[i].n == ids->dims[i].n;
    for (int i = 1; ok && i < out->rank; i++) ok = dy->dims[ids->rank + i - 1].n == out->dims[i].n;
    if (!ok) return ERR("scatter_add: dy %s must be ids' shape followed by the table's row shape", tstr(m, dy, b));
    return TF_IR_OK;
}

tf_ir_status sh_slice_grad(tf_module *m, tf_node *n, tf_type *out, tf_diag *d)
{
    char b[256];
    const tf_type *dy = IN(0);
    int ax;
    if (!tf_axis_norm(tf_node_int(n, "axis"), dy->rank, &ax))
        return ERR("slice_grad: axis %lld is out of range for %s", (long long)tf_node_int(n, "axis"), tstr(m, dy, b));
    int64_t len = tf_node_int(n, "size"), st, en, step = tf_node_int(n, "step");
    tf_slice_bounds(len, tf_node_int(n, "start"), tf_node_int(n, "end"), &st, &en);
    if (en <= st || (en - st + step - 1) / step != dy->dims[ax].n)
        return ERR("slice_grad: slicing an axis of %lld does not give dy's %lld", (long long)len, (long long)dy->dims[ax].n);
    *out = *dy;
    out->dims[ax] = (tf_dim){len, -1};
    return TF_IR_OK;
}
