/* llvm.c — lower elementwise and reduction kernels to LLVM IR and JIT them.
 *
 * The generated function mirrors kernel_eval.c step by step, so that it
 * stores exactly the bits the reference stores:
 *
 *   - loops over the index space in row-major order (for a reduction: the
 *     outer axes; per outer index one loop nest over the reduced axes per
 *     reduction, in order, then the outer stores, then a loop nest over the
 *     reduced axes for the full-space stores);
 *   - every value is a double rounded to its expression's dtype after each
 *     step (f32: fptrunc then fpext; integers: NaN to 0, trunc, saturate;
 *     bool: != 0), math in double through LLVM intrinsics and libm calls
 *     (resolved from the process), NaN handling spelled out with selects;
 *   - reductions accumulate in double in the reference's order (sounder
 *     than fp32 or pairwise fp32 sums, for every storage dtype);
 *   - f16/bf16 are 16-bit patterns in memory, converted and rounded by
 *     integer arithmetic inline (no libcalls), so their loops vectorize too;
 *   - the outermost loop nest's split axis (tf_kernel_split_axis) runs over
 *     [lo, hi) only: the runtime hands each thread its share;
 *   - dropout masks call back into the runtime for the interpreter's draw.
 *
 * Buffers are in their storage dtype (float, double, uint16_t for f16/bf16,
 * int64_t, int32_t, uint8_t). Loop counters and accumulators live in allocas that the
 * optimizer (a vectorizing pipeline, `pipeline` below, the vectorizer left
 * out for small kernels; no fast-math flags)
 * promotes; instruction selection runs at LLVM's default (O2) level for the
 * host CPU and its features. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm/Config/llvm-config.h>   /* LLVM_VERSION_STRING (plain C) */
#include <llvm-c/Transforms/PassBuilder.h>

#include "interp.h"
#include "llvm.h"
#include "scalar.h"

struct tf_jit {
    LLVMOrcLLJITRef jit;
    LLVMTargetMachineRef tm;
    char **names;          /* function names already defined */
    int nnames, cap;
    char *pipeline;        /* tf_jit_set_pipeline's; NULL: ours */
};

/* ---- what is supported -------------------------------------------------- */

static bool dtype_ok(tf_dt t)
{
    return t == TF_DT_F32 || t == TF_DT_F64 || t == TF_DT_F16 || t == TF_DT_BF16 || t == TF_DT_I64 || t == TF_DT_I32 ||
           t == TF_DT_BOOL;
}

/* The scalar primitives lower_llvm implements (all of scalar.h's). */
static bool llvm_has(tf_sprim p) { return (unsigned)p < TF_S_COUNT; }

/* Whether the op's scalar expression parses, uses only primitives this
 * generator has, and fits the operands the kernel gives it. */
static bool lowered(const tf_kexpr *x, char *why, size_t n) { return tf_sexpr_lowerable(x->op, x->nargs, llvm_has, why, n); }

bool tf_jit_lowers(int op, char *why, size_t n) { return tf_sexpr_lowerable(op, 3, llvm_has, why, n); }   /* one_hot gets the class index as b */

bool tf_jit_supports(const tf_kernel *k, char *why, size_t n)
{
    char tmp[8];
    if (!why) { why = tmp; n = sizeof tmp; }
    if (k->kind == TF_K_LIBRARY && !k->nexprs) {
        snprintf(why, n, "kernel %s: a library call with no epilogue has nothing to compile", k->name);
        return false;
    }
    if (k->kind == TF_K_VIEW) {
        snprintf(why, n, "kernel %s: a view has nothing to compile", k->name);
        return false;
    }
    for (int b = 0; b < k->nbufs; b++)
        if (!dtype_ok(k->bufs[b].value->type.dtype)) {
            snprintf(why, n, "kernel %s: buffer %s has dtype %s (not supported yet)", k->name,
                     k->bufs[b].value->name ? k->bufs[b].value->name : "?", tf_dtype_name(k->bufs[b].value->type.dtype));
            return false;
        }
    for (int i = 0; i < k->nexprs; i++) {
        const tf_kexpr *x = &k->exprs[i];
        if (!dtype_ok(x->dtype)) {
            snprintf(why, n, "kernel %s: expression %d has dtype %s (not supported yet)", k->name, i, tf_dtype_name(x->dtype));
            return false;
        }
        char no[200];
        if (x->kind == TF_KX_OP && !lowered(x, no, sizeof no)) {
            snprintf(why, n, "kernel %s: op %s has no LLVM lowering: %s", k->name, tf_op_info_of(x->op)->name, no);
            return false;
        }
    }
    for (int r = 0; r < k->nreds; r++) {
        int op = k->reds[r].op;
        if (!dtype_ok(k->reds[r].dtype) || !tf_kernel_reduction_ok(op)) {
            snprintf(why, n, "kernel %s: reduction %d (%s, %s) is not supported yet", k->name, r,
                     tf_op_info_of(op)->name, tf_dtype_name(k->reds[r].dtype));
            return false;
        }
    }
    return true;
}

/* ---- code generation ---------------------------------------------------- */

typedef struct gen {
    const tf_kernel *k;
    LLVMContextRef cx;
    LLVMModuleRef mod;
    LLVMBuilderRef b;
    LLVMValueRef fn;
    LLVMTypeRef f64, i64, i1;
    LLVMValueRef lo, hi, rt;   /* the split axis's range; the runtime words (seed, step) */
    unsigned top;              /* the axes of the outermost loop nest */
    int split;                 /* tf_kernel_split_axis */
    bool colmode;              /* a column reduction: see column_reduction() */
    LLVMValueRef tmp, tidx;    /* a row reduction's scratch row (double[ntmp]), or NULL; its counter */
    int reuse;                 /* >= 0: the full-space stores read this reduction's argument from tmp */
    unsigned blk_mask;         /* block mode: the inner reduced axes tmp holds (ntmp elements, a multiple of 8) */
    int64_t ntmp;
    LLVMValueRef colacc;       /* colmode: double[8][ncols], one reduction at a time */
    LLVMValueRef *colred;      /* colmode: per reduction, double[ncols] */
    int64_t ncols;
    LLVMValueRef *bufp;        /* typed pointer per buffer */
    LLVMValueRef idx[TF_MAX_RANK];   /* i64 allocas */
    LLVMValueRef *red;         /* double alloca per reduction */
    LLVMValueRef lanes, vacc;  /* double[8] and <8 x double> allocas (entry block) */
    LLVMValueRef *memo;        /* per expression, in the current body */
} gen;

static LLVMTypeRef storage_type(gen *g, tf_dt t)
{
    switch (t) {
    case TF_DT_F32: return LLVMFloatTypeInContext(g->cx);
    case TF_DT_F64: return g->f64;
    case TF_DT_I64: return g->i64;
    case TF_DT_I32: return LLVMInt32TypeInContext(g->cx);
    case TF_DT_F16:
    case TF_DT_BF16: return LLVMInt16TypeInContext(g->cx);   /* the 16-bit pattern */
    default: return LLVMInt8TypeInContext(g->cx);   /* bool */
    }
}

static LLVMValueRef cf(gen *g, double v) { return LLVMConstReal(g->f64, v); }
static LLVMValueRef ci(gen *g, int64_t v) { return LLVMConstInt(g->i64, (unsigned long long)v, 1); }

/* A declared function (intrinsic or libm) double(double[, double]). */
static LLVMValueRef callf(gen *g, const char *name, int nargs, LLVMValueRef a, LLVMValueRef b)
{
    LLVMTypeRef params[2] = {g->f64, g->f64};
    LLVMTypeRef ft = LLVMFunctionType(g->f64, params, (unsigned)nargs, 0);
    LLVMValueRef f = LLVMGetNamedFunction(g->mod, name);
    if (!f) f = LLVMAddFunction(g->mod, name, ft);
    LLVMValueRef args[2] = {a, b};
    return LLVMBuildCall2(g->b, ft, f, args, (unsigned)nargs, "");
}

static LLVMValueRef bool_to_f(gen *g, LLVMValueRef c)
{
    return LLVMBuildSelect(g->b, c, cf(g, 1.0), cf(g, 0.0), "");
}

static LLVMValueRef bits_to_f(gen *g, LLVMValueRef bits) { return LLVMBuildBitCast(g->b, bits, g->f64, ""); }
static LLVMValueRef f_to_bits(gen *g, LLVMValueRef v) { return LLVMBuildBitCast(g->b, v, g->i64, ""); }

/* core.c's round_ieee without branches (so loops stay vectorizable), and
 * with a short dependency chain (a kernel's expressions are one long chain
 * of roundings, so their latency is what a 16-bit kernel costs):
 *   - |v| >= 2^emin: round to nearest even at the format's last mantissa
 *     bit by integer arithmetic on the double's bits (a carry into the
 *     exponent is the right answer);
 *   - |v| < 2^emin (subnormal, a fixed quantum q = 2^(emin-mbits)):
 *     (v + C) - C with C = 1.5 * 2^52 * q: v + C lies in [2^52 q, 2^53 q),
 *     where the double's spacing is q, so the add rounds v to a multiple of
 *     q, nearest even (C / q is even), and the subtract is exact; the sign
 *     of v is put back (core.c gives -0 for a negative v that rounds to 0);
 *   - |v| >= T = (2 - 2^-(mbits+1)) * 2^emax, the midpoint between the
 *     largest finite value and 2^(emax+1), rounds (ties to even: up) past
 *     the largest finite value: infinity of v's sign (for an infinite v: v);
 *   - NaN stays.
 * The finite results need |v| < T, tested on v, off the chain. */
