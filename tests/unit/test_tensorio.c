/* test_tensorio.c — round trips, hand-built files, a malformed-input corpus,
 * truncation sweeps and a deterministic mutation fuzz for runtime/tensorio.
 * Standalone: prints one line per failed check, then "N passed, M failed".
 * Build: gcc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g
 *        -fsanitize=address,undefined -Iruntime runtime/tensorio.c
 *        tests/unit/test_tensorio.c -o /tmp/t_tio */
#include "alloc.h"
#include "tensorio.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define ERRLEN 512

static int passed, failed;
static char dir[64];

static void check(bool ok, int line, const char *fmt, ...)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL line %d: ", line);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}
#define CHECK(cond, ...) check((cond), __LINE__, __VA_ARGS__)

/* ---- helpers ------------------------------------------------------------------------------ */

static const char *tpath(const char *name)
{
    static char bufs[4][320];
    static int k;
    char *p = bufs[k++ % 4];
    snprintf(p, 320, "%s/%.200s", dir, name);
    return p;
}

typedef struct buf { unsigned char *p; size_t n, cap; } buf;

static void bput(buf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = tf_realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void bstr(buf *b, const char *s) { bput(b, s, strlen(s)); }
static void ble(buf *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++, v >>= 8) {
        unsigned char c = (unsigned char)v;
        bput(b, &c, 1);
    }
}
static void bfree(buf *b) { tf_free(b->p); memset(b, 0, sizeof *b); }

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = tf_malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(p, 1, (size_t)sz, f);
    fclose(f);
    return p;
}

static bool exists(const char *path) { struct stat sb; return stat(path, &sb) == 0; }

/* An .npy byte string built by hand: preamble, header (padded like NumPy
 * when pad is set), then data. */
static void make_npy(buf *b, int major, const char *hdr, bool pad, const void *data, size_t dlen)
{
    size_t lsize = major == 1 ? 2 : 4, hl = strlen(hdr);
    size_t total = pad ? ((8 + lsize + hl + 1 + 63) / 64) * 64 - (8 + lsize) : hl;
    bput(b, "\x93NUMPY", 6);
    unsigned char ver[2] = {(unsigned char)major, 0};
    bput(b, ver, 2);
    ble(b, total, (int)lsize);
    bstr(b, hdr);
    for (size_t i = hl; pad && i + 1 < total; i++) bstr(b, " ");
    if (pad) bstr(b, "\n");
    bput(b, data, dlen);
}

/* A .safetensors byte string: 8-byte length, JSON (jlen bytes), data. */
static void make_st_n(buf *b, const char *json, size_t jlen, const void *data, size_t dlen)
{
    ble(b, jlen, 8);
    bput(b, json, jlen);
    bput(b, data, dlen);
}
static void make_st(buf *b, const char *json, const void *data, size_t dlen)
{
    make_st_n(b, json, strlen(json), data, dlen);
}

static void fill(void *p, size_t n, unsigned seed, tio_dtype dt)
{
    unsigned char *q = p;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        q[i] = dt == TIO_BOOL ? (unsigned char)((seed >> 16) & 1) : (unsigned char)(seed >> 16);
    }
}

static tio_tensor make_tensor(const char *name, tio_dtype dt, int rank, const int64_t *shape, unsigned seed)
{
    tio_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name ? strcpy(tf_malloc(strlen(name) + 1), name) : NULL;
    t.dtype = dt;
    t.rank = rank;
    size_t n = 1;
    for (int i = 0; i < rank; i++) {
        t.shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t.nbytes = n * tio_dtype_size(dt);
    t.data = tf_malloc(t.nbytes ? t.nbytes : 1);
    fill(t.data, t.nbytes, seed, dt);
    return t;
}

static bool same_tensor(const tio_tensor *a, const tio_tensor *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank || a->nbytes != b->nbytes) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return false;
    if ((a->name == NULL) != (b->name == NULL) || (a->name && strcmp(a->name, b->name))) return false;
    return a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0;
}

/* The data area of a written safetensors file must start at a multiple of 8. */
static bool st_aligned(const char *path)
{
    size_t len;
    unsigned char *raw = read_file(path, &len);
    uint64_t hl = 0;
    for (int i = 7; raw && len >= 8 && i >= 0; i--) hl = hl << 8 | raw[i];
    bool ok = raw && len >= 8 && hl <= len - 8 && (8 + hl) % 8 == 0;
    tf_free(raw);
    return ok;
}

static bool has_tmp_files(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool found = false;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) found = true;
    if (d) closedir(d);
    return found;
}

/* ---- .npy ------------------------------------------------------------------------------------- */

static const tio_dtype npy_dtypes[] = {TIO_F32, TIO_F16, TIO_F64, TIO_I64, TIO_I32, TIO_BOOL, TIO_U8, TIO_I8, TIO_I16};

static void test_npy_roundtrip(void)
{
    static const int64_t shapes[][4] = {{0}, {5}, {2, 3}, {2, 3, 4}, {2, 1, 3, 2}};
    char err[ERRLEN];
    for (size_t d = 0; d < sizeof npy_dtypes / sizeof npy_dtypes[0]; d++) {
        for (int rank = 0; rank <= 4; rank++) {
            const char *p = tpath("rt.npy");
            tio_tensor t = make_tensor(NULL, npy_dtypes[d], rank, shapes[rank], (unsigned)(d * 10 + (size_t)rank)), u;
            tio_status st = tio_npy_write(p, &t, err, sizeof err);
            CHECK(st == TIO_OK, "npy write %s rank %d: %s", tio_dtype_name(t.dtype), rank, err);
            st = tio_npy_read(p, &u, err, sizeof err);
            CHECK(st == TIO_OK, "npy read %s rank %d: %s", tio_dtype_name(t.dtype), rank, err);
            CHECK(st == TIO_OK && same_tensor(&t, &u), "npy round trip %s rank %d differs", tio_dtype_name(t.dtype),
                  rank);
            size_t n;
            unsigned char *raw = read_file(p, &n);
            size_t doff = raw && n >= 10 ? 10 + (size_t)(raw[8] | raw[9] << 8) : 0;
            CHECK(doff && doff % 64 == 0 && raw[doff - 1] == '\n' && n == doff + t.nbytes,
                  "npy %s rank %d: data must start at a multiple of 64 after '\\n'", tio_dtype_name(t.dtype), rank);
            tf_free(raw);
            tio_tensor_free(&t);
            tio_tensor_free(&u);
        }
    }
    /* an empty tensor */
    int64_t es[2] = {0, 3};
    tio_tensor t = make_tensor(NULL, TIO_F32, 2, es, 1), u;
    CHECK(tio_npy_write(tpath("empty.npy"), &t, err, sizeof err) == TIO_OK, "write empty: %s", err);
    CHECK(tio_npy_read(tpath("empty.npy"), &u, err, sizeof err) == TIO_OK && same_tensor(&t, &u) && u.data,
          "read empty: %s", err);
    tio_tensor_free(&t);
    tio_tensor_free(&u);
    CHECK(!has_tmp_files(), "temporary files left behind after npy writes");
}

