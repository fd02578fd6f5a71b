/*
 * threadpool.c - the CPU stream's persistent threadpool. Workers live as
 * long as the stream; a job (fn) runs on all threads at once and threads
 * meet at barriers between graph nodes. Waiting spins briefly (most waits
 * between nodes are microseconds) and then sleeps on a futex, so idle pools
 * cost no CPU and a busy machine is not starved.
 *
 * On a machine whose cores are taken by other work a barrier waits for a
 * thread the scheduler has set aside, and generation slows down many times
 * (2 threads: 6 tokens/s where 1 thread makes 42, under a load of 20 on 2
 * cores). So each job measures its threads' time waiting at barriers: when
 * the threads together were busy for less than one thread's worth of the
 * job's wall time (more parallelism lost than gained), the next jobs run on
 * the calling thread alone (nth = 1; results do not depend on the thread
 * count), 8 jobs at first, doubling up to 256 while a probe with all
 * threads still loses.
 */
#include "cpu.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SPIN_ITERS 2000
#define YIELD_ITERS 8
#define SINGLE_MIN 8
#define SINGLE_MAX 256

struct tsr_threadpool {
    int n_threads;
    pthread_t *threads;
    tsr_tp_fn fn;
    void *arg;
    _Alignas(64) atomic_uint job_gen;  /* bumped for each job; workers wait on it */
    _Alignas(64) atomic_int n_active;  /* workers still running the current job */
    _Alignas(64) atomic_int bar_count; /* arrivals at the current barrier */
    _Alignas(64) atomic_uint bar_gen;  /* bumped when a barrier opens */
    atomic_int sleepers;               /* threads sleeping on a futex */
    atomic_int stop;
    int cur_nth;                       /* threads of the running job (1: the caller alone) */
    _Alignas(64) atomic_llong wait_ns; /* summed barrier waits of the running job */
    int single_left, backoff;          /* jobs still to run alone; length of the next such run */
    bool adaptive;                     /* TSR_THREADPOOL_ADAPTIVE is not "0" */
};

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void futex_wait(atomic_uint *addr, unsigned val) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake(atomic_uint *addr) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits until *addr != val: spin first, then sleep. */
static void wait_change(tsr_threadpool *tp, atomic_uint *addr, unsigned val) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val)
            return;
        cpu_relax();
    }
    /* more threads than free cores: let the thread we wait for run */
    for (int i = 0; i < YIELD_ITERS; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val)
            return;
        sched_yield();
    }
    atomic_fetch_add(&tp->sleepers, 1);
    while (atomic_load_explicit(addr, memory_order_acquire) == val) futex_wait(addr, val);
    atomic_fetch_sub(&tp->sleepers, 1);
}

static void bump_and_wake(tsr_threadpool *tp, atomic_uint *addr) {
    atomic_fetch_add_explicit(addr, 1, memory_order_acq_rel);
    if (atomic_load(&tp->sleepers) > 0)
        futex_wake(addr);
}

void tsr__tp_barrier(tsr_threadpool *tp) { tsr__tp_barrier_pf(tp, NULL); }

/* Lines requested per look at the barrier. */
#define PF_LINES 8

void tsr__tp_barrier_pf(tsr_threadpool *tp, tsr_prefetch *pf) {
    const int nth = tp->cur_nth;
    if (nth == 1)
        return;
    const unsigned gen = atomic_load_explicit(&tp->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&tp->bar_count, 1, memory_order_acq_rel) == nth - 1) {
        atomic_store_explicit(&tp->bar_count, 0, memory_order_relaxed);
        bump_and_wake(tp, &tp->bar_gen);
        return;
    }
    const int64_t t0 = mono_ns();
    if (pf)
        while (pf->cur < pf->end && atomic_load_explicit(&tp->bar_gen, memory_order_acquire) == gen)
            for (int i = 0; i < PF_LINES && pf->cur < pf->end; i++, pf->cur += 64) __builtin_prefetch(pf->cur, 0, 2);
    wait_change(tp, &tp->bar_gen, gen);
    atomic_fetch_add_explicit(&tp->wait_ns, mono_ns() - t0, memory_order_relaxed);
}

