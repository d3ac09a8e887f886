/* cuda_gemm_backward.c — the backward pass's GEMM epilogues for the cuda
 * target: a weight gradient's bias gradient and ReLU's backward handed to
 * cuBLASLt, the kernels they replace not run (the matching below). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_session.h"

/* ---- backward epilogues: bias gradients and ReLU's derivative in the GEMM ----------------
 *
 * tf_cuda_plan_backward looks, before any code is emitted, for two patterns the
 * autodiff writes, and hands them to cuBLASLt when they provably compute
 * what the kernels do:
 *
 *   - BGRAD: a weight gradient dW = X^T dY (a matmul of rank-2 operands)
 *     and, elsewhere in the plan, a reduction kernel whose only work is
 *     db = reduce_sum(dY) over dY's K axis (the batch rows), reading the very
 *     value the GEMM multiplies, into a vector of the GEMM's result type
 *     (cuBLASLt writes the bias gradient in C's type). The GEMM writes db too
 *     (BGRADA when dY is our B, BGRADB when it is our A: cuBLASLt's operands
 *     are swapped, blas.h) and the reduction kernel does not run. Where the
 *     reduction sums a wider copy of dY (mixed precision: it reads the f32
 *     gradient, the GEMM its bf16 rounding) or writes another type, it stays.
 *   - DRELU: a GEMM dA = dY W^T whose only reader is ReLU's backward,
 *     where(h > 0, dA, 0) (passes/grad_rules.c's rule for relu, x > 0), with
 *     or without db = reduce_sum of that over the rows, where h is the
 *     biased product of a forward GEMM region relu(x W + b) that nothing else
 *     reads. The forward GEMM then runs RELU_AUX_BIAS (writing relu's output
 *     and the mask, kept in device memory the plan owns from forward to
 *     backward, no epilogue kernel), the backward one DRELU_BGRAD (or DRELU)
 *     writing dX and db, and ReLU's backward kernel does not run. Only in
 *     f32 (the mask is taken before any rounding to 16 bits, the rule
 *     compares the rounded h), and only once tf_gemm_relu_mask_probe has
 *     found cuBLASLt's mask to be x > 0 in blas.h's layout (cublasLt.h says
 *     nothing of the value at 0).
 *
 * A GEMM that writes a value before the kernel that used to (DRELU: dX and
 * db are the results of the later ReLU kernel) may only do so where
 * memplan's placement lets it: nothing between the two kernels touches
 * their bytes; else the GEMM runs at the later kernel's place, where its
 * operands must still be intact. GELU is never handed over (cuda_gemm.c). */

/* The same memory: one root, or an update memplan writes in place and its param or buffer. */
static const tf_value *memory_of(const tf_value *v) { return root_of(v)->home ? root_of(v)->home : root_of(v); }
static bool same_root(const tf_value *a, const tf_value *b) { return memory_of(a) == memory_of(b); }

/* k's load x reads the whole of v row-major, over a space of v's own dims. */
static bool whole_load(const tf_kernel *k, const tf_kexpr *x, const tf_value *v)
{
    if (x->kind != TF_KX_LOAD || !same_root(k->bufs[x->buf].value, v) || k->bufs[x->buf].value->type.dtype != v->type.dtype ||
        k->rank != v->type.rank)
        return false;
    for (int a = 0; a < k->rank; a++)
        if (k->dims[a] != v->type.dims[a].n) return false;
    return tf_cuda_row_major_load(k, x, x->buf);
}

/* The kernel evaluates an erf (gelu's, or its gradient's). */
static bool has_erf(const tf_kernel *k)
{
    for (int i = 0; i < k->nexprs; i++)
        if (k->exprs[i].kind == TF_KX_OP && (k->exprs[i].op == TF_OP_ERF || k->exprs[i].op == TF_OP_GELU)) return true;
    return false;
}

static bool is_zero(const tf_kexpr *x) { return x->kind == TF_KX_CONST && x->value == 0; }

/* Bytes [p, p + n) and [q, q + m) overlap. */
static bool overlap(tf_cu_deviceptr p, size_t n, tf_cu_deviceptr q, size_t m) { return p && q && p < q + m && q < p + n; }

