/*
 * fuzz-model-load.c - fuzz target for the model loader's metadata checks
 * (tsr_model_load, libtensr/model/llama.c): hyper-parameters that are
 * negative, huge, of the wrong type or inconsistent with the tensor shapes
 * must give an error, never a crash.
 *
 * Each input is a list of 11-byte records applied to a tiny llama model
 * (n_embd 8, 2 heads of 4, 1 KV head, 1 layer, ffn 12, the vocabularies of
 * fuzz-vocab.h; byte 0 of the input picks SPM or BPE):
 *   op   key  type  value[8]
 *   op % 4 == 0: set metadata key keys[key % N] (the llama.* hyper-
 *                parameters, rope scaling, tokenizer ids) with
 *                type % 9: i32 u32 i64 u64 f32 f64 bool string(8 bytes)
 *                i32[2] array, value the little-endian bytes;
 *   op % 4 == 1: tensor key % T gets dimension type % 4 = value % 40
 *                (0 allowed), n_dims growing to cover it;
 *   op % 4 == 2: drop tensor key % T;
 *   op % 4 == 3: tensor key % T stored as F16 or Q8_0 (type & 1).
 * The model is written with the public GGUF writer to a file under
 * $TMPDIR (/tmp) and loaded into a fresh one-thread CPU backend; when it
 * loads, a session decodes two tokens, so that metadata the loader accepted
 * is proven consistent with the weights. Everything is freed each time.
 * FUZZ_VERBOSE=1 in the environment prints what each load said.
 *
 * make fuzz builds it with libFuzzer against a sanitized static library;
 * make check replays tests/fuzz/corpus-model-load/ (fuzz-replay.h).
 */
#include "libtensr.h"

#include "fuzz-vocab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_EMBD = 8, N_HEAD = 2, N_HEAD_KV = 1, HEAD_DIM = 4, N_FF = 12, N_TENSORS = 12, MAX_ELEMS = 1 << 15 };

static const char *const keys[] = {
    "llama.context_length", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
    "llama.attention.value_length", "llama.rope.dimension_count", "llama.rope.freq_base",
    "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size", "llama.rope.scaling.type",
    "llama.rope.scaling.factor", "llama.rope.scale_linear", "llama.rope.scaling.original_context_length",
    "llama.attention.sliding_window", "general.architecture", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.model",
    "tokenizer.ggml.pre", "tokenizer.chat_template", "general.alignment",
};

typedef struct tensor_spec {
    const char *name;
    int n_dims;
    int64_t ne[4];
    tsr_type type;
    int dropped;
} tensor_spec;

