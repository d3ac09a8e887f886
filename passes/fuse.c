/* fuse.c — group ops into regions that each run as one kernel.
 *
 * Four kinds of region (docs/design.md, the fuse pass):
 *   pointwise  a chain of pointwise ops over one shape (casts included: a
 *              cast inside a kernel costs nothing, so fp16/fp32 boundaries
 *              fall inside kernels rather than between them);
 *   reduction  reductions over one input shape and one set of axes, with
 *              their pointwise prologue (on the full shape) and epilogue (on
 *              the full or the reduced shape): softmax, log_softmax,
 *              layernorm, cross-entropy, batchnorm statistics and apply;
 *   gemm       a matmul/conv2d with the pointwise epilogue on its output whose
 *              other operands are vectors or scalars (bias, activation): the
 *              cuBLASLt epilogue on GPU; a widening cast (bf16 -> f32) stays
 *              out of it and joins its readers' kernel, which then read the
 *              narrow value instead of a wide copy the epilogue would store;
 *   multi      the optimizer's update chains of every param, one launch.
 * Forward ops and backward ops (autodiff's) never share a region: a forward
 * result fused into backward work would live from the forward pass on.
 * A pointwise op checkpoint recomputes (a copy made for the one backward op
 * that reads it) joins only pointwise kernels, so that its chain ends in
 * that op's kernel: in a matmul epilogue or a reduction kernel that runs
 * earlier it would be stored, and live, until the op runs.
 * A broadcast joins its readers' kernel as a load with zero strides (a
 * reduction's gradient spread back over its rows is never a tensor of
 * copies), except into the reduction that computed its operand, not when
 * it spreads few values (TF_FUSE_BROADCAST_MIN_ROWS), and not under
 * tf_options.keep_broadcasts (tf_fit_pipeline's second try at a memory
 * budget: a big fused kernel holds more values alive at once).
 * Grouping is greedy in program order: an op joins the region of a producer
 * when the region's shape rules admit it, and producer regions that fit are
 * merged. Nothing is ever duplicated (no recomputation), so fusing can only
 * save memory traffic. A merge must keep the region convex (no path leaves
 * it and comes back), so the regions can be made contiguous by a
 * topological order of regions. Reshapes are views: no kernel, no fusion. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { C_OTHER, C_PW, C_RED, C_GEMM, C_VIEW };

typedef struct group {
    int kind;              /* TF_REGION_* */
    tf_type S;             /* the iteration shape */
    unsigned R;            /* reduced axes of S (bit mask), reduction groups */
    int count, first;      /* members; index of the first */
    int head;              /* the members as a list through fz.next */
    int stamp;             /* DFS marks */
} group;

typedef struct fz {
    tf_module *m;
    const tf_options *o;
    int n;                 /* nodes */
    tf_node **nodes;
    int *grp;              /* node -> group, -1 none */
    int *next;             /* node -> the next member of its group, -1 */
    group *g;
    int ng;
    int *stamp, cur;       /* DFS marks */
    int *stack;
    int *members;          /* try_merge's set: the node indices it marks */
    const char **why;      /* node -> reason it stayed alone */
    bool *to_reduction;    /* node -> read by reductions (as what they reduce), and by nothing else */
} fz;

bool tf_fuse_folds_broadcast(const tf_node *n, bool keep_broadcasts)
{
    return tf_op_exec_of(n->op) == TF_OPX_BCAST && !keep_broadcasts && tf_type_numel(&n->in[0]->type) >= TF_FUSE_BROADCAST_MIN_ROWS;
}

static int node_class(const fz *f, const tf_node *n)
{
    switch (tf_op_exec_of(n->op)) {
    case TF_OPX_EXPR: case TF_OPX_INDEX: return C_PW;   /* one_hot too: elementwise in its output */
    case TF_OPX_REDUCE: return C_RED;
    case TF_OPX_GEMM: case TF_OPX_CONV: return C_GEMM;
    case TF_OPX_VIEW: return C_VIEW;
    /* a broadcast is a load with zero strides in the kernel that reads it,
     * not a tensor of copies (a reduction's gradient spread over the rows
     * it summed: cross-entropy's over [B, T, V] logits), where
     * tf_fuse_folds_broadcast says so */
    case TF_OPX_BCAST: return tf_fuse_folds_broadcast(n, f->o->keep_broadcasts) ? C_PW : C_OTHER;
    default: return C_OTHER;
    }
}

static int index_of(const tf_node *n) { return n->out->id; }   /* ids renumbered: decls first */

