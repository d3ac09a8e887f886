/* emu_nccl.c — cuda-emu's NCCL: the gradient mean between the ranks of a
 * data-parallel job, for the cuda target's NCCL path (cuda_comm.c) run on
 * the host.
 *
 * A stand-in has no network of its own: the mean goes through the
 * session's communicator (comm.c over MPI), whose mean function and rank
 * cuda_comm.c hands over with tf_cuda_emu_nccl_use before ncclCommInitRank. ncclAllReduce is work
 * on its stream (tf_cuda_emu_submit): run when the stream gets there, or
 * recorded into the graph the stream captures and run at each replay, as
 * NCCL's kernels are on a GPU. Only what cuda_comm.c calls is here:
 * ncclAvg over f16, bf16, f32 and f64, in place or not. The mean is comm.c's
 * (rank-order float64 sum, rounded once), so ranks agree bit for bit, as
 * the interpreter and the cpu target do; real NCCL sums in its own order. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "emu_internal.h"

struct tf_nccl_comm_s {
    void *self;
    tf_emu_mean_fn mean;
    int rank, nranks;
};

static _Thread_local struct tf_nccl_comm_s g_use;

void tf_cuda_emu_nccl_use(void *self, int rank, int size, tf_emu_mean_fn mean)
{
    g_use = (struct tf_nccl_comm_s){self, mean, rank, size};
}

enum { NCCL_OK = 0, NCCL_SYSTEM = 2, NCCL_INVALID_ARGUMENT = 4, NCCL_INVALID_USAGE = 5, NCCL_REMOTE = 6 };

static int emu_version(int *v)
{
    *v = 0;   /* no NCCL release: the path says what it is */
    return NCCL_OK;
}

static int emu_unique_id(tf_nccl_unique_id *id)
{
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "cuda-emu nccl, pid %ld", (long)getpid());
    return NCCL_OK;
}

static int emu_init_rank(tf_nccl_comm *out, int nranks, tf_nccl_unique_id id, int rank)
{
    (void)id;
    *out = NULL;
    if (!g_use.mean || g_use.nranks != nranks || g_use.rank != rank) return NCCL_INVALID_USAGE;
    struct tf_nccl_comm_s *n = tf_calloc(1, sizeof *n);
    if (!n) return NCCL_SYSTEM;
    *n = g_use;
    *out = n;
    return NCCL_OK;
}

static int emu_destroy(tf_nccl_comm c)
{
    tf_free(c);
    return NCCL_OK;
}

static int emu_async_error(tf_nccl_comm c, int *e)
{
    (void)c;
    *e = NCCL_OK;
    return NCCL_OK;
}

static const char *emu_error_string(int r)
{
    switch (r) {
    case NCCL_OK: return "no error";
    case NCCL_SYSTEM: return "out of host memory (cuda-emu's NCCL)";
    case NCCL_INVALID_ARGUMENT: return "invalid argument (cuda-emu's NCCL takes ncclAvg over f16, bf16, f32 and f64)";
    case NCCL_INVALID_USAGE: return "invalid usage (cuda-emu's NCCL: no communicator of that rank and size was handed over)";
    default: return "unknown NCCL result";
    }
}

typedef struct {
    const void *send;
    void *recv;
    size_t count;
    tf_dt dt;
    struct tf_nccl_comm_s comm;
} mean_work;

static _Atomic long g_runs;

long tf_cuda_emu_nccl_runs(void) { return g_runs; }

static int run_mean(void *arg)
{
    const mean_work *w = arg;
    g_runs++;
    if (w->send != w->recv) memmove(w->recv, w->send, w->count * (size_t)tf_dtype_bytes(w->dt));
    char err[512] = "";
    if (w->comm.mean(w->comm.self, w->dt, w->recv, (int64_t)w->count, err, sizeof err))
        return fail(EMU_UNKNOWN, "cuda-emu's ncclAllReduce: %s", err);
    return 0;
}

static int emu_allreduce(const void *send, void *recv, size_t count, int dtype, int op, tf_nccl_comm c, tf_cu_stream stream)
{
    tf_dt dt = dtype == TF_NCCL_FLOAT32 ? TF_DT_F32 : dtype == TF_NCCL_FLOAT64 ? TF_DT_F64 : dtype == TF_NCCL_FLOAT16 ? TF_DT_F16
             : dtype == TF_NCCL_BFLOAT16 ? TF_DT_BF16 : TF_DT_COUNT;
    if (!c || op != TF_NCCL_AVG || dt == TF_DT_COUNT) return NCCL_INVALID_ARGUMENT;
    mean_work w = {send, recv, count, dt, *c};
    return tf_cuda_emu_submit(stream, run_mean, &w, sizeof w) ? NCCL_REMOTE : NCCL_OK;
}

void tf_cuda_emu_nccl_fill(tf_nccl_api *api)
{
    memset(api, 0, sizeof *api);
    api->GetVersion = emu_version, api->GetUniqueId = emu_unique_id, api->CommInitRank = emu_init_rank;
    api->CommDestroy = emu_destroy, api->CommAbort = emu_destroy, api->CommGetAsyncError = emu_async_error;
    api->GetErrorString = emu_error_string, api->AllReduce = emu_allreduce;
}
