/* libr4d's thread pool: what every parallel row runs on (included by r4d.c).
 *
 * A launch is cut into more chunks than threads (pool_run: about CHUNKS_PER_THREAD a thread), and
 * the chunks are taken one at a time, by the calling thread and by whichever workers are running,
 * from one atomic ticket. A worker that has lost its core takes nothing, so the others take its
 * share: a launch waits for a descheduled thread only while that thread holds a chunk it took.
 * When the caller has no chunk left to take it spins briefly, then yields its core for a while (to
 * the worker it waits for, or another rank, where they share the core), then sleeps on a futex
 * that the worker finishing the last chunk wakes. Between launches the workers spin for SPIN_NS,
 * yielding every few µs (a spinning worker must not keep a core another rank, or its own launching
 * thread, is waiting for: a launch never waits for a worker that has not taken a chunk), then
 * sleep on the generation word, woken by the next launch.
 *
 * Why yield before sleeping: on this kind of machine (a KVM guest) a core left idle by a sleeper
 * halts, and waking it again costs far more than a sched_yield; while another thread is runnable on
 * the core, sched_yield hands it the core just as a sleep would, and keeps the core awake.
 *
 * The ticket is (generation << 32) | next chunk. A launch of generation g publishes its job in
 * jobs[g & 1] and its done count, then the ticket (g, 0). A thread takes chunk i by a CAS of (g, i)
 * to (g, i + 1), so it never takes a chunk of a launch that is over; a job slot is written again
 * only for generation g + 2, after every chunk of g and g + 1 was finished, so a thread that read
 * (g, i) reads g's job until its CAS tells it whether g is still running.
 *
 * One launch at a time: pool_run holds a mutex for its launch, so two threads launching at once
 * (a test's threads; the engine launches from one) take turns. Without Linux futexes the sleeps are
 * sched_yield and short nanosleeps. */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define POOL_PAUSE() __asm__ __volatile__("yield")
#else
#define POOL_PAUSE() ((void)0)
#endif

#define POOL_MAX_THREADS 256
#define CHUNKS_PER_THREAD 6
#ifndef SPIN_NS
/* A worker's spin after a launch before it sleeps. Long enough to span the gaps inside a decode step
 * (a single-threaded launch such as the fused collective row or a short attention, and Python,
 * between two parallel ones: up to ~100 µs), short of the gap between steps. Waking a sleeping worker
 * cost a launch ~40 µs on this KVM guest: with 50 µs here a SmolLM2 decode step took 19.7 ms, with
 * 100 µs 15.8, 200 µs 14.7, 1 ms 14.3 (bench/results/generate_tp1_issue16.md). */
#define SPIN_NS 200000
#endif
#ifndef CALLER_SPIN_NS
#define CALLER_SPIN_NS 20000 /* the caller's spin for the last chunks before it yields */
#endif
#ifndef CALLER_YIELD_NS
#define CALLER_YIELD_NS 200000 /* then its sched_yield loop before it sleeps */
#endif

typedef void (*pool_fn)(const void *ctx, int64_t begin, int64_t end);

typedef struct {
    pool_fn fn;
    const void *ctx;
    int64_t items, chunk; /* items [0, items) in chunks of `chunk` */
    uint32_t chunks;
    int threads; /* workers with id < threads take part (the caller is id 0) */
} PoolJob;

static struct {
    _Atomic uint64_t ticket;
    _Atomic uint32_t generation; /* the workers' futex word: the last generation published */
    _Atomic uint32_t sleepers;   /* workers asleep on `generation` */
    _Atomic uint32_t done[2];    /* chunks finished of jobs[g & 1]; the caller's futex word */
    _Atomic uint32_t caller_asleep;
    PoolJob jobs[2];
    uint32_t published; /* the caller's own count of generations */
    int workers;        /* worker threads started (ids 1..workers) */
    pthread_mutex_t start_lock, run_lock;
} g_pool = {.start_lock = PTHREAD_MUTEX_INITIALIZER, .run_lock = PTHREAD_MUTEX_INITIALIZER};

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* sleep while *word == expected (returns at once if it differs; spurious returns allowed) */
static void word_sleep(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns) {
#ifdef __linux__
    struct timespec t = {(time_t)(timeout_ns / 1000000000LL), (long)(timeout_ns % 1000000000LL)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, timeout_ns > 0 ? &t : NULL, NULL, 0);
#else
    (void)timeout_ns;
    if (atomic_load(word) == expected) {
        struct timespec t = {0, 20000};
        sched_yield();
        nanosleep(&t, NULL);
    }
#endif
}

