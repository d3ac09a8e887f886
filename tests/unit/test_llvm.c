/* test_llvm.c — the LLVM emitter stores exactly what kernel_eval stores.
 *
 * Each example, in train and infer mode with fp32 precision, lowered to
 * kernels; one interpreter state runs the whole plan through kernel_eval,
 * kernel by kernel. Before each elementwise or reduction kernel, its buffers
 * are copied into storage-dtype arrays and the JIT-compiled function runs on
 * them; after kernel_eval has run the kernel, every buffer it writes must
 * hold the same bits in both (NaNs equal to NaNs). Every elementwise and
 * reduction kernel of these fp32 models must compile. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "interp.h"
#include "kernel.h"
#include "llvm.h"
#include "parser.h"
#include "passes.h"
#include "testutil.h"

static uint64_t g_seed;
static int g_compiled, g_compared;

static void fill(tf_interp_ctx *a, tf_module *m, uint64_t seed)
{
    tf_diag d = {0};
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        if (v->kind != TF_VAL_INPUT) continue;
        tf_tensor *t = tf_interp_tensor(a, v, &d);
        uint64_t s = seed ^ tf_rng_stream(v->name);
        for (int64_t k = 0; t && k < t->numel; k++) {
            double u = test_rnd(&s);
            double x = tf_dtype_is_float(v->type.dtype) ? 4 * u - 2 : (double)(int64_t)(u * 10);
            t->data[k] = tf_dtype_round(v->type.dtype, x);
        }
    }
}

/* Storage-dtype copy of an interpreter tensor. */
static void *to_storage(const tf_tensor *t)
{
    size_t w = (size_t)tf_dtype_bytes(t->dtype);
    unsigned char *p = calloc((size_t)(t->numel ? t->numel : 1), w);
    for (int64_t i = 0; p && i < t->numel; i++) {
        double v = tf_dtype_round(t->dtype, t->data[i]);
        switch (t->dtype) {
        case TF_DT_F32: { float f = (float)v; memcpy(p + i * 4, &f, 4); break; }
        case TF_DT_F64: memcpy(p + i * 8, &v, 8); break;
        case TF_DT_I64: { int64_t x = (int64_t)v; memcpy(p + i * 8, &x, 8); break; }
        case TF_DT_I32: { int32_t x = (int32_t)v; memcpy(p + i * 4, &x, 4); break; }
        case TF_DT_BOOL: p[i] = v != 0; break;
        default: break;
        }
    }
    return p;
}

static bool is_nan_at(tf_dt t, const unsigned char *p, int64_t i)
{
    if (t == TF_DT_F32) { float f; memcpy(&f, p + i * 4, 4); return f != f; }
    if (t == TF_DT_F64) { double f; memcpy(&f, p + i * 8, 8); return f != f; }
    return false;
}

static void compare(const char *label, const tf_kernel *k, const tf_value *v, const tf_tensor *ref, const void *got)
{
    void *want = to_storage(ref);
    size_t w = (size_t)tf_dtype_bytes(ref->dtype);
    int64_t at = -1;
    for (int64_t i = 0; want && i < ref->numel && at < 0; i++) {
        const unsigned char *a = (const unsigned char *)want + i * (int64_t)w, *b = (const unsigned char *)got + i * (int64_t)w;
        if (memcmp(a, b, w) != 0 && !(is_nan_at(ref->dtype, want, i) && is_nan_at(ref->dtype, got, i))) at = i;
    }
    double g = 0;
    if (at >= 0) {
        const unsigned char *b = (const unsigned char *)got + at * (int64_t)w;
        switch (ref->dtype) {
        case TF_DT_F32: { float f; memcpy(&f, b, 4); g = f; break; }
        case TF_DT_F64: memcpy(&g, b, 8); break;
        case TF_DT_I64: { int64_t x; memcpy(&x, b, 8); g = (double)x; break; }
        case TF_DT_I32: { int32_t x; memcpy(&x, b, 4); g = x; break; }
        default: g = *b; break;
        }
    }
    CHECK(want && at < 0, "%s: kernel %s: %s differs at %lld: kernel_eval %.17g, llvm %.17g (seed %llu)", label, k->name,
          v->name ? v->name : "?", (long long)at, at >= 0 ? ref->data[at] : 0, g, (unsigned long long)g_seed);
    free(want);
}

