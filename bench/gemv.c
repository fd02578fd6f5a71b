/*
 * bench/gemv.c - how fast each decode matrix-vector kernel (the CPU kernel
 * table's gemv) streams weights from memory, one thread, against the
 * machine's read bandwidth (bench/bandwidth.c) measured the same way.
 *
 * Weights of TinyLlama-1.1B's FFN shape (5632 x 2048 and 2048 x 5632
 * matrices, repeated to SIZE MiB, far beyond the caches) are read through
 * the table's gemv in the order decode reads them, best of REPS passes.
 * Prints GB/s per type and the share of a plain read of the same bytes;
 * "1 col" rows time the batch-invariant decode (tensr-server's default):
 * one column with the gemm's bits, through the gemm itself (which packs
 * the rows) and through gemm1 where the table has it, the activations in
 * the gemm's format (tsr_cpu_q8s rows on VNNI machines); "8 col gemm", the
 * decode of 8 streams (the weights' bytes over the time: 8 columns each).
 * Not a test: it measures. Build: make bench/gemv (in the build tree).
 *
 * usage: bench/gemv [SIZE_MiB (default 1024)] [REPS (default 5)] [TYPE ...]
 */
#define _POSIX_C_SOURCE 200809L
#include "../tests/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* GB/s of a plain read of n bytes (AVX2 loads summed), best of reps */
static double read_rate(const char *p, size_t n, int reps) {
    double best = 0;
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = now();
        uint64_t acc = 0;
        for (size_t i = 0; i + 64 <= n; i += 64) {
            uint64_t v[8];
            memcpy(v, p + i, 64);
            acc += v[0] ^ v[3] ^ v[7];
        }
        sink += acc;
        const double g = (double)n / (now() - t0) / 1e9;
        best = g > best ? g : best;
    }
    (void)sink;
    return best;
}

/* One pass over the nmat matrices (alternately of the two shapes) through
 * kernel kind: 0 the gemv, 1 the gemm at one column (scratch: its scratch),
 * 2 gemm1 (the gemm's bits, read as the gemv reads), 8 the gemm at 8
 * columns (8 streams' decode; y: 8 rows ys bytes apart). */
typedef struct pass {
    const tsr_cpu_kernels *k;
    tsr_type t;
    bool il8;
    int kind;
    char *mem;
    size_t nmat, mat[2], xs[2];
    int64_t ks[2], ms[2];
    const char *y[2];
    size_t ys[2];
    float *out;
    void *scratch;
} pass;

static double pass_rate(const pass *ps, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = now();
        size_t off = 0;
        for (size_t m = 0; m < ps->nmat; m++) {
            const int s = (int)(m % 2);
            const char *x = ps->mem + off;
            if (ps->kind == 0)
                (ps->il8 ? ps->k->gemv_il8 : ps->k->gemv)[ps->t](ps->ks[s], ps->ms[s], 0, x, ps->xs[s], ps->y[s],
                                                                 ps->out);
            else if (ps->kind == 2)
                (ps->il8 ? ps->k->gemm1_il8 : ps->k->gemm1)[ps->t](ps->ks[s], ps->ms[s], 0, x, ps->xs[s], ps->y[s],
                                                                   ps->out);
            else
                (ps->il8 ? ps->k->gemm_il8 : ps->k->gemm)[ps->t](ps->ks[s], ps->ms[s], ps->kind == 8 ? 8 : 1, x,
                                                                 ps->xs[s], ps->y[s], ps->ys[s], ps->out,
                                                                 (size_t)ps->ms[s], ps->scratch);
            off += ps->mat[s];
        }
        const double g = (double)off / (now() - t0) / 1e9;
        best = g > best ? g : best;
    }
    return best;
}

/* The gemm's rows of ps's weights (yg: its activations, 8 rows ygs apart):
 * one column through the gemm, through gemm1 where the table has one, and 8
 * columns. */
static void gemm_rows(const pass *ps, char *const yg[2], const size_t ygs[2], int reps, double bw, const char *layout) {
    static const struct {
        int kind;
        const char *what;
    } rows[] = {{1, "1 col gemm"}, {2, "1 col gemm1"}, {8, "8 col gemm"}};
    pass pg = *ps;
    pg.y[0] = yg[0], pg.y[1] = yg[1], pg.ys[0] = ygs[0], pg.ys[1] = ygs[1];
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].kind == 2 && !(ps->il8 ? ps->k->gemm1_il8 : ps->k->gemm1)[ps->t])
            continue;
        pg.kind = rows[i].kind;
        const double best = pass_rate(&pg, reps);
        printf("| %s%s, %s | %.2f | %.0f%% |\n", tsr_type_name(ps->t), layout, rows[i].what, best, 100 * best / bw);
    }
}

