/* artifact.c — see artifact.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "artifact.h"
#include "cuda.h"
#include "cuda_jit.h"
#include "cuda_libs.h"

static int write_file(const char *path, const void *data, size_t size, char *err, size_t n)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(data, 1, size, f) == size;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) snprintf(err, n, "%s: error: cannot write: %s", path, strerror(errno));
    return ok ? 0 : -1;
}

static int make_dir(const char *path, char *err, size_t n)
{
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
    snprintf(err, n, "%s: error: cannot create the directory: %s", path, strerror(errno));
    return -1;
}

/* NVRTC loaded and the plan's CUDA C emitted; -1 (nothing to free) with
 * the reason in err. */
static int open_program(const tf_kernel_plan *plan, tf_cuda_libs *libs, tf_cuda_program *prog, char *err, size_t n)
{
    if (tf_cuda_libs_load(libs, TF_CUDA_LIB_NVRTC, NULL, err, n)) {
        tf_cuda_libs_free(libs);
        return -1;
    }
    tf_diag d = {0};
    if (tf_cuda_emit_plan(plan, prog, &d)) {
        snprintf(err, n, "%s", d.msg);
        tf_cuda_libs_free(libs);
        return -1;
    }
    return 0;
}

/* One NVRTC job per distinct kernel source of prog (the library ops' own
 * kernels and the rest), *kidx[j] the plan kernel it came from, each with
 * its cubin for arch: from the cubin disk cache (cuda_jit.h) where it has
 * it, else compiled by NVRTC now (on every core) and left there. 0, or -1
 * with the reason in err. */
static int cubins_for(const tf_cuda_libs *libs, const tf_cuda_program *prog, const char *arch, tf_nvrtc_job **jobs_out,
                      int **kidx_out, int *njobs_out, int *ncompiled, int *ncached, char *err, size_t n)
{
    int nk = 2 * prog->nkernels;
    tf_nvrtc_job *jobs = tf_calloc((size_t)(nk ? nk : 1), sizeof *jobs);
    int *kidx = tf_calloc((size_t)(nk ? nk : 1), sizeof *kidx);
    int njobs = 0, rc = jobs && kidx ? 0 : -1;
    if (rc) snprintf(err, n, "error: out of memory");
    for (int x = 0; !rc && x < nk; x++) {
        int i = x / 2;
        const tf_cuda_kernel *ck = x % 2 ? &prog->kernels[i] : &prog->library[i];
        if (!ck->src) continue;
        bool seen = false;
        for (int j = 0; j < njobs && !seen; j++) seen = !strcmp(jobs[j].name, ck->name);
        if (seen) continue;
        kidx[njobs] = i;
        jobs[njobs++] = (tf_nvrtc_job){.src = ck->src, .name = ck->name, .arch = arch};
    }
    tf_nvrtc_job *miss = rc ? NULL : tf_calloc((size_t)(njobs ? njobs : 1), sizeof *miss);
    int nmiss = 0;
    if (!rc && !miss) {
        snprintf(err, n, "error: out of memory");
        rc = -1;
    }
    for (int j = 0; !rc && j < njobs; j++) {
        if ((jobs[j].cubin = tf_cuda_cubin_cache_read(libs, jobs[j].src, jobs[j].name, arch, &jobs[j].cubin_size))) (*ncached)++;
        else miss[nmiss++] = jobs[j];
    }
    if (!rc && nmiss && tf_nvrtc_compile_jobs(libs, miss, nmiss, 0)) {
        for (int j = 0; j < nmiss; j++)
            if (miss[j].status) {
                snprintf(err, n, "error: NVRTC could not compile kernel %s for %s: %s", miss[j].name, arch, miss[j].err);
                break;
            }
        rc = -1;
    }
    for (int j = 0, at = 0; !rc && j < njobs; j++) {   /* the compiled ones back in their places */
        if (jobs[j].cubin) continue;
        jobs[j] = miss[at++];
        memset(&miss[at - 1], 0, sizeof *miss);
        tf_cuda_cubin_cache_write(libs, jobs[j].src, jobs[j].name, arch, jobs[j].cubin, jobs[j].cubin_size);
        (*ncompiled)++;
    }
    for (int j = 0; miss && j < nmiss; j++) tf_nvrtc_job_free(&miss[j]);
    tf_free(miss);
    *jobs_out = jobs, *kidx_out = kidx, *njobs_out = njobs;
    return rc;
}

