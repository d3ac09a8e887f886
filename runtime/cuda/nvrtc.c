/* nvrtc.c — CUDA C++ to cubins with NVRTC, one source at a time or many on
 * a pool of threads. Options: the SM architecture (a cubin, not PTX: no JIT
 * at load time, and what `compile -o` ships), -default-device (every
 * function is device code unless marked), C++17, and the include directory
 * the loader found for cuda_fp16.h / cuda_bf16.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_libs.h"
#include "alloc.h"

/* "sm_90", "sm_90a", "sm_100f": the number must be one NVRTC supports. */
static bool arch_known(const tf_cuda_libs *l, const char *arch)
{
    int sm = 0, used = 0;
    if (sscanf(arch, "sm_%d%n", &sm, &used) != 1) return false;
    const char *rest = arch + used;
    if (*rest && !((rest[0] == 'a' || rest[0] == 'f') && !rest[1])) return false;
    if (!l->narchs) return true;   /* NVRTC did not list them: let it decide */
    for (int i = 0; i < l->narchs; i++)
        if (l->archs[i] == sm) return true;
    return false;
}

/* The first line of the log that says "error", else its first line. */
static void first_error(const char *log, char *out, size_t n)
{
    const char *at = log ? strstr(log, "error") : NULL;
    if (!at) at = log ? log : "";
    while (at > log && at[-1] != '\n') at--;
    size_t len = strcspn(at, "\n");
    snprintf(out, n, "%.*s", (int)(len > 300 ? 300 : len), at);
}

tf_cuda_status tf_nvrtc_compile(const tf_cuda_libs *l, const char *src, const char *name, const char *arch, void **cubin,
                                size_t *size, char **log, char *err, size_t n)
{
    *cubin = NULL;
    *size = 0;
    if (log) *log = NULL;
    if (!(l->loaded & TF_CUDA_LIB_NVRTC)) {
        snprintf(err, n, "NVRTC is not loaded: %s", l->nvrtc_error[0] ? l->nvrtc_error : "tf_cuda_libs_load was not asked for it");
        return TF_CUDA_ERR_NOT_FOUND;
    }
    if (!src || !name || !arch) {
        snprintf(err, n, "nvrtc: no source, name or architecture");
        return TF_CUDA_ERR_ARG;
    }
    if (!arch_known(l, arch)) {
        snprintf(err, n, "NVRTC %d.%d cannot compile for %s (it knows sm_%d .. sm_%d)", l->nvrtc_major, l->nvrtc_minor, arch,
                 l->narchs ? l->archs[0] : 0, l->narchs ? l->archs[l->narchs - 1] : 0);
        return TF_CUDA_ERR_ARCH;
    }
    char archopt[64], incopt[4200], file[160];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    snprintf(incopt, sizeof incopt, "-I%s", l->include_dir);
    snprintf(file, sizeof file, "%.150s.cu", name);
    const char *opts[4] = {archopt, "-default-device", "--std=c++17", incopt};
    int nopts = l->include_dir[0] ? 4 : 3;
    tf_nvrtc_prog p = NULL;
    tf_nvrtc_result r = l->nvrtc.CreateProgram(&p, src, file, 0, NULL, NULL);
    if (r) {
        snprintf(err, n, "nvrtcCreateProgram(%s): %s", file, l->nvrtc.GetErrorString(r));
        return r == 1 ? TF_CUDA_ERR_OOM : TF_CUDA_ERR_COMPILE;   /* 1: NVRTC_ERROR_OUT_OF_MEMORY */
    }
    tf_cuda_status st = TF_CUDA_OK;
    tf_nvrtc_result cr = l->nvrtc.CompileProgram(p, nopts, opts);
    size_t ls = 0;
    char *text = NULL;
    if (!l->nvrtc.GetProgramLogSize(p, &ls) && (text = tf_malloc(ls + 1))) {
        if (l->nvrtc.GetProgramLog(p, text)) text[0] = 0;
        text[ls] = 0;
    }
    if (cr) {
        char first[320];
        first_error(text, first, sizeof first);
        bool headers = text && (strstr(text, "cuda_fp16.h") || strstr(text, "cuda_bf16.h")) && !l->include_dir[0];
        snprintf(err, n, "nvrtc: %s for %s: %s: %s%s", file, arch, l->nvrtc.GetErrorString(cr), first,
                 headers ? " (no directory with cuda_fp16.h and cuda_bf16.h was found: install the CUDA toolkit's headers or "
                           "`pip install nvidia-cuda-runtime`)"
                         : "");
        st = TF_CUDA_ERR_COMPILE;
    } else {
        size_t cs = 0;
        void *bin = NULL;
        if ((r = l->nvrtc.GetCUBINSize(p, &cs)) || !cs) {
            snprintf(err, n, "nvrtcGetCUBINSize(%s): %s", file, r ? l->nvrtc.GetErrorString(r) : "empty cubin");
            st = TF_CUDA_ERR_COMPILE;
        } else if (!(bin = tf_malloc(cs))) {
            snprintf(err, n, "out of memory for the cubin of %s (%zu bytes)", file, cs);
            st = TF_CUDA_ERR_OOM;
        } else if ((r = l->nvrtc.GetCUBIN(p, bin))) {
            snprintf(err, n, "nvrtcGetCUBIN(%s): %s", file, l->nvrtc.GetErrorString(r));
            tf_free(bin);
            st = TF_CUDA_ERR_COMPILE;
        } else {
            *cubin = bin;
            *size = cs;
        }
    }
    l->nvrtc.DestroyProgram(&p);
    if (log) *log = text;
    else tf_free(text);
    return st;
}

/* ---- many at once ---- */

typedef struct pool {
    const tf_cuda_libs *l;
    tf_nvrtc_job *jobs;
    int njobs, next;
    pthread_mutex_t mu;
} pool;

static void *work(void *arg)
{
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int i = p->next++;
        pthread_mutex_unlock(&p->mu);
        if (i >= p->njobs) return NULL;
        tf_nvrtc_job *j = &p->jobs[i];
        j->status = tf_nvrtc_compile(p->l, j->src, j->name, j->arch, &j->cubin, &j->cubin_size, &j->log, j->err, sizeof j->err);
    }
}

tf_cuda_status tf_nvrtc_compile_jobs(const tf_cuda_libs *l, tf_nvrtc_job *jobs, int njobs, int nthreads)
{
    for (int i = 0; i < njobs; i++) {
        jobs[i].status = TF_CUDA_OK;
        jobs[i].cubin = NULL;
        jobs[i].cubin_size = 0;
        jobs[i].log = NULL;
        jobs[i].err[0] = 0;
    }
    if (nthreads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = c > 0 ? (int)c : 1;
    }
    if (nthreads > njobs) nthreads = njobs;
    if (nthreads > 64) nthreads = 64;
    pool p = {.l = l, .jobs = jobs, .njobs = njobs};
    pthread_mutex_init(&p.mu, NULL);
    pthread_t tids[64];
    int started = 0;
    for (int i = 1; i < nthreads; i++)   /* the caller is the last worker */
        if (pthread_create(&tids[started], NULL, work, &p) == 0) started++;
    work(&p);
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    pthread_mutex_destroy(&p.mu);
    for (int i = 0; i < njobs; i++)
        if (jobs[i].status) return jobs[i].status;
    return TF_CUDA_OK;
}

void tf_nvrtc_job_free(tf_nvrtc_job *job)
{
    if (!job) return;
    tf_free(job->cubin);
    tf_free(job->log);
    job->cubin = NULL;
    job->log = NULL;
    job->cubin_size = 0;
}
