/* test_lower_equiv.c — `lower` must not change what a model computes.
 *
 * For every example model and a set of small models that together use every
 * layer op, in train and infer mode: run the interpreter on the module as
 * written (layer ops run their own kernels) and on its lowered form (core ops
 * only), from the same seed, on the same fresh random inputs, for two steps;
 * every output and every buffer must agree. The seed comes from
 * TFUSE_TEST_SEED or the clock and is printed, so a failure can be replayed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "testutil.h"
#include "interp.h"
#include "parser.h"
#include "passes.h"

/* Small models covering the layer ops the examples leave out. */
static const char *extra[] = {
    "dim N = 5\ninput x : f32[N, 7]\ninput t : f32[N, 3]\nparam w : f32[7, 3] = uniform(low=-1.0, high=1.0)\n"
    "param g : f32[3] = normal(std=1.0)\nparam b : f32[3] = normal(std=1.0)\nbuffer m : f32[3] = zeros()\n"
    "buffer v : f32[3] = ones()\nh = linear(x, w)\nn = batchnorm(h, g, b, m, v, momentum=0.3, eps=0.001)\n"
    "s = silu(n)\nd = dropout(s, p=0.25, salt=3)\nl = mse_loss(d, t)\noutput l\noutput d\n",

    "input x : f32[2, 3, 4]\nparam w : f32[4, 6] = xavier_uniform()\nparam u : f32[4] = normal(std=1.0)\n"
    "param b : f32[6] = normal(std=1.0)\nh = linear(x, w, b)\ng = gelu(h, approx=\"tanh\")\ne = gelu(h)\n"
    "s = softmax(g, axis=1)\nl = log_softmax(e, axis=0)\ny = sum(s, axes=[0, 2], keepdims=true)\n"
    "z = mean(l, axes=[-1])\nq = max(e, axes=[])\nv = linear(u, w, b)\noutput y\noutput z\noutput q\noutput v\n",

    "input q : f32[2, 3, 5, 4]\ninput k : f32[2, 3, 6, 4]\ninput v : f32[2, 3, 6, 2]\n"
    "a = attention(q, k, v)\nc = attention(q, k, v, causal=true)\noutput a\noutput c\n",

    /* attention's operands: grouped-query heads, a bool mask with a row that sees no key, an additive mask
     * with causal and a scale, dropout (train mode); both lowerings (fused and decomposed) are checked */
    "input q : f32[2, 4, 5, 4]\ninput k : f32[2, 2, 6, 4]\ninput v : f32[2, 2, 6, 3]\ninput bias : f32[1, 4, 1, 6]\n"
    "col = iota(shape=[2, 1, 5, 6], axis=3)\nrow = iota(shape=[2, 1, 5, 6], axis=2)\nkeep = lt(col, row)\n"
    "a = attention(q, k, v, keep)\nb = attention(q, k, v, bias, causal=true, scale=0.3)\n"
    "c = attention(q, k, v, dropout=0.4, salt=7)\noutput a\noutput b\noutput c\n",

    "input x : f32[2, 4, 9, 7]\nparam w : f32[6, 2, 3, 3] = kaiming_uniform()\nparam b : f32[6] = normal(std=1.0)\n"
    "c = conv2d(x, w, b, stride=[2, 1], padding=[1, 2], dilation=2, groups=2)\nm = maxpool2d(c, kernel=[2, 3], stride=1, padding=1)\n"
    "a = avgpool2d(c, kernel=3, stride=2, padding=1)\ng = global_avgpool(m)\nf = flatten(a)\noutput g\noutput f\n",

    /* half precision: norms, softmax and losses compute in fp32 inside */
    "input x : f16[3, 4, 5]\ninput y : i64[3, 4]\ninput q : bf16[1, 2, 5, 4]\nparam g : f16[5] = normal(std=1.0)\n"
    "param b : f16[5] = normal(std=1.0)\nparam c : f16[4] = normal(std=1.0)\nbuffer m : f16[4] = zeros()\n"
    "buffer v : f16[4] = ones()\nl = layernorm(x, g, b)\ns = log_softmax(l, axis=1)\nn = batchnorm(x, c, c, m, v)\n"
    "e = cross_entropy(x, y)\na = attention(q, q, q, causal=true)\nr = mean(x, axes=[1])\n"
    "output s\noutput n\noutput e\noutput a\noutput r\n",

    "input x : f32[3, 4, 5]\nbuffer rm : f32[4] = normal(std=0.1)\nbuffer rv : f32[4] = uniform(low=0.5, high=2.0)\n"
    "param g : f32[4] = normal(std=1.0)\nparam b : f32[4] = normal(std=1.0)\n"
    "n = batchnorm(x, g, b, rm, rv)\noutput n\n",
};

static uint64_t g_seed;



static bool fill_inputs(tf_interp_ctx *a, tf_interp_ctx *b, tf_module *ma, tf_module *mb, uint64_t seed)
{
    tf_diag d = {0};
    for (int i = 0; i < ma->decls.n; i++) {
        tf_value *va = ma->decls.items[i], *vb = mb->decls.items[i];
        if (va->kind != TF_VAL_INPUT) continue;
        tf_tensor *ta = tf_interp_tensor(a, va, &d), *tb = tf_interp_tensor(b, vb, &d);
        if (!ta || !tb) return false;
        uint64_t s = seed ^ tf_rng_stream(va->name);
        int64_t bound = test_int_bound(ma, va);
        for (int64_t k = 0; k < ta->numel; k++) {
            double u = test_rnd(&s);
            double x = tf_dtype_is_float(va->type.dtype) ? 4 * u - 2 : (double)(int64_t)(u * (double)bound);
            ta->data[k] = tb->data[k] = tf_dtype_round(va->type.dtype, x);
        }
    }
    return true;
}

