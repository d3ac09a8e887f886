/* context.c — the context, its errors and the status and dtype names: what
 * every part of libtfuse calls back into. Backends report through
 * tf_set_error/tf_from_diag (declared in runtime.h) and link against this
 * file, not against the API facade (api.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "env.h"

_Static_assert((int)TF_DTYPE_F32 == (int)TF_DT_F32 && (int)TF_DTYPE_F16 == (int)TF_DT_F16 &&
                   (int)TF_DTYPE_BF16 == (int)TF_DT_BF16 && (int)TF_DTYPE_F64 == (int)TF_DT_F64 &&
                   (int)TF_DTYPE_I64 == (int)TF_DT_I64 && (int)TF_DTYPE_I32 == (int)TF_DT_I32 &&
                   (int)TF_DTYPE_BOOL == (int)TF_DT_BOOL,
               "public and IR dtype codes agree");

/* ---- context and errors ---- */

tf_status tf_context_create(tf_context_t **out) { return tf_context_create_with_allocator(NULL, NULL, out); }

tf_status tf_context_create_with_allocator(tf_alloc_fn fn, void *ud, tf_context_t **out)
{
    if (!out) return TF_ERR_INVALID_ARG;
    tf_allocator a = {fn, ud};
    TF_ALLOC_SCOPE(a);
    tf_context_t *ctx = tf_calloc(1, sizeof *ctx);
    if (!ctx) return *out = NULL, TF_ERR_OOM;
    ctx->alloc = a;
    tf_status st = tf_cache_create(&ctx->cache);   /* its own: the context holds the creator's reference */
    if (st) {
        tf_free(ctx);
        return *out = NULL, st;
    }
    *out = ctx;
    return TF_OK;
}

void tf_context_free(tf_context_t *ctx)
{
    if (!ctx) return;
    tf_cache_free(ctx->cache);
    tf_free(ctx);
}

tf_allocator tf_context_allocator(const tf_context_t *ctx) { return ctx ? ctx->alloc : (tf_allocator){NULL, NULL}; }

tf_cache_t *tf_context_cache(tf_context_t *ctx) { return ctx ? ctx->cache : NULL; }

void tf_context_set_diagnostics(tf_context_t *ctx, FILE *out)
{
    if (ctx) ctx->diag = out;
}

FILE *tf_context_diag(const tf_context_t *ctx) { return ctx && ctx->diag ? ctx->diag : stderr; }

tf_status tf_context_set_cache(tf_context_t *ctx, tf_cache_t *cache)
{
    if (!ctx) return TF_ERR_INVALID_ARG;
    TF_ALLOC_SCOPE(ctx->alloc);
    tf_cache_t *mine = NULL;
    if (!cache) {
        tf_status st = tf_cache_create(&mine);
        if (st) return tf_set_error(ctx, st, "error: out of memory");
        cache = mine;
    } else {
        tf_cache_retain(cache);
    }
    tf_cache_release(ctx->cache);
    ctx->cache = cache;
    return TF_OK;
}

/* ---- compiled-kernel caches ---- */

static int env_cache_limit(const char **from)
{
    const char *e = tf_env("TFUSE_JIT_CACHE_KERNELS");
    char *end = NULL;
    long v = e && *e ? strtol(e, &end, 10) : -1;
    if (!e || !*e || *end || v < 0) {
        *from = "default";
        return 2048;
    }
    *from = "env TFUSE_JIT_CACHE_KERNELS";
    return v > 1 << 20 ? 1 << 20 : (int)v;
}

tf_status tf_cache_create(tf_cache_t **out)
{
    if (!out) return TF_ERR_INVALID_ARG;
    tf_cache_t *c = tf_calloc(1, sizeof *c);
    if (!c || pthread_mutex_init(&c->mu, NULL) != 0) {
        tf_free(c);
        return *out = NULL, TF_ERR_OOM;
    }
    c->refs = 1;
    c->limit = env_cache_limit(&c->limit_from);
    *out = c;
    return TF_OK;
}

void tf_cache_retain(tf_cache_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
}

void tf_cache_release(tf_cache_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left) return;
    for (int t = TF_TARGET_INTERP; t <= TF_TARGET_CUDA_EMU; t++) {
        const tf_backend *be = tf_backend_for((tf_target)t);
        if (be && be->cache_free) be->cache_free(c);
    }
    pthread_mutex_destroy(&c->mu);
    tf_free(c);
}

void tf_cache_free(tf_cache_t *c) { tf_cache_release(c); }

