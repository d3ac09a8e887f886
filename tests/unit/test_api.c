/* test_api.c — the public API's contracts: statuses and messages for misuse,
 * binding without copies, state save/load round trips, targets that cannot
 * run, and independence of contexts (two threads, one model each). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tfuse.h"

static const char *model =
    "module tiny\ndim B = 3\ninput x : f32[B, 4]\nparam w : f32[4, 2] = normal(std=1.0)\n"
    "param b : f32[2] = normal(std=1.0)\nbuffer count : f32[2] = zeros()\n"
    "h = linear(x, w, b)\nc = add(count, 1)\ny = relu(h)\noutput y\noutput pre = h\nupdate count = c\n";

static tf_program_t *compile(tf_context_t *ctx, const char *text, tf_mode mode)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    if (tf_model_parse_string(ctx, "tiny.ir", text, strlen(text), NULL, 0, &m)) return NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    tf_program_compile(ctx, m, &o, &p);
    tf_model_free(m);
    return p;
}

static void test_misuse(void)
{
    tf_context_t *ctx;
    CHECK(tf_context_create(&ctx) == TF_OK, "context");
    tf_model_t *m = NULL;
    CHECK(tf_model_parse_string(ctx, "bad.ir", "x = relu(", 9, NULL, 0, &m) == TF_ERR_PARSE && !m, "parse error");
    CHECK(strstr(tf_context_last_error(ctx), "bad.ir:1:10: error: expected an operand"), "message: %s",
          tf_context_last_error(ctx));
    CHECK(tf_model_parse_file(ctx, "/nonexistent/model.ir", NULL, 0, &m) == TF_ERR_IO, "missing file");
    CHECK(strstr(tf_context_last_error(ctx), "/nonexistent/model.ir: error: cannot open"), "%s", tf_context_last_error(ctx));
    tf_dim_override od = {"Z", 4};
    CHECK(tf_model_parse_string(ctx, "t.ir", model, strlen(model), &od, 1, &m) == TF_ERR_VERIFY, "unknown dim");

    tf_program_t *p = compile(ctx, model, TF_MODE_INFER);
    CHECK(p != NULL, "compile: %s", tf_context_last_error(ctx));
    if (!p) { tf_context_free(ctx); return; }
    tf_session_t *s = NULL;
    CHECK(tf_session_create(ctx, p, TF_TARGET_CUDA, 0, &s) == TF_ERR_UNAVAILABLE && !s, "cuda unavailable");
    CHECK(strstr(tf_context_last_error(ctx), "cuda"), "names the target: %s", tf_context_last_error(ctx));
    CHECK(tf_session_create(ctx, p, TF_TARGET_INTERP, 1, &s) == TF_OK, "session");
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i / 7 - 0.5f;
    int64_t shape[2] = {3, 4}, wrong[2] = {4, 3};
    CHECK(tf_session_run(s) == TF_ERR_RUNTIME && strstr(tf_context_last_error(ctx), "'x' is not bound"), "unbound");
    CHECK(tf_session_bind(s, "nope", TF_DTYPE_F32, shape, 2, x) == TF_ERR_INVALID_ARG, "unknown input");
    CHECK(tf_session_bind(s, "x", TF_DTYPE_F32, wrong, 2, x) == TF_ERR_INVALID_ARG &&
              strstr(tf_context_last_error(ctx), "f32[3, 4]") && strstr(tf_context_last_error(ctx), "f32[4, 3]"),
          "wrong shape: %s", tf_context_last_error(ctx));
    CHECK(tf_session_bind(s, "x", TF_DTYPE_F64, shape, 2, x) == TF_ERR_INVALID_ARG, "wrong dtype");
    CHECK(tf_session_bind(s, "x", TF_DTYPE_F32, shape, 2, x) == TF_OK, "bind");
    CHECK(tf_session_run(s) == TF_OK, "run: %s", tf_context_last_error(ctx));

    /* no copy: changing the caller's memory changes the next run */
    tf_tensor_view y, pre;
    CHECK(tf_session_output(s, "pre", &pre) == TF_OK && pre.rank == 2 && pre.shape[1] == 2, "output pre");
    float first = ((float *)pre.data)[0];
    x[0] += 1.0f;
    CHECK(tf_session_run(s) == TF_OK, "rerun");
    CHECK(tf_session_output(s, "pre", &pre) == TF_OK && ((float *)pre.data)[0] != first, "bound memory is read in place");
    CHECK(tf_session_output(s, "y", &y) == TF_OK, "output y");
    for (int i = 0; i < 6; i++)
        CHECK(((float *)y.data)[i] == (((float *)pre.data)[i] > 0 ? ((float *)pre.data)[i] : 0), "relu of pre [%d]", i);
    CHECK(tf_session_output(s, "h", &y) == TF_ERR_INVALID_ARG, "outputs are looked up by output name");

    /* buffers update after each step */
    float cnt[2] = {0};
    tf_tensor_view cv = {.data = cnt};
    CHECK(tf_session_get_state(s, "count", &cv, sizeof cnt) == TF_OK && cnt[0] == 2 && cnt[1] == 2, "two steps counted: %g", cnt[0]);

    /* save, perturb, load: state restored; a bad file changes nothing */
    char dir[] = "/tmp/tfuse_api_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], badpath[256];
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    snprintf(badpath, sizeof badpath, "%s/bad.safetensors", dir);
    CHECK(tf_session_save_state(s, path) == TF_OK, "save: %s", tf_context_last_error(ctx));
    float w[8], w2[8], zeros[8] = {0};
    tf_tensor_view wv = {.data = w};
    CHECK(tf_session_get_state(s, "w", &wv, sizeof w) == TF_OK && wv.rank == 2, "get w");
    float small[3] = {7, 7, 7};
    tf_tensor_view sv = {.data = small};
    CHECK(tf_session_get_state(s, "w", &sv, sizeof small) == TF_ERR_INVALID_ARG && small[0] == 7 &&
              strstr(tf_context_last_error(ctx), "needs 32 bytes, the buffer holds 12"),
          "get_state refuses a short buffer: %s", tf_context_last_error(ctx));
    tf_tensor_view qv = {.data = NULL};
    CHECK(tf_session_get_state(s, "w", &qv, 0) == TF_OK && qv.rank == 2 && qv.shape[0] * qv.shape[1] == 8,
          "get_state with no buffer gives the shape");
    tf_tensor_view zv = wv;
    zv.data = zeros;
    CHECK(tf_session_set_state(s, "w", &zv) == TF_OK, "set w");
    tf_tensor_view wrongv = zv;
    wrongv.shape[0] = 2;
    CHECK(tf_session_set_state(s, "w", &wrongv) == TF_ERR_INVALID_ARG, "set with the wrong shape");
    FILE *f = fopen(badpath, "wb");
    if (f) { fputs("not a safetensors file", f); fclose(f); }
    CHECK(tf_session_load_state(s, badpath) == TF_ERR_FORMAT && strstr(tf_context_last_error(ctx), badpath),
          "bad file: %s", tf_context_last_error(ctx));
    CHECK(tf_session_load_state(s, path) == TF_OK, "load: %s", tf_context_last_error(ctx));
    tf_tensor_view w2v = {.data = w2};
    CHECK(tf_session_get_state(s, "w", &w2v, sizeof w2) == TF_OK && !memcmp(w, w2, sizeof w), "w restored");
    unlink(path);
    unlink(badpath);
    rmdir(dir);

    /* the interpreter has no memory of its own to measure */
    double gbps = -1;
    CHECK(tf_session_copy_bandwidth(s, &gbps) == TF_ERR_UNSUPPORTED && gbps == 0 &&
              strstr(tf_context_last_error(ctx), "interp target"),
          "no copy bandwidth on interp: %s", tf_context_last_error(ctx));
    CHECK(tf_session_copy_bandwidth(s, NULL) == TF_ERR_INVALID_ARG, "copy bandwidth needs somewhere to put it");

    /* stats */
    int found = 0;
    for (size_t i = 0; i < tf_program_stat_count(p); i++) {
        const char *name;
        int64_t v;
        tf_program_stat(p, i, &name, &v);
        if (!strcmp(name, "params")) found += v == 10;
        if (!strcmp(name, "ops")) found += v > 0;
        if (!strcmp(name, "peak_bytes")) found += v > 0;
    }
    CHECK(found == 3, "stats params=10, ops, peak_bytes");
    tf_session_free(s);
    tf_program_free(p);
    tf_context_free(ctx);
}

