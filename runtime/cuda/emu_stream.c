/* emu_stream.c — cuda-emu's streams, events and graphs (see emu.h, emu.c).
 *
 * Streams. Work on a stream the caller created is queued, in order, and
 * runs only when something waits for it: cuStreamSynchronize, a
 * cuEventSynchronize of an event recorded after it, another stream's queued
 * cuStreamWaitEvent when that stream runs, a synchronous call (a copy
 * without a stream, cuCtxSynchronize) or a call that would pull memory,
 * an event, a graph or a module from under it (frees and destroys: a GPU
 * finishes the work first). So work runs as late as a GPU may run it: a
 * host buffer changed before the copy that reads it has run, or a stream
 * that reads what another writes without waiting for its event, computes
 * the wrong thing here too, where a GPU would only sometimes. cuEventQuery
 * does not make work progress (pending work stays NOT_READY). Work on the
 * legacy stream (NULL) runs at the call, after every queued stream. A
 * failure while queued work runs (an illegal address, a deadlock) is
 * reported as a GPU reports a fault: the call that queued it succeeded, and
 * the next wait for it (cuStreamSynchronize, cuEventSynchronize or
 * cuEventQuery of an event recorded after it, and every later one) returns
 * it; the stream then runs nothing more, and a stream that waits for an
 * event recorded after the failure fails with it.
 *
 * A graph is what a stream recorded while it captured, replayed in order. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "emu.h"
#include "emu_internal.h"

/* ---- state ------------------------------------------------------------------ */

typedef struct work {
    tf_cuda_emu_work fn;
    void *arg;
    size_t bytes;
} work;

typedef struct emu_graph {
    work *w;
    int n, cap;
} emu_graph;

typedef struct emu_stream {
    bool capturing;
    emu_graph *graph;            /* being recorded */
    /* a stream that joined another's capture by waiting for an event recorded in it (a fork), and
     * must be waited for in turn (a join) by the end of the capture: its items recorded so far, and
     * how many of them a capturing stream has waited for */
    bool joined;
    int cap_items, joined_upto;
    int error;                   /* a capture that went wrong */
    work *q;                     /* queued work, q[qhead..qn) not yet run */
    int qn, qcap, qhead;
    uint64_t enq, done;          /* work items queued, and run (or dropped after a fault), since the stream began */
    int fault;                   /* the first failure of queued work (sticky), 0: none */
    uint64_t fault_at;           /* its position (1 + items before it) */
    char msg[2048];              /* its words */
} emu_stream;

/* An event: the position of its last record in a stream's queue (complete
 * once the stream has run that far), or a record inside a capture. */
typedef struct emu_event {
    double ms;
    emu_stream *by;              /* a record inside a capture: the stream, and its items recorded by then */
    int by_items;
    emu_stream *st;              /* the stream of the last record while pending; NULL once that stream is gone */
    uint64_t seq;                /* the record's position in st */
    emu_graph *graph;            /* the capture the last record went into, NULL: none */
    int fault;                   /* st gone: the failure the record came after, 0: none */
    char msg[2048];
    struct emu_event *next;      /* every live event */
} emu_event;

static int g_live_streams, g_live_events, g_live_graphs;   /* (tf_emu_mu) */
static int g_capturing;      /* streams capturing: synchronous calls are errors meanwhile, as on a GPU */
/* the queues: every live stream and event; recursive, since running a stream's
 * wait runs the stream it waits for */
static pthread_mutex_t g_q_mu;
static pthread_once_t g_q_once = PTHREAD_ONCE_INIT;
static emu_stream **g_streams;
static int g_nstreams, g_cap_streams;
static emu_event *g_events;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- queues ------------------------------------------------------------------------ */

static void graph_free(emu_graph *g);

static void q_init(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_q_mu, &a);
    pthread_mutexattr_destroy(&a);
}
static void q_lock(void)
{
    pthread_once(&g_q_once, q_init);
    pthread_mutex_lock(&g_q_mu);
}
static void q_unlock(void) { pthread_mutex_unlock(&g_q_mu); }

static int run_event(void *argp);
static int run_wait(void *argp);

