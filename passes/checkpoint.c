/* checkpoint.c — activation checkpointing: for each forward value the
 * backward pass reads, keep it or compute it again where it is needed.
 *
 * `--checkpoint=auto --memory-budget=BYTES|PCT%`: a recomputed forward value
 * is computed again just before the backward pass first needs it, so the
 * forward copy dies at its last forward use. Any forward op may be
 * recomputed (pointwise, layout, reductions, matmul, convolution, pooling,
 * gather), except random ones (dropout masks) and values that live to the
 * end of the step anyway (outputs, updates). A recomputation reads the
 * recomputed copies of its operands where those are recomputed too, so a
 * chain (the interior of a transformer block, say) is recomputed from the
 * values kept around it, as in Chen et al.'s segment recomputation: each
 * recomputed value is placed before the first backward op that needs it or
 * that needs a recomputation reading it.
 *
 * tf_checkpoint_plan orders the choices: candidates (forward values the
 * backward reads) by bytes saved per FLOP recomputed (ir/cost.c), the FLOPs
 * of the whole group each needs: the candidate with what it drags along
 * (the reshape views of it or under it, and the operands that would
 * otherwise be dead by then: a chain), so that an add reading a matmul is
 * as dear as the matmul. A candidate is tried with its chain, then alone
 * (those operands kept from the forward pass instead). It simulates the
 * step's liveness (one sweep over the ops, the recomputations in place; a
 * pointwise copy read only by pointwise ops and reductions is fused into
 * them and never stored) and keeps a group when the estimated peak goes
 * down, or stays while less is held elsewhere; passes repeat until nothing
 * more helps. The result is a sequence of groups with the
 * estimated peak after each: a larger budget takes a shorter prefix, so the
 * cheapest recomputations come first. tf_fit_pipeline (fit.c) picks the
 * prefix against the real planned peak (the rest of the pipeline, fusion
 * included, to memplan) and hands it to this pass in o->recompute; the pass
 * applies it and nothing else. Recomputed ops print with `recompute=true`
 * (cse leaves them be) and --explain lists each with the bytes it frees and
 * the FLOPs it adds. Gradients are the same bits: a recomputation is the
 * same op on the same operand values. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int64_t bytes_of(const tf_value *v) { return tf_type_numel(&v->type) * tf_dtype_bytes(v->type.dtype); }
static int64_t aligned(int64_t b) { return (b + 255) / 256 * 256; }

/* The module right after autodiff, as arrays over node indices. */
typedef struct ck_graph {
    int N, bs;
    int *in_off, *in;         /* operands of node i that are nodes: in[in_off[i] .. in_off[i+1]) */
    int *fc_off, *fc;         /* forward consumers (forward nodes) of forward node i */
    int64_t *bytes;           /* aligned bytes of node i's result; 0 for a view */
    int64_t *flops;
    int *view_of;             /* a reshape (a view): the node it views, else -1; -2: a view of a non-node */
    int *first_bwd;           /* the first backward node reading forward node i, N if none */
    bool *pinned;             /* output or update: lives to the end anyway */
    bool *recomputable;
    bool *cheap;              /* pointwise or layout: recomputed afresh for each backward op that needs it */
    bool *pointwise, *fusible;   /* a pointwise op; one that fuse puts in a pointwise or reduction kernel */
} ck_graph;

/* The step with the recomputations in place (schedule): events in order,
 * each an op of the module (val = its node index) or a recomputation (val =
 * N + k for the k-th), and the value each reads for each node operand. */
typedef struct ck_sched {
    int n, cap;
    int *node, *val, *in_off;
    int *in, nin, cap_in;
    int nvals;                /* N + recomputations */
    bool oom;
    /* per forward node: the shared recomputation of an op that is not cheap,
     * and the one made for the backward op `stamp` of a cheap one */
    int *shared, *memo, *stamp;
    bool sticky;              /* too many recomputations: cheap ones are shared too */
    /* simulation scratch: nvals long, and events long */
    int *def, *last, *root, cap_vals;
    bool *stored;             /* a value that reaches memory (not a pointwise copy fused into its readers) */
    int64_t *delta;
    double area;              /* simulate's live bytes summed over the events */
} ck_sched;

