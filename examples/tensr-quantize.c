/*
 * tensr-quantize.c - converts the F32/F16/BF16 weights of a GGUF model to a
 * block-quantized type, the way llama.cpp's llama-quantize chooses types:
 *   - only 2-D and larger tensors whose name ends in "weight" are quantized;
 *     1-D tensors (norms, biases), *_norm.weight, ffn_gate_inp.weight (MoE
 *     router), rope_freqs and position embeddings stay F32;
 *   - output.weight (or token_embd.weight when the output is tied to it)
 *     becomes Q6_K, unless the target is Q8_0 (then Q8_0); with
 *     --keep-output-f16 it becomes F16 instead;
 *   - a row length that is not a multiple of the type's block falls back as
 *     llama.cpp does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16;
 *   - tensors already quantized (or integer) are copied unchanged.
 * Metadata is copied; general.file_type and general.quantization_version are
 * set. The output is written to a temporary file and renamed into place, so
 * a failed run never leaves a partial model. Rows of each tensor are
 * quantized by -j N threads (default: all cores).
 *
 *   tensr-quantize in.gguf out.gguf TYPE [--keep-output-f16] [-j N]
 *   TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K (case-insensitive)
 * Exit status: 0 on success, 1 on any error (after a message saying what
 * failed and why).
 */
#include "libtensr.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

typedef struct options {
    const char *in, *out;
    tsr_type type;
    int keep_output_f16;
    int n_threads;
} options;

static void usage(FILE *f) {
    fprintf(f, "usage: tensr-quantize in.gguf out.gguf TYPE [--keep-output-f16] [-j N]\n"
               "  TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K\n"
               "  --keep-output-f16  store output.weight (or the tied token_embd.weight) as F16\n"
               "  -j N               quantize with N threads (default: all cores)\n");
}

static int parse_args(int argc, char **argv, options *o) {
    const char *pos[3];
    int n_pos = 0;
    memset(o, 0, sizeof *o);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o->n_threads = cores > 0 ? (int)cores : 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--keep-output-f16")) o->keep_output_f16 = 1;
        else if (!strcmp(argv[i], "-j") && i + 1 < argc) o->n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); exit(0); }
        else if (argv[i][0] == '-' && argv[i][1]) { fprintf(stderr, "tensr-quantize: unknown option %s\n", argv[i]); return 1; }
        else if (n_pos < 3) pos[n_pos++] = argv[i];
        else { fprintf(stderr, "tensr-quantize: too many arguments\n"); return 1; }
    }
    if (n_pos != 3) return 1;
    if (o->n_threads < 1 || o->n_threads > 1024) {
        fprintf(stderr, "tensr-quantize: -j must be 1 to 1024\n");
        return 1;
    }
    o->in = pos[0];
    o->out = pos[1];
    static const tsr_type allowed[] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_BF16, TSR_TYPE_Q8_0,
                                       TSR_TYPE_Q4_0, TSR_TYPE_Q4_1, TSR_TYPE_Q5_0, TSR_TYPE_Q5_1,
                                       TSR_TYPE_Q4_K, TSR_TYPE_Q5_K, TSR_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        if (!strcasecmp(pos[2], tsr_type_name(allowed[i]))) {
            o->type = allowed[i];
            return 0;
        }
    fprintf(stderr, "tensr-quantize: unknown or unsupported TYPE '%s'; valid types:", pos[2]);
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) fprintf(stderr, " %s", tsr_type_name(allowed[i]));
    fprintf(stderr, "\n");
    return 1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int is_float(tsr_type t) { return t == TSR_TYPE_F32 || t == TSR_TYPE_F16 || t == TSR_TYPE_BF16; }

/* The type one tensor gets (llama.cpp's choices, see the file comment). */
static tsr_type choose_type(const options *o, const tsr_gguf *g, int64_t i, int has_output) {
    const char *name = tsr_gguf_tensor_name(g, i);
    tsr_type src = tsr_gguf_tensor_type(g, i);
    if (!is_float(src)) return src;
    int n_dims = tsr_gguf_tensor_n_dims(g, i);
    int64_t ne0 = tsr_gguf_tensor_ne(g, i, 0);
    if (n_dims < 2 || !ends_with(name, "weight") || strstr(name, "_norm.weight") ||
        strstr(name, "ffn_gate_inp.weight") || !strcmp(name, "rope_freqs.weight") ||
        strstr(name, "pos_embd") || strstr(name, "token_types"))
        return n_dims < 2 ? TSR_TYPE_F32 : src;
    tsr_type t = o->type;
    if (!strcmp(name, "output.weight") || (!has_output && !strcmp(name, "token_embd.weight"))) {
        if (o->keep_output_f16) return TSR_TYPE_F16;
        if (!tsr_type_is_quantized(t)) return t;
        if (ne0 % tsr_type_block_size(t)) t = TSR_TYPE_Q8_0;
        else if (t != TSR_TYPE_Q8_0) t = TSR_TYPE_Q6_K;
    }
    if (ne0 % tsr_type_block_size(t)) {
        if (t == TSR_TYPE_Q4_K) t = TSR_TYPE_Q5_0;
        else if (t == TSR_TYPE_Q5_K) t = TSR_TYPE_Q5_1;
        else if (t == TSR_TYPE_Q6_K) t = TSR_TYPE_Q8_0;
    }
    if (ne0 % tsr_type_block_size(t)) t = TSR_TYPE_F16;
    return t;
}

