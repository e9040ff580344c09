/*
 * kernels/cpu/cpu_pool.c — the CPU backend's persistent worker pool.
 *
 * Workers are started once and sleep on a condition variable between jobs.
 * A job is published by bumping `generation` under the mutex; each worker
 * (and the calling thread) then takes chunks of items from an atomic counter
 * until none are left, and the caller waits until every worker has checked
 * back in. Handing out chunks dynamically balances uneven work (attention
 * rows of different lengths) without changing any result, because an item's
 * computation never depends on which thread runs it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_impl.h"

typedef struct {
    cpu_pool *pool;
    int thread; /* 1 .. n_threads-1; the caller is thread 0 */
} worker_arg;

struct cpu_pool {
    int n_threads;
    pthread_t *threads;  /* [n_threads - 1] */
    worker_arg *args;    /* [n_threads - 1] */

    pthread_mutex_t mutex;
    pthread_cond_t job_ready; /* workers wait here for a new generation   */
    pthread_cond_t job_done;  /* the caller waits here for busy == 0      */
    uint64_t generation;      /* bumped once per job                        */
    int busy;                 /* workers that have not finished this job    */
    int shutting_down;

    /* The current job; written under the mutex before generation changes. */
    cpu_range_fn fn;
    void *arg;
    int64_t n_items;
    int64_t chunk;
    atomic_int_fast64_t next_item;
};

/* Take chunks until the job's items are exhausted. */
static void run_chunks(cpu_pool *pool, int thread)
{
    for (;;) {
        int64_t begin = atomic_fetch_add_explicit(&pool->next_item, pool->chunk,
                                                  memory_order_relaxed);
        if (begin >= pool->n_items)
            return;
        int64_t end = begin + pool->chunk;
        if (end > pool->n_items)
            end = pool->n_items;
        pool->fn(pool->arg, begin, end, thread);
    }
}

static void *worker_main(void *p)
{
    worker_arg *wa = p;
    cpu_pool *pool = wa->pool;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mutex);
        while (pool->generation == seen && !pool->shutting_down)
            pthread_cond_wait(&pool->job_ready, &pool->mutex);
        if (pool->shutting_down) {
            pthread_mutex_unlock(&pool->mutex);
            return NULL;
        }
        seen = pool->generation;
        pthread_mutex_unlock(&pool->mutex);

        run_chunks(pool, wa->thread);

        pthread_mutex_lock(&pool->mutex);
        if (--pool->busy == 0)
            pthread_cond_signal(&pool->job_done);
        pthread_mutex_unlock(&pool->mutex);
    }
}

static void stop_workers(cpu_pool *pool, int n_started)
{
    pthread_mutex_lock(&pool->mutex);
    pool->shutting_down = 1;
    pthread_cond_broadcast(&pool->job_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 0; i < n_started; i++)
        pthread_join(pool->threads[i], NULL);
}

static void free_pool(cpu_pool *pool)
{
    pthread_cond_destroy(&pool->job_done);
    pthread_cond_destroy(&pool->job_ready);
    pthread_mutex_destroy(&pool->mutex);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int cpu_pool_create(int n_threads, cpu_pool **out)
{
    if (!out || n_threads < 1)
        return CAIRN_EINVAL;
    cpu_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return CAIRN_ENOMEM;
    pool->n_threads = n_threads;
    atomic_init(&pool->next_item, 0);
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) {
        free(pool);
        return CAIRN_ENOMEM;
    }
    if (pthread_cond_init(&pool->job_ready, NULL) != 0) {
        pthread_mutex_destroy(&pool->mutex);
        free(pool);
        return CAIRN_ENOMEM;
    }
    if (pthread_cond_init(&pool->job_done, NULL) != 0) {
        pthread_cond_destroy(&pool->job_ready);
        pthread_mutex_destroy(&pool->mutex);
        free(pool);
        return CAIRN_ENOMEM;
    }
    int n_workers = n_threads - 1;
    if (n_workers > 0) {
        pool->threads = calloc((size_t)n_workers, sizeof *pool->threads);
        pool->args = calloc((size_t)n_workers, sizeof *pool->args);
        if (!pool->threads || !pool->args) {
            free_pool(pool);
            return CAIRN_ENOMEM;
        }
    }
    for (int i = 0; i < n_workers; i++) {
        pool->args[i].pool = pool;
        pool->args[i].thread = i + 1;
        if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]) != 0) {
            stop_workers(pool, i);
            free_pool(pool);
            return CAIRN_ENOMEM;
        }
    }
    *out = pool;
    return CAIRN_OK;
}

void cpu_pool_destroy(cpu_pool *pool)
{
    if (!pool)
        return;
    stop_workers(pool, pool->n_threads - 1);
    free_pool(pool);
}

int cpu_pool_threads(const cpu_pool *pool)
{
    return pool->n_threads;
}

void cpu_pool_parallel_for(cpu_pool *pool, int64_t n_items, int64_t min_chunk, cpu_range_fn fn,
                           void *arg)
{
    if (n_items <= 0)
        return;
    if (min_chunk < 1)
        min_chunk = 1;
    /* About four chunks per thread: enough to even out uneven items without
     * making the shared counter a point of contention. */
    int64_t chunk = n_items / ((int64_t)pool->n_threads * 4);
    if (chunk < min_chunk)
        chunk = min_chunk;
    if (pool->n_threads == 1 || chunk >= n_items) {
        fn(arg, 0, n_items, 0);
        return;
    }

    pthread_mutex_lock(&pool->mutex);
    pool->fn = fn;
    pool->arg = arg;
    pool->n_items = n_items;
    pool->chunk = chunk;
    atomic_store_explicit(&pool->next_item, 0, memory_order_relaxed);
    pool->busy = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->job_ready);
    pthread_mutex_unlock(&pool->mutex);

    run_chunks(pool, 0);

    /* Workers that never got a chunk still check in, so the job fields stay
     * valid until nobody can read them any more. */
    pthread_mutex_lock(&pool->mutex);
    while (pool->busy > 0)
        pthread_cond_wait(&pool->job_done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}
