/* bandwidth.c - the machine's read bandwidth: T threads each sum their slice
 * of one large buffer (far above the caches) with wide loads; prints the
 * best of several passes in GB/s (10^9 bytes/s). bench/compare.sh uses it
 * for the generation ceiling (model bytes x tokens/s / bandwidth).
 *   usage: bandwidth [threads (default 1)] [MiB (default 1024)] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *bar;
    int passes;
} job;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Eight independent sums: the compiler vectorizes the loop into wide loads. */
static uint64_t sum_slice(const uint64_t *p, size_t n) {
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] ^= p[i + k];
    return s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
}

static void *worker(void *arg) {
    job *j = arg;
    for (int r = 0; r < j->passes; r++) {
        pthread_barrier_wait(j->bar); /* start */
        j->sum += sum_slice(j->p, j->n);
        pthread_barrier_wait(j->bar); /* all read */
        pthread_barrier_wait(j->bar); /* main thread has timed the pass */
    }
    return NULL;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 1;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    if (nt < 1 || nt > 1024 || mib < 64) {
        fprintf(stderr, "usage: bandwidth [threads] [MiB >= 64]\n");
        return 1;
    }
    size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *buf = aligned_alloc(64, n * sizeof *buf);
    if (!buf)
        return 1;
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9E3779B97F4A7C15ull;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nt + 1);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    job *jobs = calloc((size_t)nt, sizeof *jobs);
    const int passes = 8;
    size_t per = (n / (size_t)nt) & ~(size_t)7;
    for (int i = 0; i < nt; i++) {
        jobs[i] = (job){buf + (size_t)i * per, per, 0, &bar, passes};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    double best = 0;
    for (int r = 0; r < passes; r++) {
        pthread_barrier_wait(&bar);
        double t0 = now();
        pthread_barrier_wait(&bar);
        double gbs = (double)(per * (size_t)nt * sizeof *buf) / (now() - t0) / 1e9;
        if (r > 0 && gbs > best) /* the first pass warms the pages */
            best = gbs;
        pthread_barrier_wait(&bar);
    }
    uint64_t x = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        x ^= jobs[i].sum;
    }
    printf("%.2f\n", best);
    fprintf(stderr, "bandwidth: %d threads, %zu MiB, best of %d passes: %.2f GB/s (checksum %llx)\n", nt, mib,
            passes - 1, best, (unsigned long long)x);
    free(jobs);
    free(th);
    free(buf);
    return 0;
}
