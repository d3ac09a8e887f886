/* test_disk_cache.c — the disk cache's bound (runtime/cache_file.h), in a
 * fresh $TFUSE_CACHE_DIR of its own: TFUSE_CACHE_MAX parsed or refused;
 * a write past the bound evicts the least recently used entries (by
 * mtime, set here by hand) down to 90% of it, across the parts; a hit
 * makes an entry the most recently used; a write under the bound walks
 * nothing (a stale work file survives it); work files of live writers,
 * directories and entries stay, stale work files and dangling links go;
 * a torn or corrupted record is a miss, refreshed by nothing, and written
 * again whole; processes writing, reading and evicting one cache at once
 * leave every entry whole and the total within the bound; the public
 * tf_disk_cache_* calls count and clear. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_file.h"
#include "check.h"
#include "tfuse.h"

static char root[128];

static void path_of(char *out, size_t n, const char *part, const char *name)
{
    snprintf(out, n, "%s/%s/%s", root, part, name);
}

static bool exists(const char *part, const char *name)
{
    char p[512];
    struct stat st;
    path_of(p, sizeof p, part, name);
    return lstat(p, &st) == 0;
}

static void put(const char *part, const char *name, size_t bytes)
{
    char p[512], dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, part);
    tf_make_dirs(dir);
    path_of(p, sizeof p, part, name);
    char *data = malloc(bytes);
    memset(data, 'x', bytes);
    CHECK(tf_cache_put(p, data, bytes, data), "put %s", p);
    free(data);
}

static void set_mtime(const char *part, const char *name, time_t t)
{
    char p[512];
    path_of(p, sizeof p, part, name);
    struct timespec ts[2] = {{.tv_sec = t}, {.tv_sec = t}};
    CHECK(utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW) == 0, "set the mtime of %s: %s", p, strerror(errno));
}

static time_t mtime_of(const char *part, const char *name)
{
    char p[512];
    struct stat st;
    path_of(p, sizeof p, part, name);
    return lstat(p, &st) == 0 ? st.st_mtime : 0;
}

static int64_t total(void)
{
    tf_cache_usage u;
    CHECK(tf_cache_count(root, &u), "count %s", root);
    int64_t t = 0;
    for (int p = 0; p < TF_CACHE_NPARTS; p++) t += u.bytes[p];
    return t;
}

static void sizes(void)
{
    static const struct { const char *s; uint64_t v; } good[] = {
        {"1", 1}, {"4096", 4096}, {"64K", 64 << 10}, {"64k", 64 << 10}, {"512M", 512ull << 20}, {"2G", 2ull << 30},
        {"2GB", 2ull << 30}, {"2GiB", 2ull << 30}, {"1T", 1ull << 40},
    };
    static const char *const bad[] = {"", "0", "0G", "-1", "12X", "1.5G", "G", " 5", "5 ", "2GG", "2Gb",
                                      "99999999999999999999", "17179869184G", "0x100"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        uint64_t v = 0;
        CHECK(tf_cache_parse_size(good[i].s, &v) && v == good[i].v, "'%s' is %llu bytes (got %llu)", good[i].s,
              (unsigned long long)good[i].v, (unsigned long long)v);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint64_t v = 7;
        CHECK(!tf_cache_parse_size(bad[i], &v) && v == 7, "'%s' is refused", bad[i]);
    }
    uint64_t max = 0;
    const char *from = NULL;
    char why[512] = "";
    unsetenv("TFUSE_CACHE_MAX");
    CHECK(tf_cache_max(&max, &from, why, sizeof why) && max == TF_CACHE_DEFAULT_MAX && max == 2ull << 30 && !strcmp(from, "default"),
          "unset: the default, 2 GiB (%llu)", (unsigned long long)max);
    setenv("TFUSE_CACHE_MAX", "3M", 1);
    CHECK(tf_cache_max(&max, &from, why, sizeof why) && max == 3ull << 20 && !strcmp(from, "env"), "TFUSE_CACHE_MAX=3M");
    setenv("TFUSE_CACHE_MAX", "lots", 1);
    CHECK(!tf_cache_max(&max, &from, why, sizeof why) && max == TF_CACHE_DEFAULT_MAX && strstr(why, "TFUSE_CACHE_MAX=lots") &&
          strstr(why, "not a size"), "a malformed TFUSE_CACHE_MAX is an error that names it (%s); the default stays", why);
    tf_context_t *ctx;
    int64_t m = 0;
    CHECK(!tf_context_create(&ctx), "context");
    CHECK(tf_disk_cache_max(ctx, &m) == TF_ERR_INVALID_ARG && strstr(tf_context_last_error(ctx), "TFUSE_CACHE_MAX=lots"),
          "the API refuses it too: %s", tf_context_last_error(ctx));
    tf_disk_cache_info info;
    CHECK(tf_disk_cache_get_info(ctx, &info) == TF_ERR_INVALID_ARG, "and get_info with it");
    tf_context_free(ctx);
    unsetenv("TFUSE_CACHE_MAX");
}

/* Ten entries of 1000 bytes fill a bound of 10000; each write past it
 * evicts the two least recently used. */
