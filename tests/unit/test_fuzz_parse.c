/* test_fuzz_parse.c — a deterministic mutation fuzzer of the text format,
 * through the public API only (tf_model_parse_string, tf_model_print,
 * tf_model_free).
 *
 * Each example model (mlp.ir, cnn.ir, transformer.ir from $TFUSE_EXAMPLES)
 * is mutated about 1000 times with a fixed-seed PRNG: bit flips, random
 * bytes, deleted and duplicated ranges, tokens from a small list of
 * troublemakers, numbers swapped for others (sizes, limits), whole
 * statements inserted, lines deleted, duplicated and moved, truncation.
 * Every mutant is parsed from a buffer of exactly its length (so ASan sees
 * any read past the end) and must either
 *   - parse (TF_OK); then its printed text must parse again and print to the
 *     identical text (printing is a fixed point), or
 *   - fail with TF_ERR_PARSE, TF_ERR_VERIFY or TF_ERR_LIMIT and one line of
 *     message "NAME:LINE:COL: error: ..." (LINE:COL inside the mutant) or
 *     "NAME: error: ...".
 * Crashes, leaks and undefined behaviour are caught by the sanitizer build.
 *
 * TFUSE_EXAMPLES defaults to the examples/ directory of the source tree.
 * TFUSE_FUZZ_ITERS overrides the number of mutants per example (default
 * 1000); TFUSE_FUZZ_SEED the seed. A failing mutant is written to
 * fuzz_fail_N.ir in the working directory for reproduction. */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tfuse.h"

/* ---- PRNG: splitmix64, fixed seed ---- */

static uint64_t rng_state = 0x7466757365ull;   /* "tfuse" */

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform-ish in [0, n); n > 0 */
static size_t rng_below(size_t n) { return (size_t)(rng_next() % n); }

