/* pool.c — see pool.h. A run publishes its work and bumps a generation
 * counter; the last worker to finish tells the caller. Between runs a
 * worker first spins on the counter for a while (SPIN_NS), then sleeps on a
 * condition variable; the caller waits for the workers the same way. A
 * step's kernels come one after another, microseconds apart: woken from a
 * condition variable each time, a worker came 20-50 us late on the bench
 * machine, and small models' steps (a few hundred microseconds of kernels)
 * took twice as long on 2 threads as on 1 (bench/RESULTS.md, 2026-11-28).
 * Between steps (data, evaluation) the spin runs out and the workers sleep,
 * leaving the cores to the rest of the process. */
#include <sched.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"
#include "alloc.h"

typedef struct worker {
    struct tf_pool *pool;
    int index;                 /* 1..n-1: its piece of each run */
} worker;

struct tf_pool {
    int n;                     /* threads, the caller included */
    pthread_t *threads;        /* n - 1 */
    worker *ws;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    atomic_uint_fast64_t generation;   /* bumped (release) once the run below is published */
    atomic_int pending;        /* workers still on the current run */
    atomic_bool stop;
    /* the current run */
    int64_t total;
    tf_pool_fn fn;
    void *arg;
};

static void piece(const struct tf_pool *p, int i, int64_t *lo, int64_t *hi)
{
    *lo = p->total * i / p->n;
    *hi = p->total * (i + 1) / p->n;
}

enum { SPIN_NS = 100000 };   /* 100 us: a step's next kernel comes sooner, the next step's later */

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spin until cond(p, v) holds or SPIN_NS pass; whether it held. After a
 * short busy wait the spinner yields its core at each turn: a thread the
 * scheduler put on the same core (the caller, with more threads than free
 * cores) then runs instead of waiting out a busy spinner's time slice
 * (small_gpt's inference steps took 4.2 ms instead of 0.44 in one run of
 * two before it did, and before the workers were pinned). */
static bool spin(struct tf_pool *p, bool (*cond)(struct tf_pool *, uint64_t), uint64_t v)
{
    uint64_t t0 = now_ns();
    for (int i = 0;; i++) {
        if (cond(p, v)) return true;
        if (i < 256) relax();
        else sched_yield();
        if ((i & 15) == 15 && now_ns() - t0 > SPIN_NS) return cond(p, v);
    }
}

static bool moved(struct tf_pool *p, uint64_t seen)
{
    return atomic_load_explicit(&p->generation, memory_order_acquire) != seen || atomic_load(&p->stop);
}

static bool finished(struct tf_pool *p, uint64_t unused)
{
    (void)unused;
    return atomic_load_explicit(&p->pending, memory_order_acquire) == 0;
}

static void *work(void *arg)
{
    worker *w = arg;
    struct tf_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        if (!spin(p, moved, seen)) {   /* asleep until the next run */
            pthread_mutex_lock(&p->mu);
            while (!moved(p, seen)) pthread_cond_wait(&p->go, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        int64_t lo, hi;
        piece(p, w->index, &lo, &hi);
        tf_pool_fn fn = p->fn;
        void *a = p->arg;
        if (lo < hi) fn(a, lo, hi);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {   /* the last: tell the caller */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* The CPUs this process may run on: its affinity mask (taskset, a
 * container's cpuset, mpirun binding each rank to its cores), else every
 * online CPU. */
int tf_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
#endif
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

tf_pool *tf_pool_create(int nthreads)
{
    if (nthreads < 1) nthreads = 1;
    struct tf_pool *p = tf_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    if (nthreads > 1) {
        p->threads = tf_calloc((size_t)nthreads - 1, sizeof *p->threads);
        p->ws = tf_calloc((size_t)nthreads - 1, sizeof *p->ws);
        if (!p->threads || !p->ws) {
            tf_pool_free(p);
            return NULL;
        }
        /* a pool as wide as the CPUs the process may use pins its workers, one to each CPU of the mask but the
         * one the creating thread runs on (which it is left to, unpinned): spinning workers the scheduler had
         * stacked on one CPU with the caller stayed there for whole runs (bench/RESULTS.md, 2026-11-28) */
#ifdef CPU_COUNT
        int cpus[256], ncpus = 0;
        cpu_set_t mask;
        int here = sched_getcpu();
        if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) == nthreads && here >= 0 && CPU_ISSET(here, &mask)) {
            cpus[ncpus++] = here;   /* the caller's: cpus[1..] are the workers' */
            for (int c = 0; c < CPU_SETSIZE && ncpus < 256; c++)
                if (CPU_ISSET(c, &mask) && c != here) cpus[ncpus++] = c;
        }
#endif
        for (int i = 0; i < nthreads - 1; i++) {
            p->ws[i] = (worker){p, i + 1};
            if (pthread_create(&p->threads[i], NULL, work, &p->ws[i])) break;
            p->started++;
#ifdef CPU_COUNT
            if (i + 1 < ncpus) {   /* best effort: an unpinned worker still works */
                cpu_set_t one;
                CPU_ZERO(&one);
                CPU_SET(cpus[i + 1], &one);
                pthread_setaffinity_np(p->threads[i], sizeof one, &one);
            }
#endif
        }
        if (p->started < nthreads - 1) {   /* run with the workers we got */
            if (!p->started) {
                tf_pool_free(p);
                return NULL;
            }
            p->n = p->started + 1;
        }
    }
    return p;
}

void tf_pool_free(tf_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    tf_free(p->threads);
    tf_free(p->ws);
    tf_free(p);
}

int tf_pool_threads(const tf_pool *p) { return p ? p->n : 1; }

void tf_pool_run(tf_pool *p, int64_t n, tf_pool_fn fn, void *arg)
{
    if (n <= 0) return;
    if (!p || p->n == 1 || n == 1) {
        fn(arg, 0, n);
        return;
    }
    /* every worker is done with the last run (the caller waited for it): the run's fields are free to write */
    p->total = n;
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);   /* a worker that is not spinning sleeps on go */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    int64_t lo, hi;
    piece(p, 0, &lo, &hi);
    if (lo < hi) fn(arg, lo, hi);
    if (!spin(p, finished, 0)) {
        pthread_mutex_lock(&p->mu);
        while (!finished(p, 0)) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