/* Run st's queued work up to position upto (q held). A failure is kept, and
 * what follows it is dropped. */
static void flush_until(emu_stream *st, uint64_t upto)
{
    while (st->done < upto && st->qhead < st->qn) {
        work w = st->q[st->qhead++];
        uint64_t at = ++st->done;
        if (!st->fault) {
            int r = w.fn(w.arg);
            if (r && !st->fault) {
                st->fault = r;
                st->fault_at = at;
                snprintf(st->msg, sizeof st->msg, "%s", tf_emu_msg);
            }
        }
        tf_free(w.arg);
    }
    if (st->qhead == st->qn) st->qhead = st->qn = 0;
}

void tf_emu_flush_all(void)
{
    q_lock();
    for (int i = 0; i < g_nstreams; i++) flush_until(g_streams[i], g_streams[i]->enq);
    q_unlock();
}

/* The failure queued work met at or before position at of st, 0: none. */
static int fault_by(const emu_stream *st, uint64_t at) { return st->fault && st->fault_at <= at ? st->fault : 0; }

int tf_cuda_emu_submit(tf_cu_stream s, tf_cuda_emu_work fn, const void *arg, size_t arg_bytes)
{
    emu_stream *st = (emu_stream *)s;
    if (!st) {   /* the legacy stream: after everything queued, at once */
        tf_emu_flush_all();
        return fn((void *)arg);
    }
    void *copy = tf_malloc(arg_bytes ? arg_bytes : 1);
    if (!copy) {
        if (st->capturing) st->error = OUT_OF_MEMORY;
        return fail(OUT_OF_MEMORY, "out of host memory queueing work");
    }
    memcpy(copy, arg, arg_bytes);
    q_lock();
    int r = OK;
    if (st->capturing) {
        emu_graph *g = st->graph;
        if (g->n == g->cap) {
            int cap = g->cap ? 2 * g->cap : 64;
            work *w = tf_realloc(g->w, (size_t)cap * sizeof *w);
            if (w) g->w = w, g->cap = cap;
        }
        if (g->n < g->cap) g->w[g->n++] = (work){fn, copy, arg_bytes}, st->cap_items++;
        else st->error = r = fail(OUT_OF_MEMORY, "out of host memory recording a graph");
    } else {
        if (st->qn == st->qcap) {
            int cap = st->qcap ? 2 * st->qcap : 64;
            work *w = tf_realloc(st->q, (size_t)cap * sizeof *w);
            if (w) st->q = w, st->qcap = cap;
        }
        if (st->qn < st->qcap) {
            st->q[st->qn++] = (work){fn, copy, arg_bytes};
            st->enq++;
        } else {
            r = fail(OUT_OF_MEMORY, "out of host memory queueing work");
        }
    }
    q_unlock();
    if (r) tf_free(copy);
    return r;
}

/* ---- streams ---------------------------------------------------------------------- */

