/* api.c — include/tfuse.h on top of the IR, the passes and the backends. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cache_file.h"
#include "interp.h"
#include "kernel.h"
#include "parser.h"
#include "comm.h"
#include "runtime.h"
#include "tensorio.h"
#include "env.h"

_Static_assert((int)TIO_F32 == (int)TF_DT_F32 && (int)TIO_BOOL == (int)TF_DT_BOOL && (int)TIO_I32 == (int)TF_DT_I32,
               "tensorio and IR dtype codes agree");

/* ---- models ---- */

static tf_status parse_into(tf_context_t *ctx, const char *name, const char *text, size_t len,
                            const tf_dim_override *dims, size_t ndims, tf_model_t **out)
{
    if (ndims > 256) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: more than 256 --dim overrides");
    tf_dim_set set[256] = {{0}};
    const char *auto_name = NULL;
    int nset = 0;
    for (size_t i = 0; i < ndims; i++) {
        if (!dims[i].name) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: dim override %zu has no name", i);
        if (dims[i].value == TF_DIM_AUTO) {
            if (auto_name)
                return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: only one dim can be auto (%s and %s are)", auto_name,
                                    dims[i].name);
            auto_name = dims[i].name;
            continue;
        }
        set[nset++] = (tf_dim_set){dims[i].name, dims[i].value};
    }
    tf_diag d = {0};
    tf_module *m;
    if (tf_parse(name, text, len, set, nset, &m, &d)) return tf_from_diag(ctx, &d);
    int auto_dim = auto_name ? tf_module_find_dim(m, auto_name, strlen(auto_name)) : -1;
    if (auto_name && auto_dim < 0) {
        tf_module_free(m);
        return tf_set_error(ctx, TF_ERR_VERIFY, "%s: error: --dim %s=auto: the module declares no dim named '%s'", name,
                            auto_name, auto_name);
    }
    tf_model_t *mo = tf_malloc(sizeof *mo);
    if (!mo) {
        tf_module_free(m);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    mo->m = m;
    mo->auto_dim = auto_dim;
    mo->init = NULL;
    *out = mo;
    return TF_OK;
}

tf_init_state *tf_init_state_retain(tf_init_state *s)
{
    if (s) __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
    return s;
}

void tf_init_state_release(tf_init_state *s)
{
    if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL)) return;
    for (size_t i = 0; i < s->n; i++) tio_tensor_free(&s->ts[i]);
    tf_free(s->ts);
    tf_free(s->source);
    tf_free(s);
}

/* Whether path names an ONNX model (by its extension: protobuf has no magic number). */
static bool onnx_path(const char *path)
{
    size_t n = strlen(path);
    return n > 5 && !strcasecmp(path + n - 5, ".onnx");
}

tf_status tf_model_parse_string(tf_context_t *ctx, const char *name, const char *text, size_t len,
                                const tf_dim_override *dims, size_t ndims, tf_model_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !out || (!text && len)) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    return parse_into(ctx, name ? name : "<string>", text ? text : "", len, dims, ndims, out);
}

tf_status tf_model_parse_file(tf_context_t *ctx, const char *path, const tf_dim_override *dims, size_t ndims,
                              tf_model_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !path || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    if (onnx_path(path)) return tf_onnx_load_model(ctx, path, dims, ndims, out);
    FILE *f = fopen(path, "rb");
    if (!f) return tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return tf_set_error(ctx, TF_ERR_IO, "%s: error: not a regular file", path);
    }
    if ((uint64_t)st.st_size > TF_MAX_SOURCE_BYTES) {
        fclose(f);
        return tf_set_error(ctx, TF_ERR_LIMIT, "%s: error: file is %lld bytes; model files are limited to %zu bytes",
                            path, (long long)st.st_size, TF_MAX_SOURCE_BYTES);
    }
    size_t n = (size_t)st.st_size;
    char *buf = tf_malloc(n + 1);
    if (!buf) {
        fclose(f);
        return tf_set_error(ctx, TF_ERR_OOM, "%s: error: out of memory reading the file", path);
    }
    size_t got = fread(buf, 1, n, f);
    bool bad = ferror(f);
    fclose(f);
    if (bad || got != n) {
        tf_free(buf);
        return tf_set_error(ctx, TF_ERR_IO, "%s: error: read failed", path);
    }
    buf[n] = 0;
    tf_status s = parse_into(ctx, path, buf, n, dims, ndims, out);
    tf_free(buf);
    return s;
}

void tf_model_free(tf_model_t *m)
{
    if (!m) return;
    tf_module_free(m->m);
    tf_init_state_release(m->init);
    tf_free(m);
}

static tf_status print_module(tf_context_t *ctx, const tf_module *m, char **out)
{
    if (!out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = tf_print_module(m);
    return *out ? TF_OK : tf_set_error(ctx, TF_ERR_OOM, "error: out of memory printing the module");
}

/* The text for a caller who free()s it: a copy from the C library. */
static tf_status print_export(tf_context_t *ctx, const tf_module *m, char **out)
{
    char *t = NULL;
    tf_status st = print_module(ctx, m, &t);
    if (st) return st;
    *out = tf_libc_copy(t, strlen(t) + 1);
    tf_free(t);
    return *out ? TF_OK : tf_set_error(ctx, TF_ERR_OOM, "error: out of memory printing the module");
}

tf_status tf_model_print(tf_context_t *ctx, const tf_model_t *m, char **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!m) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL model");
    return print_export(ctx, m->m, out);
}

/* ---- compiling ---- */

void tf_compile_options_init(tf_compile_options *o)
{
    memset(o, 0, sizeof *o);
    o->mode = TF_MODE_TRAIN;
    o->target = tf_default_target();
    o->opt_level = 1;
    tf_settings_from_env(o);   /* the target settings' defaults: the environment, read here only */
}

tf_target tf_default_target(void)
{
    if (!tf_backend_cuda.unavailable()) return TF_TARGET_CUDA;
    return tf_backend_cpu.unavailable() ? TF_TARGET_INTERP : TF_TARGET_CPU;
}

static const char *target_name(tf_target t)
{
    return t == TF_TARGET_INTERP ? "interp" : t == TF_TARGET_CPU ? "cpu" : t == TF_TARGET_CUDA ? "cuda" : t == TF_TARGET_CUDA_EMU ? "cuda-emu" : "?";
}

static void add_stat(tf_program_t *p, const char *name, int64_t v)
{
    if (p->nstats < (int)(sizeof p->stats / sizeof *p->stats)) p->stats[p->nstats++] = (tf_stat_entry){name, v};
}

void tf_program_free(tf_program_t *p)
{
    if (!p) return;
    if (p->has_plan) tf_kernels_free(&p->plan);
    tf_settings_free(&p->settings);
    tf_free(p->model_text);
    tf_free(p->model_name);
    for (int i = 0; i < p->ndisabled; i++) tf_free(p->disabled[i]);
    tf_free(p->disabled);
    if (p->pkg) tf_pkg_free(p->pkg);
    tf_free(p->pkg);
    tf_init_state_release(p->init);
    tf_module_free(p->m);
    tf_free(p->inputs.items);
    tf_free(p->params.items);
    tf_free(p->buffers.items);
    tf_free(p);
}