int tf_cuda_write_artifact(const tf_module *m, const tf_kernel_plan *plan, const char *arch, const char *dir, int *ncubins,
                           int *ncompiled, int *ncached, char *err, size_t n)
{
    *ncubins = *ncompiled = *ncached = 0;
    char path[8192];
    snprintf(path, sizeof path, "%s/cuda", dir);
    if (make_dir(dir, err, n) || make_dir(path, err, n)) return -1;
    tf_cuda_libs libs;
    tf_cuda_program prog;
    if (open_program(plan, &libs, &prog, err, n)) return -1;
    tf_nvrtc_job *jobs = NULL;
    int *kidx = NULL, njobs = 0;
    int rc = cubins_for(&libs, &prog, arch, &jobs, &kidx, &njobs, ncompiled, ncached, err, n);
    for (int j = 0; !rc && j < njobs; j++) {   /* each source as --dump-kernels writes it, and its cubin */
        int i = kidx[j];
        const tf_cuda_kernel *ck = !strcmp(prog.library[i].name, jobs[j].name) ? &prog.library[i] : &prog.kernels[i];
        char *cu = tf_cuda_dump(m, &plan->kernels[i], ck);
        snprintf(path, sizeof path, "%s/cuda/%s.cu", dir, ck->name);
        if (!cu) {
            snprintf(err, n, "error: out of memory");
            rc = -1;
        } else {
            rc = write_file(path, cu, strlen(cu), err, n);
        }
        tf_free(cu);
        snprintf(path, sizeof path, "%s/cuda/%s.%s.cubin", dir, jobs[j].name, arch);
        if (!rc) rc = write_file(path, jobs[j].cubin, jobs[j].cubin_size, err, n);
        if (!rc) (*ncubins)++;
    }
    tf_free(kidx);
    /* the manifest: the plan in launch order */
    size_t cap = 256 + (size_t)plan->nkernels * 320, at = 0;
    char *man = rc ? NULL : tf_malloc(cap);
    if (!rc && !man) {
        snprintf(err, n, "error: out of memory");
        rc = -1;
    }
    for (int i = 0; man && i < plan->nkernels; i++) {
        const tf_kernel *k = &plan->kernels[i];
        const tf_cuda_kernel *ck = &prog.kernels[i], *lib = &prog.library[i];
        if (k->lib && k->kind != TF_K_VIEW && lib->src)
            at += (size_t)snprintf(man + at, cap - at, "%s library %s cuda %s grid=%u block=%u smem=%u%s\n", k->name,
                                   tf_op_info_of(k->lib->op)->name, lib->name, lib->grid, lib->block, lib->smem,
                                   lib->clear_first ? " clear_first" : "");
        else if (k->lib && k->kind != TF_K_VIEW)
            at += (size_t)snprintf(man + at, cap - at, "%s library %s\n", k->name, tf_op_info_of(k->lib->op)->name);
        if (k->kind == TF_K_VIEW) at += (size_t)snprintf(man + at, cap - at, "%s view\n", k->name);
        else if (ck->src && ck->parts > 1) {   /* a multi-tensor launch: its later parts run in it */
            at += (size_t)snprintf(man + at, cap - at, "%s cuda %s grid=%u block=%u smem=%u parts=%d\n", k->name, ck->name, ck->grid,
                                   ck->block, ck->smem, ck->parts);
            for (int q = 1; q < ck->parts && i + 1 < plan->nkernels; q++)
                at += (size_t)snprintf(man + at, cap - at, "%s in %s\n", plan->kernels[++i].name, k->name);
        } else if (ck->src)
            at += (size_t)snprintf(man + at, cap - at, "%s cuda %s grid=%u block=%u smem=%u%s%.0u\n", k->name, ck->name, ck->grid,
                                   ck->block, ck->smem, ck->scratch ? " scratch=" : "", ck->scratch);
        if (k->kind != TF_K_VIEW && ck->src && ck->name2[0])
            at += (size_t)snprintf(man + at, cap - at, "%s cuda %s grid=%u block=%u smem=0\n", k->name, ck->name2, ck->grid2, ck->block2);
    }
    if (man) {
        snprintf(path, sizeof path, "%s/manifest.txt", dir);
        rc = write_file(path, man, at, err, n);
    }
    tf_free(man);
    for (int j = 0; j < njobs; j++) tf_nvrtc_job_free(&jobs[j]);
    tf_free(jobs);
    tf_cuda_program_free(&prog);
    tf_cuda_libs_free(&libs);
    return rc;
}

int tf_cuda_package_cubins(const tf_kernel_plan *plan, const char *archs, tf_pkg *pkg, int *ncubins, int *ncompiled, int *ncached,
                           char *err, size_t n)
{
    *ncubins = *ncompiled = *ncached = 0;
    tf_cuda_libs libs;
    tf_cuda_program prog;
    if (open_program(plan, &libs, &prog, err, n)) return -1;
    int rc = 0;
    char arch[48], why[256], sec[160];
    for (const char *a = archs; !rc && *a;) {   /* "sm_80,sm_90" */
        size_t len = strcspn(a, ",");
        if (len == 0 || len >= sizeof arch) {
            snprintf(err, n, "error: --arch=%s: expected architectures like sm_90, separated by commas", archs);
            rc = -1;
            break;
        }
        memcpy(arch, a, len);
        arch[len] = 0;
        a += len + (a[len] == ',');
        tf_nvrtc_job *jobs = NULL;
        int *kidx = NULL, njobs = 0;
        rc = cubins_for(&libs, &prog, arch, &jobs, &kidx, &njobs, ncompiled, ncached, err, n);
        for (int j = 0; !rc && j < njobs; j++) {
            snprintf(sec, sizeof sec, "cuda/%s/%s.cubin", arch, jobs[j].name);
            if (!tf_pkg_add(pkg, sec, jobs[j].cubin, jobs[j].cubin_size, why, sizeof why)) {
                snprintf(err, n, "error: package: %s", why);
                rc = -1;
            } else {
                (*ncubins)++;
            }
        }
        for (int j = 0; jobs && j < njobs; j++) tf_nvrtc_job_free(&jobs[j]);
        tf_free(jobs);
        tf_free(kidx);
    }
    if (!rc && !tf_pkg_add(pkg, "cuda/archs", archs, strlen(archs), why, sizeof why)) {
        snprintf(err, n, "error: package: %s", why);
        rc = -1;
    }
    tf_cuda_program_free(&prog);
    tf_cuda_libs_free(&libs);
    return rc;
}
