/* scalar.c — parsing ops.def's scalar expressions (see scalar.h).
 *
 * Grammar, lowest precedence first:
 *   cmp     := sum [("==" | "!=" | "<" | "<=" | ">" | ">=") sum]
 *   sum     := product {("+" | "-") product}
 *   product := unary {("*" | "/") unary}
 *   unary   := "-" unary | primary
 *   primary := number | "a" | "b" | "c" | name "(" [cmp {"," cmp}] ")" | "(" cmp ")" */
#include "scalar.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static const struct { const char *name; int arity; bool boolout; } prims[TF_S_COUNT] = {
    [TF_S_ARG] = {"operand", 0, false},  [TF_S_CONST] = {"number", 0, false},
    [TF_S_NEG] = {"-", 1, false},        [TF_S_ADD] = {"+", 2, false},        [TF_S_SUB] = {"-", 2, false},
    [TF_S_MUL] = {"*", 2, false},        [TF_S_DIV] = {"/", 2, false},
    [TF_S_ABS] = {"abs", 1, false},      [TF_S_EXP] = {"exp", 1, false},      [TF_S_LOG] = {"log", 1, false},
    [TF_S_SQRT] = {"sqrt", 1, false},    [TF_S_RSQRT] = {"rsqrt", 1, false},  [TF_S_TANH] = {"tanh", 1, false},
    [TF_S_SIN] = {"sin", 1, false},      [TF_S_COS] = {"cos", 1, false},      [TF_S_ERF] = {"erf", 1, false},
    [TF_S_POW] = {"pow", 2, false},      [TF_S_MAX] = {"max", 2, false},      [TF_S_MIN] = {"min", 2, false},
    [TF_S_EQ] = {"==", 2, true},         [TF_S_NE] = {"!=", 2, true},         [TF_S_LT] = {"<", 2, true},
    [TF_S_LE] = {"<=", 2, true},         [TF_S_GT] = {">", 2, true},          [TF_S_GE] = {">=", 2, true},
    [TF_S_ISFINITE] = {"isfinite", 1, true},
    [TF_S_SELECT] = {"select", 3, false},
    [TF_S_DROPOUT] = {"dropout", 0, false},
};

const char *tf_sprim_name(tf_sprim p) { return (unsigned)p < TF_S_COUNT ? prims[p].name : "?"; }
int tf_sprim_arity(tf_sprim p) { return (unsigned)p < TF_S_COUNT ? prims[p].arity : 0; }
bool tf_sprim_boolout(tf_sprim p) { return (unsigned)p < TF_S_COUNT && prims[p].boolout; }

/* ---- parser ---- */

typedef struct ps {
    const char *text, *at;
    tf_sexpr *e;
    char *why;
    size_t n;
    bool bad;
} ps;

static int fail(ps *p, const char *msg)
{
    if (!p->bad) snprintf(p->why, p->n, "\"%s\": column %d: %s", p->text, (int)(p->at - p->text) + 1, msg);
    p->bad = true;
    return -1;
}

static void skip(ps *p)
{
    while (isspace((unsigned char)*p->at)) p->at++;
}

static bool eat(ps *p, const char *tok)
{
    skip(p);
    size_t k = strlen(tok);
    if (strncmp(p->at, tok, k)) return false;
    p->at += k;
    return true;
}

static int add(ps *p, tf_snode nd)
{
    if (p->bad) return -1;
    if (p->e->n == TF_SEXPR_MAX) return fail(p, "too long");
    p->e->node[p->e->n] = nd;
    return p->e->n++;
}

static int node2(ps *p, tf_sprim prim, int a, int b)
{
    if (a < 0 || b < 0) return -1;
    return add(p, (tf_snode){.prim = prim, .kid = {a, b, 0}});
}

static int cmp(ps *p);

