/* test-tokenizer-suite.c - llama.cpp's own tokenizer test suite
 * (models/ggml-vocab-*.gguf with their .inp/.out pairs) against the model
 * layer's tokenizer.
 *
 * Usage: test-tokenizer-suite [--unsupported] VOCAB.gguf...
 * (a vocabulary after --unsupported must fail to load with
 * TSR_E_UNSUPPORTED: a tokenizer model not implemented yet)
 * For each vocabulary, VOCAB.gguf.inp holds the cases separated by the line
 * "__ggml_vocab_test__" and VOCAB.gguf.out one line of token ids per case.
 * Each case is tokenized as llama.cpp's tests/test-tokenizer-0 does it
 * (no BOS/EOS added, control tokens in the text not parsed) and the ids
 * must be exactly the recorded ones. The vocabulary files have no tensors:
 * the tokenizer loads from their metadata alone. Every case runs twice:
 * through the model layer's tokenizer, and through the public API on a
 * model loaded with tsr_load_params.vocab_only (which must leave the backend
 * without weights and refuse a session). Prints one line per vocabulary:
 * cases passed of cases run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libtensr/model/tokenizer.h"

#include "tsrtest.h"

static const char SEP[] = "\n__ggml_vocab_test__\n";

/* Reads a whole file into a NUL-terminated malloc'ed buffer. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) != NULL) {
        *len = fread(buf, 1, (size_t)n, f);
        buf[*len] = '\0';
    }
    fclose(f);
    return buf;
}

/* The next case of the .inp text at *pos (split as test-tokenizer-0 splits:
 * a trailing separator ends the last case without starting another). */
static int next_case(const char *inp, size_t len, size_t *pos, const char **text, size_t *text_len) {
    const char *sep;
    if (*pos >= len)
        return 0;
    *text = inp + *pos;
    sep = strstr(*text, SEP);
    *text_len = sep ? (size_t)(sep - *text) : len - *pos;
    *pos += *text_len + (sep ? sizeof SEP - 1 : 0);
    return 1;
}

/* Parses one .out line of ids; returns how many (at most cap). */
static size_t parse_ids(const char *line, int32_t *ids, size_t cap) {
    size_t n = 0;
    char *end;
    for (;;) {
        long v = strtol(line, &end, 10);
        if (end == line || n == cap)
            return n;
        ids[n++] = (int32_t)v;
        line = end;
    }
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* The public API's ids for text (a malloc'ed array), or NULL. */
static int32_t *public_ids(const tsr_model *m, const char *text, size_t len, size_t *n) {
    int32_t *ids;
    *n = 0;
    if (tsr_model_tokenize(m, text, len, 0, NULL, 0, n) != TSR_OK && *n == 0)
        return NULL; /* not even a count */
    ids = malloc((*n + 1) * sizeof *ids);
    if (ids && tsr_model_tokenize(m, text, len, 0, ids, *n, n) != TSR_OK) {
        free(ids);
        return NULL;
    }
    return ids;
}

/* The vocabulary through tsr_model_load with vocab_only: no weights in the
 * backend, no session, detokenizing works. NULL when it does not load. */
static tsr_model *load_public(const char *vocab, tsr_backend *be) {
    tsr_load_params lp;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    char buf[64];
    size_t len;
    int32_t id = 0;
    tsr_load_params_init(&lp, sizeof lp);
    lp.vocab_only = 1;
    if (tsr_model_load(be, vocab, &lp, &m) != TSR_OK) {
        CHECK(0, "%s: tsr_model_load with vocab_only: %s", vocab, tsr_last_error());
        return NULL;
    }
    CHECK_EQ_INT(tsr_backend_n_weights(be), 0);
    CHECK_STATUS(tsr_session_new(m, NULL, &s), TSR_E_STATE);
    CHECK(s == NULL);
    CHECK(tsr_model_n_vocab(m) > 0 && tsr_model_arch(m) && tsr_model_arch(m)[0], "%s: arch or n_vocab", vocab);
    CHECK(tsr_model_detokenize(m, &id, 1, 1, buf, sizeof buf, &len) == TSR_OK, "%s: detokenize: %s", vocab,
          tsr_last_error());
    return m;
}

