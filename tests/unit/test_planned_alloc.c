/* test_planned_alloc.c — the plan is what runs: on the cpu target a
 * session holds, for the step's values, exactly the memory memplan planned.
 * For the examples and the bench models, train (with and without
 * --checkpoint=auto) and infer: the session's arena is compile --stats
 * arena_bytes, the arena plus the inputs', params' and buffers' blocks is
 * peak_bytes, and no value lives outside the plan. A step is run first, so
 * that nothing allocated on the way escapes the count. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tfuse.h"

static int64_t stat_of(const tf_program_t *p, const char *name)
{
    for (size_t i = 0; i < tf_program_stat_count(p); i++) {
        const char *n;
        int64_t v;
        if (!tf_program_stat(p, i, &n, &v) && !strcmp(n, name)) return v;
    }
    return -1;
}

/* 1: checked, 0: the cpu target is not in this build */
static int check_one(tf_context_t *ctx, const char *path, int64_t B, tf_mode mode, double budget_pct)
{
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_session_t *s = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = TF_TARGET_CPU;
    o.threads = 2;
    if (budget_pct) o.checkpoint = TF_CHECKPOINT_AUTO, o.memory_budget_percent = budget_pct;
    const char *what = mode == TF_MODE_INFER ? "infer" : budget_pct ? "train, checkpointed" : "train";
    tf_dim_override dim = {"B", B};
    CHECK(!tf_model_parse_file(ctx, path, &dim, B ? 1 : 0, &m), "%s: %s", path, tf_context_last_error(ctx));
    CHECK(m && !tf_program_compile(ctx, m, &o, &p), "%s (%s): %s", path, what, tf_context_last_error(ctx));
    tf_model_free(m);
    if (!p) return 1;
    tf_status st = tf_session_create(ctx, p, TF_TARGET_CPU, 1, &s);
    if (st == TF_ERR_UNAVAILABLE) {
        tf_program_free(p);
        return 0;
    }
    CHECK(!st, "%s (%s): session: %s", path, what, tf_context_last_error(ctx));
    void *data[64] = {0};
    size_t nin = tf_program_io_count(p, TF_IO_INPUT);
    for (size_t i = 0; s && i < nin && i < 64; i++) {   /* zeros: every label and id in range */
        const char *name;
        tf_dtype dt;
        int rank;
        int64_t shape[8], n = 1;
        tf_program_io(p, TF_IO_INPUT, i, &name, &dt, &rank, shape);
        for (int k = 0; k < rank; k++) n *= shape[k];
        data[i] = calloc((size_t)n, (size_t)tf_dtype_size(dt));
        CHECK(data[i] && !tf_session_bind(s, name, dt, shape, rank, data[i]), "%s: bind %s", path, name);
    }
    CHECK(s && !tf_session_run(s), "%s (%s): run: %s", path, what, tf_context_last_error(ctx));
    for (size_t i = 0; i < 64; i++) free(data[i]);
    tf_session_info info;
    if (s && !tf_session_get_info(s, &info)) {
        int64_t arena = stat_of(p, "arena_bytes"), peak = stat_of(p, "peak_bytes");
        CHECK(arena > 0 && info.arena_bytes == arena, "%s (%s): the session's arena is %lld bytes, the plan's %lld", path,
              what, (long long)info.arena_bytes, (long long)arena);
        CHECK(peak > 0 && info.value_bytes == peak, "%s (%s): the session holds %lld bytes of values, the planned peak is "
              "%lld", path, what, (long long)info.value_bytes, (long long)peak);
        CHECK(info.unplanned_bytes == 0, "%s (%s): %lld bytes of values outside the plan", path, what,
              (long long)info.unplanned_bytes);
        if (budget_pct)
            CHECK(stat_of(p, "recomputed_ops") > 0, "%s (%s): nothing recomputed", path, what);
    }
    tf_session_free(s);
    tf_program_free(p);
    return 1;
}

int main(void)
{
    const char *src = getenv("TFUSE_EXAMPLES");   /* the repository's examples/; bench/ is beside it */
    char path[4096];
    /* the budget (percent of the unconstrained peak) each model can meet with
     * recomputation (the bench models at 50%: issue 16's target); 0: at its
     * dims nothing recomputed lowers its peak */
    static const struct { const char *file; int64_t B; double pct; } models[] = {
        {"examples/mlp.ir", 0, 0}, {"examples/cnn.ir", 0, 90}, {"examples/transformer.ir", 0, 0},
        {"examples/transformer.ir", 32, 80}, {"bench/models/gpt.ir", 0, 50}, {"bench/models/resnet.ir", 0, 50}};
    tf_context_t *ctx;
    CHECK(tf_context_create(&ctx) == TF_OK, "context");
    int ran = 0;
    for (size_t i = 0; src && i < sizeof models / sizeof *models; i++) {
        snprintf(path, sizeof path, "%s/../%s", src, models[i].file);
        ran += check_one(ctx, path, models[i].B, TF_MODE_TRAIN, 0);
        if (models[i].pct > 0) ran += check_one(ctx, path, models[i].B, TF_MODE_TRAIN, models[i].pct);
        ran += check_one(ctx, path, models[i].B, TF_MODE_INFER, 0);
    }
    CHECK(src != NULL, "TFUSE_EXAMPLES names the repository's examples");
    if (!ran) printf("the cpu target is not in this build: nothing to compare\n");
    tf_context_free(ctx);
    return check_report();
}