/* ---- a growable byte buffer ---- */

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void buf_reserve(buf *b, size_t n)
{
    if (n <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    b->p = p;
    b->cap = cap;
}

static void buf_set(buf *b, const char *s, size_t n)
{
    buf_reserve(b, n ? n : 1);
    memcpy(b->p, s, n);
    b->n = n;
}

/* insert s[0..n) at position at */
static void buf_insert(buf *b, size_t at, const char *s, size_t n)
{
    buf_reserve(b, b->n + n);
    memmove(b->p + at + n, b->p + at, b->n - at);
    memcpy(b->p + at, s, n);
    b->n += n;
}

static void buf_erase(buf *b, size_t at, size_t n)
{
    memmove(b->p + at, b->p + at + n, b->n - at - n);
    b->n -= n;
}

/* ---- mutations ---- */

/* Tokens that tend to break things: brackets, separators, numbers at and
 * past the limits, dtypes, special floats, bytes the format forbids,
 * keywords, half statements. */
static const struct { const char *s; size_t n; } tokens[] = {
#define T(lit) {lit, sizeof lit - 1}
    T("("), T(")"), T("["), T("]"), T("{"), T("}"), T("="), T(","), T(":"), T(" "),
    T("-1"), T("0"), T("1"), T("2"), T("-0"), T("99999999999999999999"), T("1099511627777"),
    T("1e308"), T("1e999"), T("1.2.3"), T("12abc"), T("0.5"), T("-"), T("."),
    T("f16"), T("f32"), T("i64"), T("bool"), T("inf"), T("-inf"), T("nan"),
    T("\n"), T("\0"), T("\r"), T("\t"), T("\x01"), T("\x7f"), T("\xc3\xa9"), T("\""), T("\\"),
    T("relu("), T("#"), T("train {"), T("}\n"), T("module m\n"), T("dim B = 3\n"),
    T("input"), T("param"), T("buffer"), T("output"), T("update"), T("dim"),
    T("x"), T("h"), T("true"), T("false"), T("axis=0"), T("shape=[-1]"), T("perm=[1, 0]"),
    T("keepdims=true"), T("[[1]]"), T("[]"), T("= zeros()"), T(": f32[2, 3]"),
    T("output h = h\n"), T("update x = x\n"), T("h = relu(h)\n"),
#undef T
};
enum { NTOKENS = sizeof tokens / sizeof *tokens };

/* Whole statements, inserted at a line start: names the examples use (x, h,
 * a, lg, loss, g, x1, te, q) so that they clash, shadow or come too early. */
static const char *const statements[] = {
    "output a = x", "output lg = x", "output h = x", "output g = x", "output q = x", "output x = lg",
    "output loss", "output loss = lg", "output logits", "update x = x", "h = relu(x)", "z = add(x, x)",
    "z = reduce_sum(x, axes=[])", "z = reshape(x, shape=[-1])", "z = transpose(x, perm=[1, 0])",
    "z = cast(x, to=f16)", "z = slice(x, axis=0, start=1, end=-1)", "z = concat(x, x, axis=-1)",
    "z = matmul(x, x, transpose_b=true)", "z = softmax(x)", "z = where(x, x, x)", "z = iota(shape=[2, 3])",
    "dim B = 7", "dim Z = 3", "input z : f32[B]", "input z : i64[N]", "param z : f32[3] = normal()",
    "buffer z : f32[3] = zeros()", "buffer x1 : f32[3] = ones()", "update z = z", "train {", "}",
    "module m2", "te = embedding(x, x)", "z = linear(x, x)", "z = dropout(x, p=0.5)",
    "optimizer = sgd(lr=0.1)", "precision = fp16",
};
enum { NSTATEMENTS = sizeof statements / sizeof *statements };

/* [start, end) of the line holding byte `at` (without its '\n') */
static void line_bounds(const buf *b, size_t at, size_t *s, size_t *e)
{
    size_t i = at;
    while (i > 0 && b->p[i - 1] != '\n') i--;
    size_t j = at;
    while (j < b->n && b->p[j] != '\n') j++;
    *s = i;
    *e = j;
}

static void mutate_once(buf *b)
{
    size_t n = b->n;
    switch (rng_below(15)) {
    case 0:   /* flip one bit */
        if (n) b->p[rng_below(n)] ^= (char)(1u << rng_below(8));
        break;
    case 1:   /* overwrite a byte with a random one, often printable */
        if (n) {
            size_t at = rng_below(n);
            b->p[at] = rng_below(4) ? (char)(32 + rng_below(95)) : (char)rng_below(256);
        }
        break;
    case 2: { /* delete a range */
        if (!n) break;
        size_t at = rng_below(n), len = 1 + rng_below(rng_below(4) ? 8 : 64);
        if (len > n - at) len = n - at;
        buf_erase(b, at, len);
        break;
    }
    case 3: { /* duplicate a range somewhere */
        if (!n) break;
        size_t at = rng_below(n), len = 1 + rng_below(rng_below(4) ? 16 : 128);
        if (len > n - at) len = n - at;
        char tmp[128];
        memcpy(tmp, b->p + at, len);
        buf_insert(b, rng_below(b->n + 1), tmp, len);
        break;
    }
    case 4:
    case 5:
    case 6: { /* insert a token, at a random byte or next to a word boundary */
        size_t k = rng_below(NTOKENS), at = rng_below(n + 1);
        if (rng_below(2))
            while (at < n && (isalnum((unsigned char)b->p[at]) || b->p[at] == '_' || b->p[at] == '.')) at++;
        buf_insert(b, at, tokens[k].s, tokens[k].n);
        break;
    }
    case 7: { /* delete a whole line */
        if (!n) break;
        size_t s, e;
        line_bounds(b, rng_below(n), &s, &e);
        buf_erase(b, s, e < n ? e - s + 1 : e - s);
        break;
    }
    case 8: { /* duplicate a whole line somewhere else (at a line start) */
        if (!n) break;
        size_t s, e, s2, e2;
        line_bounds(b, rng_below(n), &s, &e);
        size_t len = e - s;
        char *tmp = malloc(len + 1);
        if (!tmp) exit(2);
        memcpy(tmp, b->p + s, len);
        tmp[len] = '\n';
        line_bounds(b, rng_below(n), &s2, &e2);
        buf_insert(b, s2, tmp, len + 1);
        free(tmp);
        break;
    }
    case 9: { /* swap two lines' order: move a line to another line start */
        if (!n) break;
        size_t s, e, s2, e2;
        line_bounds(b, rng_below(n), &s, &e);
        if (e >= n) break;   /* the last line has no '\n' to move with it */
        size_t len = e - s + 1;
        char *tmp = malloc(len);
        if (!tmp) exit(2);
        memcpy(tmp, b->p + s, len);
        buf_erase(b, s, len);
        line_bounds(b, b->n ? rng_below(b->n) : 0, &s2, &e2);
        buf_insert(b, s2, tmp, len);
        free(tmp);
        break;
    }
    case 10:  /* truncate */
        b->n = rng_below(n + 1);
        break;
    case 11:
    case 12: { /* replace a run of digits with another number: shapes, limits */
        static const char *const nums[] = {"0", "1", "2", "3", "4", "5", "7", "8", "16", "-1", "-2", "1000000",
                                           "1048576", "16777216", "1099511627776", "1099511627777",
                                           "9223372036854775807", "0.5", "1e-9"};
        if (!n) break;
        size_t at = rng_below(n), end = at;
        while (at < n && !isdigit((unsigned char)b->p[at])) at++;
        if (at == n) break;
        while (at > 0 && isdigit((unsigned char)b->p[at - 1])) at--;
        end = at;
        while (end < n && isdigit((unsigned char)b->p[end])) end++;
        char num[32];
        if (rng_below(3)) snprintf(num, sizeof num, "%d", 1 + (int)rng_below(64));
        else snprintf(num, sizeof num, "%s", nums[rng_below(sizeof nums / sizeof *nums)]);
        buf_erase(b, at, end - at);
        buf_insert(b, at, num, strlen(num));
        break;
    }
    case 13:
    case 14: { /* insert a whole statement at a line start */
        size_t s, e;
        line_bounds(b, n ? rng_below(n) : 0, &s, &e);
        const char *st = statements[rng_below(NSTATEMENTS)];
        buf_insert(b, s, "\n", 1);
        buf_insert(b, s, st, strlen(st));
        break;
    }
    }
}

/* ---- checks ---- */

static int nfail_files;

static void save_failure(const buf *b)
{
    if (nfail_files >= 10) return;
    char path[64];
    snprintf(path, sizeof path, "fuzz_fail_%d.ir", nfail_files++);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(b->p, 1, b->n, f);
    fclose(f);
    fprintf(stderr, "  (mutant saved to %s)\n", path);
}

/* Does msg read "NAME:LINE:COL: error: X" or "NAME: error: X" with X not
 * empty and no newline? LINE:COL must lie in text (col up to one past the
 * end of its line, line up to one past the last). */
static int message_ok(const char *msg, const char *name, const char *text, size_t len)
{
    size_t k = strlen(name);
    if (strncmp(msg, name, k) != 0 || msg[k] != ':') return 0;
    const char *p = msg + k + 1;
    if (strchr(p, '\n')) return 0;
    if (strncmp(p, " error: ", 8) == 0) return p[8] != 0;
    if (!isdigit((unsigned char)*p)) return 0;
    char *end;
    long line = strtol(p, &end, 10);
    if (*end != ':' || !isdigit((unsigned char)end[1])) return 0;
    long col = strtol(end + 1, &end, 10);
    if (strncmp(end, ": error: ", 9) != 0 || end[9] == 0) return 0;
    /* the position exists in the text */
    long ln = 1;
    size_t i = 0;
    while (ln < line && i < len) {
        if (text[i++] == '\n') ln++;
    }
    if (line < 1 || ln != line) return 0;
    size_t ll = 0;
    while (i + ll < len && text[i + ll] != '\n') ll++;
    return col >= 1 && (size_t)col <= ll + 1;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    buf b = {0};
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        buf_reserve(&b, b.n + got);
        memcpy(b.p + b.n, chunk, got);
        b.n += got;
    }
    fclose(f);
    *len = b.n;
    if (!b.p) b.p = calloc(1, 1);
    return b.p;
}