static unsigned reduce_mask(const tf_node *n)
{
    const tf_attr *a = tf_node_attr_named(n, "axes");
    int rank = n->in[0]->type.rank;
    unsigned mask = 0;
    if (a->u.ints.n == 0) return (1u << rank) - 1;
    for (int i = 0; i < a->u.ints.n; i++) {
        int ax;
        if (tf_axis_norm(a->u.ints.v[i].v, rank, &ax)) mask |= 1u << ax;
    }
    return mask;
}

/* Is O the shape S reduced over R (kept as size-1 axes, or dropped)? */
static bool is_reduced_shape(const tf_type *S, unsigned R, const tf_type *O)
{
    if (O->rank == S->rank) {
        for (int i = 0; i < S->rank; i++)
            if (O->dims[i].n != ((R >> i) & 1 ? 1 : S->dims[i].n)) return false;
        return true;
    }
    int k = 0;
    for (int i = 0; i < S->rank; i++) {
        if ((R >> i) & 1) continue;
        if (k >= O->rank || O->dims[k].n != S->dims[i].n) return false;
        k++;
    }
    return k == O->rank;
}

/* May node n (class c) join group g? Sets *why when not. */
static bool admits(const fz *f, const group *g, const tf_node *n, int c, const char **why)
{
    const tf_type *O = &n->out->type;
    if (f->nodes[g->first]->backward != n->backward) {
        *why = "forward and backward ops stay in separate kernels (the forward results would live until the backward pass)";
        return false;
    }
    if (c == C_PW) {
        if (g->kind != TF_REGION_POINTWISE && n->recompute) {
            /* checkpoint makes a recomputed pointwise op for the backward op
             * that reads it: it belongs in that op's kernel (which joins its
             * chain), not stored by a matmul's epilogue or a reduction's
             * kernel that runs earlier */
            *why = "a recomputation joins the kernel of the backward op it is made for, not its producer's";
            return false;
        }
        if (g->kind == TF_REGION_POINTWISE && tf_type_same_shape(O, &g->S)) return true;
        if (g->kind == TF_REGION_REDUCTION && n->op == TF_OP_BROADCAST) {
            /* spreading a reduction's result back over its rows (a norm's
             * or a loss's gradient): the readers' kernel does it as it
             * loads, and stays a pointwise kernel whose result memplan may
             * write over a dying operand; in the reduction's kernel it would
             * make the readers reduction epilogues, which it may not */
            *why = "a broadcast of a reduction's result joins its readers' kernel, not the reduction's";
            return false;
        }
        if (g->kind == TF_REGION_REDUCTION && (tf_type_same_shape(O, &g->S) || is_reduced_shape(&g->S, g->R, O)))
            return true;
        if (g->kind == TF_REGION_GEMM && n->op == TF_OP_CAST && tf_dtype_bytes(O->dtype) > tf_dtype_bytes(n->in[0]->type.dtype)) {
            /* the epilogue would store the wide copy beside the product it
             * stores anyway, and its readers would read the wide one; in its
             * readers' kernel the cast reads the narrow product and is never
             * stored (a bf16 convolution's result widened for batchnorm's
             * f32 statistics: 6 bytes an element written and read, not 10) */
            *why = "a widening cast joins its readers' kernel, not a matmul epilogue that would store the wide copy";
            return false;
        }
        if (g->kind == TF_REGION_GEMM && tf_type_same_shape(O, &g->S) && f->to_reduction[index_of(n) - f->m->decls.n]) {
            /* a matmul epilogue would store it for the reduction to read
             * back (a gradient's square for a global norm: as large as the
             * gradient, and alive until the norm is taken); as the
             * reduction's prologue it is never stored */
            *why = "only reductions read it: it joins their kernel, not a matmul epilogue that would store it";
            return false;
        }
        if (g->kind == TF_REGION_GEMM && tf_type_same_shape(O, &g->S)) {
            int64_t last = O->rank ? O->dims[O->rank - 1].n : 1;
            for (int k = 0; k < n->nin; k++) {
                const tf_value *v = n->in[k];
                bool inside = v->kind == TF_VAL_NODE && f->grp[index_of(v->def) - f->m->decls.n] == (int)(g - f->g);
                if (!inside && tf_type_numel(&v->type) > last) {
                    *why = "an epilogue operand is larger than a bias vector";
                    return false;
                }
            }
            return true;
        }
        *why = "its shape differs from its producer's kernel";
        return false;
    }
    if (c == C_RED) {
        const tf_type *I = &n->in[0]->type;
        unsigned A = reduce_mask(n);
        if (g->kind == TF_REGION_POINTWISE && tf_type_same_shape(I, &g->S)) return true;
        if (g->kind == TF_REGION_REDUCTION && tf_type_same_shape(I, &g->S) && A == g->R) return true;
        *why = g->kind == TF_REGION_GEMM ? "a reduction does not fuse into a matmul epilogue"
                                         : "it reduces another shape or other axes than its producer's kernel";
        return false;
    }
    *why = "not fusible";
    return false;
}

