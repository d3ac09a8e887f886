/* train.c — `tfuse train`: fit a model to .npy data. A client of
 * include/tfuse.h only, like the rest of the command.
 *
 * A program compiled in train mode does one whole step per tf_session_run
 * (forward, backward, optimizer update, buffer updates); this file feeds it
 * batches and keeps the books around it:
 *
 *   data      --data NAME=FILE.npy,...: one array per model input, the first
 *             axis indexing samples. Each epoch visits the samples in a fresh
 *             order (Fisher-Yates, seeded by (seed, epoch)) in batches of B,
 *             the model inputs' first axis; the N mod B samples left at the
 *             end of an epoch's order are not used that epoch.
 *   loader    worker threads gather batches into a ring of slots ahead of the
 *             step. Batch k is fixed by the data cursor, not by which thread
 *             fills it or when, so every run sees the same batches.
 *   steps     --steps N is the total count (a resumed run goes on to N).
 *   state     --save writes every param and buffer (optimizer moments, loss
 *             scale, step counter: all buffers) plus metadata (step, data
 *             cursor, seed) in one safetensors file, atomically; --resume
 *             loads it and sets the session's run counter (dropout masks), so
 *             k steps + resume to N is byte-identical to N straight steps.
 *   eval      --eval-data: the model compiled for inference, given the train
 *             session's params and buffers, run over the whole set.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

const char train_synopsis[] =
    "FILE --data NAME=FILE.npy,... [--steps N | --epochs N] [--eval-data NAME=FILE.npy,...]\n"
    "                     [--eval-every N] [--save CKPT] [--save-every N] [--resume CKPT] [--params FILE]\n"
    "                     [--log FILE.csv] [--log-every N] [--workers N] [--seed N] [--dim K=V]\n"
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
    "                             written). epoch counts from 0; lr is empty when the program has no\n"
    "                             'lr' output. A resumed run continues the log: rows past the\n"
    "                             checkpoint's step (steps done after it by a run that then stopped)\n"
    "                             are dropped and logged again, so each step has one row.\n"
    "  --log-every N              when stdout is not a terminal, print a progress line every N steps\n"
    "                             (default 10) and after the last; on a terminal one line updates in\n"
    "                             place. Progress: step/total, loss, learning rate, samples/s, ETA.\n"
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

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

/* Element i of a tensor, as a double. */
static double elem(tf_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case TF_DTYPE_F32: return ((const float *)p)[i];
    case TF_DTYPE_F64: return ((const double *)p)[i];
    case TF_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case TF_DTYPE_I32: return ((const int32_t *)p)[i];
    case TF_DTYPE_BOOL: return ((const unsigned char *)p)[i];
    case TF_DTYPE_F16: return half_to_double(((const uint16_t *)p)[i]);
    case TF_DTYPE_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    }
    return NAN;
}

/* A float for people and CSV: nan and inf without a sign bit's "-nan". */
static const char *num_str(char *buf, size_t n, const char *fmt, double v)
{
    if (isnan(v)) snprintf(buf, n, "nan");
    else if (isinf(v)) snprintf(buf, n, v > 0 ? "inf" : "-inf");
    else snprintf(buf, n, fmt, v);
    return buf;
}

static char *shape_str(char *buf, size_t n, const int64_t *shape, int from, int rank)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = from; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i > from ? ", " : "", shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
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

typedef struct column {
    char *name;              /* the model input */
    char *file;
    tf_array_t *arr;
    const unsigned char *data;
    tf_dtype dtype;
    int rank;                /* the input's rank */
    int64_t shape[8];        /* the input's shape: [B, sample dims...] */
    size_t sample_bytes;
} column;

typedef struct dataset {
    column col[MAX_ITEMS];
    size_t ncol;
    int64_t n;               /* samples */
    int64_t batch;           /* B */
} dataset;

static void dataset_free(dataset *d)
{
    for (size_t i = 0; i < d->ncol; i++) {
        free(d->col[i].name);
        free(d->col[i].file);
        tf_array_free(d->col[i].arr);
    }
    d->ncol = 0;
}

/* Parse the --data lists into columns and check that every file can be
 * read, before compiling. Usage mistakes return 2, files that cannot be read 1. */
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
            if (d->ncol == MAX_ITEMS) return cli_usage_error("train", "too many arrays in %s", flag);
            column *c = &d->col[d->ncol];
            if (!(c->name = strndup(s, (size_t)(eq - s))) || !(c->file = strndup(eq + 1, (size_t)(s + len - eq - 1)))) {
                free(c->name);
                return errorf("out of memory");
            }
            d->ncol++;
            s += len + (end != NULL);
        }
    }
    if (!d->ncol) return cli_usage_error("train", "%s lists no arrays", flag);
    for (size_t i = 0; i < d->ncol; i++)
        for (size_t k = 0; k < i; k++)
            if (!strcmp(d->col[i].name, d->col[k].name))
                return cli_usage_errorf("train", "%s: input '%s' is given twice", flag, d->col[i].name);
    for (size_t i = 0; i < d->ncol; i++)
        if (cli_check_readable(flag, d->col[i].file)) return 1;
    return 0;
}