tf_status tf_cache_set_limit(tf_cache_t *c, int kernels)
{
    if (!c || kernels < 0) return TF_ERR_INVALID_ARG;
    pthread_mutex_lock(&c->mu);
    c->limit = kernels > 1 << 20 ? 1 << 20 : kernels;
    c->limit_from = "set";
    for (int t = TF_TARGET_INTERP; t <= TF_TARGET_CUDA_EMU; t++) {
        const tf_backend *be = tf_backend_for((tf_target)t);
        if (be && be->cache_trim) be->cache_trim(c);
    }
    pthread_mutex_unlock(&c->mu);
    return TF_OK;
}

tf_status tf_cache_get_info(tf_cache_t *c, tf_cache_info *out)
{
    if (!c || !out) return TF_ERR_INVALID_ARG;
    pthread_mutex_lock(&c->mu);
    *out = (tf_cache_info){.limit = c->limit, .kernels = c->kernels, .in_use = c->kernels - c->unused, .evicted = c->evicted};
    pthread_mutex_unlock(&c->mu);
    return TF_OK;
}

const char *tf_context_last_error(const tf_context_t *ctx) { return ctx ? ctx->err : "no context"; }

tf_status tf_set_error(tf_context_t *ctx, tf_status st, const char *fmt, ...)
{
    if (!ctx) return st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    return st;
}

tf_status tf_from_diag(tf_context_t *ctx, const tf_diag *d)
{
    static const tf_status map[] = {
        [TF_IR_OK] = TF_OK,           [TF_IR_ERR_SYNTAX] = TF_ERR_PARSE, [TF_IR_ERR_VERIFY] = TF_ERR_VERIFY,
        [TF_IR_ERR_LIMIT] = TF_ERR_LIMIT, [TF_IR_ERR_OOM] = TF_ERR_OOM,  [TF_IR_ERR_RUNTIME] = TF_ERR_RUNTIME,
        [TF_IR_ERR_INTERNAL] = TF_ERR_INTERNAL,
    };
    tf_status st = map[d->status];
    if (st == TF_OK) st = TF_ERR_INTERNAL;   /* a failure without a message is our bug */
    return tf_set_error(ctx, st, "%s", d->msg[0] ? d->msg : "error: internal: failure without a message");
}

