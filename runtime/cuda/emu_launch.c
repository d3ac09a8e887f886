/* emu_launch.c — cuda-emu's kernel launches (see emu.h, emu.c): every
 * thread of every block of a compiled kernel (emu_nvrtc.c) run by the
 * prelude's scheduler, as a coroutine on a stack of its own.
 *
 * Running. Launches run one at a time in the process (a mutex), on stacks
 * of 64 KiB per thread with a guard page below each; a fault inside a
 * kernel (a wild address, a stack overflow) fails the launch (on a created
 * stream: the next wait for it, as above) with the
 * kernel, the block, the thread and the address instead of killing the
 * process, as CUDA reports an illegal address. A launch's geometry is
 * checked as the driver does: at most 1024 threads a block and no more
 * than the kernel's __launch_bounds__, dynamic shared memory above 48 KiB
 * only after cuFuncSetAttribute allowed it. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"
#include "emu.h"
#include "emu_internal.h"

static const size_t STACK = 64 * 1024;

static pthread_mutex_t g_launch_mu = PTHREAD_MUTEX_INITIALIZER;   /* one launch at a time */
static int g_inject;         /* tf_cuda_emu_inject_fault: launches until the one that faults, 0: none */
static char *g_stacks;

void tf_cuda_emu_inject_fault(int after)
{
    pthread_mutex_lock(&g_launch_mu);
    g_inject = after > 0 ? after : 0;
    pthread_mutex_unlock(&g_launch_mu);
}

/* ---- launching ------------------------------------------------------------------------ */

typedef struct launch_arg {
    emu_func *f;
    unsigned grid[3], block[3], smem;
    _Alignas(16) unsigned char params[];   /* each parameter's bytes at its natural alignment (param_offset) */
} launch_arg;

/* Where parameter i's bytes go in launch_arg.params; the end after the last. */
static size_t param_offset(const emu_func *f, int i)
{
    size_t at = 0;
    for (int q = 0; q < i; q++) at = (at + f->psize[q] - 1) / f->psize[q] * f->psize[q] + f->psize[q];
    return i < f->nparams ? (at + f->psize[i] - 1) / f->psize[i] * f->psize[i] : at;
}

static sigjmp_buf g_fault_jmp;
static volatile sig_atomic_t g_in_kernel;
static volatile uintptr_t g_fault_addr;

static void on_fault(int sig, siginfo_t *info, void *uc)
{
    (void)uc;
    if (!g_in_kernel) {   /* not ours: the default action */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_fault_addr = (uintptr_t)info->si_addr;
    siglongjmp(g_fault_jmp, sig);
}

static bool stacks_ready(void)
{
    if (g_stacks) return true;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, STACK * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    for (int i = 0; i < MAX_THREADS; i++) mprotect(p + (size_t)i * STACK, page, PROT_NONE);   /* guard pages */
    g_stacks = p;
    return true;
}

static int run_launch(void *argp)
{
    launch_arg *a = argp;
    emu_func *f = a->f;
    void **params = tf_malloc((size_t)(f->nparams ? f->nparams : 1) * sizeof *params);
    if (!params) return fail(OUT_OF_MEMORY, "out of host memory");
    size_t at = 0;
    for (int i = 0; i < f->nparams; i++) {
        at = (at + f->psize[i] - 1) / f->psize[i] * f->psize[i];
        params[i] = a->params + at;
        at += f->psize[i];
    }
    pthread_mutex_lock(&g_launch_mu);
    if (!stacks_ready()) {
        pthread_mutex_unlock(&g_launch_mu);
        tf_free(params);
        return fail(OUT_OF_MEMORY, "cuda-emu: no memory for the threads' stacks");
    }
    static char alt[64 * 1024];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt}, old_ss;
    struct sigaction sa, old_segv, old_bus;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaltstack(&ss, &old_ss);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    char err[1024] = "";
    int r = OK;
    int sig = sigsetjmp(g_fault_jmp, 1);
    if (!sig && g_inject > 0 && --g_inject == 0) {   /* a test's fault (tf_cuda_emu_inject_fault) */
        r = fail(ILLEGAL_ADDRESS, "cuda-emu: kernel %s (grid %u, block %u): an illegal memory access (injected by "
                 "tf_cuda_emu_inject_fault)", f->name, a->grid[0], a->block[0]);
    } else if (!sig) {
        g_in_kernel = 1;
        if (f->mod->launch(f->entry, params, a->grid, a->block, a->smem, g_stacks, STACK, err, sizeof err))
            r = fail(LAUNCH_FAILED, "cuda-emu: kernel %s: %s", f->name, err);
        g_in_kernel = 0;
    } else {
        g_in_kernel = 0;
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        uintptr_t at = g_fault_addr, lo = (uintptr_t)g_stacks, hi = lo + STACK * MAX_THREADS;
        bool overflow = at >= lo && at < hi && (at - lo) % STACK < page;
        r = fail(ILLEGAL_ADDRESS, "cuda-emu: kernel %s (grid %u, block %u): %s at address 0x%llx",
                 f->name, a->grid[0], a->block[0], overflow ? "a thread overflowed its stack" : "an illegal memory access",
                 (unsigned long long)at);
        /* the kernel's scheduler state is abandoned; its next launch starts it afresh */
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    sigaltstack(&old_ss, NULL);
    pthread_mutex_unlock(&g_launch_mu);
    tf_free(params);
    return r;
}

static tf_cu_result emu_launch(tf_cu_function fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned smem, tf_cu_stream s, void **params, void **extra)
{
    emu_func *f = (emu_func *)fn;
    if (!f) return fail(INVALID_HANDLE, "cuLaunchKernel: no function");
    if (extra) return fail(NOT_SUPPORTED, "cuda-emu takes kernel parameters as kernelParams, not extra");
    unsigned long threads = (unsigned long)bx * by * bz;
    if (!gx || !gy || !gz || !threads || threads > MAX_THREADS || gx > 0x7fffffffu || gy > 65535 || gz > 65535)
        return fail(INVALID_VALUE, "cuLaunchKernel(%s): grid (%u, %u, %u) x block (%u, %u, %u) is outside the device's limits", f->name,
                    gx, gy, gz, bx, by, bz);
    if (f->bound && threads > f->bound)
        return fail(LAUNCH_OUT_OF_RESOURCES, "cuLaunchKernel(%s): %lu threads a block, and its __launch_bounds__ is %u", f->name, threads,
                    f->bound);
    if (smem > f->max_smem)
        return fail(INVALID_VALUE, "cuLaunchKernel(%s): %u bytes of dynamic shared memory, %u allowed (cuFuncSetAttribute raises it)",
                    f->name, smem, f->max_smem);
    if (f->nparams && !params) return fail(INVALID_VALUE, "cuLaunchKernel(%s): no parameters for %d", f->name, f->nparams);
    int r = tf_emu_module_ready(f->mod);
    if (r) return r;
    size_t bytes = sizeof(launch_arg) + param_offset(f, f->nparams);
    launch_arg *a = tf_calloc(1, bytes);
    if (!a) return fail(OUT_OF_MEMORY, "out of host memory");
    a->f = f;
    a->grid[0] = gx, a->grid[1] = gy, a->grid[2] = gz;
    a->block[0] = bx, a->block[1] = by, a->block[2] = bz;
    a->smem = smem;
    for (int i = 0, at = 0; i < f->nparams; i++) {
        at = (at + f->psize[i] - 1) / f->psize[i] * f->psize[i];
        memcpy(a->params + at, params[i], f->psize[i]);
        at += f->psize[i];
    }
    r = tf_cuda_emu_submit(s, run_launch, a, bytes);
    tf_free(a);
    return r;
}

static tf_cu_result emu_func_attr(tf_cu_function fn, int attr, int value)
{
    emu_func *f = (emu_func *)fn;
    if (attr != 8) return fail(NOT_SUPPORTED, "cuda-emu sets only CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES");
    if (value < 0 || value > SMEM_OPTIN) return fail(INVALID_VALUE, "%d bytes of dynamic shared memory: the device has %d", value, SMEM_OPTIN);
    f->max_smem = (unsigned)value;
    return OK;
}

void tf_emu_launch_fill(tf_cu_api *c) { c->FuncSetAttribute = emu_func_attr, c->LaunchKernel = emu_launch; }
