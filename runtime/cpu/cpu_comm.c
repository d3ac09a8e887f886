/* cpu_comm.c — the cpu target's allreduce kernels: buckets sent while the
 * backward pass goes on (runtime/comm.c does the sending).
 *
 * The plan's allreduce kernels, in plan order, fill the buckets autodiff
 * numbered (the op's `bucket`): each copies its operand into its bucket's
 * pack, and the last member of a bucket submits it to the communication
 * thread. A kernel that reads a mean (directly or through a view) first
 * waits for the buckets up to its own; the step waits for every bucket
 * before it writes state. A plan in which a reader came before the last
 * member of the bucket it needs would wait for a bucket never sent: such a
 * plan runs each allreduce on its own, at once, and --cpu-explain says so.
 * An allreduce of bucket -1 (synchronized batch norm's statistics, which the
 * next op reads) runs on its own, at once, always. With one rank (or no
 * communicator) an allreduce copies. */
#include <string.h>

#include "comm.h"
#include "cpu_backend.h"

#ifdef TFUSE_HAVE_LLVM

struct cpu_comm {
    const tf_comm_t *for_comm;   /* the communicator this plan was made for */
    tf_comm_plan plan;     /* buckets, members and readers (comm_plan.c) */
    tf_comm_bucket *buckets;
    int *submitted;        /* per bucket, this step: 1 sent, 2 waited for */
};

void tf_cpu_comm_free(cpu *c)
{
    struct cpu_comm *cc = c->comm;
    if (!cc) return;
    for (int b = 0; cc->buckets && b < cc->plan.nbuckets; b++) tf_comm_bucket_free(&cc->buckets[b]);
    tf_free(cc->buckets), tf_free(cc->submitted);
    tf_comm_plan_free(&cc->plan);
    tf_free(cc);
    c->comm = NULL;
}

static tf_status oom(tf_session_t *s, cpu *c)
{
    tf_cpu_comm_free(c);
    return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory for the all-reduce buckets");
}

/* Make the plan's buckets for s->comm (once per communicator). */
static tf_status prepare(tf_session_t *s, cpu *c)
{
    if (c->comm && c->comm->for_comm == s->comm) return TF_OK;
    tf_cpu_comm_free(c);
    const tf_kernel_plan *P = c->plan;
    const tf_module *m = s->p->m;
    struct cpu_comm *cc = c->comm = tf_calloc(1, sizeof *cc);
    if (!cc) return oom(s, c);
    cc->for_comm = s->comm;
    int K = P->nkernels;
    bool *in_bucket = tf_malloc((size_t)(K ? K : 1) * sizeof *in_bucket);
    if (!in_bucket) return oom(s, c);
    for (int i = 0; i < K; i++) in_bucket[i] = c->ks[i].how == RUN_ALLREDUCE;
    int st = tf_comm_plan_make(P, m->next_id, in_bucket, &cc->plan);
    tf_free(in_bucket);
    if (st) return oom(s, c);
    const tf_comm_plan *cp = &cc->plan;
    int nb = cp->nbuckets;
    cc->buckets = tf_calloc((size_t)(nb ? nb : 1), sizeof *cc->buckets);
    cc->submitted = tf_calloc((size_t)(nb ? nb : 1), sizeof *cc->submitted);
    if (!cc->buckets || !cc->submitted) return oom(s, c);
    for (int b = 0; b < nb && !cp->at_once; b++)
        if (cp->members[b] && tf_comm_bucket_init(s->comm, &cc->buckets[b], cp->dt[b], cp->elems[b], cp->members[b])) return oom(s, c);
    for (int i = 0; i < K && !cp->at_once; i++)
        if (cp->bucket_of[i] >= 0) {
            const tf_value *out = P->kernels[i].lib->out;
            cc->buckets[cp->bucket_of[i]].members[cp->member_of[i]].out = storage(c, out);
            cc->buckets[cp->bucket_of[i]].members[cp->member_of[i]].at = cp->at[i];
            cc->buckets[cp->bucket_of[i]].members[cp->member_of[i]].n = numel(out);
        }
    if (cp->at_once)
        fprintf(tf_context_diag(s->ctx), "tfuse: cpu: the plan reads a gradient's mean before its bucket is complete: "
                                         "each allreduce runs on its own, at once (no overlap)\n");
    return TF_OK;
}

static tf_status comm_failed(tf_session_t *s)
{
    return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: %s", s->comm->err[0] ? s->comm->err : "an all-reduce failed");
}

/* shard (this rank's chunk of the flat value, zeros past its end) and
 * allgather (every rank's chunk, the whole value again): ZeRO-1's. */
