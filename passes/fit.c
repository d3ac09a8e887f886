/* fit.c — fitting a step into memory: one driver, beside the pass manager,
 * owns both searches and measures them the same way.
 *
 * The measure of a candidate is memplan's planned peak (arena + inputs,
 * params and buffers) after the pipeline the options describe (the same
 * list, --O0 and --disable-pass honoured), run on a copy of the module with
 * explanations and dumps off. Two searches use it:
 *
 *  - checkpoint (`--checkpoint=auto --memory-budget=BYTES`, train mode):
 *    when the run reaches an enabled checkpoint pass right after autodiff,
 *    the driver lists the candidates (tf_checkpoint_candidates: pointwise,
 *    then layout, then pooling; the larger first) and tries them in that
 *    order on copies of the module as the checkpoint pass would get it, each
 *    copy run through the checkpoint pass and the rest of the pipeline. A
 *    candidate is kept when it lowers the peak; the search stops as soon as
 *    the budget is met. The checkpoint pass then applies that set
 *    (o->recompute) and the run goes on. The passes before checkpoint run
 *    once, not per candidate. A later checkpoint pass in the same list
 *    searches again when the run reaches it (while an earlier one is
 *    measured, it recomputes nothing).
 *  - an auto dim (`--dim B=auto --memory-limit=BYTES`): the largest value
 *    whose planned peak fits the limit. Peak grows with a batch-like dim:
 *    double from 1 until a value does not fit, then bisect. Each probe is
 *    the whole run above on a copy with the dim set, so with
 *    --checkpoint=auto each probe searches its own recompute set (to the
 *    budget), and a value whose budget cannot be met does not fit.
 *
 * The checkpoint pass itself only rewrites; it never runs other passes. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int64_t peak_of(const tf_module *m)
{
    return m->plan.planned ? m->plan.arena_bytes + m->plan.persistent_bytes : -1;
}

static const tf_recompute nothing = {0};

/* A training step checkpointed under a memory budget: what the checkpoint search (and its second try) is for. */
static bool budgeted(const tf_options *o)
{
    return o->mode == TF_IR_TRAIN && o->checkpoint == TF_IR_CHECKPOINT_AUTO && (o->memory_budget > 0 || o->memory_budget_pct > 0);
}

/* The planned peak of a copy of m (the input of the checkpoint pass at `at`)
 * run through passes [at, n) of pl, that pass recomputing nodes[0..k);
 * *persistent: its inputs, params and buffers. */
static tf_ir_status measure(const tf_module *m, const tf_pipeline *pl, int at, const tf_options *o, const int *nodes,
                            int k, int64_t *peak, int64_t *persistent)
{
    *peak = -1;
    tf_module *x = tf_module_clone((tf_module *)m);
    if (!x) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
    tf_options q = *o;
    q.explain = NULL;
    q.dump_ir = NULL;
    tf_recompute r = {.nodes = nodes, .n = k};
    q.recompute = &r;
    tf_ir_status st = tf_pipeline_run(x, pl, at, at + 1, &q);
    q.recompute = &nothing;   /* a later checkpoint pass, if any */
    if (!st) st = tf_pipeline_run(x, pl, at + 1, pl->n, &q);
    if (!st) *peak = peak_of(x);
    if (!st && persistent) *persistent = x->plan.persistent_bytes;
    tf_module_free(x);
    return st;
}

static bool memplan_disabled(const tf_options *o)
{
    const tf_pass_info *mp = tf_pass_find("memplan", 7);
    return mp && tf_pass_disabled(o, mp);
}

typedef struct ck_search {
    tf_ckpt_plan plan;
    int ng;                /* groups of the plan taken */
    int64_t budget;        /* in bytes */
    int64_t peak0, best;   /* recomputing nothing; the lowest planned peak measured */
    int64_t chosen;        /* the planned peak of the ng groups */
    int64_t floor;         /* persistent + the plan's floor estimate */
    int *extra, nextra;    /* refine's set, when it ran (else NULL: the first ng groups) */
} ck_search;

/* The best prefix (s->ng groups) does not fit: try each later group on top
 * of it, measured, keeping those that lower the planned peak, until the
 * budget is met. The set is then s->extra (s->nextra nodes), not a prefix. */
