/*
 * fuzz-vocab.h - the tiny vocabularies of tests/make_tiny_models.py, written
 * in C with the public GGUF writer, for the fuzz targets that need a
 * tokenizer (fuzz-tokenizer.c, fuzz-model-load.c): a SentencePiece one with
 * <0xXX> byte fallback and a byte-level BPE one (gpt2 byte alphabet, merges
 * that build a few words left to right), with a pre-tokenizer name given.
 */
#ifndef TSR_FUZZ_VOCAB_H
#define TSR_FUZZ_VOCAB_H

#include "libtensr.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const fuzz_spm_pieces[] = {
    "\xe2\x96\x81", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l", "u", "c", "m", "w", "f", "g",
    "y", "p", "b", "v", "k", "x", "j", "q", "z", ".", ",", "!", "?", "'", "T", "H", "I", "A",
    "\xe2\x96\x81t", "he", "\xe2\x96\x81the", "in", "\xe2\x96\x81\x61", "er", "on", "\xe2\x96\x81of", "is", "ll",
    "\xe2\x96\x81is", "es", "at", "re", "\xe2\x96\x81w", "or", "an", "nd", "\xe2\x96\x81\x61nd", "ing",
    "\xe2\x96\x81in", "en", "\xe2\x96\x81\x62", "\xe2\x96\x81s", "\xe2\x96\x81\x63", "ou", "it", "\xe2\x96\x81to",
    "\xe2\x96\x81T", "\xe2\x96\x81The", "\xe2\x96\x81H", "\xe2\x96\x81Hello", "ello", "\xe2\x96\x81world", "orld",
    "\xe2\x96\x81I", "\xe2\x96\x81quick", "\xe2\x96\x81\x62rown", "\xe2\x96\x81\x66ox", "\xc3\xa9",
    "\xe2\x96\x81\x63\x61\x66", "\xe2\x96\x81\x63\x61\x66\xc3\xa9", "\xc3\xb6", "\xe2\x96\x81w\xc3\xb6",
    "\xe2\x96\x81\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81", "12", "3", "1", "2", "0", "9",
};

static const char *const fuzz_bpe_words[] = {
    "the", "\xc4\xa0the", "\xc4\xa0\x61", "in", "\xc4\xa0in", "er", "on", "\xc4\xa0of", "and", "\xc4\xa0\x61nd",
    "\xc4\xa0to", "ing", "\xc4\xa0is", "Hello", "\xc4\xa0Hello", "\xc4\xa0world", "\xc4\xa0quick",
    "\xc4\xa0\x62rown", "\xc4\xa0\x66ox", "\xc4\x8a\xc4\x8a", "\xc4\xa0\xc4\xa0", "\xc4\xa0\xc4\xa0\xc4\xa0\xc4\xa0",
    "12", "123", "\xc4\xa0The", "\xc4\xa0\x63\x61\x66", "\xc3\x83\xc2\xa9", "\xc4\xa0\x63\x61\x66\xc3\x83\xc2\xa9",
};

#define FUZZ_N(a) (sizeof(a) / sizeof((a)[0]))
#define FUZZ_MAX_TOKENS 512

/* Strings kept alive until the writer has copied them. */
typedef struct fuzz_strs {
    char *s[FUZZ_MAX_TOKENS];
    int32_t type[FUZZ_MAX_TOKENS];
    float score[FUZZ_MAX_TOKENS];
    int n;
    char *merges[FUZZ_MAX_TOKENS];
    int n_merges;
} fuzz_strs;

static void fuzz_strs_free(fuzz_strs *v) {
    for (int i = 0; i < v->n; i++) free(v->s[i]);
    for (int i = 0; i < v->n_merges; i++) free(v->merges[i]);
    v->n = v->n_merges = 0;
}

static int fuzz_push(fuzz_strs *v, const char *s, int32_t type, float score) {
    if (v->n == FUZZ_MAX_TOKENS) abort();
    v->type[v->n] = type;
    v->score[v->n] = score;
    v->s[v->n] = strdup(s);
    return v->n++;
}

static int fuzz_find(const fuzz_strs *v, const char *s) {
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->s[i], s) == 0) return i;
    return -1;
}

static tsr_status fuzz_set_u32(tsr_gguf_writer *w, const char *key, uint32_t x) {
    return tsr_gguf_writer_set(w, key, TSR_GGUF_UINT32, &x);
}

