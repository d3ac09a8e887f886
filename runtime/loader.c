/* loader.c — tf_loader_t: batches of .npy data for a program's inputs.
 *
 * One array per input, the first axis counting samples. Shuffled, each epoch
 * visits the samples in a fresh order (Fisher-Yates, seeded by (seed,
 * epoch)) in batches of B, the inputs' first axis; the N mod B samples left
 * at the end of an epoch's order are not used that epoch. In order, an epoch
 * is ceil(N / B) batches, the last one filled up from the start.
 *
 * Worker threads gather batches into a ring of slots ahead of the consumer.
 * Batch k (counted from the start or the last set_position) goes to slot
 * k % nslots. A worker claims the next k under the lock once slot
 * k % nslots is free (batch k - nslots consumed), takes its sample indices
 * from the cursor (which advances under the lock, so the order of claims is
 * the order of the data), then copies the samples outside the lock. The
 * consumer takes batches in order, waiting only when batch k is not ready
 * yet. So batch k is fixed by the cursor, never by which thread fills it or
 * when: every run sees the same batches. Threads start with the first
 * tf_loader_next and stop at set_position (which empties the ring) and free. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

enum { MAX_WORKERS = 64 };
#define MAX_OFFSET ((int64_t)1 << 62)

typedef struct column {
    char *input, *path;
    tf_array_t *arr;
    const unsigned char *data;
    tf_dtype dtype;
    int rank;                /* the input's rank */
    int64_t shape[8];        /* the input's shape: [B, sample dims...] */
    size_t sample_bytes;
} column;

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY };

typedef struct slot {
    int state;
    uint64_t k;
    int64_t *idx;            /* B sample indices */
    void **buf;              /* per column: B samples, contiguous */
    uint64_t epoch;          /* the batch's epoch */
    int64_t pos_after;       /* the cursor's offset in that epoch after it */
    int64_t real;            /* samples that are not padding */
} slot;

struct tf_loader {
    tf_context_t *ctx;
    column *col;
    size_t ncol;
    int64_t n, batch;        /* samples, B */
    int rank, ranks;         /* this loader's batch of each global one (ranks batches) */
    bool shuffle;
    int workers;
    slot *slots;
    int nslots;
    pthread_mutex_t mu;
    pthread_cond_t can_claim, ready;
    bool sync_made;
    uint64_t next_claim, released;
    uint64_t seed, epoch;    /* the workers' cursor */
    int64_t pos;
    int64_t *perm;           /* shuffled: the order of `epoch` */
    bool stop, held;         /* held: the consumer has slot `released` */
    tf_loader_position at;   /* after the last batch tf_loader_next gave */
    pthread_t threads[MAX_WORKERS];
    int nthreads;
};

