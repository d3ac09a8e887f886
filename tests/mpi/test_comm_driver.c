/* test_comm_driver.c — runtime/comm_mpi.c in a real Open MPI job, started
 * by tests/mpi/run.sh under mpirun on 2 or 3 ranks:
 *
 *   test_comm_driver            alltoall, allgather and bcast of rank- and
 *                               position-dependent bytes at odd sizes (1, 13,
 *                               4101 and 1 MiB + 3 bytes, and 0), every rank
 *                               checking every byte it got; a second driver
 *                               on the caller's MPI_COMM_WORLD beside the
 *                               first; after the last free, a new open refused
 *                               (MPI cannot start twice).
 *   test_comm_driver timeout    rank 1 joins an allgather 30 s late: rank 0's
 *                               gives up at its 2 s timeout naming itself
 *                               and rank 1 as not answering,
 *                               says so ("as expected: <the error>") when
 *                               every check held, and aborts the job, which
 *                               run.sh expects.
 *   test_comm_driver big        a bcast of 2 GiB + 5 bytes, past one int
 *                               count (in 1 GiB pieces): not run by ctest
 *                               (4 GiB per rank, and slow on small machines).
 *
 * Each rank prints "rank R: N passed, M failed"; the job fails when any rank
 * does. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "check.h"

static int my_rank = -1;

/* The byte at position k of the chunk rank `from` sends rank `to` in
 * collective `salt`: every triple gives a different sequence. */