static tf_status make_options(tf_context_t *ctx, const tf_compile_options *opts, bool quiet, tf_diag *d, tf_options *o)
{
    *o = (tf_options){.mode = opts->mode == TF_MODE_INFER ? TF_IR_INFER : TF_IR_TRAIN,
                      .dump_ir = quiet ? NULL : opts->dump_ir, .dump_dir = opts->dump_dir, .diag = d,
                      .explain = quiet ? NULL : opts->explain, .opt0 = opts->opt_level == 0,
                      .disabled = opts->disable_passes, .ndisabled = (int)opts->ndisable_passes};
    if (!tf_ir_precision_of(opts->precision, &o->precision_set, &o->precision))
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: precision %d: expected one of tf_precision's values",
                            (int)opts->precision);
    if (opts->checkpoint != TF_CHECKPOINT_NONE && opts->checkpoint != TF_CHECKPOINT_AUTO)
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: checkpoint %d: expected TF_CHECKPOINT_NONE or TF_CHECKPOINT_AUTO",
                            (int)opts->checkpoint);
    o->checkpoint = opts->checkpoint == TF_CHECKPOINT_AUTO ? TF_IR_CHECKPOINT_AUTO : TF_IR_CHECKPOINT_NONE;
    o->memory_budget = opts->memory_budget;
    if (!(opts->memory_budget_percent >= 0 && opts->memory_budget_percent <= 100))
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: memory_budget_percent %g: expected a percentage in (0, 100]",
                            opts->memory_budget_percent);
    o->memory_budget_pct = opts->memory_budget > 0 ? 0 : opts->memory_budget_percent;
    o->attention_decomposed = opts->attention_decomposed != 0;
    o->numerics_exact = opts->numerics_exact != 0;
    o->data_parallel = opts->data_parallel != 0;
    o->sync_batchnorm = opts->sync_batchnorm != 0;
    const char *sh = opts->shard_optimizer;
    if (sh && strcmp(sh, "off") && strcmp(sh, "0")) {
        char *end;
        long n = strtol(sh, &end, 10);
        if (end == sh || *end || n < 1 || n > 65536)
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: shard_optimizer '%s': expected the number of ranks to "
                                "shard the optimizer state over (1 to 65536), or off%s", sh,
                                !strcmp(sh, "on") ? " ('on' is for tfuse train under mpirun, which knows the job's size)" : "");
        if (!opts->data_parallel)
            return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: shard_optimizer (--shard-optimizer) shards the optimizer "
                                "state over the ranks of a data-parallel step, and data_parallel is off");
        o->shard_ranks = (int)n;
    }
    if (o->sync_batchnorm && !o->data_parallel)
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: sync_batchnorm (--sync-batchnorm) averages batch norm's "
                            "statistics over the ranks of a data-parallel step, and data_parallel is off");
    o->allreduce_bucket = (int64_t)1 << 20;   /* docs/distributed.md: why 1 MiB */
    if (opts->allreduce_bucket && !tf_parse_bytes(opts->allreduce_bucket, &o->allreduce_bucket))
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: allreduce_bucket '%s': expected a size in bytes such as 4M "
                            "(digits, then K, M or G)", opts->allreduce_bucket);
    return TF_OK;
}

tf_status tf_model_run_passes(tf_context_t *ctx, tf_model_t *m, const char *passes, const tf_compile_options *opts)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!m || !passes) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    tf_compile_options dflt;
    if (!opts) {
        tf_compile_options_init(&dflt);
        opts = &dflt;
    }
    tf_diag d = {0};
    tf_options o;
    tf_status st = make_options(ctx, opts, false, &d, &o);
    if (st) return st;
    if (tf_run_pipeline(m->m, passes, &o)) return tf_from_diag(ctx, &d);
    return TF_OK;
}

/* --dump-kernels=DIR: DIR/kernels.txt, the kernel IR the emitters lower. */
static tf_status dump_kernels(tf_context_t *ctx, const tf_program_t *p, const char *dir)
{
    const tf_kernel_plan *plan;
    tf_status st = tf_program_plan(ctx, p, &plan);
    if (st) return st;
    char *text = tf_kernels_print(p->m, plan);
    if (!text) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory printing kernels");
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels.txt", dir);
    mkdir(dir, 0777);
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = false;
    tf_free(text);
    return ok ? TF_OK : tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot write: %s", path, strerror(errno));
}

/* tf_compile_options.outputs: keep only the outputs named, drop the ops
 * only the others needed (the dce pass, run here whatever the pipeline
 * holds), and the inputs that nothing kept reads: the program neither
 * computes the rest nor asks for data it would not use (a run for `logits`
 * takes no labels). Params and buffers stay: they are what a state file
 * loads. */
static tf_status keep_outputs(tf_context_t *ctx, tf_module *m, const tf_compile_options *opts, const tf_options *o)
{
    if (!opts->noutputs) return TF_OK;
    if (!opts->outputs) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: %zu outputs to keep, and no names", opts->noutputs);
    for (size_t i = 0; i < opts->noutputs; i++) {
        int k = 0;
        while (k < m->noutputs && (!opts->outputs[i] || strcmp(m->outputs[k].name, opts->outputs[i]))) k++;
        if (k < m->noutputs) continue;
        char names[512] = "";
        for (int j = 0; j < m->noutputs; j++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", j ? ", " : "", m->outputs[j].name);
        }
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: the model has no output named '%s' to compute (its outputs: %s)", opts->outputs[i] ? opts->outputs[i] : "(null)", names);
    }
    bool has_loss = false;
    for (size_t i = 0; i < opts->noutputs; i++) has_loss |= !strcmp(opts->outputs[i], "loss");
    if (o->mode == TF_IR_TRAIN && !has_loss)
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: a train step minimizes output 'loss': the outputs kept must "
                            "include it");
    int kept = 0;
    for (int k = 0; k < m->noutputs; k++) {
        bool want = false;
        for (size_t i = 0; i < opts->noutputs && !want; i++) want = !strcmp(m->outputs[k].name, opts->outputs[i]);
        if (want) m->outputs[kept++] = m->outputs[k];
        else tf_explain(o, "dce", &m->outputs[k].loc, "output %s is not asked for: not computed", m->outputs[k].name);
    }
    m->noutputs = kept;
    tf_options q = *o;
    q.explain = NULL;
    if (pass_dce(m, &q)) return tf_from_diag(ctx, o->diag);
    bool *used = tf_calloc((size_t)(m->next_id ? m->next_id : 1), sizeof *used);
    if (!used) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++)
            if (n->in[k]->kind != TF_VAL_CONST) used[n->in[k]->id] = true;
    }
    for (int i = 0; i < m->noutputs; i++) used[m->outputs[i].value->id] = true;
    for (int i = 0; i < m->nupdates; i++) used[m->updates[i].value->id] = used[m->updates[i].buffer->id] = true;
    int nd = 0;
    for (int i = 0; i < m->decls.n; i++) {
        tf_value *v = m->decls.items[i];
        if (v->kind != TF_VAL_INPUT || used[v->id]) {
            m->decls.items[nd++] = v;
            continue;
        }
        tf_explain(o, "dce", &v->loc, "input %s: nothing asked for reads it, so it is no input of the program", v->name);
        tf_module_remove_name(m, v);
    }
    m->decls.n = nd;
    tf_free(used);
    tf_module_renumber(m);
    return TF_OK;
}

/* A program of module m (taken, freed on failure too) with opts' mode,
 * target, threads and precision, and the passes' options into *o. */
