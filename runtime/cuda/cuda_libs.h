/* cuda_libs.h — the CUDA libraries tfuse uses, loaded at run time with
 * dlopen, so that one binary runs on machines with no GPU and says so
 * clearly. Only runtime/cuda knows CUDA exists; nothing here needs a CUDA
 * header (the few types and functions used are declared below).
 *
 *   NVRTC   (libnvrtc.so.13, .so.12, .so) compiles CUDA C++ to cubins; it
 *           needs no GPU, so `tfuse compile --target=cuda` works anywhere
 *           it is installed;
 *   driver  (libcuda.so.1) loads cubins and launches them; comes with the
 *           NVIDIA GPU driver, absent on machines without one;
 *   cuBLASLt (libcublasLt.so.13, .so.12) runs the cuda target's GEMMs; optional:
 *           without it the runtime says so and runs them on the host;
 *   cuDNN   (libcudnn.so.9, .so.8) runs its convolutions; optional in the
 *           same way.
 *
 * Where each is looked for, in order (the first that loads and has every
 * function wins):
 *   1. the directories of $TFUSE_CUDA_LIBS (colon-separated), or of the
 *      search's `dirs`;
 *   2. the sonames, through the dynamic loader (LD_LIBRARY_PATH, ldconfig);
 *   3. /usr/local/cuda/lib64, /usr/local/cuda/lib,
 *      /usr/local/cuda/targets/x86_64-linux/lib (the driver: also
 *      /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib/wsl/lib);
 *   4. Python packages: site-packages/nvidia/<pkg>/lib of virtualenvs,
 *      conda, pyenv, ~/.local, the system's and those beside each python on
 *      PATH (where `pip install nvidia-cuda-nvrtc` puts libnvrtc, and
 *      `pip install nvidia-cublas` libcublasLt).
 * With $TFUSE_CUDA_LIBS_ONLY=1 (or TF_CUDA_SEARCH_DIRS_ONLY), step 1 alone.
 * NVRTC in CUDA 13 has no built-in cuda_fp16.h: the loader also finds an
 * include directory holding cuda_fp16.h and cuda_bf16.h (beside the
 * library, the toolkit's, site-packages/nvidia/<pkg>/include) and passes it
 * to every compile.
 *
 * Example:
 *
 *     tf_cuda_libs libs;
 *     char err[2048];
 *     if (tf_cuda_libs_load(&libs, TF_CUDA_LIB_NVRTC, NULL, err, sizeof err)) {
 *         fprintf(stderr, "%s\n", err);        // names what is missing, and where it looked
 *     } else {
 *         void *cubin; size_t size; char *log;
 *         if (!tf_nvrtc_compile(&libs, ck.src, ck.name, "sm_90", &cubin, &size, &log, err, sizeof err)) ...
 *         tf_cuda_libs_free(&libs);
 *     }
 *
 * No global state: a tf_cuda_libs is the caller's (dlopen's reference
 * counting makes several of them in one process fine). Compiles may run in
 * several threads at once on one tf_cuda_libs (tf_nvrtc_compile_jobs). */
#ifndef TF_RUNTIME_CUDA_LIBS_H
#define TF_RUNTIME_CUDA_LIBS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum tf_cuda_status {
    TF_CUDA_OK = 0,
    TF_CUDA_ERR_NOT_FOUND,   /* a library is not on this machine (or not where the search looked) */
    TF_CUDA_ERR_SYMBOL,      /* found, but too old: a function is missing */
    TF_CUDA_ERR_ARCH,        /* NVRTC cannot compile for the architecture asked for */
    TF_CUDA_ERR_COMPILE,     /* NVRTC rejected a source (the log says why) */
    TF_CUDA_ERR_DRIVER,      /* a driver call failed */
    TF_CUDA_ERR_OOM,
    TF_CUDA_ERR_ARG,
} tf_cuda_status;

/* ---- what the loader looks up: the C ABI of NVRTC and the driver API ---- */

typedef int tf_nvrtc_result;                  /* nvrtcResult: 0 is NVRTC_SUCCESS */
typedef struct tf_nvrtc_prog_ *tf_nvrtc_prog;  /* nvrtcProgram */

