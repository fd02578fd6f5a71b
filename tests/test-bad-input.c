/*
 * test-bad-input.c - bad arguments at every public entry point of
 * libtensr.h: NULL handles and out-pointers, negative and huge sizes and
 * counts, wrong types, unknown names, token and sequence ids out of range,
 * invalid UTF-8 in prompts and chat messages, sampler parameters out of
 * range, a backend and a model freed while their children are open. Each
 * call must return what libtensr(7) (BAD INPUT) says: an error status with
 * a message in tsr_last_error(), NULL with the message (and, for the tensor
 * builders, the error recorded in the context), or the documented value of
 * an accessor; never crash, abort or leak (the library's live-allocation
 * count is the same after each case as before it; valgrind runs this test
 * in CI).
 *
 * The cases are a table of (function names, case function). The test reads
 * abi/libtensr.sym (every exported function) and fails when an exported
 * function is named by no case, so a new function cannot be forgotten.
 * tests/data/bad-input-pending.txt lists functions being added on other
 * branches whose cases are still to come: they are reported, not failed.
 *
 * The model is a tiny llama written with the GGUF writer (the vocabulary of
 * tests/fuzz/fuzz-vocab.h, a ChatML template), so the test needs no
 * download.
 */
#define _GNU_SOURCE   /* memmem */
#include "internal.h" /* tsr__alloc_live: the leak check of each case */
#include "tsrtest.h"

#include "fuzz/fuzz-vocab.h"

#include <float.h>
#include <limits.h>
#include <math.h>

#define ANY ((tsr_status)-1)

/* ---- the checks ------------------------------------------------------------ */

static void bad_status_(const char *file, int line, const char *text, tsr_status got, tsr_status want) {
    const char *err = tsr_last_error();
    tsrtest_checks++;
    if ((want == ANY ? got != TSR_OK : got == want) && err && err[0])
        return;
    tsrtest_failures++;
    fprintf(stderr, "%s:%d: %s returned %s, expected %s with a message (last error: \"%s\")\n", file, line, text,
            tsr_status_string(got), want == ANY ? "an error" : tsr_status_string(want), err ? err : "(null)");
}