/* Would the set of nodes marked in_set (indices into f->nodes) stay convex
 * once the groups run as units? True when no operand from outside the set
 * depends on a node inside it, where depending goes through every member
 * of a group as soon as it reaches one (a group is one kernel: a value one
 * member reads waits for all of them). Node-level convexity is not enough:
 * group G could read from the set through one member and feed it through
 * another, and the kernels would form a cycle. */
static void reach(fz *f, int x, int lo, int *sp)
{
    if (f->stamp[x] == f->cur) return;
    f->stamp[x] = f->cur;
    f->stack[(*sp)++] = x;
    int gx = f->grp[x];
    if (gx < 0 || f->g[gx].stamp == f->cur) return;
    f->g[gx].stamp = f->cur;
    for (int y = f->g[gx].head; y >= 0; y = f->next[y])
        if (y >= lo && f->stamp[y] != f->cur) {
            f->stamp[y] = f->cur;
            f->stack[(*sp)++] = y;
        }
}

static bool convex(fz *f, const bool *in_set, const int *set, int nset, int lo)
{
    int D = f->m->decls.n;
    f->cur++;
    int sp = 0;
    for (int s = 0; s < nset; s++) {
        tf_node *n = f->nodes[set[s]];
        for (int k = 0; k < n->nin; k++) {
            tf_value *v = n->in[k];
            if (v->kind != TF_VAL_NODE) continue;
            int j = index_of(v->def) - D;
            if (in_set[j] || j < lo) continue;
            reach(f, j, lo, &sp);
        }
    }
    /* backward from the set's outside operands, over nodes after lo:
     * reaching the set is a cycle */
    while (sp) {
        int x = f->stack[--sp];
        if (in_set[x]) return false;
        tf_node *xn = f->nodes[x];
        for (int q = 0; q < xn->nin; q++) {
            tf_value *w = xn->in[q];
            if (w->kind != TF_VAL_NODE) continue;
            int y = index_of(w->def) - D;
            if (y >= lo) reach(f, y, lo, &sp);
        }
    }
    return true;
}

/* In a kernel over shape S reducing axes R, does every value computed in
 * the set marked in_set lie where its readers in the set read it (ir.h's
 * placements)? reduce_sum(x[4,4], axes=[1]) lies along axis 0; add(x, it)
 * reads it along axis 1 (NumPy aligns from the right), so the two cannot
 * share a kernel, though every shape fits. */
static bool placed_consistently(const fz *f, const bool *in_set, const int *set, int nset, int lo, const tf_type *S, unsigned R)
{
    if (!R) return true;   /* without reduced axes every member has shape S */
    int D = f->m->decls.n;
    int64_t dims[TF_MAX_RANK];
    int8_t full[TF_MAX_RANK], res[TF_MAX_RANK], own[TF_MAX_RANK], rd[TF_MAX_RANK];
    for (int a = 0; a < S->rank; a++) dims[a] = S->dims[a].n, full[a] = (int8_t)a;
    for (int s = 0; s < nset; s++) {
        const tf_node *n = f->nodes[set[s]];
        if (!tf_place_result(S->rank, dims, R, &n->out->type, res)) return false;
        bool red = node_class(f, n) == C_RED;
        for (int k = 0; k < n->nin; k++) {
            const tf_value *v = n->in[k];
            if (v->kind != TF_VAL_NODE || index_of(v->def) - D < lo || !in_set[index_of(v->def) - D]) continue;
            if (!tf_place_result(S->rank, dims, R, &v->type, own) ||
                !tf_place_operand(dims, red ? full : res, red ? S->rank : n->out->type.rank, &v->type, n->op == TF_OP_ONE_HOT, rd) ||
                memcmp(own, rd, (size_t)v->type.rank))
                return false;
        }
    }
    return true;
}

/* Group hi's members join group gi. */
static void join_groups(fz *f, int gi, int hi)
{
    int last = -1;
    for (int y = f->g[hi].head; y >= 0; y = f->next[y]) {
        f->grp[y] = gi;
        last = y;
    }
    if (last >= 0) {
        f->next[last] = f->g[gi].head;
        f->g[gi].head = f->g[hi].head;
    }
    f->g[hi].head = -1;
    f->g[gi].count += f->g[hi].count;
    f->g[hi].count = 0;
    if (f->g[hi].first < f->g[gi].first) f->g[gi].first = f->g[hi].first;
}