static LLVMValueRef round_ieee(gen *g, LLVMValueRef v, int mbits, int emin, int emax)
{
    LLVMBuilderRef B = g->b;
    int drop = 52 - mbits;
    LLVMValueRef bits = f_to_bits(g, v);
    LLVMValueRef lsb = LLVMBuildAnd(B, LLVMBuildLShr(B, bits, ci(g, drop), ""), ci(g, 1), "");
    LLVMValueRef near = LLVMBuildAdd(B, bits, ci(g, ((int64_t)1 << (drop - 1)) - 1), "");
    LLVMValueRef rn = bits_to_f(g, LLVMBuildAnd(B, LLVMBuildAdd(B, near, lsb, ""), ci(g, ~(((int64_t)1 << drop) - 1)), ""));
    LLVMValueRef a = callf(g, "llvm.fabs.f64", 1, v, NULL);
    LLVMValueRef c = cf(g, ldexp(1.5, 52 + emin - mbits));
    LLVMValueRef rs = callf(g, "llvm.copysign.f64", 2, LLVMBuildFSub(B, LLVMBuildFAdd(B, v, c, ""), c, ""), v);
    LLVMValueRef r = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, a, cf(g, ldexp(1.0, emin)), ""), rs, rn, "");
    LLVMValueRef inf = callf(g, "llvm.copysign.f64", 2, cf(g, INFINITY), v);
    LLVMValueRef big = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, v, v, ""), v, inf, "");
    double t = ldexp(2.0 - ldexp(1.0, -(mbits + 1)), emax);
    return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, a, cf(g, t), ""), r, big, "");
}

static bool f16c;
static void find_f16c(void)
{
    char *feat = LLVMGetHostCPUFeatures();
    f16c = feat && strstr(feat, "+f16c");
    LLVMDisposeMessage(feat);
}

/* Whether the host converts between f16 and f32 in hardware (x86's F16C:
 * vcvtph2ps, vcvtps2ph). An f16 load or store is then two conversions, as
 * exact as the integer code below and several times cheaper; without it,
 * LLVM would call compiler-rt's helpers, which object code loaded without
 * LLVM (objload.c) cannot resolve. The disk cache's key has the host's
 * features, so an object compiled either way is only found by such a host. */
static bool host_f16c(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, find_f16c);
    return f16c;
}

/* A 16-bit pattern (i16) to double. */
static LLVMValueRef half_to_f(gen *g, tf_dt t, LLVMValueRef h)
{
    LLVMBuilderRef B = g->b;
    if (t == TF_DT_BF16) {
        LLVMTypeRef i32 = LLVMInt32TypeInContext(g->cx);
        LLVMValueRef w = LLVMBuildShl(B, LLVMBuildZExt(B, h, i32, ""), LLVMConstInt(i32, 16, 0), "");
        return LLVMBuildFPExt(B, LLVMBuildBitCast(B, w, LLVMFloatTypeInContext(g->cx), ""), g->f64, "");
    }
    if (host_f16c())   /* exact: every f16 is an f32, every f32 a double */
        return LLVMBuildFPExt(B, LLVMBuildFPExt(B, LLVMBuildBitCast(B, h, LLVMHalfTypeInContext(g->cx), ""),
                                                LLVMFloatTypeInContext(g->cx), ""), g->f64, "");
    LLVMValueRef x = LLVMBuildZExt(B, h, g->i64, "");
    LLVMValueRef e = LLVMBuildAnd(B, LLVMBuildLShr(B, x, ci(g, 10), ""), ci(g, 31), "");
    LLVMValueRef m = LLVMBuildAnd(B, x, ci(g, 1023), "");
    LLVMValueRef norm = LLVMBuildICmp(B, LLVMIntNE, e, ci(g, 0), "");
    LLVMValueRef mant = LLVMBuildOr(B, m, LLVMBuildSelect(B, norm, ci(g, 1024), ci(g, 0), ""), "");
    LLVMValueRef ee = LLVMBuildSelect(B, norm, e, ci(g, 1), "");   /* value = mant * 2^(ee - 25) */
    LLVMValueRef scale = bits_to_f(g, LLVMBuildShl(B, LLVMBuildAdd(B, ee, ci(g, 1023 - 25), ""), ci(g, 52), ""));
    LLVMValueRef v = LLVMBuildFMul(B, LLVMBuildUIToFP(B, mant, g->f64, ""), scale, "");
    LLVMValueRef special = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntEQ, m, ci(g, 0), ""), cf(g, INFINITY), cf(g, NAN), "");
    v = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntEQ, e, ci(g, 31), ""), special, v, "");
    LLVMValueRef neg = LLVMBuildICmp(B, LLVMIntNE, LLVMBuildAnd(B, x, ci(g, 0x8000), ""), ci(g, 0), "");
    return LLVMBuildSelect(B, neg, LLVMBuildFNeg(B, v, ""), v, "");
}

/* A double already rounded to f16/bf16 to its 16-bit pattern (i16). */
static LLVMValueRef f_to_half(gen *g, tf_dt t, LLVMValueRef v)
{
    LLVMBuilderRef B = g->b;
    LLVMTypeRef i16 = LLVMInt16TypeInContext(g->cx);
    if (t == TF_DT_BF16) {   /* exact in f32: its upper half */
        LLVMTypeRef i32 = LLVMInt32TypeInContext(g->cx);
        LLVMValueRef w = LLVMBuildBitCast(B, LLVMBuildFPTrunc(B, v, LLVMFloatTypeInContext(g->cx), ""), i32, "");
        LLVMValueRef h = LLVMBuildTrunc(B, LLVMBuildLShr(B, w, LLVMConstInt(i32, 16, 0), ""), i16, "");
        /* a NaN stores as core.c stores it: 0x7fc0, whatever its sign and payload */
        return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, v, v, ""), LLVMConstInt(i16, 0x7FC0, 0), h, "");
    }
    if (host_f16c()) {   /* v is an f16 value: both narrowings are exact */
        LLVMValueRef f = LLVMBuildFPTrunc(B, LLVMBuildFPTrunc(B, v, LLVMFloatTypeInContext(g->cx), ""), LLVMHalfTypeInContext(g->cx), "");
        return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, v, v, ""), LLVMConstInt(i16, 0x7E00, 0), LLVMBuildBitCast(B, f, i16, ""), "");
    }
    LLVMValueRef bits = f_to_bits(g, v);
    LLVMValueRef sign = LLVMBuildAnd(B, LLVMBuildLShr(B, bits, ci(g, 48), ""), ci(g, 0x8000), "");
    LLVMValueRef a = callf(g, "llvm.fabs.f64", 1, v, NULL);
    LLVMValueRef sub = LLVMBuildFPToUI(B, LLVMBuildFMul(B, LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, a, cf(g, 0x1p-14), ""), a, cf(g, 0.0), ""),
                                                        cf(g, 0x1p24), ""), g->i64, "");
    LLVMValueRef ab = f_to_bits(g, a);
    LLVMValueRef e = LLVMBuildSub(B, LLVMBuildLShr(B, ab, ci(g, 52), ""), ci(g, 1023 - 15), "");
    LLVMValueRef m = LLVMBuildAnd(B, LLVMBuildLShr(B, ab, ci(g, 42), ""), ci(g, 1023), "");
    LLVMValueRef h = LLVMBuildOr(B, LLVMBuildShl(B, e, ci(g, 10), ""), m, "");
    h = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, a, cf(g, 0x1p-14), ""), sub, h, "");
    h = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOEQ, a, cf(g, INFINITY), ""), ci(g, 0x7C00), h, "");
    h = LLVMBuildOr(B, h, sign, "");
    /* a NaN stores as core.c stores it: 0x7e00, whatever its sign */
    h = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, v, v, ""), ci(g, 0x7E00), h, "");
    return LLVMBuildTrunc(B, h, i16, "");
}

/* tf_exp (ir/core.c) step for step, branch-free: the same bits, and a
 * loop that calls it vectorizes. */
static LLVMValueRef emit_exp(gen *g, LLVMValueRef x)
{
    LLVMBuilderRef B = g->b;
    LLVMValueRef xc = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, x, cf(g, 710.0), ""), cf(g, 710.0), x, "");
    xc = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, xc, cf(g, -746.0), ""), cf(g, -746.0), xc, "");
    LLVMValueRef n = callf(g, "llvm.nearbyint.f64", 1, LLVMBuildFMul(B, xc, cf(g, TF_EXP_LOG2E), ""), NULL);
    LLVMValueRef r = LLVMBuildFSub(B, LLVMBuildFSub(B, xc, LLVMBuildFMul(B, n, cf(g, TF_EXP_LN2_HI), ""), ""),
                                   LLVMBuildFMul(B, n, cf(g, TF_EXP_LN2_LO), ""), "");
    LLVMValueRef p = cf(g, tf_exp_coeffs[TF_EXP_DEGREE]);
    for (int i = TF_EXP_DEGREE - 1; i >= 0; i--) p = LLVMBuildFAdd(B, LLVMBuildFMul(B, p, r, ""), cf(g, tf_exp_coeffs[i]), "");
    /* k1 = k / 2 (toward zero), k2 = k - k1, as integral doubles; each to an
     * integer by the 1.5 * 2^52 trick (an add and a subtract of bit
     * patterns: AVX2 has no packed double-to-int64 conversion) */
    LLVMValueRef n1 = callf(g, "llvm.trunc.f64", 1, LLVMBuildFMul(B, n, cf(g, 0.5), ""), NULL), n2 = LLVMBuildFSub(B, n, n1, "");
    LLVMValueRef magic = cf(g, 0x1.8p52), mbits = f_to_bits(g, magic);
    LLVMValueRef k1 = LLVMBuildSub(B, f_to_bits(g, LLVMBuildFAdd(B, n1, magic, "")), mbits, "");
    LLVMValueRef k2 = LLVMBuildSub(B, f_to_bits(g, LLVMBuildFAdd(B, n2, magic, "")), mbits, "");
    LLVMValueRef s1 = bits_to_f(g, LLVMBuildShl(B, LLVMBuildAdd(B, k1, ci(g, 1023), ""), ci(g, 52), ""));
    LLVMValueRef s2 = bits_to_f(g, LLVMBuildShl(B, LLVMBuildAdd(B, k2, ci(g, 1023), ""), ci(g, 52), ""));
    LLVMValueRef v = LLVMBuildFMul(B, LLVMBuildFMul(B, p, s1, ""), s2, "");
    v = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, x, cf(g, TF_EXP_OVER), ""), cf(g, INFINITY), v, "");
    v = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, x, cf(g, TF_EXP_UNDER), ""), cf(g, 0.0), v, "");
    return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, x, x, ""), x, v, "");
}

