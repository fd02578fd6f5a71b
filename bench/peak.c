/* peak.c - the machine's arithmetic peak with T threads, for the prompt
 * processing ceiling of bench/compare.sh: F32 FMA (GFLOP/s, 2 per lane) and
 * 8-bit integer dot products (GOP/s, a multiply and an add per byte pair),
 * each from chains of independent accumulators that keep the units busy.
 * Prints the rate per CPU-second times the threads (what that many cores
 * of one's own give, even on a shared machine), then the wall-clock rate.
 *   usage: peak fma|int8 [threads (default 1)] [avx2|avx512|best (default avx2)]
 * Built with -O2 -march=native by bench/compare.sh; avx512 needs a CPU and
 * compiler with AVX-512 (int8 then uses VNNI when the CPU has it); best is
 * avx512 where the build and the CPU have it, else avx2 (the peak of the
 * kernels libtensr picks by default). */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ITERS 20000000L
/* GCC -O2 keeps a small loop over a register array as a loop, the array on
 * the stack (a load and a store per FMA): unrolled, it stays in registers. */
#define UNROLL _Pragma("GCC unroll 10")

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct job {
    int kind, wide; /* kind 0 fma, 1 int8; wide: AVX-512 */
    double sink;
} job;

/* 10 accumulators x 8 lanes x 2 flop per iteration. */
static double fma_avx2(void) {
    __m256 a[10], x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    for (int k = 0; k < 10; k++) a[k] = _mm256_set1_ps((float)k);
    for (long i = 0; i < ITERS; i++) {
        UNROLL for (int k = 0; k < 10; k++) a[k] = _mm256_fmadd_ps(a[k], x, y);
    }
    __m256 s = a[0];
    for (int k = 1; k < 10; k++) s = _mm256_add_ps(s, a[k]);
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0];
}

/* maddubs (32 byte pairs -> 16 i16) + madd (-> 8 i32) + add per step, the
 * sequence the AVX2 quantized kernels use: 64 ops per step. */
static double int8_avx2(void) {
    __m256i a[8], u = _mm256_set1_epi8(3), one = _mm256_set1_epi16(1);
    __m256i s[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_si256(), s[k] = _mm256_set1_epi8((char)(k + 1));
    for (long i = 0; i < ITERS; i++)
        UNROLL for (int k = 0; k < 8; k++)
            a[k] = _mm256_add_epi32(a[k], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s[k]), one));
    __m256i r = a[0];
    for (int k = 1; k < 8; k++) r = _mm256_add_epi32(r, a[k]);
    return (double)_mm256_extract_epi32(r, 0);
}

#ifdef __AVX512F__
static double fma_avx512(void) {
    __m512 a[10], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    for (int k = 0; k < 10; k++) a[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < ITERS; i++) {
        UNROLL for (int k = 0; k < 10; k++) a[k] = _mm512_fmadd_ps(a[k], x, y);
    }
    __m512 s = a[0];
    for (int k = 1; k < 10; k++) s = _mm512_add_ps(s, a[k]);
    return _mm512_reduce_add_ps(s);
}

static double int8_avx512(void) {
    __m512i a[8], u = _mm512_set1_epi8(3), s[8];
    for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_si512(), s[k] = _mm512_set1_epi8((char)(k + 1));
    for (long i = 0; i < ITERS; i++)
        UNROLL for (int k = 0; k < 8; k++)
#ifdef __AVX512VNNI__
            a[k] = _mm512_dpbusd_epi32(a[k], u, s[k]);
#else
            a[k] = _mm512_add_epi32(a[k], _mm512_madd_epi16(_mm512_maddubs_epi16(u, s[k]), _mm512_set1_epi16(1)));
#endif
    __m512i r = a[0];
    for (int k = 1; k < 8; k++) r = _mm512_add_epi32(r, a[k]);
    return (double)_mm512_reduce_add_epi32(r);
}
#endif

static void *worker(void *arg) {
    job *j = arg;
#ifdef __AVX512F__
    if (j->wide) {
        j->sink = j->kind ? int8_avx512() : fma_avx512();
        return NULL;
    }
#endif
    j->sink = j->kind ? int8_avx2() : fma_avx2();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "fma") && strcmp(argv[1], "int8"))) {
        fprintf(stderr, "usage: peak fma|int8 [threads] [avx2|avx512|best]\n");
        return 1;
    }
    int kind = !strcmp(argv[1], "int8"), nt = argc > 2 ? atoi(argv[2]) : 1;
    int wide = argc > 3 && !strcmp(argv[3], "avx512");
#ifdef __AVX512F__
    if (argc > 3 && !strcmp(argv[3], "best"))
        wide = __builtin_cpu_supports("avx512f");
#endif
#ifndef __AVX512F__
    if (wide) {
        fprintf(stderr, "peak: built without AVX-512\n");
        return 1;
    }
#endif
    if (nt < 1 || nt > 1024)
        return 1;
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    job *jobs = calloc((size_t)nt, sizeof *jobs);
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double t0 = now();
    for (int i = 0; i < nt; i++) {
        jobs[i].kind = kind, jobs[i].wide = wide;
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    double sink = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        sink += jobs[i].sink;
    }
    double dt = now() - t0, lanes = wide ? 2 : 1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    const double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    /* fma: 10 acc x 8 lanes x 2; int8: 8 acc x 32 pairs x 2 */
    double ops = (double)ITERS * nt * lanes * (kind ? 8.0 * 32 * 2 : 10.0 * 8 * 2);
    /* stdout: the rate per CPU-second times the threads - the peak of that
     * many cores of one's own, also on a machine others share - then the
     * wall-clock rate */
    printf("%.1f %.1f\n", ops / cpu / 1e9 * nt, ops / dt / 1e9);
    /* per CPU-second: what one core gives when the machine is shared */
    fprintf(stderr, "peak: %s %s, %d threads: %.1f G%s/s wall, %.1f per CPU-second (%g)\n", argv[1],
            wide ? "avx512" : "avx2", nt, ops / dt / 1e9, kind ? "OP" : "FLOP", ops / cpu / 1e9, sink);
    free(jobs);
    free(th);
    return 0;
}