static unsigned char pat(int salt, int from, int to, size_t k)
{
    return (unsigned char)(salt * 29 + from * 101 + to * 7 + (int)(k % 251) + (int)(k / 251) * 3 + 1);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The first position where buf differs from pat(salt, from, to, .), or n. */
static size_t first_diff(const unsigned char *buf, size_t n, int salt, int from, int to)
{
    for (size_t k = 0; k < n; k++)
        if (buf[k] != pat(salt, from, to, k)) return k;
    return n;
}

static void check_alltoall(const tf_comm_driver *drv, void *impl, int rank, int size, size_t chunk, int salt)
{
    /* +1: a chunk of 0 still gets a non-NULL buffer */
    unsigned char *send = malloc(size * chunk + 1), *recv = malloc(size * chunk + 1);
    for (int j = 0; j < size; j++)
        for (size_t k = 0; k < chunk; k++) send[j * chunk + k] = pat(salt, rank, j, k);
    memset(recv, 0, size * chunk + 1);
    recv[size * chunk] = 0xEE;   /* a guard past the end */
    char err[512] = "";
    int rc = drv->alltoall(impl, send, recv, chunk, 60, err, sizeof err);
    CHECK(rc == 0, "rank %d: alltoall of %zu bytes per rank: %s", rank, chunk, err);
    for (int j = 0; j < size; j++) {
        size_t at = first_diff(recv + j * chunk, chunk, salt, j, rank);
        CHECK(at == chunk, "rank %d: alltoall of %zu bytes: the chunk from rank %d differs at byte %zu", rank, chunk, j,
              at);
    }
    CHECK(recv[size * chunk] == 0xEE, "rank %d: alltoall of %zu bytes wrote past its buffer", rank, chunk);
    free(send);
    free(recv);
}

static void check_allgather(const tf_comm_driver *drv, void *impl, int rank, int size, size_t chunk, int salt)
{
    unsigned char *send = malloc(chunk + 1), *recv = malloc(size * chunk + 1);
    for (size_t k = 0; k < chunk; k++) send[k] = pat(salt, rank, 0, k);
    memset(recv, 0, size * chunk + 1);
    recv[size * chunk] = 0xEE;
    char err[512] = "";
    int rc = drv->allgather(impl, send, recv, chunk, 60, err, sizeof err);
    CHECK(rc == 0, "rank %d: allgather of %zu bytes per rank: %s", rank, chunk, err);
    for (int j = 0; j < size; j++) {
        size_t at = first_diff(recv + j * chunk, chunk, salt, j, 0);
        CHECK(at == chunk, "rank %d: allgather of %zu bytes: the chunk from rank %d differs at byte %zu", rank, chunk, j,
              at);
    }
    CHECK(recv[size * chunk] == 0xEE, "rank %d: allgather of %zu bytes wrote past its buffer", rank, chunk);
    free(send);
    free(recv);
}

static void check_bcast(const tf_comm_driver *drv, void *impl, int rank, size_t bytes, int root, int salt)
{
    unsigned char *buf = malloc(bytes + 1);
    if (!buf) {
        CHECK(buf, "rank %d: no memory for a bcast of %zu bytes", rank, bytes);
        exit(1);   /* the job cannot stay in step without this rank */
    }
    for (size_t k = 0; k < bytes; k++) buf[k] = rank == root ? pat(salt, root, 0, k) : 0;
    buf[bytes] = 0xEE;
    char err[512] = "";
    int rc = drv->bcast(impl, buf, bytes, root, 600, err, sizeof err);
    CHECK(rc == 0, "rank %d: bcast of %zu bytes from rank %d: %s", rank, bytes, root, err);
    size_t at = first_diff(buf, bytes, salt, root, 0);
    CHECK(at == bytes, "rank %d: bcast of %zu bytes from rank %d differs at byte %zu", rank, bytes, root, at);
    CHECK(buf[bytes] == 0xEE, "rank %d: bcast of %zu bytes wrote past its buffer", rank, bytes);
    free(buf);
}

static int report(void)
{
    printf("rank %d: ", my_rank);
    return check_report();
}

static int run_collectives(const tf_comm_driver *drv, void *impl, int rank, int size)
{
    static const size_t chunks[] = {1, 13, 0, 4101, (1u << 20) + 3};
    int salt = 0;
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++) {
        check_alltoall(drv, impl, rank, size, chunks[i], ++salt);
        check_allgather(drv, impl, rank, size, chunks[i], ++salt);
        for (int root = 0; root < size; root++) check_bcast(drv, impl, rank, chunks[i] * 3 + 1, root, ++salt);
    }
    check_bcast(drv, impl, rank, 0, size - 1, ++salt);

    /* what the driver refuses, on every rank alike, so that none waits */
    char err[512] = "";
    CHECK(drv->bcast(impl, NULL, 0, size, 10, err, sizeof err) == -1 && strstr(err, "from rank"),
          "rank %d: a bcast from a rank past the job's: %s", rank, err);
    unsigned char one = 0;
    err[0] = 0;
    CHECK(drv->alltoall(impl, &one, &one, (size_t)INT32_MAX + 1, 10, err, sizeof err) == -1 &&
              strstr(err, "over MPI's int count"),
          "rank %d: an alltoall chunk past an int: %s", rank, err);

    /* a second driver, on the caller's communicator (MPI_COMM_WORLD's
     * handle: Open MPI's &ompi_mpi_comm_world, global since the first open),
     * beside the first: its free must not end MPI under the first */
    void *world = dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world");
    CHECK(world, "rank %d: ompi_mpi_comm_world not found after the open", rank);
    const tf_comm_driver *drv2 = NULL;
    void *impl2 = NULL;
    int rank2 = -1, size2 = -1;
    err[0] = 0;
    int rc = world ? tf_comm_mpi_open(world, &drv2, &impl2, &rank2, &size2, err, sizeof err) : -1;
    CHECK(rc == 0 && rank2 == rank && size2 == size, "rank %d: a second driver on MPI_COMM_WORLD: rank %d of %d: %s",
          rank, rank2, size2, err);
    if (rc == 0) {
        check_allgather(drv2, impl2, rank, size, 77, ++salt);
        drv2->free(impl2);
    }
    check_alltoall(drv, impl, rank, size, 5, ++salt);   /* the first still works */
    return 0;
}

