/* runtime.h — what libtfuse's implementation files share: the structures
 * behind the public handles, element conversion and the backend interface.
 *
 * A backend (interp, cpu, cuda) is a struct of function pointers, peers
 * behind one narrow interface (ggml's backend interface is the model).
 * `unavailable` says, before anything is created, why a target cannot run
 * here; no backend silently falls back to another. */
#ifndef TF_RUNTIME_H
#define TF_RUNTIME_H

#include <stdbool.h>

#include "../include/tfuse.h"
#include "ops.h"
#include "passes.h"

struct tf_context {
    char err[6400];
};

struct tf_model {
    tf_module *m;
    int auto_dim;           /* index of a --dim NAME=auto, or -1 */
};

typedef struct tf_stat_entry { const char *name; int64_t value; } tf_stat_entry;

struct tf_program {
    tf_module *m;           /* after every pass; owned */
    tf_ir_mode mode;
    tf_target target;
    tf_stat_entry stats[12];
    int nstats;
    tf_vec inputs, params, buffers;   /* tf_value*, in declaration order */
    int threads;            /* tf_compile_options.threads */
    tf_precision precision; /* what it was compiled in (never DEFAULT) */
};

typedef struct tf_backend tf_backend;

struct tf_session {
    tf_context_t *ctx;
    const tf_program_t *p;
    const tf_backend *be;
    void *impl;             /* the backend's state */
    uint64_t seed;
    const void **bound;     /* per program input: caller memory, or NULL */
    void **out;             /* per module output: host buffer in storage dtype */
    char *missing;          /* params the last load_state file lacked, ", "-separated; NULL if none */
};

struct tf_backend {
    const char *name;
    /* NULL when the target can run on this machine, else why not. */
    const char *(*unavailable)(void);
    /* Set up s->impl: allocate state, run initializers with s->seed. */
    tf_status (*session_create)(tf_session_t *s);
    void (*session_free)(tf_session_t *s);
    /* One step over the bound inputs; fills s->out[i] (storage dtype). */
    tf_status (*run)(tf_session_t *s);
    /* Copy a param/buffer out of / into the session (storage dtype). */
    tf_status (*state_read)(tf_session_t *s, const tf_value *v, void *dst);
    tf_status (*state_write)(tf_session_t *s, const tf_value *v, const void *src);
    /* The run counter (runs so far; it drives dropout masks), and setting it
     * so that a resumed run draws the masks the uninterrupted one would. */
    uint64_t (*step_get)(tf_session_t *s);
    void (*step_set)(tf_session_t *s, uint64_t step);
    /* Optional (NULL: none): per-kernel profiles and the session's facts. */
    void (*set_profiling)(tf_session_t *s, bool on);
    size_t (*profile_count)(tf_session_t *s);
    void (*profile_get)(tf_session_t *s, size_t i, tf_kernel_profile *out);
    void (*info)(tf_session_t *s, tf_session_info *out);
};

extern const tf_backend tf_backend_interp, tf_backend_cpu, tf_backend_cuda;
const tf_backend *tf_backend_for(tf_target t);

/* Set the context's message; returns st. */
tf_status tf_set_error(tf_context_t *ctx, tf_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Carry an IR diagnostic into the context. */
tf_status tf_from_diag(tf_context_t *ctx, const tf_diag *d);

/* training.c: the public precision as the passes take it (*set false for
 * TF_PRECISION_DEFAULT: the train block's); false for a value out of range.
 * And back. */
bool tf_ir_precision_of(tf_precision p, bool *set, tf_ir_precision *out);
tf_precision tf_precision_of_ir(tf_ir_precision p);

/* Element conversion between doubles and storage dtypes (f16/bf16 as their
 * 16-bit patterns, rounding to nearest even; bool as one byte). */
double tf_elem_load(tf_dt t, const void *base, int64_t i);
void tf_elem_store(tf_dt t, void *base, int64_t i, double v);

#endif
