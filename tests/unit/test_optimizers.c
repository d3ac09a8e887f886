/* test_optimizers.c — optimizer steps, schedules and clipping against
 * independent reference computations.
 *
 * The model is L = sum(w * x): its gradient is exactly x, so the reference
 * below (written from the formulas, in double) knows the gradient without
 * autodiff, and the test checks the update ops, the state they keep and the
 * learning rate each step computes. Params are f32 (rounded every op), the
 * reference is exact: bound 2e-5 relative over 6 steps. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tfuse.h"

enum { K = 5, STEPS = 6 };

static double xs(int step, int i) { return 0.3 * (i + 1) * (step % 2 ? -1 : 1) + 0.05 * step; }

typedef struct ref {
    double w[K], m[K], v[K], buf[K];
} ref;

/* The learning rate at 0-based step s for each schedule. */
static double sched(const char *kind, double base, int s)
{
    if (!strcmp(kind, "step")) return base * pow(0.5, (double)(s / 2));
    if (!strcmp(kind, "cosine")) {   /* total 8, warmup 2, min 0.001 */
        if (s < 2) return base * (s + 1) / 2.0;
        double p = (s - 2) / 6.0;
        return 0.001 + (base - 0.001) * 0.5 * (1 + cos(M_PI * p));
    }
    if (!strcmp(kind, "onecycle")) {   /* max 0.2, total 10, pct 0.3, div 25, final 1e4 */
        double init = 0.2 / 25, fin = init / 1e4, up = floor(0.3 * 10) - 1, down = 10 - 1 - up;
        if (s <= up) return init + (0.2 - init) * 0.5 * (1 - cos(M_PI * (s / up)));
        double p = (s - up) / down;
        return 0.2 + (fin - 0.2) * 0.5 * (1 - cos(M_PI * (p > 1 ? 1 : p)));
    }
    return base;
}

static void ref_step(ref *r, const char *opt, double lr, int t, const double *g0, double clip)
{
    double g[K], norm = 0;
    for (int i = 0; i < K; i++) norm += g0[i] * g0[i];
    norm = sqrt(norm);
    for (int i = 0; i < K; i++) g[i] = clip > 0 && norm > 0 ? g0[i] * fmin(1, clip / (norm + 1e-6)) : g0[i];
    if (!strcmp(opt, "sgd")) {           /* momentum 0.9, nesterov, wd 0.1 */
        for (int i = 0; i < K; i++) {
            double gi = g[i] + 0.1 * r->w[i];
            r->buf[i] = t == 1 ? gi : 0.9 * r->buf[i] + gi;
            r->w[i] -= lr * (gi + 0.9 * r->buf[i]);
        }
        return;
    }
    double b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.05;
    double rr[K], wn = 0, rn = 0;
    for (int i = 0; i < K; i++) {
        double gi = g[i] + (!strcmp(opt, "adam") ? wd * r->w[i] : 0);
        if (!strcmp(opt, "adamw")) r->w[i] *= 1 - lr * wd;
        r->m[i] = b1 * r->m[i] + (1 - b1) * gi;
        r->v[i] = b2 * r->v[i] + (1 - b2) * gi * gi;
        rr[i] = (r->m[i] / (1 - pow(b1, t))) / (sqrt(r->v[i] / (1 - pow(b2, t))) + eps);
        if (!strcmp(opt, "lamb")) rr[i] += wd * r->w[i];
        wn += r->w[i] * r->w[i];
        rn += rr[i] * rr[i];
    }
    double trust = !strcmp(opt, "lamb") && wn > 0 && rn > 0 ? sqrt(wn) / sqrt(rn) : 1;
    for (int i = 0; i < K; i++) r->w[i] -= lr * trust * rr[i];
}

