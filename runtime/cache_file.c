/* cache_file.c — see cache_file.h. */
#include "cache_file.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "env.h"

uint64_t tf_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* tf_le64_get, inline (tf_hash64's loop: 8 bytes per call otherwise) */
static inline uint64_t le64(const unsigned char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
#endif
}

uint64_t tf_hash64(const void *p, size_t n)
{
    static const uint64_t prime = 0x100000001b3ull;
    const unsigned char *b = p;
    uint64_t h[4] = {TF_FNV_BASIS, TF_FNV_BASIS ^ 1, TF_FNV_BASIS ^ 2, TF_FNV_BASIS ^ 3};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 4; l++) h[l] = (h[l] ^ le64(b + i + 8 * (size_t)l)) * prime;
    uint64_t r = TF_FNV_BASIS;
    for (int l = 0; l < 4; l++) r = (r ^ h[l]) * prime;
    r = tf_fnv1a(r, b + i, n - i);
    return (r ^ (uint64_t)n) * prime;
}

void tf_le64_put(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

uint64_t tf_le64_get(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

bool tf_make_dirs(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%.4000s", dir);
    for (char *q = p + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return false;
        *q = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return false;
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

bool tf_cache_root(char *out, size_t n)
{
    const char *env = tf_env("TFUSE_CACHE_DIR"), *home = tf_env("HOME");
    if (env && *env) snprintf(out, n, "%.3900s", env);
    else if (home && *home) snprintf(out, n, "%.3900s/.cache/tfuse", home);
    else return false;
    for (size_t l = strlen(out); l > 1 && out[l - 1] == '/'; l--) out[l - 1] = 0;   /* "dir/": one spelling of each path */
    return true;
}

bool tf_cache_subdir(const char *sub, char *out, size_t n)
{
    char root[4000];
    if (!tf_cache_root(root, sizeof root)) return false;
    snprintf(out, n, "%.3900s/%.64s", root, sub);
    return tf_make_dirs(out);
}

/* tf_write_atomic; durable: fsync'd before the rename */
static bool write_renamed(const char *path, const void *data, size_t n, const void *tag, bool durable)
{
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%.4200s.tmp.%ld.%llx", path, (long)getpid(), (unsigned long long)(uintptr_t)tag);
    FILE *f = fopen(tmp, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && (!durable || fsync(fileno(f)) == 0);
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return false;
    }
    return true;
}

bool tf_write_atomic(const char *path, const void *data, size_t n, const void *tag) { return write_renamed(path, data, n, tag, true); }

bool tf_record_write(const char *path, const char *header, const char *key, const char *body, const void *tag)
{
    char text[8192];
    int at = snprintf(text, sizeof text, "%skey: %s\n%s", header, key, body);
    if (at <= 0 || (size_t)at + 32 >= sizeof text) return false;
    at += snprintf(text + at, sizeof text - (size_t)at, "sum: %016llx\n",
                   (unsigned long long)tf_fnv1a(TF_FNV_BASIS, text, (size_t)at));
    return tf_cache_put(path, text, (size_t)at, tag);
}

bool tf_record_read(const char *path, const char *header, const char *key, char *body, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char buf[8192];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    if (len == 0 || len >= sizeof buf - 1) return false;
    buf[len] = 0;
    if (strlen(buf) != len) return false;   /* a NUL inside: not ours */
    char *sum = strstr(buf, "\nsum: ");
    if (!sum) return false;
    sum++;
    unsigned long long want = 0;
    int used = 0;
    if (sscanf(sum, "sum: %16llx\n%n", &want, &used) != 1 || used <= 0 || sum + used != buf + len) return false;
    if (tf_fnv1a(TF_FNV_BASIS, buf, (size_t)(sum - buf)) != want) return false;
    size_t hl = strlen(header), kl = strlen(key);
    if (strncmp(buf, header, hl) || strncmp(buf + hl, "key: ", 5) || strncmp(buf + hl + 5, key, kl) || buf[hl + 5 + kl] != '\n')
        return false;
    const char *p = buf + hl + 5 + kl + 1;
    if ((size_t)(sum - p) >= n) return false;
    memcpy(body, p, (size_t)(sum - p));
    body[sum - p] = 0;
    tf_cache_touch(path);
    return true;
}

bool tf_cache_dir_or(const char *dir, const char *sub, char *out, size_t n)
{
    if (dir) {
        if (!dir[0]) return false;
        snprintf(out, n, "%.4000s", dir);
        return tf_make_dirs(out);
    }
    return tf_cache_subdir(sub, out, n);
}

void tf_cache_key_field(const char *text, char *out, size_t n)
{
    snprintf(out, n, "%s", text ? text : "");
    for (char *q = out; *q; q++)
        if (*q == '\n' || *q == '\r') *q = ' ';
}

/* ---- the bound and eviction ---- */

const char *const tf_cache_parts[TF_CACHE_NPARTS] = {"cpu", "cuda", "cuda-emu"};

bool tf_cache_parse_size(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)s[0])) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return false;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    default: break;
    }
    if (shift) {
        end++;
        if (!strcmp(end, "B") || !strcmp(end, "iB")) end += strlen(end);   /* 2GB, 2GiB: the same 2G */
    }
    if (*end || v == 0 || v > (UINT64_MAX >> shift)) return false;
    *out = (uint64_t)v << shift;
    return true;
}

