/* train.c — `tfuse train`: fit a model to .npy data. A client of
 * include/tfuse.h only, like the rest of the command: the flags, the books
 * kept around the steps and what is printed.
 *
 * A program compiled in train mode does one whole step per tf_session_run
 * (forward, backward, optimizer update, buffer updates); this file feeds it
 * batches and keeps the books around it:
 *
 *   data      --data NAME=FILE.npy,...: a tf_loader_t (shuffled per epoch
 *             from the seed, worker threads gathering batches ahead), which
 *             checks the arrays against the program's inputs.
 *   steps     --steps N is the total count (a resumed run goes on to N).
 *   state     --save writes every param and buffer (optimizer moments, loss
 *             scale, step counter: all buffers) plus metadata (step, data
 *             position, seed) in one safetensors file, atomically; --resume
 *             loads it, sets the session's run counter (dropout masks) and
 *             the loader's position, so k steps + resume to N is
 *             byte-identical to N straight steps.
 *   eval      --eval-data: the model compiled for inference, given the train
 *             session's params and buffers, run over the whole set (an
 *             unshuffled loader).
 *   early     --early-stop: the evaluation's loss (or accuracy) is watched;
 *             each new best is saved beside --save (CKPT.best.safetensors),
 *             and PATIENCE evaluations without an improvement of more than
 *             MIN_DELTA end the run (exit 0, the last checkpoint written).
 *             The watcher's state is in the checkpoint's metadata, so a
 *             resumed run counts on.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

const char train_synopsis[] =
    "FILE --data NAME=FILE.npy,... [--steps N | --epochs N] [--eval-data NAME=FILE.npy,...]\n"
    "                     [--eval-every N] [--early-stop=PATIENCE[,MIN_DELTA]] [--early-stop-metric=loss|accuracy]\n"
    "                     [--save CKPT] [--save-every N] [--resume CKPT] [--params FILE]\n"
    "                     [--log FILE.csv] [--log-every N] [--trace FILE.json] [--workers N] [--seed N] [--dim K=V]\n"
    "                     [--target=...] [--precision=fp32|fp16|bf16] [--O0] [--disable-pass=NAME] [--explain]\n"
    "                     [--checkpoint=none|auto --memory-budget=BYTES]";

const char train_help[] =
    "Train a model: compile it in train mode (each run is one step: forward, backward, optimizer update)\n"
    "and run it over batches of .npy data.\n"
    "\n"
    "  --data NAME=FILE.npy,...   one array per model input (comma-separated, or repeat --data); the\n"
    "                             first axis indexes samples and all arrays have the same number N of\n"
    "                             them; each sample's shape and the dtype must match the input's (its\n"
    "                             type without the first axis, which is the batch size B: set it with\n"
    "                             --dim). Every epoch visits the samples in a new order, shuffled with\n"
    "                             the seed; the N mod B samples left over at the end of that order are\n"
    "                             not used in that epoch (no partial batches).\n"
    "  --steps N                  train until N steps are done in total (a resumed run continues from\n"
    "                             its checkpoint's step up to N)\n"
    "  --epochs N                 the same, as N * floor(N_samples / B) steps (default: 1 epoch)\n"
    "  --eval-data NAME=FILE.npy,...\n"
    "                             held-out data: after training (and every --eval-every N steps) the\n"
    "                             model compiled for inference, with the trained params and buffers,\n"
    "                             runs over all of it and prints the mean loss and, when the model has\n"
    "                             an output 'logits' and an integer label input, the accuracy\n"
    "                             (argmax of logits == label). A last partial batch is filled up with\n"
    "                             samples from the start of the set; those repeats count for no\n"
    "                             accuracy and the batch's loss is weighted by its real samples.\n"
    "  --early-stop=PATIENCE[,MIN_DELTA]\n"
    "                             stop when PATIENCE evaluations in a row have not improved on the\n"
    "                             best one by more than MIN_DELTA (default 0): the evaluation loss, or\n"
    "                             the accuracy with --early-stop-metric=accuracy. Needs --eval-data;\n"
    "                             evaluates every --eval-every N steps (default: every epoch). With\n"
    "                             --save CKPT, each new best is written to CKPT.best.safetensors (CKPT\n"
    "                             with .best before its extension) and the last state to CKPT. The run\n"
    "                             says at which step it stopped and why, and exits 0; --resume counts on.\n"
    "  --save CKPT                write a checkpoint at the end (and every --save-every N steps): all\n"
    "                             params and buffers (optimizer state, loss scale, step counter) as\n"
    "                             safetensors, with the step, seed and data position as metadata;\n"
    "                             written atomically (temp file, fsync, rename). 'tfuse run --params\n"
    "                             CKPT' reads it.\n"
    "  --resume CKPT              continue from a checkpoint: state, step, data order and dropout masks\n"
    "                             carry on exactly as in an uninterrupted run (same seed: the\n"
    "                             checkpoint's seed is used; a different --seed is an error)\n"
    "  --params FILE              start from these params/buffers (as 'tfuse run --params'; not with\n"
    "                             --resume); ones the file lacks keep their seeded initial values\n"
    "  --log FILE.csv             one row per step: step,epoch,loss,lr,samples_per_s (flushed as\n"
    "                             written), and one per evaluation with eval_loss and eval_accuracy\n"
    "                             (its other fields empty); 'tfuse plot FILE.csv' draws it. epoch counts\n"
    "                             from 0; lr is empty when the program has no\n"
    "                             'lr' output. A resumed run continues the log: rows past the\n"
    "                             checkpoint's step (steps done after it by a run that then stopped)\n"
    "                             are dropped and logged again, so each step has one row.\n"
    "  --log-every N              when stdout is not a terminal, print a progress line every N steps\n"
    "                             (default 10) and after the last; on a terminal one line updates in\n"
    "                             place. Progress: step/total, loss, learning rate, samples/s, ETA.\n"
    "  --trace FILE.json          the run's timeline as Chrome trace-event JSON (ui.perfetto.dev opens it):\n"
    "                             each step, its kernels (named as 'tfuse bench --profile' names them),\n"
    "                             the waits for the next batch, evaluations and checkpoints\n"
    "  --workers N                threads that assemble batches ahead of the step (default 2)\n"
    "  --seed N                   initializers, dropout and the data order (default 0)\n"
    "\n"
    "Before compiling, the files are checked: --data/--eval-data/--resume/--params can be read, --save\n"
    "and --log can be written (without touching existing files). The model needs an output 'loss'\n"
    "that is one floating number.\n"
    "\n"
    "Ctrl-C (SIGINT) or SIGTERM: the current step finishes, the checkpoint of the steps done is written\n"
    "(with --save), a message says at which step, and the exit code is 130; --resume continues exactly\n"
    "from there. A second one stops at once without a checkpoint, except while a checkpoint is being\n"
    "written, which is then finished whole first.\n"
    "\n"
    "Under Open MPI's mpirun -np N (docs/distributed.md): data-parallel training. --dim's batch is each rank's,\n"
    "rank r takes the r-th slice of every global batch, the gradients are averaged inside the step\n"
    "(--allreduce-bucket=BYTES, default 1M; --sync-batchnorm=on for the global batch's statistics;\n"
    "--shard-optimizer=on to keep 1/N of the optimizer state on each rank, ZeRO-1), every\n"
    "rank ends with the same params, and rank 0 alone prints, logs and writes --save. The ranks must agree\n"
    "(same model, data, batch, steps, seed); a rank that dies or hangs (TFUSE_COMM_TIMEOUT seconds, default\n"
    "300) ends the job with a message.\n"
    "\n"
    "A non-finite loss: with fp16 precision the loss scaler skips that step and halves the scale, and\n"
    "training goes on (a note is printed); otherwise training stops with exit code 1, naming the step.\n"
    "--target, --precision, --O0, --disable-pass, --explain, --dim (also B=auto with --memory-limit),\n"
    "--checkpoint=auto --memory-budget=BYTES, --dump-ir and --dump-dir are as for 'tfuse compile'.";

enum { MAX_WORKERS = 64 };
enum { RC_INTERRUPTED = 130 };   /* SIGINT or SIGTERM: the exit code, and the code that unwinds to it */

/* ---- flags ---- */

static bool parse_count(const char *flag, const char *v, uint64_t max, uint64_t *out)
{
    if (cli_parse_u64(v, out) && *out >= 1 && *out <= max) return true;
    char msg[160];
    snprintf(msg, sizeof msg, "%s expects an integer in [1, %" PRIu64 "], found '%%s'", flag, max);
    cli_usage_error("train", msg, v);
    return false;
}

/* A single-valued flag given twice: which one was meant? */
static int twice(const char *flag)
{
    return cli_usage_errorf("train", "%s is given twice (it takes one value; which one was meant?)", flag);
}

static int count_flag(const char *flag, const char *v, uint64_t max, uint64_t *out)
{
    if (*out) return twice(flag);
    return parse_count(flag, v, max, out) ? 1 : 2;
}

static int path_flag(const char *flag, const char *v, const char **out)
{
    int rc = 0;
    if (*out) return twice(flag);
    *out = cli_nonempty("train", flag, v, &rc);
    return rc ? rc : 1;
}