static LLVMValueRef emit_expm1(gen *g, LLVMValueRef x)
{
    LLVMBuilderRef B = g->b;
    LLVMValueRef q = cf(g, tf_exp_coeffs[TF_EXP_DEGREE]);
    for (int i = TF_EXP_DEGREE - 1; i >= 1; i--) q = LLVMBuildFAdd(B, LLVMBuildFMul(B, q, x, ""), cf(g, tf_exp_coeffs[i]), "");
    q = LLVMBuildFMul(B, q, x, "");
    LLVMValueRef big = LLVMBuildFSub(B, emit_exp(g, x), cf(g, 1.0), "");
    LLVMValueRef small = LLVMBuildFCmp(B, LLVMRealOLT, callf(g, "llvm.fabs.f64", 1, x, NULL), cf(g, TF_EXPM1_SMALL), "");
    return LLVMBuildSelect(B, small, q, big, "");
}

static LLVMValueRef emit_tanh(gen *g, LLVMValueRef x)
{
    LLVMBuilderRef B = g->b;
    LLVMValueRef t = emit_expm1(g, LLVMBuildFMul(B, cf(g, -2.0), callf(g, "llvm.fabs.f64", 1, x, NULL), ""));
    LLVMValueRef v = LLVMBuildFDiv(B, LLVMBuildFNeg(B, t, ""), LLVMBuildFAdd(B, cf(g, 2.0), t, ""), "");
    return callf(g, "llvm.copysign.f64", 2, v, x);
}

/* tf_dtype_round in IR. */
static LLVMValueRef round_to(gen *g, tf_dt t, LLVMValueRef v)
{
    switch (t) {
    case TF_DT_F16: return round_ieee(g, v, 10, -14, 15);
    case TF_DT_BF16: return round_ieee(g, v, 7, -126, 127);
    case TF_DT_F32:
        return LLVMBuildFPExt(g->b, LLVMBuildFPTrunc(g->b, v, LLVMFloatTypeInContext(g->cx), ""), g->f64, "");
    case TF_DT_BOOL:
        return bool_to_f(g, LLVMBuildFCmp(g->b, LLVMRealUNE, v, cf(g, 0.0), ""));
    case TF_DT_I32:
    case TF_DT_I64: {
        double hi = t == TF_DT_I32 ? 2147483647.0 : 9.2e18, lo = t == TF_DT_I32 ? -2147483648.0 : -9.2e18;
        LLVMValueRef nan = LLVMBuildFCmp(g->b, LLVMRealUNO, v, v, "");
        LLVMValueRef tr = callf(g, "llvm.trunc.f64", 1, v, NULL);
        LLVMValueRef c = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOLT, tr, cf(g, lo), ""), cf(g, lo), tr, "");
        c = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOGT, tr, cf(g, hi), ""), cf(g, hi), c, "");
        return LLVMBuildSelect(g->b, nan, cf(g, 0.0), c, "");
    }
    default:
        return v;
    }
}

static LLVMValueRef offset_of(gen *g, const int64_t *strides)
{
    LLVMValueRef o = ci(g, 0);
    for (int a = 0; a < g->k->rank; a++) {
        if (!strides[a]) continue;
        LLVMValueRef i = LLVMBuildLoad2(g->b, g->i64, g->idx[a], "");
        o = LLVMBuildAdd(g->b, o, LLVMBuildMul(g->b, i, ci(g, strides[a]), ""), "");
    }
    return o;
}

static LLVMValueRef flat(gen *g, bool outer);

static LLVMValueRef expr(gen *g, int i);

/* Node j of the op's scalar expression (scalar.h), its operands' nodes in
 * vals already: float64 math, a boolean as 0.0 or 1.0. */
static LLVMValueRef lower_llvm(gen *g, const tf_kexpr *x, const tf_sexpr *se, const LLVMValueRef *vals, int j)
{
    const tf_snode *nd = &se->node[j];
    LLVMBuilderRef B = g->b;
    LLVMValueRef a = tf_sprim_arity(nd->prim) > 0 ? vals[nd->kid[0]] : NULL;
    LLVMValueRef b = tf_sprim_arity(nd->prim) > 1 ? vals[nd->kid[1]] : NULL;
    LLVMValueRef zero = cf(g, 0.0);
    switch (nd->prim) {
    case TF_S_ARG: return expr(g, x->args[nd->arg]);
    case TF_S_CONST: return cf(g, nd->value);
    case TF_S_NEG: return LLVMBuildFNeg(B, a, "");
    case TF_S_ADD: return LLVMBuildFAdd(B, a, b, "");
    case TF_S_SUB: return LLVMBuildFSub(B, a, b, "");
    case TF_S_MUL: return LLVMBuildFMul(B, a, b, "");
    case TF_S_DIV: return LLVMBuildFDiv(B, a, b, "");
    case TF_S_ABS: return callf(g, "llvm.fabs.f64", 1, a, NULL);
    case TF_S_EXP: return emit_exp(g, a);
    case TF_S_LOG: return callf(g, "llvm.log.f64", 1, a, NULL);
    case TF_S_SQRT: return callf(g, "llvm.sqrt.f64", 1, a, NULL);
    case TF_S_RSQRT: return LLVMBuildFDiv(B, cf(g, 1.0), callf(g, "llvm.sqrt.f64", 1, a, NULL), "");
    case TF_S_TANH: return emit_tanh(g, a);
    case TF_S_SIN: return callf(g, "llvm.sin.f64", 1, a, NULL);
    case TF_S_COS: return callf(g, "llvm.cos.f64", 1, a, NULL);
    case TF_S_ERF: return callf(g, "erf", 1, a, NULL);
    case TF_S_POW: return callf(g, "pow", 2, a, b);
    case TF_S_MAX:
    case TF_S_MIN: {   /* NaN if either is NaN, else a > b ? a : b (a < b for min) */
        LLVMValueRef c = LLVMBuildFCmp(B, nd->prim == TF_S_MAX ? LLVMRealOGT : LLVMRealOLT, a, b, "");
        LLVMValueRef m = LLVMBuildSelect(B, c, a, b, "");
        return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, a, b, ""), cf(g, NAN), m, "");
    }
    case TF_S_EQ: return bool_to_f(g, LLVMBuildFCmp(B, LLVMRealOEQ, a, b, ""));
    case TF_S_NE: return bool_to_f(g, LLVMBuildFCmp(B, LLVMRealUNE, a, b, ""));
    case TF_S_LT: return bool_to_f(g, LLVMBuildFCmp(B, LLVMRealOLT, a, b, ""));
    case TF_S_LE: return bool_to_f(g, LLVMBuildFCmp(B, LLVMRealOLE, a, b, ""));
    case TF_S_GT: return bool_to_f(g, LLVMBuildFCmp(B, LLVMRealOGT, a, b, ""));
    case TF_S_GE: return bool_to_f(g, LLVMBuildFCmp(B, LLVMRealOGE, a, b, ""));
    case TF_S_ISFINITE:
        return bool_to_f(g, LLVMBuildFCmp(B, LLVMRealONE, callf(g, "llvm.fabs.f64", 1, a, NULL), cf(g, INFINITY), ""));
    case TF_S_SELECT: return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNE, a, zero, ""), b, vals[nd->kid[2]], "");
    case TF_S_DROPOUT: {   /* the interpreter's counter-based draw, by a call into the runtime */
        LLVMTypeRef pt[3] = {LLVMTypeOf(g->rt), g->i64, g->i64};
        LLVMTypeRef ft = LLVMFunctionType(g->f64, pt, 3, 0);
        LLVMValueRef f = LLVMGetNamedFunction(g->mod, "tf_jit_dropout_uniform");
        if (!f) f = LLVMAddFunction(g->mod, "tf_jit_dropout_uniform", ft);
        LLVMValueRef args[3] = {g->rt, ci(g, tf_node_int(x->node, "salt")), flat(g, x->reduced_domain)};
        LLVMValueRef u = LLVMBuildCall2(B, ft, f, args, 3, "");
        double p = tf_node_float(x->node, "p");
        return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGE, u, cf(g, p), ""), cf(g, tf_dtype_round(x->dtype, 1.0 / (1.0 - p))),
                               zero, "");
    }
    default: return cf(g, NAN);   /* excluded by tf_jit_supports */
    }
}