static tf_status new_program(tf_context_t *ctx, tf_module *m, const tf_compile_options *opts, bool quiet, tf_diag *d, tf_options *o,
                             tf_program_t **out)
{
    *out = NULL;
    tf_program_t *p = m ? tf_calloc(1, sizeof *p) : NULL;
    if (!p) {
        tf_module_free(m);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    p->m = m;
    p->mode = opts->mode == TF_MODE_INFER ? TF_IR_INFER : TF_IR_TRAIN;
    p->target = opts->target;
    p->threads = opts->threads;
    tf_status st = make_options(ctx, opts, quiet, d, o);
    if (st) {
        tf_program_free(p);
        return st;
    }
    p->precision = tf_precision_of_ir(tf_options_precision(o, p->m));
    *out = p;
    return TF_OK;
}

/* Run the pipeline on a copy of src, fitted into memory where the options
 * ask (tf_fit_pipeline: the checkpoint search, and the auto dim when
 * auto_dim >= 0, whose value goes to *chosen). */
static tf_status compile_module(tf_context_t *ctx, tf_module *src, const tf_compile_options *opts, int auto_dim,
                                int64_t *chosen, tf_program_t **out)
{
    tf_program_t *p = NULL;
    tf_diag d = {0};
    tf_options o;
    tf_status st = new_program(ctx, tf_module_clone(src), opts, false, &d, &o, &p);
    if (st) return st;
    if ((st = keep_outputs(ctx, p->m, opts, &o))) {
        tf_program_free(p);
        return st;
    }
    tf_fit fit = {.dim = auto_dim, .limit = opts->memory_limit};
    if (tf_fit_pipeline(p->m, NULL, &o, &fit)) {
        tf_program_free(p);
        return tf_from_diag(ctx, &d);
    }
    *chosen = fit.value;
    *out = p;
    return TF_OK;
}

/* Floating-point operations of one step's matmuls and convolutions, two
 * per multiply-add: what a step's GFLOP/s divides (bench's gflops). The
 * pointwise ops and reductions are left out: they are memory-bound, and
 * counting them would flatter a step. */
static int64_t step_flops(const tf_module *m)
{
    int64_t f = 0;
    for (int i = 0; i < m->nodes.n; i++) {
        int64_t x = tf_node_flops_heavy(m->nodes.items[i]);
        f = x > INT64_MAX - f ? INT64_MAX : f + x;
    }
    return f;
}

static int64_t planned_peak(const tf_program_t *p)
{
    return p->m->plan.planned ? p->m->plan.arena_bytes + p->m->plan.persistent_bytes : -1;
}

static tf_status finish_program(tf_context_t *ctx, tf_program_t *p, char *model_text, const tf_compile_options *opts,
                                const char *auto_dim, int64_t chosen, tf_program_t **out);

tf_status tf_program_compile(tf_context_t *ctx, const tf_model_t *model, const tf_compile_options *opts,
                             tf_program_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !model || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    tf_compile_options dflt;
    if (!opts) {
        tf_compile_options_init(&dflt);
        opts = &dflt;
    }
    if (!tf_backend_for(opts->target))
        return tf_set_error(ctx, TF_ERR_UNAVAILABLE,
                            "error: target '%s' is not part of this build yet (this build has: interp, cpu, cuda); "
                            "compile with --target=cpu or --target=interp",
                            target_name(opts->target));
    tf_program_t *p = NULL;
    tf_status st;
    int64_t chosen = 0;
    if (model->auto_dim >= 0) {   /* the options of the search; tf_fit_pipeline does it */
        const char *name = model->m->dims[model->auto_dim].name;
        if (opts->memory_limit <= 0)
            return tf_set_error(ctx, TF_ERR_INVALID_ARG,
                                "error: --dim %s=auto picks the largest %s whose planned peak fits a memory limit; "
                                "give one with --memory-limit=BYTES", name, name);
        for (size_t i = 0; i < opts->ndisable_passes; i++)
            if (opts->disable_passes[i] && !strcmp(opts->disable_passes[i], "memplan"))
                return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: --dim %s=auto needs memplan, which is disabled", name);
    }
    char *model_text = tf_print_module(model->m);   /* before the passes: what tf_program_save keeps */
    if (!model_text) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory printing the model");
    st = compile_module(ctx, model->m, opts, model->auto_dim, &chosen, &p);
    if (st) {
        tf_free(model_text);
        return st;
    }
    st = finish_program(ctx, p, model_text, opts, model->auto_dim >= 0 ? model->m->dims[model->auto_dim].name : NULL, chosen, out);
    if (!st) (*out)->init = tf_init_state_retain(model->init);
    return st;
}

/* The rest of a program once its module is final (by the passes, or read
 * back from a package): the options it keeps, its inputs, params and
 * buffers, its stats, its kernel plan, and the dumps asked for. Takes
 * model_text and p (freed on failure). */
static tf_status finish_program(tf_context_t *ctx, tf_program_t *p, char *model_text, const tf_compile_options *opts,
                                const char *auto_dim, int64_t chosen, tf_program_t **out)
{
    tf_status st = TF_OK;
    p->model_text = model_text;
    p->opts = *opts;
    p->opts.dump_ir = p->opts.dump_dir = p->opts.dump_kernels = p->opts.dump_llvm = p->opts.llvm_pipeline = NULL;
    p->opts.disable_passes = NULL, p->opts.ndisable_passes = 0, p->opts.explain = NULL;
    p->opts.outputs = NULL;   /* noutputs stays: a program that computes fewer outputs is not packaged */
    if (opts->ndisable_passes && !(p->disabled = tf_calloc(opts->ndisable_passes, sizeof *p->disabled))) {
        tf_program_free(p);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    for (size_t i = 0; i < opts->ndisable_passes; i++)
        if (opts->disable_passes[i] && !(p->disabled[p->ndisabled++] = tf_strdup(opts->disable_passes[i]))) {
            tf_program_free(p);
            return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
        }
    int64_t params = 0;
    for (int i = 0; i < p->m->decls.n; i++) {
        tf_value *v = p->m->decls.items[i];
        tf_vec *dst = v->kind == TF_VAL_INPUT ? &p->inputs : v->kind == TF_VAL_PARAM ? &p->params : &p->buffers;
        if (tf_vec_push(p->m, dst, v)) {
            tf_program_free(p);
            return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
        }
        if (v->kind == TF_VAL_PARAM) params += tf_type_numel(&v->type);
    }
    /* kernels: one per fused region, one per op outside a region, none for a
     * reshape (a view of its operand's memory) */
    int64_t kernels = 0, casts = 0;
    for (int i = 0, cur = 0; i < p->m->nodes.n; i++) {
        const tf_node *n = p->m->nodes.items[i];
        if (n->op == TF_OP_CAST) casts++;
        if (n->region) kernels += n->region != cur;
        else kernels += tf_op_exec_of(n->op) != TF_OPX_VIEW;
        cur = n->region;
    }
    add_stat(p, "ops", p->m->nodes.n);
    add_stat(p, "kernels", kernels);
    add_stat(p, "fused_regions", p->m->nregions);
    add_stat(p, "casts", casts);
    add_stat(p, "params", params);
    if (p->m->plan.planned) {   /* without memplan there is no plan to report */
        add_stat(p, "peak_bytes", planned_peak(p));
        add_stat(p, "arena_bytes", p->m->plan.arena_bytes);
    }
    if (auto_dim) add_stat(p, auto_dim, chosen);
    add_stat(p, "step_flops", step_flops(p->m));
    if (opts->checkpoint == TF_CHECKPOINT_AUTO) {   /* what checkpointing costs: FLOPs, and that over the step's */
        int64_t rf = 0, all = 0, nrec = 0;
        for (int i = 0; i < p->m->nodes.n; i++) {
            const tf_node *n = p->m->nodes.items[i];
            int64_t f = tf_node_flops(n);
            all = f > INT64_MAX - all ? INT64_MAX : all + f;
            if (n->recompute) rf = f > INT64_MAX - rf ? INT64_MAX : rf + f, nrec++;
        }
        add_stat(p, "recomputed_ops", nrec);
        add_stat(p, "recompute_flops", rf);
        /* the step-time overhead, if time went as FLOPs: recomputed over the rest, in tenths of a percent */
        add_stat(p, "recompute_overhead_permille", all > rf ? (int64_t)(1000.0 * (double)rf / (double)(all - rf) + 0.5) : 0);
    }
    int64_t ar_bytes = 0, ar_buckets = 0, ar_now = 0;   /* data parallel: what a step averages over the ranks */
    for (int i = 0; i < p->m->nodes.n; i++) {
        const tf_node *n = p->m->nodes.items[i];
        if (n->op != TF_OP_ALLREDUCE) continue;
        int64_t b = tf_node_int(n, "bucket");
        ar_bytes += tf_type_numel(&n->out->type) * tf_dtype_bytes(n->out->type.dtype);
        if (b < 0) ar_now++;
        else if (b + 1 > ar_buckets) ar_buckets = b + 1;
    }
    if (ar_bytes) {
        add_stat(p, "allreduce_bytes", ar_bytes);
        add_stat(p, "allreduce_buckets", ar_buckets);
        add_stat(p, "allreduce_at_once", ar_now);
    }
    add_stat(p, "inputs", p->inputs.n);
    add_stat(p, "outputs", p->m->noutputs);
    if (!tf_settings_copy(&p->settings, opts)) {
        tf_program_free(p);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    /* the kernel plan, once: every session and artifact of the program runs it */
    if (tf_kernels_build(p->m, &p->plan, &p->plan_diag) == TF_IR_OK) p->has_plan = true;
    else if (p->target != TF_TARGET_INTERP || p->plan_diag.status == TF_IR_ERR_OOM) st = tf_from_diag(ctx, &p->plan_diag);
    for (int i = 0; p->has_plan && i < p->nstats; i++) {   /* the plan's count, which bench and --dump-kernels report */
        if (!strcmp(p->stats[i].name, "kernels")) p->stats[i].value = tf_kernels_count(&p->plan);
    }
    if (p->has_plan) {   /* what the kernels must move per step, at the least: bytes over a copy's bandwidth bound their time */
        int64_t fb = 0, all = 0;
        for (int i = 0; i < p->plan.nkernels; i++) {
            int64_t b = tf_kernel_bytes(&p->plan.kernels[i]);
            all += b;
            if (p->plan.kernels[i].kind == TF_K_ELEMENTWISE || p->plan.kernels[i].kind == TF_K_REDUCTION) fb += b;
        }
        add_stat(p, "fused_bytes", fb);
        add_stat(p, "kernel_bytes", all);
    }
    if (!st && opts->dump_kernels) st = dump_kernels(ctx, p, opts->dump_kernels);
    if (!st && opts->dump_llvm) {   /* the cpu target's code: its LLVM IR */
        const tf_backend *cpu = tf_backend_for(TF_TARGET_CPU);
        mkdir(opts->dump_llvm, 0777);
        st = cpu->dump_code(ctx, p, opts->dump_llvm);
    }
    if (st) {
        tf_program_free(p);
        return st;
    }
    *out = p;
    return TF_OK;
}

tf_status tf_program_from_final(tf_context_t *ctx, tf_module *m, char *model_text, const tf_compile_options *opts, const char *auto_dim,
                                int64_t chosen, tf_program_t **out)
{
    tf_program_t *p = NULL;
    tf_diag d = {0};
    tf_options o;
    tf_status st = new_program(ctx, m, opts, true, &d, &o, &p);
    if (st) {
        tf_free(model_text);
        return st;
    }
    p->from_final = true;
    return finish_program(ctx, p, model_text, opts, auto_dim, chosen, out);
}

size_t tf_program_stat_count(const tf_program_t *p) { return p ? (size_t)p->nstats : 0; }

tf_status tf_program_stat(const tf_program_t *p, size_t i, const char **name, int64_t *value)
{
    if (!p || i >= (size_t)p->nstats || !name || !value) return TF_ERR_INVALID_ARG;
    *name = p->stats[i].name;
    *value = p->stats[i].value;
    return TF_OK;
}

tf_status tf_program_print(tf_context_t *ctx, const tf_program_t *p, char **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!p) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL program");
    return print_export(ctx, p->m, out);
}

tf_status tf_program_write_artifact(tf_context_t *ctx, const tf_program_t *p, const char *dir, const char *arch,
                                    int *nbinaries)
{
    tf_artifact_info info;
    tf_status st = tf_program_write_artifact_info(ctx, p, dir, arch, &info);
    if (nbinaries) *nbinaries = info.binaries;
    return st;
}

tf_status tf_program_write_artifact_info(tf_context_t *ctx, const tf_program_t *p, const char *dir, const char *arch,
                                         tf_artifact_info *info)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    tf_artifact_info none;
    if (!info) info = &none;
    memset(info, 0, sizeof *info);
    if (!p || !dir) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot create the directory: %s", dir, strerror(errno));
    char *text = NULL, path[4200];
    tf_status st = print_module(ctx, p->m, &text);
    if (st) return st;
    snprintf(path, sizeof path, "%s/program.ir", dir);
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = false;
    tf_free(text);
    if (!ok) return tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot write: %s", path, strerror(errno));
    if ((st = dump_kernels(ctx, p, dir))) return st;
    const tf_backend *be = tf_backend_for(p->target);
    if (!be || !be->write_artifact) return TF_OK;
    return be->write_artifact(ctx, p, dir, arch, info);
}

static void doctor_settings(tf_context_t *ctx, const tf_compile_options *o, tf_strbuf *t)
{
    char b[4200];
    tf_settings_doctor(o, t);
    tf_cache_info ci;
    tf_cache_t *c = tf_context_cache(ctx);
    if (c && !tf_cache_get_info(c, &ci)) {
        const char *from = c->limit_from;
        if (!strcmp(from, "set")) from = "option";
        else if (!strcmp(from, "default")) from = "default";
        else {
            snprintf(b, sizeof b, "env TFUSE_JIT_CACHE_KERNELS=%s", tf_env("TFUSE_JIT_CACHE_KERNELS") ? tf_env("TFUSE_JIT_CACHE_KERNELS") : "?");
            from = b;
        }
        tf_strbuf_printf(t, "setting jit_cache_kernels: %d (%s)\n", ci.limit, from);
    }
    uint64_t max;
    const char *max_from;
    char why[512];
    if (tf_cache_max(&max, &max_from, why, sizeof why))
        tf_strbuf_printf(t, "setting cache_max: %llu bytes (%s%s)\n", (unsigned long long)max,
                         !strcmp(max_from, "env") ? "env TFUSE_CACHE_MAX=" : "default",
                         !strcmp(max_from, "env") ? tf_env("TFUSE_CACHE_MAX") : "");
    else
        tf_strbuf_printf(t, "setting cache_max: invalid: %s\n", why);
    for (size_t i = 0; i < tf_env_nvars; i++) {   /* tfuse's other environment variables, where set */
        const char *v = tf_env(tf_env_vars[i].name);
        if (v && !strncmp(tf_env_vars[i].name, "TFUSE_", 6))
            tf_strbuf_printf(t, "env %s=%.1000s: %s\n", tf_env_vars[i].name, v, tf_env_vars[i].help);
    }
}

tf_status tf_doctor(tf_context_t *ctx, char **out) { return tf_doctor_options(ctx, NULL, out); }

tf_status tf_doctor_options(tf_context_t *ctx, const tf_compile_options *opts, char **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    tf_compile_options dflt;
    if (!opts) {
        tf_compile_options_init(&dflt);
        opts = &dflt;
    }
    tf_strbuf t = {0};
    tf_strbuf_printf(&t, "tfuse %s\ndefault target: %s\n", TFUSE_VERSION, target_name(tf_default_target()));
    static const tf_target all[] = {TF_TARGET_CPU, TF_TARGET_CUDA, TF_TARGET_CUDA_EMU, TF_TARGET_INTERP};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        const tf_backend *be = tf_backend_for(all[i]);
        const char *why = be ? be->unavailable() : "not part of this build yet";
        tf_strbuf_printf(&t, "target %s: %s%s\n", target_name(all[i]), why ? "cannot run here: " : "available", why ? why : "");
    }
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        const tf_backend *be = tf_backend_for(all[i]);
        if (be && be->doctor) be->doctor(&t);
    }
    char mpi[600];   /* data parallel: the MPI library tf_comm_create_mpi would open */
    tf_comm_mpi_doctor(mpi, sizeof mpi);
    int rank, size;
    tf_strbuf_printf(&t, "%s\n", mpi);
    if (tf_comm_launched(&rank, &size)) tf_strbuf_printf(&t, "mpi: this process is rank %d of %d\n", rank, size);
    doctor_settings(ctx, opts, &t);
    *out = t.oom || !t.p ? NULL : tf_libc_copy(t.p, t.n + 1);   /* the caller free()s it */
    tf_free(t.p);
    if (!*out) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    return TF_OK;
}