/* Rank 1 comes 30 s late; rank 0 gives up at 2 s, finds rank 1 silent, and aborts the job. */
static int run_timeout(const tf_comm_driver *drv, void *impl, int rank, int size)
{
    unsigned char send[16] = {0}, *recv = calloc((size_t)size, sizeof send);
    char err[512] = "";
    if (rank == 1) {
        sleep(30);
        printf("rank 1: still running after 30 s: rank 0's abort did not end the job\n");
        fflush(stdout);
    }
    double t0 = now_s();
    int rc = drv->allgather(impl, send, recv, sizeof send, 2.0, err, sizeof err);
    double took = now_s() - t0;
    if (rank == 0) {
        CHECK(rc == -1, "rank 0: the allgather returned %d while rank 1 slept", rc);
        CHECK(strstr(err, "rank 0:") && strstr(err, "within 2 s"), "rank 0: the message: %s", err);
        /* then up to 3 s more asking who still answers: rank 1, asleep, is named */
        CHECK(took >= 1.9 && took <= 7.0, "rank 0: gave up after %.2f s, for a timeout of 2 s", took);
        CHECK(strstr(err, "the rank not answering: 1") != NULL, "rank 0: the sleeping rank is not named: %s", err);
        char later[512] = "";
        CHECK(drv->bcast(impl, send, 1, 0, 1.0, later, sizeof later) == -1 && strstr(later, "cannot be used again"),
              "rank 0: a collective after the timeout: %s", later);
        /* the line run.sh looks for, printed only when every check held */
        if (check_failed == 0) printf("rank 0: gave up after %.2f s, as expected: %s\n", took, err);
        report();
        fflush(stdout);
        fflush(stderr);
        drv->abort(impl, 3);   /* ends every rank: rank 1 is still asleep */
    }
    free(recv);
    return 1;   /* not reached on rank 0; on rank 1 only if the abort did not come */
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "collectives";
    setvbuf(stdout, NULL, _IOLBF, 0);
    char line[512];
    tf_comm_mpi_doctor(line, sizeof line);
    int env_rank = -1, env_size = -1;
    bool launched = tf_comm_launched(&env_rank, &env_size);

    const tf_comm_driver *drv = NULL;
    void *impl = NULL;
    int rank = -1, size = -1;
    char err[512] = "";
    double t0 = now_s();
    if (tf_comm_mpi_open(NULL, &drv, &impl, &rank, &size, err, sizeof err)) {
        fprintf(stderr, "rank %d (by the environment): tf_comm_mpi_open: %s\n", env_rank, err);
        return 1;
    }
    my_rank = rank;
    if (rank == 0) printf("%s; MPI started in %.2f s\n", line, now_s() - t0);
    CHECK(!strncmp(line, "mpi: Open MPI v", 15), "rank %d: the doctor's line: %s", rank, line);
    CHECK(drv && !strcmp(drv->name, "mpi"), "rank %d: the driver's name", rank);
    CHECK(launched && env_rank == rank && env_size == size && size >= 2,
          "rank %d of %d: tf_comm_launched says %d, rank %d of %d", rank, size, launched, env_rank, env_size);

    if (!strcmp(mode, "timeout")) {
        if (size < 2) {
            fprintf(stderr, "the timeout check needs 2 ranks or more\n");
            return 1;
        }
        return run_timeout(drv, impl, rank, size);
    }
    if (!strcmp(mode, "big")) check_bcast(drv, impl, rank, ((size_t)2 << 30) + 5, size - 1, 99);
    else run_collectives(drv, impl, rank, size);
    drv->free(impl);

    /* MPI was tfuse's and is finalized: it cannot start again */
    err[0] = 0;
    int rc = tf_comm_mpi_open(NULL, &drv, &impl, &rank, &size, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "finalized"), "an open after the last free: %d: %s", rc, err);
    if (rc == 0) drv->free(impl);
    return report();
}