static LLVMValueRef expr(gen *g, int i)
{
    if (g->memo[i]) return g->memo[i];
    const tf_kernel *k = g->k;
    const tf_kexpr *x = &k->exprs[i];
    LLVMValueRef v = NULL;
    switch (x->kind) {
    case TF_KX_LOAD: {
        tf_dt st = k->bufs[x->buf].value->type.dtype;
        LLVMTypeRef et = storage_type(g, st);
        LLVMValueRef off = LLVMBuildAdd(g->b, offset_of(g, x->strides), ci(g, x->offset), "");
        LLVMValueRef p = LLVMBuildGEP2(g->b, et, g->bufp[x->buf], &off, 1, "");
        LLVMValueRef e = LLVMBuildLoad2(g->b, et, p, "");
        switch (st) {
        case TF_DT_F32: v = LLVMBuildFPExt(g->b, e, g->f64, ""); break;
        case TF_DT_F64: v = e; break;
        case TF_DT_F16:
        case TF_DT_BF16: v = half_to_f(g, st, e); break;
        case TF_DT_BOOL: v = LLVMBuildUIToFP(g->b, e, g->f64, ""); break;
        default: v = LLVMBuildSIToFP(g->b, e, g->f64, ""); break;
        }
        break;
    }
    case TF_KX_CONST: v = cf(g, tf_dtype_round(x->dtype, x->value)); break;
    case TF_KX_REDUCED:
        if (g->colmode) {
            LLVMValueRef at = flat(g, true);
            v = LLVMBuildLoad2(g->b, g->f64, LLVMBuildGEP2(g->b, g->f64, g->colred[x->red], &at, 1, ""), "");
        } else {
            v = LLVMBuildLoad2(g->b, g->f64, g->red[x->red], "");
        }
        break;
    case TF_KX_INDEX: v = LLVMBuildSIToFP(g->b, LLVMBuildLoad2(g->b, g->i64, g->idx[x->axis], ""), g->f64, ""); break;
    case TF_KX_OP: {
        const tf_sexpr *se = tf_scalar_lowering(x->op, NULL);   /* tf_jit_supports checked it */
        LLVMValueRef vals[TF_SEXPR_MAX];
        for (int j = 0; j < se->n; j++) vals[j] = lower_llvm(g, x, se, vals, j);
        v = vals[se->n - 1];
        break;
    }
    }
    /* a 16-bit load in its own dtype is exact: rounding it is the identity */
    bool exact = x->kind == TF_KX_LOAD && (x->dtype == TF_DT_F16 || x->dtype == TF_DT_BF16) &&
                 k->bufs[x->buf].value->type.dtype == x->dtype;
    if (!exact) v = round_to(g, tf_kexpr_round(x), v);
    g->memo[i] = v;
    return v;
}

/* Row-major position of the current index (all axes, or the outer ones). */
static LLVMValueRef flat(gen *g, bool outer)
{
    LLVMValueRef f = ci(g, 0);
    for (int a = 0; a < g->k->rank; a++) {
        if (outer && ((g->k->reduce_mask >> a) & 1)) continue;
        f = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, f, ci(g, g->k->dims[a]), ""),
                         LLVMBuildLoad2(g->b, g->i64, g->idx[a], ""), "");
    }
    return f;
}

static void store(gen *g, const tf_kstore *s, bool outer)
{
    tf_dt st = g->k->bufs[s->buf].value->type.dtype;
    LLVMTypeRef et = storage_type(g, st);
    /* expr() rounds every value to tf_kexpr_round: one already rounded to
     * the storage dtype is not rounded again (LLVM does not see that
     * rounding is idempotent, and a 16-bit rounding is a dozen vector ops) */
    LLVMValueRef v = expr(g, s->expr), e;
    if (tf_kexpr_round(&g->k->exprs[s->expr]) != st) v = round_to(g, st, v);
    switch (st) {
    case TF_DT_F32: e = LLVMBuildFPTrunc(g->b, v, et, ""); break;
    case TF_DT_F64: e = v; break;
    case TF_DT_F16:
    case TF_DT_BF16: e = f_to_half(g, st, v); break;
    case TF_DT_BOOL: e = LLVMBuildFPToUI(g->b, v, et, ""); break;
    default: e = LLVMBuildFPToSI(g->b, v, et, ""); break;
    }
    LLVMValueRef off = flat(g, outer);
    LLVMBuildStore(g->b, e, LLVMBuildGEP2(g->b, et, g->bufp[s->buf], &off, 1, ""));
}

typedef void (*body_fn)(gen *g, void *arg);

/* Loops over the axes in `mask` (outermost first), body innermost. */
static void loop_nest(gen *g, unsigned mask, int from, body_fn body, void *arg)
{
    int a = from;
    while (a < g->k->rank && !((mask >> a) & 1)) a++;
    if (a >= g->k->rank) {
        memset(g->memo, 0, (size_t)g->k->nexprs * sizeof *g->memo);
        body(g, arg);
        memset(g->memo, 0, (size_t)g->k->nexprs * sizeof *g->memo);
        return;
    }
    LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(g->cx, g->fn, "head");
    LLVMBasicBlockRef bodyb = LLVMAppendBasicBlockInContext(g->cx, g->fn, "body");
    LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(g->cx, g->fn, "exit");
    bool ranged = a == g->split;   /* this thread's share of the split axis (only ever an outer axis) */
    LLVMBuildStore(g->b, ranged ? g->lo : ci(g, 0), g->idx[a]);
    LLVMBuildBr(g->b, head);
    LLVMPositionBuilderAtEnd(g->b, head);
    LLVMValueRef i = LLVMBuildLoad2(g->b, g->i64, g->idx[a], "");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, i, ranged ? g->hi : ci(g, g->k->dims[a]), ""), bodyb, exit);
    LLVMPositionBuilderAtEnd(g->b, bodyb);
    loop_nest(g, mask, a + 1, body, arg);
    LLVMValueRef i2 = LLVMBuildLoad2(g->b, g->i64, g->idx[a], "");
    LLVMBuildStore(g->b, LLVMBuildAdd(g->b, i2, ci(g, 1), ""), g->idx[a]);
    LLVMBuildBr(g->b, head);
    LLVMPositionBuilderAtEnd(g->b, exit);
}

static LLVMValueRef flat_mask(gen *g, unsigned mask);

static void full_stores(gen *g, void *arg)
{
    (void)arg;
    if (g->reuse >= 0) {   /* the last reduction's argument is still in the scratch row: read, not recompute */
        LLVMValueRef at = flat_mask(g, g->k->reduce_mask);
        g->memo[g->k->reds[g->reuse].arg] = LLVMBuildLoad2(g->b, g->f64, LLVMBuildGEP2(g->b, g->f64, g->tmp, &at, 1, ""), "");
    }
    /* every value of the element before any store: an update written in
     * place (memplan's home) stores into the buffer its kernel reads */
    for (int s = 0; s < g->k->nstores; s++)
        if (!g->k->stores[s].reduced_domain) expr(g, g->k->stores[s].expr);
    for (int s = 0; s < g->k->nstores; s++)
        if (!g->k->stores[s].reduced_domain) store(g, &g->k->stores[s], false);
}

/* ---- reductions: eight lanes (ir.h), as the reference adds ---------------- */

typedef struct accum { int r; } accum;

static bool is_max(const gen *g, int r) { return g->k->reds[r].op == TF_OP_REDUCE_MAX; }
static LLVMValueRef identity(gen *g, int r) { return cf(g, is_max(g, r) ? -INFINITY : 0.0); }

/* One step of a lane: acc + x, or tf_max_step(acc, x); scalars or vectors. */
static LLVMValueRef red_step(gen *g, int r, LLVMValueRef acc, LLVMValueRef x)
{
    LLVMBuilderRef B = g->b;
    if (!is_max(g, r)) return LLVMBuildFAdd(B, acc, x, "");
    LLVMValueRef take = LLVMBuildOr(B, LLVMBuildFCmp(B, LLVMRealUNO, x, x, ""), LLVMBuildFCmp(B, LLVMRealOGT, x, acc, ""), "");
    take = LLVMBuildAnd(B, LLVMBuildFCmp(B, LLVMRealORD, acc, acc, ""), take, "");
    return LLVMBuildSelect(B, take, x, acc, "");
}

/* ((l0 . l1) . (l2 . l3)) . ((l4 . l5) . (l6 . l7)), then mean's division
 * and the result dtype's rounding. */
static LLVMValueRef red_finish(gen *g, int r, LLVMValueRef *l)
{
    LLVMValueRef a = red_step(g, r, red_step(g, r, l[0], l[1]), red_step(g, r, l[2], l[3]));
    LLVMValueRef b = red_step(g, r, red_step(g, r, l[4], l[5]), red_step(g, r, l[6], l[7]));
    LLVMValueRef v = red_step(g, r, a, b);
    if (g->k->reds[r].op == TF_OP_REDUCE_MEAN) v = LLVMBuildFDiv(g->b, v, cf(g, g->k->reds[r].count), "");
    return round_to(g, tf_kreduce_round(&g->k->reds[r]), v);
}

/* Row-major position of the current index within the axes of mask. */
static LLVMValueRef flat_mask(gen *g, unsigned mask)
{
    LLVMValueRef f = ci(g, 0);
    for (int a = 0; a < g->k->rank; a++) {
        if (!((mask >> a) & 1)) continue;
        f = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, f, ci(g, g->k->dims[a]), ""), LLVMBuildLoad2(g->b, g->i64, g->idx[a], ""), "");
    }
    return f;
}

