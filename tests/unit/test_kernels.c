/* test_kernels.c — the kernel IR computes exactly what the module does.
 *
 * Each example (and a few small models), compiled in train and infer mode
 * with the full pipeline: one interpreter runs the module op by op, another
 * runs only the kernels built from it (regions' private values never
 * materialized, loads with broadcast strides, reductions with their
 * prologues and epilogues, library calls). Outputs and the values every
 * update writes must be bit-identical. Also: the kernels' text names every
 * kernel, and a region becomes one kernel. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "interp.h"
#include "kernel.h"
#include "parser.h"
#include "passes.h"
#include "testutil.h"

static uint64_t g_seed;

static void fill(tf_interp_ctx *a, tf_interp_ctx *b, tf_module *m, uint64_t seed)
{
    tf_diag d = {0};
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        if (v->kind != TF_VAL_INPUT) continue;
        tf_tensor *ta = tf_interp_tensor(a, v, &d), *tb = tf_interp_tensor(b, v, &d);
        uint64_t s = seed ^ tf_rng_stream(v->name);
        for (int64_t k = 0; ta && tb && k < ta->numel; k++) {
            double u = test_rnd(&s);
            /* labels and ids: the smallest class count or table among the examples */
            double x = tf_dtype_is_float(v->type.dtype) ? 4 * u - 2 : (double)(int64_t)(u * 10);
            ta->data[k] = tb->data[k] = tf_dtype_round(v->type.dtype, x);
        }
    }
}

static void same(const char *label, const char *name, const tf_tensor *x, const tf_tensor *y)
{
    bool ok = x && y && x->numel == y->numel;
    int64_t at = -1;
    for (int64_t k = 0; ok && k < x->numel; k++)
        if (memcmp(&x->data[k], &y->data[k], sizeof(double)) != 0 && !(isnan(x->data[k]) && isnan(y->data[k]))) {
            ok = false;
            at = k;
        }
    CHECK(ok, "%s: %s differs at %lld: interpreter %.17g, kernels %.17g (seed %llu)", label, name, (long long)at,
          at >= 0 ? x->data[at] : 0, at >= 0 ? y->data[at] : 0, (unsigned long long)g_seed);
}

static void run(const char *label, const char *text, tf_ir_mode mode, const tf_dim_set *dims, int nd)
{
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), dims, nd, &m, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        return;
    }
    tf_options o = {.mode = mode, .diag = &d};
    tf_kernel_plan plan = {0};
    if (tf_run_pipeline(m, NULL, &o) || tf_kernels_build(m, &plan, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        tf_module_free(m);
        return;
    }
    int regions_seen = 0;
    for (int i = 0; i < plan.nkernels; i++) regions_seen += plan.kernels[i].region != 0;
    CHECK(!m->nregions || regions_seen >= m->nregions, "%s: every region has a kernel", label);
    char *text_k = tf_kernels_print(m, &plan);
    CHECK(text_k && strstr(text_k, "kernel k0_"), "%s: kernels print", label);
    tf_free(text_k);
    tf_interp_ctx *a = tf_interp_create(m, mode, g_seed), *b = tf_interp_create(m, mode, g_seed);
    bool ok = a && b && !tf_interp_init_state(a, &d) && !tf_interp_init_state(b, &d);
    for (int step = 0; ok && step < 2; step++) {
        fill(a, b, m, g_seed + (uint64_t)step);
        /* the interpreter applies the step's updates at its end; compare the
         * values before that, then let b take a's new state */
        if (tf_interp_run(a, &d)) { CHECK(0, "%s: interpreter: %s", label, d.msg); break; }
        if (tf_kernels_eval(&plan, b, &d)) { CHECK(0, "%s: kernels: %s", label, d.msg); break; }
        char name[300];
        for (int i = 0; i < m->noutputs; i++) {
            snprintf(name, sizeof name, "step %d output %s", step, m->outputs[i].name);
            same(label, name, tf_interp_tensor(a, m->outputs[i].value, &d), tf_interp_tensor(b, m->outputs[i].value, &d));
        }
        if (getenv("TFUSE_KERNELS_DEBUG"))   /* the first stored value that differs, in program order */
            for (int i = 0; i < plan.nkernels; i++) {
                const tf_kernel *k = &plan.kernels[i];
                bool found = false;
                for (int bi = 0; bi < k->nbufs && !found; bi++) {
                    if (!k->bufs[bi].written) continue;
                    tf_tensor *x = tf_interp_tensor(a, k->bufs[bi].value, &d), *y = tf_interp_tensor(b, k->bufs[bi].value, &d);
                    for (int64_t q = 0; q < x->numel && !found; q++)
                        if (x->data[q] != y->data[q]) {
                            printf("step %d: first difference in %s (kernel %s) at %lld: %.9g vs %.9g\n", step,
                                   k->bufs[bi].value->name, k->name, (long long)q, x->data[q], y->data[q]);
                            found = true;
                        }
                }
                if (found) break;
            }
        for (int i = 0; i < m->nupdates; i++) {
            snprintf(name, sizeof name, "step %d update of %s", step, m->updates[i].buffer->name);
            /* an update memplan writes in place is in its param's or buffer's storage */
            const tf_value *u = m->updates[i].value;
            same(label, name, tf_interp_tensor(a, u, &d), tf_interp_tensor(b, u->home ? u->home : u, &d));
        }
        for (int i = 0; i < m->decls.n; i++) {   /* carry the interpreter's new state over */
            tf_value *v = m->decls.items[i];
            if (v->kind == TF_VAL_INPUT) continue;
            tf_tensor *ta = tf_interp_tensor(a, v, &d), *tb = tf_interp_tensor(b, v, &d);
            memcpy(tb->data, ta->data, (size_t)ta->numel * sizeof(double));
        }
        tf_interp_set_step(b, tf_interp_step(a));
    }
    tf_interp_free(a);
    tf_interp_free(b);
    tf_kernels_free(&plan);
    tf_module_free(m);
}

