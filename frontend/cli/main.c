/* main.c — the `tfuse` command. A client of include/tfuse.h and nothing
 * else, like any host program: what the CLI can do, the API can do.
 *
 *   tfuse print FILE       parse, verify, print the canonical module
 *   tfuse opt FILE         run passes, print the result
 *   tfuse compile FILE     the full pipeline; --stats, --dump-ir, -o
 *   tfuse run FILE         inference on .npy inputs, .safetensors params
 *   tfuse train FILE       training on .npy data (train.c)
 *   tfuse bench FILE       step time, compile time, peak bytes, kernel profile (bench.c)
 *   tfuse doctor           what this build and machine can run
 *
 * The default target is tf_default_target(): cpu where this build has LLVM
 * (and no GPU is usable), else interp; --target picks another.
 *
 * Exit codes: 0 success, 1 an error in the input or while running, 2 bad
 * command-line usage. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage_cmd(const char *cmd, FILE *f);

int cli_usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "tfuse: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see 'tfuse %s --help')\n", cmd ? cmd : "");
    return 2;
}

const char *cli_flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] == 0 && *i + 1 < argc) return argv[++*i];
    return NULL;
}

static bool split_kv(const char *s, kv *out)
{
    const char *eq = strchr(s, '=');
    if (!eq || eq == s || !eq[1]) return false;
    char *key = strndup(s, (size_t)(eq - s));
    if (!key) return false;
    out->key = key;
    out->val = eq + 1;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!*s || *s == '-') return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

/* "8000000", "512K", "512M", "16G" (powers of 1024) */
static bool parse_bytes(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    if (!*s || *s == '-') return false;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : *end == 'T' ? 40 : 0;
    if (shift) end++;
    if (errno || *end || v == 0 || v > (1ull << (62 - shift))) return false;
    *out = (int64_t)(v << shift);
    return true;
}

static void free_args(args *a)
{
    for (size_t i = 0; i < a->ndims; i++) free((char *)a->dims[i].name);
    for (size_t i = 0; i < a->ninputs; i++) free((char *)a->inputs[i].key);
    for (size_t i = 0; i < a->noutputs; i++) free((char *)a->outputs[i].key);
}