/* No kernel in [lo, hi) but `except` has a buffer overlapping v's bytes, other than v itself and views of it. */
static bool untouched(const cuda_session *c, int lo, int hi, int except, const tf_value *v, const char **by, const tf_value **what)
{
    tf_cu_deviceptr p = dev_of(c, v);
    for (int j = lo; j < hi; j++) {
        const tf_kernel *k = &c->plan->kernels[j];
        if (j == except) continue;
        for (int b = 0; b < k->nbufs; b++)
            if (!same_root(k->bufs[b].value, v) && overlap(p, value_bytes(v), dev_of(c, k->bufs[b].value), value_bytes(k->bufs[b].value))) {
                *by = k->name, *what = k->bufs[b].value;
                return false;
            }
    }
    return true;
}

/* Nothing but kernels after `after` (and views that copy nothing) reads v, nor is it read before. */
static bool read_after(const cuda_session *c, const tf_value *v, int from, int after, const int *skip, int nskip)
{
    for (int j = 0; j <= after; j++) {
        const tf_kernel *k = &c->plan->kernels[j];
        bool skipped = false;
        for (int q = 0; q < nskip; q++) skipped |= skip[q] == j;
        if (skipped || j < from) continue;
        if (k->kind == TF_K_VIEW && (!dev_of(c, k->lib->out) || dev_of(c, k->lib->out) == dev_of(c, k->lib->in[0]))) continue;
        for (int b = 0; b < k->nbufs; b++)
            if (!k->bufs[b].written && same_root(k->bufs[b].value, v)) return false;
    }
    return true;
}

/* Some kernel, output or update reads v (or a view of it), but those listed. */
static bool read_elsewhere(const cuda_session *c, const tf_module *m, const tf_value *v, const int *skip, int nskip)
{
    for (int j = 0; j < c->plan->nkernels; j++) {
        const tf_kernel *k = &c->plan->kernels[j];
        bool skipped = false;
        for (int q = 0; q < nskip; q++) skipped |= skip[q] == j;
        for (int b = 0; !skipped && b < k->nbufs; b++)
            if (!k->bufs[b].written && same_root(k->bufs[b].value, v) && !(k->kind == TF_K_VIEW && k->lib->in[0] == k->bufs[b].value))
                return true;
    }
    for (int i = 0; i < m->noutputs; i++)
        if (m->outputs[i].value->kind != TF_VAL_CONST && same_root(m->outputs[i].value, v)) return true;
    for (int i = 0; i < m->nupdates; i++)
        if (m->updates[i].value->kind != TF_VAL_CONST && same_root(m->updates[i].value, v)) return true;
    return false;
}

/* A reduction kernel whose only work is reduce_sum of one load (maybe cast
 * first) into one vector: its load, its store's value; false otherwise. */
static bool lone_sum(const tf_kernel *r, const tf_kexpr **load, const tf_value **out)
{
    if (r->kind != TF_K_REDUCTION || r->nreds != 1 || r->reds[0].op != TF_OP_REDUCE_SUM || r->nstores != 1 || !r->stores[0].reduced_domain ||
        r->nexprs < 2 || r->nexprs > 3)
        return false;
    const tf_kexpr *x = &r->exprs[0], *red = &r->exprs[r->nexprs - 1];
    if (x->kind != TF_KX_LOAD || red->kind != TF_KX_REDUCED || r->stores[0].expr != r->nexprs - 1 || r->reds[0].arg != r->nexprs - 2)
        return false;
    if (r->nexprs == 3 && !(r->exprs[1].kind == TF_KX_OP && r->exprs[1].op == TF_OP_CAST && r->exprs[1].args[0] == 0)) return false;
    *load = x;
    *out = r->bufs[r->stores[0].buf].value;
    return true;
}

/* The BGRAD partner of matmul kernel gi: the reduction kernel summing its
 * dY over K (*ri), and which epilogue; false with a note when a reduction
 * of its operand (or of what it was cast from) is there but cannot be
 * handed over, or silently when there is none. */
