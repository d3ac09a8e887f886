/* passes.h — the pass interface and the pass manager.
 *
 * A pass is `tf_ir_status pass_NAME(tf_module *, const tf_options *)`: it
 * rewrites the module in place and reports problems into o->diag. The pass
 * manager runs a named pipeline (one list per mode), verifies the module
 * after every pass, and writes `--dump-ir` files as NN-NAME.ir, each of which
 * parses again. Fitting into memory (the checkpoint recompute set, an auto
 * dim) is searched by tf_fit_pipeline (fit.c), which drives the pass manager
 * over copies of the module and measures memplan's planned peak. */
#ifndef TF_PASSES_H
#define TF_PASSES_H

#include <stdio.h>

#include "ops.h"

/* The checkpoint pass's decisions: which forward values to recompute.
 * tf_fit_pipeline chooses them (see below) and hands them to the pass. */
typedef struct tf_recompute {
    const int *nodes;       /* forward node indices in the pass's input (renumbered), each < backward_start */
    int n;
    /* for --explain: */
    int ngroups, ncand;     /* groups of the plan taken, candidates it had */
    int64_t budget;         /* the budget in bytes (--memory-budget=PCT% resolved) */
    int64_t peak_before;    /* the planned peak recomputing nothing ... */
    int64_t peak_after;     /* ... and recomputing these */
    int64_t floor;          /* the estimated floor (see tf_checkpoint_plan) */
} tf_recompute;

typedef struct tf_options {
    tf_ir_mode mode;
    const char *dump_ir;    /* NULL, "all" or a pass name */
    const char *dump_dir;   /* default "." */
    FILE *explain;          /* one line per decision, or NULL */
    tf_diag *diag;
    bool opt0;              /* --O0: no TF_PASSF_OPT pass */
    const char *const *disabled;   /* --disable-pass names */
    int ndisabled;
    bool precision_set;     /* --precision overrides the train block */
    tf_ir_precision precision;
    bool grad_outputs;      /* autodiff also outputs each param's gradient as grad.<param> */
    int checkpoint;         /* TF_IR_CHECKPOINT_NONE | TF_IR_CHECKPOINT_AUTO */
    int64_t memory_budget;  /* bytes the training step should plan within (checkpoint) */
    double memory_budget_pct;   /* or this percentage of its unconstrained planned peak (0: bytes) */
    const tf_recompute *recompute;   /* set by tf_fit_pipeline for the checkpoint pass; NULL otherwise */
    bool numerics_exact;    /* fuse: every f16/bf16 value rounded to its dtype, op by op (--numerics=exact); else
                             * a region holds the 16-bit values it keeps to itself at f32 (tf_node_wide) */
    bool attention_decomposed;   /* lower: attention as matmul, softmax, matmul (--attention=decomposed), not flash_attention */
    bool data_parallel;     /* autodiff: each gradient averaged over the session's ranks (allreduce), in buckets */
    int64_t allreduce_bucket;   /* ... of about this many bytes */
    bool sync_batchnorm;    /* lower: with data_parallel, train-mode batchnorm's statistics averaged over the ranks */
    int shard_ranks;        /* autodiff: with data_parallel, the optimizer state sharded over this many ranks (ZeRO-1); 0: not */
    bool keep_broadcasts;   /* fuse: a broadcast is its own kernel (a tensor of copies), as tf_fit_pipeline's second
                             * try at a --memory-budget the fused plan misses: fusing one into its readers moves
                             * fewer bytes but can hold more values alive at once in the kernel it joins */
} tf_options;

typedef enum tf_ir_checkpoint { TF_IR_CHECKPOINT_NONE, TF_IR_CHECKPOINT_AUTO } tf_ir_checkpoint;

typedef tf_ir_status (*tf_pass_fn)(tf_module *m, const tf_options *o);

enum { TF_PASSF_OPT = 1 << 0, TF_PASSF_CORE = 1 << 1, TF_PASSF_REGIONS = 1 << 2, TF_PASSF_BACKWARD = 1 << 3 };

typedef struct tf_pass_info {
    const char *name;
    tf_pass_fn run;
    unsigned flags;
    const char *what;       /* one line for --help */
} tf_pass_info;

#define TF_PASS(name, flags, what) tf_ir_status pass_##name(tf_module *m, const tf_options *o);
#include "passes.def"
#undef TF_PASS

/* One line of --explain: "[pass] file:line:col: message". No-op without
 * o->explain. Passes explain every decision they make, and why. */
