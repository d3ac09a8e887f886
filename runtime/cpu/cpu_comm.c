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
    tf_comm_bucket *buckets;
    int nbuckets;
    int *bucket_of;        /* per plan kernel: its bucket (an allreduce), else -1 */
    int *member_of;        /* per plan kernel: its index among its bucket's members */
    int *needs;            /* per plan kernel: the last bucket whose means it reads, else -1 */
    int *submitted;        /* per bucket, this step: 1 sent, 2 waited for */
    bool at_once;          /* each allreduce on its own (see above) */
};

void tf_cpu_comm_free(cpu *c)
{
    struct cpu_comm *cc = c->comm;
    if (!cc) return;
    for (int b = 0; b < cc->nbuckets; b++) tf_comm_bucket_free(&cc->buckets[b]);
    tf_free(cc->buckets), tf_free(cc->bucket_of), tf_free(cc->member_of), tf_free(cc->needs), tf_free(cc->submitted);
    tf_free(cc);
    c->comm = NULL;
}

/* The bucket a value's storage gets its mean from, or -1. */
static int mean_bucket_of(const struct cpu_comm *cc, const int *bucket_of_value, const tf_value *v)
{
    (void)cc;
    const tf_value *r = root_of(v);
    return r->kind == TF_VAL_NODE && r->id >= 0 ? bucket_of_value[r->id] : -1;
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
    int K = P->nkernels, V = m->next_id > 0 ? m->next_id : 1, nb = 0;
    cc->bucket_of = tf_malloc((size_t)(K ? K : 1) * sizeof *cc->bucket_of);
    cc->member_of = tf_calloc((size_t)(K ? K : 1), sizeof *cc->member_of);
    cc->needs = tf_malloc((size_t)(K ? K : 1) * sizeof *cc->needs);
    int *of_value = tf_malloc((size_t)V * sizeof *of_value);
    if (!cc->bucket_of || !cc->member_of || !cc->needs || !of_value) {
        tf_free(of_value);
        return oom(s, c);
    }
    for (int v = 0; v < V; v++) of_value[v] = -1;
    for (int i = 0; i < K; i++) {
        const tf_node *n = P->kernels[i].lib;
        cc->bucket_of[i] = c->ks[i].how == RUN_ALLREDUCE && n->op == TF_OP_ALLREDUCE ? (int)tf_node_int(n, "bucket") : -1;
        if (cc->bucket_of[i] >= nb) nb = cc->bucket_of[i] + 1;
        if (cc->bucket_of[i] >= 0) of_value[n->out->id] = cc->bucket_of[i];
    }
    cc->nbuckets = nb;
    cc->buckets = tf_calloc((size_t)(nb ? nb : 1), sizeof *cc->buckets);
    cc->submitted = tf_calloc((size_t)(nb ? nb : 1), sizeof *cc->submitted);
    int64_t *elems = tf_calloc((size_t)(nb ? nb : 1), sizeof *elems);
    int *members = tf_calloc((size_t)(nb ? nb : 1), sizeof *members), *last = tf_malloc((size_t)(nb ? nb : 1) * sizeof *last);
    tf_dt *dt = tf_calloc((size_t)(nb ? nb : 1), sizeof *dt);
    if (!cc->buckets || !cc->submitted || !elems || !members || !last || !dt) {
        tf_free(of_value), tf_free(elems), tf_free(members), tf_free(last), tf_free(dt);
        return oom(s, c);
    }
    for (int b = 0; b < nb; b++) last[b] = -1;
    for (int i = 0; i < K; i++) {
        int b = cc->bucket_of[i];
        if (b < 0) continue;
        const tf_value *out = P->kernels[i].lib->out;
        if (members[b] && dt[b] != out->type.dtype) cc->at_once = true;   /* not autodiff's: one dtype per bucket */
        dt[b] = out->type.dtype;
        cc->member_of[i] = members[b]++;
        elems[b] += numel(out);
        last[b] = i;
    }
    /* who reads a mean: the last bucket it needs, which must have been sent by then */
    for (int i = 0; i < K; i++) {
        cc->needs[i] = -1;
        const tf_kernel *k = &P->kernels[i];
        for (int q = 0; q < k->nbufs; q++) {
            int b = k->bufs[q].written ? -1 : mean_bucket_of(cc, of_value, k->bufs[q].value);
            if (b < 0 || cc->bucket_of[i] >= 0) continue;
            if (last[b] > i) cc->at_once = true;
            if (b > cc->needs[i]) cc->needs[i] = b;
        }
    }
    for (int b = 0; b < nb && !cc->at_once; b++) {
        if (members[b] == 0) continue;
        if (tf_comm_bucket_init(s->comm, &cc->buckets[b], dt[b], elems[b], members[b])) {
            tf_free(of_value), tf_free(elems), tf_free(members), tf_free(last), tf_free(dt);
            return oom(s, c);
        }
        cc->buckets[b].nmembers = 0;   /* counted again as they are placed */
    }
    for (int i = 0; i < K && !cc->at_once; i++) {
        int b = cc->bucket_of[i];
        if (b < 0) continue;
        tf_comm_bucket *B = &cc->buckets[b];
        const tf_value *out = P->kernels[i].lib->out;
        int j = B->nmembers++;
        B->members[j].out = storage(c, out);
        B->members[j].at = j ? B->members[j - 1].at + B->members[j - 1].n : 0;
        B->members[j].n = numel(out);
    }
    tf_free(of_value), tf_free(elems), tf_free(members), tf_free(last), tf_free(dt);
    if (cc->at_once)
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
    if (cc->at_once || cc->bucket_of[i] < 0) {
        if (in != out) memmove(out, in, value_bytes(y));
        return tf_comm_mean(s->comm, y->type.dtype, out, numel(y)) ? comm_failed(s) : TF_OK;
    }
    tf_comm_bucket *B = &cc->buckets[cc->bucket_of[i]];
    const int j = cc->member_of[i];
    memcpy(B->pack + (size_t)B->members[j].at * (size_t)tf_dtype_bytes(y->type.dtype), in, value_bytes(y));
    if (++B->filled < B->nmembers) return TF_OK;
    B->filled = 0;
    cc->submitted[cc->bucket_of[i]] = 1;
    return tf_comm_submit(s->comm, B) ? comm_failed(s) : TF_OK;
}

