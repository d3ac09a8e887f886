/* program_pkg.c — tf_program_save and tf_program_load: a compiled program
 * as one `.tfp` file (runtime/package.h's container) that a later process
 * starts from without compiling a kernel.
 *
 * Sections:
 *   manifest           text, "key: value" lines: the format, the tfuse
 *                      version, the model's name, every option that shapes
 *                      the result (mode, target, precision, opt level,
 *                      disabled passes, checkpointing, budget, threads, the
 *                      target settings, the dim --dim B=auto chose), the
 *                      FNV-1a of the final IR text, counts
 *   model.ir           the model as compiled: its canonical text, dims applied
 *   final.ir           the program after every pass (for people and tools;
 *                      its hash is in the manifest)
 *   state.safetensors  the initial params and buffers (absent with
 *                      --no-params: sessions then run the initializers),
 *                      but those whose initializer is zeros() (biases,
 *                      optimizer moments, the step count: with Adam,
 *                      two thirds of the state), which a session starts
 *                      at zero: the cpu target's storage is zero already,
 *                      the others run that initializer
 *   cpu/target, cpu/SYM.o   the cpu target's object code (cpu/cpu_objects.c)
 *
 * Loading checks the container's checksums, the format and tfuse version,
 * then the target's code (cpu: built for this CPU and LLVM, else refused with
 * both named), then reads the program back from final.ir: the parser takes
 * the module, its comments give the memory plan (offsets, in-place writes),
 * and the module must print back to final.ir byte for byte (so it hashes to
 * the manifest's final_ir_fnv) — no pass runs. Where that does not hold (a
 * final IR this tfuse reads otherwise, an edited one), the passes run on
 * model.ir with the recorded options instead, and the package is refused if
 * the result's final IR does not hash to the recorded one. Either way the
 * kernel plan is built from that module and the backend links the package's
 * object code instead of compiling. (model.ir itself is then kept for
 * tf_program_model and the programs derived from it, `tfuse train`'s
 * evaluation program: its checksum guards it, not a compile.) */
#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "cache_file.h"
#include "interp.h"
#include "package.h"
#include "parser.h"
#include "runtime.h"
#include "env.h"

static const char *mode_str(tf_mode m) { return m == TF_MODE_INFER ? "infer" : "train"; }

static const char *target_str(tf_target t)
{
    return t == TF_TARGET_INTERP ? "interp" : t == TF_TARGET_CPU ? "cpu" : t == TF_TARGET_CUDA ? "cuda" : "cuda-emu";
}

static const char *precision_str(tf_precision p)
{
    return p == TF_PRECISION_FP16 ? "fp16" : p == TF_PRECISION_BF16 ? "bf16" : p == TF_PRECISION_FP32 ? "fp32" : "default";
}

static uint64_t final_ir_hash(tf_context_t *ctx, const tf_program_t *p, char **text, tf_status *st)
{
    *text = tf_print_module(p->m);
    if (!*text) {
        *st = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory printing the program");
        return 0;
    }
    *st = TF_OK;
    return tf_fnv1a(TF_FNV_BASIS, *text, strlen(*text));
}

/* The initial state of a fresh session as safetensors bytes (tf_malloc'd,
 * len + 1 bytes for the package's NUL), laid out in place: each param and
 * buffer in the program's order, but those whose initializer is zeros()
 * (a session starts them at zero) and none the model's own initial values
 * (an ONNX model's) lack; a drawn tensor is drawn by the interpreter's
 * initializers a block at a time (they are counter-based: a block gives
 * the elements the whole would) and rounded into its dtype. The bytes are
 * those tf_session_save_state_ex writes for an interp session that has run
 * its initializers, which holds every value as a double (GPT-2's 124 M
 * params and their optimizer moments: 3 GB): here the peak is the file.
 * (A sharded optimizer's slots, whose files have their params' shapes, are
 * zeros() and left out.) */
