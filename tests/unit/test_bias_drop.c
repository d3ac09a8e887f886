/* test_bias_drop.c — bias_drop must not change what a model computes.
 *
 * For examples/cnn.ir and small models that exercise each rule (bias drops
 * through pools, kept biases, folds into conv2d/linear with and without a
 * bias, grouped and strided convs, fp16, a batchnorm after a batchnorm), in
 * train and infer mode: run the interpreter on `lower` and on
 * `bias_drop,lower` of the same module, from the same fresh random params,
 * buffers and inputs (biases and running statistics far from 0 and 1), for
 * two steps. Outputs must agree. In train mode the buffers are checked too:
 * running_var agrees, and running_mean differs by exactly what the dropped
 * bias contributed (d <- (1 - momentum) * d + momentum * bias per step),
 * zero where nothing was dropped. Each module also stays valid, a second
 * run of the pass changes nothing, and in infer mode no batchnorm is left
 * where one was expected to fold. The seed comes from TFUSE_TEST_SEED or the
 * clock and is printed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "testutil.h"
#include "interp.h"
#include "parser.h"
#include "passes.h"

typedef struct model {
    const char *label, *text;   /* text NULL: examples/<label> */
    int bn_left_infer;          /* batchnorms bias_drop leaves in infer mode */
} model;

#define BN(i, x, c) "buffer m" #i " : f32[" #c "] = zeros()\nbuffer v" #i " : f32[" #c "] = ones()\n" \
                    "n" #i " = batchnorm(" x ", g" #c ", b" #c ", m" #i ", v" #i ", momentum=0.3)\n"

static const model models[] = {
    {"cnn.ir", NULL, 0},
    {"rules",
     "dim N = 3\ninput x : f32[N, 3, 9, 9]\ninput v : f32[N, 5]\n"
     "param g4 : f32[4] = ones()\nparam b4 : f32[4] = zeros()\nparam g6 : f32[6] = ones()\nparam b6 : f32[6] = zeros()\n"
     "param w1 : f32[4, 3, 3, 3] = kaiming_uniform()\nparam c1 : f32[4] = zeros()\n"
     "param w2 : f32[6, 2, 2, 2] = kaiming_uniform()\nparam c2 : f32[6] = zeros()\n"
     "param fw : f32[5, 4] = xavier_uniform()\nparam fb : f32[4] = zeros()\nparam sb : f32[4] = zeros()\n"
     /* conv -> maxpool(padding) -> bn: dropped */
     "x1 = conv2d(x, w1, c1, padding=1)\np1 = maxpool2d(x1, kernel=3, stride=2, padding=1)\n" BN(1, "p1", 4)
     /* grouped strided conv -> avgpool (no padding) -> bn: dropped */
     "x2 = conv2d(n1, w2, c2, stride=[1, 2], groups=2, dilation=2)\np2 = avgpool2d(x2, kernel=2, stride=1)\n" BN(2, "p2", 6)
     /* conv -> global_avgpool -> bn: dropped */
     "x3 = conv2d(x, w1, c1)\np3 = global_avgpool(x3)\n" BN(3, "p3", 4)
     /* linear -> bn: dropped; shared bias: dropped from one, kept as a param */
     "h4 = linear(v, fw, fb)\n" BN(4, "h4", 4) "h5 = linear(v, fw, sb)\n" BN(5, "h5", 4) "k5 = linear(v, fw, sb)\n"
     /* kept: relu between; avgpool with padding; conv result also an output */
     "x6 = conv2d(x, w1, c1)\nr6 = relu(x6)\n" BN(6, "r6", 4)
     "x7 = conv2d(x, w1, c1)\na7 = avgpool2d(x7, kernel=3, stride=1, padding=1)\n" BN(7, "a7", 4)
     "x8 = conv2d(x, w1, c1)\n" BN(8, "x8", 4)
     /* bn after bn; conv without a bias */
     "x9 = conv2d(x, w1, padding=2)\n" BN(9, "x9", 4) BN(10, "n9", 4)
     "output n1\noutput n2\noutput n3\noutput n4\noutput n5\noutput k5\noutput n6\noutput n7\noutput n8\noutput x8\n"
     "output n10\n",
     /* infer: n1-n3 (pools), n6 (relu), n7 (avgpool), n8 (second use) stay */
     6},
    {"fp16",
     "input x : f16[4, 3, 5, 5]\nparam w : f16[6, 3, 3, 3] = kaiming_uniform()\nparam c : f16[6] = zeros()\n"
     "param g6 : f16[6] = ones()\nparam b6 : f16[6] = zeros()\nbuffer m1 : f16[6] = zeros()\nbuffer v1 : f16[6] = ones()\n"
     "x1 = conv2d(x, w, c, padding=1)\nn1 = batchnorm(x1, g6, b6, m1, v1)\noutput n1\n",
     0},
};

