/* conv_dnnl.h — the cpu target's convolutions through oneDNN (Debian's
 * libdnnl-dev), where the build has it (TFUSE_HAVE_ONEDNN); cpu_ops.c's
 * im2col + GEMM is the fallback and the `--cpu-conv=im2col` path.
 *
 * Threading is tfuse's, as for OpenBLAS: every oneDNN primitive runs on one
 * thread (its OpenMP runtime is held at one thread on the calling thread),
 * and the pool shares out pieces of the batch fixed by the shape alone: the
 * forward and input gradient split the images into at most
 * TF_DNNL_CONV_PIECES contiguous groups, the weight gradient into
 * tf_conv_grad_weight_groups(g) groups whose partial weight gradients are
 * added in order. Where the weights outnumber the input images, the pieces
 * are groups of at least TF_DNNL_GW_CHANNELS channels over the whole batch
 * instead (output channels; the input gradient's input channels): each
 * reads its slice of the weights and writes its slice of the result, so
 * no piece reads every weight and no partials are added. A primitive is made per distinct group size (at most two)
 * when the session starts, so the bits a convolution produces do not depend
 * on the number of threads, and no OpenMP thread ever competes with the
 * pool's.
 *
 * Memory is tfuse's layout (NCHW images, OIHW weights, goihw with groups);
 * with `blocked` the primitive may pick its own layout (format_tag any), and
 * each piece reorders into it and back. */
#ifndef TF_RUNTIME_CPU_CONV_DNNL_H
#define TF_RUNTIME_CPU_CONV_DNNL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_ops.h"

enum { TF_DNNL_CONV_PIECES = 16, TF_DNNL_GW_CHANNELS = 32 };

typedef enum tf_dnnl_dir { TF_DNNL_FWD, TF_DNNL_BWD_DATA, TF_DNNL_BWD_WEIGHTS } tf_dnnl_dir;

typedef struct tf_dnnl_conv tf_dnnl_conv;

/* Whether this build has oneDNN; "oneDNN 2.6.3 (...)" or why not, for
 * `tfuse doctor`. */
bool tf_dnnl_available(void);
void tf_dnnl_describe(char *out, size_t n);

/* The primitives of one convolution node (NULL, with *why filled, when
 * oneDNN refuses the shape or the build has no oneDNN): `bias` and `relu`
 * (forward only) make them write relu(conv + bias). threads: the pool's. */
tf_dnnl_conv *tf_dnnl_conv_create(tf_dnnl_dir dir, const tf_conv_geom *g, bool bias, bool relu, bool blocked, int threads,
                                  char *why, size_t n);
void tf_dnnl_conv_free(tf_dnnl_conv *c);
/* The implementation oneDNN chose (impl_info_str), the layouts and pieces. */
void tf_dnnl_conv_explain(const tf_dnnl_conv *c, char *out, size_t n);
/* Bytes of scratch a run needs (all threads' together). */
size_t tf_dnnl_conv_scratch_bytes(const tf_dnnl_conv *c);
/* Bytes of the weights reordered into the primitive's layout (0: it takes
 * them as they are), to keep them between runs. */
size_t tf_dnnl_conv_kept_bytes(const tf_dnnl_conv *c);
/* A forward convolution's image (`dst` false) or result (true) in oneDNN's
 * blocked layout nChw16c, the layout its primitive computes in: whether it
 * can take or give it as it is, without a reorder (pieces of images, the
 * primitive's own layout nChw16c for every piece size), and, with
 * tf_dnnl_conv_take_blocked, make it do so from then on (the caller's
 * memory for that argument is then in nChw16c: cpu_layout.c). */
bool tf_dnnl_conv_blocked_ok(const tf_dnnl_conv *c, bool dst);
void tf_dnnl_conv_take_blocked(tf_dnnl_conv *c, bool dst);
/* Whether a's layout of `arg` is nChw16c: for explain. */
bool tf_dnnl_conv_is_blocked(const tf_dnnl_conv *c, bool dst);

/* Forward: a = x, b = w, bias, out = y. Input gradient: a = dy, b = w,
 * out = dx. Weight gradient: a = x, b = dy, out = dw. scratch: 64-byte
 * aligned, tf_dnnl_conv_scratch_bytes. kept (64-byte aligned,
 * tf_dnnl_conv_kept_bytes; NULL: none): where the reordered weights stay
 * between runs, reordered again only when refresh (the weights changed);
 * without it they are reordered into scratch every run. after (NULL:
 * none), for a forward convolution split by images: called on the piece's
 * thread with its images [n0, n1) once it has written them, while they are
 * in that core's cache (the epilogue kernel's share of them); returns
 * whether it was called (for every piece). false when a primitive failed
 * (nothing was written that the caller can rely on). */
typedef void (*tf_dnnl_after_fn)(void *arg, int64_t n0, int64_t n1);
bool tf_dnnl_conv_run(tf_dnnl_conv *c, tf_pool *pool, const float *a, const float *b, const float *bias, float *out,
                      void *scratch, void *kept, bool refresh, tf_dnnl_after_fn after, void *after_arg, bool *after_ran);

#endif