typedef struct tf_nvrtc_api {
    const char *(*GetErrorString)(tf_nvrtc_result r);
    tf_nvrtc_result (*Version)(int *major, int *minor);
    tf_nvrtc_result (*GetNumSupportedArchs)(int *n);
    tf_nvrtc_result (*GetSupportedArchs)(int *archs);
    tf_nvrtc_result (*CreateProgram)(tf_nvrtc_prog *p, const char *src, const char *name, int nheaders,
                                     const char *const *headers, const char *const *include_names);
    tf_nvrtc_result (*DestroyProgram)(tf_nvrtc_prog *p);
    tf_nvrtc_result (*CompileProgram)(tf_nvrtc_prog p, int nopts, const char *const *opts);
    tf_nvrtc_result (*GetProgramLogSize)(tf_nvrtc_prog p, size_t *n);
    tf_nvrtc_result (*GetProgramLog)(tf_nvrtc_prog p, char *log);
    tf_nvrtc_result (*GetCUBINSize)(tf_nvrtc_prog p, size_t *n);
    tf_nvrtc_result (*GetCUBIN)(tf_nvrtc_prog p, char *cubin);
} tf_nvrtc_api;

typedef int tf_cu_result;                      /* CUresult: 0 is CUDA_SUCCESS */
typedef int tf_cu_device;                      /* CUdevice */
typedef struct tf_cu_ctx_ *tf_cu_context;      /* CUcontext */
typedef struct tf_cu_mod_ *tf_cu_module;       /* CUmodule */
typedef struct tf_cu_func_ *tf_cu_function;    /* CUfunction */
typedef struct tf_cu_stream_ *tf_cu_stream;    /* CUstream */
typedef struct tf_cu_event_ *tf_cu_event;      /* CUevent */
typedef unsigned long long tf_cu_deviceptr;    /* CUdeviceptr */
typedef struct tf_cu_graph_ *tf_cu_graph;      /* CUgraph */
typedef struct tf_cu_gexec_ *tf_cu_graph_exec; /* CUgraphExec */

/* The driver functions the runtime starts from (dlsym names in comments
 * where they carry a version suffix). */
