/* comm.c — tf_comm_t: the ranks of a data-parallel job and the mean of
 * values over them (comm.h says how the layers split; docs/distributed.md
 * what a user sees).
 *
 * The mean of a bucket, in three moves, so that every rank ends with the
 * same bits and a run repeats them:
 *   1. alltoall: rank r receives chunk r of every rank's bucket;
 *   2. rank r sums its chunk over the ranks in rank order 0, 1, ..., N-1 in
 *      float64, divides by N and rounds once to the dtype;
 *   3. allgather: every rank receives every rank's reduced chunk.
 * Each rank sends and receives (N-1)/N of the bucket twice, as a ring
 * all-reduce does, and the order of every sum is written down here rather
 * than left to the MPI library's choice of algorithm (which may differ by
 * message size and give ranks different bits).
 *
 * The communication thread takes submitted buckets in order; a backend
 * packs a bucket as the backward pass produces its members, submits it
 * when the last one is in, and waits for it where a reader needs it. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "alloc.h"
#include "env.h"
#include "runtime.h"

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* ---- the one-rank driver ----------------------------------------------------- */

static int self_move(void *impl, const void *send, void *recv, size_t chunk, double timeout_s, char *err, size_t nerr)
{
    (void)impl, (void)timeout_s, (void)err, (void)nerr;
    if (chunk && send != recv) memmove(recv, send, chunk);
    return 0;
}

static int self_bcast(void *impl, void *buf, size_t bytes, int root, double timeout_s, char *err, size_t nerr)
{
    (void)impl, (void)buf, (void)bytes, (void)root, (void)timeout_s, (void)err, (void)nerr;
    return 0;
}

static void self_abort(void *impl, int code)
{
    (void)impl;
    exit(code);
}

static void self_free(void *impl) { (void)impl; }

static const tf_comm_driver self_driver = {"self", self_move, self_move, self_bcast, self_abort, self_free};

/* ---- the mean of a bucket ------------------------------------------------------ */

static size_t elem_bytes(tf_dt t) { return (size_t)tf_dtype_bytes(t); }

/* Step 2 over the alltoall's result: chunk `rank` of every rank, summed in
 * rank order, into this rank's chunk of pack. */
static void reduce_chunk(const tf_comm_t *c, tf_comm_bucket *b)
{
    int64_t K = b->chunk;
    size_t es = elem_bytes(b->dtype);
    void *mine = b->pack + (size_t)c->rank * (size_t)K * es;
    if (b->dtype == TF_DT_F32) {
        const float *g = (const float *)b->gather;
        float *o = mine;
        for (int64_t i = 0; i < K; i++) {
            double s = 0;
            for (int r = 0; r < c->size; r++) s += (double)g[(int64_t)r * K + i];
            o[i] = (float)(s / c->size);
        }
        return;
    }
    for (int64_t i = 0; i < K; i++) {
        double s = 0;
        for (int r = 0; r < c->size; r++) s += tf_elem_load(b->dtype, b->gather, (int64_t)r * K + i);
        tf_elem_store(b->dtype, mine, i, s / c->size);
    }
}

static int fail(tf_comm_t *c, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    if (!c->err[0]) snprintf(c->err, sizeof c->err, "%s", msg);
    pthread_mutex_unlock(&c->mu);
    return -1;
}

/* Steps 1-3 on the calling thread; the means land in b->gather (elements
 * in order). A gather bucket (b->gather_only) is step 3 alone, of this
 * rank's chunk at the start of pack. */
static int mean_bucket(tf_comm_t *c, tf_comm_bucket *b)
{
    char err[512] = "";
    size_t cb = (size_t)b->chunk * elem_bytes(b->dtype);
    double t0 = now_ns();
    pthread_mutex_lock(&c->call);
    int st = b->gather_only ? 0 : c->drv->alltoall(c->impl, b->pack, b->gather, cb, c->timeout_s, err, sizeof err);
    if (!st && !b->gather_only) reduce_chunk(c, b);
    if (!st)
        st = c->drv->allgather(c->impl, b->pack + (b->gather_only ? 0 : (size_t)c->rank * cb), b->gather, cb, c->timeout_s, err,
                               sizeof err);
    pthread_mutex_unlock(&c->call);
    pthread_mutex_lock(&c->mu);
    c->comm_ns += now_ns() - t0;
    c->bytes_reduced += b->elems * (int64_t)elem_bytes(b->dtype);
    pthread_mutex_unlock(&c->mu);
    return st ? fail(c, err) : 0;
}

