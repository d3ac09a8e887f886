/* cuda_attention.c — flash_attention and flash_attention_grad as CUDA C
 * kernels of their own (tf_cuda_emit_library hands them here). What they
 * compute is ir/attention.c's; how:
 *
 *   forward   a block of 128 threads per (batch, head, tile of kBQ query
 *             rows), looping over tiles of kBK keys: the query tile, the
 *             key tile and the value tile staged in shared memory as the
 *             math type, the [kBQ][kBK] scores computed there, an online
 *             softmax per row (running max m, running sum l, the
 *             accumulator rescaled by exp(m_old - m_new)) by kRG = 128 / kBQ
 *             threads a row, and O's unnormalized sums in registers (a
 *             thread holds kBQ * Dv / 128 of them). No [Tq, Tk] tensor in
 *             memory. O = sums / l (0 for a row that sees no key), and with
 *             lse the row's m + log l (-inf) in column Dv;
 *   backward  two entry points launched one after the other, neither with
 *             atomics: the first a block per (batch, key/value head, tile
 *             of kBK keys) that walks every query tile of every query head
 *             of the group, recomputes P_ij = exp(s_ij - lse_i) and
 *             dS_ij = P_ij (Z_ij dO_i . v_j - D_i) scale, and accumulates
 *             dV_j and dK_j in registers; the second (name2) a block per
 *             (batch, head, query tile) that recomputes dS_ij over the key
 *             tiles and accumulates dQ_i. D_i = dO_i . O_i - dlse_i is
 *             recomputed per query tile from out and dout.
 *
 * The math type is float for f32, f16 and bf16 storage and double for f64.
 * Dropout (train mode, p > 0) keeps P_ij with the interpreter's draw at the
 * flat index ((b H + h) Tq + i) Tk + j and scales it by 1/(1-p) rounded to
 * f32; the normalizer l is over the undropped probabilities. For f16 and
 * bf16 storage each exp(s_ij - m) that multiplies v is rounded to the
 * storage dtype (l sums them unrounded), as ir/attention.c does, and so
 * are P_ij Z_ij and dO in dV's sum (not dP, dS or D_i); m is the
 * running max, the row's max once a row's largest score is in an earlier
 * or the same key tile (ir/attention.c rounds against the row's max: where
 * a later tile raises it, the two differ by one 16-bit rounding of P_ij, as
 * a tensor-core flash-attention kernel does). Tiles (query rows x keys, no
 * larger than the sequences need): the first of 16x64, 8x64 .. 4x4 whose
 * shared memory fits 48 KiB and whose accumulators stay within 64
 * registers a thread, so head dims up to 256 in any dtype.
 *
 * On tensor cores (f16/bf16 q, k, v; head dims multiples of 16, up to 128
 * forward and 64 backward, whose dO is in the same dtype): the same
 * algorithm with a warp per 16 rows and mma.sync m16n8k16 (16-bit
 * operands, f32 sums) for S = q k^T, P v, dP = dO v^T and dV = (P Z)^T dO,
 * the softmax on the C fragments, and dQ = dS k, dK = dS^T q with dS in
 * f32 split into two tf32 terms (mma.m16n8k8), so that every product the
 * op defines in f32 stays within 2^-21 of it. Elsewhere than sm_80+ (an
 * older GPU, cuda-emu) tf_mma and tf_mma8 compute the same sums from the
 * same fragments exchanged by warp shuffles, so cuda-emu checks each
 * fragment's layout. --cuda-explain names the kernel a node gets and why
 * not the tensor-core one (tf_cuda_attention_kind). */
#include "cuda_emit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum {
    NT = 128,                  /* threads a block */
    SMEM_MAX = 48 * 1024,      /* dynamic shared memory without cuFuncSetAttribute */
    REGS_MAX = 64,             /* accumulators a thread holds */
    HEAD_MAX = 256,            /* the largest head dim (D, Dv) */
    MMA_HEAD_MAX = 128,        /* and on tensor cores */
    MMA_GRAD_HEAD_MAX = 64,    /* the backward on tensor cores (its accumulators in registers) */
    MMA_QT = 32,               /* the backward's first kernel: query rows a step */
    MMA_KT = 64,               /* the second: keys a step */
};

/* An attention kernel being written. */
typedef struct ak {
    const tf_kernel *k;
    const tf_node *n;
    tf_attn_geom g;
    sb s;
    bool grad;                 /* flash_attention_grad */
    bool drop;                 /* draws dropout: train mode and p > 0 */
    bool f64;                  /* the math type is double */
    tf_dt half;                /* q's dtype; f16, bf16: P (and in dV's sum dO) rounded to it (ir/attention.c) */
    bool wide;                 /* 64-bit indices */
    bool mma;                  /* the forward on tensor cores (mma.sync m16n8k16): f16/bf16, head dims multiples of 16 to 128 */
    char scalar_why[96];       /* why not, when !mma */
    int bq, bk;                /* query rows and keys a tile */
    unsigned smem;             /* bytes of dynamic shared memory */
    int64_t wd;                /* grad: dout's row, Dv or Dv + 1 */
    const char *real, *zero, *one, *expf, *logf, *fmax;   /* the math type and its spellings */
} ak;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* f16 or bf16 storage: P, and dO in dV's sum, are rounded to it. */
static bool lowp(const ak *a) { return a->half == TF_DT_F16 || a->half == TF_DT_BF16; }

/* Shared memory (elements of the math type) of the kernels at tiles bq x bk. */
static int64_t smem_elems(const ak *a, int64_t bq, int64_t bk)
{
    const tf_attn_geom *g = &a->g;
    int64_t kv = bk * (g->D + 1) + bk * (g->Dv + 1);   /* staged keys and values, rows padded by one */
    if (!a->grad) return bq * g->D + kv + bq * bk + 3 * bq;
    return kv + bq * (g->D + g->Dv) + 2 * bq * bk + 2 * bq;
}

/* Accumulators a thread holds at tiles bq x bk. */
static int64_t regs_of(const ak *a, int64_t bq, int64_t bk)
{
    const tf_attn_geom *g = &a->g;
    if (!a->grad) return cdiv(bq * g->Dv, NT);
    int64_t kv = cdiv(bk * g->D, NT) + cdiv(bk * g->Dv, NT), q = cdiv(bq * g->D, NT);
    return kv > q ? kv : q;
}

/* The smallest power of two >= n, at least 4 and at most cap. */
static int64_t pow2_fit(int64_t n, int64_t cap)
{
    int64_t p = 4;
    while (p < n && p < cap) p *= 2;
    return p;
}

/* The tiles: the first of the candidates (trimmed to the sequences) that fits; false when none does. Long key
 * tiles first: fewer rescalings of the sums, and for f16/bf16 the probabilities that multiply v are rounded
 * against a running max that is more often the row's own (ir/attention.c rounds them against the row's max). */
static bool choose_tiles(ak *a)
{
    static const int cand[][2] = {{16, 64}, {8, 64}, {16, 32}, {8, 32}, {16, 16}, {8, 16}, {4, 16}, {8, 8}, {4, 8}, {4, 4}};
    int64_t es = a->f64 ? 8 : 4;
    for (size_t c = 0; c < sizeof cand / sizeof *cand; c++) {
        int64_t bq = pow2_fit(a->g.Tq, cand[c][0]), bk = pow2_fit(a->g.Tk, cand[c][1]);
        int64_t bytes = smem_elems(a, bq, bk) * es;
        if (bytes <= SMEM_MAX && regs_of(a, bq, bk) <= REGS_MAX) {
            a->bq = (int)bq, a->bk = (int)bk, a->smem = (unsigned)bytes;
            return true;
        }
    }
    return false;
}

/* Whether the forward runs on tensor cores: 16-bit q, k and v (P multiplies v rounded to their dtype, as the op defines, so
 * both products take 16-bit operands exactly), head dims that are whole k-steps of 16 and whose accumulators fit the
 * registers (D/4 of q's fragments, Dv/2 of O's). If not, why into why. */
static bool mma_fits(const ak *a, char *why, size_t n)
{
    const tf_attn_geom *g = &a->g;
    const tf_node *nd = a->n;
    int most = a->grad ? MMA_GRAD_HEAD_MAX : MMA_HEAD_MAX;
    if (!lowp(a) || nd->in[1]->type.dtype != a->half || nd->in[2]->type.dtype != a->half)
        snprintf(why, n, "%s storage: tensor cores take f16 and bf16", tf_dtype_name(nd->in[0]->type.dtype));
    else if (a->grad && nd->in[4]->type.dtype != a->half)
        snprintf(why, n, "dO in %s, not %s: dP = dO v^T is a sum in f32 of dO unrounded", tf_dtype_name(nd->in[4]->type.dtype),
                 tf_dtype_name(a->half));
    else if (g->D % 16 || g->Dv % 16 || g->D > most || g->Dv > most)
        snprintf(why, n, "head dims D=%lld, Dv=%lld: the MMA kernel%s takes multiples of 16 up to %d", (long long)g->D, (long long)g->Dv,
                 a->grad ? "s of the backward" : "", most);
    else return true;
    return false;
}

/* The MMA kernels' tiles. Forward: kBQ = 16 rows a warp, the longest key tile whose staged q, k and v fit. Backward:
 * kBK = 16 keys a warp in the first kernel (against query tiles of kQT), kBQ = 16 rows a warp in the second (against key
 * tiles of kKT); both kernels take the larger shared memory. */
static void choose_mma_tiles(ak *a)
{
    const tf_attn_geom *g = &a->g;
    if (a->grad) {
        a->bq = a->bk = 16 * (NT / 32);
        int64_t one = (a->bk + MMA_QT) * (g->D + 8 + g->Dv + 8) * 2 + MMA_QT * 8, two = (a->bq + MMA_KT) * (g->D + 8 + g->Dv + 8) * 2 + a->bq * 8;
        a->smem = (unsigned)(one > two ? one : two);
        return;
    }
    a->bq = 16 * (NT / 32);
    for (a->bk = 64; a->bk > 16; a->bk /= 2)
        if ((a->bq * (g->D + 8) + a->bk * (g->D + 8) + a->bk * (g->Dv + 8)) * 2 <= SMEM_MAX) break;
    a->smem = (unsigned)((a->bq * (g->D + 8) + a->bk * (g->D + 8) + a->bk * (g->Dv + 8)) * 2);
}

static bool attention_op(int op) { return op == TF_OP_FLASH_ATTENTION || op == TF_OP_FLASH_ATTENTION_GRAD; }

/* The kernel's facts; false with the reason in why when it is not emitted. */
static bool ak_init(ak *a, const tf_kernel *k, bool train, char *why, size_t n)
{
    memset(a, 0, sizeof *a);
    a->k = k;
    a->n = k->lib;
    const tf_node *nd = a->n;
    const char *name = tf_op_info_of(nd->op)->name;
    tf_attn_geom_of(nd, &a->g);
    const tf_attn_geom *g = &a->g;
    a->grad = nd->op == TF_OP_FLASH_ATTENTION_GRAD;
    a->drop = train && g->dropout > 0;
    a->f64 = nd->in[0]->type.dtype == TF_DT_F64;
    a->half = nd->in[0]->type.dtype;
    a->wd = a->grad ? nd->in[4]->type.dims[3].n : 0;
    if (g->D < 1 || g->D > HEAD_MAX || g->Dv < 1 || g->Dv > HEAD_MAX) {
        snprintf(why, n, "kernel %s: %s with head dims D=%lld, Dv=%lld: the generated kernels take 1 to %d", k->name, name,
                 (long long)g->D, (long long)g->Dv, HEAD_MAX);
        return false;
    }
    if (g->B > INT32_MAX || g->H > INT32_MAX || g->Tq > INT32_MAX / 2 || g->Tk > INT32_MAX / 2) {   /* the kernels count in int */
        snprintf(why, n, "kernel %s: %s: B=%lld, H=%lld, Tq=%lld, Tk=%lld pass the generated kernels' 32-bit counts", k->name, name,
                 (long long)g->B, (long long)g->H, (long long)g->Tq, (long long)g->Tk);
        return false;
    }
    a->mma = mma_fits(a, a->scalar_why, sizeof a->scalar_why);
    if (a->mma) choose_mma_tiles(a);
    else if (!choose_tiles(a)) {   /* never at D, Dv <= 256: 4x4 tiles fit */
        snprintf(why, n, "kernel %s: %s: no tile fits %d bytes of shared memory", k->name, name, SMEM_MAX);
        return false;
    }
    int64_t biggest = tf_type_numel(&nd->out->type);
    for (int q = 0; q < nd->nin; q++)
        if (tf_type_numel(&nd->in[q]->type) > biggest) biggest = tf_type_numel(&nd->in[q]->type);
    a->wide = biggest >= ((int64_t)1 << 30);
    a->real = a->f64 ? "double" : "float";
    a->zero = a->f64 ? "0.0" : "0.0f";
    a->one = a->f64 ? "1.0" : "1.0f";
    a->expf = a->f64 ? "exp" : "expf";
    a->logf = a->f64 ? "log" : "logf";
    a->fmax = a->f64 ? "fmax" : "fmaxf";
    return true;
}

