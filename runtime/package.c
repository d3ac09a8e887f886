/* package.c — see package.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "cache_file.h"
#include "package.h"

static const char MAGIC[16] = "TFUSE-PACKAGE\n\0";

/* A package's size limit when reading: params of the biggest model tfuse
 * plans are a few GB; 64 GiB stops absurd length fields early. */
#define PKG_MAX_BYTES ((uint64_t)64 << 30)

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static bool name_ok(const char *name, size_t len)
{
    if (len == 0 || len > 255) return false;
    for (size_t i = 0; i < len; i++)
        if (name[i] < 0x21 || name[i] > 0x7e) return false;
    return true;
}

const tf_pkg_section *tf_pkg_find(const tf_pkg *p, const char *name)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->s[i].name, name)) return &p->s[i];
    return NULL;
}

/* A section named name[0..nlen): a copy of data, or (borrow) data itself,
 * which has a NUL at data[len]. */
static bool add_section(tf_pkg *p, const char *name, size_t nlen, const void *data, size_t len, bool borrow)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        tf_pkg_section *s = tf_realloc(p->s, (size_t)cap * sizeof *s);
        if (!s) return false;
        p->s = s, p->cap = cap;
    }
    tf_pkg_section *s = &p->s[p->n];
    s->name = tf_malloc(nlen + 1);
    s->borrowed = borrow;
    s->data = borrow ? (unsigned char *)data : tf_malloc(len + 1);
    if (!s->name || !s->data) {
        tf_free(s->name);
        if (!borrow) tf_free(s->data);
        return false;
    }
    memcpy(s->name, name, nlen);
    s->name[nlen] = 0;
    if (!borrow) {
        if (len) memcpy(s->data, data, len);
        s->data[len] = 0;
    }
    s->len = len;
    p->n++;
    return true;
}

bool tf_pkg_add(tf_pkg *p, const char *name, const void *data, size_t len, char *why, size_t n)
{
    if (!name_ok(name, strlen(name))) {
        snprintf(why, n, "bad section name '%.64s'", name);
        return false;
    }
    if (tf_pkg_find(p, name)) {
        snprintf(why, n, "section '%.64s' twice", name);
        return false;
    }
    if (!add_section(p, name, strlen(name), data, len, false)) {
        snprintf(why, n, "out of memory");
        return false;
    }
    return true;
}

bool tf_pkg_add_owned(tf_pkg *p, const char *name, unsigned char *data, size_t len, char *why, size_t n)
{
    if (!name_ok(name, strlen(name)) || tf_pkg_find(p, name)) {
        snprintf(why, n, tf_pkg_find(p, name) ? "section '%.64s' twice" : "bad section name '%.64s'", name);
        tf_free(data);
        return false;
    }
    data[len] = 0;
    if (!add_section(p, name, strlen(name), data, len, true)) {
        snprintf(why, n, "out of memory");
        tf_free(data);
        return false;
    }
    p->s[p->n - 1].borrowed = false;   /* owned: freed with the package */
    return true;
}

void tf_pkg_free(tf_pkg *p)
{
    for (int i = 0; i < p->n; i++) {
        tf_free(p->s[i].name);
        if (!p->s[i].borrowed) tf_free(p->s[i].data);
    }
    tf_free(p->s);
    if (p->blob_mapped) munmap(p->blob, p->blob_mapped);
    else tf_free(p->blob);
    memset(p, 0, sizeof *p);
}