static int node_of(const tf_module *m, const tf_value *v)
{
    if (v->kind != TF_VAL_NODE || v->id < m->decls.n) return -1;
    return v->id - m->decls.n;
}

static void graph_free(ck_graph *g)
{
    tf_free(g->in_off), tf_free(g->in), tf_free(g->fc_off), tf_free(g->fc), tf_free(g->bytes), tf_free(g->flops);
    tf_free(g->view_of), tf_free(g->first_bwd), tf_free(g->pinned), tf_free(g->recomputable), tf_free(g->cheap);
    tf_free(g->pointwise), tf_free(g->fusible);
    *g = (ck_graph){0};
}

static bool graph_build(tf_module *m, ck_graph *g)
{
    tf_module_renumber(m);
    int N = m->nodes.n, bs = m->backward_start, E = 0;
    *g = (ck_graph){.N = N, .bs = bs};
    for (int i = 0; i < N; i++) E += ((tf_node *)m->nodes.items[i])->nin;
    size_t n1 = (size_t)N + 1, e1 = (size_t)E + 1;
    g->in_off = tf_calloc(n1, sizeof(int)), g->in = tf_malloc(e1 * sizeof(int));
    g->fc_off = tf_calloc(n1 + 1, sizeof(int)), g->fc = tf_malloc(e1 * sizeof(int));
    g->bytes = tf_calloc(n1, sizeof(int64_t)), g->flops = tf_calloc(n1, sizeof(int64_t));
    g->view_of = tf_malloc(n1 * sizeof(int)), g->first_bwd = tf_malloc(n1 * sizeof(int));
    g->pinned = tf_calloc(n1, sizeof(bool)), g->recomputable = tf_calloc(n1, sizeof(bool));
    g->cheap = tf_calloc(n1, sizeof(bool));
    g->pointwise = tf_calloc(n1, sizeof(bool)), g->fusible = tf_calloc(n1, sizeof(bool));
    int *fill = tf_calloc(n1, sizeof(int));
    if (!g->in_off || !g->in || !g->fc_off || !g->fc || !g->bytes || !g->flops || !g->view_of || !g->first_bwd ||
        !g->pinned || !g->recomputable || !g->cheap || !g->pointwise || !g->fusible || !fill) {
        tf_free(fill);
        graph_free(g);
        return false;
    }
    int k = 0;
    for (int i = 0; i < N; i++) {
        tf_node *n = m->nodes.items[i];
        g->in_off[i] = k;
        for (int q = 0; q < n->nin; q++) {
            int u = node_of(m, n->in[q]);
            if (u >= 0) g->in[k++] = u;
        }
        bool view = n->op == TF_OP_RESHAPE && n->in[0]->kind != TF_VAL_CONST;
        g->view_of[i] = view ? (node_of(m, n->in[0]) >= 0 ? node_of(m, n->in[0]) : -2) : -1;
        g->bytes[i] = view ? 0 : aligned(bytes_of(n->out));
        g->flops[i] = tf_node_flops(n);
        g->first_bwd[i] = N;
        tf_op_kind kd = tf_op_info_of(n->op)->kind;
        g->recomputable[i] = i < bs && kd != TF_OPK_RNG && kd != TF_OPK_COMM && !tf_op_has(n->op, TF_OPF_LAYER) && !n->region;
        g->cheap[i] = kd == TF_OPK_LAYOUT || kd == TF_OPK_POINTWISE;
        /* a broadcast fuse folds into its readers' kernel is as a pointwise op there (the estimate
         * assumes the fused plan, not tf_fit_pipeline's second try) */
        g->pointwise[i] = kd == TF_OPK_POINTWISE || tf_fuse_folds_broadcast(n, false);
        g->fusible[i] = g->pointwise[i] || kd == TF_OPK_REDUCTION;
    }
    g->in_off[N] = k;
    for (int i = 0; i < m->noutputs; i++) {
        int u = node_of(m, m->outputs[i].value);
        if (u >= 0) g->pinned[u] = true;
    }
    for (int i = 0; i < m->nupdates; i++) {
        int u = node_of(m, m->updates[i].value);
        if (u >= 0) g->pinned[u] = true;
    }
    /* an update memplan will likely write in place into its param or
     * buffer (memplan.c's home_updates: a pointwise result after every
     * reader of that state, which no output or other update reads) takes
     * no room in the arena */
    int *last_read = tf_malloc((size_t)(m->decls.n ? m->decls.n : 1) * sizeof(int));
    if (!last_read) {
        tf_free(fill);
        graph_free(g);
        return false;
    }
    for (int i = 0; i < m->decls.n; i++) last_read[i] = -1;
    for (int j = 0; j < N; j++) {
        tf_node *n = m->nodes.items[j];
        for (int q = 0; q < n->nin; q++) {
            const tf_value *r = n->in[q];
            while (r->kind == TF_VAL_NODE && r->def->op == TF_OP_RESHAPE && r->def->in[0]->kind != TF_VAL_CONST) r = r->def->in[0];
            if ((r->kind == TF_VAL_PARAM || r->kind == TF_VAL_BUFFER) && r->id >= 0 && r->id < m->decls.n) last_read[r->id] = j;
        }
    }
    for (int i = 0; i < m->noutputs + m->nupdates; i++) {   /* read at the step's end */
        const tf_value *r = i < m->noutputs ? m->outputs[i].value : m->updates[i - m->noutputs].value;
        if ((r->kind == TF_VAL_PARAM || r->kind == TF_VAL_BUFFER) && r->id >= 0 && r->id < m->decls.n) last_read[r->id] = N;
    }
    for (int i = 0; i < m->nupdates; i++) {
        const tf_value *b = m->updates[i].buffer;
        int u = node_of(m, m->updates[i].value);
        if (u >= 0 && g->pointwise[u] && b->id >= 0 && b->id < m->decls.n && last_read[b->id] <= u) g->bytes[u] = 0;
    }
    tf_free(last_read);
    /* a pinned view pins what it views */
    for (int i = N - 1; i >= 0; i--)
        if (g->pinned[i] && g->view_of[i] >= 0) g->pinned[g->view_of[i]] = true;
    for (int j = 0; j < N; j++)
        for (int q = g->in_off[j]; q < g->in_off[j + 1]; q++) {
            int u = g->in[q];
            if (j >= bs && u < bs && g->first_bwd[u] == N) g->first_bwd[u] = j;
            if (j < bs) g->fc_off[u + 1]++;
        }
    for (int i = 0; i < N; i++) g->fc_off[i + 1] += g->fc_off[i];
    for (int j = 0; j < bs; j++)
        for (int q = g->in_off[j]; q < g->in_off[j + 1]; q++) {
            int u = g->in[q];
            g->fc[g->fc_off[u] + fill[u]++] = j;
        }
    tf_free(fill);
    return true;
}