bool tf_cache_max(uint64_t *out, const char **from, char *why, size_t n)
{
    const char *e = tf_env("TFUSE_CACHE_MAX");
    uint64_t v;
    *out = TF_CACHE_DEFAULT_MAX;
    if (from) *from = "default";
    if (!e || !*e) return true;
    if (!tf_cache_parse_size(e, &v)) {
        if (why && n)
            snprintf(why, n, "TFUSE_CACHE_MAX=%.200s is not a size: give the disk cache's bound in bytes, or a number "
                     "with K, M, G or T (powers of 1024; at least 1), e.g. TFUSE_CACHE_MAX=2G", e);
        return false;
    }
    *out = v;
    if (from) *from = "env";
    return true;
}

void tf_cache_touch(const char *path)
{
    /* a cuda-emu entry is a link to the object it shares: both are used now */
    utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW);
    utimensat(AT_FDCWD, path, NULL, 0);
}

typedef struct entry {
    char *name;
    int part;
    int64_t size;
    struct timespec mtime;
} entry;

typedef struct walk {
    entry *e;
    size_t n, cap;
    bool oom;                   /* some entries were not listed: nothing is evicted */
    tf_cache_usage u;
} walk;

static uint64_t usage_total(const tf_cache_usage *u)
{
    uint64_t t = 0;
    for (int p = 0; p < TF_CACHE_NPARTS; p++) t += (uint64_t)u->bytes[p];
    return t;
}

/* Count part's entries into w; clean: remove stale work files and dangling
 * links; list: keep each entry's name, size and mtime. */
static bool walk_part(const char *root, int part, bool clean, bool list, walk *w)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s/%s", root, tf_cache_parts[part]);
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT;
    int fd = dirfd(d);
    time_t now = time(NULL);
    for (struct dirent *de; (de = readdir(d));) {
        const char *nm = de->d_name;
        struct stat st;
        if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
        if (fstatat(fd, nm, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;   /* removed meanwhile */
        if (S_ISDIR(st.st_mode)) continue;
        if (strstr(nm, ".tmp.")) {   /* a work file: a live writer's, or a killed one's */
            if (clean && now - st.st_mtime > TF_CACHE_STALE_S) unlinkat(fd, nm, 0);
            continue;
        }
        if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) continue;
        struct stat target;
        if (clean && S_ISLNK(st.st_mode) && fstatat(fd, nm, &target, 0) != 0 && errno == ENOENT) {
            unlinkat(fd, nm, 0);   /* its object was evicted */
            continue;
        }
        w->u.entries[part]++;
        w->u.bytes[part] += st.st_size;
        if (!list || w->oom) continue;
        if (w->n == w->cap) {
            size_t cap = w->cap ? 2 * w->cap : 256;
            entry *e = tf_realloc(w->e, cap * sizeof *e);
            if (!e) {
                w->oom = true;
                continue;
            }
            w->e = e, w->cap = cap;
        }
        char *name = tf_strdup(nm);
        if (!name) {
            w->oom = true;
            continue;
        }
        w->e[w->n++] = (entry){.name = name, .part = part, .size = st.st_size, .mtime = st.st_mtim};
    }
    closedir(d);
    return true;
}

static void walk_free(walk *w)
{
    for (size_t i = 0; i < w->n; i++) tf_free(w->e[i].name);
    tf_free(w->e);
}

bool tf_cache_count(const char *root, tf_cache_usage *u)
{
    walk w;
    memset(&w, 0, sizeof w);
    bool ok = true;
    for (int p = 0; p < TF_CACHE_NPARTS; p++) ok &= walk_part(root, p, false, false, &w);
    *u = w.u;
    return ok;
}

/* The least recently used first; equal times by name, so that every
 * process orders them alike. */
static int by_mtime(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The root's lock and running total, opened and locked; -1 when it cannot
 * be made. Closing the descriptor unlocks it. */
static int usage_lock(const char *root)
{
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/usage", root);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0 && errno == ENOENT && tf_make_dirs(root)) fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}   /* no flock (some network disks): ENOENT races stay harmless */
    return fd;
}

static const char USAGE_HEAD[] = "tfuse disk cache usage 1\n";

/* The running total and when it was last counted; false when the file has none. */
static bool usage_read(int fd, uint64_t *bytes, long long *counted)
{
    char buf[256];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return false;
    buf[n] = 0;
    unsigned long long b;
    if (strncmp(buf, USAGE_HEAD, sizeof USAGE_HEAD - 1) ||
        sscanf(buf + sizeof USAGE_HEAD - 1, "bytes %llu\ncounted %lld\n", &b, counted) != 2)
        return false;
    *bytes = b;
    return true;
}

static void usage_write(int fd, uint64_t bytes, long long counted)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%sbytes %llu\ncounted %lld\n", USAGE_HEAD, (unsigned long long)bytes, counted);
    if (pwrite(fd, buf, (size_t)n, 0) != n || ftruncate(fd, n) != 0) {
        if (ftruncate(fd, 0) != 0) {}   /* half a record reads as none: the next write counts again */
    }
}

