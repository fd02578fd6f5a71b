/* tokenizer.c - loads a tokenizer from GGUF metadata (public libtensr GGUF
 * API only) and converts text to token ids and back (libtensr/model).
 *
 * The algorithms mirror llama.cpp's (llama-vocab.cpp) so ids are identical:
 * control tokens found in the text first (longest first), then for BPE the
 * pre-tokenizer words are byte-encoded and merged by rank, leftmost first;
 * for SentencePiece the pair whose merged text is the best-scored token is
 * merged first and unknown characters fall back to <0xXX> byte tokens. */
#include "tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok-unicode.h"

/* ---- string -> int hash table (open addressing) ------------------------- */

typedef struct strtab {
    int32_t *slots; /* value index or -1 */
    size_t mask;
} strtab;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static tsr_status strtab_init(strtab *t, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 1) cap *= 2;
    t->slots = tsr__malloc(cap * sizeof *t->slots);
    if (!t->slots)
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for a table of %zu entries", n);
    memset(t->slots, 0xFF, cap * sizeof *t->slots);
    t->mask = cap - 1;
    return TSR_OK;
}

/* Finds the slot of key: either holding an equal key or empty. keys(i)
 * gives the key text of value i. */
typedef const char *(*key_fn)(const void *owner, int32_t i, size_t *len);

static size_t strtab_slot(const strtab *t, const char *s, size_t n, key_fn keys, const void *owner) {
    size_t i = (size_t)hash_bytes(s, n) & t->mask;
    for (;; i = (i + 1) & t->mask) {
        size_t klen;
        const char *k;
        if (t->slots[i] < 0)
            return i;
        k = keys(owner, t->slots[i], &klen);
        if (klen == n && memcmp(k, s, n) == 0)
            return i;
    }
}

/* ---- the vocabulary ------------------------------------------------------ */

enum { MAX_EOG = 16 };

struct tok_vocab {
    tok_type type;
    tku_pre pre;
    int32_t n_vocab;
    char *text;          /* all token texts, NUL-separated */
    size_t *text_off;    /* [n_vocab + 1] */
    float *scores;       /* [n_vocab] */
    unsigned char *attr; /* [n_vocab] tok_attr */
    char *piece;         /* decoded pieces, concatenated */
    size_t *piece_off;   /* [n_vocab + 1] */
    strtab ids;          /* text -> id */
    char *merges;        /* merge strings "a b", NUL-separated */
    size_t *merge_off;   /* [n_merges + 1] */
    int32_t n_merges;
    strtab ranks;      /* merge string -> rank */
    int32_t *specials; /* control/user-defined/unknown ids, longest text first */
    int32_t n_specials;
    int32_t bos, eos, unk;
    int32_t eog[MAX_EOG];
    int n_eog;
    int add_bos, add_eos, add_space_prefix, ignore_merges, clean_spaces;
    int raw;                      /* BPE on raw UTF-8 with spaces as U+2581 and <0xXX> bytes (gemma4) */
    int32_t sep;                  /* WordPiece: [SEP], added at the end */
    int lowercase, strip_accents; /* WordPiece normalizer */
    size_t max_token_len;         /* WordPiece: longest token text, bytes */
};

static const char *token_key(const void *owner, int32_t i, size_t *len) {
    const tok_vocab *v = owner;
    *len = v->text_off[i + 1] - v->text_off[i] - 1;
    return v->text + v->text_off[i];
}

static const char *merge_key(const void *owner, int32_t i, size_t *len) {
    const tok_vocab *v = owner;
    *len = v->merge_off[i + 1] - v->merge_off[i] - 1;
    return v->merges + v->merge_off[i];
}

int32_t tsr__tok_find(const tok_vocab *v, const char *text, size_t len) {
    return v->ids.slots[strtab_slot(&v->ids, text, len, token_key, v)];
}

/* Rank of merging left and right, or -1. */
static int32_t merge_rank(const tok_vocab *v, const char *l, size_t nl, const char *r, size_t nr, char *scratch) {
    memcpy(scratch, l, nl);
    scratch[nl] = ' ';
    memcpy(scratch + nl + 1, r, nr);
    return v->ranks.slots[strtab_slot(&v->ranks, scratch, nl + 1 + nr, merge_key, v)];
}

void tsr__tok_vocab_free(tok_vocab *v) {
    if (!v)
        return;
    tsr__free(v->text);
    tsr__free(v->text_off);
    tsr__free(v->scores);
    tsr__free(v->attr);
    tsr__free(v->piece);
    tsr__free(v->piece_off);
    tsr__free(v->ids.slots);
    tsr__free(v->merges);
    tsr__free(v->merge_off);
    tsr__free(v->ranks.slots);
    tsr__free(v->specials);
    tsr__free(v);
}

tok_type tsr__tok_vocab_type(const tok_vocab *v) { return v->type; }
int tsr__tok_vocab_pre(const tok_vocab *v) { return (int)v->pre; }
int32_t tsr__tok_n_vocab(const tok_vocab *v) { return v->n_vocab; }
int32_t tsr__tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tsr__tok_eos(const tok_vocab *v) { return v->eos; }
int tsr__tok_add_bos(const tok_vocab *v) { return v->add_bos; }

int tsr__tok_is_eog(const tok_vocab *v, int32_t id) {
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return 1;
    return 0;
}

tok_attr tsr__tok_token_attr(const tok_vocab *v, int32_t id) {
    return (id >= 0 && id < v->n_vocab) ? (tok_attr)v->attr[id] : TOK_ATTR_UNDEFINED;
}

const char *tsr__tok_token_text(const tok_vocab *v, int32_t id) {
    return (id >= 0 && id < v->n_vocab) ? v->text + v->text_off[id] : "";
}

/* ---- loading ------------------------------------------------------------- */

