/* passmgr.c — pipelines, verification between passes, IR dumps. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "passes.h"

const tf_pass_info tf_passes[] = {
#define TF_PASS(name, flags, what) {#name, pass_##name, flags, what},
#include "passes.def"
#undef TF_PASS
};
const int tf_npasses = (int)(sizeof tf_passes / sizeof tf_passes[0]);

/* One list per mode: layer-level rewrites, lowering, cleanups, precision,
 * cleanups again (amp leaves casts to share), then kernels and memory. */
static const char *const pipelines[] = {
    [TF_IR_TRAIN] = "bias_drop,lower,canonicalize,constfold,cse,dce,autodiff,checkpoint,amp,canonicalize,cse,dce,fuse,memplan",
    [TF_IR_INFER] = "bias_drop,lower,canonicalize,constfold,cse,dce,amp,canonicalize,cse,dce,fuse,memplan",
};

const char *tf_pipeline_default(tf_ir_mode mode) { return pipelines[mode]; }

void tf_explain(const tf_options *o, const char *pass, const tf_loc *loc, const char *fmt, ...)
{
    if (!o->explain) return;
    fprintf(o->explain, "[%s] ", pass);
    if (loc && loc->line > 0) fprintf(o->explain, "%s:%d:%d: ", loc->file ? loc->file : "<input>", loc->line, loc->col);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(o->explain, fmt, ap);
    va_end(ap);
    fputc('\n', o->explain);
}

tf_ir_precision tf_options_precision(const tf_options *o, const tf_module *m)
{
    if (o->precision_set) return o->precision;
    return m->train.has_precision ? m->train.precision : TF_PREC_FP32;
}

static bool has_layer_ops(const tf_module *m)
{
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        if (tf_op_has(n->op, TF_OPF_LAYER) || (n->op == TF_OP_CONV2D && n->nin == 3)) return true;
    }
    return false;
}

bool tf_pass_disabled(const tf_options *o, const tf_pass_info *pi)
{
    if (o->opt0 && (pi->flags & TF_PASSF_OPT)) return true;
    for (int i = 0; i < o->ndisabled; i++)
        if (!strcmp(o->disabled[i], pi->name)) return true;
    return false;
}

const tf_pass_info *tf_pass_find(const char *name, size_t len)
{
    for (int i = 0; i < tf_npasses; i++)
        if (strlen(tf_passes[i].name) == len && memcmp(tf_passes[i].name, name, len) == 0) return &tf_passes[i];
    return NULL;
}

/* mkdir -p: dumps go where the user asked, whether or not it exists yet. */
static tf_ir_status make_dirs(const char *dir, tf_diag *d)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "--dump-dir path is too long");
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                tf_loc l = {dir, 0, 0};
                return tf_diag_error(d, TF_IR_ERR_RUNTIME, &l, "cannot create the dump directory: %s", strerror(errno));
            }
            *p = c;
            if (!c) break;
        }
    }
    return TF_IR_OK;
}

static tf_ir_status dump(tf_module *m, const tf_options *o, int index, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%02d-%s.ir", o->dump_dir ? o->dump_dir : ".", index, name);
    char *text = tf_print_module(m);
    if (!text) return tf_diag_error(o->diag, TF_IR_ERR_OOM, NULL, "out of memory printing the module");
    FILE *f = fopen(path, "w");
    if (!f) {
        tf_free(text);
        tf_loc l = {path, 0, 0};
        return tf_diag_error(o->diag, TF_IR_ERR_RUNTIME, &l, "cannot write IR dump: %s", strerror(errno));
    }
    fprintf(f, "# after pass %s (%s mode)\n%s", name, o->mode == TF_IR_TRAIN ? "train" : "infer", text);
    tf_free(text);
    if (fclose(f) != 0) {
        tf_loc l = {path, 0, 0};
        return tf_diag_error(o->diag, TF_IR_ERR_RUNTIME, &l, "cannot write IR dump: %s", strerror(errno));
    }
    return TF_IR_OK;
}