int train_parse_flag(int argc, char **argv, int *i, args *a)
{
    train_args *t = &a->train;
    const char *v, *flag = argv[*i];
    const uint64_t big = (uint64_t)1 << 53;
    if ((v = cli_flag_value(argc, argv, i, "--data")) || (v = cli_flag_value(argc, argv, i, "--eval-data"))) {
        bool eval = !strncmp(flag, "--eval", 6);
        const char **list = eval ? t->eval_data : t->data;
        size_t *n = eval ? &t->neval_data : &t->ndata;
        if (*n == MAX_ITEMS) return cli_usage_error("train", "too many %s flags", eval ? "--eval-data" : "--data");
        list[(*n)++] = v;
        return 1;
    }
    if ((v = cli_flag_value(argc, argv, i, "--steps"))) return count_flag("--steps", v, big, &t->steps);
    if ((v = cli_flag_value(argc, argv, i, "--epochs"))) return count_flag("--epochs", v, big, &t->epochs);
    if ((v = cli_flag_value(argc, argv, i, "--log-every"))) return count_flag("--log-every", v, big, &t->log_every);
    if ((v = cli_flag_value(argc, argv, i, "--eval-every"))) return count_flag("--eval-every", v, big, &t->eval_every);
    if ((v = cli_flag_value(argc, argv, i, "--save-every"))) return count_flag("--save-every", v, big, &t->save_every);
    if ((v = cli_flag_value(argc, argv, i, "--workers"))) return count_flag("--workers", v, MAX_WORKERS, &t->workers);
    if ((v = cli_flag_value(argc, argv, i, "--save"))) return path_flag("--save", v, &t->save);
    if ((v = cli_flag_value(argc, argv, i, "--resume"))) return path_flag("--resume", v, &t->resume);
    if ((v = cli_flag_value(argc, argv, i, "--log"))) return path_flag("--log", v, &t->log);
    if ((v = cli_flag_value(argc, argv, i, "--early-stop-metric"))) {
        if (t->early_metric) return twice("--early-stop-metric");
        if (strcmp(v, "loss") && strcmp(v, "accuracy"))
            return cli_usage_error("train", "--early-stop-metric expects loss or accuracy, found '%s'", v);
        t->early_metric = v;
        return 1;
    }
    if ((v = cli_flag_value(argc, argv, i, "--early-stop"))) return path_flag("--early-stop", v, &t->early_stop);
    return 0;
}

/* ---- small helpers ---- */

#define errorf cli_errorf
#define api_error cli_report

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A float for people and CSV: nan and inf without a sign bit's "-nan". */
static const char *num_str(char *buf, size_t n, const char *fmt, double v)
{
    if (isnan(v)) snprintf(buf, n, "nan");
    else if (isinf(v)) snprintf(buf, n, v > 0 ? "inf" : "-inf");
    else snprintf(buf, n, fmt, v);
    return buf;
}

static int64_t numel(const int64_t *shape, int from, int rank)
{
    int64_t n = 1;
    for (int i = from; i < rank; i++) n *= shape[i];
    return n;
}

static void fmt_duration(char *buf, size_t n, double s)
{
    if (!isfinite(s) || s < 0) {
        snprintf(buf, n, "?");
        return;
    }
    long long t = (long long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%lld:%02lld", t / 60, t % 60);
}

/* ---- data sets ---- */

/* The parsed --data (or --eval-data) lists, and the loader over them. */
typedef struct dataset {
    tf_data_source src[MAX_ITEMS];   /* input and path strdup'd */
    size_t n;
    tf_loader_t *L;
} dataset;

static void dataset_free(dataset *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free((char *)d->src[i].input);
        free((char *)d->src[i].path);
    }
    tf_loader_free(d->L);
    memset(d, 0, sizeof *d);
}

/* Parse the --data lists and check that every file can be read, before
 * compiling. Usage mistakes return 2, files that cannot be read 1. */
static int dataset_parse(const char *flag, const char *const *lists, size_t nlists, dataset *d)
{
    memset(d, 0, sizeof *d);
    for (size_t l = 0; l < nlists; l++) {
        const char *s = lists[l];
        while (*s) {
            const char *end = strchr(s, ',');
            size_t len = end ? (size_t)(end - s) : strlen(s);
            const char *eq = memchr(s, '=', len);
            if (!eq || eq == s || eq + 1 == s + len) {
                char item[512];
                snprintf(item, sizeof item, "%.*s", (int)(len < 400 ? len : 400), s);
                return cli_usage_error("train", flag[2] == 'e' ? "--eval-data expects NAME=FILE.npy,..., found '%s'"
                                                               : "--data expects NAME=FILE.npy,..., found '%s'", item);
            }
            if (d->n == MAX_ITEMS) return cli_usage_error("train", "too many arrays in %s", flag);
            tf_data_source *c = &d->src[d->n];
            if (!(c->input = strndup(s, (size_t)(eq - s))) || !(c->path = strndup(eq + 1, (size_t)(s + len - eq - 1)))) {
                free((char *)c->input);
                c->input = NULL;
                return errorf("out of memory");
            }
            d->n++;
            s += len + (end != NULL);
        }
    }
    if (!d->n) return cli_usage_error("train", "%s lists no arrays", flag);
    for (size_t i = 0; i < d->n; i++)
        for (size_t k = 0; k < i; k++)
            if (!strcmp(d->src[i].input, d->src[k].input))
                return cli_usage_errorf("train", "%s: input '%s' is given twice", flag, d->src[i].input);
    for (size_t i = 0; i < d->n; i++)
        if (cli_check_readable(flag, d->src[i].path)) return 1;
    return 0;
}

/* Load the parsed arrays into a loader, which checks them against the
 * program's inputs (1 on a mismatch). */
static int dataset_load(tf_context_t *ctx, const tf_program_t *p, const char *flag, bool shuffle, uint64_t seed,
                        int workers, int rank, int ranks, dataset *d)
{
    tf_loader_options o;
    tf_loader_options_init(&o);
    o.name = flag;
    o.shuffle = shuffle;
    o.seed = seed;
    o.workers = workers;
    o.rank = rank, o.ranks = ranks;   /* data parallel: this rank's slice of each global batch */
    return tf_loader_create(ctx, p, d->src, d->n, &o, &d->L) ? api_error(ctx, NULL) : 0;
}

/* ---- checkpoint metadata ---- */

static bool meta_u64(tf_context_t *ctx, const char *json, const char *key, uint64_t *out)
{
    char *v = NULL;
    bool ok = !tf_metadata_get(ctx, json, key, &v) && v && cli_parse_u64(v, out);
    free(v);
    return ok;
}

#define CKPT_FORMAT "tfuse-train-1"

typedef struct cursor { uint64_t step, epoch; int64_t pos; } cursor;

/* The early-stopping watcher (--early-stop): its settings and its state,
 * which a checkpoint's metadata carries ("early_stop"), so that a resumed
 * run counts on where the stopped one was. */
typedef struct watcher {
    bool on, acc;             /* watching; the accuracy (else the evaluation loss) */
    uint64_t patience;
    double min_delta;
    bool have;                /* a best so far */
    double best;
    uint64_t best_step, bad;  /* its step; evaluations since it without an improvement */
    char best_path[4200];     /* --save's CKPT.best.safetensors, or "" */
} watcher;

/* --early-stop=PATIENCE[,MIN_DELTA] into w; false (message printed) when malformed. */
static bool watcher_parse(const train_args *t, watcher *w)
{
    memset(w, 0, sizeof *w);
    if (!t->early_stop) return true;
    char buf[64], *comma, *end;
    snprintf(buf, sizeof buf, "%s", t->early_stop);
    if ((comma = strchr(buf, ','))) *comma = 0;
    w->on = true;
    w->acc = t->early_metric && !strcmp(t->early_metric, "accuracy");
    if (strlen(t->early_stop) >= sizeof buf || !cli_parse_u64(buf, &w->patience) || w->patience < 1 || w->patience > 1000000) {
        cli_usage_error("train", "--early-stop expects PATIENCE[,MIN_DELTA]: a whole number of evaluations from 1 to 1000000, "
                        "then optionally a comma and the least improvement that counts (>= 0), found '%s'", t->early_stop);
        return false;
    }
    if (comma) {
        errno = 0;
        w->min_delta = strtod(comma + 1, &end);
        if (errno || end == comma + 1 || *end || !(w->min_delta >= 0) || !isfinite(w->min_delta)) {
            cli_usage_error("train", "--early-stop's MIN_DELTA expects a finite number >= 0, found '%s'", comma + 1);
            return false;
        }
    }
    if (t->save) {   /* CKPT.best.safetensors: .best before the extension, or after the name */
        const char *slash = strrchr(t->save, '/'), *dot = strrchr(t->save, '.');
        size_t stem = dot && dot > (slash ? slash : t->save) ? (size_t)(dot - t->save) : strlen(t->save);
        snprintf(w->best_path, sizeof w->best_path, "%.*s.best%s", (int)stem, t->save, t->save + stem);
    }
    return true;
}

/* "batch" is the global batch (ranks x the batch dim): the data order depends on it alone, so a run
 * resumes on another number of ranks with the same global batch exactly where it was. */