static bool match_bgrad(const cuda_session *c, int gi, int *ri, tf_gemm_epilogue *kind, char *note, size_t n)
{
    const tf_node *mm = c->plan->kernels[gi].lib;
    bool ta = tf_node_bool(mm, "transpose_a"), tb = tf_node_bool(mm, "transpose_b");
    tf_dt cdt = mm->out->type.dtype;
    for (int r = 0; r < c->plan->nkernels; r++) {
        const tf_kernel *k = &c->plan->kernels[r];
        const tf_kexpr *ld;
        const tf_value *db;
        if (!lone_sum(k, &ld, &db)) continue;
        const tf_value *src = k->bufs[ld->buf].value;
        for (int q = 1; q >= 0; q--) {
            const tf_value *op = mm->in[q];
            bool copy = op->kind == TF_VAL_NODE && op->def && op->def->op == TF_OP_CAST && same_root(op->def->in[0], src);
            if (!same_root(src, op) && !copy) continue;
            const char *name = tf_gemm_epilogue_name(q ? TF_GEMM_EPI_BGRAD_B : TF_GEMM_EPI_BGRAD_A);
            /* the reduced axis is K: our B is [K, N] (tb: [N, K]), our A [M, K] (ta: [K, M]) */
            unsigned kaxis = q ? (tb ? 2u : 1u) : (ta ? 1u : 2u);
            bool dims = src->type.rank == op->type.rank;
            for (int a = 0; dims && a < op->type.rank; a++) dims = src->type.dims[a].n == op->type.dims[a].n;
            if (!dims || k->reduce_mask != kaxis || !whole_load(k, ld, src)) continue;   /* not this operand's K axis */
            if (copy) {
                snprintf(note, n, "%s not used: kernel %s sums %s, the GEMM multiplies its %s copy %s", name, k->name,
                         src->name ? src->name : "?", tf_dtype_name(op->type.dtype), op->name ? op->name : "?");
                return false;
            }
            if (mm->in[0]->type.rank != 2 || mm->in[1]->type.rank != 2 || !whole_load(k, ld, op) || k->reduce_mask != kaxis) {
                snprintf(note, n, "%s not used: kernel %s sums %s, but not over the GEMM's K axis alone", name, k->name, op->name ? op->name : "?");
                return false;
            }
            if (db->type.dtype != cdt || k->reds[0].dtype != cdt) {
                snprintf(note, n, "%s not used: kernel %s writes %s in %s, cuBLASLt writes a bias gradient in the GEMM's type, %s", name, k->name,
                         db->name ? db->name : "?", tf_dtype_name(db->type.dtype), tf_dtype_name(cdt));
                return false;
            }
            *ri = r;
            *kind = q ? TF_GEMM_EPI_BGRAD_B : TF_GEMM_EPI_BGRAD_A;
            return true;
        }
    }
    return false;
}

/* ReLU's backward after matmul kernel gi: kernel *ri computes where(h > 0, dA, 0)
 * into *dx (and its row sums into *db, or NULL) from the GEMM's result dA; *fi
 * is the forward GEMM region storing h = x W + b and relu(h). */
typedef struct drelu_match {
    int ri, fi;
    const tf_value *h, *dx, *db, *act;
} drelu_match;

