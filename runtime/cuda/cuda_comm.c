/* cuda_comm.c — the cuda target's allreduce kernels: data parallel's
 * gradient means through NCCL, on a stream of their own, while the
 * backward pass goes on (docs/distributed.md).
 *
 * The plan's allreduce kernels, in plan order, fill the buckets autodiff
 * numbered (the op's `bucket`), as on the cpu target (cpu_comm.c): each
 * copies its operand into its bucket's device buffer on the compute
 * stream; after the last member, an event orders the communication stream
 * after the packing, and ncclAllReduce(ncclAvg) averages the bucket in
 * place there. A kernel that reads a mean first makes the compute stream
 * wait for its buckets' ends and copies the means out; the step unpacks
 * every bucket before its updates. The two streams meet only through
 * events, so a step is captured as one CUDA graph, NCCL's calls in it
 * (the communication stream joins the capture by its first wait and
 * rejoins it by the last).
 *
 * NCCL's communicator is made once per tfuse communicator: rank 0's
 * ncclGetUniqueId, broadcast over it (MPI), then ncclCommInitRank. Without
 * NCCL (not found, TFUSE_CUDA_NCCL=0, or a job of one rank unless
 * TFUSE_CUDA_NCCL=1) an allreduce is a copy with one rank and runs on the
 * host with several (the interpreter's
 * kernel through the host communicator, outside any graph); --cuda-explain
 * says which and why. A plan that reads a mean before its bucket is
 * complete, or an allreduce of bucket -1 (synchronized batch norm), runs
 * each allreduce on its own, at once. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "cuda_session.h"
#include "env.h"
#include "emu.h"

typedef struct cbucket {
    tf_cu_deviceptr buf;   /* the members packed, averaged in place */
    int64_t elems;
    tf_dt dt;
    int nmembers, filled;
    struct member { tf_cu_deviceptr out; int64_t at, n; } *m;
    tf_cu_event packed, done;
    bool sent;             /* this step: submitted and not yet unpacked */
} cbucket;

struct cuda_comm {
    const tf_comm_t *for_comm;
    int size;
    bool nccl;             /* the means through NCCL */
    char why[400];         /* why not: --cuda-explain */
    tf_nccl_comm nc;
    tf_cu_stream cs;       /* the communication stream */
    tf_comm_plan plan;     /* buckets, members and readers (comm_plan.c, the cpu target's rules) */
    cbucket *b;
    int nbuckets;
    bool at_once;          /* each allreduce on its own: the plan's reason, or a dtype NCCL does not average */
    tf_cu_event fork, join;   /* an allreduce on its own */
};

static int nccl_type(tf_dt dt)
{
    switch (dt) {
    case TF_DT_F32: return TF_NCCL_FLOAT32;
    case TF_DT_F64: return TF_NCCL_FLOAT64;
    case TF_DT_F16: return TF_NCCL_FLOAT16;
    case TF_DT_BF16: return TF_NCCL_BFLOAT16;
    default: return -1;
    }
}

void tf_cuda_comm_free(cuda_session *c)
{
    struct cuda_comm *cc = c->comm;
    if (!cc) return;
    const tf_cu_api *cu = &c->libs.cu;
    if (cc->cs) cu->StreamSynchronize(cc->cs);
    for (int b = 0; b < cc->nbuckets; b++) {
        if (cc->b[b].buf) cu->MemFree(cc->b[b].buf), dev_count(c, -(int64_t)(cc->b[b].elems * tf_dtype_bytes(cc->b[b].dt)));
        if (cc->b[b].packed) cu->EventDestroy(cc->b[b].packed);
        if (cc->b[b].done) cu->EventDestroy(cc->b[b].done);
        tf_free(cc->b[b].m);
    }
    if (cc->fork) cu->EventDestroy(cc->fork);
    if (cc->join) cu->EventDestroy(cc->join);
    if (cc->nc) c->libs.nccl.CommDestroy(cc->nc);
    if (cc->cs) cu->StreamDestroy(cc->cs);
    tf_free(cc->b);
    tf_comm_plan_free(&cc->plan);
    tf_free(cc);
    c->comm = NULL;
}