bool cu_attention_supports(const tf_kernel *k, char *why, size_t n)
{
    ak a;
    return attention_op(k->lib->op) && ak_init(&a, k, true, why, n);
}

bool tf_cuda_attention_kind(const tf_kernel *k, char *buf, size_t n)
{
    ak a;
    char why[256];
    if (!k->lib || !attention_op(k->lib->op) || !ak_init(&a, k, true, why, sizeof why)) return false;
    if (a.mma)
        snprintf(buf, n, "on tensor cores (mma.sync m16n8k16, %s operands, f32 sums; elsewhere than sm_80+ the same fragments by "
                 "shuffles), tiles of %d query rows and %d keys", tf_dtype_name(a.half), a.bq, a.bk);
    else
        snprintf(buf, n, "scalar in %s (not on tensor cores: %s), tiles of %d query rows and %d keys", a.real, a.scalar_why, a.bq, a.bk);
    return true;
}

/* ---- the source: what both directions share ---- */

/* The distinct storage dtypes the kernel loads (q's first). */
static int loaded_dtypes(const ak *a, tf_dt *ts)
{
    int nt = 0;
    for (int q = 0; q < a->n->nin; q++) {
        tf_dt t = a->n->in[q]->type.dtype;
        if (q == a->g.mask && a->g.mask_bool) continue;   /* read as bytes */
        bool seen = false;
        for (int i = 0; i < nt; i++) seen |= ts[i] == t;
        if (!seen) ts[nt++] = t;
    }
    return nt;
}

/* The includes, the dropout draw, the problem and tile constants. */
static void emit_head(ak *a)
{
    sb *s = &a->s;
    const tf_attn_geom *g = &a->g;
    tf_dt ts[8];
    int nt = loaded_dtypes(a, ts);
    bool f16 = a->n->out->type.dtype == TF_DT_F16, bf16 = a->n->out->type.dtype == TF_DT_BF16;
    for (int i = 0; i < nt; i++) f16 |= ts[i] == TF_DT_F16, bf16 |= ts[i] == TF_DT_BF16;
    tf_strbuf_printf(s, "// generated by tfuse (codegen/cuda_attention.c) for NVRTC: %s, %s\n", tf_op_info_of(a->n->op)->name,
                     a->grad ? "two kernels (dK and dV a block per key tile, then dQ a block per query tile)"
                             : "a block per tile of query rows, an online softmax over tiles of keys");
    if (f16) tf_strbuf_printf(s, "#include <cuda_fp16.h>\n");
    if (bf16) tf_strbuf_printf(s, "#include <cuda_bf16.h>\n");
    tf_strbuf_printf(s, "\n%s", cu_helpers_common);
    if (a->drop) tf_strbuf_printf(s, "%s", cu_helpers_rng);
    tf_strbuf_printf(s, "\ntypedef %s tf_idx;\n", a->wide ? "long long" : "int");
    cu_line(s, 0, "// q [B, H, Tq, D], k [B, Hk, Tk, D], v [B, Hk, Tk, Dv]; query head h reads key/value head h / kG (ir/attention.c)");
    cu_line(s, 0, "constexpr int kB = %lld, kH = %lld, kHk = %lld, kG = kH / kHk, kTq = %lld, kTk = %lld, kD = %lld, kDv = %lld;",
            (long long)g->B, (long long)g->H, (long long)g->Hk, (long long)g->Tq, (long long)g->Tk, (long long)g->D, (long long)g->Dv);
    if (a->mma) {
        cu_line(s, 0, "// tiles of kBQ query rows (16 a warp) and kBK keys; kNT threads a block; staged rows of 16-bit elements padded");
        cu_line(s, 0, "// by 8 (16 bytes: the rows' 32-bit words fall in different banks)");
        cu_line(s, 0, "constexpr int kBQ = %d, kBK = %d, kNT = %d, kQS = kD + 8, kKS = kD + 8, kVS = kDv + 8;", a->bq, a->bk, NT);
        if (a->grad)
            cu_line(s, 0, "constexpr int kQT = %d, kKT = %d, kOS = kDv + 8;   // the first kernel's query rows a step, the second's keys; dO's rows",
                    MMA_QT, MMA_KT);
    } else {
        cu_line(s, 0, "// tiles of kBQ query rows and kBK keys; kNT threads a block, kRG of them a query row where rows are reduced;");
        cu_line(s, 0, "// staged keys and values are rows of kD + 1 and kDv + 1 (the padding spreads a column over the banks)");
        cu_line(s, 0, "constexpr int kBQ = %d, kBK = %d, kNT = %d, kRG = kNT / kBQ, kKS = kD + 1, kVS = kDv + 1;", a->bq, a->bk, NT);
    }
    if (a->grad) cu_line(s, 0, "constexpr int kNQ = (kTq + kBQ - 1) / kBQ, kNK = (kTk + kBK - 1) / kBK;   // query tiles, key tiles");
    else cu_line(s, 0, "constexpr int kNQ = (kTq + kBQ - 1) / kBQ;   // query tiles");
    if (a->grad) {
        cu_line(s, 0, "constexpr int kWd = %lld;   // dout's row: dO%s", (long long)a->wd, a->wd > g->Dv ? ", then the log-sum-exp's gradient" : "");
        cu_line(s, 0, "// the result: dq [B, H, Tq, D], dk [B, Hk, Tk, D], dv [B, Hk, Tk, Dv], one after the other");
        cu_line(s, 0, "constexpr tf_idx kOffK = %lld, kOffV = %lld;", (long long)(g->B * g->H * g->Tq * g->D),
                (long long)(g->B * g->H * g->Tq * g->D + g->B * g->Hk * g->Tk * g->D));
    } else {
        cu_line(s, 0, "constexpr int kW = %lld;   // the result's row: O%s", (long long)(g->Dv + g->lse), g->lse ? ", then the log-sum-exp" : "");
    }
}

static void emit_tf32_helpers(ak *a);

/* The MMA kernels' helpers: 16-bit bits in and out, the staging of raw tiles, and tf_mma, one warp's
 * D[16x8] += A[16x16] B[16x8] in f32 from 16-bit operands. Fragments are PTX's for mma.m16n8k16 (lane = 4 g + c):
 * A's four 32-bit words hold (row, columns) (g, 2c..2c+1), (g+8, 2c..), (g, 8+2c..), (g+8, 8+2c..); B's two words
 * (rows 2c..2c+1, column g), (rows 8+2c.., column g); C's four floats (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1); the
 * lower half of a word is the element of the lower column or row. sm_80 and later run the instruction; elsewhere (an
 * older GPU, cuda-emu) tf_mma computes the same sums from the same fragments exchanged by shuffles, so that cuda-emu
 * checks every fragment's layout. */
