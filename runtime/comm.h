/* comm.h — the communicator behind tf_comm_t: the ranks of a data-parallel
 * job and the collectives tfuse runs between them (docs/distributed.md).
 *
 * Two layers:
 *   - a driver moves bytes between ranks: alltoall, allgather and bcast of
 *     equal-sized chunks, each blocking the calling thread until it is done
 *     or the timeout passes. comm_mpi.c is the one over MPI (Open MPI,
 *     opened with dlopen); comm.c has "self", the one-rank driver.
 *   - comm.c builds on it what a session needs: the gradient mean (a
 *     reduce-scatter done as alltoall + a sum in rank order + allgather, so
 *     every rank gets the same bits and a run repeats them), a thread that
 *     runs those in the background while the backward pass goes on, and the
 *     checks a job makes before it starts.
 *
 * Drivers are called from one thread at a time (comm.c's mutex), which may
 * be the communication thread: MPI is initialized at
 * MPI_THREAD_SERIALIZED. */
#ifndef TF_RUNTIME_COMM_H
#define TF_RUNTIME_COMM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/tfuse.h"
#include "interp.h"
#include "ops.h"

/* A driver's collectives. Each returns 0, or -1 with err filled: a true,
 * complete sentence naming this rank and what did not answer ("rank 1: the
 * all-reduce did not complete within 300 s: a rank has died or hangs"). A
 * timeout of 0 or less waits forever. `chunk` is bytes per rank:
 *   alltoall:  send holds size chunks, chunk j for rank j; recv gets size
 *              chunks, chunk j from rank j
 *   allgather: send is one chunk; recv gets size chunks, chunk j from rank j
 *   bcast:     root's buf to every rank's */
typedef struct tf_comm_driver {
    const char *name;   /* "mpi", "self" */
    int (*alltoall)(void *impl, const void *send, void *recv, size_t chunk, double timeout_s, char *err, size_t nerr);
    int (*allgather)(void *impl, const void *send, void *recv, size_t chunk, double timeout_s, char *err, size_t nerr);
    int (*bcast)(void *impl, void *buf, size_t bytes, int root, double timeout_s, char *err, size_t nerr);
    /* End the whole job now (a rank that cannot go on: the others must not wait for it). */
    void (*abort)(void *impl, int code);
    /* Release the driver; MPI_Finalize when tfuse initialized MPI. */
    void (*free)(void *impl);
} tf_comm_driver;

/* comm_mpi.c: join the MPI job this process runs in. mpi_comm: the caller's
 * MPI_Comm (Open MPI's handle, a pointer), or NULL for MPI_COMM_WORLD.
 * Initializes MPI (MPI_THREAD_SERIALIZED) unless the caller did. 0, or -1
 * with err filled (no libmpi, an MPI other than Open MPI, a thread level
 * too low). */
int tf_comm_mpi_open(void *mpi_comm, const tf_comm_driver **drv, void **impl, int *rank, int *size, char *err, size_t nerr);
/* `tfuse doctor`'s line: the MPI library found, or why none. */
void tf_comm_mpi_doctor(char *out, size_t n);

/* ---- comm.c ---- */

/* A bucket of gradients averaged as one: the members' bytes packed in plan
 * order (one dtype), padded to size equal chunks. */
typedef struct tf_comm_bucket {
    tf_dt dtype;
    int64_t elems;         /* the members' elements together */
    int64_t chunk;         /* elements per rank: ceil(elems / size) */
    unsigned char *pack;   /* size * chunk elements: the members, then zeros */
    unsigned char *gather; /* size * chunk elements: alltoall's result, then the means gathered */
    int nmembers, filled;  /* members, and of them packed this step */
    struct { void *out; int64_t at, n; } *members;   /* where each member's mean goes */
    int state;             /* 0 idle, 1 queued, 2 done, 3 failed */
    bool gather_only;      /* an all-gather of this rank's chunk (pack's first chunk elements): no mean */
} tf_comm_bucket;