static void run(const char *label, const char *text, tf_ir_mode mode, const tf_dim_set *dims, int nd)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), dims, nd, &m, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        return;
    }
    tf_options o = {.mode = mode, .diag = &d, .precision_set = true, .precision = TF_PREC_FP32};
    tf_kernel_plan plan = {0};
    if (tf_run_pipeline(m, NULL, &o) || tf_kernels_build(m, &plan, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        tf_module_free(m);
        return;
    }
    tf_jit *jit = NULL;
    if (tf_jit_create(&jit, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        tf_kernels_free(&plan);
        tf_module_free(m);
        return;
    }
    tf_interp_ctx *ip = tf_interp_create(m, mode, g_seed);
    bool ok = ip && !tf_interp_init_state(ip, &d);
    CHECK(ok, "%s: interpreter: %s", label, d.msg);
    if (ok) fill(ip, m, g_seed);
    int compiled = 0, candidates = 0;
    for (int i = 0; ok && i < plan.nkernels; i++) {
        const tf_kernel *k = &plan.kernels[i];
        tf_kernel_fn fn = NULL;
        bool cand = (k->kind == TF_K_ELEMENTWISE || k->kind == TF_K_REDUCTION) && k->nexprs;
        candidates += cand;
        if (cand) {
            tf_diag cd = {0};
            if (tf_jit_compile(jit, k, &fn, &cd)) {
                printf("%s (%s): skipped %s: %s\n", label, mode == TF_IR_TRAIN ? "train" : "infer", k->name, cd.msg);
                fn = NULL;
            } else {
                compiled++;
            }
        }
        void **bufs = NULL;
        if (fn) {
            bufs = calloc((size_t)k->nbufs, sizeof *bufs);
            for (int b = 0; bufs && b < k->nbufs; b++) {
                tf_tensor *t = tf_interp_tensor(ip, k->bufs[b].value, &d);
                bufs[b] = t ? to_storage(t) : NULL;
                if (!bufs[b]) { CHECK(0, "%s: kernel %s: buffer %d", label, k->name, b); fn = NULL; }
            }
            if (fn) fn(bufs);
        }
        tf_kernel_plan one = {.kernels = (tf_kernel *)k, .nkernels = 1};
        if (tf_kernels_eval(&one, ip, &d)) {
            CHECK(0, "%s: kernels: %s", label, d.msg);
            ok = false;
        }
        if (fn && ok) {
            for (int b = 0; b < k->nbufs; b++)
                if (k->bufs[b].written) compare(label, k, k->bufs[b].value, tf_interp_tensor(ip, k->bufs[b].value, &d), bufs[b]);
            g_compared++;
        }
        for (int b = 0; bufs && b < k->nbufs; b++) free(bufs[b]);
        free(bufs);
    }
    printf("%s (%s): %d of %d elementwise/reduction kernels JIT-compiled and compared\n", label,
           mode == TF_IR_TRAIN ? "train" : "infer", compiled, candidates);
    CHECK(compiled > 0 && compiled == candidates, "%s: every elementwise/reduction kernel compiles (%d of %d)", label,
          compiled, candidates);
    g_compiled += compiled;
    if (plan.nkernels) {   /* the IR text names the kernel's function */
        for (int i = 0; i < plan.nkernels; i++) {
            const tf_kernel *k = &plan.kernels[i];
            if (!tf_jit_supports(k, NULL, 0)) continue;
            char *s = tf_jit_print(k);
            CHECK(s && strstr(s, k->name) && strstr(s, "define"), "%s: tf_jit_print of %s", label, k->name);
            free(s);
            break;
        }
    }
    tf_interp_free(ip);
    tf_jit_free(jit);
    tf_kernels_free(&plan);
    tf_module_free(m);
}

int main(void)
{
    g_seed = test_seed();
    static const struct { const char *file; tf_dim_set dims[4]; int nd; } models[] = {
        {"mlp.ir", {{"B", 6}, {"F", 20}}, 2},
        {"cnn.ir", {{"N", 2}, {"C", 4}}, 2},
        {"transformer.ir", {{"B", 2}, {"T", 5}, {"V", 10}}, 3},
    };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char path[4096];
        char *text = test_read_example(models[i].file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        for (int mode = 0; mode < 2; mode++) run(path, text, (tf_ir_mode)mode, models[i].dims, models[i].nd);
        free(text);
    }
    /* dropout_mask is reported, not compiled */
    {
        tf_diag d = {0};
        tf_module *m;
        const char *t = "input x : f32[3, 7]\nd = dropout(x, p=0.3)\noutput d\n";
        tf_options o = {.mode = TF_IR_TRAIN, .diag = &d};
        tf_kernel_plan plan = {0};
        tf_jit *jit = NULL;
        if (!tf_parse("dropout", t, strlen(t), NULL, 0, &m, &d)) {
            if (!tf_run_pipeline(m, NULL, &o) && !tf_kernels_build(m, &plan, &d) && !tf_jit_create(&jit, &d)) {
                int refused = 0;
                for (int i = 0; i < plan.nkernels; i++) {
                    tf_kernel_fn fn;
                    tf_diag cd = {0};
                    if (plan.kernels[i].kind == TF_K_ELEMENTWISE && tf_jit_compile(jit, &plan.kernels[i], &fn, &cd))
                        refused += cd.status == TF_IR_ERR_RUNTIME && strstr(cd.msg, "dropout_mask") != NULL;
                }
                CHECK(refused > 0, "dropout_mask is reported as unsupported");
            }
            tf_jit_free(jit);
            tf_kernels_free(&plan);
            tf_module_free(m);
        }
    }
    printf("llvm: %d kernels JIT-compiled, %d compared\n", g_compiled, g_compared);
    CHECK(g_compiled > 0, "some kernels were compiled");
    return check_report();
}