static void emit_mma_helpers(ak *a)
{
    sb *s = &a->s;
    bool bf = a->half == TF_DT_BF16;
    const char *st = cu_storage_type(a->half), *ty = bf ? "bf16" : "f16";
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// a 16-bit element's bits, and back; a float rounded to the storage's bits");
    cu_line(s, 0, "__device__ __forceinline__ unsigned short tf_bits(%s x) { return %s(x); }", st, bf ? "__bfloat16_as_ushort" : "__half_as_ushort");
    cu_line(s, 0, "__device__ __forceinline__ float tf_widen(unsigned short x) { return %s(%s(x)); }", bf ? "__bfloat162float" : "__half2float",
            bf ? "__ushort_as_bfloat16" : "__ushort_as_half");
    cu_line(s, 0, "__device__ __forceinline__ unsigned tf_pack(float lo, float hi)");
    cu_line(s, 0, "{");
    cu_line(s, 1, "return (unsigned)tf_bits(%s(lo)) | (unsigned)tf_bits(%s(hi)) << 16;", bf ? "__float2bfloat16_rn" : "__float2half_rn",
            bf ? "__float2bfloat16_rn" : "__float2half_rn");
    cu_line(s, 0, "}");
    cu_line(s, 0, "// two adjacent staged elements (the first at an even index) as one word");
    cu_line(s, 0, "__device__ __forceinline__ unsigned tf_ld2(const unsigned short *p)");
    cu_line(s, 0, "{");
    cu_line(s, 0, "#ifdef __CUDA_ARCH__");
    cu_line(s, 1, "return *(const unsigned *)p;");
    cu_line(s, 0, "#else");
    cu_line(s, 1, "return (unsigned)p[0] | (unsigned)p[1] << 16;");
    cu_line(s, 0, "#endif");
    cu_line(s, 0, "}");
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// `rows` rows of `len` elements into shared memory (a row every `stride`) as their bits, from src (a row every");
    cu_line(s, 0, "// `pitch`); rows n and past are zero");
    cu_line(s, 0, "__device__ __forceinline__ void tf_stage16(unsigned short *dst, int stride, const %s *src, int pitch, int len, int rows, int n)",
            st);
    cu_line(s, 0, "{");
    cu_line(s, 1, "for (int x = threadIdx.x; x < rows * len; x += kNT) {");
    cu_line(s, 2, "const int r = x / len, e = x - r * len;");
    cu_line(s, 2, "dst[r * stride + e] = r < n ? tf_bits(src[(tf_idx)r * pitch + e]) : (unsigned short)0;");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// d[0..3] += A B for the warp's fragments a[0..3], b[0..1] (every lane of the warp calls it)");
    cu_line(s, 0, "__device__ __forceinline__ void tf_mma(float *d, const unsigned *a, const unsigned *b)");
    cu_line(s, 0, "{");
    cu_line(s, 0, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800");
    cu_line(s, 1, "asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, {%%8, %%9}, \"", ty, ty);
    cu_line(s, 1, "             \"{%%0, %%1, %%2, %%3};\"");
    cu_line(s, 1, "             : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])");
    cu_line(s, 1, "             : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));");
    cu_line(s, 0, "#else");
    cu_line(s, 1, "const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;");
    cu_line(s, 1, "float ra[2][16], cb[2][16];   // A's rows g and g + 8; B's columns 2c and 2c + 1 (k = 0 .. 15)");
    cu_line(s, 1, "for (int q = 0; q < 4; q++) {   // lane 4 g + q holds columns 2q, 2q + 1, 8 + 2q, 9 + 2q of A's rows g and g + 8");
    cu_line(s, 2, "for (int w = 0; w < 4; w++) {");
    cu_line(s, 3, "const unsigned x = __shfl_sync(0xffffffffu, a[w], 4 * g + q);");
    cu_line(s, 3, "const int row = w & 1, col = (w >> 1) * 8 + 2 * q;");
    cu_line(s, 3, "ra[row][col] = tf_widen((unsigned short)(x & 0xffffu));");
    cu_line(s, 3, "ra[row][col + 1] = tf_widen((unsigned short)(x >> 16));");
    cu_line(s, 2, "}");
    cu_line(s, 2, "for (int n = 0; n < 2; n++)   // lane 4 (2c + n) + q holds rows 2q, 2q + 1, 8 + 2q, 9 + 2q of B's column 2c + n");
    cu_line(s, 3, "for (int w = 0; w < 2; w++) {");
    cu_line(s, 4, "const unsigned x = __shfl_sync(0xffffffffu, b[w], 4 * (2 * c + n) + q);");
    cu_line(s, 4, "cb[n][w * 8 + 2 * q] = tf_widen((unsigned short)(x & 0xffffu));");
    cu_line(s, 4, "cb[n][w * 8 + 2 * q + 1] = tf_widen((unsigned short)(x >> 16));");
    cu_line(s, 3, "}");
    cu_line(s, 1, "}");
    cu_line(s, 1, "for (int r = 0; r < 2; r++)");
    cu_line(s, 2, "for (int n = 0; n < 2; n++) {");
    cu_line(s, 3, "float acc = d[2 * r + n];");
    cu_line(s, 3, "for (int k = 0; k < 16; k++) acc += ra[r][k] * cb[n][k];");
    cu_line(s, 3, "d[2 * r + n] = acc;");
    cu_line(s, 2, "}");
    cu_line(s, 0, "#endif");
    cu_line(s, 0, "}");
    if (a->grad) emit_tf32_helpers(a);
}

/* The backward's dQ += dS k and dK += dS^T q keep dS in f32, as the op defines: each dS is split into two tf32 numbers
 * (hi, the nearest, ties away; lo, the nearest to what is left: together within 2^-21 of it, f32's range) and each
 * multiplies k or q (16-bit numbers, exact in tf32) on tensor cores: mma.m16n8k8 with tf32 operands, whose fragments are
 * A (g, c), (g+8, c), (g, c+4), (g+8, c+4); B (row c, column g), (row c+4, column g); C as above. A sum's order is free,
 * so a C fragment of dS (columns 2c, 2c+1) is an A fragment whose columns c and c+4 stand for 2c and 2c+1, and B takes
 * the same rows. */
static void emit_tf32_helpers(ak *a)
{
    sb *s = &a->s;
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// x to the nearest tf32 number (ties away from zero), as f32 bits");
    cu_line(s, 0, "__device__ __forceinline__ unsigned tf_tf32(float x)");
    cu_line(s, 0, "{");
    cu_line(s, 0, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800");
    cu_line(s, 1, "unsigned u;");
    cu_line(s, 1, "asm(\"cvt.rna.tf32.f32 %%0, %%1;\" : \"=r\"(u) : \"f\"(x));");
    cu_line(s, 1, "return u;");
    cu_line(s, 0, "#else");
    cu_line(s, 1, "const unsigned u = __float_as_uint(x);");
    cu_line(s, 1, "return (u & 0x7f800000u) == 0x7f800000u ? u : (u + 0x1000u) & 0xffffe000u;");
    cu_line(s, 0, "#endif");
    cu_line(s, 0, "}");
    cu_line(s, 0, "// a C fragment of f32 as two tf32 A fragments, hi and lo (columns c, c + 4 for 2c, 2c + 1)");
    cu_line(s, 0, "__device__ __forceinline__ void tf_split(const float *cf, unsigned *hi, unsigned *lo)");
    cu_line(s, 0, "{");
    cu_line(s, 1, "const float x[4] = {cf[0], cf[2], cf[1], cf[3]};");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 1, "for (int i = 0; i < 4; i++) {");
    cu_line(s, 2, "hi[i] = tf_tf32(x[i]);");
    cu_line(s, 2, "lo[i] = tf_tf32(x[i] - __uint_as_float(hi[i]));");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
    cu_line(s, 0, "// d[0..3] += A B, tf32 A[16x8] and B[8x8], f32 sums");
    cu_line(s, 0, "__device__ __forceinline__ void tf_mma8(float *d, const unsigned *a, const unsigned *b)");
    cu_line(s, 0, "{");
    cu_line(s, 0, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800");
    cu_line(s, 1, "asm volatile(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, {%%8, %%9}, \"");
    cu_line(s, 1, "             \"{%%0, %%1, %%2, %%3};\"");
    cu_line(s, 1, "             : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])");
    cu_line(s, 1, "             : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));");
    cu_line(s, 0, "#else");
    cu_line(s, 1, "const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;");
    cu_line(s, 1, "float ra[2][8], cb[2][8];   // A's rows g and g + 8; B's columns 2c and 2c + 1 (k = 0 .. 7)");
    cu_line(s, 1, "for (int q = 0; q < 4; q++) {   // lane 4 g + q holds columns q and q + 4 of A's rows g and g + 8");
    cu_line(s, 2, "for (int w = 0; w < 4; w++) ra[w & 1][q + (w >> 1) * 4] = __uint_as_float(__shfl_sync(0xffffffffu, a[w], 4 * g + q));");
    cu_line(s, 2, "for (int n = 0; n < 2; n++)   // lane 4 (2c + n) + q holds rows q and q + 4 of B's column 2c + n");
    cu_line(s, 3, "for (int w = 0; w < 2; w++) cb[n][q + w * 4] = __uint_as_float(__shfl_sync(0xffffffffu, b[w], 4 * (2 * c + n) + q));");
    cu_line(s, 1, "}");
    cu_line(s, 1, "for (int r = 0; r < 2; r++)");
    cu_line(s, 2, "for (int n = 0; n < 2; n++) {");
    cu_line(s, 3, "float acc = d[2 * r + n];");
    cu_line(s, 3, "for (int k = 0; k < 8; k++) acc += ra[r][k] * cb[n][k];");
    cu_line(s, 3, "d[2 * r + n] = acc;");
    cu_line(s, 2, "}");
    cu_line(s, 0, "#endif");
    cu_line(s, 0, "}");
}

/* tf_real (a stored element as the math type), tf_neg_inf, tf_stage, the row reductions. */
static void emit_loads(ak *a)
{
    sb *s = &a->s;
    const char *R = a->real;
    tf_dt ts[8];
    int nt = loaded_dtypes(a, ts);
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// a stored element as the math type");
    for (int i = 0; i < nt; i++) {
        const char *v = ts[i] == TF_DT_F16 ? "__half2float(x)" : ts[i] == TF_DT_BF16 ? "__bfloat162float(x)"
                      : (ts[i] == TF_DT_F64) == a->f64 ? "x" : a->f64 ? "(double)x" : "(float)x";
        cu_line(s, 0, "__device__ __forceinline__ %s tf_real(%s x) { return %s; }", R, cu_storage_type(ts[i]), v);
    }
    cu_line(s, 0, "__device__ __forceinline__ %s tf_neg_inf() { return -%s; }", R,
            a->f64 ? "__longlong_as_double(0x7ff0000000000000LL)" : "__int_as_float(0x7f800000)");
    if (lowp(a)) {
        bool f16 = a->half == TF_DT_F16;
        cu_line(s, 0, "// rounded to %s, the storage: the probabilities that multiply v%s (ir/attention.c)", tf_dtype_name(a->half),
                a->grad ? ", and dO in dV's sum" : "");
        cu_line(s, 0, "__device__ __forceinline__ float tf_round16(float x) { return %s(%s(x)); }", f16 ? "__half2float" : "__bfloat162float",
                f16 ? "__float2half_rn" : "__float2bfloat16_rn");
    }
    if (a->mma) {
        emit_mma_helpers(a);
        return;
    }
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// a tile of `rows` rows of `len` elements into shared memory (a row every `stride`), as the math type, from");
    cu_line(s, 0, "// src (a row every `pitch`); rows n and past are zero (a zero times a past-the-end probability stays 0)");
    cu_line(s, 0, "template <typename T>");
    cu_line(s, 0, "__device__ __forceinline__ void tf_stage(%s *dst, int stride, const T *src, int pitch, int len, int rows, int n)", R);
    cu_line(s, 0, "{");
    cu_line(s, 1, "for (int x = threadIdx.x; x < rows * len; x += kNT) {");
    cu_line(s, 2, "const int r = x / len, e = x - r * len;");
    cu_line(s, 2, "dst[r * stride + e] = r < n ? tf_real(src[(tf_idx)r * pitch + e]) : %s;", a->zero);
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// over a row's kRG consecutive lanes of a warp, xor steps: every lane ends with the same bits");
    for (int mx = 0; mx < 2; mx++) {
        if (mx && a->grad) break;   /* the backward sums only */
        cu_line(s, 0, "__device__ __forceinline__ %s tf_row_%s(%s v)", R, mx ? "max" : "sum", R);
        cu_line(s, 0, "{");
        cu_line(s, 0, "#pragma unroll");
        if (mx) cu_line(s, 1, "for (int s = kRG / 2; s > 0; s >>= 1) v = %s(v, __shfl_xor_sync(0xffffffffu, v, s, kRG));", a->fmax);
        else cu_line(s, 1, "for (int s = kRG / 2; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s, kRG);");
        cu_line(s, 1, "return v;");
        cu_line(s, 0, "}");
    }
}

/* The mask's parameter in a helper's declaration and at its call sites (empty without a mask). */
static const char *mask_decl(const ak *a, char *buf, size_t n)
{
    buf[0] = 0;
    if (a->g.mask >= 0)
        snprintf(buf, n, ", const %s *mask", a->g.mask_bool ? "unsigned char" : cu_storage_type(a->n->in[a->g.mask]->type.dtype));
    return buf;
}
static int mask_param(const ak *a) { return a->g.mask + 1; }   /* b0 is the result: operand q is b(q + 1) */

/* tf_score: s_ij or -inf; tf_keep: the dropout factor. */
static void emit_score(ak *a)
{
    sb *s = &a->s;
    const tf_attn_geom *g = &a->g;
    const char *R = a->real;
    char md[96], sc[64], at[256] = "";
    cu_literal(a->f64 ? TF_DT_F64 : TF_DT_F32, a->f64 ? g->scale : (double)(float)g->scale, sc, sizeof sc);
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// s_ij = scale q_i . k_j%s of query i and key j (qi, kj: their staged rows); -inf where i does not see j%s",
            g->mask >= 0 && !g->mask_bool ? " + mask_ij" : "",
            g->causal && g->mask_bool ? " (j > i; the mask false)" : g->causal ? " (j > i)" : g->mask_bool ? " (the mask false)" : "");
    cu_line(s, 0, "// and past the ends; dot: q_i . k_j");
    cu_line(s, 0, "__device__ __forceinline__ %s tf_score_of(%s dot, tf_idx b, tf_idx h, int i, int j%s)", R, R, mask_decl(a, md, sizeof md));
    cu_line(s, 0, "{");
    cu_line(s, 1, "if (i >= kTq || j >= kTk%s) return tf_neg_inf();", g->causal ? " || j > i" : "");
    if (g->mask >= 0) {   /* the mask's element (b, h, i, j), its broadcast axes left out */
        static const char *ax[4] = {"b", "h", "(tf_idx)i", "(tf_idx)j"};
        size_t len = 0;
        for (int d = 0; d < 4; d++) {
            if (!g->mstride[d]) continue;
            if (g->mstride[d] == 1) len += (size_t)snprintf(at + len, sizeof at - len, "%s%s", len ? " + " : "", ax[d]);
            else len += (size_t)snprintf(at + len, sizeof at - len, "%s%s * %lld", len ? " + " : "", ax[d], (long long)g->mstride[d]);
        }
        if (!len) snprintf(at, sizeof at, "0");
        cu_line(s, 1, "const %s m = mask[%s];   // strides over [B, H, Tq, Tk]: %lld, %lld, %lld, %lld",
                g->mask_bool ? "unsigned char" : cu_storage_type(a->n->in[g->mask]->type.dtype), at, (long long)g->mstride[0],
                (long long)g->mstride[1], (long long)g->mstride[2], (long long)g->mstride[3]);
        if (g->mask_bool) cu_line(s, 1, "if (!m) return tf_neg_inf();");
    }
    bool use_b = g->mask >= 0 && g->mstride[0], use_h = g->mask >= 0 && g->mstride[1];
    if (!use_b || !use_h) cu_line(s, 1, "%s%s%s;   // the mask does not vary along them", use_b ? "" : "(void)b", use_b || use_h ? "" : ", ",
                                  use_h ? "" : "(void)h");
    cu_line(s, 1, "return dot * %s%s;", sc, g->mask >= 0 && !g->mask_bool ? " + tf_real(m)" : "");
    cu_line(s, 0, "}");
    if (!a->mma) {   /* the scalar kernels' score from staged rows */
        cu_line(s, 0, "__device__ __forceinline__ %s tf_score(const %s *qi, const %s *kj, tf_idx b, tf_idx h, int i, int j%s)", R, R, R,
                mask_decl(a, md, sizeof md));
        cu_line(s, 0, "{");
        cu_line(s, 1, "%s acc = %s;", R, a->zero);
        cu_line(s, 1, "for (int e = 0; e < kD; e++) acc += qi[e] * kj[e];");
        cu_line(s, 1, "return tf_score_of(acc, b, h, i, j%s);", g->mask >= 0 ? ", mask" : "");
        cu_line(s, 0, "}");
    }
    if (!a->drop) return;
    char z[64];
    cu_literal(a->f64 ? TF_DT_F64 : TF_DT_F32, (double)(float)(1.0 / (1.0 - g->dropout)), z, sizeof z);
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// dropout (p = %.9g): P_ij is kept with the interpreter's draw at ((b H + h) Tq + i) Tk + j, scaled by 1/(1-p) in f32",
            g->dropout);
    cu_line(s, 0, "__device__ __forceinline__ %s tf_keep(unsigned long long key, tf_idx bh, int i, int j)", R);
    cu_line(s, 0, "{");
    cu_line(s, 1, "const unsigned long long at = ((unsigned long long)bh * kTq + (unsigned long long)i) * kTk + (unsigned long long)j;");
    cu_line(s, 1, "return tf_dropout_keep(key, at, %lluULL) ? %s : %s;", (unsigned long long)tf_cuda_dropout_threshold(g->dropout), z,
            a->zero);
    cu_line(s, 0, "}");
}

