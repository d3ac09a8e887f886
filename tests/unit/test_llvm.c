/* test_llvm.c — the LLVM emitter stores exactly what kernel_eval stores.
 *
 * Each example, in train and infer mode, with fp32, bf16 and fp16 precision
 * (16-bit storage), lowered to kernels; one interpreter state runs the whole
 * plan through kernel_eval, kernel by kernel. Each elementwise or reduction
 * kernel's buffers are copied into storage-dtype arrays (the ones it only
 * writes poisoned) and the JIT-compiled function runs on them in three
 * calls over pieces of its split axis, as threads would; a library kernel's
 * epilogue runs after kernel_eval has computed the library call. Every
 * buffer the kernel writes must then hold the same bits as kernel_eval's
 * (NaNs equal to NaNs). Every elementwise and reduction kernel and every
 * epilogue must compile, dropout masks included. The same kernels' object
 * code made on four threads at once (tf_jit_object) is the JIT's, byte for
 * byte. */
#include <math.h>
#include <pthread.h>
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

/* f16/bf16 bit patterns of a value already rounded to the format, written
 * independently of the emitter's (frexp rather than bit arithmetic). */
static uint16_t half_bits(tf_dt t, double v)
{
    if (t == TF_DT_BF16) {
        float f = (float)v;
        uint32_t w;
        memcpy(&w, &f, 4);
        return (uint16_t)(w >> 16);
    }
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    double a = fabs(v);
    if (a != a) return 0x7E00;
    if (isinf(a)) return (uint16_t)(sign | 0x7C00);
    if (a < 0x1p-14) return (uint16_t)(sign | (uint16_t)(a * 0x1p24));
    int e;
    double f = frexp(a, &e);   /* a = f * 2^e, f in [0.5, 1) */
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((f * 2 - 1) * 1024));
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
        case TF_DT_F16:
        case TF_DT_BF16: { uint16_t h = half_bits(t->dtype, v); memcpy(p + i * 2, &h, 2); break; }
        default: break;
        }
    }
    return p;
}

static bool is_nan_at(tf_dt t, const unsigned char *p, int64_t i)
{
    if (t == TF_DT_F32) { float f; memcpy(&f, p + i * 4, 4); return f != f; }
    if (t == TF_DT_F64) { double f; memcpy(&f, p + i * 8, 8); return f != f; }
    if (t == TF_DT_F16 || t == TF_DT_BF16) {
        uint16_t h;
        memcpy(&h, p + i * 2, 2);
        return t == TF_DT_F16 ? (h & 0x7C00) == 0x7C00 && (h & 0x3FF) : (h & 0x7F80) == 0x7F80 && (h & 0x7F);
    }
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
        case TF_DT_F16: case TF_DT_BF16: { uint16_t h; memcpy(&h, b, 2); g = h; break; }   /* the pattern */
        default: g = *b; break;
        }
    }
    CHECK(want && at < 0, "%s: kernel %s: %s differs at %lld: kernel_eval %.17g, llvm %.17g (seed %llu)", label, k->name,
          v->name ? v->name : "?", (long long)at, at >= 0 ? ref->data[at] : 0, g, (unsigned long long)g_seed);
    free(want);
}

static bool is_read(const tf_kernel *k, int b)
{
    for (int e = 0; e < k->nexprs; e++)
        if (k->exprs[e].kind == TF_KX_LOAD && k->exprs[e].buf == b) return true;
    return false;
}

static const char *prec_name(tf_ir_precision p) { return p == TF_PREC_BF16 ? "bf16" : p == TF_PREC_FP16 ? "fp16" : "fp32"; }

/* tf_jit_object on several threads at once makes, byte for byte, the
 * object code tf_jit_compile_object makes through the JIT (the cpu target
 * compiles a session's kernels on its threads and must leave the disk
 * cache the same files), and those objects link and run. */
typedef struct obj_job {
    const tf_kernel *k;
    char sym[32];
    void *obj;
    size_t n;
    tf_ir_status st;
} obj_job;

typedef struct obj_work {
    obj_job *jobs;
    int n, next;
    pthread_mutex_t mu;
} obj_work;

static void *obj_worker(void *arg)
{
    obj_work *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int i = w->next++;
        pthread_mutex_unlock(&w->mu);
        if (i >= w->n) return NULL;
        tf_diag d = {0};
        w->jobs[i].st = tf_jit_object(w->jobs[i].k, w->jobs[i].sym, NULL, &w->jobs[i].obj, &w->jobs[i].n, &d);
    }
}

static int g_objects;