static bool match_drelu(const cuda_session *c, int gi, drelu_match *d, char *note, size_t n)
{
    const tf_kernel *g = &c->plan->kernels[gi];
    const tf_value *da = g->lib->out;
    memset(d, 0, sizeof *d);
    if (g->nexprs || g->nstores) {   /* the GEMM's result feeds its own region */
        if (has_erf(g))
            snprintf(note, n, "DGELU not used: the region takes gelu's gradient, which stays in its epilogue kernel: cuBLASLt's DGELU is the "
                     "derivative of the tanh approximation, this model's gelu is erf's");
        return false;
    }
    for (int r = gi + 1; r < c->plan->nkernels; r++) {
        const tf_kernel *k = &c->plan->kernels[r];
        int gt = -1, wh = -1, lda = -1;
        for (int i = 0; i < k->nexprs; i++) {
            const tf_kexpr *x = &k->exprs[i];
            if (x->kind == TF_KX_LOAD && same_root(k->bufs[x->buf].value, da)) lda = i;
            if (x->kind == TF_KX_OP && x->op == TF_OP_GT && x->nargs == 2 && k->exprs[x->args[0]].kind == TF_KX_LOAD &&
                is_zero(&k->exprs[x->args[1]]))
                gt = i;
            if (x->kind == TF_KX_OP && x->op == TF_OP_WHERE && x->nargs == 3) wh = i;
        }
        if (lda < 0) continue;
        /* the one kernel reading dA */
        const tf_kexpr *w = wh >= 0 ? &k->exprs[wh] : NULL;
        if (has_erf(k) && (!w || gt < 0)) {
            snprintf(note, n, "DGELU not used: kernel %s takes gelu's gradient, which stays there: cuBLASLt's DGELU is the derivative of the tanh "
                     "approximation, this model's gelu is erf's", k->name);
            return false;
        }
        if (!w || gt < 0 || w->args[0] != gt || w->args[1] != lda || !is_zero(&k->exprs[w->args[2]])) return false;
        if (da->type.dtype != TF_DT_F32) {
            snprintf(note, n, "DRELU not used: ReLU's backward (kernel %s) is in %s; the mask is handed over in f32 only (cuBLASLt takes it before "
                     "rounding to 16 bits, the gradient rule compares the rounded value)", k->name, tf_dtype_name(da->type.dtype));
            return false;
        }
        int expect = 5;   /* load h, 0, gt, load dA, 0, where: the zeros may be one constant */
        const tf_kexpr *lh = &k->exprs[k->exprs[gt].args[0]];
        d->h = k->bufs[lh->buf].value;
        if (!whole_load(k, lh, d->h) || !whole_load(k, &k->exprs[lda], da) || k->rank != 2) {
            snprintf(note, n, "DRELU not used: kernel %s does not read h and the GEMM's result whole", k->name);
            return false;
        }
        int dxs = -1, dbs = -1;
        for (int st = 0; st < k->nstores; st++) {
            if (k->stores[st].expr == wh && !k->stores[st].reduced_domain) dxs = st;
            else if (k->stores[st].reduced_domain && k->exprs[k->stores[st].expr].kind == TF_KX_REDUCED && k->nreds == 1 &&
                     k->reds[0].op == TF_OP_REDUCE_SUM && k->reds[0].arg == wh && k->reduce_mask == 1u &&
                     k->exprs[k->stores[st].expr].red == 0)
                dbs = st;
        }
        int want_stores = 1 + (k->nreds ? 1 : 0);
        if (dxs < 0 || k->nstores != want_stores || (k->nreds && dbs < 0) || k->nexprs > expect + 1 + (k->nreds ? 1 : 0)) {
            snprintf(note, n, "DRELU not used: kernel %s does more than ReLU's backward%s", k->name, k->nreds ? " and the bias gradient" : "");
            return false;
        }
        d->dx = k->bufs[k->stores[dxs].buf].value;
        d->db = dbs >= 0 ? k->bufs[k->stores[dbs].buf].value : NULL;
        if (d->dx->type.dtype != TF_DT_F32 || (d->db && (d->db->type.dtype != TF_DT_F32 || k->reds[0].dtype != TF_DT_F32)) ||
            !k->bufs[k->stores[dxs].buf].disjoint) {
            snprintf(note, n, "DRELU not used: kernel %s writes another type than the GEMM's f32, or into its own operands", k->name);
            return false;
        }
        /* the forward region that stores h = x W + b and relu(h) */
        for (int f = 0; f < gi; f++) {
            const tf_kernel *fk = &c->plan->kernels[f];
            if (!fk->lib || fk->lib->op != TF_OP_MATMUL || fk->nstores != 2 || fk->nexprs != 4 || fk->nreds) continue;
            int hs = -1, as = -1;
            for (int st = 0; st < 2; st++) {
                const tf_kexpr *x = &fk->exprs[fk->stores[st].expr];
                const tf_value *v = fk->bufs[fk->stores[st].buf].value;
                if (same_root(v, d->h) && x->kind == TF_KX_OP && x->op == TF_OP_ADD) hs = st;
                else if (x->kind == TF_KX_OP && x->op == TF_OP_RELU && x->args[0] == fk->stores[1 - st].expr) as = st;
            }
            if (hs < 0) continue;
            if (as < 0) {
                snprintf(note, n, "DRELU not used: kernel %s stores %s without its relu", fk->name, d->h->name ? d->h->name : "?");
                return false;
            }
            d->fi = f;
            d->act = fk->bufs[fk->stores[as].buf].value;
            d->ri = r;
            return true;
        }
        snprintf(note, n, "DRELU not used: %s is not the biased product of a GEMM region of this step", d->h->name ? d->h->name : "?");
        return false;
    }
    return false;
}

