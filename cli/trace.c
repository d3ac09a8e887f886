/* trace.c — `--trace FILE.json` for run, bench and train: the session's
 * timeline of kernel calls (tf_session_set_tracing) and the command's own
 * spans (steps, data-loader waits, evaluations, checkpoints) as Chrome's
 * trace-event JSON, which ui.perfetto.dev and chrome://tracing open.
 *
 * Everything is on CLOCK_MONOTONIC in microseconds, the clock the runtime
 * stamps kernel calls with, so a step's span holds its kernels. Thread 1 is
 * the host (the command's spans and the cpu target's kernels, nested in
 * them), thread 2 the device (the cuda target's kernels, from CUDA events).
 * Kernels are named as `tfuse bench --profile` names them, with the profile's
 * `how` as the category. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

typedef struct span { const char *cat; char label[48]; double t0, t1; } span;

struct cli_trace {
    const char *path;
    span *spans;
    size_t n, cap;
    bool dropped;
};

double cli_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

int cli_trace_open(const char *path, cli_trace **out)
{
    *out = NULL;
    if (!path) return 0;
    if (cli_check_writable("--trace", path, false)) return 1;
    cli_trace *t = calloc(1, sizeof *t);
    if (!t) return cli_errorf("out of memory");
    t->path = path;
    *out = t;
    return 0;
}

void cli_trace_span(cli_trace *t, const char *cat, const char *label, double t0, double t1)
{
    if (!t) return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        span *s = cap <= TF_TRACE_MAX_EVENTS ? realloc(t->spans, cap * sizeof *s) : NULL;
        if (!s) {
            t->dropped = true;
            return;
        }
        t->spans = s, t->cap = cap;
    }
    span *s = &t->spans[t->n++];
    s->cat = cat, s->t0 = t0, s->t1 = t1;
    snprintf(s->label, sizeof s->label, "%s", label);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

int cli_trace_write(cli_trace *t, tf_session_t *s, const char *what)
{
    if (!t) return 0;
    FILE *f = fopen(t->path, "w");
    if (!f) return cli_errorf("--trace %s: cannot write: %s", t->path, strerror(errno));
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
    fputs("{\"ph\": \"M\", \"pid\": 1, \"name\": \"process_name\", \"args\": {\"name\": ", f);
    json_str(f, what);
    fputs("}},\n{\"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"name\": \"thread_name\", \"args\": {\"name\": \"host\"}},\n"
          "{\"ph\": \"M\", \"pid\": 1, \"tid\": 2, \"name\": \"thread_name\", \"args\": {\"name\": \"device\"}}",
          f);
    for (size_t i = 0; i < t->n; i++) {
        const span *p = &t->spans[i];
        fputs(",\n{\"ph\": \"X\", \"pid\": 1, \"tid\": 1, \"cat\": ", f);
        json_str(f, p->cat);
        fputs(", \"name\": ", f);
        json_str(f, p->label);
        fprintf(f, ", \"ts\": %.3f, \"dur\": %.3f}", p->t0, p->t1 - p->t0);
    }
    size_t n = s ? tf_session_trace_count(s) : 0;
    for (size_t i = 0; i < n; i++) {
        tf_trace_event e;
        tf_kernel_profile kp;
        if (tf_session_trace_event(s, i, &e) || tf_session_profile(s, e.kernel, &kp)) continue;
        fprintf(f, ",\n{\"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"cat\": ", e.lane ? 2 : 1);
        json_str(f, kp.how);
        fputs(", \"name\": ", f);
        json_str(f, kp.name);
        fprintf(f, ", \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"run\": %" PRId64 ", \"elements\": %" PRId64 ", \"bytes\": %" PRId64 "}}",
                e.start_us, e.dur_us, e.run, kp.elements, kp.bytes);
    }
    fputs("\n]}\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad) return cli_errorf("--trace %s: write failed: %s", t->path, strerror(errno));
    uint64_t lost = s ? tf_session_trace_dropped(s) : 0;
    fflush(stdout);   /* after what the command printed */
    fprintf(stderr, "tfuse: wrote the trace %s: %zu kernel calls and %zu spans (open it in ui.perfetto.dev)\n", t->path, n, t->n);
    if (lost || t->dropped)
        fprintf(stderr, "tfuse: note: the trace holds the first %d events of each kind; %" PRIu64 " later kernel calls are not in it\n",
                TF_TRACE_MAX_EVENTS, lost);
    return 0;
}

void cli_trace_free(cli_trace *t)
{
    if (!t) return;
    free(t->spans);
    free(t);
}
