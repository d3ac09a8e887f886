/* cpu_layout.c — convolution chains in oneDNN's blocked layout.
 *
 * A oneDNN convolution computes in nChw16c (channels in blocks of 16
 * innermost) and, given tfuse's NCHW, reorders every piece's images into
 * that layout and its results back. Between two convolutions the NCHW copy
 * is of no use to anyone, so the values that only convolutions and
 * generated elementwise kernels touch stay in nChw16c in memory, and the
 * convolutions read and write them as they are (bench/models/resnet.ir's
 * inference: 7.2-7.8 ms against 8.0-8.8 ms, bench/RESULTS.md).
 *
 * An elementwise kernel that touches such values, a convolution's epilogue
 * included, runs over the blocked index space [N, C/16, H*W, 16] instead of
 * its own (tf_kernel_blocked): it reads and writes the blocked values there,
 * reads the others (an NCHW image, a per-channel bias, a scalar) through
 * permuted strides, and computes the same values element for element. It
 * must store only blocked values: its stores write by the flat index, which
 * is then the blocked layout's offset.
 *
 * A value is kept blocked when it is a 4-d f32 activation of a multiple of
 * 16 channels, written by a convolution that can give nChw16c as it is or
 * by such an elementwise kernel, and read only by convolutions that can
 * take it as it is and by elementwise kernels that can be rebuilt; never an
 * input, an output, state or a view's operand. The largest such set is
 * found by starting from every candidate and dropping what breaks a rule
 * until nothing changes. Only inference: a training step's batch norms
 * reduce over the channels of these values, and reductions over the
 * blocked space ran at scalar speed (bench/RESULTS.md, 2026-11-29).
 * --cpu-conv-layout=plain (cpu_conv_plain) keeps every value in NCHW. */
#include <string.h>

#include "alloc.h"
#include "conv_dnnl.h"
#include "cpu_backend.h"

#ifdef TFUSE_HAVE_LLVM

enum { BLOCK = 16 };   /* nChw16c */

/* The value a convolution kernel's primitive writes: the epilogue's result
 * when the primitive writes that, else the convolution's own. */
static const tf_value *conv_result(const ckernel *ck)
{
    return ck->epi_in_conv ? ck->k->bufs[ck->epi_out].value : ck->k->lib->out;
}

/* A kernel whose generated code runs over its whole index space: an
 * elementwise kernel, or a convolution's epilogue kept out of the
 * primitive. */
static bool elementwise(const ckernel *ck)
{
    if (ck->how == RUN_JIT) return ck->k->kind == TF_K_ELEMENTWISE && ck->fn;
    return ck->how == RUN_CONV && ck->dnnl && !ck->epi_in_conv && ck->k->nexprs && ck->fn;
}

/* A 4-d f32 activation of a multiple of 16 channels, its own storage. */
static bool blockable(const tf_value *v)
{
    return v->kind == TF_VAL_NODE && root_of(v) == v && !v->home && v->type.dtype == TF_DT_F32 && v->type.rank == 4 &&
           v->type.dims[1].n % BLOCK == 0 && numel(v) > 0;
}

static bool is_blocked(const bool *blocked, const tf_value *v)
{
    return v && v->kind != TF_VAL_CONST && v->id >= 0 && blocked[root_of(v)->id];
}

/* Drop v (and say whether that changed anything). */
static bool drop(bool *blocked, const tf_value *v)
{
    if (!is_blocked(blocked, v)) return false;
    blocked[root_of(v)->id] = false;
    return true;
}

/* Kernel k over the blocked index space, its buffers blocked as `blocked`
 * says, into out: tf_kernel_blocked's 1, 0 (it cannot be, or a store is not
 * blocked) or -1 (out of memory). The logical shape is its first store's. */