static tf_cu_result emu_stream_create(tf_cu_stream *s, unsigned flags)
{
    (void)flags;
    emu_stream *st = tf_calloc(1, sizeof *st);
    if (!st) return fail(OUT_OF_MEMORY, "out of host memory");
    q_lock();
    if (g_nstreams == g_cap_streams) {
        int cap = g_cap_streams ? 2 * g_cap_streams : 16;
        emu_stream **a = tf_realloc(g_streams, (size_t)cap * sizeof *a);
        if (a) g_streams = a, g_cap_streams = cap;
    }
    bool ok = g_nstreams < g_cap_streams;
    if (ok) g_streams[g_nstreams++] = st;
    q_unlock();
    if (!ok) {
        tf_free(st);
        return fail(OUT_OF_MEMORY, "out of host memory");
    }
    pthread_mutex_lock(&tf_emu_mu);
    g_live_streams++;
    pthread_mutex_unlock(&tf_emu_mu);
    *s = (tf_cu_stream)st;
    return OK;
}
static tf_cu_result emu_stream_destroy(tf_cu_stream s)
{
    emu_stream *st = (emu_stream *)s;
    if (!st) return fail(INVALID_HANDLE, "no stream");
    if (st->capturing) {
        pthread_mutex_lock(&tf_emu_mu);
        g_capturing--;
        pthread_mutex_unlock(&tf_emu_mu);
    }
    /* its work finishes first (and the work of streams waiting for it); its events keep how it ended */
    tf_emu_flush_all();
    q_lock();
    for (int i = 0; i < g_nstreams; i++)
        if (g_streams[i] == st) {
            g_streams[i] = g_streams[--g_nstreams];
            break;
        }
    for (emu_event *e = g_events; e; e = e->next)
        if (e->st == st) {
            e->fault = fault_by(st, e->seq);
            snprintf(e->msg, sizeof e->msg, "%s", e->fault ? st->msg : "");
            e->st = NULL;
        }
    q_unlock();
    graph_free(st->graph);
    tf_free(st->q);
    tf_free(st);
    pthread_mutex_lock(&tf_emu_mu);
    g_live_streams--;
    pthread_mutex_unlock(&tf_emu_mu);
    return OK;
}
static tf_cu_result emu_stream_sync(tf_cu_stream s)
{
    emu_stream *st = (emu_stream *)s;
    if (st && st->capturing) return fail(STREAM_CAPTURE_UNSUPPORTED, "cuStreamSynchronize on a stream that is capturing a graph");
    if (!st) {
        tf_emu_flush_all();
        return tf_emu_settle();
    }
    q_lock();
    flush_until(st, st->enq);
    int fault = st->fault;
    char msg[sizeof st->msg];
    snprintf(msg, sizeof msg, "%s", st->msg);
    q_unlock();
    int r = tf_emu_settle();
    return fault ? fail(fault, "%s", msg) : r;
}

/* ---- events ----------------------------------------------------------------------- */

typedef struct event_arg { emu_event *e; } event_arg;
static int run_event(void *argp) { ((event_arg *)argp)->e->ms = now_ms(); return OK; }
static tf_cu_result emu_event_create(tf_cu_event *e, unsigned flags)
{
    if (flags & ~3u) return fail(INVALID_VALUE, "cuEventCreate: flags %#x (cuda-emu takes DEFAULT, BLOCKING_SYNC, DISABLE_TIMING)", flags);
    emu_event *ev = tf_calloc(1, sizeof *ev);
    if (!ev) return fail(OUT_OF_MEMORY, "out of host memory");
    q_lock();
    ev->next = g_events;
    g_events = ev;
    q_unlock();
    pthread_mutex_lock(&tf_emu_mu);
    g_live_events++;
    pthread_mutex_unlock(&tf_emu_mu);
    *e = (tf_cu_event)ev;
    return OK;
}
/* A live event (q held), or NULL. */
static emu_event *live_event(tf_cu_event e)
{
    for (emu_event *v = g_events; v; v = v->next)
        if (v == (emu_event *)e) return v;
    return NULL;
}
static tf_cu_result emu_event_destroy(tf_cu_event e)
{
    tf_emu_flush_all();   /* a record still queued runs first */
    q_lock();
    emu_event **p = &g_events;
    while (*p && *p != (emu_event *)e) p = &(*p)->next;
    bool found = *p != NULL;
    if (found) *p = (*p)->next;
    q_unlock();
    if (!found) return fail(INVALID_HANDLE, "cuEventDestroy: %p is not a live event", (void *)e);
    tf_free(e);
    pthread_mutex_lock(&tf_emu_mu);
    g_live_events--;
    pthread_mutex_unlock(&tf_emu_mu);
    return OK;
}
static tf_cu_result emu_event_record(tf_cu_event e, tf_cu_stream s)
{
    emu_stream *st = (emu_stream *)s;
    q_lock();
    emu_event *ev = live_event(e);
    if (!ev) {
        q_unlock();
        return fail(INVALID_HANDLE, "cuEventRecord: %p is not a live event", (void *)e);
    }
    event_arg a = {ev};
    int r = tf_cuda_emu_submit(s, run_event, &a, sizeof a);
    if (!r) {
        ev->graph = st && st->capturing ? st->graph : NULL;
        ev->st = st && !st->capturing ? st : NULL;
        ev->by = st && st->capturing ? st : NULL;
        ev->by_items = st ? st->cap_items : 0;
        ev->seq = ev->st ? st->enq : 0;
        ev->fault = 0;
    }
    q_unlock();
    return r;
}
/* Whether the event's last record has run (q held); *fault: the failure it came after. */
static bool event_done(const emu_event *e, int *fault, const char **msg)
{
    *fault = e->st ? fault_by(e->st, e->seq) : e->fault;
    *msg = e->st ? e->st->msg : e->msg;
    return !e->st || e->st->done >= e->seq;
}
static tf_cu_result emu_event_sync(tf_cu_event e)
{
    q_lock();
    emu_event *ev = live_event(e);
    if (!ev) {
        q_unlock();
        return fail(INVALID_HANDLE, "cuEventSynchronize: %p is not a live event", (void *)e);
    }
    if (ev->st) flush_until(ev->st, ev->seq);
    int fault;
    const char *m;
    event_done(ev, &fault, &m);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", m);
    q_unlock();
    return fault ? fail(fault, "%s", msg) : OK;
}
static tf_cu_result emu_event_query(tf_cu_event e)
{
    q_lock();
    emu_event *ev = live_event(e);
    if (!ev) {
        q_unlock();
        return fail(INVALID_HANDLE, "cuEventQuery: %p is not a live event", (void *)e);
    }
    int fault;
    const char *m;
    bool done = event_done(ev, &fault, &m);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", m);
    q_unlock();
    return !done ? NOT_READY : fault ? fail(fault, "%s", msg) : OK;
}