/* llama.cpp's general.file_type (llama_ftype) for the target type. */
static uint32_t file_type(tsr_type t) {
    switch (t) {
    case TSR_TYPE_Q4_0: return 2;
    case TSR_TYPE_Q4_1: return 3;
    case TSR_TYPE_Q8_0: return 7;
    case TSR_TYPE_Q5_0: return 8;
    case TSR_TYPE_Q5_1: return 9;
    case TSR_TYPE_Q4_K: return 14; /* Q4_K_S: every quantized tensor Q4_K */
    case TSR_TYPE_Q5_K: return 16; /* Q5_K_S */
    case TSR_TYPE_Q6_K: return 18;
    case TSR_TYPE_F32: return 0;
    case TSR_TYPE_BF16: return 32;
    default: return 1; /* F16 */
    }
}

/* ---- parallel conversion of one tensor ------------------------------------- */

typedef struct job {
    const void *src;
    tsr_type src_type, dst_type;
    void *dst;
    int64_t ne0, rows;
    int64_t next_row;   /* shared cursor, taken under lock */
    pthread_mutex_t lock;
    tsr_status status;
    char error[512];
} job;

#define ROWS_PER_TAKE 16

static void *worker(void *arg) {
    job *j = arg;
    size_t src_row = tsr_row_size(j->src_type, j->ne0), dst_row = tsr_row_size(j->dst_type, j->ne0);
    float *tmp = malloc((size_t)j->ne0 * ROWS_PER_TAKE * sizeof *tmp + 1);
    for (;;) {
        pthread_mutex_lock(&j->lock);
        int64_t r0 = j->next_row, n = j->rows - r0 < ROWS_PER_TAKE ? j->rows - r0 : ROWS_PER_TAKE;
        j->next_row += n;
        int failed = j->status != TSR_OK;
        pthread_mutex_unlock(&j->lock);
        if (n <= 0 || failed) break;
        tsr_status st = tmp ? tsr_dequantize(j->src_type, (const char *)j->src + r0 * src_row, tmp, n * j->ne0)
                            : TSR_E_NOMEM;
        if (!st) st = tsr_quantize(j->dst_type, tmp, (char *)j->dst + r0 * dst_row, n * j->ne0);
        if (st) {
            pthread_mutex_lock(&j->lock);
            if (!j->status) {
                j->status = st;
                snprintf(j->error, sizeof j->error, "%s", tmp ? tsr_last_error() : "out of memory");
            }
            pthread_mutex_unlock(&j->lock);
            break;
        }
    }
    free(tmp);
    return NULL;
}

static tsr_status convert(const options *o, job *j) {
    pthread_mutex_init(&j->lock, NULL);
    int n = o->n_threads;
    if (j->rows < (int64_t)n * ROWS_PER_TAKE) n = (int)((j->rows + ROWS_PER_TAKE - 1) / ROWS_PER_TAKE);
    if (n < 1) n = 1;
    pthread_t th[1024];
    int started = 0;
    for (; started < n - 1; started++)
        if (pthread_create(&th[started], NULL, worker, j)) break;
    worker(j); /* this thread works too */
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    pthread_mutex_destroy(&j->lock);
    return j->status;
}

