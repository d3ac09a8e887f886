/* pool.c — see pool.h. Workers sleep on a condition variable between runs;
 * a run bumps a generation counter, and the last worker to finish wakes the
 * caller. Work per run is a kernel (tens of microseconds and up), so one
 * mutex round trip per piece costs little. */
#include <sched.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
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
    uint64_t generation;
    int pending;               /* workers still on the current run */
    bool stop;
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

static void *work(void *arg)
{
    worker *w = arg;
    struct tf_pool *p = w->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        int64_t lo, hi;
        piece(p, w->index, &lo, &hi);
        tf_pool_fn fn = p->fn;
        void *a = p->arg;
        pthread_mutex_unlock(&p->mu);
        if (lo < hi) fn(a, lo, hi);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
        for (int i = 0; i < nthreads - 1; i++) {
            p->ws[i] = (worker){p, i + 1};
            if (pthread_create(&p->threads[i], NULL, work, &p->ws[i])) break;
            p->started++;
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
    p->stop = true;
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
    pthread_mutex_lock(&p->mu);
    p->total = n;
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    int64_t lo, hi;
    piece(p, 0, &lo, &hi);
    if (lo < hi) fn(arg, lo, hi);
    pthread_mutex_lock(&p->mu);
    while (p->pending) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