/* Try to put node i into group gi, together with the members of group hi
 * (or -1), in a kernel reducing axes R. Returns NULL and updates the groups
 * on success, else why not. */
static const char *try_merge(fz *f, bool *mark, int i, int gi, int hi, unsigned R)
{
    int lo = f->g[gi].first;
    if (hi >= 0 && f->g[hi].first < lo) lo = f->g[hi].first;
    /* nodes are grouped in program order: every member of a group is at or before i, and whatever the
     * set depends on comes before its members, so nothing after i takes part; the set is walked through
     * the groups' member lists, never the span lo..i (which grows with the program) */
    int nset = 0;
    for (int y = f->g[gi].head; y >= 0; y = f->next[y]) f->members[nset++] = y;
    for (int y = hi >= 0 ? f->g[hi].head : -1; y >= 0; y = f->next[y]) f->members[nset++] = y;
    if (f->grp[i] != gi && (hi < 0 || f->grp[i] != hi)) f->members[nset++] = i;
    for (int s = 0; s < nset; s++) mark[f->members[s]] = true;
    const char *why = !convex(f, mark, f->members, nset, lo) ? "joining its producer's kernel would make a cycle"
                      : !placed_consistently(f, mark, f->members, nset, lo, &f->g[gi].S, R)
                          ? "it reads a reduced value along other axes than the reduction's kernel computes it on"
                          : NULL;
    for (int s = 0; s < nset; s++) mark[f->members[s]] = false;
    if (why) return why;
    if (hi >= 0) join_groups(f, gi, hi);
    if (f->grp[i] != gi) {
        f->grp[i] = gi;
        f->next[i] = f->g[gi].head;
        f->g[gi].head = i;
        f->g[gi].count++;
    }
    f->g[gi].first = lo;
    return NULL;
}

static int new_group(fz *f, int i, int kind, const tf_type *S, unsigned R)
{
    group *g = &f->g[f->ng];
    g->kind = kind;
    g->S = *S;
    g->R = R;
    g->count = 1;
    g->first = i;
    g->head = i;
    g->stamp = 0;
    f->next[i] = -1;
    f->grp[i] = f->ng;
    return f->ng++;
}

static void group_nodes(fz *f, bool *mark)
{
    int D = f->m->decls.n;
    for (int i = 0; i < f->n; i++) {
        tf_node *n = f->nodes[i];
        int c = node_class(f, n);
        if (c == C_GEMM) {
            new_group(f, i, TF_REGION_GEMM, &n->out->type, 0);
            continue;
        }
        if (c != C_PW && c != C_RED) continue;
        /* join the first producer group that admits n */
        int target = -1;
        const char *why = "no producer runs in a fusible kernel";
        for (int k = 0; k < n->nin && target < 0; k++) {
            tf_value *v = n->in[k];
            if (v->kind != TF_VAL_NODE) continue;
            int gi = f->grp[index_of(v->def) - D];
            if (gi < 0) continue;
            if (admits(f, &f->g[gi], n, c, &why)) {
                const char *no = try_merge(f, mark, i, gi, -1, c == C_RED ? reduce_mask(n) : f->g[gi].R);
                if (!no) target = gi;
                else why = no;
            }
        }
        if (target < 0) {
            f->why[i] = why;
            if (c == C_PW) new_group(f, i, TF_REGION_POINTWISE, &n->out->type, 0);
            else new_group(f, i, TF_REGION_REDUCTION, &n->in[0]->type, reduce_mask(n));
            continue;
        }
        group *g = &f->g[target];
        if (c == C_RED && g->kind == TF_REGION_POINTWISE) {
            g->kind = TF_REGION_REDUCTION;
            g->R = reduce_mask(n);
        }
        /* merge the other producers' groups that fit the same kernel */
        for (int k = 0; k < n->nin; k++) {
            tf_value *v = n->in[k];
            if (v->kind != TF_VAL_NODE) continue;
            int hi = f->grp[index_of(v->def) - D];
            if (hi < 0 || hi == target || !f->g[hi].count) continue;
            group *h = &f->g[hi];
            bool fits = (!n->recompute || c != C_PW || h->kind == TF_REGION_POINTWISE) &&
                        f->nodes[h->first]->backward == f->nodes[g->first]->backward && g->kind != TF_REGION_GEMM && h->kind != TF_REGION_GEMM && tf_type_same_shape(&h->S, &g->S) &&
                        (h->kind == TF_REGION_POINTWISE || g->kind == TF_REGION_POINTWISE || h->R == g->R);
            if (fits && !try_merge(f, mark, i, target, hi, h->kind == TF_REGION_REDUCTION ? h->R : g->R) &&
                h->kind == TF_REGION_REDUCTION) {
                g->kind = TF_REGION_REDUCTION;
                g->R = h->R;
            }
        }
    }
}

