/* cache_file.c — see cache_file.h. */
#include "cache_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t tf_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
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

bool tf_cache_subdir(const char *sub, char *out, size_t n)
{
    const char *env = getenv("TFUSE_CACHE_DIR"), *home = getenv("HOME");
    if (env && *env) snprintf(out, n, "%.3900s/%.64s", env, sub);
    else if (home && *home) snprintf(out, n, "%.3900s/.cache/tfuse/%.64s", home, sub);
    else return false;
    return tf_make_dirs(out);
}

bool tf_write_atomic(const char *path, const void *data, size_t n, const void *tag)
{
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%.4200s.tmp.%ld.%llx", path, (long)getpid(), (unsigned long long)(uintptr_t)tag);
    FILE *f = fopen(tmp, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return false;
    }
    return true;
}

bool tf_record_write(const char *path, const char *header, const char *key, const char *body, const void *tag)
{
    char text[8192];
    int at = snprintf(text, sizeof text, "%skey: %s\n%s", header, key, body);
    if (at <= 0 || (size_t)at + 32 >= sizeof text) return false;
    at += snprintf(text + at, sizeof text - (size_t)at, "sum: %016llx\n",
                   (unsigned long long)tf_fnv1a(TF_FNV_BASIS, text, (size_t)at));
    return tf_write_atomic(path, text, (size_t)at, tag);
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