static tf_status initial_state(tf_context_t *ctx, const tf_program_t *p, uint64_t seed, unsigned char **out, size_t *len)
{
    *out = NULL, *len = 0;
    size_t total = (size_t)(p->params.n + p->buffers.n), n = 0;
    tio_tensor *ts = tf_calloc(total ? total : 1, sizeof *ts);
    const tio_tensor **given = tf_calloc(total ? total : 1, sizeof *given);
    const tf_value **vals = tf_calloc(total ? total : 1, sizeof *vals);   /* the value each tensor of ts is */
    static unsigned char placeholder;   /* tio_safetensors_header wants data; it reads none */
    tf_status st = ts && given && vals ? TF_OK : tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    for (size_t j = 0; j < total && !st; j++) {
        const tf_value *v = j < (size_t)p->params.n ? p->params.items[j] : p->buffers.items[j - (size_t)p->params.n];
        const tio_tensor *g = NULL;
        for (size_t k = 0; p->init && k < p->init->n && !g; k++)
            if (!strcmp(p->init->ts[k].name, v->name)) g = &p->init->ts[k];
        if (!g && tf_interp_init_is_zero(v)) continue;
        tio_tensor *t = &ts[n];
        vals[n] = v;
        given[n++] = g;
        t->name = (char *)v->name;
        t->dtype = (tio_dtype)v->type.dtype;
        t->rank = v->type.rank;
        for (int k = 0; k < v->type.rank; k++) t->shape[k] = v->type.dims[k].n;
        t->nbytes = (size_t)tf_type_numel(&v->type) * (size_t)tf_dtype_bytes(v->type.dtype);
        t->data = &placeholder;
    }
    char *hdr = NULL, err[5120];
    size_t hlen = 0, bytes = 0;
    tio_status hs = st ? TIO_OK : tio_safetensors_header(ts, n, NULL, &hdr, &hlen, err, sizeof err);
    if (!st && hs) st = tf_set_error(ctx, hs == TIO_ERR_OOM ? TF_ERR_OOM : TF_ERR_INTERNAL, "error: the initial state: %s", err);
    for (size_t i = 0; !st && i < n; i++) bytes += ts[i].nbytes;
    unsigned char *b = st ? NULL : tf_malloc(hlen + bytes + 1);
    if (!st && !b) st = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory for the package's initial state (%zu bytes)", hlen + bytes);
    enum { BLOCK = 1 << 16 };
    double *blk = st ? NULL : tf_malloc(BLOCK * sizeof *blk);
    if (!st && !blk) st = tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    size_t at = hlen;
    if (!st) memcpy(b, hdr, hlen);
    for (size_t i = 0; !st && i < n; i++) {
        const tio_tensor *t = &ts[i];
        const tf_value *v = vals[i];
        tf_dt dt = v->type.dtype;
        int64_t ne = tf_type_numel(&v->type);
        const tio_tensor *g = given[i];
        if (g && g->dtype == t->dtype && g->nbytes == t->nbytes) {
            memcpy(b + at, g->data, t->nbytes);
        } else if (g) {   /* the model's values in another dtype: as a session converts them */
            int64_t gn = 1;
            for (int k = 0; k < g->rank; k++) gn *= g->shape[k];
            if (gn != ne) st = tf_set_error(ctx, TF_ERR_FORMAT, "%s: error: the initial value of '%s' has %lld elements, not %lld",
                                            p->init->source, v->name, (long long)gn, (long long)ne);
            for (int64_t e = 0; !st && e < ne; e++) tf_elem_store(dt, b + at, e, tf_dtype_round(dt, tf_elem_load((tf_dt)g->dtype, g->data, e)));
        } else {
            for (int64_t lo = 0; lo < ne; lo += BLOCK) {
                int64_t hi = ne - lo < BLOCK ? ne : lo + BLOCK;
                tf_interp_init_range(v, seed, lo, hi, blk);
                for (int64_t e = lo; e < hi; e++) tf_elem_store(dt, b + at, e, blk[e - lo]);
            }
        }
        at += t->nbytes;
    }
    tf_free(blk);
    tf_libc_free(hdr);
    tf_free(ts);
    tf_free(given);
    tf_free(vals);
    if (st) {
        tf_free(b);
        return st;
    }
    *out = b, *len = hlen + bytes;
    return TF_OK;
}