static void sched_free(ck_sched *s)
{
    tf_free(s->node), tf_free(s->val), tf_free(s->in_off), tf_free(s->in), tf_free(s->shared), tf_free(s->memo);
    tf_free(s->stamp), tf_free(s->def), tf_free(s->last), tf_free(s->root), tf_free(s->delta);
    tf_free(s->stored);
    *s = (ck_sched){0};
}

static void push_event(ck_sched *s, int node, int val)
{
    if (s->oom) return;
    if (s->n + 1 >= s->cap) {
        int c = s->cap ? 2 * s->cap : 1024;
        int *a = tf_realloc(s->node, (size_t)c * sizeof(int)), *b = a ? tf_realloc(s->val, (size_t)c * sizeof(int)) : NULL;
        int *d = b ? tf_realloc(s->in_off, ((size_t)c + 1) * sizeof(int)) : NULL;
        if (a) s->node = a;
        if (b) s->val = b;
        if (d) s->in_off = d;
        if (!a || !b || !d) {
            s->oom = true;
            return;
        }
        s->cap = c;
    }
    s->node[s->n] = node;
    s->val[s->n] = val;
    s->in_off[s->n] = s->nin;
    s->in_off[++s->n] = s->nin;
}

static void push_operand(ck_sched *s, int v)
{
    if (s->oom) return;
    if (tf_grow((void **)&s->in, s->nin, &s->cap_in, sizeof(int))) {
        s->oom = true;
        return;
    }
    s->in[s->nin++] = v;
    s->in_off[s->n] = s->nin;
}

