/* dnn.h — 2-D convolutions (NCHW) on the GPU through cuDNN's legacy API
 * (loaded by loader.c with dlopen), for the cuda target's conv2d,
 * conv2d_grad_input and conv2d_grad_weight kernels.
 *
 * Shapes and attributes are the interpreter's (ir/interp_kernels.c
 * ik_conv2d, ir/interp_backward.c): x [N, C, H, W], w [O, C/groups, KH, KW],
 * y [N, O, Ho, Wo], cross-correlation (no kernel flip), zero padding, each of
 * stride, padding and dilation given per spatial axis [h, w]. The three
 * directions:
 *
 *   TF_CONV_FORWARD      y  = conv2d(x, w)                      (cudnnConvolutionForward)
 *   TF_CONV_GRAD_INPUT   dx = conv2d_grad_input(dy, w)          (cudnnConvolutionBackwardData)
 *   TF_CONV_GRAD_WEIGHT  dw = conv2d_grad_weight(x, dy)         (cudnnConvolutionBackwardFilter)
 *
 * with dy in y's place, dx in x's, dw in w's. A bias is not part of it:
 * `lower` rewrites conv2d(x, w, b) into conv2d(x, w) + b, and the add is
 * the region's epilogue.
 *
 * Numbers: x, w and y share one type (f32, f16 or bf16); the accumulation
 * is fp32 in every case (the descriptor's compute type is float). f32 may
 * use TF32 tensor cores when desc->tf32 (CUDNN_DEFAULT_MATH), else full
 * fp32 (CUDNN_FMA_MATH); 16-bit operands ask for tensor cores
 * (CUDNN_TENSOR_OP_MATH). alpha = 1, beta = 0: the result is overwritten,
 * never read.
 *
 * A plan is made once per conv when a session starts: descriptors, and the
 * algorithm cudnnFind*AlgorithmEx measures fastest for that shape on this
 * GPU (deterministic algorithms first: a non-deterministic one, which adds
 * with atomics, only when no deterministic one runs), then run every step.
 * Finding costs a few runs of every algorithm, so the choice is cached on
 * disk beside the cubins, in $TFUSE_CACHE_DIR/cuda (default
 * ~/.cache/tfuse/cuda): one small text file per key, <hash>.cudnn, where
 * the key is (direction, shapes, type, attributes, math type, cuDNN's
 * version, the GPU's name). Each file holds its whole key and a checksum,
 * and is written to a temporary name and renamed; a file that fails its
 * checks, names an algorithm cuDNN no longer takes for the shape, or needs
 * more workspace than the plan allows is ignored, and the Find's result
 * replaces it. A cache directory that cannot be made only means every
 * session finds. */
#ifndef TF_RUNTIME_CUDA_DNN_H
#define TF_RUNTIME_CUDA_DNN_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_libs.h"

typedef enum tf_conv_dir { TF_CONV_FORWARD, TF_CONV_GRAD_INPUT, TF_CONV_GRAD_WEIGHT } tf_conv_dir;
typedef enum tf_conv_type { TF_CONV_F32, TF_CONV_F16, TF_CONV_BF16 } tf_conv_type;

typedef struct tf_conv_desc {
    tf_conv_dir dir;
    tf_conv_type type;            /* of x, w and y alike */
    int64_t N, C, H, W;           /* x */
    int64_t O, KH, KW;            /* w: [O, C / groups, KH, KW] */
    int64_t Ho, Wo;               /* y: [N, O, Ho, Wo] */
    int64_t stride[2], pad[2], dilation[2];   /* [h, w] */
    int64_t groups;
    bool tf32;
    size_t max_workspace;         /* the most workspace bytes the algorithm may need */
    /* choosing the algorithm */
    const char *gpu;              /* the GPU's name (part of the cache key); NULL: "" */
    const char *cache_dir;        /* NULL: $TFUSE_CACHE_DIR/cuda, else ~/.cache/tfuse/cuda; "": no disk cache */
    bool cached_only;             /* do not Find: a key the cache lacks is TF_CUDA_ERR_NOT_FOUND with out->cache_miss */
    tf_cu_deviceptr x, w, y;      /* device buffers of those shapes Find*Ex runs on; it overwrites the result (y, x or w) */
    tf_cu_deviceptr ws;           /* max_workspace bytes of device memory for Find*Ex (0 when max_workspace is 0) */
} tf_conv_desc;

typedef struct tf_conv {
    tf_conv_dir dir;
    tf_cudnn_tensor xd, yd;
    tf_cudnn_filter wd;
    tf_cudnn_conv cd;
    int algo;                     /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    int math;                     /* the cudnnMathType_t the descriptor carries */
    bool deterministic;
    size_t workspace;             /* what the algorithm needs, <= max_workspace */
    float ms;                     /* the Find's time for it (what the cache recorded, when from_cache) */
    bool from_cache;              /* the algorithm came from the disk cache: no Find ran */
    bool cache_miss;              /* cached_only and the cache had nothing usable */
    char cache_file[4200];        /* the file that holds the choice; "" without a cache */
} tf_conv;

/* Plan a convolution; *out is usable (and must be freed) only on TF_CUDA_OK.
 * TF_CUDA_ERR_NOT_FOUND: cuDNN is not loaded (or, with cached_only, the
 * cache had no choice); TF_CUDA_ERR_ARG: sizes cuDNN's legacy API cannot
 * describe (a dimension or an element count beyond 2^31 - 1), or no
 * algorithm runs the case within max_workspace; err says why. */
tf_cuda_status tf_conv_plan(const tf_cuda_libs *l, tf_cudnn_handle h, const tf_conv_desc *desc, tf_conv *out, char *err,
                            size_t n);
/* Enqueue it on the stream the handle was given (cudnnSetStream). x, w and
 * y are device pointers to the tensors above (the direction's result among
 * them is written, the others read); ws has at least c->workspace bytes. */
tf_cuda_status tf_conv_run(const tf_cuda_libs *l, tf_cudnn_handle h, const tf_conv *c, tf_cu_deviceptr x, tf_cu_deviceptr w,
                           tf_cu_deviceptr y, tf_cu_deviceptr ws, size_t ws_bytes, char *err, size_t n);
void tf_conv_free(const tf_cuda_libs *l, tf_conv *c);

/* "forward", "grad_input", "grad_weight" and cuDNN's name of an algorithm
 * of that direction ("IMPLICIT_PRECOMP_GEMM", "ALGO_1", "FFT_TILING", ...). */
const char *tf_conv_dir_name(tf_conv_dir dir);
const char *tf_conv_algo_name(tf_conv_dir dir, int algo);
/* "default (TF32 allowed)", "FMA (full fp32)", "tensor op", ... */
const char *tf_conv_math_name(int math);

#endif
