/* cli.h — what the `tfuse` command's files share: the parsed command line
 * and a few helpers from main.c. Like main.c, everything here is a client of
 * include/tfuse.h only. */
#ifndef TFUSE_CLI_H
#define TFUSE_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tfuse.h"

enum { MAX_ITEMS = 256 };

typedef struct kv { const char *key, *val; } kv;

/* Flags only `tfuse train` takes (train.c parses them). */
typedef struct train_args {
    const char *data[MAX_ITEMS], *eval_data[MAX_ITEMS];   /* raw "NAME=FILE.npy,..." lists */
    size_t ndata, neval_data;
    uint64_t steps, epochs;            /* 0: not given */
    uint64_t log_every, eval_every, save_every, workers;
    const char *save, *resume, *log;
    const char *early_stop, *early_metric;   /* --early-stop=PATIENCE[,MIN_DELTA], --early-stop-metric=loss|accuracy */
} train_args;

/* the target settings, in tfuse_settings.def's order */
enum {
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP) CLI_SETTING_##NAME,
#include "tfuse_settings.def"
#undef TF_SETTING
    CLI_NSETTINGS
};

typedef struct args {
    const char *cmd, *file;
    tf_dim_override dims[MAX_ITEMS];
    size_t ndims;
    uint64_t seed;
    bool seed_set;
    tf_mode mode;
    bool mode_set;
    tf_target target;
    const char *passes, *dump_ir, *dump_dir, *out, *params;
    const char *trace;       /* run, bench, train: --trace FILE.json (trace.c) */
    const char *loss, *optimizer; /* --loss, --optimizer: added to a model that has none (tf_model_add_loss) */
    tf_precision precision;   /* --precision; TF_PRECISION_DEFAULT: not given */
    bool stats, random_inputs, help, explain, o0;
    bool no_params;           /* compile: the package without initial params */
    const char *disabled[MAX_ITEMS];
    size_t ndisabled;
    int64_t memory_limit;
    tf_checkpoint checkpoint; /* --checkpoint=none|auto */
    const char *dump_kernels; /* --dump-kernels=DIR */
    int64_t memory_budget;    /* --memory-budget=BYTES */
    double memory_budget_percent;   /* --memory-budget=PCT% */
    const char *dump_llvm;    /* --dump-llvm=DIR */
    const char *arch;         /* --arch=sm_XY (cuda) */
    uint64_t threads;         /* --threads=N (cpu target); 0 = one per core */
    uint64_t iters, warmup;   /* bench: timed runs and untimed ones before them */
    bool warmup_set, profile; /* bench: --warmup given; --profile */
    kv inputs[MAX_ITEMS], outputs[MAX_ITEMS];
    size_t ninputs, noutputs;
    train_args train;
    /* target settings (include/tfuse_settings.def): the value each one's flag gave ("" for a flag that
     * takes none), NULL where not given (the environment's default stands) */
    const char *setting[CLI_NSETTINGS];
    uint64_t jit_cache_kernels;   /* --jit-cache-kernels=N */
    unsigned short seen[64];  /* how often each flag of main.c's table was given */
} args;

/* main.c
 *
 * Messages have one form: "tfuse: error: ..." for what the command itself
 * finds (a command-line mistake exits 2, a problem with files or data 1), and
 * the library's "file:line:col: error: ..." / "path: error: ..." as they are. */
int cli_usage_error(const char *cmd, const char *fmt, const char *arg);   /* prints; returns 2 */
int cli_usage_errorf(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));   /* returns 2 */
int cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* "tfuse: error: ..."; returns 1 */
/* The context's error in the one form above, with `context` (or NULL)
 * appended in parentheses; returns 1. */
int cli_report(tf_context_t *ctx, const char *context);
/* The program of a->file: a package (`tfuse compile`'s .tfp) loaded as it
 * was compiled, or the model parsed and compiled with a's options (mode
 * `mode`); NULL with *rc set (the error printed) on failure. A flag that
 * would change what a package holds (--dim, --precision, another --mode or
 * --target) is an error naming what the package was compiled with; *target
 * gets the target to run on. *compile_ms: parsing and the passes (or
 * loading the package). */
tf_program_t *cli_load_program(tf_context_t *ctx, const args *a, tf_mode mode, FILE *explain, tf_target *target,
                               double *compile_ms, int *rc);
/* v, or NULL with *rc = 2 (printed) when v is "" (a flag's empty value). */
const char *cli_nonempty(const char *cmd, const char *flag, const char *v, int *rc);
/* Before any work: can `path` be written? replace: by an atomic writer (a
 * temporary file beside it renamed over it: the directory must take new
 * files; an existing path must be a regular file); else by opening it for
 * writing. Nothing existing is touched (a probe file is created and removed).
 * Prints "tfuse: error: FLAG PATH: ..." and returns 1, or returns 0. */