static tf_status run_shard_gather(tf_session_t *s, cpu *c, const tf_node *n)
{
    int rank = s->comm ? s->comm->rank : 0, size = s->comm ? s->comm->size : 1;
    int64_t want = tf_node_int(n, "ranks");
    if (size != want) {   /* at the op's place, as the interpreter says it */
        tf_diag d = {0};
        tf_diag_error(&d, TF_IR_ERR_RUNTIME, &n->loc, "%s: compiled for %lld ranks (shard_optimizer), and the session's job "
                      "has %d (tf_session_set_comm)", tf_op_info_of(n->op)->name, (long long)want, size);
        return tf_from_diag(s->ctx, &d);
    }
    const tf_value *x = n->in[0], *y = n->out;
    size_t es = (size_t)tf_dtype_bytes(y->type.dtype);
    unsigned char *in = storage(c, x), *out = storage(c, y);
    if (n->op == TF_OP_SHARD) {
        int64_t from = (int64_t)rank * numel(y), have = numel(x) - from;
        have = have < 0 ? 0 : have > numel(y) ? numel(y) : have;
        if (have) memmove(out, in + (size_t)from * es, (size_t)have * es);
        memset(out + (size_t)have * es, 0, (size_t)(numel(y) - have) * es);
        return TF_OK;
    }
    if (size == 1) {
        if (in != out) memmove(out, in, value_bytes(y));
        return TF_OK;
    }
    unsigned char *all = tf_malloc((size_t)numel(x) * (size_t)size * es);
    if (!all) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory for an all-gather");
    int st = tf_comm_gather(s->comm, y->type.dtype, in, numel(x), all);
    if (!st) memcpy(out, all, value_bytes(y));
    tf_free(all);
    return st ? comm_failed(s) : TF_OK;
}

tf_status tf_cpu_run_allreduce(tf_session_t *s, cpu *c, int i)
{
    const tf_node *n = c->plan->kernels[i].lib;
    if (n->op != TF_OP_ALLREDUCE) return run_shard_gather(s, c, n);
    const tf_value *x = n->in[0], *y = n->out;
    void *in = storage(c, x), *out = storage(c, y);
    if (!s->comm || s->comm->size == 1) {
        if (in != out) memmove(out, in, value_bytes(y));
        return TF_OK;
    }
    tf_status st = prepare(s, c);
    if (st) return st;
    struct cpu_comm *cc = c->comm;
    if (cc->plan.at_once || cc->plan.bucket_of[i] < 0) {
        if (in != out) memmove(out, in, value_bytes(y));
        return tf_comm_mean(s->comm, y->type.dtype, out, numel(y)) ? comm_failed(s) : TF_OK;
    }
    tf_comm_bucket *B = &cc->buckets[cc->plan.bucket_of[i]];
    const int j = cc->plan.member_of[i];
    memcpy(B->pack + (size_t)B->members[j].at * (size_t)tf_dtype_bytes(y->type.dtype), in, value_bytes(y));
    if (++B->filled < B->nmembers) return TF_OK;
    B->filled = 0;
    cc->submitted[cc->plan.bucket_of[i]] = 1;
    return tf_comm_submit(s->comm, B) ? comm_failed(s) : TF_OK;
}

/* Wait for every sent bucket up to `upto` (-1: none; INT_MAX: all). */
static tf_status wait_upto(tf_session_t *s, cpu *c, int upto)
{
    struct cpu_comm *cc = c->comm;
    tf_status st = TF_OK;
    for (int b = 0; b < cc->plan.nbuckets && b <= upto; b++)
        if (cc->submitted[b] == 1) {
            cc->submitted[b] = 2;
            if (tf_comm_wait(s->comm, &cc->buckets[b]) && !st) st = comm_failed(s);
        }
    return st;
}

tf_status tf_cpu_comm_before(tf_session_t *s, cpu *c, int i)
{
    struct cpu_comm *cc = c->comm;
    if (!cc || cc->plan.at_once || cc->for_comm != s->comm || cc->plan.needs[i] < 0) return TF_OK;
    return wait_upto(s, c, cc->plan.needs[i]);
}

tf_status tf_cpu_comm_finish(tf_session_t *s, cpu *c)
{
    struct cpu_comm *cc = c->comm;
    if (!cc || cc->plan.at_once || cc->for_comm != s->comm) return TF_OK;
    tf_status st = wait_upto(s, c, cc->plan.nbuckets);
    memset(cc->submitted, 0, (size_t)cc->plan.nbuckets * sizeof *cc->submitted);
    for (int b = 0; b < cc->plan.nbuckets; b++) cc->buckets[b].filled = 0;   /* a step that failed half way packed some */
    return st;
}

#endif
