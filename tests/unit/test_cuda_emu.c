/* test_cuda_emu.c — cuda-emu catches what a GPU would: mistakes planted in
 * generated CUDA C change what the kernel computes, or fail its launch.
 *
 * A pointwise kernel (a transpose added to a broadcast row: strided loads,
 * 16-byte vectors and a scalar tail) and a row reduction (a warp shuffle sum,
 * then shared memory across warps) are emitted by codegen/cuda.c, run on
 * cuda-emu's driver as emitted, and run again with one mistake each, on the
 * same fresh random inputs:
 *
 *   a wrong stride            a load's index multiplies by the wrong stride
 *   an off-by-one bound       the reduction's loop stops one element early
 *   a wrong shuffle width     the warp sum shuffles within 16 lanes, not 32
 *   a dropped bounds check    the vector loop runs one vector past the end
 *   a missing barrier         the reduction reads shared memory before the
 *                             other warps wrote it
 *
 * Each mutant must differ from the original somewhere, or fail its launch,
 * or write outside its buffers (every buffer is followed by a guard band the
 * test checks); that the originals agree with the interpreter is
 * test_gpu --emu's part (ctest cuda_emu_run). The driver's own checks: a launch
 * past __launch_bounds__ is refused, a wild address is reported as an
 * illegal address with the kernel's name, and a barrier in divergent code
 * is reported as a deadlock, not a hang. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda.h"
#include "emu.h"
#include "runtime.h"
#include "testutil.h"
#include "tfuse.h"

enum { GUARD = 4096 };

static tf_cuda_libs g_libs;
static uint64_t g_seed;

typedef struct run_result {
    int rc;                    /* CUresult of the launch or the sync */
    char err[2048];
    unsigned char *out[16];    /* per buffer: its bytes after the run */
    size_t bytes[16];
    bool guard_broken;
} run_result;

static void result_free(run_result *r)
{
    for (int i = 0; i < 16; i++) free(r->out[i]);
}

/* Compile src on the emu, run it over k's buffers filled from seed. */
static void run_source(const tf_kernel *k, const tf_cuda_kernel *ck, const char *src, unsigned grid, run_result *r)
{
    memset(r, 0, sizeof *r);
    tf_nvrtc_prog prog;
    size_t isz = 0;
    g_libs.nvrtc.CreateProgram(&prog, src, ck->name, 0, NULL, NULL);
    g_libs.nvrtc.CompileProgram(prog, 0, NULL);
    g_libs.nvrtc.GetCUBINSize(prog, &isz);
    char *image = malloc(isz);
    g_libs.nvrtc.GetCUBIN(prog, image);
    g_libs.nvrtc.DestroyProgram(&prog);
    tf_cu_module mod = NULL;
    tf_cu_function fn = NULL;
    tf_cu_deviceptr dp[16] = {0};
    void *args[16];
    uint64_t s = g_seed;
    r->rc = g_libs.cu.ModuleLoadData(&mod, image);
    if (!r->rc) r->rc = g_libs.cu.ModuleGetFunction(&fn, mod, ck->name);
    for (int b = 0; !r->rc && b < k->nbufs && b < 16; b++) {
        const tf_value *v = k->bufs[b].value;
        size_t bytes = (size_t)tf_type_numel(&v->type) * (size_t)tf_dtype_bytes(v->type.dtype);
        r->bytes[b] = bytes;
        r->rc = g_libs.cu.MemAlloc(&dp[b], bytes + GUARD);
        if (r->rc) break;
        unsigned char *h = malloc(bytes + GUARD);
        for (int64_t i = 0; i < tf_type_numel(&v->type); i++) tf_elem_store(v->type.dtype, h, i, 4 * test_rnd(&s) - 2);
        memset(h + bytes, 0x5c, GUARD);
        g_libs.cu.MemcpyHtoD(dp[b], h, bytes + GUARD);
        free(h);
        args[b] = &dp[b];
    }
    if (!r->rc) r->rc = g_libs.cu.LaunchKernel(fn, grid, 1, 1, ck->block, 1, 1, ck->smem, NULL, args, NULL);
    if (!r->rc) r->rc = g_libs.cu.CtxSynchronize();
    if (r->rc) {
        const char *e = "";
        g_libs.cu.GetErrorString(r->rc, &e);
        snprintf(r->err, sizeof r->err, "%s", e);
    }
    for (int b = 0; b < k->nbufs && b < 16 && dp[b]; b++) {
        if (!r->rc) {
            r->out[b] = malloc(r->bytes[b] + GUARD);
            g_libs.cu.MemcpyDtoH(r->out[b], dp[b], r->bytes[b] + GUARD);
            for (size_t i = 0; i < GUARD; i++) r->guard_broken |= r->out[b][r->bytes[b] + i] != 0x5c;
        }
        g_libs.cu.MemFree(dp[b]);
    }
    if (mod) g_libs.cu.ModuleUnload(mod);
    free(image);
}