tf_status tf_target_op_support(tf_context_t *ctx, tf_target target, const char *op, const char **how, char *detail,
                               size_t n)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!op || !how) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *how = NULL;
    char scratch[8];
    if (!detail || !n) detail = scratch, n = sizeof scratch;
    detail[0] = 0;
    const tf_backend *be = tf_backend_for(target);
    if (!be) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: no target %d", (int)target);
    int k = tf_op_lookup(op, strlen(op));
    if (k < 0) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: no op named '%s'", op);
    *how = be->op_support ? be->op_support((tf_op)k, detail, n) : NULL;
    return TF_OK;
}

size_t tf_program_io_count(const tf_program_t *p, tf_io_kind kind)
{
    if (!p) return 0;
    switch (kind) {
    case TF_IO_INPUT: return (size_t)p->inputs.n;
    case TF_IO_OUTPUT: return (size_t)p->m->noutputs;
    case TF_IO_PARAM: return (size_t)p->params.n;
    case TF_IO_BUFFER: return (size_t)p->buffers.n;
    }
    return 0;
}

static void fill_shape(const tf_type *t, tf_dtype *dtype, int *rank, int64_t shape[8])
{
    if (dtype) *dtype = (tf_dtype)t->dtype;
    if (rank) *rank = t->rank;
    if (shape)
        for (int i = 0; i < t->rank; i++) shape[i] = t->dims[i].n;
}

tf_status tf_program_io(const tf_program_t *p, tf_io_kind kind, size_t i, const char **name, tf_dtype *dtype,
                        int *rank, int64_t shape[8])
{
    if (!p || i >= tf_program_io_count(p, kind)) return TF_ERR_INVALID_ARG;
    const tf_value *v;
    const char *nm;
    if (kind == TF_IO_OUTPUT) {
        v = p->m->outputs[i].value;
        nm = p->m->outputs[i].name;
    } else {
        const tf_vec *vec = kind == TF_IO_INPUT ? &p->inputs : kind == TF_IO_PARAM ? &p->params : &p->buffers;
        v = vec->items[i];
        nm = v->name;
    }
    if (name) *name = nm;
    fill_shape(&v->type, dtype, rank, shape);
    return TF_OK;
}