/* The entry point's parameters: b0 the result, b<q+1> operand q, then {seed, step} when it draws dropout. */
static void emit_params(ak *a, sb *s)
{
    const tf_kernel *k = a->k;
    for (int p = 0; p <= a->n->nin; p++) {
        const tf_value *v = p ? a->n->in[p - 1] : a->n->out;
        bool disjoint = false;
        for (int b = 0; b < k->nbufs; b++)
            if (k->bufs[b].value == v) disjoint = k->bufs[b].disjoint;
        tf_strbuf_printf(s, "%s%s%s *%sb%d", p ? ", " : "", p ? "const " : "", cu_storage_type(v->type.dtype),
                         disjoint ? "__restrict__ " : "", p);
    }
    if (a->drop) tf_strbuf_printf(s, ", const unsigned long long *__restrict__ tf_rng");
}

/* An entry point's first line, its shared memory and the dropout key. */
static void emit_entry(ak *a, const char *suffix)
{
    sb *s = &a->s;
    tf_strbuf_printf(s, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s%s(", NT, cu_placeholder, suffix);
    emit_params(a, s);
    tf_strbuf_printf(s, ")\n{\n");
    cu_line(s, 1, "extern __shared__ __align__(16) unsigned char tf_smem[];");
}

static void emit_key(ak *a)
{
    if (a->drop)
        cu_line(&a->s, 1, "const unsigned long long key = tf_dropout_key(tf_rng, %lluULL);   // dropout's stream at this step",
                (unsigned long long)a->g.salt);
}

/* A value of the math type as the result's dtype. */
static void store_as(const ak *a, const char *v, char *out, size_t n)
{
    switch (a->n->out->type.dtype) {
    case TF_DT_F16: snprintf(out, n, "__float2half_rn(%s)", v); break;
    case TF_DT_BF16: snprintf(out, n, "__float2bfloat16_rn(%s)", v); break;
    default: snprintf(out, n, "%s", v); break;
    }
}

/* ---- the forward kernel ---- */

/* One key tile: stage it, score it, the online softmax, the accumulators. */
static void emit_forward_tile(ak *a)
{
    sb *s = &a->s;
    const char *R = a->real;
    char mk[16] = "";
    if (a->g.mask >= 0) snprintf(mk, sizeof mk, ", b%d", mask_param(a));
    cu_line(s, 2, "for (int j0 = 0; j0 < nk; j0 += kBK) {");
    cu_line(s, 3, "const int nj = tf_min(kBK, kTk - j0);   // keys j0 .. j0 + nj - 1");
    cu_line(s, 3, "__syncthreads();   // the previous key tile is used up");
    cu_line(s, 3, "tf_stage(ks, kKS, b2 + (kv * kTk + j0) * kD, kD, kD, kBK, nj);");
    cu_line(s, 3, "tf_stage(vs, kVS, b3 + (kv * kTk + j0) * kDv, kDv, kDv, kBK, nj);");
    cu_line(s, 3, "__syncthreads();");
    cu_line(s, 3, "for (int x = t; x < kBQ * kBK; x += kNT) {");
    cu_line(s, 4, "const int i = x / kBK, j = x %% kBK;");
    cu_line(s, 4, "ps[x] = tf_score(qs + i * kD, ks + j * kKS, b, h, i0 + i, j0 + j%s);", mk);
    cu_line(s, 3, "}");
    cu_line(s, 3, "__syncthreads();");
    cu_line(s, 3, "// the online softmax of row r: its new max, P_ij = exp(s_ij - max), the factor for its sums so far");
    cu_line(s, 3, "%s mx = tf_neg_inf();", R);
    cu_line(s, 3, "for (int j = l; j < kBK; j += kRG) mx = %s(mx, ps[r * kBK + j]);", a->fmax);
    cu_line(s, 3, "mx = tf_row_max(mx);");
    cu_line(s, 3, "const %s m0 = rm[r], m1 = %s(m0, mx);", R, a->fmax);
    cu_line(s, 3, "%s sum = %s;", R, a->zero);
    cu_line(s, 3, "for (int j = l; j < kBK; j += kRG) {");
    cu_line(s, 4, "const %s p = m1 == tf_neg_inf() ? %s : %s(ps[r * kBK + j] - m1);   // a hidden key: exp(-inf) = 0", R, a->zero,
            a->expf);
    cu_line(s, 4, "sum += p;");
    const char *pv = lowp(a) ? "tf_round16(p)" : "p";   /* l sums P unrounded */
    if (a->drop) cu_line(s, 4, "ps[r * kBK + j] = %s * tf_keep(key, bh, i0 + r, j0 + j);   // l sums the undropped P", pv);
    else cu_line(s, 4, "ps[r * kBK + j] = %s;", pv);
    cu_line(s, 3, "}");
    cu_line(s, 3, "sum = tf_row_sum(sum);");
    cu_line(s, 3, "__syncwarp();   // every lane of the row has read rm[r]");
    cu_line(s, 3, "if (l == 0) {");
    cu_line(s, 4, "const %s f = m1 == tf_neg_inf() ? %s : %s(m0 - m1);", R, a->one, a->expf);
    cu_line(s, 4, "ra[r] = f;");
    cu_line(s, 4, "rl[r] = rl[r] * f + sum;");
    cu_line(s, 4, "rm[r] = m1;");
    cu_line(s, 3, "}");
    cu_line(s, 3, "__syncthreads();");
    cu_line(s, 3, "// O_i = O_i f_i + sum_j P_ij v_j");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int x = 0; x < kR; x++) {");
    cu_line(s, 4, "const int y = t + x * kNT, i = y / kDv, e = y %% kDv;");
    cu_line(s, 4, "if (y >= kBQ * kDv) break;");
    cu_line(s, 4, "%s o = acc[x] * ra[i];", R);
    cu_line(s, 4, "for (int j = 0; j < kBK; j++) o += ps[i * kBK + j] * vs[j * kVS + e];");
    cu_line(s, 4, "acc[x] = o;");
    cu_line(s, 3, "}");
    cu_line(s, 2, "}");
}

static void emit_forward(ak *a)
{
    sb *s = &a->s;
    const char *R = a->real;
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "constexpr int kR = (kBQ * kDv + kNT - 1) / kNT;   // O's accumulators a thread holds");
    emit_entry(a, "");
    cu_line(s, 1, "%s *qs = (%s *)tf_smem;   // [kBQ][kD]: the block's query rows", R, R);
    cu_line(s, 1, "%s *ks = qs + kBQ * kD;   // [kBK][kKS]: a tile of keys", R);
    cu_line(s, 1, "%s *vs = ks + kBK * kKS;  // [kBK][kVS]: and of values", R);
    cu_line(s, 1, "%s *ps = vs + kBK * kVS;  // [kBQ][kBK]: the scores, then P_ij%s", R, a->drop ? " Z_ij (Z: the dropout factor)" : "");
    cu_line(s, 1, "%s *rm = ps + kBQ * kBK;  // [kBQ]: each row's running max", R);
    cu_line(s, 1, "%s *rl = rm + kBQ;        // [kBQ]: each row's running sum of exp(s - max)", R);
    cu_line(s, 1, "%s *ra = rl + kBQ;        // [kBQ]: the factor this key tile rescales each row's sums by", R);
    cu_line(s, 1, "const int t = threadIdx.x, r = t / kRG, l = t %% kRG;   // in the softmax, thread t is lane l of row r");
    emit_key(a);
    cu_line(s, 1, "for (tf_idx w = blockIdx.x; w < (tf_idx)kB * kH * kNQ; w += gridDim.x) {   // (b, h, query tile)");
    cu_line(s, 2, "const tf_idx bh = w / kNQ, b = bh / kH, h = bh %% kH, kv = b * kHk + h / kG;");
    cu_line(s, 2, "const int i0 = (int)(w %% kNQ) * kBQ, nq = tf_min(kBQ, kTq - i0);   // query rows i0 .. i0 + nq - 1");
    cu_line(s, 2, "__syncthreads();   // the previous rows are stored");
    cu_line(s, 2, "tf_stage(qs, kD, b1 + (bh * kTq + i0) * kD, kD, kD, kBQ, nq);");
    cu_line(s, 2, "if (t < kBQ) {");
    cu_line(s, 3, "rm[t] = tf_neg_inf();");
    cu_line(s, 3, "rl[t] = %s;", a->zero);
    cu_line(s, 2, "}");
    cu_line(s, 2, "%s acc[kR];   // O's unnormalized sums: element t + kNT x of the tile's [kBQ][kDv]", R);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kR; x++) acc[x] = %s;", a->zero);
    if (a->g.causal) cu_line(s, 2, "const int nk = tf_min(kTk, i0 + kBQ);   // causal: no row of the tile sees a key past its last row");
    else cu_line(s, 2, "const int nk = kTk;");
    emit_forward_tile(a);
    char st[128];
    store_as(a, "v", st, sizeof st);
    cu_line(s, 2, "// O_i = its sums / l_i, 0 for a row that sees no key%s", a->g.lse ? "; the log-sum-exp max + log l (-inf)" : "");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kR; x++) {");
    cu_line(s, 3, "const int y = t + x * kNT, i = y / kDv, e = y %% kDv;");
    cu_line(s, 3, "if (y >= kBQ * kDv || i >= nq) break;");
    cu_line(s, 3, "const %s v = rl[i] > %s ? acc[x] / rl[i] : %s;", R, a->zero, a->zero);
    cu_line(s, 3, "b0[(bh * kTq + i0 + i) * kW + e] = %s;", st);
    cu_line(s, 2, "}");
    if (a->g.lse)
        cu_line(s, 2, "if (t < nq) b0[(bh * kTq + i0 + t) * kW + kDv] = rl[t] > %s ? rm[t] + %s(rl[t]) : tf_neg_inf();", a->zero, a->logf);
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

/* ---- the forward on tensor cores ---- */

/* A block of 4 warps per (b, h, tile of 64 query rows), warp w the rows 16 w .. 16 w + 15: q's fragments in registers,
 * S = q k^T for a key tile by MMA into C fragments, the online softmax on them (a row's 4 lanes meet by shuffles), P
 * rounded to the storage dtype as the A fragments of P v (an S tile's C fragments of 8 keys are, two by two, the A
 * fragments of 16 keys), O's sums in C fragments. Dropout keeps P_ij or zeroes it, and O takes the factor 1/(1-p) once
 * at the end. */
static void emit_forward_mma(ak *a)
{
    sb *s = &a->s;
    const tf_attn_geom *g = &a->g;
    char mk[16] = "", st[128];
    if (g->mask >= 0) snprintf(mk, sizeof mk, ", b%d", mask_param(a));
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "constexpr int kNS = kBK / 8, kNO = kDv / 8, kKQ = kD / 16;   // a warp's C fragments of S and of O; q's k-steps");
    emit_entry(a, "");
    cu_line(s, 1, "unsigned short *qs = (unsigned short *)tf_smem;   // [kBQ][kQS]: the block's query rows");
    cu_line(s, 1, "unsigned short *ks = qs + kBQ * kQS;   // [kBK][kKS]: a tile of keys");
    cu_line(s, 1, "unsigned short *vs = ks + kBK * kKS;   // [kBK][kVS]: and of values");
    cu_line(s, 1, "const int t = threadIdx.x, wq = (t >> 5) * 16, g = (t & 31) >> 2, c = t & 3;   // lane 4 g + c of the warp of rows wq ..");
    emit_key(a);
    cu_line(s, 1, "for (tf_idx w = blockIdx.x; w < (tf_idx)kB * kH * kNQ; w += gridDim.x) {   // (b, h, query tile)");
    cu_line(s, 2, "const tf_idx bh = w / kNQ, b = bh / kH, h = bh %% kH, kv = b * kHk + h / kG;");
    cu_line(s, 2, "const int i0 = (int)(w %% kNQ) * kBQ, nq = tf_min(kBQ, kTq - i0);   // query rows i0 .. i0 + nq - 1");
    cu_line(s, 2, "const int r0 = i0 + wq + g, r1 = r0 + 8;   // this lane's two rows");
    cu_line(s, 2, "__syncthreads();   // the previous rows' q is read");
    cu_line(s, 2, "tf_stage16(qs, kQS, b1 + (bh * kTq + i0) * kD, kD, kD, kBQ, nq);");
    cu_line(s, 2, "__syncthreads();");
    cu_line(s, 2, "unsigned qa[kKQ][4];   // the warp's rows of q as A fragments");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int kk = 0; kk < kKQ; kk++)");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int x = 0; x < 4; x++) qa[kk][x] = tf_ld2(qs + (wq + g + (x & 1) * 8) * kQS + kk * 16 + (x >> 1) * 8 + 2 * c);");
    cu_line(s, 2, "float o[kNO][4], m[2], l[2];   // O's sums; each row's running max and this lane's part of its sum");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int n = 0; n < kNO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;");
    cu_line(s, 2, "m[0] = m[1] = tf_neg_inf();");
    cu_line(s, 2, "l[0] = l[1] = 0.0f;");
    if (g->causal) cu_line(s, 2, "const int nk = tf_min(kTk, i0 + kBQ);   // causal: no row of the tile sees a key past its last row");
    else cu_line(s, 2, "const int nk = kTk;");
    cu_line(s, 2, "for (int j0 = 0; j0 < nk; j0 += kBK) {");
    cu_line(s, 3, "const int nj = tf_min(kBK, kTk - j0);   // keys j0 .. j0 + nj - 1");
    cu_line(s, 3, "__syncthreads();   // the previous key tile is used up");
    cu_line(s, 3, "tf_stage16(ks, kKS, b2 + (kv * kTk + j0) * kD, kD, kD, kBK, nj);");
    cu_line(s, 3, "tf_stage16(vs, kVS, b3 + (kv * kTk + j0) * kDv, kDv, kDv, kBK, nj);");
    cu_line(s, 3, "__syncthreads();");
    cu_line(s, 3, "if (wq >= nq%s) continue;   // the warp's rows are past the end%s", g->causal ? " || j0 > i0 + wq + 15" : "",
            g->causal ? " or see none of these keys" : "");
    cu_line(s, 3, "float sc[kNS][4];   // S: keys j0 + 8 n + 2 c (+1) of rows r0 and r1");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int n = 0; n < kNS; n++) {");
    cu_line(s, 4, "sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 4, "for (int kk = 0; kk < kKQ; kk++) {");
    cu_line(s, 5, "const unsigned short *kr = ks + (n * 8 + g) * kKS + kk * 16 + 2 * c;   // B = k^T: column n of B is key n's row");
    cu_line(s, 5, "const unsigned kb[2] = {tf_ld2(kr), tf_ld2(kr + 8)};");
    cu_line(s, 5, "tf_mma(sc[n], qa[kk], kb);");
    cu_line(s, 4, "}");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 4, "for (int x = 0; x < 4; x++) sc[n][x] = tf_score_of(sc[n][x], b, h, x < 2 ? r0 : r1, j0 + n * 8 + 2 * c + (x & 1)%s);", mk);
    cu_line(s, 3, "}");
    cu_line(s, 3, "// the online softmax of rows r0, r1: the tile's max over the row's 4 lanes, P_ij = exp(s_ij - max), the factor");
    cu_line(s, 3, "float f[2], mx[2] = {tf_neg_inf(), tf_neg_inf()};");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int n = 0; n < kNS; n++)");
    cu_line(s, 4, "for (int x = 0; x < 4; x++) mx[x >> 1] = fmaxf(mx[x >> 1], sc[n][x]);");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int r = 0; r < 2; r++) {");
    cu_line(s, 4, "mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));");
    cu_line(s, 4, "mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));");
    cu_line(s, 4, "const float m1 = fmaxf(m[r], mx[r]);");
    cu_line(s, 4, "f[r] = m1 == tf_neg_inf() ? 1.0f : expf(m[r] - m1);");
    cu_line(s, 4, "m[r] = m1;");
    cu_line(s, 4, "l[r] *= f[r];");
    cu_line(s, 3, "}");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int n = 0; n < kNS; n++)");
    cu_line(s, 4, "for (int x = 0; x < 4; x++) {");
    cu_line(s, 5, "const float p = m[x >> 1] == tf_neg_inf() ? 0.0f : expf(sc[n][x] - m[x >> 1]);   // a hidden key: exp(-inf) = 0");
    cu_line(s, 5, "l[x >> 1] += p;   // l sums P unrounded%s", a->drop ? " and undropped" : "");
    if (a->drop)
        cu_line(s, 5, "sc[n][x] = tf_keep(key, bh, x < 2 ? r0 : r1, j0 + n * 8 + 2 * c + (x & 1)) != 0.0f ? p : 0.0f;");
    else cu_line(s, 5, "sc[n][x] = p;");
    cu_line(s, 4, "}");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int n = 0; n < kNO; n++) {");
    cu_line(s, 4, "o[n][0] *= f[0], o[n][1] *= f[0];");
    cu_line(s, 4, "o[n][2] *= f[1], o[n][3] *= f[1];");
    cu_line(s, 3, "}");
    cu_line(s, 3, "// O += P v, 16 keys a step: P's C fragments of keys 16 kk .. as an A fragment (rounded to %s)", tf_dtype_name(a->half));
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int kk = 0; kk < kBK / 16; kk++) {");
    cu_line(s, 4, "const unsigned pa[4] = {tf_pack(sc[2 * kk][0], sc[2 * kk][1]), tf_pack(sc[2 * kk][2], sc[2 * kk][3]),");
    cu_line(s, 4, "                        tf_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), tf_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};");
    cu_line(s, 4, "const unsigned short *vr = vs + (kk * 16 + 2 * c) * kVS + g;   // B = v: rows 2c, 2c + 1 (+ 8) of column g");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 4, "for (int n = 0; n < kNO; n++) {");
    cu_line(s, 5, "const unsigned short *e = vr + n * 8;");
    cu_line(s, 5, "const unsigned vb[2] = {(unsigned)e[0] | (unsigned)e[kVS] << 16, (unsigned)e[8 * kVS] | (unsigned)e[9 * kVS] << 16};");
    cu_line(s, 5, "tf_mma(o[n], pa, vb);");
    cu_line(s, 4, "}");
    cu_line(s, 3, "}");
    cu_line(s, 2, "}");
    cu_line(s, 2, "// O_i = its sums / l_i%s, 0 for a row that sees no key%s", a->drop ? " (times 1/(1-p))" : "",
            g->lse ? "; the log-sum-exp max + log l (-inf)" : "");
    char z[64] = "";
    if (a->drop) {
        cu_literal(TF_DT_F32, (double)(float)(1.0 / (1.0 - g->dropout)), z, sizeof z);
        memmove(z + 3, z, strlen(z) + 1);
        memcpy(z, " * ", 3);
    }
    store_as(a, "(l[r] > 0.0f ? o[n][2 * r + e] / l[r] : 0.0f)", st, sizeof st);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int r = 0; r < 2; r++) {");
    cu_line(s, 3, "l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);");
    cu_line(s, 3, "l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);");
    cu_line(s, 3, "const int i = r ? r1 : r0;");
    cu_line(s, 3, "if (i >= kTq) continue;");
    if (a->drop) {
        cu_line(s, 0, "#pragma unroll");
        cu_line(s, 3, "for (int n = 0; n < kNO; n++) o[n][2 * r] = o[n][2 * r]%s, o[n][2 * r + 1] = o[n][2 * r + 1]%s;", z, z);
    }
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int n = 0; n < kNO; n++)");
    cu_line(s, 4, "for (int e = 0; e < 2; e++) b0[(bh * kTq + i) * kW + n * 8 + 2 * c + e] = %s;", st);
    if (g->lse) {
        store_as(a, "(l[r] > 0.0f ? m[r] + logf(l[r]) : tf_neg_inf())", st, sizeof st);
        cu_line(s, 3, "if (c == 0) b0[(bh * kTq + i) * kW + kDv] = %s;", st);
    }
    cu_line(s, 2, "}");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

/* ---- the backward on tensor cores ---- */

/* tf_mma_rows: a tile's row statistics; the backward's helpers beyond the forward's. */
static void emit_grad_mma_rows(ak *a)
{
    sb *s = &a->s;
    const tf_node *n = a->n;
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// rows i0 .. i0 + kRows - 1 of head bh: each row's log-sum-exp (out's last column) into rl, D_i = dO_i . O_i%s into rd;",
            a->wd > a->g.Dv ? " - dlse_i" : "");
    cu_line(s, 0, "// rows past the end: -inf and 0 (they see nothing)");
    cu_line(s, 0, "template <int kRows>");
    cu_line(s, 0, "__device__ __forceinline__ void tf_mma_rows(float *rl, float *rd, const %s *out, const %s *dout, tf_idx bh, int i0)",
            cu_storage_type(n->in[3]->type.dtype), cu_storage_type(n->in[4]->type.dtype));
    cu_line(s, 0, "{");
    cu_line(s, 1, "constexpr int kG8 = kNT / kRows;   // threads a row");
    cu_line(s, 1, "const int r = threadIdx.x / kG8, l = threadIdx.x %% kG8, i = i0 + r;");
    cu_line(s, 1, "const tf_idx row = bh * kTq + i;");
    cu_line(s, 1, "float d = 0.0f;");
    cu_line(s, 1, "if (i < kTq)");
    cu_line(s, 2, "for (int e = l; e < kDv; e += kG8) d += tf_real(dout[row * kWd + e]) * tf_real(out[row * (kDv + 1) + e]);");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 1, "for (int s = kG8 / 2; s > 0; s >>= 1) d += __shfl_xor_sync(0xffffffffu, d, s, kG8);");
    cu_line(s, 1, "if (l == 0) {");
    cu_line(s, 2, "rl[r] = i < kTq ? tf_real(out[row * (kDv + 1) + kDv]) : tf_neg_inf();");
    if (a->wd > a->g.Dv) cu_line(s, 2, "rd[r] = i < kTq ? d - tf_real(dout[row * kWd + kDv]) : 0.0f;");
    else cu_line(s, 2, "rd[r] = d;");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