void tf_explain(const tf_options *o, const char *pass, const tf_loc *loc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The precision the module trains in: --precision, else the train block's. */
tf_ir_precision tf_options_precision(const tf_options *o, const tf_module *m);

/* Every registered pass, and lookup by name (NULL if none). */
extern const tf_pass_info tf_passes[];
extern const int tf_npasses;
const tf_pass_info *tf_pass_find(const char *name, size_t len);

/* The default pipeline of a mode, comma-separated. */
const char *tf_pipeline_default(tf_ir_mode mode);
/* Run a comma-separated pass list (NULL: the mode's default). Unknown names
 * are reported before anything runs. This is tf_fit_pipeline without an
 * auto dim: with --checkpoint=auto and a budget, the checkpoint search runs. */
tf_ir_status tf_run_pipeline(tf_module *m, const char *list, const tf_options *o);

/* ---- the pass manager's parts, for tf_fit_pipeline ---- */

#define TF_PIPELINE_MAX 64
typedef struct tf_pipeline {
    const tf_pass_info *pass[TF_PIPELINE_MAX];
    int n;
} tf_pipeline;

/* Resolve a comma-separated list (NULL: the mode's default) and check the
 * pass names the options give (--dump-ir, --disable-pass); nothing runs. */
tf_ir_status tf_pipeline_parse(const char *list, const tf_options *o, tf_pipeline *pl);
/* Before the first pass of a run: --dump-ir's directory and 00-input.ir. */
tf_ir_status tf_pipeline_begin(tf_module *m, const tf_options *o);
/* Run passes [from, to) of pl on m: disabled ones are skipped, the module is
 * verified after each, and --dump-ir files are numbered by position in pl. */
tf_ir_status tf_pipeline_run(tf_module *m, const tf_pipeline *pl, int from, int to, const tf_options *o);
/* Whether the options leave pass pi out (--O0, --disable-pass). */
bool tf_pass_disabled(const tf_options *o, const tf_pass_info *pi);

/* fuse.c: whether fuse runs broadcast n as loads with zero strides in its
 * readers' kernel rather than as a kernel of its own (checkpoint's estimate
 * asks too). A broadcast of fewer than TF_FUSE_BROADCAST_MIN_ROWS values
 * stays a kernel: each spreads over a long row (a batchnorm's per-channel
 * gradients over N x H x W), and fused it would join the reductions over
 * those rows into one kernel of several passes with one block (or thread)
 * per row: too few rows to fill the machine, each pass reading the rows
 * again (the small resnet's bf16 step on the cpu target: 4% slower so). A
 * loss's, a softmax's or a layernorm's gradient has a row per token. */
enum { TF_FUSE_BROADCAST_MIN_ROWS = 1024 };
bool tf_fuse_folds_broadcast(const tf_node *n, bool keep_broadcasts);

/* checkpoint.c: the order in which to recompute forward values, cheapest
 * per byte saved first. nodes[0 .. group_end[g]) is the set the first g + 1
 * groups recompute (node indices of m, renumbered; in node order within a
 * group), and group_est[g] its estimated arena peak (est0: recomputing
 * nothing). floor_est is the arena a free recomputation would leave (every
 * forward value the backward reads made where it is read and dropped
 * there): no recompute set goes under it. The first nplanned groups are
 * those the estimate says lower the peak; the rest, each candidate it
 * turned down (once, without what earlier groups hold), are for the driver
 * to measure when no prefix fits. m must be right after autodiff. */
typedef struct tf_ckpt_plan {
    int *nodes, n;
    int *group_end;
    int64_t *group_est;
    int ngroups, nplanned, ncand;
    int64_t est0, floor_est;
} tf_ckpt_plan;
tf_ir_status tf_checkpoint_plan(tf_module *m, tf_diag *d, tf_ckpt_plan *p);
void tf_checkpoint_plan_free(tf_ckpt_plan *p);

/* ---- fit.c: fitting into memory ---- */

typedef struct tf_fit {
    int dim;                /* in: the dim to choose (index into m->dims), or -1 for none */
    int64_t limit;          /* in: the planned peak it must fit (--memory-limit), > 0 */
    int64_t value;          /* out: the value chosen (also set in m) */
    int64_t peak;           /* out: its planned peak */
    int64_t over_peak;      /* out: the planned peak of the smallest value that did not fit; -1: none tried */
} tf_fit;

/* Run the pipeline `list` (NULL: the mode's default) on m, as
 * tf_pipeline_run does, and make it fit into memory where the options ask:
 *  - checkpoint (train mode, --checkpoint=auto, --memory-budget): when the
 *    pipeline reaches an active checkpoint pass right after autodiff, the
 *    recompute set is searched for on copies of the module, each copy run
 *    through the rest of *this* pipeline (same list, same disabled passes)
 *    to memplan, whose planned peak is the measure (a pipeline that does
 *    not end in memplan is an error). Candidates come from
 *    tf_checkpoint_candidates and are tried in that order, greedily: one is
 *    kept when it lowers the peak, and the search stops as soon as the
 *    budget is met. The checkpoint pass then applies the set (o->recompute).
 *    A budget that cannot be met is a TF_IR_ERR_LIMIT error naming the best
 *    peak reached.
 *  - an auto dim (fit && fit->dim >= 0): the largest value whose planned
 *    peak (after the whole pipeline, checkpoint search included) fits
 *    fit->limit: double from 1 until a value does not fit, then bisect. A
 *    value a shape rule refuses, or whose checkpoint budget cannot be met,
 *    does not fit. Probes run quietly (no --explain, no dumps); then the dim
 *    is set in m, one [memplan] --explain line says why, and the pipeline
 *    runs on m for real. The pipeline must end in memplan.
 * Every probe runs on a copy; on an error m is left part-way. */
tf_ir_status tf_fit_pipeline(tf_module *m, const char *list, const tf_options *o, tf_fit *fit);

#endif