void tf_loader_options_init(tf_loader_options *o)
{
    memset(o, 0, sizeof *o);
    o->shuffle = 1;
    o->workers = 2;
    o->ranks = 1;
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

/* Under the lock: the indices of the next batch. */
static void cursor_take(tf_loader_t *L, slot *sl)
{
    int64_t B = L->batch, n = L->n;
    if (L->shuffle) {
        int64_t G = B * L->ranks;   /* the global batch: this rank's is its rank-th B */
        if (L->pos + G > n) {   /* the rest of this epoch's order is short of a (global) batch */
            L->epoch++;
            L->pos = 0;
            epoch_order(L->perm, n, L->seed, L->epoch);
        }
        memcpy(sl->idx, L->perm + L->pos + (int64_t)L->rank * B, (size_t)B * sizeof *sl->idx);
        sl->real = B;
        B = G;
    } else {
        if (L->pos >= n) {
            L->epoch++;
            L->pos = 0;
        }
        for (int64_t j = 0; j < B; j++) sl->idx[j] = (L->pos + j) % n;
        sl->real = n - L->pos < B ? n - L->pos : B;
    }
    L->pos += B;
    sl->epoch = L->epoch;
    sl->pos_after = L->pos;
}

static void *worker(void *arg)
{
    tf_loader_t *L = arg;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (!L->stop && L->next_claim >= L->released + (uint64_t)L->nslots) pthread_cond_wait(&L->can_claim, &L->mu);
        if (L->stop) break;
        uint64_t k = L->next_claim++;
        slot *sl = &L->slots[k % (uint64_t)L->nslots];
        sl->state = SLOT_FILLING;
        sl->k = k;
        cursor_take(L, sl);
        pthread_mutex_unlock(&L->mu);
        for (size_t c = 0; c < L->ncol; c++) {
            const column *col = &L->col[c];
            unsigned char *dst = sl->buf[c];
            for (int64_t j = 0; j < L->batch; j++)
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

static void stop_workers(tf_loader_t *L)
{
    if (!L->nthreads) return;
    pthread_mutex_lock(&L->mu);
    L->stop = true;
    pthread_cond_broadcast(&L->can_claim);
    pthread_mutex_unlock(&L->mu);
    for (int i = 0; i < L->nthreads; i++) pthread_join(L->threads[i], NULL);
    L->nthreads = 0;
    L->stop = false;
}

static tf_status start_workers(tf_loader_t *L)
{
    for (int i = 0; i < L->workers; i++) {
        int e = pthread_create(&L->threads[i], NULL, worker, L);
        if (e) {
            stop_workers(L);
            return tf_set_error(L->ctx, TF_ERR_RUNTIME, "error: cannot start a loader thread: %s", strerror(e));
        }
        L->nthreads++;
    }
    return TF_OK;
}

/* ---- creating ---- */

static int64_t numel(const int64_t *shape, int from, int rank)
{
    int64_t n = 1;
    for (int i = from; i < rank; i++) n *= shape[i];
    return n;
}

/* "[d0, d1, ...]" of the dims from `from` on */
static char *dims_str(char *buf, size_t n, const int64_t *shape, int from, int rank)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = from; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i > from ? ", " : "", shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

void tf_loader_free(tf_loader_t *L)
{
    if (!L) return;
    stop_workers(L);
    for (int i = 0; L->slots && i < L->nslots; i++) {
        tf_free(L->slots[i].idx);
        for (size_t c = 0; L->slots[i].buf && c < L->ncol; c++) tf_free(L->slots[i].buf[c]);
        tf_free(L->slots[i].buf);
    }
    tf_free(L->slots);
    if (L->sync_made) {
        pthread_mutex_destroy(&L->mu);
        pthread_cond_destroy(&L->can_claim);
        pthread_cond_destroy(&L->ready);
    }
    for (size_t c = 0; c < L->ncol; c++) {
        tf_free(L->col[c].input);
        tf_free(L->col[c].path);
        tf_array_free(L->col[c].arr);
    }
    tf_free(L->col);
    tf_free(L->perm);
    tf_free(L);
}

/* The name of the dim that input `in`'s first axis is declared with, or
 * NULL when it is a number. */
static const char *batch_dim(const tf_program_t *p, const char *in)
{
    for (int i = 0; i < p->inputs.n; i++) {
        const tf_value *v = p->inputs.items[i];
        if (strcmp(v->name, in) || v->type.rank < 1) continue;
        int32_t sym = v->type.dims[0].sym;
        return sym >= 0 && sym < p->m->ndims ? p->m->dims[sym].name : NULL;
    }
    return NULL;
}

/* Match every source to an input, and every input to a source. */
static tf_status match_inputs(tf_loader_t *L, const tf_program_t *p, const char *name)
{
    size_t nin = tf_program_io_count(p, TF_IO_INPUT);
    for (size_t i = 0; i < L->ncol; i++) {
        column *c = &L->col[i];
        size_t k;
        for (k = 0; k < nin; k++) {
            const char *in;
            tf_program_io(p, TF_IO_INPUT, k, &in, &c->dtype, &c->rank, c->shape);
            if (!strcmp(in, c->input)) break;
        }
        if (k == nin) {
            char names[1024] = "";
            for (size_t j = 0, o = 0; j < nin && o < sizeof names; j++) {
                const char *in;
                tf_program_io(p, TF_IO_INPUT, j, &in, NULL, NULL, NULL);
                o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", j ? ", " : "", in);
            }
            return tf_set_error(L->ctx, TF_ERR_INVALID_ARG, "error: %s: the model has no input named '%s' (its inputs: %s)",
                                name, c->input, names);
        }
        if (c->rank == 0)
            return tf_set_error(L->ctx, TF_ERR_INVALID_ARG,
                                "error: input '%s' is a scalar: train batches along the first axis of every input", c->input);
    }
    for (size_t k = 0; k < nin; k++) {
        const char *in;
        tf_dtype dt;
        int rank;
        int64_t shape[8];
        char sb[256];
        tf_program_io(p, TF_IO_INPUT, k, &in, &dt, &rank, shape);
        bool given = false;
        for (size_t i = 0; i < L->ncol; i++) given |= !strcmp(L->col[i].input, in);
        if (!given)
            return tf_set_error(L->ctx, TF_ERR_INVALID_ARG, "error: %s gives no data for input '%s' (%s%s): add %s=FILE.npy",
                                name, in, tf_dtype_str(dt), dims_str(sb, sizeof sb, shape, 0, rank), in);
    }
    return TF_OK;
}

/* Load every array and check it against its input. */
static tf_status load_arrays(tf_loader_t *L, const tf_program_t *p, const char *name)
{
    for (size_t i = 0; i < L->ncol; i++) {
        column *c = &L->col[i];
        tf_tensor_view v;
        char s1[256], s2[256], s3[256], s4[256];
        tf_status st = tf_array_load_npy(L->ctx, c->path, &c->arr);
        if (st) {
            char msg[sizeof L->ctx->err];
            snprintf(msg, sizeof msg, "%s", tf_context_last_error(L->ctx));
            return tf_set_error(L->ctx, st, "%s (%s)", msg, name);
        }
        tf_array_view(c->arr, &v);
        c->data = v.data;
        if (v.rank != c->rank || numel(v.shape, 1, v.rank) != numel(c->shape, 1, c->rank) ||
            memcmp(v.shape + 1, c->shape + 1, sizeof *v.shape * (size_t)(c->rank - 1)) != 0 || v.rank == 0)
            return tf_set_error(L->ctx, TF_ERR_INVALID_ARG,
                                "error: %s: the array is %s%s, so its samples are %s; input '%s' is %s%s, so each sample "
                                "must be %s (the first axis counts samples)",
                                c->path, tf_dtype_str(v.dtype), dims_str(s1, sizeof s1, v.shape, 0, v.rank),
                                v.rank ? dims_str(s2, sizeof s2, v.shape, 1, v.rank) : "scalars", c->input,
                                tf_dtype_str(c->dtype), dims_str(s3, sizeof s3, c->shape, 0, c->rank),
                                dims_str(s4, sizeof s4, c->shape, 1, c->rank));
        if (v.dtype != c->dtype)
            return tf_set_error(L->ctx, TF_ERR_INVALID_ARG,
                                "error: %s: the array is %s, input '%s' is %s (no silent conversion: save it as %s)", c->path,
                                tf_dtype_str(v.dtype), c->input, tf_dtype_str(c->dtype), tf_dtype_str(c->dtype));
        c->sample_bytes = (size_t)numel(c->shape, 1, c->rank) * (size_t)tf_dtype_size(c->dtype);
        if (i == 0) {
            L->n = v.shape[0];
            L->batch = c->shape[0];
        } else if (v.shape[0] != L->n) {
            return tf_set_error(L->ctx, TF_ERR_INVALID_ARG,
                                "error: %s: %s has %" PRId64 " samples but %s has %" PRId64
                                " (every array needs one entry per sample)",
                                name, L->col[0].path, L->n, c->path, v.shape[0]);
        } else if (c->shape[0] != L->batch) {
            return tf_set_error(L->ctx, TF_ERR_INVALID_ARG,
                                "error: inputs '%s' and '%s' have first axes %" PRId64 " and %" PRId64
                                ": train batches along the first axis, so every input needs the same one",
                                L->col[0].input, c->input, L->batch, c->shape[0]);
        }
    }
    if (L->n == 0) return tf_set_error(L->ctx, TF_ERR_INVALID_ARG, "error: %s: the arrays hold no samples", name);
    if (L->shuffle && L->n < L->batch * L->ranks) {
        /* the remedy: the dim the first axis is declared with, or that there is none to set */
        char how[320], glob[64] = "";
        const char *dim = batch_dim(p, L->col[0].input);
        int64_t fits = L->n / L->ranks > 0 ? L->n / L->ranks : 1;
        if (dim)
            snprintf(how, sizeof how, "the inputs' first axis, dim %s = %" PRId64 "; pick a smaller one with --dim %s=%" PRId64, dim,
                     L->batch, dim, fits);
        else
            snprintf(how, sizeof how, "the inputs' first axis, %" PRId64 ", is a number in the model: declare a dim (dim B = %" PRId64
                     ") and write it as the inputs' first axis to choose the batch with --dim", L->batch, L->batch);
        if (L->ranks > 1) snprintf(glob, sizeof glob, "global batch of %d ranks x ", L->ranks);
        else snprintf(glob, sizeof glob, "batch of ");
        return tf_set_error(L->ctx, TF_ERR_INVALID_ARG, "error: %s has %" PRId64 " samples, fewer than one %s%" PRId64 " (%s)", name,
                            L->n, glob, L->batch, how);
    }
    return TF_OK;
}

static tf_status make_ring(tf_loader_t *L)
{
    L->nslots = 2 * L->workers + 2;
    bool ok = (L->slots = tf_calloc((size_t)L->nslots, sizeof *L->slots)) != NULL;
    for (int i = 0; ok && i < L->nslots; i++) {
        slot *sl = &L->slots[i];
        ok = (sl->idx = tf_malloc((size_t)L->batch * sizeof *sl->idx)) && (sl->buf = tf_calloc(L->ncol, sizeof *sl->buf));
        for (size_t c = 0; ok && c < L->ncol; c++)
            ok = (sl->buf[c] = tf_malloc((size_t)L->batch * L->col[c].sample_bytes + 1)) != NULL;
    }
    if (ok && L->shuffle && (ok = (L->perm = tf_malloc((size_t)L->n * sizeof *L->perm)) != NULL))
        epoch_order(L->perm, L->n, L->seed, L->epoch);
    if (!ok)
        return tf_set_error(L->ctx, TF_ERR_OOM, "error: out of memory for the batch ring (%d batches of %" PRId64 " samples)",
                            L->nslots, L->batch);
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->can_claim, NULL);
    pthread_cond_init(&L->ready, NULL);
    L->sync_made = true;
    return TF_OK;
}

tf_status tf_loader_create(tf_context_t *ctx, const tf_program_t *p, const tf_data_source *sources, size_t nsources,
                           const tf_loader_options *opts, tf_loader_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !p || !out || (!sources && nsources)) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    tf_loader_options dflt;
    if (!opts) {
        tf_loader_options_init(&dflt);
        opts = &dflt;
    }
    const char *name = opts->name ? opts->name : "data";
    if (opts->workers < 1 || opts->workers > MAX_WORKERS)
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: %s: %d loader workers; expected 1 to %d", name, opts->workers,
                            MAX_WORKERS);
    if (!nsources) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: %s lists no arrays", name);
    for (size_t i = 0; i < nsources; i++) {
        if (!sources[i].input || !sources[i].path)
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: %s: source %zu has no input name or no path", name, i);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(sources[i].input, sources[k].input))
                return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: %s: input '%s' is given twice", name, sources[i].input);
    }
    tf_loader_t *L = tf_calloc(1, sizeof *L);
    if (!L || !(L->col = tf_calloc(nsources, sizeof *L->col))) {
        tf_free(L);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    L->ctx = ctx;
    L->shuffle = opts->shuffle != 0;
    L->rank = opts->rank, L->ranks = opts->ranks;
    if (opts->ranks < 1 || opts->rank < 0 || opts->rank >= opts->ranks || (opts->ranks > 1 && !opts->shuffle)) {
        tf_loader_free(L);
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, opts->ranks > 1 && !opts->shuffle
                            ? "error: %s: rank %d of %d: data parallel loading is of shuffled data only"
                            : "error: %s: rank %d of %d: expected 0 <= rank < ranks", name, opts->rank, opts->ranks);
    }
    L->workers = opts->workers;
    L->seed = opts->seed;
    L->at.seed = opts->seed;
    for (size_t i = 0; i < nsources; i++, L->ncol++)
        if (!(L->col[i].input = tf_strdup(sources[i].input)) || !(L->col[i].path = tf_strdup(sources[i].path))) {
            tf_free(L->col[i].input);
            L->col[i].input = NULL;
            tf_loader_free(L);
            return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
        }
    tf_status st = match_inputs(L, p, name);
    if (!st) st = load_arrays(L, p, name);
    if (!st) st = make_ring(L);
    if (st) {
        tf_loader_free(L);
        return st;
    }
    *out = L;
    return TF_OK;
}

