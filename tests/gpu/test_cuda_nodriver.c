/* test_cuda_nodriver.c — on a machine without an NVIDIA driver the cuda
 * target says so, clearly and without side effects:
 *
 *   - tf_backend_cuda.unavailable() names libcuda.so.1 and that the machine
 *     has no NVIDIA GPU driver (on a machine with one: NULL, and the test
 *     checks only the forced failure below);
 *   - a session asked for anyway fails with TF_ERR_UNAVAILABLE and the same
 *     words, and so does one whose search is pinned to an empty directory
 *     (TFUSE_CUDA_LIBS=DIR TFUSE_CUDA_LIBS_ONLY=1), on any machine;
 *   - through the public API (once api.c knows the target) the same message
 *     comes back from tf_session_create. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "runtime.h"
#include "tfuse.h"

extern const tf_backend tf_backend_cuda;

/* A session built the way tf_session_create builds one, handed to the backend. */
static tf_status direct_session(tf_context_t *ctx, const tf_program_t *p)
{
    tf_session_t *s = tf_calloc(1, sizeof *s);
    s->ctx = ctx;
    s->p = p;
    s->be = &tf_backend_cuda;
    s->seed = 1;
    s->bound = tf_calloc((size_t)(p->inputs.n ? p->inputs.n : 1), sizeof *s->bound);
    s->out = tf_calloc((size_t)(p->m->noutputs ? p->m->noutputs : 1), sizeof *s->out);
    tf_status st = tf_backend_cuda.session_create(s);
    if (st) s->be = NULL;   /* a failed create leaves nothing to free */
    tf_session_free(s);
    return st;
}

int main(void)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    const char *text = "input x : f32[3]\nparam w : f32[3] = ones()\ny = mul(x, w)\noutput y\n";
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = TF_MODE_INFER;
    o.target = tf_backend_for(TF_TARGET_CUDA) ? TF_TARGET_CUDA : TF_TARGET_INTERP;
    CHECK(!tf_model_parse_string(ctx, "t", text, strlen(text), NULL, 0, &m) && !tf_program_compile(ctx, m, &o, &p), "compile: %s",
          tf_context_last_error(ctx));
    if (!p) return check_report();

    const char *why = tf_backend_cuda.unavailable();
    CHECK(why == tf_backend_cuda.unavailable(), "the answer is cached");
    if (why) {
        printf("unavailable: %s\n", why);
        CHECK(strstr(why, "libcuda.so.1") && (strstr(why, "no NVIDIA GPU driver") || strstr(why, "no CUDA device")),
              "the reason names the driver: %s", why);
        tf_status st = direct_session(ctx, p);
        const char *e = tf_context_last_error(ctx);
        CHECK(st == TF_ERR_UNAVAILABLE && strstr(e, "target 'cuda' cannot run here") && strstr(e, "libcuda.so.1"),
              "a session says why it cannot start: %s", e);
        if (tf_backend_for(TF_TARGET_CUDA)) {
            tf_session_t *s = NULL;
            st = tf_session_create(ctx, p, TF_TARGET_CUDA, 1, &s);
            e = tf_context_last_error(ctx);
            CHECK(st == TF_ERR_UNAVAILABLE && !s && strstr(e, "cannot run here") && strstr(e, "libcuda.so.1"),
                  "tf_session_create says why: %s", e);
        } else {
            printf("api.c does not route TF_TARGET_CUDA to this backend yet: the public path is not checked\n");
        }
    } else {
        printf("a CUDA driver and a GPU are here: only the forced failure is checked\n");
    }

    /* the search pinned to an empty directory: no driver, on any machine */
    char dir[] = "/tmp/tfuse-nodriver-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("TFUSE_CUDA_LIBS", dir, 1);
    setenv("TFUSE_CUDA_LIBS_ONLY", "1", 1);
    tf_status st = direct_session(ctx, p);
    const char *e = tf_context_last_error(ctx);
    CHECK(st == TF_ERR_UNAVAILABLE && strstr(e, "no CUDA driver (libcuda.so.1 not found)") && strstr(e, dir) &&
              strstr(e, "TFUSE_CUDA_LIBS_ONLY=1"),
          "an empty search says what it looked for and where: %s", e);
    printf("pinned search: %s\n", e);
    unsetenv("TFUSE_CUDA_LIBS");
    unsetenv("TFUSE_CUDA_LIBS_ONLY");
    rmdir(dir);

    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
    return check_report();
}