typedef struct worker_arg {
    tsr_threadpool *tp;
    int ith;
} worker_arg;

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    tsr_threadpool *tp = wa->tp;
    const int ith = wa->ith;
    tsr__free(wa);
    unsigned seen = 0;
    for (;;) {
        wait_change(tp, &tp->job_gen, seen);
        seen = atomic_load_explicit(&tp->job_gen, memory_order_acquire);
        if (atomic_load(&tp->stop))
            break;
        tp->fn(tp->arg, ith, tp->n_threads);
        atomic_fetch_sub_explicit(&tp->n_active, 1, memory_order_acq_rel);
    }
    return NULL;
}

void tsr__tp_run(tsr_threadpool *tp, tsr_tp_fn fn, void *arg) {
    if (tp->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    if (tp->single_left > 0) { /* the cores are busy elsewhere: alone */
        tp->single_left--;
        tp->cur_nth = 1;
        fn(arg, 0, 1);
        tp->cur_nth = tp->n_threads;
        return;
    }
    atomic_store_explicit(&tp->wait_ns, 0, memory_order_relaxed);
    const int64_t t0 = mono_ns();
    tp->fn = fn;
    tp->arg = arg;
    atomic_store(&tp->n_active, tp->n_threads - 1);
    bump_and_wake(tp, &tp->job_gen);
    fn(arg, 0, tp->n_threads);
    /* Workers finish within a barrier's time of us: spin (with a yield so
     * an oversubscribed machine makes progress). */
    const int64_t t1 = mono_ns();
    for (long i = 0; atomic_load_explicit(&tp->n_active, memory_order_acquire) > 0; i++) {
        if (i < SPIN_ITERS)
            cpu_relax();
        else
            sched_yield();
    }
    const int64_t t2 = mono_ns(), wall = t2 - t0;
    const int64_t busy = (int64_t)tp->n_threads * wall - atomic_load(&tp->wait_ns) - (t2 - t1);
    if (!tp->adaptive)
        return;
    if (wall > 50000 && busy < wall) { /* less than one thread's worth: run alone for a while */
        tp->single_left = tp->backoff;
        tp->backoff = tp->backoff * 2 < SINGLE_MAX ? tp->backoff * 2 : SINGLE_MAX;
    } else if (wall > 50000) {
        tp->backoff = SINGLE_MIN;
    }
}

static void stop_workers(tsr_threadpool *tp, int n_started) {
    atomic_store(&tp->stop, 1);
    bump_and_wake(tp, &tp->job_gen);
    for (int i = 0; i < n_started; i++) pthread_join(tp->threads[i], NULL);
}

tsr_status tsr__tp_new(int n_threads, tsr_threadpool **out) {
    *out = NULL;
    if (n_threads < 1)
        return tsr__error(TSR_E_INVALID, "cpu: threadpool: n_threads must be >= 1, found %d", n_threads);
    tsr_threadpool *tp = tsr__aligned_alloc(64, sizeof *tp);
    if (!tp)
        return tsr__error(TSR_E_NOMEM, "cpu: threadpool: out of memory");
    memset(tp, 0, sizeof *tp);
    tp->n_threads = n_threads;
    tp->cur_nth = n_threads;
    tp->backoff = SINGLE_MIN;
    const char *ad = getenv("TSR_THREADPOOL_ADAPTIVE");
    tp->adaptive = !(ad && strcmp(ad, "0") == 0);
    if (n_threads > 1) {
        tp->threads = tsr__calloc((size_t)n_threads - 1, sizeof *tp->threads);
        if (!tp->threads) {
            tsr__aligned_free(tp);
            return tsr__error(TSR_E_NOMEM, "cpu: threadpool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = tsr__malloc(sizeof *wa);
        if (wa) {
            wa->tp = tp;
            wa->ith = i;
        }
        int rc = wa ? pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) : -1;
        if (rc != 0) {
            tsr__free(wa);
            stop_workers(tp, i - 1);
            tsr__free(tp->threads);
            tsr__aligned_free(tp);
            return tsr__error(rc > 0 ? TSR_E_DEVICE : TSR_E_NOMEM, "cpu: threadpool: cannot start thread %d of %d (%s)",
                              i, n_threads, rc > 0 ? strerror(rc) : "out of memory");
        }
    }
    *out = tp;
    return TSR_OK;
}

void tsr__tp_free(tsr_threadpool *tp) {
    if (!tp)
        return;
    stop_workers(tp, tp->n_threads - 1);
    tsr__free(tp->threads);
    tsr__aligned_free(tp);
}

int tsr__tp_n_threads(const tsr_threadpool *tp) { return tp->n_threads; }
