/* embed.c — a host program that compiles and runs a model through the public
 * API only (tfuse.h), binding its own memory as inputs without copies.
 *
 * Built against an installed libtfuse (docs/c-api.md, "Embedding"), from the
 * repository root:
 *
 *   cmake --install build --prefix "$HOME/.local"
 *   export PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig LD_LIBRARY_PATH=$HOME/.local/lib
 *   cc examples/embed.c $(pkg-config --cflags --libs tfuse) -o embed && ./embed examples/mlp.ir
 *
 * (With the prefix /usr/local, as root, neither export is needed after
 * `ldconfig`. CMake: find_package(tfuse) and link tfuse::tfuse;
 * tests/cli/test_install.sh builds it all these ways.)
 *
 * It feeds examples/mlp.ir a batch of 64 made-up images and labels, prints
 * the loss, and checks it against log(10) (untrained logits are nearly
 * uniform, so the loss starts near log 10 = 2.30). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tfuse.h"

static int die(tf_context_t *ctx, const char *what)
{
    fprintf(stderr, "embed: %s failed: %s\n", what, tf_context_last_error(ctx));
    return 1;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "examples/mlp.ir";
    tf_context_t *ctx;
    tf_model_t *model;
    tf_program_t *prog;
    tf_session_t *sess;
    if (tf_context_create(&ctx)) return 1;
    tf_dim_override batch = {"B", 64};
    if (tf_model_parse_file(ctx, path, &batch, 1, &model)) return die(ctx, "parse");

    tf_compile_options opts;
    tf_compile_options_init(&opts);
    opts.mode = TF_MODE_INFER;
    /* tf_compile_options_init picked tf_default_target(): cpu where libtfuse
     * has LLVM, else the interpreter */
    if (tf_program_compile(ctx, model, &opts, &prog)) return die(ctx, "compile");
    if (tf_session_create(ctx, prog, opts.target, 42, &sess)) return die(ctx, "session");

    /* The caller owns these; the session reads them in place during run. */
    static float images[64][784];
    static int64_t labels[64];
    for (int b = 0; b < 64; b++) {
        for (int i = 0; i < 784; i++) images[b][i] = (float)((b * 31 + i * 17) % 255) / 255.0f * 0.1f;
        labels[b] = b % 10;
    }
    int64_t xs[2] = {64, 784}, ys[1] = {64};
    if (tf_session_bind(sess, "x", TF_DTYPE_F32, xs, 2, images)) return die(ctx, "bind x");
    if (tf_session_bind(sess, "y", TF_DTYPE_I64, ys, 1, labels)) return die(ctx, "bind y");
    if (tf_session_run(sess)) return die(ctx, "run");

    tf_tensor_view loss, logits;
    if (tf_session_output(sess, "loss", &loss) || tf_session_output(sess, "logits", &logits)) return die(ctx, "output");
    float l = *(const float *)loss.data;
    printf("loss %.6f over a batch of %lld (logits %lld x %lld)\n", l, (long long)logits.shape[0],
           (long long)logits.shape[0], (long long)logits.shape[1]);
    int ok = isfinite(l) && fabsf(l - logf(10.0f)) < 0.5f && logits.rank == 2 && logits.shape[1] == 10;

    tf_session_free(sess);
    tf_program_free(prog);
    tf_model_free(model);
    tf_context_free(ctx);
    if (!ok) fprintf(stderr, "embed: unexpected result\n");
    return ok ? 0 : 1;
}