/* The optimizer's update chains (pointwise groups whose results go only to
 * `update` statements, within the group) become one multi-tensor region:
 * every param updated by one kernel, not one per tensor (not in a step
 * that recomputes: see below). Such groups are
 * independent of each other (nothing but updates reads them), so the merged
 * region stays convex. */
static bool merge_updates(fz *f)
{
    tf_module *m = f->m;
    int D = m->decls.n;
    bool *ok = tf_malloc((size_t)(f->ng ? f->ng : 1) * sizeof *ok), *feeds = tf_calloc((size_t)(f->ng ? f->ng : 1), sizeof *feeds);
    if (!ok || !feeds) {
        tf_free(ok);
        tf_free(feeds);
        return false;   /* out of memory: the pass fails (an embedder's allocator said no; see ir/alloc.h) */
    }
    for (int g = 0; g < f->ng; g++) ok[g] = f->g[g].count > 0 && f->g[g].kind == TF_REGION_POINTWISE;
    for (int i = 0; i < f->n; i++) {
        tf_node *n = f->nodes[i];
        int gi = f->grp[i];
        if (gi >= 0 && !n->backward) ok[gi] = false;
        for (int k = 0; k < n->nin; k++) {   /* a value read outside its group disqualifies the group */
            tf_value *v = n->in[k];
            if (v->kind != TF_VAL_NODE) continue;
            int gv = f->grp[index_of(v->def) - D];
            if (gv >= 0 && gv != gi) ok[gv] = false;
        }
    }
    for (int i = 0; i < m->noutputs; i++) {
        tf_value *v = m->outputs[i].value;
        if (v->kind == TF_VAL_NODE && f->grp[index_of(v->def) - D] >= 0) ok[f->grp[index_of(v->def) - D]] = false;
    }
    for (int i = 0; i < m->nupdates; i++) {
        tf_value *v = m->updates[i].value;
        if (v->kind == TF_VAL_NODE && f->grp[index_of(v->def) - D] >= 0) feeds[f->grp[index_of(v->def) - D]] = true;
    }
    /* a step that recomputes (checkpoint fitting it into a memory budget)
     * keeps one kernel per param: a region's operands live to its end, so
     * one multi-tensor kernel would hold every gradient while it writes
     * every new param and moment, the step's peak once the activations are
     * recomputed (gpt: 98.4 MB at best that way, 89.2 MB per param) */
    bool split = false;
    int into = -1, merged = 0;
    for (int i = 0; i < f->n && !split; i++) split = f->nodes[i]->recompute;
    for (int g = 0; g < f->ng && !split; g++) {
        if (!ok[g] || !feeds[g]) continue;
        if (into < 0) {
            into = g;
            f->g[g].kind = TF_REGION_MULTI;
            continue;
        }
        join_groups(f, into, g);
        merged++;
    }
    if (split)
        tf_explain(f->o, "fuse", NULL, "the step recomputes (--checkpoint=auto): the optimizer's update chains run "
                   "one kernel per param, so that each gradient dies when its update has read it");
    if (into >= 0 && merged)
        tf_explain(f->o, "fuse", NULL, "the optimizer's %d update chains run as one multi-tensor kernel", merged + 1);
    else if (into >= 0 && f->g[into].count < 2)
        f->g[into].kind = TF_REGION_POINTWISE;   /* a single lone update: no region needed */
    tf_free(ok);
    tf_free(feeds);
    return true;
}

/* A multi-tensor region's members (n of them, in program order) reordered
 * so that each update chain (the members connected through values the
 * region computes) is one run: the kernel IR then has one kernel per chain
 * (kernel.c), and no chain's kernel reads what another's writes, which lets
 * the cuda target launch them all at once. Chains keep the order of their
 * first members, members their program order; a chain reads nothing
 * another chain computes, so the order stays topological. false when out of
 * memory. */