typedef struct tf_cu_api {
    tf_cu_result (*Init)(unsigned flags);
    tf_cu_result (*DriverGetVersion)(int *version);
    tf_cu_result (*GetErrorName)(tf_cu_result r, const char **s);
    tf_cu_result (*GetErrorString)(tf_cu_result r, const char **s);
    tf_cu_result (*DeviceGetCount)(int *n);
    tf_cu_result (*DeviceGet)(tf_cu_device *dev, int ordinal);
    tf_cu_result (*DeviceGetName)(char *name, int len, tf_cu_device dev);
    tf_cu_result (*DeviceGetAttribute)(int *v, int attribute, tf_cu_device dev);
    tf_cu_result (*DeviceTotalMem)(size_t *bytes, tf_cu_device dev);                 /* cuDeviceTotalMem_v2 */
    tf_cu_result (*DevicePrimaryCtxRetain)(tf_cu_context *ctx, tf_cu_device dev);
    tf_cu_result (*DevicePrimaryCtxRelease)(tf_cu_device dev);                       /* cuDevicePrimaryCtxRelease_v2 */
    tf_cu_result (*CtxSetCurrent)(tf_cu_context ctx);
    tf_cu_result (*CtxSynchronize)(void);
    tf_cu_result (*MemGetInfo)(size_t *free_bytes, size_t *total);                    /* cuMemGetInfo_v2 */
    tf_cu_result (*MemAlloc)(tf_cu_deviceptr *p, size_t bytes);                       /* cuMemAlloc_v2 */
    tf_cu_result (*MemFree)(tf_cu_deviceptr p);                                       /* cuMemFree_v2 */
    tf_cu_result (*MemcpyHtoD)(tf_cu_deviceptr dst, const void *src, size_t bytes);   /* cuMemcpyHtoD_v2 */
    tf_cu_result (*MemcpyDtoH)(void *dst, tf_cu_deviceptr src, size_t bytes);         /* cuMemcpyDtoH_v2 */
    tf_cu_result (*StreamCreate)(tf_cu_stream *s, unsigned flags);
    tf_cu_result (*StreamDestroy)(tf_cu_stream s);                                    /* cuStreamDestroy_v2 */
    tf_cu_result (*StreamSynchronize)(tf_cu_stream s);
    tf_cu_result (*ModuleLoadData)(tf_cu_module *m, const void *image);
    tf_cu_result (*ModuleUnload)(tf_cu_module m);
    tf_cu_result (*ModuleGetFunction)(tf_cu_function *f, tf_cu_module m, const char *name);
    tf_cu_result (*FuncSetAttribute)(tf_cu_function f, int attribute, int value);
    tf_cu_result (*LaunchKernel)(tf_cu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned smem, tf_cu_stream s, void **params, void **extra);
    /* what the cuda target's sessions use besides (runtime/cuda/backend_cuda.c) */
    tf_cu_result (*MemcpyHtoDAsync)(tf_cu_deviceptr dst, const void *src, size_t bytes, tf_cu_stream s);  /* _v2 */
    tf_cu_result (*MemcpyDtoHAsync)(void *dst, tf_cu_deviceptr src, size_t bytes, tf_cu_stream s);        /* _v2 */
    tf_cu_result (*MemcpyDtoDAsync)(tf_cu_deviceptr dst, tf_cu_deviceptr src, size_t bytes, tf_cu_stream s); /* _v2 */
    tf_cu_result (*MemsetD8Async)(tf_cu_deviceptr dst, unsigned char value, size_t n, tf_cu_stream s);
    tf_cu_result (*MemAllocHost)(void **p, size_t bytes);                                 /* cuMemAllocHost_v2: pinned */
    tf_cu_result (*MemFreeHost)(void *p);
    tf_cu_result (*EventCreate)(tf_cu_event *e, unsigned flags);
    tf_cu_result (*EventDestroy)(tf_cu_event e);                                          /* cuEventDestroy_v2 */
    tf_cu_result (*EventRecord)(tf_cu_event e, tf_cu_stream s);
    tf_cu_result (*EventElapsedTime)(float *ms, tf_cu_event start, tf_cu_event end);     /* _v2, or the first one */
    /* asynchronous steps: the copy stream and the compute stream order each other, the host waits for a step */
    tf_cu_result (*StreamWaitEvent)(tf_cu_stream s, tf_cu_event e, unsigned flags);
    tf_cu_result (*EventSynchronize)(tf_cu_event e);
    tf_cu_result (*EventQuery)(tf_cu_event e);                                            /* 0, or CUDA_ERROR_NOT_READY (600) */
    /* CUDA graphs: a step captured once, replayed after */
    tf_cu_result (*StreamBeginCapture)(tf_cu_stream s, int mode);                         /* cuStreamBeginCapture_v2 */
    tf_cu_result (*StreamEndCapture)(tf_cu_stream s, tf_cu_graph *g);
    tf_cu_result (*GraphInstantiate)(tf_cu_graph_exec *e, tf_cu_graph g, unsigned long long flags); /* ...WithFlags */
    tf_cu_result (*GraphLaunch)(tf_cu_graph_exec e, tf_cu_stream s);
    tf_cu_result (*GraphExecDestroy)(tf_cu_graph_exec e);
    tf_cu_result (*GraphDestroy)(tf_cu_graph g);
} tf_cu_api;

/* cuBLASLt's C ABI: opaque handles, the two semi-opaque structs the caller
 * allocates (sizes as in cublasLt.h), and the functions runtime/cuda/blas.c
 * calls. Enumerations travel as int (their C ABI); blas.c names the values. */
typedef int tf_cublas_status;                                      /* cublasStatus_t: 0 is CUBLAS_STATUS_SUCCESS */
typedef struct tf_cublaslt_ctx_ *tf_cublaslt_handle;               /* cublasLtHandle_t */
typedef struct tf_cublaslt_desc_ *tf_cublaslt_matmul_desc;         /* cublasLtMatmulDesc_t */
typedef struct tf_cublaslt_layout_ *tf_cublaslt_layout;            /* cublasLtMatrixLayout_t */
typedef struct tf_cublaslt_pref_ *tf_cublaslt_pref;                /* cublasLtMatmulPreference_t */
typedef struct tf_cublaslt_algo { unsigned long long data[8]; } tf_cublaslt_algo;   /* cublasLtMatmulAlgo_t */
typedef struct tf_cublaslt_heuristic {                             /* cublasLtMatmulHeuristicResult_t */
    tf_cublaslt_algo algo;
    size_t workspace_size;
    tf_cublas_status state;
    float waves_count;
    int reserved[4];
} tf_cublaslt_heuristic;