/* Load the parsed arrays and check them against the program's inputs (1 on
 * a mismatch). */
static int dataset_load(tf_context_t *ctx, const tf_program_t *p, const char *flag, dataset *d)
{
    size_t nin = tf_program_io_count(p, TF_IO_INPUT);
    /* match each array to a model input */
    for (size_t i = 0; i < d->ncol; i++) {
        column *c = &d->col[i];
        size_t k;
        for (k = 0; k < nin; k++) {
            const char *name;
            tf_program_io(p, TF_IO_INPUT, k, &name, &c->dtype, &c->rank, c->shape);
            if (!strcmp(name, c->name)) break;
        }
        if (k == nin) {
            char names[1024] = "";
            for (size_t j = 0, o = 0; j < nin && o < sizeof names; j++) {
                const char *name;
                tf_program_io(p, TF_IO_INPUT, j, &name, NULL, NULL, NULL);
                o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", j ? ", " : "", name);
            }
            return errorf("%s: the model has no input named '%s' (its inputs: %s)", flag, c->name, names);
        }
        if (c->rank == 0)
            return errorf("input '%s' is a scalar: train batches along the first axis of every input", c->name);
    }
    for (size_t k = 0; k < nin; k++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8];
        char sb[256];
        tf_program_io(p, TF_IO_INPUT, k, &name, &dt, &rank, shape);
        bool given = false;
        for (size_t i = 0; i < d->ncol; i++) given |= !strcmp(d->col[i].name, name);
        if (!given)
            return errorf("%s gives no data for input '%s' (%s%s): add %s=FILE.npy", flag, name, tf_dtype_str(dt),
                          shape_str(sb, sizeof sb, shape, 0, rank), name);
    }
    /* load and check */
    for (size_t i = 0; i < d->ncol; i++) {
        column *c = &d->col[i];
        tf_tensor_view v;
        char s1[256], s2[256], s3[256], s4[256];
        if (tf_array_load_npy(ctx, c->file, &c->arr)) return api_error(ctx, flag);
        tf_array_view(c->arr, &v);
        c->data = v.data;
        if (v.rank != c->rank || numel(v.shape, 1, v.rank) != numel(c->shape, 1, c->rank) ||
            memcmp(v.shape + 1, c->shape + 1, sizeof *v.shape * (size_t)(c->rank - 1)) != 0 || v.rank == 0)
            return errorf("%s: the array is %s%s, so its samples are %s; input '%s' is %s%s, so each sample must be %s "
                          "(the first axis counts samples)",
                          c->file, tf_dtype_str(v.dtype), shape_str(s1, sizeof s1, v.shape, 0, v.rank),
                          v.rank ? shape_str(s2, sizeof s2, v.shape, 1, v.rank) : "scalars", c->name,
                          tf_dtype_str(c->dtype), shape_str(s3, sizeof s3, c->shape, 0, c->rank),
                          shape_str(s4, sizeof s4, c->shape, 1, c->rank));
        if (v.dtype != c->dtype)
            return errorf("%s: the array is %s, input '%s' is %s (no silent conversion: save it as %s)", c->file,
                          tf_dtype_str(v.dtype), c->name, tf_dtype_str(c->dtype), tf_dtype_str(c->dtype));
        c->sample_bytes = (size_t)numel(c->shape, 1, c->rank) * (size_t)tf_dtype_size(c->dtype);
        if (i == 0) {
            d->n = v.shape[0];
            d->batch = c->shape[0];
        } else if (v.shape[0] != d->n) {
            return errorf("%s: %s has %" PRId64 " samples but %s has %" PRId64 " (every array needs one entry per sample)",
                          flag, d->col[0].file, d->n, c->file, v.shape[0]);
        } else if (c->shape[0] != d->batch) {
            return errorf("inputs '%s' and '%s' have first axes %" PRId64 " and %" PRId64
                          ": train batches along the first axis, so every input needs the same one",
                          d->col[0].name, c->name, d->batch, c->shape[0]);
        }
    }
    if (d->n == 0) return errorf("%s: the arrays hold no samples", flag);
    return 0;
}

/* ---- the data order ---- */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The order of epoch `epoch`: Fisher-Yates driven by splitmix64 seeded with
 * (seed, epoch). (The modulo's bias is below n / 2^64.) */
static void epoch_order(int64_t *perm, int64_t n, uint64_t seed, uint64_t epoch)
{
    uint64_t state = mix64(seed ^ mix64(epoch ^ 0x7472616e2d6f7264ull));
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        state += 0x9e3779b97f4a7c15ull;
        uint64_t r = mix64(state) % (uint64_t)(i + 1);
        int64_t t = perm[i];
        perm[i] = perm[r];
        perm[r] = t;
    }
}