/* The value an index operand (one_hot's labels, gather's ids) reads: itself,
 * or, for cross_entropy's lowering, y in where(ne(y, ignore), y, 0), whose
 * one ignored label (*ignore, *has_ignore) is allowed beside [0, depth). */
static const tf_value *index_source(const tf_value *v, bool *has_ignore, int64_t *ignore)
{
    *has_ignore = false;
    const tf_node *w = v->kind == TF_VAL_NODE ? v->def : NULL;
    if (!w || w->op != TF_OP_WHERE || w->in[2]->kind != TF_VAL_CONST || w->in[2]->cval != 0) return v;
    const tf_node *ne = w->in[0]->kind == TF_VAL_NODE ? w->in[0]->def : NULL;
    if (!ne || ne->op != TF_OP_NE || ne->in[0] != w->in[1] || ne->in[1]->kind != TF_VAL_CONST) return v;
    *has_ignore = true;
    *ignore = (int64_t)ne->in[1]->cval;
    return w->in[1];
}

tf_status tf_program_input_bound(const tf_program_t *p, size_t i, int64_t *upper)
{
    if (!p || !upper || i >= (size_t)p->inputs.n) return TF_ERR_INVALID_ARG;
    const tf_value *v = p->inputs.items[i];
    int64_t bound = 0;
    for (int k = 0; k < p->m->nodes.n; k++) {
        const tf_node *n = p->m->nodes.items[k];
        int64_t b = 0;
        bool ign;
        int64_t ii;
        if (n->op == TF_OP_ONE_HOT && index_source(n->in[0], &ign, &ii) == v) b = tf_node_int(n, "depth");
        if ((n->op == TF_OP_GATHER || n->op == TF_OP_EMBEDDING) && n->in[0] == v) b = n->in[1]->type.dims[0].n;
        if (n->op == TF_OP_CROSS_ENTROPY && n->in[1] == v) b = n->in[0]->type.dims[n->in[0]->type.rank - 1].n;
        if (b && (!bound || b < bound)) bound = b;
    }
    *upper = bound;
    return TF_OK;
}

/* ---- sessions ---- */

static size_t type_bytes(const tf_type *t) { return (size_t)tf_type_numel(t) * (size_t)tf_dtype_bytes(t->dtype); }

static tf_status apply_state(tf_session_t *s, const tio_tensor *ts, size_t n, const char *path);

tf_status tf_session_create(tf_context_t *ctx, const tf_program_t *p, tf_target target, uint64_t seed,
                            tf_session_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !p || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    const tf_backend *be = tf_backend_for(target);
    if (!be)
        return tf_set_error(ctx, TF_ERR_UNAVAILABLE,
                            "error: target '%s' is not part of this build yet (this build has: interp, cpu, cuda)",
                            target_name(target));
    const char *why = be->unavailable();
    if (why) return tf_set_error(ctx, TF_ERR_UNAVAILABLE, "error: target '%s' cannot run here: %s", be->name, why);
    tf_session_t *s = tf_calloc(1, sizeof *s);
    if (!s) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    s->ctx = ctx;
    s->p = p;
    s->be = be;
    s->seed = seed;
    s->bound = tf_calloc((size_t)(p->inputs.n ? p->inputs.n : 1), sizeof *s->bound);
    s->out = tf_calloc((size_t)(p->m->noutputs ? p->m->noutputs : 1), sizeof *s->out);
    bool ok = s->bound && s->out;
    for (int i = 0; ok && i < p->m->noutputs; i++) {
        size_t b = type_bytes(&p->m->outputs[i].value->type);
        ok = (s->out[i] = tf_malloc(b ? b : 1)) != NULL;
    }
    if (!ok) {
        tf_session_free(s);
        return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory allocating outputs");
    }
    /* a package's initial state, or the model's (an ONNX model's initializers), replaces the initializers': read (and
     * checked) first, so that the backend can skip them */
    const tf_pkg_section *init = p->pkg ? tf_pkg_find(p->pkg, "state.safetensors") : NULL;
    tio_tensor *ts = NULL;
    size_t nts = 0;
    bool given = init || p->init;
    const char *from = init ? "package state.safetensors" : p->init ? p->init->source : NULL;
    if (given) {
        char err[5120];
        tf_status st = TF_OK;
        if (init) {   /* views into the package's section: apply_state copies each tensor once, straight into the session's storage */
            tio_status ts_st = tio_safetensors_view_mem("package state.safetensors", init->data, init->len, &ts, &nts, err, sizeof err);
            st = ts_st ? tf_set_error(ctx, ts_st == TIO_ERR_OOM ? TF_ERR_OOM : TF_ERR_FORMAT, "%s", err) : TF_OK;
        } else if (!(ts = tf_malloc((p->init->n ? p->init->n : 1) * sizeof *ts))) {
            st = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
        } else {   /* the model's tensors that are still params or buffers after the passes (a folded one is not) */
            for (size_t k = 0; k < p->init->n; k++)
                for (int i = 0; i < p->params.n + p->buffers.n; i++) {
                    const tf_value *v = i < p->params.n ? p->params.items[i] : p->buffers.items[i - p->params.n];
                    if (!strcmp(p->init->ts[k].name, v->name)) {
                        ts[nts++] = p->init->ts[k];
                        break;
                    }
                }
        }
        for (int i = 0; !st && i < p->params.n + p->buffers.n; i++) {   /* every param and buffer, or the initializers run */
            const tf_value *v = i < p->params.n ? p->params.items[i] : p->buffers.items[i - p->params.n];
            bool found = false;
            for (size_t k = 0; k < nts && !found; k++) found = !strcmp(ts[k].name, v->name);
            if (!found && !tf_interp_init_is_zero(v))   /* zeros() are left out: a session starts them at zero */
                st = init ? tf_set_error(ctx, TF_ERR_FORMAT, "error: the package's initial state has no '%s': compile the model again",
                                         v->name)
                          : tf_set_error(ctx, TF_ERR_FORMAT, "%s: error: the model's initial values have no '%s'", from, v->name);
        }
        if (st) {
            if (init) tio_views_free(ts, nts);
            else tf_free(ts);
            tf_session_free(s);
            return st;
        }
        s->state_given = true;
    }
    tf_status st = be->session_create(s);
    if (st) {
        if (init) tio_views_free(ts, nts);
        else tf_free(ts);
        s->be = NULL;   /* nothing to free in the backend */
        tf_session_free(s);
        return st;
    }
    if (given) {
        st = apply_state(s, ts, nts, from);
        if (init) tio_views_free(ts, nts);
        else tf_free(ts);
        if (st) {
            tf_session_free(s);
            return st;
        }
    }
    *out = s;
    return TF_OK;
}

const char *tf_session_missing_params(const tf_session_t *s) { return s ? s->missing : NULL; }

void tf_session_free(tf_session_t *s)
{
    if (!s) return;
    tf_free(s->missing);
    tf_free(s->trace);
    if (s->be && s->impl) s->be->session_free(s);
    if (s->out)
        for (int i = 0; i < s->p->m->noutputs; i++) tf_free(s->out[i]);
    tf_free(s->out);
    tf_free(s->bound);
    tf_free(s);
}

static char *shape_str(char *buf, size_t n, tf_dtype dt, const int64_t *shape, int rank)
{
    size_t k = (size_t)snprintf(buf, n, "%s[", tf_dtype_name((tf_dt)dt));
    for (int i = 0; i < rank && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

tf_status tf_session_bind(tf_session_t *s, const char *input, tf_dtype dtype, const int64_t *shape, int rank,
                          const void *data)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s || !input || (!shape && rank) || !data)
        return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    for (int i = 0; i < s->p->inputs.n; i++) {
        const tf_value *v = s->p->inputs.items[i];
        if (strcmp(v->name, input) != 0) continue;
        bool ok = (tf_dt)dtype == v->type.dtype && rank == v->type.rank;
        for (int k = 0; ok && k < rank; k++) ok = shape[k] == v->type.dims[k].n;
        if (!ok) {
            char b1[256], b2[256];
            return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: input '%s' is %s, the data given is %s", input,
                                tf_type_str(NULL, &v->type, b1), shape_str(b2, sizeof b2, dtype, shape, rank));
        }
        s->bound[i] = data;
        return TF_OK;
    }
    if (tf_program_input_unread(s->p, input)) return TF_OK;   /* declared, and not needed for the outputs: ignored */
    return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: the model has no input named '%s'", input);
}