static void lru(void)
{
    setenv("TFUSE_CACHE_MAX", "10000", 1);
    time_t t0 = time(NULL) - 1000;
    char name[32];
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "e%d.o", i);
        put("cpu", name, 1000);
        set_mtime("cpu", name, t0 + 10 * i);   /* e0 the least recently used */
    }
    CHECK(total() == 10000, "at the bound, nothing evicted (%lld)", (long long)total());
    /* a hit on e0 and e1: the most recently used now */
    char p[512];
    path_of(p, sizeof p, "cpu", "e0.o");
    tf_cache_touch(p);
    path_of(p, sizeof p, "cpu", "e1.o");
    tf_cache_touch(p);
    CHECK(mtime_of("cpu", "e0.o") >= t0 + 999, "a hit sets the mtime to now");
    put("cpu", "e10.o", 1000);   /* 11000: down to 9000 */
    CHECK(total() <= 9000, "a write past the bound evicts down to 90%% of it (%lld)", (long long)total());
    CHECK(!exists("cpu", "e2.o") && !exists("cpu", "e3.o"), "the two least recently used went");
    CHECK(exists("cpu", "e0.o") && exists("cpu", "e1.o"), "the entries just hit stay, older as they were written");
    for (int i = 4; i <= 10; i++) {
        snprintf(name, sizeof name, "e%d.o", i);
        CHECK(exists("cpu", name), "%s stays", name);
    }
    /* the parts share the bound: an old entry of another part goes first */
    put("cuda", "old.cubin", 500);
    set_mtime("cuda", "old.cubin", t0 - 100);
    put("cuda-emu", "new.so", 500);   /* 10000: at the bound */
    CHECK(exists("cuda", "old.cubin") && total() == 10000, "at the bound again (%lld)", (long long)total());
    put("cpu", "e11.o", 1000);   /* 11000 */
    CHECK(!exists("cuda", "old.cubin") && !exists("cpu", "e4.o") && exists("cuda-emu", "new.so") && exists("cpu", "e11.o"),
          "across the parts, least recently used first");
    CHECK(total() <= 9000, "90%% of the bound (%lld)", (long long)total());
    /* an entry larger than the bound does not stay */
    put("cpu", "huge.o", 20000);
    CHECK(!exists("cpu", "huge.o") && total() <= 9000, "an entry past the bound by itself is evicted too (%lld)", (long long)total());
}

/* Work files, directories, dangling links; a write under the bound walks nothing. */
static void leftovers(void)
{
    setenv("TFUSE_CACHE_MAX", "10000", 1);
    char p[700], live[512], stale[512], dangling[512], inc[512];
    path_of(live, sizeof live, "cpu", "k.o.tmp.99999.1");
    path_of(stale, sizeof stale, "cpu", "k.o.tmp.99998.1");
    path_of(dangling, sizeof dangling, "cuda-emu", "0123.so");
    path_of(inc, sizeof inc, "cuda-emu", "include");
    tf_make_dirs(inc);
    snprintf(p, sizeof p, "%s/cuda_fp16.h", inc);
    FILE *f = fopen(p, "w");
    CHECK(f && fputs("// header\n", f) >= 0 && fclose(f) == 0, "a header in cuda-emu/include");
    for (int i = 0; i < 2; i++) {
        f = fopen(i ? stale : live, "w");
        CHECK(f && fputs("half written", f) >= 0 && fclose(f) == 0, "a work file");
    }
    set_mtime("cpu", "k.o.tmp.99998.1", time(NULL) - TF_CACHE_STALE_S - 60);
    unlink(dangling);
    CHECK(symlink("batch-gone.so", dangling) == 0, "a dangling link");
    int64_t before = total();
    tf_cache_usage u;
    CHECK(tf_cache_count(root, &u) && u.entries[2] >= 1, "the link counts as an entry");
    put("cpu", "small.o", 10);   /* well under the bound: counted, nothing walked */
    CHECK(access(stale, F_OK) == 0, "a write under the bound walks nothing: the stale work file is still there");
    CHECK(total() == before + 10, "work files are not counted (%lld, %lld)", (long long)total(), (long long)before);
    CHECK(tf_cache_evict(root, 10000, 9000, &u), "evict");
    CHECK(access(live, F_OK) == 0, "a live writer's work file stays");
    CHECK(access(stale, F_OK) != 0, "a stale one goes");
    CHECK(!exists("cuda-emu", "0123.so"), "a link whose object is gone goes");
    CHECK(access(p, F_OK) == 0, "directories and what they hold stay");
    unlink(live);
    /* the running total recounted when it is old or missing */
    snprintf(p, sizeof p, "%s/usage", root);
    f = fopen(p, "w");
    CHECK(f && fprintf(f, "tfuse disk cache usage 1\nbytes 0\ncounted %lld\n", (long long)time(NULL) - 3 * 86400) > 0 && fclose(f) == 0,
          "a usage file three days old, saying empty");
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "pad%d.o", i);
        put("cpu", name, 1000);   /* the real total passes the bound here */
    }
    CHECK(total() <= 10000, "an old running total is recounted, so the bound holds (%lld)", (long long)total());
    unlink(p);
    put("cpu", "pad3.o", 1000);
    CHECK(access(p, F_OK) == 0 && total() <= 10000, "a missing one too (%lld)", (long long)total());
}