int cli_check_writable(const char *flag, const char *path, bool replace);
/* Can `path` be opened for reading (and is not a directory)? As above. */
int cli_check_readable(const char *flag, const char *path);

/* Interruption (SIGINT, SIGTERM). Every command gets cli_signals_install():
 * a signal ends the process at once (as by default) except while a file is
 * being written between cli_write_begin/end, which then finishes whole (no
 * temporary file is left) before the process ends. `tfuse train` switches to
 * cli_signals_graceful(): the first signal only sets a flag that the
 * training loop reads between steps (the handler prints `first_msg`); a
 * second one while a file is written waits for it, otherwise it exits 130
 * at once. Handlers touch only atomics, write(2), _exit and raise. A signal
 * that was ignored when tfuse started (a background job of a script, nohup)
 * stays ignored. */
void cli_signals_install(void);
void cli_signals_graceful(const char *first_msg);
bool cli_interrupted(void);
/* "rank R: " in a data-parallel job (train.c), else "": what error messages say after "tfuse: " */
extern char cli_rank_tag[32];
/* Started by an MPI launcher with several ranks (tf_comm_launched): join the job (*comm), turn on
 * data_parallel for the compile, and send the output of ranks other than 0 to /dev/null; else *comm
 * stays NULL and *size 1. 0, or the exit code of a message printed. */
int cli_join_job(tf_context_t *ctx, args *a, tf_comm_t **comm, int *rank, int *size);
void cli_write_begin(void);
void cli_write_end(void);
/* "--name=value" or "--name value": the value, or NULL if the flag differs. */
const char *cli_flag_value(int argc, char **argv, int *i, const char *name);
bool cli_parse_u64(const char *s, uint64_t *out);
void cli_fill_options(const args *a, tf_compile_options *o, FILE *explain);

/* Deterministic data for input i: floats ~ N(0, 1); integers in [0, bound)
 * where a use gives a bound, else {0, 1}; f16/bf16 as their bit patterns.
 * malloc'd. */
void *cli_random_input(const tf_program_t *p, size_t i, uint64_t seed, tf_dtype dt, const int64_t *shape, int rank);
int cli_fail(tf_context_t *ctx);   /* cli_report(ctx, NULL) */
/* Train mode minimizes the output named 'loss': a program without one is an
 * error ("FILE: error: ..."; returns 1), `how` naming what asked for train
 * mode. */
/* Whether path names an ONNX model (by its extension, as the library decides). */
bool cli_is_onnx(const char *path);
int cli_check_train_loss(const tf_program_t *p, const char *file, const char *how, bool required);
/* run --stats: the session's target, kernels and disk cache hits and misses, as key: value lines */
void cli_print_session_stats(const tf_session_t *s);

/* bench.c */
extern const char bench_synopsis[], bench_help[];
int cmd_bench(tf_context_t *ctx, const args *a);
int cmd_import(int argc, char **argv);   /* import.c: tfuse import MODEL.onnx */
int cmd_cache(int argc, char **argv);    /* cache.c: tfuse cache stats | clear */
int cmd_plot(int argc, char **argv);     /* plot.c: tfuse plot LOG.csv... -o OUT.svg */

/* help.c: every command's name, synopsis and help text, in `tfuse --help`'s order */
typedef struct cli_command { const char *name, *synopsis, *help; } cli_command;
extern const cli_command cli_commands[];
extern const size_t cli_ncommands;

/* trace.c: --trace FILE.json, the session's timeline and the command's spans as Chrome trace-event JSON */
typedef struct cli_trace cli_trace;
double cli_now_us(void);   /* CLOCK_MONOTONIC, the runtime's clock for kernel calls */
int cli_trace_open(const char *path, cli_trace **out);   /* NULL path: *out NULL, no trace; else checks it can be written */
void cli_trace_span(cli_trace *t, const char *cat, const char *label, double t0_us, double t1_us);   /* t NULL: nothing */
int cli_trace_write(cli_trace *t, tf_session_t *s, const char *what);
void cli_trace_free(cli_trace *t);
/* A malformed TFUSE_CACHE_MAX stops a command that writes the cache (cache.c); returns 2, or 0. */
int cli_check_cache_max(tf_context_t *ctx);
void cli_usage_cmd(const char *cmd, FILE *f);   /* main.c: a command's usage and help */

/* train.c */
extern const char train_synopsis[], train_help[];
/* argv[*i] is a train flag: consume it (and its value) and return 1; not a
 * train flag: 0; a train flag used wrongly: the message is printed, 2. */
int train_parse_flag(int argc, char **argv, int *i, args *a);
int cmd_train(tf_context_t *ctx, const args *a);

#endif
