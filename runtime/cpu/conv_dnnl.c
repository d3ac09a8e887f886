/* conv_dnnl.c — see conv_dnnl.h. */
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "conv_dnnl.h"

#ifdef TFUSE_HAVE_ONEDNN

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "dnnl_util.h"

#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP && DNNL_CPU_RUNTIME != DNNL_RUNTIME_SEQ
#error "conv_dnnl.c holds oneDNN at one thread through OpenMP: this oneDNN threads otherwise"
#endif

static dnnl_engine_t g_engine;
static dnnl_status_t g_engine_status = dnnl_runtime_error;

static void engine_once(void) { g_engine_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0); }

dnnl_engine_t tf_dnnl_engine(const char **why)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, engine_once);
    if (g_engine_status != dnnl_success && why) *why = dnnl_status2str(g_engine_status);
    return g_engine_status == dnnl_success ? g_engine : NULL;
}

static dnnl_engine_t engine(void) { return tf_dnnl_engine(NULL); }

bool tf_dnnl_available(void) { return true; }

static const char *runtime_name(unsigned r)
{
    return r == DNNL_RUNTIME_OMP ? "OpenMP" : r == DNNL_RUNTIME_TBB ? "TBB" : r == DNNL_RUNTIME_SEQ ? "sequential"
         : r == DNNL_RUNTIME_THREADPOOL ? "threadpool" : "other";
}

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx512_core: return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AMX";
    default: return "other";
    }
}

void tf_dnnl_describe(char *out, size_t n)
{
    const dnnl_version_t *v = dnnl_version();
    snprintf(out, n, "oneDNN %d.%d.%d (%s runtime, held at one thread per call; ISA %s)", v->major, v->minor, v->patch,
             runtime_name(v->cpu_runtime), isa_name(dnnl_get_effective_cpu_isa()));
}

/* Where an argument's memory is: each piece's own slice (reordered, when
 * it must be, in the piece's scratch); one for all pieces, state (the
 * weights: reordered before the pieces, once per state when the session
 * keeps it) or an activation (reordered before the pieces at every call);
 * or each piece's slice of the weights, reordered like state before the
 * pieces run (a split by channels). */
typedef enum carg_kind { A_PIECE, A_STATE, A_ACT, A_SLOT } carg_kind;

/* An argument of the primitive: tfuse's plain layout (user), the
 * primitive's (prim), and the reorder between them when they differ. */
typedef struct carg {
    int arg;                  /* DNNL_ARG_* */
    bool output;              /* written by the primitive */
    carg_kind kind;
    dnnl_memory_desc_t user, prim;
    dnnl_primitive_t reorder; /* user -> prim (inputs) or prim -> user (outputs); NULL: same layout */
    size_t prim_bytes;
    int64_t stride;           /* A_PIECE and A_SLOT: floats per image (per channel when split by
                               * channels); a weight gradient's partials: floats per partial */
} carg;

/* One primitive per group size. */
typedef struct variant {
    int64_t mb, oc, ic;       /* images, output and input channels of one call */
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    carg args[4];
    int nargs;
    size_t scratchpad;        /* bytes */
    size_t piece_bytes;       /* scratchpad + per-piece reorder buffers, 64-aligned */
    size_t state_bytes, act_bytes;   /* reordered buffers of its A_STATE and A_ACT arguments */
    size_t slot_bytes;        /* its A_SLOT argument's reordered buffer, one per piece (0: none, or no reorder) */
} variant;

struct tf_dnnl_conv {
    tf_dnnl_dir dir;
    tf_conv_geom g;
    bool bias, relu, blocked;
    bool plain16;             /* forward: src/dst asked for in nChw16c (conv_mds) */
    bool by_channel;          /* pieces are groups of channels over the whole batch (conv_split_by_channel) */
    int64_t pieces;           /* groups of images (or of channels) */
    variant v[2];
    int nv;
    int threads;
    dnnl_stream_t *streams;   /* one per worker */
    size_t per_worker, shared, partials, act;   /* scratch layout, bytes: per worker; state (the session's kept
                                                 * memory when it has some); partials; activations */
};

static size_t up64(size_t b) { return (b + 63) / 64 * 64; }

bool tf_dnnl_ok(dnnl_status_t st, const char *what, char *why, size_t n)
{
    if (st == dnnl_success) return true;
    snprintf(why, n, "oneDNN refused it: %s: %s", what, dnnl_status2str(st));
    return false;
}

static bool ok(dnnl_status_t st, const char *what, char *why, size_t n) { return tf_dnnl_ok(st, what, why, n); }

static void variant_free(variant *v)
{
    for (int i = 0; i < v->nargs; i++)
        if (v->args[i].reorder) dnnl_primitive_destroy(v->args[i].reorder);
    if (v->prim) dnnl_primitive_destroy(v->prim);
    if (v->pd) dnnl_primitive_desc_destroy(v->pd);
    memset(v, 0, sizeof *v);
}