/* The value backward op j reads for forward node u: u itself, or its
 * recomputation, made here (after what it reads) when there is none to
 * reuse: a cheap op's is made again for each backward op, so that it fuses
 * into that op's kernel and is never stored; another op's once, shared. */
static int recomputed(const ck_graph *g, ck_sched *s, const bool *chosen, int u, int j)
{
    if (u >= g->bs || !chosen[u] || s->oom) return u;
    bool own = g->cheap[u] && !s->sticky;
    if (!own && s->shared[u] >= 0) return s->shared[u];
    if (own && s->stamp[u] == j) return s->memo[u];
    for (int q = g->in_off[u]; q < g->in_off[u + 1]; q++) recomputed(g, s, chosen, g->in[q], j);
    int v = s->nvals++;
    push_event(s, u, v);
    if (own) s->stamp[u] = j, s->memo[u] = v;
    else s->shared[u] = v;
    for (int q = g->in_off[u]; q < g->in_off[u + 1]; q++)   /* made above: found, not made again */
        push_operand(s, recomputed(g, s, chosen, g->in[q], j));
    if (s->nvals > 4 * g->N + 64) s->sticky = true;   /* a bound on the work; sharing is always correct */
    return v;
}

/* The step recomputing `chosen`: forward ops, then each backward op after
 * the recomputations it needs. false: out of memory. */
static bool schedule(const ck_graph *g, const bool *chosen, ck_sched *s)
{
    int N = g->N, bs = g->bs;
    s->n = s->nin = 0;
    s->nvals = N;
    s->sticky = s->oom = false;
    if (!s->shared) {
        s->shared = tf_malloc(((size_t)bs + 1) * sizeof(int));
        s->memo = tf_malloc(((size_t)bs + 1) * sizeof(int));
        s->stamp = tf_malloc(((size_t)bs + 1) * sizeof(int));
        if (!s->shared || !s->memo || !s->stamp) return false;
    }
    for (int i = 0; i < bs; i++) s->shared[i] = s->stamp[i] = -1;
    for (int j = 0; j < N && !s->oom; j++) {
        for (int q = g->in_off[j]; j >= bs && q < g->in_off[j + 1]; q++) recomputed(g, s, chosen, g->in[q], j);
        push_event(s, j, j);
        for (int q = g->in_off[j]; q < g->in_off[j + 1]; q++)
            push_operand(s, j >= bs ? recomputed(g, s, chosen, g->in[q], j) : g->in[q]);
    }
    if (!s->oom && s->nvals > s->cap_vals) {
        int c = s->nvals + s->nvals / 2;
        tf_free(s->def), tf_free(s->last), tf_free(s->root), tf_free(s->stored);
        s->def = tf_malloc((size_t)c * sizeof(int)), s->last = tf_malloc((size_t)c * sizeof(int));
        s->root = tf_malloc((size_t)c * sizeof(int)), s->stored = tf_malloc((size_t)c * sizeof(bool));
        s->cap_vals = c;
        if (!s->def || !s->last || !s->root || !s->stored) s->oom = true, s->cap_vals = 0;
    }
    if (!s->oom) {
        int64_t *d = tf_realloc(s->delta, ((size_t)s->n + 1) * sizeof(int64_t));
        if (!d) s->oom = true;
        else s->delta = d;
    }
    return !s->oom;
}

