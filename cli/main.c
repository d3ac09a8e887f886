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
 *   tfuse cache stats|clear  the compile cache on disk: what it holds, emptied
 *
 * The default target is tf_default_target(): cpu where this build has LLVM
 * (and no GPU is usable), else interp; --target picks another.
 *
 * Exit codes: 0 success, 1 an error in the input or while running, 2 bad
 * command-line usage. */
#include <errno.h>
#include <time.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static void usage_cmd(const char *cmd, FILE *f);

int cli_usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "tfuse: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see 'tfuse %s --help')\n", cmd ? cmd : "");
    return 2;
}

void cli_usage_cmd(const char *cmd, FILE *f) { usage_cmd(cmd, f); }

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

/* ---- the flags: which commands take each one, and which may repeat ----
 *
 * A flag a command would ignore is an error that names who takes it: nothing
 * on the command line is silently dropped. */

enum { C_PRINT = 1, C_OPT = 2, C_COMPILE = 4, C_RUN = 8, C_TRAIN = 16, C_BENCH = 32, C_DOCTOR = 64 };
#define C_COMPILING (C_COMPILE | C_RUN | C_TRAIN | C_BENCH)
#define C_SETTING (C_COMPILING | C_DOCTOR)   /* target settings: doctor shows them */

typedef enum flag_id {
    F_DIM, F_SEED, F_MODE, F_TARGET, F_PASSES, F_DUMP_IR, F_DUMP_DIR, F_DISABLE_PASS, F_DUMP_KERNELS, F_ARCH,
    F_DUMP_LLVM, F_THREADS, F_ITERS, F_WARMUP, F_PROFILE, F_CHECKPOINT, F_MEMORY_BUDGET, F_MEMORY_LIMIT,
    F_PRECISION, F_O0, F_EXPLAIN, F_PARAMS, F_INPUT, F_OUTPUT, F_OUT, F_STATS, F_RANDOM_INPUTS,
    F_JIT_CACHE_KERNELS, F_NO_PARAMS, F_LOSS, F_OPTIMIZER, F_TRACE,
    F_SETTING0,   /* then one per target setting, in tfuse_settings.def's order */
    NFLAGS = F_SETTING0 + CLI_NSETTINGS
} flag_id;

static const struct flag_info {
    const char *name;
    unsigned cmds;           /* the commands that take it */
    bool repeats;            /* may be given more than once */
    const char *why;         /* said when a command that does not take it gets it; NULL: the list of takers */
} flag_table[NFLAGS] = {
    /* name                    commands                     repeats why */
    [F_DIM]            = {"--dim",            C_PRINT | C_OPT | C_COMPILING, true, NULL},
    [F_SEED]           = {"--seed",           C_COMPILE | C_RUN | C_TRAIN | C_BENCH, false, NULL},
    [F_MODE]           = {"--mode",           C_OPT | C_COMPILE | C_RUN | C_TRAIN | C_BENCH, false, NULL},
    [F_TARGET]         = {"--target",         C_COMPILING,                 false, NULL},
    [F_PASSES]         = {"--passes",         C_OPT,                       false, "the pipeline of compile, run, train and bench is fixed: --disable-pass leaves one out"},
    [F_DUMP_IR]        = {"--dump-ir",        C_OPT | C_COMPILING,         false, NULL},
    [F_DUMP_DIR]       = {"--dump-dir",       C_OPT | C_COMPILING,         false, NULL},
    [F_DISABLE_PASS]   = {"--disable-pass",   C_OPT | C_COMPILING,         true,  NULL},
    [F_DUMP_KERNELS]   = {"--dump-kernels",   C_COMPILING,                 false, NULL},
    [F_ARCH]           = {"--arch",           C_COMPILE,                   false, "it picks the GPUs 'tfuse compile --target=cuda' compiles for"},
    [F_DUMP_LLVM]      = {"--dump-llvm",      C_COMPILING,                 false, NULL},
    [F_THREADS]        = {"--threads",        C_RUN | C_TRAIN | C_BENCH,   false, "threads are a property of a running session"},
    [F_ITERS]          = {"--iters",          C_BENCH,                     false, NULL},
    [F_WARMUP]         = {"--warmup",         C_BENCH,                     false, NULL},
    [F_PROFILE]        = {"--profile",        C_BENCH,                     false, NULL},
    [F_CHECKPOINT]     = {"--checkpoint",     C_OPT | C_COMPILE | C_TRAIN | C_BENCH, false, "run is inference, with no backward pass to checkpoint"},
    [F_MEMORY_BUDGET]  = {"--memory-budget",  C_OPT | C_COMPILE | C_TRAIN | C_BENCH, false, "run is inference, with no backward pass to checkpoint"},
    [F_MEMORY_LIMIT]   = {"--memory-limit",   C_COMPILING,                 false, NULL},
    [F_PRECISION]      = {"--precision",      C_OPT | C_COMPILING,         false, NULL},
    [F_O0]             = {"--O0",             C_OPT | C_COMPILING,         false, NULL},
    [F_EXPLAIN]        = {"--explain",        C_OPT | C_COMPILING,         false, NULL},
    [F_PARAMS]         = {"--params",         C_RUN | C_TRAIN,             false, NULL},
    [F_INPUT]          = {"--input",          C_RUN,                       true,  NULL},
    [F_OUTPUT]         = {"--output",         C_RUN,                       true,  NULL},
    [F_OUT]            = {"-o",               C_COMPILE,                   false, NULL},
    [F_STATS]          = {"--stats",          C_COMPILE | C_RUN,           false, NULL},
    [F_NO_PARAMS]      = {"--no-params",      C_COMPILE,                   false, NULL},
    [F_RANDOM_INPUTS]  = {"--random-inputs",  C_RUN,                       false, NULL},
    [F_JIT_CACHE_KERNELS] = {"--jit-cache-kernels", C_SETTING,             false, NULL},
    [F_LOSS]           = {"--loss",           C_COMPILE | C_TRAIN | C_BENCH, false, "it makes a model trainable, and run is inference"},
    [F_OPTIMIZER]      = {"--optimizer",      C_COMPILE | C_TRAIN | C_BENCH, false, "it is the training step's, and run is inference"},
    [F_TRACE]          = {"--trace",          C_RUN | C_TRAIN | C_BENCH,   false, "it records a running session's kernels"},
#define C_SETTING_cpu C_SETTING
#define C_SETTING_cuda C_SETTING
#define C_SETTING_all (C_SETTING | C_OPT)   /* read by the passes: `tfuse opt` takes it too */
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP) \
    [F_SETTING0 + CLI_SETTING_##NAME] = {FLAG, C_SETTING_##TARGET, false, NULL},
#include "tfuse_settings.def"
#undef TF_SETTING
};

/* The target settings' rows as the command needs them (tfuse_settings.def). */
static const struct setting_flag {
    const char *flag, *on, *off, *env, *env_on, *target, *help;
    bool is_str;
} setting_flags[CLI_NSETTINGS] = {
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP) \
    [CLI_SETTING_##NAME] = {FLAG, ON, OFF, ENV, ENV_ON, #TARGET, HELP, sizeof #TYPE == sizeof "STR"},
#include "tfuse_settings.def"
#undef TF_SETTING
};

static const char *const cmd_names[] = {"print", "opt", "compile", "run", "train", "bench", "doctor"};

static unsigned cmd_bit(const char *cmd)
{
    for (unsigned i = 0; i < sizeof cmd_names / sizeof *cmd_names; i++)
        if (!strcmp(cmd, cmd_names[i])) return 1u << i;
    return 0;
}

int cli_usage_errorf(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "tfuse: %serror: ", cli_rank_tag);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'tfuse %s --help')\n", cmd ? cmd : "");
    va_end(ap);
    return 2;
}

static bool flag_valued(flag_id f);