static long n_ok, n_rejected;

/* Parse one text; check the outcome. Returns 1 if the text was accepted. */
static int check_text(tf_context_t *ctx, const char *name, const buf *b, const tf_dim_override *dims, size_t ndims)
{
    /* an exact-size copy: a read past len is an ASan report */
    char *text = malloc(b->n ? b->n : 1);
    if (!text) exit(2);
    memcpy(text, b->p, b->n);
    tf_model_t *m = NULL;
    tf_status st = tf_model_parse_string(ctx, name, text, b->n, dims, ndims, &m);
    int accepted = 0;
    if (st == TF_OK) {
        CHECK(m != NULL, "%s: TF_OK without a model", name);
        char *p1 = NULL, *p2 = NULL;
        tf_model_t *m2 = NULL;
        tf_status s1 = m ? tf_model_print(ctx, m, &p1) : TF_ERR_INTERNAL;
        CHECK(s1 == TF_OK && p1, "%s: an accepted model does not print: %s", name, tf_context_last_error(ctx));
        if (s1 == TF_OK && p1) {
            tf_status s2 = tf_model_parse_string(ctx, "printed.ir", p1, strlen(p1), NULL, 0, &m2);
            CHECK(s2 == TF_OK, "%s: the printed text of an accepted model does not parse: %s\n--- printed:\n%s---",
                  name, tf_context_last_error(ctx), p1);
            if (s2 != TF_OK) save_failure(b);
            if (s2 == TF_OK) {
                tf_status s3 = tf_model_print(ctx, m2, &p2);
                CHECK(s3 == TF_OK && p2 && strcmp(p1, p2) == 0,
                      "%s: printing is not a fixed point\n--- first print:\n%s--- second print:\n%s---", name, p1,
                      p2 ? p2 : "(none)");
                if (!(s3 == TF_OK && p2 && strcmp(p1, p2) == 0)) save_failure(b);
            }
        }
        free(p1);
        free(p2);
        tf_model_free(m2);
        tf_model_free(m);
        n_ok++;
        accepted = 1;
    } else {
        const char *msg = tf_context_last_error(ctx);
        CHECK(m == NULL, "%s: failure left a model behind", name);
        int good_status = st == TF_ERR_PARSE || st == TF_ERR_VERIFY || st == TF_ERR_LIMIT;
        CHECK(good_status, "%s: bad input gave status '%s' (%s)", name, tf_status_name(st), msg);
        int good_msg = message_ok(msg, name, text, b->n);
        CHECK(good_msg, "%s: malformed or misplaced error message: \"%s\"", name, msg);
        if (!good_status || !good_msg) save_failure(b);
        n_rejected++;
    }
    free(text);
    return accepted;
}

