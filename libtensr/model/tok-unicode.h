/* tok-unicode.h - UTF-8 coding, Unicode classes and the pre-tokenizer
 * splitting used by the tokenizer (libtensr/model). Private to the model
 * example; behaves like llama.cpp's unicode.cpp so token ids match. */
#ifndef TSR_MODEL_TOK_UNICODE_H
#define TSR_MODEL_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define TKU_REPLACEMENT 0xFFFDu

/* Pre-tokenizer variants (tokenizer.ggml.pre), grouped by the splitting
 * llama.cpp applies to them. */
typedef enum tku_pre {
    TKU_PRE_GPT2 = 0,   /* 's|'t|... ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    TKU_PRE_SMOLLM = 1, /* every \p{N} codepoint alone, then the gpt2 rules */
    TKU_PRE_LLAMA3 = 2, /* llama-3 rules (\p{N}{1,3}, [^\r\n\p{L}\p{N}]?\p{L}+, ...) */
    TKU_PRE_DEFAULT,    /* llama.cpp's fallback: punctuation runs, the gpt2 rules, digits by 3 */
    TKU_PRE_FALCON,     /* punctuation runs (with `), the gpt2 rules, ASCII digits by 3 */
    TKU_PRE_QWEN2,      /* llama-3 rules with every \p{N} alone */
    TKU_PRE_QWEN35,     /* qwen2 rules with marks (\p{M}) in the letter words */
    TKU_PRE_DEEPSEEK_LLM,
    TKU_PRE_DEEPSEEK_CODER,
    TKU_PRE_DEEPSEEK3,  /* deepseek-v3: \p{N}{1,3}, CJK runs, then its word rules */
    TKU_PRE_BLOOM,      /*  ?[^(\s|.,!?...)]+ */
    TKU_PRE_VIKING,     /* bloom, then every \p{N} alone */
    TKU_PRE_TEKKEN,     /* cased letter words, \p{N} alone */
    TKU_PRE_GPT4O,      /* cased letter words with contractions, \p{N}{1,3} */
    TKU_PRE_KIMI_K2,    /* Han runs, then llama-3 rules for the other letters */
    TKU_PRE_GEMMA4,     /* runs of newlines and runs of anything else */
    TKU_PRE_SEED_CODER, /* qwen2 rules, no newlines after punctuation */
    TKU_PRE_UFAKZEKA,   /* qwen2 rules without the contractions */
    TKU_PRE_LAGUNA,     /* newline runs, then the qwen2 rules */
    TKU_PRE_MINICPM5,   /* \p{N}{1,3}, then llama-3 rules with \p{N}+ */
    TKU_PRE_COUNT
} tku_pre;

/* Decodes the codepoint at s[*pos] (len bytes in all) and advances *pos.
 * Malformed input gives U+FFFD and advances one byte, as llama.cpp does. */
uint32_t tsr__tku_decode(const char *s, size_t len, size_t *pos);
/* Encodes cp (<= 0x10FFFF) as UTF-8 into out; returns the byte count (1..4). */
size_t tsr__tku_encode(uint32_t cp, char out[4]);
/* Length of a complete UTF-8 sequence starting with lead byte b (1..4), as
 * llama.cpp's unicode_len_utf8 computes it from the top four bits. */
size_t tsr__tku_len_utf8(unsigned char b);

int tsr__tku_is_letter(uint32_t cp);
int tsr__tku_is_number(uint32_t cp);
int tsr__tku_is_whitespace(uint32_t cp);
int tsr__tku_is_punct(uint32_t cp);   /* \p{P} */
int tsr__tku_is_symbol(uint32_t cp);  /* \p{S} */
int tsr__tku_is_mark(uint32_t cp);    /* \p{M} */
int tsr__tku_is_control(uint32_t cp); /* Cc, Cf, Co, Cs (not unassigned) */
/* Simple lowercase mapping (cp itself when it has none). */
uint32_t tsr__tku_tolower(uint32_t cp);
/* The first codepoint of cp's canonical decomposition (NFD), as llama.cpp's
 * WordPiece normalizer uses it to strip accents. */
uint32_t tsr__tku_nfd_first(uint32_t cp);

/* GPT-2 byte-level coding: the codepoint standing for byte b, and back
 * (returns -1 when cp stands for no byte). */
uint32_t tsr__tku_byte_to_cp(unsigned char b);
int tsr__tku_cp_to_byte(uint32_t cp);

/* Splits cps[0..n) into pre-tokenizer words. Writes each word's length (in
 * codepoints) to lens[], which must hold n entries (no split makes more
 * words than codepoints); returns the number of words. */
size_t tsr__tku_split(tku_pre pre, const uint32_t *cps, size_t n, size_t *lens);

#endif