void tf_dnnl_conv_free(tf_dnnl_conv *c)
{
    if (!c) return;
    for (int i = 0; i < 2; i++) variant_free(&c->v[i]);
    for (int t = 0; c->streams && t < c->threads; t++)
        if (c->streams[t]) dnnl_stream_destroy(c->streams[t]);
    tf_free(c->streams);
    tf_free(c);
}

/* Memory descriptors of the convolution over mb images: src, weights, dst
 * in tfuse's layout or `any`. */
static bool conv_mds(const tf_dnnl_conv *c, int64_t mb, int64_t oc, int64_t ic, bool any, dnnl_memory_desc_t *src,
                     dnnl_memory_desc_t *wei, dnnl_memory_desc_t *dst, char *why, size_t n)
{
    const tf_conv_geom *g = &c->g;
    dnnl_dims_t sd = {mb, ic, g->H, g->W}, dd = {mb, oc, g->Ho, g->Wo};
    dnnl_dims_t wd = {oc, g->G > 1 ? g->Cg : ic, g->KH, g->KW}, gwd = {g->G, g->Og, g->Cg, g->KH, g->KW};
    /* The forward pass in nChw16c wherever the channels allow, not the nhwc
     * oneDNN picks for `any` (brgconv): brgconv's order of adding a window's
     * products loses 5x more than PyTorch's NCHW convolution (a VGG conv,
     * 256 -> 256 channels at 16x16: 1.45e-5 against 2.2e-6; nChw16c 1.8e-6;
     * PyTorch's own channels_last path 1.1e-5), enough to make two values
     * of a max-pool window tie in float32 and send a whole gradient term
     * elsewhere (tests/zoo/README.md). The training step and inference of
     * bench/models/resnet.ir took the same time either way (5 interleaved
     * runs: 0.99x and 0.94x). Where oneDNN has only its reference code for
     * that layout (grouped convolutions: 150x slower), variant_make asks
     * again with `any` (plain16 false). */
    dnnl_format_tag_t st = any ? dnnl_format_tag_any : dnnl_nchw, dt = st;
    if (any && c->dir == TF_DNNL_FWD && c->plain16) {
        if (ic % 16 == 0) st = dnnl_nChw16c;
        if (oc % 16 == 0) dt = dnnl_nChw16c;
    }
    return ok(dnnl_memory_desc_init_by_tag(src, 4, sd, dnnl_f32, st), "source", why, n) &&
           ok(dnnl_memory_desc_init_by_tag(dst, 4, dd, dnnl_f32, dt), "destination", why, n) &&
           ok(g->G > 1 ? dnnl_memory_desc_init_by_tag(wei, 5, gwd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_goihw)
                       : dnnl_memory_desc_init_by_tag(wei, 4, wd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_oihw),
              "weights", why, n);
}

static bool conv_desc(const tf_dnnl_conv *c, tf_dnnl_dir dir, int64_t mb, int64_t oc, int64_t ic, dnnl_convolution_desc_t *d,
                      char *why, size_t n)
{
    const tf_conv_geom *g = &c->g;
    dnnl_memory_desc_t src, wei, dst, bias;
    if (!conv_mds(c, mb, oc, ic, c->blocked, &src, &wei, &dst, why, n)) return false;
    dnnl_dims_t st = {g->s[0], g->s[1]}, dl = {g->dl[0] - 1, g->dl[1] - 1}, pl = {g->p[0], g->p[1]}, pr = {g->p[0], g->p[1]};
    dnnl_dims_t bd = {oc};
    if (dir == TF_DNNL_FWD) {
        bool b = c->bias && c->dir == TF_DNNL_FWD;
        if (b && !ok(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_a), "bias", why, n)) return false;
        return ok(dnnl_dilated_convolution_forward_desc_init(d, c->dir == TF_DNNL_FWD ? dnnl_forward_inference : dnnl_forward_training,
                                                             dnnl_convolution_direct, &src, &wei, b ? &bias : NULL, &dst, st, dl,
                                                             pl, pr),
                  "the forward descriptor", why, n);
    }
    if (dir == TF_DNNL_BWD_DATA)
        return ok(dnnl_dilated_convolution_backward_data_desc_init(d, dnnl_convolution_direct, &src, &wei, &dst, st, dl, pl, pr),
                  "the backward-data descriptor", why, n);
    return ok(dnnl_dilated_convolution_backward_weights_desc_init(d, dnnl_convolution_direct, &src, &wei, NULL, &dst, st, dl, pl,
                                                                  pr),
              "the backward-weights descriptor", why, n);
}

/* The argument `arg` of v: its plain layout, the primitive's, a reorder. */
static bool add_arg(variant *v, int arg, bool output, carg_kind kind, const dnnl_memory_desc_t *user, int64_t stride, char *why,
                    size_t n)
{
    carg *a = &v->args[v->nargs++];
    a->arg = arg, a->output = output, a->kind = kind, a->user = *user, a->stride = stride;
    const dnnl_memory_desc_t *pm = dnnl_primitive_desc_query_md(v->pd, dnnl_query_exec_arg_md, arg);
    if (!pm) {
        snprintf(why, n, "oneDNN gave no memory descriptor for argument %d", arg);
        return false;
    }
    a->prim = *pm;
    a->prim_bytes = dnnl_memory_desc_get_size(pm);
    if (dnnl_memory_desc_equal(&a->user, &a->prim)) return true;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_engine_t e = engine();
    if (!ok(output ? dnnl_reorder_primitive_desc_create(&rpd, &a->prim, e, &a->user, e, NULL)
                   : dnnl_reorder_primitive_desc_create(&rpd, &a->user, e, &a->prim, e, NULL),
            "a reorder", why, n))
        return false;
    dnnl_status_t st = dnnl_primitive_create(&a->reorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    if (!ok(st, "a reorder", why, n)) return false;
    switch (kind) {
    case A_PIECE: v->piece_bytes += up64(a->prim_bytes); break;
    case A_STATE: v->state_bytes += up64(a->prim_bytes); break;
    case A_ACT: v->act_bytes += up64(a->prim_bytes); break;
    case A_SLOT: v->slot_bytes = up64(a->prim_bytes); break;
    }
    return true;
}

static bool variant_make(tf_dnnl_conv *c, variant *v, int64_t mb, int64_t oc, int64_t ic, char *why, size_t n)
{
    const tf_conv_geom *g = &c->g;
    v->mb = mb, v->oc = oc, v->ic = ic;
    dnnl_convolution_desc_t d, fd;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t hint = NULL;
    bool good = conv_desc(c, c->dir, mb, oc, ic, &d, why, n) && ok(dnnl_primitive_attr_create(&attr), "attributes", why, n) &&
                ok(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "the scratchpad mode", why, n);
    if (good && c->relu)
        good = ok(dnnl_post_ops_create(&po), "post-ops", why, n) &&
               ok(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f), "the ReLU post-op", why, n) &&
               ok(dnnl_primitive_attr_set_post_ops(attr, po), "post-ops", why, n);
    if (good && c->dir != TF_DNNL_FWD)   /* the backward primitives take a forward one as a hint */
        good = conv_desc(c, TF_DNNL_FWD, mb, oc, ic, &fd, why, n) &&
               ok(dnnl_primitive_desc_create(&hint, &fd, NULL, engine(), NULL), "the forward hint", why, n);
    if (good) good = ok(dnnl_primitive_desc_create(&v->pd, &d, attr, engine(), hint), "the primitive descriptor", why, n);
    const char *impl = "";
    if (good && c->plain16 && dnnl_primitive_desc_query(v->pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
        impl && !strncmp(impl, "ref", 3)) {   /* no fast code for nChw16c here: oneDNN's own layout */
        dnnl_primitive_desc_destroy(v->pd);
        v->pd = NULL;
        c->plain16 = false;
        good = conv_desc(c, c->dir, mb, oc, ic, &d, why, n) &&
               ok(dnnl_primitive_desc_create(&v->pd, &d, attr, engine(), hint), "the primitive descriptor", why, n);
    }
    if (good) good = ok(dnnl_primitive_create(&v->prim, v->pd), "the primitive", why, n);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (!good) return false;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(v->pd, dnnl_query_scratchpad_md, 0);
    v->scratchpad = sp ? dnnl_memory_desc_get_size(sp) : 0;
    v->piece_bytes = up64(v->scratchpad);
    dnnl_memory_desc_t src, wei, dst, bias;
    dnnl_dims_t bd = {oc};
    if (!conv_mds(c, mb, oc, ic, false, &src, &wei, &dst, why, n)) return false;
    int64_t img = g->C * g->H * g->W, oimg = g->O * g->Ho * g->Wo, wsize = g->O * g->Cg * g->KH * g->KW;
    int64_t wrow = g->Cg * g->KH * g->KW;   /* weights per output channel */
    if (c->by_channel) {
        /* the piece's channels over the whole batch: strided slices of the
         * images, its rows (or, for the input gradient, its columns) of the
         * weights */
        dnnl_dims_t dd = {mb, oc, g->Ho, g->Wo}, ds = {oimg, g->Ho * g->Wo, g->Wo, 1};
        dnnl_dims_t sd = {mb, ic, g->H, g->W}, ss = {img, g->H * g->W, g->W, 1};
        dnnl_dims_t wd = {oc, ic, g->KH, g->KW}, ws = {g->C * g->KH * g->KW, g->KH * g->KW, g->KW, 1};
        switch (c->dir) {
        case TF_DNNL_FWD:
            good = ok(dnnl_memory_desc_init_by_strides(&dst, 4, dd, dnnl_f32, ds), "the destination slice", why, n) &&
                   add_arg(v, DNNL_ARG_SRC, false, A_ACT, &src, 0, why, n) &&
                   add_arg(v, DNNL_ARG_WEIGHTS, false, A_SLOT, &wei, wrow, why, n) &&
                   add_arg(v, DNNL_ARG_DST, true, A_PIECE, &dst, g->Ho * g->Wo, why, n);
            if (good && c->bias)
                good = ok(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_a), "bias", why, n) &&
                       add_arg(v, DNNL_ARG_BIAS, false, A_PIECE, &bias, 1, why, n);
            return good;
        case TF_DNNL_BWD_DATA:
            return ok(dnnl_memory_desc_init_by_strides(&src, 4, sd, dnnl_f32, ss), "the diff_src slice", why, n) &&
                   ok(dnnl_memory_desc_init_by_strides(&wei, 4, wd, dnnl_f32, ws), "the weights' columns", why, n) &&
                   add_arg(v, DNNL_ARG_DIFF_DST, false, A_ACT, &dst, 0, why, n) &&
                   add_arg(v, DNNL_ARG_WEIGHTS, false, A_SLOT, &wei, g->KH * g->KW, why, n) &&
                   add_arg(v, DNNL_ARG_DIFF_SRC, true, A_PIECE, &src, g->H * g->W, why, n);
        case TF_DNNL_BWD_WEIGHTS:
            return ok(dnnl_memory_desc_init_by_strides(&dst, 4, dd, dnnl_f32, ds), "the diff_dst slice", why, n) &&
                   add_arg(v, DNNL_ARG_SRC, false, A_ACT, &src, 0, why, n) &&
                   add_arg(v, DNNL_ARG_DIFF_DST, false, A_PIECE, &dst, g->Ho * g->Wo, why, n) &&
                   add_arg(v, DNNL_ARG_DIFF_WEIGHTS, true, A_PIECE, &wei, wrow, why, n);
        }
    }
    switch (c->dir) {
    case TF_DNNL_FWD:
        good = add_arg(v, DNNL_ARG_SRC, false, A_PIECE, &src, img, why, n) &&
               add_arg(v, DNNL_ARG_WEIGHTS, false, A_STATE, &wei, 0, why, n) && add_arg(v, DNNL_ARG_DST, true, A_PIECE, &dst, oimg, why, n);
        if (good && c->bias)
            good = ok(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_a), "bias", why, n) &&
                   add_arg(v, DNNL_ARG_BIAS, false, A_STATE, &bias, 0, why, n);
        break;
    case TF_DNNL_BWD_DATA:
        good = add_arg(v, DNNL_ARG_DIFF_DST, false, A_PIECE, &dst, oimg, why, n) &&
               add_arg(v, DNNL_ARG_WEIGHTS, false, A_STATE, &wei, 0, why, n) &&
               add_arg(v, DNNL_ARG_DIFF_SRC, true, A_PIECE, &src, img, why, n);
        break;
    case TF_DNNL_BWD_WEIGHTS:
        good = add_arg(v, DNNL_ARG_SRC, false, A_PIECE, &src, img, why, n) &&
               add_arg(v, DNNL_ARG_DIFF_DST, false, A_PIECE, &dst, oimg, why, n) &&
               add_arg(v, DNNL_ARG_DIFF_WEIGHTS, true, A_PIECE, &wei, wsize, why, n);
        break;
    }
    return good;
}

/* Whether c's pieces are groups of channels over the whole batch rather
 * than groups of images: where the weights outnumber the images (deep
 * layers at small images: ResNet-18's 512 -> 512 3x3 convs at 2x2, batch 4,
 * 2.4 M weights for 8 K inputs). Split by images, every piece reads every
 * weight (the forward and the input gradient) or writes a whole weight
 * gradient that is added up afterwards (four 9.4 MB partials: a 9.5 ms
 * call; split by output channels 2.0 ms). The forward and the weight
 * gradient split the output channels, the input gradient the input
 * channels, into at most TF_DNNL_CONV_PIECES groups of at least
 * TF_DNNL_GW_CHANNELS. Grouped convolutions are split by images. */
static bool conv_split_by_channel(const tf_conv_geom *g, tf_dnnl_dir dir, int64_t *pieces)
{
    int64_t ch = dir == TF_DNNL_BWD_DATA ? g->C : g->O;
    if (g->G != 1 || ch < 2 * TF_DNNL_GW_CHANNELS || g->O * g->Cg * g->KH * g->KW <= g->N * g->C * g->H * g->W) return false;
    *pieces = ch / TF_DNNL_GW_CHANNELS < TF_DNNL_CONV_PIECES ? ch / TF_DNNL_GW_CHANNELS : TF_DNNL_CONV_PIECES;
    return true;
}

/* What the pieces split: images, or (by_channel) the input gradient's input
 * channels or the other directions' output channels. */
static int64_t piece_units(const tf_dnnl_conv *c)
{
    return !c->by_channel ? c->g.N : c->dir == TF_DNNL_BWD_DATA ? c->g.C : c->g.O;
}

static void piece_range(const tf_dnnl_conv *c, int64_t q, int64_t *u0, int64_t *u1)
{
    int64_t U = piece_units(c);
    *u0 = U * q / c->pieces, *u1 = U * (q + 1) / c->pieces;
}

static int piece_variant(const tf_dnnl_conv *c, int64_t q)
{
    int64_t u0, u1;
    piece_range(c, q, &u0, &u1);
    const variant *v = &c->v[0];
    return u1 - u0 == (!c->by_channel ? v->mb : c->dir == TF_DNNL_BWD_DATA ? v->ic : v->oc) ? 0 : 1;
}