/* The writer must produce NumPy's header byte for byte. */
static void expect_header(tio_dtype dt, int rank, const int64_t *shape, const char *dict)
{
    char err[ERRLEN];
    tio_tensor t = make_tensor(NULL, dt, rank, shape, 7);
    const char *p = tpath("hdr.npy");
    CHECK(tio_npy_write(p, &t, err, sizeof err) == TIO_OK, "write: %s", err);
    size_t n, dl = strlen(dict), total = ((10 + dl + 1 + 63) / 64) * 64;
    if ((10 + dl + 1) % 64 == 0) total += 64;   /* NumPy adds a full 64 when already aligned */
    unsigned char *raw = read_file(p, &n);
    bool ok = raw && n == total + t.nbytes && !memcmp(raw, "\x93NUMPY\x01\x00", 8) &&
              (size_t)(raw[8] | raw[9] << 8) == total - 10 && !memcmp(raw + 10, dict, dl) && raw[total - 1] == '\n';
    for (size_t i = 10 + dl; ok && i < total - 1; i++) ok = raw[i] == ' ';
    CHECK(ok, "npy header for %s is not NumPy's: expected %s", tio_dtype_name(dt), dict);
    tf_free(raw);
    tio_tensor_free(&t);
}

static void test_npy_exact_header(void)
{
    int64_t s23[2] = {2, 3}, s5[1] = {5};
    expect_header(TIO_F32, 2, s23, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
    expect_header(TIO_I64, 1, s5, "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }");
    expect_header(TIO_BOOL, 0, NULL, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }");
    expect_header(TIO_U8, 1, s5, "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }");
}

static void test_npy_bf16(void)
{
    char err[ERRLEN];
    int64_t s[1] = {4};
    tio_tensor t = make_tensor(NULL, TIO_BF16, 1, s, 3);
    const char *p = tpath("bf16.npy");
    tio_status st = tio_npy_write(p, &t, err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, p) && strstr(err, "bf16") && strstr(err, "bfloat16"),
          "bf16 npy write must be refused clearly, got %d: %s", st, err);
    CHECK(!exists(p), "refused bf16 write must not create the file");
    tio_tensor_free(&t);
}

/* Read a hand-built npy and compare the values as int32 / double. */
static void expect_npy(const char *label, buf *b, tio_dtype dt, int rank, const int64_t *shape, const void *want,
                       size_t wlen)
{
    char err[ERRLEN];
    tio_tensor u;
    const char *p = tpath("hand.npy");
    write_file(p, b->p, b->n);
    tio_status st = tio_npy_read(p, &u, err, sizeof err);
    CHECK(st == TIO_OK, "%s: read failed: %s", label, err);
    if (st == TIO_OK) {
        bool ok = u.dtype == dt && u.rank == rank && u.nbytes == wlen && !memcmp(u.data, want, wlen);
        for (int i = 0; ok && i < rank; i++) ok = u.shape[i] == shape[i];
        CHECK(ok, "%s: wrong tensor (dtype %s rank %d nbytes %zu)", label, tio_dtype_name(u.dtype), u.rank, u.nbytes);
    }
    tio_tensor_free(&u);
    bfree(b);
}