/* The memory plan final.ir's comments give (ir/printer.c writes them):
 * "# memplan: arena A bytes, persistent P bytes, peak Q bytes, R in place",
 * then "#   NAME @OFFSET +BYTES" or "#   NAME in STATE" per value; false
 * when they do not read as such. */
static bool read_plan(tf_module *m, const char *text, size_t len)
{
    const char *at = NULL;
    for (const char *q = text; q < text + len && (q = strstr(q, "# memplan: ")); q++)
        if (q == text || q[-1] == '\n') {
            at = q;
            break;
        }
    if (!at) return true;   /* no plan: memplan did not run */
    long long arena, persistent, peak;
    int reused;
    if (sscanf(at, "# memplan: arena %lld bytes, persistent %lld bytes, peak %lld bytes, %d in place", &arena, &persistent, &peak,
               &reused) != 4)
        return false;
    m->plan.planned = true;
    m->plan.arena_bytes = arena, m->plan.persistent_bytes = persistent, m->plan.reused = reused;
    m->plan.updates_in_place = 0;
    for (int i = 0; i < m->nodes.n; i++) {   /* placed: only what the comments list */
        tf_value *v = ((tf_node *)m->nodes.items[i])->out;
        v->offset = -1;
        v->home = NULL;
    }
    for (const char *line = strchr(at, '\n'); line && line[1] == '#' && line[2] == ' ' && line[3] == ' ' && line[4] == ' ';
         line = strchr(line + 1, '\n')) {
        const char *name = line + 5, *end = strchr(name, ' ');
        if (!end) return false;
        tf_value *v = tf_module_find_valuen(m, name, (size_t)(end - name));
        long long off, bytes;
        if (!v) return false;
        if (sscanf(end, " @%lld +%lld", &off, &bytes) == 2) {
            v->offset = off;
        } else if (!strncmp(end, " in ", 4)) {
            const char *h = end + 4, *he = h + strcspn(h, "\n");
            if (!(v->home = tf_module_find_valuen(m, h, (size_t)(he - h)))) return false;
            m->plan.updates_in_place++;
        } else {
            return false;
        }
    }
    return true;
}

/* The program a package holds, read back from its final IR with its memory
 * plan: no pass runs. Taken only when the module read back prints to the
 * final IR byte for byte (and so hashes to the manifest's final_ir_fnv):
 * every node, attribute, region, update, offset and in-place write is the
 * compiled program's. Otherwise (an older package, a final IR this parser
 * cannot take) *out stays NULL and the caller compiles the packaged model,
 * as tf_program_load did before. An error only for what compiling would
 * hit too (out of memory). */
static tf_status from_final(tf_context_t *ctx, const tf_pkg *pkg, const char *path, const tf_compile_options *o, const char *auto_dim,
                            int64_t chosen, uint64_t want, tf_program_t **out)
{
    *out = NULL;
    const tf_pkg_section *fin = tf_pkg_find(pkg, "final.ir"), *model = tf_pkg_find(pkg, "model.ir");
    if (!fin || !model) return TF_OK;
    if (tf_fnv1a(TF_FNV_BASIS, fin->data, fin->len) != want) return TF_OK;
    char *text = tf_malloc(fin->len + 1);   /* NUL-terminated: the section is not */
    if (!text) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    memcpy(text, fin->data, fin->len);
    text[fin->len] = 0;
    char name[4200];
    snprintf(name, sizeof name, "%s(final.ir)", path);
    tf_diag d = {0};
    tf_module *m = NULL;
    if (tf_parse(name, text, fin->len, NULL, 0, &m, &d)) {
        tf_free(text);
        return d.status == TF_IR_ERR_OOM ? tf_from_diag(ctx, &d) : TF_OK;
    }
    char *again = read_plan(m, text, fin->len) ? tf_print_module(m) : NULL;
    bool same = again && strlen(again) == fin->len && !memcmp(again, text, fin->len);
    tf_free(again);
    tf_free(text);
    char *model_text = same ? tf_malloc(model->len + 1) : NULL;
    if (!model_text) {
        tf_module_free(m);
        return TF_OK;
    }
    memcpy(model_text, model->data, model->len);
    model_text[model->len] = 0;
    return tf_program_from_final(ctx, m, model_text, o, auto_dim, chosen, out);
}