static int relaid(const tf_kernel *k, const bool *blocked, bool *mask, tf_kernel *out)
{
    if (!k->nstores) return 0;
    const tf_value *v = k->bufs[k->stores[0].buf].value;
    if (v->type.rank != 4) return 0;
    for (int b = 0; b < k->nbufs; b++) mask[b] = is_blocked(blocked, k->bufs[b].value);
    const tf_dim *d = v->type.dims;
    return tf_kernel_blocked(k, mask, d[0].n, d[1].n, d[2].n * d[3].n, BLOCK, out);
}

/* Whether k can run over the blocked space (1, 0; -1: out of memory). */
static int relayable(const tf_kernel *k, const bool *blocked, bool *mask)
{
    tf_kernel t;
    int r = relaid(k, blocked, mask, &t);
    if (r > 0) tf_kernel_free(&t);
    return r;
}

/* One pass of the rules over every kernel: 1 when anything was dropped, 0
 * when nothing was, -1 when out of memory. */
static int enforce(cpu *c, bool *blocked, bool *mask)
{
    bool changed = false;
    for (int i = 0; i < c->plan->nkernels; i++) {
        const ckernel *ck = &c->ks[i];
        const tf_kernel *k = ck->k;
        const tf_value *x = NULL, *y = NULL;
        if (ck->how == RUN_CONV && ck->dnnl) {
            x = k->lib->in[0], y = conv_result(ck);
            if (!tf_dnnl_conv_blocked_ok(ck->dnnl, false)) changed |= drop(blocked, x);
            if (!tf_dnnl_conv_blocked_ok(ck->dnnl, true)) changed |= drop(blocked, y);
            for (int q = 1; q < k->lib->nin; q++) changed |= drop(blocked, k->lib->in[q]);
            if (!elementwise(ck)) {   /* the primitive is all it runs: nothing else it touches is an image */
                for (int b = 0; b < k->nbufs; b++)
                    if (k->bufs[b].value != x && k->bufs[b].value != y) changed |= drop(blocked, k->bufs[b].value);
                continue;
            }
        }
        if (elementwise(ck)) {
            /* over the blocked space when everything it stores is blocked, and it can be; else over its own, on NCHW:
             * then nothing it stores or loads is blocked (the convolution's result it reads included) */
            bool all = k->nstores > 0;
            for (int t = 0; t < k->nstores; t++) all = all && is_blocked(blocked, k->bufs[k->stores[t].buf].value);
            int r = all ? relayable(k, blocked, mask) : 0;
            if (r < 0) return -1;
            if (r) continue;
            for (int b = 0; b < k->nbufs; b++) changed |= drop(blocked, k->bufs[b].value);
            if (y) changed |= drop(blocked, y);
            continue;
        }
        for (int b = 0; b < k->nbufs; b++) changed |= drop(blocked, k->bufs[b].value);
        if (k->lib) {
            for (int q = 0; q < k->lib->nin; q++) changed |= drop(blocked, k->lib->in[q]);
            changed |= drop(blocked, k->lib->out);
        }
    }
    return changed;
}

/* The kernels that run over the blocked space, compiled; then the
 * convolutions and those kernels switched over. Nothing changes unless all
 * of it succeeds: out of memory is an error; a kernel LLVM does not compile
 * leaves every value in NCHW. */