static int save_checkpoint(tf_context_t *ctx, tf_session_t *s, const char *path, const cursor *cur, uint64_t seed,
                           const dataset *d, int ranks, const char *model, const watcher *w)
{
    char name[256];
    size_t k = 0;
    const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    for (const char *q = base; *q && k < sizeof name - 1; q++)   /* printable ASCII */
        name[k++] = *q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\' ? *q : '_';
    name[k] = 0;
    char num[6][24];
    snprintf(num[0], sizeof num[0], "%" PRIu64, cur->step);
    snprintf(num[1], sizeof num[1], "%" PRIu64, cur->epoch);
    snprintf(num[2], sizeof num[2], "%" PRId64, cur->pos);
    snprintf(num[3], sizeof num[3], "%" PRIu64, seed);
    snprintf(num[4], sizeof num[4], "%" PRId64, tf_loader_samples(d->L));
    snprintf(num[5], sizeof num[5], "%" PRId64, tf_loader_batch_size(d->L) * ranks);
    const char *const kv[][2] = {{"format", CKPT_FORMAT}, {"step", num[0]},    {"epoch", num[1]}, {"position", num[2]},
                                 {"seed", num[3]},        {"samples", num[4]}, {"batch", num[5]}, {"model", name}};
    char *meta = NULL, es[160];
    if (w && w->on)
        snprintf(es, sizeof es, "metric=%s,best=%.17g,best_step=%" PRIu64 ",bad=%" PRIu64, w->acc ? "accuracy" : "loss",
                 w->have ? w->best : NAN, w->best_step, w->bad);
    for (size_t i = 0; i < sizeof kv / sizeof *kv + (w && w->on); i++)
        if (tf_metadata_set(ctx, &meta, i < sizeof kv / sizeof *kv ? kv[i][0] : "early_stop", i < sizeof kv / sizeof *kv ? kv[i][1] : es)) {
            free(meta);
            return api_error(ctx, "--save");
        }
    cli_write_begin();   /* a second interrupt waits: the file is whole or absent, with no temporary left */
    tf_status st = tf_session_save_state_meta(s, path, meta);
    cli_write_end();
    free(meta);
    if (st) return api_error(ctx, "--save");
    return 0;
}

/* ---- progress ---- */

typedef struct progress {
    bool tty, drawn;
    uint64_t total, first, every;
    int64_t batch;
    double t0, paused, last_draw;
} progress;

static void progress_clear(progress *pr)
{
    if (pr->tty && pr->drawn) {
        fputs("\r\033[K", stdout);
        pr->drawn = false;
    }
}

static void progress_show(progress *pr, uint64_t step, uint64_t epoch, double loss, double lr, bool final, const char *const *mn,
                          const double *mv, size_t nm)
{
    double t = now_s(), busy = t - pr->t0 - pr->paused;
    uint64_t done = step - pr->first;
    if (pr->tty && !final && t - pr->last_draw < 0.1) return;
    if (!pr->tty && !final && step % pr->every) return;
    double rate = done && busy > 0 ? (double)done * (double)pr->batch / busy : 0;
    double eta = done ? (double)(pr->total - step) * busy / (double)done : NAN;
    char lrs[32], etas[32], ls[32];
    if (isnan(lr)) snprintf(lrs, sizeof lrs, "-");
    else snprintf(lrs, sizeof lrs, "%.4g", lr);
    fmt_duration(etas, sizeof etas, eta);
    char ms[512] = "";   /* the train block's metrics, after the loss */
    for (size_t i = 0, k = 0; i < nm && k < sizeof ms; i++) {
        char vs[32];
        k += (size_t)snprintf(ms + k, sizeof ms - k, "  %s %s", mn[i], num_str(vs, sizeof vs, pr->tty ? "%.4g" : "%.6g", mv[i]));
    }
    if (pr->tty) {
        printf("\r\033[Kstep %" PRIu64 "/%" PRIu64 "  epoch %" PRIu64 "  loss %s%s  lr %s  %.0f samples/s  ETA %s", step,
               pr->total, epoch, num_str(ls, sizeof ls, "%.4f", loss), ms, lrs, rate, etas);
        if (final) putchar('\n');
        pr->drawn = !final;
    } else {
        printf("step %" PRIu64 "/%" PRIu64 "  epoch %" PRIu64 "  loss %s%s  lr %s  samples/s %.1f  ETA %s\n", step,
               pr->total, epoch, num_str(ls, sizeof ls, "%.6f", loss), ms, lrs, rate, etas);
    }
    fflush(stdout);
    pr->last_draw = t;
}

/* ---- model facts ---- */

static bool has_output(const tf_program_t *p, const char *name, tf_dtype *dt, int *rank, int64_t shape[8])
{
    for (size_t i = 0; i < tf_program_io_count(p, TF_IO_OUTPUT); i++) {
        const char *n;
        tf_program_io(p, TF_IO_OUTPUT, i, &n, dt, rank, shape);
        if (!strcmp(n, name)) return true;
    }
    return false;
}

/* ---- evaluation ---- */

typedef struct evaluator {
    tf_program_t *p;
    tf_session_t *s;
    dataset data;
    bool has_loss;
    const char *label;       /* the input holding the labels, or NULL: no accuracy */
    int64_t logits_shape[8];
    int logits_rank;
    tf_dtype logits_dtype;
} evaluator;

static void evaluator_free(evaluator *e)
{
    tf_session_free(e->s);
    tf_program_free(e->p);
    dataset_free(&e->data);
    memset(e, 0, sizeof *e);
}

/* Which integer input are the labels of `logits`? One whose shape is the
 * logits' without the class axis and whose values are bounded by the class
 * count; if several fit, one named y/label(s)/target(s). */
static const char *find_label(const tf_program_t *p, const int64_t *lshape, int lrank)
{
    static const char *const names[] = {"y", "label", "labels", "target", "targets"};
    const char *any = NULL, *named = NULL;
    int nany = 0, nnamed = 0;
    for (size_t i = 0; i < tf_program_io_count(p, TF_IO_INPUT); i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8], bound = 0;
        tf_program_io(p, TF_IO_INPUT, i, &name, &dt, &rank, shape);
        if (dt != TF_DTYPE_I64 && dt != TF_DTYPE_I32) continue;
        if (rank != lrank - 1 || memcmp(shape, lshape, sizeof *lshape * (size_t)rank)) continue;
        tf_program_input_bound(p, i, &bound);
        if (bound != lshape[lrank - 1]) continue;
        any = name, nany++;
        for (size_t k = 0; k < sizeof names / sizeof *names; k++)
            if (!strcmp(name, names[k])) named = name, nnamed++;
    }
    return nany == 1 ? any : nnamed == 1 ? named : NULL;
}

/* e->data holds the parsed --eval-data lists (dataset_parse). */
static int evaluator_init(tf_context_t *ctx, const args *a, const tf_model_t *m, tf_target target, int workers, evaluator *e)
{
    tf_compile_options o;
    cli_fill_options(a, &o, NULL);
    o.mode = TF_MODE_INFER;
    o.explain = NULL;
    o.dump_ir = NULL;
    if (tf_program_compile(ctx, m, &o, &e->p)) return api_error(ctx, "compiling the model for evaluation");
    if (tf_session_create(ctx, e->p, target, a->seed, &e->s)) return api_error(ctx, NULL);
    int rc = dataset_load(ctx, e->p, "--eval-data", false, 0, workers, 0, 1, &e->data);
    if (rc) return rc;
    e->has_loss = has_output(e->p, "loss", NULL, NULL, NULL);
    if (has_output(e->p, "logits", &e->logits_dtype, &e->logits_rank, e->logits_shape) && e->logits_rank >= 2)
        e->label = find_label(e->p, e->logits_shape, e->logits_rank);
    return 0;
}

/* Copy every param and buffer both programs have from the train session. */
static int copy_state(tf_context_t *ctx, const tf_program_t *tp, tf_session_t *from, evaluator *e)
{
    for (int kind = TF_IO_PARAM; kind <= TF_IO_BUFFER; kind++)
        for (size_t i = 0; i < tf_program_io_count(e->p, (tf_io_kind)kind); i++) {
            const char *name;
            tf_dtype dt;
            int rank;
            int64_t shape[8];
            tf_program_io(e->p, (tf_io_kind)kind, i, &name, &dt, &rank, shape);
            bool in_train = false;
            for (int tk = TF_IO_PARAM; !in_train && tk <= TF_IO_BUFFER; tk++)
                for (size_t j = 0; !in_train && j < tf_program_io_count(tp, (tf_io_kind)tk); j++) {
                    const char *tn;
                    tf_program_io(tp, (tf_io_kind)tk, j, &tn, NULL, NULL, NULL);
                    in_train = !strcmp(tn, name);
                }
            if (!in_train) continue;
            tf_tensor_view v = {0};
            if (!(v.data = malloc((size_t)numel(shape, 0, rank) * (size_t)tf_dtype_size(dt) + 16)))
                return errorf("out of memory");
            tf_status st = tf_session_get_state(from, name, &v, (size_t)numel(shape, 0, rank) * (size_t)tf_dtype_size(dt) + 16);
            if (!st) st = tf_session_set_state(e->s, name, &v);
            free(v.data);
            if (st) return api_error(ctx, "copying the trained state for evaluation");
        }
    return 0;
}

