/* test-tokenizer.c - the model example's tokenizer against llama.cpp.
 *
 * Usage: test-tokenizer [REFS.json MODEL.gguf]...
 * Without arguments: tests/data/refs/tokenizer-smollm2.json against
 * SmolLM2-135M-Instruct Q4_1 ($TSR_MODEL, else the get-model.sh cache);
 * skips (77) when the model is absent, unless CI=true.
 *
 * Checks, for every reference case recorded by tests/make_llama_refs.py:
 * the token ids are exactly llama.cpp's, detokenizing gives llama.cpp's
 * bytes, sampled token pieces equal llama_token_to_piece, and printing the
 * tokens one at a time through the streaming decoder gives valid UTF-8 that
 * adds up to the text. Model-free checks of the UTF-8 streamer and the
 * Unicode classes run first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libtensr/model/tok-unicode.h"
#include "libtensr/model/tokenizer.h"

#include "tsrtest.h"

#include "data/split-refs.h"
#include "fuzz/fuzz-vocab.h"

/* ---- helpers ------------------------------------------------------------- */

/* Strict UTF-8 validity (no overlongs, surrogates or values past U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t need = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
        if (need == 0 || i + need > n)
            return 0;
        for (size_t k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) ||
            (c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))
            return 0;
        i += need;
    }
    return 1;
}

static size_t from_hex(const char *h, size_t n, unsigned char *out)
{
    size_t k = 0;
    for (size_t i = 0; i + 1 < n; i += 2) {
        unsigned x;
        if (sscanf(h + i, "%2x", &x) != 1)
            break;
        out[k++] = (unsigned char)x;
    }
    return k;
}

/* Value of "key": "hex" in line, decoded into a malloc'ed buffer. */
static unsigned char *json_hex(const char *line, const char *key, size_t *n)
{
    char pat[64];
    const char *p, *e;
    unsigned char *out;
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    if (!(p = strstr(line, pat)))
        return NULL;
    p += strlen(pat);
    if (!(e = strchr(p, '"')))
        return NULL;
    out = malloc((size_t)(e - p) / 2 + 1);
    if (out)
        *n = from_hex(p, (size_t)(e - p), out);
    return out;
}

static long json_int(const char *line, const char *key, long dflt)
{
    char pat[64];
    const char *p;
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    p = strstr(line, pat);
    return p ? strtol(p + strlen(pat), NULL, 10) : dflt;
}