/* ---- using ---- */

int64_t tf_loader_samples(const tf_loader_t *L) { return L ? L->n : 0; }
int64_t tf_loader_batch_size(const tf_loader_t *L) { return L ? L->batch : 0; }

uint64_t tf_loader_epoch_batches(const tf_loader_t *L)
{
    if (!L) return 0;
    return (uint64_t)(L->shuffle ? L->n / (L->batch * L->ranks) : (L->n + L->batch - 1) / L->batch);
}

tf_status tf_loader_next(tf_loader_t *L, tf_session_t *s, tf_batch_info *info)
{
    TF_ALLOC_SCOPE(tf_context_allocator(L ? L->ctx : NULL));
    if (!L) return TF_ERR_INVALID_ARG;
    tf_status st;
    if (!L->nthreads && (st = start_workers(L))) return st;
    pthread_mutex_lock(&L->mu);
    if (L->held) {   /* the batch given last time is done with */
        L->slots[L->released % (uint64_t)L->nslots].state = SLOT_FREE;
        L->released++;
        L->held = false;
        pthread_cond_broadcast(&L->can_claim);
    }
    slot *sl = &L->slots[L->released % (uint64_t)L->nslots];
    while (!(sl->state == SLOT_READY && sl->k == L->released)) pthread_cond_wait(&L->ready, &L->mu);
    L->held = true;
    pthread_mutex_unlock(&L->mu);
    L->at.epoch = sl->epoch;
    L->at.offset = sl->pos_after;
    if (info) *info = (tf_batch_info){.epoch = sl->epoch, .samples = sl->real, .next = L->at};
    for (size_t c = 0; s && c < L->ncol; c++) {
        const column *col = &L->col[c];
        if ((st = tf_session_bind(s, col->input, col->dtype, col->shape, col->rank, sl->buf[c]))) {
            if (s->ctx != L->ctx) tf_set_error(L->ctx, st, "%s", tf_context_last_error(s->ctx));
            return st;
        }
    }
    return TF_OK;
}

