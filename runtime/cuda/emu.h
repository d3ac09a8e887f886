/* emu.h — cuda-emu: the CUDA libraries the cuda target calls, stood in for
 * on the host, so that `--target=cuda-emu` runs the cuda target's own code
 * (the same plan, arena, launches, copies, streams and library calls) on a
 * machine with no GPU, and every generated kernel actually executes.
 *
 *   driver    device memory is host memory (a device pointer is a host
 *             address), copies and memsets are checked against the live
 *             allocations; a module is the kernel's CUDA C source, compiled
 *             with the host C++ compiler against a small prelude that
 *             defines the built-ins the emitter uses; a launch runs every
 *             thread of every block as a coroutine, with real block
 *             barriers and warp shuffles among the 32 lanes of a warp;
 *             streams queue their work in order until something waits for
 *             it (emu.c says when), or record it while a
 *             stream captures a graph, and a graph replays what it recorded;
 *   NVRTC     hands back the source as the "cubin" (the driver compiles it);
 *   cuBLASLt  computes each matmul on the host from the descriptors;
 *   cuDNN     computes each convolution on the host from the descriptors.
 *
 * Slow and exact: a debugging aid and what CI runs the cuda target on. The
 * stand-ins fill a tf_cuda_libs (cuda_libs.h) when it is loaded with the
 * search mode TF_CUDA_SEARCH_EMU; nothing is dlopen'd but the compiled
 * kernels. */
#ifndef TF_RUNTIME_CUDA_EMU_H
#define TF_RUNTIME_CUDA_EMU_H

#include <stddef.h>

#include "cuda_libs.h"
#include "ir.h"

/* NULL when cuda-emu can run here, else why not (no host C++ compiler, no
 * cache directory). */
const char *tf_cuda_emu_unavailable(void);
/* `tfuse doctor`'s lines: the compiler, its version and the kernel cache. */
void tf_cuda_emu_describe(tf_strbuf *sb);
/* The process's kernels so far that came from the cache
 * ($TFUSE_CACHE_DIR/cuda-emu) and that the host compiler compiled: a
 * session takes the difference across its start (tf_session_info). */
void tf_cuda_emu_cache_counts(long *hits, long *compiled);
/* Allocations, modules, streams and events alive (a test's leak check). */
int tf_cuda_emu_live(void);

/* For tests: the launch that runs `after` launches from now (1: the next)
 * fails as an illegal memory access would, without running; 0: none. */
void tf_cuda_emu_inject_fault(int after);

/* Fill the tables of l named by which (TF_CUDA_LIB_*) with the stand-ins. */
void tf_cuda_emu_load(tf_cuda_libs *l, unsigned which);

/* Work a stand-in library does on stream s: run now, or, while s captures
 * a graph, recorded into it and run at each replay. arg (arg_bytes) is
 * copied; fn returns 0 or a CUresult-style error code. Returns 0 or the
 * error of running it now. */
typedef int (*tf_cuda_emu_work)(void *arg);
int tf_cuda_emu_submit(tf_cu_stream s, tf_cuda_emu_work fn, const void *arg, size_t arg_bytes);

/* The NCCL stand-in (emu_nccl.c): its functions into api, and the
 * communicator the next ncclCommInitRank on this thread averages through. */
typedef int (*tf_emu_mean_fn)(void *self, tf_dt dt, void *data, int64_t n, char *err, size_t nerr);
void tf_cuda_emu_nccl_fill(tf_nccl_api *api);
void tf_cuda_emu_nccl_use(void *self, int rank, int size, tf_emu_mean_fn mean);
/* The stand-in's all-reduces run so far in this process (a test's count). */
long tf_cuda_emu_nccl_runs(void);

/* The cuDNN stand-in's functions into api (emu_dnn.c). */
void tf_cuda_emu_dnn_fill(tf_cudnn_api *api);

#endif
