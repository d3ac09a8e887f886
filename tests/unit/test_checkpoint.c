/* test_checkpoint.c — activation checkpointing keeps the numbers and meets
 * the budget. The transformer (and the MLP) compiled as training steps with
 * a memory budget below their planned peak: the new plan fits the budget,
 * something was recomputed, and loss and every gradient are identical to the
 * step without checkpointing on the same params and inputs. A budget nothing
 * can meet is a clear error. The search (passes/fit.c) measures the pass list
 * that runs, not the default one; and an auto dim searched with
 * checkpointing inside each probe fits a larger batch. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "interp.h"
#include "parser.h"
#include "passes.h"
#include "testutil.h"

static bool g_plain;   /* compile as `tfuse compile` does: no gradient outputs */

static tf_module *compile_dims(const char *path, const char *text, const tf_dim_set *dims, int ndims, int ck,
                               int64_t budget, tf_diag *d)
{
    tf_module *m;
    tf_diag_clear(d);
    if (tf_parse(path, text, strlen(text), dims, ndims, &m, d)) return NULL;
    /* fp32 so that the two steps compute exactly alike */
    tf_options o = {.mode = TF_IR_TRAIN, .diag = d, .grad_outputs = !g_plain, .checkpoint = ck, .memory_budget = budget,
                    .precision_set = true, .precision = TF_PREC_FP32};
    if (tf_run_pipeline(m, NULL, &o)) {
        tf_module_free(m);
        return NULL;
    }
    return m;
}

static tf_module *compile(const char *path, const char *text, int ck, int64_t budget, tf_diag *d)
{
    tf_dim_set dims[1] = {{"B", 8}};
    return compile_dims(path, text, dims, 1, ck, budget, d);
}

static int64_t peak(const tf_module *m) { return m->plan.arena_bytes + m->plan.persistent_bytes; }

static int recomputed(const tf_module *m)
{
    int k = 0;
    for (int i = 0; i < m->nodes.n; i++) k += ((tf_node *)m->nodes.items[i])->recompute;
    return k;
}

/* Same params, same inputs: the same loss and gradients, bit for bit
 * (the reference interpreter runs both). */
static void same_gradients(const char *path, tf_module *a, tf_module *b)
{
    tf_diag d = {0};
    tf_interp_ctx *ia = tf_interp_create(a, TF_IR_TRAIN, 5), *ib = tf_interp_create(b, TF_IR_TRAIN, 5);
    bool ok = ia && ib && !tf_interp_init_state(ia, &d) && !tf_interp_init_state(ib, &d);
    uint64_t s = 99;
    for (int i = 0; ok && i < a->decls.n; i++) {
        tf_value *v = a->decls.items[i], *w = tf_module_find_value(b, v->name);
        if (v->kind != TF_VAL_INPUT || !w) continue;
        tf_tensor *ta = tf_interp_tensor(ia, v, &d), *tb = tf_interp_tensor(ib, w, &d);
        int64_t bound = v->type.dtype == TF_DT_I64 ? 10 : 0;
        for (int64_t k = 0; k < ta->numel; k++) {
            double u = test_rnd(&s);
            ta->data[k] = tb->data[k] = bound ? (double)(int64_t)(u * (double)bound) : tf_dtype_round(v->type.dtype, 2 * u - 1);
        }
    }
    ok = ok && !tf_interp_run(ia, &d) && !tf_interp_run(ib, &d);
    CHECK(ok, "%s: run: %s", path, d.msg);
    int compared = 0;
    for (int i = 0; ok && i < a->noutputs; i++) {
        const char *nm = a->outputs[i].name;
        if (strcmp(nm, "loss") && strncmp(nm, "grad.", 5)) continue;
        tf_value *w = NULL;
        for (int k = 0; k < b->noutputs; k++)
            if (!strcmp(b->outputs[k].name, nm)) w = b->outputs[k].value;
        CHECK(w != NULL, "%s: output %s missing with checkpointing", path, nm);
        if (!w) continue;
        tf_tensor *ta = tf_interp_tensor(ia, a->outputs[i].value, &d), *tb = tf_interp_tensor(ib, w, &d);
        CHECK(ta->numel == tb->numel && !memcmp(ta->data, tb->data, (size_t)ta->numel * sizeof(double)),
              "%s: %s differs with checkpointing", path, nm);
        compared++;
    }
    CHECK(compared > 2, "%s: loss and gradients compared (%d)", path, compared);
    tf_interp_free(ia);
    tf_interp_free(ib);
}