/* The variant for pieces of `units` images or channels. */
static bool variant_for(tf_dnnl_conv *c, variant *v, int64_t units, char *why, size_t n)
{
    const tf_conv_geom *g = &c->g;
    if (!c->by_channel) return variant_make(c, v, units, g->O, g->C, why, n);
    return c->dir == TF_DNNL_BWD_DATA ? variant_make(c, v, g->N, g->O, units, why, n) : variant_make(c, v, g->N, units, g->C, why, n);
}

tf_dnnl_conv *tf_dnnl_conv_create(tf_dnnl_dir dir, const tf_conv_geom *g, bool bias, bool relu, bool blocked, int threads,
                                  char *why, size_t n)
{
    if (!engine()) {
        snprintf(why, n, "oneDNN has no CPU engine: %s", dnnl_status2str(g_engine_status));
        return NULL;
    }
    for (int i = 0; i < 2; i++) {   /* tfuse's output size is the floor; oneDNN's with padding on both sides too */
        int64_t in = i ? g->W : g->H, k = i ? g->KW : g->KH, out = i ? g->Wo : g->Ho;
        int64_t ext = (k - 1) * g->dl[i] + 1;
        if (in + 2 * g->p[i] < ext || (in + 2 * g->p[i] - ext) / g->s[i] + 1 != out || g->N < 1) {
            snprintf(why, n, "output size %lld is not oneDNN's for this geometry", (long long)out);
            return NULL;
        }
    }
    tf_dnnl_conv *c = tf_calloc(1, sizeof *c);
    if (!c) {
        snprintf(why, n, "out of memory");
        return NULL;
    }
    c->dir = dir, c->g = *g, c->bias = bias && dir == TF_DNNL_FWD, c->relu = relu && dir == TF_DNNL_FWD, c->blocked = blocked;
    c->plain16 = dir == TF_DNNL_FWD;
    c->pieces = dir == TF_DNNL_BWD_WEIGHTS ? tf_conv_grad_weight_groups(g) : g->N < TF_DNNL_CONV_PIECES ? g->N : TF_DNNL_CONV_PIECES;
    c->by_channel = conv_split_by_channel(g, dir, &c->pieces);   /* either way the shape alone decides the pieces */
    int64_t wsize = g->O * g->Cg * g->KH * g->KW;
    c->threads = threads < 1 ? 1 : threads;
    /* primitives are made for one thread: oneDNN sizes its blocking by the
     * OpenMP threads of the thread that creates them */
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    int64_t units = piece_units(c), lo = units / c->pieces, hi = (units + c->pieces - 1) / c->pieces;
    bool good = variant_for(c, &c->v[0], hi, why, n);
    c->nv = 1;
    if (good && lo != hi) good = variant_for(c, &c->v[1], lo, why, n), c->nv = 2;
    omp_set_num_threads(prev);
    if (good && !(c->streams = tf_calloc((size_t)c->threads, sizeof *c->streams))) good = false, snprintf(why, n, "out of memory");
    for (int t = 0; good && t < c->threads; t++)
        good = ok(dnnl_stream_create(&c->streams[t], engine(), dnnl_stream_default_flags), "a stream", why, n);
    if (!good) {
        tf_dnnl_conv_free(c);
        return NULL;
    }
    for (int i = 0; i < c->nv; i++) {
        if (c->v[i].piece_bytes > c->per_worker) c->per_worker = c->v[i].piece_bytes;
        c->shared += c->v[i].state_bytes;
        c->act += c->v[i].act_bytes;
    }
    for (int64_t q = 0; c->by_channel && q < c->pieces; q++) c->shared += c->v[piece_variant(c, q)].slot_bytes;
    if (dir == TF_DNNL_BWD_WEIGHTS && !c->by_channel) c->partials = up64((size_t)(c->pieces * wsize) * sizeof(float));
    return c;
}

void tf_dnnl_layout_str(const dnnl_memory_desc_t *md, char *out, size_t n)
{
    if (md->format_kind != dnnl_blocked) {
        snprintf(out, n, "opaque");
        return;
    }
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    /* outer order: dims by decreasing stride; then the inner blocks */
    int order[DNNL_MAX_NDIMS], nd = md->ndims;
    for (int i = 0; i < nd; i++) order[i] = i;
    for (int i = 0; i < nd; i++)
        for (int j = i + 1; j < nd; j++)
            if (b->strides[order[j]] > b->strides[order[i]]) {
                int t = order[i];
                order[i] = order[j], order[j] = t;
            }
    size_t at = 0;
    for (int i = 0; i < nd && at + 1 < n; i++) out[at++] = (char)('a' + order[i]);
    for (int i = 0; i < b->inner_nblks && at + 8 < n; i++)
        at += (size_t)snprintf(out + at, n - at, "%lld%c", (long long)b->inner_blks[i], (char)('a' + b->inner_idxs[i]));
    out[at < n ? at : n - 1] = 0;
}

