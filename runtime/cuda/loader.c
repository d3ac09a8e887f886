/* loader.c — find and dlopen NVRTC and the CUDA driver, resolve the
 * functions tfuse calls, and find the headers NVRTC needs. See cuda_libs.h
 * for the search order. A library that is found but lacks a function (too
 * old) is passed over with a note, and the search goes on; when nothing
 * loads, the message names the library, every place searched, the notes,
 * and what to install. */
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_libs.h"
#include "emu.h"
#include "alloc.h"
#include "env.h"

/* ---- what each library is ---- */

/* A function: its name, another name tried when the first is missing
 * (NULL: none), and where its pointer goes. */
typedef struct sym { const char *name, *alt; size_t off; } sym;

#define NV(f) {"nvrtc" #f, NULL, offsetof(tf_nvrtc_api, f)}
static const sym nvrtc_syms[] = {
    NV(GetErrorString), NV(Version), NV(GetNumSupportedArchs), NV(GetSupportedArchs), NV(CreateProgram),
    NV(DestroyProgram), NV(CompileProgram), NV(GetProgramLogSize), NV(GetProgramLog), NV(GetCUBINSize), NV(GetCUBIN),
};
#undef NV

#define CU(f, name) {name, NULL, offsetof(tf_cu_api, f)}
#define CU2(f, name, alt) {name, alt, offsetof(tf_cu_api, f)}
static const sym cu_syms[] = {
    CU(Init, "cuInit"), CU(DriverGetVersion, "cuDriverGetVersion"), CU(GetErrorName, "cuGetErrorName"),
    CU(GetErrorString, "cuGetErrorString"), CU(DeviceGetCount, "cuDeviceGetCount"), CU(DeviceGet, "cuDeviceGet"),
    CU(DeviceGetName, "cuDeviceGetName"), CU(DeviceGetAttribute, "cuDeviceGetAttribute"),
    CU(DeviceTotalMem, "cuDeviceTotalMem_v2"), CU(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    CU(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"), CU(CtxSetCurrent, "cuCtxSetCurrent"),
    CU(CtxSynchronize, "cuCtxSynchronize"), CU(MemGetInfo, "cuMemGetInfo_v2"), CU(MemAlloc, "cuMemAlloc_v2"),
    CU(MemFree, "cuMemFree_v2"), CU(MemcpyHtoD, "cuMemcpyHtoD_v2"), CU(MemcpyDtoH, "cuMemcpyDtoH_v2"),
    CU(StreamCreate, "cuStreamCreate"), CU(StreamDestroy, "cuStreamDestroy_v2"),
    CU(StreamSynchronize, "cuStreamSynchronize"), CU(ModuleLoadData, "cuModuleLoadData"),
    CU(ModuleUnload, "cuModuleUnload"), CU(ModuleGetFunction, "cuModuleGetFunction"),
    CU(FuncSetAttribute, "cuFuncSetAttribute"), CU(LaunchKernel, "cuLaunchKernel"),
    CU(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"), CU(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    CU(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"), CU(MemsetD8Async, "cuMemsetD8Async"),
    CU(MemAllocHost, "cuMemAllocHost_v2"), CU(MemFreeHost, "cuMemFreeHost"), CU(EventCreate, "cuEventCreate"),
    CU(EventDestroy, "cuEventDestroy_v2"), CU(EventRecord, "cuEventRecord"),
    /* CUDA 12.8 added _v2 (same signature); older drivers have the first */
    CU2(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    CU(StreamWaitEvent, "cuStreamWaitEvent"), CU(EventSynchronize, "cuEventSynchronize"), CU(EventQuery, "cuEventQuery"),
    CU(StreamBeginCapture, "cuStreamBeginCapture_v2"), CU(StreamEndCapture, "cuStreamEndCapture"),
    CU(GraphInstantiate, "cuGraphInstantiateWithFlags"), CU(GraphLaunch, "cuGraphLaunch"),
    CU(GraphExecDestroy, "cuGraphExecDestroy"), CU(GraphDestroy, "cuGraphDestroy"),
};
#undef CU
#undef CU2

#define LT(f) {"cublasLt" #f, NULL, offsetof(tf_cublaslt_api, f)}
static const sym lt_syms[] = {
    LT(Create), LT(Destroy), LT(GetVersion), LT(GetStatusName), LT(GetStatusString), LT(MatmulDescCreate),
    LT(MatmulDescDestroy), LT(MatmulDescSetAttribute), LT(MatrixLayoutCreate), LT(MatrixLayoutDestroy),
    LT(MatrixLayoutSetAttribute), LT(MatmulPreferenceCreate), LT(MatmulPreferenceDestroy),
    LT(MatmulPreferenceSetAttribute), LT(MatmulAlgoGetHeuristic), LT(Matmul), LT(MatmulAlgoCheck),
};
#undef LT

#define DNN(f) {"cudnn" #f, NULL, offsetof(tf_cudnn_api, f)}
static const sym dnn_syms[] = {
    DNN(GetVersion), DNN(GetErrorString), DNN(Create), DNN(Destroy), DNN(SetStream),
    DNN(CreateTensorDescriptor), DNN(SetTensor4dDescriptor), DNN(SetTensor4dDescriptorEx), DNN(DestroyTensorDescriptor),
    DNN(CreateFilterDescriptor), DNN(SetFilter4dDescriptor), DNN(DestroyFilterDescriptor),
    DNN(CreateConvolutionDescriptor), DNN(SetConvolution2dDescriptor), DNN(SetConvolutionMathType),
    DNN(SetConvolutionGroupCount), DNN(DestroyConvolutionDescriptor),
    DNN(FindConvolutionForwardAlgorithmEx), DNN(FindConvolutionBackwardDataAlgorithmEx),
    DNN(FindConvolutionBackwardFilterAlgorithmEx), DNN(GetConvolutionForwardWorkspaceSize),
    DNN(GetConvolutionBackwardDataWorkspaceSize), DNN(GetConvolutionBackwardFilterWorkspaceSize),
    DNN(ConvolutionForward), DNN(ConvolutionBackwardData), DNN(ConvolutionBackwardFilter),
};
#undef DNN

#define NCCL(f) {"nccl" #f, NULL, offsetof(tf_nccl_api, f)}
static const sym nccl_syms[] = {NCCL(GetVersion), NCCL(GetUniqueId), NCCL(CommInitRank), NCCL(CommDestroy), NCCL(CommAbort),
                                NCCL(CommGetAsyncError), NCCL(GetErrorString), NCCL(AllReduce)};
#undef NCCL

typedef struct libspec {
    const char *what;             /* for messages */
    const char *const *files;     /* names in order of preference */
    const char *const *places;    /* fixed directories after the sonames */
    bool site_packages;           /* also site-packages/nvidia/<pkg>/lib */
    const sym *syms;
    int nsyms;
} libspec;

static const char *const nvrtc_files[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
static const char *const toolkit_places[] = {"/usr/local/cuda/lib64", "/usr/local/cuda/lib",
                                             "/usr/local/cuda/targets/x86_64-linux/lib", NULL};
/* Only libcuda.so.1: a bare libcuda.so is often the toolkit's link stub,
 * which loads and then fails every call. */
static const char *const driver_files[] = {"libcuda.so.1", NULL};
static const char *const driver_places[] = {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64",
                                            "/usr/lib/wsl/lib", NULL};

static const char *const cublaslt_files[] = {"libcublasLt.so.13", "libcublasLt.so.12", NULL};

/* cuDNN 9 (8 has the same calls used here): the toolkit's lib64, Debian's
 * and Ubuntu's packages (libcudnn9-cuda-*), pip's nvidia-cudnn-cu*. In 9,
 * libcudnn.so.9 is a small shim that exports the whole legacy API and
 * loads libcudnn_graph/_ops/_cnn.so.9 from its own directory on first use
 * (checked with nm -D on 9.19: every function of dnn_syms is defined in
 * it). */
static const char *const cudnn_files[] = {"libcudnn.so.9", "libcudnn.so.8", NULL};
static const char *const cudnn_places[] = {"/usr/local/cuda/lib64", "/usr/local/cuda/lib",
                                           "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu",
                                           "/usr/lib64", NULL};

static const libspec nvrtc_spec = {"NVRTC", nvrtc_files, toolkit_places, true, nvrtc_syms,
                                   (int)(sizeof nvrtc_syms / sizeof *nvrtc_syms)};
static const libspec driver_spec = {"the CUDA driver", driver_files, driver_places, false, cu_syms,
                                    (int)(sizeof cu_syms / sizeof *cu_syms)};
static const libspec cublaslt_spec = {"cuBLASLt", cublaslt_files, toolkit_places, true, lt_syms,
                                      (int)(sizeof lt_syms / sizeof *lt_syms)};
static const libspec cudnn_spec = {"cuDNN", cudnn_files, cudnn_places, true, dnn_syms,
                                   (int)(sizeof dnn_syms / sizeof *dnn_syms)};
/* NCCL 2: the toolkit's lib (CUDA 13 ships it there), Debian's libnccl2, pip's nvidia-nccl-cu* */
static const char *const nccl_files[] = {"libnccl.so.2", NULL};
static const libspec nccl_spec = {"NCCL", nccl_files, cudnn_places, true, nccl_syms,
                                  (int)(sizeof nccl_syms / sizeof *nccl_syms)};

/* ---- small text helpers ---- */

typedef struct text { char *p; size_t n, at; } text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...)
{
    if (!t->n || t->at + 1 >= t->n) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->p + t->at, t->n - t->at, fmt, ap);
    va_end(ap);
    if (k > 0) t->at = t->at + (size_t)k < t->n ? t->at + (size_t)k : t->n - 1;
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- site-packages ---- */

/* Glob patterns for site-packages directories, into pats[0..max). */
static int site_patterns(char (*pats)[PATH_MAX], int max)
{
    int n = 0;
    const char *v;
#define PAT(...) do { if (n < max) snprintf(pats[n++], PATH_MAX, __VA_ARGS__); } while (0)
    if ((v = tf_env("VIRTUAL_ENV")) && *v) PAT("%s/lib/python3*/site-packages", v);
    if ((v = tf_env("CONDA_PREFIX")) && *v) PAT("%s/lib/python3*/site-packages", v);
    const char *home = tf_env("HOME");
    if (home && *home) PAT("%s/.local/lib/python3*/site-packages", home);
    if ((v = tf_env("PYENV_ROOT")) && *v) PAT("%s/versions/*/lib/python3*/site-packages", v);
    else if (home && *home) PAT("%s/.pyenv/versions/*/lib/python3*/site-packages", home);
    PAT("/usr/local/lib/python3*/site-packages");
    PAT("/usr/local/lib/python3*/dist-packages");
    PAT("/usr/lib/python3/dist-packages");
    PAT("/usr/lib/python3*/site-packages");
    /* beside each python on PATH: a venv's or a prefix install's bin/ */
    const char *path = tf_env("PATH");
    while (path && *path && n < max) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len && len < PATH_MAX - 64) PAT("%.*s/../lib/python3*/site-packages", (int)len, path);
        path = end ? end + 1 : NULL;
    }
#undef PAT
    return n;
}

/* Call fn on every existing path matching each site-packages pattern
 * followed by suffix ("nvidia/ * /lib/libnvrtc.so.13"); stops when fn
 * returns true. */
static bool each_site_match(const char *suffix, bool (*fn)(void *arg, const char *path), void *arg)
{
    enum { MAXPATS = 48 };
    char (*pats)[PATH_MAX] = tf_malloc(MAXPATS * sizeof *pats);
    if (!pats) return false;
    int n = site_patterns(pats, MAXPATS);
    bool done = false;
    char pat[PATH_MAX + 128];
    for (int i = 0; i < n && !done; i++) {
        snprintf(pat, sizeof pat, "%s/%s", pats[i], suffix);
        glob_t g;
        if (glob(pat, 0, NULL, &g) == 0)
            for (size_t j = 0; j < g.gl_pathc && !done; j++) done = fn(arg, g.gl_pathv[j]);
        globfree(&g);
    }
    tf_free(pats);
    return done;
}

/* ---- finding one library ---- */

typedef struct finder {
    const libspec *spec;
    void *api;                 /* where the resolved functions go */
    void *handle;
    char path[4096];
    char notes[768];           /* files that exist and did not do, and why */
    size_t nnotes;
} finder;

static void note(finder *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(finder *f, const char *fmt, ...)
{
    if (f->nnotes + 2 >= sizeof f->notes) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(f->notes + f->nnotes, sizeof f->notes - f->nnotes, fmt, ap);
    va_end(ap);
    if (k > 0) f->nnotes = f->nnotes + (size_t)k < sizeof f->notes ? f->nnotes + (size_t)k : sizeof f->notes - 1;
}

/* dlopen one candidate (a path, or a bare soname for the loader's search)
 * and resolve every function; true when it will do. */
static bool try_load(finder *f, const char *cand)
{
    bool is_path = strchr(cand, '/') != NULL;
    if (is_path && !exists(cand)) return false;
    /* never unmapped (RTLD_NODELETE): NVRTC and the driver keep threads and
     * allocations for the life of the process, and unloading them under
     * either is unsafe; tf_cuda_libs_free drops only the reference */
    void *h = dlopen(cand, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        if (is_path) {
            const char *e = dlerror();
            note(f, "; %s: %s", cand, e ? e : "dlopen failed");
        }
        return false;
    }
    for (int i = 0; i < f->spec->nsyms; i++) {
        dlerror();
        void *p = dlsym(h, f->spec->syms[i].name);
        if (!p && f->spec->syms[i].alt) p = dlsym(h, f->spec->syms[i].alt);
        if (!p) {
            note(f, "; %s lacks %s (too old)", cand, f->spec->syms[i].name);
            dlclose(h);
            return false;
        }
        memcpy((char *)f->api + f->spec->syms[i].off, &p, sizeof p);   /* object to function pointer, as POSIX allows */
    }
    f->handle = h;
    struct link_map *lm = NULL;
    const char *name = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0] ? lm->l_name : cand;
    char real[PATH_MAX];
    snprintf(f->path, sizeof f->path, "%.4000s", realpath(name, real) ? real : name);
    return true;
}

static bool try_site(void *arg, const char *path) { return try_load(arg, path); }

/* The search's directories: s->dirs, or $TFUSE_CUDA_LIBS. */
static const char *search_dirs(const tf_cuda_search *s)
{
    if (s && s->mode != TF_CUDA_SEARCH_ENV) return s->dirs;
    return tf_env("TFUSE_CUDA_LIBS");
}

static bool dirs_only(const tf_cuda_search *s)
{
    if (s && s->mode != TF_CUDA_SEARCH_ENV) return s->mode == TF_CUDA_SEARCH_DIRS_ONLY;
    const char *v = tf_env("TFUSE_CUDA_LIBS_ONLY");
    return v && strcmp(v, "1") == 0;
}

/* Run the search; on failure the message goes to err. */
static bool find(finder *f, const tf_cuda_search *s, char *err, size_t n)
{
    const libspec *sp = f->spec;
    const char *dirs = search_dirs(s);
    bool only = dirs_only(s);
    char cand[PATH_MAX + 64];
    for (const char *d = dirs; d && *d;) {   /* 1. the given directories */
        const char *end = strchr(d, ':');
        size_t len = end ? (size_t)(end - d) : strlen(d);
        for (int i = 0; len && len < PATH_MAX && sp->files[i]; i++) {
            snprintf(cand, sizeof cand, "%.*s/%s", (int)len, d, sp->files[i]);
            if (try_load(f, cand)) return true;
        }
        d = end ? end + 1 : NULL;
    }
    if (!only) {
        for (int i = 0; sp->files[i]; i++)   /* 2. the sonames, through the dynamic loader */
            if (try_load(f, sp->files[i])) return true;
        for (int p = 0; sp->places[p]; p++)   /* 3. the usual places */
            for (int i = 0; sp->files[i]; i++) {
                snprintf(cand, sizeof cand, "%s/%s", sp->places[p], sp->files[i]);
                if (try_load(f, cand)) return true;
            }
        for (int i = 0; sp->site_packages && sp->files[i]; i++) {   /* 4. pip's nvidia packages */
            snprintf(cand, sizeof cand, "nvidia/*/lib/%s", sp->files[i]);
            if (each_site_match(cand, try_site, f)) return true;
        }
    }
    /* not found: say what, where, and what to do */
    text t = {err, n, 0};
    char names[256] = "";
    for (int i = 0; sp->files[i]; i++) {
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", i == 0 ? "" : sp->files[i + 1] ? ", " : " or ", sp->files[i]);
    }
    bool env = !s || s->mode == TF_CUDA_SEARCH_ENV;
    if (sp == &driver_spec) add(&t, "no CUDA driver (%s not found): this machine has no NVIDIA GPU driver", names);
    else add(&t, "%s not found: no loadable %s", sp->what, names);
    if (only) {
        add(&t, "; searched only %s%s (%s)", env ? "TFUSE_CUDA_LIBS=" : "", dirs && *dirs ? dirs : "(empty)",
            env ? "TFUSE_CUDA_LIBS_ONLY=1" : "a directories-only search");
    } else {
        add(&t, "; searched ");
        if (dirs && *dirs) add(&t, "%s%s, ", env ? "TFUSE_CUDA_LIBS=" : "", dirs);
        else if (env) add(&t, "$TFUSE_CUDA_LIBS (unset), ");
        add(&t, "the dynamic loader's path (LD_LIBRARY_PATH, ldconfig)");
        for (int p = 0; sp->places[p]; p++) add(&t, ", %s", sp->places[p]);
        if (sp->site_packages) add(&t, " and Python site-packages (nvidia/*/lib)");
    }
    if (f->nnotes) add(&t, "%s", f->notes);
    if (sp == &nvrtc_spec)
        add(&t, "; install the CUDA toolkit or `pip install nvidia-cuda-nvrtc nvidia-cuda-runtime`, or set TFUSE_CUDA_LIBS to "
                "the directory holding libnvrtc.so");
    else if (sp == &cublaslt_spec)
        add(&t, "; install the CUDA toolkit's cuBLAS or `pip install nvidia-cublas`, or set TFUSE_CUDA_LIBS to the directory "
                "holding libcublasLt.so");
    else if (sp == &cudnn_spec)
        add(&t, "; install cuDNN 9 (NVIDIA's libcudnn9-cuda-12 or -13 package) or `pip install nvidia-cudnn-cu12`, or set "
                "TFUSE_CUDA_LIBS to the directory holding libcudnn.so.9");
    else if (sp == &nccl_spec)
        add(&t, "; install NCCL 2 (the CUDA toolkit's, NVIDIA's libnccl2 package) or `pip install nvidia-nccl-cu12`, or set "
                "TFUSE_CUDA_LIBS to the directory holding libnccl.so.2");
    else if (!only)
        add(&t, "; GPU targets need the NVIDIA driver (TFUSE_CUDA_LIBS may name the directory holding libcuda.so.1)");
    return false;
}

/* NVRTC opens libnvrtc-builtins.so.MAJOR.MINOR by soname when it compiles;
 * outside the loader's path (pip's wheels, a TFUSE_CUDA_LIBS directory)
 * that fails unless the one beside libnvrtc is already loaded, which a
 * later dlopen of the same soname then finds. */
static void *preload_builtins(const tf_cuda_libs *l)
{
    char dir[PATH_MAX], cand[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s", l->nvrtc_path);
    char *slash = strrchr(dir, '/');
    if (!slash) return NULL;
    *slash = 0;
    snprintf(cand, sizeof cand, "%s/libnvrtc-builtins.so.%d.%d", dir, l->nvrtc_major, l->nvrtc_minor);
    return exists(cand) ? dlopen(cand, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) : NULL;
}

/* ---- the headers NVRTC needs ---- */

static bool has_headers(const char *dir)
{
    char p[2 * PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/cuda_fp16.h", dir);
    if (!exists(p)) return false;
    snprintf(p, sizeof p, "%s/cuda_bf16.h", dir);
    return exists(p);
}

static bool take_include(tf_cuda_libs *l, const char *dir)
{
    if (!has_headers(dir)) return false;
    char real[PATH_MAX];
    snprintf(l->include_dir, sizeof l->include_dir, "%.4000s", realpath(dir, real) ? real : dir);
    return true;
}

static bool try_include_site(void *arg, const char *path) { return take_include(arg, path); }

static void find_include(tf_cuda_libs *l, const tf_cuda_search *s)
{
    char cand[PATH_MAX + 64];
    const char *dirs = search_dirs(s);
    for (const char *d = dirs; d && *d;) {   /* beside the directories searched */
        const char *end = strchr(d, ':');
        size_t len = end ? (size_t)(end - d) : strlen(d);
        snprintf(cand, sizeof cand, "%.*s/../include", (int)(len < PATH_MAX ? len : 0), d);
        if (len && take_include(l, cand)) return;
        d = end ? end + 1 : NULL;
    }
    char lib[PATH_MAX];
    snprintf(lib, sizeof lib, "%s", l->nvrtc_path);
    char *slash = strrchr(lib, '/');
    if (slash) {
        *slash = 0;
        snprintf(cand, sizeof cand, "%s/../include", lib);   /* the toolkit's, or pip's nvidia/cu13 */
        if (take_include(l, cand)) return;
        snprintf(cand, sizeof cand, "%s/../../cuda_runtime/include", lib);   /* pip's CUDA 12 layout */
        if (take_include(l, cand)) return;
    }
    static const char *const places[] = {"/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include", NULL};
    for (int i = 0; places[i]; i++)
        if (take_include(l, places[i])) return;
    each_site_match("nvidia/*/include", try_include_site, l);
}

/* ---- the API ---- */

tf_cuda_status tf_cuda_libs_load(tf_cuda_libs *out, unsigned which, const tf_cuda_search *s, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    return tf_cuda_libs_add(out, which, s, err, n);
}

tf_cuda_status tf_cuda_libs_add(tf_cuda_libs *out, unsigned which, const tf_cuda_search *s, char *err, size_t n)
{
    tf_cuda_status st = TF_CUDA_OK;
    text t = {err, n, 0};
    if (n) err[0] = 0;
    which &= ~out->loaded;
    if (s && s->mode == TF_CUDA_SEARCH_EMU) {
        tf_cuda_emu_load(out, which);
        return TF_CUDA_OK;
    }
    if (which & TF_CUDA_LIB_NVRTC) {
        finder f = {.spec = &nvrtc_spec, .api = &out->nvrtc};
        if (find(&f, s, out->nvrtc_error, sizeof out->nvrtc_error)) {
            out->loaded |= TF_CUDA_LIB_NVRTC;
            out->nvrtc_handle = f.handle;
            snprintf(out->nvrtc_path, sizeof out->nvrtc_path, "%s", f.path);
            out->nvrtc.Version(&out->nvrtc_major, &out->nvrtc_minor);
            out->builtins_handle = preload_builtins(out);
            int na = 0;
            if (!out->nvrtc.GetNumSupportedArchs(&na) && na > 0 && na <= (int)(sizeof out->archs / sizeof *out->archs) &&
                !out->nvrtc.GetSupportedArchs(out->archs))
                out->narchs = na;
            find_include(out, s);
        } else {
            memset(&out->nvrtc, 0, sizeof out->nvrtc);
            add(&t, "%s", out->nvrtc_error);
            st = TF_CUDA_ERR_NOT_FOUND;
        }
    }
    if (which & TF_CUDA_LIB_DRIVER) {
        finder f = {.spec = &driver_spec, .api = &out->cu};
        if (find(&f, s, out->driver_error, sizeof out->driver_error)) {
            out->loaded |= TF_CUDA_LIB_DRIVER;
            out->driver_handle = f.handle;
            snprintf(out->driver_path, sizeof out->driver_path, "%s", f.path);
            if (out->cu.DriverGetVersion(&out->driver_version)) out->driver_version = 0;
        } else {
            memset(&out->cu, 0, sizeof out->cu);
            add(&t, "%s%s", t.at ? "\n" : "", out->driver_error);
            if (!st) st = TF_CUDA_ERR_NOT_FOUND;
        }
    }
    if (which & TF_CUDA_LIB_CUBLASLT) {
        finder f = {.spec = &cublaslt_spec, .api = &out->lt};
        if (find(&f, s, out->cublaslt_error, sizeof out->cublaslt_error)) {
            out->loaded |= TF_CUDA_LIB_CUBLASLT;
            out->cublaslt_handle = f.handle;
            snprintf(out->cublaslt_path, sizeof out->cublaslt_path, "%s", f.path);
            out->cublaslt_version = out->lt.GetVersion();
        } else {
            memset(&out->lt, 0, sizeof out->lt);
            add(&t, "%s%s", t.at ? "\n" : "", out->cublaslt_error);
            if (!st) st = TF_CUDA_ERR_NOT_FOUND;
        }
    }
    if (which & TF_CUDA_LIB_CUDNN) {
        finder f = {.spec = &cudnn_spec, .api = &out->dnn};
        if (find(&f, s, out->cudnn_error, sizeof out->cudnn_error)) {
            out->loaded |= TF_CUDA_LIB_CUDNN;
            out->cudnn_handle = f.handle;
            snprintf(out->cudnn_path, sizeof out->cudnn_path, "%s", f.path);
            out->cudnn_version = out->dnn.GetVersion();
        } else {
            memset(&out->dnn, 0, sizeof out->dnn);
            add(&t, "%s%s", t.at ? "\n" : "", out->cudnn_error);
            if (!st) st = TF_CUDA_ERR_NOT_FOUND;
        }
    }
    if (which & TF_CUDA_LIB_NCCL) {
        finder f = {.spec = &nccl_spec, .api = &out->nccl};
        if (find(&f, s, out->nccl_error, sizeof out->nccl_error)) {
            out->loaded |= TF_CUDA_LIB_NCCL;
            out->nccl_handle = f.handle;
            snprintf(out->nccl_path, sizeof out->nccl_path, "%s", f.path);
            if (out->nccl.GetVersion(&out->nccl_version)) out->nccl_version = 0;
        } else {
            memset(&out->nccl, 0, sizeof out->nccl);
            add(&t, "%s%s", t.at ? "\n" : "", out->nccl_error);
            if (!st) st = TF_CUDA_ERR_NOT_FOUND;
        }
    }
    return st;
}

void tf_cuda_libs_free(tf_cuda_libs *l)
{
    if (!l) return;
    if (l->builtins_handle) dlclose(l->builtins_handle);
    if (l->nvrtc_handle) dlclose(l->nvrtc_handle);
    if (l->driver_handle) dlclose(l->driver_handle);
    if (l->cublaslt_handle) dlclose(l->cublaslt_handle);
    if (l->cudnn_handle) dlclose(l->cudnn_handle);
    if (l->nccl_handle) dlclose(l->nccl_handle);
    memset(l, 0, sizeof *l);
}

int tf_cuda_libs_describe(const tf_cuda_libs *l, char *buf, size_t n)
{
    text t = {buf, n, 0};
    if (n) buf[0] = 0;
    if (l->loaded & TF_CUDA_LIB_NVRTC) {
        add(&t, "nvrtc: %d.%d %s\n", l->nvrtc_major, l->nvrtc_minor, l->nvrtc_path);
        if (l->narchs) add(&t, "nvrtc architectures: sm_%d .. sm_%d (%d)\n", l->archs[0], l->archs[l->narchs - 1], l->narchs);
        if (l->include_dir[0]) add(&t, "cuda headers: %s\n", l->include_dir);
        else add(&t, "cuda headers: not found (kernels on f16/bf16 data need cuda_fp16.h and cuda_bf16.h)\n");
    } else if (l->nvrtc_error[0]) {
        add(&t, "nvrtc: not loaded: %s\n", l->nvrtc_error);
    }
    if (l->loaded & TF_CUDA_LIB_DRIVER)
        add(&t, "driver: %d.%d %s\n", l->driver_version / 1000, l->driver_version % 1000 / 10, l->driver_path);
    else if (l->driver_error[0])
        add(&t, "driver: not loaded: %s\n", l->driver_error);
    if (l->loaded & TF_CUDA_LIB_CUBLASLT)
        add(&t, "cublasLt: %zu.%zu.%zu %s\n", l->cublaslt_version / 10000, l->cublaslt_version / 100 % 100,
            l->cublaslt_version % 100, l->cublaslt_path);
    else if (l->cublaslt_error[0])
        add(&t, "cublasLt: not loaded: %s\n", l->cublaslt_error);
    if (l->loaded & TF_CUDA_LIB_CUDNN)
        add(&t, "cudnn: %zu.%zu.%zu %s\n", l->cudnn_version / 10000, l->cudnn_version / 100 % 100, l->cudnn_version % 100,
            l->cudnn_path);
    else if (l->cudnn_error[0])
        add(&t, "cudnn: not loaded: %s\n", l->cudnn_error);
    if (l->loaded & TF_CUDA_LIB_NCCL)
        add(&t, "nccl: %d.%d.%d %s (data parallel's gradient means on the cuda target)\n",
            l->nccl_version / 10000, l->nccl_version / 100 % 100, l->nccl_version % 100, l->nccl_path);
    else if (l->nccl_error[0])
        add(&t, "nccl: not loaded: %s\n", l->nccl_error);
    return (int)t.at;
}

tf_cuda_status tf_cuda_check(const tf_cuda_libs *l, tf_cu_result r, const char *call, const char *file, int line, char *err,
                             size_t n)
{
    if (!r) return TF_CUDA_OK;
    const char *name = NULL, *str = NULL;
    if (l->cu.GetErrorName && l->cu.GetErrorName(r, &name)) name = NULL;
    if (l->cu.GetErrorString && l->cu.GetErrorString(r, &str)) str = NULL;
    snprintf(err, n, "%s failed at %s:%d: %s (%s)", call, file, line, name ? name : "CUDA error", str ? str : "no description");
    return TF_CUDA_ERR_DRIVER;
}

tf_cuda_status tf_cuda_driver_init(tf_cuda_libs *l, int *ndevices, char *err, size_t n)
{
    if (ndevices) *ndevices = 0;
    if (!(l->loaded & TF_CUDA_LIB_DRIVER)) {
        snprintf(err, n, "%s", l->driver_error[0] ? l->driver_error : "the CUDA driver is not loaded");
        return TF_CUDA_ERR_NOT_FOUND;
    }
    if (TF_CU_CALL(l, err, n, Init(0))) return TF_CUDA_ERR_DRIVER;
    int count = 0;
    if (TF_CU_CALL(l, err, n, DeviceGetCount(&count))) return TF_CUDA_ERR_DRIVER;
    if (count <= 0) {
        snprintf(err, n, "the CUDA driver (%s) sees no GPU", l->driver_path);
        return TF_CUDA_ERR_DRIVER;
    }
    if (ndevices) *ndevices = count;
    return TF_CUDA_OK;
}
