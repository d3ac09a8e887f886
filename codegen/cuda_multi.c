/* cuda_multi.c — multi-tensor launches: the consecutive parts of one
 * multi-tensor region (an optimizer's update chains, one elementwise kernel
 * each) as one kernel, each part a pointwise loop (cu_emit_pointwise) over
 * its own range of the grid's blocks. cuda.h says which kernels form a span
 * and how the parameters are passed. */
#include "cuda_emit.h"

#include <stdio.h>
#include <string.h>

/* A multi-tensor launch's parameters stay within the 4 KiB every CUDA
 * driver and architecture accepts (newer ones take 32 KiB; PyTorch's
 * multi_tensor_apply keeps to 4 KiB as well); a region with more buffers
 * is several launches. Every part's blocks have MULTI_BLOCK threads. */
enum { MULTI_PARAM_BYTES = 4096, MULTI_BLOCK = 256 };

static bool multi_part_ok(const tf_kernel *k)
{
    if (!k->multi || k->kind != TF_K_ELEMENTWISE || !k->nstores || !tf_cuda_supports(k, NULL, 0)) return false;
    for (int i = 0; i < k->nexprs; i++)
        if (k->exprs[i].kind == TF_KX_OP && k->exprs[i].op == TF_OP_DROPOUT_MASK) return false;
    return true;
}

int tf_cuda_multi_span(const tf_kernel *ks, int n)
{
    if (n < 1 || !multi_part_ok(&ks[0])) return n < 1 ? 0 : 1;
    int span = 1, params = ks[0].nbufs;
    while (span < n && ks[span].region == ks[0].region && multi_part_ok(&ks[span]) &&
           (params + ks[span].nbufs) * (int)sizeof(void *) <= MULTI_PARAM_BYTES) {
        bool apart = true;
        for (int q = 0; q < span && apart; q++) apart = tf_kernels_independent(&ks[q], &ks[span]);
        if (!apart) break;
        params += ks[span].nbufs;
        span++;
    }
    return span;
}

int tf_cuda_multi_params(const tf_kernel *ks, int n, int *first)
{
    int total = 0, distinct = 0;
    for (int q = 0; q < n; q++)
        for (int b = 0; b < ks[q].nbufs; b++, total++) {
            first[total] = total;
            for (int r = 0, o = 0; r <= q && first[total] == total; r++)   /* at most 512 buffers: a plain search */
                for (int c = 0; c < ks[r].nbufs && o < total; c++, o++)
                    if (first[o] == o && ks[r].bufs[c].value == ks[q].bufs[b].value) {
                        first[total] = o;
                        break;
                    }
            distinct += first[total] == total;
        }
    return distinct;
}