static tf_status commit(tf_session_t *s, cpu *c, const bool *blocked, bool *mask)
{
    size_t n = (size_t)(c->plan->nkernels ? c->plan->nkernels : 1);   /* at most one each */
    tf_kernel *ks = tf_calloc(n, sizeof *ks);
    int *which = tf_calloc(n, sizeof *which);
    jit_req *rs = tf_calloc(n, sizeof *rs);
    tf_status st = ks && which && rs ? TF_OK : tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    int made = 0;
    for (int i = 0; !st && i < c->plan->nkernels; i++) {
        const ckernel *ck = &c->ks[i];
        int r = elementwise(ck) ? relaid(ck->k, blocked, mask, &ks[made]) : 0;
        if (r < 0) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        if (r <= 0) continue;
        which[made] = i;
        rs[made].slot = -1;
        rs[made].k = &ks[made];
        made++;
    }
    for (int i = 0; !st && i < made; i++) {
        tf_diag d;
        d.status = TF_IR_OK;
        if (tf_cpu_jit_lookup(c->cache, s->p->settings.llvm_pipeline, s->p->pkg, &rs[i], &d)) st = tf_from_diag(s->ctx, &d);
    }
    if (!st) tf_cpu_jit_compile_all(c->cache, c->pool, s->p->settings.llvm_pipeline, rs, made);
    bool good = !st;
    for (int i = 0; good && i < made; i++) {
        if (rs[i].st && (!rs[i].d || rs[i].d->status != TF_IR_ERR_RUNTIME))
            st = rs[i].d ? tf_from_diag(s->ctx, rs[i].d) : tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        good = !rs[i].st && rs[i].fn;
    }
    if (good) {
        for (int i = 0; i < made; i++) {
            ckernel *ck = &c->ks[which[i]];
            tf_cpu_jit_put(c->cache, ck->jit_slot);
            ck->jit_slot = rs[i].slot;
            rs[i].slot = -1;
            ck->fn = rs[i].fn;
            ck->k = &ks[i];
            int ax = tf_kernel_split_axis(ck->k);
            ck->extent = ax < 0 ? 1 : ck->k->dims[ax];
        }
        for (int i = 0; i < c->plan->nkernels; i++) {
            ckernel *ck = &c->ks[i];
            if (ck->how != RUN_CONV || !ck->dnnl) continue;
            if (is_blocked(blocked, ck->k->lib->in[0])) tf_dnnl_conv_take_blocked(ck->dnnl, false);
            if (is_blocked(blocked, conv_result(ck))) tf_dnnl_conv_take_blocked(ck->dnnl, true);
        }
        c->relaid = ks, c->nrelaid = made;
        ks = NULL;
    }
    for (int i = 0; rs && i < made; i++) {
        if (rs[i].slot >= 0) tf_cpu_jit_put(c->cache, rs[i].slot);
        tf_cpu_jit_req_free(&rs[i]);
    }
    for (int i = 0; ks && i < made; i++) tf_kernel_free(&ks[i]);
    tf_free(ks);
    tf_free(which);
    tf_free(rs);
    return st;
}

tf_status tf_cpu_plan_layouts(tf_session_t *s, cpu *c)
{
    const tf_module *m = s->p->m;
    if (s->p->mode != TF_IR_INFER || s->p->settings.cpu_conv_plain) return TF_OK;
    int V = m->next_id > 0 ? m->next_id : 1, most = 1;
    for (int i = 0; i < c->plan->nkernels; i++)
        if (c->plan->kernels[i].nbufs > most) most = c->plan->kernels[i].nbufs;
    bool *blocked = tf_calloc((size_t)V, sizeof *blocked), *mask = tf_calloc((size_t)most, sizeof *mask);
    tf_status st = blocked && mask ? TF_OK : tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    if (!st) {
        /* candidates: what a convolution or an elementwise kernel writes */
        for (int i = 0; i < c->plan->nkernels; i++) {
            const ckernel *ck = &c->ks[i];
            if (ck->how == RUN_CONV && ck->dnnl && blockable(conv_result(ck))) blocked[conv_result(ck)->id] = true;
            if (!elementwise(ck)) continue;
            for (int t = 0; t < ck->k->nstores; t++) {
                const tf_value *v = ck->k->bufs[ck->k->stores[t].buf].value;
                if (blockable(v)) blocked[v->id] = true;
            }
        }
        for (int i = 0; i < m->noutputs + m->nupdates; i++)
            drop(blocked, i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value);
        for (int i = 0; i < m->nodes.n; i++) {   /* a view's operand: the view reads it as NCHW */
            const tf_node *n = m->nodes.items[i];
            if (root_of(n->out) != n->out) drop(blocked, n->out);
        }
        int r;
        while ((r = enforce(c, blocked, mask)) > 0) {
        }
        st = r < 0 ? tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory") : commit(s, c, blocked, mask);
    }
    tf_free(blocked);
    tf_free(mask);
    return st;
}

#endif /* TFUSE_HAVE_LLVM */