void tf_dnnl_conv_explain(const tf_dnnl_conv *c, char *out, size_t n)
{
    const char *impl = "?";
    dnnl_primitive_desc_query(c->v[0].pd, dnnl_query_impl_info_str, 0, &impl);
    char lay[256] = "";
    size_t at = 0;
    for (int i = 0; i < c->v[0].nargs && at < sizeof lay; i++) {
        const carg *a = &c->v[0].args[i];
        char l[64];
        tf_dnnl_layout_str(&a->prim, l, sizeof l);
        at += (size_t)snprintf(lay + at, sizeof lay - at, "%s%s %s%s", i ? ", " : "",
                               a->arg == DNNL_ARG_SRC ? "src" : a->arg == DNNL_ARG_DST ? "dst" : a->arg == DNNL_ARG_WEIGHTS ? "weights"
                               : a->arg == DNNL_ARG_BIAS ? "bias" : a->arg == DNNL_ARG_DIFF_SRC ? "diff_src"
                               : a->arg == DNNL_ARG_DIFF_DST ? "diff_dst" : "diff_weights",
                               l, a->reorder ? " (reordered)" : "");
    }
    const variant *v = &c->v[0];
    snprintf(out, n, "oneDNN %s (algorithm direct), %s; %lld pieces of %lld%s %s%s%s", impl, lay, (long long)c->pieces,
             (long long)(!c->by_channel ? v->mb : c->dir == TF_DNNL_BWD_DATA ? v->ic : v->oc), c->nv > 1 ? " or fewer" : "",
             !c->by_channel ? "image(s)" : c->dir == TF_DNNL_BWD_DATA ? "input channels over the whole batch"
                                                                   : "output channels over the whole batch",
             c->bias ? ", bias in the primitive" : "", c->relu ? ", ReLU post-op" : "");
}

size_t tf_dnnl_conv_scratch_bytes(const tf_dnnl_conv *c)
{
    return (size_t)c->threads * c->per_worker + c->shared + c->partials + c->act;
}

typedef struct run_job {
    tf_dnnl_conv *c;
    const float *a, *b, *bias;
    float *out;
    unsigned char *scratch;
    void *shared[2][4];      /* per variant, per argument: its reordered A_STATE or A_ACT buffer */
    void *slot[TF_DNNL_CONV_PIECES];   /* per piece: its reordered A_SLOT buffer (by_channel) */
    tf_dnnl_after_fn after;  /* run on each piece's images after it (NULL: none) */
    void *after_arg;
    int workers;
    atomic_bool failed;
} run_job;

/* The user's pointer of argument i for piece q, whose first image (or
 * channel, by_channel: piece_units) is u0. */
static void *user_ptr(const run_job *j, const carg *a, int64_t q, int64_t u0)
{
    const tf_dnnl_conv *c = j->c;
    if (c->dir == TF_DNNL_BWD_WEIGHTS && a->output && !c->by_channel)   /* partial q */
        return j->scratch + (size_t)c->threads * c->per_worker + c->shared + (size_t)(q * a->stride) * sizeof(float);
    const float *p;
    switch (a->arg) {
    case DNNL_ARG_BIAS: p = j->bias; break;
    case DNNL_ARG_WEIGHTS: p = j->b; break;
    case DNNL_ARG_DIFF_DST: p = c->dir == TF_DNNL_BWD_WEIGHTS ? j->b : j->a; break;
    case DNNL_ARG_SRC: p = j->a; break;
    default: p = j->out; break;   /* DST, DIFF_SRC */
    }
    return (void *)(p + (a->kind == A_PIECE || a->kind == A_SLOT ? u0 * a->stride : 0));
}

bool tf_dnnl_exec(dnnl_primitive_t p, dnnl_stream_t s, int nargs, const dnnl_exec_arg_t *args)
{
    return dnnl_primitive_execute(p, s, nargs, args) == dnnl_success && dnnl_stream_wait(s) == dnnl_success;
}

static bool exec(dnnl_primitive_t p, dnnl_stream_t s, int nargs, const dnnl_exec_arg_t *args) { return tf_dnnl_exec(p, s, nargs, args); }

static bool reorder(dnnl_primitive_t r, dnnl_stream_t s, const dnnl_memory_desc_t *from, void *src, const dnnl_memory_desc_t *to,
                    void *dst)
{
    dnnl_memory_t m[2] = {NULL, NULL};
    bool good = dnnl_memory_create(&m[0], from, engine(), src) == dnnl_success &&
                dnnl_memory_create(&m[1], to, engine(), dst) == dnnl_success;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, m[0]}, {DNNL_ARG_TO, m[1]}};
    good = good && exec(r, s, 2, args);
    for (int i = 0; i < 2; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    return good;
}