static bool chains_together(fz *f, const int *unit_of, int *mem, int n)
{
    int D = f->m->decls.n;
    int *root = tf_malloc((size_t)n * sizeof *root), *pos = tf_malloc((size_t)f->n * sizeof *pos), *tmp = tf_malloc((size_t)n * sizeof *tmp);
    if (!root || !pos || !tmp) {
        tf_free(root), tf_free(pos), tf_free(tmp);
        return false;
    }
    for (int p = 0; p < n; p++) {
        root[p] = p;
        pos[mem[p]] = p;
    }
    for (int p = 0; p < n; p++) {
        const tf_node *nd = f->nodes[mem[p]];
        for (int k = 0; k < nd->nin; k++) {
            tf_value *v = nd->in[k];
            if (v->kind != TF_VAL_NODE || unit_of[index_of(v->def) - D] != unit_of[mem[p]]) continue;
            int a = p, b = pos[index_of(v->def) - D];
            while (root[a] != a) a = root[a];
            while (root[b] != b) b = root[b];
            if (a != b) root[a > b ? a : b] = a < b ? a : b;   /* the root is the chain's first member */
        }
    }
    for (int p = 0; p < n; p++) {   /* flatten: every member names its chain's first */
        int a = p;
        while (root[a] != a) a = root[a];
        root[p] = a;
    }
    int no = 0;
    for (int c = 0; c < n; c++)
        if (root[c] == c)
            for (int p = c; p < n; p++)
                if (root[p] == c) tmp[no++] = mem[p];
    memcpy(mem, tmp, (size_t)n * sizeof *mem);
    tf_free(root), tf_free(pos), tf_free(tmp);
    return true;
}

/* Order nodes so each region is contiguous: Kahn's algorithm over regions
 * (and lone nodes), taking the ready unit with the earliest first node. */
static tf_ir_status reorder(fz *f, int *unit_of, int nunits, int *unit_first)
{
    int D = f->m->decls.n;
    int *indeg = tf_calloc((size_t)nunits, sizeof *indeg), *heap = tf_malloc((size_t)nunits * sizeof *heap);
    tf_node **out = tf_malloc((size_t)f->n * sizeof *out);
    int *start = tf_calloc((size_t)nunits + 1, sizeof *start), *members = tf_malloc((size_t)f->n * sizeof *members);
    if (!indeg || !heap || !out || !start || !members) {
        tf_free(indeg), tf_free(heap), tf_free(out), tf_free(start), tf_free(members);
        return TF_IR_ERR_OOM;
    }
    /* members of each unit in program order */
    for (int i = 0; i < f->n; i++) start[unit_of[i] + 1]++;
    for (int u = 0; u < nunits; u++) start[u + 1] += start[u];
    int *fill = indeg;   /* reuse as cursor, reset below */
    for (int i = 0; i < f->n; i++) members[start[unit_of[i]] + fill[unit_of[i]]++] = i;
    for (int u = 0; u < nunits; u++) {
        const tf_node *first = f->nodes[members[start[u]]];
        if (start[u + 1] - start[u] > 2 && first->region && f->m->regions[first->region - 1].kind == TF_REGION_MULTI &&
            !chains_together(f, unit_of, members + start[u], start[u + 1] - start[u])) {
            tf_free(indeg), tf_free(heap), tf_free(out), tf_free(start), tf_free(members);
            return TF_IR_ERR_OOM;
        }
    }
    memset(indeg, 0, (size_t)nunits * sizeof *indeg);
    /* each edge into a unit from another: counted in indeg, listed under its producer (cstart/cons: the
     * consumers' units by producer node, one entry per operand), so a unit releases its consumers without
     * a scan of the nodes after it */
    int *cstart = tf_calloc((size_t)f->n + 1, sizeof *cstart), nedges = 0;
    for (int i = 0; cstart && i < f->n; i++)
        for (int k = 0; k < f->nodes[i]->nin; k++) {
            tf_value *v = f->nodes[i]->in[k];
            if (v->kind == TF_VAL_NODE && unit_of[index_of(v->def) - D] != unit_of[i]) {
                indeg[unit_of[i]]++;
                cstart[index_of(v->def) - D + 1]++;
                nedges++;
            }
        }
    int *cons = cstart ? tf_malloc((size_t)(nedges ? nedges : 1) * sizeof *cons) : NULL;
    if (!cons) {
        tf_free(indeg), tf_free(heap), tf_free(out), tf_free(start), tf_free(members), tf_free(cstart);
        return TF_IR_ERR_OOM;
    }
    for (int i = 0; i < f->n; i++) cstart[i + 1] += cstart[i];
    for (int i = 0; i < f->n; i++)   /* consumers in program order, as the scan met them */
        for (int k = 0; k < f->nodes[i]->nin; k++) {
            tf_value *v = f->nodes[i]->in[k];
            int j = v->kind == TF_VAL_NODE ? index_of(v->def) - D : -1;
            if (j >= 0 && unit_of[j] != unit_of[i]) cons[cstart[j]++] = unit_of[i];
        }
    for (int i = f->n; i > 0; i--) cstart[i] = cstart[i - 1];   /* back to starts */
    cstart[0] = 0;
    int hn = 0, no = 0;
    for (int u = 0; u < nunits; u++)
        if (!indeg[u]) heap[hn++] = u;
    while (hn) {
        int best = 0;   /* units are few per step: a linear pick keeps this short */
        for (int k = 1; k < hn; k++)
            if (unit_first[heap[k]] < unit_first[heap[best]]) best = k;
        int u = heap[best];
        heap[best] = heap[--hn];
        for (int p = start[u]; p < start[u + 1]; p++) {
            int i = members[p];
            out[no++] = f->nodes[i];
            for (int e = cstart[i]; e < cstart[i + 1]; e++)   /* release consumers */
                if (--indeg[cons[e]] == 0) heap[hn++] = cons[e];
        }
    }
    tf_ir_status st = no == f->n ? TF_IR_OK : TF_IR_ERR_INTERNAL;
    if (!st && f->n) memcpy(f->m->nodes.items, out, (size_t)f->n * sizeof *out);
    tf_free(indeg), tf_free(heap), tf_free(out), tf_free(start), tf_free(members), tf_free(cstart), tf_free(cons);
    return st;
}

