/*
 * fuzz-tokenizer.c - fuzz target for the model layer's tokenizer
 * (libtensr/model/tokenizer.h): bytes in, token ids out, ids back to bytes.
 *
 * Three vocabularies are built once, in memory, with the public GGUF writer
 * (fuzz-vocab.h, after tests/make_tiny_models.py): SentencePiece with byte
 * fallback, and byte-level BPE with the smollm and llama-bpe
 * pre-tokenizers. Input byte 0 picks the vocabulary and the flags, the rest
 * is the text. Always checked: every id is in the vocabulary, detokenize
 * and the streaming decoder work on them, the stream gives valid UTF-8.
 *
 * Round trip, asserted only where llama.cpp's tokenizers promise it (text
 * valid UTF-8, no BOS added, no special-token parsing):
 * - BPE smollm: detokenize(tokenize(x)) == x (byte-level: every byte has a
 *   token; smollm does not clean up spaces).
 * - SPM: the same, when x holds no U+2581: SentencePiece writes spaces as
 *   U+2581, so a literal one comes back as a space; the space prefix it
 *   inserts is stripped again by detokenize.
 * - BPE llama-bpe cleans up tokenization spaces (" ." -> "."), like
 *   llama.cpp: no round trip asserted.
 *
 * Every pre-tokenizer's splitting (tku_split) also runs on the text's
 * codepoints: its pieces must be non-empty and cover the text exactly.
 *
 * make fuzz builds it with libFuzzer against a sanitized static library;
 * make check replays tests/fuzz/corpus-tokenizer/ (fuzz-replay.h).
 */
#include "libtensr.h"
#include "libtensr/model/tok-unicode.h"
#include "libtensr/model/tokenizer.h"

#include "fuzz-vocab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tok_vocab *vocabs[3];

static tok_vocab *load_vocab(int which) {
    tsr_gguf_writer *w;
    void *mem;
    size_t n;
    tsr_gguf *g;
    tok_vocab *v = NULL;
    if (tsr_gguf_writer_new(&w) != TSR_OK) abort();
    if (tsr_gguf_writer_set_str(w, "general.architecture", "llama") != TSR_OK) abort();
    if (which == 0)
        fuzz_vocab_spm(w);
    else
        fuzz_vocab_bpe(w, which == 1 ? "smollm" : "llama-bpe");
    if (tsr_gguf_writer_write_memory(w, &mem, &n) != TSR_OK) abort();
    if (tsr_gguf_open_memory(mem, n, "fuzz-vocab.gguf", 1, &g) != TSR_OK) abort();
    if (tsr__tok_vocab_load(g, &v) != TSR_OK) {
        fprintf(stderr, "fuzz-tokenizer: vocabulary %d: %s\n", which, tsr_last_error());
        abort();
    }
    tsr_gguf_close(g);
    tsr_free(mem);
    tsr_gguf_writer_free(w);
    return v;
}

/* Strict UTF-8 validity (no overlongs, surrogates or values past U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t need = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
        if (need == 0 || i + need > n) return 0;
        for (size_t k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return 0;
        i += need;
    }
    return 1;
}

static int has_u2581(const uint8_t *s, size_t n) {
    for (size_t i = 0; i + 2 < n; i++)
        if (s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) return 1;
    return 0;
}

static void check_stream(const tok_vocab *v, const int32_t *ids, size_t n, int special) {
    tok_stream s;
    const char *out;
    size_t len;
    tsr__tok_stream_init(&s);
    for (size_t i = 0; i < n; i++) {
        size_t pl;
        const char *p = tsr__tok_piece(v, ids[i], special, &pl);
        if (pl && !p) abort();
        if (tsr__tok_stream_push(&s, p, pl, &out, &len) != TSR_OK) abort();
        if (!valid_utf8((const unsigned char *)out, len)) abort();
    }
    if (tsr__tok_stream_flush(&s, &out, &len) != TSR_OK || !valid_utf8((const unsigned char *)out, len)) abort();
    tsr__tok_stream_free(&s);
}

/* Every splitter: pieces non-empty, adding up to the text. */
static void check_splits(const char *text, size_t len) {
    uint32_t *cps = malloc((len + 1) * sizeof *cps);
    size_t *lens = malloc((len + 1) * sizeof *lens), n = 0, pos = 0;
    if (!cps || !lens) abort();
    while (pos < len) cps[n++] = tsr__tku_decode(text, len, &pos);
    for (int pre = 0; pre < TKU_PRE_COUNT; pre++) {
        size_t n_words = tsr__tku_split((tku_pre)pre, cps, n, lens), total = 0;
        if (n_words > n) abort();
        for (size_t w = 0; w < n_words; w++) {
            if (lens[w] == 0) abort();
            total += lens[w];
        }
        if (total != n) abort();
    }
    free(cps);
    free(lens);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] % 3, add_special = data[0] >> 2 & 1, parse_special = data[0] >> 3 & 1;
    int special = data[0] >> 4 & 1, remove_special = data[0] >> 5 & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    check_splits(text, len);
    if (!vocabs[which]) vocabs[which] = load_vocab(which);
    const tok_vocab *v = vocabs[which];

    int32_t *ids = NULL;
    size_t n = 0;
    if (tsr__tok_tokenize(v, text, len, add_special, parse_special, &ids, &n) != TSR_OK) {
        if (!tsr_last_error()[0]) abort();
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tsr__tok_n_vocab(v)) abort();
    char *back = NULL;
    size_t blen = 0;
    if (tsr__tok_detokenize(v, ids, n, remove_special, special, &back, &blen) != TSR_OK || back[blen] != '\0') abort();
    tsr__free(back);
    check_stream(v, ids, n, special);

    int promised = which != 2 && !add_special && !parse_special && valid_utf8(data + 1, len) &&
                   !(which == 0 && has_u2581(data + 1, len));
    if (promised) {
        if (tsr__tok_detokenize(v, ids, n, 0, 0, &back, &blen) != TSR_OK) abort();
        if (blen != len || memcmp(back, text, len) != 0) {
            fprintf(stderr, "fuzz-tokenizer: vocabulary %d: round trip of %zu bytes gave %zu bytes\n", which, len,
                    blen);
            abort();
        }
        tsr__free(back);
    }
    tsr__free(ids);
    return 0;
}

#define FUZZ_NAME "tokenizer"
#include "fuzz-replay.h"