/* Count flag f; a second one of a flag that does not repeat is an error. */
static int note_flag(args *a, flag_id f)
{
    if (++a->seen[f] > 1 && !flag_table[f].repeats)
        return cli_usage_errorf(a->cmd, flag_valued(f) ? "%s is given twice (it takes one value; which one was meant?)"
                                                       : "%s is given twice", flag_table[f].name);
    return 0;
}

/* An empty value ("--save=") names nothing. */
const char *cli_nonempty(const char *cmd, const char *flag, const char *v, int *rc)
{
    if (v && !*v) *rc = cli_usage_errorf(cmd, "%s needs a value, found an empty one", flag);
    return v;
}

/* A target setting's flag at argv[*i]: 0 when taken, 2 (printed) when
 * malformed, -1 when argv[*i] is no setting's flag. */
static int parse_setting(int argc, char **argv, int *i, args *a)
{
    const char *s = argv[*i], *v;
    for (int k = 0; k < CLI_NSETTINGS; k++) {
        const struct setting_flag *f = &setting_flags[k];
        int r;
        if (!f->is_str && !f->on[0]) {   /* a flag that takes no value: it sets the setting */
            if (strcmp(s, f->flag)) continue;
            v = "";
        } else if (!(v = cli_flag_value(argc, argv, i, f->flag))) {
            continue;
        }
        if ((r = note_flag(a, (flag_id)(F_SETTING0 + k)))) return r;
        if (f->is_str) {
            r = 0;
            a->setting[k] = cli_nonempty(a->cmd, f->flag, v, &r);
            return r;
        }
        if (f->on[0] && strcmp(v, f->on) && strcmp(v, f->off))
            return cli_usage_errorf(a->cmd, "%s expects %s or %s, found '%s'", f->flag, f->off, f->on, v);
        a->setting[k] = v;
        return 0;
    }
    return -1;
}

/* The target settings' part of --help, from tfuse_settings.def. */
static void settings_help(FILE *f)
{
    fputs("Target settings (compile, run, train, bench and doctor; each flag overrides the environment variable\n"
          "that gives its default):\n", f);
    for (int k = 0; k < CLI_NSETTINGS; k++) {
        const struct setting_flag *s = &setting_flags[k];
        char flag[96], env[96];
        if (s->is_str) snprintf(flag, sizeof flag, "%s=%s", s->flag, s->on);
        else if (s->on[0]) snprintf(flag, sizeof flag, "%s=%s|%s", s->flag, s->off, s->on);   /* the default first */
        else snprintf(flag, sizeof flag, "%s", s->flag);
        if (s->is_str) snprintf(env, sizeof env, "%s", s->env);
        else snprintf(env, sizeof env, "%s=%s", s->env, s->env_on);
        char text[1024];   /* "target: help (ENV)", wrapped at 110 columns under the flag's column */
        snprintf(text, sizeof text, "%s: %s (%s)", s->target, s->help, env);
        fprintf(f, "  %-24s", flag);
        int col = 2 + (int)(strlen(flag) > 24 ? strlen(flag) : 24);
        for (const char *w = text; *w;) {
            size_t len = strcspn(w, " ");
            if (col + 1 + (int)len > 110 && col > 27) {
                fprintf(f, "\n%27s", "");
                col = 27;
            } else {
                fputc(' ', f);
                col++;
            }
            fprintf(f, "%.*s", (int)len, w);
            col += (int)len;
            w += len;
            w += strspn(w, " ");
        }
        fputc('\n', f);
    }
    fputs("  --jit-cache-kernels=N    cpu: compiled kernels no session holds that stay cached (default 2048)\n"
          "                           (TFUSE_JIT_CACHE_KERNELS)\n", f);
}

/* ---- each flag's parser: its value (NULL for a flag that takes none) into a;
 * 0, or 2 with the usage error printed */

typedef int (*flag_parser)(args *a, const char *v);

static int set_dim(args *a, const char *v)
{
    kv p;
    uint64_t n;
    if (a->ndims == MAX_ITEMS) return cli_usage_error(a->cmd, "too many --dim flags%s", "");
    if (!split_kv(v, &p)) return cli_usage_error(a->cmd, "--dim expects NAME=VALUE, found '%s'", v);
    for (size_t k = 0; k < a->ndims; k++)
        if (!strcmp(a->dims[k].name, p.key)) {
            int r = cli_usage_errorf(a->cmd, "--dim %s is given twice (which value was meant?)", p.key);
            free((char *)p.key);
            return r;
        }
    if (!strcmp(p.val, "auto")) {
        a->dims[a->ndims++] = (tf_dim_override){p.key, TF_DIM_AUTO};
        return 0;
    }
    if (!cli_parse_u64(p.val, &n) || n < 1 || n > ((uint64_t)1 << 40)) {
        free((char *)p.key);
        return cli_usage_error(a->cmd, "--dim value must be an integer in [1, 2^40] or auto, found '%s'", v);
    }
    a->dims[a->ndims++] = (tf_dim_override){p.key, (int64_t)n};
    return 0;
}

static int set_seed(args *a, const char *v)
{
    if (!cli_parse_u64(v, &a->seed)) return cli_usage_error(a->cmd, "--seed expects a non-negative integer, found '%s'", v);
    a->seed_set = true;
    return 0;
}

static int set_mode(args *a, const char *v)
{
    if (!strcmp(v, "train")) a->mode = TF_MODE_TRAIN;
    else if (!strcmp(v, "infer")) a->mode = TF_MODE_INFER;
    else return cli_usage_error(a->cmd, "--mode expects train or infer, found '%s'", v);
    a->mode_set = true;
    return 0;
}

static int set_target(args *a, const char *v)
{
    if (!strcmp(v, "interp")) a->target = TF_TARGET_INTERP;
    else if (!strcmp(v, "cpu")) a->target = TF_TARGET_CPU;
    else if (!strcmp(v, "cuda")) a->target = TF_TARGET_CUDA;
    else if (!strcmp(v, "cuda-emu")) a->target = TF_TARGET_CUDA_EMU;
    else return cli_usage_error(a->cmd, "--target expects interp, cpu, cuda or cuda-emu, found '%s'", v);
    return 0;
}

/* A flag whose value is a name or a path: not empty. */
#define STRING_FLAG(fn, flag, field)                      \
    static int fn(args *a, const char *v)                 \
    {                                                     \
        int r = 0;                                        \
        a->field = cli_nonempty(a->cmd, flag, v, &r);     \
        return r;                                         \
    }
STRING_FLAG(set_passes, "--passes", passes)
STRING_FLAG(set_dump_ir, "--dump-ir", dump_ir)
STRING_FLAG(set_dump_dir, "--dump-dir", dump_dir)
STRING_FLAG(set_dump_kernels, "--dump-kernels", dump_kernels)
STRING_FLAG(set_dump_llvm, "--dump-llvm", dump_llvm)
STRING_FLAG(set_params, "--params", params)
STRING_FLAG(set_out, "-o", out)
STRING_FLAG(set_loss, "--loss", loss)
STRING_FLAG(set_optimizer, "--optimizer", optimizer)
STRING_FLAG(set_trace, "--trace", trace)
#undef STRING_FLAG

/* A flag that takes no value and sets a bool. */
#define BARE_FLAG(fn, field)                  \
    static int fn(args *a, const char *v)     \
    {                                         \
        (void)v;                              \
        a->field = true;                      \
        return 0;                             \
    }
BARE_FLAG(set_profile, profile)
BARE_FLAG(set_o0, o0)
BARE_FLAG(set_explain, explain)
BARE_FLAG(set_stats, stats)
BARE_FLAG(set_no_params, no_params)
BARE_FLAG(set_random_inputs, random_inputs)
#undef BARE_FLAG

static int set_disable_pass(args *a, const char *v)
{
    int r = 0;
    if (a->ndisabled == MAX_ITEMS) return cli_usage_error(a->cmd, "too many --disable-pass flags%s", "");
    for (size_t k = 0; k < a->ndisabled; k++)
        if (!strcmp(a->disabled[k], v)) return cli_usage_error(a->cmd, "--disable-pass=%s is given twice", v);
    a->disabled[a->ndisabled++] = cli_nonempty(a->cmd, "--disable-pass", v, &r);
    return r;
}