int tf_comm_bucket_init(const tf_comm_t *c, tf_comm_bucket *b, tf_dt dt, int64_t n, int nmembers)
{
    memset(b, 0, sizeof *b);
    b->dtype = dt;
    b->elems = n;
    b->chunk = (n + c->size - 1) / c->size;
    size_t bytes = (size_t)(b->chunk ? b->chunk : 1) * (size_t)c->size * elem_bytes(dt);
    b->pack = tf_calloc(1, bytes);
    b->gather = tf_calloc(1, bytes);
    b->nmembers = nmembers;
    b->members = tf_calloc((size_t)(nmembers ? nmembers : 1), sizeof *b->members);
    return b->pack && b->gather && b->members ? 0 : -1;
}

void tf_comm_bucket_free(tf_comm_bucket *b)
{
    tf_free(b->pack), tf_free(b->gather), tf_free(b->members);
    memset(b, 0, sizeof *b);
}

/* Through the queue, as a bucket of one: every rank issues its collectives
 * in one order, whichever thread asks. */
int tf_comm_mean(tf_comm_t *c, tf_dt dt, void *data, int64_t n)
{
    if (c->size == 1 || n == 0) return 0;
    tf_comm_bucket b = {0};
    if (tf_comm_bucket_init(c, &b, dt, n, 1)) {
        tf_comm_bucket_free(&b);
        return fail(c, "out of memory for an all-reduce");
    }
    memcpy(b.pack, data, (size_t)n * elem_bytes(dt));
    b.members[0].out = data, b.members[0].at = 0, b.members[0].n = n;
    int st = tf_comm_submit(c, &b) || tf_comm_wait(c, &b) ? -1 : 0;
    tf_comm_bucket_free(&b);
    return st;
}

int tf_comm_gather(tf_comm_t *c, tf_dt dt, const void *data, int64_t n, void *out)
{
    if (c->size == 1 || n == 0) {
        memcpy(out, data, (size_t)n * elem_bytes(dt));
        return 0;
    }
    tf_comm_bucket b = {0};
    if (tf_comm_bucket_init(c, &b, dt, n * c->size, 1)) {   /* chunk = n */
        tf_comm_bucket_free(&b);
        return fail(c, "out of memory for an all-gather");
    }
    b.gather_only = true;
    memcpy(b.pack, data, (size_t)n * elem_bytes(dt));
    b.members[0].out = out, b.members[0].at = 0, b.members[0].n = n * c->size;
    int st = tf_comm_submit(c, &b) || tf_comm_wait(c, &b) ? -1 : 0;
    tf_comm_bucket_free(&b);
    return st;
}

static int interp_gather(void *self, tf_dt dt, const double *data, int64_t n, double *out, char *err, size_t nerr)
{
    tf_comm_t *c = self;
    size_t es = elem_bytes(dt);
    unsigned char *v = tf_malloc((size_t)(n ? n : 1) * es), *all = tf_malloc((size_t)(n ? n : 1) * (size_t)c->size * es);
    int st = v && all ? 0 : -1;
    if (st) snprintf(err, nerr, "out of memory for an all-gather");
    for (int64_t i = 0; !st && i < n; i++) tf_elem_store(dt, v, i, data[i]);
    if (!st && tf_comm_gather(c, dt, v, n, all)) {
        pthread_mutex_lock(&c->mu);
        snprintf(err, nerr, "%s", c->err);
        pthread_mutex_unlock(&c->mu);
        st = -1;
    }
    for (int64_t i = 0; !st && i < n * c->size; i++) out[i] = tf_elem_load(dt, all, i);
    tf_free(v), tf_free(all);
    return st;
}