/* ---- the loader: worker threads fill a ring of batches ahead of the step ----
 *
 * Batch k (counted from the loader's start) goes to slot k % nslots. A worker
 * claims the next k under the lock once slot k % nslots has been released
 * (batch k - nslots consumed), takes its sample indices from the cursor
 * (which also advances under the lock, so the order of claims is the order
 * of the data), then copies the samples outside the lock. The consumer takes
 * batches in order, waiting only when batch k is not ready yet. */

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY };

typedef struct slot {
    int state;
    uint64_t k;
    int64_t *idx;            /* B sample indices */
    void *buf[MAX_ITEMS];    /* per column: B samples, contiguous */
    uint64_t epoch;          /* the batch's epoch */
    int64_t pos_after;       /* the cursor's position in that epoch after it */
    int64_t real;            /* samples that are not padding */
} slot;

typedef struct loader {
    const dataset *ds;
    bool train;              /* shuffle per epoch, drop the partial batch; else in order, pad the last */
    uint64_t seed;
    slot *slots;
    int nslots;
    pthread_mutex_t mu;
    pthread_cond_t can_claim, ready;
    uint64_t next_claim, released, total;
    uint64_t epoch;          /* cursor */
    int64_t pos;
    int64_t *perm;           /* train: the order of `epoch` */
    bool stop;
    pthread_t threads[MAX_WORKERS];
    int nthreads;
} loader;

/* Under the lock: the indices of the next batch. */
static void cursor_take(loader *L, slot *sl)
{
    const dataset *d = L->ds;
    int64_t B = d->batch;
    if (L->train) {
        if (L->pos + B > d->n) {   /* the rest of this epoch's order is short of a batch */
            L->epoch++;
            L->pos = 0;
            epoch_order(L->perm, d->n, L->seed, L->epoch);
        }
        memcpy(sl->idx, L->perm + L->pos, (size_t)B * sizeof *sl->idx);
        sl->real = B;
    } else {
        for (int64_t j = 0; j < B; j++) sl->idx[j] = (L->pos + j) % d->n;
        sl->real = d->n - L->pos < B ? d->n - L->pos : B;
    }
    L->pos += B;
    sl->epoch = L->epoch;
    sl->pos_after = L->pos;
}

static void *loader_worker(void *arg)
{
    loader *L = arg;
    const dataset *d = L->ds;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (!L->stop && L->next_claim < L->total && L->next_claim >= L->released + (uint64_t)L->nslots)
            pthread_cond_wait(&L->can_claim, &L->mu);
        if (L->stop || L->next_claim >= L->total) break;
        uint64_t k = L->next_claim++;
        slot *sl = &L->slots[k % (uint64_t)L->nslots];
        sl->state = SLOT_FILLING;
        sl->k = k;
        cursor_take(L, sl);
        pthread_mutex_unlock(&L->mu);
        for (size_t c = 0; c < d->ncol; c++) {
            const column *col = &d->col[c];
            unsigned char *dst = sl->buf[c];
            for (int64_t j = 0; j < d->batch; j++)
                memcpy(dst + (size_t)j * col->sample_bytes, col->data + (size_t)sl->idx[j] * col->sample_bytes,
                       col->sample_bytes);
        }
        pthread_mutex_lock(&L->mu);
        sl->state = SLOT_READY;
        pthread_cond_broadcast(&L->ready);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

static void loader_free(loader *L)
{
    if (L->nthreads) {
        pthread_mutex_lock(&L->mu);
        L->stop = true;
        pthread_cond_broadcast(&L->can_claim);
        pthread_mutex_unlock(&L->mu);
        for (int i = 0; i < L->nthreads; i++) pthread_join(L->threads[i], NULL);
        L->nthreads = 0;
    }
    if (L->slots) {
        for (int i = 0; i < L->nslots; i++) {
            free(L->slots[i].idx);
            for (size_t c = 0; c < L->ds->ncol; c++) free(L->slots[i].buf[c]);
        }
        free(L->slots);
        pthread_mutex_destroy(&L->mu);
        pthread_cond_destroy(&L->can_claim);
        pthread_cond_destroy(&L->ready);
    }
    free(L->perm);
    memset(L, 0, sizeof *L);
}

/* total batches from the cursor (epoch, pos); train or eval order. */
static int loader_start(loader *L, const dataset *d, bool train, uint64_t seed, uint64_t epoch, int64_t pos,
                        uint64_t total, int workers)
{
    memset(L, 0, sizeof *L);
    L->ds = d;
    L->train = train;
    L->seed = seed;
    L->epoch = epoch;
    L->pos = pos;
    L->total = total;
    L->nslots = 2 * workers + 2;
    if (!(L->slots = calloc((size_t)L->nslots, sizeof *L->slots))) return errorf("out of memory");
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->can_claim, NULL);
    pthread_cond_init(&L->ready, NULL);
    bool ok = true;
    for (int i = 0; ok && i < L->nslots; i++) {
        ok = (L->slots[i].idx = malloc((size_t)d->batch * sizeof(int64_t))) != NULL;
        for (size_t c = 0; ok && c < d->ncol; c++)
            ok = (L->slots[i].buf[c] = malloc((size_t)d->batch * d->col[c].sample_bytes + 1)) != NULL;
    }
    if (ok && train) {
        ok = (L->perm = malloc((size_t)d->n * sizeof *L->perm)) != NULL;
        if (ok) epoch_order(L->perm, d->n, seed, epoch);
    }
    if (!ok) {
        loader_free(L);
        return errorf("out of memory for the batch ring (%d batches of %" PRId64 " samples)", 2 * workers + 2, d->batch);
    }
    for (int i = 0; i < workers; i++) {
        int e = pthread_create(&L->threads[i], NULL, loader_worker, L);
        if (e) {
            loader_free(L);
            return errorf("cannot start a loader thread: %s", strerror(e));
        }
        L->nthreads++;
    }
    return 0;
}