/* One case through both tokenizers; returns 1 when both give want. */
static int run_case(const char *vocab, const tok_vocab *v, const tsr_model *m, const char *text, size_t text_len,
                    const int32_t *want, size_t n_want, size_t k) {
    size_t n_got = 0, n_pub = 0;
    int32_t *got = NULL, *pub = m ? public_ids(m, text, text_len, &n_pub) : NULL;
    int ok, pub_ok;
    CHECK_OK(tsr__tok_tokenize(v, text, text_len, 0, 0, &got, &n_got));
    ok = got && n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0;
    pub_ok = pub && n_pub == n_want && memcmp(pub, want, n_pub * sizeof *pub) == 0;
    if (!ok || !pub_ok) {
        CHECK(0, "%s: case %zu '%.*s' (%s)", vocab, k, (int)text_len, text, ok ? "public API" : "tokenizer");
        print_ids("want", want, n_want);
        print_ids("got ", got, got ? n_got : 0);
        print_ids("api ", pub, pub ? n_pub : 0);
    }
    tsr__free(got);
    free(pub);
    return ok && pub_ok;
}

/* Runs every case of one vocabulary; returns 1 when all pass. */
static int run_vocab(const char *vocab, tsr_backend *be) {
    char path[4096];
    size_t inp_len = 0, out_len = 0, pos = 0, n_cases = 0, n_pass = 0, text_len;
    char *inp, *out, *o;
    const char *text;
    tok_vocab *v = NULL;
    tsr_model *m = NULL;
    int32_t want[4096];

    snprintf(path, sizeof path, "%s.inp", vocab);
    inp = read_all(path, &inp_len);
    snprintf(path, sizeof path, "%s.out", vocab);
    out = read_all(path, &out_len);
    CHECK(inp && out, "%s: missing .inp or .out", vocab);
    if (!inp || !out)
        goto done;
    if (tsr__tok_vocab_load_file(vocab, &v) != TSR_OK) {
        CHECK(0, "%s: does not load: %s", vocab, tsr_last_error());
        goto done;
    }
    m = load_public(vocab, be);
    for (o = out; next_case(inp, inp_len, &pos, &text, &text_len); n_cases++) {
        size_t n_want;
        char *nl = strchr(o, '\n');
        CHECK(*o || nl, "%s: fewer .out lines than cases", vocab);
        if (nl)
            *nl = '\0';
        n_want = parse_ids(o, want, sizeof want / sizeof want[0]);
        o = nl ? nl + 1 : o + strlen(o);
        n_pass += run_case(vocab, v, m, text, text_len, want, n_want, n_cases);
    }
    CHECK(n_cases > 0, "%s: no cases", vocab);
    CHECK(*o == '\0', "%s: more .out lines than cases", vocab);
    printf("%s: %zu/%zu cases pass\n", vocab, n_pass, n_cases);
done:
    tsr_model_free(m);
    tsr__tok_vocab_free(v);
    free(inp);
    free(out);
    return n_cases > 0 && n_pass == n_cases;
}

/* A vocabulary whose tokenizer model is not implemented: refused by name. */
static void check_unsupported(const char *vocab) {
    tok_vocab *v = NULL;
    tsr_model *m = NULL;
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.vocab_only = 1;
    CHECK_STATUS(tsr_model_load(NULL, vocab, &lp, &m), TSR_E_UNSUPPORTED);
    CHECK_STATUS(tsr__tok_vocab_load_file(vocab, &v), TSR_E_UNSUPPORTED);
    printf("%s: not supported (%s)\n", vocab, tsr_last_error());
    tsr__tok_vocab_free(v);
}

int main(int argc, char **argv) {
    int unsupported = 0;
    tsr_backend_params bp;
    tsr_backend *be = NULL;
    if (argc < 2) {
        fprintf(stderr, "usage: test-tokenizer-suite [--unsupported] VOCAB.gguf...\n");
        return 2;
    }
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 1;
    CHECK_OK(tsr_backend_new(&bp, &be));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--unsupported") == 0)
            unsupported = 1;
        else if (unsupported)
            check_unsupported(argv[i]);
        else
            run_vocab(argv[i], be);
    }
    tsr_backend_free(be);
    return tsrtest_done("test-tokenizer-suite");
}