typedef struct tf_cublaslt_api {
    tf_cublas_status (*Create)(tf_cublaslt_handle *h);
    tf_cublas_status (*Destroy)(tf_cublaslt_handle h);
    size_t (*GetVersion)(void);
    const char *(*GetStatusName)(tf_cublas_status st);
    const char *(*GetStatusString)(tf_cublas_status st);
    tf_cublas_status (*MatmulDescCreate)(tf_cublaslt_matmul_desc *d, int compute_type, int scale_type);
    tf_cublas_status (*MatmulDescDestroy)(tf_cublaslt_matmul_desc d);
    tf_cublas_status (*MatmulDescSetAttribute)(tf_cublaslt_matmul_desc d, int attr, const void *buf, size_t size);
    tf_cublas_status (*MatrixLayoutCreate)(tf_cublaslt_layout *l, int type, unsigned long long rows, unsigned long long cols,
                                           long long ld);
    tf_cublas_status (*MatrixLayoutDestroy)(tf_cublaslt_layout l);
    tf_cublas_status (*MatrixLayoutSetAttribute)(tf_cublaslt_layout l, int attr, const void *buf, size_t size);
    tf_cublas_status (*MatmulPreferenceCreate)(tf_cublaslt_pref *p);
    tf_cublas_status (*MatmulPreferenceDestroy)(tf_cublaslt_pref p);
    tf_cublas_status (*MatmulPreferenceSetAttribute)(tf_cublaslt_pref p, int attr, const void *buf, size_t size);
    tf_cublas_status (*MatmulAlgoGetHeuristic)(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, tf_cublaslt_layout a,
                                               tf_cublaslt_layout b, tf_cublaslt_layout c, tf_cublaslt_layout d,
                                               tf_cublaslt_pref pref, int requested, tf_cublaslt_heuristic *results,
                                               int *returned);
    tf_cublas_status (*Matmul)(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, const void *alpha, const void *a,
                               tf_cublaslt_layout adesc, const void *b, tf_cublaslt_layout bdesc, const void *beta,
                               const void *c, tf_cublaslt_layout cdesc, void *d, tf_cublaslt_layout ddesc,
                               const tf_cublaslt_algo *algo, void *workspace, size_t workspace_bytes, tf_cu_stream stream);
    /* whether algo (e.g. one read back from a file) runs this problem here, and the workspace it needs
     * (result->workspace_size; result->algo is not written) */
    tf_cublas_status (*MatmulAlgoCheck)(tf_cublaslt_handle h, tf_cublaslt_matmul_desc op, tf_cublaslt_layout a,
                                        tf_cublaslt_layout b, tf_cublaslt_layout c, tf_cublaslt_layout d,
                                        const tf_cublaslt_algo *algo, tf_cublaslt_heuristic *result);
} tf_cublaslt_api;

/* ---- loading ---- */

typedef enum tf_cuda_search_mode {
    TF_CUDA_SEARCH_ENV,         /* dirs from $TFUSE_CUDA_LIBS; alone when $TFUSE_CUDA_LIBS_ONLY=1 */
    TF_CUDA_SEARCH_EVERYWHERE,  /* dirs first, then the sonames, the usual places, site-packages */
    TF_CUDA_SEARCH_DIRS_ONLY,   /* dirs alone */
    TF_CUDA_SEARCH_EMU,         /* none: cuda-emu's host stand-ins (emu.h) */
} tf_cuda_search_mode;

typedef struct tf_cuda_search {
    tf_cuda_search_mode mode;
    const char *dirs;           /* colon-separated directories (unused with TF_CUDA_SEARCH_ENV) */
} tf_cuda_search;

/* ---- cuDNN: the legacy (cuDNN 7..9) C API for 2-D convolutions, which
 * runtime/cuda/dnn.c plans and runs. libcudnn.so.9 exports every function
 * here (it forwards to libcudnn_ops.so.9, libcudnn_cnn.so.9 and
 * libcudnn_graph.so.9 beside it); libcudnn.so.8 has them all too. Handles and
 * descriptors are opaque; enumerations travel as int (their C ABI), and
 * dnn.c names the values it uses. ---- */

typedef int tf_cudnn_status;                                         /* cudnnStatus_t; 0 = success */
typedef struct tf_cudnn_ctx_ *tf_cudnn_handle;                       /* cudnnHandle_t */
typedef struct tf_cudnn_tensor_ *tf_cudnn_tensor;                    /* cudnnTensorDescriptor_t */
typedef struct tf_cudnn_filter_ *tf_cudnn_filter;                    /* cudnnFilterDescriptor_t */
typedef struct tf_cudnn_conv_ *tf_cudnn_conv;                        /* cudnnConvolutionDescriptor_t */

/* cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionBwdDataAlgoPerf_t and
 * cudnnConvolutionBwdFilterAlgoPerf_t: one layout (48 bytes on LP64). */
typedef struct tf_cudnn_algo_perf {
    int algo;                    /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    tf_cudnn_status status;
    float time;                  /* milliseconds */
    size_t memory;               /* workspace bytes */
    int determinism;             /* cudnnDeterminism_t: 0 non-deterministic, 1 deterministic */
    int math_type;               /* cudnnMathType_t */
    int reserved[3];
} tf_cudnn_algo_perf;

typedef struct tf_cudnn_api {
    size_t (*GetVersion)(void);                                      /* 10000 * major + 100 * minor + patch */
    const char *(*GetErrorString)(tf_cudnn_status s);
    tf_cudnn_status (*Create)(tf_cudnn_handle *h);
    tf_cudnn_status (*Destroy)(tf_cudnn_handle h);
    tf_cudnn_status (*SetStream)(tf_cudnn_handle h, tf_cu_stream stream);
    /* descriptors: (format, data type) and (data type, format) are in cuDNN's own orders */
    tf_cudnn_status (*CreateTensorDescriptor)(tf_cudnn_tensor *d);
    tf_cudnn_status (*SetTensor4dDescriptor)(tf_cudnn_tensor d, int format, int data_type, int n, int c, int h, int w);
    tf_cudnn_status (*SetTensor4dDescriptorEx)(tf_cudnn_tensor d, int data_type, int n, int c, int h, int w, int n_stride,
                                               int c_stride, int h_stride, int w_stride);
    tf_cudnn_status (*DestroyTensorDescriptor)(tf_cudnn_tensor d);
    tf_cudnn_status (*CreateFilterDescriptor)(tf_cudnn_filter *d);
    tf_cudnn_status (*SetFilter4dDescriptor)(tf_cudnn_filter d, int data_type, int format, int k, int c, int h, int w);
    tf_cudnn_status (*DestroyFilterDescriptor)(tf_cudnn_filter d);
    tf_cudnn_status (*CreateConvolutionDescriptor)(tf_cudnn_conv *d);
    tf_cudnn_status (*SetConvolution2dDescriptor)(tf_cudnn_conv d, int pad_h, int pad_w, int stride_h, int stride_w,
                                                  int dilation_h, int dilation_w, int mode, int compute_type);
    tf_cudnn_status (*SetConvolutionMathType)(tf_cudnn_conv d, int math_type);
    tf_cudnn_status (*SetConvolutionGroupCount)(tf_cudnn_conv d, int groups);
    tf_cudnn_status (*DestroyConvolutionDescriptor)(tf_cudnn_conv d);
    /* algorithms: measured on the caller's buffers (each Find overwrites its result operand) */
    tf_cudnn_status (*FindConvolutionForwardAlgorithmEx)(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x, tf_cudnn_filter wd,
                                                         const void *w, tf_cudnn_conv cd, tf_cudnn_tensor yd, void *y,
                                                         int requested, int *returned, tf_cudnn_algo_perf *perf,
                                                         void *workspace, size_t workspace_bytes);
    tf_cudnn_status (*FindConvolutionBackwardDataAlgorithmEx)(tf_cudnn_handle h, tf_cudnn_filter wd, const void *w,
                                                              tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd,
                                                              tf_cudnn_tensor dxd, void *dx, int requested, int *returned,
                                                              tf_cudnn_algo_perf *perf, void *workspace, size_t workspace_bytes);
    tf_cudnn_status (*FindConvolutionBackwardFilterAlgorithmEx)(tf_cudnn_handle h, tf_cudnn_tensor xd, const void *x,
                                                                tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd,
                                                                tf_cudnn_filter dwd, void *dw, int requested, int *returned,
                                                                tf_cudnn_algo_perf *perf, void *workspace, size_t workspace_bytes);
    tf_cudnn_status (*GetConvolutionForwardWorkspaceSize)(tf_cudnn_handle h, tf_cudnn_tensor xd, tf_cudnn_filter wd, tf_cudnn_conv cd,
                                                          tf_cudnn_tensor yd, int algo, size_t *bytes);
    tf_cudnn_status (*GetConvolutionBackwardDataWorkspaceSize)(tf_cudnn_handle h, tf_cudnn_filter wd, tf_cudnn_tensor dyd,
                                                               tf_cudnn_conv cd, tf_cudnn_tensor dxd, int algo, size_t *bytes);
    tf_cudnn_status (*GetConvolutionBackwardFilterWorkspaceSize)(tf_cudnn_handle h, tf_cudnn_tensor xd, tf_cudnn_tensor dyd,
                                                                 tf_cudnn_conv cd, tf_cudnn_filter dwd, int algo, size_t *bytes);
    /* out = alpha * op(in) + beta * out; alpha and beta point to float (double for double data) */
    tf_cudnn_status (*ConvolutionForward)(tf_cudnn_handle h, const void *alpha, tf_cudnn_tensor xd, const void *x,
                                          tf_cudnn_filter wd, const void *w, tf_cudnn_conv cd, int algo, void *workspace,
                                          size_t workspace_bytes, const void *beta, tf_cudnn_tensor yd, void *y);
    tf_cudnn_status (*ConvolutionBackwardData)(tf_cudnn_handle h, const void *alpha, tf_cudnn_filter wd, const void *w,
                                               tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd, int algo, void *workspace,
                                               size_t workspace_bytes, const void *beta, tf_cudnn_tensor dxd, void *dx);
    tf_cudnn_status (*ConvolutionBackwardFilter)(tf_cudnn_handle h, const void *alpha, tf_cudnn_tensor xd, const void *x,
                                                 tf_cudnn_tensor dyd, const void *dy, tf_cudnn_conv cd, int algo, void *workspace,
                                                 size_t workspace_bytes, const void *beta, tf_cudnn_filter dwd, void *dw);
} tf_cudnn_api;