static uint64_t g_seed;


static bool is_running_var(const tf_module *m, const tf_value *v)
{
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        if (n->op == TF_OP_BATCHNORM && n->in[4] == v) return true;
    }
    return false;
}


/* Give every declaration of `src` the same random values in both contexts
 * (where the module still has it). Inputs each step; state once. */
static bool fill(const tf_module *src, tf_interp_ctx *const ip[2], tf_module *const mod[2], bool state, uint64_t seed)
{
    tf_diag d = {0};
    for (int i = 0; i < src->decls.n; i++) {
        const tf_value *v = src->decls.items[i];
        if ((v->kind == TF_VAL_INPUT) == state) continue;
        uint64_t s = (seed ^ tf_rng_stream(v->name)) | 1;
        bool var = is_running_var(src, v);
        int64_t bound = test_int_bound(src, v);
        tf_tensor *t[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            tf_value *w = tf_module_find_value(mod[k], v->name);
            if (w && !(t[k] = tf_interp_tensor(ip[k], w, &d))) return false;
        }
        for (int64_t e = 0; t[0] && e < t[0]->numel; e++) {
            double u = test_rnd(&s);
            double x = !tf_dtype_is_float(v->type.dtype) ? (double)(int64_t)(u * (double)bound) : var ? 0.3 + 2 * u : 4 * u - 2;
            t[0]->data[e] = tf_dtype_round(v->type.dtype, x);
            if (t[1]) t[1]->data[e] = t[0]->data[e];
        }
    }
    return true;
}

/* |a - b| <= rtol * (|a| + max|a|): the tolerance is on the tensor's scale,
 * since a batchnorm output near 0 keeps only the rounding of its inputs. */
static void compare(const char *what, const tf_tensor *a, const tf_tensor *b, const double *shift)
{
    bool half = a->dtype == TF_DT_F16 || a->dtype == TF_DT_BF16;
    double rtol = half ? 8e-3 : 2e-5, scale = 0;
    for (int64_t k = 0; k < a->numel; k++) scale = fmax(scale, fabs(a->data[k]));
    int bad = 0;
    for (int64_t k = 0; k < a->numel && bad < 3; k++) {
        double want = a->data[k] - (shift ? shift[k] : 0);
        if (!check_close(b->data[k], want, rtol, rtol * scale)) {
            bad++;
            CHECK(0, "%s[%lld]: lower %.9g, bias_drop+lower %.9g, expected %.9g (seed %llu)", what, (long long)k,
                  a->data[k], b->data[k], want, (unsigned long long)g_seed);
        }
    }
    if (!bad) check_passed++;
}

/* The conv2d/linear whose bias reaches batchnorm bn in the original module,
 * if bias_drop dropped it (found by name in the dropped module). */
static const tf_node *dropped_source(const tf_node *bn, tf_module *dropped)
{
    const tf_value *v = bn->in[0];
    while (v->kind == TF_VAL_NODE && (v->def->op == TF_OP_MAXPOOL2D || v->def->op == TF_OP_AVGPOOL2D ||
                                      v->def->op == TF_OP_GLOBAL_AVGPOOL))
        v = v->def->in[0];
    if (v->kind != TF_VAL_NODE || (v->def->op != TF_OP_CONV2D && v->def->op != TF_OP_LINEAR) || v->def->nin != 3)
        return NULL;
    const tf_value *w = tf_module_find_value(dropped, v->name);
    return w && w->def && w->def->nin == 2 ? v->def : NULL;
}

static int count_op(const tf_module *m, int op)
{
    int k = 0;
    for (int i = 0; i < m->nodes.n; i++) k += ((const tf_node *)m->nodes.items[i])->op == op;
    return k;
}

static void run_model(const model *md, const char *text, tf_ir_mode mode)
{
    const char *what = mode == TF_IR_TRAIN ? "train" : "infer";
    tf_diag d = {0};
    tf_module *m = NULL, *mod[2] = {NULL, NULL}, *dropped = NULL;
    tf_interp_ctx *ip[2] = {NULL, NULL};
    tf_options o = {.mode = mode, .diag = &d};
    if (tf_parse(md->label, text, strlen(text), NULL, 0, &m, &d)) {
        CHECK(0, "%s does not parse: %s", md->label, d.msg);
        return;
    }
    dropped = tf_module_clone(m);
    bool ok = dropped && !pass_bias_drop(dropped, &o) && !tf_verify(dropped, &d);
    CHECK(ok, "%s %s: bias_drop failed: %s", md->label, what, d.msg);
    if (!ok) goto out;
    /* idempotent: a second run prints the same module */
    tf_module *again = tf_module_clone(dropped);
    char *p1 = tf_print_module(dropped), *p2 = NULL;
    if (again && !pass_bias_drop(again, &o) && !tf_verify(again, &d)) p2 = tf_print_module(again);
    CHECK(p1 && p2 && !strcmp(p1, p2), "%s %s: a second bias_drop changed the module", md->label, what);
    tf_free(p1);
    tf_free(p2);
    tf_module_free(again);
    if (mode == TF_IR_INFER)
        CHECK(count_op(dropped, TF_OP_BATCHNORM) == md->bn_left_infer, "%s: %d batchnorms left after folding, expected %d",
              md->label, count_op(dropped, TF_OP_BATCHNORM), md->bn_left_infer);
    mod[0] = tf_module_clone(m);
    mod[1] = tf_module_clone(dropped);
    ok = mod[0] && mod[1] && !pass_lower(mod[0], &o) && !tf_verify(mod[0], &d) && !pass_lower(mod[1], &o) &&
         !tf_verify(mod[1], &d);
    CHECK(ok, "%s %s: lower failed: %s", md->label, what, d.msg);
    if (!ok) goto out;
    for (int k = 0; k < 2; k++) ip[k] = tf_interp_create(mod[k], mode, g_seed);
    ok = ip[0] && ip[1] && !tf_interp_init_state(ip[0], &d) && !tf_interp_init_state(ip[1], &d) &&
         fill(m, ip, mod, true, g_seed);
    CHECK(ok, "%s: interpreter setup: %s", md->label, d.msg);
    double *shift[64] = {0};   /* per original batchnorm: expected running_mean difference */
    for (int step = 0; ok && step < 2; step++) {
        ok = fill(m, ip, mod, false, g_seed + 7919 * (uint64_t)(step + 1));
        if (ok && (tf_interp_run(ip[0], &d) || tf_interp_run(ip[1], &d))) {
            CHECK(0, "%s %s: run failed: %s", md->label, what, d.msg);
            ok = false;
        }
        char nm[300];
        for (int i = 0; ok && i < m->noutputs; i++) {
            snprintf(nm, sizeof nm, "%s %s step %d output %s", md->label, what, step, m->outputs[i].name);
            compare(nm, tf_interp_tensor(ip[0], mod[0]->outputs[i].value, &d),
                    tf_interp_tensor(ip[1], mod[1]->outputs[i].value, &d), NULL);
        }
        for (int i = 0, j = 0; ok && mode == TF_IR_TRAIN && i < m->nodes.n && j < 64; i++) {
            const tf_node *bn = m->nodes.items[i];
            if (bn->op != TF_OP_BATCHNORM) continue;
            const tf_value *rm = bn->in[3], *rv = bn->in[4];
            const tf_tensor *ta = tf_interp_tensor(ip[0], tf_module_find_value(mod[0], rm->name), &d);
            const tf_tensor *tb = tf_interp_tensor(ip[1], tf_module_find_value(mod[1], rm->name), &d);
            const tf_node *src = dropped_source(bn, dropped);
            double mom = tf_node_float(bn, "momentum");
            if (!shift[j]) shift[j] = tf_calloc((size_t)ta->numel, sizeof(double));
            if (src) {
                const tf_tensor *bias = tf_interp_tensor(ip[0], tf_module_find_value(mod[0], src->in[2]->name), &d);
                for (int64_t k = 0; k < ta->numel; k++) shift[j][k] = (1 - mom) * shift[j][k] + mom * bias->data[k];
            }
            snprintf(nm, sizeof nm, "%s train step %d running mean %s (%s)", md->label, step, rm->name,
                     src ? "bias dropped" : "bias kept");
            compare(nm, ta, tb, shift[j]);
            snprintf(nm, sizeof nm, "%s train step %d running var %s", md->label, step, rv->name);
            compare(nm, tf_interp_tensor(ip[0], tf_module_find_value(mod[0], rv->name), &d),
                    tf_interp_tensor(ip[1], tf_module_find_value(mod[1], rv->name), &d), NULL);
            j++;
        }
    }
    for (int j = 0; j < 64; j++) tf_free(shift[j]);
out:
    for (int k = 0; k < 2; k++) {
        tf_interp_free(ip[k]);
        tf_module_free(mod[k]);
    }
    tf_module_free(dropped);
    tf_module_free(m);
}


