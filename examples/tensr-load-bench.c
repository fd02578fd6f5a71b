/*
 * tensr-load-bench.c - times tsr_backend_load_gguf (used by
 * tests/bench-load.sh). Each run makes a fresh CPU backend, loads the model
 * and frees it; the time of the load call alone is printed, one line per run:
 *   seconds=0.123 mib=92.1 mib_per_s=748.8 io_threads=4 mmap=0
 *
 *   tensr-load-bench MODEL.gguf [-t IO_THREADS] [-m] [-n RUNS] [--verify] [-p]
 * -t 0 (default) lets the loader choose; -m maps CPU weights instead of
 * reading them; -p times only the GGUF parse (tsr_gguf_open + close), the
 * part of a load that comes before placement and reads. Exit status 1 on
 * any error, with the library's message.
 */
#include "libtensr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int usage(void) {
    fprintf(stderr, "usage: tensr-load-bench MODEL.gguf [-t IO_THREADS] [-m] [-n RUNS] [--verify] [-p]\n");
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int threads = 0, mmap = 0, runs = 1, verify = 0, parse_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "-m") == 0)
            mmap = 1;
        else if (strcmp(argv[i], "--verify") == 0)
            verify = 1;
        else if (strcmp(argv[i], "-p") == 0)
            parse_only = 1;
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else
            return usage();
    }
    if (!path || runs < 1 || threads < 0)
        return usage();
    for (int r = 0; r < runs && parse_only; r++) {
        tsr_gguf *g = NULL;
        double t0 = now_s();
        tsr_status s = tsr_gguf_open(path, &g);
        tsr_gguf_close(g);
        if (s != TSR_OK) {
            fprintf(stderr, "tensr-load-bench: %s: %s\n", tsr_status_string(s), tsr_last_error());
            return 1;
        }
        printf("seconds=%.4f parse_only=1\n", now_s() - t0);
    }
    for (int r = 0; r < runs && !parse_only; r++) {
        tsr_backend *b = NULL;
        tsr_status s = tsr_backend_new(NULL, &b);
        if (s != TSR_OK) {
            fprintf(stderr, "tensr-load-bench: %s: %s\n", tsr_status_string(s), tsr_last_error());
            return 1;
        }
        tsr_load_params p;
        tsr_load_params_init(&p, sizeof p);
        p.n_io_threads = threads;
        p.use_mmap = mmap;
        p.verify = verify;
        double t0 = now_s();
        s = tsr_backend_load_gguf(b, path, &p);
        double dt = now_s() - t0;
        if (s != TSR_OK) {
            fprintf(stderr, "tensr-load-bench: %s: %s\n", tsr_status_string(s), tsr_last_error());
            tsr_backend_free(b);
            return 1;
        }
        double mib = 0;
        for (size_t i = 0; i < tsr_backend_n_weights(b); i++)
            mib += tsr_tensor_nbytes(tsr_backend_weight_at(b, i)) / 1048576.0;
        printf("seconds=%.4f mib=%.1f mib_per_s=%.1f io_threads=%d mmap=%d\n", dt, mib, dt > 0 ? mib / dt : 0.0,
               threads, mmap);
        fflush(stdout);
        tsr_backend_free(b);
    }
    return 0;
}