/* NCCL (data parallel's gradient means between GPUs, docs/distributed.md;
 * cuda_comm.c). Values from nccl.h: ncclResult_t, ncclDataType_t,
 * ncclRedOp_t; the unique id is 128 bytes, passed by value. */
typedef struct { char internal[128]; } tf_nccl_unique_id;
typedef struct tf_nccl_comm_s *tf_nccl_comm;
enum { TF_NCCL_SUCCESS = 0, TF_NCCL_IN_PROGRESS = 7 };
enum { TF_NCCL_FLOAT16 = 6, TF_NCCL_FLOAT32 = 7, TF_NCCL_FLOAT64 = 8, TF_NCCL_BFLOAT16 = 9 };
enum { TF_NCCL_AVG = 4 };
typedef struct tf_nccl_api {
    int (*GetVersion)(int *version);              /* ncclResult_t; version: 10000 * major + 100 * minor + patch */
    int (*GetUniqueId)(tf_nccl_unique_id *id);
    int (*CommInitRank)(tf_nccl_comm *comm, int nranks, tf_nccl_unique_id id, int rank);
    int (*CommDestroy)(tf_nccl_comm comm);
    int (*CommAbort)(tf_nccl_comm comm);
    int (*CommGetAsyncError)(tf_nccl_comm comm, int *async_error);
    const char *(*GetErrorString)(int result);
    int (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op, tf_nccl_comm comm, tf_cu_stream stream);
} tf_nccl_api;

enum { TF_CUDA_LIB_NVRTC = 1 << 0, TF_CUDA_LIB_DRIVER = 1 << 1, TF_CUDA_LIB_CUBLASLT = 1 << 2, TF_CUDA_LIB_CUDNN = 1 << 3,
       TF_CUDA_LIB_NCCL = 1 << 4 };