/* Walk every part (removing leftovers) and, above bound, remove the least
 * recently used entries until at most target stays; the lock is held. */
static void evict_locked(const char *root, uint64_t bound, uint64_t target, tf_cache_usage *left)
{
    walk w;
    memset(&w, 0, sizeof w);
    for (int p = 0; p < TF_CACHE_NPARTS; p++) walk_part(root, p, true, true, &w);
    uint64_t total = usage_total(&w.u);
    if (total > bound && !w.oom) {
        qsort(w.e, w.n, sizeof *w.e, by_mtime);
        for (size_t i = 0; i < w.n && total > target; i++) {
            char path[4400];
            snprintf(path, sizeof path, "%.4000s/%s/%s", root, tf_cache_parts[w.e[i].part], w.e[i].name);
            if (unlink(path) != 0 && errno != ENOENT) continue;   /* another process's eviction took it: as good */
            total -= (uint64_t)w.e[i].size;
            w.u.entries[w.e[i].part]--;
            w.u.bytes[w.e[i].part] -= w.e[i].size;
        }
    }
    walk_free(&w);
    if (left) *left = w.u;
}

bool tf_cache_evict(const char *root, uint64_t bound, uint64_t target, tf_cache_usage *left)
{
    int fd = usage_lock(root);
    if (fd < 0) return false;
    tf_cache_usage u;
    evict_locked(root, bound, target, &u);
    usage_write(fd, usage_total(&u), (long long)time(NULL));
    close(fd);
    if (left) *left = u;
    return true;
}

void tf_cache_added(const char *path, uint64_t bytes)
{
    char root[4000];
    if (!tf_cache_root(root, sizeof root)) return;
    size_t rl = strlen(root);
    if (strncmp(path, root, rl) || path[rl] != '/') return;
    const char *rest = path + rl + 1;
    bool ours = false;
    for (int p = 0; p < TF_CACHE_NPARTS && !ours; p++) {
        size_t pl = strlen(tf_cache_parts[p]);
        ours = !strncmp(rest, tf_cache_parts[p], pl) && rest[pl] == '/' && !strchr(rest + pl + 1, '/');
    }
    if (!ours) return;
    uint64_t max, total = 0;
    tf_cache_max(&max, NULL, NULL, 0);
    int fd = usage_lock(root);
    if (fd < 0) return;
    long long counted = 0, now = (long long)time(NULL);
    bool known = usage_read(fd, &total, &counted) && counted <= now + 60 && now - counted < 24 * 3600;
    if (known) total += bytes;
    if (!known || total > max) {   /* count again; evict down to 90% of the bound when above it */
        tf_cache_usage u;
        evict_locked(root, max, max - max / 10, &u);
        total = usage_total(&u);
        counted = now;
    }
    usage_write(fd, total, counted);
    close(fd);
}

bool tf_cache_put(const char *path, const void *data, size_t n, const void *tag)
{
    if (!write_renamed(path, data, n, tag, false)) return false;
    tf_cache_added(path, n);
    return true;
}

bool tf_cache_clear(const char *root, const char *part, tf_cache_usage *removed)
{
    memset(removed, 0, sizeof *removed);
    int which = -1;
    for (int p = 0; part && p < TF_CACHE_NPARTS; p++)
        if (!strcmp(part, tf_cache_parts[p])) which = p;
    if (part && which < 0) return false;
    struct stat st;
    if (stat(root, &st) != 0) return errno == ENOENT;   /* no cache yet: nothing to remove */
    int fd = usage_lock(root);
    if (fd < 0) return false;
    time_t now = time(NULL);
    for (int p = 0; p < TF_CACHE_NPARTS; p++) {
        if (which >= 0 && p != which) continue;
        char dir[4200];
        snprintf(dir, sizeof dir, "%.4000s/%s", root, tf_cache_parts[p]);
        DIR *d = opendir(dir);
        if (!d) continue;
        int dfd = dirfd(d);
        for (struct dirent *de; (de = readdir(d));) {
            const char *nm = de->d_name;
            if (!strcmp(nm, ".") || !strcmp(nm, "..") || fstatat(dfd, nm, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
            if (S_ISDIR(st.st_mode)) continue;
            bool work = strstr(nm, ".tmp.") != NULL;
            if (work && now - st.st_mtime <= TF_CACHE_STALE_S) continue;   /* a live writer's */
            if (unlinkat(dfd, nm, 0) != 0 || work) continue;
            removed->entries[p]++;
            removed->bytes[p] += st.st_size;
        }
        closedir(d);
    }
    tf_cache_usage left;
    tf_cache_count(root, &left);
    usage_write(fd, usage_total(&left), (long long)now);
    close(fd);
    return true;
}