/* A stream's queued wait: the stream it waits for runs up to the record. */
typedef struct wait_arg { emu_stream *st; uint64_t seq; } wait_arg;
static int run_wait(void *argp)
{
    wait_arg *w = argp;
    flush_until(w->st, w->seq);   /* q held: this runs inside a flush */
    return fault_by(w->st, w->seq) ? fail(w->st->fault, "%s", w->st->msg) : OK;
}
typedef struct fail_arg { int code; char msg[2048]; } fail_arg;
static int run_fail(void *argp) { return fail(((fail_arg *)argp)->code, "%s", ((fail_arg *)argp)->msg); }

static bool capture_live(const emu_graph *g);

static tf_cu_result emu_stream_wait_event(tf_cu_stream s, tf_cu_event e, unsigned flags)
{
    emu_stream *st = (emu_stream *)s;
    bool forked = false;
    if (flags) return fail(INVALID_VALUE, "cuStreamWaitEvent: flags %u (cuda-emu takes 0)", flags);
    q_lock();
    emu_event *ev = live_event(e);
    int r = OK;
    if (!ev) {
        r = fail(INVALID_HANDLE, "cuStreamWaitEvent: %p is not a live event", (void *)e);
    } else if (st && st->capturing) {
        /* inside a capture, only an event recorded into the same capture orders work (a recorded graph runs in
         * order, so that is already so); one from outside would cross the capture's boundary */
        if (ev->graph != st->graph) {
            st->error = STREAM_CAPTURE_ISOLATION;
            r = fail(STREAM_CAPTURE_ISOLATION, "cuStreamWaitEvent: a capturing stream waits for an event recorded outside the capture");
        } else if (ev->by && ev->by != st && ev->by->joined && ev->by->graph == st->graph && ev->by_items > ev->by->joined_upto) {
            ev->by->joined_upto = ev->by_items;   /* a join: what the forked stream recorded so far is waited for */
        }
    } else if (st && ev->graph && capture_live(ev->graph)) {
        /* a fork: this stream joins the capture the event was recorded in, its work recorded there from now on */
        st->capturing = st->joined = true;
        st->graph = ev->graph;
        st->cap_items = st->joined_upto = 0;
        st->error = 0;
        forked = true;
    } else if (ev->st && ev->st->done < ev->seq) {   /* pending: the wait runs it when this stream gets there */
        if (ev->st != st) {
            wait_arg w = {ev->st, ev->seq};
            r = tf_cuda_emu_submit(s, run_wait, &w, sizeof w);
        }
    } else {
        int fault;
        const char *m;
        event_done(ev, &fault, &m);
        if (fault) {   /* it came after a failure: so does this stream's next work */
            fail_arg f = {fault, ""};
            snprintf(f.msg, sizeof f.msg, "%s", m);
            r = tf_cuda_emu_submit(s, run_fail, &f, sizeof f);
        }
    }
    q_unlock();
    if (forked) {
        pthread_mutex_lock(&tf_emu_mu);
        g_capturing++;
        pthread_mutex_unlock(&tf_emu_mu);
    }
    return r;
}