/* $TFUSE_EXAMPLES, else the examples/ next to this source file (found from
 * __FILE__), else ./examples, ../examples, ../../examples. */
static const char *examples_dir(void)
{
    static char from_src[4096];
    const char *env = getenv("TFUSE_EXAMPLES");
    if (env && *env) return env;
    const char *slash = strrchr(__FILE__, '/');
    if (slash) {
        snprintf(from_src, sizeof from_src, "%.*s/../../examples", (int)(slash - __FILE__), __FILE__);
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/mlp.ir", from_src);
        FILE *f = fopen(probe, "rb");
        if (f) {
            fclose(f);
            return from_src;
        }
    }
    static const char *const guesses[] = {"examples", "../examples", "../../examples"};
    for (size_t i = 0; i < sizeof guesses / sizeof *guesses; i++) {
        char probe[64];
        snprintf(probe, sizeof probe, "%s/mlp.ir", guesses[i]);
        FILE *f = fopen(probe, "rb");
        if (f) {
            fclose(f);
            return guesses[i];
        }
    }
    return "examples";
}

/* ---- regressions: bugs found by fuzzing and reports, each with its own check ---- */

/* Parsing text must fail with status want and a message that starts with
 * "NAME:where error: " and contains sub. */
static void expect_reject(tf_context_t *ctx, const char *text, tf_status want, const char *where, const char *sub)
{
    tf_model_t *m = NULL;
    tf_status st = tf_model_parse_string(ctx, "reg.ir", text, strlen(text), NULL, 0, &m);
    const char *msg = tf_context_last_error(ctx);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "reg.ir:%s error: ", where);
    CHECK(st == want && !strncmp(msg, prefix, strlen(prefix)) && strstr(msg, sub),
          "expected %s '%s...%s', got %s '%s' for:\n%s", tf_status_name(want), prefix, sub, tf_status_name(st), msg, text);
    tf_model_free(m);
}