typedef struct tf_cuda_libs {
    unsigned loaded;            /* TF_CUDA_LIB_* that loaded */
    void *nvrtc_handle, *driver_handle, *cublaslt_handle, *cudnn_handle, *nccl_handle;
    void *builtins_handle;      /* libnvrtc-builtins beside libnvrtc, when not on the loader's path */
    char nvrtc_path[4096];      /* the file loaded, "" when not */
    char driver_path[4096];
    char cublaslt_path[4096];
    char cudnn_path[4096];
    char nccl_path[4096];
    char include_dir[4096];     /* holds cuda_fp16.h and cuda_bf16.h; "" when none was found */
    int nvrtc_major, nvrtc_minor;
    int driver_version;         /* cuDriverGetVersion: 1000 * major + 10 * minor */
    size_t cublaslt_version;    /* cublasLtGetVersion: 10000 * major + 100 * minor + patch */
    size_t cudnn_version;       /* cudnnGetVersion: the same scheme */
    int nccl_version;           /* ncclGetVersion: the same scheme */
    int archs[64], narchs;      /* the SM versions NVRTC compiles for (75, 80, ..., 90, ...) */
    char nvrtc_error[1024];     /* why NVRTC did not load, when asked for and not loaded */
    char driver_error[1024];
    char cublaslt_error[1024];
    char cudnn_error[1024];
    char nccl_error[1024];
    tf_nvrtc_api nvrtc;
    tf_cu_api cu;
    tf_cublaslt_api lt;
    tf_cudnn_api dnn;
    tf_nccl_api nccl;
} tf_cuda_libs;

/* Load the libraries in `which` (TF_CUDA_LIB_*), searching as s says (NULL:
 * TF_CUDA_SEARCH_ENV). TF_CUDA_OK when all of them loaded; otherwise the
 * first failure's status, with every missing library's reason in err
 * (which library, where the search looked, what to install). Whatever did
 * load is usable either way (out->loaded); free with tf_cuda_libs_free.
 * Loading the driver does not initialize it: see tf_cuda_driver_init. */
tf_cuda_status tf_cuda_libs_load(tf_cuda_libs *out, unsigned which, const tf_cuda_search *s, char *err, size_t n);
/* Load more of them into l (those of `which` not loaded yet), as
 * tf_cuda_libs_load does. */
tf_cuda_status tf_cuda_libs_add(tf_cuda_libs *l, unsigned which, const tf_cuda_search *s, char *err, size_t n);
void tf_cuda_libs_free(tf_cuda_libs *l);

/* What was loaded from where, and what was not and why: a few lines of
 * "name: version path" for `tfuse doctor`. Returns the length written
 * (snprintf-style). */
int tf_cuda_libs_describe(const tf_cuda_libs *l, char *buf, size_t n);

/* cuInit and the device count: TF_CUDA_ERR_DRIVER when cuInit fails or there
 * is no device, with the driver's own words for why. */
tf_cuda_status tf_cuda_driver_init(tf_cuda_libs *l, int *ndevices, char *err, size_t n);

/* The result of a driver call: TF_CUDA_OK, or TF_CUDA_ERR_DRIVER with
 * "CALL failed at FILE:LINE: NAME (the driver's string)" in err. */
tf_cuda_status tf_cuda_check(const tf_cuda_libs *l, tf_cu_result r, const char *call, const char *file, int line, char *err,
                             size_t n);
/* if (TF_CU_CALL(libs, err, n, MemAlloc(&p, bytes))) return ...; records the
 * call's text, file and line. */
#define TF_CU_CALL(libs, err, n, call) tf_cuda_check((libs), (libs)->cu.call, "cu" #call, __FILE__, __LINE__, (err), (n))

/* ---- compiling ---- */

/* Compile one source to a cubin for arch ("sm_80", "sm_90", "sm_90a", ...).
 * name is the kernel's name (the program's file name in NVRTC's messages).
 * *cubin (malloc'd) and *size on success; *log (malloc'd, possibly "") in
 * every case where NVRTC ran: its warnings on success, its errors on
 * failure. TF_CUDA_ERR_ARCH when NVRTC does not know arch,
 * TF_CUDA_ERR_COMPILE with the log's first error in err. */
tf_cuda_status tf_nvrtc_compile(const tf_cuda_libs *l, const char *src, const char *name, const char *arch, void **cubin,
                                size_t *size, char **log, char *err, size_t n);

/* Many compiles on nthreads threads (<= 0: one per online CPU). Each job
 * gets its own result; the call returns TF_CUDA_OK when every job
 * succeeded, else the first failed job's status. */
typedef struct tf_nvrtc_job {
    const char *src, *name, *arch;   /* in */
    tf_cuda_status status;           /* out */
    void *cubin;
    size_t cubin_size;
    char *log;
    char err[512];
} tf_nvrtc_job;

tf_cuda_status tf_nvrtc_compile_jobs(const tf_cuda_libs *l, tf_nvrtc_job *jobs, int njobs, int nthreads);
void tf_nvrtc_job_free(tf_nvrtc_job *job);   /* its cubin and log */

#endif