static void run(const char *opt_text, const char *opt, const char *sched_text, const char *sched_kind, double base,
                double clip)
{
    char text[2048];
    snprintf(text, sizeof text,
             "input x : f32[%d]\nparam w : f32[%d] = uniform(low=-1.0, high=1.0)\nl = mul(w, x)\n"
             "loss = reduce_sum(l, axes=[])\noutput loss\ntrain {\n  optimizer = %s\n%s%s}\n",
             K, K, opt_text, sched_text, clip > 0 ? "  clip_grad_norm = 0.5\n" : "");
    tf_context_t *ctx;
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_session_t *s = NULL;
    tf_context_create(&ctx);
    tf_compile_options o;
    tf_compile_options_init(&o);
    bool ok = !tf_model_parse_string(ctx, opt_text, text, strlen(text), NULL, 0, &m) && !tf_program_compile(ctx, m, &o, &p) &&
              !tf_session_create(ctx, p, TF_TARGET_INTERP, 7, &s);
    CHECK(ok, "%s: %s", opt_text, tf_context_last_error(ctx));
    ref r;
    memset(&r, 0, sizeof r);
    float w0[K], x[K];
    tf_tensor_view wv = {.data = w0};
    if (ok) ok = !tf_session_get_state(s, "w", &wv, sizeof w0);
    for (int i = 0; i < K; i++) r.w[i] = w0[i];
    int64_t shape[1] = {K};
    for (int step = 0; ok && step < STEPS; step++) {
        double g[K];
        for (int i = 0; i < K; i++) x[i] = (float)xs(step, i), g[i] = x[i];
        ok = !tf_session_bind(s, "x", TF_DTYPE_F32, shape, 1, x) && !tf_session_run(s);
        CHECK(ok, "%s step %d: %s", opt_text, step, tf_context_last_error(ctx));
        double lr = sched(sched_kind, base, step);
        tf_tensor_view lv;
        if (ok && !tf_session_output(s, "lr", &lv))
            CHECK(check_close(*(float *)lv.data, lr, 2e-6, 1e-9), "%s %s step %d: lr %.9g, reference %.9g", opt_text,
                  sched_kind, step, *(float *)lv.data, lr);
        ref_step(&r, opt, lr, step + 1, g, clip);
        float got[K];
        tf_tensor_view gv = {.data = got};
        if (ok) ok = !tf_session_get_state(s, "w", &gv, sizeof got);
        int bad = 0;
        for (int i = 0; ok && i < K; i++)
            if (!check_close(got[i], r.w[i], 2e-5, 2e-6) && bad++ < 2)
                CHECK(0, "%s step %d: w[%d] = %.9g, reference %.9g", opt_text, step, i, got[i], r.w[i]);
        if (!bad) check_passed++;
    }
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

/* A tiny model session: L = sum(w * x), w : f32[K]. */
static tf_session_t *tiny(tf_context_t *ctx, const char *train, tf_program_t **pp, tf_model_t **mp)
{
    char text[1024];
    snprintf(text, sizeof text,
             "input x : f32[%d]\nparam w : f32[%d] = uniform(low=-1.0, high=1.0)\nl = mul(w, x)\n"
             "loss = reduce_sum(l, axes=[])\noutput loss\ntrain {\n%s}\n", K, K, train);
    tf_compile_options o;
    tf_compile_options_init(&o);
    tf_session_t *s = NULL;
    if (tf_model_parse_string(ctx, "tiny", text, strlen(text), NULL, 0, mp) || tf_program_compile(ctx, *mp, &o, pp) ||
        tf_session_create(ctx, *pp, TF_TARGET_INTERP, 3, &s))
        CHECK(0, "tiny model: %s", tf_context_last_error(ctx));
    return s;
}

static float scalar_state(tf_session_t *s, const char *name)
{
    float f = NAN;
    int64_t i64 = 0;
    tf_tensor_view v = {.data = &i64};
    if (tf_session_get_state(s, name, &v, sizeof i64)) return NAN;
    if (v.dtype == TF_DTYPE_F32) memcpy(&f, &i64, sizeof f);
    else f = (float)i64;
    return f;
}

/* fp16 loss scaling: an inf in the gradients skips the step (params, step
 * counter unchanged) and halves the scale; 2000 clean steps double it. */
static void test_loss_scaling(void)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_program_t *p = NULL;
    tf_model_t *m = NULL;
    tf_session_t *s = tiny(ctx, "  optimizer = sgd(lr=0.01)\n  precision = fp16\n", &p, &m);
    if (s) {
        float x[K], w0[K], w1[K];
        int64_t shape[1] = {K};
        tf_tensor_view a = {.data = w0}, b = {.data = w1};
        CHECK(scalar_state(s, "train.loss_scale") == 65536, "initial scale 65536, found %g", scalar_state(s, "train.loss_scale"));
        for (int i = 0; i < K; i++) x[i] = 0.25f * (float)(i + 1);
        x[2] = INFINITY;
        tf_session_get_state(s, "w", &a, sizeof w0);
        bool ok = !tf_session_bind(s, "x", TF_DTYPE_F32, shape, 1, x) && !tf_session_run(s);
        CHECK(ok, "run: %s", tf_context_last_error(ctx));
        tf_session_get_state(s, "w", &b, sizeof w1);
        CHECK(!memcmp(w0, w1, sizeof w0), "an inf gradient skips the step: params unchanged");
        CHECK(scalar_state(s, "train.step") == 0, "the step counter does not advance on a skipped step");
        CHECK(scalar_state(s, "train.loss_scale") == 32768, "scale halved: %g", scalar_state(s, "train.loss_scale"));
        x[2] = 0.5f;
        for (int step = 0; ok && step < 1999; step++) ok = !tf_session_run(s);
        CHECK(ok && scalar_state(s, "train.loss_scale") == 32768, "1999 clean steps keep the scale: %g",
              scalar_state(s, "train.loss_scale"));
        CHECK(scalar_state(s, "train.good_steps") == 1999, "good steps counted: %g", scalar_state(s, "train.good_steps"));
        ok = ok && !tf_session_run(s);
        CHECK(ok && scalar_state(s, "train.loss_scale") == 65536, "the 2000th clean step doubles the scale: %g",
              scalar_state(s, "train.loss_scale"));
        tf_session_get_state(s, "w", &b, sizeof w1);
        CHECK(memcmp(w0, w1, sizeof w0) != 0 && scalar_state(s, "train.step") == 2000, "clean steps update");
    }
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

/* accumulate = 2: the first micro-batch changes no param; the second
 * applies the mean of both gradients once. */
static void test_accumulation(void)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_program_t *p = NULL;
    tf_model_t *m = NULL;
    tf_session_t *s = tiny(ctx, "  optimizer = sgd(lr=0.1)\n  accumulate = 2\n", &p, &m);
    if (s) {
        float x1[K], x2[K], w0[K], w1[K];
        int64_t shape[1] = {K};
        tf_tensor_view a = {.data = w0}, b = {.data = w1};
        for (int i = 0; i < K; i++) x1[i] = 0.5f * (float)(i + 1), x2[i] = -0.25f * (float)i;
        tf_session_get_state(s, "w", &a, sizeof w0);
        bool ok = !tf_session_bind(s, "x", TF_DTYPE_F32, shape, 1, x1) && !tf_session_run(s);
        tf_session_get_state(s, "w", &b, sizeof w1);
        CHECK(ok && !memcmp(w0, w1, sizeof w0), "first micro-batch: params unchanged");
        CHECK(scalar_state(s, "train.step") == 0, "first micro-batch: step unchanged");
        ok = ok && !tf_session_bind(s, "x", TF_DTYPE_F32, shape, 1, x2) && !tf_session_run(s);
        tf_session_get_state(s, "w", &b, sizeof w1);
        int bad = 0;
        for (int i = 0; ok && i < K; i++)
            bad += !check_close(w1[i], w0[i] - 0.1 * (x1[i] + x2[i]) / 2, 1e-6, 1e-7);
        CHECK(ok && !bad, "second micro-batch: w -= lr * mean of both gradients");
        CHECK(scalar_state(s, "train.step") == 1 && scalar_state(s, "train.micro") == 0, "one step, micro-batch counter wrapped");
    }
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

int main(void)
{
    test_loss_scaling();
    test_accumulation();
    run("sgd(lr=0.05, momentum=0.9, nesterov=true, weight_decay=0.1)", "sgd", "", "constant", 0.05, 0);
    run("adam(lr=0.05, beta2=0.99, weight_decay=0.05)", "adam", "", "constant", 0.05, 0);
    run("adamw(lr=0.05, beta2=0.99, weight_decay=0.05)", "adamw", "", "constant", 0.05, 0);
    run("lamb(lr=0.05, beta2=0.99, eps=1e-08, weight_decay=0.05)", "lamb", "", "constant", 0.05, 0);
    run("adamw(lr=0.05, beta2=0.99, weight_decay=0.05)", "adamw", "  schedule = step(step_size=2, gamma=0.5)\n", "step", 0.05, 0);
    run("adamw(lr=0.05, beta2=0.99, weight_decay=0.05)", "adamw",
        "  schedule = cosine(total_steps=8, warmup_steps=2, min_lr=0.001)\n", "cosine", 0.05, 0);
    run("adamw(lr=0.05, beta2=0.99, weight_decay=0.05)", "adamw", "  schedule = onecycle(max_lr=0.2, total_steps=10)\n",
        "onecycle", 0.2, 0);
    run("sgd(lr=0.05, momentum=0.9, nesterov=true, weight_decay=0.1)", "sgd", "", "constant", 0.05, 0.5);
    return check_report();
}
