/* interp.h — the reference interpreter: the oracle every backend and pass is
 * tested against.
 *
 * Values are tf_tensors of doubles (ops.h), each element rounded to its
 * dtype after every op; sums and dot products accumulate in float64. Slow on
 * purpose: clarity over speed. Layer ops have kernels of their own (not a
 * detour through `lower`), so lowering is checked against an independent
 * computation.
 *
 * A context holds one tensor per value. Params and buffers persist across
 * runs; buffer updates (batchnorm running statistics, `update` statements)
 * are applied after the whole step, so every op of a step reads the old
 * state. Randomness (initializers, dropout) is a counter-based hash of
 * (seed, stream, index): reproducible for a seed, independent of run order.
 *
 * Limits of the oracle: integers travel as doubles, exact up to 2^53 (ids,
 * labels and indices are far below); i64 results saturate at +-9.2e18. */
#ifndef TF_IR_INTERP_H
#define TF_IR_INTERP_H

#include "ops.h"

/* Largest tensor the interpreter allocates (elements); beyond it a clear
 * error, never an attempt that brings the machine down. */
#define TF_INTERP_MAX_NUMEL ((int64_t)1 << 28)

tf_interp_ctx *tf_interp_create(tf_module *m, tf_ir_mode mode, uint64_t seed);
void tf_interp_free(tf_interp_ctx *ip);

/* The tensor of a value (allocated, zeroed, on first request; NULL on OOM or
 * size limit, with the diag filled). */
tf_tensor *tf_interp_tensor(tf_interp_ctx *ip, const tf_value *v, tf_diag *d);
/* Run every param/buffer initializer (seeded per value name). */
tf_ir_status tf_interp_init_state(tf_interp_ctx *ip, tf_diag *d);
/* Elements [lo, hi) of a param's or buffer's initial value under seed, as
 * tf_interp_init_state leaves them (rounded to its dtype) into out[0 ..
 * hi - lo): each element depends on its index alone, so a backend fills
 * its storage in pieces, on any number of threads, with the same bits. */
void tf_interp_init_range(const tf_value *v, uint64_t seed, int64_t lo, int64_t hi, double *out);
/* Whether that value is all zeros (its bits, in every dtype). */
bool tf_interp_init_is_zero(const tf_value *v);
/* One forward step: every input must have been written. Applies updates. */
tf_ir_status tf_interp_run(tf_interp_ctx *ip, tf_diag *d);

/* For kernels. */
tf_ir_mode tf_interp_mode(const tf_interp_ctx *ip);
uint64_t tf_interp_seed(const tf_interp_ctx *ip);
uint64_t tf_interp_step(const tf_interp_ctx *ip);      /* 0 for the first run */
/* Set the run counter (a resumed training run continues its dropout masks). */
void tf_interp_set_step(tf_interp_ctx *ip, uint64_t step);
/* The seed later draws use (dropout; initializers already ran with the first). */
void tf_interp_set_seed(tf_interp_ctx *ip, uint64_t seed);
tf_diag *tf_interp_diag(tf_interp_ctx *ip);
/* Where the kernels report errors outside tf_interp_run (kernel_eval runs
 * them one at a time); NULL after. */
void tf_interp_set_diag(tf_interp_ctx *ip, tf_diag *d);
tf_module *tf_interp_module(const tf_interp_ctx *ip);
/* allreduce's collective (the runtime's communicator, runtime/comm.c): the
 * mean over ranks of n values of dtype dt in place (held as doubles, each
 * exact in dt), summed in rank order; 0, or -1 with err filled. Without one
 * (fn NULL) the job is one rank: allreduce copies. */
typedef int (*tf_interp_mean_fn)(void *self, tf_dt dt, double *data, int64_t n, char *err, size_t nerr);
/* allgather's (shard_optimizer): every rank's n values of dtype dt, into out
 * (size * n of them, in rank order); 0, or -1 with err filled. */
typedef int (*tf_interp_gather_fn)(void *self, tf_dt dt, const double *data, int64_t n, double *out, char *err, size_t nerr);
typedef struct tf_interp_comm {
    void *self;
    int rank, size;
    tf_interp_mean_fn mean;
    tf_interp_gather_fn gather;
} tf_interp_comm;
/* The session's ranks for allreduce, shard and allgather (copied); NULL: one rank. */
void tf_interp_set_comm(tf_interp_ctx *ip, const tf_interp_comm *c);
/* NULL when the job is one rank. */
const tf_interp_comm *tf_interp_comm_of(const tf_interp_ctx *ip);
/* Schedule `buffer := value` for the end of the current step (copied now). */
tf_ir_status tf_interp_defer_update(tf_interp_ctx *ip, const tf_value *buffer, const tf_tensor *value);

/* Tensor helpers. */
tf_ir_status tf_tensor_alloc(tf_tensor *t, const tf_type *ty, tf_diag *d);
void tf_tensor_release(tf_tensor *t);

/* Counter-based random numbers: uniform in [0, 1) (the top 53 bits of a
 * hash of (seed, stream, index), times 2^-53); standard normal (normal()
 * initializers): tf_normal_quantile((k + 1/2) / 2^52) with k the top 52
 * bits of the same hash (interp.c says why); and a stream id from a name. */
double tf_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
double tf_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* Phi^-1(p), the standard normal quantile, by Wichura's AS241 (relative
 * error about 1e-16); -inf at 0, +inf at 1, NaN outside [0, 1]. */
double tf_normal_quantile(double p);
uint64_t tf_rng_stream(const char *name);
/* Dropout's stream for a salt at a step: element i is kept (scaled by
 * 1/(1-p), rounded to the dtype) when tf_rng_uniform(seed, stream, i) >= p. */
uint64_t tf_dropout_stream(uint64_t step, uint64_t salt);

#endif