static bool run_piece(run_job *j, int t, int64_t q)
{
    tf_dnnl_conv *c = j->c;
    int64_t n0, n1;
    piece_range(c, q, &n0, &n1);
    int vi = piece_variant(c, q);
    variant *v = &c->v[vi];
    dnnl_stream_t s = c->streams[t];
    unsigned char *ws = j->scratch + (size_t)t * c->per_worker, *at = ws + up64(v->scratchpad);
    dnnl_memory_t mem[5] = {0};
    dnnl_exec_arg_t args[5];
    void *prim_ptr[4];
    bool good = true;
    for (int i = 0; good && i < v->nargs; i++) {
        carg *a = &v->args[i];
        void *u = user_ptr(j, a, q, n0);
        prim_ptr[i] = u;
        if (a->reorder && a->kind == A_PIECE) {
            prim_ptr[i] = at;
            at += up64(a->prim_bytes);
            if (!a->output) good = reorder(a->reorder, s, &a->user, u, &a->prim, prim_ptr[i]);
        } else if (a->reorder && a->kind == A_SLOT) {
            prim_ptr[i] = j->slot[q];
        } else if (a->reorder) {
            prim_ptr[i] = j->shared[vi][i];
        }
        good = good && dnnl_memory_create(&mem[i], &a->prim, engine(), prim_ptr[i]) == dnnl_success;
        args[i] = (dnnl_exec_arg_t){a->arg, mem[i]};
    }
    int nargs = v->nargs;
    if (good && v->scratchpad) {
        const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(v->pd, dnnl_query_scratchpad_md, 0);
        good = dnnl_memory_create(&mem[nargs], sp, engine(), ws) == dnnl_success;
        args[nargs] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[nargs]};
        nargs++;
    }
    good = good && exec(v->prim, s, nargs, args);
    for (int i = 0; good && i < v->nargs; i++) {
        carg *a = &v->args[i];
        if (a->output && a->reorder) good = reorder(a->reorder, s, &a->prim, prim_ptr[i], &a->user, user_ptr(j, a, q, n0));
    }
    if (good && j->after) j->after(j->after_arg, n0, n1);
    for (int i = 0; i < 5; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    return good;
}

static void run_worker(void *arg, int64_t lo, int64_t hi)
{
    run_job *j = arg;
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int64_t t = lo; t < hi; t++)
        for (int64_t q = j->c->pieces * t / j->workers; q < j->c->pieces * (t + 1) / j->workers; q++)
            if (!run_piece(j, (int)t, q)) atomic_store(&j->failed, true);
    omp_set_num_threads(prev);
}

size_t tf_dnnl_conv_kept_bytes(const tf_dnnl_conv *c) { return c->shared; }

/* The argument of v for a forward convolution's image or result. */
static carg *image_arg(variant *v, bool dst)
{
    for (int i = 0; i < v->nargs; i++)
        if (v->args[i].arg == (dst ? DNNL_ARG_DST : DNNL_ARG_SRC)) return &v->args[i];
    return NULL;
}

bool tf_dnnl_conv_blocked_ok(const tf_dnnl_conv *c, bool dst)
{
    if (c->dir != TF_DNNL_FWD || c->by_channel) return false;
    for (int i = 0; i < c->nv; i++) {
        const variant *v = &c->v[i];
        carg *a = image_arg((variant *)v, dst);
        dnnl_memory_desc_t want;
        dnnl_dims_t d = {v->mb, dst ? c->g.O : c->g.C, dst ? c->g.Ho : c->g.H, dst ? c->g.Wo : c->g.W};
        if (!a || a->kind != A_PIECE || d[1] % 16 ||
            dnnl_memory_desc_init_by_tag(&want, 4, d, dnnl_f32, dnnl_nChw16c) != dnnl_success || !dnnl_memory_desc_equal(&a->prim, &want))
            return false;
    }
    return true;
}

void tf_dnnl_conv_take_blocked(tf_dnnl_conv *c, bool dst)
{
    for (int i = 0; i < c->nv; i++) {
        carg *a = image_arg(&c->v[i], dst);
        if (!a) continue;
        a->user = a->prim;   /* the same size: nChw16c pads nothing when the channels are a multiple of 16 */
        if (a->reorder) dnnl_primitive_destroy(a->reorder);
        a->reorder = NULL;
    }
}

bool tf_dnnl_conv_is_blocked(const tf_dnnl_conv *c, bool dst)
{
    carg *a = c->dir == TF_DNNL_FWD ? image_arg((variant *)&c->v[0], dst) : NULL;
    return a && a->kind == A_PIECE && !a->reorder && dnnl_memory_desc_equal(&a->user, &a->prim) &&
           tf_dnnl_conv_blocked_ok(c, dst);
}

