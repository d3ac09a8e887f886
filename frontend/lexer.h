/* lexer.h — tokens of the tfuse text format.
 *
 * Newlines are tokens: a statement is one line. `#` starts a comment to the
 * end of the line. Identifiers may contain dots (`layer1.w`), as safetensors
 * names do. A number may carry a leading minus; `inf` and `nan` are numbers
 * where a number is expected, and the lexer hands them over as identifiers.
 * Bytes the format never uses (NUL, control characters, non-ASCII outside
 * comments and strings) are errors at their line:col. */
#ifndef TF_FRONTEND_LEXER_H
#define TF_FRONTEND_LEXER_H

#include <stddef.h>
#include <stdint.h>

#include "ir.h"

typedef enum tf_tok_kind {
    TK_EOF, TK_NEWLINE, TK_IDENT, TK_INT, TK_FLOAT, TK_STRING,
    TK_LPAREN, TK_RPAREN, TK_LBRACK, TK_RBRACK, TK_LBRACE, TK_RBRACE,
    TK_COMMA, TK_EQ, TK_COLON, TK_ERROR,
} tf_tok_kind;

typedef struct tf_token {
    tf_tok_kind kind;
    const char *p;       /* start in the source */
    size_t len;
    int line, col;
    int64_t ival;        /* TK_INT */
    double fval;         /* TK_FLOAT (and TK_INT as double) */
} tf_token;

typedef struct tf_lexer {
    const char *src, *end, *cur;
    const char *file;
    int line;
    const char *line_start;
    tf_diag *diag;
} tf_lexer;

void tf_lexer_init(tf_lexer *lx, const char *file, const char *src, size_t len, tf_diag *d);
/* Next token; TK_ERROR after filling the diag. */
tf_token tf_lexer_next(tf_lexer *lx);
const char *tf_tok_kind_name(tf_tok_kind k);
/* "'foo'", "end of line", "end of file": what a token is, for messages. */
void tf_tok_describe(const tf_token *t, char *buf, size_t n);

#endif