static void test_regressions(tf_context_t *ctx)
{
    /* an empty model (no text, or only comments and blank lines) is an error at 1:1 */
    expect_reject(ctx, "", TF_ERR_PARSE, "1:1:", "the model is empty");
    expect_reject(ctx, "# only a comment\n\n   \n", TF_ERR_PARSE, "1:1:", "only comments and blank lines");
    /* a finite literal its dtype cannot hold is an error at the literal, not inf */
    expect_reject(ctx, "module m\ninput x : f32[2]\ny = mul(x, 1e39)\noutput y\n", TF_ERR_VERIFY, "3:12:",
                  "1e+39 is outside f32's range");
    expect_reject(ctx, "module m\ninput x : f16[2]\ny = add(x, 70000)\noutput y\n", TF_ERR_VERIFY, "3:12:",
                  "70000 is outside f16's range");
    expect_reject(ctx, "module m\ninput x : bf16[2]\ny = add(x, -3.4e38)\noutput y\n", TF_ERR_VERIFY, "3:12:",
                  "would become -inf");
    expect_reject(ctx, "module m\nparam w : f16[2] = uniform(-65536, 1)\noutput w\n", TF_ERR_VERIFY, "2:20:",
                  "uniform(low=...): the value -65536 is outside f16's range");
    /* ... while the largest finite values, and inf/nan written as such, are fine */
    static const char *const fine[] = {
        "module m\ninput x : f16[2]\ny = add(x, 65504)\nz = mul(y, 65519)\nw = add(z, -inf)\nv = add(w, nan)\noutput v\n",
        "module m\ninput x : f32[2]\ny = add(x, 3.4028234e38)\nz = mul(y, inf)\noutput z\n",
        "module m\ninput x : f64[2]\ny = add(x, 1e300)\noutput y\n",
        "module m\ninput x : i64[2]\ny = add(x, 9007199254740992)\nz = add(y, -9007199254740992)\noutput z\n",
    };
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++) {
        tf_model_t *m = NULL;
        tf_status st = tf_model_parse_string(ctx, "fine.ir", fine[i], strlen(fine[i]), NULL, 0, &m);
        CHECK(st == TF_OK, "must parse: %s\n%s", tf_context_last_error(ctx), fine[i]);
        tf_model_free(m);
    }
    /* integer literals are read exactly: an operand a float64 cannot hold is
     * an error at the literal (it was silently rounded, or refused at the op
     * as "9.22337e+18"); an attribute keeps the exact value */
    expect_reject(ctx, "module m\ninput x : i64[2]\ny = add(x, 9223372036854775807)\noutput y\n", TF_ERR_PARSE, "3:12:",
                  "integer 9223372036854775807 cannot be an operand");
    expect_reject(ctx, "module m\ninput x : i64[2]\ny = add(x, 9007199254740993)\noutput y\n", TF_ERR_PARSE, "3:12:",
                  "it would become 9007199254740992");
    expect_reject(ctx, "module m\ninput x : i64[4]\nz = slice(x, axis=0, start=0, end=9223372036854775807)\noutput z\n",
                  TF_ERR_VERIFY, "3:35:", "found 9223372036854775807");
    expect_reject(ctx, "module m\ninput x : i64[4]\nz = slice(x, axis=0, start=-9223372036854775809, end=2)\noutput z\n",
                  TF_ERR_PARSE, "3:28:", "does not fit in 64 bits");

    /* memplan: a training model with 2^40-row inputs whose arena passes 2^63
     * bytes planned a negative peak_bytes; now it is a TF_ERR_LIMIT naming
     * the value that crossed 2^62 */
    buf b = {0};
    static const char head[] = "module big\ninput x : f64[1099511627776, 256]\nparam w : f64[256] = ones()\nh0 = mul(x, w)\n";
    buf_set(&b, head, sizeof head - 1);
    char line[96];
    for (int i = 1; i < 4200; i++) {
        int k = snprintf(line, sizeof line, "h%d = tanh(h%d)\n", i, i - 1);
        buf_insert(&b, b.n, line, (size_t)k);
    }
    static const char tail[] = "loss = mean(h4199, axes=[])\noutput loss\ntrain {\n  optimizer = sgd(lr=0.1)\n}\n";
    buf_insert(&b, b.n, tail, sizeof tail - 1);
    tf_model_t *m = NULL;
    tf_status st = tf_model_parse_string(ctx, "big.ir", b.p, b.n, NULL, 0, &m);
    CHECK(st == TF_OK, "the 2^40-row model must parse: %s", tf_context_last_error(ctx));
    for (int mode = 0; st == TF_OK && mode < 2; mode++) {
        tf_compile_options o;
        tf_compile_options_init(&o);
        o.mode = mode ? TF_MODE_INFER : TF_MODE_TRAIN;
        o.target = TF_TARGET_INTERP;
        tf_program_t *p = NULL;
        tf_status cs = tf_program_compile(ctx, m, &o, &p);
        int64_t peak = 0;
        for (size_t i = 0; cs == TF_OK && i < tf_program_stat_count(p); i++) {
            const char *nm;
            int64_t v;
            if (tf_program_stat(p, i, &nm, &v) == TF_OK && !strcmp(nm, "peak_bytes")) peak = v;
        }
        if (mode == 0)
            CHECK(cs == TF_ERR_LIMIT && strstr(tf_context_last_error(ctx), "big.ir:") &&
                      strstr(tf_context_last_error(ctx), "memplan: the arena would pass 2^62 bytes"),
                  "train: expected TF_ERR_LIMIT from memplan, got %s (peak %lld): %s", tf_status_name(cs),
                  (long long)peak, tf_context_last_error(ctx));
        else   /* inference keeps nothing for a backward pass: it plans, and its peak is positive */
            CHECK(cs == TF_OK && peak > 0, "infer: %s, peak %lld: %s", tf_status_name(cs), (long long)peak,
                  tf_context_last_error(ctx));
        tf_program_free(p);
    }
    tf_model_free(m);
    free(b.p);
}