/* What the search for one backward epilogue came to. */
typedef enum planned { NOT_PLANNED, PLANNED, PLAN_OOM } planned;

/* BGRAD planned: matmul kernel gi's GEMM writes the bias gradient db that
 * reduction kernel ri computed, and kernel ri does not run. */
static void bgrad_record(cuda_session *c, int gi, int ri, tf_gemm_epilogue kind, const tf_value *db)
{
    const tf_kernel *k = &c->plan->kernels[gi];
    gkernel *gk = &c->ks[gi];
    gk->how = RUN_GEMM;
    gk->preplanned = true;
    snprintf(gk->epi, sizeof gk->epi, "%s (the bias gradient %.60s, the sum of %.60s over its rows, written with the product; kernel %s "
             "does not run)%s", tf_gemm_epilogue_name(kind), db->name ? db->name : "?",
             k->lib->in[kind == TF_GEMM_EPI_BGRAD_B]->name ? k->lib->in[kind == TF_GEMM_EPI_BGRAD_B]->name : "?",
             c->plan->kernels[ri].name, k->nexprs && k->nstores ? "; the region in its epilogue kernel" : "; no epilogue kernel");
    c->ks[ri].k = &c->plan->kernels[ri];
    c->ks[ri].how = RUN_NOTHING;
    c->ks[ri].preplanned = true;
    snprintf(c->ks[ri].lab, sizeof c->ks[ri].lab, "in GEMM: %s", tf_gemm_epilogue_name(kind));
    c->ks[ri].label = c->ks[ri].lab;
    snprintf(c->ks[ri].why, sizeof c->ks[ri].why, "its reduce_sum is the %s epilogue of kernel %s's GEMM", tf_gemm_epilogue_name(kind),
             k->name);
}

/* BGRAD for matmul kernel gi; NOT_PLANNED with the reason in note when a
 * partner reduction is there but cannot be handed over. */
static planned plan_bgrad(cuda_session *c, int gi, char *note, size_t n)
{
    const tf_kernel *k = &c->plan->kernels[gi];
    gkernel *gk = &c->ks[gi];
    bool oom = false;
    int ri;
    tf_gemm_epilogue kind;
    if (!match_bgrad(c, gi, &ri, &kind, note, n)) return NOT_PLANNED;
    const tf_kexpr *ld;
    const tf_value *db;
    lone_sum(&c->plan->kernels[ri], &ld, &db);
    const char *by = NULL;
    const tf_value *what = NULL;
    int skip[1] = {ri};
    epi_plan fwd;
    char why[200];
    bool fwd_epi = tf_cuda_plan_epilogue(k, &fwd, &oom, why, sizeof why);
    tf_cuda_epi_free(fwd.rest);
    if (oom) return PLAN_OOM;
    if (fwd_epi)
        snprintf(note, n, "%s not used: the GEMM's region has a bias epilogue of its own", tf_gemm_epilogue_name(kind));
    else if (c->ks[ri].preplanned)
        snprintf(note, n, "%s not used: kernel %s is another GEMM's", tf_gemm_epilogue_name(kind), c->plan->kernels[ri].name);
    else if (ri < gi ? !untouched(c, ri + 1, gi + 1, -1, db, &by, &what) : !untouched(c, gi, ri, -1, db, &by, &what))
        snprintf(note, n, "%s not used: memplan placed %s over %s, which kernel %s uses between the two kernels",
                 tf_gemm_epilogue_name(kind), db->name ? db->name : "?", what->name ? what->name : "?", by);
    else if (!read_after(c, db, ri < gi ? ri : gi, gi, skip, 1))
        snprintf(note, n, "%s not used: %s is read before kernel %s", tf_gemm_epilogue_name(kind), db->name ? db->name : "?", k->name);
    else {
        epi_plan ep = {.kind = kind, .bias_dev = dev_of(c, db), .d_dev = dev_of(c, k->lib->out)};
        if (tf_cuda_gemm_setup(c, gk, &ep, &oom)) {
            bgrad_record(c, gi, ri, kind, db);
            return PLANNED;
        }
        if (oom) return PLAN_OOM;
        snprintf(note, n, "%s not used: cuBLASLt takes no such epilogue here (%.200s)", tf_gemm_epilogue_name(kind), gk->why);
        gk->why[0] = 0;
    }
    return NOT_PLANNED;
}