static int primary(ps *p)
{
    skip(p);
    const char *s = p->at;
    if (isdigit((unsigned char)*s) || *s == '.') {
        char *end;
        double v = strtod(s, &end);
        p->at = end;
        return add(p, (tf_snode){.prim = TF_S_CONST, .value = v});
    }
    if (eat(p, "(")) {
        int v = cmp(p);
        if (!eat(p, ")")) return fail(p, "expected ')'");
        return v;
    }
    if (!isalpha((unsigned char)*s)) return fail(p, "expected an operand, a number, a primitive or '('");
    size_t k = 0;
    while (isalnum((unsigned char)s[k]) || s[k] == '_') k++;
    p->at = s + k;
    if (k == 1 && *s >= 'a' && *s <= 'c') {
        int q = *s - 'a';
        if (q + 1 > p->e->nargs) p->e->nargs = q + 1;
        return add(p, (tf_snode){.prim = TF_S_ARG, .arg = q});
    }
    tf_sprim prim = TF_S_COUNT;
    for (int i = TF_S_ABS; i < TF_S_COUNT; i++)
        if (isalpha((unsigned char)prims[i].name[0]) && strlen(prims[i].name) == k && !strncmp(prims[i].name, s, k)) prim = (tf_sprim)i;
    if (prim == TF_S_COUNT) {
        p->at = s;
        return fail(p, "unknown name (operands are a, b, c; primitives are listed in codegen/scalar.h)");
    }
    if (!eat(p, "(")) return fail(p, "expected '(' after a primitive");
    tf_snode nd = {.prim = prim};
    int got = 0;
    if (!eat(p, ")")) {
        do {
            int v = cmp(p);
            if (v < 0) return -1;
            if (got == 3) return fail(p, "too many operands");
            nd.kid[got++] = v;
        } while (eat(p, ","));
        if (!eat(p, ")")) return fail(p, "expected ',' or ')'");
    }
    if (got != prims[prim].arity) return fail(p, "wrong number of operands for the primitive");
    return add(p, nd);
}

static int unary(ps *p)
{
    if (eat(p, "-")) {
        int v = unary(p);
        return v < 0 ? -1 : add(p, (tf_snode){.prim = TF_S_NEG, .kid = {v, 0, 0}});
    }
    return primary(p);
}

static int product(ps *p)
{
    int v = unary(p);
    for (;;) {
        if (eat(p, "*")) v = node2(p, TF_S_MUL, v, unary(p));
        else if (eat(p, "/")) v = node2(p, TF_S_DIV, v, unary(p));
        else return v;
    }
}

static int sum(ps *p)
{
    int v = product(p);
    for (;;) {
        if (eat(p, "+")) v = node2(p, TF_S_ADD, v, product(p));
        else if (eat(p, "-")) v = node2(p, TF_S_SUB, v, product(p));
        else return v;
    }
}

