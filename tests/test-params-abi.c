/*
 * test-params-abi.c - parameter structs are read only up to the caller's
 * `size`. Each *_params struct is filled as a caller compiled against an
 * older header would fill it (a smaller size, the later fields absent), with
 * garbage bytes (0xA5) where the newer fields would be. The _init function
 * must not write past the caller's size, and every consumer must use
 * defaults for the missing fields: reading the garbage would give absurd
 * values (negative thread counts, huge batch limits, plan_only on) that the
 * checks below would notice.
 *
 * Public API only: this is what an application linked to the shared
 * library sees.
 */
#include "libtensr.h"
#include "tsrtest.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GARBAGE 0xA5

/* Weak references for the parts of the API that land separately (KV cache,
 * GGUF): the test links and runs what exists, and says what it skipped.
 * tests/check-symbols.sh is what fails when a declared function is missing. */
#if defined(__GNUC__)
#pragma weak tsr_kv_cache_params_init
#pragma weak tsr_kv_cache_new
#pragma weak tsr_kv_cache_free
#pragma weak tsr_kv_cache_begin
#pragma weak tsr_kv_cache_clear
#pragma weak tsr_kv_cache_n_ctx
#pragma weak tsr_gguf_writer_new
#pragma weak tsr_gguf_writer_free
#pragma weak tsr_gguf_writer_set_str
#pragma weak tsr_gguf_writer_add_tensor
#pragma weak tsr_gguf_writer_write_file
#pragma weak tsr_backend_load_gguf
#define HAVE(fn) ((fn) != NULL)
#else
#define HAVE(fn) 1
#endif
static int skipped;
#define NEED(fn)                                                                \
    do {                                                                        \
        if (!HAVE(fn)) {                                                        \
            printf("skip: %s is not exported yet\n", #fn);                      \
            skipped++;                                                          \
            return;                                                             \
        }                                                                       \
    } while (0)

/* The bytes [from, to) of buf must still be garbage. */
static int untouched(const void *buf, size_t from, size_t to)
{
    const unsigned char *b = buf;
    for (size_t i = from; i < to; i++)
        if (b[i] != GARBAGE) return 0;
    return 1;
}

static tsr_backend *backend_old_params(void)
{
    union { tsr_backend_params p; unsigned char raw[sizeof(tsr_backend_params) + 32]; } u;
    const size_t old = offsetof(tsr_backend_params, flash_attn); /* size, devices, n_threads */
    memset(&u, GARBAGE, sizeof u);
    tsr_backend_params_init(&u.p, old);
    CHECK(u.p.size == old, "size recorded as %zu, expected %zu", u.p.size, old);
    CHECK(untouched(&u, old, sizeof u), "tsr_backend_params_init wrote past the caller's size");
    CHECK(u.p.devices == NULL && u.p.n_threads == 0, "defaults of the old fields");
    u.p.n_threads = 1;
    tsr_backend *be = NULL;
    tsr_status s = tsr_backend_new(&u.p, &be);
    CHECK(s == TSR_OK && be != NULL, "tsr_backend_new with an old-size struct: %s", tsr_status_string(s));
    if (!be) return NULL;
    CHECK(tsr_backend_n_threads(be) == 1, "n_threads %d", tsr_backend_n_threads(be));
    CHECK(tsr_backend_attn_max_batch(be) == 0, "attn_max_batch %zu, expected the default 0",
          tsr_backend_attn_max_batch(be));
    return be;
}

static void kv_cache_old_params(tsr_backend *be)
{
    NEED(tsr_kv_cache_new);
    union { tsr_kv_cache_params p; unsigned char raw[sizeof(tsr_kv_cache_params) + 32]; } u;
    const size_t old = offsetof(tsr_kv_cache_params, n_seq); /* without n_seq, n_batch_max */
    memset(&u, GARBAGE, sizeof u);
    tsr_kv_cache_params_init(&u.p, old);
    CHECK(u.p.size == old, "size recorded as %zu", u.p.size);
    CHECK(untouched(&u, old, sizeof u), "tsr_kv_cache_params_init wrote past the caller's size");
    u.p.n_layers = 1;
    u.p.n_ctx = 1024;
    u.p.n_head_kv = 1;
    u.p.head_dim_k = 8;
    u.p.head_dim_v = 8;
    u.p.type_k = TSR_TYPE_F16;
    u.p.type_v = TSR_TYPE_F16;
    tsr_kv_cache *c = NULL;
    tsr_status s = tsr_kv_cache_new(be, &u.p, &c);
    CHECK(s == TSR_OK && c != NULL, "tsr_kv_cache_new with an old-size struct: %s", tsr_status_string(s));
    if (!c) return;
    CHECK(tsr_kv_cache_n_ctx(c) == 1024, "n_ctx %lld", (long long)tsr_kv_cache_n_ctx(c));
    /* default n_batch_max = 512: a batch of 512 fits, one of 513 is refused */
    tsr_context *ctx = tsr_context_new(be);
    static int32_t pos[513];
    for (int i = 0; i < 513; i++) pos[i] = i;
    s = tsr_kv_cache_begin(c, ctx, 512, pos, NULL);
    CHECK(s == TSR_OK, "begin(512) with the default n_batch_max: %s", tsr_status_string(s));
    tsr_context_close(ctx);
    tsr_kv_cache_clear(c);
    ctx = tsr_context_new(be);
    s = tsr_kv_cache_begin(c, ctx, 513, pos, NULL);
    CHECK(s != TSR_OK, "begin(513) accepted: n_batch_max is not the default 512");
    tsr_context_close(ctx);
    tsr_kv_cache_free(c);
}

/* A caller from before the sliding window: garbage where n_swa and
 * swa_layers would be must mean no window (reading them would take a
 * window of 0xA5A5... positions and read the layer flags through a garbage
 * pointer: a crash). The cache works, and the mask of a token at position
 * 1000 hides none of the cells of positions 0..1000. */
static void kv_cache_before_window(tsr_backend *be)
{
    NEED(tsr_kv_cache_new);
    union { tsr_kv_cache_params p; unsigned char raw[sizeof(tsr_kv_cache_params) + 32]; } u;
    const size_t old = offsetof(tsr_kv_cache_params, n_swa);
    memset(&u, GARBAGE, sizeof u);
    tsr_kv_cache_params_init(&u.p, old);
    CHECK(u.p.size == old, "size recorded as %zu", u.p.size);
    CHECK(untouched(&u, old, sizeof u), "tsr_kv_cache_params_init wrote past the caller's size");
    u.p.n_layers = 2;
    u.p.n_ctx = 1024;
    u.p.n_head_kv = 1;
    u.p.head_dim_k = 8;
    u.p.head_dim_v = 8;
    u.p.n_batch_max = 1024;
    tsr_kv_cache *c = NULL;
    tsr_status s = tsr_kv_cache_new(be, &u.p, &c);
    CHECK(s == TSR_OK && c != NULL, "tsr_kv_cache_new with a pre-window struct: %s", tsr_status_string(s));
    if (!c) return;
    static int32_t pos[1001];
    for (int i = 0; i < 1001; i++) pos[i] = i;
    tsr_context *ctx = tsr_context_new(be);
    s = tsr_kv_cache_begin(c, ctx, 1001, pos, NULL);
    CHECK(s == TSR_OK, "begin(1001): %s", tsr_status_string(s));
    tsr_tensor *mask = tsr_kv_cache_mask(c);
    static uint16_t row[1024];
    int64_t n_kv = mask ? tsr_tensor_ne(mask, 0) : 0;
    CHECK(mask && n_kv <= 1024 && tsr_tensor_read(mask, row, (size_t)1000 * n_kv * 2, (size_t)n_kv * 2) == TSR_OK,
          "reading the mask row of position 1000");
    int hidden = 0;
    for (int j = 0; j < 1001 && j < n_kv; j++) hidden += row[j] != 0;
    CHECK(hidden == 0, "%d of the 1001 cells hidden from position 1000: a window was read from garbage", hidden);
    tsr_context_close(ctx);
    tsr_kv_cache_free(c);
}

/* Old load params: without verify and plan_only (garbage there would mean
 * "plan only": nothing allocated). */
static void load_params_old(tsr_load_params *p, unsigned char *raw, size_t raw_size)
{
    const size_t old = offsetof(tsr_load_params, verify);
    memset(raw, GARBAGE, raw_size);
    tsr_load_params_init(p, old);
    CHECK(p->size == old, "size recorded as %zu", p->size);
    CHECK(untouched(raw, old, raw_size), "tsr_load_params_init wrote past the caller's size");
    CHECK(p->n_gpu_layers == 0 && p->overrides == NULL && p->progress == NULL, "defaults of the old fields");
}

static void place_weights_old_params(tsr_backend *be)
{
    union { tsr_load_params p; unsigned char raw[sizeof(tsr_load_params) + 32]; } u;
    load_params_old(&u.p, u.raw, sizeof u);
    const int64_t ne[2] = {8, 4};
    tsr_status s = tsr_backend_declare_weight(be, "blk.0.attn_q.weight", TSR_TYPE_F32, 2, ne);
    CHECK(s == TSR_OK, "declare_weight: %s", tsr_status_string(s));
    s = tsr_backend_place_weights(be, &u.p);
    CHECK(s == TSR_OK, "place_weights with an old-size struct: %s", tsr_status_string(s));
    tsr_tensor *w = tsr_backend_weight(be, "blk.0.attn_q.weight");
    CHECK(w != NULL && tsr_tensor_buffer_type(w) != NULL, "the weight was not allocated (plan_only read?)");
}

static void load_gguf_old_params(void)
{
    NEED(tsr_gguf_writer_new);
    NEED(tsr_backend_load_gguf);
    char path[] = "/tmp/tsr-params-abi-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
    if (fd < 0) return;
    close(fd);
    tsr_gguf_writer *w = NULL;
    float data[16];
    for (int i = 0; i < 16; i++) data[i] = (float)i;
    const int64_t ne[2] = {8, 2};
    tsr_status s = tsr_gguf_writer_new(&w);
    if (s == TSR_OK) s = tsr_gguf_writer_set_str(w, "general.architecture", "llama");
    if (s == TSR_OK) s = tsr_gguf_writer_add_tensor(w, "blk.0.ffn_up.weight", TSR_TYPE_F32, 2, ne, data);
    if (s == TSR_OK) s = tsr_gguf_writer_write_file(w, path);
    tsr_gguf_writer_free(w);
    CHECK(s == TSR_OK, "writing a test GGUF: %s", tsr_status_string(s));

    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.n_threads = 1;
    tsr_backend *be = NULL;
    if (s == TSR_OK) s = tsr_backend_new(&bp, &be);
    union { tsr_load_params p; unsigned char raw[sizeof(tsr_load_params) + 32]; } u;
    load_params_old(&u.p, u.raw, sizeof u);
    if (s == TSR_OK) s = tsr_backend_load_gguf(be, path, &u.p);
    CHECK(s == TSR_OK, "load_gguf with an old-size struct: %s", tsr_status_string(s));
    tsr_tensor *t = be ? tsr_backend_weight(be, "blk.0.ffn_up.weight") : NULL;
    float back[16] = {0};
    s = t ? tsr_tensor_read(t, back, 0, sizeof back) : TSR_E_NOT_FOUND;
    CHECK(s == TSR_OK && memcmp(back, data, sizeof data) == 0, "loaded weight data: %s", tsr_status_string(s));
    tsr_backend_free(be);
    unlink(path);
}

/* The model layer's structs: _init writes nothing past an older caller's size
 * and fills the fields it knows with the documented defaults. (Their
 * consumers need a model: tests/test-session.c and test-python.py cover them.) */
static void model_params_old(void)
{
    unsigned char raw[sizeof(tsr_session_params) + 16];
    memset(raw, GARBAGE, sizeof raw);
    const size_t old_size = offsetof(tsr_session_params, n_outputs_max);
    tsr_session_params_init((tsr_session_params *)raw, old_size);
    tsr_session_params sp;
    memcpy(&sp, raw, sizeof sp);
    CHECK(sp.size == old_size && untouched(raw, old_size, sizeof raw));
    CHECK(sp.n_ctx == 0 && sp.n_batch == 2048 && sp.n_ubatch == 512 && sp.n_seq_max == 1);

    unsigned char raw2[sizeof(tsr_sampler_params) + 16];
    memset(raw2, GARBAGE, sizeof raw2);
    const size_t old2 = offsetof(tsr_sampler_params, repeat_penalty);
    tsr_sampler_params_init((tsr_sampler_params *)raw2, old2);
    tsr_sampler_params mp;
    memcpy(&mp, raw2, sizeof mp);
    CHECK(mp.size == old2 && untouched(raw2, old2, sizeof raw2));
    CHECK(mp.temp == 0.8f && mp.top_k == 40 && mp.top_p == 0.95f && mp.min_p == 0.05f);
}

/* tsr_model_load reads vocab_only only from a caller whose struct has it:
 * garbage past an older size must not make a vocabulary-only load (which
 * would accept a NULL backend and reach the file: TSR_E_IO here). */
static void model_load_old_params(void)
{
    union { tsr_load_params p; unsigned char raw[sizeof(tsr_load_params) + 32]; } u;
    tsr_model *m = NULL;
    memset(u.raw, GARBAGE, sizeof u.raw);
    tsr_load_params_init(&u.p, offsetof(tsr_load_params, vocab_only));
    CHECK(untouched(u.raw, offsetof(tsr_load_params, vocab_only), sizeof u.raw));
    tsr_status s = tsr_model_load(NULL, "/nonexistent/tsr-params-abi.gguf", &u.p, &m);
    CHECK(s == TSR_E_INVALID && m == NULL, "an old struct read as vocab_only: %s", tsr_status_string(s));
    tsr_load_params_init(&u.p, sizeof u.p);
    u.p.vocab_only = 1;
    s = tsr_model_load(NULL, "/nonexistent/tsr-params-abi.gguf", &u.p, &m);
    CHECK(s == TSR_E_IO && m == NULL, "vocab_only with a NULL backend should reach the file: %s",
          tsr_status_string(s));
}

int main(void)
{
    model_params_old();
    model_load_old_params();
    tsr_backend *be = backend_old_params();
    if (be) {
        kv_cache_old_params(be);
        kv_cache_before_window(be);
        place_weights_old_params(be);
        tsr_backend_free(be);
    }
    load_gguf_old_params();
    if (!tsrtest_failures)
        printf("ok: old-size parameter structs get defaults for the missing fields%s\n",
               skipped ? " (some consumers skipped)" : "");
    return tsrtest_done("test-params-abi");
}