/* Reads a string array key into one NUL-separated arena. */
static tsr_status load_str_array(const tsr_gguf *g, const char *key, char **arena, size_t **off, uint64_t *n_out) {
    tsr_gguf_type et;
    uint64_t n;
    size_t total = 0, len;
    const char *s;
    tsr_status st = tsr_gguf_get_arr_info(g, key, &et, &n);

    if (st != TSR_OK)
        return tsr__error(st, "tokenizer: key %s: %s", key, tsr_last_error());
    if (et != TSR_GGUF_STRING || n > INT32_MAX)
        return tsr__error(TSR_E_MALFORMED, "tokenizer: key %s: expected an array of at most 2^31 strings", key);
    for (uint64_t i = 0; i < n; i++) {
        if ((st = tsr_gguf_get_arr_str(g, key, i, &s, &len)) != TSR_OK)
            return tsr__error(st, "tokenizer: key %s[%llu]: %s", key, (unsigned long long)i, tsr_last_error());
        total += len + 1 + 24; /* room for "[EMPTY_i]" replacements */
    }
    *arena = tsr__malloc(total ? total : 1);
    *off = tsr__malloc((n + 1) * sizeof **off);
    if (!*arena || !*off)
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %s", key);
    (*off)[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        char *dst = *arena + (*off)[i];
        tsr_gguf_get_arr_str(g, key, i, &s, &len);
        if (len == 0) /* llama.cpp names empty tokens so that they stay unique */
            len = (size_t)snprintf(dst, 25, "[EMPTY_%llu]", (unsigned long long)i);
        else
            memcpy(dst, s, len);
        dst[len] = '\0';
        (*off)[i + 1] = (*off)[i] + len + 1;
    }
    *n_out = n;
    return TSR_OK;
}

static tsr_status load_merges(tok_vocab *v, const tsr_gguf *g) {
    uint64_t n = 0;
    tsr_gguf_type et;
    tsr_status st = TSR_OK;
    /* kimi-k2 files may have no merges (llama.cpp accepts that for it alone) */
    if (v->pre != TKU_PRE_KIMI_K2 || tsr_gguf_get_arr_info(g, "tokenizer.ggml.merges", &et, &n) == TSR_OK)
        st = load_str_array(g, "tokenizer.ggml.merges", &v->merges, &v->merge_off, &n);
    if (st != TSR_OK)
        return st;
    v->n_merges = (int32_t)n;
    if ((st = strtab_init(&v->ranks, n)) != TSR_OK)
        return st;
    for (int32_t i = 0; i < v->n_merges; i++) {
        size_t len;
        const char *k = merge_key(v, i, &len);
        size_t slot = strtab_slot(&v->ranks, k, len, merge_key, v);
        if (v->ranks.slots[slot] < 0) /* the first (lowest) rank of a pair wins */
            v->ranks.slots[slot] = i;
    }
    return TSR_OK;
}

static tsr_status load_numeric(tok_vocab *v, const tsr_gguf *g) {
    tsr_gguf_type et;
    uint64_t n;
    const void *data;

    v->scores = tsr__calloc((size_t)v->n_vocab + 1, sizeof *v->scores);
    v->attr = tsr__malloc((size_t)v->n_vocab + 1);
    if (!v->scores || !v->attr)
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %d tokens", v->n_vocab);
    memset(v->attr, TOK_ATTR_NORMAL, (size_t)v->n_vocab + 1);
    if (tsr_gguf_get_arr_info(g, "tokenizer.ggml.scores", &et, &n) == TSR_OK) {
        if ((et != TSR_GGUF_FLOAT32 && et != TSR_GGUF_INT32) || n < (uint64_t)v->n_vocab)
            return tsr__error(TSR_E_MALFORMED, "tokenizer: tokenizer.ggml.scores: expected %d f32/i32, found %llu",
                              v->n_vocab, (unsigned long long)n);
        tsr_gguf_get_arr_data(g, "tokenizer.ggml.scores", &data);
        for (int32_t i = 0; i < v->n_vocab; i++) {
            if (et == TSR_GGUF_FLOAT32)
                memcpy(&v->scores[i], (const char *)data + 4 * (size_t)i, 4);
            else {
                int32_t x;
                memcpy(&x, (const char *)data + 4 * (size_t)i, 4);
                v->scores[i] = (float)x;
            }
        }
    }
    if (tsr_gguf_get_arr_info(g, "tokenizer.ggml.token_type", &et, &n) == TSR_OK) {
        if (et != TSR_GGUF_INT32 || n < (uint64_t)v->n_vocab)
            return tsr__error(TSR_E_MALFORMED, "tokenizer: tokenizer.ggml.token_type: expected %d i32, found %llu",
                              v->n_vocab, (unsigned long long)n);
        tsr_gguf_get_arr_data(g, "tokenizer.ggml.token_type", &data);
        for (int32_t i = 0; i < v->n_vocab; i++) {
            int32_t x;
            memcpy(&x, (const char *)data + 4 * (size_t)i, 4);
            v->attr[i] = (unsigned char)((x >= 1 && x <= 6) ? x : TOK_ATTR_UNDEFINED);
        }
    }
    return TSR_OK;
}

/* Flags llama.cpp sets with the pre-tokenizer (llama-vocab.cpp). */
enum {
    PRE_CLEAN = 1,  /* clean_spaces: tidy spaces when detokenizing */
    PRE_IGNORE = 2, /* ignore_merges: a word that is a token is taken whole */
    PRE_BOS = 4,    /* add_bos (unless tokenizer.ggml.add_bos_token says otherwise) */
    PRE_NO_BOS = 8, /* no BOS token unless tokenizer.ggml.bos_token_id names one */
    PRE_RAW = 16    /* SentencePiece-style BPE: no byte coding, spaces as U+2581, BOS always */
};

typedef struct pre_name {
    const char *name;
    tku_pre pre;
    unsigned flags;
} pre_name;

/* Every tokenizer.ggml.pre of a gpt2 vocabulary whose splitting we
 * implement, with llama.cpp's flags; rows in llama.cpp's order. */