static tf_status add(tf_context_t *ctx, tf_pkg *pkg, const char *name, const void *data, size_t len)
{
    char why[256];
    return tf_pkg_add(pkg, name, data, len, why, sizeof why) ? TF_OK : tf_set_error(ctx, TF_ERR_OOM, "error: package: %s", why);
}

tf_status tf_program_save(tf_context_t *ctx, const tf_program_t *p, const char *path, int with_params, uint64_t seed,
                          const char *cuda_archs, tf_package_info *info)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !p || !path) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    if (info) memset(info, 0, sizeof *info);
    if (!p->model_text) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: this program has no model text to package");
    if (p->opts.noutputs)
        return tf_set_error(ctx, TF_ERR_UNSUPPORTED, "error: this program computes only some outputs "
                            "(tf_compile_options.outputs): a package holds programs that compute them all");
    if (p->target == TF_TARGET_CUDA_EMU)
        return tf_set_error(ctx, TF_ERR_UNSUPPORTED,
                            "error: cuda-emu compiles its kernels for this host when a session starts: a package of it would hold "
                            "nothing to skip; compile for --target=cuda (cubins) or cpu");
    tf_pkg pkg = {0};
    char *final = NULL;
    tf_status st;
    uint64_t h = final_ir_hash(ctx, p, &final, &st);
    tf_strbuf m = {0};
    tf_strbuf_printf(&m, "format: tfuse-package %d\ntfuse: %s\nmodel: %s\nmode: %s\ntarget: %s\nprecision: %s\n", TF_PKG_VERSION,
                     TFUSE_VERSION, p->m->name ? p->m->name : "", mode_str(p->opts.mode), target_str(p->target),
                     precision_str(p->precision));
    tf_strbuf_printf(&m, "opt_level: %d\ncheckpoint: %s\nmemory_budget: %" PRId64 "\nmemory_budget_percent: %.17g\nthreads: %d\n",
                     p->opts.opt_level, p->opts.checkpoint == TF_CHECKPOINT_AUTO ? "auto" : "none", p->opts.memory_budget,
                     p->opts.memory_budget_percent, p->opts.threads);
    for (int i = 0; i < p->ndisabled; i++) tf_strbuf_printf(&m, "disable_pass: %s\n", p->disabled[i]);
    for (int i = 0; i < p->nstats; i++)   /* the dim --dim NAME=auto chose: compile_module records it as a stat */
        for (int d = 0; d < p->m->ndims; d++)
            if (!strcmp(p->stats[i].name, p->m->dims[d].name)) tf_strbuf_printf(&m, "dim: %s=%" PRId64 "\n", p->stats[i].name, p->stats[i].value);
    for (size_t i = 0; i < tf_nsettings; i++) {   /* a string setting by its name, when set; then the others, in order */
        const char *sv = tf_settings[i].is_str ? *(char *const *)((const char *)&p->settings + tf_settings[i].prog_off) : NULL;
        if (sv) tf_strbuf_printf(&m, "%s: %s\n", tf_settings[i].d.name, sv);
    }
    for (size_t i = 0; i < tf_nsettings; i++)
        if (!tf_settings[i].is_str)
            tf_strbuf_printf(&m, "setting: %s=%d\n", tf_settings[i].d.name, *tf_setting_bool((tf_compile_options *)&p->opts, &tf_settings[i]));
    tf_strbuf_printf(&m, "final_ir_fnv: %016" PRIx64 "\nparams: %s\n", h, with_params ? "included" : "initializers");
    if (m.oom || !m.p) st = st ? st : tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    if (!st) st = add(ctx, &pkg, "model.ir", p->model_text, strlen(p->model_text));
    if (!st) st = add(ctx, &pkg, "final.ir", final, strlen(final));
    if (!st && with_params) {
        unsigned char *state = NULL;
        size_t n = 0;
        char why[256];
        st = initial_state(ctx, p, seed, &state, &n);
        if (!st && !tf_pkg_add_owned(&pkg, "state.safetensors", state, n, why, sizeof why))   /* the package's now */
            st = tf_set_error(ctx, TF_ERR_OOM, "error: package: %s", why);
        if (info) info->has_params = !st;
    }
    int nobj = 0, cached = 0;
    const tf_backend *be = tf_backend_for(p->target);
    /* the target's code (cuda: NVRTC makes cubins without a GPU or a driver) */
    if (!st && be && be->package_code) st = be->package_code(ctx, p, cuda_archs, &pkg, &nobj, &cached);
    if (!st) {
        tf_strbuf_printf(&m, "objects: %d\n", nobj);
        st = !m.oom && m.p ? add(ctx, &pkg, "manifest", m.p, strlen(m.p)) : tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    }
    char why[512];
    size_t len = 0;
    if (!st && !tf_pkg_write(&pkg, path, &len, why, sizeof why)) st = tf_set_error(ctx, TF_ERR_IO, "%s: error: %s", path, why);
    if (!st && info) info->objects = nobj, info->objects_cached = cached, info->bytes = (int64_t)len;
    tf_free(m.p);
    tf_free(final);
    tf_pkg_free(&pkg);
    return st;
}