/* P_ij (times Z_ij) and dS_ij from a score's dot, the row's log-sum-exp and D_i, the dP_ij in `dp`: the lines that set
 * `p` and `ds` (declared by the caller, 0 where row i does not see key j). */
static void emit_grad_mma_element(ak *a, int depth, const char *dot, const char *i, const char *j, const char *lse, const char *dd,
                                  const char *dp)
{
    sb *s = &a->s;
    char sc[64], mk[16] = "";
    cu_literal(TF_DT_F32, (double)(float)a->g.scale, sc, sizeof sc);
    if (a->g.mask >= 0) snprintf(mk, sizeof mk, ", b%d", mask_param(a));
    cu_line(s, depth, "const float sij = tf_score_of(%s, b, h, %s, %s%s);", dot, i, j, mk);
    cu_line(s, depth, "if (sij != tf_neg_inf() && %s != tf_neg_inf()) {", lse);
    cu_line(s, depth + 1, "p = expf(sij - %s);", lse);
    if (a->drop) {
        cu_line(s, depth + 1, "const float z = tf_keep(key, bh, %s, %s);", i, j);
        cu_line(s, depth + 1, "ds = p * (z * %s - %s) * %s;", dp, dd, sc);
        cu_line(s, depth + 1, "p *= z;");
    } else {
        cu_line(s, depth + 1, "ds = p * (%s - %s) * %s;", dp, dd, sc);
    }
    cu_line(s, depth, "}");
}

/* A warp's A fragments of 16 rows (from `row0` of a staged tile) over `len` columns into `name`. */
static void emit_frags(ak *a, int depth, const char *name, const char *tile, const char *stride, const char *len)
{
    sb *s = &a->s;
    cu_line(s, depth, "unsigned %s[%s / 16][4];", name, len);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth, "for (int kk = 0; kk < %s / 16; kk++)", len);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth + 1, "for (int x = 0; x < 4; x++) %s[kk][x] = tf_ld2(%s + (x & 1) * 8 * %s + kk * 16 + (x >> 1) * 8 + 2 * c);", name, tile,
            stride);
}

/* acc[n] += (dS's C fragments cf[..]: 8 columns each, `cols` of them) times a staged tile's rows (the same 8 a step)
 * by tf32 MMA, dS split in two. */
static void emit_ds_times(ak *a, int depth, const char *acc, const char *cf, const char *cols, const char *tile, const char *stride,
                          const char *len)
{
    sb *s = &a->s;
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth, "for (int n = 0; n < %s / 8; n++) {", cols);
    cu_line(s, depth + 1, "unsigned hi[4], lo[4];");
    cu_line(s, depth + 1, "tf_split(%s[n], hi, lo);", cf);
    cu_line(s, depth + 1, "const unsigned short *tr = %s + (n * 8 + 2 * c) * %s + g;   // B: rows 2c, 2c + 1 (as c, c + 4) of column g", tile,
            stride);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth + 1, "for (int e = 0; e < %s / 8; e++) {", len);
    cu_line(s, depth + 2, "const unsigned tb[2] = {__float_as_uint(tf_widen(tr[e * 8])), __float_as_uint(tf_widen(tr[e * 8 + %s]))};", stride);
    cu_line(s, depth + 2, "tf_mma8(%s[e], hi, tb);", acc);
    cu_line(s, depth + 2, "tf_mma8(%s[e], lo, tb);", acc);
    cu_line(s, depth + 1, "}");
    cu_line(s, depth, "}");
}

/* A warp's C fragments acc[len / 8][4] zeroed. */
static void emit_zero(ak *a, int depth, const char *acc, const char *len)
{
    cu_line(&a->s, depth, "float %s[%s / 8][4];", acc, len);
    cu_line(&a->s, 0, "#pragma unroll");
    cu_line(&a->s, depth, "for (int n = 0; n < %s / 8; n++) %s[n][0] = %s[n][1] = %s[n][2] = %s[n][3] = 0.0f;", len, acc, acc, acc, acc);
}

/* c[n] += the warp's A fragments fa (over `len` columns, k-steps of 16) times B, whose column n is row n of a staged
 * tile: one C fragment per 8 rows of the tile, `rows` of them. */
static void emit_rows_product(ak *a, int depth, const char *c, const char *fa, const char *tile, const char *stride, const char *len)
{
    sb *s = &a->s;
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth, "for (int kk = 0; kk < %s / 16; kk++) {", len);
    cu_line(s, depth + 1, "const unsigned short *tr = %s + (n * 8 + g) * %s + kk * 16 + 2 * c;", tile, stride);
    cu_line(s, depth + 1, "const unsigned tb[2] = {tf_ld2(tr), tf_ld2(tr + 8)};");
    cu_line(s, depth + 1, "tf_mma(%s[n], %s[kk], tb);", c, fa);
    cu_line(s, depth, "}");
}

/* A warp's C fragments acc[len / 8][4] of rows r0 (and r0 + 8, both below `limit`) stored at b0[off + row * len + column]. */
static void emit_store_frags(ak *a, int depth, const char *acc, const char *off, const char *r0, const char *limit, const char *len)
{
    sb *s = &a->s;
    char st[128], v[64];
    snprintf(v, sizeof v, "%s[n][2 * r + e]", acc);
    store_as(a, v, st, sizeof st);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth, "for (int r = 0; r < 2; r++) {");
    cu_line(s, depth + 1, "const int i = %s + 8 * r;", r0);
    cu_line(s, depth + 1, "if (i >= %s) continue;", limit);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth + 1, "for (int n = 0; n < %s / 8; n++)", len);
    cu_line(s, depth + 2, "for (int e = 0; e < 2; e++) b0[%s + (tf_idx)i * %s + n * 8 + 2 * c + e] = %s;", off, len, st);
    cu_line(s, depth, "}");
}

/* The first kernel: a block per (b, key/value head, 64 keys), warp w the keys 16 w .. 16 w + 15, walking query tiles of
 * kQT rows of every query head of the group: S^T = k q^T and dP^T = v dO^T by MMA (k's and v's rows of the warp as A
 * fragments), P^T and dS^T on the C fragments, dV += (P Z)^T dO (rounded, as the op defines) and dK += dS^T q (dS in
 * f32, split in two tf32 terms). */
static void emit_grad_mma_kv(ak *a)
{
    sb *s = &a->s;
    tf_strbuf_append(s, "\n", 1);
    emit_entry(a, "");
    cu_line(s, 1, "unsigned short *ks = (unsigned short *)tf_smem;   // [kBK][kKS]: the block's keys");
    cu_line(s, 1, "unsigned short *vs = ks + kBK * kKS;   // [kBK][kVS]: and values");
    cu_line(s, 1, "unsigned short *qs = vs + kBK * kVS;   // [kQT][kQS]: a tile of query rows");
    cu_line(s, 1, "unsigned short *dos = qs + kQT * kQS;  // [kQT][kOS]: and their dO");
    cu_line(s, 1, "float *rl = (float *)(dos + kQT * kOS);   // [kQT]: each row's log-sum-exp");
    cu_line(s, 1, "float *rd = rl + kQT;                     // [kQT]: each row's D_i");
    cu_line(s, 1, "const int t = threadIdx.x, wk = (t >> 5) * 16, g = (t & 31) >> 2, c = t & 3;   // lane 4 g + c of the warp of keys wk ..");
    emit_key(a);
    cu_line(s, 1, "for (tf_idx w = blockIdx.x; w < (tf_idx)kB * kHk * kNK; w += gridDim.x) {   // (b, key/value head, key tile)");
    cu_line(s, 2, "const tf_idx kv = w / kNK, b = kv / kHk;");
    cu_line(s, 2, "const int j0 = (int)(w %% kNK) * kBK, nj = tf_min(kBK, kTk - j0);   // keys j0 .. j0 + nj - 1");
    cu_line(s, 2, "const int jr = j0 + wk + g;   // this lane's keys: jr and jr + 8");
    cu_line(s, 2, "__syncthreads();   // the previous keys are used up");
    cu_line(s, 2, "tf_stage16(ks, kKS, b2 + (kv * kTk + j0) * kD, kD, kD, kBK, nj);");
    cu_line(s, 2, "tf_stage16(vs, kVS, b3 + (kv * kTk + j0) * kDv, kDv, kDv, kBK, nj);");
    cu_line(s, 2, "__syncthreads();");
    emit_frags(a, 2, "ka", "ks + (wk + g) * kKS", "kKS", "kD");
    emit_frags(a, 2, "va", "vs + (wk + g) * kVS", "kVS", "kDv");
    emit_zero(a, 2, "dk", "kD");
    emit_zero(a, 2, "dv", "kDv");
    cu_line(s, 2, "for (tf_idx h = kv %% kHk * kG; h < (kv %% kHk + 1) * kG; h++) {   // the query heads that read this head");
    cu_line(s, 3, "const tf_idx bh = b * kH + h;");
    if (a->g.causal)
        cu_line(s, 3, "for (int i0 = j0 / kQT * kQT; i0 < kTq; i0 += kQT) {   // causal: rows before j0 see none of these keys");
    else cu_line(s, 3, "for (int i0 = 0; i0 < kTq; i0 += kQT) {");
    cu_line(s, 4, "const int nq = tf_min(kQT, kTq - i0);");
    cu_line(s, 4, "__syncthreads();   // the previous rows are used up");
    cu_line(s, 4, "tf_stage16(qs, kQS, b1 + (bh * kTq + i0) * kD, kD, kD, kQT, nq);");
    cu_line(s, 4, "tf_stage16(dos, kOS, b5 + (bh * kTq + i0) * kWd, kWd, kDv, kQT, nq);");
    cu_line(s, 4, "tf_mma_rows<kQT>(rl, rd, b4, b5, bh, i0);");
    cu_line(s, 4, "__syncthreads();");
    cu_line(s, 4, "if (wk >= nj%s) continue;   // the warp's keys are past the end%s", a->g.causal ? " || i0 + kQT - 1 < j0 + wk" : "",
            a->g.causal ? ", or after every row of the tile" : "");
    cu_line(s, 4, "float st[kQT / 8][4], dp[kQT / 8][4];   // S^T and dP^T, then (P Z)^T and dS^T: keys jr (+8), rows i0 + 8 n + 2c (+1)");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 4, "for (int n = 0; n < kQT / 8; n++) {");
    cu_line(s, 5, "st[n][0] = st[n][1] = st[n][2] = st[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;");
    emit_rows_product(a, 5, "st", "ka", "qs", "kQS", "kD");
    emit_rows_product(a, 5, "dp", "va", "dos", "kOS", "kDv");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 5, "for (int x = 0; x < 4; x++) {");
    cu_line(s, 6, "const int j = jr + (x >> 1) * 8, i = i0 + n * 8 + 2 * c + (x & 1);");
    cu_line(s, 6, "float p = 0.0f, ds = 0.0f;");
    emit_grad_mma_element(a, 6, "st[n][x]", "i", "j", "rl[i - i0]", "rd[i - i0]", "dp[n][x]");
    cu_line(s, 6, "st[n][x] = p;");
    cu_line(s, 6, "dp[n][x] = ds;");
    cu_line(s, 5, "}");
    cu_line(s, 4, "}");
    cu_line(s, 4, "// dV_j += sum_i P_ij%s dO_i, both rounded to %s: (P Z)^T's C fragments, two by two, as A fragments",
            a->drop ? " Z_ij" : "", tf_dtype_name(a->half));
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 4, "for (int kk = 0; kk < kQT / 16; kk++) {");
    cu_line(s, 5, "const unsigned pa[4] = {tf_pack(st[2 * kk][0], st[2 * kk][1]), tf_pack(st[2 * kk][2], st[2 * kk][3]),");
    cu_line(s, 5, "                        tf_pack(st[2 * kk + 1][0], st[2 * kk + 1][1]), tf_pack(st[2 * kk + 1][2], st[2 * kk + 1][3])};");
    cu_line(s, 5, "const unsigned short *orow = dos + (kk * 16 + 2 * c) * kOS + g;   // B = dO: rows 2c, 2c + 1 (+ 8) of column g");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 5, "for (int e = 0; e < kDv / 8; e++) {");
    cu_line(s, 6, "const unsigned short *x = orow + e * 8;");
    cu_line(s, 6, "const unsigned ob[2] = {(unsigned)x[0] | (unsigned)x[kOS] << 16, (unsigned)x[8 * kOS] | (unsigned)x[9 * kOS] << 16};");
    cu_line(s, 6, "tf_mma(dv[e], pa, ob);");
    cu_line(s, 5, "}");
    cu_line(s, 4, "}");
    cu_line(s, 4, "// dK_j += sum_i dS_ij q_i");
    emit_ds_times(a, 4, "dk", "dp", "kQT", "qs", "kQS", "kD");
    cu_line(s, 3, "}");
    cu_line(s, 2, "}");
    emit_store_frags(a, 2, "dk", "kOffK + (kv * kTk) * kD", "jr", "kTk", "kD");
    emit_store_frags(a, 2, "dv", "kOffV + (kv * kTk) * kDv", "jr", "kTk", "kDv");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