/* expr returns the status want (ANY: any error) and tsr_last_error() says why */
#define ERR(expr, want)                                    \
    do {                                                   \
        tsr_clear_error();                                 \
        tsr_status st_ = (expr);                           \
        bad_status_(__FILE__, __LINE__, #expr, st_, want); \
    } while (0)

static void bad_null_(const char *file, int line, const char *text, int is_null) {
    const char *err = tsr_last_error();
    tsrtest_checks++;
    if (is_null && err && err[0])
        return;
    tsrtest_failures++;
    fprintf(stderr, "%s:%d: %s: %s\n", file, line, text, is_null ? "NULL without a message" : "not NULL");
}

/* expr returns NULL (or a negative sentinel) and tsr_last_error() says why */
#define NUL(expr)                                    \
    do {                                             \
        tsr_clear_error();                           \
        int null_ = (expr) == NULL;                  \
        bad_null_(__FILE__, __LINE__, #expr, null_); \
    } while (0)
#define NEG(expr)                                   \
    do {                                            \
        tsr_clear_error();                          \
        int neg_ = (expr) < 0;                      \
        bad_null_(__FILE__, __LINE__, #expr, neg_); \
    } while (0)

/* an accessor's documented value for a bad argument (no message promised) */
#define VAL(expr, want)                                                \
    do {                                                               \
        long long got_ = (long long)(expr), want_ = (long long)(want); \
        CHECK(got_ == want_, "%lld, documented %lld", got_, want_);    \
    } while (0)

/* ---- fixtures ------------------------------------------------------------------ */

static tsr_backend *be;     /* a one-thread CPU backend without weights */
static tsr_backend *mbe;    /* the backend of the model */
static tsr_model *model;    /* the tiny llama */
static tsr_gguf *gg;        /* a small GGUF from memory: keys of each kind, one tensor */
static tsr_kv_cache *cache; /* 1 layer, 8 cells, 1 head of 4 */
static tsr_device *cpu;     /* the CPU device */
static char model_path[512];

/* The context of the op cases and its standard tensors, made again for
 * each OP() so that each bad call is the context's first error. */
static tsr_context *ctx;
static tsr_tensor *A, *B, *H, *V, *I, *P, *Q, *K, *W;

static tsr_backend *new_backend(void) {
    tsr_backend_params bp;
    tsr_backend *b = NULL;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 1;
    CHECK_OK(tsr_backend_new(&bp, &b));
    if (!b)
        exit(tsrtest_done("test-bad-input"));
    return b;
}

static void ctx_close(void) {
    tsr_context_close(ctx);
    ctx = NULL;
}

static void fresh(void) {
    const int64_t ne_a[2] = {4, 3}, ne_v[1] = {5}, ne_i[1] = {3}, ne_q[3] = {4, 2, 3}, ne_k[3] = {4, 1, 3},
                  ne_w[2] = {4, 5};
    const int32_t idx[3] = {0, 1, 2};
    ctx_close();
    ctx = tsr_context_new(be);
    A = tsr_input(ctx, TSR_TYPE_F32, 2, ne_a, NULL);
    B = tsr_input(ctx, TSR_TYPE_F32, 2, ne_a, NULL);
    H = tsr_input(ctx, TSR_TYPE_F16, 2, ne_a, NULL);
    V = tsr_input(ctx, TSR_TYPE_F32, 1, ne_v, NULL);
    I = tsr_input(ctx, TSR_TYPE_I32, 1, ne_i, idx);
    P = tsr_input(ctx, TSR_TYPE_I32, 1, ne_i, idx);
    Q = tsr_input(ctx, TSR_TYPE_F32, 3, ne_q, NULL);
    K = tsr_input(ctx, TSR_TYPE_F32, 3, ne_k, NULL);
    W = tsr_new_tensor(ctx, NULL, TSR_TYPE_F32, 2, ne_w);
    if (!ctx || !A || !B || !H || !V || !I || !P || !Q || !K || !W || tsr_context_status(ctx) != TSR_OK) {
        fprintf(stderr, "test-bad-input: the standard tensors: %s\n", tsr_last_error());
        exit(1);
    }
}

static void bad_op_(const char *file, int line, const char *text, const tsr_tensor *r) {
    const char *cerr = tsr_context_error(ctx), *err = tsr_last_error();
    tsrtest_checks++;
    if (!r && cerr && cerr[0] && tsr_context_status(ctx) != TSR_OK && err && err[0])
        return;
    tsrtest_failures++;
    fprintf(stderr, "%s:%d: %s: %s\n", file, line, text,
            r      ? "not NULL"
            : cerr ? "NULL but no message in tsr_last_error()"
                   : "NULL but no error in the context");
}

/* a tensor builder returns NULL with its error in a fresh context and in
 * tsr_last_error(); expr uses ctx and the standard tensors */
#define OP(expr)                                \
    do {                                        \
        fresh();                                \
        tsr_clear_error();                      \
        const tsr_tensor *r_ = (expr);          \
        bad_op_(__FILE__, __LINE__, #expr, r_); \
    } while (0)

/* ---- the tiny model and GGUF ------------------------------------------------- */

enum { N_EMBD = 8, N_HEAD = 2, HEAD_DIM = 4, N_FF = 12 };

static void add_zero_tensor(tsr_gguf_writer *w, const char *name, int n_dims, int64_t ne0, int64_t ne1) {
    static float zeros[N_EMBD * 512];
    const int64_t ne[2] = {ne0, ne1};
    CHECK_OK(tsr_gguf_writer_add_tensor(w, name, TSR_TYPE_F32, n_dims, ne, zeros));
}

static void set_u32(tsr_gguf_writer *w, const char *key, uint32_t v) { CHECK_OK(fuzz_set_u32(w, key, v)); }

static void write_model(const char *path) {
    static const char chatml[] = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    float base = 10000.0f, eps = 1e-5f;
    tsr_gguf_writer *w = NULL;
    CHECK_OK(tsr_gguf_writer_new(&w));
    CHECK_OK(tsr_gguf_writer_set_str(w, "general.architecture", "llama"));
    set_u32(w, "llama.context_length", 32);
    set_u32(w, "llama.embedding_length", N_EMBD);
    set_u32(w, "llama.block_count", 1);
    set_u32(w, "llama.feed_forward_length", N_FF);
    set_u32(w, "llama.attention.head_count", N_HEAD);
    set_u32(w, "llama.attention.head_count_kv", 1);
    set_u32(w, "llama.rope.dimension_count", HEAD_DIM);
    CHECK_OK(tsr_gguf_writer_set(w, "llama.rope.freq_base", TSR_GGUF_FLOAT32, &base));
    CHECK_OK(tsr_gguf_writer_set(w, "llama.attention.layer_norm_rms_epsilon", TSR_GGUF_FLOAT32, &eps));
    CHECK_OK(tsr_gguf_writer_set_str(w, "tokenizer.chat_template", chatml));
    (void)fuzz_vocab_bpe; /* the SentencePiece vocabulary only */
    int n_vocab = fuzz_vocab_spm(w);
    add_zero_tensor(w, "token_embd.weight", 2, N_EMBD, n_vocab);
    add_zero_tensor(w, "blk.0.attn_norm.weight", 1, N_EMBD, 1);
    add_zero_tensor(w, "blk.0.attn_q.weight", 2, N_EMBD, N_HEAD * HEAD_DIM);
    add_zero_tensor(w, "blk.0.attn_k.weight", 2, N_EMBD, HEAD_DIM);
    add_zero_tensor(w, "blk.0.attn_v.weight", 2, N_EMBD, HEAD_DIM);
    add_zero_tensor(w, "blk.0.attn_output.weight", 2, N_HEAD * HEAD_DIM, N_EMBD);
    add_zero_tensor(w, "blk.0.ffn_norm.weight", 1, N_EMBD, 1);
    add_zero_tensor(w, "blk.0.ffn_gate.weight", 2, N_EMBD, N_FF);
    add_zero_tensor(w, "blk.0.ffn_up.weight", 2, N_EMBD, N_FF);
    add_zero_tensor(w, "blk.0.ffn_down.weight", 2, N_FF, N_EMBD);
    add_zero_tensor(w, "output_norm.weight", 1, N_EMBD, 1);
    add_zero_tensor(w, "output.weight", 2, N_EMBD, n_vocab);
    CHECK_OK(tsr_gguf_writer_write_file(w, path));
    tsr_gguf_writer_free(w);
}

static void open_small_gguf(void) {
    tsr_gguf_writer *w = NULL;
    const int32_t arr[3] = {1, 2, 3};
    const char *strs[2] = {"a", "b"};
    const float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int64_t ne[2] = {4, 2};
    void *mem = NULL;
    size_t size = 0;
    CHECK_OK(tsr_gguf_writer_new(&w));
    set_u32(w, "k.u32", 7);
    CHECK_OK(tsr_gguf_writer_set_str(w, "k.str", "text"));
    CHECK_OK(tsr_gguf_writer_set_arr(w, "k.arr", TSR_GGUF_INT32, arr, 3));
    CHECK_OK(tsr_gguf_writer_set_arr_str(w, "k.strs", strs, 2));
    CHECK_OK(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 2, ne, data));
    CHECK_OK(tsr_gguf_writer_write_memory(w, &mem, &size));
    CHECK_OK(tsr_gguf_open_memory(mem, size, "small.gguf", 0, &gg));
    tsr_free(mem);
    tsr_gguf_writer_free(w);
}

static void fixtures_open(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(model_path, sizeof model_path, "%s/test-bad-input-%ld.gguf", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    be = new_backend();
    mbe = new_backend();
    cpu = tsr_device_by_name("CPU");
    write_model(model_path);
    CHECK_OK(tsr_model_load(mbe, model_path, NULL, &model));
    open_small_gguf();
    tsr_kv_cache_params kp;
    tsr_kv_cache_params_init(&kp, sizeof kp);
    kp.n_layers = 1;
    kp.n_ctx = 8;
    kp.n_head_kv = 1;
    kp.head_dim_k = kp.head_dim_v = HEAD_DIM;
    kp.n_batch_max = 4;
    CHECK_OK(tsr_kv_cache_new(be, &kp, &cache));
    /* the scheduler keeps what its first compute allocates: not a leak of a case */
    tsr_session *s = NULL;
    CHECK_OK(tsr_session_new(model, NULL, &s));
    CHECK_OK(tsr_session_decode(s, 3, (const int32_t[]){5, 6, 7}, NULL, NULL, NULL));
    tsr_session_free(s);
    fresh();
    tsr_tensor *sum = tsr_add(ctx, A, B);
    CHECK_OK(tsr_compute(ctx, &sum, 1));
    ctx_close();
    if (!model || !gg || !cache || !cpu)
        exit(tsrtest_done("test-bad-input"));
}

static void fixtures_close(void) {
    ctx_close();
    tsr_kv_cache_free(cache);
    tsr_gguf_close(gg);
    tsr_model_free(model);
    tsr_backend_free(mbe);
    tsr_backend_free(be);
    if (!getenv("KEEP_MODEL"))
        unlink(model_path);
}

/* ---- version, status, errors, logging ------------------------------------ */

static void c_version(void) {
    VAL(tsr_version(), TSR_VERSION_NUMBER); /* no arguments: nothing can be bad */
    CHECK(strlen(tsr_version_string()) >= 5);
}

static void c_status(void) {
    CHECK(tsr_status_string((tsr_status)99) != NULL && tsr_status_string((tsr_status)99)[0]);
    CHECK(tsr_status_string((tsr_status)-5) != NULL && tsr_status_string((tsr_status)-5)[0]);
    tsr_clear_error();
    CHECK(tsr_last_error() != NULL && tsr_last_error()[0] == '\0');
}

static tsr_log_level seen_level = TSR_LOG_NONE;
static void count_log(tsr_log_level level, const char *msg, const tsr_log_field *f, size_t n, void *user) {
    (void)msg, (void)f, (void)n, (void)user;
    if (level < seen_level)
        seen_level = level;
}

static void c_log(void) {
    tsr_log_level old = tsr_log_get_level();
    tsr_log_set_level((tsr_log_level)99); /* a level that is none: the default, warn */
    VAL(tsr_log_get_level(), TSR_LOG_WARN);
    tsr_log_set_level((tsr_log_level)-7);
    VAL(tsr_log_get_level(), TSR_LOG_WARN);
    tsr_log_set(count_log, NULL);
    tsr_log_set(NULL, NULL); /* the default again */
    tsr_log_set_level(old);
}

/* ---- types ----------------------------------------------------------------- */

static void c_types(void) {
    tsr_type t = TSR_TYPE_F32;
    float f[32] = {0};
    uint8_t q[64];
    CHECK(tsr_type_name((tsr_type)4) == NULL && tsr_type_name((tsr_type)-1) == NULL &&
          tsr_type_name(TSR_TYPE_COUNT) == NULL);
    ERR(tsr_type_by_name("q9_z", &t), TSR_E_NOT_FOUND);
    ERR(tsr_type_by_name(NULL, &t), TSR_E_INVALID);
    ERR(tsr_type_by_name("f32", NULL), TSR_E_INVALID);
    VAL(tsr_type_block_size((tsr_type)1000), 0);
    VAL(tsr_type_block_bytes((tsr_type)-3), 0);
    VAL(tsr_type_is_quantized((tsr_type)1000), 0);
    VAL(tsr_row_size(TSR_TYPE_Q4_0, 31), 0);
    VAL(tsr_row_size(TSR_TYPE_F32, -1), 0);
    VAL(tsr_row_size(TSR_TYPE_F32, INT64_MAX), 0);
    VAL(tsr_row_size((tsr_type)5, 32), 0);
    ERR(tsr_quantize(TSR_TYPE_Q4_0, f, q, 31), TSR_E_INVALID);
    ERR(tsr_quantize(TSR_TYPE_Q4_0, NULL, q, 32), TSR_E_INVALID);
    ERR(tsr_quantize(TSR_TYPE_Q4_0, f, NULL, 32), TSR_E_INVALID);
    ERR(tsr_quantize(TSR_TYPE_Q4_0, f, q, -32), TSR_E_INVALID);
    ERR(tsr_quantize((tsr_type)77, f, q, 32), ANY);
    ERR(tsr_dequantize(TSR_TYPE_Q4_0, q, f, 33), TSR_E_INVALID);
    ERR(tsr_dequantize(TSR_TYPE_Q4_0, NULL, f, 32), TSR_E_INVALID);
    ERR(tsr_dequantize(TSR_TYPE_Q4_0, q, NULL, 32), TSR_E_INVALID);
    ERR(tsr_dequantize(TSR_TYPE_F32, q, f, -1), TSR_E_INVALID);
    ERR(tsr_dequantize((tsr_type)77, q, f, 32), ANY);
}

static void c_half(void) { /* every bit pattern is a value: NaN and inf convert as such */
    CHECK(isnan(tsr_fp16_to_fp32(tsr_fp32_to_fp16(NAN))));
    CHECK(isinf(tsr_fp16_to_fp32(tsr_fp32_to_fp16(1e30f))));
    CHECK(isnan(tsr_bf16_to_fp32(tsr_fp32_to_bf16(NAN))));
    CHECK(isinf(tsr_bf16_to_fp32(tsr_fp32_to_bf16(INFINITY))));
}

/* ---- devices, buffer types, buffers, overrides ----------------------------------- */

static void c_devices(void) {
    size_t fr = 0, total = 0;
    CHECK(tsr_device_count() >= 1);
    NUL(tsr_device_get(tsr_device_count()));
    NUL(tsr_device_get(SIZE_MAX));
    NUL(tsr_device_by_name(NULL));
    NUL(tsr_device_by_name("NOPE7"));
    NUL(tsr_device_by_name(""));
    VAL(tsr_device_name(NULL), NULL);
    VAL(tsr_device_description(NULL), NULL);
    VAL(tsr_device_kind(NULL), TSR_DEVICE_CPU);
    VAL(tsr_device_index_in_model(NULL), -1);
    ERR(tsr_device_memory(NULL, &fr, &total), TSR_E_INVALID);
    CHECK_OK(tsr_device_memory(cpu, NULL, NULL)); /* either out-pointer may be NULL */
    VAL(tsr_device_buffer_type(NULL), NULL);
    VAL(tsr_device_host_buffer_type(NULL), NULL);
    CHECK(tsr_backends_available() != NULL);
}

static void c_buffers(void) {
    tsr_buffer *buf = (tsr_buffer *)&buf;
    tsr_buffer_type *bt = tsr_device_buffer_type(cpu);
    NUL(tsr_buffer_type_by_name(NULL));
    NUL(tsr_buffer_type_by_name("CUDA99"));
    VAL(tsr_buffer_type_name(NULL), NULL);
    VAL(tsr_buffer_type_device(NULL), NULL);
    ERR(tsr_buffer_alloc(NULL, 16, &buf), TSR_E_INVALID);
    CHECK(buf == NULL, "*out is NULL after a failure");
    ERR(tsr_buffer_alloc(bt, 16, NULL), TSR_E_INVALID);
    ERR(tsr_buffer_alloc(bt, SIZE_MAX, &buf), ANY);
    ERR(tsr_buffer_alloc(bt, SIZE_MAX / 2, &buf), ANY);
    CHECK(buf == NULL);
    tsr_buffer_free(NULL);
    VAL(tsr_buffer_size(NULL), 0);
    VAL(tsr_buffer_get_type(NULL), NULL);
}

static void c_overrides(void) {
    tsr_buft_override *list = (tsr_buft_override *)&list;
    ERR(tsr_buft_overrides_parse(NULL, &list), TSR_E_INVALID);
    ERR(tsr_buft_overrides_parse("exps=CPU", NULL), TSR_E_INVALID);
    ERR(tsr_buft_overrides_parse("exps=NOPE", &list), TSR_E_NOT_FOUND);
    CHECK(list == NULL);
    ERR(tsr_buft_overrides_parse("([=CPU", &list), ANY);
    ERR(tsr_buft_overrides_parse("noequals", &list), ANY);
    ERR(tsr_buft_overrides_parse("=CPU", &list), ANY);
    ERR(tsr_buft_overrides_parse("a=CPU,,b=\xff\xfe", &list), ANY);
    tsr_buft_overrides_free(NULL);
}

/* ---- backend ------------------------------------------------------------------ */

static void c_backend_params(void) {
    tsr_backend_params bp;
    tsr_backend *b = (tsr_backend *)&b;
    tsr_device *bogus[2] = {(tsr_device *)&bp, NULL};
    tsr_backend_params_init(NULL, sizeof bp); /* ignored */
    tsr_backend_params_init(&bp, 0);          /* ignored: smaller than the size field */
    tsr_backend_params_init(&bp, sizeof bp);
    ERR(tsr_backend_new(&bp, NULL), TSR_E_INVALID);
    bp.flash_attn = 7;
    ERR(tsr_backend_new(&bp, &b), TSR_E_INVALID);
    CHECK(b == NULL);
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = -3;
    ERR(tsr_backend_new(&bp, &b), TSR_E_INVALID);
    tsr_backend_params_init(&bp, sizeof bp);
    bp.devices = bogus; /* not a device */
    ERR(tsr_backend_new(&bp, &b), TSR_E_INVALID);
    bogus[0] = NULL; /* an empty list: the CPU alone */
    CHECK_OK(tsr_backend_new(&bp, &b));
    CHECK(tsr_backend_n_devices(b) == 1 && tsr_backend_device(b, 0) == cpu);
    tsr_backend_free(b);
    tsr_backend_params_init(&bp, sizeof bp);
    bp.size = 3; /* not filled by _init */
    ERR(tsr_backend_new(&bp, &b), TSR_E_INVALID);
    /* n_threads far above the cores is clamped, not an error */
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 100000;
    CHECK_OK(tsr_backend_new(&bp, &b));
    CHECK(tsr_backend_n_threads(b) >= 1 && tsr_backend_n_threads(b) < 100000);
    tsr_backend_free(b);
    tsr_backend_free(NULL);
}

static void c_backend_get(void) {
    size_t w = 1, k = 1, c = 1;
    VAL(tsr_backend_n_devices(NULL), 0);
    VAL(tsr_backend_device(NULL, 0), NULL);
    VAL(tsr_backend_device(be, 99), NULL);
    VAL(tsr_backend_n_threads(NULL), 0);
    VAL(tsr_backend_flash_attn(NULL), 0);
    VAL(tsr_backend_attn_max_batch(NULL), 0);
    VAL(tsr_backend_n_weights(NULL), 0);
    VAL(tsr_backend_weight_at(NULL, 0), NULL);
    VAL(tsr_backend_weight_at(mbe, SIZE_MAX), NULL);
    VAL(tsr_backend_layer_buffer_type(NULL, 0), NULL);
    VAL(tsr_backend_layer_buffer_type(mbe, -1), NULL);
    VAL(tsr_backend_layer_buffer_type(mbe, 1000), NULL);
    VAL(tsr_backend_n_layers(NULL), 0);
    VAL(tsr_backend_n_splits(NULL), 0);
    VAL(tsr_backend_n_copies(NULL), 0);
    ERR(tsr_backend_memory_plan(NULL, 0, &w, &k, &c), TSR_E_INVALID);
    ERR(tsr_backend_memory_plan(be, 99, &w, &k, &c), TSR_E_RANGE);
    tsr_backend_log_plan(NULL); /* no-op */
}

static void c_backend_weights(void) {
    const int64_t ne[2] = {4, 4}, neg[2] = {4, -4};
    tsr_load_params lp;
    tsr_load_params_init(NULL, sizeof lp);
    tsr_load_params_init(&lp, 1);
    NUL(tsr_backend_weight(NULL, "output.weight"));
    NUL(tsr_backend_weight(mbe, NULL));
    NUL(tsr_backend_weight(mbe, "no.such.weight"));
    NUL(tsr_backend_weight_on(NULL, "output.weight", cpu));
    NUL(tsr_backend_weight_on(mbe, "no.such.weight", cpu));
    NUL(tsr_backend_weight_on(mbe, NULL, cpu));
    ERR(tsr_backend_declare_weight(NULL, "w", TSR_TYPE_F32, 2, ne), TSR_E_INVALID);
    ERR(tsr_backend_declare_weight(be, NULL, TSR_TYPE_F32, 2, ne), TSR_E_INVALID);
    ERR(tsr_backend_declare_weight(be, "w", TSR_TYPE_F32, 2, NULL), TSR_E_INVALID);
    ERR(tsr_backend_declare_weight(be, "w", TSR_TYPE_F32, 0, ne), TSR_E_INVALID);
    ERR(tsr_backend_declare_weight(be, "w", TSR_TYPE_F32, 5, ne), TSR_E_INVALID);
    ERR(tsr_backend_declare_weight(be, "w", TSR_TYPE_F32, 2, neg), TSR_E_INVALID);
    ERR(tsr_backend_declare_weight(be, "w", (tsr_type)4, 2, ne), ANY);
    ERR(tsr_backend_declare_weight(be, "w", TSR_TYPE_Q4_0, 2, ne), ANY);             /* 4 is no whole block */
    ERR(tsr_backend_declare_weight(mbe, "output.weight", TSR_TYPE_F32, 2, ne), ANY); /* a duplicate */
    ERR(tsr_backend_place_weights(NULL, NULL), TSR_E_INVALID);
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = -7;
    ERR(tsr_backend_load_gguf(be, model_path, &lp), TSR_E_INVALID);
    ERR(tsr_backend_load_gguf(NULL, model_path, NULL), TSR_E_INVALID);
    ERR(tsr_backend_load_gguf(be, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_backend_load_gguf(be, "/nonexistent/x.gguf", NULL), TSR_E_IO);
    ERR(tsr_backend_load_gguf(mbe, model_path, NULL), TSR_E_STATE); /* holds weights already */
    CHECK_EQ_INT(tsr_backend_n_weights(be), 0);
}

/* A backend freed while a context and a KV cache are open stays alive
 * until the last of them closes. */
static void c_backend_free_busy(void) {
    tsr_backend *b = new_backend();
    tsr_context *c = tsr_context_new(b);
    tsr_kv_cache *kv = NULL;
    tsr_kv_cache_params kp;
    const int64_t ne[1] = {3};
    tsr_kv_cache_params_init(&kp, sizeof kp);
    kp.n_layers = 1;
    kp.n_ctx = 4;
    kp.n_head_kv = 1;
    kp.head_dim_k = kp.head_dim_v = 4;
    CHECK_OK(tsr_kv_cache_new(b, &kp, &kv));
    tsr_backend_free(b);
    tsr_tensor *t = tsr_input(c, TSR_TYPE_F32, 1, ne, NULL);
    CHECK(t != NULL && tsr_context_backend(c) == b);
    CHECK_OK(tsr_compute(c, &t, 1));
    tsr_context_close(c);
    CHECK_EQ_INT(tsr_kv_cache_n_ctx(kv), 4);
    tsr_kv_cache_free(kv); /* frees the backend */
}

/* ---- contexts and tensors ------------------------------------------------------ */

static void c_context(void) {
    NUL(tsr_context_new(NULL));
    tsr_context_close(NULL);
    CHECK(tsr_context_error(NULL) != NULL); /* "NULL context" */
    VAL(tsr_context_status(NULL), TSR_E_INVALID);
    VAL(tsr_context_backend(NULL), NULL);
}

static void c_leaves(void) {
    const int64_t ne[4] = {4, 3, 1, 1}, neg[2] = {4, -1}, huge[4] = {INT64_MAX, INT64_MAX, 2, 2},
                  big[2] = {INT64_C(1) << 40, INT64_C(1) << 30};
    tsr_buffer_type *bt = tsr_device_buffer_type(cpu);
    fresh();
    NUL(tsr_input(NULL, TSR_TYPE_F32, 2, ne, NULL));
    NUL(tsr_new_tensor(NULL, bt, TSR_TYPE_F32, 2, ne));
    NUL(tsr_empty(NULL, TSR_TYPE_F32, 2, ne));
    OP(tsr_input(ctx, TSR_TYPE_F32, 0, ne, NULL));
    OP(tsr_input(ctx, TSR_TYPE_F32, 5, ne, NULL));
    OP(tsr_input(ctx, TSR_TYPE_F32, -1, ne, NULL));
    OP(tsr_input(ctx, TSR_TYPE_F32, 2, NULL, NULL));
    OP(tsr_input(ctx, TSR_TYPE_F32, 2, neg, NULL));
    OP(tsr_input(ctx, TSR_TYPE_F32, 4, huge, NULL));
    OP(tsr_input(ctx, (tsr_type)4, 2, ne, NULL));
    OP(tsr_input(ctx, (tsr_type)12345, 2, ne, NULL));
    OP(tsr_input(ctx, TSR_TYPE_Q4_0, 2, ne, NULL)); /* 4 is no whole block */
    OP(tsr_input(ctx, TSR_TYPE_F32, 2, big, NULL)); /* 4 EiB: out of memory */
    OP(tsr_new_tensor(ctx, bt, TSR_TYPE_F32, 2, neg));
    OP(tsr_new_tensor(ctx, bt, (tsr_type)-1, 2, ne));
    OP(tsr_new_tensor(ctx, bt, TSR_TYPE_F32, 2, big));
    OP(tsr_new_tensor(ctx, bt, TSR_TYPE_F32, 9, ne));
    OP(tsr_empty(ctx, TSR_TYPE_F32, 2, neg));
    OP(tsr_empty(ctx, TSR_TYPE_F32, 2, NULL));
    OP(tsr_empty(ctx, (tsr_type)31, 2, ne));
    ctx_close();
}

static void c_tensor_get(void) {
    char buf[64];
    fresh();
    VAL(tsr_set_name(NULL, "x"), NULL);
    CHECK(tsr_set_name(A, NULL) == A); /* a NULL name is ignored */
    memset(buf, 'x', sizeof buf - 1);
    buf[sizeof buf - 1] = '\0';
    CHECK(tsr_set_name(A, buf) == A && strlen(tsr_tensor_name(A)) == 63); /* truncated */
    CHECK(strcmp(tsr_tensor_name(NULL), "") == 0);
    VAL((int)tsr_tensor_type(NULL), -1);
    VAL(tsr_tensor_n_dims(NULL), 0);
    VAL(tsr_tensor_ne(NULL, 0), -1);
    VAL(tsr_tensor_ne(A, -1), -1);
    VAL(tsr_tensor_ne(A, 9), 1);
    VAL(tsr_tensor_nb(NULL, 0), 0);
    VAL(tsr_tensor_nb(A, 4), 0);
    VAL(tsr_tensor_nb(A, -1), 0);
    VAL(tsr_tensor_nelements(NULL), 0);
    VAL(tsr_tensor_nbytes(NULL), 0);
    VAL(tsr_tensor_is_contiguous(NULL), 0);
    VAL(tsr_tensor_buffer_type(NULL), NULL);
    VAL(tsr_tensor_device(NULL), NULL);
    ctx_close();
}

static void c_tensor_io(void) {
    float buf[16];
    fresh();
    tsr_tensor *sum = tsr_add(ctx, A, B);
    ERR(tsr_tensor_read(NULL, buf, 0, 4), TSR_E_INVALID);
    ERR(tsr_tensor_read(A, NULL, 0, 4), TSR_E_INVALID);
    ERR(tsr_tensor_read(A, buf, 0, 4 * 13), TSR_E_RANGE);
    ERR(tsr_tensor_read(A, buf, 48, 4), TSR_E_RANGE);
    ERR(tsr_tensor_read(A, buf, SIZE_MAX, 2), TSR_E_RANGE);
    ERR(tsr_tensor_read(A, buf, 4, SIZE_MAX), TSR_E_RANGE);
    ERR(tsr_tensor_read(sum, buf, 0, 4), TSR_E_STATE); /* not computed */
    ERR(tsr_tensor_write(NULL, buf, 0, 4), TSR_E_INVALID);
    ERR(tsr_tensor_write(A, NULL, 0, 4), TSR_E_INVALID);
    ERR(tsr_tensor_write(A, buf, 0, 4 * 13), TSR_E_RANGE);
    ERR(tsr_tensor_write(A, buf, SIZE_MAX - 1, 4), TSR_E_RANGE);
    ERR(tsr_tensor_write(sum, buf, 0, 4), TSR_E_STATE);
    CHECK_OK(tsr_tensor_read(A, NULL, 0, 0)); /* nothing to copy */
    ctx_close();
}

/* ---- ops ---------------------------------------------------------------------- */

static void c_binary(void) {
    tsr_tensor *(*const fns[])(tsr_context *, tsr_tensor *, tsr_tensor *) = {tsr_add, tsr_sub,    tsr_mul,
                                                                             tsr_div, tsr_swiglu, tsr_geglu};
    fresh();
    for (size_t i = 0; i < FUZZ_N(fns); i++) {
        NUL(fns[i](NULL, A, B));
        OP(fns[i](ctx, NULL, B));
        OP(fns[i](ctx, A, NULL));
        OP(fns[i](ctx, A, V)); /* shapes that do not broadcast */
        OP(fns[i](ctx, A, I)); /* an I32 operand */
    }
    ctx_close();
}

static void c_unary(void) {
    fresh();
    NUL(tsr_scale(NULL, A, 2.0f));
    NUL(tsr_silu(NULL, A));
    NUL(tsr_gelu(NULL, A));
    NUL(tsr_softmax(NULL, A));
    NUL(tsr_rms_norm(NULL, A, 1e-5f));
    NUL(tsr_norm(NULL, A, 1e-5f));
    NUL(tsr_cont(NULL, A));
    NUL(tsr_transpose(NULL, A));
    NUL(tsr_argmax(NULL, A));
    OP(tsr_scale(ctx, NULL, 2.0f));
    OP(tsr_scale(ctx, I, 2.0f));
    OP(tsr_silu(ctx, NULL));
    OP(tsr_silu(ctx, I));
    OP(tsr_gelu(ctx, NULL));
    OP(tsr_gelu(ctx, I));
    OP(tsr_softmax(ctx, NULL));
    OP(tsr_softmax(ctx, I));
    OP(tsr_rms_norm(ctx, NULL, 1e-5f));
    OP(tsr_rms_norm(ctx, I, 1e-5f));
    OP(tsr_rms_norm(ctx, A, -1.0f));
    OP(tsr_rms_norm(ctx, A, NAN));
    OP(tsr_norm(ctx, NULL, 1e-5f));
    OP(tsr_norm(ctx, A, -1.0f));
    OP(tsr_cont(ctx, NULL));
    OP(tsr_transpose(ctx, NULL));
    OP(tsr_argmax(ctx, NULL));
    OP(tsr_argmax(ctx, I));
    ctx_close();
}

static void c_moe(void) {
    fresh();
    NUL(tsr_mul_mat_id(NULL, Q, K, I));
    NUL(tsr_top_k(NULL, A, 1));
    NUL(tsr_argsort(NULL, A, TSR_SORT_ASC));
    NUL(tsr_sigmoid(NULL, A));
    NUL(tsr_sum_rows(NULL, A));
    OP(tsr_mul_mat_id(ctx, NULL, K, I));
    OP(tsr_mul_mat_id(ctx, Q, NULL, I));
    OP(tsr_mul_mat_id(ctx, Q, K, NULL));
    OP(tsr_mul_mat_id(ctx, Q, K, I)); /* ids for 1 token, b of 3 */
    OP(tsr_mul_mat_id(ctx, Q, K, A)); /* F32 ids */
    OP(tsr_mul_mat_id(ctx, Q, H, I)); /* F16 b */
    OP(tsr_mul_mat_id(ctx, I, K, I)); /* I32 experts */
    OP(tsr_mul_mat_id(ctx, Q, V, I)); /* k 4 against 5 */
    OP(tsr_top_k(ctx, NULL, 1));
    OP(tsr_top_k(ctx, A, 0));
    OP(tsr_top_k(ctx, A, -1));
    OP(tsr_top_k(ctx, A, 5)); /* rows of 4 */
    OP(tsr_top_k(ctx, I, 1));
    OP(tsr_argsort(ctx, NULL, TSR_SORT_DESC));
    OP(tsr_argsort(ctx, A, (tsr_sort_order)2));
    OP(tsr_argsort(ctx, A, (tsr_sort_order)-1));
    OP(tsr_argsort(ctx, I, TSR_SORT_ASC));
    OP(tsr_sigmoid(ctx, NULL));
    OP(tsr_sigmoid(ctx, I));
    OP(tsr_sum_rows(ctx, NULL));
    OP(tsr_sum_rows(ctx, I));
    ctx_close();
}

static void c_matmul(void) {
    fresh();
    NUL(tsr_mul_mat(NULL, A, B));
    OP(tsr_mul_mat(ctx, NULL, B));
    OP(tsr_mul_mat(ctx, A, NULL));
    OP(tsr_mul_mat(ctx, A, V));                     /* k 4 against 5 */
    OP(tsr_mul_mat(ctx, A, I));                     /* I32 b */
    OP(tsr_mul_mat(ctx, I, A));                     /* I32 a */
    OP(tsr_mul_mat(ctx, Q, tsr_transpose(ctx, B))); /* k mismatch and broadcast */
    ctx_close();
}

static void c_rows(void) {
    fresh();
    NUL(tsr_get_rows(NULL, A, I));
    NUL(tsr_set_rows(NULL, W, A, I));
    OP(tsr_get_rows(ctx, NULL, I));
    OP(tsr_get_rows(ctx, A, NULL));
    OP(tsr_get_rows(ctx, A, A)); /* F32 indices */
    {
        const int32_t bad[3] = {0, 7, -1};
        fresh();
        tsr_tensor *bi = tsr_input(ctx, TSR_TYPE_I32, 1, (const int64_t[]){3}, bad);
        tsr_clear_error();
        bad_op_(__FILE__, __LINE__, "tsr_get_rows(ctx, A, {0, 7, -1})", tsr_get_rows(ctx, A, bi));
        fresh();
        bi = tsr_input(ctx, TSR_TYPE_I32, 1, (const int64_t[]){3}, bad);
        tsr_clear_error();
        bad_op_(__FILE__, __LINE__, "tsr_set_rows(ctx, W, A, {0, 7, -1})", tsr_set_rows(ctx, W, A, bi));
    }
    OP(tsr_set_rows(ctx, NULL, A, I));
    OP(tsr_set_rows(ctx, W, NULL, I));
    OP(tsr_set_rows(ctx, W, A, NULL));
    OP(tsr_set_rows(ctx, W, V, I)); /* row length 5 into rows of 4 */
    OP(tsr_set_rows(ctx, W, A, A)); /* F32 indices */
    OP(tsr_set_rows(ctx, I, A, I)); /* an I32 destination */
    ctx_close();
}

static void c_rope(void) {
    fresh();
    NUL(tsr_rope(NULL, Q, P, 4, TSR_ROPE_NORMAL, 10000.0f, 1.0f));
    NUL(tsr_rope_ext(NULL, Q, P, NULL, 4, 0, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f));
    OP(tsr_rope(ctx, NULL, P, 4, TSR_ROPE_NORMAL, 10000.0f, 1.0f));
    OP(tsr_rope(ctx, Q, NULL, 4, TSR_ROPE_NORMAL, 10000.0f, 1.0f));
    OP(tsr_rope(ctx, Q, A, 4, TSR_ROPE_NORMAL, 10000.0f, 1.0f)); /* F32 positions */
    OP(tsr_rope(ctx, Q, V, 4, TSR_ROPE_NORMAL, 10000.0f, 1.0f)); /* 5 positions for 3 tokens */
    OP(tsr_rope(ctx, Q, P, 5, TSR_ROPE_NORMAL, 10000.0f, 1.0f)); /* odd n_dims */
    OP(tsr_rope(ctx, Q, P, 8, TSR_ROPE_NORMAL, 10000.0f, 1.0f)); /* n_dims > head_dim */
    OP(tsr_rope(ctx, Q, P, -2, TSR_ROPE_NORMAL, 10000.0f, 1.0f));
    OP(tsr_rope(ctx, Q, P, 4, 77, 10000.0f, 1.0f)); /* unknown mode */
    OP(tsr_rope(ctx, Q, P, 4, TSR_ROPE_NORMAL, -1.0f, 1.0f));
    OP(tsr_rope(ctx, Q, P, 4, TSR_ROPE_NORMAL, 10000.0f, NAN));
    OP(tsr_rope_ext(ctx, Q, P, I, 4, 0, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f)); /* I32 factors */
    OP(tsr_rope_ext(ctx, Q, P, NULL, 4, 0, -5, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f));
    OP(tsr_rope_ext(ctx, Q, P, NULL, 4, 0, 0, 10000.0f, 1.0f, NAN, 1.0f, 32.0f, 1.0f));
    ctx_close();
}

static void c_softmax_ext(void) {
    fresh();
    NUL(tsr_softmax_ext(NULL, A, NULL, 1.0f));
    OP(tsr_softmax_ext(ctx, NULL, NULL, 1.0f));
    OP(tsr_softmax_ext(ctx, A, V, 1.0f)); /* mask rows of 5 for rows of 4 */
    OP(tsr_softmax_ext(ctx, A, I, 1.0f)); /* an I32 mask */
    OP(tsr_softmax_ext(ctx, A, NULL, NAN));
    ctx_close();
}

static void c_concat_cpy(void) {
    fresh();
    NUL(tsr_concat(NULL, A, B, 0));
    NUL(tsr_cpy(NULL, A, B));
    NUL(tsr_cast(NULL, A, TSR_TYPE_F16));
    OP(tsr_concat(ctx, NULL, B, 0));
    OP(tsr_concat(ctx, A, B, 4));
    OP(tsr_concat(ctx, A, B, -1));
    OP(tsr_concat(ctx, A, V, 1)); /* other dims differ */
    OP(tsr_concat(ctx, A, H, 0)); /* types differ */
    OP(tsr_cpy(ctx, NULL, B));
    OP(tsr_cpy(ctx, A, NULL));
    OP(tsr_cpy(ctx, A, V)); /* 12 elements into 5 */
    OP(tsr_cast(ctx, NULL, TSR_TYPE_F16));
    OP(tsr_cast(ctx, A, (tsr_type)4));
    OP(tsr_cast(ctx, A, (tsr_type)-9));
    OP(tsr_cast(ctx, A, TSR_TYPE_Q4_0)); /* rows of 4 are no whole block */
    ctx_close();
}

static void c_views(void) {
    const int64_t ne[2] = {3, 4}, neg[2] = {-3, -4}, ne5[2] = {5, 5};
    fresh();
    NUL(tsr_view_1d(NULL, A, 4, 0));
    NUL(tsr_view_2d(NULL, A, 4, 3, 16, 0));
    NUL(tsr_view_3d(NULL, A, 4, 3, 1, 16, 48, 0));
    NUL(tsr_view_4d(NULL, A, 4, 3, 1, 1, 16, 48, 48, 0));
    NUL(tsr_reshape(NULL, A, 2, ne));
    NUL(tsr_reshape_1d(NULL, A, 12));
    NUL(tsr_reshape_2d(NULL, A, 3, 4));
    NUL(tsr_reshape_3d(NULL, A, 3, 2, 2));
    NUL(tsr_reshape_4d(NULL, A, 3, 2, 2, 1));
    NUL(tsr_permute(NULL, A, 1, 0, 2, 3));
    OP(tsr_view_1d(ctx, NULL, 4, 0));
    OP(tsr_view_1d(ctx, A, 13, 0)); /* past the end */
    OP(tsr_view_1d(ctx, A, 4, 48)); /* past the end */
    OP(tsr_view_1d(ctx, A, -1, 0));
    OP(tsr_view_1d(ctx, A, 1, SIZE_MAX)); /* offset overflows */
    OP(tsr_view_2d(ctx, A, 4, 4, 16, 0));
    OP(tsr_view_2d(ctx, A, 4, 2, SIZE_MAX / 2, 0));
    OP(tsr_view_3d(ctx, A, 4, 3, 2, 16, 48, 0));
    OP(tsr_view_4d(ctx, A, 4, 3, 1, 2, 16, 48, 48, 0));
    OP(tsr_view_4d(ctx, A, INT64_MAX, 2, 1, 1, 16, 48, 48, 0));
    OP(tsr_reshape(ctx, NULL, 2, ne));
    OP(tsr_reshape(ctx, A, 2, NULL));
    OP(tsr_reshape(ctx, A, 0, ne));
    OP(tsr_reshape(ctx, A, 5, ne));
    OP(tsr_reshape(ctx, A, 2, neg));
    OP(tsr_reshape(ctx, A, 2, ne5));
    OP(tsr_reshape(ctx, tsr_transpose(ctx, A), 2, ne)); /* not contiguous */
    OP(tsr_reshape_1d(ctx, A, 11));
    OP(tsr_reshape_1d(ctx, NULL, 12));
    OP(tsr_reshape_2d(ctx, A, 5, 3));
    OP(tsr_reshape_2d(ctx, A, -3, -4));
    OP(tsr_reshape_3d(ctx, A, 2, 2, 2));
    OP(tsr_reshape_4d(ctx, A, 2, 2, 2, 2));
    OP(tsr_permute(ctx, NULL, 1, 0, 2, 3));
    OP(tsr_permute(ctx, A, 0, 0, 2, 3)); /* not a permutation */
    OP(tsr_permute(ctx, A, 4, 0, 2, 3));
    OP(tsr_permute(ctx, A, -1, 0, 2, 3));
    ctx_close();
}

static void c_flash(void) {
    fresh();
    NUL(tsr_flash_attn(NULL, Q, K, K, NULL, 1.0f));
    NUL(tsr_attention_nocache(NULL, Q, K, K, NULL, 1.0f));
    OP(tsr_flash_attn(ctx, NULL, K, K, NULL, 1.0f));
    OP(tsr_flash_attn(ctx, Q, NULL, K, NULL, 1.0f));
    OP(tsr_flash_attn(ctx, Q, K, NULL, NULL, 1.0f));
    OP(tsr_flash_attn(ctx, Q, A, K, NULL, 1.0f)); /* k of another head_dim layout */
    OP(tsr_flash_attn(ctx, Q, K, K, I, 1.0f));    /* an I32 mask */
    OP(tsr_flash_attn(ctx, I, K, K, NULL, 1.0f)); /* an I32 q */
    OP(tsr_attention_nocache(ctx, NULL, K, K, NULL, 1.0f));
    OP(tsr_attention_nocache(ctx, Q, NULL, K, NULL, 1.0f));
    OP(tsr_attention_nocache(ctx, Q, V, K, NULL, 1.0f)); /* k [5] */
    OP(tsr_attention_nocache(ctx, Q, K, K, I, 1.0f));    /* an I32 mask */
    ctx_close();
}

/* ---- compute ---------------------------------------------------------------------- */

static void c_compute(void) {
    size_t sizes[4];
    tsr_tensor *none[1] = {NULL};
    fresh();
    tsr_tensor *sum = tsr_add(ctx, A, B);
    ERR(tsr_compute(NULL, &sum, 1), TSR_E_INVALID);
    ERR(tsr_compute(ctx, NULL, 1), TSR_E_INVALID);
    ERR(tsr_compute(ctx, none, 1), TSR_E_INVALID);
    ERR(tsr_reserve(NULL, &sum, 1), TSR_E_INVALID);
    ERR(tsr_reserve(ctx, NULL, 1), TSR_E_INVALID);
    ERR(tsr_reserve(ctx, none, 1), TSR_E_INVALID);
    ERR(tsr_measure(NULL, &sum, 1, sizes), TSR_E_INVALID);
    ERR(tsr_measure(ctx, &sum, 1, NULL), TSR_E_INVALID);
    ERR(tsr_measure(ctx, none, 1, sizes), TSR_E_INVALID);
    /* a context whose op failed fails to compute with that op's error */
    CHECK(tsr_add(ctx, A, V) == NULL);
    ERR(tsr_compute(ctx, &sum, 1), TSR_E_INVALID);
    ERR(tsr_reserve(ctx, &sum, 1), TSR_E_INVALID);
    /* an output of another backend's context */
    fresh();
    tsr_context *other = tsr_context_new(mbe);
    tsr_tensor *x = tsr_input(other, TSR_TYPE_F32, 1, (const int64_t[]){4}, NULL);
    tsr_tensor *y = tsr_scale(other, x, 2.0f);
    ERR(tsr_compute(ctx, &y, 1), TSR_E_INVALID);
    tsr_context_close(other);
    ctx_close();
}

/* ---- KV cache and attention ------------------------------------------------------ */

static void c_kv_new(void) {
    tsr_kv_cache_params kp;
    tsr_kv_cache *c = (tsr_kv_cache *)&c;
    const int bad_heads[1] = {-1};
    tsr_kv_cache_params_init(NULL, sizeof kp);
    tsr_kv_cache_params_init(&kp, 2);
    tsr_kv_cache_params_init(&kp, sizeof kp);
    kp.n_layers = 1, kp.n_ctx = 4, kp.n_head_kv = 1, kp.head_dim_k = kp.head_dim_v = 4;
    ERR(tsr_kv_cache_new(NULL, &kp, &c), TSR_E_INVALID);
    ERR(tsr_kv_cache_new(be, NULL, &c), TSR_E_INVALID);
    ERR(tsr_kv_cache_new(be, &kp, NULL), TSR_E_INVALID);
    kp.n_ctx = -4;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    CHECK(c == NULL);
    kp.n_ctx = INT64_MAX / 2;
    ERR(tsr_kv_cache_new(be, &kp, &c), ANY);
    kp.n_ctx = 4, kp.n_layers = -1;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    kp.n_layers = 1, kp.n_head_kv = 0;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    kp.n_head_kv = 1, kp.head_dim_k = -4;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    kp.head_dim_k = 4, kp.type_k = (tsr_type)4;
    ERR(tsr_kv_cache_new(be, &kp, &c), ANY);
    kp.type_k = TSR_TYPE_I32;
    ERR(tsr_kv_cache_new(be, &kp, &c), ANY);
    kp.type_k = TSR_TYPE_F16, kp.n_seq = 0;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    kp.n_seq = 1, kp.n_batch_max = -1;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    kp.n_batch_max = 4, kp.n_head_kv_layer = bad_heads;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    kp.n_head_kv_layer = NULL, kp.size = 1;
    ERR(tsr_kv_cache_new(be, &kp, &c), TSR_E_INVALID);
    tsr_kv_cache_free(NULL);
    /* a huge n_batch_max is a bound only: the batches still fit the cells */
    tsr_kv_cache_params_init(&kp, sizeof kp);
    kp.n_layers = 1, kp.n_ctx = 4, kp.n_head_kv = 1, kp.head_dim_k = kp.head_dim_v = 4;
    kp.n_batch_max = (int64_t)1 << 62;
    c = NULL;
    CHECK_OK(tsr_kv_cache_new(be, &kp, &c));
    if (c) {
        const int32_t p2[2] = {0, 1}, p4[4] = {2, 3, 4, 5};
        tsr_context *x = tsr_context_new(be);
        CHECK_OK(tsr_kv_cache_begin(c, x, 2, p2, NULL));
        ERR(tsr_kv_cache_begin(c, x, 4, p4, NULL), TSR_E_FULL);
        ERR(tsr_kv_cache_begin(c, x, ((int64_t)1 << 62) - 1, NULL, NULL), TSR_E_FULL);
        ERR(tsr_kv_cache_begin_again(c, x, ((int64_t)1 << 62) - 1, NULL, NULL), ANY);
        VAL(tsr_kv_cache_used(c), 2);
        tsr_context_close(x);
        tsr_kv_cache_free(c);
    }
}

static void c_kv_use(void) {
    const int32_t pos[2] = {0, 1}, neg_pos[2] = {0, -5}, bad_seq[2] = {0, 3}, neg_seq[2] = {-1, 0};
    fresh();
    ERR(tsr_kv_cache_begin(NULL, ctx, 2, pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin(cache, NULL, 2, pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin(cache, ctx, -2, pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin(cache, ctx, 5, NULL, NULL), TSR_E_RANGE); /* > n_batch_max */
    ERR(tsr_kv_cache_begin(cache, ctx, INT64_MAX, NULL, NULL), TSR_E_RANGE);
    ERR(tsr_kv_cache_begin(cache, ctx, 2, neg_pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin(cache, ctx, 2, pos, bad_seq), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin(cache, ctx, 2, pos, neg_seq), TSR_E_INVALID);
    VAL(tsr_kv_cache_used(cache), 0); /* nothing changed */
    ERR(tsr_kv_cache_begin_again(NULL, ctx, 2, pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin_again(cache, NULL, 2, pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin_again(cache, ctx, 2, pos, NULL), TSR_E_STATE); /* no begin in ctx */
    ERR(tsr_kv_cache_begin_again(cache, ctx, -2, pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin_again(cache, ctx, INT64_MAX, NULL, NULL), TSR_E_RANGE);
    ERR(tsr_kv_cache_begin_again(cache, ctx, 2, neg_pos, NULL), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin_again(cache, ctx, 2, pos, bad_seq), TSR_E_INVALID);
    VAL(tsr_kv_cache_used(cache), 0);
    CHECK_OK(tsr_kv_cache_begin(cache, ctx, 2, pos, NULL));
    ERR(tsr_kv_cache_begin_again(cache, ctx, 1, pos, NULL), TSR_E_STATE); /* another batch size */
    ERR(tsr_kv_cache_begin_again(cache, ctx, 2, neg_pos, NULL), TSR_E_INVALID);
    VAL(tsr_kv_cache_used(cache), 2);
    tsr_backend *other = NULL; /* a context of another backend, perhaps with the id of this begin's */
    CHECK_OK(tsr_backend_new(NULL, &other));
    tsr_context *octx = other ? tsr_context_new(other) : NULL;
    if (octx)
        ERR(tsr_kv_cache_begin_again(cache, octx, 2, pos, NULL), TSR_E_INVALID);
    tsr_context_close(octx);
    tsr_backend_free(other);
    VAL(tsr_kv_cache_used(cache), 2);
    tsr_kv_cache_clear(cache);
    CHECK_OK(tsr_kv_cache_begin(cache, ctx, 0, pos, NULL)); /* an empty batch, again */
    CHECK_OK(tsr_kv_cache_begin_again(cache, ctx, 0, pos, NULL));
    VAL(tsr_kv_cache_used(cache), 0);
    ERR(tsr_kv_cache_begin_reserve(NULL, ctx, 2), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin_reserve(cache, NULL, 2), TSR_E_INVALID);
    ERR(tsr_kv_cache_begin_reserve(cache, ctx, -1), TSR_E_RANGE);
    ERR(tsr_kv_cache_begin_reserve(cache, ctx, 99), TSR_E_RANGE);
    tsr_kv_cache_clear(NULL);
    ERR(tsr_kv_cache_remove(NULL, 0, 0, -1), TSR_E_INVALID);
    ERR(tsr_kv_cache_remove(cache, 5, 0, -1), TSR_E_INVALID);
    ERR(tsr_kv_cache_remove(cache, -2, 0, -1), TSR_E_INVALID);
    VAL(tsr_kv_cache_used(NULL), 0);
    VAL(tsr_kv_cache_n_ctx(NULL), 0);
    VAL(tsr_kv_cache_seq_pos_max(NULL, 0), -1);
    VAL(tsr_kv_cache_seq_pos_max(cache, 99), -1);
    VAL(tsr_kv_cache_mask(NULL), NULL);
    ctx_close();
}

static void c_attention(void) {
    const int32_t pos[3] = {0, 1, 2};
    fresh();
    CHECK_OK(tsr_kv_cache_begin(cache, ctx, 3, pos, NULL));
    NUL(tsr_attention(NULL, cache, 0, Q, K, K, 1.0f));
    tsr_clear_error();
    bad_op_(__FILE__, __LINE__, "tsr_attention(ctx, NULL, ...)", tsr_attention(ctx, NULL, 0, Q, K, K, 1.0f));
    OP(tsr_attention(ctx, cache, 0, Q, K, K, 1.0f)); /* no begin in this context */
    const int32_t p3[3] = {0, 1, 2};
    for (int il = -1; il <= 1; il += 2) { /* layers -1 and 1 of a one-layer cache */
        fresh();
        tsr_kv_cache_clear(cache);
        CHECK_OK(tsr_kv_cache_begin(cache, ctx, 3, p3, NULL));
        tsr_clear_error();
        bad_op_(__FILE__, __LINE__, "tsr_attention(ctx, cache, il, ...)", tsr_attention(ctx, cache, il, Q, K, K, 1.0f));
    }
    fresh();
    tsr_kv_cache_clear(cache);
    CHECK_OK(tsr_kv_cache_begin(cache, ctx, 3, p3, NULL));
    tsr_clear_error();
    bad_op_(__FILE__, __LINE__, "tsr_attention(ctx, cache, 0, Q, A, ...)", tsr_attention(ctx, cache, 0, Q, A, K, 1.0f));
    fresh();
    tsr_kv_cache_clear(cache);
    CHECK_OK(tsr_kv_cache_begin(cache, ctx, 2, p3, NULL)); /* 2 tokens, q has 3 */
    tsr_clear_error();
    bad_op_(__FILE__, __LINE__, "tsr_attention(2-token batch, 3-token q)", tsr_attention(ctx, cache, 0, Q, K, K, 1.0f));
    tsr_kv_cache_clear(cache);
    ctx_close();
}

/* ---- GGUF ----------------------------------------------------------------------- */

static void c_gguf_open(void) {
    tsr_gguf *g = (tsr_gguf *)&g;
    static const uint8_t junk[16] = "GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\x7f";
    ERR(tsr_gguf_open(NULL, &g), TSR_E_INVALID);
    ERR(tsr_gguf_open(model_path, NULL), TSR_E_INVALID);
    ERR(tsr_gguf_open("/nonexistent/x.gguf", &g), TSR_E_IO);
    CHECK(g == NULL);
    ERR(tsr_gguf_open("/", &g), ANY); /* a directory */
    ERR(tsr_gguf_open_memory(NULL, 16, "x", 0, &g), TSR_E_INVALID);
    ERR(tsr_gguf_open_memory(junk, sizeof junk, NULL, 0, NULL), TSR_E_INVALID);
    ERR(tsr_gguf_open_memory(junk, 0, NULL, 0, &g), TSR_E_MALFORMED);
    ERR(tsr_gguf_open_memory(junk, sizeof junk, NULL, 1, &g), TSR_E_MALFORMED);
    ERR(tsr_gguf_open_memory("nope, not a gguf", 16, "x", 0, &g), TSR_E_MALFORMED);
    tsr_gguf_close(NULL);
}

static void c_gguf_get(void) {
    uint32_t u32;
    int32_t i32;
    uint64_t u64, n;
    int64_t i64;
    float f32;
    double f64;
    int b;
    const char *s;
    size_t len;
    const void *data;
    tsr_gguf_type et;
    char buf[64];
    VAL(tsr_gguf_version(NULL), 0);
    VAL(tsr_gguf_n_tensors(NULL), -1);
    VAL(tsr_gguf_n_keys(NULL), -1);
    VAL(tsr_gguf_alignment(NULL), 0);
    VAL(tsr_gguf_data_offset(NULL), 0);
    VAL(tsr_gguf_path(NULL), NULL);
    VAL(tsr_gguf_find_key(NULL, "k.u32"), -1);
    VAL(tsr_gguf_find_key(gg, NULL), -1);
    VAL(tsr_gguf_find_key(gg, "no.such.key"), -1);
    VAL(tsr_gguf_key_name(NULL, 0), NULL);
    VAL(tsr_gguf_key_name(gg, -1), NULL);
    VAL(tsr_gguf_key_name(gg, 1000), NULL);
    VAL((int)tsr_gguf_key_type(gg, -1), -1);
    VAL((int)tsr_gguf_key_type(NULL, 0), -1);
    ERR(tsr_gguf_get_u32(NULL, "k.u32", &u32), TSR_E_INVALID);
    ERR(tsr_gguf_get_u32(gg, NULL, &u32), TSR_E_INVALID);
    ERR(tsr_gguf_get_u32(gg, "k.u32", NULL), TSR_E_INVALID);
    ERR(tsr_gguf_get_u32(gg, "no.such.key", &u32), TSR_E_NOT_FOUND);
    ERR(tsr_gguf_get_u32(gg, "k.str", &u32), TSR_E_TYPE);
    ERR(tsr_gguf_get_i32(gg, "k.str", &i32), TSR_E_TYPE);
    ERR(tsr_gguf_get_i32(NULL, "k.u32", &i32), TSR_E_INVALID);
    ERR(tsr_gguf_get_u64(gg, "k.arr", &u64), TSR_E_TYPE);
    ERR(tsr_gguf_get_u64(gg, "k.u32", NULL), TSR_E_INVALID);
    ERR(tsr_gguf_get_i64(gg, "no.such.key", &i64), TSR_E_NOT_FOUND);
    ERR(tsr_gguf_get_i64(gg, "k.str", &i64), TSR_E_TYPE);
    ERR(tsr_gguf_get_f32(gg, "k.str", &f32), TSR_E_TYPE);
    ERR(tsr_gguf_get_f32(gg, NULL, &f32), TSR_E_INVALID);
    ERR(tsr_gguf_get_f64(gg, "k.str", &f64), TSR_E_TYPE);
    ERR(tsr_gguf_get_f64(gg, "k.u32", NULL), TSR_E_INVALID);
    ERR(tsr_gguf_get_bool(gg, "k.u32", &b), TSR_E_TYPE);
    ERR(tsr_gguf_get_bool(NULL, "k.u32", &b), TSR_E_INVALID);
    ERR(tsr_gguf_get_str(gg, "k.u32", &s, &len), TSR_E_TYPE);
    ERR(tsr_gguf_get_str(gg, "k.str", NULL, &len), TSR_E_INVALID);
    ERR(tsr_gguf_get_str(gg, "no.such.key", &s, NULL), TSR_E_NOT_FOUND);
    ERR(tsr_gguf_get_arr_info(gg, "k.u32", &et, &n), TSR_E_TYPE);
    ERR(tsr_gguf_get_arr_info(gg, "k.arr", NULL, NULL), TSR_E_INVALID);
    ERR(tsr_gguf_get_arr_info(NULL, "k.arr", &et, &n), TSR_E_INVALID);
    ERR(tsr_gguf_get_arr_data(gg, "k.strs", &data), TSR_E_TYPE); /* strings have no raw data */
    ERR(tsr_gguf_get_arr_data(gg, "k.arr", NULL), TSR_E_INVALID);
    ERR(tsr_gguf_get_arr_data(gg, "no.such.key", &data), TSR_E_NOT_FOUND);
    ERR(tsr_gguf_get_arr_str(gg, "k.strs", 2, &s, &len), TSR_E_RANGE);
    ERR(tsr_gguf_get_arr_str(gg, "k.strs", UINT64_MAX, &s, &len), TSR_E_RANGE);
    ERR(tsr_gguf_get_arr_str(gg, "k.arr", 0, &s, &len), TSR_E_TYPE);
    ERR(tsr_gguf_get_arr_str(gg, "k.strs", 0, NULL, &len), TSR_E_INVALID);
    ERR(tsr_gguf_get_raw(gg, -1, &data, &len), TSR_E_RANGE);
    ERR(tsr_gguf_get_raw(gg, 1000, &data, &len), TSR_E_RANGE);
    ERR(tsr_gguf_get_raw(gg, 0, NULL, &len), TSR_E_INVALID);
    ERR(tsr_gguf_get_raw(NULL, 0, &data, &len), TSR_E_INVALID);
    ERR(tsr_gguf_get_raw(gg, tsr_gguf_find_key(gg, "k.arr"), &data, &len), TSR_E_TYPE); /* not a scalar */
    VAL(tsr_gguf_find_tensor(NULL, "t"), -1);
    VAL(tsr_gguf_find_tensor(gg, NULL), -1);
    VAL(tsr_gguf_find_tensor(gg, "nope"), -1);
    VAL(tsr_gguf_tensor_name(gg, 1), NULL);
    VAL(tsr_gguf_tensor_name(NULL, 0), NULL);
    VAL((int)tsr_gguf_tensor_type(gg, -1), -1);
    VAL(tsr_gguf_tensor_n_dims(gg, 5), -1);
    VAL(tsr_gguf_tensor_ne(gg, 0, -1), -1);
    VAL(tsr_gguf_tensor_ne(gg, 0, 7), 1);
    VAL(tsr_gguf_tensor_ne(NULL, 0, 0), -1);
    VAL(tsr_gguf_tensor_offset(gg, 3), 0);
    VAL(tsr_gguf_tensor_size(gg, INT64_MIN), 0);
    ERR(tsr_gguf_read_tensor(gg, 1, buf, sizeof buf), TSR_E_RANGE);
    ERR(tsr_gguf_read_tensor(NULL, 0, buf, sizeof buf), TSR_E_INVALID);
    ERR(tsr_gguf_read_tensor(gg, 0, NULL, 32), TSR_E_INVALID);
    ERR(tsr_gguf_read_tensor(gg, 0, buf, 4), TSR_E_RANGE); /* smaller than the tensor */
}

static void c_gguf_writer(void) {
    tsr_gguf_writer *w = NULL;
    uint32_t one = 1;
    int8_t two = 2;
    const int64_t ne[2] = {4, 2}, neg[2] = {4, -2};
    const float data[8] = {0};
    const char *strs[2] = {"a", NULL};
    void *mem = (void *)&mem;
    size_t size = 0;
    ERR(tsr_gguf_writer_new(NULL), TSR_E_INVALID);
    CHECK_OK(tsr_gguf_writer_new(&w));
    ERR(tsr_gguf_writer_set_alignment(NULL, 32), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_alignment(w, 0), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_alignment(w, 48), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_alignment(w, SIZE_MAX), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set(NULL, "k", TSR_GGUF_UINT32, &one), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set(w, NULL, TSR_GGUF_UINT32, &one), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set(w, "k", TSR_GGUF_UINT32, NULL), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set(w, "k", TSR_GGUF_ARRAY, &one), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set(w, "k", (tsr_gguf_type)99, &one), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set(w, "k", TSR_GGUF_BOOL, &two), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set(w, "", TSR_GGUF_UINT32, &one), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_str(NULL, "k", "v"), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_str(w, "k", NULL), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_str(w, NULL, "v"), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr(w, "k", TSR_GGUF_INT32, NULL, 3), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr(w, "k", TSR_GGUF_STRING, data, 1), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr(w, "k", (tsr_gguf_type)-1, data, 1), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr(w, "k", TSR_GGUF_INT32, data, UINT64_MAX), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr(NULL, "k", TSR_GGUF_INT32, data, 1), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr_str(w, "k", strs, 2), TSR_E_INVALID); /* a NULL string */
    ERR(tsr_gguf_writer_set_arr_str(w, "k", NULL, 2), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr_str(w, "k", strs, UINT64_MAX), TSR_E_INVALID);
    ERR(tsr_gguf_writer_set_arr_str(NULL, "k", strs, 1), TSR_E_INVALID);
    ERR(tsr_gguf_writer_copy_keys(NULL, gg), TSR_E_INVALID);
    ERR(tsr_gguf_writer_copy_keys(w, NULL), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(NULL, "t", TSR_TYPE_F32, 2, ne, data), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(w, NULL, TSR_TYPE_F32, 2, ne, data), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 2, NULL, data), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 0, ne, data), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 5, ne, data), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 2, neg, data), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(w, "t", (tsr_type)4, 2, ne, data), TSR_E_INVALID);
    ERR(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_Q4_0, 2, ne, data), TSR_E_INVALID);
    CHECK_OK(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 2, ne, data));
    ERR(tsr_gguf_writer_add_tensor(w, "t", TSR_TYPE_F32, 2, ne, data), TSR_E_INVALID); /* duplicate */
    ERR(tsr_gguf_writer_write_file(NULL, "/tmp/x.gguf"), TSR_E_INVALID);
    ERR(tsr_gguf_writer_write_file(w, NULL), TSR_E_INVALID);
    ERR(tsr_gguf_writer_write_file(w, "/nonexistent/dir/x.gguf"), TSR_E_IO);
    ERR(tsr_gguf_writer_write_memory(NULL, &mem, &size), TSR_E_INVALID);
    ERR(tsr_gguf_writer_write_memory(w, NULL, &size), TSR_E_INVALID);
    ERR(tsr_gguf_writer_write_memory(w, &mem, NULL), TSR_E_INVALID);
    tsr_gguf_writer_free(w);
    tsr_gguf_writer_free(NULL);
    tsr_free(NULL);
}

/* ---- the model layer -------------------------------------------------------------- */

static void c_model_load(void) {
    tsr_model *m = (tsr_model *)&m;
    tsr_backend *b = new_backend();
    tsr_load_params lp;
    ERR(tsr_model_load(NULL, model_path, NULL, &m), TSR_E_INVALID);
    CHECK(m == NULL);
    ERR(tsr_model_load(b, NULL, NULL, &m), TSR_E_INVALID);
    ERR(tsr_model_load(b, model_path, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_model_load(b, "/nonexistent/x.gguf", NULL, &m), TSR_E_IO);
    ERR(tsr_model_load(mbe, model_path, NULL, &m), TSR_E_STATE);
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_io_threads = -2;
    ERR(tsr_model_load(b, model_path, &lp, &m), TSR_E_INVALID);
    CHECK_EQ_INT(tsr_backend_n_weights(b), 0); /* nothing stays after a failure */
    tsr_model_free(NULL);
    tsr_backend_free(b);
}

static void c_model_get(void) {
    VAL(tsr_model_arch(NULL), NULL);
    VAL(tsr_model_n_vocab(NULL), 0);
    VAL(tsr_model_n_ctx_train(NULL), 0);
    VAL(tsr_model_token_bos(NULL), -1);
    VAL(tsr_model_token_eos(NULL), -1);
    VAL(tsr_model_token_is_eog(NULL, 2), 0);
    VAL(tsr_model_token_is_eog(model, -1), 0);
    VAL(tsr_model_token_is_eog(model, INT32_MAX), 0);
}

static void c_tokenize(void) {
    int32_t toks[64];
    size_t n = 0, len = 0;
    char buf[256];
    const int32_t bad[2] = {1, 100000}, neg[1] = {-1};
    const char bad_utf8[] = "caf\xc3 \xff\xfe\xe2\x82 ok \xed\xa0\x80 \xf4\x90\x80\x80";
    int32_t nv = tsr_model_n_vocab(model);
    ERR(tsr_model_tokenize(NULL, "hi", 2, 0, toks, 64, &n), TSR_E_INVALID);
    ERR(tsr_model_tokenize(model, NULL, 2, 0, toks, 64, &n), TSR_E_INVALID);
    ERR(tsr_model_tokenize(model, "hi", 2, 0, NULL, 64, &n), TSR_E_INVALID);
    ERR(tsr_model_tokenize(model, "hi", 2, 0, toks, 64, NULL), TSR_E_INVALID);
    ERR(tsr_model_tokenize(model, "hi", 2, 0x80, toks, 64, &n), TSR_E_INVALID);
    ERR(tsr_model_tokenize(model, "hello world", 11, 0, toks, 1, &n), TSR_E_RANGE);
    CHECK(n > 1, "the count is given when the buffer is too small: %zu", n);
    /* invalid UTF-8 is tokenized as bytes (byte fallback), as llama.cpp does */
    CHECK_OK(tsr_model_tokenize(model, bad_utf8, sizeof bad_utf8 - 1, 0, toks, 64, &n));
    CHECK_OK(tsr_model_detokenize(model, toks, n, 0, buf, sizeof buf, &len));
    /* (as in llama.cpp, a stray lead byte swallows the next byte, here the
     * space, which then comes back as its bytes: not a strict round trip) */
    CHECK(len > 4 && memmem(buf, len, "\xff\xfe", 2) && memmem(buf, len, " ok ", 4), "bytes back: %zu", len);
    ERR(tsr_model_token_piece(NULL, 5, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_token_piece(model, -1, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_token_piece(model, nv, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_token_piece(model, INT32_MIN, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_token_piece(model, 5, 0, NULL, 4, &len), TSR_E_INVALID);
    ERR(tsr_model_token_piece(model, 5, 0, buf, sizeof buf, NULL), TSR_E_INVALID);
    ERR(tsr_model_detokenize(NULL, bad, 1, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_detokenize(model, bad, 2, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_detokenize(model, neg, 1, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_detokenize(model, NULL, 1, 0, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_detokenize(model, bad, 1, 0, NULL, 4, &len), TSR_E_INVALID);
    ERR(tsr_model_detokenize(model, bad, 1, 0, buf, sizeof buf, NULL), TSR_E_INVALID);
    ERR(tsr_model_detokenize(model, toks, n, 0, buf, 2, &len), TSR_E_RANGE);
}

static void c_chat(void) {
    char buf[512];
    size_t len = 0;
    tsr_chat_message msgs[2] = {{"user", "hi"}, {"assistant", "\xff\xfe bad \xc3 utf-8"}};
    tsr_chat_message null_role[1] = {{NULL, "hi"}}, null_content[1] = {{"user", NULL}};
    ERR(tsr_model_chat_format(NULL, msgs, 1, 1, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_chat_format(model, NULL, 1, 1, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_chat_format(model, msgs, 1, 1, NULL, 8, &len), TSR_E_INVALID);
    ERR(tsr_model_chat_format(model, msgs, 1, 1, buf, sizeof buf, NULL), TSR_E_INVALID);
    ERR(tsr_model_chat_format(model, null_role, 1, 1, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_chat_format(model, null_content, 1, 1, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_model_chat_format(model, msgs, 2, 1, buf, 4, &len), TSR_E_RANGE);
    /* invalid UTF-8 in a message is copied as it is (the template adds
     * nothing to it and the tokenizer takes bytes) */
    CHECK_OK(tsr_model_chat_format(model, msgs, 2, 1, buf, sizeof buf, &len));
    CHECK(strstr(buf, msgs[1].content) != NULL);
}

static void c_session_new(void) {
    tsr_session_params sp;
    tsr_session *s = (tsr_session *)&s;
    tsr_session_params_init(NULL, sizeof sp);
    tsr_session_params_init(&sp, 3);
    tsr_session_params_init(&sp, sizeof sp);
    ERR(tsr_session_new(NULL, &sp, &s), TSR_E_INVALID);
    CHECK(s == NULL);
    ERR(tsr_session_new(model, &sp, NULL), TSR_E_INVALID);
    sp.n_ctx = -1;
    ERR(tsr_session_new(model, &sp, &s), TSR_E_INVALID);
    sp.n_ctx = INT64_MAX;
    ERR(tsr_session_new(model, &sp, &s), TSR_E_INVALID);
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_seq_max = -4;
    ERR(tsr_session_new(model, &sp, &s), TSR_E_INVALID);
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_batch = -1;
    ERR(tsr_session_new(model, &sp, &s), TSR_E_INVALID);
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ubatch = -512;
    ERR(tsr_session_new(model, &sp, &s), TSR_E_INVALID);
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_outputs_max = -2;
    ERR(tsr_session_new(model, &sp, &s), TSR_E_INVALID);
    tsr_session_params_init(&sp, sizeof sp);
    sp.type_k = (tsr_type)4;
    ERR(tsr_session_new(model, &sp, &s), ANY);
    tsr_session_params_init(&sp, sizeof sp);
    sp.type_v = TSR_TYPE_I32;
    ERR(tsr_session_new(model, &sp, &s), ANY);
    tsr_session_free(NULL);
}

static void c_session_use(void) {
    tsr_session_params sp;
    tsr_session *s = NULL;
    const int32_t toks[2] = {5, 6}, bad_tok[2] = {5, 100000}, neg_tok[2] = {-1, 5}, pos[2] = {0, 1},
                  neg_pos[2] = {0, -3}, bad_seq[2] = {0, 2}, neg_seq[2] = {0, -1};
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 8;
    sp.n_batch = 4;
    sp.n_seq_max = 2;
    CHECK_OK(tsr_session_new(model, &sp, &s));
    if (!s)
        return;
    ERR(tsr_session_decode(NULL, 2, toks, NULL, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_session_decode(s, 2, NULL, NULL, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_session_decode(s, 2, bad_tok, NULL, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_session_decode(s, 2, neg_tok, NULL, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_session_decode(s, 2, toks, neg_pos, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_session_decode(s, 2, toks, pos, bad_seq, NULL), TSR_E_INVALID);
    ERR(tsr_session_decode(s, 2, toks, pos, neg_seq, NULL), TSR_E_INVALID);
    ERR(tsr_session_decode(s, 5, toks, NULL, NULL, NULL), TSR_E_INVALID);     /* > n_batch */
    ERR(tsr_session_decode(s, SIZE_MAX, toks, NULL, NULL, NULL), TSR_E_FULL); /* more than the cells: full first */
    VAL(tsr_session_n_past(s, 0), 0);                                         /* nothing changed */
    CHECK_OK(tsr_session_decode(s, 2, toks, pos, NULL, NULL));
    for (int i = 0; i < 3; i++) /* 8 cells: 2 + 4 + 2 fill it, then full */
        if (i < 2)
            CHECK_OK(tsr_session_decode(s, i ? 2 : 4, (const int32_t[]){5, 6, 7, 8}, NULL, NULL, NULL));
    ERR(tsr_session_decode(s, 1, toks, NULL, NULL, NULL), TSR_E_FULL);
    VAL(tsr_session_logits(NULL, 0), NULL);
    VAL(tsr_session_logits(s, 99), NULL);
    VAL(tsr_session_logits(s, SIZE_MAX), NULL);
    ERR(tsr_session_remove(NULL, 0, 0, -1), TSR_E_INVALID);
    ERR(tsr_session_remove(s, 2, 0, -1), TSR_E_INVALID);
    ERR(tsr_session_remove(s, -2, 0, -1), TSR_E_INVALID);
    VAL(tsr_session_n_past(NULL, 0), -1);
    VAL(tsr_session_n_past(s, 2), -1);
    VAL(tsr_session_n_past(s, -1), -1);
    VAL(tsr_session_n_ctx(NULL), 0);
    tsr_session_free(s);
}

/* Sequences copied, saved and loaded, in the session and the cache. */
static void c_session_seq(void) {
    tsr_session_params sp;
    tsr_session *s = NULL;
    const int32_t toks[2] = {5, 6};
    char junk[64] = {0};
    size_t size = 0;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 8;
    sp.n_seq_max = 2;
    CHECK_OK(tsr_session_new(model, &sp, &s));
    if (!s)
        return;
    CHECK_OK(tsr_session_decode(s, 2, toks, NULL, NULL, NULL));
    ERR(tsr_session_seq_copy(NULL, 0, 1, 0, -1), TSR_E_INVALID);
    ERR(tsr_session_seq_copy(s, 0, 2, 0, -1), TSR_E_INVALID);
    ERR(tsr_session_seq_copy(s, -1, 1, 0, -1), TSR_E_INVALID);
    ERR(tsr_session_seq_save(NULL, 0, NULL, 0, &size), TSR_E_INVALID);
    ERR(tsr_session_seq_save(s, 0, NULL, 0, NULL), TSR_E_INVALID);
    ERR(tsr_session_seq_save(s, 0, NULL, 16, &size), TSR_E_INVALID);
    ERR(tsr_session_seq_save(s, 5, junk, sizeof junk, &size), TSR_E_INVALID);
    ERR(tsr_session_seq_save(s, 0, junk, 4, &size), TSR_E_RANGE);
    ERR(tsr_session_seq_load(NULL, 0, junk, sizeof junk), TSR_E_INVALID);
    ERR(tsr_session_seq_load(s, 0, NULL, 8), TSR_E_INVALID);
    ERR(tsr_session_seq_load(s, 2, junk, sizeof junk), TSR_E_INVALID);
    ERR(tsr_session_seq_load(s, 0, junk, sizeof junk), TSR_E_MALFORMED);
    ERR(tsr_session_seq_load(s, 0, junk, 3), TSR_E_MALFORMED);
    VAL(tsr_session_n_past(s, 0), 2); /* nothing changed */
    ERR(tsr_kv_cache_seq_copy(NULL, 0, 0, 0, -1), TSR_E_INVALID);
    ERR(tsr_kv_cache_seq_copy(cache, 0, 7, 0, -1), TSR_E_INVALID);
    ERR(tsr_kv_cache_seq_save(NULL, 0, NULL, 0, &size), TSR_E_INVALID);
    ERR(tsr_kv_cache_seq_save(cache, -1, NULL, 0, &size), TSR_E_INVALID);
    ERR(tsr_kv_cache_seq_load(NULL, 0, junk, sizeof junk), TSR_E_INVALID);
    ERR(tsr_kv_cache_seq_load(cache, 9, junk, sizeof junk), TSR_E_INVALID);
    ERR(tsr_kv_cache_seq_load(cache, 0, junk, sizeof junk), TSR_E_MALFORMED);
    tsr_session_free(s);
}

static void c_sampler_logprobs(void) {
    tsr_sampler *smp = NULL;
    float *logits = calloc((size_t)tsr_model_n_vocab(model), sizeof *logits), lp = 0;
    int32_t top[2];
    CHECK_OK(tsr_sampler_new(model, NULL, &smp));
    ERR(tsr_sampler_logprobs(NULL, logits, 0, &lp, 0, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_sampler_logprobs(smp, NULL, 0, &lp, 0, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_sampler_logprobs(smp, logits, tsr_model_n_vocab(model), &lp, 0, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_sampler_logprobs(smp, logits, -2, &lp, 0, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_sampler_logprobs(smp, logits, 0, &lp, 2, top, NULL), TSR_E_INVALID);
    tsr_sampler_free(smp);
    free(logits);
}

static void c_fit(void) {
    tsr_fit_params fp;
    tsr_fit_result r;
    tsr_fit_params_init(NULL, sizeof fp); /* ignored */
    tsr_fit_params_init(&fp, 0);          /* ignored: smaller than the size field */
    tsr_fit_params_init(&fp, sizeof fp);
    memset(&r, 0, sizeof r);
    r.size = sizeof r;
    ERR(tsr_fit(NULL, NULL, NULL, NULL, &fp, &r), TSR_E_INVALID);
    ERR(tsr_fit("x.gguf", NULL, NULL, NULL, &fp, NULL), TSR_E_INVALID);
    r.size = 0; /* not set by the caller */
    ERR(tsr_fit("x.gguf", NULL, NULL, NULL, &fp, &r), TSR_E_INVALID);
    r.size = sizeof r;
    fp.size = 3;
    ERR(tsr_fit("x.gguf", NULL, NULL, NULL, &fp, &r), TSR_E_INVALID);
    tsr_fit_params_init(&fp, sizeof fp);
    fp.n_ctx_min = -1;
    ERR(tsr_fit("/nonexistent/x.gguf", NULL, NULL, NULL, &fp, &r), TSR_E_INVALID);
    fp.n_ctx_min = 4096;
    fp.n_margins = 2; /* without margins */
    ERR(tsr_fit("/nonexistent/x.gguf", NULL, NULL, NULL, &fp, &r), TSR_E_INVALID);
    ERR(tsr_fit("/nonexistent/x.gguf", NULL, NULL, NULL, NULL, &r), TSR_E_IO);
    CHECK(strstr(tsr_last_error(), "/nonexistent/x.gguf") != NULL, "the error names the file: %s", tsr_last_error());
    tsr_fit_result_free(&r); /* after a failure: nothing to free */
    tsr_fit_result_free(NULL);
    size_t len = 0;
    char buf[8];
    ERR(tsr_fit_result_flags(NULL, buf, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_fit_result_flags(&r, NULL, sizeof buf, &len), TSR_E_INVALID);
    ERR(tsr_fit_result_flags(&r, buf, sizeof buf, NULL), TSR_E_INVALID);
    ERR(tsr_fit_result_flags(&r, buf, sizeof buf, &len), TSR_E_RANGE); /* "-ngl 0 -c 0" */
    CHECK(len == strlen("-ngl 0 -c 0"), "len %zu", len);
    ERR(tsr_fit_result_flags(&r, NULL, 0, &len), TSR_E_RANGE);
}

static void c_batcher(void) {
    tsr_batcher_params bp;
    tsr_batcher *b = NULL;
    tsr_batcher_params_init(NULL, sizeof bp);
    tsr_request_params_init(NULL, 64);
    ERR(tsr_batcher_new(NULL, NULL, &b), TSR_E_INVALID);
    ERR(tsr_batcher_new(model, NULL, NULL), TSR_E_INVALID);
    const int64_t bad[4][4] = {{0, 16, 8, 0}, {2, 1, 8, 0}, {4, 16, 2, 0}, {2, 16, 8, -1}};
    for (int i = 0; i < 4; i++) {
        tsr_batcher_params_init(&bp, sizeof bp);
        bp.n_slots = (int32_t)bad[i][0];
        bp.n_ctx_slot = bad[i][1];
        bp.n_batch = bad[i][2];
        bp.n_queue_max = bad[i][3];
        ERR(tsr_batcher_new(model, &bp, &b), TSR_E_INVALID);
        VAL(b, NULL);
    }
    tsr_batcher_params_init(&bp, sizeof bp);
    bp.n_slots = 2;
    bp.n_ctx_slot = 16;
    bp.n_batch = 8;
    CHECK_OK(tsr_batcher_new(model, &bp, &b));
    if (!b)
        return;
    tsr_request_params rp;
    uint64_t id = 0;
    size_t n = 0;
    char buf[4];
    const int32_t toks[3] = {5, 6, 7}, bad_tok[1] = {100000}, long_toks[16] = {0};
    const char *stops[1] = {""};
    tsr_request_params_init(&rp, sizeof rp);
    ERR(tsr_batcher_submit(NULL, &rp, &id), TSR_E_INVALID);
    ERR(tsr_batcher_submit(b, NULL, &id), TSR_E_INVALID);
    ERR(tsr_batcher_submit(b, &rp, NULL), TSR_E_INVALID);
    ERR(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID); /* no prompt */
    rp.tokens = toks;
    ERR(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID); /* empty */
    rp.tokens = bad_tok;
    rp.n_tokens = 1;
    ERR(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID);
    rp.tokens = long_toks;
    rp.n_tokens = 16;
    ERR(tsr_batcher_submit(b, &rp, &id), TSR_E_RANGE);
    rp.tokens = toks;
    rp.n_tokens = 3;
    rp.n_stop = 1;
    ERR(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID); /* NULL stop */
    rp.stop = stops;
    ERR(tsr_batcher_submit(b, &rp, &id), TSR_E_INVALID); /* empty stop */
    rp.n_stop = 0;
    ERR(tsr_batcher_cancel(NULL, 1), TSR_E_INVALID);
    ERR(tsr_batcher_cancel(b, 12345), TSR_E_NOT_FOUND);
    ERR(tsr_batcher_step(NULL, &n), TSR_E_INVALID);
    ERR(tsr_batcher_poll(NULL, 1, NULL, 0, &n, NULL), TSR_E_INVALID);
    ERR(tsr_batcher_poll(b, 1, NULL, 0, NULL, NULL), TSR_E_INVALID);
    ERR(tsr_batcher_poll(b, 1, NULL, 4, &n, NULL), TSR_E_INVALID);
    ERR(tsr_batcher_poll(b, 12345, NULL, 0, &n, NULL), TSR_E_NOT_FOUND);
    ERR(tsr_batcher_text(NULL, 1, buf, sizeof buf, &n), TSR_E_INVALID);
    ERR(tsr_batcher_text(b, 12345, buf, sizeof buf, &n), TSR_E_NOT_FOUND);
    ERR(tsr_batcher_release(NULL, 1), TSR_E_INVALID);
    ERR(tsr_batcher_release(b, 12345), TSR_E_NOT_FOUND);
    rp.max_tokens = 6;
    CHECK_OK(tsr_batcher_submit(b, &rp, &id));
    ERR(tsr_batcher_release(b, id), TSR_E_STATE); /* still running */
    n = 1;
    for (int i = 0; i < 50 && n; i++) CHECK_OK(tsr_batcher_step(b, &n));
    ERR(tsr_batcher_text(b, id, buf, 0, &n), TSR_E_RANGE);
    tsr_batcher_counts(NULL, NULL, NULL, NULL);
    tsr_batcher_counts(b, NULL, NULL, NULL);
    CHECK_OK(tsr_batcher_release(b, id));
    tsr_batcher_free(b);
    tsr_batcher_free(NULL);
}

/* A model freed while a session is open lives until the session closes. */
static void c_model_free_busy(void) {
    tsr_backend *b = new_backend();
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    const int32_t toks[2] = {5, 6};
    CHECK_OK(tsr_model_load(b, model_path, NULL, &m));
    CHECK_OK(tsr_session_new(m, NULL, &s));
    tsr_model_free(m);
    tsr_backend_free(b); /* deferred too: the session's cache holds it */
    CHECK_OK(tsr_session_decode(s, 2, toks, NULL, NULL, NULL));
    CHECK(tsr_session_logits(s, 1) != NULL);
    tsr_session_free(s); /* frees the model and the backend */
}

static void c_sampler(void) {
    tsr_sampler_params p;
    tsr_sampler *s = (tsr_sampler *)&s;
    float logits[512] = {0};
    tsr_sampler_params_init(NULL, sizeof p);
    tsr_sampler_params_init(&p, 1);
    tsr_sampler_params_init(&p, sizeof p);
    ERR(tsr_sampler_new(NULL, &p, &s), TSR_E_INVALID);
    CHECK(s == NULL);
    ERR(tsr_sampler_new(model, &p, NULL), TSR_E_INVALID);
    const struct {
        float temp, top_p, min_p, penalty;
        int32_t last_n;
    } bad[] = {
        {0.8f, 7.0f, 0.05f, 1.0f, 64},        {-1.0f, 0.9f, 0.05f, 1.0f, 64}, {0.8f, -0.1f, 0.05f, 1.0f, 64},
        {0.8f, 0.9f, 1.5f, 1.0f, 64},         {0.8f, 0.9f, -2.0f, 1.0f, 64},  {0.8f, 0.9f, 0.05f, 0.0f, 64},
        {0.8f, 0.9f, 0.05f, -1.0f, 64},       {0.8f, 0.9f, 0.05f, 1.0f, -2},  {NAN, 0.9f, 0.05f, 1.0f, 64},
        {INFINITY, 0.9f, 0.05f, 1.0f, 64},    {0.8f, NAN, 0.05f, 1.0f, 64},   {0.8f, 0.9f, 0.05f, INFINITY, 64},
        {0.8f, 0.9f, 0.05f, 1.0f, INT32_MAX},
    };
    for (size_t i = 0; i < FUZZ_N(bad); i++) {
        tsr_sampler_params_init(&p, sizeof p);
        p.temp = bad[i].temp, p.top_p = bad[i].top_p, p.min_p = bad[i].min_p;
        p.repeat_penalty = bad[i].penalty, p.repeat_last_n = bad[i].last_n;
        s = (tsr_sampler *)&s;
        ERR(tsr_sampler_new(model, &p, &s), TSR_E_INVALID);
        CHECK(s == NULL, "case %zu", i);
    }
    /* top_k beyond the vocabulary is the whole vocabulary; top_k <= 0 is off */
    tsr_sampler_params_init(&p, sizeof p);
    p.top_k = INT32_MAX;
    CHECK_OK(tsr_sampler_new(model, &p, &s));
    NEG(tsr_sampler_sample(NULL, logits));
    NEG(tsr_sampler_sample(s, NULL));
    ERR(tsr_sampler_accept(NULL, 3), TSR_E_INVALID);
    ERR(tsr_sampler_accept(s, -1), TSR_E_INVALID);
    ERR(tsr_sampler_accept(s, tsr_model_n_vocab(model)), TSR_E_INVALID);
    tsr_sampler_reset(NULL);
    tsr_sampler_free(s);
    tsr_sampler_free(NULL);
}

/* ---- the table and the coverage check ---------------------------------------------- */

static const struct bad_case {
    const char *names; /* the public functions the case calls with bad input */
    void (*fn)(void);
} cases[] = {
    {"tsr_version tsr_version_string", c_version},
    {"tsr_status_string tsr_last_error tsr_clear_error", c_status},
    {"tsr_log_set tsr_log_set_level tsr_log_get_level", c_log},
    {"tsr_type_name tsr_type_by_name tsr_type_block_size tsr_type_block_bytes tsr_type_is_quantized "
     "tsr_row_size tsr_quantize tsr_dequantize",
     c_types},
    {"tsr_fp32_to_fp16 tsr_fp16_to_fp32 tsr_fp32_to_bf16 tsr_bf16_to_fp32", c_half},
    {"tsr_device_count tsr_device_get tsr_device_by_name tsr_device_name tsr_device_description "
     "tsr_device_kind tsr_device_index_in_model tsr_device_memory tsr_device_buffer_type "
     "tsr_device_host_buffer_type tsr_backends_available",
     c_devices},
    {"tsr_buffer_type_by_name tsr_buffer_type_name tsr_buffer_type_device tsr_buffer_alloc tsr_buffer_free "
     "tsr_buffer_size tsr_buffer_get_type",
     c_buffers},
    {"tsr_buft_overrides_parse tsr_buft_overrides_free", c_overrides},
    {"tsr_backend_params_init tsr_backend_new tsr_backend_free", c_backend_params},
    {"tsr_backend_n_devices tsr_backend_device tsr_backend_n_threads tsr_backend_flash_attn "
     "tsr_backend_attn_max_batch tsr_backend_n_weights tsr_backend_weight_at tsr_backend_layer_buffer_type "
     "tsr_backend_n_layers tsr_backend_n_splits tsr_backend_n_copies tsr_backend_memory_plan tsr_backend_log_plan",
     c_backend_get},
    {"tsr_load_params_init tsr_backend_weight tsr_backend_weight_on tsr_backend_declare_weight "
     "tsr_backend_place_weights tsr_backend_load_gguf",
     c_backend_weights},
    {"tsr_backend_free", c_backend_free_busy},
    {"tsr_context_new tsr_context_close tsr_context_error tsr_context_status tsr_context_backend", c_context},
    {"tsr_input tsr_new_tensor tsr_empty", c_leaves},
    {"tsr_set_name tsr_tensor_name tsr_tensor_type tsr_tensor_n_dims tsr_tensor_ne tsr_tensor_nb "
     "tsr_tensor_nelements tsr_tensor_nbytes tsr_tensor_is_contiguous tsr_tensor_buffer_type tsr_tensor_device",
     c_tensor_get},
    {"tsr_tensor_read tsr_tensor_write", c_tensor_io},
    {"tsr_add tsr_sub tsr_mul tsr_div tsr_swiglu tsr_geglu", c_binary},
    {"tsr_scale tsr_silu tsr_gelu tsr_softmax tsr_rms_norm tsr_norm tsr_cont tsr_transpose tsr_argmax", c_unary},
    {"tsr_mul_mat", c_matmul},
    {"tsr_mul_mat_id tsr_top_k tsr_argsort tsr_sigmoid tsr_sum_rows", c_moe},
    {"tsr_get_rows tsr_set_rows", c_rows},
    {"tsr_rope tsr_rope_ext", c_rope},
    {"tsr_softmax_ext", c_softmax_ext},
    {"tsr_concat tsr_cpy tsr_cast", c_concat_cpy},
    {"tsr_view_1d tsr_view_2d tsr_view_3d tsr_view_4d tsr_reshape tsr_reshape_1d tsr_reshape_2d tsr_reshape_3d "
     "tsr_reshape_4d tsr_permute",
     c_views},
    {"tsr_flash_attn tsr_attention_nocache", c_flash},
    {"tsr_compute tsr_reserve tsr_measure", c_compute},
    {"tsr_kv_cache_params_init tsr_kv_cache_new tsr_kv_cache_free", c_kv_new},
    {"tsr_kv_cache_begin tsr_kv_cache_begin_again tsr_kv_cache_begin_reserve tsr_kv_cache_clear tsr_kv_cache_remove tsr_kv_cache_used "
     "tsr_kv_cache_n_ctx tsr_kv_cache_seq_pos_max tsr_kv_cache_mask",
     c_kv_use},
    {"tsr_attention", c_attention},
    {"tsr_gguf_open tsr_gguf_open_memory tsr_gguf_close", c_gguf_open},
    {"tsr_gguf_version tsr_gguf_n_tensors tsr_gguf_n_keys tsr_gguf_alignment tsr_gguf_data_offset tsr_gguf_path "
     "tsr_gguf_find_key tsr_gguf_key_name tsr_gguf_key_type tsr_gguf_get_u32 tsr_gguf_get_i32 tsr_gguf_get_u64 "
     "tsr_gguf_get_i64 tsr_gguf_get_f32 tsr_gguf_get_f64 tsr_gguf_get_bool tsr_gguf_get_str tsr_gguf_get_arr_info "
     "tsr_gguf_get_arr_data tsr_gguf_get_arr_str tsr_gguf_get_raw tsr_gguf_find_tensor tsr_gguf_tensor_name "
     "tsr_gguf_tensor_type tsr_gguf_tensor_n_dims tsr_gguf_tensor_ne tsr_gguf_tensor_offset tsr_gguf_tensor_size "
     "tsr_gguf_read_tensor",
     c_gguf_get},
    {"tsr_gguf_writer_new tsr_gguf_writer_free tsr_gguf_writer_set_alignment tsr_gguf_writer_set "
     "tsr_gguf_writer_set_str tsr_gguf_writer_set_arr tsr_gguf_writer_set_arr_str tsr_gguf_writer_copy_keys "
     "tsr_gguf_writer_add_tensor tsr_gguf_writer_write_file tsr_gguf_writer_write_memory tsr_free",
     c_gguf_writer},
    {"tsr_model_load tsr_model_free", c_model_load},
    {"tsr_model_arch tsr_model_n_vocab tsr_model_n_ctx_train tsr_model_token_bos tsr_model_token_eos "
     "tsr_model_token_is_eog",
     c_model_get},
    {"tsr_model_tokenize tsr_model_token_piece tsr_model_detokenize", c_tokenize},
    {"tsr_model_chat_format", c_chat},
    {"tsr_session_params_init tsr_session_new tsr_session_free", c_session_new},
    {"tsr_session_decode tsr_session_logits tsr_session_remove tsr_session_n_past tsr_session_n_ctx", c_session_use},
    {"tsr_session_seq_copy tsr_session_seq_save tsr_session_seq_load tsr_kv_cache_seq_copy tsr_kv_cache_seq_save "
     "tsr_kv_cache_seq_load",
     c_session_seq},
    {"tsr_sampler_logprobs", c_sampler_logprobs},
    {"tsr_batcher_params_init tsr_request_params_init tsr_batcher_new tsr_batcher_free tsr_batcher_submit "
     "tsr_batcher_cancel tsr_batcher_step tsr_batcher_poll tsr_batcher_text tsr_batcher_release tsr_batcher_counts",
     c_batcher},
    {"tsr_fit_params_init tsr_fit tsr_fit_result_free tsr_fit_result_flags", c_fit},
    {"tsr_model_free", c_model_free_busy},
    {"tsr_sampler_params_init tsr_sampler_new tsr_sampler_free tsr_sampler_sample tsr_sampler_reset "
     "tsr_sampler_accept",
     c_sampler},
};

/* name is one of the space-separated words of list */
static int listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ' ' || p[-1] == '\n') && (p[n] == '\0' || p[n] == ' ' || p[n] == '\n'))
            return 1;
    return 0;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *s = NULL;
    long size;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (s = calloc(1, (size_t)size + 1)) && fread(s, 1, (size_t)size, f) != (size_t)size) {
        free(s);
        s = NULL;
    }
    fclose(f);
    return s;
}

/* Every function of abi/libtensr.sym ("name@@NODE" lines) has a case or is
 * pending; every name of the table is exported. Returns the covered count. */
static int check_coverage(void) {
    const char *top = getenv("top_srcdir");
    char path[1024];
    int n_covered = 0, n_pending = 0;
    snprintf(path, sizeof path, "%s/abi/libtensr.sym", top && *top ? top : ".");
    char *sym = slurp(path);
    snprintf(path, sizeof path, "%s/tests/data/bad-input-pending.txt", top && *top ? top : ".");
    char *pending = slurp(path);
    CHECK(sym != NULL, "cannot read abi/libtensr.sym (top_srcdir %s)", top ? top : "unset");
    for (char *line = sym; line && *line;) {
        char *end = strchr(line, '\n'), *at = strstr(line, "@@");
        if (end)
            *end = '\0';
        if (at && (!end || at < end))
            *at = '\0';
        int found = 0;
        for (size_t i = 0; i < FUZZ_N(cases) && !found; i++) found = listed(cases[i].names, line);
        if (found) {
            n_covered++;
        } else if (pending && listed(pending, line)) {
            n_pending++;
            printf("note: %s has no bad-input case yet (tests/data/bad-input-pending.txt)\n", line);
        } else if (*line) {
            CHECK(0, "%s is exported but no case of test-bad-input.c calls it with bad input", line);
        }
        line = end ? end + 1 : NULL;
    }
    /* the table names exported functions only (a typo would hide a gap) */
    snprintf(path, sizeof path, "%s/abi/libtensr.sym", top && *top ? top : ".");
    char *sym2 = slurp(path);
    for (size_t i = 0; sym2 && i < FUZZ_N(cases); i++) {
        char names[2048], *save = NULL;
        snprintf(names, sizeof names, "%s", cases[i].names);
        for (char *w = strtok_r(names, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            char want[128];
            snprintf(want, sizeof want, "\n%s@@", w);
            CHECK(strstr(sym2, want) || strncmp(sym2, want + 1, strlen(want + 1)) == 0,
                  "case names %s, which abi/libtensr.sym does not export", w);
        }
    }
    printf("bad-input coverage: %d exported functions have cases, %d pending\n", n_covered, n_pending);
    free(sym);
    free(sym2);
    free(pending);
    return n_covered;
}

int main(void) {
    tsr_log_set_level(TSR_LOG_NONE); /* the warnings of bad calls are expected */
    fixtures_open();
    for (size_t i = 0; i < FUZZ_N(cases); i++) {
        int64_t live = tsr__alloc_live();
        int failures = tsrtest_failures;
        cases[i].fn();
        ctx_close();
        CHECK(tsr__alloc_live() == live, "case %s: %lld allocations leaked", cases[i].names,
              (long long)(tsr__alloc_live() - live));
        if (tsrtest_failures > failures)
            fprintf(stderr, "  (in the case of %s)\n", cases[i].names);
    }
    fixtures_close();
    check_coverage();
    return tsrtest_done("test-bad-input");
}