/* The layer kernel rounds once (float64 -> storage); the lowered graph
 * rounds after every op. f32: a few ulps per element. f16/bf16: the lowered
 * graph stores intermediates (attention scores, probabilities) in half
 * precision, so an element that cancels to near zero keeps only an error on
 * the scale of the tensor; the bound is a few ulps of the dtype times the
 * tensor's largest magnitude. */
static void compare(const char *what, const char *name, const tf_tensor *x, const tf_tensor *y)
{
    CHECK(x->numel == y->numel, "%s %s: sizes differ", what, name);
    bool half = x->dtype == TF_DT_F16 || x->dtype == TF_DT_BF16;
    double rtol = x->dtype == TF_DT_F16 ? 2e-3 : x->dtype == TF_DT_BF16 ? 1.6e-2 : 2e-5;
    double atol = rtol / 10;
    if (half) {
        double scale = 0;
        for (int64_t k = 0; k < x->numel; k++)
            if (fabs(x->data[k]) > scale) scale = fabs(x->data[k]);
        atol = rtol * scale;
    }
    int bad = 0;
    for (int64_t k = 0; k < x->numel && k < y->numel && bad < 3; k++)
        if (!check_close(y->data[k], x->data[k], rtol, atol)) {
            bad++;
            CHECK(0, "%s %s[%lld]: layer kernel %.9g, lowered %.9g (seed %llu)", what, name, (long long)k, x->data[k],
                  y->data[k], (unsigned long long)g_seed);
        }
    if (!bad) check_passed++;
}

static void run_pair(const char *label, const char *text, tf_ir_mode mode, bool decomposed)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), NULL, 0, &m, &d)) {
        CHECK(0, "%s does not parse: %s", label, d.msg);
        return;
    }
    tf_module *low = tf_module_clone(m);
    tf_options o = {.mode = mode, .diag = &d, .attention_decomposed = decomposed};
    CHECK(low != NULL, "clone");
    if (!low) { tf_module_free(m); return; }
    if (pass_lower(low, &o) || tf_verify(low, &d)) {
        CHECK(0, "%s: lower failed: %s", label, d.msg);
        tf_module_free(m);
        tf_module_free(low);
        return;
    }
    for (int i = 0; i < low->nodes.n; i++) {
        const tf_node *n = low->nodes.items[i];
        CHECK(!tf_op_has(n->op, TF_OPF_LAYER) && !(n->op == TF_OP_CONV2D && n->nin == 3),
              "%s: layer op %s survives lowering", label, tf_op_info_of(n->op)->name);
    }
    tf_interp_ctx *a = tf_interp_create(m, mode, g_seed), *b = tf_interp_create(low, mode, g_seed);
    bool ok = a && b && !tf_interp_init_state(a, &d) && !tf_interp_init_state(b, &d);
    CHECK(ok, "%s: interpreter setup: %s", label, d.msg);
    const char *what = mode == TF_IR_TRAIN ? "train" : "infer";
    for (int step = 0; ok && step < 2; step++) {
        ok = fill_inputs(a, b, m, low, g_seed + (uint64_t)step);
        if (ok && (tf_interp_run(a, &d) || tf_interp_run(b, &d))) {
            CHECK(0, "%s: run failed: %s", label, d.msg);
            ok = false;
        }
        for (int i = 0; ok && i < m->noutputs; i++) {
            char nm[300];
            snprintf(nm, sizeof nm, "%s output %s step %d", label, m->outputs[i].name, step);
            compare(what, nm, tf_interp_tensor(a, m->outputs[i].value, &d), tf_interp_tensor(b, low->outputs[i].value, &d));
        }
        for (int i = 0; ok && i < m->decls.n; i++) {
            tf_value *v = m->decls.items[i];
            if (v->kind != TF_VAL_BUFFER) continue;
            char nm[300];
            snprintf(nm, sizeof nm, "%s buffer %s after step %d", label, v->name, step);
            compare(what, nm, tf_interp_tensor(a, v, &d), tf_interp_tensor(b, low->decls.items[i], &d));
        }
    }
    tf_interp_free(a);
    tf_interp_free(b);
    tf_module_free(m);
    tf_module_free(low);
}


int main(void)
{
    g_seed = test_seed();
    static const char *examples[] = {"mlp.ir", "cnn.ir", "transformer.ir"};
    for (int mode = 0; mode < 2; mode++) {
        for (size_t i = 0; i < sizeof examples / sizeof *examples; i++) {
            char path[4096];
            char *text = test_read_example(examples[i], path, sizeof path);
            CHECK(text != NULL, "cannot read %s (set TFUSE_EXAMPLES)", path);
            if (text) run_pair(path, text, (tf_ir_mode)mode, false);
            free(text);
        }
        for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) {
            char label[32];
            snprintf(label, sizeof label, "extra%zu", i);
            run_pair(label, extra[i], (tf_ir_mode)mode, false);
            if (strstr(extra[i], "attention(")) {   /* the written-out form too */
                snprintf(label, sizeof label, "extra%zu decomposed", i);
                run_pair(label, extra[i], (tf_ir_mode)mode, true);
            }
        }
    }
    return check_report();
}