/* A record (the algorithm caches): a hit refreshes it, a torn or corrupted one is a miss and is written again. */
static void records(void)
{
    unsetenv("TFUSE_CACHE_MAX");
    char p[512], body[256];
    path_of(p, sizeof p, "cuda", "algo.cublaslt");
    CHECK(tf_record_write(p, "tfuse cublaslt 1\n", "m=8 n=8", "algo 3\n", p), "write a record");
    set_mtime("cuda", "algo.cublaslt", 1000000);
    CHECK(tf_record_read(p, "tfuse cublaslt 1\n", "m=8 n=8", body, sizeof body) && !strcmp(body, "algo 3\n"), "read it");
    CHECK(mtime_of("cuda", "algo.cublaslt") > 1000000, "the hit refreshed it");
    CHECK(!tf_record_read(p, "tfuse cublaslt 1\n", "m=8 n=9", body, sizeof body), "another key is a miss");
    struct stat st;
    stat(p, &st);
    for (int how = 0; how < 2; how++) {
        FILE *f = fopen(p, "r+b");
        if (how == 0) {   /* one byte of the body flipped */
            fseek(f, -22, SEEK_END);
            int c = fgetc(f);
            fseek(f, -22, SEEK_END);
            fputc(c ^ 1, f);
        }
        fclose(f);
        if (how == 1) CHECK(truncate(p, st.st_size - 5) == 0, "truncate");
        set_mtime("cuda", "algo.cublaslt", 1000000);
        CHECK(!tf_record_read(p, "tfuse cublaslt 1\n", "m=8 n=8", body, sizeof body), "a %s record is a miss",
              how ? "truncated" : "corrupted");
        CHECK(mtime_of("cuda", "algo.cublaslt") == 1000000, "and no hit: its recency stays");
        CHECK(tf_record_write(p, "tfuse cublaslt 1\n", "m=8 n=8", "algo 4\n", p), "written again");
        CHECK(tf_record_read(p, "tfuse cublaslt 1\n", "m=8 n=8", body, sizeof body) && !strcmp(body, "algo 4\n"), "whole again");
        stat(p, &st);
    }
}

/* Work files (".tmp." in the name) in dir. */
static int test_count_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* Processes filling one cache at once: each writes records (some names
 * shared), reads some back and evicts now and then. */
enum { WRITERS = 3, WRITES = 150 };
static const uint64_t CONCURRENT_MAX = 40000;

static int writer(int w)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(w + 1);
    char p[512], key[64], body[4096], got[4096];
    int bad = 0;
    for (int i = 0; i < WRITES; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        int id = (int)(s % 200);   /* writers share names */
        snprintf(key, sizeof key, "k%d", id);
        path_of(p, sizeof p, "cuda", key);
        int len = 100 + (int)((s >> 20) % 1500), at = snprintf(body, sizeof body, "writer %d\n", w);
        for (int k = at; k < len; k++) body[k] = (char)('a' + (k + id) % 26);
        body[len - 1] = '\n';
        body[len] = 0;
        if (!tf_record_write(p, "tfuse test 1\n", key, body, body)) bad++;
        snprintf(key, sizeof key, "k%d", (int)((s >> 33) % 200));
        path_of(p, sizeof p, "cuda", key);
        tf_record_read(p, "tfuse test 1\n", key, got, sizeof got);   /* a hit or a miss, never torn */
        if (i % 37 == 0) tf_cache_evict(root, CONCURRENT_MAX, CONCURRENT_MAX / 2, NULL);
    }
    return bad ? 1 : 0;
}

