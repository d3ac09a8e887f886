/* cpu_explain.c — what the cpu target says about itself: --cpu-explain's
 * lines (how each matmul and convolution of a session runs), its lines of
 * `tfuse doctor`, and how it runs each op (tf_backend.op_support). */
#include <stdio.h>

#include "conv_dnnl.h"
#include "cpu_backend.h"
#include "cpu_ops.h"
#include "gemm_dnnl.h"
#ifdef TFUSE_HAVE_LLVM
#include "llvm.h"
#endif

#ifdef TFUSE_HAVE_LLVM

/* --cpu-explain: how each convolution runs. */
void tf_cpu_explain(FILE *f, const cpu *c)
{
    char lib[256], how[1024];
    tf_dnnl_describe(lib, sizeof lib);
    fprintf(f, "cpu: %d threads; convolutions and packed GEMMs: %s\n", tf_pool_threads(c->pool), lib);
    for (int i = 0; i < c->plan->nkernels; i++) {
        const ckernel *ck = &c->ks[i];
        if (ck->how == RUN_MATMUL || ck->how == RUN_MATMUL_BF16) {
            const tf_value *ov = ck->k->lib->out;
            int64_t N = ov->type.dims[ov->type.rank - 1].n, M = numel(ov) / (N ? N : 1);
            if (ck->dgemm) tf_dnnl_gemm_explain(ck->dgemm, how, sizeof how);
            else snprintf(how, sizeof how, "%s: %s", ck->how == RUN_MATMUL_BF16 ? "the bf16 GEMM" : tf_cpu_blas_name(),
                          ck->how == RUN_MATMUL_BF16 ? "bf16 operands" : ck->gemm_why);
            fprintf(f, "cpu: kernel %s: matmul (%lld x %lld) through %s\n", ck->k->name, (long long)M, (long long)N, how);
            continue;
        }
        if (ck->how == RUN_ATTENTION) {
            tf_attn_geom g;
            tf_attn_geom_of(ck->k->lib, &g);
            fprintf(f, "cpu: kernel %s: %s (B=%lld H=%lld Hk=%lld Tq=%lld Tk=%lld D=%lld Dv=%lld) through the flash attention "
                    "kernel: tiles of queries against tiles of keys, %s per tile, no [Tq, Tk] tensor\n", ck->k->name,
                    tf_op_info_of(ck->k->lib->op)->name, (long long)g.B, (long long)g.H, (long long)g.Hk, (long long)g.Tq,
                    (long long)g.Tk, (long long)g.D, (long long)g.Dv, tf_cpu_blas_name());
            continue;
        }
        if (ck->how != RUN_CONV && ck->how != RUN_CONV_GI && ck->how != RUN_CONV_GW) continue;
        const char *op = tf_op_info_of(ck->k->lib->op)->name;
        if (!ck->dnnl) {
            fprintf(f, "cpu: kernel %s: %s through im2col + GEMM (%s): %s\n", ck->k->name, op, tf_cpu_blas_name(), ck->conv_why);
            continue;
        }
        tf_dnnl_conv_explain(ck->dnnl, how, sizeof how);
        bool bx = tf_dnnl_conv_is_blocked(ck->dnnl, false), by = tf_dnnl_conv_is_blocked(ck->dnnl, true);
        fprintf(f, "cpu: kernel %s: %s through %s%s%s%s%s\n", ck->k->name, op, how,
                ck->epi_in_conv ? "; the region's epilogue is in the primitive (no epilogue kernel)" : "",
                bx && by ? "; image and result kept in nChw16c (no reorder)" : bx ? "; image kept in nChw16c (no reorder)"
                : by ? "; result kept in nChw16c (no reorder)" : "",
                ck->conv_why[0] ? "; " : "", ck->conv_why);
    }
}

#endif /* TFUSE_HAVE_LLVM */

void tf_cpu_doctor(tf_strbuf *out)
{
    char conv[256];
    tf_dnnl_describe(conv, sizeof conv);
#ifdef TFUSE_HAVE_LLVM
    char jit[1300];
    tf_strbuf_printf(out, "cpu: LLVM JIT %s\n", tf_jit_where(jit, sizeof jit));
#endif
    tf_strbuf_printf(out, "cpu: gemm %s, %d threads by default\n", tf_cpu_blas_name(), tf_cpu_count());
    if (tf_dnnl_available()) tf_strbuf_printf(out, "cpu: convolutions through %s\n", conv);
    else tf_strbuf_printf(out, "cpu: convolutions through im2col + GEMM (%s)\n", conv);
}

const char *tf_cpu_op_support(tf_op op, char *detail, size_t n)
{
    const char *name = tf_op_info_of(op)->name;
    if (tf_cpu_unavailable()) {
        snprintf(detail, n, "%s", tf_cpu_unavailable());
        return NULL;
    }
    bool library;
    const char *how = tf_op_support_plan(op, tf_cpu_jit_supports, "an alias of its operand's memory",
                                         "compiled by LLVM into its kernel (fused with its neighbours)",
                                         "the interpreter's kernel on widened copies", detail, n, &library);
    if (!library) return how;
    switch (tf_op_exec_of(op)) {
    case TF_OPX_GEMM:
        snprintf(detail, n, "GEMM through %s (f32, f16, bf16; f64 runs the interpreter's kernel)", tf_cpu_blas_name());
        return "library";
    case TF_OPX_CONV:
        if (tf_dnnl_available())
            snprintf(detail, n, "oneDNN's convolution primitives (2-d images in f32, f16, bf16; --cpu-conv=im2col: im2col + GEMM through %s)",
                     tf_cpu_blas_name());
        else
            snprintf(detail, n, "im2col + GEMM through %s (2-d images in f32, f16, bf16)", tf_cpu_blas_name());
        return "library";
    case TF_OPX_POOL: case TF_OPX_POOL_GRAD:
        snprintf(detail, n, "the runtime's pooling loops (2-d images in f32, f16, bf16)");
        return "library";
    case TF_OPX_GATHER: case TF_OPX_SCATTER:
        snprintf(detail, n, "rows copied or added on storage (i64/i32 ids)");
        return "library";
    case TF_OPX_CONCAT: case TF_OPX_SLICE_GRAD:
        snprintf(detail, n, "copies on storage (any dtype)");
        return "library";
    case TF_OPX_ATTENTION:
        snprintf(detail, n, "the runtime's flash attention: tiles of queries and keys, a GEMM through %s per tile, the online "
                 "softmax between (f32, f16, bf16; f64 runs the interpreter's kernel)", tf_cpu_blas_name());
        return "library";
    case TF_OPX_COMM:
        if (op == TF_OP_ALLREDUCE)
            snprintf(detail, n, "the gradient's bucket sent over MPI on a thread of its own while the backward pass goes on "
                     "(runtime/comm.c); a copy with one rank");
        else
            snprintf(detail, n, "%s: this rank's chunk of the value, or every rank's gathered over MPI (runtime/comm.c)", name);
        return "library";
    default:
        snprintf(detail, n, "%s has no cpu implementation: the interpreter's kernel runs it on widened copies", name);
        return "fallback";
    }
}
