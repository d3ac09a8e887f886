/* test_onnx_model.c — an ONNX file as a model of the library (docs/onnx.md),
 * through the C API and so under ASan+UBSan in ctest (tests/onnx/test_onnx.py
 * checks the numbers against ONNX Runtime and PyTorch):
 *
 *   - tf_model_parse_file on an .onnx file (the fuzz corpus's conv model)
 *     gives a model whose sessions start from its initializers: its outputs
 *     equal, bit for bit, those of the imported text run with the
 *     safetensors tf_onnx_import wrote (--params), on interp;
 *   - a package compiled from it holds those weights (its session's outputs
 *     are the same bits), and so does a program made again from the
 *     program's model (tf_program_model, as `tfuse train`'s evaluator is);
 *   - tf_model_add_loss gives it cross_entropy(out, labels) and an optimizer:
 *     a training step runs and changes the weights it started from;
 *   - tf_model_add_loss refuses, with the reason, what it cannot do: a value
 *     the model lacks, a name it has, a loss it does not know, bad syntax,
 *     a non-floating operand, an optimizer beside one the model names, and
 *     an optimizer that is not one (the parser's message). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"
#include "tfuse.h"

static const char *model_path(char *buf, size_t n)
{
    const char *ex = getenv("TFUSE_EXAMPLES");   /* <source>/examples */
    snprintf(buf, n, "%s/../tests/fuzz/corpus/onnx/conv.onnx", ex ? ex : "examples");
    return buf;
}

/* Output `out` of a one-step inference run of p on interp with input x. */
static float *infer(tf_context_t *ctx, tf_program_t *p, const char *params, const float *x, size_t *n)
{
    tf_session_t *s = NULL;
    float *r = NULL;
    int64_t shape[4] = {2, 3, 8, 8};
    tf_tensor_view v;
    if (tf_session_create(ctx, p, TF_TARGET_INTERP, 7, &s) || (params && tf_session_load_state(s, params)) ||
        tf_session_bind(s, "x", TF_DTYPE_F32, shape, 4, x) || tf_session_run(s) || tf_session_output(s, "out", &v)) {
        CHECK(0, "infer: %s", tf_context_last_error(ctx));
    } else {
        *n = (size_t)(v.shape[0] * v.shape[1]);
        r = malloc(*n * sizeof *r);
        memcpy(r, v.data, *n * sizeof *r);
    }
    tf_session_free(s);
    return r;
}

static tf_program_t *compile_infer(tf_context_t *ctx, tf_model_t *m)
{
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_INTERP;
    tf_program_t *p = NULL;
    if (tf_program_compile(ctx, m, &o, &p)) CHECK(0, "compile: %s", tf_context_last_error(ctx));
    return p;
}

static bool same(const float *a, const float *b, size_t n) { return a && b && !memcmp(a, b, n * sizeof *a); }

static void expect_refused(tf_context_t *ctx, const char *path, const char *loss, const char *opt, const char *words)
{
    tf_model_t *m = NULL;
    if (tf_model_parse_file(ctx, path, NULL, 0, &m)) {
        CHECK(0, "parse: %s", tf_context_last_error(ctx));
        return;
    }
    tf_status st = tf_model_add_loss(ctx, m, loss, opt);
    CHECK(st != TF_OK && strstr(tf_context_last_error(ctx), words), "--loss '%s' --optimizer '%s' refused with '%s': %s", loss ? loss : "",
          opt ? opt : "", words, st ? tf_context_last_error(ctx) : "accepted");
    tf_model_free(m);
}