static tf_cu_result emu_event_elapsed(float *ms, tf_cu_event a, tf_cu_event b)
{
    q_lock();
    emu_event *ea = live_event(a), *eb = live_event(b);
    int fa = 0, fb = 0;
    const char *m;
    bool done = ea && eb && event_done(ea, &fa, &m) && event_done(eb, &fb, &m);
    if (done) *ms = (float)(eb->ms - ea->ms);
    q_unlock();
    if (!ea || !eb) return fail(INVALID_HANDLE, "cuEventElapsedTime: not a live event");
    return done ? OK : NOT_READY;
}

/* ---- graphs: what a capture recorded, replayed in order ------------------------------ */

/* Whether g is still being captured by the stream that began it (q held). */
static bool capture_live(const emu_graph *g)
{
    for (int i = 0; i < g_nstreams; i++)
        if (g_streams[i]->capturing && !g_streams[i]->joined && g_streams[i]->graph == g) return true;
    return false;
}

static void graph_free(emu_graph *g)
{
    if (!g) return;
    for (int i = 0; i < g->n; i++) tf_free(g->w[i].arg);
    tf_free(g->w);
    tf_free(g);
}

static tf_cu_result emu_begin_capture(tf_cu_stream s, int mode)
{
    emu_stream *st = (emu_stream *)s;
    (void)mode;
    if (!st) return fail(STREAM_CAPTURE_UNSUPPORTED, "the legacy stream cannot capture a graph");
    if (st->capturing) return fail(INVALID_VALUE, "cuStreamBeginCapture: the stream is capturing already");
    if (!(st->graph = tf_calloc(1, sizeof *st->graph))) return fail(OUT_OF_MEMORY, "out of host memory");
    st->capturing = true;
    st->error = 0;
    pthread_mutex_lock(&tf_emu_mu);
    g_capturing++;
    pthread_mutex_unlock(&tf_emu_mu);
    return OK;
}

static tf_cu_result emu_end_capture(tf_cu_stream s, tf_cu_graph *out)
{
    emu_stream *st = (emu_stream *)s;
    *out = NULL;
    if (!st || !st->capturing || st->joined) return fail(INVALID_VALUE, "cuStreamEndCapture: the stream did not begin a capture");
    st->capturing = false;
    emu_graph *g = st->graph;
    st->graph = NULL;
    /* the streams that joined it leave it; each must have been waited for after its last recorded work */
    bool unjoined = false;
    int error = st->error, left = 1;
    q_lock();
    for (int i = 0; i < g_nstreams; i++) {
        emu_stream *o = g_streams[i];
        if (!o->joined || o->graph != g) continue;
        unjoined |= o->joined_upto < o->cap_items;
        if (o->error && !error) error = o->error;
        o->capturing = o->joined = false;
        o->graph = NULL;
        left++;
    }
    q_unlock();
    pthread_mutex_lock(&tf_emu_mu);
    g_capturing -= left;
    pthread_mutex_unlock(&tf_emu_mu);
    if (error || unjoined) {
        graph_free(g);
        if (unjoined)
            return fail(STREAM_CAPTURE_UNJOINED, "cuStreamEndCapture: a stream that joined the capture was not waited for after its "
                                                 "last work (cudaErrorStreamCaptureUnjoined)");
        return fail(STREAM_CAPTURE_INVALIDATED, "the capture was invalidated by a failed call inside it");
    }
    pthread_mutex_lock(&tf_emu_mu);
    g_live_graphs++;
    pthread_mutex_unlock(&tf_emu_mu);
    *out = (tf_cu_graph)g;
    return OK;
}

