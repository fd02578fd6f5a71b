/*
 * test-load-model.c - tsr_backend_load_gguf on the real model
 * (SmolLM2-135M-Instruct Q4_1 in ~/.cache/libtensr, or $TSR_TEST_MODEL):
 * loaded with several I/O threads, read and mapped, with verification on;
 * every tensor's bytes must equal tsr_gguf_read_tensor's; and a file
 * renamed over the path between the parse and the reads is refused or not
 * read (test_replaced). Skips (77) when
 * the model is absent, fails when it is absent and CI=true.
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <unistd.h>

static int compare_all(tsr_backend *b, tsr_gguf *g) {
    int bad = 0;
    for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
        size_t n = tsr_gguf_tensor_size(g, i);
        tsr_tensor *t = tsr_backend_weight(b, tsr_gguf_tensor_name(g, i));
        uint8_t *x = malloc(n ? n : 1), *y = malloc(n ? n : 1);
        if (!t || tsr_gguf_read_tensor(g, i, x, n) != TSR_OK || tsr_tensor_read(t, y, 0, n) != TSR_OK ||
            memcmp(x, y, n) != 0) {
            fprintf(stderr, "tensor %s differs\n", tsr_gguf_tensor_name(g, i));
            bad++;
        }
        free(x);
        free(y);
    }
    return bad;
}

/* ---- the file is parsed once: replaced between the parse and the reads ---- */

typedef struct swap {
    const char *from, *to; /* rename(from, to) at the first progress call */
    int done;
} swap;

static int swap_at_start(uint64_t done, uint64_t total, void *user) {
    (void)done, (void)total;
    swap *w = user;
    if (!w->done++)
        CHECK(rename(w->from, w->to) == 0);
    return 0;
}

static int copy_file(const char *from, const char *to, long flip_at) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int ok = a && b;
    char buf[1 << 16];
    size_t n;
    long pos = 0;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) {
        if (flip_at >= pos && flip_at < pos + (long)n)
            buf[flip_at - pos] ^= 0x5A;
        pos += (long)n;
        ok = fwrite(buf, 1, n, b) == n;
    }
    if (a)
        fclose(a);
    if (b && fclose(b) != 0)
        ok = 0;
    return ok;
}

/* tsr_model_load parses the file and reads the weights of that same file:
 * another file renamed over the path after the parse, before any weight is
 * read (the first progress call), is either refused with an error naming
 * the replacement or not read at all -- never weights of one file with
 * metadata of another. B differs from A in a byte of the last tensor's
 * data. */
static void test_replaced(const char *path, tsr_gguf *g) {
    char a[] = "/tmp/tsr-parse-once-XXXXXX";
    int fd = mkstemp(a);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    char bpath[sizeof a + 2];
    snprintf(bpath, sizeof bpath, "%s.b", a);
    int64_t last = tsr_gguf_n_tensors(g) - 1;
    const long flip = (long)(tsr_gguf_data_offset(g) + tsr_gguf_tensor_offset(g, last) + tsr_gguf_tensor_size(g, last) / 2);
    for (int mm = 0; mm < 2; mm++) {
        CHECK(copy_file(path, a, -1) && copy_file(path, bpath, flip));
        tsr_backend_params bp;
        tsr_backend_params_init(&bp, sizeof bp);
        bp.n_threads = 1;
        tsr_backend *b = NULL;
        CHECK_OK(tsr_backend_new(&bp, &b));
        swap w = {bpath, a, 0};
        tsr_load_params p;
        tsr_load_params_init(&p, sizeof p);
        p.use_mmap = mm;
        p.n_io_threads = 2;
        p.progress = swap_at_start;
        p.progress_user = &w;
        tsr_model *m = NULL;
        tsr_status st = tsr_model_load(b, a, &p, &m);
        CHECK(w.done > 0);
        if (st == TSR_OK) /* the weights of the file parsed: the original's bytes */
            CHECK(compare_all(b, g) == 0);
        else
            CHECK(st == TSR_E_IO && strstr(tsr_last_error(), "replaced"), "mmap %d: %s", mm, tsr_last_error());
        printf("replaced after the parse, mmap %d: %s\n", mm, st == TSR_OK ? "loaded the parsed file's weights" : tsr_last_error());
        tsr_model_free(m);
        tsr_backend_free(b);
        unlink(a);
        unlink(bpath);
    }
}

int main(void) {
    char path[1024];
    if (!tsrtest_model(path, sizeof path))
        return tsrtest_done("test-load-model");
    tsr_gguf *g = NULL;
    CHECK_OK(tsr_gguf_open(path, &g));
    if (!g)
        return tsrtest_done("test-load-model");
    const int threads[] = {1, 4};
    for (int mm = 0; mm < 2; mm++)
        for (int k = 0; k < 2; k++) {
            tsr_backend_params bp;
            tsr_backend_params_init(&bp, sizeof bp);
            bp.n_threads = 1;
            tsr_backend *b = NULL;
            CHECK_OK(tsr_backend_new(&bp, &b));
            tsr_load_params p;
            tsr_load_params_init(&p, sizeof p);
            p.n_io_threads = threads[k];
            p.use_mmap = mm;
            p.verify = 1;
            CHECK_OK(tsr_backend_load_gguf(b, path, &p));
            CHECK(tsr_backend_n_weights(b) == (size_t)tsr_gguf_n_tensors(g));
            CHECK(compare_all(b, g) == 0);
            /* a few named tensors, by shape and type too */
            tsr_tensor *e = tsr_backend_weight(b, "token_embd.weight");
            int64_t ie = tsr_gguf_find_tensor(g, "token_embd.weight");
            CHECK(e && ie >= 0 && tsr_tensor_type(e) == tsr_gguf_tensor_type(g, ie) &&
                  tsr_tensor_ne(e, 0) == tsr_gguf_tensor_ne(g, ie, 0) && tsr_tensor_ne(e, 1) == tsr_gguf_tensor_ne(g, ie, 1));
            CHECK(tsr_backend_weight(b, "blk.29.ffn_down.weight") != NULL);
            CHECK(tsr_backend_n_layers(b) == 30);
            tsr_backend_free(b);
        }
    test_replaced(path, g);
    tsr_gguf_close(g);
    return tsrtest_done("test-load-model");
}