/* Two threads, each with its own context, compile and run the same model
 * with the same seed on the default target (cpu where there is LLVM: both
 * reach the process's JIT cache at once): the results agree. */
typedef struct job { float out[6]; int ok; } job;

static void *worker(void *arg)
{
    job *j = arg;
    tf_context_t *ctx;
    if (tf_context_create(&ctx)) return NULL;
    tf_program_t *p = compile(ctx, model, TF_MODE_INFER);
    tf_session_t *s = NULL;
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i / 5;
    int64_t shape[2] = {3, 4};
    tf_tensor_view y;
    j->ok = p && !tf_session_create(ctx, p, tf_default_target(), 9, &s) && !tf_session_bind(s, "x", TF_DTYPE_F32, shape, 2, x) &&
            !tf_session_run(s) && !tf_session_output(s, "pre", &y);
    if (j->ok) memcpy(j->out, y.data, sizeof j->out);
    tf_session_free(s);
    tf_program_free(p);
    tf_context_free(ctx);
    return NULL;
}

static void test_threads(void)
{
    pthread_t t[2];
    job jobs[2] = {{{0}, 0}, {{0}, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK(jobs[0].ok && jobs[1].ok, "both threads ran");
    CHECK(!memcmp(jobs[0].out, jobs[1].out, sizeof jobs[0].out), "same seed, same numbers");
}

/* What each target says about how it runs an op. */
static void test_op_support(void)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    const char *how = NULL;
    char why[512];
    CHECK(!tf_target_op_support(ctx, TF_TARGET_INTERP, "matmul", &how, why, sizeof why) && how && !strcmp(how, "interp"),
          "interp runs matmul: %s", how ? how : "NULL");
    CHECK(tf_target_op_support(ctx, TF_TARGET_CPU, "frobnicate", &how, why, sizeof why) == TF_ERR_INVALID_ARG &&
              strstr(tf_context_last_error(ctx), "no op named 'frobnicate'"),
          "an unknown op: %s", tf_context_last_error(ctx));
    CHECK(!tf_target_op_support(ctx, TF_TARGET_CUDA, "matmul", &how, why, sizeof why) && how && !strcmp(how, "library") &&
              strstr(why, "cuBLASLt"),
          "cuda: matmul through cuBLASLt (%s: %s)", how ? how : "NULL", why);
    CHECK(!tf_target_op_support(ctx, TF_TARGET_CUDA, "exp", &how, why, sizeof why) && how && !strcmp(how, "jit"),
          "cuda: exp is generated code (%s: %s)", how ? how : "NULL", why);
    CHECK(!tf_target_op_support(ctx, TF_TARGET_CUDA, "conv2d", &how, why, sizeof why) && how && !strcmp(how, "library") &&
              strstr(why, "cuDNN"),
          "cuda: conv2d through cuDNN (%s: %s)", how ? how : "NULL", why);
    CHECK(!tf_target_op_support(ctx, TF_TARGET_CUDA, "conv2d_grad_weight", &how, why, sizeof why) && how && !strcmp(how, "library") &&
              strstr(why, "cuDNN"),
          "cuda: conv2d_grad_weight through cuDNN (%s: %s)", how ? how : "NULL", why);
    static const char *const generated[] = {"maxpool2d", "avgpool2d", "maxpool2d_grad", "avgpool2d_grad", "gather", "scatter_add",
                                            "concat", "slice_grad"};
    for (size_t i = 0; i < sizeof generated / sizeof *generated; i++)
        CHECK(!tf_target_op_support(ctx, TF_TARGET_CUDA, generated[i], &how, why, sizeof why) && how && !strcmp(how, "jit") &&
                  strstr(why, "generated"),
              "cuda: %s is a generated kernel (%s: %s)", generated[i], how ? how : "NULL", why);
    CHECK(!tf_target_op_support(ctx, TF_TARGET_CPU, "reshape", &how, why, sizeof why) && (!how || !strcmp(how, "view")),
          "cpu: reshape is a view (%s: %s)", how ? how : "NULL", why);
    CHECK(!tf_target_op_support(ctx, TF_TARGET_CPU, "linear", &how, why, sizeof why) && !how && why[0],
          "cpu: a layer op is lowered first: %s", why);
    const char *cpu_exp = NULL;   /* NULL: a build without LLVM, which has no cpu target */
    tf_target_op_support(ctx, TF_TARGET_CPU, "exp", &cpu_exp, NULL, 0);
    if (cpu_exp) {
        CHECK(!tf_target_op_support(ctx, TF_TARGET_CPU, "reduce_sum", &how, why, sizeof why) && how && !strcmp(how, "jit"),
              "cpu: reduce_sum is JIT-compiled (%s: %s)", how ? how : "NULL", why);
        CHECK(!tf_target_op_support(ctx, TF_TARGET_CPU, "matmul", &how, why, sizeof why) && how && !strcmp(how, "library"),
              "cpu: matmul is a GEMM (%s: %s)", how ? how : "NULL", why);
    }
    tf_context_free(ctx);
}

/* tf_version: the header's TFUSE_VERSION, MAJOR.MINOR.PATCH, as the library was built */
static void test_version(void)
{
    const char *v = tf_version();
    unsigned a, b, c;
    char end;
    CHECK(v && !strcmp(v, TFUSE_VERSION), "tf_version() %s, the header says %s", v ? v : "NULL", TFUSE_VERSION);
    CHECK(v && sscanf(v, "%u.%u.%u%c", &a, &b, &c, &end) == 3, "version '%s' is MAJOR.MINOR.PATCH", v ? v : "NULL");
    /* tf_struct_layout: sizes and offsets as compiled here, -1 for what is not there */
    CHECK(tf_struct_layout("tf_compile_options", NULL) == sizeof(tf_compile_options), "tf_compile_options' size");
    CHECK(tf_struct_layout("tf_compile_options", "cpu_explain") == offsetof(tf_compile_options, cpu_explain), "cpu_explain's offset");
    CHECK(tf_struct_layout("tf_session_info", "graph_replays") == offsetof(tf_session_info, graph_replays), "graph_replays' offset");
    CHECK(tf_struct_layout("tf_package_info", "bytes") == offsetof(tf_package_info, bytes), "bytes' offset");
    CHECK(tf_struct_layout("tf_compile_options", "no_such_field") == (size_t)-1, "an unknown field is -1");
    CHECK(tf_struct_layout("tf_no_such", NULL) == (size_t)-1 && tf_struct_layout(NULL, NULL) == (size_t)-1, "an unknown struct is -1");
}

/* tf_compile_options.outputs: the outputs not named are not computed, an
 * input only they read is no input, and misuse says why. */
static void test_keep_outputs(void)
{
    static const char *two =
        "module two\ninput x : f32[3, 4]\ninput y : i64[3]\nparam w : f32[4, 2] = normal(std=1.0)\n"
        "h = matmul(x, w)\nloss = cross_entropy(h, y)\noutput loss\noutput logits = h\n";
    tf_context_t *ctx;
    CHECK(tf_context_create(&ctx) == TF_OK, "context");
    tf_model_t *m = NULL;
    CHECK(tf_model_parse_string(ctx, "two.ir", two, strlen(two), NULL, 0, &m) == TF_OK, "parse: %s",
          tf_context_last_error(ctx));
    if (!m) { tf_context_free(ctx); return; }
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_INTERP;
    const char *logits[] = {"logits"}, *nope[] = {"logits", "nope"};
    o.outputs = logits, o.noutputs = 1;
    tf_program_t *p = NULL;
    CHECK(tf_program_compile(ctx, m, &o, &p) == TF_OK && p, "compile: %s", tf_context_last_error(ctx));
    if (p) {
        const char *name = NULL;
        CHECK(tf_program_io_count(p, TF_IO_OUTPUT) == 1 && !tf_program_io(p, TF_IO_OUTPUT, 0, &name, NULL, NULL, NULL) &&
                  !strcmp(name, "logits"), "one output, logits");
        CHECK(tf_program_io_count(p, TF_IO_INPUT) == 1 && !tf_program_io(p, TF_IO_INPUT, 0, &name, NULL, NULL, NULL) &&
                  !strcmp(name, "x"), "one input, x (y only fed the loss)");
        tf_session_t *s = NULL;
        float x[12];
        for (int i = 0; i < 12; i++) x[i] = (float)i / 5 - 1;
        int64_t shape[2] = {3, 4};
        CHECK(tf_session_create(ctx, p, TF_TARGET_INTERP, 0, &s) == TF_OK, "session");
        CHECK(s && tf_session_bind(s, "x", TF_DTYPE_F32, shape, 2, x) == TF_OK && tf_session_run(s) == TF_OK,
              "runs without y: %s", tf_context_last_error(ctx));
        tf_tensor_view v;
        CHECK(s && tf_session_output(s, "logits", &v) == TF_OK && v.rank == 2 && v.shape[1] == 2, "logits");
        CHECK(s && tf_session_output(s, "loss", &v) != TF_OK, "no loss");
        tf_session_free(s);
        CHECK(tf_program_save(ctx, p, "/tmp/never-written.tfp", 0, 0, NULL, NULL) == TF_ERR_UNSUPPORTED &&
                  strstr(tf_context_last_error(ctx), "only some outputs"), "not packaged: %s", tf_context_last_error(ctx));
        tf_program_free(p);
        p = NULL;
    }
    o.outputs = nope, o.noutputs = 2;
    CHECK(tf_program_compile(ctx, m, &o, &p) == TF_ERR_INVALID_ARG && !p &&
              strstr(tf_context_last_error(ctx), "no output named 'nope' to compute (its outputs: loss, logits)"),
          "unknown output: %s", tf_context_last_error(ctx));
    o.mode = TF_MODE_TRAIN;
    o.outputs = logits, o.noutputs = 1;
    CHECK(tf_program_compile(ctx, m, &o, &p) == TF_ERR_INVALID_ARG && !p && strstr(tf_context_last_error(ctx), "'loss'"),
          "train keeps the loss: %s", tf_context_last_error(ctx));
    tf_model_free(m);
    tf_context_free(ctx);
}

/* Profiles carry each kernel's least traffic, and a copy's bandwidth is
 * there to hold it against (cpu target; skipped where it cannot run). */
static void test_bandwidth(void)
{
    tf_context_t *ctx;
    CHECK(tf_context_create(&ctx) == TF_OK, "context");
    tf_program_t *p = compile(ctx, model, TF_MODE_INFER);
    tf_session_t *s = NULL;
    if (!p || tf_session_create(ctx, p, TF_TARGET_CPU, 1, &s)) {
        CHECK(!p || strstr(tf_context_last_error(ctx), "cpu"), "why cpu cannot run: %s", tf_context_last_error(ctx));
        tf_program_free(p);
        tf_context_free(ctx);
        return;
    }
    float x[12] = {0};
    int64_t shape[2] = {3, 4};
    CHECK(tf_session_bind(s, "x", TF_DTYPE_F32, shape, 2, x) == TF_OK && tf_session_set_profiling(s, 1) == TF_OK, "bind");
    for (int i = 0; i < 3; i++) CHECK(tf_session_run(s) == TF_OK, "run: %s", tf_context_last_error(ctx));
    int counter = 0, gemm = 0;
    for (size_t i = 0; i < tf_session_profile_count(s); i++) {
        tf_kernel_profile kp;
        CHECK(tf_session_profile(s, i, &kp) == TF_OK, "profile %zu", i);
        /* count's update, in place: 2 floats read, 2 written */
        if (!strcmp(kp.how, "jit") && kp.elements == 2) {
            counter++;
            CHECK(kp.bytes == 16, "%s moves %lld bytes, want 16", kp.name, (long long)kp.bytes);
        }
        /* linear and relu: at least x, w and the product once */
        if (strstr(kp.how, "gemm")) {
            gemm++;
            CHECK(kp.bytes >= (12 + 8 + 6) * 4, "%s moves %lld bytes", kp.name, (long long)kp.bytes);
        }
    }
    CHECK(counter == 1 && gemm == 1, "the counter's kernel and the GEMM are profiled (%d, %d)", counter, gemm);
    double gbps = 0;
    CHECK(tf_session_copy_bandwidth(s, &gbps) == TF_OK && gbps > 0.1 && gbps < 1e5, "a copy's bandwidth: %g GB/s (%s)", gbps,
          tf_context_last_error(ctx));
    float cnt[2] = {0};
    tf_tensor_view cv = {.data = cnt};
    CHECK(tf_session_get_state(s, "count", &cv, sizeof cnt) == TF_OK && cnt[0] == 3, "measuring left the state alone: %g", cnt[0]);
    tf_session_free(s);
    tf_program_free(p);
    tf_context_free(ctx);
}

int main(void)
{
    test_bandwidth();
    test_version();
    test_misuse();
    test_keep_outputs();
    test_op_support();
    test_threads();
    return check_report();
}