int main(void)
{
    static const char *const files[] = {"mlp.ir", "cnn.ir", "transformer.ir"};
    /* a dim each example declares, for --dim style overrides */
    static const char *const dim_of[] = {"B", "N", "T"};
    const char *dir = examples_dir();
    long iters = 1000;
    const char *e = getenv("TFUSE_FUZZ_ITERS");
    if (e && atol(e) > 0) iters = atol(e);
    e = getenv("TFUSE_FUZZ_SEED");
    if (e && *e) rng_state = strtoull(e, NULL, 0);

    tf_context_t *ctx = NULL;
    if (tf_context_create(&ctx) != TF_OK) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    buf b = {0};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%.3000s/%s", dir, files[f]);
        size_t len;
        char *orig = read_file(path, &len);
        CHECK(orig != NULL, "cannot read %s (set TFUSE_EXAMPLES to the examples directory)", path);
        if (!orig) continue;

        /* the example itself is valid and prints to a fixed point */
        buf_set(&b, orig, len);
        CHECK(check_text(ctx, files[f], &b, NULL, 0), "%s: the unmutated example must parse: %s", files[f],
              tf_context_last_error(ctx));
        long accepted = 0;
        for (long i = 0; i < iters; i++) {
            buf_set(&b, orig, len);
            int nmut = 1 + (int)rng_below(rng_below(4) ? 3 : 8);
            for (int k = 0; k < nmut; k++) mutate_once(&b);
            /* now and then, a dim override too (possibly one the mutant lost) */
            tf_dim_override ov = {dim_of[f], 1 + (int64_t)rng_below(rng_below(2) ? 8 : 4096)};
            bool with_dims = rng_below(8) == 0;
            accepted += check_text(ctx, files[f], &b, with_dims ? &ov : NULL, with_dims ? 1 : 0);
        }
        printf("%s: %ld mutants, %ld accepted\n", files[f], iters, accepted);
        free(orig);
    }
    free(b.p);
    test_regressions(ctx);
    tf_context_free(ctx);
    printf("fuzz_parse: %ld accepted, %ld rejected\n", n_ok, n_rejected);
    return check_report();
}