/* ---- loading -------------------------------------------------------------- */

/* The value of "key: " on its own line of the manifest, copied into out;
 * the k-th such line (for repeated keys). */
static bool field(const char *manifest, const char *key, int k, char *out, size_t n)
{
    size_t kl = strlen(key);
    for (const char *line = manifest; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > kl + 1 && !strncmp(line, key, kl) && line[kl] == ':' && line[kl + 1] == ' ' && k-- == 0) {
            size_t v = len - kl - 2;
            if (v >= n) v = n - 1;
            memcpy(out, line + kl + 2, v);
            out[v] = 0;
            return true;
        }
        line = end ? end + 1 : NULL;
    }
    return false;
}

static tf_status bad(tf_context_t *ctx, const char *path, const char *what)
{
    return tf_set_error(ctx, TF_ERR_FORMAT, "%s: error: not a usable package: %s", path, what);
}

tf_status tf_program_load(tf_context_t *ctx, const char *path, tf_program_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !path || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    tf_pkg *pkg = tf_calloc(1, sizeof *pkg);
    if (!pkg) return tf_set_error(ctx, TF_ERR_OOM, "error: out of memory");
    char why[512], v[1024];
    bool oom = false;
    if (!tf_pkg_read(pkg, path, &oom, why, sizeof why)) {
        tf_free(pkg);
        return tf_set_error(ctx, oom ? TF_ERR_OOM : TF_ERR_FORMAT, "%s: error: %s", path, why);
    }
    tf_status st = TF_OK;
    const tf_pkg_section *man = tf_pkg_find(pkg, "manifest"), *model = tf_pkg_find(pkg, "model.ir");
    const char *mt = man ? (const char *)man->data : "";
    tf_compile_options o;
    tf_compile_options_init(&o);
    for (size_t i = 0; i < tf_nsettings; i++)   /* the package's settings, not this environment's: its manifest sets them all */
        if (tf_settings[i].is_str) *tf_setting_str(&o, &tf_settings[i]) = NULL;
    tf_dim_override dim = {0};
    char dim_name[256] = "", strs[4][1024], *disabled[64];
    size_t nstr = 0;
    int ndisabled = 0;
    uint64_t want = 0;
    if (!man || !model) st = bad(ctx, path, "it lacks its manifest or its model");
    else if (!field(mt, "format", 0, v, sizeof v) || strcmp(v, "tfuse-package 1")) st = bad(ctx, path, "the manifest's format is not tfuse-package 1");
    else if (!field(mt, "tfuse", 0, v, sizeof v) || strcmp(v, TFUSE_VERSION))
        st = tf_set_error(ctx, TF_ERR_UNAVAILABLE, "%s: error: the package was made by tfuse %s; this is tfuse %s: compile the model again",
                          path, field(mt, "tfuse", 0, v, sizeof v) ? v : "?", TFUSE_VERSION);
    if (!st) {
        bool ok = field(mt, "mode", 0, v, sizeof v) && (!strcmp(v, "train") || !strcmp(v, "infer"));
        o.mode = ok && !strcmp(v, "infer") ? TF_MODE_INFER : TF_MODE_TRAIN;
        ok = ok && field(mt, "target", 0, v, sizeof v);
        if (ok)
            o.target = !strcmp(v, "cpu") ? TF_TARGET_CPU : !strcmp(v, "interp") ? TF_TARGET_INTERP : !strcmp(v, "cuda") ? TF_TARGET_CUDA
                                                                                                          : (ok = false, o.target);
        ok = ok && field(mt, "precision", 0, v, sizeof v);
        if (ok) o.precision = !strcmp(v, "fp16") ? TF_PRECISION_FP16 : !strcmp(v, "bf16") ? TF_PRECISION_BF16 : TF_PRECISION_FP32;
        ok = ok && field(mt, "opt_level", 0, v, sizeof v) && sscanf(v, "%d", &o.opt_level) == 1;
        ok = ok && field(mt, "checkpoint", 0, v, sizeof v);
        if (ok) o.checkpoint = !strcmp(v, "auto") ? TF_CHECKPOINT_AUTO : TF_CHECKPOINT_NONE;
        ok = ok && field(mt, "memory_budget", 0, v, sizeof v) && sscanf(v, "%" SCNd64, &o.memory_budget) == 1;
        ok = ok && field(mt, "memory_budget_percent", 0, v, sizeof v) && sscanf(v, "%lf", &o.memory_budget_percent) == 1;
        ok = ok && field(mt, "threads", 0, v, sizeof v) && sscanf(v, "%d", &o.threads) == 1;
        ok = ok && field(mt, "final_ir_fnv", 0, v, sizeof v) && sscanf(v, "%" SCNx64, &want) == 1;
        for (size_t i = 0, k = 0; ok && i < tf_nsettings; i++) {
            const tf_setting_row *r = &tf_settings[i];
            if (r->is_str) {
                if (nstr == sizeof strs / sizeof *strs) ok = false;   /* more string settings than this reader holds */
                else if (field(mt, r->d.name, 0, strs[nstr], sizeof strs[nstr])) *tf_setting_str(&o, r) = strs[nstr++];
                continue;
            }
            int val = 0;
            size_t nl = strlen(r->d.name);
            ok = field(mt, "setting", (int)k++, v, sizeof v) && !strncmp(v, r->d.name, nl) && v[nl] == '=' &&
                 sscanf(v + nl + 1, "%d", &val) == 1;
            *tf_setting_bool(&o, r) = val;
        }
        for (; ok && ndisabled < 64 && field(mt, "disable_pass", ndisabled, v, sizeof v); ndisabled++)
            ok = (disabled[ndisabled] = tf_strdup(v)) != NULL;
        o.disable_passes = (const char *const *)disabled, o.ndisable_passes = (size_t)ndisabled;
        if (ok && field(mt, "dim", 0, v, sizeof v)) {
            char *eq = strchr(v, '=');
            ok = eq && eq - v < (ptrdiff_t)sizeof dim_name && sscanf(eq + 1, "%" SCNd64, &dim.value) == 1;
            if (ok) memcpy(dim_name, v, (size_t)(eq - v)), dim_name[eq - v] = 0, dim.name = dim_name;
        }
        if (!ok) st = bad(ctx, path, "its manifest lacks a field or has one this tfuse cannot read");
    }
    const tf_backend *be = st ? NULL : tf_backend_for(o.target);
    if (!st && !be) st = tf_set_error(ctx, TF_ERR_UNAVAILABLE, "%s: error: target '%s' is not part of this build", path, target_str(o.target));
    if (!st && be->package_check) st = be->package_check(ctx, pkg, path);
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    /* the program as the package holds it, no pass run; where that cannot be read back, compiled from the model */
    if (!st) st = from_final(ctx, pkg, path, &o, dim.name, dim.value, want, &p);
    if (!st && !p) {
        char name[4200];
        snprintf(name, sizeof name, "%s(model.ir)", path);
        st = tf_model_parse_string(ctx, name, (const char *)model->data, model->len, dim.name ? &dim : NULL, dim.name ? 1 : 0, &m);
        if (!st) st = tf_program_compile(ctx, m, &o, &p);
    }
    if (!st && !p->from_final) {
        char *final = NULL;
        uint64_t got = final_ir_hash(ctx, p, &final, &st);
        tf_free(final);
        if (!st && got != want)
            st = tf_set_error(ctx, TF_ERR_FORMAT,
                              "%s: error: the program this tfuse compiles from the package's model is not the one the package "
                              "holds (final IR hash %016" PRIx64 ", package %016" PRIx64 "): compile the model again", path, got, want);
    }
    for (int i = 0; i < ndisabled; i++) tf_free(disabled[i]);
    tf_model_free(m);
    if (st) {
        tf_program_free(p);
        tf_pkg_free(pkg);
        tf_free(pkg);
        return st;
    }
    p->pkg = pkg;
    *out = p;
    return TF_OK;
}