static const pre_name pre_names[] = {
    {"default", TKU_PRE_DEFAULT, PRE_CLEAN},
    {"llama3", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"llama-v3", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"llama-bpe", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"falcon3", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"falcon-h1", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"pixtral", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"midm-2.0", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"lfm2", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"jina-v5-nano", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_IGNORE | PRE_BOS},
    {"deepseek-llm", TKU_PRE_DEEPSEEK_LLM, 0},
    {"deepseek-coder", TKU_PRE_DEEPSEEK_CODER, 0},
    {"deepseek-v3", TKU_PRE_DEEPSEEK3, 0},
    {"hunyuan-dense", TKU_PRE_DEEPSEEK3, 0},
    {"joyai-llm", TKU_PRE_DEEPSEEK3, 0},
    {"hy_v4", TKU_PRE_DEEPSEEK3, 0},
    {"falcon", TKU_PRE_FALCON, PRE_CLEAN},
    {"mpt", TKU_PRE_GPT2, PRE_CLEAN},
    {"starcoder", TKU_PRE_SMOLLM, PRE_CLEAN},
    {"gpt-2", TKU_PRE_GPT2, PRE_CLEAN},
    {"phi-2", TKU_PRE_GPT2, PRE_CLEAN},
    {"jina-es", TKU_PRE_GPT2, PRE_CLEAN},
    {"jina-de", TKU_PRE_GPT2, PRE_CLEAN},
    {"gigachat", TKU_PRE_GPT2, PRE_CLEAN},
    {"jina-v2-es", TKU_PRE_GPT2, PRE_CLEAN},
    {"jina-v2-de", TKU_PRE_GPT2, PRE_CLEAN},
    {"a.x-4.0", TKU_PRE_GPT2, PRE_CLEAN},
    {"mellum", TKU_PRE_GPT2, PRE_CLEAN},
    {"modern-bert", TKU_PRE_GPT2, PRE_CLEAN},
    {"refact", TKU_PRE_SMOLLM, PRE_CLEAN},
    {"command-r", TKU_PRE_SMOLLM, 0},
    {"qwen2", TKU_PRE_QWEN2, 0},
    {"deepseek-r1-qwen", TKU_PRE_QWEN2, 0},
    {"kormo", TKU_PRE_QWEN2, 0},
    {"f2llmv2", TKU_PRE_QWEN2, 0},
    {"qwen35", TKU_PRE_QWEN35, 0},
    {"stablelm2", TKU_PRE_QWEN2, PRE_CLEAN},
    {"olmo", TKU_PRE_GPT2, PRE_CLEAN},
    {"dbrx", TKU_PRE_LLAMA3, PRE_CLEAN},
    {"smaug-bpe", TKU_PRE_LLAMA3, PRE_CLEAN},
    {"poro-chat", TKU_PRE_BLOOM, 0},
    {"chatglm-bpe", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_NO_BOS},
    {"glm4", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_NO_BOS | PRE_IGNORE},
    {"glm5", TKU_PRE_LLAMA3, PRE_CLEAN | PRE_NO_BOS | PRE_IGNORE},
    {"viking", TKU_PRE_VIKING, 0},
    {"jais", TKU_PRE_GPT2, PRE_CLEAN},
    {"tekken", TKU_PRE_TEKKEN, PRE_IGNORE | PRE_BOS},
    {"smollm", TKU_PRE_SMOLLM, 0},
    {"codeshell", TKU_PRE_SMOLLM, PRE_CLEAN},
    {"bloom", TKU_PRE_BLOOM, PRE_CLEAN},
    {"gpt3-finnish", TKU_PRE_BLOOM, PRE_CLEAN},
    {"exaone", TKU_PRE_SMOLLM, PRE_CLEAN},
    {"exaone4", TKU_PRE_GPT2, PRE_CLEAN},
    {"minerva-7b", TKU_PRE_SMOLLM, PRE_CLEAN},
    {"megrez", TKU_PRE_QWEN2, PRE_CLEAN},
    {"gpt-4o", TKU_PRE_GPT4O, 0},
    {"llama4", TKU_PRE_GPT4O, 0},
    {"kanana2", TKU_PRE_GPT4O, 0},
    {"talkie", TKU_PRE_GPT4O, 0},
    {"minimax-m2", TKU_PRE_GPT4O, 0},
    {"trillion", TKU_PRE_GPT2, 0},
    {"granite-docling", TKU_PRE_GPT2, 0},
    {"bailingmoe", TKU_PRE_QWEN2, 0},
    {"bailingmoe2", TKU_PRE_QWEN2, 0},
    {"llada-moe", TKU_PRE_QWEN2, 0},
    {"hunyuan", TKU_PRE_QWEN2, 0},
    {"kimi-k2", TKU_PRE_KIMI_K2, 0},
    {"grok-2", TKU_PRE_QWEN2, 0},
    {"solar-open", TKU_PRE_QWEN2, 0},
    {"seed-coder", TKU_PRE_SEED_CODER, 0},
    {"ufakzeka", TKU_PRE_UFAKZEKA, 0},
    {"minicpm5", TKU_PRE_MINICPM5, PRE_CLEAN | PRE_IGNORE},
    {"laguna", TKU_PRE_LAGUNA, 0},
    {"mellum2", TKU_PRE_SMOLLM, PRE_CLEAN},
    {"gemma4", TKU_PRE_GEMMA4, PRE_CLEAN | PRE_RAW},
    {"granite-embed-multi-311m", TKU_PRE_GEMMA4, PRE_CLEAN | PRE_RAW},
};

/* tokenizer.ggml.pre: an unknown or missing name gets llama.cpp's default
 * splitting with a warning, as llama.cpp does for a missing one. */
static void load_pre(tok_vocab *v, const tsr_gguf *g, const char *pre) {
    unsigned flags = PRE_CLEAN;
    size_t i, n = sizeof pre_names / sizeof pre_names[0];

    v->pre = TKU_PRE_DEFAULT;
    if (!pre && tsr_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL) != TSR_OK)
        pre = NULL;
    if (pre && !*pre) /* llama.cpp: an empty name is a missing one */
        pre = NULL;
    for (i = 0; pre && i < n && strcmp(pre, pre_names[i].name) != 0; i++) continue;
    if (pre && i < n) {
        v->pre = pre_names[i].pre;
        flags = pre_names[i].flags;
    } else {
        tsr__log(TSR_LOG_WARN,
                 pre ? "tokenizer: unknown pre-tokenizer, using the default splitting"
                     : "tokenizer: no tokenizer.ggml.pre, using the default splitting; "
                       "generation quality will be degraded",
                 1, "pre", pre ? pre : "");
    }
    v->clean_spaces = (flags & PRE_CLEAN) != 0;
    v->ignore_merges = (flags & PRE_IGNORE) != 0;
    v->add_bos = (flags & PRE_BOS) != 0;
    v->raw = (flags & PRE_RAW) != 0;
    if (flags & PRE_NO_BOS)
        v->bos = -1;
}

static tsr_status load_type(tok_vocab *v, const tsr_gguf *g) {
    const char *model;
    tsr_status st = tsr_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);

    if (st != TSR_OK)
        return tsr__error(st, "tokenizer: key tokenizer.ggml.model: %s", tsr_last_error());
    if (strcmp(model, "llama") == 0) {
        v->type = TOK_TYPE_SPM;
        v->bos = 1, v->eos = 2, v->unk = 0;
        v->add_bos = 1, v->add_space_prefix = 1;
        return TSR_OK;
    }
    if (strcmp(model, "bert") == 0) { /* llama.cpp's defaults for BERT files */
        v->type = TOK_TYPE_WPM;
        v->bos = 101, v->eos = -1, v->unk = 100, v->sep = 102;
        v->add_bos = 1, v->clean_spaces = 1;
        return TSR_OK;
    }
    if (strcmp(model, "gemma4") == 0) { /* BPE whose ids come from the file alone */
        v->type = TOK_TYPE_BPE;
        v->bos = v->eos = v->unk = -1;
        load_pre(v, g, "gemma4");
        return TSR_OK;
    }
    if (strcmp(model, "gpt2") != 0)
        return tsr__error(TSR_E_UNSUPPORTED,
                          "tokenizer: tokenizer.ggml.model '%s' is not supported (bert, gemma4, gpt2, llama)", model);
    v->type = TOK_TYPE_BPE;
    v->bos = 11, v->eos = 11, v->unk = -1;
    load_pre(v, g, NULL);
    return TSR_OK;
}