static void objects_alike(const char *label, tf_jit *jit, const tf_kernel_plan *plan)
{
    obj_job *jobs = calloc((size_t)plan->nkernels + 1, sizeof *jobs);
    int n = 0;
    for (int i = 0; jobs && i < plan->nkernels; i++)
        if (tf_jit_supports(&plan->kernels[i], NULL, 0) && plan->kernels[i].nexprs) {
            jobs[n].k = &plan->kernels[i];
            snprintf(jobs[n].sym, sizeof jobs[n].sym, "tf_obj_%d", i);
            n++;
        }
    obj_work w = {.jobs = jobs, .n = n};
    pthread_mutex_init(&w.mu, NULL);
    pthread_t t[3];
    int started = 0;
    for (int i = 0; i < 3; i++) started += pthread_create(&t[started], NULL, obj_worker, &w) == 0;
    obj_worker(&w);
    for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
    pthread_mutex_destroy(&w.mu);
    for (int i = 0; i < n; i++) {
        tf_kernel_fn fn = NULL;
        tf_jit_code *code = NULL;
        void *obj = NULL;
        size_t on = 0;
        tf_diag d = {0};
        CHECK(!jobs[i].st, "%s: %s: tf_jit_object on a thread", label, jobs[i].k->name);
        if (!tf_jit_compile_object(jit, jobs[i].k, jobs[i].sym, &fn, &code, &obj, &on, &d)) {
            CHECK(on == jobs[i].n && obj && jobs[i].obj && memcmp(obj, jobs[i].obj, on) == 0,
                  "%s: %s: the object made on a thread (%zu bytes) is the JIT's (%zu bytes)", label, jobs[i].k->name, jobs[i].n, on);
            tf_jit_release(jit, code, &d);
            g_objects++;
        } else {
            CHECK(0, "%s: %s: tf_jit_compile_object: %s", label, jobs[i].k->name, d.msg);
        }
        tf_free(obj);
        tf_free(jobs[i].obj);
    }
    free(jobs);
}

static void run(const char *label, const char *text, tf_ir_mode mode, const tf_dim_set *dims, int nd, tf_ir_precision prec)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), dims, nd, &m, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        return;
    }
    tf_options o = {.mode = mode, .diag = &d, .precision_set = true, .precision = prec};
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
        tf_jit_code *code = NULL;
        bool lib = k->kind == TF_K_LIBRARY;
        bool cand = (k->kind == TF_K_ELEMENTWISE || k->kind == TF_K_REDUCTION || lib) && k->nexprs;
        candidates += cand;
        if (cand) {
            tf_diag cd = {0};
            if (tf_jit_compile(jit, k, &fn, &code, &cd)) {
                printf("%s (%s, %s): skipped %s: %s\n", label, mode == TF_IR_TRAIN ? "train" : "infer", prec_name(prec), k->name, cd.msg);
                fn = NULL;
            } else {
                compiled++;
            }
        }
        tf_kernel_plan one = {.kernels = (tf_kernel *)k, .nkernels = 1};
        uint64_t rt[2] = {tf_interp_seed(ip), tf_interp_step(ip)};
        if (lib && tf_kernels_eval(&one, ip, &d)) {   /* the library result the epilogue reads */
            CHECK(0, "%s: kernels: %s", label, d.msg);
            ok = false;
        }
        void **bufs = NULL;
        if (fn && ok) {
            bufs = calloc((size_t)k->nbufs, sizeof *bufs);
            for (int b = 0; bufs && b < k->nbufs; b++) {
                tf_tensor *t = tf_interp_tensor(ip, k->bufs[b].value, &d);
                bufs[b] = t ? to_storage(t) : NULL;
                if (!bufs[b]) { CHECK(0, "%s: kernel %s: buffer %d", label, k->name, b); fn = NULL; continue; }
                bool libout = lib && k->bufs[b].value == k->lib->out;
                if (k->bufs[b].written && !libout && !is_read(k, b))
                    memset(bufs[b], 0x5A, (size_t)(t->numel * tf_dtype_bytes(t->dtype)));
            }
            if (fn) {   /* in three pieces of the split axis; without one, once (as the cpu target runs it) */
                int ax = tf_kernel_split_axis(k);
                int64_t n = ax < 0 ? 1 : k->dims[ax], a = n / 3, b = 2 * n / 3;
                if (ax >= 0) {
                    fn(bufs, 0, a, rt);
                    fn(bufs, a, b, rt);
                }
                fn(bufs, ax >= 0 ? b : 0, n, rt);
            }
        }
        if (!lib && tf_kernels_eval(&one, ip, &d)) {
            CHECK(0, "%s: kernels: %s", label, d.msg);
            ok = false;
        }
        if (fn && ok) {
            for (int b = 0; b < k->nbufs; b++)
                if (k->bufs[b].written && !(lib && k->bufs[b].value == k->lib->out))
                    compare(label, k, k->bufs[b].value, tf_interp_tensor(ip, k->bufs[b].value, &d), bufs[b]);
            g_compared++;
        }
        for (int b = 0; bufs && b < k->nbufs; b++) free(bufs[b]);
        free(bufs);
        tf_diag rd = {0};
        CHECK(!tf_jit_release(jit, code, &rd), "%s: releasing %s: %s", label, k->name, rd.msg);
    }
    printf("%s (%s, %s): %d of %d elementwise/reduction/epilogue kernels JIT-compiled and compared\n", label,
           mode == TF_IR_TRAIN ? "train" : "infer", prec_name(prec), compiled, candidates);
    CHECK(compiled > 0 && compiled == candidates, "%s: every elementwise/reduction kernel compiles (%d of %d)", label,
          compiled, candidates);
    g_compiled += compiled;
    if (plan.nkernels) {   /* the IR text names the kernel's function */
        for (int i = 0; i < plan.nkernels; i++) {
            const tf_kernel *k = &plan.kernels[i];
            if (!tf_jit_supports(k, NULL, 0)) continue;
            char *s = tf_jit_print(k);
            CHECK(s && strstr(s, k->name) && strstr(s, "define"), "%s: tf_jit_print of %s", label, k->name);
            tf_free(s);   /* tfuse's allocation */
            break;
        }
    }
    if (prec == TF_PREC_FP32) objects_alike(label, jit, &plan);
    tf_interp_free(ip);
    tf_jit_free(jit);
    tf_kernels_free(&plan);
    tf_module_free(m);
}

