/* parser.c — recursive descent over lines; see parser.h and
 * docs/ir.md (the text format) for the grammar:
 *
 *   module  := line*                      one statement per line
 *   line    := 'module' NAME
 *            | 'dim' NAME '=' INT
 *            | ('input'|'param'|'buffer') NAME ':' type ('=' call)?
 *            | NAME (':' type)? '=' OP '(' operand,* attr,* ')'
 *            | 'output' NAME ('=' NAME)?
 *            | 'update' NAME '=' NAME
 *            | 'train' '{' (NAME '=' tvalue)* '}'
 *            | 'region' NAME ('kind' '=' KIND)? '{' op-line* 'yield' NAME,* '}'   (no nesting)
 *   type    := DTYPE ('[' (INT|DIM),* ']')?
 *   operand := NAME | number              attr := NAME '=' value
 *   value   := number | STRING | NAME | '[' value,* ']'   (lists hold ints or dims; they do not nest)
 *   call    := NAME '(' (value|attr),* ')'    positional values fill the schema in order */
#include "parser.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lexer.h"
#include "ops.h"

typedef struct parser {
    tf_lexer lx;
    tf_token tok;
    tf_module *m;
    tf_diag *d;
    int region;             /* the region being parsed (1-based), 0 outside */
    int nrandom;            /* dropouts so far without an explicit salt */
    const tf_dim_set *over;
    int nover;
    bool *over_used;
} parser;

#define FAIL(p) ((p)->d->status)

static tf_loc loc_of(parser *p, const tf_token *t) { return (tf_loc){p->m->file, t->line, t->col}; }

static void advance(parser *p) { p->tok = tf_lexer_next(&p->lx); }

static tf_ir_status err_at(parser *p, const tf_token *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static tf_ir_status err_at(parser *p, const tf_token *t, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tf_loc l = loc_of(p, t);
    return tf_diag_error(p->d, TF_IR_ERR_SYNTAX, &l, "%s", msg);
}

/* "expected X, found Y" at the current token. */
static tf_ir_status expected(parser *p, const char *what)
{
    if (p->tok.kind == TK_ERROR) return FAIL(p);
    char found[128];
    tf_tok_describe(&p->tok, found, sizeof found);
    return err_at(p, &p->tok, "expected %s, found %s", what, found);
}

static tf_ir_status expect(parser *p, tf_tok_kind k, const char *what)
{
    if (p->tok.kind != k) return expected(p, what);
    advance(p);
    return TF_IR_OK;
}

static bool tok_is(const tf_token *t, const char *s)
{
    return t->kind == TK_IDENT && strlen(s) == t->len && memcmp(t->p, s, t->len) == 0;
}

const char *const tf_parser_words[] = {
    /* statement keywords: TF_PARSER_NKEYWORDS */
    "module", "dim", "input", "param", "buffer", "output", "update", "train", "region", "yield",
    /* train-block keys and precisions, region and op marks, literals */
    "optimizer", "schedule", "precision", "clip_grad_norm", "accumulate", "metrics", "fp32", "fp16", "bf16",
    "kind", "numerics", "fast", "exact", "recompute", "backward", "true", "false", "inf", "nan", "-inf",
};
const int tf_parser_nwords = (int)(sizeof tf_parser_words / sizeof *tf_parser_words);

static bool is_keyword(const tf_token *t)
{
    for (int i = 0; i < TF_PARSER_NKEYWORDS; i++)
        if (tok_is(t, tf_parser_words[i])) return true;
    return false;
}

static const char *tok_str(parser *p, const tf_token *t) { return tf_arena_strndup(&p->m->arena, t->p, t->len); }

static tf_ir_status oom(parser *p) { return tf_diag_error(p->d, TF_IR_ERR_OOM, NULL, "out of memory while parsing"); }

/* Edit distance, for "did you mean" hints. */
static int edit_distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    int prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int c = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < c) c = prev[j] + 1;
            if (cur[j - 1] + 1 < c) c = cur[j - 1] + 1;
            cur[j] = c;
        }
        memcpy(prev, cur, sizeof cur);
    }
    return prev[lb];
}

static void op_hint(const tf_token *t, char *buf, size_t n)
{
    int best = -1, bd = 3;
    for (int i = 0; i < TF_OP_COUNT; i++) {
        int dd = edit_distance(t->p, t->len, tf_op_table[i].name);
        if (dd < bd) bd = dd, best = i;
    }
    if (best >= 0) snprintf(buf, n, "; did you mean '%s'?", tf_op_table[best].name);
    else buf[0] = 0;
}

static void spec_names(const tf_attr_spec *s, int n, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = 0;
    if (n == 0) snprintf(buf, len, "none");
    for (int i = 0; i < n && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%s", i ? ", " : "", s[i].name);
}

/* ---- types ---- */

static tf_ir_status parse_type(parser *p, tf_type *t)
{
    memset(t, 0, sizeof *t);
    if (p->tok.kind != TK_IDENT || !tf_dtype_from_name(p->tok.p, p->tok.len, &t->dtype))
        return expected(p, "a dtype (f32, f16, bf16, f64, i64, i32, bool)");
    advance(p);
    if (p->tok.kind != TK_LBRACK) return TF_IR_OK;   /* scalar written without [] */
    advance(p);
    int64_t numel = 1;
    while (p->tok.kind != TK_RBRACK) {
        if (t->rank == TF_MAX_RANK) return err_at(p, &p->tok, "a type has at most %d axes", TF_MAX_RANK);
        tf_dim dim = {0, -1};
        if (p->tok.kind == TK_INT) {
            dim.n = p->tok.ival;
        } else if (p->tok.kind == TK_IDENT) {
            int k = tf_module_find_dim(p->m, p->tok.p, p->tok.len);
            if (k < 0) {
                char b[128];
                tf_tok_describe(&p->tok, b, sizeof b);
                return err_at(p, &p->tok, "unknown dim %s (declare it first: `dim %.*s = <size>`)", b,
                              (int)(p->tok.len > 60 ? 60 : p->tok.len), p->tok.p);
            }
            dim = (tf_dim){p->m->dims[k].value, k};
        } else {
            return expected(p, "a dimension (an integer or a dim name)");
        }
        if (dim.n < 1) return err_at(p, &p->tok, "dimension must be positive, found %lld", (long long)dim.n);
        if (dim.n > TF_MAX_DIM)
            return err_at(p, &p->tok, "dimension %lld is larger than the limit 2^40", (long long)dim.n);
        if (numel > TF_MAX_NUMEL / dim.n)
            return err_at(p, &p->tok, "type has more than 2^48 elements");
        numel *= dim.n;
        t->dims[t->rank++] = dim;
        advance(p);
        if (p->tok.kind == TK_COMMA) advance(p);
        else if (p->tok.kind != TK_RBRACK) return expected(p, "',' or ']' in the type");
    }
    advance(p);
    return TF_IR_OK;
}

/* ---- attribute values ---- */

static tf_ir_status parse_scalar_value(parser *p, tf_attr *a, bool in_list)
{
    tf_token t = p->tok;
    memset(a, 0, sizeof *a);
    a->set = true;
    switch (t.kind) {
    case TK_INT: a->kind = TF_ATTR_INT; a->u.i = (tf_ival){t.ival, -1}; break;
    case TK_FLOAT: a->kind = TF_ATTR_FLOAT; a->u.f = t.fval; break;
    case TK_STRING:
        if (memchr(t.p, '\\', t.len)) return err_at(p, &t, "escapes are not supported in attribute strings");
        a->kind = TF_ATTR_STR;
        if (!(a->u.s = tok_str(p, &t))) return oom(p);
        break;
    case TK_IDENT: {
        int k = tf_module_find_dim(p->m, t.p, t.len);
        if (k < 0 && in_list)
            return err_at(p, &t, "unknown dim '%.*s' in the list (lists hold integers or declared dim names)",
                          (int)(t.len > 60 ? 60 : t.len), t.p);
        if (k >= 0) {
            a->kind = TF_ATTR_INT;
            a->u.i = (tf_ival){p->m->dims[k].value, k};
        } else if (tok_is(&t, "true") || tok_is(&t, "false")) {
            a->kind = TF_ATTR_BOOL;
            a->u.b = t.p[0] == 't';
        } else if (tok_is(&t, "inf") || tok_is(&t, "nan")) {
            a->kind = TF_ATTR_FLOAT;
            a->u.f = t.p[0] == 'i' ? INFINITY : NAN;
        } else {
            a->kind = TF_ATTR_STR;
            if (!(a->u.s = tok_str(p, &t))) return oom(p);
        }
        break;
    }
    case TK_LBRACK:
        if (in_list) return err_at(p, &t, "lists do not nest");
        /* fall through */
    default: return expected(p, "a value (number, string, name or list)");
    }
    advance(p);
    return TF_IR_OK;
}

static tf_ir_status parse_value(parser *p, tf_attr *a)
{
    if (p->tok.kind != TK_LBRACK) return parse_scalar_value(p, a, false);
    advance(p);
    tf_ival items[64];
    int n = 0;
    while (p->tok.kind != TK_RBRACK) {
        if (n == 64) return err_at(p, &p->tok, "a list holds at most 64 entries");
        tf_token at = p->tok;
        tf_attr e;
        if (parse_scalar_value(p, &e, true)) return FAIL(p);
        if (e.kind != TF_ATTR_INT) return err_at(p, &at, "lists hold integers or dim names only");
        items[n++] = e.u.i;
        if (p->tok.kind == TK_COMMA) advance(p);
        else if (p->tok.kind != TK_RBRACK) return expected(p, "',' or ']' in the list");
    }
    advance(p);
    memset(a, 0, sizeof *a);
    a->kind = TF_ATTR_INTS;
    a->set = true;
    a->u.ints.n = n;
    if (!(a->u.ints.v = tf_arena_array(&p->m->arena, (size_t)(n ? n : 1), sizeof(tf_ival)))) return oom(p);
    memcpy(a->u.ints.v, items, (size_t)n * sizeof *items);
    return TF_IR_OK;
}

static int spec_of(const tf_attr_spec *specs, int nspecs, const tf_token *key)
{
    for (int i = 0; i < nspecs; i++)
        if (tok_is(key, specs[i].name)) return i;
    return -1;
}

/* One value into *slot, coerced to the spec's kind and range-checked. */
static tf_ir_status finish_attr(parser *p, const tf_attr_spec *spec, tf_attr *slot)
{
    tf_token at = p->tok;
    tf_loc l = loc_of(p, &at);
    tf_attr a;
    if (parse_value(p, &a)) return FAIL(p);
    bool numeric = spec->kind == TF_ATTR_INT || spec->kind == TF_ATTR_FLOAT || spec->kind == TF_ATTR_INTS;
    if (numeric && at.kind == TK_IDENT && a.kind == TF_ATTR_STR)   /* a bare name that is no dim */
        return err_at(p, &at, "unknown dim '%.*s' (attribute '%s' expects %s)", (int)(at.len > 60 ? 60 : at.len), at.p,
                      spec->name, spec->kind == TF_ATTR_INTS ? "integers or declared dim names" : "a number or a declared dim");
    if (tf_attr_coerce(p->m, spec, &a, &l, p->d) || tf_attr_check(spec, &a, &l, p->d)) return FAIL(p);
    *slot = a;
    return TF_IR_OK;
}

/* key '=' value into attrs[] per the schema: unknown, duplicate, ill-typed
 * and out-of-range values are errors at the key or the value. */
static tf_ir_status parse_attr_kv(parser *p, const char *owner, const tf_attr_spec *specs, int nspecs, tf_attr *attrs)
{
    tf_token key = p->tok;
    int k = spec_of(specs, nspecs, &key);
    if (k < 0) {
        char names[512];
        spec_names(specs, nspecs, names, sizeof names);
        return err_at(p, &key, "unknown attribute '%.*s' for %s; expected one of: %s", (int)(key.len > 60 ? 60 : key.len),
                      key.p, owner, names);
    }
    if (attrs[k].kind != TF_ATTR_NONE) return err_at(p, &key, "attribute '%s' given twice", specs[k].name);
    advance(p);
    if (expect(p, TK_EQ, "'='")) return FAIL(p);
    return finish_attr(p, &specs[k], &attrs[k]);
}

/* Is the current token a name followed by '='? (one token of lookahead) */
static bool at_key(parser *p)
{
    if (p->tok.kind != TK_IDENT) return false;
    tf_lexer save = p->lx;
    tf_token t = p->tok;
    tf_diag dsave = *p->d;
    advance(p);
    bool eq = p->tok.kind == TK_EQ;
    p->lx = save;
    p->tok = t;
    *p->d = dsave;   /* a lexer error past the name is reported when reached */
    return eq;
}

static tf_ir_status check_required(parser *p, const char *owner, const tf_attr_spec *specs, int n, tf_attr *attrs,
                                   const tf_token *at)
{
    for (int i = 0; i < n; i++)
        if (attrs[i].kind == TF_ATTR_NONE && !specs[i].dflt)
            return err_at(p, at, "%s: missing required attribute '%s'", owner, specs[i].name);
    if (tf_attrs_fill_defaults(p->m, specs, n, attrs, p->d)) return FAIL(p);
    return TF_IR_OK;
}

/* NAME '(' (value | key=value),* ')' against a function table. A call with no
 * parentheses is allowed where `bare` is set (schedule = constant). */
static tf_ir_status parse_call(parser *p, const char *what, const tf_fn_info *fns, int nfns, tf_call *c, bool bare)
{
    tf_token name = p->tok;
    if (name.kind != TK_IDENT) return expected(p, what);
    int fn = tf_fn_lookup(fns, nfns, name.p, name.len);
    if (fn < 0) {
        char names[256];
        size_t k = 0;
        for (int i = 0; i < nfns; i++) k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", fns[i].name);
        return err_at(p, &name, "unknown %s '%.*s'; expected one of: %s", what, (int)(name.len > 60 ? 60 : name.len),
                      name.p, names);
    }
    const tf_fn_info *f = &fns[fn];
    c->fn = fn;
    c->loc = loc_of(p, &name);
    c->nattr = f->nattrs;
    if (!(c->attrs = tf_arena_array(&p->m->arena, (size_t)(f->nattrs ? f->nattrs : 1), sizeof(tf_attr)))) return oom(p);
    advance(p);
    if (p->tok.kind != TK_LPAREN) {
        if (bare) return check_required(p, f->name, f->attrs, f->nattrs, c->attrs, &name);
        return expected(p, "'(' after the function name");
    }
    advance(p);
    int pos = 0;
    bool keyed = false;
    while (p->tok.kind != TK_RPAREN) {
        tf_token at = p->tok;
        if (at_key(p)) {
            if (parse_attr_kv(p, f->name, f->attrs, f->nattrs, c->attrs)) return FAIL(p);
            keyed = true;
        } else {
            if (p->tok.kind == TK_ERROR) return FAIL(p);
            if (keyed) return err_at(p, &at, "positional arguments must come before key=value ones");
            if (pos >= f->nattrs)
                return err_at(p, &at, "%s takes at most %d argument%s", f->name, f->nattrs, f->nattrs == 1 ? "" : "s");
            if (finish_attr(p, &f->attrs[pos], &c->attrs[pos])) return FAIL(p);
            pos++;
        }
        if (p->tok.kind == TK_COMMA) advance(p);
        else if (p->tok.kind != TK_RPAREN) return expected(p, "',' or ')'");
    }
    advance(p);
    return check_required(p, f->name, f->attrs, f->nattrs, c->attrs, &name);
}

/* ---- statements ---- */

static tf_ir_status check_new_name(parser *p, const tf_token *t)
{
    if (t->kind != TK_IDENT) return expected(p, "a name");
    if (is_keyword(t)) return err_at(p, t, "'%.*s' is a keyword and cannot name a value", (int)t->len, t->p);
    tf_value *old = tf_module_find_valuen(p->m, t->p, t->len);
    if (old)
        return err_at(p, t, "redefinition of '%.*s' (first defined at line %d)", (int)t->len, t->p, old->loc.line);
    int k = tf_module_find_dim(p->m, t->p, t->len);
    if (k >= 0) return err_at(p, t, "'%.*s' is already a dim (line %d)", (int)t->len, t->p, p->m->dims[k].loc.line);
    if (tok_is(t, "inf") || tok_is(t, "nan") || tok_is(t, "true") || tok_is(t, "false"))
        return err_at(p, t, "'%.*s' is a literal and cannot name a value", (int)t->len, t->p);
    for (int i = 0; i < p->m->noutputs; i++)   /* `output h = x` took the name h */
        if (strlen(p->m->outputs[i].name) == t->len && !memcmp(p->m->outputs[i].name, t->p, t->len))
            return err_at(p, t, "'%.*s' is already the name of an output (line %d)", (int)t->len, t->p,
                          p->m->outputs[i].loc.line);
    return TF_IR_OK;
}

static tf_ir_status parse_dim(parser *p)
{
    tf_token name = p->tok;
    if (check_new_name(p, &name)) return FAIL(p);
    advance(p);
    if (expect(p, TK_EQ, "'=' after the dim name")) return FAIL(p);
    if (p->tok.kind != TK_INT) return expected(p, "the dim's size (a positive integer)");
    int64_t v = p->tok.ival;
    if (v < 1) return err_at(p, &p->tok, "dim %.*s must be positive, found %lld", (int)name.len, name.p, (long long)v);
    if (v > TF_MAX_DIM) return err_at(p, &p->tok, "dim %.*s = %lld is larger than the limit 2^40", (int)name.len, name.p, (long long)v);
    for (int i = 0; i < p->nover; i++)
        if (strlen(p->over[i].name) == name.len && !memcmp(p->over[i].name, name.p, name.len)) {
            v = p->over[i].value;
            p->over_used[i] = true;
        }
    advance(p);
    char nm[300];
    snprintf(nm, sizeof nm, "%.*s", (int)name.len, name.p);
    return tf_module_add_dim(p->m, nm, v, loc_of(p, &name)) ? oom(p) : TF_IR_OK;
}

static tf_ir_status parse_decl(parser *p, tf_value_kind kind)
{
    tf_token name = p->tok;
    if (check_new_name(p, &name)) return FAIL(p);
    advance(p);
    if (expect(p, TK_COLON, "':' and a type after the name")) return FAIL(p);
    tf_value *v = tf_arena_alloc(&p->m->arena, sizeof *v);
    if (!v || !(v->name = tok_str(p, &name))) return oom(p);
    v->kind = kind;
    v->loc = loc_of(p, &name);
    if (parse_type(p, &v->type)) return FAIL(p);
    v->init.fn = -1;
    if (p->tok.kind == TK_EQ) {
        if (kind == TF_VAL_INPUT) return err_at(p, &p->tok, "an input takes no initializer; it is fed at run time");
        advance(p);
        if (parse_call(p, "initializer", tf_init_fns, TF_INIT_COUNT, &v->init, false)) return FAIL(p);
    } else if (kind != TF_VAL_INPUT) {
        /* no initializer: zeros, printed explicitly */
        v->init.fn = TF_INIT_ZEROS;
        v->init.loc = v->loc;
    }
    if (tf_module_add_name(p->m, v) || tf_vec_push(p->m, &p->m->decls, v)) return oom(p);
    return TF_IR_OK;
}

static tf_ir_status parse_operand(parser *p, tf_value **out)
{
    tf_token t = p->tok;
    if (t.kind == TK_INT || t.kind == TK_FLOAT || tok_is(&t, "inf") || tok_is(&t, "nan")) {
        double v = t.kind == TK_IDENT ? (t.p[0] == 'i' ? INFINITY : NAN) : t.fval;
        /* The lexer read the integer exactly; a number operand is held as a
         * float64, so one it cannot hold exactly is refused here rather than
         * silently rounded (9007199254740993 would become ...992). */
        if (t.kind == TK_INT && !(v < 0x1p63 && (int64_t)v == t.ival))
            return err_at(p, &t, "integer %lld cannot be an operand: number operands are held as float64, which is "
                          "exact only up to 2^53 (9007199254740992) in magnitude; it would become %.17g",
                          (long long)t.ival, v);
        tf_value *c = tf_const(p->m, v, t.kind == TK_INT ? TF_DT_I64 : TF_DT_F32);
        if (!c) return oom(p);
        c->loc = loc_of(p, &t);
        *out = c;
        advance(p);
        return TF_IR_OK;
    }
    if (t.kind != TK_IDENT) return expected(p, "an operand (a value name or a number)");
    tf_value *v = tf_module_find_valuen(p->m, t.p, t.len);
    if (!v) {
        if (tf_module_find_dim(p->m, t.p, t.len) >= 0)
            return err_at(p, &t, "'%.*s' is a dim, not a value; use it in a type or an attribute", (int)t.len, t.p);
        return err_at(p, &t, "undefined value '%.*s' (values must be defined before use)", (int)(t.len > 60 ? 60 : t.len), t.p);
    }
    *out = v;
    advance(p);
    return TF_IR_OK;
}

static tf_ir_status parse_op(parser *p)
{
    tf_token name = p->tok;
    if (check_new_name(p, &name)) return FAIL(p);
    advance(p);
    tf_node *n = tf_arena_alloc(&p->m->arena, sizeof *n);
    tf_value *out = tf_arena_alloc(&p->m->arena, sizeof *out);
    if (!n || !out || !(out->name = tok_str(p, &name))) return oom(p);
    if (p->tok.kind == TK_COLON) {
        advance(p);
        if (parse_type(p, &n->annot)) return FAIL(p);
        n->annotated = true;
    }
    if (expect(p, TK_EQ, "'=' after the value name")) return FAIL(p);
    tf_token opt = p->tok;
    if (opt.kind != TK_IDENT) return expected(p, "an op name");
    int op = tf_op_lookup(opt.p, opt.len);
    if (op < 0) {
        char hint[96];
        op_hint(&opt, hint, sizeof hint);
        return err_at(p, &opt, "unknown op '%.*s'%s", (int)(opt.len > 60 ? 60 : opt.len), opt.p, hint);
    }
    const tf_op_info *oi = tf_op_info_of(op);
    advance(p);
    if (expect(p, TK_LPAREN, "'(' after the op name")) return FAIL(p);
    tf_value *ins[64];
    int nin = 0;
    tf_attr *attrs = tf_arena_array(&p->m->arena, (size_t)(oi->nattrs ? oi->nattrs : 1), sizeof *attrs);
    if (!attrs) return oom(p);
    bool keyed = false;
    while (p->tok.kind != TK_RPAREN) {
        tf_token at = p->tok;
        if (at_key(p) && (tok_is(&at, "recompute") || tok_is(&at, "backward"))) {   /* any op: autodiff's marks */
            advance(p);
            advance(p);
            if (!tok_is(&p->tok, "true") && !tok_is(&p->tok, "false")) return expected(p, "true or false");
            *(tok_is(&at, "backward") ? &n->backward : &n->recompute) = p->tok.p[0] == 't';
            advance(p);
            keyed = true;
            goto next;
        }
        if (at_key(p)) {
            if (parse_attr_kv(p, oi->name, oi->attrs, oi->nattrs, attrs)) return FAIL(p);
            keyed = true;
            goto next;
        }
        if (keyed) return err_at(p, &at, "operands must come before key=value attributes");
        if (nin == 64) return err_at(p, &at, "%s takes at most %d operands", oi->name, oi->max_in);
        if (parse_operand(p, &ins[nin++])) return FAIL(p);
    next:
        if (p->tok.kind == TK_COMMA) advance(p);
        else if (p->tok.kind != TK_RPAREN) return expected(p, "',' or ')'");
    }
    advance(p);
    n->op = op;
    n->loc = loc_of(p, &opt);
    n->region = p->region;
    if (nin < oi->min_in || nin > oi->max_in) {
        if (oi->min_in == oi->max_in)
            return err_at(p, &opt, "%s takes %d operand%s, found %d", oi->name, oi->min_in, oi->min_in == 1 ? "" : "s", nin);
        return err_at(p, &opt, "%s takes %d to %d operands, found %d", oi->name, oi->min_in, oi->max_in, nin);
    }
    if (op == TF_OP_DROPOUT || op == TF_OP_DROPOUT_MASK) {
        /* each dropout draws its own mask: a missing salt becomes the op's
         * ordinal among random ops, written out so the dump keeps it */
        int k = tf_op_attr_index(op, "salt");
        if (attrs[k].kind == TF_ATTR_NONE) attrs[k] = tf_attr_int(++p->nrandom);
    }
    if (check_required(p, oi->name, oi->attrs, oi->nattrs, attrs, &opt)) return FAIL(p);
    n->nin = nin;
    if (!(n->in = tf_arena_array(&p->m->arena, (size_t)(nin ? nin : 1), sizeof *n->in))) return oom(p);
    memcpy(n->in, ins, (size_t)nin * sizeof *ins);
    n->attrs = attrs;
    n->out = out;
    out->kind = TF_VAL_NODE;
    out->def = n;
    out->loc = loc_of(p, &name);
    if (tf_module_add_name(p->m, out) || tf_module_append_node(p->m, n)) return oom(p);
    return TF_IR_OK;
}

static tf_ir_status parse_output(parser *p)
{
    tf_token name = p->tok;
    if (name.kind != TK_IDENT) return expected(p, "the output's name");
    advance(p);
    tf_token vt = name;
    if (p->tok.kind == TK_EQ) {
        advance(p);
        vt = p->tok;
        if (vt.kind != TK_IDENT) return expected(p, "the value the output names");
        advance(p);
    }
    tf_value *v = tf_module_find_valuen(p->m, vt.p, vt.len);
    if (!v) return err_at(p, &vt, "undefined value '%.*s' in output", (int)(vt.len > 60 ? 60 : vt.len), vt.p);
    for (int i = 0; i < p->m->noutputs; i++)
        if (strlen(p->m->outputs[i].name) == name.len && !memcmp(p->m->outputs[i].name, name.p, name.len))
            return err_at(p, &name, "output '%.*s' declared twice (first at line %d)", (int)name.len, name.p,
                          p->m->outputs[i].loc.line);
    if (vt.p != name.p) {
        tf_value *clash = tf_module_find_valuen(p->m, name.p, name.len);
        if (clash && clash != v)
            return err_at(p, &name, "output name '%.*s' is already the name of another value (line %d)", (int)name.len,
                          name.p, clash->loc.line);
    }
    char nm[300];
    snprintf(nm, sizeof nm, "%.*s", (int)name.len, name.p);
    return tf_module_add_output(p->m, nm, v, loc_of(p, &name)) ? oom(p) : TF_IR_OK;
}

static tf_ir_status parse_update(parser *p)
{
    tf_token bt = p->tok;
    if (bt.kind != TK_IDENT) return expected(p, "the buffer to update");
    tf_value *b = tf_module_find_valuen(p->m, bt.p, bt.len);
    if (!b || (b->kind != TF_VAL_BUFFER && b->kind != TF_VAL_PARAM))
        return err_at(p, &bt, "update: '%.*s' is not a buffer or param (the state a step may change)",
                      (int)(bt.len > 60 ? 60 : bt.len), bt.p);
    advance(p);
    if (expect(p, TK_EQ, "'=' after the buffer")) return FAIL(p);
    tf_token vt = p->tok;
    if (vt.kind != TK_IDENT) return expected(p, "the new value's name");
    tf_value *v = tf_module_find_valuen(p->m, vt.p, vt.len);
    if (!v) return err_at(p, &vt, "undefined value '%.*s' in update", (int)(vt.len > 60 ? 60 : vt.len), vt.p);
    advance(p);
    return tf_module_add_update(p->m, b, v, loc_of(p, &bt)) ? oom(p) : TF_IR_OK;
}

static tf_ir_status parse_train(parser *p, const tf_token *kw)
{
    tf_train *tr = &p->m->train;
    if (tr->present) return err_at(p, kw, "a second train block (the first is at line %d)", tr->loc.line);
    tr->present = true;
    tr->loc = loc_of(p, kw);
    if (expect(p, TK_LBRACE, "'{' after 'train'")) return FAIL(p);
    for (;;) {
        if (p->tok.kind == TK_NEWLINE) { advance(p); continue; }
        if (p->tok.kind == TK_RBRACE) { advance(p); return TF_IR_OK; }
        if (p->tok.kind == TK_EOF)
            return err_at(p, &p->tok, "unterminated train block (opened at line %d): expected '}'", tr->loc.line);
        tf_token key = p->tok;
        if (key.kind != TK_IDENT) return expected(p, "a train key (optimizer, schedule, precision, clip_grad_norm, accumulate, metrics) or '}'");
        advance(p);
        if (expect(p, TK_EQ, "'=' after the key")) return FAIL(p);
        tf_token vt = p->tok;
        if (tok_is(&key, "optimizer")) {
            if (tr->optimizer.fn >= 0) return err_at(p, &key, "optimizer given twice");
            if (parse_call(p, "optimizer", tf_optimizer_fns, TF_OPT_COUNT, &tr->optimizer, true)) return FAIL(p);
        } else if (tok_is(&key, "schedule")) {
            if (tr->schedule.fn >= 0) return err_at(p, &key, "schedule given twice");
            if (parse_call(p, "schedule", tf_schedule_fns, TF_SCHED_COUNT, &tr->schedule, true)) return FAIL(p);
        } else if (tok_is(&key, "precision")) {
            if (tr->has_precision) return err_at(p, &key, "precision given twice");
            if (tok_is(&vt, "fp32")) tr->precision = TF_PREC_FP32;
            else if (tok_is(&vt, "fp16")) tr->precision = TF_PREC_FP16;
            else if (tok_is(&vt, "bf16")) tr->precision = TF_PREC_BF16;
            else return expected(p, "fp32, fp16 or bf16");
            tr->has_precision = true;
            advance(p);
        } else if (tok_is(&key, "clip_grad_norm")) {
            if (tr->has_clip) return err_at(p, &key, "clip_grad_norm given twice");
            if (vt.kind != TK_INT && vt.kind != TK_FLOAT) return expected(p, "a number");
            if (!(vt.fval > 0) || isinf(vt.fval)) return err_at(p, &vt, "clip_grad_norm must be a positive finite number, found %g", vt.fval);
            tr->clip_grad_norm = vt.fval;
            tr->has_clip = true;
            advance(p);
        } else if (tok_is(&key, "accumulate")) {
            if (tr->has_accumulate) return err_at(p, &key, "accumulate given twice");
            if (vt.kind != TK_INT) return expected(p, "an integer number of micro-batches");
            if (vt.ival < 1 || vt.ival > 1000000) return err_at(p, &vt, "accumulate must be in [1, 1000000], found %lld", (long long)vt.ival);
            tr->accumulate = vt.ival;
            tr->has_accumulate = true;
            advance(p);
        } else if (tok_is(&key, "metrics")) {   /* output names; tf_verify checks they are scalar outputs */
            if (tr->nmetrics) return err_at(p, &key, "metrics given twice");
            for (;;) {
                tf_token nt = p->tok;
                if (nt.kind != TK_IDENT) return expected(p, "the name of an output (a metric)");
                for (int i = 0; i < tr->nmetrics; i++)
                    if (strlen(tr->metrics[i]) == nt.len && !memcmp(tr->metrics[i], nt.p, nt.len))
                        return err_at(p, &nt, "metric '%.*s' named twice", (int)(nt.len > 60 ? 60 : nt.len), nt.p);
                if (tr->nmetrics == 64) return err_at(p, &nt, "more than 64 metrics");
                if (!tr->metrics && (!(tr->metrics = tf_arena_array(&p->m->arena, 64, sizeof *tr->metrics)) ||
                                     !(tr->metric_locs = tf_arena_array(&p->m->arena, 64, sizeof *tr->metric_locs))))
                    return oom(p);
                char nm[256];
                snprintf(nm, sizeof nm, "%.*s", (int)(nt.len > 255 ? 255 : nt.len), nt.p);
                if (!(tr->metrics[tr->nmetrics] = tf_arena_strdup(&p->m->arena, nm))) return oom(p);
                tr->metric_locs[tr->nmetrics++] = loc_of(p, &nt);
                advance(p);
                if (p->tok.kind != TK_COMMA) break;
                advance(p);
            }
        } else {
            return err_at(p, &key, "unknown train key '%.*s'; expected one of: optimizer, schedule, precision, clip_grad_norm, "
                          "accumulate, metrics", (int)(key.len > 60 ? 60 : key.len), key.p);
        }
        if (p->tok.kind != TK_NEWLINE && p->tok.kind != TK_RBRACE) return expected(p, "end of line");
    }
}

/* A set of values (open addressing over pointers, in the arena): 1 when v
 * was added, 0 when it was there, -1 when out of memory. */
typedef struct yield_set { const tf_value **slots; size_t cap, n; } yield_set;

static size_t slot_of(const tf_value *v, size_t cap) { return (size_t)(((uintptr_t)v >> 4) * 0x9e3779b97f4a7c15ull) & (cap - 1); }

static int yield_set_add(tf_arena *a, yield_set *s, const tf_value *v)
{
    if (2 * (s->n + 1) > s->cap) {   /* at most half full */
        size_t cap = s->cap ? 2 * s->cap : 64;
        const tf_value **slots = tf_arena_array(a, cap, sizeof *slots);
        if (!slots) return -1;
        memset(slots, 0, cap * sizeof *slots);
        for (size_t i = 0; i < s->cap; i++)
            if (s->slots[i]) {
                size_t k = slot_of(s->slots[i], cap);
                while (slots[k]) k = (k + 1) & (cap - 1);
                slots[k] = s->slots[i];
            }
        s->slots = slots;
        s->cap = cap;
    }
    size_t k = slot_of(v, s->cap);
    for (; s->slots[k]; k = (k + 1) & (s->cap - 1))
        if (s->slots[k] == v) return 0;
    s->slots[k] = v;
    s->n++;
    return 1;
}

static tf_ir_status parse_region(parser *p, const tf_token *kw)
{
    tf_token name = p->tok;
    if (name.kind != TK_IDENT) return expected(p, "the region's name");
    for (int i = 0; i < p->m->nregions; i++)
        if (strlen(p->m->regions[i].name) == name.len && !memcmp(p->m->regions[i].name, name.p, name.len))
            return err_at(p, &name, "region '%.*s' defined twice", (int)name.len, name.p);
    advance(p);
    tf_region_kind kind = TF_REGION_POINTWISE;
    if (tok_is(&p->tok, "kind")) {
        advance(p);
        if (expect(p, TK_EQ, "'=' after 'kind'")) return FAIL(p);
        int k = -1;
        for (int i = 0; i < TF_REGION_KIND_COUNT; i++)
            if (tok_is(&p->tok, tf_region_kind_name((tf_region_kind)i))) k = i;
        if (k < 0) return expected(p, "a region kind (pointwise, reduction, gemm, multi)");
        kind = (tf_region_kind)k;
        advance(p);
    }
    bool wide = false;   /* numerics=fast: tf_node_wide */
    if (tok_is(&p->tok, "numerics")) {
        advance(p);
        if (expect(p, TK_EQ, "'=' after 'numerics'")) return FAIL(p);
        if (!tok_is(&p->tok, "fast") && !tok_is(&p->tok, "exact")) return expected(p, "a numerics mode (fast or exact)");
        wide = tok_is(&p->tok, "fast");
        advance(p);
    }
    if (expect(p, TK_LBRACE, "'{' to open the region")) return FAIL(p);
    char nm[300];
    snprintf(nm, sizeof nm, "%.*s", (int)name.len, name.p);
    int id = tf_module_add_region(p->m, nm, kind, loc_of(p, &name));
    if (!id) return oom(p);
    p->m->regions[id - 1].wide = wide;
    p->region = id;
    /* yields: as many as the region defines (a multi-tensor region of a large model yields thousands);
     * in the module's arena, so that no error below has anything to free */
    tf_value **yields = NULL;
    int ny = 0, cap = 0;
    yield_set seen = {0};   /* what is yielded already: a second yield of it is an error */
    bool yielded = false, any = false;
    for (;;) {
        if (p->tok.kind == TK_NEWLINE) { advance(p); continue; }
        if (p->tok.kind == TK_EOF)
            return err_at(p, &p->tok, "unterminated region %s (opened at line %d): expected '}'", nm, kw->line);
        if (p->tok.kind == TK_RBRACE) {
            if (!yielded) return err_at(p, &p->tok, "region %s ends without 'yield'", nm);
            advance(p);
            break;
        }
        if (yielded) return expected(p, "'}' after the yield");
        if (tok_is(&p->tok, "yield")) {
            if (!any) return err_at(p, &p->tok, "region %s is empty", nm);
            advance(p);
            while (p->tok.kind == TK_IDENT) {
                tf_token vt = p->tok;
                tf_value *v = tf_module_find_valuen(p->m, vt.p, vt.len);
                if (!v || v->kind != TF_VAL_NODE || v->def->region != id)
                    return err_at(p, &vt, "region %s can only yield values it defines; '%.*s' is not one", nm,
                                  (int)(vt.len > 60 ? 60 : vt.len), vt.p);
                int added = yield_set_add(&p->m->arena, &seen, v);
                if (added <= 0) return added < 0 ? oom(p) : err_at(p, &vt, "'%s' is yielded twice", v->name);
                if (ny == cap) {
                    tf_value **more = tf_arena_array(&p->m->arena, (size_t)(cap ? 2 * cap : 16), sizeof *more);
                    if (!more) return oom(p);
                    if (ny) memcpy(more, yields, (size_t)ny * sizeof *yields);
                    yields = more;
                    cap = cap ? 2 * cap : 16;
                }
                yields[ny++] = v;
                advance(p);
                if (p->tok.kind != TK_COMMA) break;
                advance(p);
            }
            if (p->tok.kind != TK_NEWLINE) return expected(p, "a value name to yield, or end of line");
            yielded = true;
            continue;
        }
        if (tok_is(&p->tok, "region")) return err_at(p, &p->tok, "regions do not nest");
        if (is_keyword(&p->tok)) return expected(p, "an op (NAME = op(...)), 'yield' or '}' inside a region");
        if (parse_op(p)) return FAIL(p);
        any = true;
        if (p->tok.kind != TK_NEWLINE) return expected(p, "end of line (one statement per line)");
    }
    p->region = 0;
    tf_region *rg = &p->m->regions[id - 1];
    rg->kind = kind;
    rg->nyields = ny;
    rg->yields = yields;
    return TF_IR_OK;
}

static tf_ir_status parse_statement(parser *p, bool *seen_stmt)
{
    tf_token t = p->tok;
    if (t.kind != TK_IDENT) return expected(p, "a statement (module, dim, input, param, buffer, output, update, train, or NAME = op(...))");
    bool first = !*seen_stmt;
    *seen_stmt = true;
    if (is_keyword(&t)) {   /* `output = relu(x)`: a keyword where a value name was meant */
        tf_lexer save = p->lx;
        tf_diag dsave = *p->d;
        advance(p);
        bool defines = p->tok.kind == TK_EQ || p->tok.kind == TK_COLON;
        p->lx = save;
        p->tok = t;
        *p->d = dsave;
        if (defines) return err_at(p, &t, "'%.*s' is a keyword and cannot name a value", (int)t.len, t.p);
    }
    if (tok_is(&t, "module")) {
        if (!first) return err_at(p, &t, p->m->name ? "a second 'module' statement: a file holds one module"
                                                    : "'module' must be the first statement");
        advance(p);
        if (p->tok.kind != TK_IDENT) return expected(p, "the module's name");
        if (!(p->m->name = tok_str(p, &p->tok))) return oom(p);
        advance(p);
        return TF_IR_OK;
    }
    if (tok_is(&t, "dim")) { advance(p); return parse_dim(p); }
    if (tok_is(&t, "input")) { advance(p); return parse_decl(p, TF_VAL_INPUT); }
    if (tok_is(&t, "param")) { advance(p); return parse_decl(p, TF_VAL_PARAM); }
    if (tok_is(&t, "buffer")) { advance(p); return parse_decl(p, TF_VAL_BUFFER); }
    if (tok_is(&t, "output")) { advance(p); return parse_output(p); }
    if (tok_is(&t, "update")) { advance(p); return parse_update(p); }
    if (tok_is(&t, "train")) { advance(p); return parse_train(p, &t); }
    if (tok_is(&t, "region")) { advance(p); return parse_region(p, &t); }
    if (tok_is(&t, "yield")) return err_at(p, &t, "'yield' outside a region");
    return parse_op(p);
}

/* The smallest magnitude that rounds to inf in a floating dtype (the largest
 * finite value plus half a unit in its last place); f64 literals the lexer
 * has already range-checked. */
static double inf_threshold(tf_dt dt, double *largest)
{
    switch (dt) {
    case TF_DT_F32: *largest = 0x1.fffffep127; return 0x1.ffffffp127;
    case TF_DT_F16: *largest = 65504; return 65520;
    case TF_DT_BF16: *largest = 0x1.fep127; return 0x1.ffp127;
    default: *largest = INFINITY; return INFINITY;
    }
}

/* The shortest text that reads back as v (1e+39, not 9.9999999999999994e+38). */
static void shortest(double v, char *buf, size_t n)
{
    if (v == trunc(v) && fabs(v) < 1e16) {
        snprintf(buf, n, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static tf_ir_status literal_too_big(tf_diag *d, const tf_loc *at, const char *what, double v, tf_dt dt)
{
    double largest, lim = inf_threshold(dt, &largest);
    char vs[32], ls[32];
    if (!isfinite(v) || fabs(v) < lim) return TF_IR_OK;
    shortest(v, vs, sizeof vs);
    snprintf(ls, sizeof ls, "%.9g", largest);
    return tf_diag_error(d, TF_IR_ERR_VERIFY, at, "%s %s is outside %s's range (finite values are within +-%s): it would "
                         "become %sinf; write %sinf if that is meant", what, vs, tf_dtype_name(dt), ls,
                         v < 0 ? "-" : "", v < 0 ? "-" : "");
}

/* After verification, when every number operand has its op's dtype: a
 * finite literal that the dtype cannot hold (1e39 as f32, 70000 as f16) is
 * an error at the literal, not a silent inf. The same for the values a
 * const() or uniform() initializer writes into a param or buffer. inf, -inf
 * and nan written as such stay allowed. */
static tf_ir_status check_float_literals(tf_module *m, tf_diag *d)
{
    for (int i = 0; i < m->decls.n; i++) {
        const tf_value *v = m->decls.items[i];
        if (!tf_dtype_is_float(v->type.dtype) || (v->init.fn != TF_INIT_CONST && v->init.fn != TF_INIT_UNIFORM))
            continue;
        const tf_fn_info *f = &tf_init_fns[v->init.fn];
        for (int k = 0; k < f->nattrs && k < v->init.nattr; k++) {
            char what[96];
            snprintf(what, sizeof what, "%s(%s=...): the value", f->name, f->attrs[k].name);
            if (v->init.attrs[k].kind == TF_ATTR_FLOAT &&
                literal_too_big(d, &v->init.loc, what, v->init.attrs[k].u.f, v->type.dtype))
                return d->status;
        }
    }
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        for (int k = 0; k < n->nin; k++) {
            const tf_value *c = n->in[k];
            if (c->kind == TF_VAL_CONST && tf_dtype_is_float(c->type.dtype) &&
                literal_too_big(d, &c->loc, "the number", c->cval, c->type.dtype))
                return d->status;
        }
    }
    return TF_IR_OK;
}

tf_ir_status tf_parse(const char *file, const char *src, size_t len, const tf_dim_set *dims, int ndims,
                      tf_module **out, tf_diag *d)
{
    *out = NULL;
    if (!file) file = "<input>";
    if (len > TF_MAX_SOURCE_BYTES) {
        tf_loc l = {file, 0, 0};
        return tf_diag_error(d, TF_IR_ERR_LIMIT, &l, "source is %zu bytes, more than the limit of %zu", len,
                             TF_MAX_SOURCE_BYTES);
    }
    parser p = {0};
    p.m = tf_module_create(file);
    p.d = d;
    p.over = dims;
    p.nover = ndims;
    p.over_used = tf_calloc((size_t)(ndims > 0 ? ndims : 1), sizeof *p.over_used);
    if (!p.m || !p.over_used) {
        tf_module_free(p.m);
        tf_free(p.over_used);
        return tf_diag_error(d, TF_IR_ERR_OOM, NULL, "out of memory");
    }
    for (int i = 0; i < ndims; i++)
        if (dims[i].value < 1 || dims[i].value > TF_MAX_DIM) {
            tf_loc l = {file, 0, 0};
            tf_diag_error(d, TF_IR_ERR_VERIFY, &l, "--dim %s=%lld: a dim must be in [1, 2^40]", dims[i].name,
                          (long long)dims[i].value);
            goto fail;
        }
    tf_lexer_init(&p.lx, p.m->file, src, len, d);
    advance(&p);
    bool seen = false;
    while (p.tok.kind != TK_EOF) {
        if (p.tok.kind == TK_ERROR) goto fail;
        if (p.tok.kind == TK_NEWLINE) { advance(&p); continue; }
        if (parse_statement(&p, &seen)) goto fail;
        if (p.tok.kind != TK_NEWLINE && p.tok.kind != TK_EOF) {
            expected(&p, "end of line (one statement per line)");
            goto fail;
        }
    }
    for (int i = 0; i < ndims; i++)
        if (!p.over_used[i]) {
            tf_loc l = {file, 0, 0};
            tf_diag_error(d, TF_IR_ERR_VERIFY, &l, "--dim %s: the module declares no dim named '%s'", dims[i].name,
                          dims[i].name);
            goto fail;
        }
    if (!seen) {
        tf_loc l = {p.m->file, 1, 1};
        tf_diag_error(d, TF_IR_ERR_SYNTAX, &l, "the model is empty: %s; expected statements such as "
                      "'module NAME', 'input x : f32[4]', 'y = relu(x)', 'output y'",
                      len ? "it holds only comments and blank lines" : "the file has no text");
        goto fail;
    }
    tf_free(p.over_used);
    if (tf_verify(p.m, d) || check_float_literals(p.m, d)) {
        tf_module_free(p.m);
        return d->status;
    }
    *out = p.m;
    return TF_IR_OK;
fail:
    tf_free(p.over_used);
    tf_module_free(p.m);
    return d->status ? d->status : TF_IR_ERR_SYNTAX;
}
