/* test_pass_equiv.c — no pass changes what a model computes.
 *
 * For every example model, in train and infer mode, and for every pass of
 * the default pipeline: the interpreter runs the module compiled with the
 * whole pipeline and with that pass disabled, from the same params, buffers
 * and fresh random inputs (params and buffers are set by name, never left at
 * their initializers, so a dropped bias is non-zero); every output and every
 * buffer they share must agree. Also the whole pipeline against --O0.
 *
 * Error rule: the largest difference in a tensor, relative to the largest
 * magnitude in the reference tensor (fp64-accumulated by the interpreter):
 * 2e-5 in f32; when the two runs differ in half-precision arithmetic (amp
 * on one side only, bias_drop in a half-precision model, or fuse under
 * --numerics=fast, whose regions hold 16-bit values at f32: fuse is also
 * run under --numerics=exact, where it must change nothing), a few units of
 * the half type's precision: 2^-8 for fp16, 2^-5 for bf16, which also
 * bounds the rounding of every input of a half-precision matmul. State after
 * a training step (gradients, moments, updated params) gets 4x that bound
 * when half-precision arithmetic differs: the backward pass compounds it. The seed is printed
 * (TFUSE_TEST_SEED replays it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "testutil.h"
#include "interp.h"
#include "parser.h"
#include "passes.h"

static uint64_t g_seed;



/* Fill every decl of `m` by name: inputs ~ U(-2, 2) (ints in range),
 * params ~ U(-1, 1), buffers ~ U(0.5, 1.5) (valid running variances). */
static bool fill(tf_interp_ctx *ip, tf_module *m, const tf_module *orig, uint64_t seed)
{
    tf_diag d = {0};
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        tf_tensor *t = tf_interp_tensor(ip, v, &d);
        if (!t) return false;
        uint64_t s = seed ^ tf_rng_stream(v->name) ^ (uint64_t)v->kind << 40;
        const tf_value *ov = tf_module_find_value(orig, v->name);
        int64_t bound = ov ? test_int_bound(orig, ov) : 2;
        for (int64_t k = 0; k < t->numel; k++) {
            double u = test_rnd(&s), x;
            if (!tf_dtype_is_float(v->type.dtype)) x = (double)(int64_t)(u * (double)bound);
            else if (v->kind == TF_VAL_INPUT) x = 4 * u - 2;
            else if (v->kind == TF_VAL_PARAM) x = 2 * u - 1;
            else x = 0.5 + u;
            t->data[k] = tf_dtype_round(v->type.dtype, x);
        }
    }
    return true;
}

static void compare(const char *label, const char *name, const tf_tensor *ref, const tf_tensor *got, double tol)
{
    if (ref->numel != got->numel) {
        CHECK(0, "%s %s: sizes differ", label, name);
        return;
    }
    double scale = 0, worst = 0;
    int64_t at = 0;
    for (int64_t k = 0; k < ref->numel; k++)
        if (fabs(ref->data[k]) > scale) scale = fabs(ref->data[k]);
    for (int64_t k = 0; k < ref->numel; k++) {
        double e = fabs(ref->data[k] - got->data[k]);
        if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e, at = k;
    }
    CHECK(worst <= tol * (scale > 0 ? scale : 1), "%s %s[%lld]: %.9g vs %.9g: error %.3g of scale %.3g > %.3g (seed %llu)",
          label, name, (long long)at, ref->data[at], got->data[at], worst, scale, tol, (unsigned long long)g_seed);
}

static tf_module *compile(const char *path, const char *text, tf_ir_mode mode, const char *disable, bool o0, bool exact)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(path, text, strlen(text), NULL, 0, &m, &d)) {
        CHECK(0, "%s: %s", path, d.msg);
        return NULL;
    }
    const char *dis[1] = {disable};
    tf_options o = {.mode = mode, .diag = &d, .disabled = dis, .ndisabled = disable ? 1 : 0, .opt0 = o0, .numerics_exact = exact};
    if (tf_run_pipeline(m, NULL, &o)) {
        CHECK(0, "%s: pipeline without %s: %s", path, disable ? disable : "-", d.msg);
        tf_module_free(m);
        return NULL;
    }
    return m;
}