static tf_ir_status refine(const tf_module *m, const tf_pipeline *pl, int at, const tf_options *o, ck_search *s)
{
    const tf_ckpt_plan *p = &s->plan;
    if (!(s->extra = tf_malloc(((size_t)p->n + 1) * sizeof(int))))
        return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory in checkpoint");
    s->nextra = s->ng ? p->group_end[s->ng - 1] : 0;
    memcpy(s->extra, p->nodes, (size_t)s->nextra * sizeof(int));
    /* the groups the estimate turned down (after nplanned) are measured
     * until REFINE_MISSES in a row lower nothing: each is a run of the
     * pipeline, and a --dim B=auto search does this for every batch it
     * probes */
    enum { REFINE_MISSES = 12 };
    int misses = 0;
    for (int g = s->ng; g < p->ngroups && s->chosen > s->budget && misses < REFINE_MISSES; g++) {
        int from = g ? p->group_end[g - 1] : 0, k = p->group_end[g] - from;
        memcpy(s->extra + s->nextra, p->nodes + from, (size_t)k * sizeof(int));
        int64_t pk;
        tf_ir_status st = measure(m, pl, at, o, s->extra, s->nextra + k, &pk, NULL);
        if (st) return st;
        if (pk < s->chosen) s->chosen = s->best = pk, s->nextra += k, s->ng++, misses = 0;
        else if (g >= p->nplanned) misses++;
    }
    return TF_IR_OK;
}

/* The recompute set for the checkpoint pass at `at`, which gets m: the
 * shortest prefix of tf_checkpoint_plan's groups (cheapest per byte first)
 * whose real planned peak fits the budget, found by bisection between
 * nothing and the whole plan (the peak falls, by and large, as groups are
 * added; the prefix taken is one measured to fit). */
static tf_ir_status refine(const tf_module *m, const tf_pipeline *pl, int at, const tf_options *o, ck_search *s);

static const int *search_set(const ck_search *s, int *n)
{
    *n = s->extra ? s->nextra : s->ng ? s->plan.group_end[s->ng - 1] : 0;
    return s->extra ? s->extra : s->plan.nodes;
}

static tf_ir_status search_checkpoint(tf_module *m, const tf_pipeline *pl, int at, const tf_options *o, ck_search *s)
{
    *s = (ck_search){0};
    tf_ir_status st = tf_checkpoint_plan(m, o->diag, &s->plan);
    if (st) return st;
    int64_t persistent = 0, pk;
    if ((st = measure(m, pl, at, o, s->plan.nodes, 0, &s->peak0, &persistent))) return st;
    if (s->peak0 < 0)
        return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "--checkpoint=auto fits the planned peak into "
                             "--memory-budget, and memplan does not end the pipeline%s: nothing to measure",
                             memplan_disabled(o) ? " (it is disabled)" : "");
    s->budget = o->memory_budget > 0 ? o->memory_budget : (int64_t)((double)s->peak0 * o->memory_budget_pct / 100.0);
    /* the estimate knows no fusion: scale it by what memplan made of recomputing nothing */
    double calib = s->plan.est0 > 0 ? (double)(s->peak0 - persistent) / (double)s->plan.est0 : 1.0;
    s->floor = persistent + (int64_t)((double)s->plan.floor_est * (calib < 1.0 ? calib : 1.0));
    s->best = s->chosen = s->peak0;
    if (s->peak0 <= s->budget || !s->plan.ngroups) return TF_IR_OK;
    /* the whole plan first; the peak does not always fall as groups are added
     * (fusion and first-fit placement differ from the estimate), so when the
     * whole plan does not fit, sample prefixes for one that does */
    int G = s->plan.nplanned, lo = 0, hi = G;   /* lo does not fit; hi fits if it is known to */
    if (!G) {   /* the estimate found nothing: measure what it turned down */
        s->chosen = s->best;
        return refine(m, pl, at, o, s);
    }
    if ((st = measure(m, pl, at, o, s->plan.nodes, s->plan.group_end[G - 1], &pk, NULL))) return st;
    s->best = pk < s->best ? pk : s->best;
    int best_g = pk <= s->peak0 ? G : 0;
    int64_t at_hi = pk;
    if (pk > s->budget) {
        hi = -1;
        for (int k = 1; k < 16 && G > 1; k++) {
            int g = (int)((int64_t)G * k / 16);
            if (g <= lo || g >= G) continue;
            if ((st = measure(m, pl, at, o, s->plan.nodes, s->plan.group_end[g - 1], &pk, NULL))) return st;
            if (pk < s->best) s->best = pk, best_g = g;
            if (pk <= s->budget) {
                hi = g, at_hi = pk;
                break;
            }
            lo = g;
        }
        if (hi < 0) {   /* nothing measured fits: from the best prefix, add the later groups that lower the peak */
            s->ng = best_g;
            s->chosen = s->best;
            return refine(m, pl, at, o, s);
        }
    }
    s->chosen = at_hi;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if ((st = measure(m, pl, at, o, s->plan.nodes, s->plan.group_end[mid - 1], &pk, NULL))) return st;
        if (pk < s->best) s->best = pk;
        if (pk <= s->budget) hi = mid, s->chosen = pk;
        else lo = mid;
    }
    s->ng = hi;
    return TF_IR_OK;
}