static int set_arch(args *a, const char *v)
{
    for (const char *e = v;; e += strcspn(e, ",") + 1) {   /* sm_80 or a list: sm_80,sm_90 */
        size_t len = strcspn(e, ",");
        if (len < 4 || strncmp(e, "sm_", 3) || strspn(e + 3, "0123456789a") != len - 3)
            return cli_usage_error(a->cmd, "--arch expects GPU architectures such as sm_80 or sm_80,sm_90, found '%s'", v);
        if (!e[len]) break;
    }
    a->arch = v;
    return 0;
}

/* An integer flag in [lo, hi]. */
static int set_u64(args *a, const char *flag, const char *v, uint64_t *out, uint64_t lo, uint64_t hi, const char *range)
{
    if (!cli_parse_u64(v, out) || *out < lo || *out > hi)
        return cli_usage_errorf(a->cmd, "%s expects an integer in %s, found '%s'", flag, range, v);
    return 0;
}

static int set_threads(args *a, const char *v) { return set_u64(a, "--threads", v, &a->threads, 1, 1024, "[1, 1024]"); }
static int set_iters(args *a, const char *v) { return set_u64(a, "--iters", v, &a->iters, 1, 1000000, "[1, 1000000]"); }

static int set_warmup(args *a, const char *v)
{
    a->warmup_set = true;
    return set_u64(a, "--warmup", v, &a->warmup, 0, 1000000, "[0, 1000000]");
}

static int set_jit_cache_kernels(args *a, const char *v)
{
    return set_u64(a, "--jit-cache-kernels", v, &a->jit_cache_kernels, 0, 1u << 20, "[0, 1048576]");
}

static int set_checkpoint(args *a, const char *v)
{
    if (tf_checkpoint_parse(v, &a->checkpoint)) return cli_usage_error(a->cmd, "--checkpoint expects none or auto, found '%s'", v);
    return 0;
}

static int set_memory_budget(args *a, const char *v)
{
    size_t len = strlen(v);
    char *end = NULL;
    if (len > 1 && v[len - 1] == '%') {   /* a percentage of the unconstrained planned peak */
        a->memory_budget_percent = strtod(v, &end);
        if (end != v + len - 1 || !(a->memory_budget_percent > 0 && a->memory_budget_percent <= 100))
            return cli_usage_error(a->cmd, "--memory-budget expects bytes (e.g. 8000000, 512M, 16G) or a percentage "
                                           "of the planned peak in (0, 100] (e.g. 50%%), found '%s'", v);
    } else if (!parse_bytes(v, &a->memory_budget)) {
        return cli_usage_error(a->cmd, "--memory-budget expects bytes (e.g. 8000000, 512M, 16G) or a percentage of "
                                       "the planned peak (e.g. 50%%), found '%s'", v);
    }
    return 0;
}

static int set_memory_limit(args *a, const char *v)
{
    if (!parse_bytes(v, &a->memory_limit))
        return cli_usage_error(a->cmd, "--memory-limit expects bytes (e.g. 8000000, 512M, 16G), found '%s'", v);
    return 0;
}

static int set_precision(args *a, const char *v)
{
    if (tf_precision_parse(v, &a->precision) || a->precision == TF_PRECISION_DEFAULT)   /* "default": leave it out */
        return cli_usage_error(a->cmd, "--precision expects fp32, fp16 or bf16, found '%s'", v);
    return 0;
}

/* --input NAME=FILE / --output NAME=FILE: no name read twice, no file written twice. */
static int set_io(args *a, const char *v, bool in)
{
    kv *list = in ? a->inputs : a->outputs;
    size_t *n = in ? &a->ninputs : &a->noutputs;
    if (*n == MAX_ITEMS) return cli_usage_error(a->cmd, "too many --input/--output flags%s", "");
    if (!split_kv(v, &list[*n])) return cli_usage_errorf(a->cmd, "%s expects NAME=FILE.npy, found '%s'", in ? "--input" : "--output", v);
    kv *p = &list[(*n)++];
    for (size_t k = 0; k + 1 < *n; k++) {
        if (in && !strcmp(list[k].key, p->key))
            return cli_usage_errorf(a->cmd, "--input %s is given twice (which file was meant?)", p->key);
        if (!in && !strcmp(list[k].val, p->val))
            return cli_usage_errorf(a->cmd, "--output %s and --output %s write the same file: one would be lost",
                                    list[k].key, p->key);
    }
    return 0;
}

static int set_input(args *a, const char *v) { return set_io(a, v, true); }
static int set_output(args *a, const char *v) { return set_io(a, v, false); }

/* How each flag of flag_table is read: whether it takes a value (--flag=V
 * or --flag V; -o takes the next argument only), its parser, and another
 * spelling. The target settings' flags are parse_setting's. */
static const struct flag_parse {
    bool valued;
    flag_parser set;
    const char *alias;
} flag_parse[F_SETTING0] = {
    [F_DIM] = {true, set_dim, NULL},               [F_SEED] = {true, set_seed, NULL},
    [F_MODE] = {true, set_mode, NULL},             [F_TARGET] = {true, set_target, NULL},
    [F_PASSES] = {true, set_passes, NULL},         [F_DUMP_IR] = {true, set_dump_ir, NULL},
    [F_DUMP_DIR] = {true, set_dump_dir, NULL},     [F_DISABLE_PASS] = {true, set_disable_pass, NULL},
    [F_DUMP_KERNELS] = {true, set_dump_kernels, NULL}, [F_ARCH] = {true, set_arch, NULL},
    [F_DUMP_LLVM] = {true, set_dump_llvm, NULL},   [F_THREADS] = {true, set_threads, NULL},
    [F_ITERS] = {true, set_iters, NULL},           [F_WARMUP] = {true, set_warmup, NULL},
    [F_PROFILE] = {false, set_profile, NULL},      [F_CHECKPOINT] = {true, set_checkpoint, NULL},
    [F_MEMORY_BUDGET] = {true, set_memory_budget, NULL}, [F_MEMORY_LIMIT] = {true, set_memory_limit, NULL},
    [F_PRECISION] = {true, set_precision, NULL},   [F_O0] = {false, set_o0, "-O0"},
    [F_EXPLAIN] = {false, set_explain, NULL},      [F_PARAMS] = {true, set_params, NULL},
    [F_INPUT] = {true, set_input, NULL},           [F_OUTPUT] = {true, set_output, NULL},
    [F_OUT] = {true, set_out, NULL},               [F_STATS] = {false, set_stats, NULL},
    [F_RANDOM_INPUTS] = {false, set_random_inputs, NULL}, [F_JIT_CACHE_KERNELS] = {true, set_jit_cache_kernels, NULL},
    [F_NO_PARAMS] = {false, set_no_params, NULL},  [F_LOSS] = {true, set_loss, NULL},
    [F_OPTIMIZER] = {true, set_optimizer, NULL},   [F_TRACE] = {true, set_trace, NULL},
};

/* Whether flag f takes a value (--O0, --profile and --no-tf32 do not). */
static bool flag_valued(flag_id f)
{
    if (f < F_SETTING0) return flag_parse[f].valued;
    const struct setting_flag *sf = &setting_flags[f - F_SETTING0];
    return sf->is_str || sf->on[0];
}

/* The flag of flag_table at argv[*i] (its value in *v, *i past it), or -1. */
static int match_flag(int argc, char **argv, int *i, const char **v)
{
    const char *s = argv[*i];
    for (int f = 0; f < F_SETTING0; f++) {
        const struct flag_parse *fp = &flag_parse[f];
        const char *name = flag_table[f].name;
        *v = NULL;
        if (!fp->valued) {
            if (!strcmp(s, name) || (fp->alias && !strcmp(s, fp->alias))) return f;
        } else if (f == F_OUT) {   /* -o FILE only */
            if (!strcmp(s, name) && *i + 1 < argc) {
                *v = argv[++*i];
                return f;
            }
        } else if ((*v = cli_flag_value(argc, argv, i, name))) {
            return f;
        }
    }
    return -1;
}