void tf_comm_interp_attach(tf_interp_ctx *ip, tf_comm_t *c)
{
    if (!c || c->size == 1) {
        tf_interp_set_comm(ip, NULL);
        return;
    }
    tf_interp_comm ic = {c, c->rank, c->size, tf_comm_interp_mean, interp_gather};
    tf_interp_set_comm(ip, &ic);
}

int tf_comm_interp_mean(void *self, tf_dt dt, double *data, int64_t n, char *err, size_t nerr)
{
    tf_comm_t *c = self;
    void *v = n && dt != TF_DT_F64 ? tf_malloc((size_t)n * elem_bytes(dt)) : NULL;
    if (n && dt != TF_DT_F64 && !v) {
        snprintf(err, nerr, "out of memory for an all-reduce");
        return -1;
    }
    for (int64_t i = 0; v && i < n; i++) tf_elem_store(dt, v, i, data[i]);
    int st = tf_comm_mean(c, v ? dt : TF_DT_F64, v ? v : data, n);
    for (int64_t i = 0; v && !st && i < n; i++) data[i] = tf_elem_load(dt, v, i);
    tf_free(v);
    if (!st) return 0;
    pthread_mutex_lock(&c->mu);
    snprintf(err, nerr, "%s", c->err);
    pthread_mutex_unlock(&c->mu);
    return -1;
}

int tf_comm_gather_all(tf_comm_t *c, const void *send, void *recv, size_t bytes)
{
    char err[512] = "";
    pthread_mutex_lock(&c->call);
    int st = c->drv->allgather(c->impl, send, recv, bytes, c->timeout_s, err, sizeof err);
    pthread_mutex_unlock(&c->call);
    return st ? fail(c, err) : 0;
}

/* ---- the communication thread ---------------------------------------------------- */