/* The second kernel: dQ, a block per (b, h, 64 query rows), warp w the rows 16 w ..: S = q k^T and dP = dO v^T by MMA
 * (q's and dO's rows as A fragments), dS on the C fragments, dQ += dS k (dS split in two tf32 terms). */
static void emit_grad_mma_q(ak *a)
{
    sb *s = &a->s;
    tf_strbuf_append(s, "\n", 1);
    emit_entry(a, "_b");
    cu_line(s, 1, "unsigned short *qs = (unsigned short *)tf_smem;   // [kBQ][kQS]: the block's query rows");
    cu_line(s, 1, "unsigned short *dos = qs + kBQ * kQS;  // [kBQ][kOS]: and their dO");
    cu_line(s, 1, "unsigned short *ks = dos + kBQ * kOS;  // [kKT][kKS]: a tile of keys");
    cu_line(s, 1, "unsigned short *vs = ks + kKT * kKS;   // [kKT][kVS]: and values");
    cu_line(s, 1, "float *rl = (float *)(vs + kKT * kVS);   // [kBQ]: each row's log-sum-exp");
    cu_line(s, 1, "float *rd = rl + kBQ;                    // [kBQ]: each row's D_i");
    cu_line(s, 1, "const int t = threadIdx.x, wq = (t >> 5) * 16, g = (t & 31) >> 2, c = t & 3;   // lane 4 g + c of the warp of rows wq ..");
    emit_key(a);
    cu_line(s, 1, "for (tf_idx w = blockIdx.x; w < (tf_idx)kB * kH * kNQ; w += gridDim.x) {   // (b, h, query tile)");
    cu_line(s, 2, "const tf_idx bh = w / kNQ, b = bh / kH, h = bh %% kH, kv = b * kHk + h / kG;");
    cu_line(s, 2, "const int i0 = (int)(w %% kNQ) * kBQ, nq = tf_min(kBQ, kTq - i0);   // query rows i0 .. i0 + nq - 1");
    cu_line(s, 2, "const int r0 = i0 + wq + g;   // this lane's rows: r0 and r0 + 8");
    cu_line(s, 2, "__syncthreads();   // the previous rows are used up");
    cu_line(s, 2, "tf_stage16(qs, kQS, b1 + (bh * kTq + i0) * kD, kD, kD, kBQ, nq);");
    cu_line(s, 2, "tf_stage16(dos, kOS, b5 + (bh * kTq + i0) * kWd, kWd, kDv, kBQ, nq);");
    cu_line(s, 2, "tf_mma_rows<kBQ>(rl, rd, b4, b5, bh, i0);");
    cu_line(s, 2, "__syncthreads();");
    emit_frags(a, 2, "qa", "qs + (wq + g) * kQS", "kQS", "kD");
    emit_frags(a, 2, "oa", "dos + (wq + g) * kOS", "kOS", "kDv");
    cu_line(s, 2, "const float lse[2] = {rl[wq + g], rl[wq + g + 8]}, dd[2] = {rd[wq + g], rd[wq + g + 8]};");
    emit_zero(a, 2, "dq", "kD");
    if (a->g.causal) cu_line(s, 2, "const int nk = tf_min(kTk, i0 + kBQ);   // causal: no row of the tile sees a key past its last row");
    else cu_line(s, 2, "const int nk = kTk;");
    cu_line(s, 2, "for (int j0 = 0; j0 < nk; j0 += kKT) {");
    cu_line(s, 3, "const int nj = tf_min(kKT, kTk - j0);");
    cu_line(s, 3, "__syncthreads();   // the previous key tile is used up");
    cu_line(s, 3, "tf_stage16(ks, kKS, b2 + (kv * kTk + j0) * kD, kD, kD, kKT, nj);");
    cu_line(s, 3, "tf_stage16(vs, kVS, b3 + (kv * kTk + j0) * kDv, kDv, kDv, kKT, nj);");
    cu_line(s, 3, "__syncthreads();");
    cu_line(s, 3, "if (wq >= nq%s) continue;   // the warp's rows are past the end%s", a->g.causal ? " || j0 > i0 + wq + 15" : "",
            a->g.causal ? " or see none of these keys" : "");
    cu_line(s, 3, "float sc[kKT / 8][4], dp[kKT / 8][4];   // S and dP, then dS: rows r0 (+8), keys j0 + 8 n + 2c (+1)");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 3, "for (int n = 0; n < kKT / 8; n++) {");
    cu_line(s, 4, "sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;");
    emit_rows_product(a, 4, "sc", "qa", "ks", "kKS", "kD");
    emit_rows_product(a, 4, "dp", "oa", "vs", "kVS", "kDv");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 4, "for (int x = 0; x < 4; x++) {");
    cu_line(s, 5, "const int i = r0 + (x >> 1) * 8, j = j0 + n * 8 + 2 * c + (x & 1);");
    cu_line(s, 5, "float p = 0.0f, ds = 0.0f;");
    emit_grad_mma_element(a, 5, "sc[n][x]", "i", "j", "lse[x >> 1]", "dd[x >> 1]", "dp[n][x]");
    cu_line(s, 5, "(void)p;");
    cu_line(s, 5, "dp[n][x] = ds;");
    cu_line(s, 4, "}");
    cu_line(s, 3, "}");
    cu_line(s, 3, "// dQ_i += sum_j dS_ij k_j");
    emit_ds_times(a, 3, "dq", "dp", "kKT", "ks", "kKS", "kD");
    cu_line(s, 2, "}");
    emit_store_frags(a, 2, "dq", "(bh * kTq) * kD", "r0", "kTq", "kD");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

/* ---- the backward kernels ---- */

/* tf_grad_rows: a query tile staged with its row statistics; tf_grad_tile: P Z and dS against a key tile. */
static void emit_grad_helpers(ak *a)
{
    sb *s = &a->s;
    const tf_attn_geom *g = &a->g;
    const char *R = a->real;
    const tf_node *n = a->n;
    char md[96];
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// query rows i0 .. of head bh: q and dO staged, each row's log-sum-exp (out's last column) and");
    cu_line(s, 0, "// D_i = dO_i . O_i%s; rows past the end: lse -inf (they see nothing)", a->wd > g->Dv ? " - dlse_i" : "");
    cu_line(s, 0, "__device__ void tf_grad_rows(%s *qs, %s *dos, %s *rl, %s *rd, const %s *q, const %s *out, const %s *dout, tf_idx bh,"
            " int i0)", R, R, R, R, cu_storage_type(n->in[0]->type.dtype), cu_storage_type(n->in[3]->type.dtype),
            cu_storage_type(n->in[4]->type.dtype));
    cu_line(s, 0, "{");
    cu_line(s, 1, "const int nq = tf_min(kBQ, kTq - i0), r = threadIdx.x / kRG, l = threadIdx.x %% kRG;");
    cu_line(s, 1, "const tf_idx row = bh * kTq + i0;");
    cu_line(s, 1, "__syncthreads();   // the previous rows are used up");
    cu_line(s, 1, "tf_stage(qs, kD, q + row * kD, kD, kD, kBQ, nq);");
    cu_line(s, 1, "tf_stage(dos, kDv, dout + row * kWd, kWd, kDv, kBQ, nq);");
    cu_line(s, 1, "__syncthreads();");
    cu_line(s, 1, "%s d = %s;", R, a->zero);
    cu_line(s, 1, "if (r < nq)");
    cu_line(s, 2, "for (int e = l; e < kDv; e += kRG) d += dos[r * kDv + e] * tf_real(out[(row + r) * (kDv + 1) + e]);");
    cu_line(s, 1, "d = tf_row_sum(d);");
    cu_line(s, 1, "if (l == 0) {");
    cu_line(s, 2, "rl[r] = r < nq ? tf_real(out[(row + r) * (kDv + 1) + kDv]) : tf_neg_inf();");
    if (a->wd > g->Dv) cu_line(s, 2, "rd[r] = r < nq ? d - tf_real(dout[(row + r) * kWd + kDv]) : %s;", a->zero);
    else cu_line(s, 2, "rd[r] = d;");
    cu_line(s, 1, "}");
    cu_line(s, 1, "__syncthreads();");
    cu_line(s, 0, "}");
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "// the query tile (rows i0 ..) against the key tile (keys j0 ..): pz = P_ij%s%s, ds = dS_ij = P_ij (%sdO_i . v_j - D_i) scale,",
            a->drop ? " Z_ij" : "", lowp(a) ? " (rounded)" : "", a->drop ? "Z_ij " : "");
    cu_line(s, 0, "// [kBQ][kBK]; P_ij = exp(s_ij - lse_i), 0 where row i does not see key j");
    cu_line(s, 0, "__device__ void tf_grad_tile(%s *pz, %s *ds, const %s *qs, const %s *dos, const %s *rl, const %s *rd, const %s *ks,",
            R, R, R, R, R, R, R);
    cu_line(s, 0, "                             const %s *vs, tf_idx b, tf_idx h, int i0, int j0%s%s)", R, mask_decl(a, md, sizeof md),
            a->drop ? ", unsigned long long key" : "");
    cu_line(s, 0, "{");
    char sc[64];
    cu_literal(a->f64 ? TF_DT_F64 : TF_DT_F32, a->f64 ? g->scale : (double)(float)g->scale, sc, sizeof sc);
    cu_line(s, 1, "for (int x = threadIdx.x; x < kBQ * kBK; x += kNT) {");
    cu_line(s, 2, "const int r = x / kBK, c = x %% kBK;");
    cu_line(s, 2, "const %s sij = tf_score(qs + r * kD, ks + c * kKS, b, h, i0 + r, j0 + c%s);", R, g->mask >= 0 ? ", mask" : "");
    cu_line(s, 2, "%s p = %s, d = %s;", R, a->zero, a->zero);
    cu_line(s, 2, "if (sij != tf_neg_inf() && rl[r] != tf_neg_inf()) {");
    cu_line(s, 3, "p = %s(sij - rl[r]);", a->expf);
    cu_line(s, 3, "%s dp = %s;", R, a->zero);
    cu_line(s, 3, "for (int e = 0; e < kDv; e++) dp += dos[r * kDv + e] * vs[c * kVS + e];");
    if (a->drop) {
        cu_line(s, 3, "const %s z = tf_keep(key, (tf_idx)b * kH + h, i0 + r, j0 + c);", R);
        cu_line(s, 3, "d = p * (z * dp - rd[r]) * %s;", sc);
        cu_line(s, 3, "p *= z;");
    } else {
        cu_line(s, 3, "d = p * (dp - rd[r]) * %s;", sc);
    }
    cu_line(s, 2, "}");
    cu_line(s, 2, "pz[x] = %s;", lowp(a) ? "tf_round16(p)" : "p");
    cu_line(s, 2, "ds[x] = d;");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