static void base_tensors(tensor_spec *t, int64_t n_vocab) {
    const tensor_spec base[N_TENSORS] = {
        {"token_embd.weight", 2, {N_EMBD, n_vocab, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.attn_norm.weight", 1, {N_EMBD, 1, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.attn_q.weight", 2, {N_EMBD, N_HEAD * HEAD_DIM, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.attn_k.weight", 2, {N_EMBD, N_HEAD_KV * HEAD_DIM, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.attn_v.weight", 2, {N_EMBD, N_HEAD_KV * HEAD_DIM, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.attn_output.weight", 2, {N_HEAD * HEAD_DIM, N_EMBD, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.ffn_norm.weight", 1, {N_EMBD, 1, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.ffn_gate.weight", 2, {N_EMBD, N_FF, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.ffn_up.weight", 2, {N_EMBD, N_FF, 1, 1}, TSR_TYPE_F32, 0},
        {"blk.0.ffn_down.weight", 2, {N_FF, N_EMBD, 1, 1}, TSR_TYPE_F32, 0},
        {"output_norm.weight", 1, {N_EMBD, 1, 1, 1}, TSR_TYPE_F32, 0},
        {"output.weight", 2, {N_EMBD, n_vocab, 1, 1}, TSR_TYPE_F32, 0},
    };
    memcpy(t, base, sizeof base);
}

static void set_i64(tsr_gguf_writer *w, const char *key, int64_t v) {
    if (tsr_gguf_writer_set(w, key, TSR_GGUF_INT64, &v) != TSR_OK) abort();
}

static int64_t base_keys(tsr_gguf_writer *w, int bpe) {
    float base = 10000.0f, eps = 1e-5f;
    if (tsr_gguf_writer_set_str(w, "general.architecture", "llama") != TSR_OK) abort();
    set_i64(w, "llama.context_length", 32);
    set_i64(w, "llama.embedding_length", N_EMBD);
    set_i64(w, "llama.block_count", 1);
    set_i64(w, "llama.feed_forward_length", N_FF);
    set_i64(w, "llama.attention.head_count", N_HEAD);
    set_i64(w, "llama.attention.head_count_kv", N_HEAD_KV);
    set_i64(w, "llama.attention.key_length", HEAD_DIM);
    set_i64(w, "llama.attention.value_length", HEAD_DIM);
    set_i64(w, "llama.rope.dimension_count", HEAD_DIM);
    if (tsr_gguf_writer_set(w, "llama.rope.freq_base", TSR_GGUF_FLOAT32, &base) != TSR_OK ||
        tsr_gguf_writer_set(w, "llama.attention.layer_norm_rms_epsilon", TSR_GGUF_FLOAT32, &eps) != TSR_OK)
        abort();
    int n_vocab = bpe ? fuzz_vocab_bpe(w, "smollm") : fuzz_vocab_spm(w);
    set_i64(w, "llama.vocab_size", n_vocab);
    return n_vocab;
}

/* A metadata record; the writer's own refusals (a bool that is not 0/1)
 * just leave the key as it was. */
static void apply_key(tsr_gguf_writer *w, const uint8_t *r) {
    const char *key = keys[r[1] % FUZZ_N(keys)];
    const uint8_t *v = r + 3;
    uint8_t b = v[0] & 1;
    char s[9];
    static const tsr_gguf_type types[] = {TSR_GGUF_INT32, TSR_GGUF_UINT32, TSR_GGUF_INT64,
                                          TSR_GGUF_UINT64, TSR_GGUF_FLOAT32, TSR_GGUF_FLOAT64};
    switch (r[2] % 9) {
    case 6: (void)tsr_gguf_writer_set(w, key, TSR_GGUF_BOOL, &b); break;
    case 7:
        memcpy(s, v, 8);
        s[8] = '\0';
        (void)tsr_gguf_writer_set_str(w, key, s);
        break;
    case 8: (void)tsr_gguf_writer_set_arr(w, key, TSR_GGUF_INT32, v, 2); break;
    default: (void)tsr_gguf_writer_set(w, key, types[r[2] % 9], v); break;
    }
}

static void apply_tensor(tensor_spec *ts, const uint8_t *r) {
    tensor_spec *t = &ts[r[1] % N_TENSORS];
    uint64_t v;
    memcpy(&v, r + 3, 8);
    switch (r[0] % 4) {
    case 1: {
        int d = r[2] % 4;
        t->ne[d] = (int64_t)(v % 40);
        if (t->n_dims < d + 1) t->n_dims = d + 1;
        break;
    }
    case 2: t->dropped = 1; break;
    case 3: t->type = r[2] & 1 ? TSR_TYPE_Q8_0 : TSR_TYPE_F16; break;
    }
}

/* Adds the tensors (zero data); 0 when one cannot be written at all (a row
 * that is no whole number of blocks, too large): the input is skipped. */
static int add_tensors(tsr_gguf_writer *w, const tensor_spec *ts) {
    static uint8_t zeros[MAX_ELEMS * 4];
    for (int i = 0; i < N_TENSORS; i++) {
        const tensor_spec *t = &ts[i];
        int64_t n = 1;
        for (int d = 0; d < t->n_dims; d++) n *= t->ne[d];
        if (t->dropped) continue;
        if (n > MAX_ELEMS || (n && tsr_row_size(t->type, t->ne[0]) == 0)) return 0;
        if (tsr_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, zeros) != TSR_OK) return 0;
    }
    return 1;
}

static void try_model(const char *path) {
    tsr_backend_params bp;
    tsr_backend *be;
    tsr_model *m = NULL;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 1;
    if (tsr_backend_new(&bp, &be) != TSR_OK) abort();
    tsr_status st = tsr_model_load(be, path, NULL, &m);
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "fuzz-model-load: %s\n", st ? tsr_last_error() : "loaded");
    if (st != TSR_OK) {
        if (m || !tsr_last_error()[0]) abort();
    } else {
        tsr_session_params sp;
        tsr_session *s;
        tsr_session_params_init(&sp, sizeof sp);
        sp.n_ctx = 8;
        if (tsr_session_new(m, &sp, &s) == TSR_OK) {
            int32_t toks[2] = {0, tsr_model_n_vocab(m) - 1};
            if (tsr_session_decode(s, 2, toks, NULL, NULL, NULL) == TSR_OK && !tsr_session_logits(s, 1)) abort();
            tsr_session_free(s);
        }
        tsr_model_free(m);
    }
    tsr_backend_free(be);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[256];
    if (!path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/fuzz-model-load-%ld.gguf", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
    }
    if (size < 1 || size > 64 * 11) return 0;
    int bpe = data[0] & 1;
    tsr_gguf_writer *w;
    tensor_spec ts[N_TENSORS];
    if (tsr_gguf_writer_new(&w) != TSR_OK) abort();
    base_tensors(ts, base_keys(w, bpe));
    for (size_t off = 1; off + 11 <= size; off += 11) {
        if (data[off] % 4 == 0)
            apply_key(w, data + off);
        else
            apply_tensor(ts, data + off);
    }
    int ok = add_tensors(w, ts) && tsr_gguf_writer_write_file(w, path) == TSR_OK;
    tsr_gguf_writer_free(w);
    if (ok) try_model(path);
    unlink(path);
    return 0;
}

#define FUZZ_NAME "model-load"
#include "fuzz-replay.h"
