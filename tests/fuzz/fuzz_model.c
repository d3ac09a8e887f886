/* fuzz_model.c — libFuzzer target: the text format through the public API,
 * as a host program uses it. Each input is parsed and verified
 * (tf_model_parse_string); a model that parses is printed, parsed again and
 * printed again (printing must be a fixed point), then compiled for the
 * interp target in inference and in training mode with options drawn from
 * the input's bytes (precision, --O0, checkpoint=auto with a budget), and
 * the compiled program is printed.
 *
 * What counts as a finding (besides the sanitizers' reports, a hang, or a
 * single allocation over libFuzzer's -malloc_limit_mb):
 *   - a rejection that is not TF_ERR_PARSE/VERIFY/LIMIT (parsing) or is
 *     TF_ERR_INTERNAL/OOM or has no message (compiling), or whose message
 *     does not start with "fuzz.ir:";
 *   - a printed model that does not parse, or prints differently;
 *   - a negative peak_bytes or arena_bytes from compiling.
 * Nothing is run: compiling plans memory but allocates none of it, so a
 * model with dims near the 2^40 limit costs no more than one with small
 * dims, and sizes beyond the limits must be errors, not allocations. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tfuse.h"

static tf_context_t *ctx;

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_model: %s\n%s\n", what, detail ? detail : "");
    abort();
}

static void check_error(tf_status st, const char *stage, int parse)
{
    const char *msg = tf_context_last_error(ctx);
    char what[160];
    bool ok_status = parse ? (st == TF_ERR_PARSE || st == TF_ERR_VERIFY || st == TF_ERR_LIMIT)
                           : (st != TF_ERR_INTERNAL && st != TF_ERR_OOM);
    snprintf(what, sizeof what, "%s failed with %s", stage, tf_status_name(st));
    if (!ok_status) die(what, msg);
    if (!msg[0]) die("an error without a message", what);
    if (strncmp(msg, "fuzz.ir:", 8) != 0 && strncmp(msg, "error:", 6) != 0)
        die("an error message that names neither the file nor says error:", msg);
}

static void compile_one(const tf_model_t *m, tf_mode mode, uint8_t knobs)
{
    static const tf_precision precision[4] = {TF_PRECISION_DEFAULT, TF_PRECISION_DEFAULT, TF_PRECISION_FP16,
                                              TF_PRECISION_BF16};
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = TF_TARGET_INTERP;
    o.precision = precision[knobs & 3];
    o.opt_level = (knobs & 4) ? 0 : 1;
    if ((knobs & 24) == 24) {   /* one input in four: the budget search compiles the step many times */
        o.checkpoint = TF_CHECKPOINT_AUTO;
        o.memory_budget = (int64_t)1 << (10 + 2 * (knobs >> 5));
    }
    tf_program_t *p = NULL;
    tf_status st = tf_program_compile(ctx, m, &o, &p);
    if (st) {
        check_error(st, mode == TF_MODE_TRAIN ? "compile (train)" : "compile (infer)", 0);
        return;
    }
    for (size_t i = 0; i < tf_program_stat_count(p); i++) {
        const char *name;
        int64_t v;
        if (tf_program_stat(p, i, &name, &v) == TF_OK && v < 0) {
            char b[160];
            snprintf(b, sizeof b, "%s = %lld", name, (long long)v);
            die("a negative compile statistic", b);
        }
    }
    char *text = NULL;
    if (tf_program_print(ctx, p, &text) == TF_OK) free(text);
    tf_program_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx && tf_context_create(&ctx) != TF_OK) die("tf_context_create failed", NULL);
    tf_model_t *m = NULL, *m2 = NULL;
    tf_status st = tf_model_parse_string(ctx, "fuzz.ir", (const char *)data, size, NULL, 0, &m);
    if (st) {
        check_error(st, "parse", 1);
        return 0;
    }
    char *t1 = NULL, *t2 = NULL;
    if (tf_model_print(ctx, m, &t1) != TF_OK) die("tf_model_print failed", tf_context_last_error(ctx));
    if (tf_model_parse_string(ctx, "fuzz.ir", t1, strlen(t1), NULL, 0, &m2) != TF_OK)
        die("the printed model does not parse", tf_context_last_error(ctx));
    if (tf_model_print(ctx, m2, &t2) != TF_OK) die("tf_model_print failed on the reparsed model", NULL);
    if (strcmp(t1, t2) != 0) {
        fprintf(stderr, "first print:\n%s\nsecond print:\n%s\n", t1, t2);
        die("printing is not a fixed point", NULL);
    }
    free(t1);
    free(t2);
    tf_model_free(m2);
    uint8_t knobs = 0;   /* options from the input's bytes: a mutation of the text changes them too */
    for (size_t i = 0; i < size; i++) knobs = (uint8_t)(knobs * 31 + data[i]);
    compile_one(m, TF_MODE_INFER, knobs);
    compile_one(m, TF_MODE_TRAIN, knobs);
    tf_model_free(m);
    return 0;
}