/* The command line as a loop over the flag table: each flag counted (a
 * second of one that does not repeat is an error) and parsed by its row's
 * parser; then the target settings, train's own flags and the model file. */
static int parse_args(int argc, char **argv, args *a)
{
    const char *cmd = a->cmd;
    for (int i = 2; i < argc; i++) {
        const char *s = argv[i], *v;
        int r, f;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            a->help = true;
        } else if ((f = match_flag(argc, argv, &i, &v)) >= 0) {
            if ((r = note_flag(a, (flag_id)f)) || (r = flag_parse[f].set(a, v))) return r;
        } else if ((r = parse_setting(argc, argv, &i, a)) != -1) {
            if (r) return r;
        } else if (!strcmp(cmd, "train") && (r = train_parse_flag(argc, argv, &i, a))) {
            if (r != 1) return r;
        } else if (s[0] == '-' && s[1]) {
            return cli_usage_error(cmd, "unknown or incomplete option '%s'", s);
        } else if (!strcmp(cmd, "doctor")) {
            return cli_usage_error(cmd, "doctor takes no arguments, found '%s'", s);
        } else if (!a->file) {
            a->file = s;
        } else {
            return cli_usage_error(cmd, "more than one model file given ('%s')", s);
        }
    }
    if (!a->help && !a->file && strcmp(cmd, "doctor")) return cli_usage_error(cmd, "no model file given%s", "");
    return 0;
}

/* The mode a command compiles in. */
static tf_mode effective_mode(const args *a)
{
    if (!strcmp(a->cmd, "run")) return TF_MODE_INFER;
    if (!strcmp(a->cmd, "train")) return TF_MODE_TRAIN;
    return a->mode;
}

static const char *target_str(tf_target t)
{
    return t == TF_TARGET_INTERP ? "interp" : t == TF_TARGET_CPU ? "cpu" : t == TF_TARGET_CUDA ? "cuda" : "cuda-emu";
}

/* After parsing: flags the command does not take, and flags that would do
 * nothing without another one. Returns 2 (printed) or 0. */
static int check_flags(const args *a)
{
    const char *cmd = a->cmd;
    unsigned me = cmd_bit(cmd);
    if (!strcmp(cmd, "doctor")) {
        for (int f = 0; f < NFLAGS; f++)
            if (a->seen[f] && !(flag_table[f].cmds & C_DOCTOR))
                return cli_usage_errorf(cmd, "doctor takes no flags but --help and the target settings, found %s",
                                        flag_table[f].name);
        return 0;
    }
    for (int f = 0; f < NFLAGS; f++) {
        if (!a->seen[f] || (flag_table[f].cmds & me)) continue;
        const char *name = flag_table[f].name;
        if (!strcmp(cmd, "train") && (f == F_INPUT || f == F_OUTPUT || f == F_RANDOM_INPUTS))
            return cli_usage_errorf(cmd, "train reads its data with --data NAME=FILE.npy,... (%s is for 'tfuse run')", name);
        /* the reasons of --checkpoint, --memory-budget, --loss and --optimizer are run's; --passes's are for the
         * commands with a fixed pipeline: elsewhere the list of the commands that take the flag says it */
        bool runs_why = f == F_CHECKPOINT || f == F_MEMORY_BUDGET || f == F_LOSS || f == F_OPTIMIZER;
        bool why_fits = runs_why ? !strcmp(cmd, "run") : f == F_PASSES ? (me & C_COMPILING) != 0 : true;
        if (flag_table[f].why && why_fits) return cli_usage_errorf(cmd, "'tfuse %s' takes no %s: %s", cmd, name, flag_table[f].why);
        char takers[128] = "";
        size_t k = 0;
        for (unsigned c = 0; c < sizeof cmd_names / sizeof *cmd_names; c++)
            if (flag_table[f].cmds & (1u << c))
                k += (size_t)snprintf(takers + k, sizeof takers - k, "%s%s", k ? ", " : "", cmd_names[c]);
        return cli_usage_errorf(cmd, "'tfuse %s' takes no %s (it is a flag of: %s)", cmd, name, takers);
    }
    tf_mode mode = effective_mode(a);
    if (!strcmp(cmd, "run") && a->mode_set && a->mode != TF_MODE_INFER)
        return cli_usage_errorf(cmd, "run is inference; training is 'tfuse train'");
    if (!strcmp(cmd, "train") && a->mode_set && a->mode != TF_MODE_TRAIN)
        return cli_usage_errorf(cmd, "train compiles in train mode; --mode=infer is for 'tfuse run'");
    /* --dim NAME=auto and --memory-limit go together */
    const char *auto_dim = NULL;
    for (size_t i = 0; i < a->ndims; i++) {
        if (a->dims[i].value != TF_DIM_AUTO) continue;
        if (auto_dim) return cli_usage_errorf(cmd, "only one dim can be auto (%s and %s are)", auto_dim, a->dims[i].name);
        auto_dim = a->dims[i].name;
    }
    if (auto_dim && !(me & C_COMPILING))
        return cli_usage_errorf(cmd, "--dim %s=auto is settled by compiling (compile, run, train, bench); "
                                     "'tfuse %s' needs a number", auto_dim, cmd);
    if (auto_dim && !a->memory_limit)
        return cli_usage_errorf(cmd, "--dim %s=auto picks the largest %s whose planned peak fits a memory limit: "
                                     "give one with --memory-limit=BYTES", auto_dim, auto_dim);
    if (a->memory_limit && !auto_dim)
        return cli_usage_errorf(cmd, "--memory-limit sizes a dim declared auto, and none is: "
                                     "add --dim NAME=auto (e.g. --dim B=auto)");
    /* --checkpoint=auto and --memory-budget go together, in train mode */
    bool ckpt_auto = a->checkpoint == TF_CHECKPOINT_AUTO;
    if (ckpt_auto && mode != TF_MODE_TRAIN)
        return cli_usage_errorf(cmd, "--checkpoint=auto recomputes forward values in the backward pass, and infer mode "
                                     "has none: drop it or use --mode=train");
    bool budget = a->memory_budget || a->memory_budget_percent > 0;
    if (ckpt_auto && !budget && !(auto_dim && a->memory_limit))   /* with --dim B=auto the limit is the budget */
        return cli_usage_errorf(cmd, "--checkpoint=auto recomputes values until the step fits a budget: "
                                     "give one with --memory-budget=BYTES|PCT%%");
    if (budget && !ckpt_auto)
        return cli_usage_errorf(cmd, "--memory-budget is the budget of --checkpoint=auto, which is not given: "
                                     "add --checkpoint=auto");
    if (a->dump_dir && !a->dump_ir)
        return cli_usage_errorf(cmd, "--dump-dir says where --dump-ir=all|PASS writes, and no --dump-ir is given");
    if (a->arch && !(a->target == TF_TARGET_CUDA && a->out))
        return cli_usage_errorf(cmd, "--arch picks the GPU that 'compile --target=cuda -o DIR' builds cubins for: "
                                     "it needs --target=cuda and -o DIR");
    if (a->threads && a->target != TF_TARGET_CPU)
        return cli_usage_errorf(cmd, "--threads sets the cpu target's threads, and the target is %s%s",
                                target_str(a->target), a->seen[F_TARGET] ? "" : " (the default here)");
    return 0;
}

_Static_assert(NFLAGS <= 64, "args.seen has 64 counters");

char cli_rank_tag[32];

/* One message, written to stderr in one piece: the ranks of a data-parallel
 * job share the launcher's stderr, and pieces written apart interleave. */