static void word_wake(_Atomic uint32_t *word, int count) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
#else
    (void)word, (void)count;
#endif
}

/* take and run chunks of generation g until none is left */
static void pool_take(uint32_t g) {
    const PoolJob *job = &g_pool.jobs[g & 1];
    for (;;) {
        uint64_t t = atomic_load_explicit(&g_pool.ticket, memory_order_acquire);
        if ((uint32_t)(t >> 32) != g) return;
        const uint32_t i = (uint32_t)t, chunks = job->chunks;
        if (i >= chunks) return;
        if (!atomic_compare_exchange_weak_explicit(&g_pool.ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        const int64_t begin = (int64_t)i * job->chunk, end = begin + job->chunk;
        job->fn(job->ctx, begin, end < job->items ? end : job->items);
        if (atomic_fetch_add(&g_pool.done[g & 1], 1) + 1 == chunks && atomic_load(&g_pool.caller_asleep))
            word_wake(&g_pool.done[g & 1], 1);
    }
}

static void *pool_worker(void *arg) {
    const int id = (int)(intptr_t)arg;
    uint32_t seen = atomic_load(&g_pool.generation);
    for (;;) {
        uint32_t g = atomic_load_explicit(&g_pool.generation, memory_order_acquire);
        if (g == seen) {
            const int64_t until = now_ns() + SPIN_NS;
            for (int n = 1; (g = atomic_load_explicit(&g_pool.generation, memory_order_acquire)) == seen; n++) {
                POOL_PAUSE();
                if ((n & 63) == 0) /* a thread waiting for this core (a rank sharing it, the launcher) goes first */
                    sched_yield();
                if ((n & 63) == 0 && now_ns() > until) {
                    atomic_fetch_add(&g_pool.sleepers, 1);
                    if (atomic_load(&g_pool.generation) == seen) word_sleep(&g_pool.generation, seen, 0);
                    atomic_fetch_sub(&g_pool.sleepers, 1);
                }
            }
        }
        seen = g;
        if (id < g_pool.jobs[g & 1].threads) pool_take(g);
    }
    return NULL;
}

/* after fork() only the calling thread exists: the child starts its own workers when it needs them */
static void pool_after_fork(void) {
    g_pool.workers = 0;
    atomic_store(&g_pool.sleepers, 0);
    atomic_store(&g_pool.caller_asleep, 0);
    pthread_mutex_init(&g_pool.start_lock, NULL);
    pthread_mutex_init(&g_pool.run_lock, NULL);
}

/* workers 1..want-1 running; returns how many threads (the caller included) can take part */
static int pool_start(int want) {
    if (want > POOL_MAX_THREADS) want = POOL_MAX_THREADS;
    if (g_pool.workers >= want - 1) return want;
    pthread_mutex_lock(&g_pool.start_lock);
    static int hooked = 0;
    if (!hooked) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        hooked = 1;
    }
    while (g_pool.workers < want - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        const int failed = pthread_create(&thread, &attr, pool_worker, (void *)(intptr_t)(g_pool.workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        g_pool.workers++;
    }
    pthread_mutex_unlock(&g_pool.start_lock);
    return g_pool.workers + 1 < want ? g_pool.workers + 1 : want;
}

/* fn(ctx, begin, end) over [0, items), cut in chunks of whole `unit`s, on up to `threads` threads
 * (this one included); returns when every chunk has run. */
static int g_pool_force; /* > 0: every region on this many threads, whatever its size (r4d_par_force) */

static void pool_run(pool_fn fn, const void *ctx, int64_t items, int64_t unit, int threads) {
    if (items <= 0) return;
    if (unit < 1) unit = 1;
    if (g_pool_force > 0) threads = g_pool_force;
    const int64_t units = (items + unit - 1) / unit;
    if (threads > 1) threads = pool_start(threads);
    if (threads <= 1 || units <= 1) {
        fn(ctx, 0, items);
        return;
    }
    int64_t per = (units + (int64_t)threads * CHUNKS_PER_THREAD - 1) / ((int64_t)threads * CHUNKS_PER_THREAD);
    const int64_t chunk = per * unit;
    pthread_mutex_lock(&g_pool.run_lock);
    const uint32_t g = ++g_pool.published;
    PoolJob *job = &g_pool.jobs[g & 1];
    job->fn = fn;
    job->ctx = ctx;
    job->items = items;
    job->chunk = chunk;
    job->chunks = (uint32_t)((items + chunk - 1) / chunk);
    job->threads = threads;
    atomic_store(&g_pool.done[g & 1], 0);
    atomic_store(&g_pool.ticket, (uint64_t)g << 32);
    atomic_store(&g_pool.generation, g);
    if (atomic_load(&g_pool.sleepers)) word_wake(&g_pool.generation, threads - 1);
    pool_take(g);
    const uint32_t chunks = job->chunks;
    uint32_t finished = atomic_load(&g_pool.done[g & 1]);
    if (finished != chunks) {
        const int64_t start = now_ns();
        for (int n = 1; (finished = atomic_load(&g_pool.done[g & 1])) != chunks; n++) {
            POOL_PAUSE();
            if ((n & 63) == 0 && now_ns() - start > CALLER_SPIN_NS) break;
        }
        while (atomic_load(&g_pool.done[g & 1]) != chunks && now_ns() - start < CALLER_SPIN_NS + CALLER_YIELD_NS)
            sched_yield();
        while ((finished = atomic_load(&g_pool.done[g & 1])) != chunks) {
            atomic_store(&g_pool.caller_asleep, 1);
            if ((finished = atomic_load(&g_pool.done[g & 1])) != chunks)
                word_sleep(&g_pool.done[g & 1], finished, 1000000);
            atomic_store(&g_pool.caller_asleep, 0);
        }
    }
    pthread_mutex_unlock(&g_pool.run_lock);
}

/* ------------------------------------------------------------------------------------------ */
/* waiting on a word another process writes: the host collectives' flags (collectives.py) */

/* Wait until the u64 at `word` >= value: spin for `spin_ns`, sched_yield until `yield_ns` more have
 * passed (the core to a rank sharing it, the core kept awake), then sleep on its low 32 bits (the
 * writer stores the new value, then calls r4d_wake_word), re-checking at least every millisecond.
 * Returns 0, or -1 after timeout_ns (0: no limit). Shared memory: the futex is not private. */
int r4d_wait_word(const uint64_t *word, uint64_t value, int64_t spin_ns, int64_t yield_ns, int64_t timeout_ns) {
    const _Atomic uint64_t *w = (const _Atomic uint64_t *)word;
    if (atomic_load_explicit(w, memory_order_acquire) >= value) return 0;
    const int64_t start = now_ns();
    for (int n = 1; atomic_load_explicit(w, memory_order_acquire) < value; n++) {
        POOL_PAUSE();
        if ((n & 63) == 0 && now_ns() - start > spin_ns) break;
    }
    while (atomic_load_explicit(w, memory_order_acquire) < value && now_ns() - start < spin_ns + yield_ns) sched_yield();
    for (;;) {
        const uint64_t seen = atomic_load_explicit(w, memory_order_acquire);
        if (seen >= value) return 0;
        const int64_t elapsed = now_ns() - start;
        if (timeout_ns > 0 && elapsed > timeout_ns) return -1;
#ifdef __linux__
        struct timespec t = {0, 1000000};
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, (uint32_t)seen, &t, NULL, 0);
#else
        sched_yield();
#endif
    }
}

/* wake every process sleeping on `word` in r4d_wait_word (after storing its new value) */
void r4d_wake_word(uint64_t *word) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}
