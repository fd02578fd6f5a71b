/*
 * test-cuda-emu.c - the CUDA module's host-side rules, on the emulated
 * CUDA0 (tests/libtensr-cuda-emu.la; tests/test-ops-cuda-emu.sh loads it
 * through TSR_BACKEND_PATH and runs this before the op harness):
 *
 *  - placement keeps a weight whose type CUDA has no kernel for (Q2_K,
 *    Q3_K, IQ4_NL, IQ4_XS) in system memory, and puts the others on CUDA0;
 *  - supports_op refuses F32/F16 views at offsets off their element size
 *    (the kernels' plain loads would fault), claims aligned ones, and the
 *    refused node still computes (on the CPU) with the device intact;
 *  - a matrix product of no matrices (ne[2] 0) computes nothing, on the
 *    GEMM and matrix-vector paths, called directly (the host code divided
 *    by a->ne[2]);
 *  - stream_bytes (what tsr_fit adds to the plan) reports the cuBLAS
 *    workspace (32 MiB) and the scratch of the largest node (a GEMM's F16
 *    copy of its columns), and a measured graph's plan carries it for CUDA0.
 */
#include "internal.h"
#include "tsrtest.h"

#include <string.h>

static tsr_device *cuda0;

static tsr_backend *backend_cuda(void) {
    tsr_device *list[2] = {cuda0, NULL};
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.devices = list;
    p.n_threads = 1;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    return b;
}

static const char *buft_of(tsr_backend *b, const char *name) {
    tsr_tensor *w = tsr_backend_weight(b, name);
    return w ? tsr_buffer_type_name(tsr_tensor_buffer_type(w)) : "(none)";
}

static void test_placement(void) {
    tsr_backend *b = backend_cuda();
    const struct {
        const char *name;
        tsr_type type;
        const char *want;
    } w[] = {{"blk.0.attn_q.weight", TSR_TYPE_Q8_0, "CUDA0"},     {"blk.0.attn_k.weight", TSR_TYPE_Q4_K, "CUDA0"},
             {"blk.0.attn_v.weight", TSR_TYPE_F16, "CUDA0"},      {"blk.0.ffn_up.weight", TSR_TYPE_Q2_K, "CPU"},
             {"blk.0.ffn_gate.weight", TSR_TYPE_Q3_K, "CPU"},     {"blk.0.ffn_down.weight", TSR_TYPE_IQ4_NL, "CPU"},
             {"blk.0.attn_output.weight", TSR_TYPE_IQ4_XS, "CPU"}};
    const int64_t ne[2] = {256, 8}, ne_norm[1] = {256};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        CHECK_OK(tsr_backend_declare_weight(b, w[i].name, w[i].type, 2, ne));
    CHECK_OK(tsr_backend_declare_weight(b, "blk.0.attn_norm.weight", TSR_TYPE_F32, 1, ne_norm));
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = -1;
    CHECK_OK(tsr_backend_place_weights(b, &lp));
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        CHECK(strcmp(buft_of(b, w[i].name), w[i].want) == 0, "%s (%s) in %s, want %s", w[i].name,
              tsr_type_name(w[i].type), buft_of(b, w[i].name), w[i].want);
    CHECK(strcmp(buft_of(b, "blk.0.attn_norm.weight"), "CUDA0") == 0);
    tsr_backend_free(b);
}