/* ---- main -------------------------------------------------------------------- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads tensor i, converts it to `type`, adds it to w. */
static int do_tensor(const options *o, const tsr_gguf *g, tsr_gguf_writer *w, int64_t i, tsr_type type,
                     size_t *out_size) {
    size_t size = tsr_gguf_tensor_size(g, i);
    int n_dims = tsr_gguf_tensor_n_dims(g, i);
    int64_t ne[4];
    for (int d = 0; d < 4; d++) ne[d] = tsr_gguf_tensor_ne(g, i, d);
    int64_t rows = ne[1] * ne[2] * ne[3];
    void *src = malloc(size ? size : 1), *dst = NULL;
    int rc = 1;
    if (!src) {
        fprintf(stderr, "tensr-quantize: out of memory reading tensor '%s' (%zu bytes)\n", tsr_gguf_tensor_name(g, i), size);
        return 1;
    }
    if (tsr_gguf_read_tensor(g, i, src, size)) {
        fprintf(stderr, "tensr-quantize: read failed: %s\n", tsr_last_error());
        goto out;
    }
    tsr_type src_type = tsr_gguf_tensor_type(g, i);
    *out_size = size;
    if (type != src_type) {
        *out_size = tsr_row_size(type, ne[0]) * (size_t)rows;
        dst = malloc(*out_size ? *out_size : 1);
        if (!dst) {
            fprintf(stderr, "tensr-quantize: out of memory for tensor '%s'\n", tsr_gguf_tensor_name(g, i));
            goto out;
        }
        job j = {.src = src, .src_type = src_type, .dst_type = type, .dst = dst, .ne0 = ne[0], .rows = rows};
        if (convert(o, &j)) {
            fprintf(stderr, "tensr-quantize: tensor '%s': %s\n", tsr_gguf_tensor_name(g, i), j.error);
            goto out;
        }
    }
    if (tsr_gguf_writer_add_tensor(w, tsr_gguf_tensor_name(g, i), type, n_dims, ne, dst ? dst : src)) {
        fprintf(stderr, "tensr-quantize: %s\n", tsr_last_error());
        goto out;
    }
    rc = 0;
out:
    free(src);
    free(dst);
    return rc;
}

static int run(const options *o, const tsr_gguf *g, tsr_gguf_writer *w) {
    /* Keep the input's alignment; write the key only where the input had one
     * or needs one, so that metadata stays as it was. */
    int set_align = tsr_gguf_find_key(g, "general.alignment") >= 0 || tsr_gguf_alignment(g) != 32;
    if ((set_align && tsr_gguf_writer_set_alignment(w, tsr_gguf_alignment(g))) || tsr_gguf_writer_copy_keys(w, g)) {
        fprintf(stderr, "tensr-quantize: %s\n", tsr_last_error());
        return 1;
    }
    uint32_t ftype = file_type(o->type), qver = 2;
    if (tsr_gguf_writer_set(w, "general.file_type", TSR_GGUF_UINT32, &ftype) ||
        tsr_gguf_writer_set(w, "general.quantization_version", TSR_GGUF_UINT32, &qver)) {
        fprintf(stderr, "tensr-quantize: %s\n", tsr_last_error());
        return 1;
    }
    int has_output = tsr_gguf_find_tensor(g, "output.weight") >= 0;
    int64_t n = tsr_gguf_n_tensors(g);
    double in_total = 0, out_total = 0;
    for (int64_t i = 0; i < n; i++) {
        tsr_type type = choose_type(o, g, i, has_output);
        size_t out_size = 0;
        if (do_tensor(o, g, w, i, type, &out_size)) return 1;
        in_total += (double)tsr_gguf_tensor_size(g, i);
        out_total += (double)out_size;
        printf("[%4" PRId64 "/%4" PRId64 "] %-40s %-5s -> %-5s [%" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
               "] %8.2f MiB -> %8.2f MiB\n", i + 1, n, tsr_gguf_tensor_name(g, i),
               tsr_type_name(tsr_gguf_tensor_type(g, i)), tsr_type_name(type), tsr_gguf_tensor_ne(g, i, 0),
               tsr_gguf_tensor_ne(g, i, 1), tsr_gguf_tensor_ne(g, i, 2), tsr_gguf_tensor_ne(g, i, 3),
               tsr_gguf_tensor_size(g, i) / 1048576.0, out_size / 1048576.0);
    }
    printf("tensors: %.2f MiB -> %.2f MiB\n", in_total / 1048576.0, out_total / 1048576.0);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o)) {
        usage(stderr);
        return 1;
    }
    double t0 = now();
    tsr_gguf *g = NULL;
    if (tsr_gguf_open(o.in, &g)) {
        fprintf(stderr, "tensr-quantize: cannot read the input: %s\n", tsr_last_error());
        return 1;
    }
    tsr_gguf_writer *w = NULL;
    int rc = 1;
    if (tsr_gguf_writer_new(&w)) {
        fprintf(stderr, "tensr-quantize: %s\n", tsr_last_error());
        goto out;
    }
    printf("tensr-quantize: %s -> %s as %s with %d threads\n", o.in, o.out, tsr_type_name(o.type), o.n_threads);
    if (run(&o, g, w)) goto out;
    if (tsr_gguf_writer_write_file(w, o.out)) {
        fprintf(stderr, "tensr-quantize: cannot write the output: %s\n", tsr_last_error());
        goto out;
    }
    printf("wrote %s in %.2f s\n", o.out, now() - t0);
    rc = 0;
out:
    tsr_gguf_writer_free(w);
    tsr_gguf_close(g);
    return rc;
}