/* Does a mutant's run differ from the original's? */
static bool differs(const tf_kernel *k, const run_result *a, const run_result *b)
{
    if (b->rc || b->guard_broken) return true;
    for (int i = 0; i < k->nbufs; i++)
        if (k->bufs[i].written && memcmp(a->out[i], b->out[i], a->bytes[i])) return true;
    return false;
}

/* src with the first occurrence of `from` (after `after`, if given) replaced by `to`. */
static char *mutate(const char *src, const char *after, const char *from, const char *to)
{
    const char *base = after ? strstr(src, after) : src;
    const char *at = base ? strstr(base, from) : NULL;
    if (!at) return NULL;
    size_t n = strlen(src) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - src), src, to, at + strlen(from));
    return out;
}

/* The kernel of the plan whose kind is `kind` (the first). */
static const tf_kernel *find_kernel(const tf_kernel_plan *plan, tf_kernel_kind kind)
{
    for (int i = 0; i < plan->nkernels; i++)
        if (plan->kernels[i].kind == kind && tf_cuda_supports(&plan->kernels[i], NULL, 0)) return &plan->kernels[i];
    return NULL;
}

typedef struct mutant { const char *what, *after, *from, *to; } mutant;

static void check_mutants(const char *label, const char *model, tf_kernel_kind kind, const mutant *ms, int nm)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = TF_TARGET_CUDA_EMU;
    const tf_kernel_plan *plan = NULL;
    if (tf_model_parse_string(ctx, label, model, strlen(model), NULL, 0, &m) || tf_program_compile(ctx, m, &o, &p) ||
        tf_program_plan(ctx, p, &plan)) {
        CHECK(0, "%s: %s", label, tf_context_last_error(ctx));
    } else {
        const tf_kernel *k = find_kernel(plan, kind);
        tf_cuda_kernel ck;
        tf_diag d = {0};
        CHECK(k != NULL, "%s: a kernel of the kind wanted", label);
        if (k && !tf_cuda_emit(k, &ck, &d)) {
            run_result orig;
            run_source(k, &ck, ck.src, ck.grid, &orig);
            CHECK(orig.rc == 0 && !orig.guard_broken, "%s: the emitted kernel runs (%s)", label, orig.err);
            for (int i = 0; i < nm; i++) {
                char *src = mutate(ck.src, ms[i].after, ms[i].from, ms[i].to);
                CHECK(src != NULL, "%s: the text to mutate for '%s' (%s) is in the kernel", label, ms[i].what, ms[i].from);
                if (!src || orig.rc) {
                    free(src);
                    continue;
                }
                run_result mr;
                run_source(k, &ck, src, ck.grid, &mr);
                bool caught = differs(k, &orig, &mr);
                printf("%s, %s: %s\n", label, ms[i].what,
                       mr.rc ? mr.err : mr.guard_broken ? "wrote past a buffer's end" : caught ? "different results" : "NOT CAUGHT");
                CHECK(caught, "%s: the mistake '%s' changes nothing cuda-emu can see", label, ms[i].what);
                result_free(&mr);
                free(src);
            }
            result_free(&orig);
            tf_cuda_kernel_free(&ck);
        }
    }
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