/* The estimated arena peak of the step recomputing `chosen` (-1: out of
 * memory): every value from its op to its last use (outputs and updates to
 * the end), a view holding what it views, sizes 256-byte aligned; no
 * fusion, no reuse in place. floor_mode: a forward value a backward op reads
 * is made for that op alone and dies with it (recomputation for free: a
 * lower bound on any schedule). */
static int64_t simulate(const ck_graph *g, ck_sched *s, const bool *chosen, bool floor_mode)
{
    if (!schedule(g, chosen, s)) return -1;
    int bs = g->bs, T = s->n;
    for (int v = 0; v < s->nvals; v++) s->def[v] = s->last[v] = -1, s->stored[v] = true;
    /* a pointwise op's copy made for one backward op, read only by pointwise
     * ops and reductions, runs inside their kernel (fuse): never stored */
    for (int t = 0; t < T; t++)
        if (s->val[t] >= g->N && g->cheap[s->node[t]] && g->pointwise[s->node[t]]) s->stored[s->val[t]] = false;
    for (int t = 0; t < T; t++)
        for (int q = s->in_off[t]; q < s->in_off[t + 1] && !g->fusible[s->node[t]]; q++) s->stored[s->in[q]] = true;
    for (int t = 0; t < T; t++) {
        int node = s->node[t], val = s->val[t];
        s->def[val] = t;
        for (int q = s->in_off[t]; q < s->in_off[t + 1]; q++) {
            int r = s->root[s->in[q]];
            if (floor_mode && node >= bs && r < bs) continue;   /* counted at this op below */
            if (s->last[r] < t) s->last[r] = t;
        }
        s->root[val] = g->view_of[node] >= 0 && s->in_off[t + 1] > s->in_off[t] ? s->root[s->in[s->in_off[t]]] : val;
        if (val == node && g->pinned[node]) s->last[s->root[val]] = T;
    }
    for (int t = 0; t <= T; t++) s->delta[t] = 0;
    for (int t = 0; t < T; t++) {
        int v = s->val[t];
        int64_t b = s->stored[v] ? g->bytes[s->node[t]] : 0;
        if (!b) continue;
        int l = s->last[v] < t ? t : s->last[v];
        s->delta[t] += b;
        if (l < T) s->delta[l + 1] -= b;
    }
    int64_t live = 0, peak = 0;
    s->area = 0;
    for (int t = 0; t < T; t++) {
        live += s->delta[t];
        s->area += (double)live;
        int64_t here = live;
        if (floor_mode && s->node[t] >= bs)
            for (int q = s->in_off[t]; q < s->in_off[t + 1]; q++) {
                int r = s->root[s->in[q]];
                if (r < bs && !g->pinned[r]) here += g->bytes[r];
            }
        if (here > peak) peak = here;
    }
    return peak;
}

void tf_checkpoint_plan_free(tf_ckpt_plan *p)
{
    if (!p) return;
    tf_free(p->nodes);
    tf_free(p->group_end);
    tf_free(p->group_est);
    *p = (tf_ckpt_plan){0};
}

typedef struct cand { int node; double score; } cand;

static int cand_order(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->node - y->node;
}

/* Add to the group (grp, *ng) node c and, transitively, what recomputing it
 * needs recomputed too: a view's target, the views of it the backward reads,
 * and operands that the backward would not otherwise keep. false: one of
 * them cannot be recomputed. */