static void load_special_ids(tok_vocab *v, const tsr_gguf *g) {
    uint32_t id;
    int b;
    if (tsr_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id) == TSR_OK && id < (uint32_t)v->n_vocab)
        v->bos = (int32_t)id;
    if (tsr_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &id) == TSR_OK && id < (uint32_t)v->n_vocab)
        v->eos = (int32_t)id;
    if (tsr_gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &id) == TSR_OK && id < (uint32_t)v->n_vocab)
        v->unk = (int32_t)id;
    if (v->bos >= v->n_vocab)
        v->bos = -1;
    if (v->eos >= v->n_vocab)
        v->eos = -1;
    if (tsr_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == TSR_OK)
        v->add_bos = b;
    if (tsr_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) == TSR_OK)
        v->add_eos = b;
    if (tsr_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == TSR_OK)
        v->add_space_prefix = b;
}

/* WordPiece: [SEP], the normalizer's switches, the longest token. */
static void load_wpm(tok_vocab *v, const tsr_gguf *g) {
    uint32_t id;
    int b;
    if (tsr_gguf_get_u32(g, "tokenizer.ggml.seperator_token_id", &id) == TSR_OK) /* sic */
        v->sep = id < (uint32_t)v->n_vocab ? (int32_t)id : -1;
    v->lowercase = 1;
    if (tsr_gguf_get_bool(g, "tokenizer.ggml.normalizer.lowercase", &b) == TSR_OK)
        v->lowercase = b;
    v->strip_accents = v->lowercase;
    if (tsr_gguf_get_bool(g, "tokenizer.ggml.normalizer.strip_accents", &b) == TSR_OK)
        v->strip_accents = b;
    for (int32_t i = 0; i < v->n_vocab; i++) {
        size_t len = v->text_off[i + 1] - v->text_off[i] - 1;
        if (len > v->max_token_len)
            v->max_token_len = len;
    }
}

static void add_eog(tok_vocab *v, int32_t id) {
    if (id < 0 || tsr__tok_is_eog(v, id) || v->n_eog == MAX_EOG)
        return;
    v->eog[v->n_eog++] = id;
}

/* End-of-generation tokens: EOS/EOT/EOM ids and, as llama.cpp does, tokens
 * known by their text (they are made control tokens if they are not). */
static void find_eog(tok_vocab *v, const tsr_gguf *g) {
    static const char *const names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>", "<|endoftext|>",
                                        "<|eom_id|>", "<EOT>",      "<|end_of_text|>", "</s>",          "<eos>"};
    uint32_t id;
    add_eog(v, v->eos);
    if (tsr_gguf_get_u32(g, "tokenizer.ggml.eot_token_id", &id) == TSR_OK && id < (uint32_t)v->n_vocab)
        add_eog(v, (int32_t)id);
    if (tsr_gguf_get_u32(g, "tokenizer.ggml.eom_token_id", &id) == TSR_OK && id < (uint32_t)v->n_vocab)
        add_eog(v, (int32_t)id);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t t = tsr__tok_find(v, names[i], strlen(names[i]));
        if (t >= 0) {
            add_eog(v, t);
            if (v->attr[t] != TOK_ATTR_CONTROL)
                v->attr[t] = TOK_ATTR_CONTROL;
        }
    }
}

typedef struct len_id {
    size_t len;
    int32_t id;
} len_id;

/* Longest text first (a token containing another must be found first);
 * equal lengths by id so the order is deterministic. */