/* The pass really drops: cnn.ir in train mode loses both conv biases, whose
 * params stay, read by nothing, marked zero_grad (autodiff gives them a zero
 * gradient, so the optimizer's weight decay still applies); the classifier's
 * bias (no batchnorm) is untouched. */
static void check_cnn_train(const char *text)
{
    tf_diag d = {0};
    tf_module *m;
    tf_options o = {.mode = TF_IR_TRAIN, .diag = &d};
    if (tf_parse("cnn.ir", text, strlen(text), NULL, 0, &m, &d)) return;
    CHECK(!pass_bias_drop(m, &o) && !tf_verify(m, &d), "cnn train: %s", d.msg);
    const tf_value *c1b = tf_module_find_value(m, "c1.b"), *c2b = tf_module_find_value(m, "c2.b");
    const tf_value *fcb = tf_module_find_value(m, "fc.b");
    CHECK(c1b && c2b && c1b->zero_grad && c2b->zero_grad, "cnn: the conv bias params are not kept with a zero gradient");
    CHECK(fcb != NULL && !fcb->zero_grad, "cnn: the classifier's bias was touched");
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++) CHECK(n->in[k] != c1b && n->in[k] != c2b, "cnn: a dropped bias is still read");
    }
    const tf_value *x1 = tf_module_find_value(m, "x1");
    CHECK(x1 && x1->def && x1->def->nin == 2, "cnn: x1 keeps its bias");
    tf_module_free(m);
}

int main(void)
{
    g_seed = test_seed();
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char path[4096];
        char *text = NULL;
        if (!models[i].text) {
            text = test_read_example(models[i].label, path, sizeof path);
            CHECK(text != NULL, "cannot read %s (set TFUSE_EXAMPLES)", path);
            if (!text) continue;
            check_cnn_train(text);
        }
        for (int mode = 0; mode < 2; mode++) run_model(&models[i], text ? text : models[i].text, (tf_ir_mode)mode);
        free(text);   /* test_read_example's */
    }
    return check_report();
}