/* The next batch, in order; it stays valid until loader_release. */
static slot *loader_next(loader *L)
{
    pthread_mutex_lock(&L->mu);
    slot *sl = &L->slots[L->released % (uint64_t)L->nslots];
    while (!(sl->state == SLOT_READY && sl->k == L->released)) pthread_cond_wait(&L->ready, &L->mu);
    pthread_mutex_unlock(&L->mu);
    return sl;
}

static void loader_release(loader *L, slot *sl)
{
    pthread_mutex_lock(&L->mu);
    sl->state = SLOT_FREE;
    L->released++;
    pthread_cond_broadcast(&L->can_claim);
    pthread_mutex_unlock(&L->mu);
}

static int bind_batch(tf_session_t *s, tf_context_t *ctx, const dataset *d, const slot *sl)
{
    for (size_t c = 0; c < d->ncol; c++) {
        const column *col = &d->col[c];
        if (tf_session_bind(s, col->name, col->dtype, col->shape, col->rank, sl->buf[c]))
            return api_error(ctx, "binding a batch");
    }
    return 0;
}

/* ---- checkpoint metadata: a flat JSON object of strings ---- */

/* The string at *p (on its opening quote), decoded into a malloc'd buffer. */
static char *json_string(const char **p)
{
    const char *s = *p;
    if (*s != '"') return NULL;
    size_t cap = strlen(s) + 1, k = 0;
    char *o = malloc(cap);
    if (!o) return NULL;
    for (s++; *s && *s != '"'; s++) {
        if (*s != '\\') {
            o[k++] = *s;
            continue;
        }
        s++;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *m;
        if (*s && (m = strchr(from, *s))) {
            o[k++] = to[m - from];
        } else if (*s == 'u' && s[1] && s[2] && s[3] && s[4]) {
            unsigned cp = 0;
            for (int i = 1; i <= 4; i++) {
                char ch = s[i];
                cp = cp * 16 + (unsigned)(ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                        : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : 0);
            }
            o[k++] = cp < 0x80 && cp ? (char)cp : '?';   /* our values are ASCII */
            s += 4;
        } else {
            free(o);
            return NULL;
        }
    }
    if (*s != '"') {
        free(o);
        return NULL;
    }
    o[k] = 0;
    *p = s + 1;
    return o;
}

/* The value of `key` (malloc'd), or NULL when absent or the text is not a
 * flat object of strings. */
static char *meta_get(const char *json, const char *key)
{
    const char *p = json;
    while (*p == ' ') p++;
    if (*p++ != '{') return NULL;
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p != '"') return NULL;
        char *k = json_string(&p);
        while (k && *p == ' ') p++;
        if (!k || *p++ != ':') {
            free(k);
            return NULL;
        }
        while (*p == ' ') p++;
        char *v = json_string(&p);
        bool match = !strcmp(k, key);
        free(k);
        if (!v) return NULL;
        if (match) return v;
        free(v);
    }
}

static bool meta_u64(const char *json, const char *key, uint64_t *out)
{
    char *v = meta_get(json, key);
    bool ok = v && cli_parse_u64(v, out);
    free(v);
    return ok;
}

#define CKPT_FORMAT "tfuse-train-1"

typedef struct cursor { uint64_t step, epoch; int64_t pos; } cursor;