/* Wait for every sent bucket up to `upto` (-1: none; INT_MAX: all). */
static tf_status wait_upto(tf_session_t *s, cpu *c, int upto)
{
    struct cpu_comm *cc = c->comm;
    tf_status st = TF_OK;
    for (int b = 0; b < cc->nbuckets && b <= upto; b++)
        if (cc->submitted[b] == 1) {
            cc->submitted[b] = 2;
            if (tf_comm_wait(s->comm, &cc->buckets[b]) && !st) st = comm_failed(s);
        }
    return st;
}

tf_status tf_cpu_comm_before(tf_session_t *s, cpu *c, int i)
{
    struct cpu_comm *cc = c->comm;
    if (!cc || cc->at_once || cc->for_comm != s->comm || cc->needs[i] < 0) return TF_OK;
    return wait_upto(s, c, cc->needs[i]);
}

tf_status tf_cpu_comm_finish(tf_session_t *s, cpu *c)
{
    struct cpu_comm *cc = c->comm;
    if (!cc || cc->at_once || cc->for_comm != s->comm) return TF_OK;
    tf_status st = wait_upto(s, c, cc->nbuckets);
    memset(cc->submitted, 0, (size_t)cc->nbuckets * sizeof *cc->submitted);
    for (int b = 0; b < cc->nbuckets; b++) cc->buckets[b].filled = 0;   /* a step that failed half way packed some */
    return st;
}

#endif
