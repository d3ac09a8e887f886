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

/* The distinct kernels of prog (the library ops' own kernels and the
 * rest; kidx[j] the plan kernel ks[j] came from) and their cubins for arch
 * (cuda_jit.h: programs of several kernels, from the cubin disk cache
 * where it has them, else compiled by NVRTC now, on every core, and left
 * there). 0, or -1 with the reason in err; *ks, *kidx and *cb to free
 * either way. */
static int cubins_for(const tf_cuda_libs *libs, const tf_cuda_program *prog, const char *arch, const tf_cuda_kernel ***ks_out,
                      int **kidx_out, int *nks_out, tf_cuda_cubins *cb, char *err, size_t n)
{
    memset(cb, 0, sizeof *cb);
    int nk = 2 * prog->nkernels;
    const tf_cuda_kernel **ks = tf_calloc((size_t)(nk ? nk : 1), sizeof *ks);
    int *kidx = tf_calloc((size_t)(nk ? nk : 1), sizeof *kidx);
    int nks = 0, rc = ks && kidx ? 0 : -1;
    *ks_out = ks, *kidx_out = kidx, *nks_out = 0;
    if (rc) {
        snprintf(err, n, "error: out of memory");
        return -1;
    }
    for (int x = 0; x < nk; x++) {
        int i = x / 2;
        const tf_cuda_kernel *ck = x % 2 ? &prog->kernels[i] : &prog->library[i];
        if (!ck->src) continue;
        bool seen = false;
        for (int j = 0; j < nks && !seen; j++) seen = !strcmp(ks[j]->name, ck->name);
        if (seen) continue;
        kidx[nks] = i;
        ks[nks++] = ck;
    }
    *nks_out = nks;
    char why[2048];
    if (tf_cuda_cubins_get(libs, arch, NULL, TF_CUBINS_STORED, 0, ks, nks, cb, why, sizeof why)) {
        snprintf(err, n, "error: %s", why);
        return -1;
    }
    return 0;
}

