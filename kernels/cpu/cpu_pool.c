/*
 * kernels/cpu/cpu_pool.c — the CPU backend's persistent worker pool.
 *
 * Workers are started once. Between jobs they spin briefly on the job
 * counter and then sleep on a condition variable. A job is published by
 * bumping `generation` (under the mutex, so sleepers cannot miss it; the
 * broadcast is only made when someone sleeps); each worker (and the calling
 * thread) then takes chunks of items from an atomic counter until none are
 * left, and the caller spins until every worker has checked back in. Handing out chunks dynamically balances uneven work (attention
 * rows of different lengths) without changing any result, because an item's
 * computation never depends on which thread runs it.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_impl.h"

typedef struct {
    cpu_pool *pool;
    int thread; /* 1 .. n_threads-1; the caller is thread 0 */
} worker_arg;

/* Pause iterations a worker spins on the job counter before it sleeps on
 * the condition variable (about 0.1-0.5 ms): between the ops of one forward
 * pass the gap is a few microseconds, so during a pass workers never sleep
 * and a job starts without a system call; an idle backend costs no CPU. */
#define SPIN_BEFORE_SLEEP 4000
/* Spins of the caller waiting for the workers before it yields its core. */
#define SPIN_BEFORE_YIELD 20000

struct cpu_pool {
    int n_threads;
    pthread_t *threads;  /* [n_threads - 1] */
    worker_arg *args;    /* [n_threads - 1] */

    pthread_mutex_t mutex;
    pthread_cond_t job_ready; /* sleeping workers wait here for a new generation */
    int sleepers;             /* workers in (or entering) job_ready, under mutex */
    atomic_uint_fast64_t generation; /* bumped once per job, under mutex        */
    atomic_int busy;          /* workers that have not finished this job         */
    atomic_int shutting_down;

    /* The current job; written before generation is released. */
    cpu_range_fn fn;
    void *arg;
    int64_t n_items;
    int64_t chunk; /* the smallest chunk handed out */
    atomic_int_fast64_t next_item;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Take chunks until the job's items are exhausted. Chunks are guided: each
 * is a share of what is left (1 / (4 n_threads) of it, at least the job's
 * minimum), so they start large (few trips to the shared counter, long
 * contiguous runs of weight rows for the prefetchers) and shrink towards
 * the end, where the threads then finish within a small chunk of each
 * other instead of one waiting for the other's last quarter. Which thread
 * runs an item never changes its result. */
static void run_chunks(cpu_pool *pool, int thread)
{
    const int64_t n = pool->n_items, min_chunk = pool->chunk;
    const int64_t share = 4 * (int64_t)pool->n_threads;
    int64_t begin = atomic_load_explicit(&pool->next_item, memory_order_relaxed);
    for (;;) {
        if (begin >= n)
            return;
        int64_t chunk = (n - begin) / share;
        if (chunk < min_chunk)
            chunk = min_chunk;
        const int64_t end = n - begin < chunk ? n : begin + chunk;
        if (!atomic_compare_exchange_weak_explicit(&pool->next_item, &begin, end,
                                                   memory_order_relaxed, memory_order_relaxed))
            continue; /* begin now holds the counter's current value */
        pool->fn(pool->arg, begin, end, thread);
        begin = atomic_load_explicit(&pool->next_item, memory_order_relaxed);
    }
}

static void *worker_main(void *p)
{
    worker_arg *wa = p;
    cpu_pool *pool = wa->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&pool->shutting_down, memory_order_acquire)) {
            if (++spins < SPIN_BEFORE_SLEEP) {
                cpu_relax();
                continue;
            }
            /* The generation is re-checked under the mutex the publisher
             * holds while bumping it, so a wake-up cannot be missed. */
            pthread_mutex_lock(&pool->mutex);
            pool->sleepers++;
            while (atomic_load_explicit(&pool->generation, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&pool->shutting_down, memory_order_acquire))
                pthread_cond_wait(&pool->job_ready, &pool->mutex);
            pool->sleepers--;
            pthread_mutex_unlock(&pool->mutex);
            spins = 0;
        }
        if (atomic_load_explicit(&pool->shutting_down, memory_order_acquire))
            return NULL;
        seen = gen;
        run_chunks(pool, wa->thread);
        atomic_fetch_sub_explicit(&pool->busy, 1, memory_order_release);
    }
}

static void stop_workers(cpu_pool *pool, int n_started)
{
    pthread_mutex_lock(&pool->mutex);
    atomic_store_explicit(&pool->shutting_down, 1, memory_order_release);
    pthread_cond_broadcast(&pool->job_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 0; i < n_started; i++)
        pthread_join(pool->threads[i], NULL);
}

static void free_pool(cpu_pool *pool)
{
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
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->busy, 0);
    atomic_init(&pool->shutting_down, 0);
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) {
        free(pool);
        return CAIRN_ENOMEM;
    }
    if (pthread_cond_init(&pool->job_ready, NULL) != 0) {
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
    /* Worth splitting only if the first guided chunk (run_chunks) leaves
     * items for another thread. */
    int64_t first = n_items / ((int64_t)pool->n_threads * 4);
    if (first < min_chunk)
        first = min_chunk;
    if (pool->n_threads == 1 || first >= n_items) {
        fn(arg, 0, n_items, 0);
        return;
    }
    const int64_t chunk = min_chunk; /* run_chunks' smallest chunk */

    pool->fn = fn;
    pool->arg = arg;
    pool->n_items = n_items;
    pool->chunk = chunk;
    atomic_store_explicit(&pool->next_item, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->busy, pool->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    if (pool->sleepers > 0)
        pthread_cond_broadcast(&pool->job_ready);
    pthread_mutex_unlock(&pool->mutex);

    run_chunks(pool, 0);

    /* Workers that never got a chunk still check in, so the job fields stay
     * valid until nobody can read them any more. */
    int spins = 0;
    while (atomic_load_explicit(&pool->busy, memory_order_acquire) > 0) {
        if (++spins < SPIN_BEFORE_YIELD) {
            cpu_relax();
        } else {
            sched_yield();
            spins = 0;
        }
    }
}
