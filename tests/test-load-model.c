/*
 * test-load-model.c - tsr_backend_load_gguf on the real model
 * (SmolLM2-135M-Instruct Q4_1 in ~/.cache/libtensr, or $TSR_TEST_MODEL):
 * loaded with several I/O threads, read and mapped, with verification on;
 * every tensor's bytes must equal tsr_gguf_read_tensor's. Skips (77) when
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
    tsr_gguf_close(g);
    return tsrtest_done("test-load-model");
}
