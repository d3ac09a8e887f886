/* bench.c — `tfuse bench FILE`: how fast one step runs.
 *
 * Compiles the model (timed: compile_ms), creates a session (timed: jit_ms,
 * which on the cpu target is JIT-compiling every kernel), then a second
 * session of the same program (jit_ms_cached: the process's kernel cache),
 * binds deterministic random inputs (labels and ids within their bounds),
 * runs --warmup untimed steps and --iters timed ones, and prints `key: value`
 * lines: step_ms is the median, with min, mean and p90 beside it. --profile
 * adds a per-kernel table sorted by total time. Training steps update the
 * params as they go, as a real run would; the data stays the same batch. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

const char bench_synopsis[] =
    "FILE [--mode=train|infer] [--target=interp|cpu|cuda|cuda-emu] [--iters N] [--warmup N] [--threads N] [--profile]\n"
    "                     [--trace FILE.json]\n"
    "                     [--precision=fp32|fp16|bf16] [--O0] [--disable-pass=NAME] [--checkpoint=auto --memory-budget=B]";
const char bench_help[] =
    "Time one step of a model on random inputs: prints key: value lines (target, mode, threads,\n"
    "compile_ms, jit_ms, jit_ms_cached, kernels, peak_bytes, step_ms = the median of --iters timed\n"
    "steps (default 20) after --warmup untimed ones (default 3), step_ms_min, step_ms_mean,\n"
    "step_ms_p90). --profile adds a table of kernels sorted by total time, with each call's bytes\n"
    "(the least traffic: each byte read or written once), GB/s, and for generated kernels the share\n"
    "of a plain copy's bandwidth in the same memory (copy_gbps, measured then); fused_gbps and\n"
    "fused_of_copy sum the generated kernels' bytes over their time. cuda: device_bytes, the\n"
    "device memory the session holds for its steps. --trace FILE.json writes the timed steps' timeline:\n"
    "every kernel call (as --profile names them) inside its step, as Chrome trace-event JSON that\n"
    "ui.perfetto.dev opens (docs/cli.md).";

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_profile(const void *a, const void *b)
{
    const tf_kernel_profile *x = a, *y = b;
    return x->total_ms > y->total_ms ? -1 : x->total_ms < y->total_ms;
}

/* Generated kernels (pointwise and reduction: how "jit") are the ones a
 * copy's bandwidth bounds: their bytes per second are held against it. */
static bool bandwidth_bound(const tf_kernel_profile *k) { return !strcmp(k->how, "jit") && k->bytes > 0; }

static void print_profile(tf_context_t *ctx, tf_session_t *s, const char *target, uint64_t iters)
{
    size_t n = tf_session_profile_count(s);
    if (!n) {
        printf("profile: none (the %s target has no kernels to time)\n", target);
        return;
    }
    tf_kernel_profile *ps = calloc(n, sizeof *ps);
    if (!ps) return;
    double total = 0, copy = 0, fused_bytes = 0, fused_ms = 0;
    int fused = 0, fused_under = 0;
    for (size_t i = 0; i < n; i++) {
        tf_session_profile(s, i, &ps[i]);
        total += ps[i].total_ms;
    }
    /* the yardstick: a plain copy in the same memory, measured now (without it, no "of copy" column) */
    if (tf_session_copy_bandwidth(s, &copy)) {
        fprintf(stderr, "tfuse bench: no copy bandwidth to compare the kernels with: %s\n", tf_context_last_error(ctx));
        copy = 0;
    }
    qsort(ps, n, sizeof *ps, cmp_profile);
    printf("\n%-28s %-18s %12s %10s %12s %7s %10s %9s %7s\n", "kernel", "how", "elements", "calls", "ms/step", "share", "MB/call",
           "GB/s", "of copy");
    for (size_t i = 0; i < n; i++) {
        const tf_kernel_profile *k = &ps[i];
        if (k->calls == 0) continue;
        double gbps = k->total_ms > 0 ? (double)k->bytes * (double)k->calls / (k->total_ms * 1e6) : 0;
        printf("%-28s %-18s %12" PRId64 " %10" PRId64 " %12.4f %6.1f%% %10.3f", k->name, k->how, k->elements, k->calls,
               k->total_ms / (double)iters, total > 0 ? 100 * k->total_ms / total : 0, (double)k->bytes / 1e6);
        if (k->bytes > 0 && k->total_ms > 0) printf(" %9.1f", gbps);
        else printf(" %9s", "-");
        if (bandwidth_bound(k) && copy > 0 && k->total_ms > 0) printf(" %6.0f%%\n", 100 * gbps / copy);
        else printf(" %7s\n", "-");
        if (bandwidth_bound(k) && k->total_ms > 0) {
            fused++;
            fused_under += copy > 0 && gbps < 0.85 * copy;
            fused_bytes += (double)k->bytes * (double)k->calls;
            fused_ms += k->total_ms;
        }
    }
    printf("%-28s %-18s %12s %10s %12.4f %6.1f%%\n", "total", "", "", "", total / (double)iters, 100.0);
    /* key: value lines again, for scripts: the copy, and the generated kernels together (bytes over time) */
    if (copy > 0) printf("copy_gbps: %.1f\n", copy);
    if (fused_ms > 0) {
        printf("fused_kernels: %d\n", fused);
        printf("fused_gbps: %.1f\n", fused_bytes / (fused_ms * 1e6));
        printf("fused_ms_per_step: %.4f\n", fused_ms / (double)iters);
        if (copy > 0) {
            printf("fused_of_copy: %.3f\n", fused_bytes / (fused_ms * 1e6) / copy);
            printf("fused_under_85pct: %d\n", fused_under);
        }
    }
    free(ps);
}