/* Long rows: the lanes in a small array, lane t % 8 by the reduced position. */
static void accumulate(gen *g, void *arg)
{
    accum *a = arg;
    LLVMValueRef x = expr(g, g->k->reds[a->r].arg);
    LLVMValueRef l = LLVMBuildAnd(g->b, flat_mask(g, g->k->reduce_mask), ci(g, TF_RED_LANES - 1), "");
    LLVMValueRef p = LLVMBuildGEP2(g->b, g->f64, g->lanes, &l, 1, "");
    LLVMBuildStore(g->b, red_step(g, a->r, LLVMBuildLoad2(g->b, g->f64, p, ""), x), p);
}

/* Rows up to 4096 elements: the reduced argument goes to a scratch row
 * first (a loop with no carried dependence, so exp and friends vectorize),
 * then the row, padded to a multiple of 8 with the identity, is added up
 * eight lanes at a time as one <8 x double> chain. */
static void store_tmp(gen *g, void *arg)
{
    accum *a = arg;
    LLVMValueRef x = expr(g, g->k->reds[a->r].arg);
    LLVMValueRef at = flat_mask(g, g->k->reduce_mask);
    LLVMBuildStore(g->b, x, LLVMBuildGEP2(g->b, g->f64, g->tmp, &at, 1, ""));
}

static void vacc_init(gen *g, int r)
{
    LLVMValueRef init[TF_RED_LANES];
    for (int l = 0; l < TF_RED_LANES; l++) init[l] = identity(g, r);
    LLVMBuildStore(g->b, LLVMConstVector(init, TF_RED_LANES), g->vacc);
}

static LLVMValueRef vacc_finish(gen *g, int r)
{
    LLVMTypeRef vt = LLVMVectorType(g->f64, TF_RED_LANES);
    LLVMValueRef acc = LLVMBuildLoad2(g->b, vt, g->vacc, ""), l[TF_RED_LANES];
    for (int k = 0; k < TF_RED_LANES; k++)
        l[k] = LLVMBuildExtractElement(g->b, acc, LLVMConstInt(LLVMInt32TypeInContext(g->cx), (unsigned)k, 0), "");
    return red_finish(g, r, l);
}

/* vacc = step(vacc, tmp[8b .. 8b+7]) for b in [0, nb). */
static void vacc_add_tmp(gen *g, int r, int64_t nb)
{
    LLVMBuilderRef B = g->b;
    LLVMTypeRef vt = LLVMVectorType(g->f64, TF_RED_LANES);
    LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(g->cx, g->fn, "lhead");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(g->cx, g->fn, "lbody");
    LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(g->cx, g->fn, "lexit");
    (void)r;
    LLVMBuildStore(B, ci(g, 0), g->tidx);
    LLVMBuildBr(B, head);
    LLVMPositionBuilderAtEnd(B, head);
    LLVMValueRef i = LLVMBuildLoad2(B, g->i64, g->tidx, "");
    LLVMBuildCondBr(B, LLVMBuildICmp(B, LLVMIntSLT, i, ci(g, nb), ""), body, exit);
    LLVMPositionBuilderAtEnd(B, body);
    LLVMValueRef off = LLVMBuildMul(B, i, ci(g, TF_RED_LANES), "");
    LLVMValueRef vp = LLVMBuildBitCast(B, LLVMBuildGEP2(B, g->f64, g->tmp, &off, 1, ""), LLVMPointerType(vt, 0), "");
    LLVMValueRef v = LLVMBuildLoad2(B, vt, vp, "");
    LLVMSetAlignment(v, 8);
    LLVMBuildStore(B, red_step(g, r, LLVMBuildLoad2(B, vt, g->vacc, ""), v), g->vacc);
    LLVMBuildStore(B, LLVMBuildAdd(B, i, ci(g, 1), ""), g->tidx);
    LLVMBuildBr(B, head);
    LLVMPositionBuilderAtEnd(B, exit);
}

static LLVMValueRef sum_tmp(gen *g, int r)
{
    int64_t nb = (g->ntmp + TF_RED_LANES - 1) / TF_RED_LANES;
    for (int64_t t = g->ntmp; t < nb * TF_RED_LANES; t++) {
        LLVMValueRef at = ci(g, t);
        LLVMBuildStore(g->b, identity(g, r), LLVMBuildGEP2(g->b, g->f64, g->tmp, &at, 1, ""));
    }
    vacc_init(g, r);
    vacc_add_tmp(g, r, nb);
    return vacc_finish(g, r);
}

/* Long reductions in blocks: the innermost reduced axes (g->blk_mask, a
 * multiple of 8 elements) go through the scratch row, block after block,
 * into one running <8 x double>; lane t % 8 is the same lane in every block. */
static void store_tmp_block(gen *g, void *arg)
{
    accum *a = arg;
    LLVMValueRef x = expr(g, g->k->reds[a->r].arg);
    LLVMValueRef at = flat_mask(g, g->blk_mask);
    LLVMBuildStore(g->b, x, LLVMBuildGEP2(g->b, g->f64, g->tmp, &at, 1, ""));
}

static void block_body(gen *g, void *arg)
{
    accum *a = arg;
    loop_nest(g, g->blk_mask, 0, store_tmp_block, a);
    vacc_add_tmp(g, a->r, g->ntmp / TF_RED_LANES);
}

/* Column mode: per outer index (column) eight lanes, colacc[lane][column]. */
static void accumulate_col(gen *g, void *arg)
{
    accum *a = arg;
    LLVMValueRef x = expr(g, g->k->reds[a->r].arg);
    LLVMValueRef l = LLVMBuildAnd(g->b, flat_mask(g, g->k->reduce_mask), ci(g, TF_RED_LANES - 1), "");
    LLVMValueRef at = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, l, ci(g, g->ncols), ""), flat(g, true), "");
    LLVMValueRef p = LLVMBuildGEP2(g->b, g->f64, g->colacc, &at, 1, "");
    LLVMBuildStore(g->b, red_step(g, a->r, LLVMBuildLoad2(g->b, g->f64, p, ""), x), p);
}

static void col_zero(gen *g, void *arg)
{
    int r = *(int *)arg;
    LLVMValueRef col = flat(g, true);
    for (int l = 0; l < TF_RED_LANES; l++) {
        LLVMValueRef at = LLVMBuildAdd(g->b, col, ci(g, l * g->ncols), "");
        LLVMBuildStore(g->b, identity(g, r), LLVMBuildGEP2(g->b, g->f64, g->colacc, &at, 1, ""));
    }
}

static void col_finish(gen *g, void *arg)
{
    int r = *(int *)arg;
    LLVMValueRef col = flat(g, true), l[TF_RED_LANES];
    for (int k = 0; k < TF_RED_LANES; k++) {
        LLVMValueRef at = LLVMBuildAdd(g->b, col, ci(g, k * g->ncols), "");
        l[k] = LLVMBuildLoad2(g->b, g->f64, LLVMBuildGEP2(g->b, g->f64, g->colacc, &at, 1, ""), "");
    }
    LLVMBuildStore(g->b, red_finish(g, r, l), LLVMBuildGEP2(g->b, g->f64, g->colred[r], &col, 1, ""));
}

static void col_outer_stores(gen *g, void *arg)
{
    (void)arg;
    const tf_kernel *k = g->k;
    for (int a = 0; a < k->rank; a++)
        if ((k->reduce_mask >> a) & 1) LLVMBuildStore(g->b, ci(g, 0), g->idx[a]);
    for (int s = 0; s < k->nstores; s++)
        if (k->stores[s].reduced_domain) store(g, &k->stores[s], true);
}

/* A reduction whose reduced axes all come before its outer ones (bias
 * gradients, batchnorm statistics: sums down columns) walks memory row by
 * row with eight running lanes per column, instead of down each column;
 * each lane still takes its rows in increasing order, so the bits are the
 * reference's. Columns: up to 4096 (the lanes live on the stack). */
static bool column_reduction(const tf_kernel *k)
{
    if (k->kind != TF_K_REDUCTION || !k->reduce_mask || !k->rank || ((k->reduce_mask >> (k->rank - 1)) & 1)) return false;
    int64_t outer = 1;
    bool seen_outer = false;
    for (int a = 0; a < k->rank; a++) {
        bool red = (k->reduce_mask >> a) & 1;
        if (red && seen_outer) return false;
        seen_outer |= !red;
        if (!red) outer *= k->dims[a];
    }
    return outer <= 4096;
}

static void column_body(gen *g)
{
    const tf_kernel *k = g->k;
    unsigned all = (1u << k->rank) - 1, outer = all & ~k->reduce_mask;
    for (int r = 0; r < k->nreds; r++) {
        accum acc = {r};
        loop_nest(g, outer, 0, col_zero, &r);
        loop_nest(g, all, 0, accumulate_col, &acc);
        loop_nest(g, outer, 0, col_finish, &r);
    }
    loop_nest(g, outer, 0, col_outer_stores, NULL);
    loop_nest(g, all, 0, full_stores, NULL);
}