/* Where matmul kernel gi's DRELU GEMM may run, as memplan placed dX and db:
 * at its own place (*at_g), else at ReLU's kernel (*at_r); *by and *what
 * name a kernel in the way and the value it uses. */
static void drelu_place(const cuda_session *c, int gi, const drelu_match *dm, bool *at_g, bool *at_r, const char **by,
                        const tf_value **what)
{
    const tf_kernel *k = &c->plan->kernels[gi];
    *at_g = untouched(c, gi, dm->ri, gi, dm->dx, by, what) && (!dm->db || untouched(c, gi, dm->ri, gi, dm->db, by, what));
    /* at_g: the GEMM's own operands must not be what memplan put dX over either */
    for (int q = 0; *at_g && q < 2; q++)
        *at_g = !overlap(dev_of(c, k->lib->in[q]), value_bytes(k->lib->in[q]), dev_of(c, dm->dx), value_bytes(dm->dx)) &&
                (!dm->db || !overlap(dev_of(c, k->lib->in[q]), value_bytes(k->lib->in[q]), dev_of(c, dm->db), value_bytes(dm->db)));
    *at_r = !*at_g;
    for (int q = 0; *at_r && q < 2; q++) {   /* run at ReLU's kernel: the operands intact there, and apart from dX and db */
        const tf_value *o = k->lib->in[q];
        *at_r = untouched(c, gi + 1, dm->ri, -1, o, by, what) && !overlap(dev_of(c, o), value_bytes(o), dev_of(c, dm->dx), value_bytes(dm->dx)) &&
                (!dm->db || !overlap(dev_of(c, o), value_bytes(o), dev_of(c, dm->db), value_bytes(dm->db)));
    }
}

/* cuBLASLt's ReLU mask compared once with blas.h's reading of it
 * (c->lt.relu_probe); false only for out of memory. */
static bool probe_relu_mask(cuda_session *c)
{
    if (!c->lt.relu_probe) {
        bool same = false;
        tf_cuda_status ps = tf_gemm_relu_mask_probe(&c->libs, c->lt.handle, c->stream, c->ws_dev, c->ws_bytes, &same, c->lt.relu_probe_why,
                                                    sizeof c->lt.relu_probe_why);
        if (ps == TF_CUDA_ERR_OOM) return false;
        c->lt.relu_probe = same ? 1 : -1;
    }
    return true;
}

/* The forward GEMM (kernel dm->fi, its bias buffer bias_buf) planned as
 * RELU_AUX_BIAS and matmul kernel gi's as *be (DRELU_BGRAD, or DRELU),
 * sharing a ReLU mask the forward one owns; NOT_PLANNED with the reason in
 * dnote when cuBLASLt takes either not. */