static int parse_args(int argc, char **argv, args *a)
{
    const char *cmd = a->cmd;
    for (int i = 2; i < argc; i++) {
        const char *s = argv[i], *v;
        int r;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) { a->help = true; continue; }
        if ((v = cli_flag_value(argc, argv, &i, "--dim"))) {
            kv p;
            uint64_t n;
            if (a->ndims == MAX_ITEMS) return cli_usage_error(cmd, "too many --dim flags%s", "");
            if (!split_kv(v, &p)) return cli_usage_error(cmd, "--dim expects NAME=VALUE, found '%s'", v);
            if (!strcmp(p.val, "auto")) {
                a->dims[a->ndims++] = (tf_dim_override){p.key, TF_DIM_AUTO};
                continue;
            }
            if (!cli_parse_u64(p.val, &n) || n < 1 || n > ((uint64_t)1 << 40)) {
                free((char *)p.key);
                return cli_usage_error(cmd, "--dim value must be an integer in [1, 2^40] or auto, found '%s'", v);
            }
            a->dims[a->ndims++] = (tf_dim_override){p.key, (int64_t)n};
        } else if ((v = cli_flag_value(argc, argv, &i, "--seed"))) {
            if (!cli_parse_u64(v, &a->seed)) return cli_usage_error(cmd, "--seed expects a non-negative integer, found '%s'", v);
            a->seed_set = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--mode"))) {
            if (!strcmp(v, "train")) a->mode = TF_MODE_TRAIN;
            else if (!strcmp(v, "infer")) a->mode = TF_MODE_INFER;
            else return cli_usage_error(cmd, "--mode expects train or infer, found '%s'", v);
            a->mode_set = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--target"))) {
            if (!strcmp(v, "interp")) a->target = TF_TARGET_INTERP;
            else if (!strcmp(v, "cpu")) a->target = TF_TARGET_CPU;
            else if (!strcmp(v, "cuda")) a->target = TF_TARGET_CUDA;
            else return cli_usage_error(cmd, "--target expects interp, cpu or cuda, found '%s'", v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--passes"))) {
            a->passes = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-ir"))) {
            a->dump_ir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-dir"))) {
            a->dump_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--disable-pass"))) {
            if (a->ndisabled == MAX_ITEMS) return cli_usage_error(cmd, "too many --disable-pass flags%s", "");
            a->disabled[a->ndisabled++] = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-kernels"))) {
            a->dump_kernels = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--arch"))) {
            if (strncmp(v, "sm_", 3) || !v[3] || strspn(v + 3, "0123456789a") != strlen(v + 3))
                return cli_usage_error(cmd, "--arch expects a GPU architecture such as sm_80 or sm_90, found '%s'", v);
            a->arch = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-llvm"))) {
            a->dump_llvm = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads"))) {
            if (!cli_parse_u64(v, &a->threads) || a->threads < 1 || a->threads > 1024)
                return cli_usage_error(cmd, "--threads expects an integer in [1, 1024], found '%s'", v);
        } else if (!strcmp(cmd, "bench") && (v = cli_flag_value(argc, argv, &i, "--iters"))) {
            if (!cli_parse_u64(v, &a->iters) || a->iters < 1 || a->iters > 1000000)
                return cli_usage_error(cmd, "--iters expects an integer in [1, 1000000], found '%s'", v);
        } else if (!strcmp(cmd, "bench") && (v = cli_flag_value(argc, argv, &i, "--warmup"))) {
            if (!cli_parse_u64(v, &a->warmup) || a->warmup > 1000000)
                return cli_usage_error(cmd, "--warmup expects an integer in [0, 1000000], found '%s'", v);
            a->warmup_set = true;
        } else if (!strcmp(cmd, "bench") && !strcmp(s, "--profile")) {
            a->profile = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--checkpoint"))) {
            if (strcmp(v, "none") && strcmp(v, "auto"))
                return cli_usage_error(cmd, "--checkpoint expects none or auto, found '%s'", v);
            a->checkpoint = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--memory-budget"))) {
            if (!parse_bytes(v, &a->memory_budget))
                return cli_usage_error(cmd, "--memory-budget expects bytes (e.g. 8000000, 512M, 16G), found '%s'", v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--memory-limit"))) {
            if (!parse_bytes(v, &a->memory_limit))
                return cli_usage_error(cmd, "--memory-limit expects bytes (e.g. 8000000, 512M, 16G), found '%s'", v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--precision"))) {
            if (strcmp(v, "fp32") && strcmp(v, "fp16") && strcmp(v, "bf16"))
                return cli_usage_error(cmd, "--precision expects fp32, fp16 or bf16, found '%s'", v);
            a->precision = v;
        } else if (!strcmp(s, "--O0") || !strcmp(s, "-O0")) {
            a->o0 = true;
        } else if (!strcmp(s, "--explain")) {
            a->explain = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--params"))) {
            a->params = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--input")) || (v = cli_flag_value(argc, argv, &i, "--output"))) {
            bool in = !strncmp(s, "--input", 7);
            kv *list = in ? a->inputs : a->outputs;
            size_t *n = in ? &a->ninputs : &a->noutputs;
            if (*n == MAX_ITEMS) return cli_usage_error(cmd, "too many --input/--output flags%s", "");
            if (!split_kv(v, &list[*n])) return cli_usage_error(cmd, "expected NAME=FILE.npy, found '%s'", v);
            (*n)++;
        } else if (!strcmp(s, "-o") && i + 1 < argc) {
            a->out = argv[++i];
        } else if (!strcmp(s, "--stats")) {
            a->stats = true;
        } else if (!strcmp(s, "--random-inputs")) {
            a->random_inputs = true;
        } else if (!strcmp(cmd, "train") && (r = train_parse_flag(argc, argv, &i, a))) {
            if (r != 1) return r;
        } else if (s[0] == '-' && s[1]) {
            return cli_usage_error(cmd, "unknown or incomplete option '%s'", s);
        } else if (!a->file) {
            a->file = s;
        } else {
            return cli_usage_error(cmd, "more than one model file given ('%s')", s);
        }
    }
    if (!a->help && !a->file) return cli_usage_error(cmd, "no model file given%s", "");
    return 0;
}

int cli_fail(tf_context_t *ctx)
{
    fprintf(stderr, "%s\n", tf_context_last_error(ctx));
    return 1;
}
#define fail cli_fail

static tf_model_t *load_model(tf_context_t *ctx, const args *a)
{
    tf_model_t *m = NULL;
    if (tf_model_parse_file(ctx, a->file, a->dims, a->ndims, &m)) return NULL;
    return m;
}

static int cmd_print(tf_context_t *ctx, const args *a)
{
    tf_model_t *m = load_model(ctx, a);
    char *text = NULL;
    if (!m || tf_model_print(ctx, m, &text)) {
        tf_model_free(m);
        return fail(ctx);
    }
    fputs(text, stdout);
    free(text);
    tf_model_free(m);
    return 0;
}

void cli_fill_options(const args *a, tf_compile_options *o, FILE *explain)
{
    tf_compile_options_init(o);
    o->mode = a->mode;
    o->target = a->target;
    o->dump_ir = a->dump_ir;
    o->dump_dir = a->dump_dir;
    o->opt_level = a->o0 ? 0 : 1;
    o->disable_passes = a->disabled;
    o->ndisable_passes = a->ndisabled;
    o->precision = a->precision;
    o->explain = a->explain ? explain : NULL;
    o->memory_limit = a->memory_limit;
    o->checkpoint = a->checkpoint;
    o->dump_kernels = a->dump_kernels;
    o->memory_budget = a->memory_budget;
    o->dump_llvm = a->dump_llvm;
    o->threads = (int)a->threads;
}

static int cmd_opt(tf_context_t *ctx, const args *a)
{
    tf_model_t *m = load_model(ctx, a);
    char *text = NULL;
    tf_compile_options o;
    cli_fill_options(a, &o, stderr);   /* the module goes to stdout */
    if (!m || tf_model_run_passes(ctx, m, a->passes ? a->passes : "lower", &o) || tf_model_print(ctx, m, &text)) {
        tf_model_free(m);
        return fail(ctx);
    }
    fputs(text, stdout);
    free(text);
    tf_model_free(m);
    return 0;
}

static tf_program_t *compile(tf_context_t *ctx, tf_model_t *m, const args *a)
{
    tf_compile_options o;
    cli_fill_options(a, &o, stdout);
    tf_program_t *p = NULL;
    if (tf_program_compile(ctx, m, &o, &p)) return NULL;
    return p;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "%s: error: cannot write: %s\n", path, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    return 0;
}

static int cmd_compile(tf_context_t *ctx, const args *a)
{
    tf_model_t *m = load_model(ctx, a);
    if (!m) return fail(ctx);
    tf_program_t *p = compile(ctx, m, a);
    int rc = 0;
    if (!p) rc = fail(ctx);
    if (!rc && a->stats)
        for (size_t i = 0; i < tf_program_stat_count(p); i++) {
            const char *name;
            int64_t v;
            tf_program_stat(p, i, &name, &v);
            printf("%s: %" PRId64 "\n", name, v);
        }
    if (!rc && a->out && a->target == TF_TARGET_CUDA) {   /* a directory: IR, kernels, CUDA C and cubins */
        int n = 0;
        if (tf_program_write_artifact(ctx, p, a->out, a->arch, &n)) rc = fail(ctx);
        else printf("wrote %s: program.ir, kernels.txt, manifest.txt and %d cubins for %s\n", a->out, n, a->arch ? a->arch : "sm_90");
    } else if (!rc && a->out) {
        char *text = NULL;
        if (tf_program_print(ctx, p, &text)) rc = fail(ctx);
        else rc = write_file(a->out, text);
        free(text);
    }
    tf_program_free(p);
    tf_model_free(m);
    return rc;
}

/* ---- run ---- */

static void print_tensor(const char *name, const tf_tensor_view *t)
{
    int64_t n = 1;
    printf("%s : %s[", name, tf_dtype_str(t->dtype));
    for (int i = 0; i < t->rank; i++) {
        printf("%s%" PRId64, i ? ", " : "", t->shape[i]);
        n *= t->shape[i];
    }
    printf("] =");
    int64_t show = n <= 64 ? n : 8;
    for (int64_t i = 0; i < show; i++) {
        switch (t->dtype) {
        case TF_DTYPE_F32: printf(" %.7g", (double)((const float *)t->data)[i]); break;
        case TF_DTYPE_F64: printf(" %.10g", ((const double *)t->data)[i]); break;
        case TF_DTYPE_I64: printf(" %" PRId64, ((const int64_t *)t->data)[i]); break;
        case TF_DTYPE_I32: printf(" %" PRId32, ((const int32_t *)t->data)[i]); break;
        case TF_DTYPE_BOOL: printf(" %s", ((const unsigned char *)t->data)[i] ? "true" : "false"); break;
        default: printf(" 0x%04x", ((const uint16_t *)t->data)[i]); break;   /* f16/bf16 bits */
        }
    }
    if (show < n) printf(" ... (%" PRId64 " values; write them with --output %s=FILE.npy)", n, name);
    printf("\n");
}

/* Deterministic inputs for trying a model: floats ~ N(0, 1); integers uniform
 * in [0, bound) where a use (labels, ids) gives a bound, else {0, 1}. */
void *cli_random_input(const tf_program_t *p, size_t i, uint64_t seed, tf_dtype dt, const int64_t *shape, int rank)
{
    int64_t n = 1, bound = 0;
    for (int k = 0; k < rank; k++) n *= shape[k];
    tf_program_input_bound(p, i, &bound);
    if (bound <= 0) bound = 2;
    void *data = malloc((size_t)n * (size_t)tf_dtype_size(dt) + 1);
    if (!data) return NULL;
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + i + 1;
    for (int64_t k = 0; k < n; k++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u2 = (double)(s >> 11) / 9007199254740992.0;
        double g = sqrt(-2 * log(u > 1e-300 ? u : 1e-300)) * cos(6.283185307179586 * u2);
        switch (dt) {
        case TF_DTYPE_F32: ((float *)data)[k] = (float)g; break;
        case TF_DTYPE_F64: ((double *)data)[k] = g; break;
        case TF_DTYPE_I64: ((int64_t *)data)[k] = (int64_t)(u * (double)bound); break;
        case TF_DTYPE_I32: ((int32_t *)data)[k] = (int32_t)(u * (double)bound); break;
        case TF_DTYPE_BOOL: ((unsigned char *)data)[k] = u < 0.5; break;
        default: ((uint16_t *)data)[k] = 0; break;
        }
    }
    return data;
}

static int cmd_run(tf_context_t *ctx, args *a)
{
    if (a->mode_set && a->mode != TF_MODE_INFER)
        return cli_usage_error("run", "run is inference; training is 'tfuse train'%s", "");
    a->mode = TF_MODE_INFER;
    tf_model_t *m = load_model(ctx, a);
    if (!m) return fail(ctx);
    tf_program_t *p = compile(ctx, m, a);
    tf_session_t *s = NULL;
    tf_array_t *arrays[MAX_ITEMS] = {0};
    void *randoms[MAX_ITEMS] = {0};
    int rc = 0;
    if (!p || tf_session_create(ctx, p, a->target, a->seed, &s)) rc = fail(ctx);
    if (!rc && a->params && tf_session_load_state(s, a->params)) rc = fail(ctx);
    if (!rc && a->params && tf_session_missing_params(s))
        fprintf(stderr, "tfuse run: note: %s has no value for %s; they keep their initial values\n", a->params,
                tf_session_missing_params(s));
    for (size_t i = 0; !rc && i < a->ninputs; i++) {
        tf_tensor_view v;
        if (tf_array_load_npy(ctx, a->inputs[i].val, &arrays[i])) { rc = fail(ctx); break; }
        tf_array_view(arrays[i], &v);
        if (tf_session_bind(s, a->inputs[i].key, v.dtype, v.shape, v.rank, v.data)) {
            fprintf(stderr, "%s: %s\n", a->inputs[i].val, tf_context_last_error(ctx));
            rc = 1;
        }
    }
    size_t nin = p ? tf_program_io_count(p, TF_IO_INPUT) : 0;
    for (size_t i = 0; !rc && i < nin && i < MAX_ITEMS; i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8];
        tf_program_io(p, TF_IO_INPUT, i, &name, &dt, &rank, shape);
        bool given = false;
        for (size_t k = 0; k < a->ninputs; k++) given |= !strcmp(a->inputs[k].key, name);
        if (given) continue;
        if (!a->random_inputs) {
            fprintf(stderr, "tfuse: error: input '%s' (%s) has no data: pass --input %s=FILE.npy, or --random-inputs\n",
                    name, tf_dtype_str(dt), name);
            rc = 1;
            break;
        }
        if (dt == TF_DTYPE_F16 || dt == TF_DTYPE_BF16) {
            fprintf(stderr, "tfuse: error: --random-inputs does not fill %s input '%s'\n", tf_dtype_str(dt), name);
            rc = 1;
            break;
        }
        if (!(randoms[i] = cli_random_input(p, i, a->seed, dt, shape, rank))) {
            fprintf(stderr, "tfuse: error: out of memory\n");
            rc = 1;
        } else if (tf_session_bind(s, name, dt, shape, rank, randoms[i])) {
            rc = fail(ctx);
        }
    }
    if (!rc && tf_session_run(s)) rc = fail(ctx);
    for (size_t i = 0; !rc && i < a->noutputs; i++) {
        tf_tensor_view v;
        if (tf_session_output(s, a->outputs[i].key, &v) || tf_array_save_npy(ctx, a->outputs[i].val, &v)) rc = fail(ctx);
    }
    if (!rc && a->noutputs == 0)
        for (size_t i = 0; i < tf_program_io_count(p, TF_IO_OUTPUT); i++) {
            const char *name;
            tf_tensor_view v;
            tf_program_io(p, TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
            tf_session_output(s, name, &v);
            print_tensor(name, &v);
        }
    for (size_t i = 0; i < MAX_ITEMS; i++) {
        tf_array_free(arrays[i]);
        free(randoms[i]);
    }
    tf_session_free(s);
    tf_program_free(p);
    tf_model_free(m);
    return rc;
}

static const struct {
    const char *name, *synopsis, *help;
} commands[] = {
    {"print", "FILE [--dim K=V]",
     "Parse and verify a model, then print its canonical text (every value typed)."},
    {"opt", "FILE [--passes=a,b,...] [--mode=train|infer] [--explain] [--dim K=V]",
     "Run passes (default: lower) and print the module; --explain writes each decision to stderr."},
    {"compile", "FILE [--mode=train|infer] [--target=interp|cpu|cuda] [--arch=sm_90] [--precision=fp32|fp16|bf16] [--O0] [--disable-pass=NAME]\n"
     "                     [--explain] [--dim K=V|K=auto --memory-limit=BYTES] [--checkpoint=none|auto --memory-budget=BYTES]\n"
     "                     [--dump-ir=all|PASS] [--dump-dir=DIR] [--dump-kernels=DIR] [--dump-llvm=DIR] [--stats] [-o OUT]",
     "Run the full pipeline. --stats prints key: value lines (ops, kernels, fused_regions, casts, params,\n"
     "peak_bytes, ...); --explain prints one line per decision and why; --O0 runs no optimizing pass;\n"
     "--dim B=auto picks the largest B whose planned peak fits --memory-limit (512M, 16G, ...);\n"
     "train mode: --checkpoint=auto recomputes cheap forward values in the backward pass until the\n"
     "step's planned peak fits --memory-budget;\n"
     "--dump-ir writes DIR/NN-PASS.ir after each pass (each parses again); --dump-kernels writes\n"
     "DIR/kernels.txt, the kernel IR of every kernel; --dump-llvm writes DIR/kernels.ll, the optimized\n"
     "LLVM IR the cpu target runs; -o writes the compiled IR. With --target=cuda, -o DIR writes a directory:\n"
     "program.ir, kernels.txt, cuda/*.cu and cuda/*.<arch>.cubin for every generated kernel (NVRTC, no GPU\n"
     "needed; --arch picks the GPU, default sm_90) and manifest.txt. The default target is cpu when this\n"
     "build has LLVM, else interp."},
    {"run", "FILE [--input NAME=FILE.npy ...] [--random-inputs] [--params FILE.safetensors] [--output NAME=FILE.npy ...]\n"
     "                     [--seed N] [--target=...] [--threads N] [--precision=...] [--O0] [--disable-pass=NAME]",
     "Inference: bind inputs from .npy files, load params (names = IR names; params the file lacks\n"
     "keep their seeded initial values), run, and write outputs to .npy (or print them)."},
    {"train", train_synopsis, train_help},
    {"bench", bench_synopsis, bench_help},
    {"doctor", "", "What this build and machine can run: the targets (and why one cannot run here), the cpu\n"
                   "target's GEMM library and threads, the CUDA libraries found (or where the search looked) and the GPUs."},
};

static void usage_cmd(const char *cmd, FILE *f)
{
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(commands[i].name, cmd)) {
            fprintf(f, "usage: tfuse %s %s\n\n%s\n\nEvery command also takes --dim K=V (repeatable), --seed N and --help.\n",
                    cmd, commands[i].synopsis, commands[i].help);
            return;
        }
}

static void usage(FILE *f)
{
    fprintf(f, "tfuse %s — a graph compiler and kernel fuser for training and inference\n\nusage:\n", TFUSE_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  tfuse %-8s %s\n", commands[i].name, commands[i].synopsis);
    fprintf(f, "\n'tfuse COMMAND --help' describes one command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("tfuse %s\n", TFUSE_VERSION);
        return 0;
    }
    bool known = false;
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) known |= !strcmp(commands[i].name, cmd);
    if (!known) {
        fprintf(stderr, "tfuse: error: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    if (!strcmp(cmd, "doctor") && argc == 2) {
        tf_context_t *dctx;
        char *text = NULL;
        if (tf_context_create(&dctx) || tf_doctor(dctx, &text)) return 1;
        fputs(text, stdout);
        free(text);
        tf_context_free(dctx);
        return 0;
    }
    args a = {.cmd = cmd, .mode = TF_MODE_TRAIN, .target = tf_default_target()};
    int rc = parse_args(argc, argv, &a);
    if (rc || a.help) {
        if (a.help) usage_cmd(cmd, stdout);
        free_args(&a);
        return rc;
    }
    tf_context_t *ctx;
    if (tf_context_create(&ctx)) {
        fprintf(stderr, "tfuse: error: out of memory\n");
        free_args(&a);
        return 1;
    }
    if (!strcmp(cmd, "print")) rc = cmd_print(ctx, &a);
    else if (!strcmp(cmd, "opt")) rc = cmd_opt(ctx, &a);
    else if (!strcmp(cmd, "compile")) rc = cmd_compile(ctx, &a);
    else if (!strcmp(cmd, "train")) rc = cmd_train(ctx, &a);
    else if (!strcmp(cmd, "bench")) rc = cmd_bench(ctx, &a);
    else rc = cmd_run(ctx, &a);
    tf_context_free(ctx);
    free_args(&a);
    return rc;
}