static void *comm_main(void *arg)
{
    tf_comm_t *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->head == c->nqueue && !c->stopping) pthread_cond_wait(&c->cv, &c->mu);
        if (c->head == c->nqueue) break;
        tf_comm_bucket *b = c->queue[c->head++];
        bool failed = c->err[0] != 0;
        pthread_mutex_unlock(&c->mu);
        int st = failed ? -1 : mean_bucket(c, b);
        if (!st)
            for (int i = 0; i < b->nmembers; i++)
                memcpy(b->members[i].out, b->gather + (size_t)b->members[i].at * elem_bytes(b->dtype),
                       (size_t)b->members[i].n * elem_bytes(b->dtype));
        pthread_mutex_lock(&c->mu);
        b->state = st ? 3 : 2;
        if (c->head == c->nqueue) c->head = c->nqueue = 0;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int tf_comm_submit(tf_comm_t *c, tf_comm_bucket *b)
{
    pthread_mutex_lock(&c->mu);
    if (c->err[0]) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    if (!c->thread_started) {
        if (pthread_create(&c->thread, NULL, comm_main, c)) {
            pthread_mutex_unlock(&c->mu);
            return fail(c, "cannot start the communication thread");
        }
        c->thread_started = true;
    }
    if (c->nqueue == c->capqueue) {
        int cap = c->capqueue ? 2 * c->capqueue : 16;
        tf_comm_bucket **q = tf_realloc(c->queue, (size_t)cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&c->mu);
            return fail(c, "out of memory for the all-reduce queue");
        }
        c->queue = q, c->capqueue = cap;
    }
    b->state = 1;
    c->queue[c->nqueue++] = b;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int tf_comm_wait(tf_comm_t *c, tf_comm_bucket *b)
{
    double t0 = now_ns();
    pthread_mutex_lock(&c->mu);
    while (b->state == 1) pthread_cond_wait(&c->cv, &c->mu);
    int st = b->state == 2 ? 0 : -1;
    b->state = 0;
    double w = now_ns() - t0;
    c->wait_ns += w;
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- the public handle ------------------------------------------------------------ */

static tf_comm_t *comm_new(const tf_comm_driver *drv, void *impl, int rank, int size)
{
    tf_comm_t *c = tf_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->drv = drv, c->impl = impl, c->rank = rank, c->size = size;
    c->timeout_s = 300;
    const char *t = tf_env("TFUSE_COMM_TIMEOUT");
    char *end;
    double v = t ? strtod(t, &end) : 0;
    if (t && end != t && !*end && v > 0) c->timeout_s = v;
    pthread_mutex_init(&c->call, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

tf_status tf_comm_create_mpi(tf_context_t *ctx, void *mpi_comm, tf_comm_t **out)
{
    if (!ctx || !out) return ctx ? tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument") : TF_ERR_INVALID_ARG;
    *out = NULL;
    const char *t = tf_env("TFUSE_COMM_TIMEOUT");
    char *end;
    if (t && (strtod(t, &end) <= 0 || end == t || *end))
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: TFUSE_COMM_TIMEOUT='%s': expected seconds, a number above 0", t);
    const tf_comm_driver *drv;
    void *impl;
    int rank, size;
    char err[512] = "";
    if (tf_comm_mpi_open(mpi_comm, &drv, &impl, &rank, &size, err, sizeof err))
        return tf_set_error(ctx, TF_ERR_UNAVAILABLE, "error: %s", err);
    if (!(*out = comm_new(drv, impl, rank, size))) {
        drv->free(impl);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    return TF_OK;
}

tf_status tf_comm_create_self(tf_context_t *ctx, tf_comm_t **out)
{
    if (!ctx || !out) return ctx ? tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument") : TF_ERR_INVALID_ARG;
    if (!(*out = comm_new(&self_driver, NULL, 0, 1))) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    return TF_OK;
}

int tf_comm_rank(const tf_comm_t *c) { return c ? c->rank : 0; }
int tf_comm_size(const tf_comm_t *c) { return c ? c->size : 1; }

tf_status tf_comm_allgather(tf_context_t *ctx, tf_comm_t *c, const void *send, void *recv, size_t bytes)
{
    if (!ctx || !c || (!send && bytes) || (!recv && bytes))
        return ctx ? tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument") : TF_ERR_INVALID_ARG;
    if (tf_comm_gather_all(c, send, recv, bytes)) return tf_set_error(ctx, TF_ERR_RUNTIME, "error: %s", c->err);
    return TF_OK;
}

tf_status tf_comm_broadcast(tf_context_t *ctx, tf_comm_t *c, void *buf, size_t bytes, int root)
{
    if (!ctx || !c || (!buf && bytes)) return ctx ? tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument") : TF_ERR_INVALID_ARG;
    if (root < 0 || root >= c->size)
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: broadcast from rank %d of a job of %d", root, c->size);
    char err[512] = "";
    pthread_mutex_lock(&c->call);
    int st = c->drv->bcast(c->impl, buf, bytes, root, c->timeout_s, err, sizeof err);
    pthread_mutex_unlock(&c->call);
    if (st) return tf_set_error(ctx, TF_ERR_RUNTIME, "error: %s", fail(c, err) ? c->err : err);
    return TF_OK;
}

void tf_comm_abort(tf_comm_t *c, int code)
{
    if (c) c->drv->abort(c->impl, code);
    exit(code);
}

void tf_comm_stats(const tf_comm_t *c, tf_comm_totals *out)
{
    memset(out, 0, sizeof *out);
    if (!c) return;
    tf_comm_t *m = (tf_comm_t *)c;
    pthread_mutex_lock(&m->mu);
    out->rank = c->rank, out->size = c->size;
    out->bytes_reduced = c->bytes_reduced;
    out->bytes_nccl = c->bytes_nccl;
    out->comm_ms = c->comm_ns / 1e6;
    out->wait_ms = c->wait_ns / 1e6;
    pthread_mutex_unlock(&m->mu);
}

void tf_comm_free(tf_comm_t *c)
{
    if (!c) return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    c->drv->free(c->impl);
    tf_free(c->queue);
    pthread_mutex_destroy(&c->call);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    tf_free(c);
}