static void check_model(const char *file)
{
    char path[4096];
    char *text = test_read_example(file, path, sizeof path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    tf_diag d;
    tf_module *a = compile(path, text, TF_IR_CHECKPOINT_NONE, 0, &d);
    CHECK(a != NULL, "%s: %s", path, d.msg);
    if (!a) { free(text); return; }
    int64_t full = peak(a), arena = a->plan.arena_bytes;
    int64_t budget = full - arena / 10;   /* a tenth of the arena must go */
    tf_module *b = compile(path, text, TF_IR_CHECKPOINT_AUTO, budget, &d);
    CHECK(b != NULL, "%s with budget %lld: %s", path, (long long)budget, d.msg);
    if (b) {
        CHECK(peak(b) <= budget, "%s: peak %lld within budget %lld (was %lld)", path, (long long)peak(b), (long long)budget,
              (long long)full);
        CHECK(recomputed(b) > 0, "%s: something is recomputed", path);
        same_gradients(path, a, b);
    }
    tf_module_free(b);
    /* an impossible budget */
    tf_module *c = compile(path, text, TF_IR_CHECKPOINT_AUTO, 1000, &d);
    CHECK(!c && strstr(d.msg, "--memory-budget=1000 cannot be met"), "%s: impossible budget: %s", path, d.msg);
    tf_module_free(c);
    tf_module_free(a);
    free(text);
}

/* A custom pass list: the budget is met by the peak that list plans. */
static void check_custom_list(const char *file)
{
    static const char list[] = "lower,autodiff,checkpoint,memplan";
    char path[4096];
    char *text = test_read_example(file, path, sizeof path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    tf_diag d = {0};
    tf_dim_set dims[1] = {{"B", 32}};
    tf_module *a = NULL, *b = NULL;
    int64_t full = 0, budget = 0;
    for (int k = 0; k < 2; k++) {
        tf_module **m = k ? &b : &a;
        tf_options o = {.mode = TF_IR_TRAIN, .diag = &d, .checkpoint = k ? TF_IR_CHECKPOINT_AUTO : TF_IR_CHECKPOINT_NONE,
                        .memory_budget = budget};
        if (tf_parse(path, text, strlen(text), dims, 1, m, &d) || tf_run_pipeline(*m, list, &o)) break;
        if (!k) budget = (full = peak(a)) - a->plan.arena_bytes / 10;
    }
    CHECK(a && b && !d.status, "%s --passes=%s: %s", path, list, d.msg);
    if (b) {
        CHECK(peak(b) <= budget, "%s --passes=%s: peak %lld within budget %lld (was %lld)", path, list,
              (long long)peak(b), (long long)budget, (long long)full);
        CHECK(recomputed(b) > 0, "%s --passes=%s: something is recomputed", path, list);
    }
    tf_module_free(a);
    tf_module_free(b);
    free(text);
}

/* --dim B=auto: with --checkpoint=auto (budget = limit) the chosen batch is
 * larger, fits the limit, and the module has it. */
static void check_auto_dim(const char *file)
{
    char path[4096];
    char *text = test_read_example(file, path, sizeof path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    int64_t limit = 2500000, chosen[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        tf_diag d = {0};
        tf_module *m;
        if (tf_parse(path, text, strlen(text), NULL, 0, &m, &d)) {
            CHECK(false, "%s: %s", path, d.msg);
            break;
        }
        tf_options o = {.mode = TF_IR_TRAIN, .diag = &d, .checkpoint = k ? TF_IR_CHECKPOINT_AUTO : TF_IR_CHECKPOINT_NONE,
                        .memory_budget = k ? limit : 0};
        tf_fit fit = {.dim = tf_module_find_dim(m, "B", 1), .limit = limit};
        tf_ir_status st = tf_fit_pipeline(m, NULL, &o, &fit);
        CHECK(!st, "%s --dim B=auto (checkpoint %d): %s", path, k, d.msg);
        if (!st) {
            chosen[k] = fit.value;
            CHECK(fit.peak == peak(m) && peak(m) <= limit && fit.over_peak > limit,
                  "%s: B=%lld plans %lld = %lld within %lld, one more %lld", path, (long long)fit.value,
                  (long long)fit.peak, (long long)peak(m), (long long)limit, (long long)fit.over_peak);
            CHECK(m->dims[fit.dim].value == fit.value, "%s: the module has B=%lld", path, (long long)fit.value);
            CHECK(k == 0 || recomputed(m) > 0, "%s: B=%lld recomputes", path, (long long)fit.value);
        }
        tf_module_free(m);
    }
    CHECK(chosen[1] > chosen[0] && chosen[0] > 0, "%s: B=%lld with checkpointing > B=%lld without", path,
          (long long)chosen[1], (long long)chosen[0]);
    free(text);
}

/* Whether some op of kind k is recomputed in m. */
static bool recomputes_kind(const tf_module *m, tf_op_kind k)
{
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        if (n->recompute && tf_op_info_of(n->op)->kind == k) return true;
    }
    return false;
}

/* Every budget from the unconstrained peak down to the lowest one the
 * search reaches compiles and plans within it; one byte under that is an
 * error naming the floor (gpt's lowest plan within 5% of it: its optimizer
 * updates run per param once recomputing, so they do not hold every gradient
 * at the step's end) and the largest batch that fits; gradients are
 * the same bits at the tightest budget, where matmuls (and convolutions,
 * where the model has them) are recomputed too. */
static void check_sweep(const char *file, const tf_dim_set *dims, int ndims, tf_op_kind heavy, double floor_slack)
{
    char path[4096];
    char *text = test_read_example(file, path, sizeof path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    tf_diag d;
    tf_module *a = compile_dims(path, text, dims, ndims, TF_IR_CHECKPOINT_NONE, 0, &d);
    CHECK(a != NULL, "%s: %s", path, d.msg);
    tf_module *c = a ? compile_dims(path, text, dims, ndims, TF_IR_CHECKPOINT_AUTO, 1, &d) : NULL;
    const char *at = strstr(d.msg, "at best ");
    CHECK(!c && at && strstr(d.msg, "floor of about") && strstr(d.msg, "cannot be met"), "%s: budget 1: %s", path, d.msg);
    tf_module_free(c);
    if (!a || !at) {
        tf_module_free(a);
        free(text);
        return;
    }
    int64_t full = peak(a), best = strtoll(at + 8, NULL, 10);
    CHECK(best > 0 && best < full * 9 / 10, "%s: the search goes well under the peak: %lld of %lld", path, (long long)best,
          (long long)full);
    if (floor_slack > 0) {   /* the lowest plan within floor_slack of the estimated floor */
        const char *fl = strstr(d.msg, "floor of about ");
        int64_t floor = fl ? strtoll(fl + 15, NULL, 10) : 0;
        CHECK(floor > 0 && (double)best <= (double)floor * floor_slack, "%s: the lowest plan %lld within %.2fx the floor %lld",
              path, (long long)best, floor_slack, (long long)floor);
    }
    tf_module *tight = NULL;
    for (int k = 0; k <= 8; k++) {
        int64_t budget = full - (full - best) * k / 8;
        tf_module *b = compile_dims(path, text, dims, ndims, TF_IR_CHECKPOINT_AUTO, budget, &d);
        CHECK(b && peak(b) <= budget, "%s: budget %lld (peak %lld, best %lld): %s, planned %lld", path, (long long)budget,
              (long long)full, (long long)best, b ? "compiled" : d.msg, b ? (long long)peak(b) : -1LL);
        if (k == 8) tight = b;
        else tf_module_free(b);
    }
    if (tight) {
        CHECK(recomputes_kind(tight, TF_OPK_MATMUL) || heavy != TF_OPK_MATMUL, "%s: a matmul is recomputed", path);
        CHECK(recomputes_kind(tight, heavy), "%s: a %s-kind op is recomputed", path, heavy == TF_OPK_CONV ? "conv" : "matmul");
        same_gradients(path, a, tight);
    }
    tf_module_free(tight);
    tf_module_free(a);
    free(text);
}

/* Issue 16's target: a bench model at its own dims trains within 35% of its
 * unconstrained planned peak (updates written in place, largest-first
 * placement, and the candidates the estimate turned down measured: without
 * them gpt stopped at 39.5% and resnet at 38.2%); the sweep above checks
 * the gradients of the tightest plans. */
static void check_35(const char *file)
{
    char path[4096];
    char *text = test_read_example(file, path, sizeof path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    tf_diag d;
    g_plain = true;
    tf_module *a = compile_dims(path, text, NULL, 0, TF_IR_CHECKPOINT_NONE, 0, &d);
    CHECK(a != NULL, "%s: %s", path, d.msg);
    int64_t budget = a ? peak(a) * 35 / 100 : 0;
    tf_module *b = a ? compile_dims(path, text, NULL, 0, TF_IR_CHECKPOINT_AUTO, budget, &d) : NULL;
    CHECK(b && peak(b) <= budget, "%s: 35%% of %lld bytes: %s, planned %lld", path, a ? (long long)peak(a) : -1LL,
          b ? "compiled" : d.msg, b ? (long long)peak(b) : -1LL);
    if (b) printf("%s: 35%% of the unconstrained %lld bytes: planned %lld (%.1f%%)\n", path, (long long)peak(a),
                  (long long)peak(b), 100.0 * (double)peak(b) / (double)peak(a));
    g_plain = false;
    tf_module_free(b);
    tf_module_free(a);
    free(text);
}

int main(void)
{
    tf_dim_set gpt[7] = {{"B", 4}, {"T", 32}, {"V", 64}, {"E", 64}, {"H", 2}, {"D", 32}, {"F", 256}}, resnet[4] = {{"N", 2}, {"C1", 8}, {"C2", 16}, {"C3", 32}};
    check_sweep("../bench/models/gpt.ir", gpt, 7, TF_OPK_MATMUL, 1.05);
    check_sweep("../bench/models/resnet.ir", resnet, 4, TF_OPK_CONV, 0);
    check_35("../bench/models/gpt.ir");
    check_35("../bench/models/resnet.ir");
    check_model("transformer.ir");
    check_custom_list("transformer.ir");
    check_auto_dim("transformer.ir");
    return check_report();
}