/* Which values leave their region: read by an op outside it, an output or
 * an update. One pass over the module; leaves[id] by value id. */
static bool *values_leaving(const tf_module *m)
{
    int V = 0;
    for (int i = 0; i < m->decls.n; i++) V = ((tf_value *)m->decls.items[i])->id + 1 > V ? ((tf_value *)m->decls.items[i])->id + 1 : V;
    for (int i = 0; i < m->nodes.n; i++) {
        int id = ((tf_node *)m->nodes.items[i])->out->id;
        if (id + 1 > V) V = id + 1;
    }
    bool *leaves = tf_calloc((size_t)(V ? V : 1), sizeof *leaves);
    if (!leaves) return NULL;
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *u = m->nodes.items[i];
        for (int k = 0; k < u->nin; k++)
            if (u->in[k]->kind == TF_VAL_NODE && u->in[k]->def->region != u->region) leaves[u->in[k]->id] = true;
    }
    for (int i = 0; i < m->noutputs; i++) leaves[m->outputs[i].value->id] |= m->outputs[i].value->kind == TF_VAL_NODE;
    for (int i = 0; i < m->nupdates; i++) leaves[m->updates[i].value->id] |= m->updates[i].value->kind == TF_VAL_NODE;
    return leaves;
}

tf_ir_status pass_fuse(tf_module *m, const tf_options *o)
{
    tf_module_clear_regions(m);
    tf_module_renumber(m);
    fz f = {.m = m, .o = o, .n = m->nodes.n, .nodes = (tf_node **)m->nodes.items};
    size_t n = (size_t)(f.n ? f.n : 1);
    f.grp = tf_malloc(n * sizeof *f.grp);
    f.next = tf_malloc(n * sizeof *f.next);
    f.g = tf_calloc(n, sizeof *f.g);
    f.stamp = tf_calloc(n, sizeof *f.stamp);
    f.stack = tf_malloc(n * sizeof *f.stack);
    f.members = tf_malloc(n * sizeof *f.members);
    f.why = tf_calloc(n, sizeof *f.why);
    bool *mark = tf_calloc(n, sizeof *mark);
    int *unit_of = tf_malloc(n * sizeof *unit_of), *unit_first = tf_malloc(n * sizeof *unit_first), *region_of = tf_calloc(n, sizeof *region_of);
    tf_ir_status st = TF_IR_OK;
    if (!f.grp || !f.next || !f.g || !f.stamp || !f.stack || !f.members || !f.why || !mark || !unit_of || !unit_first || !region_of) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in fuse");
        goto done;
    }
    for (int i = 0; i < f.n; i++) f.grp[i] = -1;
    /* which results only reductions read */
    bool *other_reader = tf_calloc(n, sizeof *other_reader);
    f.to_reduction = tf_calloc(n, sizeof *f.to_reduction);
    if (!other_reader || !f.to_reduction) {
        tf_free(other_reader);
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in fuse");
        goto done;
    }
    for (int i = 0; i < f.n; i++) {
        const tf_node *r = f.nodes[i];
        for (int k = 0; k < r->nin; k++) {
            const tf_value *v = r->in[k];
            if (v->kind != TF_VAL_NODE) continue;
            int j = index_of(v->def) - m->decls.n;
            if (node_class(&f, r) == C_RED && k == 0) f.to_reduction[j] = true;
            else other_reader[j] = true;
        }
    }
    for (int i = 0; i < m->noutputs + m->nupdates; i++) {
        const tf_value *v = i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value;
        if (v->kind == TF_VAL_NODE) other_reader[index_of(v->def) - m->decls.n] = true;
    }
    for (int i = 0; i < f.n; i++) f.to_reduction[i] = f.to_reduction[i] && !other_reader[i];
    tf_free(other_reader);
    group_nodes(&f, mark);
    if (!merge_updates(&f)) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in fuse");
        goto done;
    }

    /* groups of two or more ops become regions; units for ordering */
    int nunits = 0, nreg = 0;
    int *unit_of_group = tf_malloc(n * sizeof *unit_of_group);
    if (!unit_of_group) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in fuse");
        goto done;
    }
    for (int gi = 0; gi < f.ng; gi++) unit_of_group[gi] = -1;
    for (int i = 0; i < f.n; i++) {
        int gi = f.grp[i];
        bool fused = gi >= 0 && f.g[gi].count >= 2;
        if (fused && unit_of_group[gi] >= 0) {
            unit_of[i] = unit_of_group[gi];
            continue;
        }
        unit_of[i] = nunits;
        unit_first[nunits] = i;
        if (fused) {
            unit_of_group[gi] = nunits;
            char name[32];
            snprintf(name, sizeof name, "fuse.%d", ++nreg);
            region_of[nunits] = tf_module_add_region(m, name, (tf_region_kind)f.g[gi].kind, f.nodes[i]->loc);
            if (!region_of[nunits]) {
                tf_free(unit_of_group);
                st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in fuse");
                goto done;
            }
        }
        nunits++;
    }
    for (int i = 0; i < f.n; i++) f.nodes[i]->region = region_of[unit_of[i]];
    tf_free(unit_of_group);

    /* explain, in program order, before nodes move */
    for (int i = 0; i < f.n && o->explain; i++) {
        tf_node *nd = f.nodes[i];
        const char *op = tf_op_info_of(nd->op)->name;
        int c = node_class(&f, nd);
        if (nd->region) continue;
        if (c == C_VIEW) tf_explain(o, "fuse", &nd->loc, "%s %s: a view, no kernel", op, nd->out->name);
        else if (c == C_GEMM) tf_explain(o, "fuse", &nd->loc, "%s %s: library call, no pointwise epilogue to fuse", op, nd->out->name);
        else if (c == C_OTHER) tf_explain(o, "fuse", &nd->loc, "%s %s: not fused: %s ops run as their own kernel", op,
                                          nd->out->name, op);
        else tf_explain(o, "fuse", &nd->loc, "%s %s: not fused: %s", op, nd->out->name, f.why[i] ? f.why[i] : "nothing to fuse it with");
    }
    if ((st = reorder(&f, unit_of, nunits, unit_first))) {
        st = tf_diag_error(o->diag, st, NULL, st == TF_IR_ERR_OOM ? "out of memory in fuse" : "internal: fuse made a cycle");
        goto done;
    }
    /* yields: what each region's members give to the rest of the module;
     * regions are contiguous now, so each is one run of nodes */
    bool *leaving = values_leaving(m);
    if (!leaving) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in fuse");
        goto done;
    }
    for (int i = 0, r; i < f.n; i = r) {
        r = i + 1;
        if (!f.nodes[i]->region) continue;
        while (r < f.n && f.nodes[r]->region == f.nodes[i]->region) r++;
        tf_region *rg = &m->regions[f.nodes[i]->region - 1];
        int cnt = 0, total = r - i;
        rg->yields = tf_arena_array(&m->arena, (size_t)total, sizeof *rg->yields);
        if (!rg->yields) {
            tf_free(leaving);
            st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in fuse");
            goto done;
        }
        char list[512];
        size_t k = 0;
        list[0] = 0;
        for (int q = i; q < r; q++) {
            tf_node *nd = f.nodes[q];
            if (k < sizeof list) k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "", nd->out->name);
            if (leaving[nd->out->id]) rg->yields[cnt++] = nd->out;
        }
        rg->nyields = cnt;
        /* fast 16-bit numerics (tf_node_wide): marked where it changes something */
        rg->wide = !o->numerics_exact && tf_region_has_wide(m, f.nodes[i]->region);
        tf_explain(o, "fuse", &rg->loc, "%s (%s): %d ops in one kernel, %d value%s leave%s it: %s", rg->name,
                   tf_region_kind_name(rg->kind), total, cnt, cnt == 1 ? "" : "s", cnt == 1 ? "s" : "", list);
    }
    tf_free(leaving);
    tf_module_renumber(m);
done:
    tf_free(f.grp), tf_free(f.next), tf_free(f.g), tf_free(f.stamp), tf_free(f.stack), tf_free(f.members), tf_free(f.why), tf_free(mark);
    tf_free(f.to_reduction);
    tf_free(unit_of), tf_free(unit_first), tf_free(region_of);
    return st;
}