int main(void)
{
    char path[4096], dir[64] = "/tmp/tfuse-onnx-XXXXXX", ir_params[128], pkg[128];
    model_path(path, sizeof path);
    if (access(path, R_OK)) {
        fprintf(stderr, "%s: not found\n", path);
        return 1;
    }
    if (!mkdtemp(dir)) return 1;
    snprintf(ir_params, sizeof ir_params, "%s/conv.safetensors", dir);
    snprintf(pkg, sizeof pkg, "%s/conv.tfp", dir);
    tf_context_t *ctx;
    tf_context_create(&ctx);
    uint64_t seed = test_seed();
    float x[2 * 3 * 8 * 8];
    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)(2 * test_rnd(&seed) - 1);

    /* the .onnx file, and the imported text with the weights written beside it */
    tf_model_t *m = NULL, *mt = NULL;
    char *text = NULL;
    size_t n1 = 0, n2 = 0, n3 = 0, n4 = 0;
    CHECK(!tf_model_parse_file(ctx, path, NULL, 0, &m), "parse %s: %s", path, tf_context_last_error(ctx));
    CHECK(!tf_onnx_import(ctx, path, NULL, 0, &text, ir_params) && text, "import: %s", tf_context_last_error(ctx));
    CHECK(!tf_model_parse_string(ctx, "conv.ir", text, text ? strlen(text) : 0, NULL, 0, &mt), "parse text: %s",
          tf_context_last_error(ctx));
    free(text);
    tf_program_t *p = m ? compile_infer(ctx, m) : NULL, *pt = mt ? compile_infer(ctx, mt) : NULL;
    float *direct = p ? infer(ctx, p, NULL, x, &n1) : NULL, *via_text = pt ? infer(ctx, pt, ir_params, x, &n2) : NULL;
    CHECK(n1 == 8 && n1 == n2 && same(direct, via_text, n1), "the .onnx model's session starts from its initializers (%zu, %zu outputs)",
          n1, n2);
    bool nonzero = false;
    for (size_t i = 0; direct && i < n1; i++) nonzero |= direct[i] != 0;
    CHECK(nonzero, "its outputs are not those of zeros()");

    /* a package of it, and a program made again from its model */
    tf_package_info info;
    tf_program_t *loaded = NULL, *again = NULL;
    tf_model_t *back = NULL;
    CHECK(p && !tf_program_save(ctx, p, pkg, 1, 3, NULL, &info) && info.has_params, "package: %s", tf_context_last_error(ctx));
    CHECK(!tf_program_load(ctx, pkg, &loaded), "load: %s", tf_context_last_error(ctx));
    float *from_pkg = loaded ? infer(ctx, loaded, NULL, x, &n3) : NULL;
    CHECK(same(direct, from_pkg, n1) && n3 == n1, "the package holds the model's weights");
    CHECK(p && !tf_program_model(ctx, p, &back), "tf_program_model: %s", tf_context_last_error(ctx));
    again = back ? compile_infer(ctx, back) : NULL;
    float *from_again = again ? infer(ctx, again, NULL, x, &n4) : NULL;
    CHECK(same(direct, from_again, n1) && n4 == n1, "a program made again from the program's model keeps the weights");

    /* a loss and an optimizer: one training step moves the weights from where they started */
    CHECK(m && !tf_model_add_loss(ctx, m, "cross_entropy(out, labels)", "sgd(lr=0.1)"), "add_loss: %s", tf_context_last_error(ctx));
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_TRAIN;
    o.target = TF_TARGET_INTERP;
    tf_program_t *pt2 = NULL;
    tf_session_t *s = NULL;
    CHECK(m && !tf_program_compile(ctx, m, &o, &pt2), "train compile: %s", tf_context_last_error(ctx));
    int64_t xs[4] = {2, 3, 8, 8}, ls[1] = {2}, labels[2] = {1, 3};
    tf_tensor_view w0 = {0}, w1 = {0}, loss;
    float before[4 * 3 * 3 * 3], after[4 * 3 * 3 * 3];
    w0.data = before, w1.data = after;
    if (pt2 && !tf_session_create(ctx, pt2, TF_TARGET_INTERP, 1, &s) && !tf_session_get_state(s, "w1", &w0, sizeof before) &&
        !tf_session_bind(s, "x", TF_DTYPE_F32, xs, 4, x) && !tf_session_bind(s, "labels", TF_DTYPE_I64, ls, 1, labels) &&
        !tf_session_run(s) && !tf_session_output(s, "loss", &loss) && !tf_session_get_state(s, "w1", &w1, sizeof after)) {
        double moved = 0;
        for (size_t i = 0; i < sizeof before / sizeof *before; i++) moved = fmax(moved, fabs(after[i] - before[i]));
        bool started = false;
        for (size_t i = 0; i < sizeof before / sizeof *before; i++) started |= before[i] != 0;
        CHECK(started && moved > 0 && isfinite(*(const float *)loss.data), "a training step from the ONNX weights: loss %g, w1 moved %g",
              *(const float *)loss.data, moved);
    } else {
        CHECK(0, "train step: %s", tf_context_last_error(ctx));
    }
    tf_session_free(s);

    /* what tf_model_add_loss refuses */
    expect_refused(ctx, path, "cross_entropy(nope, labels)", NULL, "no value named 'nope' (its outputs: out, gmp)");
    expect_refused(ctx, path, "cross_entropy(out, x)", NULL, "'x' names a value of the model already");
    expect_refused(ctx, path, "hinge(out, y)", NULL, "cross_entropy or mse_loss, not 'hinge'");
    expect_refused(ctx, path, "cross_entropy(out labels)", NULL, "expected cross_entropy(OUTPUT, LABELS)");
    expect_refused(ctx, path, "cross_entropy(out, labels) extra", NULL, "expected cross_entropy(OUTPUT, LABELS)");
    expect_refused(ctx, path, NULL, "adamx(lr=1)", "adamx");
    expect_refused(ctx, path, NULL, "sgd(lr=1)\n}\n", "expected one call");
    tf_model_t *twice = NULL;
    if (!tf_model_parse_file(ctx, path, NULL, 0, &twice) && !tf_model_add_loss(ctx, twice, "mse_loss(out, t)", "sgd(lr=1)")) {
        tf_status st = tf_model_add_loss(ctx, twice, NULL, "adamw(lr=1)");
        CHECK(st && strstr(tf_context_last_error(ctx), "names its optimizer already"), "a second optimizer: %s",
              st ? tf_context_last_error(ctx) : "accepted");
        st = tf_model_add_loss(ctx, twice, "mse_loss(out, u)", NULL);
        CHECK(st && strstr(tf_context_last_error(ctx), "a value named 'loss' already"), "a second loss: %s",
              st ? tf_context_last_error(ctx) : "accepted");
    } else {
        CHECK(0, "mse_loss: %s", tf_context_last_error(ctx));
    }
    tf_model_free(twice);

    free(direct), free(via_text), free(from_pkg), free(from_again);
    tf_program_free(p), tf_program_free(pt), tf_program_free(loaded), tf_program_free(again), tf_program_free(pt2);
    tf_model_free(m), tf_model_free(mt), tf_model_free(back);
    tf_context_free(ctx);
    unlink(ir_params), unlink(pkg), rmdir(dir);
    return check_report();
}