static planned drelu_gemms(cuda_session *c, int gi, const drelu_match *dm, int bias_buf, epi_plan *be, char *dnote, size_t n)
{
    gkernel *gk = &c->ks[gi], *fk = &c->ks[dm->fi];
    const tf_kernel *fkern = &c->plan->kernels[dm->fi];
    bool oom = false;
    tf_cu_deviceptr mask = 0;
    int64_t M = dm->dx->type.dims[0].n, N = dm->dx->type.dims[1].n;
    size_t mb = tf_gemm_relu_mask_bytes(M, N);
    tf_cu_result mr = c->libs.cu.MemAlloc(&mask, mb);
    if (mr) return PLAN_OOM;
    dev_count(c, (int64_t)mb);
    epi_plan fe = {.kind = TF_GEMM_EPI_RELU_AUX_BIAS, .bias_buf = bias_buf, .d_dev = dev_of(c, dm->act), .aux_dev = mask};
    *be = (epi_plan){.kind = dm->db ? TF_GEMM_EPI_DRELU_BGRAD : TF_GEMM_EPI_DRELU, .bias_dev = dm->db ? dev_of(c, dm->db) : 0,
                     .d_dev = dev_of(c, dm->dx), .aux_dev = mask};
    fk->k = fkern;
    bool ok = M == c->plan->kernels[dm->fi].lib->out->type.dims[0].n && tf_cuda_gemm_setup(c, fk, &fe, &oom);
    if (ok) fk->mm->own = mask;
    else c->libs.cu.MemFree(mask), dev_count(c, -(int64_t)mb);
    if (ok && !tf_cuda_gemm_setup(c, gk, be, &oom)) {
        tf_cuda_gemm_call_free(c, fk->mm);
        fk->mm = NULL;
        ok = false;
    }
    if (oom) return PLAN_OOM;
    if (!ok) {
        snprintf(dnote, n, "DRELU not used: cuBLASLt takes no such epilogue here (%.200s)", gk->why[0] ? gk->why : fk->why);
        gk->why[0] = fk->why[0] = 0;
        return NOT_PLANNED;
    }
    return PLANNED;
}

/* DRELU planned with epilogue kind: the forward GEMM writes relu's output
 * and the mask, no epilogue kernel; matmul kernel gi's GEMM does ReLU's
 * backward (and the bias gradient) at its own place (at_g) or at ReLU's
 * kernel's, and the other of the two does not run. */
static void drelu_record(cuda_session *c, int gi, const drelu_match *dm, int bias_buf, tf_gemm_epilogue kind, bool at_g)
{
    const tf_kernel *k = &c->plan->kernels[gi], *fkern = &c->plan->kernels[dm->fi];
    gkernel *gk = &c->ks[gi], *fk = &c->ks[dm->fi], *rk = &c->ks[dm->ri];
    const char *en = tf_gemm_epilogue_name(kind);
    fk->how = RUN_GEMM, fk->preplanned = true, fk->no_code = true;
    snprintf(fk->epi, sizeof fk->epi, "RELU_AUX_BIAS (bias %.60s, relu written to %.60s, its ReLU mask kept for kernel %s's %s; "
             "%.60s, read by ReLU's backward alone, is not written); no epilogue kernel",
             fkern->bufs[bias_buf].value->name ? fkern->bufs[bias_buf].value->name : "?", dm->act->name ? dm->act->name : "?",
             k->name, en, dm->h->name ? dm->h->name : "?");
    rk->k = &c->plan->kernels[dm->ri];
    rk->preplanned = true;
    gk->preplanned = true;
    char what_text[400];
    snprintf(what_text, sizeof what_text, "%s (the mask of kernel %s, dX written to %.60s%s%.60s: ReLU's backward%s, kernel %s's work)",
             en, fkern->name, dm->dx->name ? dm->dx->name : "?", dm->db ? ", the bias gradient to " : "",
             dm->db && dm->db->name ? dm->db->name : "", dm->db ? " and the bias gradient" : "", c->plan->kernels[dm->ri].name);
    if (at_g) {
        gk->how = RUN_GEMM;
        snprintf(gk->epi, sizeof gk->epi, "%s; no epilogue kernel", what_text);
        rk->how = RUN_NOTHING;
        snprintf(rk->lab, sizeof rk->lab, "in GEMM: %s", en);
        rk->label = rk->lab;
        snprintf(rk->why, sizeof rk->why, "ReLU's backward is the %s epilogue of kernel %s's GEMM", en, k->name);
    } else {   /* memplan put dX where the kernels in between still work: the GEMM runs in ReLU's kernel's place */
        rk->how = RUN_GEMM;
        rk->mm = gk->mm;
        gk->mm = NULL;
        rk->no_code = true;
        snprintf(rk->epi, sizeof rk->epi, "kernel %s's GEMM, run here: %s; no epilogue kernel", k->name, what_text);
        gk->how = RUN_NOTHING;
        snprintf(gk->lab, sizeof gk->lab, "GEMM moved: %s", en);
        gk->label = gk->lab;
        snprintf(gk->why, sizeof gk->why, "its GEMM runs in kernel %s's place, with the %s epilogue (memplan puts %s where kernels in "
                 "between still work)", c->plan->kernels[dm->ri].name, en, dm->dx->name ? dm->dx->name : "?");
    }
}