static int cmp(ps *p)
{
    int v = sum(p);
    static const struct { const char *tok; tf_sprim prim; } ops[] = {
        {"==", TF_S_EQ}, {"!=", TF_S_NE}, {"<=", TF_S_LE}, {">=", TF_S_GE}, {"<", TF_S_LT}, {">", TF_S_GT},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (eat(p, ops[i].tok)) return node2(p, ops[i].prim, v, sum(p));
    return v;
}

bool tf_sexpr_parse(const char *text, tf_sexpr *out, char *why, size_t n)
{
    char tmp[8];
    if (!why) { why = tmp; n = sizeof tmp; }
    memset(out, 0, sizeof *out);
    ps p = {text, text, out, why, n, false};
    int root = cmp(&p);
    skip(&p);
    if (root >= 0 && *p.at) fail(&p, "unexpected text after the expression");
    if (p.bad || root != out->n - 1) return false;
    return true;
}

/* ---- the table's lowerings, parsed once ---- */

static tf_sexpr parsed[TF_OP_COUNT];
static char parse_error[TF_OP_COUNT][160];
static bool parsed_ok[TF_OP_COUNT];
static pthread_once_t parse_once = PTHREAD_ONCE_INIT;

static void parse_all(void)
{
    for (int op = 0; op < TF_OP_COUNT; op++) {
        const char *t = tf_op_info_of(op)->lower;
        if (!t) { snprintf(parse_error[op], sizeof parse_error[op], "ops.def gives %s no scalar expression", tf_op_info_of(op)->name); continue; }
        parsed_ok[op] = tf_sexpr_parse(t, &parsed[op], parse_error[op], sizeof parse_error[op]);
    }
}

const tf_sexpr *tf_scalar_lowering(int op, const char **why)
{
    if ((unsigned)op >= TF_OP_COUNT) {
        if (why) *why = "no such op";
        return NULL;
    }
    pthread_once(&parse_once, parse_all);
    if (why) *why = parsed_ok[op] ? "" : parse_error[op];
    return parsed_ok[op] ? &parsed[op] : NULL;
}

bool tf_sexpr_lowerable(int op, int nargs, bool (*has)(tf_sprim), char *why, size_t n)
{
    char tmp[8];
    if (!why) { why = tmp; n = sizeof tmp; }
    const char *no;
    const tf_sexpr *se = tf_scalar_lowering(op, &no);
    if (!se) { snprintf(why, n, "%s", no); return false; }
    if (se->nargs > nargs) { snprintf(why, n, "its expression names more operands than the op has"); return false; }
    for (int j = 0; j < se->n; j++)
        if (!has(se->node[j].prim)) {
            snprintf(why, n, "primitive '%s' is not implemented here", tf_sprim_name(se->node[j].prim));
            return false;
        }
    return true;
}

/* ---- float64 evaluation (what the tests compare with the interpreter) ---- */

double tf_sexpr_eval(const tf_sexpr *e, const double *args)
{
    double v[TF_SEXPR_MAX];
    for (int i = 0; i < e->n; i++) {
        const tf_snode *nd = &e->node[i];
        double a = nd->kid[0] < i ? v[nd->kid[0]] : 0, b = nd->kid[1] < i ? v[nd->kid[1]] : 0;
        switch (nd->prim) {
        case TF_S_ARG: v[i] = args[nd->arg]; break;
        case TF_S_CONST: v[i] = nd->value; break;
        case TF_S_NEG: v[i] = -a; break;
        case TF_S_ADD: v[i] = a + b; break;
        case TF_S_SUB: v[i] = a - b; break;
        case TF_S_MUL: v[i] = a * b; break;
        case TF_S_DIV: v[i] = a / b; break;
        case TF_S_ABS: v[i] = fabs(a); break;
        case TF_S_EXP: v[i] = exp(a); break;
        case TF_S_LOG: v[i] = log(a); break;
        case TF_S_SQRT: v[i] = sqrt(a); break;
        case TF_S_RSQRT: v[i] = 1.0 / sqrt(a); break;
        case TF_S_TANH: v[i] = tanh(a); break;
        case TF_S_SIN: v[i] = sin(a); break;
        case TF_S_COS: v[i] = cos(a); break;
        case TF_S_ERF: v[i] = erf(a); break;
        case TF_S_POW: v[i] = pow(a, b); break;
        case TF_S_MAX: v[i] = a != a || b != b ? NAN : a > b ? a : b; break;
        case TF_S_MIN: v[i] = a != a || b != b ? NAN : a < b ? a : b; break;
        case TF_S_EQ: v[i] = a == b; break;
        case TF_S_NE: v[i] = a != b; break;
        case TF_S_LT: v[i] = a < b; break;
        case TF_S_LE: v[i] = a <= b; break;
        case TF_S_GT: v[i] = a > b; break;
        case TF_S_GE: v[i] = a >= b; break;
        case TF_S_ISFINITE: v[i] = isfinite(a); break;
        case TF_S_SELECT: v[i] = a != 0 ? b : v[nd->kid[2]]; break;
        case TF_S_DROPOUT: v[i] = 1; break;
        default: v[i] = NAN; break;
        }
    }
    return e->n ? v[e->n - 1] : NAN;
}