static bool grow(ck_graph *g, const bool *chosen, const bool *read_back, bool *in_grp, int *grp, int *ng, int c, bool drag)
{
    int head = *ng;
    if (in_grp[c] || chosen[c]) return true;
    in_grp[c] = true;
    grp[(*ng)++] = c;
    for (; head < *ng; head++) {
        int x = grp[head];
        if (!g->recomputable[x] || g->pinned[x]) return false;
        for (int q = g->in_off[x]; q < g->in_off[x + 1]; q++) {
            int u = g->in[q];
            if (u >= g->bs || chosen[u] || in_grp[u]) continue;
            if (g->view_of[x] == u || (drag && !read_back[u] && !g->pinned[u] && g->recomputable[u])) {
                in_grp[u] = true;
                grp[(*ng)++] = u;
            }
        }
        for (int q = g->fc_off[x]; q < g->fc_off[x + 1]; q++) {
            int v = g->fc[q];
            if (g->view_of[v] == x && read_back[v] && !chosen[v] && !in_grp[v]) {
                in_grp[v] = true;
                grp[(*ng)++] = v;
            }
        }
    }
    return true;
}

tf_ir_status tf_checkpoint_plan(tf_module *m, tf_diag *d, tf_ckpt_plan *p)
{
    *p = (tf_ckpt_plan){0};
    ck_graph g;
    if (!graph_build(m, &g)) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
    int N = g.N, bs = g.bs, nc = 0;
    ck_sched sc = {0};
    size_t n1 = (size_t)N + 1;
    bool *chosen = tf_calloc(n1, sizeof(bool)), *read_back = tf_calloc(n1, sizeof(bool)), *in_grp = tf_calloc(n1, sizeof(bool));
    int *grp = tf_malloc(n1 * sizeof(int));
    cand *c = tf_malloc(n1 * sizeof *c);
    p->nodes = tf_malloc(n1 * sizeof(int));
    p->group_end = tf_malloc(n1 * sizeof(int));
    p->group_est = tf_malloc(n1 * sizeof(int64_t));
    tf_ir_status st = TF_IR_OK;
    if (!chosen || !read_back || !in_grp || !grp || !c || !p->nodes || !p->group_end || !p->group_est) {
        st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
        goto done;
    }
    for (int i = 0; i < bs; i++) read_back[i] = g.first_bwd[i] < N;
    for (int i = 0; i < bs; i++) {
        if (!read_back[i] || !g.recomputable[i] || g.pinned[i]) continue;
        int r = i;
        while (g.view_of[r] >= 0) r = g.view_of[r];
        int64_t saved = g.bytes[r];
        if (!saved) continue;   /* a view of a decl: nothing to free */
        /* per FLOP of what recomputing it takes (its chain), not its own:
         * an add that needs a matmul recomputed is not cheap */
        int ng = 0;
        int64_t f = 0;
        bool ok = grow(&g, chosen, read_back, in_grp, grp, &ng, i, true);
        for (int q = 0; q < ng; q++) in_grp[grp[q]] = false, f += g.flops[grp[q]];
        c[nc++] = (cand){i, (double)saved / (double)((ok ? f : g.flops[i]) + 1)};
        p->ncand++;
    }
    qsort(c, (size_t)nc, sizeof *c, cand_order);
    p->floor_est = simulate(&g, &sc, chosen, true);
    p->est0 = simulate(&g, &sc, chosen, false);
    if (p->est0 < 0 || p->floor_est < 0) {
        st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
        goto done;
    }
    int64_t cur = p->est0;
    double area = sc.area;
    for (int pass = 0; pass < 8; pass++) {
        bool changed = false;
        for (int k = 0; k < nc; k++) {
            /* with the operands nothing else keeps (a chain), else alone
             * (those operands then kept from the forward pass: a layernorm
             * input instead of its centered and normed values) */
            for (int drag = 1, prev = -1; drag >= 0 && !chosen[c[k].node]; drag--) {
                int ng = 0;
                bool ok = grow(&g, chosen, read_back, in_grp, grp, &ng, c[k].node, drag);
                for (int q = 0; q < ng; q++) in_grp[grp[q]] = false;
                if (!ok || !ng || ng == prev) continue;
                prev = ng;
                for (int q = 0; q < ng; q++) chosen[grp[q]] = true;
                int64_t est = simulate(&g, &sc, chosen, false);
                if (est < 0) {
                    st = tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
                    goto done;
                }
                /* the peak falls, or stays where it is while less is held
                 * elsewhere (the planned peak, fused and placed, may be there) */
                if (est < cur || (est == cur && sc.area < area)) {
                    area = sc.area;
                    /* in node order: a recomputation after what it reads */
                    for (int q = 0; q < ng; q++) p->nodes[p->n++] = grp[q];
                    p->group_end[p->ngroups] = p->n;
                    p->group_est[p->ngroups++] = est;
                    cur = est;
                    changed = true;
                } else {
                    for (int q = 0; q < ng; q++) chosen[grp[q]] = false;
                }
            }
        }
        if (!changed) break;
    }
    /* then what the estimate turned down, each group once, in the same
     * order: moving a value's memory elsewhere can look like no gain here
     * (the simulation knows no fusion, no placement), and the driver
     * measures these one by one where no prefix fits (fit.c's refine) */
    p->nplanned = p->ngroups;
    for (int k = 0; k < nc; k++) {
        if (chosen[c[k].node]) continue;
        int ng = 0;
        bool ok = grow(&g, chosen, read_back, in_grp, grp, &ng, c[k].node, true);
        for (int q = 0; q < ng; q++) in_grp[grp[q]] = false;
        if (!ok) continue;
        int from = p->n;
        for (int q = 0; q < ng; q++)
            if (!chosen[grp[q]]) chosen[grp[q]] = true, p->nodes[p->n++] = grp[q];
        if (p->n == from) continue;
        p->group_end[p->ngroups] = p->n;
        p->group_est[p->ngroups++] = cur;
    }
done:
    tf_free(chosen);
    tf_free(read_back);
    tf_free(in_grp);
    tf_free(grp);
    tf_free(c);
    sched_free(&sc);
    graph_free(&g);
    if (st) tf_checkpoint_plan_free(p);
    return st;
}