tf_ir_status tf_pipeline_parse(const char *list, const tf_options *o, tf_pipeline *pl)
{
    if (!list) list = tf_pipeline_default(o->mode);
    pl->n = 0;
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len) {
            const tf_pass_info *pi = tf_pass_find(p, len);
            if (!pi) {
                char names[512];
                size_t k = 0;
                for (int i = 0; i < tf_npasses; i++)
                    k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", tf_passes[i].name);
                return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "unknown pass '%.*s'; passes are: %s", (int)len, p,
                                     names);
            }
            if (pl->n == TF_PIPELINE_MAX)
                return tf_diag_error(o->diag, TF_IR_ERR_LIMIT, NULL, "more than 64 passes in one pipeline");
            pl->pass[pl->n++] = pi;
        }
        p += len + (comma ? 1 : 0);
    }
    char all[512];   /* the passes, for the messages below */
    size_t k = 0;
    for (int i = 0; i < tf_npasses && k < sizeof all; i++)
        k += (size_t)snprintf(all + k, sizeof all - k, "%s%s", i ? ", " : "", tf_passes[i].name);
    if (o->dump_ir && strcmp(o->dump_ir, "all") && !tf_pass_find(o->dump_ir, strlen(o->dump_ir)))
        return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "--dump-ir=%s names no pass (it takes all, or one of: %s)", o->dump_ir,
                             all);
    for (int i = 0; i < o->ndisabled; i++)
        if (!tf_pass_find(o->disabled[i], strlen(o->disabled[i])))
            return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL, "--disable-pass=%s names no pass; passes are: %s", o->disabled[i],
                                 all);
    return TF_IR_OK;
}

tf_ir_status tf_pipeline_begin(tf_module *m, const tf_options *o)
{
    if (o->dump_ir && o->dump_dir && make_dirs(o->dump_dir, o->diag)) return o->diag->status;
    if (o->dump_ir && !strcmp(o->dump_ir, "all") && dump(m, o, 0, "input")) return o->diag->status;
    return TF_IR_OK;
}

tf_ir_status tf_pipeline_run(tf_module *m, const tf_pipeline *pl, int from, int to, const tf_options *o)
{
    for (int i = from; i < to; i++) {
        const tf_pass_info *pi = pl->pass[i];
        if (tf_pass_disabled(o, pi)) {
            tf_explain(o, pi->name, NULL, "skipped (%s)", o->opt0 && (pi->flags & TF_PASSF_OPT) ? "--O0" : "--disable-pass");
            continue;
        }
        if ((pi->flags & TF_PASSF_CORE) && has_layer_ops(m))
            return tf_diag_error(o->diag, TF_IR_ERR_VERIFY, NULL,
                                 "pass '%s' needs a lowered module: run 'lower' before it (e.g. --passes=lower,%s)",
                                 pi->name, pi->name);
        if (m->nregions && !(pi->flags & TF_PASSF_REGIONS)) {
            tf_explain(o, pi->name, NULL, "dissolves %d fused region%s first (run fuse again to regroup)", m->nregions,
                       m->nregions == 1 ? "" : "s");
            tf_module_clear_regions(m);
        }
        m->plan.planned = false;   /* any pass may move values; memplan plans again */
        if (!(pi->flags & TF_PASSF_BACKWARD)) m->backward_start = 0;   /* passes.def: only such a pass keeps it */
        if (pi->run(m, o)) return o->diag->status;
        if (tf_verify(m, o->diag)) return o->diag->status;   /* a pass that breaks the IR is caught here */
        if (o->dump_ir && (!strcmp(o->dump_ir, "all") || !strcmp(o->dump_ir, pi->name)) && dump(m, o, i + 1, pi->name))
            return o->diag->status;
    }
    return TF_IR_OK;
}

