/* comm_plan.c — the bucket plan of a program's allreduce kernels, the rules
 * the cpu target (cpu/cpu_comm.c) and the cuda target (cuda/cuda_comm.c)
 * share: autodiff numbered the buckets (the op's `bucket`); each kernel
 * fills its bucket in plan order; a kernel that reads a mean (directly or
 * through a view) needs every bucket up to the last one it reads; and a
 * plan in which such a reader comes before the last member of a bucket it
 * needs, or a bucket mixes dtypes, runs each allreduce on its own, at once. */
#include "comm.h"

#include "alloc.h"
#include "kernel.h"

void tf_comm_plan_free(tf_comm_plan *p)
{
    tf_free(p->bucket_of), tf_free(p->member_of), tf_free(p->needs), tf_free(p->at), tf_free(p->members), tf_free(p->elems),
        tf_free(p->dt);
    *p = (tf_comm_plan){0};
}

int tf_comm_plan_make(const struct tf_kernel_plan *P, int nvalues, const bool *in_bucket, tf_comm_plan *cp)
{
    *cp = (tf_comm_plan){0};
    int K = P->nkernels, V = nvalues > 0 ? nvalues : 1, nb = 0;
    cp->bucket_of = tf_malloc((size_t)(K ? K : 1) * sizeof *cp->bucket_of);
    cp->member_of = tf_calloc((size_t)(K ? K : 1), sizeof *cp->member_of);
    cp->needs = tf_malloc((size_t)(K ? K : 1) * sizeof *cp->needs);
    cp->at = tf_calloc((size_t)(K ? K : 1), sizeof *cp->at);
    int *of_value = tf_malloc((size_t)V * sizeof *of_value), *last = NULL;
    if (!cp->bucket_of || !cp->member_of || !cp->needs || !cp->at || !of_value) goto oom;
    for (int v = 0; v < V; v++) of_value[v] = -1;
    for (int i = 0; i < K; i++) {
        const tf_node *n = P->kernels[i].lib;
        cp->bucket_of[i] = in_bucket[i] && n && n->op == TF_OP_ALLREDUCE ? (int)tf_node_int(n, "bucket") : -1;
        if (cp->bucket_of[i] >= nb) nb = cp->bucket_of[i] + 1;
        if (cp->bucket_of[i] >= 0 && n->out->id >= 0 && n->out->id < V) of_value[n->out->id] = cp->bucket_of[i];
    }
    cp->nbuckets = nb;
    size_t B = (size_t)(nb ? nb : 1);
    cp->members = tf_calloc(B, sizeof *cp->members);
    cp->elems = tf_calloc(B, sizeof *cp->elems);
    cp->dt = tf_calloc(B, sizeof *cp->dt);
    last = tf_malloc(B * sizeof *last);
    if (!cp->members || !cp->elems || !cp->dt || !last) goto oom;
    for (int b = 0; b < nb; b++) last[b] = -1;
    for (int i = 0; i < K; i++) {
        int b = cp->bucket_of[i];
        if (b < 0) continue;
        const tf_value *out = P->kernels[i].lib->out;
        if (cp->members[b] && cp->dt[b] != out->type.dtype) cp->at_once = true;   /* not autodiff's: one dtype per bucket */
        cp->dt[b] = out->type.dtype;
        cp->member_of[i] = cp->members[b]++;
        cp->at[i] = cp->elems[b];
        cp->elems[b] += tf_type_numel(&out->type);
        last[b] = i;
    }
    /* who reads a mean: the last bucket it needs, which must have been sent by then */
    for (int i = 0; i < K; i++) {
        cp->needs[i] = -1;
        const tf_kernel *k = &P->kernels[i];
        for (int q = 0; q < k->nbufs; q++) {
            const tf_value *r = tf_value_storage(k->bufs[q].value);
            int b = k->bufs[q].written || r->kind != TF_VAL_NODE || r->id < 0 || r->id >= V ? -1 : of_value[r->id];
            if (b < 0 || cp->bucket_of[i] >= 0) continue;
            if (last[b] > i) cp->at_once = true;
            if (b > cp->needs[i]) cp->needs[i] = b;
        }
    }
    tf_free(of_value), tf_free(last);
    return 0;
oom:
    tf_free(of_value), tf_free(last);
    tf_comm_plan_free(cp);
    return -1;
}