static void outer_step(gen *g, void *arg)
{
    (void)arg;
    const tf_kernel *k = g->k;
    for (int a = 0; a < k->rank; a++)
        if ((k->reduce_mask >> a) & 1) LLVMBuildStore(g->b, ci(g, 0), g->idx[a]);
    for (int r = 0; r < k->nreds; r++) LLVMBuildStore(g->b, cf(g, NAN), g->red[r]);
    for (int r = 0; r < k->nreds; r++) {
        accum acc = {r};
        LLVMValueRef v;
        if (g->tmp && g->blk_mask) {
            vacc_init(g, r);
            loop_nest(g, k->reduce_mask & ~g->blk_mask, 0, block_body, &acc);
            v = vacc_finish(g, r);
        } else if (g->tmp) {
            loop_nest(g, k->reduce_mask, 0, store_tmp, &acc);
            v = sum_tmp(g, r);
        } else {
            for (int l = 0; l < TF_RED_LANES; l++) {
                LLVMValueRef at = ci(g, l);
                LLVMBuildStore(g->b, identity(g, r), LLVMBuildGEP2(g->b, g->f64, g->lanes, &at, 1, ""));
            }
            loop_nest(g, k->reduce_mask, 0, accumulate, &acc);
            LLVMValueRef l[TF_RED_LANES];
            for (int q = 0; q < TF_RED_LANES; q++) {
                LLVMValueRef at = ci(g, q);
                l[q] = LLVMBuildLoad2(g->b, g->f64, LLVMBuildGEP2(g->b, g->f64, g->lanes, &at, 1, ""), "");
            }
            v = red_finish(g, r, l);
        }
        LLVMBuildStore(g->b, v, g->red[r]);
    }
    /* outer stores at inner index 0 (irrelevant to them) */
    for (int a = 0; a < k->rank; a++)
        if ((k->reduce_mask >> a) & 1) LLVMBuildStore(g->b, ci(g, 0), g->idx[a]);
    memset(g->memo, 0, (size_t)k->nexprs * sizeof *g->memo);
    for (int s = 0; s < k->nstores; s++)
        if (k->stores[s].reduced_domain) store(g, &k->stores[s], true);
    memset(g->memo, 0, (size_t)k->nexprs * sizeof *g->memo);
    g->reuse = g->tmp && !g->blk_mask && k->nreds ? k->nreds - 1 : -1;
    loop_nest(g, k->reduce_mask, 0, full_stores, NULL);
    g->reuse = -1;
}

/* Build the kernel's function into a new module of cx. */
static LLVMModuleRef build_module(LLVMContextRef cx, const tf_kernel *k, const char *fname)
{
    gen g = {.k = k, .cx = cx, .reuse = -1};
    g.mod = LLVMModuleCreateWithNameInContext(k->name, cx);
    g.b = LLVMCreateBuilderInContext(cx);
    g.f64 = LLVMDoubleTypeInContext(cx);
    g.i64 = LLVMInt64TypeInContext(cx);
    g.i1 = LLVMInt1TypeInContext(cx);
    LLVMTypeRef i8p = LLVMPointerType(LLVMInt8TypeInContext(cx), 0);
    LLVMTypeRef argt[4] = {LLVMPointerType(i8p, 0), g.i64, g.i64, LLVMPointerType(g.i64, 0)};
    LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(cx), argt, 4, 0);
    LLVMValueRef outer_fn = LLVMAddFunction(g.mod, fname, ft);
    /* The body takes one typed pointer per buffer, `noalias` where the
     * buffer's memory is disjoint from every other's (tf_kbuf.disjoint): the
     * outer function unpacks bufs and calls it, and once it is inlined the
     * vectorizer needs no runtime overlap checks for those. */
    int nb = k->nbufs;
    LLVMTypeRef *bt = tf_calloc((size_t)nb + 3, sizeof *bt);
    g.bufp = tf_calloc((size_t)k->nbufs + 1, sizeof *g.bufp);
    g.red = tf_calloc((size_t)k->nreds + 1, sizeof *g.red);
    g.memo = tf_calloc((size_t)k->nexprs + 1, sizeof *g.memo);
    LLVMValueRef *callargs = tf_calloc((size_t)nb + 3, sizeof *callargs);
    if (!bt || !callargs || !g.bufp || !g.red || !g.memo) {
        tf_free(bt); tf_free(callargs);
        tf_free(g.bufp); tf_free(g.red); tf_free(g.memo);
        LLVMDisposeBuilder(g.b);
        LLVMDisposeModule(g.mod);
        return NULL;
    }
    for (int bi = 0; bi < nb; bi++) bt[bi] = LLVMPointerType(storage_type(&g, k->bufs[bi].value->type.dtype), 0);
    bt[nb] = g.i64, bt[nb + 1] = g.i64, bt[nb + 2] = LLVMPointerType(g.i64, 0);
    LLVMTypeRef bodyt = LLVMFunctionType(LLVMVoidTypeInContext(cx), bt, (unsigned)nb + 3, 0);
    char bname[160];
    snprintf(bname, sizeof bname, "%s.body", fname);
    g.fn = LLVMAddFunction(g.mod, bname, bodyt);
    LLVMSetLinkage(g.fn, LLVMInternalLinkage);
    LLVMAddAttributeAtIndex(g.fn, LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(cx, LLVMGetEnumAttributeKindForName("alwaysinline", 12), 0));
    unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
    for (int bi = 0; bi < nb; bi++) {
        if (k->bufs[bi].disjoint) LLVMAddAttributeAtIndex(g.fn, (unsigned)bi + 1, LLVMCreateEnumAttribute(cx, noalias, 0));
        g.bufp[bi] = LLVMGetParam(g.fn, (unsigned)bi);
        const char *nm = k->bufs[bi].value->name ? k->bufs[bi].value->name : "";
        LLVMSetValueName2(g.bufp[bi], nm, strlen(nm));
    }
    g.lo = LLVMGetParam(g.fn, (unsigned)nb);
    g.hi = LLVMGetParam(g.fn, (unsigned)nb + 1);
    g.rt = LLVMGetParam(g.fn, (unsigned)nb + 2);
    LLVMSetValueName2(g.lo, "lo", 2);
    LLVMSetValueName2(g.hi, "hi", 2);
    LLVMSetValueName2(g.rt, "rt", 2);
    /* the outer function: unpack and call */
    LLVMPositionBuilderAtEnd(g.b, LLVMAppendBasicBlockInContext(cx, outer_fn, "entry"));
    LLVMValueRef bufs = LLVMGetParam(outer_fn, 0);
    LLVMSetValueName2(bufs, "bufs", 4);
    for (int bi = 0; bi < nb; bi++) {
        LLVMValueRef ix = ci(&g, bi);
        LLVMValueRef p = LLVMBuildLoad2(g.b, i8p, LLVMBuildGEP2(g.b, i8p, bufs, &ix, 1, ""), "");
        callargs[bi] = LLVMBuildBitCast(g.b, p, bt[bi], "");
    }
    for (int a = 1; a < 4; a++) callargs[nb + a - 1] = LLVMGetParam(outer_fn, (unsigned)a);
    LLVMBuildCall2(g.b, bodyt, g.fn, callargs, (unsigned)nb + 3, "");
    LLVMBuildRetVoid(g.b);
    tf_free(bt);
    tf_free(callargs);
    g.split = tf_kernel_split_axis(k);
    g.top = 0;
    for (int a = 0; a < k->rank; a++)
        if (k->kind != TF_K_REDUCTION || !((k->reduce_mask >> a) & 1)) g.top |= 1u << a;
    LLVMPositionBuilderAtEnd(g.b, LLVMAppendBasicBlockInContext(cx, g.fn, "entry"));
    for (int a = 0; a < k->rank; a++) g.idx[a] = LLVMBuildAlloca(g.b, g.i64, "i");
    for (int r = 0; r < k->nreds; r++) g.red[r] = LLVMBuildAlloca(g.b, g.f64, "red");
    g.lanes = LLVMBuildArrayAlloca(g.b, g.f64, ci(&g, TF_RED_LANES), "lanes");
    g.vacc = LLVMBuildAlloca(g.b, LLVMVectorType(g.f64, TF_RED_LANES), "vacc");
    g.colmode = column_reduction(k);
    if (g.colmode) {
        g.ncols = 1;
        for (int a = 0; a < k->rank; a++)
            if (!((k->reduce_mask >> a) & 1)) g.ncols *= k->dims[a];
        g.colred = tf_calloc((size_t)k->nreds + 1, sizeof *g.colred);
        g.colacc = LLVMBuildArrayAlloca(g.b, g.f64, ci(&g, TF_RED_LANES * g.ncols), "colacc");
        for (int r = 0; g.colred && r < k->nreds; r++) g.colred[r] = LLVMBuildArrayAlloca(g.b, g.f64, ci(&g, g.ncols), "colred");
    }
    if (g.colmode && !g.colred) g.colmode = false;   /* out of memory: the plain loops */
    if (!g.colmode && k->kind == TF_K_REDUCTION) {   /* rows up to 4096 elements: the two-loop form */
        g.ntmp = 1;
        for (int a = 0; a < k->rank; a++)
            if ((k->reduce_mask >> a) & 1) g.ntmp *= k->dims[a];
        if (g.ntmp > 4096) {   /* blocks: the innermost reduced axes, up to 4096 elements, a multiple of 8 */
            int64_t b = 1;
            unsigned mask = 0;
            for (int a = k->rank - 1; a >= 0; a--) {
                if (!((k->reduce_mask >> a) & 1)) continue;
                if (b * k->dims[a] > 4096) break;
                b *= k->dims[a];
                mask |= 1u << a;
            }
            if (b % TF_RED_LANES == 0 && mask) {
                g.blk_mask = mask;
                g.ntmp = b;
            }
        }
        if (g.ntmp <= 4096) {
            g.tmp = LLVMBuildArrayAlloca(g.b, g.f64, ci(&g, (g.ntmp + TF_RED_LANES - 1) / TF_RED_LANES * TF_RED_LANES), "row");
            g.tidx = LLVMBuildAlloca(g.b, g.i64, "t");
        }
    }
    if (g.colmode) {
        column_body(&g);
    } else if (k->kind == TF_K_REDUCTION) {
        unsigned outer = 0;
        for (int a = 0; a < k->rank; a++)
            if (!((k->reduce_mask >> a) & 1)) outer |= 1u << a;
        loop_nest(&g, outer, 0, outer_step, NULL);
    } else {
        unsigned all = k->rank ? (1u << k->rank) - 1 : 0;
        loop_nest(&g, all, 0, full_stores, NULL);
    }
    LLVMBuildRetVoid(g.b);
    tf_free(g.colred);
    tf_free(g.bufp);
    tf_free(g.red);
    tf_free(g.memo);
    LLVMDisposeBuilder(g.b);
    return g.mod;
}

