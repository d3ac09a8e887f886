/* test_op_table.c — every op in ops.def has everything every layer needs.
 *
 * Walks the whole op table and requires, per op:
 *   - a shape rule and an interpreter kernel;
 *   - a gradient rule, or none_<why> with a reason in grad_rules.c's table
 *     (layer ops: none, they are lowered before autodiff);
 *   - for an op that becomes an expression in kernels: a scalar expression
 *     (ops.def's LOWER) that parses, that both code generators lower
 *     (tf_jit_lowers, tf_cuda_lowers), and that computes in float64 what
 *     the op's scalar function computes, on a grid of values with zeros,
 *     signs, infinities and NaN;
 *   - a case in the target tests: some model of target_cases.h, or one
 *     tc_generated makes from the table, uses it (before or after
 *     compiling, so backward ops count through the training cases);
 *   - the code generators refuse, with a reason, a kernel holding an op they
 *     cannot lower, rather than computing something else;
 *   - malformed scalar expressions are rejected with the column. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda.h"
#include "kernel.h"
#include "scalar.h"
#include "target_cases.h"
#ifdef TFUSE_HAVE_LLVM
#include "llvm.h"
#endif

static bool seen[TF_OP_COUNT];

static void mark_module(const tf_module *m)
{
    for (int i = 0; i < m->nodes.n; i++) seen[((const tf_node *)m->nodes.items[i])->op] = true;
}

/* Parse and compile (interp target) one case; mark every op it holds. */
static void cover(const char *label, const char *text, tf_mode mode)
{
    tf_context_t *ctx;
    tf_context_create(&ctx);
    tf_model_t *m = NULL;
    tf_program_t *p = NULL;
    tf_compile_options o;
    tf_compile_options_init(&o);
    o.mode = mode;
    o.target = TF_TARGET_INTERP;
    bool ok = !tf_model_parse_string(ctx, label, text, strlen(text), NULL, 0, &m) && !tf_program_compile(ctx, m, &o, &p);
    CHECK(ok, "%s: %s", label, tf_context_last_error(ctx));
    if (ok) {
        mark_module(m->m);
        mark_module(p->m);
    }
    tf_program_free(p);
    tf_model_free(m);
    tf_context_free(ctx);
}

static bool same(double got, double want)
{
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= 1e-12 * (1 + fabs(want));
}

static void scalar_agrees(int op, const tf_sexpr *se)
{
    const tf_op_info *in = tf_op_info_of(op);
    if (!in->scalar) return;
    static const double grid[] = {-3.5, -1, -0.25, -0.0, 0.0, 0.5, 1, 2, 7.25, INFINITY, -INFINITY, NAN};
    size_t ng = sizeof grid / sizeof *grid;
    int bad = 0;
    for (size_t i = 0; i < ng; i++)
        for (size_t j = 0; j < (in->max_in > 1 ? ng : 1); j++) {
            double args[3] = {grid[i], grid[j], 0}, got = tf_sexpr_eval(se, args), want = in->scalar(grid[i], grid[j]);
            if (!same(got, want) && bad++ < 3)
                CHECK(0, "%s: the scalar expression \"%s\" gives %.17g at (%g, %g); the interpreter's function %.17g", in->name,
                      in->lower, got, grid[i], grid[j], want);
        }
    CHECK(bad == 0, "%s: %d points disagree", in->name, bad);
}