static void concurrent(void)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/cuda' '%s/cpu' '%s/cuda-emu' '%s/usage'", root, root, root, root);
    CHECK(system(cmd) == 0, "empty the cache");
    setenv("TFUSE_CACHE_MAX", "40000", 1);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/cuda", root);
    tf_make_dirs(dir);
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        fflush(NULL);
        if ((pids[w] = fork()) == 0) _exit(writer(w));
    }
    for (int w = 0; w < WRITERS; w++) {
        int status = 0;
        CHECK(waitpid(pids[w], &status, 0) == pids[w] && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "writer %d finished cleanly (status %d)", w, status);
    }
    int64_t t = total();
    CHECK(t > 0 && (uint64_t)t <= CONCURRENT_MAX, "within the bound after them all (%lld of %llu)", (long long)t,
          (unsigned long long)CONCURRENT_MAX);
    int whole = 0, torn = 0, tmp = 0;
    for (int id = 0; id < 200; id++) {
        char p[512], key[32], body[4096];
        snprintf(key, sizeof key, "k%d", id);
        path_of(p, sizeof p, "cuda", key);
        if (access(p, F_OK) != 0) continue;
        if (tf_record_read(p, "tfuse test 1\n", key, body, sizeof body) && !strncmp(body, "writer ", 7)) whole++;
        else {
            torn++;
            fprintf(stderr, "not whole: %s\n", p);
        }
    }
    tf_cache_usage u;
    tf_cache_count(root, &u);
    tmp = test_count_tmp(dir);
    CHECK(whole > 0 && torn == 0 && whole == u.entries[1], "every entry left is whole (%d whole, %d not, %lld counted)", whole, torn,
          (long long)u.entries[1]);
    CHECK(tmp == 0, "no work file left behind (%d)", tmp);
}

static void api(void)
{
    unsetenv("TFUSE_CACHE_MAX");
    put("cpu", "a.o", 100);
    put("cpu", "b.o", 200);
    put("cuda-emu", "c.so", 50);
    tf_context_t *ctx;
    CHECK(!tf_context_create(&ctx), "context");
    tf_disk_cache_info info;
    CHECK(!tf_disk_cache_get_info(ctx, &info), "get_info: %s", tf_context_last_error(ctx));
    CHECK(!strcmp(info.dir, root) && info.max_bytes == (int64_t)TF_CACHE_DEFAULT_MAX && !strcmp(info.max_from, "default"),
          "the directory and the default bound (%s, %lld)", info.dir, (long long)info.max_bytes);
    CHECK(!strcmp(info.parts[0].name, "cpu") && info.parts[0].entries == 2 && info.parts[0].bytes == 300 &&
          !strcmp(info.parts[2].name, "cuda-emu") && info.parts[2].entries == 1 && info.entries == 3 + info.parts[1].entries &&
          info.bytes == 350 + info.parts[1].bytes, "per part and in all (cpu %lld/%lld, total %lld/%lld)",
          (long long)info.parts[0].entries, (long long)info.parts[0].bytes, (long long)info.entries, (long long)info.bytes);
    tf_disk_cache_info gone;
    CHECK(tf_disk_cache_clear(ctx, "gpu", &gone) == TF_ERR_INVALID_ARG && strstr(tf_context_last_error(ctx), "'gpu'"),
          "an unknown part is refused: %s", tf_context_last_error(ctx));
    CHECK(!tf_disk_cache_clear(ctx, "cpu", &gone) && gone.parts[0].entries == 2 && gone.parts[0].bytes == 300 && gone.entries == 2,
          "clear cpu: its two entries");
    CHECK(!exists("cpu", "a.o") && exists("cuda-emu", "c.so"), "the other parts stay");
    CHECK(!tf_disk_cache_clear(ctx, NULL, &gone) && gone.parts[2].entries == 1, "clear all");
    CHECK(!tf_disk_cache_get_info(ctx, &info) && info.entries == 0 && info.bytes == 0, "empty (%lld)", (long long)info.entries);
    setenv("TFUSE_CACHE_MAX", "5G", 1);
    CHECK(!tf_disk_cache_get_info(ctx, &info) && info.max_bytes == 5ll << 30 && !strcmp(info.max_from, "env TFUSE_CACHE_MAX"),
          "the bound from TFUSE_CACHE_MAX");
    unsetenv("TFUSE_CACHE_MAX");
    tf_context_free(ctx);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/tfuse-disk-cache-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("TFUSE_CACHE_DIR", root, 1);   /* never the user's */
    sizes();
    lru();
    leftovers();
    records();
    concurrent();
    api();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (!getenv("KEEP")) CHECK(system(cmd) == 0, "remove %s", root);
    return check_report();
}