/* ---- target, optimization, JIT ------------------------------------------ */

static void init_native_once(void)
{
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
}

/* Once per process, whichever thread compiles first. */
static void init_native(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_native_once);
}

static LLVMTargetMachineRef host_tm(char *err, size_t n)
{
    char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
    char *msg = NULL;
    LLVMTargetRef t;
    LLVMTargetMachineRef tm = NULL;
    if (LLVMGetTargetFromTriple(triple, &t, &msg)) {
        snprintf(err, n, "no LLVM target for %s: %s", triple, msg ? msg : "?");
    } else {
        tm = LLVMCreateTargetMachine(t, triple, cpu, feat, LLVMCodeGenLevelDefault, LLVMRelocDefault, LLVMCodeModelJITDefault);
        if (!tm) snprintf(err, n, "cannot create an LLVM target machine for %s", triple);
    }
    if (msg) LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(feat);
    return tm;
}

/* The optimization pipeline: what default<O2> does that matters for our
 * kernels (inline the body, promote the index and accumulator slots,
 * simplify, rotate loops, hoist invariants — the reduced-domain expressions
 * and buffer pointers — canonicalize induction variables, vectorize), at
 * about a third of O2's compile time and with the same kernel speed on the
 * benchmark models. tf_compile_options.llvm_pipeline (--llvm-pipeline;
 * default $TFUSE_LLVM_PIPELINE) overrides it (e.g. "default<O3>"), for
 * experiments. */
static const char pipeline[] =
    "always-inline,function(sroa,early-cse,instcombine,simplifycfg,loop(loop-rotate),loop-mssa(licm),indvars,"
    "loop-vectorize,instcombine,simplifycfg)";
/* The same without the vectorizer, for kernels over at most SMALL_KERNEL
 * elements: their loops run in a microsecond either way, and vectorizing
 * is about a quarter of a kernel's compile time (the optimizer's chains of
 * bias and LayerNorm params, with dozens of expressions over a few hundred
 * elements, are among the slowest to compile). The vectorizer keeps every
 * result's bits (no fast-math), so this changes speed only. */
static const char pipeline_small[] =
    "always-inline,function(sroa,early-cse,instcombine,simplifycfg,loop(loop-rotate),loop-mssa(licm),indvars,"
    "instcombine,simplifycfg)";
enum { SMALL_KERNEL = 4096 };

static bool small_kernel(const tf_kernel *k)
{
    int64_t n = 1;
    for (int a = 0; a < k->rank; a++) n *= k->dims[a];
    return n <= SMALL_KERNEL;
}

/* Verify and optimize k's module; 0 on success, else the message in err. */
static int finish_module(LLVMModuleRef mod, const tf_kernel *k, LLVMTargetMachineRef tm, const char *pipe, char *err, size_t n)
{
    char *msg = NULL;
    if (LLVMVerifyModule(mod, LLVMReturnStatusAction, &msg)) {
        snprintf(err, n, "generated LLVM IR does not verify: %s", msg ? msg : "?");
        LLVMDisposeMessage(msg);
        return 1;
    }
    if (msg) LLVMDisposeMessage(msg);
    if (tm) {
        char *triple = LLVMGetTargetMachineTriple(tm);
        LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
        LLVMSetTarget(mod, triple);
        LLVMSetModuleDataLayout(mod, td);
        LLVMDisposeTargetData(td);
        LLVMDisposeMessage(triple);
    }
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    /* Loops are vectorized but not unrolled: with every trip count a
     * constant, full unrolling multiplies the code (and the compile time)
     * for no gain on loops already vectorized; SLP finds nothing our loops
     * do not give the loop vectorizer. */
    bool small = !pipe && small_kernel(k);
    LLVMPassBuilderOptionsSetLoopVectorization(po, !small);
    LLVMPassBuilderOptionsSetLoopUnrolling(po, 0);
    LLVMPassBuilderOptionsSetSLPVectorization(po, 0);
    LLVMErrorRef e = LLVMRunPasses(mod, pipe ? pipe : small ? pipeline_small : pipeline, tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
        char *m = LLVMGetErrorMessage(e);
        snprintf(err, n, "LLVM optimization failed: %s", m);
        LLVMDisposeErrorMessage(m);
        return 1;
    }
    return 0;
}

/* LLVM failing is an error, never a reason to run a kernel elsewhere:
 * TF_IR_ERR_RUNTIME is kept for "this kernel is not supported" (the
 * runtime runs those through the reference and counts them). */
static tf_ir_status llvm_error(tf_diag *d, LLVMErrorRef e, const char *what)
{
    char *m = LLVMGetErrorMessage(e);
    tf_ir_status st = tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "%s: %s", what, m);
    LLVMDisposeErrorMessage(m);
    return st;
}

/* What generated code calls in the runtime (kernel.h): the dropout draw. */
static LLVMErrorRef define_runtime_symbols(tf_jit *j)
{
    union { void *p; LLVMOrcExecutorAddress a; } u;
    memset(&u, 0, sizeof u);
    u.p = tf_kernel_runtime_symbol("tf_jit_dropout_uniform", NULL);
    LLVMJITCSymbolMapPair sym = {
        .Name = LLVMOrcLLJITMangleAndIntern(j->jit, "tf_jit_dropout_uniform"),
        .Sym = {.Address = u.a, .Flags = {LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable, 0}},
    };
    return LLVMOrcJITDylibDefine(LLVMOrcLLJITGetMainJITDylib(j->jit), LLVMOrcAbsoluteSymbols(&sym, 1));
}

tf_ir_status tf_jit_create(tf_jit **out, tf_diag *d)
{
    *out = NULL;
    init_native();
    tf_jit *j = tf_calloc(1, sizeof *j);
    if (!j) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    char err[512];
    if (!(j->tm = host_tm(err, sizeof err))) {
        tf_free(j);
        return tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "%s", err);
    }
    /* the JIT's own target machine: the host's CPU and features */
    LLVMOrcLLJITBuilderRef jb = LLVMOrcCreateLLJITBuilder();
    LLVMTargetMachineRef jtm = host_tm(err, sizeof err);
    if (jtm) LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(jb, LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(jtm));
    LLVMErrorRef e = LLVMOrcCreateLLJIT(&j->jit, jb);
    if (e) {
        LLVMDisposeTargetMachine(j->tm);
        tf_free(j);
        return llvm_error(d, e, "cannot create the LLVM JIT");
    }
    LLVMOrcDefinitionGeneratorRef gen = NULL;
    e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(j->jit), NULL, NULL);
    if (e) {
        tf_jit_free(j);
        return llvm_error(d, e, "cannot resolve symbols from the process");
    }
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j->jit), gen);
    if ((e = define_runtime_symbols(j))) {
        tf_jit_free(j);
        return llvm_error(d, e, "cannot define the runtime's symbols");
    }
    *out = j;
    return TF_IR_OK;
}

void tf_jit_free(tf_jit *j)
{
    if (!j) return;
    if (j->jit) {
        LLVMErrorRef e = LLVMOrcDisposeLLJIT(j->jit);
        if (e) LLVMConsumeError(e);
    }
    if (j->tm) LLVMDisposeTargetMachine(j->tm);
    tf_free(j->pipeline);
    for (int i = 0; i < j->nnames; i++) tf_free(j->names[i]);
    tf_free(j->names);
    tf_free(j);
}