static void run_case(const char *path, const char *text, tf_ir_mode mode, const char *pass, bool o0, bool exact)
{
    tf_module *orig = NULL, *a = NULL, *b = NULL;
    tf_diag d = {0};
    tf_parse(path, text, strlen(text), NULL, 0, &orig, &d);
    a = compile(path, text, mode, NULL, false, exact);
    b = compile(path, text, mode, pass, o0, exact);
    if (!orig || !a || !b) goto done;
    tf_ir_precision prec = orig->train.has_precision ? orig->train.precision : TF_PREC_FP32;
    /* passes that change the arithmetic (not just its grouping or order):
     * amp itself, and bias_drop, whose cancellation is exact only in exact
     * arithmetic and which runs in half precision when the model does */
    bool amp_differs = prec != TF_PREC_FP32 && (o0 || !strcmp(pass, "amp") || !strcmp(pass, "bias_drop") ||
                                                (!exact && !strcmp(pass, "fuse")));
    double tol = !amp_differs ? 2e-5 : prec == TF_PREC_FP16 ? 1.0 / 256 : 1.0 / 32;
    char label[512];
    snprintf(label, sizeof label, "%s %s%s, with vs %s%s:", path, mode == TF_IR_TRAIN ? "train" : "infer",
             exact ? " --numerics=exact" : "", o0 ? "--O0" : "without ", o0 ? "" : pass);
    tf_interp_ctx *ia = tf_interp_create(a, mode, g_seed), *ib = tf_interp_create(b, mode, g_seed);
    for (int step = 0; ia && ib && step < 2; step++) {
        if (!fill(ia, a, orig, g_seed + (uint64_t)step) || !fill(ib, b, orig, g_seed + (uint64_t)step) ||
            tf_interp_run(ib, &d) || tf_interp_run(ia, &d)) {
            CHECK(0, "%s run: %s", label, d.msg);
            break;
        }
        for (int i = 0; i < a->noutputs; i++)
            compare(label, a->outputs[i].name, tf_interp_tensor(ib, b->outputs[i].value, &d),
                    tf_interp_tensor(ia, a->outputs[i].value, &d), tol);
        /* A dropped bias no longer flows into batchnorm's running mean (the
         * buffer shifts by momentum x bias, the bias is gone at inference
         * too): test_bias_drop checks that exact relation instead. */
        bool buffers_differ = mode == TF_IR_TRAIN && (o0 || !strcmp(pass, "bias_drop"));
        /* after a training step, state holds gradients (momentum) and
         * their integrals: half precision through a backward pass (batchnorm's
         * above all) errs by several units of its precision, 4x the bound */
        double state_tol = amp_differs && mode == TF_IR_TRAIN ? 4 * tol : tol;
        for (int i = 0; i < a->decls.n && !buffers_differ; i++) {
            tf_value *v = a->decls.items[i], *w = tf_module_find_value(b, v->name);
            if (v->kind == TF_VAL_BUFFER && w)
                compare(label, v->name, tf_interp_tensor(ib, w, &d), tf_interp_tensor(ia, v, &d), state_tol);
        }
    }
    tf_interp_free(ia);
    tf_interp_free(ib);
done:
    tf_module_free(orig);
    tf_module_free(a);
    tf_module_free(b);
}


int main(void)
{
    g_seed = test_seed();
    static const char *examples[] = {"mlp.ir", "cnn.ir", "transformer.ir"};
    for (size_t e = 0; e < sizeof examples / sizeof *examples; e++) {
        char path[4096];
        char *text = test_read_example(examples[e], path, sizeof path);
        CHECK(text != NULL, "cannot read %s (set TFUSE_EXAMPLES)", path);
        if (!text) continue;
        for (int mode = 0; mode < 2; mode++) {
            /* without lower nothing else can run; autodiff changes what a
             * step does by design (it trains): test_grad_rules and
             * test_training check it against finite differences */
            for (int p = 0; p < tf_npasses; p++)
                if (strcmp(tf_passes[p].name, "lower") != 0 && strcmp(tf_passes[p].name, "autodiff") != 0)
                    run_case(path, text, (tf_ir_mode)mode, tf_passes[p].name, false, false);
            run_case(path, text, (tf_ir_mode)mode, "fuse", false, true);   /* exact numerics: fusing is only grouping */
            run_case(path, text, (tf_ir_mode)mode, NULL, true, false);
        }
        free(text);
    }
    return check_report();
}