/* Data parallel (comm, size > 1): rank r evaluates batches r, r + size, ...
 * and the ranks' sums are gathered, so that every rank takes part (none
 * waits for another's whole evaluation in a collective with a timeout) and
 * the evaluation takes 1/size of the time; rank 0 prints. */
static int evaluate(tf_context_t *ctx, const tf_program_t *tp, tf_session_t *ts, evaluator *e, uint64_t step,
                    progress *pr, tf_comm_t *comm, int rank, int size, double *eloss, double *eacc)
{
    *eloss = *eacc = NAN;
    int rc = copy_state(ctx, tp, ts, e);
    if (rc) return rc;
    tf_loader_t *L = e->data.L;
    uint64_t nb = tf_loader_epoch_batches(L);
    tf_loader_set_position(L, &(tf_loader_position){0, 0, 0});   /* from the start, each time */
    double loss_sum = 0;
    int64_t correct = 0, counted = 0;
    int64_t per_row = e->label ? numel(e->logits_shape, 1, e->logits_rank - 1) : 0;
    int64_t classes = e->label ? e->logits_shape[e->logits_rank - 1] : 0;
    for (uint64_t b = 0; b < nb && !rc; b++) {
        if (cli_interrupted()) {   /* abandon the evaluation: it changes no state */
            rc = RC_INTERRUPTED;
            break;
        }
        tf_batch_info bi;
        if (tf_loader_next(L, e->s, &bi)) {
            rc = api_error(ctx, "binding a batch");
            break;
        }
        if (b % (uint64_t)size != (uint64_t)rank) continue;   /* another rank's batch */
        if (tf_session_run(e->s)) {
            rc = api_error(ctx, "evaluating");
            break;
        }
        tf_tensor_view v, labels;
        /* the step's outputs: on the cuda target the first read waits for the step and reports its failure */
        const char *first = "loss";
        if (!e->has_loss) tf_program_io(e->p, TF_IO_OUTPUT, 0, &first, NULL, NULL, NULL);
        if (tf_program_io_count(e->p, TF_IO_OUTPUT) && tf_session_output(e->s, first, &v)) {
            rc = api_error(ctx, "evaluating");
            break;
        }
        if (e->has_loss && !tf_session_output(e->s, "loss", &v)) loss_sum += tf_view_element(&v, 0) * (double)bi.samples;
        if (e->label && !tf_session_output(e->s, "logits", &v) && !tf_loader_view(L, e->label, &labels)) {
            for (int64_t r = 0; r < bi.samples * per_row; r++) {
                int64_t want = (int64_t)tf_view_element(&labels, r), best = 0;
                if (want < 0 || want >= classes) continue;   /* cross_entropy's ignore_index: not a prediction */
                double bv = tf_view_element(&v, r * classes);
                for (int64_t c = 1; c < classes; c++) {
                    double x = tf_view_element(&v, r * classes + c);
                    if (x > bv || (isnan(x) && !isnan(bv))) bv = x, best = c;
                }
                correct += best == want;
                counted++;
            }
        }
    }
    if (size > 1 && (rc == 0 || rc == RC_INTERRUPTED)) {   /* the ranks' sums, and whether any was interrupted */
        struct { double loss; int64_t correct, counted, stop; } me = {loss_sum, correct, counted, rc != 0},
                                                               *all = calloc((size_t)size, sizeof *all);
        if (!all) return errorf("out of memory");
        if (tf_comm_allgather(ctx, comm, &me, all, sizeof me)) {
            free(all);
            return api_error(ctx, "gathering the evaluation");
        }
        loss_sum = 0, correct = counted = 0;
        for (int r = 0; r < size; r++) {
            loss_sum += all[r].loss, correct += all[r].correct, counted += all[r].counted;
            if (all[r].stop) rc = RC_INTERRUPTED;
        }
        free(all);
    }
    if (rc) return rc;
    progress_clear(pr);
    int64_t n = tf_loader_samples(L);
    printf("eval after step %" PRIu64 ":", step);
    char ls[32];
    if (e->has_loss) printf("  loss %s", num_str(ls, sizeof ls, "%.6f", *eloss = loss_sum / (double)n));
    if (e->label) printf("  accuracy %.4f", *eacc = counted ? (double)correct / (double)counted : NAN);
    printf("  (%" PRId64 " samples)\n", n);
    fflush(stdout);
    return 0;
}

/* ---- the command ---- */

typedef struct trainer {
    tf_model_t *m;
    tf_program_t *p;
    tf_session_t *s;
    dataset data;
    evaluator ev;
    bool have_ev;
    FILE *log;
    /* data parallel (mpirun): the job's communicator, or NULL for one process */
    tf_comm_t *comm;
    int rank, size;
    bool stop_all;            /* a rank was interrupted: every rank stops after this step */
    bool agreed;              /* the run ends by a decision every rank made alike: no need to abort the job */
    bool sharded;             /* the optimizer state is sharded over the ranks (shard_optimizer) */
    watcher watch;            /* --early-stop */
    cli_trace *trace;         /* --trace (rank 0's) */
    double mvals[64];         /* the last step's metrics (train_plan.metrics) */
} trainer;