static void say_line(const char *prefix, const char *fmt, va_list ap, const char *suffix)
{
    char line[8192];
    int n = snprintf(line, sizeof line, "%s", prefix);
    if (n >= 0 && n < (int)sizeof line) n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (n >= 0 && n < (int)sizeof line) snprintf(line + n, sizeof line - (size_t)n, "%s\n", suffix);
    else memcpy(line + sizeof line - 2, "\n", 2);   /* cut short: still one line */
    fflush(stdout);   /* keep the order of what a user sees */
    fputs(line, stderr);
}

int cli_errorf(const char *fmt, ...)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "tfuse: %serror: ", cli_rank_tag);
    va_list ap;
    va_start(ap, fmt);
    say_line(prefix, fmt, ap, "");
    va_end(ap);
    return 1;
}

static void report_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say_line("", fmt, ap, "");
    va_end(ap);
}

int cli_report(tf_context_t *ctx, const char *context)
{
    const char *msg = tf_context_last_error(ctx);
    char ctx_part[512] = "";
    if (context) snprintf(ctx_part, sizeof ctx_part, " (%s)", context);
    if (!strncmp(msg, "error: ", 7)) report_line("tfuse: %s%s%s", cli_rank_tag, msg, ctx_part);
    else if (strstr(msg, ": error: ")) report_line("%s%s%s", cli_rank_tag, msg, ctx_part);
    else report_line("tfuse: %serror: %s%s", cli_rank_tag, msg, ctx_part);
    return 1;
}

int cli_fail(tf_context_t *ctx)
{
    return cli_report(ctx, NULL);
}
/* ---- interruption ----
 * The handler may run on any thread (the loader's, the target's pool): it
 * reads and writes only lock-free atomics, and calls write, _exit, signal
 * and raise, which are async-signal-safe. */

static atomic_int sig_count, sig_number, sig_writing;
static atomic_bool sig_graceful;
static char sig_first_msg[1024];
static size_t sig_first_len;

static void say(const char *s, size_t n)
{
    ssize_t r = write(STDERR_FILENO, s, n);
    (void)r;
}

static void on_signal(int sig)
{
    int n = atomic_fetch_add(&sig_count, 1) + 1;
    atomic_store(&sig_number, sig);
    bool graceful = atomic_load(&sig_graceful);
    if (graceful && n == 1) {
        say(sig_first_msg, sig_first_len);
        return;
    }
    if (atomic_load(&sig_writing)) {
        static const char m[] = "tfuse: interrupt: finishing the file being written first, so that it is whole\n";
        say(m, sizeof m - 1);
        return;
    }
    if (graceful) {
        static const char m[] = "tfuse: interrupted again: stopping at once, without a checkpoint\n";
        say(m, sizeof m - 1);
        _exit(130);
    }
    signal(sig, SIG_DFL);   /* end as the default action would: the parent sees the signal */
    raise(sig);
}

void cli_signals_install(void)
{
    static const int sigs[] = {SIGINT, SIGTERM};
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;   /* file writes and waits go on after the handler */
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)   /* one ignored by whoever started us stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(sigs[i], &sa, NULL);
}

void cli_signals_graceful(const char *first_msg)
{
    if (!*first_msg) sig_first_msg[0] = 0;   /* nothing to say (a data-parallel rank other than 0) */
    else snprintf(sig_first_msg, sizeof sig_first_msg, "%s%s\n", isatty(STDERR_FILENO) ? "\n" : "", first_msg);
    sig_first_len = strlen(sig_first_msg);
    atomic_store(&sig_graceful, true);
}

bool cli_interrupted(void)
{
    return atomic_load(&sig_count) > 0;
}

void cli_write_begin(void)
{
    atomic_store(&sig_writing, 1);
}

