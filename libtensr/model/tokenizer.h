/* tokenizer.h - text <-> token ids for GGUF models, loaded from the GGUF
 * metadata through libtensr's public GGUF API (libtensr/model).
 *
 * Supports byte-level BPE vocabularies (tokenizer.ggml.model = "gpt2") with
 * every pre-tokenizer (tokenizer.ggml.pre) of llama.cpp's table in
 * tokenizer.c (gpt2, llama3, qwen2, qwen35, deepseek-llm/-coder/-v3, falcon,
 * tekken, gpt-4o, kimi-k2, bloom, ... ; an unknown or missing one gets
 * llama.cpp's default splitting with a logged warning), and SentencePiece
 * vocabularies (tokenizer.ggml.model = "llama": scores, <0xXX> byte
 * fallback, U+2581 as the space marker), gemma4's SentencePiece-style BPE
 * and WordPiece (tokenizer.ggml.model = "bert": lowercased, accents
 * stripped, longest-match words, [CLS] ... [SEP] as the special tokens). Results are meant to equal
 * llama.cpp's llama_tokenize / llama_token_to_piece for the same model.
 *
 * A tok_vocab is immutable after loading: using one from several threads is
 * safe. Errors: functions return a tsr_status and tsr_last_error() gives a
 * thread-local detail. */
#ifndef TSR_MODEL_TOKENIZER_H
#define TSR_MODEL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "bridge.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tok_vocab tok_vocab;

typedef enum tok_type {
    TOK_TYPE_BPE = 1, /* byte-level BPE ("gpt2") */
    TOK_TYPE_SPM = 2, /* SentencePiece ("llama") */
    TOK_TYPE_WPM = 3  /* WordPiece ("bert") */
} tok_type;

/* Token attributes, from tokenizer.ggml.token_type (GGUF numbering). */
typedef enum tok_attr {
    TOK_ATTR_UNDEFINED = 0,
    TOK_ATTR_NORMAL = 1,
    TOK_ATTR_UNKNOWN = 2,
    TOK_ATTR_CONTROL = 3,
    TOK_ATTR_USER_DEFINED = 4,
    TOK_ATTR_UNUSED = 5,
    TOK_ATTR_BYTE = 6
} tok_attr;

/* Loads the tokenizer from an open GGUF (g is not kept). Unsupported
 * tokenizer models or pre-tokenizers fail with TSR_E_UNSUPPORTED naming them. */
tsr_status tsr__tok_vocab_load(const tsr_gguf *g, tok_vocab **out);
/* Opens path, loads the tokenizer, closes the file. */
tsr_status tsr__tok_vocab_load_file(const char *path, tok_vocab **out);
void tsr__tok_vocab_free(tok_vocab *v); /* NULL is a no-op */

tok_type tsr__tok_vocab_type(const tok_vocab *v);
/* The pre-tokenizer splitting in use (a tku_pre of tok-unicode.h). */
int tsr__tok_vocab_pre(const tok_vocab *v);
int32_t tsr__tok_n_vocab(const tok_vocab *v);
int32_t tsr__tok_bos(const tok_vocab *v); /* -1 when none */
int32_t tsr__tok_eos(const tok_vocab *v); /* -1 when none */
int tsr__tok_add_bos(const tok_vocab *v); /* tokenizer.ggml.add_bos_token (or the model type's default) */
/* End of generation: EOS, EOT, EOM and the usual end-of-turn tokens. */
int tsr__tok_is_eog(const tok_vocab *v, int32_t id);
tok_attr tsr__tok_token_attr(const tok_vocab *v, int32_t id);
/* The token's text as stored in the vocabulary (NUL-terminated, owned by v). */
const char *tsr__tok_token_text(const tok_vocab *v, int32_t id);
/* Finds a token by its exact vocabulary text; -1 when absent. */
int32_t tsr__tok_find(const tok_vocab *v, const char *text, size_t len);

/* Tokenizes text[0..len). add_special: BOS (and EOS) as the model asks;
 * parse_special: control tokens written in the text ("<|im_start|>") become
 * their ids instead of being tokenized as text. *out (tsr__malloc'ed, the caller
 * frees it with tsr__free()) receives *n_out ids. */
tsr_status tsr__tok_tokenize(const tok_vocab *v, const char *text, size_t len, int add_special, int parse_special,
                             int32_t **out, size_t *n_out);

/* The bytes a token stands for (not NUL-terminated; owned by v). Control
 * and unknown tokens give their text when special is non-zero, else
 * nothing. The bytes may be an incomplete part of a UTF-8 sequence. */
const char *tsr__tok_piece(const tok_vocab *v, int32_t id, int special, size_t *len);

/* Detokenizes ids as llama_detokenize does: remove_special drops a leading
 * BOS / trailing EOS the model adds, special renders control tokens. *out is
 * tsr__malloc'ed (free with tsr__free()), NUL-terminated; *len excludes the NUL. Bytes are raw (may be
 * invalid UTF-8 when the ids are). */
tsr_status tsr__tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n, int remove_special, int special,
                               char **out, size_t *len);

/* Streaming detokenizer for printing tokens as they come: buffers the
 * bytes of UTF-8 sequences split across tokens and only ever emits valid
 * UTF-8 (malformed bytes become U+FFFD). */
typedef struct tok_stream {
    unsigned char pend[4]; /* start of an incomplete sequence */
    size_t n_pend;
    char *buf; /* output of the last call */
    size_t cap;
} tok_stream;

void tsr__tok_stream_init(tok_stream *s);
void tsr__tok_stream_free(tok_stream *s); /* frees s->buf; s can be re-initialized */
/* Feeds bytes; *out (owned by s, valid until the next call) receives the
 * complete UTF-8 text now available, *out_len its length. */
tsr_status tsr__tok_stream_push(tok_stream *s, const char *bytes, size_t len, const char **out, size_t *out_len);
/* Ends the stream: a pending incomplete sequence is emitted as U+FFFD. */
tsr_status tsr__tok_stream_flush(tok_stream *s, const char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif
