/* passes.h — the pass interface and the pass manager.
 *
 * A pass is `tf_ir_status pass_NAME(tf_module *, const tf_options *)`: it
 * rewrites the module in place and reports problems into o->diag. The pass
 * manager runs a named pipeline (one list per mode), verifies the module
 * after every pass, and writes `--dump-ir` files as NN-NAME.ir, each of which
 * parses again. */
#ifndef TF_PASSES_H
#define TF_PASSES_H

#include <stdio.h>

#include "ops.h"

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
} tf_options;

typedef enum tf_ir_checkpoint { TF_IR_CHECKPOINT_NONE, TF_IR_CHECKPOINT_AUTO } tf_ir_checkpoint;

typedef tf_ir_status (*tf_pass_fn)(tf_module *m, const tf_options *o);

enum { TF_PASSF_OPT = 1 << 0, TF_PASSF_CORE = 1 << 1, TF_PASSF_REGIONS = 1 << 2 };

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

/* The default pipeline of a mode, comma-separated; and the part of it
 * after the first occurrence of `pass` ("" if none). */
const char *tf_pipeline_default(tf_ir_mode mode);
const char *tf_pipeline_after(tf_ir_mode mode, const char *pass);
/* Run a comma-separated pass list (NULL: the mode's default). Unknown names
 * are reported before anything runs. */
tf_ir_status tf_run_pipeline(tf_module *m, const char *list, const tf_options *o);

#endif