void cli_write_end(void)
{
    atomic_store(&sig_writing, 0);
    if (!atomic_load(&sig_graceful) && atomic_load(&sig_count) > 0) {   /* deferred: end now */
        int sig = atomic_load(&sig_number);
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

/* ---- checking paths before the work ---- */

int cli_check_readable(const char *flag, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cli_errorf("%s %s: cannot open: %s", flag, path, strerror(errno));
    struct stat st;
    bool dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    close(fd);
    if (dir) return cli_errorf("%s %s: is a directory, not a file", flag, path);
    return 0;
}

int cli_check_writable(const char *flag, const char *path, bool replace)
{
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return cli_errorf("%s %s: is a directory, not a file", flag, path);
        if (replace && !S_ISREG(st.st_mode))
            return cli_errorf("%s %s: is not a regular file (it would be replaced by one)", flag, path);
        if (!replace) {
            if (access(path, W_OK) != 0) return cli_errorf("%s %s: cannot write: %s", flag, path, strerror(errno));
            return 0;
        }
    } else if (errno != ENOENT) {
        return cli_errorf("%s %s: %s", flag, path, strerror(errno));
    }
    /* the directory must take a new file: create one beside the path, remove it */
    size_t n = strlen(path) + 64;
    char *probe = malloc(n), *dir = strdup(path);
    if (!probe || !dir) {
        free(probe);
        free(dir);
        return cli_errorf("out of memory");
    }
    snprintf(probe, n, "%s.tfuse-probe.%ld", path, (long)getpid());
    cli_write_begin();
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    cli_write_end();
    int rc = 0;
    if (fd < 0 && e != EEXIST)
        rc = cli_errorf("%s %s: cannot create a file in '%s': %s", flag, path, dirname(dir), strerror(e));
    free(probe);
    free(dir);
    return rc;
}

#define fail cli_fail

/* print, opt and compile read a model's text (or an ONNX model): a package
 * or a data file is said to be what it is, not lexed as text. NULL when it
 * failed, said already. */
static tf_model_t *load_model(tf_context_t *ctx, const args *a)
{
    tf_model_t *m = NULL;
    unsigned char head[8] = {0};
    FILE *f = fopen(a->file, "rb");
    size_t got = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    if (tf_is_package(a->file)) {
        cli_errorf("%s: a compiled package, not a model's text: 'tfuse %s' reads the .ir (or .onnx) it was compiled from; "
                   "run, train and bench take the package", a->file, a->cmd);
        return NULL;
    }
    if (got >= 6 && !memcmp(head, "\x93NUMPY", 6)) {
        cli_errorf("%s: a .npy array, not a model: give the model's .ir (or .onnx) file", a->file);
        return NULL;
    }
    if (tf_model_parse_file(ctx, a->file, a->dims, a->ndims, &m)) fail(ctx);
    return m;
}

static int cmd_print(tf_context_t *ctx, const args *a)
{
    tf_model_t *m = load_model(ctx, a);
    char *text = NULL;
    if (!m) return 1;
    if (tf_model_print(ctx, m, &text)) {
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
    o->memory_budget_percent = a->memory_budget_percent;
    o->dump_llvm = a->dump_llvm;
    o->threads = (int)a->threads;
    /* a flag overrides the environment's default */
#define SET_BOOL(field, v, on) ((field) = !(on)[0] || !strcmp((v), (on)))
#define SET_STR(field, v, on) ((field) = (v))
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP) \
    if (a->setting[CLI_SETTING_##NAME]) SET_##TYPE(o->NAME, a->setting[CLI_SETTING_##NAME], ON);
#include "tfuse_settings.def"
#undef TF_SETTING
#undef SET_BOOL
#undef SET_STR
}

static int cmd_opt(tf_context_t *ctx, const args *a)
{
    tf_model_t *m = load_model(ctx, a);
    char *text = NULL;
    if (!m) return 1;
    tf_compile_options o;
    cli_fill_options(a, &o, stderr);   /* the module goes to stdout */
    if (tf_model_run_passes(ctx, m, a->passes ? a->passes : "lower", &o) || tf_model_print(ctx, m, &text)) {
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

static double wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static const char *mode_name(tf_mode m) { return m == TF_MODE_INFER ? "infer" : "train"; }
static const char *target_name(tf_target t)
{
    return t == TF_TARGET_INTERP ? "interp" : t == TF_TARGET_CPU ? "cpu" : t == TF_TARGET_CUDA ? "cuda" : "cuda-emu";
}
static const char *precision_name(tf_precision p)
{
    return p == TF_PRECISION_FP16 ? "fp16" : p == TF_PRECISION_BF16 ? "bf16" : "fp32";
}

tf_program_t *cli_load_program(tf_context_t *ctx, const args *a, tf_mode mode, FILE *explain, tf_target *target,
                               double *compile_ms, int *rc)
{
    *rc = 0;
    *target = a->target;
    double t0 = wall_ms();
    tf_program_t *p = NULL;
    if (!tf_is_package(a->file)) {
        tf_model_t *m = NULL;
        args b = *a;
        b.mode = mode;
        tf_compile_options o;
        cli_fill_options(&b, &o, explain);
        const char *wanted[MAX_ITEMS];   /* run --output NAME=FILE: compute those outputs alone */
        for (size_t i = 0; mode == TF_MODE_INFER && i < a->noutputs; i++) wanted[i] = a->outputs[i].key;
        if (mode == TF_MODE_INFER && a->noutputs) o.outputs = wanted, o.noutputs = a->noutputs;
        if (tf_model_parse_file(ctx, a->file, a->dims, a->ndims, &m) ||
            ((a->loss || a->optimizer) && tf_model_add_loss(ctx, m, a->loss, a->optimizer)) || tf_program_compile(ctx, m, &o, &p))
            *rc = fail(ctx);
        tf_model_free(m);
        if (compile_ms) *compile_ms = wall_ms() - t0;
        return p;
    }
    /* a package: what shaped it is fixed; a flag that would change it is a mistake */
    const char *changes = a->ndims ? "--dim" : a->loss ? "--loss" : a->optimizer ? "--optimizer" : a->seen[F_CHECKPOINT] ? "--checkpoint"
                        : a->seen[F_MEMORY_BUDGET] ? "--memory-budget"
                        : a->seen[F_DISABLE_PASS] ? "--disable-pass" : a->o0 ? "--O0" : a->seen[F_MEMORY_LIMIT] ? "--memory-limit" : NULL;
    if (changes) {
        *rc = cli_usage_errorf(a->cmd, "%s is a compiled package: %s changes what it holds; give it to `tfuse compile` with the "
                               "model file instead", a->file, changes);
        return NULL;
    }
    if (tf_program_load(ctx, a->file, &p)) {
        *rc = fail(ctx);
        return NULL;
    }
    tf_mode pm;
    tf_target pt;
    tf_precision pp;
    tf_program_describe(p, &pm, &pt, &pp);
    const char *bad = NULL;
    char want[64] = "", have[64] = "";
    if (pm != mode) bad = "mode", snprintf(want, sizeof want, "%s", mode_name(mode)), snprintf(have, sizeof have, "%s", mode_name(pm));
    else if (a->seen[F_TARGET] && a->target != pt)
        bad = "target", snprintf(want, sizeof want, "%s", target_name(a->target)), snprintf(have, sizeof have, "%s", target_name(pt));
    else if (a->precision != TF_PRECISION_DEFAULT && a->precision != pp)
        bad = "precision", snprintf(want, sizeof want, "%s", precision_name(a->precision)), snprintf(have, sizeof have, "%s", precision_name(pp));
    if (bad) {   /* what was asked: a flag given, or the command's default (bench: train); and the flag that runs the package as it is */
        bool given = strcmp(bad, "mode") || a->mode_set;
        *rc = cli_usage_errorf(a->cmd, "%s was compiled with %s %s, and %s %s: %s --%s=%s (the package's), or compile the model with --%s=%s",
                               a->file, bad, have, given ? "this asks for" : "the command's default is", want, given ? "give" : "add", bad,
                               have, bad, want);
        tf_program_free(p);
        return NULL;
    }
    *target = pt;
    tf_program_set_threads(p, (int)a->threads);   /* a run's choice, not the package's */
    if (compile_ms) *compile_ms = wall_ms() - t0;
    return p;
}

/* Atomically: PATH.tmp.PID beside it, renamed over it; an interrupt waits
 * for the rename, so there is never a half-written PATH or a temporary file. */
static int write_file(const char *path, const char *text)
{
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return cli_errorf("out of memory");
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    cli_write_begin();
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0;
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = false, e = errno;
    if (!f && fd >= 0) close(fd);
    if (ok && rename(tmp, path) != 0) ok = false, e = errno;
    if (!ok && fd >= 0) unlink(tmp);
    cli_write_end();
    free(tmp);
    if (!ok) {
        fflush(stdout);
        fprintf(stderr, "%s: error: cannot write: %s\n", path, strerror(e));
        return 1;
    }
    return 0;
}

/* Train mode minimizes a loss, by the compiler's rule (autodiff's
 * find_loss): the output named 'loss', else the first output that is one
 * floating number (said in a note). Without one the library would compile a
 * forward-only step: an error, or, when not required (compile's default
 * mode), a note that says what was compiled. how: what asked for training. */
int cli_check_train_loss(const tf_program_t *p, const char *file, const char *how, bool required)
{
    bool note_only = !required;
    const char *scalar = NULL;
    for (size_t i = 0; i < tf_program_io_count(p, TF_IO_OUTPUT); i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8];
        tf_program_io(p, TF_IO_OUTPUT, i, &name, &dt, &rank, shape);
        if (!strcmp(name, "loss")) return 0;
        if (!scalar && rank == 0 && (dt == TF_DTYPE_F32 || dt == TF_DTYPE_F64 || dt == TF_DTYPE_F16 || dt == TF_DTYPE_BF16)) scalar = name;
    }
    fflush(stdout);
    if (scalar) {
        fprintf(stderr, "%s: note: no output named 'loss': %s minimizes '%s', the model's first output that is one floating number\n",
                file, how, scalar);
        return 0;
    }
    if (note_only) {
        fprintf(stderr, "%s: note: the model has no loss (an output named 'loss', or one floating number output): %s compiled "
                "its forward pass alone, in train mode (batchnorm on batch statistics, dropout on); --mode=infer compiles it for "
                "inference\n", file, how);
        return 0;
    }
    fprintf(stderr, "%s: error: %s needs a loss to minimize: an output named 'loss' (or one floating number output), and the model "
            "has neither: %s\n", file, how,
            cli_is_onnx(file) ? "give one with --loss \"cross_entropy(OUTPUT, LABELS)\" or --loss \"mse_loss(OUTPUT, TARGET)\""
                              : "add 'output loss' (or 'output loss = VALUE'), or give one with --loss");
    return 1;
}

bool cli_is_onnx(const char *path)
{
    size_t n = path ? strlen(path) : 0;
    return n > 5 && !strcasecmp(path + n - 5, ".onnx");
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Where `tfuse compile FILE` puts its package: FILE's name with .tfp for
 * its extension, in the current directory (as a C compiler writes its
 * object file), malloc'd. */
static char *default_package_path(const char *file)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    size_t n = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot && dot != base) n = (size_t)(dot - base);
    char *out = malloc(n + 5);
    if (out) memcpy(out, base, n), memcpy(out + n, ".tfp", 5);
    return out;
}

static void print_bytes(const char *label, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    printf("%s%.*f %s", label, i ? 1 : 0, b, u[i]);
}

/* `tfuse compile`'s summary: what was compiled and what it became. */
static void print_summary(const tf_program_t *p, const args *a, const char *out, const tf_package_info *pi, double ms)
{
    tf_mode mode;
    tf_target target;
    tf_precision prec;
    tf_program_describe(p, &mode, &target, &prec);
    int64_t kernels = -1, regions = -1, peak = -1, ops = -1;
    for (size_t i = 0; i < tf_program_stat_count(p); i++) {
        const char *name;
        int64_t v;
        tf_program_stat(p, i, &name, &v);
        if (!strcmp(name, "kernels")) kernels = v;
        else if (!strcmp(name, "fused_regions")) regions = v;
        else if (!strcmp(name, "peak_bytes")) peak = v;
        else if (!strcmp(name, "ops")) ops = v;
    }
    printf("compiled %s: %s, %s, target %s; %" PRId64 " ops, %" PRId64 " kernels (%" PRId64 " fused regions)", a->file,
           mode_name(mode), precision_name(prec), target_name(target), ops, kernels, regions);
    if (peak >= 0) print_bytes(", planned peak ", (double)peak);
    printf("\n");
    if (pi) {
        printf("wrote %s: %d kernel binaries (%d from the cache, %d compiled now), %s", out, pi->objects, pi->objects_cached,
               pi->objects - pi->objects_cached, pi->has_params ? "initial params" : "no params (--no-params)");
        print_bytes(", ", (double)pi->bytes);
        printf(", in %.0f ms\n", ms);
    }
}

static int cmd_compile(tf_context_t *ctx, const args *a)
{
    /* -o X.ir: the final IR as text; --target=cuda -o DIR: the cubin directory; else a package */
    bool ir_text = a->out && ends_with(a->out, ".ir");
    bool cuda_dir = a->out && !ir_text && a->target == TF_TARGET_CUDA && !ends_with(a->out, ".tfp");
    bool package = !ir_text && !cuda_dir && a->target != TF_TARGET_CUDA_EMU;
    char *pkg_path = package ? (a->out ? strdup(a->out) : default_package_path(a->file)) : NULL;
    if (package && !pkg_path) return cli_errorf("out of memory");
    if (a->target == TF_TARGET_CUDA_EMU && a->out && !ir_text)
        return cli_usage_errorf(a->cmd, "-o %s: a cuda-emu program is not packaged (its kernels are compiled for this host when a "
                                "session starts): drop -o, write the final IR with -o NAME.ir, or compile for --target=cpu or cuda", a->out);
    if (cuda_dir && a->arch && strchr(a->arch, ',')) {
        free(pkg_path);
        return cli_usage_errorf(a->cmd, "-o %s writes one architecture's cubins into a directory; a package (-o NAME.tfp) holds "
                                "several (--arch=%s)", a->out, a->arch);
    }
    if ((a->no_params || a->seed_set) && !package) {
        free(pkg_path);
        return cli_usage_errorf(a->cmd, "%s the initial params of a package, and this writes none%s",
                                a->no_params ? "--no-params leaves out" : "--seed draws", ir_text ? " (-o names an .ir file: the final IR as text)" : "");
    }
    if (a->no_params && a->seed_set) {
        free(pkg_path);
        return cli_usage_errorf(a->cmd, "--seed draws the package's initial params, and --no-params leaves them out: give one");
    }
    if ((ir_text || package) && cli_check_writable("-o", ir_text ? a->out : pkg_path, true)) {
        free(pkg_path);
        return 1;
    }
    double t0 = wall_ms();
    tf_model_t *m = load_model(ctx, a);
    if (!m || ((a->loss || a->optimizer) && tf_model_add_loss(ctx, m, a->loss, a->optimizer))) {   /* as train and bench apply them */
        int rc = m ? fail(ctx) : 1;
        tf_model_free(m);
        free(pkg_path);
        return rc;
    }
    tf_program_t *p = compile(ctx, m, a);
    int rc = 0;
    if (!p) rc = fail(ctx);
    if (!rc && a->mode == TF_MODE_TRAIN) rc = cli_check_train_loss(p, a->file, a->mode_set ? "--mode=train" : "compile's default --mode=train", a->mode_set);
    if (!rc && a->stats)
        for (size_t i = 0; i < tf_program_stat_count(p); i++) {
            const char *name;
            int64_t v;
            tf_program_stat(p, i, &name, &v);
            printf("%s: %" PRId64 "\n", name, v);
        }
    if (!rc && cuda_dir) {   /* a directory: IR, kernels, CUDA C and cubins */
        tf_artifact_info info;
        if (tf_program_write_artifact_info(ctx, p, a->out, a->arch, &info)) {
            rc = fail(ctx);
        } else {
            printf("wrote %s: program.ir, kernels.txt, manifest.txt, cubins.txt and %d cubins holding %d kernels for %s (%d compiled, "
                   "%d from the disk cache)\n",
                   a->out, info.binaries, info.kernels, a->arch ? a->arch : "sm_90", info.compiled, info.cached);
            if (a->stats) printf("cubins: %d\nkernels_compiled: %d\nkernels_cached: %d\n", info.binaries, info.compiled, info.cached);
        }
    } else if (!rc && ir_text) {
        char *text = NULL;
        if (tf_program_print(ctx, p, &text)) rc = fail(ctx);
        else rc = write_file(a->out, text);
        free(text);
    } else if (!rc && package) {
        tf_package_info pi;
        cli_write_begin();   /* an interrupt waits for the package's rename */
        if (tf_program_save(ctx, p, pkg_path, !a->no_params, a->seed, a->arch, &pi)) rc = fail(ctx);
        cli_write_end();
        if (!rc) print_summary(p, a, pkg_path, &pi, wall_ms() - t0);
    } else if (!rc) {
        print_summary(p, a, NULL, NULL, 0);
        printf("not packaged: cuda-emu compiles its kernels for this host when a session starts\n");
    }
    free(pkg_path);
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
    a->mode = TF_MODE_INFER;
    /* the files first: a missing input is found before compiling, an
     * unwritable output before running */
    for (size_t i = 0; i < a->ninputs; i++)
        if (cli_check_readable("--input", a->inputs[i].val)) return 1;
    if (a->params && cli_check_readable("--params", a->params)) return 1;
    for (size_t i = 0; i < a->noutputs; i++)
        if (cli_check_writable("--output", a->outputs[i].val, true)) return 1;
    cli_trace *tr = NULL;
    if (cli_trace_open(a->trace, &tr)) return 1;
    int rc = 0;
    tf_target target;
    tf_program_t *p = cli_load_program(ctx, a, TF_MODE_INFER, stdout, &target, NULL, &rc);
    if (!p) {
        cli_trace_free(tr);
        return rc;
    }
    tf_session_t *s = NULL;
    tf_array_t *arrays[MAX_ITEMS] = {0};
    void *randoms[MAX_ITEMS] = {0};
    if (tf_session_create(ctx, p, target, a->seed, &s)) rc = fail(ctx);
    if (!rc && a->params && tf_session_load_state(s, a->params)) rc = fail(ctx);
    if (!rc && a->params && tf_session_missing_params(s))
        fprintf(stderr, "tfuse: note: %s has no value for %s; they keep their initial values\n", a->params,
                tf_session_missing_params(s));
    for (size_t i = 0; !rc && i < a->ninputs; i++) {
        tf_tensor_view v;
        if (tf_program_input_unread(p, a->inputs[i].key)) {   /* declared, and nothing asked for reads it */
            fprintf(stderr, "tfuse: note: --input %s: the outputs asked for do not read input '%s'; its data is not needed\n",
                    a->inputs[i].key, a->inputs[i].key);
            continue;
        }
        if (tf_array_load_npy(ctx, a->inputs[i].val, &arrays[i])) { rc = fail(ctx); break; }
        tf_array_view(arrays[i], &v);
        if (tf_session_bind(s, a->inputs[i].key, v.dtype, v.shape, v.rank, v.data)) {
            char where[600];
            snprintf(where, sizeof where, "--input %s=%s", a->inputs[i].key, a->inputs[i].val);
            rc = cli_report(ctx, where);
        }
    }
    for (size_t i = 0; !rc && i < a->noutputs; i++) {   /* every --output names an output */
        size_t k, nout = tf_program_io_count(p, TF_IO_OUTPUT);
        for (k = 0; k < nout; k++) {
            const char *name;
            tf_program_io(p, TF_IO_OUTPUT, k, &name, NULL, NULL, NULL);
            if (!strcmp(name, a->outputs[i].key)) break;
        }
        if (k == nout) rc = cli_errorf("--output %s=%s: the model has no output named '%s'", a->outputs[i].key,
                                       a->outputs[i].val, a->outputs[i].key);
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
            rc = cli_errorf("input '%s' (%s) has no data: pass --input %s=FILE.npy, or --random-inputs", name,
                            tf_dtype_str(dt), name);
            break;
        }
        if (dt == TF_DTYPE_F16 || dt == TF_DTYPE_BF16) {
            rc = cli_errorf("--random-inputs does not fill %s input '%s'", tf_dtype_str(dt), name);
            break;
        }
        if (!(randoms[i] = cli_random_input(p, i, a->seed, dt, shape, rank))) {
            rc = cli_errorf("out of memory");
        } else if (tf_session_bind(s, name, dt, shape, rank, randoms[i])) {
            rc = fail(ctx);
        }
    }
    if (!rc && tr && tf_session_set_tracing(s, 1)) rc = fail(ctx);
    double t0 = cli_now_us();
    if (!rc && tf_session_run(s)) rc = fail(ctx);
    if (!rc && tr) {   /* the step's end: the cuda target's outputs wait for it */
        const char *first;
        tf_tensor_view v;
        if (tf_program_io_count(p, TF_IO_OUTPUT) && !tf_program_io(p, TF_IO_OUTPUT, 0, &first, NULL, NULL, NULL) &&
            tf_session_output(s, first, &v))
            rc = fail(ctx);
        cli_trace_span(tr, "step", "run", t0, cli_now_us());
        if (!rc) rc = cli_trace_write(tr, s, a->file);
    }
    cli_trace_free(tr);
    if (!rc && a->stats) cli_print_session_stats(s);
    for (size_t i = 0; !rc && i < a->noutputs; i++) {
        tf_tensor_view v;
        if (tf_session_output(s, a->outputs[i].key, &v)) {
            rc = fail(ctx);
            break;
        }
        cli_write_begin();   /* an interrupt waits for the file to be whole */
        if (tf_array_save_npy(ctx, a->outputs[i].val, &v)) rc = fail(ctx);
        cli_write_end();
    }
    if (!rc && a->noutputs == 0)
        for (size_t i = 0; i < tf_program_io_count(p, TF_IO_OUTPUT); i++) {
            const char *name;
            tf_tensor_view v;
            tf_program_io(p, TF_IO_OUTPUT, i, &name, NULL, NULL, NULL);
            if (tf_session_output(s, name, &v)) {   /* the cuda target waits for the step here */
                rc = fail(ctx);
                break;
            }
            print_tensor(name, &v);
        }
    for (size_t i = 0; i < MAX_ITEMS; i++) {
        tf_array_free(arrays[i]);
        free(randoms[i]);
    }
    tf_session_free(s);
    tf_program_free(p);
    return rc;
}

/* --stats of a session: its kernels, and what the disk cache gave it */
void cli_print_session_stats(const tf_session_t *s)
{
    tf_session_info info;
    if (tf_session_get_info(s, &info)) return;
    printf("target: %s\nkernels: %d\nkernels_jit_compiled: %d\nkernels_jit_cached: %d\ndisk_cache_hits: %d\n"
           "disk_cache_misses: %d\n", info.target, info.kernels, info.jit_compiled, info.jit_cached, info.disk_hits,
           info.disk_misses);
    if (info.jit_package) printf("kernels_jit_package: %d\n", info.jit_package);
}


static void usage_cmd(const char *cmd, FILE *f)
{
    for (size_t i = 0; i < cli_ncommands; i++)
        if (!strcmp(cli_commands[i].name, cmd)) {
            if (!strcmp(cmd, "cache")) {
                fprintf(f, "usage: tfuse %s %s\n\n%s\n", cmd, cli_commands[i].synopsis, cli_commands[i].help);
                return;
            }
            bool pkg = !strcmp(cmd, "run") || !strcmp(cmd, "train") || !strcmp(cmd, "bench");   /* they take packages */
            fprintf(f, "usage: tfuse %s %s\n\n%s\n\n%s%s", cmd, cli_commands[i].synopsis, cli_commands[i].help,
                    !strcmp(cmd, "doctor") ? "" : pkg ? "FILE is a model (.ir), a package (.tfp) or an ONNX model (.onnx, docs/onnx.md). "
                                                      : "FILE is a model (.ir) or an ONNX model (.onnx, docs/onnx.md). ",
                    !strcmp(cmd, "doctor") ? "It takes no flags but --help and the target settings below.\n\n"
                    : "compile, train and bench\n"
                      "take --loss \"cross_entropy(OUTPUT, LABELS)\" or --loss \"mse_loss(OUTPUT, TARGET)\" (a new input) and\n"
                      "--optimizer \"adamw(lr=1e-3)\" for a model that has none: how an ONNX model is fine-tuned.\n"
                      "Every command also takes --dim K=V (repeatable) and --help; run, train and bench take --seed N.\n"
                      "A flag the command would ignore, or one that needs another (--memory-limit and --dim K=auto,\n"
                      "--checkpoint=auto and --memory-budget, --dump-dir and --dump-ir), is an error (exit 2).\n\n");
            settings_help(f);
            return;
        }
}

static void usage(FILE *f)
{
    fprintf(f, "tfuse %s — a graph compiler and kernel fuser for training and inference\n\nusage:\n", TFUSE_VERSION);
    for (size_t i = 0; i < cli_ncommands; i++)
        fprintf(f, "  tfuse %-8s %s\n", cli_commands[i].name, cli_commands[i].synopsis);
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
    for (size_t i = 0; i < cli_ncommands; i++) known |= !strcmp(cli_commands[i].name, cmd);
    if (!known) {
        fprintf(stderr, "tfuse: error: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    if (!strcmp(cmd, "cache")) return cmd_cache(argc, argv);
    if (!strcmp(cmd, "import")) return cmd_import(argc, argv);
    if (!strcmp(cmd, "plot")) return cmd_plot(argc, argv);
    args a = {.cmd = cmd, .mode = TF_MODE_TRAIN, .target = tf_default_target()};
    int rc = parse_args(argc, argv, &a);
    if (!rc && !a.mode_set && cli_is_onnx(a.file) && !a.loss) a.mode = TF_MODE_INFER;   /* an ONNX model infers, unless given a loss */
    if (!rc && !a.help) rc = check_flags(&a);
    if (rc || a.help) {
        if (a.help) usage_cmd(cmd, stdout);
        free_args(&a);
        return rc;
    }
    cli_signals_install();
    tf_context_t *ctx;
    if (tf_context_create(&ctx)) {
        free_args(&a);
        return cli_errorf("out of memory");
    }
    if (a.seen[F_JIT_CACHE_KERNELS]) tf_cache_set_limit(tf_context_cache(ctx), (int)a.jit_cache_kernels);
    if ((cmd_bit(cmd) & C_COMPILING) && (rc = cli_check_cache_max(ctx))) {   /* before anything is compiled and cached */
        tf_context_free(ctx);
        free_args(&a);
        return rc;
    }
    if (!strcmp(cmd, "doctor")) {
        char *text = NULL;
        tf_compile_options o;
        cli_fill_options(&a, &o, NULL);
        if (tf_doctor_options(ctx, &o, &text)) rc = fail(ctx);
        else fputs(text, stdout);
        free(text);
    } else if (!strcmp(cmd, "print")) rc = cmd_print(ctx, &a);
    else if (!strcmp(cmd, "opt")) rc = cmd_opt(ctx, &a);
    else if (!strcmp(cmd, "compile")) rc = cmd_compile(ctx, &a);
    else if (!strcmp(cmd, "train")) rc = cmd_train(ctx, &a);
    else if (!strcmp(cmd, "bench")) rc = cmd_bench(ctx, &a);
    else rc = cmd_run(ctx, &a);
    tf_context_free(ctx);
    free_args(&a);
    return rc;
}