/* Why a budget was not met, for tf_fit_pipeline's message. */
typedef struct ck_unmet {
    bool unmet;
    int64_t budget, peak0, best, floor;
    int nrecomputed;
} ck_unmet;

/* Run pl on m, choosing the recompute set at each checkpoint pass that
 * searches. A budget that cannot be met stops the run with *u filled in
 * (u->unmet); the caller says so. */
static tf_ir_status run_fitted(tf_module *m, const tf_pipeline *pl, const tf_options *o, ck_unmet *u)
{
    *u = (ck_unmet){0};
    int from = 0;
    for (int i = 0; i < pl->n; i++) {
        if (strcmp(pl->pass[i]->name, "checkpoint") || tf_pass_disabled(o, pl->pass[i])) continue;
        if (tf_pipeline_run(m, pl, from, i, o)) return o->diag->status;
        from = i;
        /* backward_start is what the pass will see: the pass manager keeps it for checkpoint */
        if (!budgeted(o) || !m->backward_start) continue;   /* the pass says why it does nothing */
        ck_search s;
        tf_ir_status st = search_checkpoint(m, pl, i, o, &s);
        if (!st && s.chosen > s.budget) {
            int nset;
            search_set(&s, &nset);
            *u = (ck_unmet){true, s.budget, s.peak0, s.best, s.floor, nset};
            tf_checkpoint_plan_free(&s.plan);
            tf_free(s.extra);
            return TF_IR_OK;
        }
        if (!st) {
            tf_options q = *o;
            int nset;
            const int *set = search_set(&s, &nset);
            tf_recompute r = {set, nset, s.ng, s.plan.ncand, s.budget, s.peak0, s.chosen, s.floor};
            q.recompute = &r;
            st = tf_pipeline_run(m, pl, i, i + 1, &q);
        }
        tf_checkpoint_plan_free(&s.plan);
        tf_free(s.extra);
        if (st) return st;
        from = i + 1;
    }
    return tf_pipeline_run(m, pl, from, pl->n, o);
}

/* run_fitted (after tf_pipeline_begin when `begin`), and when a memory
 * budget is missed, a second try with broadcasts as their own kernels
 * (o->keep_broadcasts): fused into their readers they move fewer bytes,
 * but the kernel they join can hold more values alive at once (a
 * batchnorm's whole backward pass in one), and under a budget memory comes
 * first. src: m as it was before the run (NULL: no second try), copied
 * for it. *kept: the second plan met it and m is now that plan. The auto
 * dim's probes go through here too, so that the batch it picks is the
 * largest an explicit --dim with the same budget compiles. */
static tf_ir_status run_fitted_retry(tf_module *m, const tf_module *src, const tf_pipeline *pl, const tf_options *o, bool begin,
                                     ck_unmet *u, bool *kept)
{
    *kept = false;
    tf_ir_status st = begin ? tf_pipeline_begin(m, o) : TF_IR_OK;
    if (!st) st = run_fitted(m, pl, o, u);
    tf_module *again = NULL;
    if (!st && u->unmet && src && !o->keep_broadcasts && budgeted(o)) {
        if (!(again = tf_module_clone((tf_module *)src))) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
        tf_diag d2 = {0};
        tf_options r = *o;
        r.keep_broadcasts = true;
        r.diag = &d2;
        ck_unmet u2 = {0};
        tf_ir_status st2 = begin ? tf_pipeline_begin(again, &r) : TF_IR_OK;
        if (!st2) st2 = run_fitted(again, pl, &r, &u2);
        if (!st2 && !u2.unmet) {
            tf_module_swap(m, again);
            u->unmet = false;
            *kept = true;
        } else if (!st2 && u2.best > 0 && u2.best < u->best) {
            u->best = u2.best, u->nrecomputed = u2.nrecomputed;
        }
    }
    tf_module_free(again);
    return st;
}