static void test_npy_handbuilt(void)
{
    /* Exactly what np.save(np.array([1, 2, 3], dtype='<i4')) writes: magic,
     * version 1.0, header length 118, the dict, 60 spaces, '\n', data. */
    static const char npy_i4[] =
        "\x93NUMPY\x01\x00\x76\x00"
        "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"
        "                                                            \n"
        "\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00";
    int32_t v123[3] = {1, 2, 3};
    int64_t s3[1] = {3}, s23[2] = {2, 3}, s2[1] = {2};
    buf b = {0};
    CHECK(sizeof npy_i4 - 1 == 128 + 12, "hand-built npy literal has the wrong size");
    bput(&b, npy_i4, sizeof npy_i4 - 1);
    expect_npy("numpy-written <i4 (3,)", &b, TIO_I32, 1, s3, v123, sizeof v123);

    int32_t v6[6] = {0, 1, 2, 3, 4, 5};
    const char *variants[] = {
        "{'shape': (2, 3), 'fortran_order': False, 'descr': '<i4'}",
        "{\"descr\":\"<i4\",\n\t\"fortran_order\" : False ,\"shape\":( 2 ,3 ) }\n",
        "  {'descr':'<i4','fortran_order':False,'shape':(2,3,),}  \n",
        "{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 3L), }",
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char label[64];
        snprintf(label, sizeof label, "header variant %zu", i);
        make_npy(&b, 1, variants[i], i % 2 == 0, v6, sizeof v6);
        expect_npy(label, &b, TIO_I32, 2, s23, v6, sizeof v6);
    }
    make_npy(&b, 2, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", true, v6, sizeof v6);
    expect_npy("version 2.0", &b, TIO_I32, 2, s23, v6, sizeof v6);
    make_npy(&b, 3, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", true, v6, sizeof v6);
    expect_npy("version 3.0", &b, TIO_I32, 2, s23, v6, sizeof v6);
    int32_t scalar = 42;
    make_npy(&b, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", true, &scalar, 4);
    expect_npy("scalar", &b, TIO_I32, 0, NULL, &scalar, 4);

    /* big-endian descr is byte-swapped; '=' is native */
    static const unsigned char be_i4[8] = {0, 0, 0, 1, 0, 0, 1, 0};
    int32_t want_i4[2] = {1, 256};
    make_npy(&b, 1, "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", true, be_i4, 8);
    expect_npy("big-endian >i4", &b, TIO_I32, 1, s2, want_i4, sizeof want_i4);
    static const unsigned char be_f8[16] = {0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0xc0, 0x04, 0, 0, 0, 0, 0, 0};
    double want_f8[2] = {1.0, -2.5};
    make_npy(&b, 1, "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", true, be_f8, 16);
    expect_npy("big-endian >f8", &b, TIO_F64, 1, s2, want_f8, sizeof want_f8);
    static const unsigned char be_i2[4] = {0x12, 0x34, 0xff, 0xfe};
    int16_t want_i2[2] = {0x1234, -2};
    make_npy(&b, 1, "{'descr': '>i2', 'fortran_order': False, 'shape': (2,), }", true, be_i2, 4);
    expect_npy("big-endian >i2", &b, TIO_I16, 1, s2, want_i2, sizeof want_i2);
    static const unsigned char be_f2[2] = {0x3c, 0x00};
    uint16_t want_f2 = 0x3c00;
    make_npy(&b, 1, "{'descr': '>f2', 'fortran_order': False, 'shape': (), }", true, be_f2, 2);
    expect_npy("big-endian >f2", &b, TIO_F16, 0, NULL, &want_f2, 2);
    make_npy(&b, 1, "{'descr': '=i4', 'fortran_order': False, 'shape': (2,), }", true, want_i4, 8);
    expect_npy("native =i4", &b, TIO_I32, 1, s2, want_i4, sizeof want_i4);

    /* bool bytes are normalized to 0/1 */
    static const unsigned char bools[4] = {0, 1, 2, 255};
    static const unsigned char want_b[4] = {0, 1, 1, 1};
    int64_t s4[1] = {4};
    make_npy(&b, 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", true, bools, 4);
    expect_npy("bool normalization", &b, TIO_BOOL, 1, s4, want_b, 4);

    /* fortran_order True is transposed to C order */
    int32_t f23[6] = {0, 3, 1, 4, 2, 5};   /* column-major storage of [[0,1,2],[3,4,5]] */
    make_npy(&b, 1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }", true, f23, sizeof f23);
    expect_npy("fortran (2, 3)", &b, TIO_I32, 2, s23, v6, sizeof v6);
    int32_t f234[24], c234[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                c234[i * 12 + j * 4 + k] = i * 12 + j * 4 + k;
                f234[i + 2 * j + 6 * k] = i * 12 + j * 4 + k;
            }
    int64_t s234[3] = {2, 3, 4};
    make_npy(&b, 1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }", true, f234, sizeof f234);
    expect_npy("fortran (2, 3, 4)", &b, TIO_I32, 3, s234, c234, sizeof c234);
}

/* ---- malformed inputs ------------------------------------------------------------------------- */

static int bad_count;

/* Reading b must fail: with status want (or any failure if want is TIO_OK),
 * a message naming the path (and containing sub, if given), zeroed outputs. */
static void expect_bad(bool npy, const char *label, buf *b, tio_status want, const char *sub)
{
    char err[ERRLEN], name[64];
    snprintf(name, sizeof name, "bad%d.%s", bad_count++, npy ? "npy" : "safetensors");
    const char *p = tpath(name);
    write_file(p, b->p, b->n);
    tio_status st;
    bool zeroed;
    memset(err, 0, sizeof err);
    if (npy) {
        tio_tensor t;
        st = tio_npy_read(p, &t, err, sizeof err);
        zeroed = st == TIO_OK || (!t.data && !t.name);
        if (st == TIO_OK) tio_tensor_free(&t);
    } else {
        tio_tensor *ts = (tio_tensor *)&st;   /* poison: must be reset */
        size_t n = 99;
        st = tio_safetensors_read(p, &ts, &n, err, sizeof err);
        zeroed = st == TIO_OK || (!ts && !n);
        if (st == TIO_OK) tio_tensors_free(ts, n);
    }
    CHECK(st != TIO_OK && (want == TIO_OK || st == want), "%s: expected failure %d, got %d (%s)", label, want, st, err);
    CHECK(err[0] && strstr(err, p) && (!sub || strstr(err, sub)), "%s: message must name the path%s%s: \"%s\"",
          label, sub ? " and say " : "", sub ? sub : "", err);
    CHECK(zeroed, "%s: outputs must be zeroed on failure", label);
    unlink(p);
    bfree(b);
}

static void test_npy_malformed(void)
{
    buf b = {0};
    float f6[6] = {0};
    const char *ok_tail = "'fortran_order': False, 'shape': (2, 3), }";
    char hdr[512];

    expect_bad(true, "empty file", &b, TIO_ERR_FORMAT, "truncated header: file is 0 bytes");
    bstr(&b, "\x93NUMPZ\x01\x00\x10\x00");
    expect_bad(true, "bad magic", &b, TIO_ERR_FORMAT, "magic");
    bstr(&b, "PK\x03\x04 this is an npz");
    expect_bad(true, "zip file", &b, TIO_ERR_FORMAT, "magic");
    make_npy(&b, 4, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", true, f6, sizeof f6);
    expect_bad(true, "version 4.0", &b, TIO_ERR_FORMAT, "version 4.0");
    make_npy(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", true, f6, sizeof f6);
    b.p[7] = 1;
    expect_bad(true, "version 1.1", &b, TIO_ERR_FORMAT, "version 1.1");
    bput(&b, "\x93NUMPY\x01\x00\x76", 9);
    expect_bad(true, "truncated preamble", &b, TIO_ERR_FORMAT, "truncated header");
    make_npy(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", true, NULL, 0);
    b.p[8] = 0xff, b.p[9] = 0x7f;
    expect_bad(true, "header length beyond file", &b, TIO_ERR_FORMAT, "beyond the end");
    make_npy(&b, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", true, NULL, 0);
    b.p[8] = b.p[9] = b.p[10] = b.p[11] = 0xff;
    expect_bad(true, "v2 header length 4 GiB", &b, TIO_ERR_FORMAT, "beyond the end");

    struct { const char *hdr; tio_status st; const char *sub; } cases[] = {
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "expected ':'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", TIO_ERR_FORMAT, "expected"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}", TIO_ERR_FORMAT, "'extra'"},
        {"{'descr': '<f4', 'shape': (2, 3), }", TIO_ERR_FORMAT, "fortran_order"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "duplicate"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "<c8"},
        {"{'descr': '<U4', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "unsupported descr"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "unsupported descr"},
        {"{'descr': '', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "unsupported descr"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "structured"},
        {"{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "'|'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }", TIO_ERR_LIMIT, "9"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", TIO_ERR_FORMAT, "negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904), }",
         TIO_ERR_FORMAT, "overflow"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1073741824, 1048576), }", TIO_ERR_LIMIT, "2^40"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", TIO_ERR_FORMAT, "64 bits"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", TIO_ERR_FORMAT, "trailing comma"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", TIO_ERR_FORMAT, "tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 'x'), }", TIO_ERR_FORMAT, "integers"},
        {"{'descr': '<f4', 'fortran_order': 'no', 'shape': (2, 3), }", TIO_ERR_FORMAT, "True or False"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", TIO_ERR_FORMAT, "True or False"},
        {"{'descr': '\\x3cf4', 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, "escape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } junk", TIO_ERR_FORMAT, "only whitespace"},
        {"[1, 2]", TIO_ERR_FORMAT, "dict"},
        {"", TIO_ERR_FORMAT, "expected"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 3), }", TIO_ERR_FORMAT, "expected"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }", TIO_ERR_FORMAT, NULL},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3.0), }", TIO_ERR_FORMAT, "fraction"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char label[600];
        snprintf(label, sizeof label, "npy header <%s>", cases[i].hdr);
        make_npy(&b, 1, cases[i].hdr, true, f6, sizeof f6);
        expect_bad(true, label, &b, cases[i].st, cases[i].sub);
    }
    /* deep nesting must be refused, not overflow the stack */
    strcpy(hdr, "{'descr': ");
    for (int i = 0; i < 200; i++) strcat(hdr, "(");
    make_npy(&b, 1, hdr, true, NULL, 0);
    expect_bad(true, "deeply nested header", &b, TIO_ERR_FORMAT, "nested");
    /* NUL byte inside the header */
    snprintf(hdr, sizeof hdr, "{'descr': '<f4', %s", ok_tail);
    make_npy(&b, 1, hdr, true, f6, sizeof f6);
    b.p[20] = 0;
    expect_bad(true, "NUL in header", &b, TIO_ERR_FORMAT, "0x00");
    /* data shorter than the shape needs */
    make_npy(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", true, f6, 12);
    expect_bad(true, "truncated data", &b, TIO_ERR_FORMAT,
               "truncated data: shape (2, 3) of <f4 needs 24 bytes, file has 12");
    /* bytes after the data: an error that says how many, and where the file
     * should have ended (numpy.load would ignore them) */
    make_npy(&b, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", true, f6, sizeof f6);
    bstr(&b, "trailing bytes");
    expect_bad(true, "trailing bytes", &b, TIO_ERR_FORMAT,
               "14 trailing bytes after the data: shape (2, 3) of <i4 needs 24 bytes at byte 128, so the file "
               "should be 152 bytes, but it is 166");
    make_npy(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", true, f6, sizeof f6);
    bput(&b, "", 1);
    expect_bad(true, "one trailing byte", &b, TIO_ERR_FORMAT, "1 trailing byte after");
    /* a header over the 1 MiB limit (v2 length field), the file long enough */
    make_npy(&b, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", true, NULL, 0);
    b.p[8] = 0, b.p[9] = 0, b.p[10] = 0x20, b.p[11] = 0;   /* 2 MiB */
    for (int i = 0; i < (3 << 20) / 64; i++) bstr(&b, "                                                                ");
    expect_bad(true, "2 MiB npy header", &b, TIO_ERR_LIMIT, "1 MiB");
}

/* ---- safetensors ------------------------------------------------------------------------------- */

static void test_st_roundtrip(void)
{
    char err[ERRLEN];
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s05[2] = {0, 5}, s3[1] = {3}, s22[2] = {2, 2}, s7[1] = {7};
    int64_t s2222[4] = {2, 2, 2, 2};
    tio_tensor ts[11] = {
        make_tensor("w", TIO_F32, 2, s23, 1),         make_tensor("b16", TIO_BF16, 1, s4, 2),
        make_tensor("scalar", TIO_I64, 0, NULL, 3),   make_tensor("empty", TIO_F16, 2, s05, 4),
        make_tensor("mask", TIO_BOOL, 1, s3, 5),      make_tensor("tok", TIO_I32, 2, s22, 6),
        make_tensor("na\"me \xc3\xa9\\x", TIO_U8, 1, s7, 7), make_tensor("a.b.c", TIO_I8, 1, s3, 8),
        make_tensor("i16", TIO_I16, 4, s2222, 9),     make_tensor("d", TIO_F64, 1, s3, 10),
        make_tensor("w.x", TIO_F32, 1, s3, 11),
    };
    const char *p = tpath("rt.safetensors");
    const char *meta = " {\"format\": \"pt\", \"note\": \"a \\\"quoted\\\" \\u00e9 value\"} ";
    tio_status st = tio_safetensors_write(p, ts, 11, meta, err, sizeof err);
    CHECK(st == TIO_OK, "safetensors write: %s", err);
    tio_tensor *out = NULL;
    size_t n = 0;
    st = tio_safetensors_read(p, &out, &n, err, sizeof err);
    CHECK(st == TIO_OK && n == 11, "safetensors read: %s (n=%zu)", err, n);
    for (size_t i = 0; st == TIO_OK && i < n && i < 11; i++)
        CHECK(same_tensor(&ts[i], &out[i]), "safetensors round trip: tensor %zu (%s) differs", i, ts[i].name);
    tio_tensors_free(out, n);
    size_t len;
    unsigned char *raw = read_file(p, &len);
    CHECK(st_aligned(p), "safetensors data area must start 8-aligned");
    CHECK(raw && memmem(raw, len, "\"__metadata__\":", 15) && memmem(raw, len, "{\"format\": \"pt\"", 15),
          "metadata missing from header");
    tf_free(raw);

    /* no tensors, no metadata */
    st = tio_safetensors_write(tpath("none.safetensors"), NULL, 0, NULL, err, sizeof err);
    CHECK(st == TIO_OK && st_aligned(tpath("none.safetensors")), "write of zero tensors: %s", err);
    out = (tio_tensor *)1;
    st = tio_safetensors_read(tpath("none.safetensors"), &out, &n, err, sizeof err);
    CHECK(st == TIO_OK && n == 0 && out == NULL, "read of zero tensors: %s", err);

    /* overwriting keeps it atomic and leaves no temporary file */
    st = tio_safetensors_write(p, ts + 10, 1, NULL, err, sizeof err);
    CHECK(st == TIO_OK && st_aligned(p), "overwrite: %s", err);
    st = tio_safetensors_read(p, &out, &n, err, sizeof err);
    CHECK(st == TIO_OK && n == 1 && same_tensor(&out[0], &ts[10]), "overwritten file wrong: %s", err);
    if (st == TIO_OK) tio_tensors_free(out, n);
    CHECK(!has_tmp_files(), "temporary files left behind after safetensors writes");
    for (int i = 0; i < 11; i++) tio_tensor_free(&ts[i]);
}

static void test_st_handbuilt(void)
{
    static const char json[] =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[8,16]},"
        " \"w\\u00e9ight\" : { \"shape\" : [1, 2], \"dtype\" : \"F32\", \"data_offsets\" : [0, 8] } ,"
        "\"\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[16,17]}}    ";
    static const unsigned char data[17] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 9};
    buf b = {0};
    char err[ERRLEN];
    make_st(&b, json, data, sizeof data);
    const char *p = tpath("hand.safetensors");
    write_file(p, b.p, b.n);
    bfree(&b);
    tio_tensor *ts;
    size_t n;
    tio_status st = tio_safetensors_read(p, &ts, &n, err, sizeof err);
    CHECK(st == TIO_OK && n == 3, "hand-built safetensors: %s", err);
    if (st != TIO_OK || n != 3) return;
    int32_t *bi = ts[0].data;
    float *wf = ts[1].data;
    CHECK(!strcmp(ts[0].name, "b") && ts[0].dtype == TIO_I32 && ts[0].rank == 1 && ts[0].shape[0] == 2 &&
              bi[0] == 7 && bi[1] == -1, "hand-built tensor b wrong");
    CHECK(!strcmp(ts[1].name, "w\xc3\xa9ight") && ts[1].dtype == TIO_F32 && ts[1].rank == 2 && ts[1].shape[0] == 1 &&
              ts[1].shape[1] == 2 && wf[0] == 1.0f && wf[1] == 2.0f, "hand-built tensor w\\u00e9ight wrong");
    CHECK(!strcmp(ts[2].name, "\xf0\x9f\x98\x80") && ts[2].rank == 0 && ts[2].nbytes == 1 &&
              ((unsigned char *)ts[2].data)[0] == 9, "hand-built tensor with surrogate-pair name wrong");
    tio_tensors_free(ts, n);
}

static void test_st_malformed(void)
{
    buf b = {0};
    unsigned char d32[32] = {0};
    const char *T = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";

    bput(&b, "\x05\0\0\0\0", 5);
    expect_bad(false, "5-byte file", &b, TIO_ERR_FORMAT, "at least 8");
    expect_bad(false, "empty file", &b, TIO_ERR_FORMAT, "at least 8");
    ble(&b, 100, 8);
    bstr(&b, "{}");
    expect_bad(false, "header length larger than file", &b, TIO_ERR_FORMAT, "beyond the end");
    ble(&b, (uint64_t)1 << 40, 8);
    bstr(&b, "{}");
    expect_bad(false, "header length 2^40", &b, TIO_ERR_LIMIT, "100 MB");
    ble(&b, UINT64_MAX, 8);
    expect_bad(false, "header length 2^64-1", &b, TIO_ERR_LIMIT, "100 MB");

    struct { const char *json; tio_status st; const char *sub; } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", TIO_ERR_FORMAT, "string key"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "expected"},
        {"{\"a\":{\"dtype\":\"F32", TIO_ERR_FORMAT, "unterminated"},
        {"{\"a\\q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "escape"},
        {"{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "surrogate"},
        {"{\"a\\udc00\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "surrogate"},
        {"{\"a\\u12\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "hex"},
        {"{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "UTF-8"},
        {"{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "UTF-8"},
        {"[]", TIO_ERR_FORMAT, "found an array"},
        {"\"str\"", TIO_ERR_FORMAT, "found a string"},
        {"42", TIO_ERR_FORMAT, "found an integer"},
        {"", TIO_ERR_FORMAT, "expected"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", TIO_ERR_FORMAT, "duplicate"},
        {"{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "empty tensor name"},
        {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "NUL"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[32,40]}}", TIO_ERR_FORMAT, "data area"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", TIO_ERR_FORMAT, "begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", TIO_ERR_FORMAT, "begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", TIO_ERR_FORMAT, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "needs 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],\"data_offsets\":[0,8]}}",
         TIO_ERR_FORMAT, "overflow"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT,
         "64 bits"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1073741824,1073741824],\"data_offsets\":[0,8]}}", TIO_ERR_LIMIT,
         "2^40"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", TIO_ERR_LIMIT, "9"},
        {"{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", TIO_ERR_FORMAT, "F8_E4M3"},
        {"{\"a\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}", TIO_ERR_FORMAT, "unsupported dtype"},
        {"{\"a\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", TIO_ERR_FORMAT, "missing \"data_offsets\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", TIO_ERR_FORMAT, "\"x\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", TIO_ERR_FORMAT, "two integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "array"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "fraction"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e1],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "exponent"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "expected"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", TIO_ERR_FORMAT, "leading zeros"},
        {"{\"a\":5}", TIO_ERR_FORMAT, "expected an object"},
        {"{\"__metadata__\":{\"k\":1}}", TIO_ERR_FORMAT, "strings"},
        {"{\"__metadata__\":[]}", TIO_ERR_FORMAT, "__metadata__"},
        {"{} x", TIO_ERR_FORMAT, "only whitespace"},
        {"{'a':{}}", TIO_ERR_FORMAT, "string key"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}\n\t\"b\":1}", TIO_ERR_FORMAT, "','"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char label[600];
        snprintf(label, sizeof label, "safetensors header <%s>", cases[i].json);
        make_st(&b, cases[i].json, d32, sizeof d32);
        expect_bad(false, label, &b, cases[i].st, cases[i].sub);
    }
    /* NUL byte inside the JSON */
    static const char nul_json[] = "{\"a\":{\"dtype\":\"F32\"\0,\"shape\":[2],\"data_offsets\":[0,8]}}";
    make_st_n(&b, nul_json, sizeof nul_json - 1, d32, 8);
    expect_bad(false, "NUL in JSON", &b, TIO_ERR_FORMAT, "0x00");
    /* a UTF-8 sequence cut off by the end of the header, although the data
     * area right after it starts with a continuation byte */
    make_st(&b, "{\"a\":\"\xc3", "\xa9\xa9\xa9\xa9", 4);
    expect_bad(false, "UTF-8 cut by header end", &b, TIO_ERR_FORMAT, "UTF-8");
    /* raw control character inside a string */
    make_st(&b, "{\"a\tb\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d32, 8);
    expect_bad(false, "tab in string", &b, TIO_ERR_FORMAT, "control");
    /* nesting bomb: refused by depth, no stack overflow */
    char *bomb = tf_malloc(20003);
    strcpy(bomb, "{\"a\":");
    memset(bomb + 5, '[', 19990);
    bomb[19995] = 0;
    make_st(&b, bomb, NULL, 0);
    tf_free(bomb);
    expect_bad(false, "nesting bomb", &b, TIO_ERR_FORMAT, "nested");
    /* the data area is one byte shorter than the tensor */
    make_st(&b, T, d32, 7);
    expect_bad(false, "data one byte short", &b, TIO_ERR_FORMAT, "data area");
    /* bytes after the last tensor, and gaps between tensors, are errors */
    make_st(&b, T, d32, 9);
    expect_bad(false, "one trailing byte", &b, TIO_ERR_FORMAT,
               "1 trailing byte after the tensors: the data area (from byte 62) is 9 bytes, the header's tensors "
               "use 8");
    make_st(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[16,24]}}", d32, 24);
    expect_bad(false, "gap between tensors", &b, TIO_ERR_FORMAT,
               "a gap of 8 bytes before tensor \"b\": bytes [8, 16) of the data area belong to no tensor");
    make_st(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", d32, 12);
    expect_bad(false, "gap before the first tensor", &b, TIO_ERR_FORMAT, "a gap of 4 bytes before tensor \"a\"");
    make_st(&b, "{\"__metadata__\":{\"k\":\"v\"}}", d32, 3);
    expect_bad(false, "data but no tensors", &b, TIO_ERR_FORMAT, "3 trailing bytes");
    /* an empty tensor anywhere in the data area is fine */
    make_st(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[3,3]}}", d32, 8);
    {
        tio_tensor *ts = NULL;
        size_t n = 0;
        char err[ERRLEN];
        tio_status st = tio_safetensors_read_mem("mem.safetensors", b.p, b.n, &ts, &n, NULL, err, sizeof err);
        CHECK(st == TIO_OK && n == 2 && ts[1].nbytes == 0, "empty tensor inside the data area: %s", err);
        if (st == TIO_OK) tio_tensors_free(ts, n);
        bfree(&b);
    }
}

static void test_st_write_errors(void)
{
    char err[ERRLEN];
    int64_t s2[1] = {2}, neg[1] = {-2};
    tio_tensor ts[2] = {make_tensor("x", TIO_F32, 1, s2, 1), make_tensor("x", TIO_F32, 1, s2, 2)};
    const char *p = tpath("werr.safetensors");
    struct { const char *label; const char *meta; const char *sub; } metas[] = {
        {"non-string metadata", "{\"a\": 1}", "strings"},
        {"trailing comma metadata", "{\"a\": \"b\",}", "metadata JSON"},
        {"array metadata", "[\"a\"]", "object"},
        {"garbage metadata", "not json", "metadata JSON at byte 0"},
        {"empty metadata", "", "metadata JSON"},
    };
    tio_status st = tio_safetensors_write(p, ts, 2, NULL, err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, p) && strstr(err, "duplicate"), "duplicate names: %d %s", st, err);
    for (size_t i = 0; i < sizeof metas / sizeof metas[0]; i++) {
        st = tio_safetensors_write(p, ts, 1, metas[i].meta, err, sizeof err);
        CHECK(st == TIO_ERR_ARG && strstr(err, p) && strstr(err, metas[i].sub), "%s: %d %s", metas[i].label, st, err);
    }
    char *keep = ts[1].name;
    const char *names[] = {"", "__metadata__", "bad\xff"};
    for (int i = 0; i < 3; i++) {
        ts[1].name = (char *)names[i];
        st = tio_safetensors_write(p, ts, 2, NULL, err, sizeof err);
        CHECK(st == TIO_ERR_ARG && strstr(err, p), "bad name %d must be refused: %d %s", i, st, err);
    }
    ts[1].name = NULL;
    st = tio_safetensors_write(p, ts, 2, NULL, err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, "NULL"), "NULL name: %d %s", st, err);
    ts[1].name = keep;
    keep[0] = 'y';
    ts[1].nbytes = 4;
    st = tio_safetensors_write(p, ts, 2, NULL, err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, "nbytes"), "nbytes mismatch: %d %s", st, err);
    ts[1].nbytes = 8;
    ts[1].rank = 9;
    st = tio_safetensors_write(p, ts, 2, NULL, err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, "rank"), "rank 9: %d %s", st, err);
    ts[1].rank = 1;
    memcpy(ts[1].shape, neg, sizeof neg);
    st = tio_npy_write(tpath("neg.npy"), &ts[1], err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, "negative"), "negative shape: %d %s", st, err);
    ts[1].shape[0] = 2;
    ts[1].dtype = (tio_dtype)77;
    st = tio_npy_write(tpath("neg.npy"), &ts[1], err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, "dtype"), "invalid dtype: %d %s", st, err);
    ts[1].dtype = TIO_F32;
    void *data = ts[1].data;
    ts[1].data = NULL;
    st = tio_npy_write(tpath("neg.npy"), &ts[1], err, sizeof err);
    CHECK(st == TIO_ERR_ARG && strstr(err, "NULL"), "NULL data: %d %s", st, err);
    ts[1].data = data;
    CHECK(!exists(p) && !exists(tpath("neg.npy")), "refused writes must not create files");
    st = tio_npy_write(tpath("nodir/x.npy"), &ts[1], err, sizeof err);
    CHECK(st == TIO_ERR_IO && strstr(err, "nodir/x.npy") && strstr(err, "temporary"), "missing dir: %d %s", st, err);
    st = tio_safetensors_write(tpath("nodir/x.safetensors"), ts, 2, NULL, err, sizeof err);
    CHECK(st == TIO_ERR_IO && strstr(err, "nodir/x.safetensors"), "missing dir: %d %s", st, err);
    for (int i = 0; i < 2; i++) tio_tensor_free(&ts[i]);
}

/* ---- I/O errors and API edges ------------------------------------------------------------------ */

static void test_io_and_args(void)
{
    char err[ERRLEN], tiny[8];
    tio_tensor t, *ts;
    size_t n;
    tio_status st = tio_npy_read(tpath("missing.npy"), &t, err, sizeof err);
    CHECK(st == TIO_ERR_IO && strstr(err, "missing.npy") && strstr(err, "No such file"), "missing file: %s", err);
    st = tio_safetensors_read(dir, &ts, &n, err, sizeof err);
    CHECK(st == TIO_ERR_IO && strstr(err, dir) && strstr(err, "regular file"), "directory: %s", err);
    st = tio_npy_read(NULL, &t, err, sizeof err);
    CHECK(st == TIO_ERR_ARG && err[0], "NULL path: %s", err);
    st = tio_safetensors_read(tpath("x"), NULL, &n, err, sizeof err);
    CHECK(st == TIO_ERR_ARG && err[0], "NULL out: %s", err);
    st = tio_npy_read(tpath("missing.npy"), &t, NULL, 0);
    CHECK(st == TIO_ERR_IO, "err == NULL must be allowed");
    memset(tiny, 'x', sizeof tiny);
    st = tio_npy_read(tpath("missing.npy"), &t, tiny, sizeof tiny);
    CHECK(st == TIO_ERR_IO && strlen(tiny) == sizeof tiny - 1, "message must be truncated to errlen");

    /* A valid file padded (sparse) to 3 GiB: refused from its size and header
     * alone, without reading or allocating the padding (the readers used to
     * load the whole file and ignore the rest: 3.6 GB for a 200 KB array). */
    for (int fmt = 0; fmt < 2; fmt++) {
        const char *big = tpath(fmt ? "big.safetensors" : "big.npy");
        int64_t s2[1] = {2};
        tio_tensor one = make_tensor(fmt ? "w" : NULL, TIO_F32, 1, s2, 3);
        st = fmt ? tio_safetensors_write(big, &one, 1, NULL, err, sizeof err) : tio_npy_write(big, &one, err, sizeof err);
        tio_tensor_free(&one);
        CHECK(st == TIO_OK, "write %s: %s", big, err);
        struct rusage ru0, ru1;
        getrusage(RUSAGE_SELF, &ru0);
        if (truncate(big, ((off_t)3) << 30) == 0) {
            if (fmt) st = tio_safetensors_read(big, &ts, &n, err, sizeof err);
            else st = tio_npy_read(big, &t, err, sizeof err);
            getrusage(RUSAGE_SELF, &ru1);
            CHECK(st == TIO_ERR_FORMAT && strstr(err, big) && strstr(err, "trailing bytes"),
                  "file padded to 3 GiB: %d %s", st, err);
            CHECK(ru1.ru_maxrss - ru0.ru_maxrss < 64 * 1024, "reading a file padded to 3 GiB grew the RSS by %ld KiB",
                  ru1.ru_maxrss - ru0.ru_maxrss);
        }
        unlink(big);
    }

    /* the in-memory readers: the same checks, the name in messages */
    {
        int64_t s23[2] = {2, 3};
        tio_tensor w = make_tensor(NULL, TIO_I16, 2, s23, 9), u;
        const char *p = tpath("mem.npy");
        CHECK(tio_npy_write(p, &w, err, sizeof err) == TIO_OK, "write mem.npy: %s", err);
        size_t len;
        unsigned char *raw = read_file(p, &len);
        st = tio_npy_read_mem("mem.npy", raw, len, &u, err, sizeof err);
        CHECK(st == TIO_OK && same_tensor(&w, &u), "tio_npy_read_mem: %s", err);
        if (st == TIO_OK) tio_tensor_free(&u);
        st = tio_npy_read_mem("cut.npy", raw, len - 1, &u, err, sizeof err);
        CHECK(st == TIO_ERR_FORMAT && !strncmp(err, "cut.npy: truncated data", 23), "tio_npy_read_mem cut: %s", err);
        st = tio_npy_read_mem("none.npy", NULL, 0, &u, err, sizeof err);
        CHECK(st == TIO_ERR_FORMAT && strstr(err, "none.npy"), "tio_npy_read_mem of nothing: %s", err);
        tf_free(raw);
        unlink(p);
        tio_tensor_free(&w);
    }

    /* views: read_mem's tensors without the copies, the data in the caller's bytes; a bool byte other than 0
     * or 1, which a copy would normalize, is an error; a damaged file is refused as read_mem refuses it */
    {
        int64_t s23[2] = {2, 3}, s5[1] = {5}, s0[1] = {0};
        tio_tensor w[3] = {make_tensor("w", TIO_F32, 2, s23, 4), make_tensor("on", TIO_BOOL, 1, s5, 2),
                           make_tensor("e", TIO_BF16, 1, s0, 1)};
        const char *p = tpath("view.safetensors");
        CHECK(tio_safetensors_write(p, w, 3, NULL, err, sizeof err) == TIO_OK, "write view.safetensors: %s", err);
        size_t len, nv = 0, nr = 0;
        unsigned char *raw = read_file(p, &len);
        tio_tensor *vs = NULL, *rs = NULL;
        st = tio_safetensors_view_mem("view.safetensors", raw, len, &vs, &nv, err, sizeof err);
        CHECK(st == TIO_OK && nv == 3, "tio_safetensors_view_mem: %s", err);
        for (size_t i = 0; st == TIO_OK && i < nv; i++) {
            unsigned char *d = vs[i].data;
            CHECK(same_tensor(&w[i], &vs[i]) && d >= raw && d + vs[i].nbytes <= raw + len, "view of %s: not the file's bytes", w[i].name);
        }
        if (st == TIO_OK) tio_views_free(vs, nv);
        const tio_tensor *on = &w[1];
        size_t at = len - on->nbytes;   /* the bool tensor is the data area's last (written in order, e empty) */
        CHECK(!memcmp(raw + at, on->data, on->nbytes), "the bool tensor is not where the test expects it");
        raw[at + 3] = 2;
        st = tio_safetensors_view_mem("view.safetensors", raw, len, &vs, &nv, err, sizeof err);
        CHECK(st == TIO_ERR_FORMAT && strstr(err, "\"on\": bool byte 3 is 2") && !vs && !nv, "a bool byte of 2 in a view: %d %s", st, err);
        st = tio_safetensors_read_mem("view.safetensors", raw, len, &rs, &nr, NULL, err, sizeof err);
        CHECK(st == TIO_OK && ((unsigned char *)rs[1].data)[3] == 1, "a bool byte of 2 read: %d %s", st, err);
        if (st == TIO_OK) tio_tensors_free(rs, nr);
        st = tio_safetensors_view_mem("cut.safetensors", raw, len - 1, &vs, &nv, err, sizeof err);
        CHECK(st == TIO_ERR_FORMAT && strstr(err, "cut.safetensors") && !vs, "a view of a cut file: %d %s", st, err);
        tf_free(raw);
        unlink(p);
        for (int i = 0; i < 3; i++) tio_tensor_free(&w[i]);
    }

    static const char *names[] = {"f32", "f16", "bf16", "f64", "i64", "i32", "bool", "u8", "i8", "i16"};
    static const size_t sizes[] = {4, 2, 2, 8, 8, 4, 1, 1, 1, 2};
    for (int i = 0; i < 10; i++)
        CHECK(!strcmp(tio_dtype_name((tio_dtype)i), names[i]) && tio_dtype_size((tio_dtype)i) == sizes[i],
              "dtype %d name/size", i);
    CHECK(tio_dtype_size((tio_dtype)10) == 0 && !strcmp(tio_dtype_name((tio_dtype)-1), "?"), "invalid dtype");
    tio_tensor_free(NULL);
    tio_tensors_free(NULL, 3);
}

/* ---- truncation sweep and mutation fuzz ---------------------------------------------------------- */

static void sweep(bool npy, const unsigned char *good, size_t len)
{
    char err[ERRLEN];
    const char *p = tpath(npy ? "sweep.npy" : "sweep.safetensors");
    int bad = 0;
    for (size_t cut = 0; cut < len; cut++) {
        write_file(p, good, cut);
        tio_status st;
        tio_tensor t, *ts;
        size_t n;
        err[0] = 0;
        if (npy) st = tio_npy_read(p, &t, err, sizeof err);
        else st = tio_safetensors_read(p, &ts, &n, err, sizeof err);
        if (st == TIO_OK) npy ? tio_tensor_free(&t) : tio_tensors_free(ts, n);
        if (st == TIO_OK || !strstr(err, p)) {
            if (bad++ < 3) printf("  truncation at %zu of %zu: status %d, \"%s\"\n", cut, len, st, err);
        }
    }
    CHECK(bad == 0, "%s: %d truncations were accepted or badly reported", npy ? "npy" : "safetensors", bad);
}

static uint64_t lcg = 0x2545F4914F6CDD1DULL;
static uint32_t rnd(void)
{
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg >> 33);
}

/* Mutate a valid file 2000 times, biased toward the header; any result is
 * fine as long as nothing crashes or leaks and failures are reported. */
static void fuzz(bool npy, const unsigned char *good, size_t len, size_t hdr_end)
{
    static const unsigned char interesting[] = {0, 0xff, '"', '\'', '{', '}', '[', ']', '(', ')', ',', ':', '\\',
                                                '-', '0', '9', ' ', 'u', 0x80, 0xc3};
    char err[ERRLEN];
    const char *p = tpath(npy ? "fuzz.npy" : "fuzz.safetensors");
    unsigned char *m = tf_malloc(len);
    int ok = 0, silent = 0;
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = len;
        memcpy(m, good, len);
        for (int k = 1 + (int)(rnd() % 4); k > 0; k--) {
            size_t pos = rnd() % 10 < 8 ? rnd() % hdr_end : rnd() % len;
            switch (rnd() % 5) {
            case 0: m[pos] ^= (unsigned char)(1u << (rnd() % 8)); break;
            case 1: m[pos] = (unsigned char)rnd(); break;
            case 2: m[pos] = interesting[rnd() % sizeof interesting]; break;
            case 3: if (pos < n) n = pos; break;
            default: if (pos + 1 < len) memmove(m + pos, m + pos + 1, len - pos - 1); break;
            }
        }
        write_file(p, m, n);
        tio_status st;
        tio_tensor t, *ts;
        size_t cnt;
        err[0] = 0;
        if (npy) st = tio_npy_read(p, &t, err, sizeof err);
        else st = tio_safetensors_read(p, &ts, &cnt, err, sizeof err);
        if (st == TIO_OK) {
            ok++;
            npy ? tio_tensor_free(&t) : tio_tensors_free(ts, cnt);
        } else if (!strstr(err, p)) {
            if (silent++ < 3) printf("  mutation %d: status %d without a proper message: \"%s\"\n", iter, st, err);
        }
    }
    tf_free(m);
    CHECK(silent == 0, "%s fuzz: %d failures without a message naming the path", npy ? "npy" : "safetensors", silent);
    CHECK(ok < 2000, "%s fuzz: no mutation was rejected", npy ? "npy" : "safetensors");
}

static void test_sweeps_and_fuzz(void)
{
    char err[ERRLEN];
    int64_t s23[2] = {2, 3}, s4[1] = {4};
    tio_tensor t = make_tensor(NULL, TIO_F32, 2, s23, 5);
    CHECK(tio_npy_write(tpath("good.npy"), &t, err, sizeof err) == TIO_OK, "write good.npy: %s", err);
    size_t len;
    unsigned char *good = read_file(tpath("good.npy"), &len);
    if (good) {
        sweep(true, good, len);
        fuzz(true, good, len, 128);
    }
    tf_free(good);
    tio_tensor_free(&t);

    tio_tensor ts[3] = {make_tensor("alpha", TIO_F32, 2, s23, 1), make_tensor("beta", TIO_BF16, 1, s4, 2),
                        make_tensor("gamma", TIO_I64, 1, s4, 3)};
    CHECK(tio_safetensors_write(tpath("good.safetensors"), ts, 3, "{\"k\":\"v\"}", err, sizeof err) == TIO_OK,
          "write good.safetensors: %s", err);
    good = read_file(tpath("good.safetensors"), &len);
    if (good) {
        size_t hl = (size_t)good[0] | (size_t)good[1] << 8;
        sweep(false, good, len);
        fuzz(false, good, len, 8 + hl);
    }
    tf_free(good);
    for (int i = 0; i < 3; i++) tio_tensor_free(&ts[i]);
}

/* ---- main ------------------------------------------------------------------------------------------ */

static void cleanup(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(tpath(e->d_name));
    if (d) closedir(d);
    rmdir(dir);
}

int main(void)
{
    strcpy(dir, "/tmp/test_tensorio_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_npy_roundtrip();
    test_npy_exact_header();
    test_npy_bf16();
    test_npy_handbuilt();
    test_npy_malformed();
    test_st_roundtrip();
    test_st_handbuilt();
    test_st_malformed();
    test_st_write_errors();
    test_io_and_args();
    test_sweeps_and_fuzz();
    cleanup();
    printf("%d passed, %d failed\n", passed, failed);
    return failed > 0;
}
