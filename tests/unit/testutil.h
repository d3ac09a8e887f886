/* testutil.h — what the interpreter-level tests share: a seeded generator,
 * the valid range of an integer input, and reading a whole file. */
#ifndef TF_TESTS_TESTUTIL_H
#define TF_TESTS_TESTUTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"

/* xorshift64: uniform in [0, 1). */
static inline double test_rnd(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (double)(*s >> 11) / 9007199254740992.0;
}

/* Files in dir whose names end in suffix ("": all), dot files aside; -1
 * when dir cannot be read (the disk caches' tests count their entries). */
static inline int test_count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (e->d_name[0] != '.' && (!suffix[0] || (l >= sl && !strcmp(e->d_name + l - sl, suffix)))) n++;
    }
    closedir(d);
    return n;
}

/* Exclusive upper bound for an integer input from its uses in a module
 * written with layer ops (labels of cross_entropy, ids of embedding); 2 when
 * no use bounds it. */
static inline int64_t test_int_bound(const tf_module *m, const tf_value *v)
{
    for (int i = 0; i < m->nodes.n; i++) {
        const tf_node *n = m->nodes.items[i];
        if (n->op == TF_OP_CROSS_ENTROPY && n->in[1] == v) return n->in[0]->type.dims[n->in[0]->type.rank - 1].n;
        if (n->op == TF_OP_EMBEDDING && n->in[0] == v) return n->in[1]->type.dims[0].n;
    }
    return 2;
}

/* The whole file, NUL-terminated, malloc'd; NULL if unreadable. */
static inline char *test_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) buf[n] = 0;
    else { free(buf); buf = NULL; }
    fclose(f);
    return buf;
}

/* The run's seed: TFUSE_TEST_SEED, else the clock; printed, so that a
 * failure can be replayed. */
static inline uint64_t test_seed(void)
{
    const char *s = getenv("TFUSE_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (replay with TFUSE_TEST_SEED)\n", (unsigned long long)seed);
    return seed;
}

/* The example models at sizes small enough for the tests that run each of
 * them on every path (kernels, JIT, CUDA C, targets): the dims to override. */
typedef struct test_example {
    const char *file;
    struct { const char *name; int64_t value; } dims[3];
    int nd;
} test_example;
static const test_example test_examples[] = {
    {"mlp.ir", {{"B", 8}, {"F", 20}}, 2},
    {"cnn.ir", {{"N", 2}, {"C", 4}}, 2},
    {"transformer.ir", {{"B", 2}, {"T", 5}, {"V", 10}}, 3},
};
enum { TEST_NEXAMPLES = sizeof test_examples / sizeof *test_examples };

/* An example model's text (TFUSE_EXAMPLES names the folder, else
 * "examples"); its path goes to path[n]. NULL if unreadable. */
static inline char *test_read_example(const char *file, char *path, size_t n)
{
    const char *dir = getenv("TFUSE_EXAMPLES");
    snprintf(path, n, "%.3000s/%s", dir ? dir : "examples", file);
    return test_read_file(path);
}

#endif
