/* model-demo.c - the model layer from an application's side, built against
 * the installed library alone:
 *
 *     cc model-demo.c $(pkg-config --cflags --libs libtensr) -o model-demo
 *     ./model-demo SmolLM2-135M-Instruct.Q4_1.gguf
 *
 * Loads a model, tokenizes a prompt, generates greedily, decodes two
 * sequences in one batch (each sequence's logits equal its logits alone),
 * removes one sequence and continues the other, and shows the statuses the
 * header promises: TSR_E_IO for a missing file, TSR_E_RANGE for a buffer
 * too small, TSR_E_FULL for a full cache. Prints what it does; exits 1 when
 * something is not as promised. */
#include <libtensr.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static void expect(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) {
        failures++;
        if (tsr_last_error()[0])
            printf("     (%s)\n", tsr_last_error());
    }
}

static int argmax(const float *v, int32_t n)
{
    int best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* Greedy continuation of the prompt on sequence 0, printed. */
static void generate(tsr_model *m, tsr_session *s, const int32_t *ids, size_t n, int n_gen)
{
    char piece[256];
    size_t len;
    tsr_status st = tsr_session_decode(s, n, ids, NULL, NULL, NULL);
    printf("     \"");
    for (int i = 0; st == TSR_OK && i < n_gen; i++) {
        int32_t tok = argmax(tsr_session_logits(s, i == 0 ? n - 1 : 0), tsr_model_n_vocab(m));
        if (tsr_model_token_is_eog(m, tok))
            break;
        if (tsr_model_token_piece(m, tok, 0, piece, sizeof piece, &len) == TSR_OK)
            printf("%.*s", (int)len, piece);
        st = tsr_session_decode(s, 1, &tok, NULL, NULL, NULL);
    }
    printf("\"\n");
    expect(st == TSR_OK, "greedy generation");
}

/* Logits of the last token of b: decoded in one batch with a (sequence 0)
 * and b (sequence 1), then alone. */
static void two_sequences(tsr_model *m, tsr_session *s, const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    int32_t toks[128], seq[128];
    int8_t want[128] = {0};
    size_t n = na + nb;
    if (n > 128)
        return;
    for (size_t i = 0; i < n; i++) {
        toks[i] = i < na ? a[i] : b[i - na];
        seq[i] = i < na ? 0 : 1;
    }
    want[na - 1] = want[n - 1] = 1;
    tsr_session_remove(s, -1, 0, -1);
    expect(tsr_session_decode(s, n, toks, NULL, seq, want) == TSR_OK, "two sequences in one decode");
    int32_t nv = tsr_model_n_vocab(m);
    float *mixed = malloc((size_t)nv * sizeof *mixed);
    const float *row = tsr_session_logits(s, n - 1);
    if (!mixed || !row) {
        expect(0, "logits of the mixed batch");
        free(mixed);
        return;
    }
    memcpy(mixed, row, (size_t)nv * sizeof *mixed);
    expect(tsr_session_n_past(s, 0) == (int32_t)na && tsr_session_n_past(s, 1) == (int32_t)nb,
           "each sequence at its own position");
    /* remove sequence 0: sequence 1 continues as if alone */
    int32_t next = argmax(mixed, nv);
    expect(tsr_session_remove(s, 0, 0, -1) == TSR_OK && tsr_session_n_past(s, 0) == 0, "sequence 0 removed");
    int32_t seq1 = 1;
    expect(tsr_session_decode(s, 1, &next, NULL, &seq1, NULL) == TSR_OK, "sequence 1 continues");
    int after_mixed = argmax(tsr_session_logits(s, 0), nv);

    tsr_session_remove(s, -1, 0, -1);
    expect(tsr_session_decode(s, nb, b, NULL, NULL, NULL) == TSR_OK, "the second prompt alone");
    row = tsr_session_logits(s, nb - 1);
    double diff = 0, norm = 0;
    for (int32_t i = 0; row && i < nv; i++) {
        diff = fmax(diff, fabs(row[i] - mixed[i]));
        norm = fmax(norm, fabs(row[i]));
    }
    printf("     max |mixed - alone| = %.3g (of logits up to %.1f)\n", diff, norm);
    expect(row && argmax(row, nv) == next && diff <= 1e-2 * norm, "logits in the mixed batch equal those alone");
    expect(tsr_session_decode(s, 1, &next, NULL, NULL, NULL) == TSR_OK &&
               argmax(tsr_session_logits(s, 0), nv) == after_mixed,
           "the continuation after removing sequence 0 equals the one alone");
    free(mixed);
}

static void statuses(tsr_model *m)
{
    tsr_backend *be = NULL; /* one model per backend: a fresh one */
    tsr_model *none = NULL;
    expect(tsr_backend_new(NULL, &be) == TSR_OK &&
               tsr_model_load(be, "/nonexistent/model.gguf", NULL, &none) == TSR_E_IO && !none,
           "a missing file is TSR_E_IO");
    tsr_backend_free(be);
    int32_t ids[2];
    size_t n = 0;
    const char *text = "a sentence of more than two tokens";
    expect(tsr_model_tokenize(m, text, strlen(text), 0, ids, 2, &n) == TSR_E_RANGE && n > 2,
           "a token buffer too small is TSR_E_RANGE, with the count needed");
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 16;
    tsr_session *small = NULL;
    int32_t many[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    expect(tsr_session_new(m, &sp, &small) == TSR_OK, "a session of 16 cells");
    expect(tsr_session_decode(small, 10, many, NULL, NULL, NULL) == TSR_OK, "10 tokens fit");
    expect(tsr_session_decode(small, 10, many, NULL, NULL, NULL) == TSR_E_FULL && tsr_session_n_past(small, 0) == 10,
           "10 more are TSR_E_FULL, and nothing changed");
    tsr_session_free(small);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : getenv("TSR_MODEL");
    if (!path) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 2;
    tsr_backend *be = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    if (tsr_backend_new(&bp, &be) != TSR_OK || tsr_model_load(be, path, NULL, &m) != TSR_OK) {
        fprintf(stderr, "%s: %s\n", path, tsr_last_error());
        tsr_backend_free(be);
        return 1;
    }
    printf("     %s: architecture %s, %d tokens, trained on %lld\n", path, tsr_model_arch(m), tsr_model_n_vocab(m),
           (long long)tsr_model_n_ctx_train(m));
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 256;
    sp.n_seq_max = 2;
    expect(tsr_session_new(m, &sp, &s) == TSR_OK, "a session of 256 cells for 2 sequences");

    const char *prompt = "The capital of France is", *other = "Once upon a time";
    int32_t a[64], b[64];
    size_t na = 0, nb = 0;
    expect(tsr_model_tokenize(m, prompt, strlen(prompt), TSR_TOKENIZE_ADD_SPECIAL, a, 64, &na) == TSR_OK &&
               tsr_model_tokenize(m, other, strlen(other), TSR_TOKENIZE_ADD_SPECIAL, b, 64, &nb) == TSR_OK,
           "tokenize");
    printf("     \"%s\" ->", prompt);
    for (size_t i = 0; i < na; i++)
        printf(" %d", a[i]);
    printf("\n");
    if (s && na && nb) {
        generate(m, s, a, na, 16);
        two_sequences(m, s, a, na, b, nb);
        statuses(m);
    }
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(be);
    printf("model-demo: %s\n", failures ? "FAILED" : "all as promised");
    return failures ? 1 : 0;
}