tf_status tf_loader_view(const tf_loader_t *L, const char *input, tf_tensor_view *out)
{
    if (!L || !input || !out) return tf_set_error(L ? L->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    if (!L->held)
        return tf_set_error(L->ctx, TF_ERR_INVALID_ARG, "error: no batch to view: tf_loader_next gives one");
    const slot *sl = &L->slots[L->released % (uint64_t)L->nslots];
    for (size_t c = 0; c < L->ncol; c++) {
        const column *col = &L->col[c];
        if (strcmp(col->input, input)) continue;
        out->dtype = col->dtype;
        out->rank = col->rank;
        memcpy(out->shape, col->shape, sizeof out->shape);
        out->data = sl->buf[c];
        return TF_OK;
    }
    return tf_set_error(L->ctx, TF_ERR_INVALID_ARG, "error: the data has no array for input '%s'", input);
}

tf_status tf_loader_get_position(const tf_loader_t *L, tf_loader_position *out)
{
    if (!L || !out) return TF_ERR_INVALID_ARG;
    *out = L->at;
    return TF_OK;
}

tf_status tf_loader_set_position(tf_loader_t *L, const tf_loader_position *pos)
{
    TF_ALLOC_SCOPE(tf_context_allocator(L ? L->ctx : NULL));
    if (!L || !pos) return TF_ERR_INVALID_ARG;
    if (pos->offset < 0 || pos->offset > MAX_OFFSET)
        return tf_set_error(L->ctx, TF_ERR_INVALID_ARG, "error: data position offset %" PRId64 " is outside [0, 2^62]",
                            pos->offset);
    stop_workers(L);   /* what they gathered ahead belongs to the old position */
    for (int i = 0; i < L->nslots; i++) L->slots[i].state = SLOT_FREE;
    L->next_claim = L->released = 0;
    L->held = false;
    L->seed = pos->seed;
    L->epoch = pos->epoch;
    L->pos = pos->offset;
    if (L->shuffle) epoch_order(L->perm, L->n, L->seed, L->epoch);
    L->at = *pos;
    return TF_OK;
}
