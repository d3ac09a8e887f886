/* package.h — the `.tfp` container: named sections, each with its own
 * checksum, and one checksum over the whole file.
 *
 *   offset 0   "TFUSE-PACKAGE\n" + 2 zero bytes (16 bytes)
 *              u32 format version (TF_PKG_VERSION), u32 section count
 *   then per section:
 *              u32 name length, the name (no NUL), u64 data length,
 *              the data, one zero byte (so that a section read in
 *              place is a C string), u64 tf_hash64 of the data
 *              (cache_file.h)
 *   last       u64 FNV-1a 64 of every byte before it but the sections'
 *              data (their own hashes, which it covers, cover that)
 *
 * Integers are little-endian. A reader checks the magic, the version, that
 * every length stays inside the file, every section's checksum and the
 * file's (every byte is covered once: the data by tf_hash64, 4-8x faster
 * than FNV-1a on the params, the rest by the trailer); a truncated or altered file is refused with the byte offset or the
 * section that does not check out, never read past its end. Names are
 * printable ASCII up to 255 bytes and unique. The writer streams the file
 * from the sections into a temporary file renamed over the target. Nothing here knows what the sections mean:
 * runtime/api.c (tf_program_save / tf_program_load) does. */
#ifndef TF_RUNTIME_PACKAGE_H
#define TF_RUNTIME_PACKAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { TF_PKG_VERSION = 1 };

typedef struct tf_pkg_section {
    char *name;
    unsigned char *data;   /* data[len] is a NUL, so text sections are strings */
    size_t len;
    bool borrowed;         /* data points into the parsed bytes (tf_pkg_parse), not a copy */
} tf_pkg_section;

typedef struct tf_pkg {
    tf_pkg_section *s;
    int n, cap;
    unsigned char *blob;   /* tf_pkg_read's file bytes, which sections point into; owned */
    size_t blob_mapped;    /* blob is the file mapped read-only (this many bytes), not a copy; 0: malloc'd */
} tf_pkg;

/* Add a copy of data under name (replacing nothing: names must be new).
 * false: out of memory, or a bad or repeated name (*why says which). */
bool tf_pkg_add(tf_pkg *p, const char *name, const void *data, size_t len, char *why, size_t n);
/* The same without the copy: data (tf_malloc'd, len + 1 bytes: a NUL goes at
 * data[len]) becomes the package's, freed with it, also on failure. */
bool tf_pkg_add_owned(tf_pkg *p, const char *name, unsigned char *data, size_t len, char *why, size_t n);
/* The section named, or NULL. */
const tf_pkg_section *tf_pkg_find(const tf_pkg *p, const char *name);
void tf_pkg_free(tf_pkg *p);

/* The whole file as bytes (malloc'd into *out, *len); or written to path
 * atomically (streamed: a temporary file beside it, fsync, rename; its
 * size into *written, which may be NULL). false with *why filled. */
bool tf_pkg_serialize(const tf_pkg *p, unsigned char **out, size_t *len, char *why, size_t n);
bool tf_pkg_write(const tf_pkg *p, const char *path, size_t *written, char *why, size_t n);
/* Parse bytes / a file into p (which must be empty): the sections point
 * into b, which must outlive p (tf_pkg_read's buffer is p's). false with
 * *why ("truncated: ...", "checksum of section 'x' does not match", ...).
 * *oom is set when memory ran out. */
bool tf_pkg_parse(tf_pkg *p, const unsigned char *b, size_t len, bool *oom, char *why, size_t n);
/* tf_pkg_read maps the file (read-only, private; it reads it where mapping
 * fails): a program loaded from a package uses the page cache's pages, and
 * its sessions copy the initial params from them once. tfuse replaces a
 * package by renaming a new file over it, which leaves a mapping intact;
 * truncating a package in place while a process uses it is what it is for
 * any mapped file (SIGBUS on the lost pages). */
bool tf_pkg_read(tf_pkg *p, const char *path, bool *oom, char *why, size_t n);
/* Whether the first bytes of a file are a package's magic. */
bool tf_pkg_is_package(const char *path);

#endif
