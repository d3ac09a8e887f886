/* emu_internal.h — what the files of cuda-emu's driver share (private to
 * runtime/cuda; emu.h is what the rest of tfuse sees):
 *   emu.c          device memory, copies, the device, context and error
 *                  calls, and the tables tf_cuda_emu_load fills;
 *   emu_stream.c   streams, events and graphs: when queued work runs;
 *   emu_nvrtc.c    NVRTC's stand-in and modules, compiled by the host C++
 *                  compiler and cached;
 *   emu_launch.c   kernel launches, thread by thread, faults caught.
 * Each file's own state is static in it; tf_emu_mu guards what several
 * touch. */
#ifndef TF_RUNTIME_CUDA_EMU_INTERNAL_H
#define TF_RUNTIME_CUDA_EMU_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "emu.h"

/* The CUresult codes the stand-ins return. */
enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_IMAGE = 200, INVALID_HANDLE = 400,
    NOT_FOUND = 500, NOT_READY = 600, ILLEGAL_ADDRESS = 700, LAUNCH_OUT_OF_RESOURCES = 701, LAUNCH_FAILED = 719,
    STREAM_CAPTURE_UNSUPPORTED = 900, STREAM_CAPTURE_INVALIDATED = 901, STREAM_CAPTURE_ISOLATION = 905, STREAM_CAPTURE_UNJOINED = 904, NOT_SUPPORTED = 801, EMU_UNKNOWN = 999,
};
/* The emulated device's limits. */
enum { MAX_THREADS = 1024, STATIC_SMEM = 48 * 1024, SMEM_OPTIN = 232448, SMS = 132 };
enum { MAX_PARAMS = 4096 };   /* CUDA 12.1+ takes 32 KiB of kernel parameters: 4096 pointers */

/* A __global__ function of a module (a tf_cu_function). */
typedef struct emu_func {
    char name[64];
    unsigned bound;              /* __launch_bounds__, 0: none */
    unsigned max_smem;           /* dynamic shared memory allowed */
    int nparams;
    unsigned char psize[MAX_PARAMS];   /* bytes of each parameter */
    void (*entry)(void **);
    struct emu_module *mod;
} emu_func;

/* Where a module is on its way from source to loaded code. */
typedef enum { MOD_PENDING, MOD_COMPILING, MOD_READY, MOD_FAILED } mod_state;

/* A loaded module (a tf_cu_module): its source, then its compiled object. */
typedef struct emu_module {
    char *src;
    uint64_t key;
    char so[4200];               /* the cached object for this kernel (a link) */
    mod_state state;
    char *error;                 /* MOD_FAILED: the compiler's words */
    void *handle;
    int (*launch)(void (*)(void **), void **, const unsigned *, const unsigned *, unsigned, char *, unsigned long, char *,
                  unsigned long);
    emu_func *fns;
    int nfns;
    struct emu_module *next_pending;
} emu_module;

/* Allocations, modules and their compilation, what is alive, captures (emu.c). */
extern pthread_mutex_t tf_emu_mu;
/* The last failure's words on this thread, for cuGetErrorString (emu.c). */
extern _Thread_local char tf_emu_msg[2048];

/* Keep the failure's words (fmt) for cuGetErrorString and return its code. */
static inline int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tf_emu_msg, sizeof tf_emu_msg, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- emu_stream.c ---- */

/* Run every stream's queued work (as a GPU finishes work before memory, a module or an event goes). */
void tf_emu_flush_all(void);
/* Streams capturing a graph now: a synchronous call is an error meanwhile, as on a GPU. */
int tf_emu_capturing(void);
/* Streams, events and graphs alive (tf_emu_mu held). */
int tf_emu_live_queues(void);
/* The stream, event and graph calls into c. */
void tf_emu_stream_fill(tf_cu_api *c);

/* ---- emu_nvrtc.c ---- */

/* Compile every module still pending; the first failure's code and words. */
int tf_emu_settle(void);
/* m compiled (with every other pending module) and loaded, or why not. */
int tf_emu_module_ready(emu_module *m);
/* Modules alive (tf_emu_mu held). */
int tf_emu_live_modules(void);
/* The module calls into c. */
void tf_emu_module_fill(tf_cu_api *c);
/* NVRTC's stand-in into api. */
void tf_emu_nvrtc_fill(tf_nvrtc_api *api);

/* ---- emu_launch.c ---- */

/* cuLaunchKernel and cuFuncSetAttribute into c. */
void tf_emu_launch_fill(tf_cu_api *c);

#endif