int tf_is_package(const char *path) { return path && tf_pkg_is_package(path); }

tf_status tf_program_describe(const tf_program_t *p, tf_mode *mode, tf_target *target, tf_precision *precision)
{
    if (!p) return TF_ERR_INVALID_ARG;
    if (mode) *mode = p->opts.mode;
    if (target) *target = p->target;
    if (precision) *precision = p->precision;
    return TF_OK;
}

tf_status tf_program_model(tf_context_t *ctx, const tf_program_t *p, tf_model_t **out)
{
    TF_ALLOC_SCOPE(tf_context_allocator(ctx));
    if (!ctx || !p || !out) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: NULL argument");
    *out = NULL;
    if (!p->model_text) return tf_set_error(ctx, TF_ERR_INVALID_ARG, "error: this program keeps no model");
    tf_dim_override dim = {0};
    for (int i = 0; i < p->nstats && !dim.name; i++)   /* the dim --dim NAME=auto chose */
        for (int d = 0; d < p->m->ndims && !dim.name; d++)
            if (!strcmp(p->stats[i].name, p->m->dims[d].name)) dim = (tf_dim_override){p->stats[i].name, p->stats[i].value};
    char name[300];
    snprintf(name, sizeof name, "%s(model)", p->m->name ? p->m->name : "program");
    tf_status st = tf_model_parse_string(ctx, name, p->model_text, strlen(p->model_text), dim.name ? &dim : NULL, dim.name ? 1 : 0, out);
    if (!st) (*out)->init = tf_init_state_retain(p->init);
    return st;
}

int tf_program_input_unread(const tf_program_t *p, const char *name)
{
    if (!p || !name || !p->model_text) return 0;
    for (int i = 0; i < p->inputs.n; i++)
        if (!strcmp(((const tf_value *)p->inputs.items[i])->name, name)) return 0;
    size_t n = strlen(name);
    /* the canonical text declares each input on a line of its own: "input  NAME : TYPE" */
    for (const char *l = p->model_text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        if (strncmp(l, "input ", 6)) continue;
        const char *q = l + 6;
        while (*q == ' ') q++;
        if (!strncmp(q, name, n) && (q[n] == ' ' || q[n] == ':')) return 1;
    }
    return 0;
}

tf_status tf_program_set_threads(tf_program_t *p, int threads)
{
    if (!p || threads < 0) return TF_ERR_INVALID_ARG;
    p->threads = threads;
    return TF_OK;
}
