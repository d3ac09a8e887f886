/* tensorio.c — .npy and .safetensors readers and writers; the format decisions
 * are documented in tensorio.h. Layout: error plumbing; dtypes and shapes;
 * sources (a file read at offsets, or memory) and atomic write; one strict literal parser that reads JSON
 * (safetensors headers) and, in Python mode, the dict literal of .npy headers;
 * then the two formats. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "tensorio.h"
#include "alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Both formats store little-endian data, and tio_tensor holds it as is. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensorio assumes a little-endian host"
#endif

#define MAX_TENSOR    ((uint64_t)1 << 40)             /* bytes */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)   /* 100 MB */
#define NPY_MAX_HEADER ((uint64_t)1 << 20)            /* 1 MiB; NumPy writes < 1 KiB */
#define MAX_DEPTH     64                              /* literal nesting */
#define SHAPE_BUF     256   /* "(d, d, ...)": 8 dims of up to 20 digits */
#define NAME_BUF      80    /* a name quoted in a message, truncated */

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* ---- errors ------------------------------------------------------------------------ */

/* Where failures are reported; every message starts with the path. */
typedef struct ectx { const char *path; char *err; size_t errlen; } ectx;

PRINTF_LIKE(3, 4)
static tio_status fail(const ectx *E, tio_status st, const char *fmt, ...)
{
    if (!E->err || !E->errlen) return st;
    int k = snprintf(E->err, E->errlen, "%s: ", E->path ? E->path : "(null path)");
    if (k >= 0 && (size_t)k < E->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(E->err + k, E->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* Bytes for a message: printable ASCII as is, the rest as \xNN, truncated
 * with "..." so that a hostile name cannot flood the message. */
static const char *show(const void *p, size_t n, char buf[NAME_BUF])
{
    const unsigned char *s = p;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k + 8 >= NAME_BUF) { memcpy(buf + k, "...", 3); k += 3; break; }
        if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\') buf[k++] = (char)s[i];
        else k += (size_t)snprintf(buf + k, NAME_BUF - k, "\\x%02x", s[i]);
    }
    buf[k] = 0;
    return buf;
}

/* ---- dtypes and shapes --------------------------------------------------------------- */

static const struct dtinfo {
    const char *name;   /* tio_dtype_name */
    size_t size;
    const char *npy;    /* descr without the byte-order char; NULL: no NumPy dtype */
    const char *st;     /* safetensors dtype string */
} DT[] = {
    [TIO_F32] = {"f32", 4, "f4", "F32"},    [TIO_F16] = {"f16", 2, "f2", "F16"},
    [TIO_BF16] = {"bf16", 2, NULL, "BF16"}, [TIO_F64] = {"f64", 8, "f8", "F64"},
    [TIO_I64] = {"i64", 8, "i8", "I64"},    [TIO_I32] = {"i32", 4, "i4", "I32"},
    [TIO_BOOL] = {"bool", 1, "b1", "BOOL"}, [TIO_U8] = {"u8", 1, "u1", "U8"},
    [TIO_I8] = {"i8", 1, "i1", "I8"},       [TIO_I16] = {"i16", 2, "i2", "I16"},
};
#define NDT (sizeof DT / sizeof DT[0])

static bool dtype_ok(tio_dtype t) { return (unsigned)t < NDT; }
size_t tio_dtype_size(tio_dtype t) { return dtype_ok(t) ? DT[t].size : 0; }
const char *tio_dtype_name(tio_dtype t) { return dtype_ok(t) ? DT[t].name : "?"; }

static uint64_t get_le(const uint8_t *p, int n) { uint64_t v = 0; while (n--) v = v << 8 | p[n]; return v; }
static void put_le(uint8_t *p, uint64_t v, int n) { for (int i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v; }

/* Finish freshly read data: byte-swap big-endian elements, and turn bool
 * bytes other than 0 into 1 (reading 2 through a _Bool is undefined). */
static void fix_data(tio_tensor *t, bool swap)
{
    uint8_t *p = t->data;
    size_t es = DT[t->dtype].size;
    for (size_t i = 0; swap && i + es <= t->nbytes; i += es)
        for (size_t a = i, b = i + es - 1; a < b; a++, b--) { uint8_t x = p[a]; p[a] = p[b]; p[b] = x; }
    for (size_t i = 0; t->dtype == TIO_BOOL && i < t->nbytes; i++) p[i] = p[i] != 0;
}

/* NumPy's tuple repr: "()", "(5,)", "(2, 3)". */
static const char *shape_str(const int64_t *shape, int rank, char buf[SHAPE_BUF])
{
    size_t k = (size_t)snprintf(buf, SHAPE_BUF, "(");
    for (int i = 0; i < rank && i < TIO_MAX_RANK; i++)
        k += (size_t)snprintf(buf + k, SHAPE_BUF - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    snprintf(buf + k, SHAPE_BUF - k, rank == 1 ? ",)" : ")");
    return buf;
}

/* Byte size of a shape. Negative dims and 64-bit overflow give `bad`
 * (TIO_ERR_FORMAT for files, TIO_ERR_ARG for callers); tensors over
 * MAX_TENSOR give TIO_ERR_LIMIT. ctx prefixes the message. */
static tio_status shape_bytes(const ectx *E, const char *ctx, const int64_t *shape, int rank, tio_dtype dt,
                              tio_status bad, uint64_t *nbytes)
{
    char s[SHAPE_BUF];
    uint64_t n = 1;
    bool empty = false;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return fail(E, bad, "%snegative dimension %lld in shape %s", ctx, (long long)shape[i],
                        shape_str(shape, rank, s));
        empty |= shape[i] == 0;
    }
    /* With a zero dim the tensor is empty, but the other dims still must not
     * overflow: later code may multiply them. */
    for (int i = 0; i < rank; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d && (n > UINT64_MAX / d || n * d > UINT64_MAX / DT[dt].size))
            return fail(E, bad, "%sshape %s of %s: element count overflows 64 bits", ctx,
                        shape_str(shape, rank, s), DT[dt].name);
        if (d) n *= d;
    }
    uint64_t b = empty ? 0 : n * DT[dt].size;
    if (b > MAX_TENSOR)
        return fail(E, TIO_ERR_LIMIT, "%sshape %s of %s is %llu bytes, over the 2^40-byte tensor limit", ctx,
                    shape_str(shape, rank, s), DT[dt].name, (unsigned long long)b);
    *nbytes = b;
    return TIO_OK;
}

/* Validate a caller's tensor before writing it. */
static tio_status check_tensor(const ectx *E, const char *ctx, const tio_tensor *t)
{
    char s[SHAPE_BUF];
    uint64_t nb;
    if (!dtype_ok(t->dtype)) return fail(E, TIO_ERR_ARG, "%sinvalid dtype %d", ctx, (int)t->dtype);
    if (t->rank < 0 || t->rank > TIO_MAX_RANK)
        return fail(E, TIO_ERR_ARG, "%srank %d is outside 0..%d", ctx, t->rank, TIO_MAX_RANK);
    tio_status st = shape_bytes(E, ctx, t->shape, t->rank, t->dtype, TIO_ERR_ARG, &nb);
    if (st) return st;
    if (t->nbytes != nb)
        return fail(E, TIO_ERR_ARG, "%snbytes is %zu but shape %s of %s needs %llu", ctx, t->nbytes,
                    shape_str(t->shape, t->rank, s), DT[t->dtype].name, (unsigned long long)nb);
    if (nb && !t->data) return fail(E, TIO_ERR_ARG, "%sdata is NULL", ctx);
    return TIO_OK;
}

/* ---- reading: header first, then exactly the data; atomic write -------------------- */

/* Where a reader's bytes come from: an open regular file, read with pread at
 * the offsets the header names, or a caller's buffer (tio_*_read_mem). The
 * readers never load a file whole: they read the fixed preamble, the header
 * (bounded by its own limit and by the file size), validate it against the
 * file size, and then read exactly the data it describes. */
typedef struct source {
    int fd;                 /* -1 for memory */
    const uint8_t *mem;
    uint64_t size;
} source;

static tio_status src_open(const ectx *E, source *S)
{
    /* O_NONBLOCK: a FIFO given by mistake must not hang open(); it has no
     * effect on the regular files we go on to read. */
    struct stat sb;
    S->mem = NULL;
    S->fd = open(E->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (S->fd < 0) return fail(E, TIO_ERR_IO, "cannot open: %s", strerror(errno));
    tio_status st = TIO_OK;
    if (fstat(S->fd, &sb) != 0) st = fail(E, TIO_ERR_IO, "cannot stat: %s", strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = fail(E, TIO_ERR_IO, "expected a regular file, found another kind of file");
    else if (sb.st_size < 0) st = fail(E, TIO_ERR_IO, "cannot stat: negative size");
    if (st) {
        close(S->fd);
        S->fd = -1;
        return st;
    }
    S->size = (uint64_t)sb.st_size;
    return TIO_OK;
}

static void src_close(source *S)
{
    if (S->fd >= 0) close(S->fd);
    S->fd = -1;
}

/* n bytes at file offset off into dst; the caller has checked that they
 * lie within the size, so a short read means the file changed under us. */
static tio_status src_read(const ectx *E, const source *S, uint64_t off, void *dst, size_t n)
{
    if (off > S->size || n > S->size - off)
        return fail(E, TIO_ERR_IO, "internal: read of %zu bytes at byte %llu is past the end (%llu bytes)", n,
                    (unsigned long long)off, (unsigned long long)S->size);
    if (S->mem) {
        if (n) memcpy(dst, S->mem + off, n);
        return TIO_OK;
    }
    size_t got = 0;
    while (got < n) {
        size_t want = n - got > ((size_t)1 << 30) ? (size_t)1 << 30 : n - got;
        ssize_t k = pread(S->fd, (uint8_t *)dst + got, want, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0)
            return fail(E, TIO_ERR_IO, "read error at byte %llu: %s", (unsigned long long)(off + got), strerror(errno));
        if (k == 0)
            return fail(E, TIO_ERR_IO, "file shrank while read: expected %llu bytes, it ended at byte %llu",
                        (unsigned long long)S->size, (unsigned long long)(off + got));
        got += (size_t)k;
    }
    return TIO_OK;
}

/* A malloc'd copy of n bytes at off (n + 1 allocated, NUL-terminated). */
static tio_status src_dup(const ectx *E, const source *S, uint64_t off, size_t n, const char *what, uint8_t **out)
{
    *out = tf_malloc(n + 1);
    if (!*out) return fail(E, TIO_ERR_OOM, "cannot allocate %zu bytes for the %s", n + 1, what);
    tio_status st = src_read(E, S, off, *out, n);
    if (st) {
        tf_free(*out);
        *out = NULL;
        return st;
    }
    (*out)[n] = 0;
    return TIO_OK;
}

typedef struct chunk { const void *p; size_t n; } chunk;   /* a piece of an output file */

/* Write PATH.tmp.PID in the same directory, fsync it, rename it over PATH,
 * then fsync the directory so the rename is durable (best-effort: some
 * filesystems refuse directory fsync). */
static tio_status atomic_write(const ectx *E, const chunk *cs, size_t nc)
{
    size_t cap = strlen(E->path) + 32;
    char *tmp = tf_malloc(cap);
    if (!tmp) return fail(E, TIO_ERR_OOM, "out of memory");
    snprintf(tmp, cap, "%s.tmp.%ld", E->path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) {
        /* left by a crashed writer that had our pid; recreating with O_EXCL
         * still refuses to follow a planted symlink */
        unlink(tmp);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    }
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    const char *what = f ? NULL : "creation";
    int e = errno;
    if (!f && fd >= 0) close(fd);
    for (size_t i = 0; i < nc && !what; i++)
        if (cs[i].n && fwrite(cs[i].p, 1, cs[i].n, f) != cs[i].n) what = "write", e = errno;
    if (!what && fflush(f) != 0) what = "write", e = errno;
    if (!what && fsync(fileno(f)) != 0) what = "fsync", e = errno;
    if (f && fclose(f) != 0 && !what) what = "close", e = errno;
    if (!what && rename(tmp, E->path) != 0) what = "rename", e = errno;
    tio_status st = TIO_OK;
    if (what) {
        if (fd >= 0) unlink(tmp);
        st = fail(E, TIO_ERR_IO, "%s of temporary file %s failed: %s", what, tmp, strerror(e));
    } else if ((fd = open(dirname(strcpy(tmp, E->path)), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    tf_free(tmp);
    return st;
}

/* ---- literal parser: strict JSON, or the Python subset of .npy headers ---------------- */

/* A parsed value. Python tuples are arrays with `tuple` set; Python's True
 * and False are J_BOOL with num 1/0. */
enum jkind { J_OBJ = 1, J_ARR, J_STR, J_INT, J_BOOL };

typedef struct jval {
    enum jkind kind;
    size_t at;            /* offset of the value in the parsed text */
    int64_t num;          /* J_INT, J_BOOL */
    char *str;            /* J_STR: decoded, NUL-terminated, but may hold \u0000: use len */
    size_t len;
    struct jval *el;      /* J_ARR elements, J_OBJ values */
    struct jval *keys;    /* J_OBJ keys (J_STR), parallel to el */
    size_t n;
    bool tuple, comma;    /* Python: written with (), and had a comma ("(5)" is just 5) */
} jval;

typedef struct pcur {
    const ectx *E;
    const char *what;         /* "npy header", "JSON header", "metadata JSON" */
    const unsigned char *s;
    size_t n, i, base;        /* base: file offset of s[0], for messages */
    bool py;                  /* Python-literal mode */
} pcur;

static bool peek(const pcur *c, char ch) { return c->i < c->n && c->s[c->i] == (unsigned char)ch; }
static bool digit_at(const pcur *c, size_t i) { return i < c->n && c->s[i] >= '0' && c->s[i] <= '9'; }

static void skip_ws(pcur *c)
{
    while (c->i < c->n && c->s[c->i] && strchr(c->py ? " \t\n\r\f\v" : " \t\n\r", c->s[c->i])) c->i++;
}

/* Failure at offset `at` of the parsed text, reported as a file offset. */
PRINTF_LIKE(4, 5)
static tio_status cfail(const pcur *c, tio_status st, size_t at, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail(c->E, st, "%s at byte %zu: %s", c->what, c->base + at, msg);
}

/* "expected X, found Y" at the cursor. */
static tio_status expected(const pcur *c, const char *what)
{
    char found[32];
    if (c->i >= c->n) snprintf(found, sizeof found, "the end");
    else if (c->s[c->i] >= 0x20 && c->s[c->i] < 0x7f) snprintf(found, sizeof found, "'%c'", c->s[c->i]);
    else snprintf(found, sizeof found, "byte 0x%02x", c->s[c->i]);
    return cfail(c, TIO_ERR_FORMAT, c->i, "expected %s, found %s", what, found);
}

/* Frees everything under v. A value under construction is always freeable:
 * a slot is zeroed and counted in n before it is parsed into. */
static void jfree(jval *v)
{
    for (size_t i = 0; i < v->n; i++) { jfree(&v->el[i]); if (v->keys) jfree(&v->keys[i]); }
    tf_free(v->el);
    tf_free(v->keys);
    tf_free(v->str);
    memset(v, 0, sizeof *v);
}

static const char *jkind_name(const jval *v)
{
    static const char *const names[] = {"nothing", "an object", "an array", "a string", "an integer", "a boolean"};
    return v->tuple ? "a tuple" : names[v->kind];
}

static bool jis(const jval *k, const char *s) { return k->len == strlen(s) && !memcmp(k->str, s, k->len); }

static const jval *jget(const jval *obj, const char *key)
{
    for (size_t i = 0; i < obj->n; i++)
        if (jis(&obj->keys[i], key)) return &obj->el[i];
    return NULL;
}

/* Offset of the first invalid UTF-8 sequence (overlong, surrogate, above
 * U+10FFFF or cut short), or n if the text is valid. */
static size_t utf8_bad(const unsigned char *s, size_t n)
{
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    for (size_t i = 0; i < n;) {
        unsigned b = s[i];
        unsigned len = b < 0x80 ? 1 : (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
        uint32_t cp = len == 1 ? b : b & (0x7fu >> len);
        if (!len || n - i < len) return i;
        for (unsigned k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (len > 1 && (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) return i;
        i += len;
    }
    return n;
}

static bool hex4(const unsigned char *p, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned ch = p[k];
        if (ch >= '0' && ch <= '9') *v = *v << 4 | (ch - '0');
        else if (ch >= 'a' && ch <= 'f') *v = *v << 4 | (ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') *v = *v << 4 | (ch - 'A' + 10);
        else return false;
    }
    return true;
}

static size_t utf8_put(char *o, uint32_t cp)
{
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[5] = {0, 0, 0xc0, 0xe0, 0xf0};
    o[0] = (char)(n == 1 ? cp : lead[n] | cp >> (6 * (n - 1)));
    for (size_t k = 1; k < n; k++) o[k] = (char)(0x80 | (cp >> (6 * (n - 1 - k)) & 0x3f));
    return n;
}

/* JSON \u escape at the cursor (on the 'u'), surrogate pairs joined. */
static tio_status junicode(pcur *c, size_t end, uint32_t *cp)
{
    uint32_t lo;
    size_t at = c->i - 1;
    if (end - c->i < 5 || !hex4(c->s + c->i + 1, cp))
        return cfail(c, TIO_ERR_FORMAT, at, "expected 4 hex digits after \\u");
    c->i += 5;
    if (*cp >= 0xdc00 && *cp <= 0xdfff)
        return cfail(c, TIO_ERR_FORMAT, at, "lone low surrogate \\u%04x", (unsigned)*cp);
    if (*cp < 0xd800 || *cp > 0xdbff) return TIO_OK;
    if (end - c->i < 6 || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u' || !hex4(c->s + c->i + 2, &lo) ||
        lo < 0xdc00 || lo > 0xdfff)
        return cfail(c, TIO_ERR_FORMAT, at, "high surrogate \\u%04x is not followed by a low surrogate",
                     (unsigned)*cp);
    *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
    c->i += 6;
    return TIO_OK;
}

/* String at the cursor (on the opening quote). Two passes: find the closing
 * quote to size the buffer (decoding never grows the text), then decode.
 * Python mode takes either quote and no escapes (NumPy never writes any). */
static tio_status jstr(pcur *c, jval *v)
{
    unsigned char q = c->s[c->i];
    v->kind = J_STR;
    v->at = c->i;
    size_t end = ++c->i, k = 0;
    while (end < c->n && c->s[end] != q) end += c->s[end] == '\\' && !c->py ? 2 : 1;
    if (end >= c->n) return cfail(c, TIO_ERR_FORMAT, v->at, "unterminated string");
    char *o = v->str = tf_malloc(end - c->i + 1);
    if (!o) return fail(c->E, TIO_ERR_OOM, "out of memory while parsing");
    while (c->i < end) {
        unsigned ch = c->s[c->i++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *m;
        uint32_t cp = 0;
        if (ch < 0x20 || (ch == '\\' && c->py))
            return c->i--, expected(c, c->py ? "a plain string character (no escapes or control characters)"
                                             : "a string character (control characters must be escaped)");
        if (ch != '\\') { o[k++] = (char)ch; continue; }
        /* the escape letter lies before `end`: the scan above skipped it */
        if (c->s[c->i] && (m = strchr(from, c->s[c->i]))) { o[k++] = to[m - from]; c->i++; continue; }
        if (c->s[c->i] != 'u') return expected(c, "an escape letter (one of \"\\/bfnrtu)");
        tio_status st = junicode(c, end, &cp);
        if (st) return st;
        k += utf8_put(o + k, cp);
    }
    o[k] = 0;
    v->len = k;
    c->i = end + 1;
    return TIO_OK;
}

/* Decimal integer fitting int64: no leading zeros, fractions or exponents;
 * Python mode also takes the Python 2 'L' suffix that very old NumPy wrote. */
static tio_status jint(pcur *c, jval *v)
{
    v->kind = J_INT;
    v->at = c->i;
    c->i += peek(c, '-');
    if (!digit_at(c, c->i)) return expected(c, "a digit");
    if (c->s[c->i] == '0' && digit_at(c, c->i + 1))
        return cfail(c, TIO_ERR_FORMAT, v->at, "leading zeros are not allowed in integers");
    uint64_t x = 0;
    while (digit_at(c, c->i)) {
        unsigned d = c->s[c->i++] - '0';
        if (x > ((uint64_t)INT64_MAX - d) / 10)
            return cfail(c, TIO_ERR_FORMAT, v->at, "integer does not fit in 64 bits");
        x = x * 10 + d;
    }
    if (c->py && (peek(c, 'L') || peek(c, 'l'))) c->i++;
    if (peek(c, '.') || peek(c, 'e') || peek(c, 'E'))
        return cfail(c, TIO_ERR_FORMAT, v->at, "expected an integer, found a fraction or exponent");
    v->num = c->s[v->at] == '-' ? -(int64_t)x : (int64_t)x;
    return TIO_OK;
}

static int jkey_cmp(const void *a, const void *b)
{
    const jval *x = *(const jval *const *)a, *y = *(const jval *const *)b;
    int r = memcmp(x->str, y->str, x->len < y->len ? x->len : y->len);
    return r ? r : (x->len > y->len) - (x->len < y->len);
}

/* Duplicate keys are rejected (in a safetensors header that is a duplicate
 * tensor name). Sorting keeps this O(n log n) for headers with many tensors. */
static tio_status jdupcheck(pcur *c, const jval *v)
{
    if (v->n < 2) return TIO_OK;
    const jval **p = tf_malloc(v->n * sizeof *p);
    tio_status st = TIO_OK;
    if (!p) return fail(c->E, TIO_ERR_OOM, "out of memory while parsing");
    for (size_t i = 0; i < v->n; i++) p[i] = &v->keys[i];
    qsort(p, v->n, sizeof *p, jkey_cmp);
    for (size_t i = 1; i < v->n && !st; i++)
        if (!jkey_cmp(&p[i - 1], &p[i])) {
            char b[NAME_BUF];
            size_t at = p[i]->at > p[i - 1]->at ? p[i]->at : p[i - 1]->at;
            st = cfail(c, TIO_ERR_FORMAT, at, "duplicate key \"%s\"", show(p[i]->str, p[i]->len, b));
        }
    tf_free(p);
    return st;
}

static tio_status jvalue(pcur *c, jval *v, int depth);

/* Objects, arrays and tuples share one loop; keys only for objects. Python
 * allows a trailing comma before the closing bracket, JSON does not. */
static tio_status jcontainer(pcur *c, jval *v, int depth)
{
    unsigned char open = c->s[c->i];
    char close = open == '{' ? '}' : open == '[' ? ']' : ')';
    bool obj = open == '{';
    size_t cap = 0;
    v->kind = obj ? J_OBJ : J_ARR;
    v->tuple = open == '(';
    v->at = c->i++;
    if (depth >= MAX_DEPTH) return cfail(c, TIO_ERR_FORMAT, v->at, "nested deeper than %d levels", MAX_DEPTH);
    for (;;) {
        skip_ws(c);
        if (peek(c, close) && (v->n == 0 || c->py)) break;
        if (v->n == cap) {
            size_t nc = cap ? cap * 2 : 4;
            jval *e = tf_realloc(v->el, nc * sizeof *e), *k = NULL;
            if (e) v->el = e;
            if (e && obj && (k = tf_realloc(v->keys, nc * sizeof *k))) v->keys = k;
            if (!e || (obj && !k)) return fail(c->E, TIO_ERR_OOM, "out of memory while parsing");
            cap = nc;
        }
        memset(&v->el[v->n], 0, sizeof *v->el);
        if (obj) memset(&v->keys[v->n], 0, sizeof *v->keys);
        v->n++;
        tio_status st;
        if (obj) {
            if (!peek(c, '"') && !(c->py && peek(c, '\''))) return expected(c, "a string key");
            if ((st = jstr(c, &v->keys[v->n - 1]))) return st;
            skip_ws(c);
            if (!peek(c, ':')) return expected(c, "':' after a key");
            c->i++;
        }
        if ((st = jvalue(c, &v->el[v->n - 1], depth + 1))) return st;
        skip_ws(c);
        if (peek(c, close)) break;
        if (!peek(c, ',')) return expected(c, obj ? "',' or '}'" : v->tuple ? "',' or ')'" : "',' or ']'");
        c->i++;
        v->comma = true;
    }
    c->i++;
    return obj ? jdupcheck(c, v) : TIO_OK;
}

static tio_status jvalue(pcur *c, jval *v, int depth)
{
    skip_ws(c);
    if (peek(c, '{') || peek(c, '[') || (c->py && peek(c, '('))) return jcontainer(c, v, depth);
    if (peek(c, '"') || (c->py && peek(c, '\''))) return jstr(c, v);
    if (peek(c, '-') || digit_at(c, c->i)) return jint(c, v);
    bool t = c->py && c->n - c->i >= 4 && !memcmp(c->s + c->i, "True", 4);
    if (t || (c->py && c->n - c->i >= 5 && !memcmp(c->s + c->i, "False", 5))) {
        *v = (jval){.kind = J_BOOL, .at = c->i, .num = t};
        c->i += t ? 4 : 5;
        return TIO_OK;
    }
    return expected(c, c->py ? "a dict, tuple, list, string, integer, True or False"
                             : "an object, array, string or integer (true, false, null and fractions are unused)");
}

/* The whole text must be one value, optionally surrounded by whitespace
 * (both formats pad their headers with spaces). JSON must be UTF-8. */
static tio_status jparse(pcur *c, jval *root)
{
    size_t bad = c->py ? c->n : utf8_bad(c->s, c->n);
    if (bad < c->n) return cfail(c, TIO_ERR_FORMAT, bad, "invalid UTF-8 (byte 0x%02x)", c->s[bad]);
    tio_status st = jvalue(c, root, 0);
    if (st) return st;
    skip_ws(c);
    return c->i == c->n ? TIO_OK : expected(c, "only whitespace after the value");
}

/* A shape: an array (a tuple for .npy) of at most TIO_MAX_RANK integers. */
static tio_status get_shape(const pcur *c, const char *ctx, const jval *v, tio_tensor *t)
{
    if (v->kind != J_ARR || v->tuple != c->py)
        return cfail(c, TIO_ERR_FORMAT, v->at, "%sshape must be %s, found %s", ctx, c->py ? "a tuple" : "an array",
                     jkind_name(v));
    if (v->n > TIO_MAX_RANK)
        return cfail(c, TIO_ERR_LIMIT, v->at, "%sshape has %zu dimensions, at most %d are supported", ctx, v->n,
                     TIO_MAX_RANK);
    for (size_t k = 0; k < v->n; k++) {
        if (v->el[k].kind != J_INT)
            return cfail(c, TIO_ERR_FORMAT, v->el[k].at, "%sshape entries must be integers, found %s", ctx,
                         jkind_name(&v->el[k]));
        t->shape[k] = v->el[k].num;
    }
    if (v->n == 1 && c->py && !v->comma)   /* in Python, "(5)" is just 5 */
        return cfail(c, TIO_ERR_FORMAT, v->at, "%sshape (%lld) is not a tuple; a 1-tuple needs a trailing comma: "
                     "(%lld,)", ctx, (long long)t->shape[0], (long long)t->shape[0]);
    t->rank = (int)v->n;
    return TIO_OK;
}

/* ---- .npy ------------------------------------------------------------------------------ */

/* The header dict: exactly 'descr', 'fortran_order' and 'shape'. */
static tio_status npy_header(pcur *c, const jval *d, tio_tensor *t, bool *swap, bool *fortran, char descr[NAME_BUF])
{
    static const char *const keys[3] = {"descr", "fortran_order", "shape"};
    char nm[NAME_BUF];
    if (d->kind != J_OBJ) return cfail(c, TIO_ERR_FORMAT, d->at, "expected a dict, found %s", jkind_name(d));
    for (size_t i = 0; i < d->n; i++)
        if (!jis(&d->keys[i], keys[0]) && !jis(&d->keys[i], keys[1]) && !jis(&d->keys[i], keys[2]))
            return cfail(c, TIO_ERR_FORMAT, d->keys[i].at, "unexpected key '%s' (expected 'descr', 'fortran_order' "
                         "and 'shape')", show(d->keys[i].str, d->keys[i].len, nm));
    for (int w = 0; w < 3; w++)
        if (!jget(d, keys[w])) return cfail(c, TIO_ERR_FORMAT, d->at, "header dict has no '%s' key", keys[w]);
    const jval *de = jget(d, "descr"), *fo = jget(d, "fortran_order");
    if (de->kind == J_ARR)
        return cfail(c, TIO_ERR_FORMAT, de->at, "structured dtypes (a list descr) are not supported");
    if (de->kind != J_STR) return cfail(c, TIO_ERR_FORMAT, de->at, "descr must be a string, found %s", jkind_name(de));
    show(de->str, de->len, descr);
    size_t i = 0;
    while (de->len && i < NDT && !(DT[i].npy && !strcmp(de->str + 1, DT[i].npy))) i++;
    if (de->len < 2 || !strchr("<>=|", de->str[0]) || i == NDT)
        return cfail(c, TIO_ERR_FORMAT, de->at, "unsupported descr '%s' (tfuse reads <f4 <f2 <f8 <i8 <i4 |b1, and "
                     "these with byte order '>' or '=')", descr);
    if (de->str[0] == '|' && DT[i].size > 1)
        return cfail(c, TIO_ERR_FORMAT, de->at, "descr '%s': byte order '|' is only valid for 1-byte types, "
                     "expected '<' or '>'", descr);
    t->dtype = (tio_dtype)i;
    *swap = de->str[0] == '>';   /* '=' is the host's order, which is little-endian */
    if (fo->kind != J_BOOL)
        return cfail(c, TIO_ERR_FORMAT, fo->at, "fortran_order must be True or False, found %s", jkind_name(fo));
    *fortran = fo->num;
    return get_shape(c, "", jget(d, "shape"), t);
}

/* Copy a Fortran-ordered array into C order: walk the destination in C order
 * with an odometer while tracking the matching column-major source offset. */
static void fortran_to_c(const uint8_t *src, uint8_t *dst, const tio_tensor *t, uint64_t numel)
{
    size_t idx[TIO_MAX_RANK] = {0}, fstride[TIO_MAX_RANK], soff = 0, es = DT[t->dtype].size;
    for (int k = 0; k < t->rank; k++) fstride[k] = k ? fstride[k - 1] * (size_t)t->shape[k - 1] : 1;
    for (uint64_t e = 0; e < numel; e++) {
        memcpy(dst + e * es, src + soff * es, es);
        for (int k = t->rank - 1; k >= 0; k--) {
            soff += fstride[k];
            if (++idx[k] < (size_t)t->shape[k]) break;
            soff -= fstride[k] * (size_t)t->shape[k];
            idx[k] = 0;
        }
    }
}

static tio_status npy_parse(const ectx *E, const source *S, tio_tensor *out)
{
    static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    char descr[NAME_BUF], s[SHAPE_BUF];
    uint8_t pre[12];
    uint64_t len = S->size;
    size_t npre = len < sizeof pre ? (size_t)len : sizeof pre;
    tio_status st = src_read(E, S, 0, pre, npre);
    if (st) return st;
    if (memcmp(pre, magic, npre < 6 ? npre : 6) != 0)
        return fail(E, TIO_ERR_FORMAT, "not a .npy file: expected magic \\x93NUMPY, found \"%s\"",
                    show(pre, npre < 6 ? npre : 6, descr));
    if (len < 8)
        return fail(E, TIO_ERR_FORMAT, "truncated header: file is %llu bytes, expected at least 10",
                    (unsigned long long)len);
    unsigned major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        return fail(E, TIO_ERR_FORMAT, "unsupported .npy version %u.%u (expected 1.0, 2.0 or 3.0)", major, minor);
    int lsize = major == 1 ? 2 : 4;   /* width of the header-length field */
    size_t hstart = 8 + (size_t)lsize;
    if (len < hstart)
        return fail(E, TIO_ERR_FORMAT, "truncated header: file is %llu bytes, expected at least %zu",
                    (unsigned long long)len, hstart);
    uint64_t hlen = get_le(pre + 8, lsize), nbytes = 0;
    if (hlen > len - hstart)
        return fail(E, TIO_ERR_FORMAT, "header length %llu goes beyond the end of the file (%llu bytes follow "
                    "the preamble)", (unsigned long long)hlen, (unsigned long long)(len - hstart));
    if (hlen > NPY_MAX_HEADER)
        return fail(E, TIO_ERR_LIMIT, "header length %llu is over the 1 MiB limit (NumPy writes headers of a few "
                    "hundred bytes)", (unsigned long long)hlen);
    uint8_t *hdr;
    if ((st = src_dup(E, S, hstart, (size_t)hlen, "npy header", &hdr))) return st;
    pcur c = {E, "npy header", hdr, (size_t)hlen, 0, hstart, true};
    jval root = {0};
    tio_tensor t = {0};
    bool swap = false, fortran = false;
    st = jparse(&c, &root);
    if (!st) st = npy_header(&c, &root, &t, &swap, &fortran, descr);
    jfree(&root);
    tf_free(hdr);
    if (!st) st = shape_bytes(E, "", t.shape, t.rank, t.dtype, TIO_ERR_FORMAT, &nbytes);
    if (st) return st;
    /* The header says how many bytes follow it; the file must hold exactly
     * those (NumPy writes nothing after the data: anything there is damage,
     * or not what the header claims). */
    uint64_t doff = hstart + hlen, have = len - doff;
    if (nbytes > have)
        return fail(E, TIO_ERR_FORMAT, "truncated data: shape %s of %s needs %llu bytes, file has %llu", shape_str(t.shape, t.rank, s), descr, (unsigned long long)nbytes,
                    (unsigned long long)have);
    if (nbytes < have)
        return fail(E, TIO_ERR_FORMAT, "%llu trailing byte%s after the data: shape %s of %s needs %llu bytes at byte "
                    "%llu, so the file should be %llu bytes, but it is %llu",
                    (unsigned long long)(have - nbytes), have - nbytes == 1 ? "" : "s", shape_str(t.shape, t.rank, s), descr,
                    (unsigned long long)nbytes, (unsigned long long)doff, (unsigned long long)(doff + nbytes),
                    (unsigned long long)len);
    if (!(t.data = tf_malloc(nbytes ? (size_t)nbytes : 1)))
        return fail(E, TIO_ERR_OOM, "cannot allocate %llu bytes of tensor data", (unsigned long long)nbytes);
    t.nbytes = (size_t)nbytes;
    if (fortran && t.rank > 1 && nbytes) {
        uint8_t *tmp = tf_malloc((size_t)nbytes);
        if (!tmp) st = fail(E, TIO_ERR_OOM, "cannot allocate %llu bytes to reorder Fortran-ordered data",
                            (unsigned long long)nbytes);
        else if (!(st = src_read(E, S, doff, tmp, (size_t)nbytes)))
            fortran_to_c(tmp, t.data, &t, nbytes / DT[t.dtype].size);
        tf_free(tmp);
    } else {
        st = src_read(E, S, doff, t.data, (size_t)nbytes);
    }
    if (st) {
        tf_free(t.data);
        return st;
    }
    fix_data(&t, swap);
    *out = t;
    return TIO_OK;
}

tio_status tio_npy_read(const char *path, tio_tensor *out, char *err, size_t errlen)
{
    ectx E = {path, err, errlen};
    source S;
    if (err && errlen) err[0] = 0;
    if (!out || !path) return fail(&E, TIO_ERR_ARG, "NULL %s argument", out ? "path" : "out");
    memset(out, 0, sizeof *out);
    tio_status st = src_open(&E, &S);
    if (st) return st;
    st = npy_parse(&E, &S, out);
    src_close(&S);
    return st;
}

tio_status tio_npy_read_mem(const char *name, const void *data, size_t len, tio_tensor *out, char *err,
                            size_t errlen)
{
    ectx E = {name, err, errlen};
    if (err && errlen) err[0] = 0;
    if (!out || !name || (!data && len)) return fail(&E, TIO_ERR_ARG, "NULL %s argument", out ? "name or data" : "out");
    memset(out, 0, sizeof *out);
    source S = {-1, data ? data : (const uint8_t *)"", len};
    return npy_parse(&E, &S, out);
}

tio_status tio_npy_write(const char *path, const tio_tensor *t, char *err, size_t errlen)
{
    ectx E = {path, err, errlen};
    if (err && errlen) err[0] = 0;
    if (!t || !path) return fail(&E, TIO_ERR_ARG, "NULL %s argument", t ? "path" : "tensor");
    tio_status st = check_tensor(&E, "", t);
    if (st) return st;
    if (!DT[t->dtype].npy)
        return fail(&E, TIO_ERR_ARG, "%s cannot be written as .npy: 'bfloat16' is not a NumPy dtype (use "
                    "safetensors, or convert to f32)", DT[t->dtype].name);
    /* NumPy pads so that the 10-byte preamble + header + '\n' is a multiple
     * of 64, adding a full 64 spaces when it already is one. */
    char shape[SHAPE_BUF], hdr[10 + 512];
    int hl = snprintf(hdr + 10, sizeof hdr - 10, "{'descr': '%c%s', 'fortran_order': False, 'shape': %s, }",
                      DT[t->dtype].size == 1 ? '|' : '<', DT[t->dtype].npy, shape_str(t->shape, t->rank, shape));
    size_t pad = 64 - (10 + (size_t)hl + 1) % 64, total = 10 + (size_t)hl + pad + 1;
    memset(hdr + 10 + hl, ' ', pad);
    hdr[total - 1] = '\n';
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    put_le((uint8_t *)hdr + 8, total - 10, 2);
    chunk cs[2] = {{hdr, total}, {t->data, t->nbytes}};
    return atomic_write(&E, cs, 2);
}

/* ---- safetensors ------------------------------------------------------------------------- */

/* "__metadata__" must map strings to strings. */
static tio_status check_metadata(const pcur *c, const jval *m)
{
    if (m->kind != J_OBJ)
        return cfail(c, TIO_ERR_FORMAT, m->at, "__metadata__ must be an object, found %s", jkind_name(m));
    for (size_t i = 0; i < m->n; i++)
        if (m->el[i].kind != J_STR)
            return cfail(c, TIO_ERR_FORMAT, m->el[i].at, "__metadata__ values must be strings, found %s",
                         jkind_name(&m->el[i]));
    return TIO_OK;
}

typedef struct st_range { uint64_t b, e; size_t idx; } st_range;

static int range_cmp(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    return x->b != y->b ? (x->b > y->b) - (x->b < y->b) : (x->e > y->e) - (x->e < y->e);
}

/* Validate one header entry; fill t (all but data) and its byte range r. */
static tio_status st_entry(pcur *c, const jval *key, const jval *v, uint64_t data_len, tio_tensor *t, st_range *r)
{
    char nm[NAME_BUF], ctx[NAME_BUF + 16], s[SHAPE_BUF];
    if (!key->len) return cfail(c, TIO_ERR_FORMAT, key->at, "empty tensor name");
    if (memchr(key->str, 0, key->len)) return cfail(c, TIO_ERR_FORMAT, key->at, "tensor name contains a NUL character");
    snprintf(ctx, sizeof ctx, "tensor \"%s\": ", show(key->str, key->len, nm));
    if (v->kind != J_OBJ) return cfail(c, TIO_ERR_FORMAT, v->at, "%sexpected an object, found %s", ctx, jkind_name(v));
    for (size_t i = 0; i < v->n; i++)
        if (!jis(&v->keys[i], "dtype") && !jis(&v->keys[i], "shape") && !jis(&v->keys[i], "data_offsets"))
            return cfail(c, TIO_ERR_FORMAT, v->keys[i].at, "%sunexpected key \"%s\" (expected dtype, shape, "
                         "data_offsets)", ctx, show(v->keys[i].str, v->keys[i].len, nm));
    const jval *dt = jget(v, "dtype"), *sh = jget(v, "shape"), *off = jget(v, "data_offsets");
    if (!dt || !sh || !off)
        return cfail(c, TIO_ERR_FORMAT, v->at, "%smissing \"%s\"", ctx, !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (dt->kind != J_STR)
        return cfail(c, TIO_ERR_FORMAT, dt->at, "%sdtype must be a string, found %s", ctx, jkind_name(dt));
    size_t i = 0;
    while (i < NDT && !jis(dt, DT[i].st)) i++;
    if (i == NDT)
        return cfail(c, TIO_ERR_FORMAT, dt->at, "%sunsupported dtype \"%s\" (expected one of F32 F16 BF16 F64 I64 "
                     "I32 BOOL U8 I8 I16)", ctx, show(dt->str, dt->len, nm));
    t->dtype = (tio_dtype)i;
    uint64_t nbytes;
    tio_status st = get_shape(c, ctx, sh, t);
    if (!st) st = shape_bytes(c->E, ctx, t->shape, t->rank, t->dtype, TIO_ERR_FORMAT, &nbytes);
    if (st) return st;
    if (off->kind != J_ARR || off->n != 2 || off->el[0].kind != J_INT || off->el[1].kind != J_INT)
        return cfail(c, TIO_ERR_FORMAT, off->at, "%sdata_offsets must be an array of two integers", ctx);
    int64_t b = off->el[0].num, e = off->el[1].num;
    if (b < 0 || e < b || (uint64_t)e > data_len)
        return cfail(c, TIO_ERR_FORMAT, off->at, "%sdata_offsets [%lld, %lld]: expected 0 <= begin <= end <= %llu "
                     "(the data area size)", ctx, (long long)b, (long long)e, (unsigned long long)data_len);
    if ((uint64_t)(e - b) != nbytes)
        return cfail(c, TIO_ERR_FORMAT, off->at, "%sdata_offsets [%lld, %lld] span %llu bytes, but shape %s of %s "
                     "needs %llu", ctx, (long long)b, (long long)e, (unsigned long long)(e - b),
                     shape_str(t->shape, t->rank, s), DT[i].st, (unsigned long long)nbytes);
    t->nbytes = (size_t)nbytes;
    *r = (st_range){(uint64_t)b, (uint64_t)e, 0};
    if (!(t->name = tf_malloc(key->len + 1))) return fail(c->E, TIO_ERR_OOM, "out of memory");
    memcpy(t->name, key->str, key->len + 1);
    return TIO_OK;
}

/* JSON string with the escapes JSON needs (the text is valid UTF-8). */
static void json_put_str(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* The (checked) "__metadata__" object as compact JSON text, malloc'd; with
 * `key` (may be NULL), that key's value is `value`, appended when m lacks
 * the key. */
static tio_status meta_text(const ectx *E, const jval *m, const char *key, const char *value, char **out)
{
    char *text = NULL;
    size_t tlen = 0;
    bool found = false;
    FILE *f = open_memstream(&text, &tlen);
    if (!f) return fail(E, TIO_ERR_OOM, "out of memory");
    fputc('{', f);
    for (size_t i = 0; i < m->n; i++) {
        bool match = key && jis(&m->keys[i], key);
        found |= match;
        if (i) fputc(',', f);
        json_put_str(f, m->keys[i].str, m->keys[i].len);
        fputc(':', f);
        json_put_str(f, match ? value : m->el[i].str, match ? strlen(value) : m->el[i].len);
    }
    if (key && !found) {
        if (m->n) fputc(',', f);
        json_put_str(f, key, strlen(key));
        fputc(':', f);
        json_put_str(f, value, strlen(value));
    }
    fputc('}', f);
    bool bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        tf_libc_free(text);   /* stdio's buffer */
        return fail(E, TIO_ERR_OOM, "out of memory");
    }
    *out = text;
    return TIO_OK;
}

/* meta: NULL, or where the metadata text goes (NULL when there is none).
 * view (S in memory only): each tensor's data points into S->mem, not a
 * copy (tio_safetensors_view_mem). */
static tio_status st_parse(const ectx *E, const source *S, tio_tensor **out, size_t *nout, char **meta, bool view)
{
    uint64_t len = S->size;
    uint8_t lenbuf[8], *hdr = NULL;
    if (len < 8)
        return fail(E, TIO_ERR_FORMAT, "file is %llu bytes, expected at least 8 (the header length)",
                    (unsigned long long)len);
    tio_status st = src_read(E, S, 0, lenbuf, 8);
    if (st) return st;
    uint64_t hl = get_le(lenbuf, 8), far = 0;
    if (!memcmp(lenbuf, "\x93NUMPY", 6))   /* another format's magic, not a length */
        return fail(E, TIO_ERR_FORMAT, "not a safetensors file: it is a .npy array (NumPy's format); params and checkpoints "
                    "are safetensors files (what tfuse train --save writes)");
    if (!memcmp(lenbuf, "TFUSE-PA", 8))
        return fail(E, TIO_ERR_FORMAT, "not a safetensors file: it is a tfuse package (.tfp); run, train and bench take it as "
                    "the model (FILE), not as params");
    if (hl > len - 8 && hl <= ST_MAX_HEADER)
        return fail(E, TIO_ERR_FORMAT, "header length %llu goes beyond the end of the file (%llu bytes follow "
                    "the length)", (unsigned long long)hl, (unsigned long long)(len - 8));
    if (hl > ST_MAX_HEADER)
        return fail(E, TIO_ERR_LIMIT, "header length %llu is over the 100 MB limit (file is %llu bytes): not a safetensors file%s",
                    (unsigned long long)hl, (unsigned long long)len, hl > len ? ", or a truncated one" : "");
    if (hl > len - 8)
        return fail(E, TIO_ERR_FORMAT, "header length %llu goes beyond the end of the file (%llu bytes follow "
                    "the length)", (unsigned long long)hl, (unsigned long long)(len - 8));
    if ((st = src_dup(E, S, 8, (size_t)hl, "JSON header", &hdr))) return st;
    pcur c = {E, "JSON header", hdr, (size_t)hl, 0, 8, false};
    size_t count = 0, k = 0, far_idx = 0;
    uint64_t data_off = 8 + hl, data_len = len - data_off;
    tio_tensor *ts = NULL;
    st_range *r = NULL;
    jval root = {0};
    char a[NAME_BUF], b[NAME_BUF];
    st = jparse(&c, &root);
    if (!st && root.kind != J_OBJ)
        st = cfail(&c, TIO_ERR_FORMAT, root.at, "expected a JSON object, found %s", jkind_name(&root));
    if (st) goto done;
    for (size_t i = 0; i < root.n; i++) count += !jis(&root.keys[i], "__metadata__");
    ts = tf_calloc(count ? count : 1, sizeof *ts);
    r = tf_calloc(count ? count : 1, sizeof *r);
    if (!ts || !r) { st = fail(E, TIO_ERR_OOM, "out of memory for %zu tensors", count); goto done; }
    for (size_t i = 0; i < root.n && !st; i++) {
        if (jis(&root.keys[i], "__metadata__")) {
            if (!(st = check_metadata(&c, &root.el[i])) && meta) st = meta_text(E, &root.el[i], NULL, NULL, meta);
        } else if (!(st = st_entry(&c, &root.keys[i], &root.el[i], data_len, &ts[k], &r[k]))) r[k].idx = k, k++;
    }
    if (st) goto done;
    /* The tensors must tile the data area: sorted by begin, each non-empty
     * range starts exactly where the previous one ended (earlier is an
     * overlap, later a gap), and the last one ends at the end of the file.
     * So the data read below is exactly the file's remaining bytes. */
    qsort(r, count, sizeof *r, range_cmp);
    for (size_t i = 0; i < count; i++) {
        if (r[i].b == r[i].e) continue;
        const char *nb = ts[r[i].idx].name;
        if (r[i].b < far) {
            const char *na = ts[far_idx].name;
            st = fail(E, TIO_ERR_FORMAT, "tensors \"%s\" and \"%s\" overlap: both use bytes [%llu, %llu) of the "
                      "data area", show(na, strlen(na), a), show(nb, strlen(nb), b), (unsigned long long)r[i].b,
                      (unsigned long long)(r[i].e < far ? r[i].e : far));
            goto done;
        }
        if (r[i].b > far) {
            st = fail(E, TIO_ERR_FORMAT, "a gap of %llu bytes before tensor \"%s\": bytes [%llu, %llu) of the data "
                      "area belong to no tensor (tensors must be packed end to end)",
                      (unsigned long long)(r[i].b - far), show(nb, strlen(nb), b), (unsigned long long)far,
                      (unsigned long long)r[i].b);
            goto done;
        }
        far = r[i].e;
        far_idx = r[i].idx;
    }
    if (far < data_len) {
        st = fail(E, TIO_ERR_FORMAT, "%llu trailing byte%s after the tensors: the data area (from byte %llu) is %llu "
                  "bytes, the header's tensors use %llu", (unsigned long long)(data_len - far),
                  data_len - far == 1 ? "" : "s",
                  (unsigned long long)data_off, (unsigned long long)data_len, (unsigned long long)far);
        goto done;
    }
    for (size_t i = 0; view && i < count; i++) {
        tio_tensor *t = &ts[r[i].idx];
        t->data = (void *)(S->mem + data_off + r[i].b);
        for (size_t b = 0; t->dtype == TIO_BOOL && b < t->nbytes && !st; b++)
            if (S->mem[data_off + r[i].b + b] > 1)
                st = fail(E, TIO_ERR_FORMAT, "tensor \"%s\": bool byte %zu is %u, expected 0 or 1",
                          show(t->name, strlen(t->name), a), b, (unsigned)S->mem[data_off + r[i].b + b]);
    }
    if (st) goto done;
    for (size_t i = 0; !view && i < count; i++) {
        tio_tensor *t = &ts[r[i].idx];
        if (!(t->data = tf_malloc(t->nbytes ? t->nbytes : 1))) {
            st = fail(E, TIO_ERR_OOM, "cannot allocate %zu bytes of tensor data", t->nbytes);
            goto done;
        }
        if ((st = src_read(E, S, data_off + r[i].b, t->data, t->nbytes))) goto done;
        fix_data(t, false);
    }
done:
    jfree(&root);
    tf_free(r);
    tf_free(hdr);
    if (st) {
        if (view) tio_views_free(ts, count);
        else tio_tensors_free(ts, count);
        if (meta) tf_libc_free(*meta), *meta = NULL;   /* stdio's buffer */
        return st;
    }
    if (!count) tf_free(ts), ts = NULL;
    *out = ts;
    *nout = count;
    return TIO_OK;
}

tio_status tio_safetensors_read_meta(const char *path, tio_tensor **out, size_t *n, char **meta, char *err,
                                     size_t errlen)
{
    ectx E = {path, err, errlen};
    source S;
    if (err && errlen) err[0] = 0;
    if (meta) *meta = NULL;
    if (!out || !n || !path) return fail(&E, TIO_ERR_ARG, "NULL %s argument", !path ? "path" : "output");
    *out = NULL;
    *n = 0;
    tio_status st = src_open(&E, &S);
    if (st) return st;
    st = st_parse(&E, &S, out, n, meta, false);
    src_close(&S);
    return st;
}

tio_status tio_safetensors_read(const char *path, tio_tensor **out, size_t *n, char *err, size_t errlen)
{
    return tio_safetensors_read_meta(path, out, n, NULL, err, errlen);
}

tio_status tio_safetensors_read_mem(const char *name, const void *data, size_t len, tio_tensor **out, size_t *n,
                                    char **meta, char *err, size_t errlen)
{
    ectx E = {name, err, errlen};
    if (err && errlen) err[0] = 0;
    if (meta) *meta = NULL;
    if (!out || !n || !name || (!data && len))
        return fail(&E, TIO_ERR_ARG, "NULL %s argument", !name ? "name" : !data ? "data" : "output");
    *out = NULL;
    *n = 0;
    source S = {-1, data ? data : (const uint8_t *)"", len};
    return st_parse(&E, &S, out, n, meta, false);
}

tio_status tio_safetensors_view_mem(const char *name, const void *data, size_t len, tio_tensor **out, size_t *n, char *err,
                                    size_t errlen)
{
    ectx E = {name, err, errlen};
    if (err && errlen) err[0] = 0;
    if (!out || !n || !name || (!data && len))
        return fail(&E, TIO_ERR_ARG, "NULL %s argument", !name ? "name" : !data ? "data" : "output");
    *out = NULL;
    *n = 0;
    source S = {-1, data ? data : (const uint8_t *)"", len};
    return st_parse(&E, &S, out, n, NULL, true);
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Names must be present, non-empty, UTF-8, not "__metadata__", and unique. */
static tio_status st_check_tensors(const ectx *E, const tio_tensor *ts, size_t n)
{
    char nm[NAME_BUF], ctx[NAME_BUF + 16];
    for (size_t i = 0; i < n; i++) {
        const char *name = ts[i].name;
        if (!name || !*name)
            return fail(E, TIO_ERR_ARG, "tensor %zu: expected a non-empty name, found %s", i, name ? "\"\"" : "NULL");
        size_t nl = strlen(name);
        snprintf(ctx, sizeof ctx, "tensor \"%s\": ", show(name, nl, nm));
        if (!strcmp(name, "__metadata__") || utf8_bad((const unsigned char *)name, nl) < nl)
            return fail(E, TIO_ERR_ARG, "%sname is reserved or not valid UTF-8", ctx);
        tio_status st = check_tensor(E, ctx, &ts[i]);
        if (st) return st;
    }
    if (n < 2) return TIO_OK;
    const char **names = tf_malloc(n * sizeof *names);
    tio_status st = TIO_OK;
    if (!names) return fail(E, TIO_ERR_OOM, "out of memory");
    for (size_t i = 0; i < n; i++) names[i] = ts[i].name;
    qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 1; i < n && !st; i++)
        if (!strcmp(names[i - 1], names[i]))
            st = fail(E, TIO_ERR_ARG, "duplicate tensor name \"%s\"", show(names[i], strlen(names[i]), nm));
    tf_free(names);
    return st;
}

/* The header of a safetensors file of ts (the 8-byte length, then the JSON,
 * padded so the data starts 8-aligned) into *hdr (libc malloc, via
 * open_memstream: tf_libc_free it) and *hlen; what follows it is each
 * tensor's nbytes in order. */
static tio_status st_header(ectx *E, const tio_tensor *ts, size_t n, const char *meta, char **hdr, size_t *hlen)
{
    *hdr = NULL, *hlen = 0;
    if (!ts && n) return fail(E, TIO_ERR_ARG, "NULL tensors argument");
    tio_status st = st_check_tensors(E, ts, n);
    if (st) return st;
    if (meta) {
        /* Validate with the reader's parser, then embed the text verbatim. */
        pcur c = {E, "metadata JSON", (const unsigned char *)meta, strlen(meta), 0, 0, false};
        jval m = {0};
        if (!(st = jparse(&c, &m))) st = check_metadata(&c, &m);
        jfree(&m);
        if (st) return st == TIO_ERR_OOM ? st : TIO_ERR_ARG;
    }
    /* Build the header with stdio into a growing buffer (POSIX open_memstream). */
    uint64_t off = 0;
    FILE *m = open_memstream(hdr, hlen);
    if (!m) return fail(E, TIO_ERR_OOM, "out of memory");
    fputs("        {", m);   /* the length, written below */
    if (meta) fputs("\"__metadata__\":", m), fputs(meta, m);
    for (size_t i = 0; i < n; i++) {
        const tio_tensor *t = &ts[i];
        fputs(i || meta ? ",\"" : "\"", m);
        for (const char *p = t->name; *p; p++) {   /* JSON-escape the name */
            unsigned char ch = (unsigned char)*p;
            if (ch == '"' || ch == '\\') fprintf(m, "\\%c", ch);
            else if (ch < 0x20) fprintf(m, "\\u%04x", ch);
            else fputc(ch, m);
        }
        fprintf(m, "\":{\"dtype\":\"%s\",\"shape\":[", DT[t->dtype].st);
        for (int k = 0; k < t->rank; k++) fprintf(m, k ? ",%lld" : "%lld", (long long)t->shape[k]);
        /* each tensor is in memory and <= 2^40 bytes, so the sum cannot wrap */
        fprintf(m, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    fputc('}', m);
    long pos = ftell(m);
    while (pos > 8 && (pos - 8) % 8) fputc(' ', m), pos++;   /* the data area (at 8 + the JSON) starts 8-aligned */
    bool bad = pos < 0 || ferror(m);
    if (fclose(m) != 0 || bad) st = fail(E, TIO_ERR_OOM, "out of memory building the header");
    else if (*hlen - 8 > ST_MAX_HEADER)
        st = fail(E, TIO_ERR_LIMIT, "header would be %zu bytes, over the 100 MB limit readers enforce", *hlen - 8);
    if (!st) put_le((uint8_t *)*hdr, *hlen - 8, 8);
    if (st) {
        tf_libc_free(*hdr);
        *hdr = NULL;
    }
    return st;
}

tio_status tio_safetensors_write(const char *path, const tio_tensor *ts, size_t n, const char *meta, char *err,
                                 size_t errlen)
{
    ectx E = {path, err, errlen};
    if (err && errlen) err[0] = 0;
    if (!path) return fail(&E, TIO_ERR_ARG, "NULL path argument");
    char *hdr;
    size_t hlen;
    tio_status st = st_header(&E, ts, n, meta, &hdr, &hlen);
    if (st) return st;
    chunk *cs = tf_malloc((n + 1) * sizeof *cs);
    if (!cs) st = fail(&E, TIO_ERR_OOM, "out of memory");
    if (!st) {
        cs[0] = (chunk){hdr, hlen};
        for (size_t i = 0; i < n; i++) cs[1 + i] = (chunk){ts[i].data, ts[i].nbytes};
        st = atomic_write(&E, cs, n + 1);
    }
    tf_free(cs);
    tf_libc_free(hdr);   /* stdio's buffer */
    return st;
}

tio_status tio_safetensors_header(const tio_tensor *ts, size_t n, const char *meta, char **hdr, size_t *hlen, char *err,
                                  size_t errlen)
{
    ectx E = {"safetensors", err, errlen};
    if (err && errlen) err[0] = 0;
    return st_header(&E, ts, n, meta, hdr, hlen);
}

/* ---- metadata objects -------------------------------------------------------------------- */

static tio_status meta_parse(const ectx *E, const char *json, jval *m)
{
    pcur c = {E, "metadata JSON", (const unsigned char *)json, strlen(json), 0, 0, false};
    tio_status st = jparse(&c, m);
    return st ? st : check_metadata(&c, m);
}

tio_status tio_meta_get(const char *json, const char *key, char **value, char *err, size_t errlen)
{
    ectx E = {"metadata", err, errlen};
    if (err && errlen) err[0] = 0;
    if (value) *value = NULL;
    if (!json || !key || !value) return fail(&E, TIO_ERR_ARG, "NULL argument");
    jval m = {0};
    tio_status st = meta_parse(&E, json, &m);
    const jval *v = st ? NULL : jget(&m, key);
    if (v && !(*value = tf_libc_copy(v->str, strlen(v->str) + 1)))   /* the caller free()s it */
        st = fail(&E, TIO_ERR_OOM, "out of memory");
    jfree(&m);
    return st;
}

tio_status tio_meta_set(const char *json, const char *key, const char *value, char **out, char *err, size_t errlen)
{
    ectx E = {"metadata", err, errlen};
    if (err && errlen) err[0] = 0;
    if (out) *out = NULL;
    if (!key || !value || !out) return fail(&E, TIO_ERR_ARG, "NULL argument");
    char b[NAME_BUF];
    if (utf8_bad((const unsigned char *)key, strlen(key)) < strlen(key))
        return fail(&E, TIO_ERR_ARG, "key \"%s\" is not valid UTF-8", show(key, strlen(key), b));
    if (utf8_bad((const unsigned char *)value, strlen(value)) < strlen(value))
        return fail(&E, TIO_ERR_ARG, "the value of \"%s\" is not valid UTF-8", show(key, strlen(key), b));
    jval m = {.kind = J_OBJ};
    tio_status st = json ? meta_parse(&E, json, &m) : TIO_OK;
    if (!st) st = meta_text(&E, &m, key, value, out);
    jfree(&m);
    return st;
}

/* ---- freeing ----------------------------------------------------------------------------- */

void tio_tensor_free(tio_tensor *t)
{
    if (!t) return;
    tf_free(t->name);
    tf_free(t->data);
    t->name = t->data = NULL, t->nbytes = 0;
}

void tio_views_free(tio_tensor *ts, size_t n)
{
    if (!ts) return;
    for (size_t i = 0; i < n; i++) tf_free(ts[i].name);
    tf_free(ts);
}

void tio_tensors_free(tio_tensor *ts, size_t n)
{
    if (!ts) return;
    for (size_t i = 0; i < n; i++) tio_tensor_free(&ts[i]);
    tf_free(ts);
}