/* Ids and labels read straight from an input are checked before a step on
 * every target, with the message and place the interpreter gives: compiled
 * kernels index with them (gather) or compare against them (one_hot), and
 * an id out of range must be an error, never a wrong number. */
static tf_status check_indices(tf_session_t *s)
{
    const tf_module *m = s->p->m;
    for (int k = 0; k < m->nodes.n; k++) {
        const tf_node *n = m->nodes.items[k];
        if (n->op != TF_OP_ONE_HOT && n->op != TF_OP_GATHER) continue;
        bool has_ignore;
        int64_t ignore;
        const tf_value *v = index_source(n->in[0], &has_ignore, &ignore);
        int i = 0;
        while (i < s->p->inputs.n && s->p->inputs.items[i] != v) i++;
        if (i == s->p->inputs.n || (v->type.dtype != TF_DT_I64 && v->type.dtype != TF_DT_I32)) continue;
        int64_t hi = n->op == TF_OP_ONE_HOT ? tf_node_int(n, "depth") : n->in[1]->type.dims[0].n;
        int64_t count = tf_type_numel(&v->type);
        for (int64_t j = 0; j < count; j++) {
            int64_t x = v->type.dtype == TF_DT_I64 ? ((const int64_t *)s->bound[i])[j] : ((const int32_t *)s->bound[i])[j];
            if ((x >= 0 && x < hi) || (has_ignore && x == ignore)) continue;
            tf_diag d = {0};
            tf_diag_error(&d, TF_IR_ERR_RUNTIME, &n->loc, "%s: %s %lld at position %lld is out of range [0, %lld)",
                          tf_op_info_of(n->op)->name, n->op == TF_OP_ONE_HOT ? "label" : "id", (long long)x, (long long)j,
                          (long long)hi);
            return tf_from_diag(s->ctx, &d);
        }
    }
    return TF_OK;
}

/* The step the last run enqueued, finished (a backend whose run returns
 * before the device is done: cuda): every call that reads results, state or
 * profiles waits for it first, and is the one that reports its error. */
static tf_status session_wait(tf_session_t *s) { return s->be && s->be->wait && s->impl ? s->be->wait(s) : TF_OK; }

tf_status tf_session_run(tf_session_t *s)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s) return TF_ERR_INVALID_ARG;
    for (int i = 0; i < s->p->inputs.n; i++)
        if (!s->bound[i])
            return tf_set_error(s->ctx, TF_ERR_RUNTIME, "error: input '%s' is not bound",
                                ((tf_value *)s->p->inputs.items[i])->name);
    tf_status st = check_indices(s);
    if (!st) st = s->be->run(s);
    if (s->tracing) s->trace_run++;   /* the backends tag this run's calls with the count before it */
    return st;
}

tf_status tf_session_output(tf_session_t *s, const char *name, tf_tensor_view *out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s || !name || !out) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    for (int i = 0; i < s->p->m->noutputs; i++)
        if (!strcmp(s->p->m->outputs[i].name, name)) {
            tf_status st = session_wait(s);
            if (!st && s->be && s->be->output_fetch && s->impl) st = s->be->output_fetch(s, i);
            if (st) return st;
            fill_shape(&s->p->m->outputs[i].value->type, &out->dtype, &out->rank, out->shape);
            out->data = s->out[i];
            return TF_OK;
        }
    return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: the model has no output named '%s'", name);
}

static const tf_value *find_state(const tf_session_t *s, const char *name)
{
    for (int i = 0; i < s->p->params.n; i++)
        if (!strcmp(((tf_value *)s->p->params.items[i])->name, name)) return s->p->params.items[i];
    for (int i = 0; i < s->p->buffers.n; i++)
        if (!strcmp(((tf_value *)s->p->buffers.items[i])->name, name)) return s->p->buffers.items[i];
    return NULL;
}

tf_status tf_session_get_state(tf_session_t *s, const char *name, tf_tensor_view *out, size_t capacity)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s || !name || !out) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    const tf_value *v = find_state(s, name);
    if (!v) return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: the model has no param or buffer named '%s'", name);
    fill_shape(&v->type, &out->dtype, &out->rank, out->shape);
    if (!out->data) return TF_OK;
    size_t need = (size_t)tf_type_numel(&v->type) * (size_t)tf_dtype_bytes(v->type.dtype);
    if (capacity < need)
        return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "get_state: error: '%s' needs %zu bytes, the buffer holds %zu", name,
                            need, capacity);
    tf_status st = session_wait(s);
    return st ? st : s->be->state_read(s, v, out->data);
}

static tf_status check_view(tf_session_t *s, const tf_value *v, const tf_tensor_view *t, const char *what)
{
    bool ok = (tf_dt)t->dtype == v->type.dtype && t->rank == v->type.rank;
    for (int k = 0; ok && k < t->rank; k++) ok = t->shape[k] == v->type.dims[k].n;
    if (ok) return TF_OK;
    char b1[256], b2[256];
    return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "%s: error: '%s' is %s in the model, %s there", what, v->name,
                        tf_type_str(NULL, &v->type, b1), shape_str(b2, sizeof b2, t->dtype, t->shape, t->rank));
}

tf_status tf_session_set_state(tf_session_t *s, const char *name, const tf_tensor_view *t)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s || !name || !t || !t->data) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    const tf_value *v = find_state(s, name);
    if (!v) return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: the model has no param or buffer named '%s'", name);
    tf_status st = check_view(s, v, t, "set_state");
    if (!st) st = session_wait(s);
    return st ? st : s->be->state_write(s, v, t->data);
}

/* shard_optimizer (ZeRO-1): the ranks a program shards its optimizer state
 * over (its shard ops' `ranks`), 0 when it does not. */
static int shard_ranks_of(const tf_program_t *p)
{
    for (int i = 0; i < p->m->nodes.n; i++) {
        const tf_node *n = p->m->nodes.items[i];
        if (n->op == TF_OP_SHARD) return (int)tf_node_int(n, "ranks");
    }
    return 0;
}

/* The param whose optimizer slot v is, when v holds only this rank's chunk
 * of it (opt.<slot>.<param>, [ceil(n / ranks)] elements); else NULL. In a
 * file such a slot has its param's shape: the chunks of every rank. */
static const tf_value *sharded_slot(const tf_session_t *s, const tf_value *v, int ranks)
{
    if (!ranks || strncmp(v->name, "opt.", 4) || v->type.rank != 1) return NULL;
    const char *dot = strchr(v->name + 4, '.');
    for (int i = 0; dot && i < s->p->params.n; i++) {
        const tf_value *w = s->p->params.items[i];
        int64_t n = tf_type_numel(&w->type);
        if (!strcmp(dot + 1, w->name) && v->type.dims[0].n == (n + ranks - 1) / ranks) return w;
    }
    return NULL;
}

/* A session of a sharded program in a job of another size cannot hold its chunks. */
static tf_status shard_job(tf_session_t *s, int ranks, const char *what)
{
    int size = tf_comm_size(s->comm);
    if (size == ranks) return TF_OK;
    return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "%s: error: the program shards its optimizer state over %d ranks "
                        "(shard_optimizer), and the session's job has %d (tf_session_set_comm)", what, ranks, size);
}

/* State that compiling in train mode adds (autodiff's optimizer slots
 * "opt.SLOT.PARAM", its step counter and loss scale "train.*"): a program
 * compiled for inference has none of it and skips it in a checkpoint. */
static bool is_training_state(const char *name) { return !strncmp(name, "opt.", 4) || !strncmp(name, "train.", 6); }

tf_status tf_session_load_state(tf_session_t *s, const char *path) { return tf_session_load_state_meta(s, path, NULL); }

/* Tensors (from a state file, or a package's initial state: path names
 * it in errors) into the session's params and buffers: everything checked
 * before anything is written. */