bool tf_dnnl_conv_run(tf_dnnl_conv *c, tf_pool *pool, const float *a, const float *b, const float *bias, float *out,
                      void *scratch, void *kept, bool refresh, tf_dnnl_after_fn after, void *after_arg, bool *after_ran)
{
    bool by_images = c->dir == TF_DNNL_FWD && !c->by_channel;
    run_job j = {.c = c, .a = a, .b = b, .bias = bias, .out = out, .scratch = scratch, .after = by_images ? after : NULL,
                 .after_arg = after_arg};
    if (after_ran) *after_ran = j.after != NULL;
    atomic_init(&j.failed, false);
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    /* inputs shared by the pieces reordered before them: the weights (and
     * each piece's slice of them) into kept, only when they changed; the
     * activations at every call */
    unsigned char *sh = kept ? (unsigned char *)kept : (unsigned char *)scratch + (size_t)c->threads * c->per_worker;
    unsigned char *act = (unsigned char *)scratch + (size_t)c->threads * c->per_worker + c->shared + c->partials;
    bool good = true;
    for (int vi = 0; vi < c->nv; vi++)
        for (int i = 0; i < c->v[vi].nargs; i++) {
            carg *ar = &c->v[vi].args[i];
            if (!ar->reorder || (ar->kind != A_STATE && ar->kind != A_ACT)) continue;
            unsigned char **at = ar->kind == A_STATE ? &sh : &act;
            j.shared[vi][i] = *at;
            *at += up64(ar->prim_bytes);
            if (ar->kind == A_ACT || !kept || refresh)
                good = good && reorder(ar->reorder, c->streams[0], &ar->user, user_ptr(&j, ar, 0, 0), &ar->prim, j.shared[vi][i]);
        }
    for (int64_t q = 0; c->by_channel && q < c->pieces; q++) {
        variant *v = &c->v[piece_variant(c, q)];
        for (int i = 0; i < v->nargs; i++) {
            carg *ar = &v->args[i];
            if (!ar->reorder || ar->kind != A_SLOT) continue;
            int64_t u0, u1;
            piece_range(c, q, &u0, &u1);
            j.slot[q] = sh;
            sh += up64(ar->prim_bytes);
            if (!kept || refresh) good = good && reorder(ar->reorder, c->streams[0], &ar->user, user_ptr(&j, ar, q, u0), &ar->prim, j.slot[q]);
        }
    }
    omp_set_num_threads(prev);
    if (!good) return false;
    j.workers = tf_pool_threads(pool);
    if (j.workers > c->threads) j.workers = c->threads;
    if (j.workers > c->pieces) j.workers = (int)c->pieces;
    if (j.workers <= 1) {
        j.workers = 1;
        run_worker(&j, 0, 1);
    } else {
        tf_pool_run(pool, j.workers, run_worker, &j);
    }
    if (atomic_load(&j.failed)) return false;
    if (c->dir == TF_DNNL_BWD_WEIGHTS && !c->by_channel) {   /* the partials, added in order */
        const tf_conv_geom *g = &c->g;
        int64_t wsize = g->O * g->Cg * g->KH * g->KW;
        const float *part = (const float *)((unsigned char *)scratch + (size_t)c->threads * c->per_worker + c->shared);
        memcpy(out, part, (size_t)wsize * sizeof *out);
        for (int64_t q = 1; q < c->pieces; q++)
            for (int64_t i = 0; i < wsize; i++) out[i] += part[q * wsize + i];
    }
    return true;
}

#else /* !TFUSE_HAVE_ONEDNN */

bool tf_dnnl_available(void) { return false; }

void tf_dnnl_describe(char *out, size_t n)
{
    snprintf(out, n, "no oneDNN in this build: configured with -DTFUSE_WITH_ONEDNN=OFF or without libdnnl-dev");
}

tf_dnnl_conv *tf_dnnl_conv_create(tf_dnnl_dir dir, const tf_conv_geom *g, bool bias, bool relu, bool blocked, int threads,
                                  char *why, size_t n)
{
    (void)dir, (void)g, (void)bias, (void)relu, (void)blocked, (void)threads;
    snprintf(why, n, "this build has no oneDNN");
    return NULL;
}

void tf_dnnl_conv_free(tf_dnnl_conv *c) { (void)c; }
bool tf_dnnl_conv_blocked_ok(const tf_dnnl_conv *c, bool dst) { (void)c, (void)dst; return false; }
void tf_dnnl_conv_take_blocked(tf_dnnl_conv *c, bool dst) { (void)c, (void)dst; }
bool tf_dnnl_conv_is_blocked(const tf_dnnl_conv *c, bool dst) { (void)c, (void)dst; return false; }
void tf_dnnl_conv_explain(const tf_dnnl_conv *c, char *out, size_t n) { (void)c, snprintf(out, n, "no oneDNN"); }
size_t tf_dnnl_conv_scratch_bytes(const tf_dnnl_conv *c) { (void)c; return 0; }
size_t tf_dnnl_conv_kept_bytes(const tf_dnnl_conv *c) { (void)c; return 0; }
bool tf_dnnl_conv_run(tf_dnnl_conv *c, tf_pool *pool, const float *a, const float *b, const float *bias, float *out,
                      void *scratch, void *kept, bool refresh, tf_dnnl_after_fn after, void *after_arg, bool *after_ran)
{
    (void)c, (void)pool, (void)a, (void)b, (void)bias, (void)out, (void)scratch, (void)kept, (void)refresh, (void)after, (void)after_arg;
    if (after_ran) *after_ran = false;
    return false;
}

#endif