/* An executable graph: its own copy of the recorded work. */
static tf_cu_result emu_instantiate(tf_cu_graph_exec *out, tf_cu_graph gg, unsigned long long flags)
{
    emu_graph *g = (emu_graph *)gg, *e = tf_calloc(1, sizeof *e);
    (void)flags;
    *out = NULL;
    if (!g) return fail(INVALID_HANDLE, "no graph");
    if (!e || !(e->w = tf_calloc((size_t)(g->n ? g->n : 1), sizeof *e->w))) {
        tf_free(e);
        return fail(OUT_OF_MEMORY, "out of host memory");
    }
    for (int i = 0; i < g->n; i++) {
        e->w[i] = g->w[i];
        e->w[i].arg = NULL;
    }
    e->n = e->cap = g->n;
    /* the work's arguments are copied: the graph may be destroyed before its executable */
    for (int i = 0; i < g->n; i++) {
        size_t bytes = g->w[i].bytes;
        if (!(e->w[i].arg = tf_malloc(bytes ? bytes : 1))) {
            graph_free(e);
            return fail(OUT_OF_MEMORY, "out of host memory");
        }
        memcpy(e->w[i].arg, g->w[i].arg, bytes);
    }
    pthread_mutex_lock(&tf_emu_mu);
    g_live_graphs++;
    pthread_mutex_unlock(&tf_emu_mu);
    *out = (tf_cu_graph_exec)e;
    return OK;
}

typedef struct graph_arg { emu_graph *e; } graph_arg;
static int run_graph(void *argp)
{
    emu_graph *e = ((graph_arg *)argp)->e;
    for (int i = 0; i < e->n; i++) {
        int r = e->w[i].fn(e->w[i].arg);
        if (r) return r;
    }
    return OK;
}

static tf_cu_result emu_graph_launch(tf_cu_graph_exec ge, tf_cu_stream s)
{
    emu_graph *e = (emu_graph *)ge;
    emu_stream *st = (emu_stream *)s;
    if (!e) return fail(INVALID_HANDLE, "no graph");
    if (st && st->capturing) return fail(NOT_SUPPORTED, "cuda-emu does not capture a graph launch into another graph");
    graph_arg a = {e};
    return tf_cuda_emu_submit(s, run_graph, &a, sizeof a);
}

static tf_cu_result graph_destroy(void *g)
{
    if (!g) return fail(INVALID_HANDLE, "no graph");
    graph_free(g);
    pthread_mutex_lock(&tf_emu_mu);
    g_live_graphs--;
    pthread_mutex_unlock(&tf_emu_mu);
    return OK;
}
static tf_cu_result emu_gexec_destroy(tf_cu_graph_exec e)
{
    tf_emu_flush_all();   /* a queued launch of it runs first */
    return graph_destroy(e);
}
static tf_cu_result emu_graph_destroy(tf_cu_graph g) { return graph_destroy(g); }

/* ---- what emu.c asks ----------------------------------------------------------------- */

int tf_emu_capturing(void) { return g_capturing; }

int tf_emu_live_queues(void) { return g_live_streams + g_live_events + g_live_graphs; }

void tf_emu_stream_fill(tf_cu_api *c)
{
    c->StreamCreate = emu_stream_create, c->StreamDestroy = emu_stream_destroy, c->StreamSynchronize = emu_stream_sync;
    c->EventCreate = emu_event_create, c->EventDestroy = emu_event_destroy, c->EventRecord = emu_event_record;
    c->EventElapsedTime = emu_event_elapsed;
    c->StreamWaitEvent = emu_stream_wait_event, c->EventSynchronize = emu_event_sync, c->EventQuery = emu_event_query;
    c->StreamBeginCapture = emu_begin_capture, c->StreamEndCapture = emu_end_capture, c->GraphInstantiate = emu_instantiate;
    c->GraphLaunch = emu_graph_launch, c->GraphExecDestroy = emu_gexec_destroy, c->GraphDestroy = emu_graph_destroy;
}