static int cmp_len_id(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static tsr_status build_specials(tok_vocab *v) {
    len_id *tmp = tsr__malloc(((size_t)v->n_vocab + 1) * sizeof *tmp);
    v->specials = tsr__malloc(((size_t)v->n_vocab + 1) * sizeof *v->specials);
    if (!v->specials || !tmp) {
        tsr__free(tmp);
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory");
    }
    for (int32_t i = 0; i < v->n_vocab; i++) {
        unsigned a = v->attr[i];
        if (a == TOK_ATTR_CONTROL || a == TOK_ATTR_USER_DEFINED || a == TOK_ATTR_UNKNOWN)
            tmp[v->n_specials++] = (len_id){v->text_off[i + 1] - v->text_off[i], i};
    }
    qsort(tmp, (size_t)v->n_specials, sizeof *tmp, cmp_len_id);
    for (int32_t k = 0; k < v->n_specials; k++) v->specials[k] = tmp[k].id;
    tsr__free(tmp);
    return TSR_OK;
}

/* Decoded bytes of token i (what llama_token_to_piece gives with special). */
static size_t decode_token(const tok_vocab *v, int32_t i, char *dst) {
    size_t len, n = 0, pos = 0;
    const char *t = token_key(v, i, &len);
    unsigned a = v->attr[i];

    if (a == TOK_ATTR_CONTROL || a == TOK_ATTR_UNKNOWN || a == TOK_ATTR_USER_DEFINED) {
        memcpy(dst, t, len);
        return len;
    }
    if (a == TOK_ATTR_BYTE) {
        unsigned x = 0;
        if (len == 6 && sscanf(t, "<0x%2X>", &x) == 1)
            dst[0] = (char)x;
        else if (v->type == TOK_TYPE_BPE) /* llama.cpp: the first byte-coded char */
            dst[0] = (char)tsr__tku_cp_to_byte(tsr__tku_decode(t, len, &pos));
        return 1;
    }
    if (a != TOK_ATTR_NORMAL)
        return 0;
    while (pos < len) {
        if (v->type != TOK_TYPE_BPE || v->raw) {
            if (pos + 3 <= len && memcmp(t + pos, "\xe2\x96\x81", 3) == 0) {
                dst[n++] = ' ';
                pos += 3;
            } else {
                dst[n++] = t[pos++];
            }
        } else {
            size_t p0 = pos;
            int b = tsr__tku_cp_to_byte(tsr__tku_decode(t, len, &pos));
            if (b >= 0) {
                dst[n++] = (char)b;
            } else { /* not byte-coded: keep the text */
                memcpy(dst + n, t + p0, pos - p0);
                n += pos - p0;
            }
        }
    }
    return n;
}

static tsr_status build_pieces(tok_vocab *v) {
    size_t total = v->text_off[v->n_vocab] + 1;
    v->piece = tsr__malloc(total);
    v->piece_off = tsr__malloc(((size_t)v->n_vocab + 1) * sizeof *v->piece_off);
    if (!v->piece || !v->piece_off)
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for the pieces");
    v->piece_off[0] = 0;
    for (int32_t i = 0; i < v->n_vocab; i++)
        v->piece_off[i + 1] = v->piece_off[i] + decode_token(v, i, v->piece + v->piece_off[i]);
    return TSR_OK;
}

static tsr_status load_all(tok_vocab *v, const tsr_gguf *g) {
    uint64_t n;
    tsr_status st;

    if ((st = load_type(v, g)) != TSR_OK)
        return st;
    if ((st = load_str_array(g, "tokenizer.ggml.tokens", &v->text, &v->text_off, &n)) != TSR_OK)
        return st;
    if (n == 0)
        return tsr__error(TSR_E_MALFORMED, "tokenizer: tokenizer.ggml.tokens is empty");
    v->n_vocab = (int32_t)n;
    if ((st = load_numeric(v, g)) != TSR_OK || (st = strtab_init(&v->ids, n)) != TSR_OK)
        return st;
    for (int32_t i = 0; i < v->n_vocab; i++) { /* a later duplicate wins, as in llama.cpp */
        size_t len;
        const char *k = token_key(v, i, &len);
        v->ids.slots[strtab_slot(&v->ids, k, len, token_key, v)] = i;
    }
    if (v->type == TOK_TYPE_BPE && (st = load_merges(v, g)) != TSR_OK)
        return st;
    load_special_ids(v, g);
    if (v->type == TOK_TYPE_WPM)
        load_wpm(v, g);
    if (v->raw && !v->add_bos) { /* as llama.cpp does for gemma4 */
        tsr__log(TSR_LOG_WARN, "tokenizer: BOS added although tokenizer.ggml.add_bos_token is false (gemma4)", 0);
        v->add_bos = 1;
    }
    find_eog(v, g);
    if ((st = build_specials(v)) != TSR_OK)
        return st;
    return build_pieces(v);
}

tsr_status tsr__tok_vocab_load(const tsr_gguf *g, tok_vocab **out) {
    tok_vocab *v;
    tsr_status st;

    if (!g || !out)
        return tsr__error(TSR_E_INVALID, "tok_vocab_load: NULL argument");
    *out = NULL;
    v = tsr__calloc(1, sizeof *v);
    if (!v)
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory");
    st = load_all(v, g);
    if (st != TSR_OK) {
        tsr__tok_vocab_free(v);
        return st;
    }
    *out = v;
    return TSR_OK;
}

tsr_status tsr__tok_vocab_load_file(const char *path, tok_vocab **out) {
    tsr_gguf *g = NULL;
    tsr_status st = tsr_gguf_open(path, &g);
    if (st != TSR_OK)
        return tsr__error(st, "%s", tsr_last_error());
    st = tsr__tok_vocab_load(g, out);
    tsr_gguf_close(g);
    return st;
}

/* ---- output buffer of ids ------------------------------------------------ */

typedef struct idbuf {
    int32_t *ids;
    size_t n, cap;
} idbuf;

static tsr_status push_id(idbuf *b, int32_t id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        int32_t *p = tsr__realloc(b->ids, cap * sizeof *p);
        if (!p)
            return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %zu ids", cap);
        b->ids = p, b->cap = cap;
    }
    b->ids[b->n++] = id;
    return TSR_OK;
}

/* ---- BPE ----------------------------------------------------------------- */

/* One symbol of a word being merged: a byte range of the encoded word. */
typedef struct sym {
    size_t off, len;
    int32_t rank; /* rank of merging with the next live symbol, -1 none */
    int next;     /* index of the next live symbol, -1 at the end */
} sym;

static int32_t pair_rank(const tok_vocab *v, const char *w, const sym *s, int i, char *scratch) {
    int j = s[i].next;
    if (j < 0)
        return -1;
    return merge_rank(v, w + s[i].off, s[i].len, w + s[j].off, s[j].len, scratch);
}

/* Emits the ids of one symbol: the token, or else its single bytes (byte
 * coded, or <0xXX> tokens for raw vocabularies). */
static tsr_status emit_symbol(const tok_vocab *v, const char *t, size_t len, idbuf *out) {
    int32_t id = tsr__tok_find(v, t, len);
    tsr_status st = TSR_OK;
    if (id >= 0)
        return push_id(out, id);
    for (size_t k = 0; k < len && st == TSR_OK; k++) {
        char hex[8];
        int32_t b;
        snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)t[k]);
        b = v->raw ? tsr__tok_find(v, hex, 6) : tsr__tok_find(v, t + k, 1);
        if (b >= 0)
            st = push_id(out, b);
    }
    return st;
}

static int all_newlines(const char *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (w[i] != '\n')
            return 0;
    return 1;
}

/* Merges the byte-encoded word w (n bytes) by rank and emits its ids. s and
 * scratch have room for the word. */
static tsr_status bpe_word(const tok_vocab *v, const char *w, size_t n, sym *s, char *scratch, idbuf *out) {
    int ns = 0;
    tsr_status st = TSR_OK;

    if ((v->ignore_merges || (v->raw && all_newlines(w, n))) && tsr__tok_find(v, w, n) >= 0)
        return push_id(out, tsr__tok_find(v, w, n));
    for (size_t off = 0; off < n; ns++) {
        size_t l = tsr__tku_len_utf8((unsigned char)w[off]);
        s[ns].off = off;
        s[ns].len = l < n - off ? l : n - off;
        s[ns].next = off + s[ns].len < n ? ns + 1 : -1;
        off += s[ns].len;
    }
    for (int i = 0; i < ns; i++) s[i].rank = pair_rank(v, w, s, i, scratch);
    for (;;) { /* lowest rank first; ties: leftmost */
        int best = -1;
        for (int i = 0; i >= 0 && i < ns; i = s[i].next)
            if (s[i].rank >= 0 && (best < 0 || s[i].rank < s[best].rank))
                best = i;
        if (best < 0)
            break;
        int j = s[best].next;
        s[best].len += s[j].len;
        s[best].next = s[j].next;
        s[best].rank = pair_rank(v, w, s, best, scratch);
        for (int p = 0; p >= 0; p = s[p].next) /* the left neighbour's pair changed */
            if (s[p].next == best) {
                s[p].rank = pair_rank(v, w, s, p, scratch);
                break;
            }
    }
    for (int i = 0; i >= 0 && ns > 0 && st == TSR_OK; i = s[i].next) st = emit_symbol(v, w + s[i].off, s[i].len, out);
    return st;
}