static tf_status apply_state(tf_session_t *s, const tio_tensor *ts, size_t n, const char *path)
{
    tf_status st = TF_OK;
    int ranks = shard_ranks_of(s->p);
    /* check everything before writing anything: a bad file changes no state */
    for (size_t i = 0; i < n && !st; i++) {
        const tf_value *v = find_state(s, ts[i].name);
        if (!v && is_training_state(ts[i].name)) continue;
        if (!v) {
            st = tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "%s: error: tensor '%s' matches no param or buffer of the model",
                              path, ts[i].name);
            break;
        }
        if (ts[i].dtype > TIO_BOOL) {
            st = tf_set_error(s->ctx, TF_ERR_FORMAT, "%s: error: tensor '%s' has dtype %s, which tfuse does not use", path,
                              ts[i].name, tio_dtype_name(ts[i].dtype));
            break;
        }
        tf_tensor_view tv = {.dtype = (tf_dtype)ts[i].dtype, .rank = ts[i].rank, .data = ts[i].data};
        memcpy(tv.shape, ts[i].shape, sizeof tv.shape);
        const tf_value *of = sharded_slot(s, v, ranks);   /* in the file: the whole param's shape */
        if (of) {
            tf_value whole = *v;
            whole.type = of->type;
            whole.type.dtype = v->type.dtype;
            st = check_view(s, &whole, &tv, path);
            if (!st) st = shard_job(s, ranks, path);
        } else {
            st = check_view(s, v, &tv, path);
        }
    }
    if (!st) st = session_wait(s);
    for (size_t i = 0; i < n && !st; i++) {
        const tf_value *v = find_state(s, ts[i].name);
        const tf_value *of = v ? sharded_slot(s, v, ranks) : NULL;
        if (of) {   /* this rank's chunk, zeros past the end */
            size_t es = (size_t)tf_dtype_bytes(v->type.dtype), c = (size_t)v->type.dims[0].n, all = (size_t)tf_type_numel(&of->type);
            size_t from = (size_t)tf_comm_rank(s->comm) * c, have = from < all ? (all - from < c ? all - from : c) : 0;
            unsigned char *chunk = tf_calloc(c ? c : 1, es);
            if (!chunk) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            else {
                memcpy(chunk, (const unsigned char *)ts[i].data + from * es, have * es);
                st = s->be->state_write(s, v, chunk);
            }
            tf_free(chunk);
        } else if (v) {
            st = s->be->state_write(s, v, ts[i].data);
        }
    }
    /* remember which params the file left at their initial values */
    tf_free(s->missing);
    s->missing = NULL;
    for (int i = 0; !st && i < s->p->params.n; i++) {
        const tf_value *v = s->p->params.items[i];
        bool found = false;
        for (size_t k = 0; k < n && !found; k++) found = !strcmp(ts[k].name, v->name);
        if (found) continue;
        size_t have = s->missing ? strlen(s->missing) : 0, add = strlen(v->name) + 3;
        char *grown = tf_realloc(s->missing, have + add);
        if (!grown) {
            st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            break;
        }
        snprintf(grown + have, add, "%s%s", have ? ", " : "", v->name);
        s->missing = grown;
    }
    return st;
}

tf_status tf_session_load_state_meta(tf_session_t *s, const char *path, char **metadata_json_out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s || !path) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    char err[5120];
    tio_tensor *ts = NULL;
    size_t n = 0;
    char *meta = NULL;
    if (metadata_json_out) *metadata_json_out = NULL;
    tio_status ts_st = tio_safetensors_read_meta(path, &ts, &n, metadata_json_out ? &meta : NULL, err, sizeof err);
    if (ts_st)
        return tf_set_error(s->ctx, ts_st == TIO_ERR_IO ? TF_ERR_IO : ts_st == TIO_ERR_OOM ? TF_ERR_OOM : TF_ERR_FORMAT,
                            "%s", err);
    tf_status st = apply_state(s, ts, n, path);
    tio_tensors_free(ts, n);
    if (st) tf_libc_free(meta);   /* stdio's buffer, for the caller to free() */
    else if (metadata_json_out) *metadata_json_out = meta;
    return st;
}

tf_status tf_session_save_state(tf_session_t *s, const char *path) { return tf_session_save_state_meta(s, path, NULL); }

tf_status tf_session_save_state_meta(tf_session_t *s, const char *path, const char *metadata_json_object)
{
    return tf_session_save_state_ex(s, path, metadata_json_object, false);
}

/* Whether the model's initial values (an ONNX model's) hold one for name: then zeros() is not its value. */
static bool init_has(const tf_program_t *p, const char *name)
{
    for (size_t k = 0; p->init && k < p->init->n; k++)
        if (!strcmp(p->init->ts[k].name, name)) return true;
    return false;
}

tf_status tf_session_save_state_ex(tf_session_t *s, const char *path, const char *metadata_json_object, bool skip_zero_init)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s || !path) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    size_t total = (size_t)(s->p->params.n + s->p->buffers.n), n = 0;
    tf_status st = session_wait(s);
    if (st) return st;
    int ranks = shard_ranks_of(s->p);
    tio_tensor *ts = tf_calloc(total ? total : 1, sizeof *ts);
    if (!ts) return tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
    for (size_t j = 0; j < total && !st; j++) {
        const tf_value *v = j < (size_t)s->p->params.n ? s->p->params.items[j] : s->p->buffers.items[j - (size_t)s->p->params.n];
        if (skip_zero_init && tf_interp_init_is_zero(v) && !init_has(s->p, v->name)) continue;
        size_t i = n++;
        ts[i].name = (char *)v->name;
        ts[i].dtype = (tio_dtype)v->type.dtype;
        ts[i].rank = v->type.rank;
        for (int k = 0; k < v->type.rank; k++) ts[i].shape[k] = v->type.dims[k].n;
        ts[i].nbytes = type_bytes(&v->type);
        const tf_value *of = sharded_slot(s, v, ranks);
        if (of && (st = shard_job(s, ranks, path))) break;
        if (of) {   /* every rank's chunk, gathered: the slot in its param's shape (a collective: every rank saves) */
            size_t es = (size_t)tf_dtype_bytes(v->type.dtype), c = (size_t)v->type.dims[0].n;
            size_t mine_bytes = c * es, all_bytes = mine_bytes * (size_t)ranks;
            void *mine = tf_malloc(mine_bytes > 0 ? mine_bytes : 1);
            ts[i].rank = of->type.rank;
            for (int k = 0; k < of->type.rank; k++) ts[i].shape[k] = of->type.dims[k].n;
            ts[i].nbytes = (size_t)tf_type_numel(&of->type) * es;
            ts[i].data = tf_malloc(all_bytes > 0 ? all_bytes : 1);
            if (!mine || !ts[i].data) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
            if (!st) st = s->be->state_read(s, v, mine);
            if (!st && !s->comm) memcpy(ts[i].data, mine, mine_bytes);   /* one rank: its chunk is the whole */
            else if (!st && tf_comm_gather(s->comm, v->type.dtype, mine, (int64_t)c, ts[i].data))
                st = tf_set_error(s->ctx, TF_ERR_RUNTIME, "%s: error: gathering %s: %s", path, v->name, s->comm->err);
            tf_free(mine);
            continue;
        }
        if (!(ts[i].data = tf_malloc(ts[i].nbytes ? ts[i].nbytes : 1))) st = tf_set_error(s->ctx, TF_ERR_OOM, "error: out of memory");
        else st = s->be->state_read(s, v, ts[i].data);
    }
    /* a data-parallel job: rank 0 writes (every rank holds the same state, but for the chunks gathered above) */
    bool write = tf_comm_rank(s->comm) == 0;
    char err[5120];
    tio_status ws;
    if (!st && write && (ws = tio_safetensors_write(path, ts, n, metadata_json_object, err, sizeof err)))
        st = tf_set_error(s->ctx, metadata_json_object && ws == TIO_ERR_ARG ? TF_ERR_INVALID_ARG : ws == TIO_ERR_OOM ? TF_ERR_OOM : TF_ERR_IO,
                          "%s", err);
    for (size_t i = 0; i < n; i++) tf_free(ts[i].data);
    tf_free(ts);
    return st;
}

tf_status tf_session_step(tf_session_t *s, uint64_t *step)
{
    if (!s || !step) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: NULL argument");
    *step = s->be->step_get(s);
    return session_wait(s);
}

tf_status tf_session_set_step(tf_session_t *s, uint64_t step)
{
    if (!s) return TF_ERR_INVALID_ARG;
    s->be->step_set(s, step);
    return TF_OK;
}

