/* check.h — the unit tests' few macros. Each failed check prints where and
 * why; a test program ends with check_report(), which prints
 * "N passed, M failed" and returns the exit code. */
#ifndef TF_TESTS_CHECK_H
#define TF_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) {                                                           \
            check_passed++;                                                   \
        } else {                                                              \
            check_failed++;                                                   \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
        }                                                                     \
    } while (0)

/* |got - want| <= atol + rtol * |want|, NaNs equal only to NaNs. */
static inline int check_close(double got, double want, double rtol, double atol)
{
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static inline int check_report(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