static int save_checkpoint(tf_context_t *ctx, tf_session_t *s, const char *path, const cursor *cur, uint64_t seed,
                           const dataset *d, const char *model)
{
    char name[256];
    size_t k = 0;
    const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    for (const char *q = base; *q && k < sizeof name - 1; q++)   /* ASCII, nothing to escape */
        name[k++] = *q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\' ? *q : '_';
    name[k] = 0;
    char meta[1024];
    snprintf(meta, sizeof meta,
             "{\"format\":\"" CKPT_FORMAT "\",\"step\":\"%" PRIu64 "\",\"epoch\":\"%" PRIu64 "\",\"position\":\"%" PRId64
             "\",\"seed\":\"%" PRIu64 "\",\"samples\":\"%" PRId64 "\",\"batch\":\"%" PRId64 "\",\"model\":\"%s\"}",
             cur->step, cur->epoch, cur->pos, seed, d->n, d->batch, name);
    cli_write_begin();   /* a second interrupt waits: the file is whole or absent, with no temporary left */
    tf_status st = tf_session_save_state_meta(s, path, meta);
    cli_write_end();
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

static void progress_show(progress *pr, uint64_t step, uint64_t epoch, double loss, double lr, bool final)
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
    if (pr->tty) {
        printf("\r\033[Kstep %" PRIu64 "/%" PRIu64 "  epoch %" PRIu64 "  loss %s  lr %s  %.0f samples/s  ETA %s", step,
               pr->total, epoch, num_str(ls, sizeof ls, "%.4f", loss), lrs, rate, etas);
        if (final) putchar('\n');
        pr->drawn = !final;
    } else {
        printf("step %" PRIu64 "/%" PRIu64 "  epoch %" PRIu64 "  loss %s  lr %s  samples/s %.1f  ETA %s\n", step,
               pr->total, epoch, num_str(ls, sizeof ls, "%.6f", loss), lrs, rate, etas);
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

/* The precision training runs in: --precision, else the train block's
 * (fp32 when it names none). */
static const char *train_precision(tf_context_t *ctx, const tf_model_t *m, tf_precision override)
{
    static const char *const names[] = {"fp32", "fp16", "bf16"};
    if (override != TF_PRECISION_DEFAULT) return tf_precision_name(override);
    char *text = NULL;
    const char *prec = "fp32";
    bool in_train = false;
    if (tf_model_print(ctx, m, &text)) return prec;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        while (*line == ' ') line++;
        if (!strcmp(line, "train {")) in_train = true;
        else if (in_train && !strcmp(line, "}")) in_train = false;
        else if (in_train && !strncmp(line, "precision = ", 12))
            for (size_t i = 0; i < sizeof names / sizeof *names; i++)
                if (!strcmp(line + 12, names[i])) prec = names[i];
    }
    free(text);
    return prec;
}

/* ---- evaluation ---- */

typedef struct evaluator {
    tf_program_t *p;
    tf_session_t *s;
    dataset data;
    bool has_loss;
    int label;               /* column of the labels, or -1: no accuracy */
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
static int find_label(const tf_program_t *p, const dataset *d, const int64_t *lshape, int lrank)
{
    static const char *const names[] = {"y", "label", "labels", "target", "targets"};
    int any = -1, nany = 0, named = -1, nnamed = 0;
    for (size_t c = 0; c < d->ncol; c++) {
        const column *col = &d->col[c];
        if (col->dtype != TF_DTYPE_I64 && col->dtype != TF_DTYPE_I32) continue;
        if (col->rank != lrank - 1 || memcmp(col->shape, lshape, sizeof *lshape * (size_t)col->rank)) continue;
        int64_t bound = 0;
        for (size_t k = 0; k < tf_program_io_count(p, TF_IO_INPUT); k++) {
            const char *n;
            tf_program_io(p, TF_IO_INPUT, k, &n, NULL, NULL, NULL);
            if (!strcmp(n, col->name)) tf_program_input_bound(p, k, &bound);
        }
        if (bound != lshape[lrank - 1]) continue;
        any = (int)c, nany++;
        for (size_t k = 0; k < sizeof names / sizeof *names; k++)
            if (!strcmp(col->name, names[k])) named = (int)c, nnamed++;
    }
    return nany == 1 ? any : nnamed == 1 ? named : -1;
}

/* e->data holds the parsed --eval-data lists (dataset_parse). */
static int evaluator_init(tf_context_t *ctx, const args *a, const tf_model_t *m, evaluator *e)
{
    e->label = -1;
    tf_compile_options o;
    cli_fill_options(a, &o, NULL);
    o.mode = TF_MODE_INFER;
    o.explain = NULL;
    o.dump_ir = NULL;
    if (tf_program_compile(ctx, m, &o, &e->p)) return api_error(ctx, "compiling the model for evaluation");
    if (tf_session_create(ctx, e->p, a->target, a->seed, &e->s)) return api_error(ctx, NULL);
    int rc = dataset_load(ctx, e->p, "--eval-data", &e->data);
    if (rc) return rc;
    e->has_loss = has_output(e->p, "loss", NULL, NULL, NULL);
    if (has_output(e->p, "logits", &e->logits_dtype, &e->logits_rank, e->logits_shape) && e->logits_rank >= 2)
        e->label = find_label(e->p, &e->data, e->logits_shape, e->logits_rank);
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

static int evaluate(tf_context_t *ctx, const tf_program_t *tp, tf_session_t *ts, evaluator *e, uint64_t step,
                    int workers, progress *pr)
{
    int rc = copy_state(ctx, tp, ts, e);
    if (rc) return rc;
    const dataset *d = &e->data;
    uint64_t nb = (uint64_t)((d->n + d->batch - 1) / d->batch);
    loader L;
    if ((rc = loader_start(&L, d, false, 0, 0, 0, nb, workers))) return rc;
    double loss_sum = 0;
    int64_t correct = 0, counted = 0;
    int64_t per_row = e->label >= 0 ? numel(e->logits_shape, 1, e->logits_rank - 1) : 0;
    int64_t classes = e->label >= 0 ? e->logits_shape[e->logits_rank - 1] : 0;
    for (uint64_t b = 0; b < nb && !rc; b++) {
        if (cli_interrupted()) {   /* abandon the evaluation: it changes no state */
            rc = RC_INTERRUPTED;
            break;
        }
        slot *sl = loader_next(&L);
        if ((rc = bind_batch(e->s, ctx, d, sl)) || tf_session_run(e->s)) {
            if (!rc) rc = api_error(ctx, "evaluating");
            loader_release(&L, sl);
            break;
        }
        tf_tensor_view v;
        if (e->has_loss && !tf_session_output(e->s, "loss", &v)) loss_sum += elem(v.dtype, v.data, 0) * (double)sl->real;
        if (e->label >= 0 && !tf_session_output(e->s, "logits", &v)) {
            const column *lab = &d->col[e->label];
            const void *labels = sl->buf[e->label];
            for (int64_t r = 0; r < sl->real * per_row; r++) {
                int64_t best = 0;
                double bv = elem(v.dtype, v.data, r * classes);
                for (int64_t c = 1; c < classes; c++) {
                    double x = elem(v.dtype, v.data, r * classes + c);
                    if (x > bv || (isnan(x) && !isnan(bv))) bv = x, best = c;
                }
                correct += best == (int64_t)elem(lab->dtype, labels, r);
                counted++;
            }
        }
        loader_release(&L, sl);
    }
    loader_free(&L);
    if (rc) return rc;
    progress_clear(pr);
    printf("eval after step %" PRIu64 ":", step);
    char ls[32];
    if (e->has_loss) printf("  loss %s", num_str(ls, sizeof ls, "%.6f", loss_sum / (double)d->n));
    if (e->label >= 0) printf("  accuracy %.4f", (double)correct / (double)counted);
    printf("  (%" PRId64 " samples)\n", d->n);
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
    loader L;
    FILE *log;
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
    for (size_t i = 0; path && i < d->ncol; i++)
        if (same_file(path, d->col[i].file))
            return cli_usage_errorf("train", "%s %s is a data file of %s: it would be overwritten", flag, path, dflag);
    return 0;
}

#define LOG_HEADER "step,epoch,loss,lr,samples_per_s"

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
    char line[64] = "";
    if (!f) return cli_errorf("--log %s: cannot open: %s", t->log, strerror(errno));
    bool ours = fgets(line, sizeof line, f) && !strcmp(line, LOG_HEADER "\n");
    fclose(f);
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
static int log_open(const char *path, bool resuming, uint64_t step, FILE **out)
{
    struct stat st;
    bool keep = resuming && stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
    if (!keep) {
        struct stat s2;
        bool special = stat(path, &s2) == 0 && !S_ISREG(s2.st_mode);   /* /dev/stdout, a pipe */
        if (!(*out = fopen(path, special ? "a" : "w"))) return errorf("--log %s: cannot write: %s", path, strerror(errno));
        fputs(LOG_HEADER "\n", *out);
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
                  const dataset *d, bool quiet)
{
    char *meta = NULL;
    if (tf_session_load_state_meta(s, path, &meta)) return api_error(ctx, "--resume");
    char *format = meta ? meta_get(meta, "format") : NULL;
    bool ours = format && !strcmp(format, CKPT_FORMAT);
    free(format);
    uint64_t samples = 0, batch = 0, pos = 0;
    int rc = 0;
    if (!ours)
        rc = errorf("%s: not a checkpoint of 'tfuse train' (its metadata has no training position); "
                    "to start from its params, use --params", path);
    else if (!meta_u64(meta, "step", &cur->step) || !meta_u64(meta, "epoch", &cur->epoch) ||
             !meta_u64(meta, "position", &pos) || !meta_u64(meta, "seed", seed) || !meta_u64(meta, "samples", &samples) ||
             !meta_u64(meta, "batch", &batch) || pos > (uint64_t)1 << 62)
        rc = errorf("%s: malformed training metadata: %s", path, meta);
    if (!rc) {
        cur->pos = (int64_t)pos;
        if (!quiet && (samples != (uint64_t)d->n || batch != (uint64_t)d->batch))
            fprintf(stderr, "tfuse: note: %s was trained on %" PRIu64 " samples in batches of %" PRIu64
                    "; now %" PRId64 " in batches of %" PRId64 ": the data order is not the original run's\n",
                    path, samples, batch, d->n, d->batch);
        tf_session_set_step(s, cur->step);
    }
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
    if (cur->step == first) {
        fprintf(stderr, "tfuse: interrupted before step %" PRIu64 ": nothing trained in this run, no checkpoint written\n",
                cur->step + 1);
        return RC_INTERRUPTED;
    }
    if (!t->save) {
        fprintf(stderr, "tfuse: interrupted at step %" PRIu64 ": no checkpoint written (no --save given)\n", cur->step);
        return RC_INTERRUPTED;
    }
    int rc = saved ? 0 : save_checkpoint(ctx, T->s, t->save, cur, seed, &T->data, a->file);   /* saved: by --save-every */
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

static int train_run(tf_context_t *ctx, const args *a, trainer *T)
{
    const train_args *t = &a->train;
    int rc;
    /* everything that can be checked before compiling: data lists and files,
     * the files to read and to write */
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
    if ((rc = check_outputs(a))) return rc;

    if (tf_model_parse_file(ctx, a->file, a->dims, a->ndims, &T->m)) return api_error(ctx, NULL);
    tf_compile_options o;
    cli_fill_options(a, &o, stdout);
    o.mode = TF_MODE_TRAIN;
    if (tf_program_compile(ctx, T->m, &o, &T->p)) return api_error(ctx, NULL);
    if (cli_interrupted()) return stop_early();
    tf_dtype loss_dt;
    int loss_rank;
    int64_t loss_shape[8];
    if ((rc = cli_check_train_loss(T->p, a->file, "training"))) return rc;
    has_output(T->p, "loss", &loss_dt, &loss_rank, loss_shape);
    if (numel(loss_shape, 0, loss_rank) != 1)   /* autodiff refuses these first, with the place */
        return errorf("%s: output 'loss' has %" PRId64 " elements; training needs a scalar loss", a->file,
                      numel(loss_shape, 0, loss_rank));
    bool has_lr = has_output(T->p, "lr", NULL, NULL, NULL);
    const char *precision = train_precision(ctx, T->m, a->precision);
    bool fp16 = !strcmp(precision, "fp16");
    if ((rc = dataset_load(ctx, T->p, "--data", &T->data))) return rc;
    const dataset *d = &T->data;
    if (d->n < d->batch)
        return errorf("--data has %" PRId64 " samples, fewer than one batch of %" PRId64
                      " (the inputs' first axis; pick a smaller one with --dim)", d->n, d->batch);
    uint64_t per_epoch = (uint64_t)(d->n / d->batch);
    if (t->epochs > ((uint64_t)1 << 62) / per_epoch)
        return errorf("--epochs %" PRIu64 " makes more than 2^62 steps", t->epochs);
    uint64_t total = t->steps ? t->steps : (t->epochs ? t->epochs : 1) * per_epoch;

    uint64_t seed = a->seed;
    cursor cur = {0, 0, 0};
    if (tf_session_create(ctx, T->p, a->target, seed, &T->s)) return api_error(ctx, NULL);
    if (a->params && tf_session_load_state(T->s, a->params)) return api_error(ctx, "--params");
    if (a->params && tf_session_missing_params(T->s))
        fprintf(stderr, "tfuse: note: %s has no value for %s; they start from their initializers\n", a->params,
                tf_session_missing_params(T->s));
    if (t->resume) {
        uint64_t ck_seed;
        if ((rc = resume(ctx, T->s, t->resume, &cur, &ck_seed, d, false))) return rc;
        if (ck_seed != seed) {
            if (a->seed_set)
                return cli_usage_errorf("train", "--seed %" PRIu64 " differs from the seed %" PRIu64
                                        " of %s: a resumed run keeps its seed", seed, ck_seed, t->resume);
            seed = ck_seed;   /* dropout masks come from the session's seed: start over with the right one */
            tf_session_free(T->s);
            T->s = NULL;
            if (tf_session_create(ctx, T->p, a->target, seed, &T->s)) return api_error(ctx, NULL);
            if ((rc = resume(ctx, T->s, t->resume, &cur, &ck_seed, d, true))) return rc;
        }
    }
    if (T->have_ev && (rc = evaluator_init(ctx, a, T->m, &T->ev))) return rc;
    if (cli_interrupted()) return stop_early();
    /* from here on the run writes: the log first */
    if (t->log && (rc = log_open(t->log, t->resume != NULL, cur.step, &T->log))) return rc;
    int workers = t->workers ? (int)t->workers : 2;
    uint64_t log_every = t->log_every ? t->log_every : 10;

    printf("training %s: %" PRId64 " samples, batches of %" PRId64 ", %" PRIu64 " steps per epoch", a->file, d->n,
           d->batch, per_epoch);
    if (d->n % d->batch) printf(" (%" PRId64 " samples per epoch left out)", d->n % d->batch);
    if (cur.step) printf("; resuming at step %" PRIu64 " (epoch %" PRIu64 ")", cur.step, cur.epoch);
    printf("; steps %" PRIu64 "/%" PRIu64 ", seed %" PRIu64 "\n", cur.step, total, seed);
    fflush(stdout);

    progress pr = {.tty = isatty(fileno(stdout)), .total = total, .first = cur.step, .every = log_every,
                   .batch = d->batch, .t0 = now_s()};
    if (cur.step < total &&
        (rc = loader_start(&T->L, d, true, seed, cur.epoch, cur.pos, total - cur.step, workers)))
        return rc;
    double last = now_s(), loss = NAN, lr = NAN;
    uint64_t epoch = cur.epoch, skipped = 0;
    bool interrupted = false, saved = false;   /* saved: the state of cur.step is in t->save */
    while (cur.step < total) {
        if ((interrupted = cli_interrupted())) break;   /* between steps: the state is that of cur.step steps */
        slot *sl = loader_next(&T->L);
        if ((interrupted = cli_interrupted())) {   /* while waiting for the batch: abandon the step */
            loader_release(&T->L, sl);
            break;
        }
        if ((rc = bind_batch(T->s, ctx, d, sl))) break;
        if (tf_session_run(T->s)) {
            progress_clear(&pr);
            char where[64];
            snprintf(where, sizeof where, "at step %" PRIu64, cur.step + 1);
            rc = api_error(ctx, where);
            break;
        }
        cur.step++;
        cur.epoch = epoch = sl->epoch;
        cur.pos = sl->pos_after;
        loader_release(&T->L, sl);
        tf_tensor_view v;
        tf_session_output(T->s, "loss", &v);
        loss = elem(v.dtype, v.data, 0);
        if (has_lr && !tf_session_output(T->s, "lr", &v)) lr = elem(v.dtype, v.data, 0);
        double tnow = now_s(), dt = tnow - last;
        last = tnow;
        if (T->log) {
            char ls[32], lrs[32];
            fprintf(T->log, "%" PRIu64 ",%" PRIu64 ",%s,", cur.step, epoch, num_str(ls, sizeof ls, "%.9g", loss));
            if (has_lr) fputs(num_str(lrs, sizeof lrs, "%.9g", lr), T->log);
            fprintf(T->log, ",%.1f\n", dt > 0 ? (double)d->batch / dt : 0.0);
            fflush(T->log);
        }
        if (!isfinite(loss)) {
            progress_clear(&pr);
            if (!fp16) {
                rc = errorf("loss is %s at step %" PRIu64 " (in %s, where no loss scaler skips such a step); stopping",
                            isnan(loss) ? "nan" : "inf", cur.step, precision);
                break;
            }
            skipped++;
            printf("note: step %" PRIu64 ": loss is %s in fp16; the loss scaler skips the step and halves the scale\n",
                   cur.step, isnan(loss) ? "nan" : "inf");
        }
        progress_show(&pr, cur.step, epoch, loss, lr, cur.step == total);
        double pause0 = now_s();
        saved = t->save_every && cur.step % t->save_every == 0 && cur.step < total;
        if (saved && (rc = save_checkpoint(ctx, T->s, t->save, &cur, seed, d, a->file))) break;
        if (t->eval_every && cur.step % t->eval_every == 0 && cur.step < total &&
            (rc = evaluate(ctx, T->p, T->s, &T->ev, cur.step, workers, &pr))) {
            if (rc == RC_INTERRUPTED) interrupted = true, rc = 0;
            break;
        }
        double paused = now_s() - pause0;
        pr.paused += paused;
        last += paused;
    }
    loader_free(&T->L);
    if (rc) return rc;
    progress_clear(&pr);
    if (interrupted || cli_interrupted()) return stop_interrupted(ctx, a, T, &cur, pr.first, seed, saved);
    if (pr.first >= total) printf("nothing to train: the checkpoint is at step %" PRIu64 " of %" PRIu64 "\n", cur.step, total);
    if (skipped) printf("%" PRIu64 " step(s) skipped for a non-finite loss\n", skipped);
    if (t->save) {
        if ((rc = save_checkpoint(ctx, T->s, t->save, &cur, seed, d, a->file))) return rc;
        printf("saved %s (step %" PRIu64 ")\n", t->save, cur.step);
    }
    if (T->have_ev && (rc = evaluate(ctx, T->p, T->s, &T->ev, cur.step, workers, &pr)) == RC_INTERRUPTED) {
        fflush(stdout);
        fprintf(stderr, "tfuse: interrupted during the evaluation after step %" PRIu64 "%s%s\n", cur.step,
                t->save ? ": training is done and the checkpoint written to " : "", t->save ? t->save : "");
    }
    return rc;
}

int cmd_train(tf_context_t *ctx, const args *a)
{
    int rc = check_usage(a);
    if (rc) return rc;
    char msg[900];
    if (a->train.save)
        snprintf(msg, sizeof msg, "tfuse: interrupt: stopping after the current step, then writing the checkpoint "
                 "to %.600s (interrupt again to stop at once, without it)", a->train.save);
    else
        snprintf(msg, sizeof msg, "tfuse: interrupt: stopping after the current step (interrupt again to stop at once)");
    cli_signals_graceful(msg);
    trainer T;
    memset(&T, 0, sizeof T);
    rc = train_run(ctx, a, &T);
    loader_free(&T.L);
    if (T.log && fclose(T.log) != 0 && !rc) rc = errorf("--log %s: write failed: %s", a->train.log, strerror(errno));
    if (T.have_ev) evaluator_free(&T.ev);
    dataset_free(&T.data);
    tf_session_free(T.s);
    tf_program_free(T.p);
    tf_model_free(T.m);
    return rc;
}