/* One probe of the auto dim: a copy of m with the dim at v, run quietly.
 * *peak: its planned peak, or -1 when a shape rule refuses v (an error for
 * v = 1); *unmet: the checkpoint budget cannot be met (*peak: the best). */
static tf_ir_status probe(const tf_module *m, const tf_pipeline *pl, const tf_options *o, int dim, int64_t v,
                         int64_t *peak, bool *unmet)
{
    *peak = -1;
    *unmet = false;
    tf_module *x = tf_module_clone((tf_module *)m);
    if (!x) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    tf_diag refused = {0};
    tf_ir_status st = TF_IR_OK;
    if (!tf_module_set_dim(x, dim, v, v == 1 ? o->diag : &refused)) {
        tf_options q = *o;
        q.explain = NULL;
        q.dump_ir = NULL;
        ck_unmet u;
        bool kept;
        tf_module *src = budgeted(&q) ? tf_module_clone(x) : NULL;   /* for a second try (run_fitted_retry) */
        if (budgeted(&q) && !src) st = tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
        else if (!(st = run_fitted_retry(x, src, pl, &q, false, &u, &kept))) {
            if (u.unmet) {
                *peak = u.best;
                *unmet = true;
            } else if ((*peak = peak_of(x)) < 0) {
                st = tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "--dim %s=auto needs memplan%s", m->dims[dim].name,
                                   memplan_disabled(o) ? ", which is disabled" : " to end the pipeline");
            }
        }
        tf_module_free(src);
    } else if (v == 1) {
        st = o->diag->status;
    }
    tf_module_free(x);
    return st;
}

static const char *budget_str(const tf_options *o, char buf[64])
{
    if (o->memory_budget > 0) snprintf(buf, 64, "%lld", (long long)o->memory_budget);
    else snprintf(buf, 64, "%g%%", o->memory_budget_pct);
    return buf;
}

static tf_ir_status fit_dim(tf_module *m, const tf_pipeline *pl, const tf_options *o, tf_fit *fit)
{
    if (fit->dim >= m->ndims)
        return tf_diag_error(o->diag, TF_IR_ERR_INTERNAL, NULL, "fit: dim %d of %d", fit->dim, m->ndims);
    const char *name = m->dims[fit->dim].name;
    if (fit->limit <= 0)
        return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "--dim %s=auto picks the largest %s whose planned peak "
                             "fits a memory limit; give one with --memory-limit=BYTES", name, name);
    int64_t lo = 0, hi = 0, peak;   /* lo fits, hi does not (0: unknown) */
    bool unmet, unmet_at_1 = false;
    fit->peak = fit->over_peak = -1;
    tf_ir_status st;
    for (int64_t v = 1;; v = v > TF_MAX_DIM / 2 ? TF_MAX_DIM : 2 * v) {
        if ((st = probe(m, pl, o, fit->dim, v, &peak, &unmet))) return st;
        if (!unmet && peak >= 0 && peak <= fit->limit) {
            lo = v;
            fit->peak = peak;
            if (v == TF_MAX_DIM) break;
        } else {
            hi = v;
            fit->over_peak = peak;
            unmet_at_1 = unmet && v == 1;
            break;
        }
    }
    while (hi && hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((st = probe(m, pl, o, fit->dim, mid, &peak, &unmet))) return st;
        if (!unmet && peak >= 0 && peak <= fit->limit) {
            lo = mid;
            fit->peak = peak;
        } else {
            hi = mid;
            fit->over_peak = peak;
        }
    }
    if (!lo && unmet_at_1 && fit->over_peak <= fit->limit)
        return tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL, "--dim %s=auto: even %s=1 cannot meet --memory-budget=%s: "
                             "it plans %lld bytes at best by recomputing", name, name, budget_str(o, (char[64]){0}),
                             (long long)fit->over_peak);
    if (!lo)
        return tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL, "--dim %s=auto: even %s=1 plans %lld bytes, more than "
                             "--memory-limit=%lld", name, name, (long long)fit->over_peak, (long long)fit->limit);
    fit->value = lo;
    if ((st = tf_module_set_dim(m, fit->dim, lo, o->diag))) return st;
    char more[64] = "";
    if (fit->over_peak >= 0) snprintf(more, sizeof more, "; one more would need %lld", (long long)fit->over_peak);
    tf_explain(o, "memplan", NULL, "--dim %s=auto: %s=%lld plans %lld bytes, within --memory-limit=%lld%s", name, name,
               (long long)lo, (long long)fit->peak, (long long)fit->limit, more);
    return TF_IR_OK;
}