int tf_cuda_write_artifact(const tf_module *m, const tf_kernel_plan *plan, const char *arch, const char *dir, int *ncubins,
                           int *nkernels, int *ncompiled, int *ncached, char *err, size_t n)
{
    *ncubins = *nkernels = *ncompiled = *ncached = 0;
    char path[8192];
    snprintf(path, sizeof path, "%s/cuda", dir);
    if (make_dir(dir, err, n) || make_dir(path, err, n)) return -1;
    tf_cuda_libs libs;
    tf_cuda_program prog;
    if (open_program(plan, &libs, &prog, err, n)) return -1;
    const tf_cuda_kernel **ks = NULL;
    int *kidx = NULL, nks = 0;
    tf_cuda_cubins cb;
    int rc = cubins_for(&libs, &prog, arch, &ks, &kidx, &nks, &cb, err, n);
    for (int j = 0; !rc && j < nks; j++) {   /* each source as --dump-kernels writes it */
        int i = kidx[j];
        char *cu = tf_cuda_dump(m, &plan->kernels[i], ks[j]);
        snprintf(path, sizeof path, "%s/cuda/%s.cu", dir, ks[j]->name);
        if (!cu) {
            snprintf(err, n, "error: out of memory");
            rc = -1;
        } else {
            rc = write_file(path, cu, strlen(cu), err, n);
        }
        tf_free(cu);
    }
    /* each program's cubin, and cubins.txt: which cubin holds which of the model's kernels */
    tf_strbuf list = {0};
    for (int c = 0; !rc && c < cb.n; c++) {
        snprintf(path, sizeof path, "%s/cuda/%s.%s.cubin", dir, cb.c[c].name, arch);
        rc = write_file(path, cb.c[c].bin, cb.c[c].size, err, n);
        tf_strbuf_printf(&list, "cuda/%s.%s.cubin", cb.c[c].name, arch);
        for (int j = 0; j < nks; j++)
            if (cb.of[j] == c) tf_strbuf_printf(&list, " %s", ks[j]->name);
        tf_strbuf_printf(&list, "\n");
    }
    if (!rc && list.oom) {
        snprintf(err, n, "error: out of memory");
        rc = -1;
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/cubins.txt", dir);
        rc = write_file(path, list.p ? list.p : "", list.n, err, n);
    }
    tf_free(list.p);
    if (!rc) *ncubins = cb.n, *nkernels = nks, *ncompiled = cb.compiled, *ncached = cb.cached;
    tf_cuda_cubins_free(&cb);
    tf_free(ks);
    tf_free(kidx);
    /* the manifest: the plan in launch order */
    /* a kernel: at most three lines (a library op's and its epilogue's, flash_attention_grad's two, a kernel's and its
     * second entry point's), each under 256 bytes */
    size_t cap = 256 + (size_t)plan->nkernels * 768, at = 0;
    char *man = rc ? NULL : tf_malloc(cap);
    if (!rc && !man) {
        snprintf(err, n, "error: out of memory");
        rc = -1;
    }
    for (int i = 0; man && i < plan->nkernels; i++) {
        const tf_kernel *k = &plan->kernels[i];
        const tf_cuda_kernel *ck = &prog.kernels[i], *lib = &prog.library[i];
        if (k->lib && k->kind != TF_K_VIEW && lib->src) {
            at += (size_t)snprintf(man + at, cap - at, "%s library %s cuda %s grid=%u block=%u smem=%u%s\n", k->name,
                                   tf_op_info_of(k->lib->op)->name, lib->name, lib->grid, lib->block, lib->smem,
                                   lib->clear_first ? " clear_first" : "");
            if (lib->name2[0])   /* flash_attention_grad's second entry point, launched right after */
                at += (size_t)snprintf(man + at, cap - at, "%s library %s cuda %s grid=%u block=%u smem=%u\n", k->name,
                                       tf_op_info_of(k->lib->op)->name, lib->name2, lib->grid2, lib->block2, lib->smem2);
        } else if (k->lib && k->kind != TF_K_VIEW)
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
            at += (size_t)snprintf(man + at, cap - at, "%s cuda %s grid=%u block=%u smem=%u\n", k->name, ck->name2, ck->grid2, ck->block2,
                                   ck->smem2);
    }
    if (man) {
        snprintf(path, sizeof path, "%s/manifest.txt", dir);
        rc = write_file(path, man, at, err, n);
    }
    tf_free(man);
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
        const tf_cuda_kernel **ks = NULL;
        int *kidx = NULL, nks = 0;
        tf_cuda_cubins cb;
        rc = cubins_for(&libs, &prog, arch, &ks, &kidx, &nks, &cb, err, n);
        tf_strbuf index = {0};   /* "KERNEL PROGRAM" per kernel */
        for (int j = 0; !rc && j < nks; j++) tf_strbuf_printf(&index, "%s %s\n", ks[j]->name, cb.c[cb.of[j]].name);
        for (int c = 0; !rc && c < cb.n; c++) {
            snprintf(sec, sizeof sec, "cuda/%s/%s.cubin", arch, cb.c[c].name);
            if (!tf_pkg_add(pkg, sec, cb.c[c].bin, cb.c[c].size, why, sizeof why)) {
                snprintf(err, n, "error: package: %s", why);
                rc = -1;
            } else {
                (*ncubins)++;
                *ncompiled += cb.c[c].from == TF_CUBIN_COMPILED;
                *ncached += cb.c[c].from == TF_CUBIN_CACHED;
            }
        }
        snprintf(sec, sizeof sec, "cuda/%s/kernels", arch);
        if (!rc && (index.oom || !tf_pkg_add(pkg, sec, index.p ? index.p : "", index.n, why, sizeof why))) {
            snprintf(err, n, "error: package: %s", index.oom ? "out of memory" : why);
            rc = -1;
        }
        tf_free(index.p);
        tf_cuda_cubins_free(&cb);
        tf_free(ks);
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