/* tf_kernel_bytes: the least traffic of each kernel, summed over a small
 * inference program, against the count by hand (f32: 4 bytes, i64: 8). */
static void bytes_case(const char *label, const char *body, int64_t want)
{
    char text[1024];
    snprintf(text, sizeof text, "input x : f32[64, 32]\ninput b : f32[32]\ninput ids : i64[8]\n"
             "param tab : f32[1000, 16] = zeros()\nparam w : f32[32, 16] = zeros()\n%s", body);
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(label, text, strlen(text), NULL, 0, &m, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
        return;
    }
    tf_options o = {.mode = TF_IR_INFER, .diag = &d};
    tf_kernel_plan plan = {0};
    if (tf_run_pipeline(m, NULL, &o) || tf_kernels_build(m, &plan, &d)) {
        CHECK(0, "%s: %s", label, d.msg);
    } else {
        int64_t got = 0;
        for (int i = 0; i < plan.nkernels; i++) got += tf_kernel_bytes(&plan.kernels[i]);
        CHECK(got == want, "%s: tf_kernel_bytes sums to %lld, want %lld", label, (long long)got, (long long)want);
    }
    tf_kernels_free(&plan);
    tf_module_free(m);
}

static void test_bytes(void)
{
    /* a fused region: x and the broadcast b read once each, y written once */
    bytes_case("add+relu", "h = add(x, b)\ny = relu(h)\noutput y\n", (2048 + 32 + 2048) * 4);
    /* a reduction: x read, one value per row written */
    bytes_case("sum", "y = sum(x, axes=[1])\noutput y\n", (2048 + 64) * 4);
    /* a transpose reads and writes every element once, whatever the strides */
    bytes_case("transpose", "y = transpose(x, perm=[1, 0])\noutput y\n", 2048 * 2 * 4);
    /* a slice reads only the elements it keeps */
    bytes_case("slice", "y = slice(x, axis=1, start=8, end=24)\noutput y\n", 1024 * 2 * 4);
    /* a gather touches the rows it takes, not the table */
    bytes_case("embedding", "y = embedding(ids, tab)\noutput y\n", 8 * 8 + 128 * 4 + 128 * 4);
    /* a GEMM's lower bound: both operands and the product once */
    bytes_case("matmul", "y = matmul(x, w)\noutput y\n", (2048 + 512 + 1024) * 4);
    /* the same load twice is one read */
    bytes_case("square", "y = mul(x, x)\noutput y\n", 2048 * 2 * 4);
}

int main(void)
{
    test_bytes();
    g_seed = test_seed();
    for (size_t i = 0; i < TEST_NEXAMPLES; i++) {
        const test_example *ex = &test_examples[i];
        tf_dim_set dims[3];
        for (int j = 0; j < ex->nd; j++) dims[j] = (tf_dim_set){ex->dims[j].name, ex->dims[j].value};
        char path[4096];
        char *text = test_read_example(ex->file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        for (int mode = 0; mode < 2; mode++) run(path, text, (tf_ir_mode)mode, dims, ex->nd);
        free(text);   /* test_read_example's */
    }
    run("dropout", "input x : f32[3, 7]\nparam w : f32[7, 5] = uniform()\nh = linear(x, w)\nd = dropout(h, p=0.3)\n"
        "s = softmax(d)\nloss = mean(s, axes=[])\noutput loss\noutput s\n", TF_IR_TRAIN, NULL, 0);
    return check_report();
}
