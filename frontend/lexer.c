/* lexer.c — see lexer.h. */
#include "lexer.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_IDENT = 256, MAX_NUMBER = 64, MAX_STRING = 4096 };

void tf_lexer_init(tf_lexer *lx, const char *file, const char *src, size_t len, tf_diag *d)
{
    lx->src = lx->cur = lx->line_start = src;
    lx->end = src + len;
    lx->file = file;
    lx->line = 1;
    lx->diag = d;
}

static int col_of(const tf_lexer *lx, const char *p) { return (int)(p - lx->line_start) + 1; }

static tf_token error_at(tf_lexer *lx, const char *p, const char *fmt, const char *arg)
{
    tf_loc loc = {lx->file, lx->line, col_of(lx, p)};
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    tf_diag_error(lx->diag, TF_IR_ERR_SYNTAX, &loc, "%s", msg);
    return (tf_token){.kind = TK_ERROR, .p = p, .line = lx->line, .col = col_of(lx, p)};
}

static bool ident_start(int c) { return isalpha(c) || c == '_'; }
static bool ident_char(int c) { return isalnum(c) || c == '_' || c == '.'; }

static tf_token bad_byte(tf_lexer *lx, const char *p)
{
    unsigned char c = (unsigned char)*p;
    char what[64];
    if (c == 0) snprintf(what, sizeof what, "NUL byte");
    else if (c >= 0x80) snprintf(what, sizeof what, "byte 0x%02x (non-ASCII; allowed only in comments and strings)", c);
    else if (c < 0x20 || c == 0x7f) snprintf(what, sizeof what, "control byte 0x%02x", c);
    else snprintf(what, sizeof what, "'%c'", c);
    return error_at(lx, p, "unexpected %s", what);
}

static tf_token lex_number(tf_lexer *lx, const char *start)
{
    const char *p = start;
    tf_token t = {.p = start, .line = lx->line, .col = col_of(lx, start)};
    if (*p == '-') p++;
    bool is_float = false;
    while (p < lx->end && isdigit((unsigned char)*p)) p++;
    if (p < lx->end && *p == '.') {
        is_float = true;
        p++;
        while (p < lx->end && isdigit((unsigned char)*p)) p++;
    }
    if (p < lx->end && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (q < lx->end && (*q == '+' || *q == '-')) q++;
        if (q < lx->end && isdigit((unsigned char)*q)) {
            is_float = true;
            p = q;
            while (p < lx->end && isdigit((unsigned char)*p)) p++;
        }
    }
    if (p < lx->end && ident_char((unsigned char)*p)) {
        const char *q = p;
        while (q < lx->end && ident_char((unsigned char)*q)) q++;
        char text[48];
        snprintf(text, sizeof text, "%.*s", (int)(q - start > 40 ? 40 : q - start), start);
        return error_at(lx, start, "malformed number '%s'", text);
    }
    size_t len = (size_t)(p - start);
    if (len > MAX_NUMBER) return error_at(lx, start, "number literal longer than %s characters", "64");
    char buf[MAX_NUMBER + 1];
    memcpy(buf, start, len);
    buf[len] = 0;
    if (!strcmp(buf, "-") || !strcmp(buf, ".") || !strcmp(buf, "-."))
        return error_at(lx, start, "malformed number '%s'", buf);
    errno = 0;
    if (is_float) {
        t.kind = TK_FLOAT;
        t.fval = strtod(buf, NULL);
        if (errno == ERANGE && isinf(t.fval)) return error_at(lx, start, "number '%s' overflows a double", buf);
    } else {
        t.kind = TK_INT;
        t.ival = strtoll(buf, NULL, 10);
        if (errno == ERANGE) return error_at(lx, start, "integer '%s' does not fit in 64 bits", buf);
        t.fval = (double)t.ival;
    }
    t.len = len;
    lx->cur = p;
    return t;
}

tf_token tf_lexer_next(tf_lexer *lx)
{
    const char *p = lx->cur;
    for (;;) {
        while (p < lx->end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
        if (p < lx->end && *p == '#') {
            while (p < lx->end && *p != '\n') {
                if (*p == 0) { lx->cur = p; return bad_byte(lx, p); }
                p++;
            }
            continue;
        }
        break;
    }
    tf_token t = {.p = p, .len = 1, .line = lx->line, .col = col_of(lx, p)};
    if (p >= lx->end) {
        t.kind = TK_EOF;
        t.len = 0;
        lx->cur = p;
        return t;
    }
    unsigned char c = (unsigned char)*p;
    if (c == '\n') {
        t.kind = TK_NEWLINE;
        lx->cur = p + 1;
        lx->line++;
        lx->line_start = lx->cur;
        return t;
    }
    if (ident_start(c)) {
        const char *q = p;
        while (q < lx->end && ident_char((unsigned char)*q)) q++;
        if (q - p > MAX_IDENT) return error_at(lx, p, "identifier longer than %s characters", "256");
        t.kind = TK_IDENT;
        t.len = (size_t)(q - p);
        lx->cur = q;
        return t;
    }
    if (isdigit(c) || ((c == '-' || c == '.') && p + 1 < lx->end && (isdigit((unsigned char)p[1]) || p[1] == '.')))
        return lex_number(lx, p);
    if (c == '-' && lx->end - p >= 4 && !memcmp(p + 1, "inf", 3) &&
        (lx->end - p == 4 || !ident_char((unsigned char)p[4]))) {
        t.kind = TK_FLOAT;
        t.fval = -INFINITY;
        t.len = 4;
        lx->cur = p + 4;
        return t;
    }
    if (c == '"') {
        const char *q = p + 1;
        while (q < lx->end && *q != '"') {
            if (*q == '\n' || *q == 0) break;
            if (*q == '\\' && q + 1 < lx->end && q[1] != '\n') q++;
            q++;
        }
        if (q >= lx->end || *q != '"') return error_at(lx, p, "unterminated string%s", "");
        if (q - p - 1 > MAX_STRING) return error_at(lx, p, "string longer than %s characters", "4096");
        t.kind = TK_STRING;
        t.p = p + 1;
        t.len = (size_t)(q - p - 1);
        lx->cur = q + 1;
        return t;
    }
    static const char punct[] = "()[]{},=:";
    static const tf_tok_kind kinds[] = {TK_LPAREN, TK_RPAREN, TK_LBRACK, TK_RBRACK, TK_LBRACE,
                                        TK_RBRACE, TK_COMMA,  TK_EQ,     TK_COLON};
    const char *at = c ? strchr(punct, c) : NULL;
    if (at) {
        t.kind = kinds[at - punct];
        lx->cur = p + 1;
        return t;
    }
    lx->cur = p;
    return bad_byte(lx, p);
}

const char *tf_tok_kind_name(tf_tok_kind k)
{
    static const char *names[] = {"end of file", "end of line", "a name", "an integer", "a number", "a string",
                                  "'('", "')'", "'['", "']'", "'{'", "'}'", "','", "'='", "':'", "an error"};
    return names[k];
}

void tf_tok_describe(const tf_token *t, char *buf, size_t n)
{
    switch (t->kind) {
    case TK_IDENT: case TK_INT: case TK_FLOAT:
        snprintf(buf, n, "'%.*s'", (int)(t->len > 60 ? 60 : t->len), t->p);
        break;
    case TK_STRING:
        snprintf(buf, n, "string \"%.*s\"", (int)(t->len > 60 ? 60 : t->len), t->p);
        break;
    default: snprintf(buf, n, "%s", tf_tok_kind_name(t->kind));
    }
}