struct tf_comm {
    const tf_comm_driver *drv;
    void *impl;
    int rank, size;
    double timeout_s;      /* TFUSE_COMM_TIMEOUT, default 300 */
    pthread_mutex_t call;  /* one driver call at a time */
    pthread_mutex_t mu;    /* guards the queue, the bucket states, err and the totals */
    pthread_cond_t cv;
    pthread_t thread;
    bool thread_started, stopping;
    tf_comm_bucket **queue;   /* submitted, in order */
    int nqueue, capqueue, head;
    char err[512];         /* the first failure: every later wait returns it */
    /* totals since the session's start, for --stats and bench --profile */
    int64_t bytes_reduced, bytes_nccl;   /* bytes_nccl: the cuda target's NCCL path counts its steps' */
    double wait_ns, comm_ns;
};

/* A bucket of n elements of dt in nmembers members (their out, at and n
 * for the caller to fill); 0, or -1 when out of memory (free it still). */
int tf_comm_bucket_init(const tf_comm_t *c, tf_comm_bucket *b, tf_dt dt, int64_t n, int nmembers);
void tf_comm_bucket_free(tf_comm_bucket *b);
/* The mean over ranks of n elements of dtype dt at data, in place, summed in
 * rank order in float64 and rounded once; on the calling thread. 0, or -1
 * with c->err. */
int tf_comm_mean(tf_comm_t *c, tf_dt dt, void *data, int64_t n);
/* Submit bucket b (all members packed) to the communication thread. 0, or
 * -1 with c->err. */
int tf_comm_submit(tf_comm_t *c, tf_comm_bucket *b);
/* Every rank's n elements of dt at data into out (size * n, rank order),
 * through the queue; 0, or -1 with c->err. */
int tf_comm_gather(tf_comm_t *c, tf_dt dt, const void *data, int64_t n, void *out);
/* Give an interpreter the session's ranks (NULL or one rank: none). */
void tf_comm_interp_attach(tf_interp_ctx *ip, tf_comm_t *c);
/* allreduce's collective for the interpreter's kernel (tf_interp_mean_fn):
 * self is the tf_comm_t; the values travel in dt, as the targets' do (the
 * same sum, the same rounding: the same bits). */
int tf_comm_interp_mean(void *self, tf_dt dt, double *data, int64_t n, char *err, size_t nerr);
/* ---- comm_plan.c: which bucket each allreduce kernel fills (the cpu and cuda targets' shared rules) ---- */
struct tf_kernel_plan;
typedef struct tf_comm_plan {
    int nbuckets;
    int *bucket_of;        /* per kernel: its bucket (an allreduce in one), else -1 */
    int *member_of;        /* per kernel: its index among its bucket's members */
    int *needs;            /* per kernel: the last bucket whose means it reads, else -1 */
    int64_t *at;           /* per kernel in a bucket: its first element's offset in the bucket */
    int *members;          /* per bucket: members */
    int64_t *elems;        /* per bucket: the members' elements together */
    tf_dt *dt;             /* per bucket: its dtype */
    bool at_once;          /* each allreduce on its own: a reader before its bucket is complete, or mixed dtypes */
} tf_comm_plan;
/* in_bucket[i]: kernel i is an allreduce the backend runs in its bucket;
 * nvalues: the module's value ids. 0, or -1 out of memory (*cp freed). */
int tf_comm_plan_make(const struct tf_kernel_plan *P, int nvalues, const bool *in_bucket, tf_comm_plan *cp);
void tf_comm_plan_free(tf_comm_plan *cp);
/* Wait for b: its means written to its members' outputs. 0, or -1 with c->err. */
int tf_comm_wait(tf_comm_t *c, tf_comm_bucket *b);
/* Every rank's `bytes` bytes at send gathered into recv (size * bytes), on the calling thread. */
int tf_comm_gather_all(tf_comm_t *c, const void *send, void *recv, size_t bytes);

#endif