/* k->name, or k->name.N when this JIT already has a function of that name. */
static char *unique_name(tf_jit *j, const char *base)
{
    char buf[96];
    snprintf(buf, sizeof buf, "%s", base);
    for (int n = 1;; n++) {
        bool used = false;
        for (int i = 0; i < j->nnames && !used; i++) used = strcmp(j->names[i], buf) == 0;
        if (!used) break;
        snprintf(buf, sizeof buf, "%s.%d", base, n);
    }
    if (j->nnames == j->cap) {
        int cap = j->cap ? 2 * j->cap : 16;
        char **p = tf_realloc(j->names, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        j->names = p;
        j->cap = cap;
    }
    char *s = tf_strdup(buf);
    if (s) j->names[j->nnames++] = s;
    return s;
}

/* Forget a function name (its code was removed). */
static void forget_name(tf_jit *j, const char *name)
{
    for (int i = 0; i < j->nnames; i++)
        if (strcmp(j->names[i], name) == 0) {
            tf_free(j->names[i]);
            j->names[i] = j->names[--j->nnames];
            return;
        }
}

struct tf_jit_code {
    LLVMOrcResourceTrackerRef rt;   /* the module's code and memory in the JIT */
    char name[96];
};

tf_ir_status tf_jit_release(tf_jit *j, tf_jit_code *c, tf_diag *d)
{
    if (!c) return TF_IR_OK;
    LLVMErrorRef e = LLVMOrcResourceTrackerRemove(c->rt);
    LLVMOrcReleaseResourceTracker(c->rt);
    forget_name(j, c->name);
    tf_free(c);
    return e ? llvm_error(d, e, "llvm: cannot free a kernel's code") : TF_IR_OK;
}

/* c's function, just added to the JIT: its address into *fn (the JIT
 * compiles or links it now), c into *code; on failure c is released and
 * the message starts with what. */
static tf_ir_status look_up(tf_jit *j, tf_jit_code *c, const char *what, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d)
{
    LLVMOrcExecutorAddress addr = 0;
    LLVMErrorRef e = LLVMOrcLLJITLookup(j->jit, &addr, c->name);
    if (e) {
        tf_ir_status st = llvm_error(d, e, what);
        tf_jit_release(j, c, d);
        return st;
    }
    union { LLVMOrcExecutorAddress a; tf_kernel_fn f; } u;
    memset(&u, 0, sizeof u);
    u.a = addr;
    *fn = u.f;
    *code = c;
    return TF_IR_OK;
}

tf_ir_status tf_jit_compile(tf_jit *j, const tf_kernel *k, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d)
{
    *fn = NULL;
    *code = NULL;
    char why[512];
    if (!tf_jit_supports(k, why, sizeof why)) return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "llvm: %s", why);
    const char *name = unique_name(j, k->name);
    if (!name) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMModuleRef mod = build_module(LLVMOrcThreadSafeContextGetContext(tsc), k, name);
    if (!mod) {
        LLVMOrcDisposeThreadSafeContext(tsc);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    if (finish_module(mod, k, j->tm, j->pipeline, why, sizeof why)) {
        LLVMDisposeModule(mod);
        LLVMOrcDisposeThreadSafeContext(tsc);
        return tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "llvm: kernel %s: %s", k->name, why);
    }
    LLVMSetTarget(mod, LLVMOrcLLJITGetTripleString(j->jit));
    LLVMSetDataLayout(mod, LLVMOrcLLJITGetDataLayoutStr(j->jit));
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(mod, tsc);
    LLVMOrcDisposeThreadSafeContext(tsc);   /* the module keeps its context alive */
    tf_jit_code *c = tf_calloc(1, sizeof *c);
    if (!c) {
        LLVMOrcDisposeThreadSafeModule(tsm);
        forget_name(j, name);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    snprintf(c->name, sizeof c->name, "%s", name);
    c->rt = LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(j->jit));
    LLVMErrorRef e = LLVMOrcLLJITAddLLVMIRModuleWithRT(j->jit, c->rt, tsm);
    if (e) {
        LLVMOrcDisposeThreadSafeModule(tsm);
        LLVMOrcReleaseResourceTracker(c->rt);
        forget_name(j, c->name);
        tf_free(c);
        return llvm_error(d, e, "llvm: cannot add the kernel's module");
    }
    return look_up(j, c, "llvm: cannot compile the kernel", fn, code, d);
}

char *tf_jit_target_id(tf_jit *j)
{
    char *triple = LLVMGetTargetMachineTriple(j->tm), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
    size_t n = strlen(triple) + strlen(cpu) + strlen(feat) + 96;
    char *id = tf_malloc(n);
    if (id) snprintf(id, n, "llvm %s\ntriple %s\ncpu %s\nfeatures %s", LLVM_VERSION_STRING, triple, cpu, feat);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(feat);
    return id;
}

/* An object file into the JIT under a resource tracker of its own, and sym's address. Takes buf. */
static tf_ir_status add_object(tf_jit *j, const char *sym, LLVMMemoryBufferRef buf, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d)
{
    tf_jit_code *c = tf_calloc(1, sizeof *c);
    const char *name = c ? unique_name(j, sym) : NULL;
    if (!name || strcmp(name, sym) != 0) {   /* the object defines sym: no other code of this JIT may */
        if (name) forget_name(j, name);
        tf_free(c);
        LLVMDisposeMemoryBuffer(buf);
        return name ? tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "llvm: the JIT already has a function %s", sym)
                    : tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    snprintf(c->name, sizeof c->name, "%s", sym);
    c->rt = LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(j->jit));
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFileWithRT(j->jit, c->rt, buf);
    if (e) {
        LLVMOrcReleaseResourceTracker(c->rt);
        forget_name(j, c->name);
        tf_free(c);
        return llvm_error(d, e, "llvm: cannot add the kernel's object code");
    }
    return look_up(j, c, "llvm: cannot link the kernel's object code", fn, code, d);
}

/* k's object code, its function named sym, made with tm and pipeline pipe
 * into *obj (malloc'd, *obj_n bytes); touches no tf_jit. */
static tf_ir_status emit_object(const tf_kernel *k, const char *sym, LLVMTargetMachineRef tm, const char *pipe, void **obj, size_t *obj_n,
                                tf_diag *d)
{
    *obj = NULL;
    *obj_n = 0;
    char why[512];
    if (!tf_jit_supports(k, why, sizeof why)) return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "llvm: %s", why);
    LLVMContextRef cx = LLVMContextCreate();
    LLVMModuleRef mod = build_module(cx, k, sym);
    if (!mod) {
        LLVMContextDispose(cx);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    tf_ir_status st = TF_IR_OK;
    LLVMMemoryBufferRef buf = NULL;
    char *msg = NULL;
    if (finish_module(mod, k, tm, pipe, why, sizeof why))
        st = tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "llvm: kernel %s: %s", k->name, why);
    else if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMObjectFile, &msg, &buf))
        st = tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "llvm: kernel %s: emitting object code: %s", k->name, msg ? msg : "?");
    if (msg) LLVMDisposeMessage(msg);
    LLVMDisposeModule(mod);
    LLVMContextDispose(cx);
    if (st) return st;
    size_t n = LLVMGetBufferSize(buf);
    if ((*obj = tf_malloc(n ? n : 1))) {
        memcpy(*obj, LLVMGetBufferStart(buf), n);
        *obj_n = n;
    }
    LLVMDisposeMemoryBuffer(buf);
    return *obj ? TF_IR_OK : tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
}

tf_ir_status tf_jit_compile_object(tf_jit *j, const tf_kernel *k, const char *sym, tf_kernel_fn *fn, tf_jit_code **code, void **obj,
                                   size_t *obj_n, tf_diag *d)
{
    *fn = NULL;
    *code = NULL;
    tf_ir_status st = emit_object(k, sym, j->tm, j->pipeline, obj, obj_n, d);
    if (!st && (st = tf_jit_load_object(j, sym, *obj, *obj_n, fn, code, d))) {
        tf_free(*obj);
        *obj = NULL;
        *obj_n = 0;
    }
    return st;
}

tf_ir_status tf_jit_object(const tf_kernel *k, const char *sym, const char *pipe, void **obj, size_t *obj_n, tf_diag *d)
{
    *obj = NULL;
    *obj_n = 0;
    init_native();
    char err[512];
    LLVMTargetMachineRef tm = host_tm(err, sizeof err);   /* one per call: a target machine is not for two threads at once */
    if (!tm) return tf_diag_error(d, TF_IR_ERR_INTERNAL, NULL, "%s", err);
    tf_ir_status st = emit_object(k, sym, tm, pipe, obj, obj_n, d);
    LLVMDisposeTargetMachine(tm);
    return st;
}

tf_ir_status tf_jit_load_object(tf_jit *j, const char *sym, const void *obj, size_t n, tf_kernel_fn *fn, tf_jit_code **code, tf_diag *d)
{
    *fn = NULL;
    *code = NULL;
    LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, n, sym);
    if (!buf) return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    return add_object(j, sym, buf, fn, code, d);
}

tf_ir_status tf_jit_set_pipeline(tf_jit *j, const char *pipe)
{
    if ((!pipe && !j->pipeline) || (pipe && j->pipeline && !strcmp(pipe, j->pipeline))) return TF_IR_OK;
    char *copy = pipe ? tf_strdup(pipe) : NULL;
    if (pipe && !copy) return TF_IR_ERR_OOM;
    tf_free(j->pipeline);
    j->pipeline = copy;
    return TF_IR_OK;
}

char *tf_jit_print(const tf_kernel *k) { return tf_jit_print_pipeline(k, NULL); }

char *tf_jit_print_pipeline(const tf_kernel *k, const char *pipe)
{
    if (!tf_jit_supports(k, NULL, 0)) return NULL;
    init_native();
    char err[512];
    LLVMContextRef cx = LLVMContextCreate();
    LLVMModuleRef mod = build_module(cx, k, k->name);
    char *out = NULL;
    if (mod) {
        LLVMTargetMachineRef tm = host_tm(err, sizeof err);
        if (!finish_module(mod, k, tm, pipe, err, sizeof err)) {
            char *s = LLVMPrintModuleToString(mod);
            out = tf_strdup(s);
            LLVMDisposeMessage(s);
        }
        if (tm) LLVMDisposeTargetMachine(tm);
        LLVMDisposeModule(mod);
    }
    LLVMContextDispose(cx);
    return out;
}

const char *tf_jit_unavailable(void) { return NULL; }

const char *tf_jit_where(char *buf, size_t n)
{
    snprintf(buf, n, "linked in (LLVM %s)", LLVM_VERSION_STRING);
    return buf;
}

#ifdef TFUSE_LLVM_MODULE
/* What libtfuse.so's codegen/llvm_lazy.c looks up in this module. */
const tf_llvm_api tf_llvm_module_api = {
    .version = TF_LLVM_API_VERSION,
    .size = sizeof(tf_llvm_api),
    .kernel_size = sizeof(tf_kernel),
    .diag_size = sizeof(tf_diag),
    .create = tf_jit_create,
    .free = tf_jit_free,
    .compile = tf_jit_compile,
    .release = tf_jit_release,
    .target_id = tf_jit_target_id,
    .compile_object = tf_jit_compile_object,
    .load_object = tf_jit_load_object,
    .object = tf_jit_object,
    .set_pipeline = tf_jit_set_pipeline,
    .supports = tf_jit_supports,
    .lowers = tf_jit_lowers,
    .print = tf_jit_print,
    .print_pipeline = tf_jit_print_pipeline,
};
#endif
