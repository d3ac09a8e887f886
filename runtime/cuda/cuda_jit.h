/* cuda_jit.h — from emitted CUDA C (codegen/cuda.h) to functions a session
 * launches: identical sources compiled once, several kernels to an NVRTC
 * program, the programs by NVRTC on every core, cubins cached on disk,
 * modules loaded into the current context.
 *
 * Programs. NVRTC spends about 20 ms on every program before it reads the
 * first kernel (its own headers, the front end's and ptxas's start), so
 * the kernels that must be compiled are grouped: as many programs as
 * cores (the compiles run in parallel, one program per thread; more
 * programs than threads would leave a thread with one program more than
 * another at the end), twice or more as many when the sources pass 1 MiB
 * a program; the kernels dealt out largest first, each to the lightest
 * program (a kernel weighs its source's bytes plus 3000, its fixed share
 * of the compile), so the programs take about as long each. A program's source is, in the order of the kernels' names,
 * each kernel's source in a namespace of its own ("<name>_ns", so that
 * the helpers every kernel carries do not collide) followed by "using
 * <name>_ns::<name>;" (and its second entry point's), with the kernels'
 * #include lines, once each, at the top. The entry points keep their
 * extern "C" names, distinct by construction (a hash of the source), and
 * cuModuleGetFunction finds each in its program's module. A program is
 * named "tfp_" + the 16 hex digits of its cache key (below).
 *
 * The disk cache: $TFUSE_CACHE_DIR/cuda (default ~/.cache/tfuse/cuda).
 *   KEY.cubin      one per program, KEY the hash of (its source, the
 *                  architecture, the NVRTC version): a header (the key,
 *                  the architecture, the sizes and a checksum of what
 *                  follows), the names of the kernels the program
 *                  defines, then the cubin;
 *   KKEY.kernel    one per kernel, KKEY the hash of (the kernel's own
 *                  source, the architecture, the NVRTC version): a
 *                  symbolic link to the KEY.cubin of the program that
 *                  holds it.
 * A kernel is found through its link, so a kernel that another model (or
 * the other program of a session) already compiled is a hit whatever
 * program it was compiled in; the kernels without one are grouped and
 * compiled. Every file is written to a temporary name and renamed, so
 * concurrent sessions and interrupted writes never leave a torn file. A
 * program file that fails its checks, does not list the kernel, or whose
 * cubin the driver refuses, is a miss: its kernels are compiled again and
 * the files replaced; a link whose program was evicted is a miss too. A
 * cache directory that cannot be created or written only means every
 * session compiles. */
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
    tf_cu_module module;        /* its program's module (jit->modules owns it) */
    tf_cu_function function;
    unsigned grid, block, smem, align;   /* launch geometry (grid within the driver's limit) */
    bool rng;                   /* takes the {seed, step} pointer last */
    unsigned scratch;           /* bytes of zeroed device scratch it takes after the buffers (0: none) */
    tf_cu_function function2;   /* NULL, or a second entry point launched right after with the same parameters */
    unsigned grid2, block2, smem2;
} tf_cuda_jit_fn;

typedef struct tf_cuda_jit {
    tf_cuda_jit_fn *fns;
    int nfns;
    tf_cu_module *modules;      /* one per program loaded */
    int nmodules;
    int compiled;               /* kernels NVRTC compiled this session */
    int cached;                 /* kernels whose cubin came from the disk cache */
    int packaged;               /* kernels whose cubin came from the program's package */
} tf_cuda_jit;

/* Compile (or take from the package, pkg non-NULL, or read from the cache)
 * and load every job's kernel for arch into the current context. A
 * package's cubins are its sections "cuda/ARCH/PROGRAM.cubin", and
 * "cuda/ARCH/kernels" says which program holds each kernel (a line
 * "KERNEL PROGRAM" per kernel; a kernel's name is the hash of its CUDA C:
 * another source is another name). TF_CUDA_OK, or the first failure with
 * the kernel, the call and NVRTC's or the driver's words in err. */
tf_cuda_status tf_cuda_jit_build(tf_cuda_jit *j, const tf_cuda_libs *l, const char *arch, const tf_pkg *pkg, tf_cuda_jit_job *jobs,
                                 int njobs, char *err, size_t n);
/* Unload the modules (the context must be current) and free the table. */
void tf_cuda_jit_free(tf_cuda_jit *j, const tf_cuda_libs *l);

/* ---- cubins without a context (artifact.c: `tfuse compile --target=cuda
 * -o DIR` and packages; and tf_cuda_jit_build) ---- */

typedef enum tf_cubin_from { TF_CUBIN_COMPILED, TF_CUBIN_CACHED, TF_CUBIN_PACKAGE } tf_cubin_from;

typedef struct tf_cuda_cubin {
    char name[24];              /* "tfp_" + 16 hex digits: the program (see the top) */
    void *bin;                  /* the cubin, malloc'd */
    size_t size;
    char (*kernels)[24];        /* the kernels it defines (a cached program may hold kernels of other models too) */
    int nkernels;
    tf_cubin_from from;
} tf_cuda_cubin;

typedef struct tf_cuda_cubins {
    tf_cuda_cubin *c;           /* the programs that hold the kernels asked for */
    int n;
    int *of;                    /* of[i]: the program in c that holds ks[i] */
    int compiled, cached, packaged;   /* of ks: kernels compiled now, found in the cache, in the package */
} tf_cuda_cubins;

typedef enum tf_cubins_mode {
    TF_CUBINS_STORED,           /* the package's (pkg non-NULL), else the cache's, else compiled now and cached */
    TF_CUBINS_FRESH,            /* compiled now, and the cache's files replaced (a stored cubin the driver refused) */
} tf_cubins_mode;

/* The cubins of ks[0..nk) (distinct names) for arch into *out, grouped
 * into programs as the top of this file says, for `threads` compiling
 * threads (0: one per core; the number of programs follows it). TF_CUDA_OK, or the first
 * failure with the reason in err: NVRTC's words name the kernel (a program
 * that fails is compiled kernel by kernel to find it). tf_cuda_cubins_free
 * frees *out either way. */
tf_cuda_status tf_cuda_cubins_get(const tf_cuda_libs *l, const char *arch, const tf_pkg *pkg, tf_cubins_mode mode, int threads,
                                  const tf_cuda_kernel *const *ks, int nk, tf_cuda_cubins *out, char *err, size_t n);
void tf_cuda_cubins_free(tf_cuda_cubins *c);

#endif