static void walk(void)
{
    int lowered = 0, reasons = 0;
    for (int op = 0; op < TF_OP_COUNT; op++) {
        const tf_op_info *in = tf_op_info_of(op);
        CHECK(in->name && in->shape && in->interp, "op %d: name, shape rule and interpreter kernel", op);
        bool layer = tf_op_has(op, TF_OPF_LAYER);
        const char *why = tf_grad_none_reason(op);
        CHECK(tf_grad_rule(op) || why, "%s: neither a gradient rule nor a reason for having none", in->name);
        CHECK(!layer || (!tf_grad_rule(op) && why && strstr(why, "layer")), "%s: a layer op has no gradient rule: %s",
              in->name, why ? why : "(rule)");
        reasons += why != NULL;
        /* the EXEC column agrees with what the other columns say */
        tf_op_exec ex = tf_op_exec_of(op);
        CHECK(ex >= 0 && ex < TF_OPX_COUNT && strcmp(tf_exec_name(ex), "?"), "%s: EXEC %d is no class", in->name, (int)ex);
        CHECK(layer == (ex == TF_OPX_LAYER), "%s: a layer op (flag LAYER) is exactly one whose EXEC is LAYER", in->name);
        CHECK(layer || (in->lower != NULL) == (ex == TF_OPX_EXPR),
              "%s: a core op computed from an expression (EXEC EXPR) is exactly one with a LOWER expression", in->name);
        CHECK(ex != TF_OPX_REDUCE || in->kind == TF_OPK_REDUCTION, "%s: EXEC REDUCE but KIND is not REDUCTION", in->name);
        CHECK(ex != TF_OPX_INDEX || in->max_in == 0, "%s: EXEC INDEX computes from the index alone: no operands", in->name);
        CHECK(ex != TF_OPX_VIEW || in->max_in == 1, "%s: a view views one operand", in->name);
        CHECK(!tf_exec_own_kernel(ex) || tf_exec_library(ex), "%s: a kernel of its own is a library kernel", in->name);
        if (in->lower) {
            const char *perr;
            const tf_sexpr *se = tf_scalar_lowering(op, &perr);
            CHECK(se != NULL, "%s: its scalar expression does not parse: %s", in->name, perr);
            if (se) {
                CHECK(se->nargs <= (op == TF_OP_ONE_HOT ? 2 : in->max_in), "%s: names operands the op lacks", in->name);
                scalar_agrees(op, se);
            }
        }
        if (!tf_kernel_op_is_expr(op)) continue;
        lowered++;
        char w1[256] = "", w2[256] = "";
        CHECK(in->lower != NULL, "%s: kernels compute it, but ops.def gives it no scalar expression", in->name);
        CHECK(tf_cuda_lowers(op, w1, sizeof w1), "%s: no CUDA lowering: %s", in->name, w1);
#ifdef TFUSE_HAVE_LLVM
        CHECK(tf_jit_lowers(op, w2, sizeof w2), "%s: no LLVM lowering: %s", in->name, w2);
#else
        (void)w2;
#endif
    }
    printf("op table: %d ops, %d lowered from scalar expressions, %d without a gradient rule (each with a reason)\n",
           TF_OP_COUNT, lowered, reasons);
}

static void coverage(void)
{
    int generated = tc_each_case(cover);
    int missing = 0;
    for (int op = 0; op < TF_OP_COUNT; op++)
        if (!seen[op]) {
            missing++;
            CHECK(0, "%s: no target case uses it (add one to tests/unit/target_cases.h)", tf_op_info_of(op)->name);
        }
    printf("target cases: %d written, %d generated from the table; %d ops without a case\n",
           (int)(sizeof target_cases / sizeof *target_cases), generated, missing);
}

/* A kernel holding an op a generator cannot lower is refused with a reason. */
static void refused(void)
{
    tf_kbuf buf = {0};
    tf_kexpr ex[2] = {{.kind = TF_KX_CONST, .dtype = TF_DT_F32, .value = 1},
                      {.kind = TF_KX_OP, .op = TF_OP_MATMUL, .dtype = TF_DT_F32, .nargs = 2, .args = {0, 0}}};
    tf_kstore st = {.buf = 0, .expr = 1};
    tf_kernel k = {.name = "k_test", .kind = TF_K_ELEMENTWISE, .rank = 1, .dims = {4}, .exprs = ex, .nexprs = 2,
                   .stores = &st, .nstores = 1, .bufs = &buf, .nbufs = 0};
    char why[512] = "";
    CHECK(!tf_cuda_supports(&k, why, sizeof why) && strstr(why, "matmul") && strstr(why, "no CUDA lowering"),
          "cuda refuses an op without a scalar expression: %s", why);
#ifdef TFUSE_HAVE_LLVM
    why[0] = 0;
    CHECK(!tf_jit_supports(&k, why, sizeof why) && strstr(why, "matmul") && strstr(why, "no LLVM lowering"),
          "llvm refuses an op without a scalar expression: %s", why);
#endif
}

static void parse_errors(void)
{
    static const struct { const char *text, *msg; } bad[] = {
        {"a +", "column 4"},          {"foo(a)", "unknown name"},    {"exp(a, b)", "wrong number"},
        {"(a", "expected ')'"},        {"a b", "unexpected text"},   {"d", "unknown name"},
        {"max(a)", "wrong number"},    {"select(a, b)", "wrong number"}, {"", "expected an operand"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tf_sexpr e;
        char why[256] = "";
        CHECK(!tf_sexpr_parse(bad[i].text, &e, why, sizeof why) && strstr(why, bad[i].msg) && strstr(why, "column"),
              "\"%s\" is refused with \"%s\": %s", bad[i].text, bad[i].msg, why);
    }
    tf_sexpr e;
    double args[3] = {2, 3, 0};
    CHECK(tf_sexpr_parse("-a * (b - 1) / 4 + max(a, b) >= 2", &e, NULL, 0) && tf_sexpr_eval(&e, args) == 1.0,
          "precedence: -2 * 2 / 4 + 3 = 2 >= 2");
    CHECK(tf_sexpr_parse("select(a < b, a, b)", &e, NULL, 0) && tf_sexpr_eval(&e, args) == 2.0, "select picks a");
}

int main(void)
{
    walk();
    coverage();
    refused();
    parse_errors();
    return check_report();
}