/* "ids": [1, 2, 3] into a malloc'ed array. */
static int32_t *json_ids(const char *line, size_t *n)
{
    const char *p = strstr(line, "\"ids\": [");
    int32_t *ids;
    size_t cap = 16;
    char *end;
    *n = 0;
    if (!p || !(ids = malloc(cap * sizeof *ids)))
        return NULL;
    p += strlen("\"ids\": [");
    while (*p && *p != ']') {
        long x = strtol(p, &end, 10);
        if (end == p)
            break;
        if (*n == cap) {
            int32_t *q = realloc(ids, 2 * cap * sizeof *q);
            if (!q)
                break;
            ids = q, cap *= 2;
        }
        ids[(*n)++] = (int32_t)x;
        p = end;
        while (*p == ',' || *p == ' ')
            p++;
    }
    return ids;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* ---- model-free checks --------------------------------------------------- */

/* Feeds bytes to a stream in pieces of the given sizes; checks every output
 * chunk is valid UTF-8 and the whole equals expect. */
static void stream_case(const char *in, size_t n, const size_t *cuts, const char *expect)
{
    tok_stream s;
    char all[256];
    size_t k = 0, pos = 0;
    const char *out;
    size_t len;
    tsr__tok_stream_init(&s);
    for (size_t c = 0; pos < n; c++) {
        size_t step = cuts[c] ? cuts[c] : n - pos;
        if (step > n - pos)
            step = n - pos;
        CHECK(tsr__tok_stream_push(&s, in + pos, step, &out, &len) == TSR_OK, "push");
        CHECK(valid_utf8((const unsigned char *)out, len), "chunk %zu is not valid UTF-8", c);
        memcpy(all + k, out, len);
        k += len, pos += step;
    }
    CHECK(tsr__tok_stream_flush(&s, &out, &len) == TSR_OK, "flush");
    memcpy(all + k, out, len);
    k += len;
    CHECK(k == strlen(expect) && memcmp(all, expect, k) == 0, "stream gave '%.*s', expected '%s'", (int)k, all,
          expect);
    tsr__tok_stream_free(&s);
}

static void test_stream(void)
{
    static const size_t ones[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    static const size_t mixed[] = {2, 3, 1, 5, 0};
    const char *t = "a\xc3\xa9\xf0\x9f\xa6\x99z\xe2\x82\xac"; /* a é 🦙 z € */
    stream_case(t, strlen(t), ones, t);
    stream_case(t, strlen(t), mixed, t);
    /* malformed bytes become U+FFFD; an unfinished tail too, at the end */
    stream_case("a\xff" "b", 3, ones, "a\xef\xbf\xbd" "b");
    stream_case("x\xf0\x9f", 3, ones, "x\xef\xbf\xbd");
    stream_case("\xed\xa0\x80", 3, ones, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"); /* surrogate */
    stream_case("\xc0\xaf", 2, mixed, "\xef\xbf\xbd\xef\xbf\xbd");                /* overlong */
    stream_case("", 0, ones, "");
}

static void test_unicode(void)
{
    size_t pos = 0, lens[32];
    uint32_t cps[32];
    const char *s = "It's  12ab\xc3\xa9 !!\n";
    size_t n = 0, nw;
    CHECK(tsr__tku_is_letter('a') && tsr__tku_is_letter(0xE9) && tsr__tku_is_letter(0x4E2D) && !tsr__tku_is_letter('1'), "letters");
    CHECK(tsr__tku_is_number('7') && tsr__tku_is_number(0xBD) && tsr__tku_is_number(0x0663) && !tsr__tku_is_number('x'), "numbers");
    CHECK(tsr__tku_is_whitespace(0x3000) && tsr__tku_is_whitespace('\n') && !tsr__tku_is_whitespace(0x200B), "spaces");
    CHECK(tsr__tku_decode("\xff", 1, &pos) == TKU_REPLACEMENT && pos == 1, "malformed byte");
    for (int b = 0; b < 256; b++)
        CHECK(tsr__tku_cp_to_byte(tsr__tku_byte_to_cp((unsigned char)b)) == b, "byte %d round trip", b);
    for (pos = 0; s[pos];)
        cps[n++] = tsr__tku_decode(s, strlen(s), &pos);
    /* smollm: "It" "'s" "  " (spaces ending a piece) "1" "2" "abé" " !!" "\n" */
    nw = tsr__tku_split(TKU_PRE_SMOLLM, cps, n, lens);
    CHECK(nw == 8 && lens[0] == 2 && lens[1] == 2 && lens[2] == 2 && lens[3] == 1 && lens[4] == 1 &&
              lens[5] == 3 && lens[6] == 3 && lens[7] == 1,
          "smollm split gave %zu words", nw);
}

/* ---- against llama.cpp ---------------------------------------------------- */

typedef struct stats {
    int cases, ids_ok, detok_ok, pieces, pieces_ok;
} stats;

/* Streams the tokens' pieces one at a time: every chunk must be valid UTF-8
 * and, when the pieces add up to valid UTF-8, the chunks must add up to them. */
static void check_stream(const tok_vocab *v, const int32_t *ids, size_t n)
{
    tok_stream s;
    const char *out;
    size_t len, k = 0, total = 0;
    char *all, *raw;
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        tsr__tok_piece(v, ids[i], 1, &len), total += len;
    all = malloc(3 * total + 8), raw = malloc(total + 1);
    if (!all || !raw)
        goto done;
    tsr__tok_stream_init(&s);
    for (size_t i = 0, r = 0; i < n; i++) {
        const char *p = tsr__tok_piece(v, ids[i], 1, &len);
        memcpy(raw + r, p, len), r += len;
        if (tsr__tok_stream_push(&s, p, len, &out, &len) != TSR_OK || !valid_utf8((const unsigned char *)out, len))
            ok = 0;
        memcpy(all + k, out, len), k += len;
    }
    if (tsr__tok_stream_flush(&s, &out, &len) == TSR_OK)
        memcpy(all + k, out, len), k += len;
    CHECK(ok, "streamed chunks are not all valid UTF-8");
    if (valid_utf8((const unsigned char *)raw, total))
        CHECK(k == total && memcmp(all, raw, k) == 0, "streamed text differs (%zu vs %zu bytes)", k, total);
    tsr__tok_stream_free(&s);
done:
    free(all);
    free(raw);
}

static void check_case(const tok_vocab *v, const char *line, stats *st)
{
    size_t n_in = 0, n_ref = 0, n_got = 0, n_det = 0, det_len = 0;
    unsigned char *in = json_hex(line, "hex", &n_in);
    unsigned char *det = json_hex(line, "detok_hex", &n_det);
    int32_t *ref = json_ids(line, &n_ref), *got = NULL;
    int add = (int)json_int(line, "add_special", 0), parse = (int)json_int(line, "parse_special", 0);
    char *text = NULL;

    st->cases++;
    if (!in || !ref) {
        CHECK(0, "unreadable case: %.80s", line);
        goto done;
    }
    if (tsr__tok_tokenize(v, (const char *)in, n_in, add, parse, &got, &n_got) != TSR_OK) {
        CHECK(0, "tokenize failed: %s", tsr_last_error());
        goto done;
    }
    check_stream(v, ref, n_ref);
    if (n_got == n_ref && memcmp(got, ref, n_ref * sizeof *ref) == 0) {
        st->ids_ok++;
    } else {
        CHECK(0, "ids differ for %.*s (add_special %d, parse_special %d)", (int)(n_in > 60 ? 60 : n_in),
              (const char *)in, add, parse);
        print_ids("llama.cpp", ref, n_ref);
        print_ids("ours     ", got, n_got);
    }
    if (det && tsr__tok_detokenize(v, ref, n_ref, 0, 1, &text, &det_len) == TSR_OK) {
        if (det_len == n_det && memcmp(text, det, n_det) == 0)
            st->detok_ok++;
        else
            CHECK(0, "detokenized '%s' differs from llama.cpp's (%zu vs %zu bytes)", text, det_len, n_det);
    }
done:
    free(in);
    free(det);
    free(ref);
    tsr__free(got); /* the library's allocations */
    tsr__free(text);
}

static void check_piece(const tok_vocab *v, const char *line, stats *st)
{
    size_t n = 0, len;
    long id = json_int(line, "piece_id", -1);
    unsigned char *ref = json_hex(line, "piece_hex", &n);
    const char *p = tsr__tok_piece(v, (int32_t)id, 1, &len);
    st->pieces++;
    if (ref && len == n && memcmp(p, ref, n) == 0)
        st->pieces_ok++;
    else
        CHECK(0, "piece of token %ld differs", id);
    free(ref);
}

static int run_refs(const char *refs, const char *model)
{
    FILE *f = fopen(refs, "r");
    tok_vocab *v = NULL;
    char *line = NULL;
    size_t cap = 0;
    stats st = {0};
    int fails = tsrtest_failures;

    CHECK(f, "cannot open %s", refs);
    if (!f)
        return 1;
    if (tsr__tok_vocab_load_file(model, &v) != TSR_OK) {
        CHECK(0, "%s: %s", model, tsr_last_error());
        fclose(f);
        return 1;
    }
    while (getline(&line, &cap, f) > 0) {
        long nv = json_int(line, "n_vocab", -1);
        if (nv >= 0 && strstr(line, "\"generator\""))
            CHECK(nv == tsr__tok_n_vocab(v), "n_vocab %d, llama.cpp %ld", tsr__tok_n_vocab(v), nv);
        if (strstr(line, "\"piece_id\""))
            check_piece(v, line, &st);
        else if (strstr(line, "\"ids\": ["))
            check_case(v, line, &st);
    }
    printf("%s: %d/%d cases with identical ids, %d/%d identical detokenizations, %d/%d identical pieces\n",
           refs, st.ids_ok, st.cases, st.detok_ok, st.cases, st.pieces_ok, st.pieces);
    CHECK(st.cases > 0, "no cases in %s", refs);
    free(line);
    fclose(f);
    tsr__tok_vocab_free(v);
    return tsrtest_failures != fails;
}

static const char *default_model(char *buf, size_t n)
{
    const char *m = getenv("TSR_MODEL"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (m && *m)
        return m;
    if (xdg && *xdg)
        snprintf(buf, n, "%s/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf", xdg);
    else
        snprintf(buf, n, "%s/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
    return buf;
}

/* Every row of tests/data/split-refs.h: the pre-tokenizer's pieces are
 * those the Python regex oracle found. */
static void test_split_refs(void)
{
    int bad = 0;
    for (size_t r = 0; r < sizeof split_refs / sizeof split_refs[0]; r++) {
        const struct split_ref *ref = &split_refs[r];
        size_t len = strlen(ref->text), n = 0, pos = 0, n_words, k = 0;
        uint32_t cps[256];
        size_t lens[256];
        int same;
        while (pos < len && n < 256) cps[n++] = tsr__tku_decode(ref->text, len, &pos);
        n_words = tsr__tku_split(ref->pre, cps, n, lens);
        for (same = 1; same && k < n_words; k++) same = ref->lens[k] == lens[k];
        same = same && ref->lens[n_words] == 0;
        CHECK(same, "pre-tokenizer %d splits '%s' unlike the regexes (row %zu)", (int)ref->pre, ref->text, r);
        if (!same && bad++ < 10) {
            fprintf(stderr, "    want:");
            for (k = 0; ref->lens[k]; k++) fprintf(stderr, " %u", ref->lens[k]);
            fprintf(stderr, "\n    got: ");
            for (k = 0; k < n_words; k++) fprintf(stderr, " %zu", lens[k]);
            fprintf(stderr, "\n");
        }
    }
}

/* The last warning the library logged (its msg and the value of "pre"). */
static char warned[256], warned_pre[64];

static void catch_log(tsr_log_level level, const char *msg, const tsr_log_field *f, size_t n, void *user)
{
    (void)user;
    if (level != TSR_LOG_WARN)
        return;
    snprintf(warned, sizeof warned, "%s", msg);
    warned_pre[0] = '\0';
    for (size_t i = 0; i < n; i++)
        if (strcmp(f[i].key, "pre") == 0)
            snprintf(warned_pre, sizeof warned_pre, "%s", f[i].value);
}

/* A tiny BPE vocabulary (fuzz-vocab.h) with tokenizer.ggml.pre = pre (""
 * counts as missing, as in llama.cpp) and tokenizer.ggml.model = model
 * (NULL: gpt2), loaded from memory. */
static tsr_status load_tiny(const char *pre, const char *model, tok_vocab **v)
{
    tsr_gguf_writer *w = NULL;
    tsr_gguf *g = NULL;
    void *mem = NULL;
    size_t n;
    tsr_status st = tsr_gguf_writer_new(&w);
    if (st == TSR_OK)
        fuzz_vocab_bpe(w, pre);
    if (st == TSR_OK && model)
        st = tsr_gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    if (st == TSR_OK)
        st = tsr_gguf_writer_write_memory(w, &mem, &n);
    if (st == TSR_OK)
        st = tsr_gguf_open_memory(mem, n, "tiny.gguf", 1, &g);
    tsr_gguf_writer_free(w);
    warned[0] = warned_pre[0] = '\0';
    if (st == TSR_OK)
        st = tsr__tok_vocab_load(g, v);
    tsr_gguf_close(g);
    tsr_free(mem);
    return st;
}

/* An unknown or missing tokenizer.ggml.pre loads with the default splitting
 * and a warning naming it; a known one without a warning; an unknown
 * tokenizer model is refused, named. */
static void test_pre_fallback(void)
{
    tok_vocab *v = NULL;
    (void)fuzz_vocab_spm; /* fuzz-vocab.h's other vocabulary, unused here */
    tsr_log_set(catch_log, NULL);
    CHECK_OK(load_tiny("no-such-pre", NULL, &v));
    CHECK(v && tsr__tok_vocab_pre(v) == TKU_PRE_DEFAULT, "unknown pre: splitting %d", v ? tsr__tok_vocab_pre(v) : -1);
    CHECK(strstr(warned, "unknown pre-tokenizer") && strcmp(warned_pre, "no-such-pre") == 0,
          "warning '%s' pre='%s'", warned, warned_pre);
    tsr__tok_vocab_free(v), v = NULL;
    CHECK_OK(load_tiny("", NULL, &v));
    CHECK(v && tsr__tok_vocab_pre(v) == TKU_PRE_DEFAULT && strstr(warned, "no tokenizer.ggml.pre"), "missing pre: '%s'",
          warned);
    tsr__tok_vocab_free(v), v = NULL;
    CHECK_OK(load_tiny("qwen2", NULL, &v));
    CHECK(v && tsr__tok_vocab_pre(v) == TKU_PRE_QWEN2 && warned[0] == '\0', "qwen2: '%s'", warned);
    tsr__tok_vocab_free(v), v = NULL;
    CHECK_STATUS(load_tiny("gpt-2", "t5", &v), TSR_E_UNSUPPORTED);
    CHECK(v == NULL && strstr(tsr_last_error(), "'t5'"), "%s", tsr_last_error());
    tsr_log_set(NULL, NULL);
}

int main(int argc, char **argv)
{
    char refs[4096], model[4096];
    const char *top = getenv("top_srcdir");
    FILE *f;

    test_stream();
    test_unicode();
    test_split_refs();
    test_pre_fallback();
    if (argc >= 3) {
        for (int i = 1; i + 1 < argc; i += 2)
            run_refs(argv[i], argv[i + 1]);
    } else {
        snprintf(refs, sizeof refs, "%s/tests/data/refs/tokenizer-smollm2.json", top ? top : ".");
        default_model(model, sizeof model);
        if (!(f = fopen(model, "rb"))) {
            const char *ci = getenv("CI");
            if (!ci || strcmp(ci, "true") != 0)
                SKIP("model %s absent (run examples/get-model.sh)", model);
            CHECK(0, "model %s absent (run examples/get-model.sh); CI=true requires it", model);
            return tsrtest_done("test-tokenizer");
        }
        fclose(f);
        run_refs(refs, model);
    }
    return tsrtest_done("test-tokenizer");
}