static void test_unaligned_views(void) {
    tsr_backend *b = backend_cuda();
    tsr_context *ctx = tsr_context_new(b);
    const int64_t ne[1] = {64};
    tsr_tensor *t32 = tsr_new_tensor(ctx, tsr_device_buffer_type(cuda0), TSR_TYPE_F32, 1, ne);
    tsr_tensor *t16 = tsr_new_tensor(ctx, tsr_device_buffer_type(cuda0), TSR_TYPE_F16, 1, ne);
    CHECK(t32 && t16);
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    uint16_t h[64];
    for (int i = 0; i < 64; i++) h[i] = tsr__fp32_to_fp16(1.0f + (float)i / 64);
    CHECK_OK(tsr_tensor_write(t32, x, 0, sizeof x));
    CHECK_OK(tsr_tensor_write(t16, h, 0, sizeof h));
    tsr_tensor *odd32 = tsr_scale(ctx, tsr_view_1d(ctx, t32, 16, 2), 2.0f);
    tsr_tensor *even32 = tsr_scale(ctx, tsr_view_1d(ctx, t32, 16, 8), 2.0f);
    tsr_tensor *odd16 = tsr_add(ctx, tsr_view_1d(ctx, t32, 16, 0), tsr_view_1d(ctx, t16, 16, 1));
    tsr_tensor *even16 = tsr_add(ctx, tsr_view_1d(ctx, t32, 16, 0), tsr_view_1d(ctx, t16, 16, 2));
    CHECK(odd32 && even32 && odd16 && even16);
    CHECK(!cuda0->iface->supports_op(cuda0, odd32), "an F32 view at byte 2 is claimed");
    CHECK(cuda0->iface->supports_op(cuda0, even32));
    CHECK(!cuda0->iface->supports_op(cuda0, odd16), "an F16 view at byte 1 is claimed");
    CHECK(cuda0->iface->supports_op(cuda0, even16));
    tsr_tensor *outs[4] = {odd32, even32, odd16, even16};
    CHECK_OK(tsr_compute(ctx, outs, 4));
    CHECK(tsr_tensor_device(even32) == cuda0 && tsr_tensor_device(odd32) != cuda0);
    float got[16], want[16];
    CHECK_OK(tsr_tensor_read(odd32, got, 0, sizeof got));
    for (int i = 0; i < 16; i++) {
        float v;
        memcpy(&v, (const char *)x + 2 + 4 * i, 4);
        want[i] = 2 * v;
    }
    CHECK(memcmp(got, want, sizeof got) == 0);
    CHECK_OK(tsr_tensor_read(even32, got, 0, sizeof got));
    for (int i = 0; i < 16; i++) CHECK_NEAR(got[i], 2.0 * (i + 2), 0);
    CHECK_OK(tsr_tensor_read(even16, got, 0, sizeof got));
    for (int i = 0; i < 16; i++) CHECK_NEAR(got[i], i + tsr__fp16_to_fp32(h[i + 1]), 0);
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

static void test_no_matrices(void) {
    tsr_backend *b = backend_cuda();
    tsr_context *ctx = tsr_context_new(b);
    tsr_stream *s = NULL;
    CHECK_OK(cuda0->iface->stream_new(cuda0, 1, &s));
    for (int n = 3; n <= 12; n += 9) { /* the matrix-vector kernel, then the GEMM */
        const int64_t na[3] = {32, 5, 0}, nb[3] = {32, n, 0};
        tsr_tensor *a = tsr_new_tensor(ctx, tsr_device_buffer_type(cuda0), TSR_TYPE_F32, 3, na);
        tsr_tensor *x = tsr_new_tensor(ctx, tsr_device_buffer_type(cuda0), TSR_TYPE_F32, 3, nb);
        tsr_tensor *node = a && x ? tsr_mul_mat(ctx, a, x) : NULL;
        CHECK(node != NULL);
        if (!node || !s)
            continue;
        CHECK(cuda0->iface->supports_op(cuda0, node));
        CHECK_OK(cuda0->iface->reserve(s, &node, 1));
        CHECK_OK(cuda0->iface->compute(s, &node, 1));
        CHECK_OK(cuda0->iface->synchronize(s));
    }
    if (s)
        cuda0->iface->stream_free(s);
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

static void test_stream_bytes(void) {
    CHECK(cuda0->iface->stream_bytes != NULL, "the CUDA module reports no stream memory");
    if (!cuda0->iface->stream_bytes)
        return;
    tsr_backend *b = backend_cuda();
    tsr_context *ctx = tsr_context_new(b);
    const int64_t na[2] = {1024, 256}, nb[2] = {1024, 512}; /* F16 weight: cuBLAS reads it in place */
    tsr_tensor *a = tsr_new_tensor(ctx, tsr_device_buffer_type(cuda0), TSR_TYPE_F16, 2, na);
    tsr_tensor *x = tsr_input(ctx, TSR_TYPE_F32, 2, nb, NULL);
    tsr_tensor *y = a && x ? tsr_mul_mat(ctx, a, x) : NULL;
    CHECK(y != NULL);
    const size_t ws = (size_t)32 << 20, cols = 1024 * 512 * 2; /* the columns converted to F16 */
    size_t none = cuda0->iface->stream_bytes(cuda0, NULL, 0), one = y ? cuda0->iface->stream_bytes(cuda0, &y, 1) : 0;
    CHECK(none >= ws && none < ws + 4096, "stream bytes without nodes %zu: want the 32 MiB workspace", none);
    CHECK(one >= ws + cols && one < ws + cols + 4096, "stream bytes of a 1024x256 by 1024x512 GEMM: %zu, want %zu", one,
          ws + cols);
    size_t sizes[2] = {0};
    if (y)
        CHECK_OK(tsr_measure(ctx, &y, 1, sizes));
    size_t d = tsr__backend_device_index(b, cuda0);
    CHECK(tsr__backend_plan_stream(b, d) == one, "CUDA0's planned stream memory %zu, want %zu",
          tsr__backend_plan_stream(b, d), one);
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

int main(void) {
    cuda0 = tsr_device_by_name("CUDA0");
    if (!cuda0)
        SKIP("no CUDA0 (run by tests/test-ops-cuda-emu.sh, which loads the emulated module)");
    test_placement();
    test_unaligned_views();
    test_no_matrices();
    test_stream_bytes();
    return tsrtest_done("test-cuda-emu");
}
