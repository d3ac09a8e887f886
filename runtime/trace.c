/* trace.c — a session's timeline of kernel calls (tf_session_set_tracing,
 * tfuse.h): backends add each call with tf_trace_add where they time it for
 * the profile, so the timeline and the profile count the same calls. */
#include <string.h>

#include "alloc.h"
#include "runtime.h"

tf_status tf_session_set_tracing(tf_session_t *s, int on)
{
    if (!s) return TF_ERR_INVALID_ARG;
    tf_status st = tf_session_set_profiling(s, on);   /* waits for a step in flight; clears the profile */
    if (st) return st;
    if (on) {
        s->ntrace = 0;
        s->trace_dropped = 0;
        s->trace_run = 0;
    }
    s->tracing = on != 0;
    return TF_OK;
}

void tf_trace_add(tf_session_t *s, size_t kernel, double start_us, double dur_us, int64_t run, int lane)
{
    if (!s->tracing) return;
    if (s->ntrace == s->cap_trace) {
        size_t cap = s->cap_trace ? 2 * s->cap_trace : 4096;
        if (cap > TF_TRACE_MAX_EVENTS) cap = TF_TRACE_MAX_EVENTS;
        tf_trace_event *t = s->ntrace < cap ? tf_realloc(s->trace, cap * sizeof *t) : NULL;
        if (!t) {   /* full, or out of memory: counted, not fatal to the run */
            s->trace_dropped++;
            return;
        }
        s->trace = t;
        s->cap_trace = cap;
    }
    s->trace[s->ntrace++] = (tf_trace_event){kernel, start_us, dur_us, run, lane};
}

size_t tf_session_trace_count(const tf_session_t *s) { return s ? s->ntrace : 0; }
uint64_t tf_session_trace_dropped(const tf_session_t *s) { return s ? s->trace_dropped : 0; }

tf_status tf_session_trace_event(const tf_session_t *s, size_t i, tf_trace_event *out)
{
    if (!s || !out || i >= s->ntrace) return TF_ERR_INVALID_ARG;
    *out = s->trace[i];
    return TF_OK;
}
