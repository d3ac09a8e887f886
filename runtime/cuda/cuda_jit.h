/* cuda_jit.h — from emitted CUDA C (codegen/cuda.h) to functions a session
 * launches: identical sources compiled once, by NVRTC on every core, cubins
 * cached on disk, modules loaded into the current context.
 *
 * The disk cache: $TFUSE_CACHE_DIR/cuda (default ~/.cache/tfuse/cuda), one
 * file per (source, architecture, NVRTC version), named by a hash of the
 * three; each file carries a header (the hash, the kernel name, the size
 * and a checksum of the cubin) checked on every read, and is written to a
 * temporary name and renamed, so concurrent sessions and interrupted writes
 * never leave a torn file behind. A file that fails its checks, or a cubin
 * the driver refuses, is compiled again and replaced. A cache directory
 * that cannot be created or written only means every session compiles. */
#ifndef TF_RUNTIME_CUDA_JIT_H
#define TF_RUNTIME_CUDA_JIT_H

#include "cuda.h"
#include "cuda_libs.h"
#include "package.h"

typedef struct tf_cuda_jit_job {
    tf_cuda_kernel kernel;      /* in: tf_cuda_emit's result (the caller frees it) */
    int owner;                  /* in: the caller's index (its kernel) */
    int fn;                     /* out: the function in jit->fns */
} tf_cuda_jit_job;

typedef struct tf_cuda_jit_fn {
    char name[24];              /* "tf_<hash>" */
    tf_cu_module module;
    tf_cu_function function;
    unsigned grid, block, smem, align;   /* launch geometry (grid within the driver's limit) */
    bool rng;                   /* takes the {seed, step} pointer last */
    unsigned scratch;           /* bytes of zeroed device scratch it takes after the buffers (0: none) */
    tf_cu_function function2;   /* NULL, or a second entry point launched right after with the same parameters */
    unsigned grid2, block2;
} tf_cuda_jit_fn;

typedef struct tf_cuda_jit {
    tf_cuda_jit_fn *fns;
    int nfns;
    int compiled;               /* NVRTC compiles this session */
    int cached;                 /* cubins read from the disk cache */
    int packaged;               /* cubins taken from the program's package */
    char cache_dir[4096];       /* "" when there is none */
} tf_cuda_jit;

/* Compile (or take from the package, pkg non-NULL, or read from the cache)
 * and load every job's kernel for arch into the current context. A
 * package's cubin for a kernel is its section "cuda/ARCH/NAME.cubin" (the
 * name is the hash of the kernel's CUDA C: another source is another name).
 * TF_CUDA_OK, or the first failure with the kernel, the call and NVRTC's or
 * the driver's words in err. */
tf_cuda_status tf_cuda_jit_build(tf_cuda_jit *j, const tf_cuda_libs *l, const char *arch, const tf_pkg *pkg, tf_cuda_jit_job *jobs,
                                 int njobs, char *err, size_t n);
/* Unload the modules (the context must be current) and free the table. */
void tf_cuda_jit_free(tf_cuda_jit *j, const tf_cuda_libs *l);

/* The same disk cache for a caller with no context (artifact.c: `tfuse
 * compile --target=cuda -o DIR`): the cubin of src (entry point name) for
 * arch from the cache, malloc'd (tf_free) with its size in *size, or NULL;
 * and a cubin NVRTC just made, written there. */
void *tf_cuda_cubin_cache_read(const tf_cuda_libs *l, const char *src, const char *name, const char *arch, size_t *size);
void tf_cuda_cubin_cache_write(const tf_cuda_libs *l, const char *src, const char *name, const char *arch, const void *bin,
                               size_t size);

#endif