bool tf_pkg_serialize(const tf_pkg *p, unsigned char **out, size_t *len, char *why, size_t n)
{
    size_t total = 16 + 8 + 8;
    for (int i = 0; i < p->n; i++) total += 4 + strlen(p->s[i].name) + 8 + p->s[i].len + 1 + 8;
    unsigned char *b = tf_malloc(total), *at = b;
    if (!b) {
        snprintf(why, n, "out of memory (%zu bytes)", total);
        return false;
    }
    memcpy(at, MAGIC, 16), at += 16;
    put32(at, TF_PKG_VERSION), put32(at + 4, (uint32_t)p->n), at += 8;
    uint64_t dir = tf_fnv1a(TF_FNV_BASIS, b, 24);   /* the trailer: every byte but the sections' data (their own hashes cover it) */
    for (int i = 0; i < p->n; i++) {
        size_t nl = strlen(p->s[i].name);
        unsigned char *head = at;
        put32(at, (uint32_t)nl), at += 4;
        memcpy(at, p->s[i].name, nl), at += nl;
        tf_le64_put(at, p->s[i].len), at += 8;
        dir = tf_fnv1a(dir, head, (size_t)(at - head));
        if (p->s[i].len) memcpy(at, p->s[i].data, p->s[i].len);
        at += p->s[i].len;
        head = at;
        *at++ = 0;
        tf_le64_put(at, tf_hash64(p->s[i].data, p->s[i].len)), at += 8;
        dir = tf_fnv1a(dir, head, 9);
    }
    tf_le64_put(at, dir);
    *out = b, *len = total;
    return true;
}

/* The bytes tf_pkg_serialize makes, streamed from the sections into a
 * temporary file beside path, made durable and renamed over it: a package
 * of large params is never held twice in memory. */
bool tf_pkg_write(const tf_pkg *p, const char *path, size_t *written, char *why, size_t n)
{
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%.4200s.tmp.%ld.%llx", path, (long)getpid(), (unsigned long long)(uintptr_t)p);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(why, n, "cannot write it: %s", strerror(errno ? errno : EIO));
        return false;
    }
    unsigned char head[24], b[4 + 255 + 8], tail[9];
    memcpy(head, MAGIC, 16);
    put32(head + 16, TF_PKG_VERSION), put32(head + 20, (uint32_t)p->n);
    uint64_t dir = tf_fnv1a(TF_FNV_BASIS, head, 24);
    size_t total = 24;
    bool ok = fwrite(head, 1, 24, f) == 24;
    for (int i = 0; ok && i < p->n; i++) {
        size_t nl = strlen(p->s[i].name);
        put32(b, (uint32_t)nl);
        memcpy(b + 4, p->s[i].name, nl);
        tf_le64_put(b + 4 + nl, p->s[i].len);
        dir = tf_fnv1a(dir, b, 4 + nl + 8);
        tail[0] = 0;
        tf_le64_put(tail + 1, tf_hash64(p->s[i].data, p->s[i].len));
        dir = tf_fnv1a(dir, tail, 9);
        ok = fwrite(b, 1, 4 + nl + 8, f) == 4 + nl + 8 && (!p->s[i].len || fwrite(p->s[i].data, 1, p->s[i].len, f) == p->s[i].len) &&
             fwrite(tail, 1, 9, f) == 9;
        total += 4 + nl + 8 + p->s[i].len + 9;
    }
    tf_le64_put(head, dir);
    ok = ok && fwrite(head, 1, 8, f) == 8 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) ok = false, e = errno;
    if (ok && rename(tmp, path) != 0) ok = false, e = errno;
    if (!ok) {
        remove(tmp);
        snprintf(why, n, "cannot write it: %s", strerror(e ? e : EIO));
        return false;
    }
    if (written) *written = total + 8;
    return true;
}