int cmd_bench(tf_context_t *ctx, const args *a0)
{
    args job = *a0, *a = &job;   /* under mpirun: data_parallel on */
    tf_comm_t *comm = NULL;
    int rank = 0, size = 1, jrc = cli_join_job(ctx, a, &comm, &rank, &size);
    if (jrc) {
        tf_comm_free(comm);
        return jrc;
    }
    uint64_t iters = a->iters ? a->iters : 20, warmup = a->warmup_set ? a->warmup : 3;
    tf_session_t *s = NULL, *s2 = NULL;
    void *data[MAX_ITEMS] = {0};
    double *times = calloc(iters, sizeof *times);
    int rc = times ? 0 : 1;
    cli_trace *tr = NULL;   /* rank 0's alone under mpirun */
    if (!rc && rank == 0 && cli_trace_open(a->trace, &tr)) rc = 1;
    double compile_ms = 0, t0;
    tf_target target = a->target;
    tf_program_t *p = rc ? NULL : cli_load_program(ctx, a, a->mode, stderr, &target, &compile_ms, &rc);
    /* timing a "training step" that has no backward pass would be a number about nothing */
    if (!rc && a->mode == TF_MODE_TRAIN)
        rc = cli_check_train_loss(p, a->file, a->mode_set ? "--mode=train" : "bench's default --mode=train", true);
    t0 = now_ms();
    if (!rc && (tf_session_create(ctx, p, target, a->seed, &s) || tf_session_set_comm(s, comm))) rc = cli_fail(ctx);
    double jit_ms = now_ms() - t0;
    t0 = now_ms();
    if (!rc && tf_session_create(ctx, p, target, a->seed, &s2)) rc = cli_fail(ctx);
    double jit_cached_ms = now_ms() - t0;
    tf_session_free(s2);
    size_t nin = p ? tf_program_io_count(p, TF_IO_INPUT) : 0;
    for (size_t i = 0; !rc && i < nin && i < MAX_ITEMS; i++) {
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8];
        tf_program_io(p, TF_IO_INPUT, i, &name, &dt, &rank, shape);
        if (!(data[i] = cli_random_input(p, i, a->seed, dt, shape, rank))) {
            rc = cli_errorf("out of memory");
        } else if (tf_session_bind(s, name, dt, shape, rank, data[i])) {
            rc = cli_fail(ctx);
        }
    }
    /* a step's time is until its outputs can be read: the cuda target's run
     * returns once the step is enqueued, and reading an output waits for it */
    const char *first_output = NULL;
    tf_tensor_view ov;
    if (p && tf_program_io_count(p, TF_IO_OUTPUT)) tf_program_io(p, TF_IO_OUTPUT, 0, &first_output, NULL, NULL, NULL);
    for (uint64_t i = 0; !rc && i < warmup; i++)
        if (tf_session_run(s) || (first_output && tf_session_output(s, first_output, &ov))) rc = cli_fail(ctx);
    if (!rc && a->profile && tf_session_set_profiling(s, 1)) rc = cli_fail(ctx);
    if (!rc && tr && tf_session_set_tracing(s, 1)) rc = cli_fail(ctx);   /* the timed steps, as the profile counts them */
    tf_comm_totals c0, c1;
    tf_comm_stats(comm, &c0);
    for (uint64_t i = 0; !rc && i < iters; i++) {
        t0 = now_ms();
        double u0 = cli_now_us();
        if (tf_session_run(s) || (first_output && tf_session_output(s, first_output, &ov))) rc = cli_fail(ctx);
        times[i] = now_ms() - t0;
        char label[32];
        snprintf(label, sizeof label, "step %" PRIu64, i);
        cli_trace_span(tr, "step", label, u0, cli_now_us());
    }
    if (!rc) rc = cli_trace_write(tr, s, a->file);
    if (!rc) {
        tf_session_info info;
        tf_session_get_info(s, &info);
        double mean = 0;
        for (uint64_t i = 0; i < iters; i++) mean += times[i];
        mean /= (double)iters;
        qsort(times, iters, sizeof *times, cmp_double);
        double median = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
        printf("model: %s\n", a->file);
        printf("target: %s\n", info.target);
        printf("mode: %s\n", a->mode == TF_MODE_INFER ? "infer" : "train");
        printf("threads: %d\n", info.threads);
        if (info.library) printf("gemm: %s\n", info.library);
        printf("compile_ms: %.3f\n", compile_ms);
        printf("jit_ms: %.3f\n", jit_ms);
        printf("jit_ms_cached: %.3f\n", jit_cached_ms);
        for (size_t i = 0; p && i < tf_program_stat_count(p); i++) {   /* the matmuls' and convolutions' rate */
            const char *sn;
            int64_t sv;
            if (!tf_program_stat(p, i, &sn, &sv) && !strcmp(sn, "step_flops") && sv > 0 && median > 0) {
                printf("step_gflop: %.4f\n", (double)sv * 1e-9);
                printf("gflops: %.2f\n", (double)sv * 1e-6 / median);
            }
        }
        printf("kernels: %d\n", info.kernels);
        printf("kernels_jit_compiled: %d\n", info.jit_compiled);
        if (info.jit_disk) printf("kernels_jit_disk: %d\n", info.jit_disk);
        if (info.jit_package) printf("kernels_jit_package: %d\n", info.jit_package);
        printf("disk_cache_hits: %d\ndisk_cache_misses: %d\n", info.disk_hits, info.disk_misses);
        printf("kernels_fallback: %d\n", info.fallbacks);
        for (size_t i = 0; i < tf_program_stat_count(p); i++) {
            const char *name;
            int64_t v;
            tf_program_stat(p, i, &name, &v);
            if (!strcmp(name, "peak_bytes") || !strcmp(name, "params")) printf("%s: %" PRId64 "\n", name, v);
        }
        if (info.device_bytes) printf("device_bytes: %" PRId64 "\n", info.device_bytes);
        printf("warmup: %" PRIu64 "\n", warmup);
        printf("iters: %" PRIu64 "\n", iters);
        printf("step_ms: %.4f\n", median);
        printf("step_ms_min: %.4f\n", times[0]);
        printf("step_ms_mean: %.4f\n", mean);
        printf("step_ms_p90: %.4f\n", times[(iters * 9) / 10 < iters ? (iters * 9) / 10 : iters - 1]);
        if (comm) {   /* data parallel: what the timed steps averaged, and how much of it they waited for */
            tf_comm_stats(comm, &c1);
            double n = (double)iters, cm = (c1.comm_ms - c0.comm_ms) / n, wm = (c1.wait_ms - c0.wait_ms) / n;
            printf("ranks: %d\n", size);
            printf("allreduce_bytes_per_step: %.0f\n", (double)(c1.bytes_reduced - c0.bytes_reduced) / n);
            printf("allreduce_ms_per_step: %.4f\n", cm);
            printf("allreduce_wait_ms_per_step: %.4f\n", wm);
            printf("allreduce_hidden_pct: %.1f\n", cm > 0 ? 100.0 * fmax(0.0, 1.0 - wm / cm) : 0.0);
        }
        if (a->profile) print_profile(ctx, s, info.target, iters);
    }
    for (size_t i = 0; i < MAX_ITEMS; i++) free(data[i]);
    free(times);
    cli_trace_free(tr);
    tf_session_free(s);
    tf_program_free(p);
    if (comm && rc) {   /* a rank failing alone would leave the others in a collective */
        fflush(stdout);
        fflush(stderr);
        tf_comm_abort(comm, rc);
    }
    tf_comm_free(comm);
    return rc;
}
