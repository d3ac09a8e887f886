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
 * (the text --dump-kernels writes); its cubins, cuda/<program>.<arch>.cubin,
 * NVRTC's programs of several kernels each (cuda_jit.h: one per core, more
 * for a big model), compiled on every core; cubins.txt, a line per cubin:
 * its path, then the names of the model's kernels it holds (a cubin taken
 * from the cache may define other models' kernels besides); and
 * manifest.txt: one line per kernel of the plan,
 * in launch order: "<kernel> cuda <name> grid=G block=B smem=S[ scratch=N]"
 * (scratch: bytes of zeroed device memory a split reduction takes; its
 * full-space stores, when it has them, are a second line "<kernel> cuda
 * <name>_b ...", launched after it, from the same cubin), "<kernel>
 * library <op> cuda <name> grid=G block=B smem=S[ clear_first]" (a library
 * op's generated kernel; clear_first: its result is zeroed before the
 * launch; flash_attention_grad's second entry point, launched right
 * after, is a second such line, "<name>_b"), "<kernel> library <op>" (the
 * runtime's cuBLASLt or host kernels) or "<kernel> view"; a library op's
 * line comes before its epilogue's.
 * Identical kernels share one source, taken from the cubin disk cache
 * where it has them (cuda_jit.h; NVRTC compiles the rest, and they are
 * cached), so a second compile of a model compiles nothing. *ncubins:
 * cubins written, holding *nkernels distinct kernels, *ncompiled of them
 * compiled by NVRTC now and *ncached found in the cache. 0 on success,
 * else -1 with the reason in err (NVRTC missing, an architecture NVRTC
 * does not know, a compile error naming the kernel, a file that cannot be
 * written). The cuda backend's write_artifact. */
int tf_cuda_write_artifact(const tf_module *m, const tf_kernel_plan *plan, const char *arch, const char *dir, int *ncubins,
                           int *nkernels, int *ncompiled, int *ncached, char *err, size_t n);

/* The cubins of every distinct kernel of plan for each architecture of
 * archs ("sm_80,sm_90"), from the disk cache or NVRTC as above, into pkg:
 * for each ARCH, a section "cuda/ARCH/PROGRAM.cubin" per program and
 * "cuda/ARCH/kernels", a line "KERNEL PROGRAM" per kernel, saying which
 * program holds it; and "cuda/archs" = archs. That is a package's cuda
 * code (cuda_jit.h's tf_cuda_jit_build takes it from there). *ncubins:
 * the cubins (all architectures), *ncompiled of them compiled now and
 * *ncached read from the cache. 0, or -1 with the reason in err. */
int tf_cuda_package_cubins(const tf_kernel_plan *plan, const char *archs, tf_pkg *pkg, int *ncubins, int *ncompiled, int *ncached,
                           char *err, size_t n);

#endif