bool tf_cuda_comm_on_host(const tf_session_t *s, const cuda_session *c)
{
    return tf_comm_size(s->comm) > 1 && !(c->comm && c->comm->nccl && c->comm->for_comm == s->comm);
}

/* The emulator's stand-in averages through the host communicator (emu_nccl.c). */
static int emu_mean(void *self, tf_dt dt, void *data, int64_t n, char *err, size_t nerr)
{
    tf_comm_t *comm = self;
    if (!tf_comm_mean(comm, dt, data, n)) return 0;
    snprintf(err, nerr, "%s", comm->err);
    return -1;
}

static tf_status nccl_fail(tf_session_t *s, cuda_session *c, int r, const char *what)
{
    const char *words = c->libs.nccl.GetErrorString ? c->libs.nccl.GetErrorString(r) : NULL;
    return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: cuda: NCCL: %s: %s (ncclResult %d)", what, words ? words : "no description", r);
}

/* NCCL's communicator for s->comm, or cc->why. Every rank takes the same
 * branch: whether NCCL loaded is agreed on first (a rank without it would
 * otherwise wait in the broadcast for ever). */
static tf_status open_nccl(tf_session_t *s, cuda_session *c, struct cuda_comm *cc)
{
    char err[1200] = "";
    if (tf_env("TFUSE_CUDA_NCCL") && !strcmp(tf_env("TFUSE_CUDA_NCCL"), "0"))
        snprintf(cc->why, sizeof cc->why, "TFUSE_CUDA_NCCL=0");
    else if (tf_cuda_libs_add(&c->libs, TF_CUDA_LIB_NCCL, &c->search, err, sizeof err))
        snprintf(cc->why, sizeof cc->why, "NCCL was not found: %.300s", err);
    else if (!c->emu && c->libs.nccl_version && c->libs.nccl_version < 21000)
        snprintf(cc->why, sizeof cc->why, "NCCL %d.%d has no ncclAvg (2.10 or later needed)", c->libs.nccl_version / 10000,
                 c->libs.nccl_version / 100 % 100);
    /* the ranks agree: every rank's answer, gathered */
    int have = cc->why[0] ? 0 : 1;
    int *all = tf_calloc((size_t)cc->size, sizeof *all);
    if (!all) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    if (tf_comm_gather_all(s->comm, &have, all, sizeof have)) {
        tf_free(all);
        return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: %s", s->comm->err);
    }
    int missing = -1;
    for (int r = 0; r < cc->size; r++)
        if (!all[r] && missing < 0) missing = r;
    tf_free(all);
    if (missing >= 0) {
        if (have) snprintf(cc->why, sizeof cc->why, "rank %d has no NCCL: every rank averages on the host", missing);
        return TF_OK;
    }
    tf_nccl_unique_id id;
    memset(&id, 0, sizeof id);
    int r = s->comm->rank == 0 ? c->libs.nccl.GetUniqueId(&id) : 0;
    if (r) return nccl_fail(s, c, r, "ncclGetUniqueId");
    tf_status st = tf_comm_broadcast(s->ctx, s->comm, &id, sizeof id, 0);
    if (st) return st;
    if (c->emu) tf_cuda_emu_nccl_use(s->comm, s->comm->rank, s->comm->size, emu_mean);
    r = c->libs.nccl.CommInitRank(&cc->nc, cc->size, id, s->comm->rank);
    if (r) return nccl_fail(s, c, r, "ncclCommInitRank");
    CU_DO("creating the communication stream", StreamCreate(&cc->cs, CU_STREAM_NON_BLOCKING));
    CU_DO("creating the all-reduce events", EventCreate(&cc->fork, CU_EVENT_DISABLE_TIMING));
    CU_DO("creating the all-reduce events", EventCreate(&cc->join, CU_EVENT_DISABLE_TIMING));
    cc->nccl = true;
    return TF_OK;
}