/* The dim a batch is: the leading dim of the first input that has a named
 * one, or -1. */
static int batch_dim(const tf_module *m)
{
    for (int i = 0; i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        if (v->kind == TF_VAL_INPUT && v->type.rank > 0 && v->type.dims[0].sym >= 0) return v->type.dims[0].sym;
    }
    return -1;
}

tf_ir_status tf_fit_pipeline(tf_module *m, const char *list, const tf_options *o, tf_fit *fit)
{
    tf_pipeline pl;
    if (tf_pipeline_parse(list, o, &pl)) return o->diag->status;
    tf_options q = *o;
    bool auto_dim = fit && fit->dim >= 0;
    bool ck = q.mode == TF_IR_TRAIN && q.checkpoint == TF_IR_CHECKPOINT_AUTO;
    /* --dim B=auto --memory-limit with --checkpoint=auto and no budget: the limit is the budget */
    if (auto_dim && ck && q.memory_budget <= 0 && q.memory_budget_pct <= 0) q.memory_budget = fit->limit;
    if (auto_dim && fit_dim(m, &pl, &q, fit)) return o->diag->status;
    tf_module *orig = NULL;   /* for the largest batch that fits, should the budget not be met */
    if (!auto_dim && budgeted(&q) && !(orig = tf_module_clone(m)))
        return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory");
    ck_unmet u = {0};
    bool kept = false;
    tf_ir_status st = run_fitted_retry(m, orig, &pl, &q, true, &u, &kept);
    if (!st && kept)
        tf_explain(o, "fit", NULL, "the memory budget is met with broadcasts run as their own kernels, not fused into their readers' "
                   "(which held more values alive at once): planned %lld bytes", (long long)peak_of(m));
    if (!st && u.unmet) {
        char more[512] = "";
        int bd = orig ? batch_dim(orig) : -1;
        if (bd >= 0) {
            const char *name = orig->dims[bd].name;
            tf_diag d2 = {0};
            tf_options p = q;
            p.explain = NULL;
            p.dump_ir = NULL;
            p.diag = &d2;
            p.memory_budget = u.budget;
            p.memory_budget_pct = 0;
            tf_fit f = {.dim = bd, .limit = u.budget};
            if (!fit_dim(orig, &pl, &p, &f))
                snprintf(more, sizeof more, "; the largest %s that fits it with recomputation is %s=%lld (--dim %s=auto "
                         "--memory-limit=%lld --checkpoint=auto)", name, name, (long long)f.value, name,
                         (long long)u.budget);
            else if (d2.status == TF_IR_ERR_LIMIT)
                snprintf(more, sizeof more, "; even %s=1 does not fit it", name);
        }
        if (u.best > 0 && u.best < u.floor) u.floor = u.best;   /* the floor is an estimate: a plan found under it lowers it */
        st = tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL,
                           "--memory-budget=%lld cannot be met: %s %lld bytes (inputs, params, optimizer state and "
                           "what the backward pass holds at once, however much is recomputed); the step plans %lld "
                           "bytes, and at best %lld recomputing %d forward values%s",
                           (long long)u.budget, u.budget < u.floor ? "it is under the floor of about" :
                           "the best plan found is over it; the floor is about", (long long)u.floor,
                           (long long)u.peak0, (long long)u.best, u.nrecomputed, more);
    }
    tf_module_free(orig);
    return st;
}

tf_ir_status tf_run_pipeline(tf_module *m, const char *list, const tf_options *o)
{
    return tf_fit_pipeline(m, list, o, NULL);
}