const char *tf_status_name(tf_status s)
{
    static const char *names[] = {"ok", "invalid argument", "parse error", "verify error", "limit exceeded",
                                  "i/o error", "format error", "out of memory", "target unavailable",
                                  "unsupported", "runtime error", "internal error"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "unknown status";
}

const char *tf_version(void) { return TFUSE_VERSION; }

#define S(T) {#T, NULL, sizeof(T)}
#define F(T, f) {#T, #f, offsetof(T, f)}
static const struct { const char *type, *field; size_t at; } g_layout[] = {
    S(tf_compile_options), F(tf_compile_options, mode), F(tf_compile_options, target), F(tf_compile_options, dump_ir),
    F(tf_compile_options, dump_dir), F(tf_compile_options, opt_level), F(tf_compile_options, disable_passes),
    F(tf_compile_options, ndisable_passes), F(tf_compile_options, precision), F(tf_compile_options, explain),
    F(tf_compile_options, memory_limit), F(tf_compile_options, dump_kernels), F(tf_compile_options, checkpoint),
    F(tf_compile_options, memory_budget), F(tf_compile_options, memory_budget_percent), F(tf_compile_options, threads),
    F(tf_compile_options, dump_llvm),
#define TF_SETTING(NAME, TYPE, TARGET, ENV, ENV_ON, FLAG, ON, OFF, HELP) F(tf_compile_options, NAME),
#include "../include/tfuse_settings.def"
#undef TF_SETTING
    F(tf_compile_options, outputs), F(tf_compile_options, noutputs),
    S(tf_session_info), F(tf_session_info, target), F(tf_session_info, threads), F(tf_session_info, kernels),
    F(tf_session_info, jit_compiled), F(tf_session_info, jit_cached), F(tf_session_info, fallbacks), F(tf_session_info, jit_disk),
    F(tf_session_info, jit_package), F(tf_session_info, jit_ms), F(tf_session_info, disk_hits), F(tf_session_info, disk_misses),
    F(tf_session_info, library), F(tf_session_info, step_graph), F(tf_session_info, graph_replays),
    F(tf_session_info, arena_bytes), F(tf_session_info, value_bytes), F(tf_session_info, unplanned_bytes), F(tf_session_info, aux_bytes), F(tf_session_info, device_bytes),
    S(tf_train_config), F(tf_train_config, has_block), F(tf_train_config, optimizer), F(tf_train_config, lr),
    F(tf_train_config, optimizer_params), F(tf_train_config, noptimizer_params), F(tf_train_config, schedule),
    F(tf_train_config, schedule_params), F(tf_train_config, nschedule_params), F(tf_train_config, precision),
    F(tf_train_config, clip_grad_norm), F(tf_train_config, accumulate), F(tf_train_config, metrics), F(tf_train_config, nmetrics),
    S(tf_kernel_profile), F(tf_kernel_profile, name), F(tf_kernel_profile, how), F(tf_kernel_profile, total_ms),
    F(tf_kernel_profile, calls), F(tf_kernel_profile, elements), F(tf_kernel_profile, bytes),
    S(tf_cache_info), F(tf_cache_info, limit), F(tf_cache_info, kernels), F(tf_cache_info, in_use), F(tf_cache_info, evicted),
    S(tf_package_info), F(tf_package_info, objects), F(tf_package_info, objects_cached), F(tf_package_info, has_params),
    F(tf_package_info, bytes),
};
#undef S
#undef F

size_t tf_struct_layout(const char *name, const char *field)
{
    for (size_t i = 0; name && i < sizeof g_layout / sizeof *g_layout; i++)
        if (!strcmp(g_layout[i].type, name) && (field ? g_layout[i].field && !strcmp(g_layout[i].field, field) : !g_layout[i].field))
            return g_layout[i].at;
    return (size_t)-1;
}

const char *tf_dtype_str(tf_dtype t) { return tf_dtype_name((tf_dt)t); }
int tf_dtype_size(tf_dtype t) { return tf_dtype_bytes((tf_dt)t); }

/* ---- the backends ---- */

const tf_backend *tf_backend_for(tf_target t)
{
    return t == TF_TARGET_INTERP ? &tf_backend_interp
           : t == TF_TARGET_CPU  ? &tf_backend_cpu
           : t == TF_TARGET_CUDA ? &tf_backend_cuda
           : t == TF_TARGET_CUDA_EMU ? &tf_backend_cuda_emu
                                 : NULL;
}


tf_status tf_program_plan(tf_context_t *ctx, const tf_program_t *p, const tf_kernel_plan **out)
{
    *out = NULL;
    if (!p->has_plan) return tf_from_diag(ctx, &p->plan_diag);
    *out = &p->plan;
    return TF_OK;
}

tf_op_class tf_op_classify(tf_op op, tf_kernel *probe, tf_kexpr *x, tf_kreduce *r)
{
    const tf_op_info *info = tf_op_info_of(op);
    tf_op_exec ex = tf_op_exec_of(op);
    if (ex == TF_OPX_LAYER) return TF_OPC_LAYER;
    if (ex == TF_OPX_VIEW) return TF_OPC_VIEW;
    bool layout = ex == TF_OPX_COPY || ex == TF_OPX_BCAST;
    bool reduction = ex == TF_OPX_REDUCE;
    if (tf_exec_library(ex)) return TF_OPC_LIBRARY;
    memset(probe, 0, sizeof *probe);
    snprintf(probe->name, sizeof probe->name, "%s", info->name);
    probe->kind = reduction ? TF_K_REDUCTION : TF_K_ELEMENTWISE;
    if (layout) return TF_OPC_CODE;   /* a copy through strides: one load */
    /* an op kernels compute from its scalar expression (operands a, b, c:
     * one_hot gets the class index as b); iota becomes an index */
    *x = (tf_kexpr){.kind = reduction ? TF_KX_CONST : tf_kernel_op_is_expr(op) ? TF_KX_OP : TF_KX_INDEX, .op = op,
                    .dtype = TF_DT_F32, .nargs = 3};
    probe->exprs = x;
    probe->nexprs = 1;
    if (reduction) {
        *r = (tf_kreduce){.op = op, .arg = 0, .dtype = TF_DT_F32, .count = 1};
        probe->reds = r;
        probe->nreds = 1;
        probe->reduce_mask = 1;
        probe->rank = 1;
        probe->dims[0] = 1;
    }
    return TF_OPC_CODE;
}

const char *tf_op_support_plan(tf_op op, bool (*supports)(const tf_kernel *, char *, size_t), const char *alias,
                               const char *compiled, const char *fallback, char *detail, size_t n, bool *library)
{
    tf_kernel probe;
    tf_kexpr x;
    tf_kreduce r;
    char why[512];
    *library = false;
    switch (tf_op_classify(op, &probe, &x, &r)) {
    case TF_OPC_LAYER:
        snprintf(detail, n, "%s is a layer op: the lower pass rewrites it into core ops first", tf_op_info_of(op)->name);
        return NULL;
    case TF_OPC_VIEW: snprintf(detail, n, "%s", alias); return "view";
    case TF_OPC_CODE:
        if (supports(&probe, why, sizeof why)) {
            snprintf(detail, n, "%s", compiled);
            return "jit";
        }
        snprintf(detail, n, "%s: %s", fallback, why);
        return "fallback";
    case TF_OPC_LIBRARY: break;
    }
    *library = true;
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double tf_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}