tf_ir_status tf_cuda_emit_multi(const tf_kernel *ks, int n, tf_cuda_kernel *out, tf_diag *d)
{
    memset(out, 0, sizeof *out);
    if (n < 2 || tf_cuda_multi_span(ks, n) != n)
        return tf_diag_error(d, TF_IR_ERR_RUNTIME, NULL, "cuda: kernels %s.. (%d) are not one multi-tensor launch", n > 0 ? ks[0].name : "?", n);
    sb parts = {0}, params = {0}, body = {0};
    bool f16 = false, bf16 = false, vec = false;
    unsigned base = 0, align = 1;
    char **fns = tf_calloc((size_t)n, sizeof *fns);   /* the distinct parts' functions (from their parameters on) */
    int *fn_part = tf_calloc((size_t)n, sizeof *fn_part), nfns = 0;   /* the part each was first emitted for */
    int total = 0;
    for (int q = 0; q < n; q++) total += ks[q].nbufs;
    /* per buffer of the parts in turn: its parameter (the buffer it first comes as), and what the parameter's
     * type needs: written by any part, apart from every other buffer in all of them */
    int *first = tf_calloc((size_t)(total ? total : 1), sizeof *first);
    struct { int q, b; } *where = tf_calloc((size_t)(total ? total : 1), sizeof *where);   /* each buffer's part and place */
    bool *written = tf_calloc((size_t)(total ? total : 1), sizeof *written), *apart = tf_calloc((size_t)(total ? total : 1), sizeof *apart);
    bool oom = !fns || !fn_part || !first || !where || !written || !apart;
    int nparams = oom ? 0 : tf_cuda_multi_params(ks, n, first);
    for (int o = 0; !oom && o < total; o++) apart[o] = true;
    for (int q = 0; q < n && !oom; q++) {
        const tf_kernel *k = &ks[q];
        em e;
        if (!cu_em_init(&e, k)) {
            oom = true;
            break;
        }
        e.bid = "tf_bid";
        e.nblocks = "tf_nblocks";
        e.block = MULTI_BLOCK;
        e.count = "tf_n";
        geom g = {0};
        cu_emit_pointwise(&e, &g);
        sb own = {0}, fn = {0};
        cu_buffer_params(&own, k, e.written, "");
        tf_strbuf_printf(&fn, "(%s, int tf_bid, int tf_nblocks, long long tf_n)\n{\n    typedef %s tf_idx;\n%s}\n", own.p ? own.p : "",
                         e.wide ? "long long" : "int", e.s.p ? e.s.p : "");
        /* parts alike but for their sizes are one function (ptxas's time grows faster than the code it is
         * given, and an optimizer's update of 36 params is 3 or 4 distinct parts); not inlined, so that
         * ptxas compiles each once */
        int same = 0;
        while (same < nfns && !(fn.p && fns[same] && strcmp(fns[same], fn.p) == 0)) same++;
        if (same == nfns) {
            tf_strbuf_printf(&parts, "\n// part %d: %s\nstatic __device__ __noinline__ void tf_part%d%s", q, k->name, q, fn.p ? fn.p : "");
            fns[nfns] = fn.p;
            fn_part[nfns++] = q;
            fn.p = NULL;
        }
        int off = 0;
        for (int r = 0; r < q; r++) off += ks[r].nbufs;
        for (int b = 0; b < k->nbufs; b++) {   /* a parameter is named for where it first comes: p<part>b<buffer> */
            int f = first[off + b];
            where[off + b].q = q, where[off + b].b = b;
            written[f] |= e.written[b];
            apart[f] &= k->bufs[b].disjoint;
        }
        tf_strbuf_printf(&body, "    if (blockIdx.x < %uu) { tf_part%d(", base + g.grid, fn_part[same]);
        for (int b = 0; b < k->nbufs; b++) {
            int f = first[off + b];
            tf_strbuf_printf(&body, "p%db%d, ", where[f].q, where[f].b);
        }
        tf_strbuf_printf(&body, "(int)blockIdx.x - %u, %u, %lldLL); return; }   // part %d: %s\n", base, g.grid, (long long)e.numel, q,
                         k->name);
        oom |= fn.oom;
        tf_free(fn.p);
        base += g.grid;
        if (g.align > align) align = g.align;
        f16 |= e.f16;
        bf16 |= e.bf16;
        vec |= e.vec;
        oom |= own.oom || e.s.oom;
        tf_free(own.p);
        tf_free(e.s.p);
        tf_free(e.written);
        tf_free(e.contig);
        tf_free(e.mark);
    }
    for (int q = 0, o = 0; !oom && q < n; q++)   /* the parameters, each value once */
        for (int b = 0; b < ks[q].nbufs; b++, o++)
            if (first[o] == o)
                tf_strbuf_printf(&params, "%s%s%s *%sp%db%d", params.n ? ", " : "", written[o] ? "" : "const ",
                                 cu_storage_type(ks[q].bufs[b].value->type.dtype), apart[o] ? "__restrict__ " : "", q, b);
    tf_free(first);
    tf_free(where);
    tf_free(written);
    tf_free(apart);
    sb src = {0};
    if (!oom) {
        tf_strbuf_printf(&src, "// generated by tfuse (codegen/cuda.c) for NVRTC: a multi-tensor launch of %d kernels\n", n);
        if (f16) tf_strbuf_printf(&src, "#include <cuda_fp16.h>\n");
        if (bf16) tf_strbuf_printf(&src, "#include <cuda_bf16.h>\n");
        tf_strbuf_printf(&src, "\n%s", cu_helpers_common);
        if (vec) tf_strbuf_printf(&src, "%s", cu_helpers_vec);
        if (f16) tf_strbuf_printf(&src, "%s", cu_helpers_f16);
        if (bf16) tf_strbuf_printf(&src, "%s", cu_helpers_bf16);
        tf_strbuf_printf(&src, "%s", parts.p ? parts.p : "");
        tf_strbuf_printf(&src, "\n// each part's blocks are a range of the grid\nextern \"C\" __global__ void __launch_bounds__(%u) %s(%s)\n{\n%s}\n",
                         MULTI_BLOCK, cu_placeholder, params.p ? params.p : "", body.p ? body.p : "");
    }
    oom |= parts.oom || params.oom || body.oom || src.oom;
    for (int i = 0; i < nfns; i++) tf_free(fns[i]);
    tf_free(fns);
    tf_free(fn_part);
    tf_free(parts.p);
    tf_free(params.p);
    tf_free(body.p);
    if (oom) {
        tf_free(src.p);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory emitting CUDA");
    }
    cu_name_source(out, src.p, src.n);
    out->shape = vec ? TF_CUDA_POINTWISE_VEC : TF_CUDA_POINTWISE;
    out->grid = base;
    out->block = MULTI_BLOCK;
    out->align = align;
    out->vec = 1;
    out->parts = n;
    out->nparams = nparams;
    return TF_IR_OK;
}