/* The buckets (comm_plan.c's plan), each a device buffer and two events. */
static tf_status plan_buckets(tf_session_t *s, cuda_session *c, struct cuda_comm *cc)
{
    const tf_kernel_plan *P = c->plan;
    int K = P->nkernels;
    bool *in_bucket = tf_malloc((size_t)(K ? K : 1) * sizeof *in_bucket);
    if (!in_bucket) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory for the all-reduce buckets");
    for (int i = 0; i < K; i++) in_bucket[i] = c->ks[i].how == RUN_ALLREDUCE;
    int st = tf_comm_plan_make(P, s->p->m->next_id, in_bucket, &cc->plan);
    tf_free(in_bucket);
    if (st) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory for the all-reduce buckets");
    const tf_comm_plan *cp = &cc->plan;
    cc->nbuckets = cp->nbuckets;
    cc->at_once = cp->at_once;
    for (int b = 0; b < cp->nbuckets; b++)
        if (cp->members[b] && nccl_type(cp->dt[b]) < 0) cc->at_once = true;
    cc->b = tf_calloc((size_t)(cc->nbuckets ? cc->nbuckets : 1), sizeof *cc->b);
    if (!cc->b) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory for the all-reduce buckets");
    for (int b = 0; b < cc->nbuckets && !cc->at_once; b++) {
        cbucket *B = &cc->b[b];
        if (!cp->members[b]) continue;
        B->dt = cp->dt[b];
        B->elems = cp->elems[b];
        B->nmembers = cp->members[b];
        if (!(B->m = tf_calloc((size_t)cp->members[b], sizeof *B->m)))
            return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory for the all-reduce buckets");
        size_t bytes = (size_t)B->elems * (size_t)tf_dtype_bytes(B->dt);
        CU_DO("allocating an all-reduce bucket", MemAlloc(&B->buf, bytes ? bytes : 1));
        dev_count(c, (int64_t)bytes);
        CU_DO("creating the all-reduce events", EventCreate(&B->packed, CU_EVENT_DISABLE_TIMING));
        CU_DO("creating the all-reduce events", EventCreate(&B->done, CU_EVENT_DISABLE_TIMING));
    }
    for (int i = 0; i < K && !cc->at_once; i++)
        if (cp->bucket_of[i] >= 0) {
            const tf_value *out = P->kernels[i].lib->out;
            cc->b[cp->bucket_of[i]].m[cp->member_of[i]] = (struct member){dev_of(c, out), cp->at[i], numel(out)};
        }
    return TF_OK;
}

tf_status tf_cuda_comm_prepare(tf_session_t *s, cuda_session *c)
{
    if (c->comm && c->comm->for_comm == s->comm) return TF_OK;
    bool any = false;
    for (int i = 0; i < c->plan->nkernels && !any; i++) any = c->ks[i].how == RUN_ALLREDUCE;
    if (!any && !c->comm) return TF_OK;
    if (c->comm) c->libs.cu.StreamSynchronize(c->stream);   /* a step in flight may still use the old buckets and graph */
    tf_cuda_comm_free(c);
    struct cuda_comm *cc = c->comm = tf_calloc(1, sizeof *cc);
    if (!cc) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    cc->for_comm = s->comm;
    cc->size = tf_comm_size(s->comm);
    tf_status st = TF_OK;
    /* TFUSE_CUDA_NCCL=1: NCCL even for a job of one rank (mpirun -np 1), to measure what its calls cost */
    const char *env = tf_env("TFUSE_CUDA_NCCL");
    if (cc->size > 1 || (s->comm && env && !strcmp(env, "1"))) {
        st = open_nccl(s, c, cc);
        if (!st && cc->nccl) st = plan_buckets(s, c, cc);
    } else {
        snprintf(cc->why, sizeof cc->why, "one rank: each allreduce is a copy");
    }
    /* a graph made for another communicator (or none) is not this one's */
    if (c->graph.exec) c->libs.cu.GraphExecDestroy(c->graph.exec);
    c->graph.exec = NULL;
    c->graph.why[0] = 0;
    tf_cuda_plan_steps(s, c);
    if (st) tf_cuda_comm_free(c);
    else if (s->p->settings.cuda_explain) tf_cuda_comm_explain(tf_context_diag(s->ctx), s, c);
    return st;
}