/* tf_grad_tile's last arguments: the mask, the dropout key. */
static void grad_tile_tail(const ak *a, char *out, size_t n)
{
    char mk[16] = "";
    if (a->g.mask >= 0) snprintf(mk, sizeof mk, ", b%d", mask_param(a));
    snprintf(out, n, "%s%s", mk, a->drop ? ", key" : "");
}

/* Both backward kernels' shared memory. */
static void emit_grad_smem(ak *a)
{
    sb *s = &a->s;
    const char *R = a->real;
    cu_line(s, 1, "%s *ks = (%s *)tf_smem;    // [kBK][kKS]: a tile of keys", R, R);
    cu_line(s, 1, "%s *vs = ks + kBK * kKS;   // [kBK][kVS]: and of values", R);
    cu_line(s, 1, "%s *qs = vs + kBK * kVS;   // [kBQ][kD]: a tile of query rows", R);
    cu_line(s, 1, "%s *dos = qs + kBQ * kD;   // [kBQ][kDv]: and their dO", R);
    cu_line(s, 1, "%s *pz = dos + kBQ * kDv;  // [kBQ][kBK]: P_ij%s", R, a->drop ? " Z_ij" : "");
    cu_line(s, 1, "%s *ds = pz + kBQ * kBK;   // [kBQ][kBK]: dS_ij", R);
    cu_line(s, 1, "%s *rl = ds + kBQ * kBK;   // [kBQ]: each row's log-sum-exp", R);
    cu_line(s, 1, "%s *rd = rl + kBQ;         // [kBQ]: each row's D_i", R);
    cu_line(s, 1, "const int t = threadIdx.x;");
    emit_key(a);
}

/* acc[x] += sum over `over` of a[o][..] b[o][..] for this thread's elements of a [rows][len] accumulator. */
static void emit_accumulate(ak *a, int depth, const char *acc, const char *nacc, const char *rows, const char *len, const char *over,
                            const char *lhs, const char *rhs)
{
    sb *s = &a->s;
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, depth, "for (int x = 0; x < %s; x++) {", nacc);
    cu_line(s, depth + 1, "const int y = t + x * kNT, u = y / %s, e = y %% %s;   // element (u, e)", len, len);
    cu_line(s, depth + 1, "if (y >= %s * %s) break;", rows, len);
    cu_line(s, depth + 1, "%s a = %s[x];", a->real, acc);
    cu_line(s, depth + 1, "for (int o = 0; o < %s; o++) a += %s * %s;", over, lhs, rhs);
    cu_line(s, depth + 1, "%s[x] = a;", acc);
    cu_line(s, depth, "}");
}

/* The first kernel: dK and dV, a block per (b, key/value head, key tile). */
static void emit_grad_kv(ak *a)
{
    sb *s = &a->s;
    const char *R = a->real;
    char tail[64];
    grad_tile_tail(a, tail, sizeof tail);
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "constexpr int kRK = (kBK * kD + kNT - 1) / kNT, kRV = (kBK * kDv + kNT - 1) / kNT;   // dK's and dV's accumulators a thread holds");
    emit_entry(a, "");
    emit_grad_smem(a);
    cu_line(s, 1, "for (tf_idx w = blockIdx.x; w < (tf_idx)kB * kHk * kNK; w += gridDim.x) {   // (b, key/value head, key tile)");
    cu_line(s, 2, "const tf_idx kv = w / kNK, b = kv / kHk;");
    cu_line(s, 2, "const int j0 = (int)(w %% kNK) * kBK, nj = tf_min(kBK, kTk - j0);   // keys j0 .. j0 + nj - 1");
    cu_line(s, 2, "__syncthreads();   // the previous keys are used up");
    cu_line(s, 2, "tf_stage(ks, kKS, b2 + (kv * kTk + j0) * kD, kD, kD, kBK, nj);");
    cu_line(s, 2, "tf_stage(vs, kVS, b3 + (kv * kTk + j0) * kDv, kDv, kDv, kBK, nj);");
    cu_line(s, 2, "%s dk[kRK], dv[kRV];   // elements t + kNT x of the tile's dK [kBK][kD] and dV [kBK][kDv]", R);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kRK; x++) dk[x] = %s;", a->zero);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kRV; x++) dv[x] = %s;", a->zero);
    cu_line(s, 2, "for (tf_idx h = kv %% kHk * kG; h < (kv %% kHk + 1) * kG; h++) {   // the query heads that read this head");
    if (a->g.causal)
        cu_line(s, 3, "for (int i0 = j0 / kBQ * kBQ; i0 < kTq; i0 += kBQ) {   // causal: rows before j0 see none of these keys");
    else cu_line(s, 3, "for (int i0 = 0; i0 < kTq; i0 += kBQ) {");
    cu_line(s, 4, "tf_grad_rows(qs, dos, rl, rd, b1, b4, b5, b * kH + h, i0);");
    cu_line(s, 4, "tf_grad_tile(pz, ds, qs, dos, rl, rd, ks, vs, b, h, i0, j0%s);", tail);
    cu_line(s, 4, "__syncthreads();");
    cu_line(s, 4, "// dV_j += sum_i P_ij%s dO_i%s; dK_j += sum_i dS_ij q_i", a->drop ? " Z_ij" : "", lowp(a) ? " (both rounded)" : "");
    emit_accumulate(a, 4, "dv", "kRV", "kBK", "kDv", "kBQ", "pz[o * kBK + u]", lowp(a) ? "tf_round16(dos[o * kDv + e])" : "dos[o * kDv + e]");
    emit_accumulate(a, 4, "dk", "kRK", "kBK", "kD", "kBQ", "ds[o * kBK + u]", "qs[o * kD + e]");
    cu_line(s, 3, "}");
    cu_line(s, 2, "}");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kRK; x++) {");
    cu_line(s, 3, "const int y = t + x * kNT, j = y / kD, e = y %% kD;");
    cu_line(s, 3, "if (y >= kBK * kD || j >= nj) break;");
    cu_line(s, 3, "b0[kOffK + (kv * kTk + j0 + j) * kD + e] = dk[x];");
    cu_line(s, 2, "}");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kRV; x++) {");
    cu_line(s, 3, "const int y = t + x * kNT, j = y / kDv, e = y %% kDv;");
    cu_line(s, 3, "if (y >= kBK * kDv || j >= nj) break;");
    cu_line(s, 3, "b0[kOffV + (kv * kTk + j0 + j) * kDv + e] = dv[x];");
    cu_line(s, 2, "}");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

/* The second kernel: dQ, a block per (b, h, query tile). */
static void emit_grad_q(ak *a)
{
    sb *s = &a->s;
    const char *R = a->real;
    char tail[64];
    grad_tile_tail(a, tail, sizeof tail);
    tf_strbuf_append(s, "\n", 1);
    cu_line(s, 0, "constexpr int kRQ = (kBQ * kD + kNT - 1) / kNT;   // dQ's accumulators a thread holds");
    emit_entry(a, "_b");
    emit_grad_smem(a);
    cu_line(s, 1, "for (tf_idx w = blockIdx.x; w < (tf_idx)kB * kH * kNQ; w += gridDim.x) {   // (b, h, query tile)");
    cu_line(s, 2, "const tf_idx bh = w / kNQ, b = bh / kH, h = bh %% kH, kv = b * kHk + h / kG;");
    cu_line(s, 2, "const int i0 = (int)(w %% kNQ) * kBQ, nq = tf_min(kBQ, kTq - i0);   // query rows i0 .. i0 + nq - 1");
    cu_line(s, 2, "tf_grad_rows(qs, dos, rl, rd, b1, b4, b5, bh, i0);");
    cu_line(s, 2, "%s dq[kRQ];   // elements t + kNT x of the tile's dQ [kBQ][kD]", R);
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kRQ; x++) dq[x] = %s;", a->zero);
    if (a->g.causal) cu_line(s, 2, "const int nk = tf_min(kTk, i0 + kBQ);   // causal: no row of the tile sees a key past its last row");
    else cu_line(s, 2, "const int nk = kTk;");
    cu_line(s, 2, "for (int j0 = 0; j0 < nk; j0 += kBK) {");
    cu_line(s, 3, "const int nj = tf_min(kBK, kTk - j0);");
    cu_line(s, 3, "__syncthreads();   // the previous key tile is used up");
    cu_line(s, 3, "tf_stage(ks, kKS, b2 + (kv * kTk + j0) * kD, kD, kD, kBK, nj);");
    cu_line(s, 3, "tf_stage(vs, kVS, b3 + (kv * kTk + j0) * kDv, kDv, kDv, kBK, nj);");
    cu_line(s, 3, "__syncthreads();");
    cu_line(s, 3, "tf_grad_tile(pz, ds, qs, dos, rl, rd, ks, vs, b, h, i0, j0%s);", tail);
    cu_line(s, 3, "__syncthreads();");
    cu_line(s, 3, "// dQ_i += sum_j dS_ij k_j");
    emit_accumulate(a, 3, "dq", "kRQ", "kBQ", "kD", "kBK", "ds[u * kBK + o]", "ks[o * kKS + e]");
    cu_line(s, 2, "}");
    cu_line(s, 0, "#pragma unroll");
    cu_line(s, 2, "for (int x = 0; x < kRQ; x++) {");
    cu_line(s, 3, "const int y = t + x * kNT, i = y / kD, e = y %% kD;");
    cu_line(s, 3, "if (y >= kBQ * kD || i >= nq) break;");
    cu_line(s, 3, "b0[(bh * kTq + i0 + i) * kD + e] = dq[x];");
    cu_line(s, 2, "}");
    cu_line(s, 1, "}");
    cu_line(s, 0, "}");
}

tf_ir_status cu_emit_attention(const tf_kernel *k, bool train, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    ak a;
    char why[256];
    if (!attention_op(k->lib->op)) snprintf(why, sizeof why, "kernel %s: not an attention op", k->name);
    if (!attention_op(k->lib->op) || !ak_init(&a, k, train, why, sizeof why))
        return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: %s", why);
    emit_head(&a);
    emit_loads(&a);
    emit_score(&a);
    if (a.grad && a.mma) {
        emit_grad_mma_rows(&a);
        emit_grad_mma_kv(&a);
        emit_grad_mma_q(&a);
    } else if (a.grad) {
        emit_grad_helpers(&a);
        emit_grad_kv(&a);
        emit_grad_q(&a);
    } else if (a.mma) {
        emit_forward_mma(&a);
    } else {
        emit_forward(&a);
    }
    if (a.s.oom) {
        tf_free(a.s.p);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    const tf_attn_geom *g = &a.g;
    cu_name_source(out, a.s.p, a.s.n);
    out->shape = TF_CUDA_ATTENTION;
    out->block = NT;
    out->smem = a.smem;
    out->grid = cu_blocks_for(a.grad ? g->B * g->Hk * cdiv(g->Tk, a.bk) : g->B * g->H * cdiv(g->Tq, a.bq), 1);
    if (a.grad) {
        snprintf(out->name2, sizeof out->name2, "%.19s_b", out->name);
        out->grid2 = cu_blocks_for(g->B * g->H * cdiv(g->Tq, a.bq), 1);
        out->block2 = NT;
        out->smem2 = a.smem;
    }
    unsigned align = 1;
    for (int q = -1; q < k->lib->nin; q++) {
        unsigned b = (unsigned)tf_dtype_bytes((q < 0 ? k->lib->out : k->lib->in[q])->type.dtype);
        if (b > align) align = b;
    }
    out->align = align;
    out->vec = 1;
    out->nparams = 1 + k->lib->nin + (a.drop ? 1 : 0);
    out->rng = a.drop;
    out->library = true;
    out->wide_index = a.wide;
    return TF_IR_OK;
}
