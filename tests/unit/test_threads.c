/* test_threads.c — results do not depend on the number of threads.
 *
 * Each model is compiled for the cpu target with 1, 2, 3, 7 and 16 threads
 * (more threads than this machine has cores is allowed and must change
 * nothing but speed); every session gets the same seed and the same fresh
 * random inputs, takes two steps, and every output, param, buffer and
 * optimizer slot must equal the 1-thread session's bit for bit. The models
 * are the examples at sizes where the GEMMs are large enough to be split
 * over threads and the convolutions' weight gradients add over several
 * images, in fp32 and in bf16, and the target cases that stress the same
 * splits. (Before, a GEMM was cut into one block per thread, and OpenBLAS
 * may add a dot product in another order for another block shape; a
 * convolution's weight gradient added one partial sum per thread.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime.h"
#include "target_cases.h"
#include "testutil.h"
#include "tfuse.h"

static uint64_t g_seed;
static int g_compared;

enum { NT = 5, MAXIN = 32 };
static const int thread_counts[NT] = {1, 2, 3, 7, 16};

typedef struct run {
    tf_context_t *ctx;
    tf_model_t *m;
    tf_program_t *p[NT];
    tf_session_t *s[NT];
    void *data[MAXIN];
} run;

static void run_free(run *r)
{
    for (int i = 0; i < NT; i++) {
        tf_session_free(r->s[i]);
        tf_program_free(r->p[i]);
    }
    for (int i = 0; i < MAXIN; i++) free(r->data[i]);
    tf_model_free(r->m);
    tf_context_free(r->ctx);
}

static bool run_make(run *r, const char *label, const char *text, tf_mode mode, const char *precision,
                     const tf_dim_override *dims, size_t nd)
{
    memset(r, 0, sizeof *r);
    tf_context_create(&r->ctx);
    if (tf_model_parse_string(r->ctx, label, text, strlen(text), dims, nd, &r->m)) {
        CHECK(0, "%s: %s", label, tf_context_last_error(r->ctx));
        return false;
    }
    for (int t = 0; t < NT; t++) {
        tf_compile_options o;
        tf_compile_options_init(&o);
        o.mode = mode;
        o.target = TF_TARGET_CPU;
        if (precision) tf_precision_parse(precision, &o.precision);   /* NULL: the train block's */
        o.threads = thread_counts[t];
        if (tf_program_compile(r->ctx, r->m, &o, &r->p[t]) || tf_session_create(r->ctx, r->p[t], TF_TARGET_CPU, g_seed, &r->s[t])) {
            CHECK(0, "%s, %d threads: %s", label, thread_counts[t], tf_context_last_error(r->ctx));
            return false;
        }
        tf_session_info info;
        CHECK(!tf_session_get_info(r->s[t], &info) && info.threads == thread_counts[t], "%s: the session runs %d threads, not %d",
              label, info.threads, thread_counts[t]);
    }
    uint64_t s = g_seed ^ 0x2545f491u;
    for (size_t i = 0; i < tf_program_io_count(r->p[0], TF_IO_INPUT) && i < MAXIN; i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8], n = 1, bound = 0;
        tf_program_io(r->p[0], TF_IO_INPUT, i, &name, &dt, &rank, shape);
        tf_program_input_bound(r->p[0], i, &bound);
        for (int k = 0; k < rank; k++) n *= shape[k];
        if (!(r->data[i] = calloc((size_t)(n ? n : 1), (size_t)tf_dtype_size(dt)))) return false;
        bool fl = dt == TF_DTYPE_F32 || dt == TF_DTYPE_F64 || dt == TF_DTYPE_F16 || dt == TF_DTYPE_BF16;
        for (int64_t k = 0; k < n; k++) {
            double u = test_rnd(&s);
            tf_elem_store((tf_dt)dt, r->data[i], k, fl ? 4 * u - 2 : (double)(int64_t)(u * (double)(bound > 0 ? bound : 2)));
        }
        for (int t = 0; t < NT; t++)
            if (tf_session_bind(r->s[t], name, dt, shape, rank, r->data[i])) {
                CHECK(0, "%s: bind %s: %s", label, name, tf_context_last_error(r->ctx));
                return false;
            }
    }
    return true;
}

static bool same_bits(const char *label, const char *what, const char *name, int t, const tf_tensor_view *a,
                      const tf_tensor_view *b)
{
    size_t bytes = (size_t)tc_numel(a) * (size_t)tf_dtype_size(a->dtype);
    bool same = a->dtype == b->dtype && tc_numel(a) == tc_numel(b) && !memcmp(a->data, b->data, bytes);
    CHECK(same, "%s: %s %s differs between 1 and %d threads (seed %llu)", label, what, name, thread_counts[t],
          (unsigned long long)g_seed);
    g_compared++;
    return same;
}