/* The compute stream's work so far, then `then` on the communication stream (fork). */
static tf_status fork_to(tf_session_t *s, cuda_session *c, tf_cu_event e)
{
    struct cuda_comm *cc = c->comm;
    CU_DO("ordering an all-reduce after its gradients", EventRecord(e, c->stream));
    CU_DO("ordering an all-reduce after its gradients", StreamWaitEvent(cc->cs, e, 0));
    return TF_OK;
}

static tf_status all_reduce(tf_session_t *s, cuda_session *c, tf_cu_deviceptr p, int64_t n, tf_dt dt)
{
    struct cuda_comm *cc = c->comm;
    int r = c->libs.nccl.AllReduce((const void *)(uintptr_t)p, (void *)(uintptr_t)p, (size_t)n, nccl_type(dt), TF_NCCL_AVG, cc->nc, cc->cs);
    return r ? nccl_fail(s, c, r, "ncclAllReduce") : TF_OK;
}

tf_status tf_cuda_run_allreduce(tf_session_t *s, cuda_session *c, int i)
{
    const tf_node *n = c->plan->kernels[i].lib;
    const tf_value *x = n->in[0], *y = n->out;
    tf_cu_deviceptr in = dev_of(c, x), out = dev_of(c, y);
    struct cuda_comm *cc = c->comm;
    if (!cc || !cc->nccl) {   /* one rank: the mean is the value */
        if (in != out && out) CU_DO("an allreduce of one rank", MemcpyDtoDAsync(out, in, value_bytes(y), c->stream));
        return TF_OK;
    }
    tf_status st;
    int b = cc->plan.bucket_of[i];
    if (cc->at_once || b < 0) {   /* on its own: in place in its result, the compute stream waits */
        if (in != out) CU_DO("an allreduce's operand", MemcpyDtoDAsync(out, in, value_bytes(y), c->stream));
        if ((st = fork_to(s, c, cc->fork)) || (st = all_reduce(s, c, out, numel(y), y->type.dtype))) return st;
        CU_DO("waiting for an allreduce", EventRecord(cc->join, cc->cs));
        CU_DO("waiting for an allreduce", StreamWaitEvent(c->stream, cc->join, 0));
        return TF_OK;
    }
    cbucket *B = &cc->b[b];
    const int j = cc->plan.member_of[i];
    size_t es = (size_t)tf_dtype_bytes(B->dt);
    CU_DO("packing a gradient into its bucket", MemcpyDtoDAsync(B->buf + (tf_cu_deviceptr)((size_t)B->m[j].at * es), in, value_bytes(y),
                                                                 c->stream));
    if (++B->filled < B->nmembers) return TF_OK;
    B->filled = 0;
    if ((st = fork_to(s, c, B->packed)) || (st = all_reduce(s, c, B->buf, B->elems, B->dt))) return st;
    CU_DO("marking a bucket's end", EventRecord(B->done, cc->cs));
    B->sent = true;
    return TF_OK;
}

/* The compute stream waits for bucket b, and copies its means out (join). */
static tf_status unpack(tf_session_t *s, cuda_session *c, int b)
{
    cbucket *B = &c->comm->b[b];
    B->sent = false;
    CU_DO("waiting for a bucket's mean", StreamWaitEvent(c->stream, B->done, 0));
    size_t es = (size_t)tf_dtype_bytes(B->dt);
    for (int j = 0; j < B->nmembers; j++)
        if (B->m[j].out)
            CU_DO("unpacking a bucket's means", MemcpyDtoDAsync(B->m[j].out, B->buf + (tf_cu_deviceptr)((size_t)B->m[j].at * es),
                                                                (size_t)B->m[j].n * es, c->stream));
    return TF_OK;
}