bool tf_pkg_parse(tf_pkg *p, const unsigned char *b, size_t len, bool *oom, char *why, size_t n)
{
    *oom = false;
    memset(p, 0, sizeof *p);
    if (len < 16 || memcmp(b, MAGIC, 16)) {
        snprintf(why, n, "not a tfuse package (it does not start with the package magic)");
        return false;
    }
    if (len < 32) {
        snprintf(why, n, "truncated: %zu bytes, less than a package's header and trailer", len);
        return false;
    }
    uint32_t version = get32(b + 16), count = get32(b + 20);
    if (version != TF_PKG_VERSION) {
        snprintf(why, n, "package format version %u; this tfuse reads version %d (recompile the model)", version, TF_PKG_VERSION);
        return false;
    }
    uint64_t dir = tf_fnv1a(TF_FNV_BASIS, b, 24);   /* the trailer's: package.h */
    size_t at = 24, end = len - 8;
    for (uint32_t i = 0; i < count; i++) {
        if (end - at < 4) goto truncated;
        size_t head = at;
        uint32_t nl = get32(b + at);
        at += 4;
        if (nl > end - at || end - at - nl < 8) goto truncated;
        const char *name = (const char *)b + at;
        if (!name_ok(name, nl)) {
            snprintf(why, n, "section %u at byte %zu has a bad name", i, at);
            goto fail;
        }
        at += nl;
        uint64_t dl = tf_le64_get(b + at);
        at += 8;
        dir = tf_fnv1a(dir, b + head, at - head);
        if (dl > end - at || end - at - dl < 9) goto truncated;
        const unsigned char *data = b + at;
        at += (size_t)dl;
        if (b[at++] != 0) {
            snprintf(why, n, "section '%.*s' does not end in its zero byte", (int)nl, name);
            goto fail;
        }
        dir = tf_fnv1a(dir, b + at - 1, 9);
        if (tf_le64_get(b + at) != tf_hash64(data, (size_t)dl)) {
            snprintf(why, n, "the checksum of section '%.*s' does not match: the file is corrupted", (int)nl, name);
            goto fail;
        }
        at += 8;
        for (int k = 0; k < p->n; k++)
            if (strlen(p->s[k].name) == nl && !memcmp(p->s[k].name, name, nl)) {
                snprintf(why, n, "section '%.*s' appears twice", (int)nl, name);
                goto fail;
            }
        if (!add_section(p, name, nl, data, (size_t)dl, true)) {
            *oom = true;
            snprintf(why, n, "out of memory");
            goto fail;
        }
    }
    if (at != end) {
        snprintf(why, n, "%zu bytes after the last section: the file is corrupted", end - at);
        goto fail;
    }
    if (tf_le64_get(b + end) != dir) {
        snprintf(why, n, "the file's checksum does not match: it is truncated or corrupted (%zu bytes)", len);
        goto fail;
    }
    return true;
truncated:
    snprintf(why, n, "truncated or corrupted: section %d runs past the end (byte %zu of %zu)", p->n, at, len);
fail:
    tf_pkg_free(p);
    return false;
}

bool tf_pkg_read(tf_pkg *p, const char *path, bool *oom, char *why, size_t n)
{
    *oom = false;
    memset(p, 0, sizeof *p);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, n, "cannot open: %s", strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(why, n, "not a regular file");
        return false;
    }
    if ((uint64_t)st.st_size > PKG_MAX_BYTES) {
        close(fd);
        snprintf(why, n, "%lld bytes: packages are limited to %llu bytes", (long long)st.st_size, (unsigned long long)PKG_MAX_BYTES);
        return false;
    }
    size_t len = (size_t)st.st_size;
    /* mapped, its pages filled in one call: the page cache's own pages, no copy into fresh memory (whose first
     * touch, a page fault per 4 KiB, costs more than the copy); read where mapping fails */
    int flags = MAP_PRIVATE;
#ifdef MAP_POPULATE
    flags |= MAP_POPULATE;
#endif
    void *map = len ? mmap(NULL, len, PROT_READ, flags, fd, 0) : MAP_FAILED;
    unsigned char *b = map != MAP_FAILED ? map : tf_malloc(len ? len : 1);
    bool ok = b != NULL;
    if (!ok) {
        *oom = true;
        snprintf(why, n, "out of memory reading %zu bytes", len);
    }
    for (size_t got = 0; ok && map == MAP_FAILED && got < len;) {
        ssize_t k = read(fd, b + got, len - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            snprintf(why, n, "read failed: %s", k < 0 ? strerror(errno) : "the file got shorter");
            ok = false;
        }
        got += k > 0 ? (size_t)k : 0;
    }
    close(fd);
    ok = ok && tf_pkg_parse(p, b, len, oom, why, n);
    if (ok) {   /* the sections point into it */
        p->blob = b;
        p->blob_mapped = map != MAP_FAILED ? len : 0;
    } else if (map != MAP_FAILED) {
        munmap(map, len);
    } else {
        tf_free(b);
    }
    return ok;
}

bool tf_pkg_is_package(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char head[16];
    bool yes = fread(head, 1, 16, f) == 16 && !memcmp(head, MAGIC, 16);
    fclose(f);
    return yes;
}