tf_status tf_session_set_comm(tf_session_t *s, tf_comm_t *c)
{
    if (!s) return TF_ERR_INVALID_ARG;
    TF_ALLOC_SCOPE(tf_context_allocator(s->ctx));
    bool averages = false;
    for (int i = 0; i < s->p->m->nodes.n && !averages; i++)
        averages = ((const tf_node *)s->p->m->nodes.items[i])->op == TF_OP_ALLREDUCE;
    if (c && tf_comm_size(c) > 1 && s->p->mode == TF_IR_TRAIN && !averages)
        return tf_set_error(s->ctx, TF_ERR_INVALID_ARG,
                            "error: a job of %d ranks, and the program was compiled without data_parallel: its ranks would "
                            "train %d separate models (compile with data_parallel, --data-parallel=on)",
                            tf_comm_size(c), tf_comm_size(c));
    int ranks = shard_ranks_of(s->p);
    if (ranks && tf_comm_size(c) != ranks)
        return tf_set_error(s->ctx, TF_ERR_INVALID_ARG, "error: the program shards its optimizer state over %d ranks "
                            "(shard_optimizer), and this job has %d: compile it for %d", ranks, tf_comm_size(c), tf_comm_size(c));
    s->comm = c;
    /* every rank draws its own dropout masks (the global batch's rows are not all masked alike); rank 0's
     * are a single session's; the initial state stays the seed's, the same on every rank */
    int rank = c && tf_comm_size(c) > 1 ? tf_comm_rank(c) : 0;
    uint64_t z = s->seed + 0x9e3779b97f4a7c15ull * (uint64_t)rank;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    if (s->be->dropout_seed_set) s->be->dropout_seed_set(s, rank ? z ^ (z >> 31) : s->seed);
    return TF_OK;
}

/* ---- host arrays ---- */

struct tf_array {
    tio_tensor t;
};

tf_status tf_array_load_npy(tf_context_t *ctx, const char *path, tf_array_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !path || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    tf_array_t *a = tf_calloc(1, sizeof *a);
    if (!a) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    char err[5120];
    tio_status st = tio_npy_read(path, &a->t, err, sizeof err);
    if (st) {
        tf_free(a);
        return tf_set_error(ctx, st == TIO_ERR_IO ? TF_ERR_IO : st == TIO_ERR_OOM ? TF_ERR_OOM : TF_ERR_FORMAT, "%s", err);
    }
    if (a->t.dtype > TIO_BOOL) {
        tf_set_error(ctx, TF_ERR_FORMAT, "error: %s: the array is %s, a dtype tfuse does not use: save it as one of f32 f16 "
                     "f64 i64 i32 bool (numpy: arr.astype(np.float32), or np.int32 for ids)", path, tio_dtype_name(a->t.dtype));
        tf_array_free(a);
        return TF_ERR_FORMAT;
    }
    *out = a;
    return TF_OK;
}

tf_status tf_array_save_npy(tf_context_t *ctx, const char *path, const tf_tensor_view *t)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !path || !t || !t->data || t->rank < 0 || t->rank > 8)
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: bad argument");
    tio_tensor tt = {.dtype = (tio_dtype)t->dtype, .rank = t->rank, .data = t->data};
    size_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        tt.shape[i] = t->shape[i];
        n *= (size_t)t->shape[i];
    }
    tt.nbytes = n * (size_t)tf_dtype_bytes((tf_dt)t->dtype);
    char err[5120];
    tio_status st = tio_npy_write(path, &tt, err, sizeof err);
    return st ? tf_set_error(ctx, st == TIO_ERR_ARG ? TF_ERR_INVALID_ARG : st == TIO_ERR_OOM ? TF_ERR_OOM : TF_ERR_IO, "%s", err) : TF_OK;
}

tf_status tf_array_view(const tf_array_t *a, tf_tensor_view *out)
{
    if (!a || !out) return TF_ERR_INVALID_ARG;
    out->dtype = (tf_dtype)a->t.dtype;
    out->rank = a->t.rank;
    memcpy(out->shape, a->t.shape, sizeof out->shape);
    out->data = a->t.data;
    return TF_OK;
}

void tf_array_free(tf_array_t *a)
{
    if (!a) return;
    tio_tensor_free(&a->t);
    tf_free(a);
}

/* ---- session facts and profiles ---- */

tf_status tf_session_get_info(const tf_session_t *s, tf_session_info *out)
{
    if (!s || !out) return TF_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (s->be->info) s->be->info((tf_session_t *)s, out);
    out->target = s->be->name;
    if (!out->threads) out->threads = 1;
    return TF_OK;
}

tf_status tf_session_set_profiling(tf_session_t *s, int on)
{
    TF_ALLOC_SCOPE(tf_context_allocator(s ? s->ctx : NULL));
    if (!s) return TF_ERR_INVALID_ARG;
    tf_status st = session_wait(s);   /* a profiled step's times land before the switch */
    if (s->be->set_profiling) s->be->set_profiling(s, on != 0);
    return st;
}

size_t tf_session_profile_count(const tf_session_t *s)
{
    return s && s->be->profile_count ? s->be->profile_count((tf_session_t *)s) : 0;
}

tf_status tf_session_profile(const tf_session_t *s, size_t i, tf_kernel_profile *out)
{
    if (!s || !out || i >= tf_session_profile_count(s)) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: no such profile entry");
    tf_status st = session_wait((tf_session_t *)s);
    if (st) return st;
    s->be->profile_get((tf_session_t *)s, i, out);
    return TF_OK;
}

tf_status tf_session_copy_bandwidth(tf_session_t *s, double *gbps)
{
    if (!s || !gbps) return tf_set_error(s ? s->ctx : NULL, TF_ERR_INVALID_ARG, "error: tf_session_copy_bandwidth needs a session and somewhere to put the figure");
    *gbps = 0;
    if (!s->be->copy_bandwidth)
        return tf_set_error(s->ctx, TF_ERR_UNSUPPORTED, "error: the %s target has no memory of its own to measure a copy in", s->be->name);
    tf_status st = session_wait(s);
    return st ? st : s->be->copy_bandwidth(s, gbps);
}

/* ---- the compile cache on disk (cache_file.h) ---- */

tf_status tf_disk_cache_max(tf_context_t *ctx, int64_t *max_bytes)
{
    uint64_t max;
    char why[512];
    if (!max_bytes) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    bool ok = tf_cache_max(&max, NULL, why, sizeof why);
    *max_bytes = (int64_t)max;
    return ok ? TF_OK : tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: %s", why);
}

/* dir, bound and part names of *out; false (with the error set) without a directory */
static tf_status disk_cache_head(tf_context_t *ctx, tf_disk_cache_info *out, bool need_max)
{
    memset(out, 0, sizeof *out);
    uint64_t max;
    char why[512];
    bool max_ok = tf_cache_max(&max, &out->max_from, why, sizeof why);
    out->max_bytes = (int64_t)max;
    out->max_from = !strcmp(out->max_from, "env") ? "env TFUSE_CACHE_MAX" : "default";
    for (int p = 0; p < TF_CACHE_NPARTS; p++) out->parts[p].name = tf_cache_parts[p];
    if (need_max && !max_ok) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: %s", why);
    if (!tf_cache_root(out->dir, sizeof out->dir))
        return tf_set_error(ctx, TF_ERR_UNAVAILABLE, "error: no disk cache: neither $TFUSE_CACHE_DIR nor $HOME is set");
    return TF_OK;
}

static void disk_cache_sums(tf_disk_cache_info *out, const tf_cache_usage *u)
{
    for (int p = 0; p < TF_CACHE_NPARTS; p++) {
        out->parts[p].entries = u->entries[p];
        out->parts[p].bytes = u->bytes[p];
        out->entries += u->entries[p];
        out->bytes += u->bytes[p];
    }
}

tf_status tf_disk_cache_get_info(tf_context_t *ctx, tf_disk_cache_info *out)
{
    if (!out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    tf_status st = disk_cache_head(ctx, out, true);
    if (st) return st;
    tf_cache_usage u;
    if (!tf_cache_count(out->dir, &u))
        return tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot read the disk cache: %s", out->dir, strerror(errno));
    disk_cache_sums(out, &u);
    return TF_OK;
}

tf_status tf_disk_cache_clear(tf_context_t *ctx, const char *part, tf_disk_cache_info *removed)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    tf_disk_cache_info none;
    if (!removed) removed = &none;
    tf_status st = disk_cache_head(ctx, removed, false);
    if (st) return st;
    bool known = !part;
    for (int p = 0; p < TF_CACHE_NPARTS; p++) known |= part && !strcmp(part, tf_cache_parts[p]);
    if (!known)
        return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: the disk cache has no part '%s' (its parts: cpu, cuda, cuda-emu)", part);
    tf_cache_usage u;
    if (!tf_cache_clear(removed->dir, part, &u))
        return tf_set_error(ctx, TF_ERR_IO, "%s: error: cannot lock the disk cache: %s", removed->dir, strerror(errno));
    disk_cache_sums(removed, &u);
    return TF_OK;
}
