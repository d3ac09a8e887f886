/* artifact.h — what the cuda target writes without a GPU: `tfuse compile
 * --target=cuda --arch=sm_90 -o DIR` (every kernel's CUDA C and its cubin,
 * compiled by NVRTC, which needs no GPU). Only runtime/cuda knows CUDA: the
 * cuda backend (backend_cuda.c) calls this behind its write_artifact. */
#ifndef TF_RUNTIME_CUDA_ARTIFACT_H
#define TF_RUNTIME_CUDA_ARTIFACT_H

#include <stddef.h>

#include "kernel.h"
#include "package.h"

/* Into dir (created if missing): cuda/<name>.cu for every emitted kernel
 * (the text --dump-kernels writes), cuda/<name>.<arch>.cubin compiled by
 * NVRTC on every core, and manifest.txt: one line per kernel of the plan,
 * in launch order: "<kernel> cuda <name> grid=G block=B smem=S[ scratch=N]"
 * (scratch: bytes of zeroed device memory a split reduction takes; its
 * full-space stores, when it has them, are a second line "<kernel> cuda
 * <name>_b ...", launched after it), "<kernel>
 * library <op> cuda <name> grid=G block=B smem=S[ clear_first]" (a library
 * op's generated kernel; clear_first: its result is zeroed before the
 * launch), "<kernel> library <op>" (the runtime's cuBLASLt or host kernels)
 * or "<kernel> view"; a library op's line comes before its epilogue's.
 * Identical kernels share one source and one cubin, taken from the cubin
 * disk cache where it has them (cuda_jit.h; NVRTC compiles the rest, and
 * they are cached), so a second compile of a model compiles nothing.
 * *ncubins: cubins written; *ncompiled of them by NVRTC now, *ncached from
 * the cache. 0 on success, else -1 with the reason in err (NVRTC missing,
 * an architecture NVRTC does not know, a compile error with its log, a
 * file that cannot be written). The cuda backend's write_artifact. */
int tf_cuda_write_artifact(const tf_module *m, const tf_kernel_plan *plan, const char *arch, const char *dir, int *ncubins,
                           int *ncompiled, int *ncached, char *err, size_t n);

/* The cubins of every distinct kernel of plan for each architecture of
 * archs ("sm_80,sm_90"), from the disk cache or NVRTC as above, into pkg as
 * sections "cuda/ARCH/NAME.cubin", and "cuda/archs" = archs: a package's
 * cuda code (cuda_jit.h's tf_cuda_jit_build takes them from there). 0, or
 * -1 with the reason in err. */
int tf_cuda_package_cubins(const tf_kernel_plan *plan, const char *archs, tf_pkg *pkg, int *ncubins, int *ncompiled, int *ncached,
                           char *err, size_t n);

#endif