int main(int argc, char **argv) {
    const size_t size = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    static const tsr_type all[] = {TSR_TYPE_Q4_0, TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q4_K,
                                   TSR_TYPE_Q5_K, TSR_TYPE_Q6_K, TSR_TYPE_Q8_0, TSR_TYPE_F16};
    const tsr_cpu_kernels *k = tsr__cpu_kernels();
    char *mem = aligned_alloc(64, size);
    memset(mem, 1, size);
    const double bw = read_rate(mem, size, reps);
    printf("kernels %s, one thread, %zu MiB: plain read %.2f GB/s\n", k->name, size >> 20, bw);
    printf("| type | gemv GB/s | share of the read |\n| --- | ---: | ---: |\n");
    for (size_t ti = 0; ti < sizeof all / sizeof all[0]; ti++) {
        const tsr_type t = all[ti];
        if (argc > 3) {
            bool want = false;
            for (int a = 3; a < argc; a++) want |= !strcmp(argv[a], tsr_type_name(t));
            if (!want)
                continue;
        }
        if (!k->gemv[t]) {
            printf("| %s | (no gemv) | |\n", tsr_type_name(t));
            continue;
        }
        /* the FFN's two shapes, alternately: k = 2048 (gate/up, 5632 rows) and k = 5632 (down, 2048 rows) */
        const int64_t ks[2] = {2048, 5632}, ms[2] = {5632, 2048};
        const size_t xs[2] = {tsr_row_size(t, ks[0]), tsr_row_size(t, ks[1])};
        const size_t mat[2] = {xs[0] * (size_t)ms[0], xs[1] * (size_t)ms[1]};
        size_t nmat = size / (mat[0] + mat[1]) * 2;
        /* a bank of 64 quantized rows of each shape, copied through the weights */
        float *f = malloc(5632 * sizeof(float));
        for (int s = 0; s < 2; s++) {
            char *bank = malloc(64 * xs[s]);
            for (int r = 0; r < 64; r++) {
                for (int64_t i = 0; i < ks[s]; i++) f[i] = frand();
                tsr__type_traits(t)->from_float(f, bank + (size_t)r * xs[s], ks[s]);
            }
            size_t off = 0;
            for (size_t m = 0; m < nmat; m++) {
                if ((int)(m % 2) == s)
                    for (int64_t r = 0; r < ms[s]; r++)
                        memcpy(mem + off + (size_t)r * xs[s], bank + (size_t)(r % 64) * xs[s], xs[s]);
                off += mat[m % 2];
            }
            free(bank);
        }
        const tsr_type dt = k->dot_type[t];
        char *y[2], *yg[2] = {NULL, NULL};
        size_t ygs[2] = {0, 0};
        const bool gm = k->gemm[t] != NULL, q8s = gm && k->gemm_q8s[t];
        for (int s = 0; s < 2; s++) {
            for (int64_t i = 0; i < ks[s]; i++) f[i] = frand();
            y[s] = malloc(tsr_row_size(dt, ks[s]));
            k->from_float[dt](f, y[s], ks[s]);
            if (gm) { /* 8 columns (the 8 streams' rows: copies of one) */
                ygs[s] = q8s ? TSR_CPU_Q8S_ROW(ks[s]) : tsr_row_size(k->gemm_type[t], ks[s]);
                yg[s] = malloc(8 * ygs[s]);
                (q8s ? k->q8s_from_float : k->from_float[k->gemm_type[t]])(f, yg[s], ks[s]);
                for (int c = 1; c < 8; c++) memcpy(yg[s] + (size_t)c * ygs[s], yg[s], ygs[s]);
            }
        }
        float *out = malloc(8 * 5632 * sizeof(float));
        void *scratch = aligned_alloc(64, tsr__pad(TSR_CPU_GEMM_SCRATCH(5632), 64));
        pass ps = {k,
                   t,
                   false,
                   0,
                   mem,
                   nmat,
                   {mat[0], mat[1]},
                   {xs[0], xs[1]},
                   {ks[0], ks[1]},
                   {ms[0], ms[1]},
                   {y[0], y[1]},
                   {0, 0},
                   out,
                   scratch};
        double best = pass_rate(&ps, reps);
        printf("| %s | %.2f | %.0f%% |\n", tsr_type_name(t), best, 100 * best / bw);
        if (gm)
            gemm_rows(&ps, yg, ygs, reps, bw, "");
        if (k->gemv_il8[t]) { /* the same weights in the 8-row interleaved layout (cpu/repack.c) */
            char *tmp = malloc(8 * xs[1] > 8 * xs[0] ? 8 * xs[1] : 8 * xs[0]);
            size_t off = 0;
            for (size_t m = 0; m < nmat; m++) {
                const int s = (int)(m % 2);
                tsr_tensor w = {0};
                w.type = t, w.data = mem + off, w.ne[0] = ks[s], w.ne[1] = ms[s], w.ne[2] = w.ne[3] = 1;
                w.nb[0] = tsr_row_size(t, tsr_type_block_size(t)), w.nb[1] = xs[s];
                tsr__il8_groups(&w, 0, ms[s] / 8, true, tmp);
                off += mat[s];
            }
            free(tmp);
            ps.il8 = true;
            best = pass_rate(&ps, reps);
            printf("| %s interleaved | %.2f | %.0f%% |\n", tsr_type_name(t), best, 100 * best / bw);
            if (gm && k->gemm_il8[t])
                gemm_rows(&ps, yg, ygs, reps, bw, " interleaved");
        }
        free(scratch), free(yg[0]), free(yg[1]);
        free(f), free(out), free(y[0]), free(y[1]);
    }
    free(mem);
    return 0;
}