/* Decodes text to codepoints (llama.cpp's lenient decoding). */
static uint32_t *to_cps(const char *text, size_t len, size_t *n) {
    uint32_t *cps = tsr__malloc((len + 1) * sizeof *cps);
    size_t pos = 0;
    *n = 0;
    if (!cps)
        return NULL;
    while (pos < len) cps[(*n)++] = tsr__tku_decode(text, len, &pos);
    return cps;
}

static tsr_status bpe_fragment(const tok_vocab *v, const char *text, size_t len, idbuf *out) {
    size_t n_cps, n_words, *lens = NULL, pos = 0;
    uint32_t *cps = to_cps(text, len, &n_cps);
    char *word = NULL, *scratch = NULL;
    sym *syms = NULL;
    tsr_status st = TSR_OK;

    lens = tsr__malloc((n_cps + 1) * sizeof *lens);
    /* each codepoint re-encodes to at most 4 bytes, each byte-encoded to 2 */
    word = tsr__malloc(8 * n_cps + 1);
    scratch = tsr__malloc(16 * n_cps + 2);
    syms = tsr__malloc((8 * n_cps + 1) * sizeof *syms);
    if (!cps || !lens || !word || !scratch || !syms) {
        st = tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %zu bytes of text", len);
        goto done;
    }
    for (size_t k = 0; v->raw && k < n_cps; k++) /* spaces written as U+2581 */
        if (cps[k] == ' ')
            cps[k] = 0x2581;
    n_words = tsr__tku_split(v->pre, cps, n_cps, lens);
    for (size_t w = 0; w < n_words && st == TSR_OK; w++) {
        size_t wn = 0;
        for (size_t k = 0; k < lens[w]; k++) {
            char u[4];
            size_t nu = tsr__tku_encode(cps[pos + k], u);
            if (v->raw) {
                memcpy(word + wn, u, nu);
                wn += nu;
                continue;
            }
            for (size_t b = 0; b < nu; b++) wn += tsr__tku_encode(tsr__tku_byte_to_cp((unsigned char)u[b]), word + wn);
        }
        pos += lens[w];
        st = bpe_word(v, word, wn, syms, scratch, out);
    }
done:
    tsr__free(cps);
    tsr__free(lens);
    tsr__free(word);
    tsr__free(scratch);
    tsr__free(syms);
    return st;
}

/* ---- SentencePiece --------------------------------------------------------- */

static int32_t spm_pair(const tok_vocab *v, const char *t, const sym *s, int i) {
    int j = s[i].next;
    if (j < 0)
        return -1;
    return tsr__tok_find(v, t + s[i].off, s[i].len + s[j].len);
}

static tsr_status spm_emit(const tok_vocab *v, const char *t, const sym *s, int i, idbuf *out) {
    int32_t id = tsr__tok_find(v, t + s[i].off, s[i].len);
    tsr_status st = TSR_OK;
    if (id >= 0)
        return push_id(out, id);
    for (size_t k = 0; k < s[i].len && st == TSR_OK; k++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)t[s[i].off + k]);
        id = tsr__tok_find(v, hex, 6);
        if (id < 0)
            id = tsr__tok_find(v, t + s[i].off + k, 1);
        if (id < 0)
            return tsr__error(TSR_E_MALFORMED, "tokenizer: no byte token for 0x%02X", (unsigned char)t[s[i].off + k]);
        st = push_id(out, id);
    }
    return st;
}

/* Merges the best-scored pair first (ties: leftmost) while the merged text
 * is a token; unknown characters become byte tokens. */
static tsr_status spm_text(const tok_vocab *v, const char *t, size_t n, idbuf *out) {
    sym *s = tsr__malloc((n + 1) * sizeof *s);
    int ns = 0;
    tsr_status st = TSR_OK;

    if (!s)
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %zu bytes of text", n);
    for (size_t off = 0; off < n; ns++) {
        size_t l = tsr__tku_len_utf8((unsigned char)t[off]);
        s[ns].off = off;
        s[ns].len = l < n - off ? l : n - off;
        s[ns].next = off + s[ns].len < n ? ns + 1 : -1;
        off += s[ns].len;
    }
    for (int i = 0; i < ns; i++) s[i].rank = spm_pair(v, t, s, i);
    for (;;) {
        int best = -1;
        for (int i = 0; i >= 0 && i < ns; i = s[i].next)
            if (s[i].rank >= 0 && (best < 0 || v->scores[s[i].rank] > v->scores[s[best].rank]))
                best = i;
        if (best < 0)
            break;
        int j = s[best].next;
        s[best].len += s[j].len;
        s[best].next = s[j].next;
        s[best].rank = spm_pair(v, t, s, best);
        for (int p = 0; p >= 0; p = s[p].next)
            if (s[p].next == best) {
                s[p].rank = spm_pair(v, t, s, p);
                break;
            }
    }
    for (int i = 0; i >= 0 && ns > 0 && st == TSR_OK; i = s[i].next) st = spm_emit(v, t, s, i, out);
    tsr__free(s);
    return st;
}

