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

/* The planned peak of a copy of m (the input of the checkpoint pass at `at`)
 * run through passes [at, n) of pl, that pass recomputing nodes[0..k). */
static tf_ir_status measure(const tf_module *m, const tf_pipeline *pl, int at, const tf_options *o, const int *nodes,
                            int k, int64_t *peak)
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
    tf_module_free(x);
    return st;
}

static bool memplan_disabled(const tf_options *o)
{
    const tf_pass_info *mp = tf_pass_find("memplan", 7);
    return mp && tf_pass_disabled(o, mp);
}

typedef struct ck_search {
    int *nodes;            /* candidates; the first nk are kept */
    int nc, nk;
    int64_t peak0, best;   /* recomputing nothing; the kept ones */
} ck_search;

/* The recompute set for the checkpoint pass at `at`, which gets m: greedy
 * over the candidates in their order, a candidate kept when it lowers the
 * peak, stopping once the budget is met. */
static tf_ir_status search_checkpoint(tf_module *m, const tf_pipeline *pl, int at, const tf_options *o, ck_search *s)
{
    *s = (ck_search){0};
    tf_ir_status st = tf_checkpoint_candidates(m, o->diag, &s->nodes, &s->nc);
    if (st) return st;
    if ((st = measure(m, pl, at, o, s->nodes, 0, &s->peak0))) return st;
    if (s->peak0 < 0)
        return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "--checkpoint=auto fits the planned peak into "
                             "--memory-budget, and memplan does not end the pipeline%s: nothing to measure",
                             memplan_disabled(o) ? " (it is disabled)" : "");
    s->best = s->peak0;
    for (int i = 0; i < s->nc && s->best > o->memory_budget; i++) {
        int keep = s->nodes[s->nk];
        s->nodes[s->nk] = s->nodes[i];   /* try the kept ones plus this one */
        int64_t pk;
        if ((st = measure(m, pl, at, o, s->nodes, s->nk + 1, &pk))) return st;
        if (pk < s->best) s->best = pk, s->nk++;
        else s->nodes[s->nk] = keep;
    }
    return TF_IR_OK;
}

/* Run pl on m, choosing the recompute set at each checkpoint pass that
 * searches. In a probe (short_of != NULL) a budget that cannot be met stops
 * the run with *short_of = the best peak reached (else -1); otherwise it is
 * an error. */
static tf_ir_status run_fitted(tf_module *m, const tf_pipeline *pl, const tf_options *o, int64_t *short_of)
{
    if (short_of) *short_of = -1;
    int from = 0;
    for (int i = 0; i < pl->n; i++) {
        if (strcmp(pl->pass[i]->name, "checkpoint") || tf_pass_disabled(o, pl->pass[i])) continue;
        if (tf_pipeline_run(m, pl, from, i, o)) return o->diag->status;
        from = i;
        /* backward_start is what the pass will see: the pass manager keeps it for checkpoint */
        if (o->mode != TF_IR_TRAIN || o->checkpoint != TF_IR_CHECKPOINT_AUTO || o->memory_budget <= 0 || !m->backward_start)
            continue;   /* the pass says why it does nothing */
        ck_search s;
        tf_ir_status st = search_checkpoint(m, pl, i, o, &s);
        if (!st && s.best > o->memory_budget) {
            if (short_of) {
                *short_of = s.best;
                tf_free(s.nodes);
                return TF_IR_OK;
            }
            st = tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL,
                               "--memory-budget=%lld cannot be met: the step plans %lld bytes, and at best %lld by "
                               "recomputing %d of %d cheap forward values; a smaller batch fits (--dim B=auto "
                               "--memory-limit=%lld)", (long long)o->memory_budget, (long long)s.peak0,
                               (long long)s.best, s.nk, s.nc, (long long)o->memory_budget);
        }
        if (!st) {
            tf_options q = *o;
            tf_recompute r = {s.nodes, s.nk, s.nc, s.peak0, s.best};
            q.recompute = &r;
            st = tf_pipeline_run(m, pl, i, i + 1, &q);
        }
        tf_free(s.nodes);
        if (st) return st;
        from = i + 1;
    }
    return tf_pipeline_run(m, pl, from, pl->n, o);
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
        int64_t short_of;
        if (!(st = run_fitted(x, pl, &q, &short_of))) {
            if (short_of >= 0) {
                *peak = short_of;
                *unmet = true;
            } else if ((*peak = peak_of(x)) < 0) {
                st = tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "--dim %s=auto needs memplan%s", m->dims[dim].name,
                                   memplan_disabled(o) ? ", which is disabled" : " to end the pipeline");
            }
        }
    } else if (v == 1) {
        st = o->diag->status;
    }
    tf_module_free(x);
    return st;
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
        return tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL, "--dim %s=auto: even %s=1 cannot meet --memory-budget=%lld: "
                             "it plans %lld bytes at best by recomputing", name, name, (long long)o->memory_budget,
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

tf_ir_status tf_fit_pipeline(tf_module *m, const char *list, const tf_options *o, tf_fit *fit)
{
    tf_pipeline pl;
    if (tf_pipeline_parse(list, o, &pl)) return o->diag->status;
    if (fit && fit->dim >= 0 && fit_dim(m, &pl, o, fit)) return o->diag->status;
    if (tf_pipeline_begin(m, o)) return o->diag->status;
    return run_fitted(m, &pl, o, NULL);
}