/* The driver's checks on launches: bounds, wild addresses, divergent barriers. */
static void driver_checks(void)
{
    static const char *const bad[] = {
        /* a wild address */
        "extern \"C\" __global__ void __launch_bounds__(32) tf_wild(float *b0) { b0[threadIdx.x] = *(float *)16; }",
        /* a barrier in divergent code: half a warp waits at __syncthreads, the other half at __syncwarp */
        "extern \"C\" __global__ void __launch_bounds__(64) tf_diverge(float *b0) { if (threadIdx.x < 16) __syncthreads(); "
        "else __syncwarp(); b0[threadIdx.x] = 1; }",
    };
    static const char *const want[] = {"illegal memory access", "deadlock"};
    static const char *const names[] = {"tf_wild", "tf_diverge"};
    for (int i = 0; i < 2; i++) {
        tf_nvrtc_prog prog;
        size_t isz = 0;
        g_libs.nvrtc.CreateProgram(&prog, bad[i], names[i], 0, NULL, NULL);
        g_libs.nvrtc.GetCUBINSize(prog, &isz);
        char *image = malloc(isz);
        g_libs.nvrtc.GetCUBIN(prog, image);
        g_libs.nvrtc.DestroyProgram(&prog);
        tf_cu_module mod = NULL;
        tf_cu_function fn = NULL;
        tf_cu_deviceptr dp = 0;
        CHECK(!g_libs.cu.ModuleLoadData(&mod, image) && !g_libs.cu.ModuleGetFunction(&fn, mod, names[i]) && !g_libs.cu.MemAlloc(&dp, 1024),
              "%s loads", names[i]);
        void *args[1] = {&dp};
        unsigned block = i == 0 ? 32 : 64;
        int rc = g_libs.cu.LaunchKernel(fn, 1, 1, 1, block * 2, 1, 1, 0, NULL, args, NULL);
        const char *e = "";
        g_libs.cu.GetErrorString(rc, &e);
        CHECK(rc != 0 && strstr(e, "__launch_bounds__"), "a block past __launch_bounds__ is refused: %s", e);
        rc = g_libs.cu.LaunchKernel(fn, 1, 1, 1, block, 1, 1, 0, NULL, args, NULL);
        g_libs.cu.GetErrorString(rc, &e);
        printf("%s: %s\n", names[i], e);
        CHECK(rc != 0 && strstr(e, want[i]) && strstr(e, names[i]), "%s fails with '%s' and its name: %s", names[i], want[i], e);
        g_libs.cu.MemFree(dp);
        g_libs.cu.ModuleUnload(mod);
        free(image);
    }
}

/* Modules that define a kernel of the same name (the cuda target's may share kernels), compiled in one go:
 * three, the first and the third sharing tf_shared, so that two compile batches (a 2-core machine's) would
 * deal them into one translation unit, which must not define tf_shared twice. Fresh sources each run (the
 * seed in them), so the disk cache holds none of them. */
static void shared_kernels(void)
{
    const char *names[3][2] = {{"tf_shared", "tf_one"}, {"tf_two", "tf_three"}, {"tf_shared", "tf_four"}};
    tf_cu_module mods[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        char src[1024];
        snprintf(src, sizeof src, "// seed %llu, module %d\n"
                 "extern \"C\" __global__ void __launch_bounds__(32) %s(float *b0) { b0[threadIdx.x] = 1; }\n"
                 "extern \"C\" __global__ void __launch_bounds__(32) %s(float *b0) { b0[threadIdx.x] = %d; }\n",
                 (unsigned long long)g_seed, i, names[i][0], names[i][1], i + 2);
        tf_nvrtc_prog prog;
        size_t isz = 0;
        g_libs.nvrtc.CreateProgram(&prog, src, names[i][0], 0, NULL, NULL);
        g_libs.nvrtc.GetCUBINSize(prog, &isz);
        char *image = malloc(isz);
        g_libs.nvrtc.GetCUBIN(prog, image);
        g_libs.nvrtc.DestroyProgram(&prog);
        CHECK(!g_libs.cu.ModuleLoadData(&mods[i], image), "module %d loads", i);
        free(image);
    }
    tf_cu_deviceptr dp = 0;
    CHECK(!g_libs.cu.MemAlloc(&dp, 128), "memory");
    for (int i = 0; i < 3; i++) {   /* the first launch compiles every pending module */
        tf_cu_function fn = NULL;
        void *args[1] = {&dp};
        int rc = mods[i] ? g_libs.cu.ModuleGetFunction(&fn, mods[i], names[i][1]) : 1;
        if (!rc) rc = g_libs.cu.LaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
        float got[32] = {0};
        if (!rc) rc = g_libs.cu.MemcpyDtoH(got, dp, sizeof got);
        const char *e = "";
        g_libs.cu.GetErrorString(rc, &e);
        CHECK(!rc && got[31] == (float)(i + 2), "module %d's %s runs (%s)", i, names[i][1], rc ? e : "ok");
    }
    g_libs.cu.MemFree(dp);
    for (int i = 0; i < 3; i++)
        if (mods[i]) g_libs.cu.ModuleUnload(mods[i]);
}

/* A stream that waits for an event recorded in a capture joins it (a fork: cuda_comm.c's NCCL stream);
 * the capture ends well only once a capturing stream has waited for that stream's last work (a join),
 * and its replay runs the two streams' work in the order they were given. */