/* DRELU for matmul kernel gi; NOT_PLANNED with the reason in dnote when
 * ReLU's backward is there but cannot be handed over. */
static planned plan_drelu(tf_session_t *s, cuda_session *c, int gi, char *dnote, size_t n)
{
    drelu_match dm;
    if (!match_drelu(c, gi, &dm, dnote, n)) return NOT_PLANNED;
    const gkernel *fk = &c->ks[dm.fi];
    const tf_kernel *fkern = &c->plan->kernels[dm.fi];
    int skip[1] = {dm.ri};
    const char *by = NULL;
    const tf_value *what = NULL;
    epi_plan fwd;
    char why[200];
    bool oom = false;
    bool fwd_ok = tf_cuda_plan_epilogue(fkern, &fwd, &oom, why, sizeof why);
    tf_cuda_epi_free(fwd.rest);
    if (oom) return PLAN_OOM;
    bool at_g, at_r;
    drelu_place(c, gi, &dm, &at_g, &at_r, &by, &what);
    if (!probe_relu_mask(c)) return PLAN_OOM;
    if (c->lt.relu_probe < 0)
        snprintf(dnote, n, "DRELU not used: cuBLASLt's ReLU mask is not x > 0 as blas.h reads it: %.200s", c->lt.relu_probe_why);
    else if (!fwd_ok || fwd.kind != TF_GEMM_EPI_BIAS || fk->preplanned)
        snprintf(dnote, n, "DRELU not used: the forward region (kernel %s) is not one cuBLASLt can write the mask for", fkern->name);
    else if (read_elsewhere(c, s->p->m, dm.h, skip, 1))
        snprintf(dnote, n, "DRELU not used: %s is read apart from ReLU's backward, and RELU_AUX_BIAS does not write it",
                 dm.h->name ? dm.h->name : "?");
    else if (!at_g && !at_r)
        snprintf(dnote, n, "DRELU not used: memplan placed %s or its operands where kernel %s uses %s in between",
                 dm.dx->name ? dm.dx->name : "?", by ? by : "?", what && what->name ? what->name : "?");
    else {
        epi_plan be;
        planned p = drelu_gemms(c, gi, &dm, fwd.bias_buf, &be, dnote, n);
        if (p == PLANNED) drelu_record(c, gi, &dm, fwd.bias_buf, be.kind, at_g);
        return p;
    }
    return NOT_PLANNED;
}

/* Plan the backward epilogues (see above). False only for out of memory. */
bool tf_cuda_plan_backward(tf_session_t *s, cuda_session *c)
{
    int nk = c->plan->nkernels;
    for (int gi = 0; gi < nk; gi++) {
        const tf_kernel *k = &c->plan->kernels[gi];
        gkernel *gk = &c->ks[gi];
        if (!k->lib || k->lib->op != TF_OP_MATMUL || gk->preplanned) continue;
        gk->k = k;
        char note[300] = "", dnote[300] = "";
        planned p = plan_bgrad(c, gi, note, sizeof note);
        if (p == NOT_PLANNED) p = plan_drelu(s, c, gi, dnote, sizeof dnote);
        if (p == PLAN_OOM) return false;
        if (p == NOT_PLANNED) snprintf(gk->epi_note, sizeof gk->epi_note, "%s%s%s", note, note[0] && dnote[0] ? "; " : "", dnote);
    }
    return true;
}