/* After each step: outputs; after the last, every param and buffer (the
 * optimizer's slots and step counter are buffers of a train program). */
static void compare(run *r, const char *label, bool state)
{
    for (int t = 1; t < NT; t++) {
        for (size_t i = 0; i < tf_program_io_count(r->p[0], TF_IO_OUTPUT); i++) {
            const char *name;
            tf_tensor_view a, b;
            tf_program_io(r->p[0], TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
            tf_session_output(r->s[0], name, &a);
            tf_session_output(r->s[t], name, &b);
            same_bits(label, "output", name, t, &a, &b);
        }
        for (int kind = TF_IO_PARAM; state && kind <= TF_IO_BUFFER; kind++)
            for (size_t i = 0; i < tf_program_io_count(r->p[0], (tf_io_kind)kind); i++) {
                const char *name;
                tf_tensor_view a = {0}, b = {0};
                tf_program_io(r->p[0], (tf_io_kind)kind, i, &name, NULL, NULL, NULL);
                tf_session_get_state(r->s[0], name, &a, 0);
                size_t bytes = (size_t)tc_numel(&a) * (size_t)tf_dtype_size(a.dtype);
                a.data = malloc(bytes ? bytes : 1);
                b.data = malloc(bytes ? bytes : 1);
                if (a.data && b.data && !tf_session_get_state(r->s[0], name, &a, bytes) &&
                    !tf_session_get_state(r->s[t], name, &b, bytes))
                    same_bits(label, "state", name, t, &a, &b);
                else
                    CHECK(0, "%s: state %s: %s", label, name, tf_context_last_error(r->ctx));
                free(a.data);
                free(b.data);
            }
    }
}

static void check_model(const char *label, const char *text, tf_mode mode, const char *precision, const tf_dim_override *dims,
                        size_t nd)
{
    run r;
    if (run_make(&r, label, text, mode, precision, dims, nd)) {
        for (int step = 0; step < 2; step++) {
            bool ok = true;
            for (int t = 0; t < NT && ok; t++)
                if (tf_session_run(r.s[t])) {
                    CHECK(0, "%s, %d threads: run: %s", label, thread_counts[t], tf_context_last_error(r.ctx));
                    ok = false;
                }
            if (!ok) break;
            compare(&r, label, mode == TF_MODE_TRAIN && step == 1);
        }
    }
    run_free(&r);
}

int main(void)
{
    g_seed = test_seed();
    if (tf_backend_cpu.unavailable()) {
        printf("threads: no cpu target in this build (no LLVM); nothing to compare\n");
        return check_report();
    }
    /* sizes where the GEMMs split into several pieces and a conv weight
     * gradient adds over more images than it has groups */
    static const struct {
        const char *file;
        tf_dim_override dims[3];
        size_t nd;
    } models[] = {
        {"mlp.ir", {{"B", 96}, {"F", 200}}, 2},
        {"cnn.ir", {{"N", 6}, {"C", 8}}, 2},
        {"transformer.ir", {{"B", 3}, {"T", 24}, {"V", 70}}, 3},
    };
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char path[4096];
        char *text = test_read_example(models[i].file, path, sizeof path);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        static const char *precisions[] = {"fp32", "bf16"};
        for (int pi = 0; pi < 2; pi++) {
            char lab[4200];
            snprintf(lab, sizeof lab, "%s train [%s]", path, precisions[pi]);
            check_model(lab, text, TF_MODE_TRAIN, precisions[pi], models[i].dims, models[i].nd);
        }
        char lab[4200];
        snprintf(lab, sizeof lab, "%s infer", path);
        check_model(lab, text, TF_MODE_INFER, NULL, models[i].dims, models[i].nd);
        free(text);
    }
    static const char *cases[] = {"gemm, larger and batched", "conv", "long rows and columns", "train conv, pools, bias",
                                  "train batchnorm, slice, concat", "reductions with broadcast operands"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *text = tc_text(cases[i]);
        CHECK(text != NULL, "no target case '%s'", cases[i]);
        if (text) check_model(cases[i], text, strncmp(cases[i], "train", 5) ? TF_MODE_INFER : TF_MODE_TRAIN, NULL, NULL, 0);
    }
    printf("threads: %d tensors bit-identical on 1, 2, 3, 7 and 16 threads\n", g_compared);
    return check_report();
}