static void fork_join(void)
{
    const tf_cu_api *cu = &g_libs.cu;
    tf_cu_stream a = NULL, b = NULL;
    tf_cu_event e1 = NULL, e2 = NULL;
    tf_cu_deviceptr d = 0;
    CHECK(!cu->StreamCreate(&a, 1) && !cu->StreamCreate(&b, 1) && !cu->EventCreate(&e1, 2) && !cu->EventCreate(&e2, 2) &&
          !cu->MemAlloc(&d, 8), "streams, events and memory");
    unsigned char one = 1, two = 2, got[2] = {0, 0};
    for (int joined = 0; joined < 2; joined++) {
        tf_cu_graph g = NULL;
        CHECK(!cu->StreamBeginCapture(a, 0), "begin a capture");
        cu->MemsetD8Async(d, 0, 2, a);
        CHECK(!cu->EventRecord(e1, a) && !cu->StreamWaitEvent(b, e1, 0), "b forks from a's capture");
        cu->MemcpyHtoDAsync(d, &one, 1, b);   /* recorded into a's graph, not run */
        if (joined) CHECK(!cu->EventRecord(e2, b) && !cu->StreamWaitEvent(a, e2, 0), "a waits for b: the join");
        cu->MemcpyHtoDAsync(d + 1, &two, 1, a);
        int r = cu->StreamEndCapture(a, &g);
        const char *e = "";
        cu->GetErrorString(r, &e);
        if (!joined) {
            CHECK(r != 0 && strstr(e, "was not waited for"), "a capture whose forked stream never rejoined fails: %s", e);
        } else {
            tf_cu_graph_exec x = NULL;
            CHECK(!r && !cu->GraphInstantiate(&x, g, 0) && !cu->GraphLaunch(x, a) && !cu->StreamSynchronize(a) &&
                      !cu->MemcpyDtoH(got, d, 2) && got[0] == 1 && got[1] == 2,
                  "the joined capture replays both streams' work (%d %d): %s", got[0], got[1], e);
            if (x) cu->GraphExecDestroy(x);
        }
        if (g) cu->GraphDestroy(g);
        CHECK(!cu->StreamSynchronize(b), "b is an ordinary stream again after the capture ends");
    }
    cu->MemFree(d);
    cu->EventDestroy(e1), cu->EventDestroy(e2);
    cu->StreamDestroy(a), cu->StreamDestroy(b);
}

int main(void)
{
    g_seed = test_seed();
    if (!getenv("TFUSE_CACHE_DIR")) setenv("TFUSE_CACHE_DIR", "emu-cache", 1);
    const char *why = tf_cuda_emu_unavailable();
    if (why) {
        fprintf(stderr, "test_cuda_emu: %s\n", why);
        return 1;
    }
    tf_cuda_search emu = {TF_CUDA_SEARCH_EMU, NULL};
    char err[512];
    CHECK(!tf_cuda_libs_load(&g_libs, TF_CUDA_LIB_DRIVER | TF_CUDA_LIB_NVRTC, &emu, err, sizeof err), "the stand-ins load: %s", err);
    static const mutant pointwise[] = {
        {"a wrong stride", "b0[", " * ", " * 2 * "},
        {"a dropped bounds check", "for (tf_idx tc", "tc < ", "tc <= "},
    };
    check_mutants("pointwise", "input x : f32[37, 24]\ninput r : f32[37]\nt = transpose(x, perm=[1, 0])\ny = add(t, r)\n"
                  "z = exp(y)\noutput z\n", TF_K_ELEMENTWISE, pointwise, 2);
    static const mutant reduction[] = {
        {"an off-by-one bound", "for (tf_idx r = tf_m", "r < ", "r < -1 + "},
        {"a wrong shuffle width", "__shfl_xor_sync(0xffffffffu, v, s", ")", ", 16)"},
        {"a missing barrier", "if ((tf_m & 31) == 0)", "__syncthreads();", ";"},
    };
    check_mutants("row reduction", "input x : f32[5, 3000]\ns = reduce_sum(x, axes=[1])\noutput s\n", TF_K_REDUCTION, reduction, 3);
    driver_checks();
    fork_join();
    shared_kernels();
    tf_cuda_libs_free(&g_libs);
    CHECK(tf_cuda_emu_live() == 0, "nothing left allocated on cuda-emu (%d)", tf_cuda_emu_live());
    return check_report();
}