static tsr_status fuzz_set_bool(tsr_gguf_writer *w, const char *key, int b) {
    int8_t x = (int8_t)(b != 0);
    return tsr_gguf_writer_set(w, key, TSR_GGUF_BOOL, &x);
}

static tsr_status fuzz_write_tokens(tsr_gguf_writer *w, fuzz_strs *v, int scores) {
    tsr_status st = tsr_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->s, (uint64_t)v->n);
    if (st == TSR_OK)
        st = tsr_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TSR_GGUF_INT32, v->type, (uint64_t)v->n);
    if (st == TSR_OK && scores)
        st = tsr_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TSR_GGUF_FLOAT32, v->score, (uint64_t)v->n);
    return st;
}

/* SentencePiece: <unk> <s> </s>, 256 byte tokens, the pieces (a longer
 * piece scores higher than its parts). Returns the vocabulary size. */
static int fuzz_vocab_spm(tsr_gguf_writer *w) {
    fuzz_strs v = {0};
    char b[16];
    fuzz_push(&v, "<unk>", 2, 0.0f);
    fuzz_push(&v, "<s>", 3, 0.0f);
    fuzz_push(&v, "</s>", 3, 0.0f);
    for (int i = 0; i < 256; i++) {
        snprintf(b, sizeof b, "<0x%02X>", i);
        fuzz_push(&v, b, 6, 0.0f);
    }
    for (size_t k = 0; k < FUZZ_N(fuzz_spm_pieces); k++)
        fuzz_push(&v, fuzz_spm_pieces[k], 1, -(float)k + 2.0f * (float)strlen(fuzz_spm_pieces[k]));
    tsr_status st = tsr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    if (st == TSR_OK) st = fuzz_write_tokens(w, &v, 1);
    if (st == TSR_OK) st = fuzz_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (st == TSR_OK) st = fuzz_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (st == TSR_OK) st = fuzz_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (st == TSR_OK) st = fuzz_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    int n = v.n;
    fuzz_strs_free(&v);
    if (st != TSR_OK) abort();
    return n;
}

static size_t fuzz_utf8(unsigned cp, char *out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* the gpt2 byte alphabet stays below U+0800 */
}

/* Byte-level BPE: the 256 gpt2 byte characters, merges building each word
 * of fuzz_bpe_words, three control tokens. Returns the vocabulary size. */
static int fuzz_vocab_bpe(tsr_gguf_writer *w, const char *pre) {
    fuzz_strs v = {0};
    unsigned n_extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        char s[4] = {0};
        fuzz_utf8(printable ? (unsigned)b : 256 + n_extra++, s);
        fuzz_push(&v, s, 1, 0.0f);
    }
    for (size_t k = 0; k < FUZZ_N(fuzz_bpe_words); k++) {
        const char *word = fuzz_bpe_words[k];
        size_t len = strlen(word), cur = (unsigned char)word[0] >= 0xC0 ? 2 : 1;
        while (cur < len) {
            size_t ch = (unsigned char)word[cur] >= 0xC0 ? 2 : 1;
            char m[128], joined[128];
            snprintf(joined, sizeof joined, "%.*s", (int)(cur + ch), word);
            if (fuzz_find(&v, joined) < 0) {
                snprintf(m, sizeof m, "%.*s %.*s", (int)cur, word, (int)ch, word + cur);
                v.merges[v.n_merges++] = strdup(m);
                fuzz_push(&v, joined, 1, 0.0f);
            }
            cur += ch;
        }
    }
    fuzz_push(&v, "<|begin_of_text|>", 3, 0.0f);
    fuzz_push(&v, "<|end_of_text|>", 3, 0.0f);
    fuzz_push(&v, "<|eot_id|>", 3, 0.0f);
    tsr_status st = tsr_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (st == TSR_OK) st = tsr_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    if (st == TSR_OK) st = fuzz_write_tokens(w, &v, 0);
    if (st == TSR_OK)
        st = tsr_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges,
                                         (uint64_t)v.n_merges);
    if (st == TSR_OK) st = fuzz_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v.n - 3);
    if (st == TSR_OK) st = fuzz_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v.n - 2);
    if (st == TSR_OK) st = fuzz_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    int n = v.n;
    fuzz_strs_free(&v);
    if (st != TSR_OK) abort();
    return n;
}

#endif