/* Prefixes a space if asked, replaces spaces by U+2581, tokenizes. */
static tsr_status spm_fragment(const tok_vocab *v, const char *text, size_t len, int prefix, idbuf *out) {
    size_t n = 0;
    char *t = tsr__malloc(3 * (len + 1) + 1);
    tsr_status st;
    if (!t)
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %zu bytes of text", len);
    for (size_t i = 0; i < len + (size_t)(prefix != 0); i++) {
        char c = (prefix && i == 0) ? ' ' : text[i - (size_t)(prefix != 0)];
        if (c == ' ') {
            memcpy(t + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            t[n++] = c;
        }
    }
    st = spm_text(v, t, n, out);
    tsr__free(t);
    return st;
}

/* ---- WordPiece ------------------------------------------------------------ */

/* One word: a U+2581 prefix, then the longest token at each position; a
 * word with a position no token starts at is the unknown token alone. */
static tsr_status wpm_word(const tok_vocab *v, char *w, size_t n, idbuf *out) {
    size_t start = out->n;
    tsr_status st = TSR_OK;
    for (size_t i = 0; i < n && st == TSR_OK;) {
        size_t j = i + v->max_token_len + 1 < n ? i + v->max_token_len + 1 : n;
        int32_t id = -1;
        for (; j > i && (id = tsr__tok_find(v, w + i, j - i)) < 0; j--) continue;
        if (id < 0) {
            out->n = start;
            break;
        }
        st = push_id(out, id);
        i = j;
    }
    if (st == TSR_OK && out->n == start && v->unk >= 0)
        st = push_id(out, v->unk);
    return st;
}

/* CJK ideographs as BERT's tokenizer isolates them. */
static int is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) || (cp >= 0xF900 && cp <= 0xFAFF) ||
           (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* BERT's normalizer and word splitting: whitespace ends a word, control
 * characters (and accents) vanish, punctuation, ASCII symbols and CJK
 * ideographs are words of their own; each word goes to wpm_word. */
static tsr_status wpm_fragment(const tok_vocab *v, const char *text, size_t len, idbuf *out) {
    size_t n_cps, n = 3;
    uint32_t *cps = to_cps(text, len, &n_cps);
    char *w = tsr__malloc(4 * len + 8);
    tsr_status st = TSR_OK;
    if (!cps || !w) {
        st = tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %zu bytes of text", len);
        goto done;
    }
    memcpy(w, "\xe2\x96\x81", 3);
    for (size_t i = 0; i <= n_cps && st == TSR_OK; i++) {
        uint32_t cp = i < n_cps ? cps[i] : ' ', c;
        int alone;
        cp = v->strip_accents ? tsr__tku_nfd_first(cp) : cp;
        if (cp == 0 || cp == 0xFFFD || tsr__tku_is_control(cp) || (v->strip_accents && tsr__tku_is_mark(cp)))
            continue;
        alone = tsr__tku_is_punct(cp) || (cp < 0x7F && tsr__tku_is_symbol(cp)) || is_cjk(cp);
        if ((tsr__tku_is_whitespace(cp) || alone) && n > 3) { /* the word so far */
            st = wpm_word(v, w, n, out);
            n = 3;
        }
        if (tsr__tku_is_whitespace(cp) || st != TSR_OK)
            continue;
        c = v->lowercase ? tsr__tku_tolower(cp) : cp;
        n += tsr__tku_encode(c, w + n);
        if (alone) {
            st = wpm_word(v, w, n, out);
            n = 3;
        }
    }
done:
    tsr__free(cps);
    tsr__free(w);
    return st;
}

/* ---- special tokens in text ---------------------------------------------- */

/* A fragment of the input: raw text [off, off+len) or a token (id >= 0). */
typedef struct frag {
    size_t off, len;
    int32_t id;
} frag;

typedef struct fragbuf {
    frag *f;
    size_t n, cap;
} fragbuf;

static tsr_status frag_insert(fragbuf *b, size_t at, frag f) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 16;
        frag *p = tsr__realloc(b->f, cap * sizeof *p);
        if (!p)
            return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory");
        b->f = p, b->cap = cap;
    }
    memmove(b->f + at + 1, b->f + at, (b->n - at) * sizeof *b->f);
    b->f[at] = f;
    b->n++;
    return TSR_OK;
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0 || nn > hn)
        return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0)
            return h + i;
    return NULL;
}

/* Splits every raw fragment at each occurrence of special token id. */
static tsr_status split_special(const char *text, fragbuf *b, int32_t id, const char *tt, size_t tn) {
    for (size_t i = 0; i < b->n; i++) {
        frag f = b->f[i];
        const char *m;
        tsr_status st;
        if (f.id >= 0 || !(m = find_bytes(text + f.off, f.len, tt, tn)))
            continue;
        size_t left = (size_t)(m - text) - f.off;
        b->f[i].len = left; /* becomes the left part (maybe empty) */
        if ((st = frag_insert(b, i + 1, (frag){0, 0, id})) != TSR_OK)
            return st;
        if ((st = frag_insert(b, i + 2, (frag){f.off + left + tn, f.len - left - tn, -1})) != TSR_OK)
            return st;
        i += 1; /* continue with the right part */
    }
    return TSR_OK;
}

static tsr_status partition(const tok_vocab *v, const char *text, size_t len, int parse_special, fragbuf *b) {
    tsr_status st;
    if (len && (st = frag_insert(b, 0, (frag){0, len, -1})) != TSR_OK)
        return st;
    for (int32_t k = 0; k < v->n_specials; k++) {
        int32_t id = v->specials[k];
        size_t tn;
        const char *tt = token_key(v, id, &tn);
        if (!parse_special && v->attr[id] != TOK_ATTR_USER_DEFINED)
            continue;
        if ((st = split_special(text, b, id, tt, tn)) != TSR_OK)
            return st;
    }
    return TSR_OK;
}

/* ---- tokenize ------------------------------------------------------------ */

static tsr_status tokenize_frags(const tok_vocab *v, const char *text, const fragbuf *b, idbuf *out) {
    int prev_special = 1; /* SentencePiece prefixes a space at the start and after a token */
    tsr_status st = TSR_OK;
    for (size_t i = 0; i < b->n && st == TSR_OK; i++) {
        const frag *f = &b->f[i];
        if (f->id >= 0) {
            st = push_id(out, f->id);
            prev_special = 1;
        } else if (f->len == 0) {
            continue;
        } else if (v->type == TOK_TYPE_SPM) {
            st = spm_fragment(v, text + f->off, f->len, v->add_space_prefix && prev_special, out);
            prev_special = 0;
        } else if (v->type == TOK_TYPE_WPM) {
            st = wpm_fragment(v, text + f->off, f->len, out);
        } else {
            st = bpe_fragment(v, text + f->off, f->len, out);
        }
    }
    return st;
}

tsr_status tsr__tok_tokenize(const tok_vocab *v, const char *text, size_t len, int add_special, int parse_special,
                             int32_t **out, size_t *n_out) {
    idbuf ids = {0};
    fragbuf frags = {0};
    tsr_status st = TSR_OK;

    if (!v || (!text && len) || !out || !n_out)
        return tsr__error(TSR_E_INVALID, "tok_tokenize: NULL argument");
    *out = NULL, *n_out = 0;
    if (add_special && v->add_bos && v->bos >= 0)
        st = push_id(&ids, v->bos);
    if (st == TSR_OK)
        st = partition(v, text, len, parse_special, &frags);
    if (st == TSR_OK)
        st = tokenize_frags(v, text, &frags, &ids);
    if (st == TSR_OK && add_special && v->type == TOK_TYPE_WPM && v->sep >= 0)
        st = push_id(&ids, v->sep);
    if (st == TSR_OK && add_special && v->add_eos && v->eos >= 0)
        st = push_id(&ids, v->eos);
    if (st == TSR_OK && !ids.ids) /* a valid pointer even for no ids */
        st = push_id(&ids, 0), ids.n = 0;
    tsr__free(frags.f);
    if (st != TSR_OK) {
        tsr__free(ids.ids);
        return st;
    }
    *out = ids.ids, *n_out = ids.n;
    return TSR_OK;
}

