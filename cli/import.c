/* import.c — `tfuse import MODEL.onnx [-o MODEL.ir] [--dim NAME=N ...]`:
 * an ONNX model as tfuse's text IR, its initializers beside it as
 * safetensors (docs/onnx.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char usage_text[] =
    "usage: tfuse import MODEL.onnx [-o MODEL.ir] [--dim NAME=N ...]\n"
    "Read an ONNX model and write it as tfuse's text (MODEL.ir, or -o PATH; '-' prints it) and its\n"
    "initializers as MODEL.safetensors beside it, for `tfuse run MODEL.ir --params MODEL.safetensors`,\n"
    "`tfuse compile` and the rest. A dim_param (a named size, such as batch_size) becomes a tfuse dim of\n"
    "value 1 unless --dim gives it one. A node tfuse cannot import is an error that names the node, its\n"
    "op and the model's opset. docs/onnx.md lists the ops read.\n"
    "  -o PATH        where the text goes (default: the model's name with .ir); its params go to the\n"
    "                 same name with .safetensors\n"
    "  --dim NAME=N   a named dim's value (repeatable)\n";

/* PATH with its extension (after the last '/') replaced by ext. */
static char *with_ext(const char *path, const char *ext)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    size_t keep = dot && (!slash || dot > slash) ? (size_t)(dot - path) : strlen(path);
    char *out = malloc(keep + strlen(ext) + 1);
    if (!out) return NULL;
    memcpy(out, path, keep);
    strcpy(out + keep, ext);
    return out;
}

int cmd_import(int argc, char **argv)
{
    const char *model = NULL, *out = NULL;
    tf_dim_override dims[64];
    size_t nd = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) return cli_usage_error("import", "%s needs a path", a);
            out = argv[++i];
        } else if (!strcmp(a, "--dim") || !strncmp(a, "--dim=", 6)) {
            const char *kv = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            const char *eq = kv ? strchr(kv, '=') : NULL;
            char *end = NULL;
            long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
            if (!eq || eq == kv || !*(eq + 1) || *end || v < 1) return cli_usage_error("import", "--dim wants NAME=N with N >= 1, got '%s'", kv ? kv : "");
            if (nd == sizeof dims / sizeof *dims) return cli_usage_error("import", "more than 64 --dim flags%s", "");
            char *name = strndup(kv, (size_t)(eq - kv));
            if (!name) return cli_errorf("out of memory");
            dims[nd++] = (tf_dim_override){name, v};
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("import", "unknown flag %s (try tfuse import --help)", a);
        } else if (model) {
            return cli_usage_error("import", "one model at a time: '%s' is a second one", a);
        } else {
            model = a;
        }
    }
    int rc = 0;
    if (!model) rc = cli_usage_error("import", "no ONNX model given%s", "");
    char *ir = NULL, *params = NULL;
    bool to_stdout = out && !strcmp(out, "-");
    if (!rc) {
        ir = out ? strdup(out) : with_ext(model, ".ir");
        params = with_ext(to_stdout ? model : ir ? ir : "", ".safetensors");
        if (!ir || !params) rc = cli_errorf("out of memory");
        else if (!to_stdout && !strcmp(ir, model))
            rc = out ? cli_errorf("-o %s: that is the model itself", ir)
                     : cli_errorf("%s: 'tfuse import' reads an ONNX model (.onnx), and this one's output would be the model itself "
                                  "(its name with .ir); a .ir file is tfuse's own text and needs no import", model);
    }
    /* before the work: the outputs can be written */
    if (!rc) rc = cli_check_readable("model", model);
    if (!rc && !to_stdout) rc = cli_check_writable("-o", ir, true);
    if (!rc) rc = cli_check_writable("params", params, true);
    tf_context_t *ctx = NULL;
    if (!rc && tf_context_create(&ctx)) rc = cli_errorf("out of memory");
    char *text = NULL;
    if (!rc && tf_onnx_import(ctx, model, dims, nd, &text, params)) rc = cli_fail(ctx);
    if (!rc) {
        FILE *f = to_stdout ? stdout : fopen(ir, "w");
        if (!f) rc = cli_errorf("-o %s: cannot write: %s", ir, strerror(errno));
        else {
            if (!to_stdout) fprintf(f, "# imported from %s by tfuse import; its params: %s\n", model, params);
            size_t len = strlen(text);
            bool bad = fputs(text, f) < 0 || (len && text[len - 1] != '\n' && fputc('\n', f) == EOF);
            if (!to_stdout) bad |= fclose(f) != 0;
            if (bad) rc = cli_errorf("-o %s: write failed", ir);
        }
        if (!rc && !to_stdout) fprintf(stderr, "wrote %s and %s\n", ir, params);
    }
    free(text);
    free(ir);
    free(params);
    for (size_t i = 0; i < nd; i++) free((char *)dims[i].name);
    tf_context_free(ctx);
    return rc;
}