tf_status tf_cuda_comm_before(tf_session_t *s, cuda_session *c, int i)
{
    struct cuda_comm *cc = c->comm;
    if (!cc || !cc->nccl || cc->at_once || cc->plan.needs[i] < 0) return TF_OK;
    tf_status st;
    for (int b = 0; b <= cc->plan.needs[i]; b++)
        if (cc->b[b].sent && (st = unpack(s, c, b))) return st;
    return TF_OK;
}

tf_status tf_cuda_comm_finish(tf_session_t *s, cuda_session *c)
{
    struct cuda_comm *cc = c->comm;
    if (!cc || !cc->nccl || cc->at_once) return TF_OK;
    tf_status st = TF_OK;
    for (int b = 0; b < cc->nbuckets; b++) {
        if (cc->b[b].sent && !st) st = unpack(s, c, b);
        cc->b[b].sent = false;
        cc->b[b].filled = 0;   /* a step that failed half way packed some */
    }
    return st;
}

tf_cu_result tf_cuda_comm_sync(tf_session_t *s, cuda_session *c, tf_cu_event e)
{
    struct cuda_comm *cc = c->comm;
    if (!cc || !cc->nccl || c->emu) return c->libs.cu.EventSynchronize(e);
    double limit = s->comm->timeout_s;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        tf_cu_result r = c->libs.cu.EventQuery(e);
        if (r != CUDA_ERROR_NOT_READY) return r;
        int async = 0;
        if (!c->libs.nccl.CommGetAsyncError(cc->nc, &async) && async && async != TF_NCCL_IN_PROGRESS) {
            c->libs.nccl.CommAbort(cc->nc);
            cc->nc = NULL;
            snprintf(c->err, sizeof c->err, "rank %d: NCCL failed: %s", s->comm->rank, c->libs.nccl.GetErrorString(async));
            return TF_CUDA_COMM_FAILED;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        double waited = (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
        if (limit > 0 && waited > limit) {
            c->libs.nccl.CommAbort(cc->nc);
            cc->nc = NULL;
            snprintf(c->err, sizeof c->err, "rank %d: the step's all-reduce did not complete within %.0f s: a rank has died or hangs "
                     "(TFUSE_COMM_TIMEOUT)", s->comm->rank, limit);
            return TF_CUDA_COMM_FAILED;
        }
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

void tf_cuda_comm_count(tf_session_t *s, const cuda_session *c)
{
    const struct cuda_comm *cc = c->comm;
    if (!cc || !cc->nccl || c->emu) return;   /* the stand-in averages through the host communicator, which counts */
    int64_t bytes = 0;
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->ks[i].how == RUN_ALLREDUCE) bytes += (int64_t)value_bytes(c->plan->kernels[i].lib->out);
    pthread_mutex_lock(&s->comm->mu);
    s->comm->bytes_reduced += bytes;
    s->comm->bytes_nccl += bytes;
    pthread_mutex_unlock(&s->comm->mu);
}

const char *tf_cuda_comm_why(const cuda_session *c) { return c->comm ? c->comm->why : ""; }

void tf_cuda_comm_explain(FILE *f, const tf_session_t *s, const cuda_session *c)
{
    const struct cuda_comm *cc = c->comm;
    if (!cc) return;
    if (cc->nccl) {
        int64_t bytes = 0;
        for (int b = 0; b < cc->nbuckets; b++) bytes += cc->b[b].elems * tf_dtype_bytes(cc->b[b].dt);
        fprintf(f, "cuda: allreduce: NCCL (%s) over %d ranks, rank %d; %d buckets, %lld bytes, on a stream of their own%s; %s%s\n",
                c->libs.nccl_path, cc->size, tf_comm_rank(s->comm), cc->nbuckets, (long long)bytes,
                cc->at_once ? "; each allreduce on its own, at once (the plan reads a mean before its bucket is complete)" : "",
                c->graph.on ? "each step one CUDA graph, NCCL's calls in it" : "steps launched kernel by kernel: ",
                c->graph.on ? "" : c->graph.why);
    } else {
        fprintf(f, "cuda: allreduce: %s (%s)\n", cc->size > 1 ? "on the host, through the job's communicator" : "a copy", cc->why);
    }
}