/* ---- detokenize ---------------------------------------------------------- */

/* llama.cpp's clean-up of detokenized BPE text, ported pass by pass (in
 * place, with its exact quirks) so the bytes stay identical: " ?" " !" " ."
 * " ," lose the space, a lone quote between spaces loses both, and " 's"
 * " 'm" " 're" " 've" lose the space. Returns the new length. */
static size_t clean_spaces(char *text, size_t total) {
    size_t t1 = total, t2, t3;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t1; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            total--;
        text[total++] = x;
    }
    t2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t2; i++) {
        char x = text[i];
        if (x == '\'' && i + 1 < t2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
            total--;
            text[++i] = '\0';
        }
        text[total++] = x;
    }
    t3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < t3; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < t3) {
            char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm')
                total--;
            else if (x1 != 't' && x1 != 'd' && i + 2 < t3 &&
                     ((x1 == 'r' && text[i + 2] == 'e') || (x1 == 'v' && text[i + 2] == 'e')))
                total--;
        }
        text[total++] = x;
    }
    return total;
}

const char *tsr__tok_piece(const tok_vocab *v, int32_t id, int special, size_t *len) {
    unsigned a;
    *len = 0;
    if (!v || id < 0 || id >= v->n_vocab)
        return "";
    a = v->attr[id];
    if (!special && (a == TOK_ATTR_CONTROL || a == TOK_ATTR_UNKNOWN))
        return "";
    *len = v->piece_off[id + 1] - v->piece_off[id];
    return v->piece + v->piece_off[id];
}

tsr_status tsr__tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n, int remove_special, int special,
                               char **out, size_t *len) {
    size_t total = 0, k = 0;
    int strip = v && v->add_space_prefix;
    char *s;

    if (!v || (!ids && n) || !out || !len)
        return tsr__error(TSR_E_INVALID, "tok_detokenize: NULL argument");
    if (remove_special && v->add_bos && n > 0 && ids[0] == v->bos)
        strip = 0, ids++, n--;
    if (remove_special && v->add_eos && n > 0 && ids[n - 1] == v->eos)
        n--;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        tsr__tok_piece(v, ids[i], special, &l);
        total += l;
    }
    if (!(s = tsr__malloc(total + 1)))
        return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %zu bytes", total + 1);
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = tsr__tok_piece(v, ids[i], special, &l);
        if (i == 0 && strip && l > 0 && p[0] == ' ') /* the space SentencePiece added */
            p++, l--;
        memcpy(s + k, p, l);
        k += l;
    }
    if (v->clean_spaces)
        k = clean_spaces(s, k);
    s[k] = '\0';
    *out = s, *len = k;
    return TSR_OK;
}

/* ---- streaming UTF-8 ------------------------------------------------------ */

void tsr__tok_stream_init(tok_stream *s) { memset(s, 0, sizeof *s); }

void tsr__tok_stream_free(tok_stream *s) {
    tsr__free(s->buf);
    memset(s, 0, sizeof *s);
}

static tsr_status stream_reserve(tok_stream *s, size_t need) {
    if (need > s->cap) {
        char *p = tsr__realloc(s->buf, need);
        if (!p)
            return tsr__error(TSR_E_NOMEM, "tokenizer: out of memory for %zu bytes", need);
        s->buf = p, s->cap = need;
    }
    return TSR_OK;
}

/* Length of the valid UTF-8 sequence at u[0..n), 0 if malformed, or -1 if
 * it is a valid but incomplete start. */
static int utf8_seq(const unsigned char *u, size_t n) {
    int need = u[0] < 0x80 ? 1 : u[0] < 0xC2 ? 0 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : u[0] < 0xF5 ? 4 : 0;
    for (int k = 1; k < need; k++) {
        unsigned char lo = 0x80, hi = 0xBF;
        if ((size_t)k >= n)
            return -1;
        if (k == 1 && u[0] == 0xE0)
            lo = 0xA0; /* overlong */
        if (k == 1 && u[0] == 0xED)
            hi = 0x9F; /* surrogates */
        if (k == 1 && u[0] == 0xF0)
            lo = 0x90; /* overlong */
        if (k == 1 && u[0] == 0xF4)
            hi = 0x8F; /* past U+10FFFF */
        if (u[k] < lo || u[k] > hi)
            return 0;
    }
    return need;
}

tsr_status tsr__tok_stream_push(tok_stream *s, const char *bytes, size_t len, const char **out, size_t *out_len) {
    size_t n = s->n_pend + len, k = 0, i = 0;
    unsigned char *in;
    /* output (at most 3 bytes per input byte: U+FFFD) first, the input after it */
    tsr_status st = stream_reserve(s, 4 * n + 8);
    if (st != TSR_OK)
        return st;
    in = (unsigned char *)s->buf + 3 * n + 4;
    memcpy(in, s->pend, s->n_pend);
    memcpy(in + s->n_pend, bytes, len);
    s->n_pend = 0;
    while (i < n) {
        int l = utf8_seq(in + i, n - i);
        if (l < 0) { /* keep the incomplete tail for the next token */
            memcpy(s->pend, in + i, n - i);
            s->n_pend = n - i;
            break;
        }
        if (l == 0) {
            memcpy(s->buf + k, "\xef\xbf\xbd", 3);
            k += 3, i += 1;
        } else {
            memmove(s->buf + k, in + i, (size_t)l);
            k += (size_t)l, i += (size_t)l;
        }
    }
    s->buf[k] = '\0';
    *out = s->buf, *out_len = k;
    return TSR_OK;
}

tsr_status tsr__tok_stream_flush(tok_stream *s, const char **out, size_t *out_len) {
    int had = s->n_pend > 0;
    tsr_status st = stream_reserve(s, 4);
    if (st != TSR_OK)
        return st;
    s->n_pend = 0;
    if (had)
        memcpy(s->buf, "\xef\xbf\xbd", 3);
    s->buf[had ? 3 : 0] = '\0';
    *out = s->buf, *out_len = had ? 3 : 0;
    return TSR_OK;
}