/* Recompute nodes[0..k) of m (forward node indices, as renumbered), in the
 * order schedule() gives. */
static tf_ir_status apply(tf_module *m, const tf_options *o, const int *nodes, int k, int64_t *flops, int *made)
{
    *flops = 0;
    *made = 0;
    ck_graph g;
    ck_sched sc = {0};
    if (!graph_build(m, &g)) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
    int N = g.N, bs = g.bs;
    tf_node **old = tf_malloc((size_t)(N ? N : 1) * sizeof *old);
    bool *chosen = tf_calloc((size_t)N + 1, sizeof *chosen), *told = tf_calloc((size_t)N + 1, sizeof *told);
    tf_value **val = NULL;
    tf_ir_status st = TF_IR_OK;
    if (!old || !chosen || !told) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
        goto done;
    }
    memcpy(old, m->nodes.items, (size_t)N * sizeof *old);
    for (int i = 0; i < k; i++) {
        if (nodes[i] < 0 || nodes[i] >= bs) {
            st = tf_diag_error(o->diag, TF_IR_ERR_INTERNAL, NULL, "checkpoint: asked to recompute node %d, which is not "
                               "one of the %d forward nodes", nodes[i], bs);
            goto done;
        }
        chosen[nodes[i]] = true;
    }
    if (!schedule(&g, chosen, &sc) || !(val = tf_calloc((size_t)sc.nvals + 1, sizeof *val))) {
        st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
        goto done;
    }
    for (int i = 0; i < N; i++) val[i] = old[i]->out;
    m->nodes.n = 0;
    for (int t = 0; t < sc.n && !st; t++) {
        int e = sc.node[t], nin = 0;
        tf_node *src = old[e], *n = src;
        if (sc.val[t] != e) {   /* a recomputation: a copy with its own operand and attribute arrays */
            int na = tf_op_info_of(src->op)->nattrs;
            char name[512];
            snprintf(name, sizeof name, "%s.recompute", src->out->name);
            n = tf_arena_alloc(&m->arena, sizeof *n);
            tf_value *v = tf_arena_alloc(&m->arena, sizeof *v);
            if (!n || !v || !(n->in = NULL, *n = *src, n->in = tf_arena_array(&m->arena, (size_t)(src->nin ? src->nin : 1),
                                                                               sizeof *n->in)) ||
                !(n->attrs = tf_arena_array(&m->arena, (size_t)(na ? na : 1), sizeof *n->attrs))) {
                st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
                break;
            }
            memcpy(n->in, src->in, (size_t)src->nin * sizeof *n->in);
            memcpy(n->attrs, src->attrs, (size_t)na * sizeof *n->attrs);
            n->recompute = true;
            n->backward = true;
            n->region = 0;
            n->annotated = false;
            *v = *src->out;
            if (!(v->name = tf_module_unique_name(m, name)) || (v->def = n, v->id = -1, n->out = v, tf_module_add_name(m, v))) {
                st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
                break;
            }
            val[sc.val[t]] = v;
            int64_t f = tf_node_flops(src);
            *flops += f;
            ++*made;
            if (!told[e]) {
                told[e] = true;
                tf_explain(o, "checkpoint", &src->loc, "recompute %s (%s%s): frees %lld bytes kept from the forward "
                           "pass, adds %lld FLOPs%s", src->out->name, tf_op_info_of(src->op)->name,
                           g.cheap[e] ? ", again for each backward op that reads it, inside its kernel" : "",
                           (long long)(g.view_of[e] >= 0 ? 0 : bytes_of(src->out)), (long long)f,
                           g.cheap[e] ? " each time" : "");
            }
        }
        /* node operands take the values the schedule says, in order */
        for (int q = 0; q < n->nin; q++)
            if (node_of(m, src->in[q]) >= 0) n->in[q] = val[sc.in[sc.in_off[t] + nin++]];
        if (tf_module_append_node(m, n)) st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
    }
    tf_module_renumber(m);
done:
    tf_free(old);
    tf_free(chosen);
    tf_free(told);
    tf_free(val);
    sched_free(&sc);
    graph_free(&g);
    return st;
}

tf_ir_status pass_checkpoint(tf_module *m, const tf_options *o)
{
    if (o->mode != TF_IR_TRAIN || o->checkpoint == TF_IR_CHECKPOINT_NONE) {
        tf_explain(o, "checkpoint", NULL, "%s: every forward value the backward pass reads is kept",
                   o->mode != TF_IR_TRAIN ? "infer mode" : "--checkpoint=none");
        return TF_IR_OK;
    }
    if (!m->backward_start) {
        tf_explain(o, "checkpoint", NULL, "no backward pass right before this pass (run it after autodiff): nothing to do");
        return TF_IR_OK;
    }
    if (o->memory_budget <= 0 && o->memory_budget_pct <= 0) {
        tf_explain(o, "checkpoint", NULL, "--checkpoint=auto without --memory-budget: nothing to fit, nothing recomputed");
        return TF_IR_OK;
    }
    const tf_recompute *r = o->recompute;
    if (!r) {
        tf_explain(o, "checkpoint", NULL, "no recompute set given (tf_fit_pipeline chooses one): nothing recomputed");
        return TF_IR_OK;
    }
    if (!r->n) {
        tf_explain(o, "checkpoint", NULL, "planned peak %lld bytes fits --memory-budget=%lld: nothing recomputed",
                   (long long)r->peak_before, (long long)r->budget);
        return TF_IR_OK;
    }
    int64_t flops = 0;
    int made = 0;
    tf_ir_status st = apply(m, o, r->nodes, r->n, &flops, &made);
    if (!st)
        tf_explain(o, "checkpoint", NULL, "recomputed %d forward values in %d ops (%d of %d candidate groups, cheapest per byte first), "
                   "%lld FLOPs: planned peak %lld -> %lld bytes, within --memory-budget=%lld (the floor is about %lld)",
                   r->n, made, r->ngroups, r->ncand, (long long)flops, (long long)r->peak_before, (long long)r->peak_after,
                   (long long)r->budget, (long long)r->floor);
    return st;
}