/* Do two paths name one file? (The same text, or the same inode.) */
static bool same_file(const char *x, const char *y)
{
    struct stat a, b;
    if (!strcmp(x, y)) return true;
    return stat(x, &a) == 0 && stat(y, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int check_usage(const args *a)
{
    const train_args *t = &a->train;
    if (!t->ndata) return cli_usage_errorf("train", "no training data: give --data NAME=FILE.npy,... for the model's inputs");
    if (t->steps && t->epochs)
        return cli_usage_errorf("train", "give --steps or --epochs, not both (--epochs N is N passes over the data)");
    if (a->params && t->resume)
        return cli_usage_errorf("train", "--params and --resume both load state; a checkpoint is resumed with --resume alone");
    if (t->eval_every && !t->neval_data) return cli_usage_errorf("train", "--eval-every needs --eval-data");
    if (t->save_every && !t->save) return cli_usage_errorf("train", "--save-every needs --save CKPT");
    if (t->early_stop && !t->neval_data)
        return cli_usage_errorf("train", "--early-stop needs --eval-data: it watches the evaluation's loss or accuracy");
    if (t->early_metric && !t->early_stop) return cli_usage_errorf("train", "--early-stop-metric needs --early-stop=PATIENCE");
    /* files that would overwrite each other */
    if (t->log && t->save && same_file(t->log, t->save))
        return cli_usage_errorf("train", "--log and --save name the same file, '%s'", t->log);
    if (t->log && t->resume && same_file(t->log, t->resume))
        return cli_usage_errorf("train", "--log %s is the checkpoint given to --resume: the log would overwrite it", t->log);
    if (t->log && a->params && same_file(t->log, a->params))
        return cli_usage_errorf("train", "--log %s is the file given to --params: the log would overwrite it", t->log);
    return 0;
}

/* A data file that --save or --log would overwrite. */
static int check_not_data(const char *flag, const char *path, const dataset *d, const char *dflag)
{
    for (size_t i = 0; path && i < d->n; i++)
        if (same_file(path, d->src[i].path))
            return cli_usage_errorf("train", "%s %s is a data file of %s: it would be overwritten", flag, path, dflag);
    return 0;
}

#define LOG_HEADER "step,epoch,loss,lr,samples_per_s,eval_loss,eval_accuracy"
#define LOG_HEADER_V1 "step,epoch,loss,lr,samples_per_s"   /* before the evaluation columns */

/* Before anything runs: the files training will write can be written, and a
 * log that a resumed run continues is one of ours. Nothing is modified. */
static int check_outputs(const args *a)
{
    const train_args *t = &a->train;
    if (t->save && cli_check_writable("--save", t->save, true)) return 1;
    if (!t->log) return 0;
    if (cli_check_writable("--log", t->log, false)) return 1;
    struct stat st;
    if (!t->resume || stat(t->log, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return 0;
    FILE *f = fopen(t->log, "r");
    char line[128] = "";
    if (!f) return cli_errorf("--log %s: cannot open: %s", t->log, strerror(errno));
    bool ours = fgets(line, sizeof line, f) && !strncmp(line, LOG_HEADER, strlen(LOG_HEADER)) &&
                (line[strlen(LOG_HEADER)] == '\n' || line[strlen(LOG_HEADER)] == ',');   /* then the metrics' columns */
    fclose(f);
    if (!strcmp(line, LOG_HEADER_V1 "\n"))
        return cli_errorf("--log %s: written by an earlier tfuse, without the evaluation columns (eval_loss, eval_accuracy), so a "
                          "resumed run does not continue it: give another path", t->log);
    if (!ours)
        return cli_errorf("--log %s: not a log of 'tfuse train' (its first line is not '" LOG_HEADER "'), so a resumed "
                          "run does not continue it: give another path", t->log);
    return 0;
}

/* Open the CSV log as training starts. A fresh run starts it over. A
 * resumed run continues it: rows up to the checkpoint's step stay, rows past
 * it (steps a run did after its last checkpoint before it stopped) are
 * dropped, since those steps are done again and logged again; so each step
 * has one row. */
static int log_open(const char *path, bool resuming, uint64_t step, const char *header_text, FILE **out)
{
    struct stat st;
    bool keep = resuming && stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
    if (!keep) {
        struct stat s2;
        bool special = stat(path, &s2) == 0 && !S_ISREG(s2.st_mode);   /* /dev/stdout, a pipe */
        if (!(*out = fopen(path, special ? "a" : "w"))) return errorf("--log %s: cannot write: %s", path, strerror(errno));
        fprintf(*out, "%s\n", header_text);
        fflush(*out);
        return 0;
    }
    FILE *f = fopen(path, "r+");
    if (!f) return errorf("--log %s: cannot write: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    off_t cut = 0;
    uint64_t dropped = 0;
    bool cutting = false, header = true;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (header && (strncmp(line, header_text, strlen(header_text)) || line[strlen(header_text)] != '\n')) {
            fclose(f);
            int rc = errorf("--log %s: its columns are '%.*s', and this run's are '%s' (the model's metrics differ): "
                            "a resumed run does not continue it; give another path", path, (int)(n && line[n - 1] == '\n' ? n - 1 : n), line,
                            header_text);
            free(line);
            return rc;
        }
        if (!cutting) {
            uint64_t k;
            char *comma = strchr(line, ',');
            bool whole = line[n - 1] == '\n';
            if (comma) *comma = 0;
            if (header) header = false;
            else if (!whole || !comma || !cli_parse_u64(line, &k) || k > step) cutting = true;
            if (!cutting) cut += n;
        }
        dropped += cutting;
    }
    free(line);
    if (ferror(f)) {
        fclose(f);
        return errorf("--log %s: read failed", path);
    }
    if (dropped) {
        if (ftruncate(fileno(f), cut) != 0) {
            int e = errno;
            fclose(f);
            return errorf("--log %s: cannot drop the rows past step %" PRIu64 ": %s", path, step, strerror(e));
        }
        fprintf(stderr, "tfuse: note: %s: dropped %" PRIu64 " row(s) past step %" PRIu64
                " (the checkpoint's); those steps are logged again as they are redone\n", path, dropped, step);
    }
    fseek(f, 0, SEEK_END);
    *out = f;
    return 0;
}

/* Load the checkpoint into s; fill the cursor and the seed it was run with. */
static int resume(tf_context_t *ctx, tf_session_t *s, const char *path, cursor *cur, uint64_t *seed,
                  const dataset *d, int ranks, bool quiet, watcher *w)
{
    char *meta = NULL;
    if (tf_session_load_state_meta(s, path, &meta)) return api_error(ctx, "--resume");
    char *format = NULL;
    bool ours = meta && !tf_metadata_get(ctx, meta, "format", &format) && format && !strcmp(format, CKPT_FORMAT);
    free(format);
    uint64_t samples = 0, batch = 0, pos = 0;
    int rc = 0;
    if (!ours)
        rc = errorf("%s: not a checkpoint of 'tfuse train' (its metadata has no training position); "
                    "to start from its params, use --params", path);
    else if (!meta_u64(ctx, meta, "step", &cur->step) || !meta_u64(ctx, meta, "epoch", &cur->epoch) ||
             !meta_u64(ctx, meta, "position", &pos) || !meta_u64(ctx, meta, "seed", seed) ||
             !meta_u64(ctx, meta, "samples", &samples) || !meta_u64(ctx, meta, "batch", &batch) || pos > (uint64_t)1 << 62)
        rc = errorf("%s: malformed training metadata: %s", path, meta);
    if (!rc) {
        cur->pos = (int64_t)pos;
        int64_t n = tf_loader_samples(d->L), b = tf_loader_batch_size(d->L) * ranks;   /* the global batch */
        if (!quiet && (samples != (uint64_t)n || batch != (uint64_t)b))
            fprintf(stderr, "tfuse: note: %s was trained on %" PRIu64 " samples in batches of %" PRIu64
                    "; now %" PRId64 " in batches of %" PRId64 ": the data order is not the original run's\n",
                    path, samples, batch, n, b);
        tf_session_set_step(s, cur->step);
    }
    char *es = NULL;   /* the early-stopping watcher's state, when both runs watch the same metric */
    if (!rc && w->on && !tf_metadata_get(ctx, meta, "early_stop", &es) && es) {
        char metric[16] = "", best[40] = "";
        unsigned long long bs = 0, bad = 0;
        if (sscanf(es, "metric=%15[a-z],best=%39[^,],best_step=%llu,bad=%llu", metric, best, &bs, &bad) != 4)
            rc = errorf("%s: malformed early-stopping metadata: %s", path, es);
        else if (strcmp(metric, w->acc ? "accuracy" : "loss")) {
            if (!quiet)
                fprintf(stderr, "tfuse: note: %s watched the evaluation %s; this run watches the %s, from scratch\n", path, metric,
                        w->acc ? "accuracy" : "loss");
        } else {
            w->best = strtod(best, NULL);
            w->have = !isnan(w->best);
            w->best_step = bs, w->bad = bad;
        }
    }
    free(es);
    free(meta);
    return rc;
}

/* Stopped by SIGINT/SIGTERM between steps: write the checkpoint of the
 * steps done (if --save), say so, exit 130. */
static int stop_interrupted(tf_context_t *ctx, const args *a, trainer *T, const cursor *cur, uint64_t first,
                            uint64_t seed, bool saved)
{
    const train_args *t = &a->train;
    fflush(stdout);
    if (T->rank > 0) {   /* rank 0 writes the checkpoint and says so; this rank takes part (sharded state is gathered) */
        if (t->save && cur->step != first && !saved) save_checkpoint(ctx, T->s, t->save, cur, seed, &T->data, T->size, a->file, &T->watch);
        return RC_INTERRUPTED;
    }
    if (cur->step == first) {
        fprintf(stderr, "tfuse: interrupted before step %" PRIu64 ": nothing trained in this run, no checkpoint written\n",
                cur->step + 1);
        return RC_INTERRUPTED;
    }
    if (!t->save) {
        fprintf(stderr, "tfuse: interrupted at step %" PRIu64 ": no checkpoint written (no --save given)\n", cur->step);
        return RC_INTERRUPTED;
    }
    int rc = saved ? 0 : save_checkpoint(ctx, T->s, t->save, cur, seed, &T->data, T->size, a->file, &T->watch);   /* saved: by --save-every */
    if (rc) return rc;
    fprintf(stderr, "tfuse: interrupted at step %" PRIu64 ": checkpoint written to %s (continue with --resume %s)\n",
            cur->step, t->save, t->save);
    return RC_INTERRUPTED;
}

/* Setup was interrupted (compiling, loading): nothing has run. */
static int stop_early(void)
{
    fflush(stdout);
    fprintf(stderr, "tfuse: interrupted before training started: nothing trained, no checkpoint written\n");
    return RC_INTERRUPTED;
}

/* What train_run decides before the first step. */
typedef struct train_plan {
    tf_target target;
    bool has_lr, fp16;        /* the program outputs lr; it trains in fp16 (a loss scaler skips bad steps) */
    const char *precision;
    int workers;              /* the loader's threads */
    int64_t N, B;             /* samples, batch size */
    uint64_t per_epoch, total, seed, log_every;
    uint64_t eval_every;      /* --eval-every, or every epoch under --early-stop; 0: at the end only */
    const char *const *metrics;   /* the train block's metrics: outputs logged and shown beside the loss */
    size_t nmetrics;
    char header[4096];        /* the --log CSV's first line */
    cursor cur;               /* where the run starts: step, epoch, position */
} train_plan;

/* Everything that can be checked before compiling: data lists and files,
 * the files to read and to write. */
static int train_check(const args *a, trainer *T)
{
    const train_args *t = &a->train;
    int rc;
    if ((rc = dataset_parse("--data", t->data, t->ndata, &T->data))) return rc;
    if (t->neval_data) {
        T->have_ev = true;
        if ((rc = dataset_parse("--eval-data", t->eval_data, t->neval_data, &T->ev.data))) return rc;
    }
    if ((rc = check_not_data("--save", t->save, &T->data, "--data")) || (rc = check_not_data("--log", t->log, &T->data, "--data")) ||
        (rc = check_not_data("--save", t->save, &T->ev.data, "--eval-data")) ||
        (rc = check_not_data("--log", t->log, &T->ev.data, "--eval-data")))
        return rc;
    if (t->resume && cli_check_readable("--resume", t->resume)) return 1;
    if (a->params && cli_check_readable("--params", a->params)) return 1;
    const char *best = T->watch.best_path[0] ? T->watch.best_path : NULL;   /* --early-stop's best checkpoint */
    if ((rc = check_not_data("--save's best checkpoint", best, &T->data, "--data")) ||
        (rc = check_not_data("--save's best checkpoint", best, &T->ev.data, "--eval-data")))
        return rc;
    if (best && t->log && same_file(best, t->log))
        return cli_usage_errorf("train", "--log %s is the best checkpoint --early-stop writes beside --save", t->log);
    if (best && cli_check_writable("--save", best, true)) return 1;
    if (T->rank == 0 && cli_trace_open(a->trace, &T->trace)) return 1;
    return check_outputs(a);
}

/* The program, its loss and train block, and the data: how many steps. */
static int train_prepare(tf_context_t *ctx, const args *a, trainer *T, train_plan *P)
{
    const train_args *t = &a->train;
    int rc;
    if (!(T->p = cli_load_program(ctx, a, TF_MODE_TRAIN, stdout, &P->target, NULL, &rc))) return rc;
    /* the model again, for the evaluation program (a package holds it) */
    if (tf_program_model(ctx, T->p, &T->m)) return api_error(ctx, NULL);
    if (cli_interrupted()) return stop_early();
    tf_dtype loss_dt;
    int loss_rank;
    int64_t loss_shape[8];
    if ((rc = cli_check_train_loss(T->p, a->file, "training", true))) return rc;
    has_output(T->p, "loss", &loss_dt, &loss_rank, loss_shape);
    if (numel(loss_shape, 0, loss_rank) != 1)   /* autodiff refuses these first, with the place */
        return errorf("%s: output 'loss' has %" PRId64 " elements; training needs a scalar loss", a->file,
                      numel(loss_shape, 0, loss_rank));
    P->has_lr = has_output(T->p, "lr", NULL, NULL, NULL);
    tf_train_config tc;
    if (tf_program_train_config(ctx, T->p, &tc)) return api_error(ctx, NULL);
    P->metrics = tc.metrics, P->nmetrics = tc.nmetrics < 64 ? tc.nmetrics : 64;
    size_t hk = (size_t)snprintf(P->header, sizeof P->header, "%s", LOG_HEADER);
    for (size_t i = 0; i < P->nmetrics && hk < sizeof P->header; i++)
        hk += (size_t)snprintf(P->header + hk, sizeof P->header - hk, ",%s", P->metrics[i]);
    tf_train_config cfg;
    if (tf_program_train_config(ctx, T->p, &cfg)) return api_error(ctx, NULL);
    P->precision = tf_precision_name(cfg.precision);
    P->fp16 = cfg.precision == TF_PRECISION_FP16;
    P->workers = t->workers ? (int)t->workers : 2;
    if ((rc = dataset_load(ctx, T->p, "--data", true, a->seed, P->workers, T->rank, T->size, &T->data))) return rc;
    P->N = tf_loader_samples(T->data.L), P->B = tf_loader_batch_size(T->data.L);
    P->per_epoch = tf_loader_epoch_batches(T->data.L);
    if (t->epochs > ((uint64_t)1 << 62) / P->per_epoch)
        return errorf("--epochs %" PRIu64 " makes more than 2^62 steps", t->epochs);
    P->total = t->steps ? t->steps : (t->epochs ? t->epochs : 1) * P->per_epoch;
    return 0;
}

/* ---- data parallel ---- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* What every rank must agree on before the first step: the same tfuse, the
 * same model and training setup, the same data and the same starting point
 * (ranks that differ would compute collectives of different sizes, or
 * quietly train on different terms). */
typedef struct job_facts {
    char version[16];
    uint64_t model;           /* the compiled model's text, its target and precision */
    int64_t samples, batch;
    uint64_t steps, seed, step, epoch;
    int64_t pos;
} job_facts;

static int ranks_agree(tf_context_t *ctx, trainer *T, const train_plan *P)
{
    job_facts me = {0}, *all = calloc((size_t)T->size, sizeof *all);
    if (!all) return errorf("out of memory");
    snprintf(me.version, sizeof me.version, "%s", TFUSE_VERSION);
    char *text = NULL;
    if (tf_model_print(ctx, T->m, &text)) {
        free(all);
        return api_error(ctx, NULL);
    }
    me.model = fnv1a(0xcbf29ce484222325ull, text, strlen(text));
    free(text);
    me.model = fnv1a(me.model, &P->target, sizeof P->target);
    me.model = fnv1a(me.model, P->precision, strlen(P->precision));
    me.samples = P->N, me.batch = P->B, me.steps = P->total, me.seed = P->seed;
    me.step = P->cur.step, me.epoch = P->cur.epoch, me.pos = P->cur.pos;
    if (tf_comm_allgather(ctx, T->comm, &me, all, sizeof me)) {
        free(all);
        return api_error(ctx, "checking that the ranks agree");
    }
    int rc = 0;
    for (int r = 1; r < T->size && !rc; r++) {
        const job_facts *x = &all[0], *y = &all[r];
        const char *what = strcmp(x->version, y->version) ? "the tfuse version" : x->batch != y->batch ? "the batch size"
                         : x->model != y->model ? "the model (its text, target or precision)"
                         : x->samples != y->samples ? "the number of samples"
                         : x->steps != y->steps ? "the number of steps" : x->seed != y->seed ? "the seed"
                         : x->step != y->step || x->epoch != y->epoch || x->pos != y->pos ? "the step to start from" : NULL;
        if (what) {
            T->agreed = true;   /* every rank sees the same table and stops alike; rank 0 says why */
            rc = T->rank ? 1 : errorf("rank %d differs from rank 0 in %s (tfuse %s vs %s, batch %" PRId64 " vs %" PRId64 ", %" PRId64
                        " vs %" PRId64 " samples, step %" PRIu64 " vs %" PRIu64 "): every rank must run the same command "
                        "on the same files", r, what, y->version, x->version, y->batch, x->batch, y->samples, x->samples,
                        y->step, x->step);
        }
    }
    free(all);
    return rc;
}

/* After a step: the ranks' losses (their mean is the step's loss, what one
 * process with the global batch would report) and whether any rank was
 * interrupted (then all stop after this step, at the same one). */
static int ranks_after_step(tf_context_t *ctx, trainer *T, double *loss)
{
    struct { double loss; int64_t stop; } me = {*loss, cli_interrupted()}, *all = calloc((size_t)T->size, sizeof *all);
    if (!all) return errorf("out of memory");
    if (tf_comm_allgather(ctx, T->comm, &me, all, sizeof me)) {
        free(all);
        return api_error(ctx, "gathering the ranks' losses");
    }
    double sum = 0;
    for (int r = 0; r < T->size; r++) {
        sum += all[r].loss;
        if (all[r].stop) T->stop_all = true;
    }
    *loss = sum / T->size;
    free(all);
    return 0;
}

/* Every rank's params and buffers, hashed and compared: data parallel
 * training keeps them identical, bit for bit; a rank that drifted is named. */
static int ranks_same_state(tf_context_t *ctx, trainer *T)
{
    uint64_t h = 0xcbf29ce484222325ull, *all = calloc((size_t)T->size, sizeof *all);
    void *buf = NULL;
    size_t cap = 0;
    int rc = all ? 0 : errorf("out of memory");
    for (int kind = TF_IO_PARAM; !rc && kind <= TF_IO_BUFFER; kind++)
        for (size_t i = 0; !rc && i < tf_program_io_count(T->p, (tf_io_kind)kind); i++) {
            const char *name;
            tf_tensor_view v = {0};
            if (tf_program_io(T->p, (tf_io_kind)kind, i, &name, NULL, NULL, NULL) || tf_session_get_state(T->s, name, &v, 0)) {
                rc = api_error(ctx, NULL);
                break;
            }
            if (T->sharded && !strncmp(name, "opt.", 4)) continue;   /* each rank's own chunk of the optimizer state */
            size_t bytes = (size_t)tf_dtype_size(v.dtype);
            for (int k = 0; k < v.rank; k++) bytes *= (size_t)v.shape[k];
            if (bytes > cap) {
                void *nb = realloc(buf, bytes);
                if (!nb) {
                    rc = errorf("out of memory");
                    break;
                }
                buf = nb, cap = bytes;
            }
            v.data = buf;
            if (tf_session_get_state(T->s, name, &v, cap)) rc = api_error(ctx, NULL);
            h = fnv1a(fnv1a(h, name, strlen(name)), buf, bytes);
        }
    free(buf);
    if (!rc && tf_comm_allgather(ctx, T->comm, &h, all, sizeof h)) rc = api_error(ctx, "comparing the ranks' params");
    for (int r = 1; !rc && r < T->size; r++)
        if (all[r] != all[0]) {
            T->agreed = true;
            rc = errorf("rank %d's params and buffers differ from rank 0's after training (hashes %016" PRIx64 " and %016" PRIx64
                        "): the ranks drifted apart; this is a bug in tfuse", r, all[r], all[0]);
        }
    if (!rc) printf("params and buffers identical on all %d ranks (hash %016" PRIx64 ")%s\n", T->size, h,
                    T->sharded ? ", but for each rank's chunk of the optimizer state" : "");
    free(all);
    return rc;
}

/* Rank 0's summary: what the all-reduces moved and how much of their time
 * the steps waited for (the rest overlapped the backward pass). */
static void ranks_report(const trainer *T, uint64_t steps)
{
    tf_comm_totals c;
    tf_comm_stats(T->comm, &c);
    if (!steps) return;
    double per = (double)steps;
    if (c.bytes_nccl && c.bytes_nccl == c.bytes_reduced) {   /* on the GPUs' own stream: the host times none of it */
        printf("data parallel: %d ranks; per step %.3f MB averaged by NCCL on a stream of its own beside the backward pass "
               "(`tfuse bench --profile` times the steps)\n", c.size, (double)c.bytes_reduced / per / 1e6);
        return;
    }
    printf("data parallel: %d ranks; per step %.3f MB averaged, all-reduce %.2f ms, of it waited for %.2f ms (%.0f%% "
           "overlapped the backward pass)\n", c.size, (double)c.bytes_reduced / per / 1e6, c.comm_ms / per, c.wait_ms / per,
           c.comm_ms > 0 ? 100.0 * fmax(0.0, 1.0 - c.wait_ms / c.comm_ms) : 0.0);
}

/* The session (from --params or a --resume checkpoint, whose seed it
 * keeps), the loader's position, the evaluator and the log. */
static int train_start(tf_context_t *ctx, const args *a, trainer *T, train_plan *P)
{
    const train_args *t = &a->train;
    const dataset *d = &T->data;
    int rc;
    P->seed = a->seed;
    P->cur = (cursor){0, 0, 0};
    if (tf_session_create(ctx, T->p, P->target, P->seed, &T->s) || tf_session_set_comm(T->s, T->comm)) return api_error(ctx, NULL);
    if (a->params && tf_session_load_state(T->s, a->params)) return api_error(ctx, "--params");
    if (a->params && tf_session_missing_params(T->s))
        fprintf(stderr, "tfuse: note: %s has no value for %s; they start from their initializers\n", a->params,
                tf_session_missing_params(T->s));
    if (t->resume) {
        uint64_t ck_seed;
        if ((rc = resume(ctx, T->s, t->resume, &P->cur, &ck_seed, d, T->size, T->rank > 0, &T->watch))) return rc;
        if (ck_seed != P->seed) {
            if (a->seed_set)
                return cli_usage_errorf("train", "--seed %" PRIu64 " differs from the seed %" PRIu64
                                        " of %s: a resumed run keeps its seed", P->seed, ck_seed, t->resume);
            P->seed = ck_seed;   /* dropout masks come from the session's seed: start over with the right one */
            tf_session_free(T->s);
            T->s = NULL;
            if (tf_session_create(ctx, T->p, P->target, P->seed, &T->s) || tf_session_set_comm(T->s, T->comm))
                return api_error(ctx, NULL);
            if ((rc = resume(ctx, T->s, t->resume, &P->cur, &ck_seed, d, T->size, true, &T->watch))) return rc;
        }
    }
    if (tf_loader_set_position(d->L, &(tf_loader_position){P->cur.epoch, P->cur.pos, P->seed})) return api_error(ctx, "--resume");
    if (T->have_ev && (rc = evaluator_init(ctx, a, T->m, P->target, P->workers, &T->ev))) return rc;
    if (T->watch.on && T->watch.acc && !T->ev.label)
        return errorf("--early-stop-metric=accuracy: the evaluation of %s gives no accuracy (that needs an output 'logits' "
                      "and an integer label input of its batch shape); watch the loss instead", a->file);
    if (T->watch.on && !T->watch.acc && !T->ev.has_loss)
        return errorf("--early-stop: the evaluation of %s gives no loss (the model has no output 'loss')", a->file);
    P->eval_every = t->eval_every ? t->eval_every : T->watch.on ? P->per_epoch : 0;   /* early stopping: every epoch */
    if (T->size > 1 && (rc = ranks_agree(ctx, T, P))) return rc;
    if (cli_interrupted()) return stop_early();
    /* from here on the run writes: the log first (rank 0's) */
    if (t->log && T->rank == 0 && (rc = log_open(t->log, t->resume != NULL, P->cur.step, P->header, &T->log))) return rc;
    P->log_every = t->log_every ? t->log_every : 10;
    int64_t G = P->B * T->size;   /* the global batch */
    if (T->size > 1)
        printf("training %s on %d ranks: %" PRId64 " samples, global batches of %" PRId64 " (%d x %" PRId64 "), %" PRIu64
               " steps per epoch", a->file, T->size, P->N, G, T->size, P->B, P->per_epoch);
    else
        printf("training %s: %" PRId64 " samples, batches of %" PRId64 ", %" PRIu64 " steps per epoch", a->file, P->N, P->B,
               P->per_epoch);
    if (P->N % G) printf(" (%" PRId64 " samples per epoch left out)", P->N % G);
    if (P->cur.step) printf("; resuming at step %" PRIu64 " (epoch %" PRIu64 ")", P->cur.step, P->cur.epoch);
    printf("; steps %" PRIu64 "/%" PRIu64 ", seed %" PRIu64 "\n", P->cur.step, P->total, P->seed);
    fflush(stdout);
    return 0;
}

/* One step's loss (and lr) after it ran: logged, shown, and a non-finite
 * loss stops an fp32/bf16 run (a nonzero return) or counts as a step the
 * fp16 loss scaler skipped. */
static int train_after_step(tf_context_t *ctx, trainer *T, const train_plan *P, progress *pr, uint64_t epoch,
                            double *last, uint64_t *skipped)
{
    /* Step N's loss is read here, before step N+1 is enqueued, although
     * the cuda target's run is asynchronous: reading it after run N+1
     * would change what happens. An output is valid only until the
     * next run (tfuse.h), so step N's would be gone; a non-finite loss
     * stops an fp32/bf16 run at step N, and --save-every, --eval-every
     * and an interrupt read the state of step N, all of which need step
     * N+1 not to have run. The host still overlaps the GPU while the
     * step is enqueued and its inputs copied (a copy stream, two pinned
     * slots), and the next batch is prepared by the loader's threads. */
    tf_tensor_view v;
    uint64_t step = P->cur.step;
    if (tf_session_output(T->s, "loss", &v)) {
        progress_clear(pr);
        char where[64];
        snprintf(where, sizeof where, "at step %" PRIu64, step);
        return api_error(ctx, where);
    }
    double loss = tf_view_element(&v, 0), lr = NAN;
    int rc;
    if (T->size > 1 && (rc = ranks_after_step(ctx, T, &loss))) return rc;
    if (P->has_lr && !tf_session_output(T->s, "lr", &v)) lr = tf_view_element(&v, 0);
    for (size_t i = 0; i < P->nmetrics; i++)   /* this rank's value (each rank's own batch under mpirun) */
        T->mvals[i] = tf_session_output(T->s, P->metrics[i], &v) ? NAN : tf_view_element(&v, 0);
    double tnow = now_s(), dt = tnow - *last;
    *last = tnow;
    if (T->log) {
        char ls[32], lrs[32];
        fprintf(T->log, "%" PRIu64 ",%" PRIu64 ",%s,", step, epoch, num_str(ls, sizeof ls, "%.9g", loss));
        if (P->has_lr) fputs(num_str(lrs, sizeof lrs, "%.9g", lr), T->log);
        fprintf(T->log, ",%.1f,,", dt > 0 ? (double)(P->B * T->size) / dt : 0.0);
        for (size_t i = 0; i < P->nmetrics; i++) fprintf(T->log, ",%s", num_str(ls, sizeof ls, "%.9g", T->mvals[i]));
        fputc('\n', T->log);
        fflush(T->log);
    }
    if (!isfinite(loss)) {
        progress_clear(pr);
        T->agreed = true;   /* the mean loss: every rank sees it */
        if (!P->fp16)
            return errorf("loss is %s at step %" PRIu64 " (in %s, where no loss scaler skips such a step); stopping",
                          isnan(loss) ? "nan" : "inf", step, P->precision);
        (*skipped)++;
        printf("note: step %" PRIu64 ": loss is %s in fp16; the loss scaler skips the step and halves the scale\n",
               step, isnan(loss) ? "nan" : "inf");
    }
    progress_show(pr, step, epoch, loss, lr, step == P->total, P->metrics, T->mvals, P->nmetrics);
    return 0;
}

/* After an evaluation at cur->step: log it; the watcher takes its value (a
 * new best is saved to CKPT.best), and *stop says PATIENCE evaluations in a
 * row have not improved. Every rank decides alike (the evaluation's values
 * are gathered) and saves (a collective when the optimizer is sharded). */
static int after_eval(tf_context_t *ctx, const args *a, trainer *T, const train_plan *P, double eloss, double eacc, bool *stop)
{
    watcher *w = &T->watch;
    const cursor *cur = &P->cur;
    *stop = false;
    if (T->log) {
        char ls[32], as[32];
        fprintf(T->log, "%" PRIu64 ",%" PRIu64 ",,,,%s,%s", cur->step, cur->epoch, isnan(eloss) ? "" : num_str(ls, sizeof ls, "%.9g", eloss),
                isnan(eacc) ? "" : num_str(as, sizeof as, "%.9g", eacc));
        for (size_t i = 0; i < P->nmetrics; i++) fputc(',', T->log);
        fputc('\n', T->log);
        fflush(T->log);
    }
    if (!w->on) return 0;
    double v = w->acc ? eacc : eloss;
    const char *what = w->acc ? "accuracy" : "loss";
    bool better = !w->have || (w->acc ? v > w->best + w->min_delta : v < w->best - w->min_delta);
    if (isnan(v)) better = false;   /* a nan evaluation is never the best */
    char vs[32], bs[32];
    if (better) {
        w->have = true, w->best = v, w->best_step = cur->step, w->bad = 0;
        if (!w->best_path[0]) {
            if (T->rank == 0) printf("early stop: new best evaluation %s %s at step %" PRIu64 "\n", what, num_str(vs, sizeof vs, "%.6g", v),
                                     cur->step);
            return 0;
        }
        int rc = save_checkpoint(ctx, T->s, w->best_path, cur, P->seed, &T->data, T->size, a->file, w);
        if (!rc && T->rank == 0)
            printf("early stop: new best evaluation %s %s at step %" PRIu64 ", saved to %s\n", what, num_str(vs, sizeof vs, "%.6g", v),
                   cur->step, w->best_path);
        return rc;
    }
    w->bad++;
    *stop = w->bad >= w->patience;
    if (T->rank == 0)
        printf("early stop: evaluation %s %s, no improvement on %s (step %" PRIu64 ") by more than %g: %" PRIu64 " of %" PRIu64 "\n",
               what, num_str(vs, sizeof vs, "%.6g", v), num_str(bs, sizeof bs, "%.6g", w->best), w->best_step, w->min_delta, w->bad,
               w->patience);
    return 0;
}

static int train_run(tf_context_t *ctx, const args *a, trainer *T)
{
    const train_args *t = &a->train;
    train_plan P = {0};
    int rc;
    if ((rc = train_check(a, T)) || (rc = train_prepare(ctx, a, T, &P)) || (rc = train_start(ctx, a, T, &P))) return rc;
    if (T->trace && tf_session_set_tracing(T->s, 1)) return api_error(ctx, "--trace");
    const dataset *d = &T->data;
    cursor *cur = &P.cur;
    /* under mpirun rank 0's stdout is a pseudo-terminal whatever the launcher's is: progress in lines there */
    progress pr = {.tty = T->size == 1 && isatty(fileno(stdout)), .total = P.total, .first = cur->step, .every = P.log_every,
                   .batch = P.B * T->size, .t0 = now_s()};
    double last = now_s();
    uint64_t epoch = cur->epoch, skipped = 0;
    bool interrupted = false, saved = false;   /* saved: the state of cur->step is in t->save */
    bool stopped = false;                      /* by the early-stopping watcher */
    double eloss, eacc;
    while (cur->step < P.total) {
        /* between steps: the state is that of cur->step steps (data parallel: when any rank was interrupted) */
        if ((interrupted = T->size > 1 ? T->stop_all : cli_interrupted())) break;
        tf_batch_info bi;
        double u0 = cli_now_us();
        if (tf_loader_next(d->L, T->s, &bi)) {
            rc = api_error(ctx, "binding a batch");
            break;
        }
        double u1 = cli_now_us();
        cli_trace_span(T->trace, "data", "next batch", u0, u1);
        if (T->size == 1 && (interrupted = cli_interrupted())) break;   /* while waiting for the batch: abandon the step */
        if (tf_session_run(T->s)) {
            progress_clear(&pr);
            char where[64];
            snprintf(where, sizeof where, "at step %" PRIu64, cur->step + 1);
            rc = api_error(ctx, where);
            break;
        }
        cur->step++;
        cur->epoch = epoch = bi.epoch;
        cur->pos = bi.next.offset;
        rc = train_after_step(ctx, T, &P, &pr, epoch, &last, &skipped);   /* reads the loss: the step is done */
        char label[40];
        snprintf(label, sizeof label, "step %" PRIu64, cur->step);
        cli_trace_span(T->trace, "step", label, u1, cli_now_us());
        if (rc) break;
        double pause0 = now_s();
        saved = t->save_every && cur->step % t->save_every == 0 && cur->step < P.total;
        /* every rank saves (a collective when the optimizer state is sharded); the library writes on rank 0 */
        if (saved && (rc = save_checkpoint(ctx, T->s, t->save, cur, P.seed, d, T->size, a->file, &T->watch))) break;
        if (saved) cli_trace_span(T->trace, "checkpoint", "save", pause0 * 1e6, now_s() * 1e6);
        if (P.eval_every && cur->step % P.eval_every == 0 && cur->step < P.total) {
            double e0 = cli_now_us();
            rc = evaluate(ctx, T->p, T->s, &T->ev, cur->step, &pr, T->comm, T->rank, T->size, &eloss, &eacc);
            cli_trace_span(T->trace, "eval", "evaluation", e0, cli_now_us());
            if (rc) {
                if (rc == RC_INTERRUPTED) interrupted = true, rc = 0;
                break;
            }
            if ((rc = after_eval(ctx, a, T, &P, eloss, eacc, &stopped)) || stopped) break;
        }
        double paused = now_s() - pause0;
        pr.paused += paused;
        last += paused;
    }
    if (rc) return rc;
    progress_clear(&pr);
    if (interrupted) T->agreed = true;
    /* data parallel: only what the ranks agreed on (an interrupt after the last step's exchange would
     * send this rank away from the collectives below while the others wait in them) */
    if (interrupted || (T->size == 1 && cli_interrupted())) return stop_interrupted(ctx, a, T, cur, pr.first, P.seed, saved);
    if (pr.first >= P.total) printf("nothing to train: the checkpoint is at step %" PRIu64 " of %" PRIu64 "\n", cur->step, P.total);
    if (skipped) printf("%" PRIu64 " step(s) skipped for a non-finite loss\n", skipped);
    if (T->size > 1) {
        ranks_report(T, cur->step - pr.first);
        if ((rc = ranks_same_state(ctx, T))) return rc;
    }
    if (t->save) {
        if ((rc = save_checkpoint(ctx, T->s, t->save, cur, P.seed, d, T->size, a->file, &T->watch))) return rc;
        printf("saved %s (step %" PRIu64 ")\n", t->save, cur->step);
    }
    if (stopped) {   /* evaluated at this step already */
        const watcher *w = &T->watch;
        char bs[32];
        if (T->rank == 0)
            printf("stopped early at step %" PRIu64 ": the evaluation %s has not improved on %s (step %" PRIu64 ") by more than %g "
                   "in %" PRIu64 " evaluations%s%s\n", cur->step, w->acc ? "accuracy" : "loss", num_str(bs, sizeof bs, "%.6g", w->best),
                   w->best_step, w->min_delta, w->patience, w->best_path[0] ? "; the best state is in " : "", w->best_path);
        return 0;
    }
    if (T->have_ev && (rc = evaluate(ctx, T->p, T->s, &T->ev, cur->step, &pr, T->comm, T->rank, T->size, &eloss, &eacc)) == RC_INTERRUPTED &&
        T->rank == 0) {
        fflush(stdout);
        fprintf(stderr, "tfuse: interrupted during the evaluation after step %" PRIu64 "%s%s\n", cur->step,
                t->save ? ": training is done and the checkpoint written to " : "", t->save ? t->save : "");
    }
    bool unused;
    if (!rc && T->have_ev) rc = after_eval(ctx, a, T, &P, eloss, eacc, &unused);   /* the final state may be the best */
    return rc;
}

int cmd_train(tf_context_t *ctx, const args *a0)
{
    int rc = check_usage(a0);
    if (rc) return rc;
    args job = *a0, *a = &job;
    trainer T;
    memset(&T, 0, sizeof T);
    if (!watcher_parse(&a->train, &T.watch)) return 2;
    rc = cli_join_job(ctx, a, &T.comm, &T.rank, &T.size);
    const char *sh = a->setting[CLI_SETTING_shard_optimizer];
    T.sharded = sh && strcmp(sh, "off") && strcmp(sh, "0");
    if (rc) {
        tf_comm_free(T.comm);
        return rc;
    }
    char msg[900];
    if (a->train.save)
        snprintf(msg, sizeof msg, "tfuse: interrupt: stopping after the current step, then writing the checkpoint "
                 "to %.600s (interrupt again to stop at once, without it)", a->train.save);
    else
        snprintf(msg, sizeof msg, "tfuse: interrupt: stopping after the current step (interrupt again to stop at once)");
    cli_signals_graceful(T.rank ? "" : msg);   /* rank 0 speaks for the job */
    rc = train_run(ctx, a, &T);
    if (T.trace && T.s) {   /* what ran, also when the run stopped on an error or an interrupt */
        int trc = cli_trace_write(T.trace, T.s, a->file);
        if (!rc) rc = trc;
    }
    cli_trace_free(T.trace);
    if (T.log && fclose(T.log) != 0 && !rc) rc = errorf("--log %s: write failed: %s", a->train.log, strerror(errno));
    if (T.have_ev) evaluator_free(&T.ev);
    dataset_free(&T.data);
    tf_session_free(T.s);
    tf_program_free(T.p);
    tf_model_free(T.m);
    /* a rank that fails alone would leave the others waiting in a collective: end the whole job */
    if (T.comm && rc && rc != RC_INTERRUPTED && !T.agreed) {
        fflush(stdout);
        fflush(stderr);
        tf_comm_abort(T.comm, rc);
    }
    tf_comm_free(T.comm);
    return rc;
}