int main(void)
{
    g_seed = test_seed();
    for (size_t i = 0; i < TEST_NEXAMPLES; i++) {
        const test_example *ex = &test_examples[i];
        tf_dim_set dims[3];
        for (int j = 0; j < ex->nd; j++) dims[j] = (tf_dim_set){ex->dims[j].name, ex->dims[j].value};
        char path[4096];
        char *text = test_read_example(ex->file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        for (int mode = 0; mode < 2; mode++)
            for (int p = 0; p < 3; p++)
                run(path, text, (tf_ir_mode)mode, dims, ex->nd,
                    p == 0 ? TF_PREC_FP32 : p == 1 ? TF_PREC_BF16 : TF_PREC_FP16);
        free(text);
    }
    /* dropout masks draw the interpreter's numbers; odd sizes (1, primes)
     * against the split pieces and vector widths */
    run("dropout", "input x : f32[3, 7]\nd = dropout(x, p=0.3)\ny = mul(d, 2.0)\noutput y\n", TF_IR_TRAIN, NULL, 0, TF_PREC_FP32);
    /* long reductions: in blocks (1600 per block, a multiple of 8) and with
     * per-element lanes (1369 per row of the block is not) */
    run("long", "input x : f32[3, 5, 40, 40]\ninput y : f32[3, 2, 37, 37]\ns = reduce_sum(x, axes=[0, 2, 3])\n"
        "m = reduce_max(y, axes=[0, 2, 3])\nq = mul(x, x)\nv = reduce_mean(q, axes=[0, 2, 3], keepdims=true)\nd = sub(q, v)\n"
        "output s\noutput m\noutput d\n", TF_IR_INFER, NULL, 0, TF_PREC_FP32);
    run("odd", "input x : f32[1, 13]\ninput y : f32[17, 1, 13]\nz = add(x, y)\ns = reduce_sum(z, axes=[1, 2])\n"
        "m = reduce_max(z, axes=[0])\ne = exp(m)\noutput s\noutput e\n", TF_IR_INFER, NULL, 0, TF_PREC_FP32);
    /* the loops vectorize: an f32 and a bf16 bias+relu kernel print vector types; over at most 4096 elements
     * (llvm.c's SMALL_KERNEL) the vectorizer is left out, to compile faster: a 64 x 64 one prints none */
    for (int bf = 0; bf < 3; bf++) {
        tf_diag d = {0};
        tf_module *m;
        const char *t = bf == 1 ? "input x : bf16[128, 64]\ninput y : bf16[64]\nz = add(x, y)\nr = relu(z)\noutput r\n"
                        : bf == 0 ? "input x : f32[128, 64]\ninput y : f32[64]\nz = add(x, y)\nr = relu(z)\noutput r\n"
                                  : "input x : f32[64, 64]\ninput y : f32[64]\nz = add(x, y)\nr = relu(z)\noutput r\n";
        tf_options o = {.mode = TF_IR_INFER, .diag = &d};
        tf_kernel_plan plan = {0};
        if (tf_parse("vec", t, strlen(t), NULL, 0, &m, &d)) continue;
        if (!tf_run_pipeline(m, NULL, &o) && !tf_kernels_build(m, &plan, &d) && plan.nkernels == 1) {
            char *ir = tf_jit_print(&plan.kernels[0]);
            if (bf == 2) CHECK(ir && !strstr(ir, " x float>"), "the small f32 kernel is not vectorized");
            else CHECK(ir && strstr(ir, bf ? " x i16>" : " x float>"), "the %s kernel is vectorized", bf ? "bf16" : "f32");
            tf_free(ir);
        } else {
            CHECK(0, "vec: %s", d.msg);
        }
        tf_kernels_free(&plan);
        tf_module_free(m);
    }
    printf("llvm: %d kernels JIT-compiled, %d compared, %d objects made on threads alike\n", g_compiled, g_compared, g_objects);
    CHECK(g_compiled > 0, "some kernels were compiled");
    CHECK(g_objects > 0, "objects were made on threads");
    return check_report();
}
