/*
 * test-cuda-emu.c - the CUDA module's host-side rules, on the emulated
 * CUDA0 (tests/libtensr-cuda-emu.la; tests/test-ops-cuda-emu.sh loads it
 * through TSR_BACKEND_PATH and runs this before the op harness; on a GPU
 * tests/gpu/check.sh runs it against the real module, without the
 * emulator's launch and allocation counts):
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
 *  - a compute after reserve allocates no device memory (the emulator's
 *    count of cudaMalloc calls): reserved for a u-batch's flash attention
 *    over every cell (enough rows not to split the keys), products of 12
 *    columns and experts over 12 tokens, then decode-sized nodes (one
 *    query row over fewer cells: the keys split, their scratch; products
 *    of 1 and 8 columns: the mat-vec's activations), plain and replayed as
 *    graphs.
 */
#include "internal.h"
#include "tsrtest.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
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

/* The emulator's count of cudaMalloc calls, from the module the core loaded. */
static unsigned long long (*emu_mallocs)(void);

static tsr_tensor *dev_tensor(tsr_context *ctx, tsr_type type, int n_dims, const int64_t *ne) {
    tsr_tensor *t = tsr_new_tensor(ctx, tsr_device_buffer_type(cuda0), type, n_dims, ne);
    CHECK(t != NULL);
    if (t) {
        const size_t n = tsr_tensor_nbytes(t);
        unsigned char *z = calloc(1, n ? n : 1);
        for (size_t i = 0; z && i < n; i++) /* F16, F32 and Q8_0 scales of about 1e-2 to 1 (no subnormals) */
            z[i] = i & 1 ? 0x3c : (unsigned char)(i * 7 % 61);
        CHECK_OK(tsr_tensor_write(t, z, 0, n));
        free(z);
    }
    return t;
}

/* Reserves a stream for big's nodes, then computes small's (plain,
 * captured, replayed) and checks that no device memory was allocated. */
static void reserve_then_compute(tsr_tensor **big, size_t n_big, tsr_tensor **small, size_t n_small,
                                 const char *what) {
    tsr_stream *s = NULL;
    CHECK_OK(cuda0->iface->stream_new(cuda0, 1, &s));
    if (!s)
        return;
    CHECK_OK(cuda0->iface->reserve(s, big, n_big));
    const unsigned long long before = emu_mallocs();
    for (int rep = 0; rep < 3; rep++) {
        CHECK_OK(cuda0->iface->compute(s, small, n_small));
        CHECK_OK(cuda0->iface->synchronize(s));
    }
    CHECK(emu_mallocs() == before, "%llu device allocations by computes after reserve (%s)", emu_mallocs() - before,
          what);
    cuda0->iface->stream_free(s);
}

static void test_reserve_covers(void) {
    if (!emu_mallocs) { /* a GPU's module: no allocation count */
        const char *mod = getenv("TSR_BACKEND_PATH");
        CHECK(!mod || !strstr(mod, "cuda-emu"), "tcu_emu_mallocs not found in the module of TSR_BACKEND_PATH");
        printf("test-cuda-emu: no allocation count (not the emulated module): reserve's cover not checked\n");
        return;
    }
    tsr_backend *b = backend_cuda();
    tsr_context *ctx = tsr_context_new(b);
    /* a u-batch of 544 query rows of 8 heads over 1024 cells fills the
     * multiprocessors without splitting the keys (no scratch); one row
     * splits them */
    const int64_t nq[4] = {64, 544, 8, 1}, nk[4] = {64, 1024, 8, 1}, nw[2] = {64, 96}, nx[2] = {64, 12};
    const int64_t ne_e[3] = {64, 96, 4}, ne_b[3] = {64, 1, 12}, ne_id[2] = {2, 12}, ne_o[1] = {96 * 2 * 12};
    tsr_tensor *q = dev_tensor(ctx, TSR_TYPE_F32, 4, nq), *k = dev_tensor(ctx, TSR_TYPE_F16, 4, nk);
    tsr_tensor *v = dev_tensor(ctx, TSR_TYPE_F16, 4, nk), *w = dev_tensor(ctx, TSR_TYPE_F16, 2, nw);
    tsr_tensor *x = dev_tensor(ctx, TSR_TYPE_F32, 2, nx), *wq = dev_tensor(ctx, TSR_TYPE_Q8_0, 2, nw);
    tsr_tensor *ex = dev_tensor(ctx, TSR_TYPE_F16, 3, ne_e), *eb = dev_tensor(ctx, TSR_TYPE_F32, 3, ne_b);
    tsr_tensor *ids = dev_tensor(ctx, TSR_TYPE_I32, 2, ne_id);
    tsr_tensor *out[4];
    for (int i = 0; i < 4; i++) out[i] = dev_tensor(ctx, TSR_TYPE_F32, 1, ne_o); /* results of the small nodes */
    if (!q || !k || !v || !w || !x || !wq || !ex || !eb || !ids || !out[0] || !out[1] || !out[2] || !out[3]) {
        tsr_context_close(ctx);
        tsr_backend_free(b);
        return;
    }
    int32_t id[24];
    for (int i = 0; i < 24; i++) id[i] = i % 4;
    CHECK_OK(tsr_tensor_write(ids, id, 0, sizeof id));
    tsr_tensor *fa_big = tsr_flash_attn(ctx, q, k, v, NULL, 0.125f);
    tsr_tensor *q1 = tsr_view_4d(ctx, q, 64, 1, 8, 1, tsr_tensor_nb(q, 1), tsr_tensor_nb(q, 2), tsr_tensor_nb(q, 3), 0);
    for (int64_t n_kv = 128; n_kv <= 1024; n_kv += 224) { /* decode over 128 to 1024 cells */
        tsr_tensor *kv[2];
        for (int j = 0; j < 2; j++)
            kv[j] = tsr_view_4d(ctx, j ? v : k, 64, n_kv, 8, 1, tsr_tensor_nb(k, 1), tsr_tensor_nb(k, 2),
                                tsr_tensor_nb(k, 3), 0);
        tsr_tensor *fa = tsr_flash_attn(ctx, q1, kv[0], kv[1], NULL, 0.125f);
        CHECK(fa_big && fa && cuda0->iface->supports_op(cuda0, fa_big) && cuda0->iface->supports_op(cuda0, fa));
        if (!fa_big || !fa)
            break;
        fa->data = out[0]->data;
        char what[64];
        snprintf(what, sizeof what, "flash attention, 1 query row, %lld cells", (long long)n_kv);
        reserve_then_compute(&fa_big, 1, &fa, 1, what);
    }
    /* products reserved for 12 columns (cuBLAS), computed for 1 and 8 (the mat-vec) */
    tsr_tensor *mm_big[3] = {tsr_mul_mat(ctx, w, x), tsr_mul_mat(ctx, wq, x), tsr_mul_mat_id(ctx, ex, eb, ids)};
    tsr_tensor *mm[4] = {
        tsr_mul_mat(ctx, w, tsr_view_2d(ctx, x, 64, 8, tsr_tensor_nb(x, 1), 0)),
        tsr_mul_mat(ctx, wq, tsr_view_2d(ctx, x, 64, 1, tsr_tensor_nb(x, 1), 0)),
        tsr_mul_mat(ctx, wq, tsr_view_2d(ctx, x, 64, 8, tsr_tensor_nb(x, 1), 0)),
        tsr_mul_mat_id(ctx, ex, tsr_view_3d(ctx, eb, 64, 1, 8, tsr_tensor_nb(eb, 1), tsr_tensor_nb(eb, 2), 0),
                       tsr_view_2d(ctx, ids, 2, 8, tsr_tensor_nb(ids, 1), 0))};
    for (int i = 0; i < 4; i++) {
        CHECK(mm[i] && (i == 3 || mm_big[i]) && cuda0->iface->supports_op(cuda0, mm[i]));
        if (!mm[i] || (i < 3 && !mm_big[i]))
            break;
        mm[i]->data = out[i]->data;
        if (i == 3) {
            reserve_then_compute(mm_big, 3, mm, 4, "products of 1 and 8 columns");
            reserve_then_compute(&mm_big[0], 1, &mm[0], 1, "an F16 product of 8 columns");
        }
    }
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

/* The emulator's count of kernel launches (a graph's replay counts its
 * kernels), of host waits on a stream, and the module's count of CUDA
 * graph descriptions it built (the emulated module exports it). */
static unsigned long long (*emu_launches)(void), (*emu_syncs)(void), (*emu_graph_keys)(void);
static unsigned long long last_syncs, last_keys; /* decode_launches' counted token */

/* Kernels launched for one decode token of the model (every layer and the
 * head on CUDA0): a 5-token prompt, then tokens one at a time; the third
 * single token is counted (the first launches plainly, the second is
 * captured, the third replays). 0 on failure. */
static unsigned long long decode_launches(const char *path, int flash) {
    tsr_device *list[2] = {cuda0, NULL};
    tsr_backend_params bp;
    tsr_backend_params_init(&bp, sizeof bp);
    bp.devices = list;
    bp.n_threads = 1;
    bp.flash_attn = flash ? TSR_FLASH_ATTN_ON : TSR_FLASH_ATTN_OFF;
    tsr_backend *b = NULL;
    tsr_model *m = NULL;
    tsr_session *s = NULL;
    CHECK_OK(tsr_backend_new(&bp, &b));
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = -1;
    if (b)
        CHECK_OK(tsr_model_load(b, path, &lp, &m));
    tsr_session_params sp;
    tsr_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 256;
    sp.n_ubatch = 64;
    if (m)
        CHECK_OK(tsr_session_new(m, &sp, &s));
    unsigned long long n = 0;
    const int32_t prompt[5] = {1, 300, 301, 302, 303};
    if (s && tsr_session_decode(s, 5, prompt, NULL, NULL, NULL) == TSR_OK) {
        for (int i = 0; i < 3; i++) {
            const int32_t t = 310 + i;
            const unsigned long long before = emu_launches ? emu_launches() : 0;
            const unsigned long long syncs = emu_syncs ? emu_syncs() : 0, keys = emu_graph_keys ? emu_graph_keys() : 0;
            CHECK_OK(tsr_session_decode(s, 1, &t, NULL, NULL, NULL));
            last_syncs = emu_syncs ? emu_syncs() - syncs : 0;
            last_keys = emu_graph_keys ? emu_graph_keys() - keys : 0;
            CHECK(tsr_session_logits(s, 0) != NULL);
            n = emu_launches() - before;
        }
    }
    tsr_session_free(s);
    tsr_model_free(m);
    tsr_backend_free(b);
    return n;
}

/* launches FLASH MODEL_A LAYERS_A MODEL_B LAYERS_B: the kernels per decode
 * layer, (launches of B - launches of A) / (LAYERS_B - LAYERS_A), printed;
 * fails above TSR_EMU_LAUNCH_LIMIT (default 16). */
static int launches_main(char **argv) {
    CHECK(emu_launches != NULL, "tcu_emu_launches not found in the module of TSR_BACKEND_PATH");
    if (!emu_launches)
        return tsrtest_done("test-cuda-emu launches");
    const int flash = atoi(argv[2]), la = atoi(argv[4]), lb = atoi(argv[6]);
    const unsigned long long a = decode_launches(argv[3], flash), b = decode_launches(argv[5], flash);
    CHECK(a > 0 && b > a && lb > la, "launches %llu (%d layers), %llu (%d layers)", a, la, b, lb);
    if (a > 0 && b > a && lb > la) {
        const double per = (double)(b - a) / (lb - la), rest = (double)a - per * la;
        const char *lim = getenv("TSR_EMU_LAUNCH_LIMIT");
        const double limit = lim ? atof(lim) : 16;
        printf("kernel launches per decode token, flash attention %s: %.1f per layer, %.1f outside the layers "
               "(%llu with %d layers); host syncs %llu, graph descriptions built %llu\n",
               flash ? "on" : "off", per, rest, b, lb, last_syncs, last_keys);
        CHECK(per <= limit, "%.1f kernel launches per decode layer, more than %.0f", per, limit);
        /* the token replays the step's graph: the scheduler kept its plan, so
         * the description is not built again; the host waits once for the
         * compute (its inputs are copied without a wait) and once to read
         * the logits */
        CHECK(last_keys == 0, "a replayed decode step built %llu graph descriptions", last_keys);
        CHECK(last_syncs <= 2, "%llu host syncs in a decode step (compute and logits read: 2)", last_syncs);
    }
    return tsrtest_done("test-cuda-emu launches");
}

static uint32_t rng = 777;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffffff) / 16777216.0f - 0.5f;
}

/* A tensor on CUDA0 of random values (through type's reference
 * quantizer); *vals: the values it holds (dequantized), malloc'd. */
static tsr_tensor *rand_tensor(tsr_context *ctx, tsr_type type, int64_t ne0, int64_t ne1, float scale, float offset,
                               float **vals) {
    const int64_t ne[2] = {ne0, ne1}, n = ne0 * ne1;
    const tsr_type_traits *tr = tsr__type_traits(type);
    tsr_tensor *t = tsr_new_tensor(ctx, tsr_device_buffer_type(cuda0), type, 2, ne);
    float *f = malloc((size_t)n * sizeof *f);
    void *q = malloc((size_t)(n / tr->block_size) * tr->block_bytes);
    CHECK(t && f && q);
    for (int64_t i = 0; f && i < n; i++) f[i] = offset + scale * frand();
    if (t && f && q) {
        tr->from_float(f, q, n);
        tr->to_float(q, f, n);
        CHECK_OK(tsr_tensor_write(t, q, 0, (size_t)(n / tr->block_size) * tr->block_bytes));
    }
    free(q);
    *vals = f;
    return t;
}

/* got[m x n] against want (double), by normalized mean squared error. */
static void check_close(const char *what, const float *got, const double *want, int64_t n, double limit) {
    double err = 0, ref = 0;
    bool bad = false;
    for (int64_t i = 0; i < n; i++) {
        err += (got[i] - want[i]) * (got[i] - want[i]);
        ref += want[i] * want[i];
        bad = bad || got[i] != got[i];
    }
    const double nmse = ref > 0 ? err / ref : err;
    CHECK(!bad && nmse <= limit, "%s: NMSE %.3g (limit %.3g)%s", what, nmse, limit, bad ? ", NaN" : "");
}

/* The fused pairs of the decode layer (rms_norm x weight, a product and the
 * residual added, gate/up and swiglu with the product as either operand)
 * against a double reference, at 1, 3 and 8 columns, F32, F16 and Q8_0
 * weights, 37 and 45 rows; and the launches asserted, so a pair not
 * fused shows. */
static void test_fusions(void) {
    const tsr_type types[3] = {TSR_TYPE_F32, TSR_TYPE_F16, TSR_TYPE_Q8_0};
    const int64_t k = 96, mq = 37, mf = 45;
    for (int ti = 0; ti < 3; ti++)
        for (int64_t n = 1; n <= 8; n += n == 1 ? 2 : 5) {
            tsr_backend *b = backend_cuda();
            tsr_context *ctx = tsr_context_new(b);
            float *x, *wn, *wq, *res, *wg, *wu;
            tsr_tensor *tx = rand_tensor(ctx, TSR_TYPE_F32, k, n, 2.0f, 0.1f, &x);
            tsr_tensor *twn = rand_tensor(ctx, TSR_TYPE_F32, k, 1, 0.4f, 1.0f, &wn);
            tsr_tensor *twq = rand_tensor(ctx, types[ti], k, mq, 0.3f, 0.0f, &wq);
            tsr_tensor *tres = rand_tensor(ctx, TSR_TYPE_F32, mq, n, 1.0f, 0.0f, &res);
            tsr_tensor *twg = rand_tensor(ctx, types[ti], k, mf, 0.3f, 0.0f, &wg);
            tsr_tensor *twu = rand_tensor(ctx, types[ti], k, mf, 0.3f, 0.0f, &wu);
            float *xg, *xu;
            tsr_tensor *txg = rand_tensor(ctx, TSR_TYPE_F32, mf, n, 2.0f, 0.0f, &xg);
            tsr_tensor *txu = rand_tensor(ctx, TSR_TYPE_F32, mf, n, 2.0f, 0.0f, &xu);
            /* three chains, each its own compute (the scheduler orders a graph's
             * nodes by depth: a chain keeps each pair adjacent, as a layer does):
             * norm x weight, product, then the residual; the same, then
             * swiglu(x, up); the same, then swiglu(gate, x) */
            tsr_tensor *outs[3];
            for (int j = 0; j < 3; j++) {
                tsr_tensor *n1 = tsr_mul(ctx, tsr_rms_norm(ctx, tx, 1e-5f), tsr_reshape_1d(ctx, twn, k));
                tsr_tensor *p = tsr_mul_mat(ctx, j == 0 ? twq : j == 1 ? twu : twg, n1);
                outs[j] = j == 0 ? tsr_add(ctx, p, tres) : j == 1 ? tsr_swiglu(ctx, txg, p) : tsr_swiglu(ctx, p, txu);
            }
            const unsigned long long before = emu_launches ? emu_launches() : 0;
            float *got[3];
            for (int j = 0; j < 3; j++) { /* each read before the next compute */
                got[j] = malloc((size_t)(mf * n) * sizeof *got[j]);
                CHECK_OK(tsr_compute(ctx, &outs[j], 1));
                CHECK(tsr_tensor_device(outs[j]) == cuda0);
                if (got[j])
                    CHECK_OK(tsr_tensor_read(outs[j], got[j], 0, (size_t)((j ? mf : mq) * n) * sizeof *got[j]));
            }
            /* per chain: norm x weight 1 (with the Q8_1 activations of integer
             * weights; float weights read F32 in place), the product with its
             * next node 1 */
            const unsigned long long want = 3 * 2;
            if (emu_launches) /* the emulated module (a GPU's: the values alone) */
                CHECK(emu_launches() - before == want, "%s, %lld columns: %llu launches, want %llu (a pair not fused)",
                      tsr_type_name(types[ti]), (long long)n, emu_launches() - before, want);
            /* the reference, in double */
            double *dn = calloc((size_t)(k * n), sizeof *dn), *dq = calloc((size_t)(mq * n), sizeof *dq);
            double *dr = calloc((size_t)(mq * n), sizeof *dr), *dg = calloc((size_t)(mf * n), sizeof *dg);
            double *du = calloc((size_t)(mf * n), sizeof *du), *dh = calloc((size_t)(mf * n), sizeof *dh);
            double *dh2 = calloc((size_t)(mf * n), sizeof *dh2);
            for (int64_t c = 0; c < n; c++) {
                double ss = 0;
                for (int64_t i = 0; i < k; i++) ss += (double)x[c * k + i] * x[c * k + i];
                const double sc = 1.0 / sqrt(ss / k + 1e-5);
                for (int64_t i = 0; i < k; i++) dn[c * k + i] = x[c * k + i] * sc;
                for (int64_t j = 0; j < mf; j++) {
                    double sq = 0, sg = 0, su = 0;
                    for (int64_t i = 0; i < k; i++) {
                        const double v = dn[c * k + i] * wn[i];
                        if (j < mq)
                            sq += v * wq[j * k + i];
                        sg += v * wg[j * k + i];
                        su += v * wu[j * k + i];
                    }
                    if (j < mq) {
                        dq[c * mq + j] = sq;
                        dr[c * mq + j] = sq + res[c * mq + j];
                    }
                    dg[c * mf + j] = sg;
                    du[c * mf + j] = su;
                    dh[c * mf + j] = xg[c * mf + j] / (1 + exp(-(double)xg[c * mf + j])) * su;
                    dh2[c * mf + j] = sg / (1 + exp(-sg)) * xu[c * mf + j];
                }
            }
            const double lim = types[ti] == TSR_TYPE_Q8_0 ? 1e-3 : types[ti] == TSR_TYPE_F16 ? 1e-5 : 1e-9;
            const struct {
                const float *got;
                const double *want;
                int64_t m;
                const char *name;
            } cmp[] = {{got[0], dr, mq, "product + residual"},
                       {got[1], dh, mf, "swiglu(x, product)"},
                       {got[2], dh2, mf, "swiglu(product, x)"}};
            for (size_t i = 0; i < sizeof cmp / sizeof *cmp; i++) {
                char what[96];
                snprintf(what, sizeof what, "%s, %s weights, %lld columns", cmp[i].name, tsr_type_name(types[ti]),
                         (long long)n);
                if (cmp[i].got)
                    check_close(what, cmp[i].got, cmp[i].want, cmp[i].m * n, lim);
            }
            free(dn), free(dq), free(dr), free(dg), free(du), free(dh), free(dh2);
            free(got[0]), free(got[1]), free(got[2]);
            free(x), free(wn), free(wq), free(res), free(wg), free(wu), free(xg), free(xu);
            tsr_context_close(ctx);
            tsr_backend_free(b);
        }
}

/* The mat-vec at every column count (1..8: one kernel instance each, so a
 * count dispatched to the wrong instance shows) and weight type, at shapes
 * that leave tails (k not a multiple of the block's threads; F16 rows of
 * odd k, every other one not 4-byte aligned, so both the two-element
 * words and the single elements run; 67 rows, and more rows than the
 * grid's blocks, so a block's second row reuses its shared memory); then gate and up of the
 * same input with their swiglu (either operand the gate), fused into one
 * launch: the three results against a double reference and the launches
 * asserted (the product: 1, or 2 with the Q8_1 conversion; the pair too). */
static void test_mat_vec_cols(void) {
    const struct {
        tsr_type type;
        int64_t k, m, max_n;
    } ws[] = {{TSR_TYPE_F32, 301, 67, 8},       {TSR_TYPE_F16, 301, 67, 8},      {TSR_TYPE_BF16, 302, 67, 8},
              {TSR_TYPE_Q8_0, 32 * 37, 67, 8},  {TSR_TYPE_Q4_0, 32 * 37, 67, 8}, {TSR_TYPE_Q5_1, 32 * 5, 67, 8},
              {TSR_TYPE_Q4_K, 256 * 5, 67, 8},  {TSR_TYPE_Q6_K, 256 * 3, 67, 8},
              {TSR_TYPE_Q8_0, 32, 65535 + 37, 1}}; /* more rows than blocks: a block takes a second row */
    /* the last case guards the barrier after a row's sums are read, which
     * threads run in order catch (the last warp reads them after the other
     * warps ran on to the next row) and threads run last first cannot: run
     * in that order alone (6 s) */
    const char *rev = getenv("TCU_EMU_REVERSE");
    const size_t n_ws = sizeof ws / sizeof *ws - (rev && *rev == '1' ? 1 : 0);
    for (size_t wi = 0; wi < n_ws; wi++)
        for (int64_t n = 1; n <= ws[wi].max_n; n++) {
            const tsr_type type = ws[wi].type;
            const int64_t k = ws[wi].k, m = ws[wi].m;
            const bool q8 = type != TSR_TYPE_F32 && type != TSR_TYPE_F16 && type != TSR_TYPE_BF16;
            tsr_backend *b = backend_cuda();
            tsr_context *ctx = tsr_context_new(b);
            float *w, *w2, *x;
            tsr_tensor *tw = rand_tensor(ctx, type, k, m, 0.3f, 0.0f, &w);
            tsr_tensor *tw2 = rand_tensor(ctx, type, k, m, 0.3f, 0.0f, &w2);
            tsr_tensor *tx = rand_tensor(ctx, TSR_TYPE_F32, k, n, 2.0f, 0.1f, &x);
            tsr_tensor *p = tsr_mul_mat(ctx, tw, tx);
            tsr_tensor *g = tsr_mul_mat(ctx, tw, tx), *u = tsr_mul_mat(ctx, tw2, tx);
            tsr_tensor *pair[3] = {n % 2 ? tsr_swiglu(ctx, g, u) : tsr_swiglu(ctx, u, g), g, u};
            float *got[4];
            for (int j = 0; j < 4; j++) got[j] = malloc((size_t)(m * n) * sizeof **got);
            const unsigned long long want = q8 ? 2 : 1;
            unsigned long long before = emu_launches ? emu_launches() : 0;
            CHECK_OK(tsr_compute(ctx, &p, 1));
            CHECK(tsr_tensor_device(p) == cuda0);
            if (emu_launches)
                CHECK(emu_launches() - before == want, "%s, %lld columns: the product took %llu launches, want %llu",
                      tsr_type_name(type), (long long)n, emu_launches() - before, want);
            if (got[3])
                CHECK_OK(tsr_tensor_read(p, got[3], 0, (size_t)(m * n) * sizeof **got));
            before = emu_launches ? emu_launches() : 0;
            CHECK_OK(tsr_compute(ctx, pair, 3));
            if (emu_launches)
                CHECK(emu_launches() - before == want, "%s, %lld columns: gate/up/swiglu took %llu launches, want %llu",
                      tsr_type_name(type), (long long)n, emu_launches() - before, want);
            for (int j = 0; j < 3; j++)
                if (got[j])
                    CHECK_OK(tsr_tensor_read(pair[j], got[j], 0, (size_t)(m * n) * sizeof **got));
            double *dg = calloc((size_t)(m * n), sizeof *dg), *du = calloc((size_t)(m * n), sizeof *du);
            double *dh = calloc((size_t)(m * n), sizeof *dh);
            for (int64_t c = 0; dg && du && dh && c < n; c++)
                for (int64_t j = 0; j < m; j++) {
                    double sg = 0, su = 0;
                    for (int64_t i = 0; i < k; i++) {
                        sg += (double)w[j * k + i] * x[c * k + i];
                        su += (double)w2[j * k + i] * x[c * k + i];
                    }
                    dg[c * m + j] = sg;
                    du[c * m + j] = su;
                    dh[c * m + j] = n % 2 ? sg / (1 + exp(-sg)) * su : su / (1 + exp(-su)) * sg;
                }
            const double lim = q8 ? 1e-3 : type == TSR_TYPE_F32 ? 1e-9 : 1e-6;
            const char *names[4] = {"swiglu of the pair", "gate of the pair", "up of the pair", "product"};
            const double *wants[4] = {dh, dg, du, dg};
            for (int j = 0; j < 4; j++) {
                char what[96];
                snprintf(what, sizeof what, "mat-vec: %s, %s weights, k %lld, %lld columns", names[j],
                         tsr_type_name(type), (long long)k, (long long)n);
                if (got[j] && wants[j])
                    check_close(what, got[j], wants[j], m * n, lim);
            }
            free(dg), free(du), free(dh);
            for (int j = 0; j < 4; j++) free(got[j]);
            free(w), free(w2), free(x);
            tsr_context_close(ctx);
            tsr_backend_free(b);
        }
}

/* A compute the scheduler runs again on its kept plan finds its CUDA graph
 * without building its description (graph descriptions built: 0) and waits
 * on the host once (its input copied without a wait); after another plan
 * in between, the description is built and compared again (1), since a
 * plan may bind any tensor elsewhere. Results against a double reference. */
static void test_graph_key(void) {
    if (!emu_graph_keys || !emu_syncs)
        return; /* the emulated module's counters (a GPU's module has none) */
    const int64_t k = 64, m = 37;
    tsr_backend *b = backend_cuda();
    tsr_context *ctx = tsr_context_new(b);
    float *w, *xv = malloc((size_t)k * sizeof *xv), *got = malloc((size_t)m * sizeof *got);
    tsr_tensor *tw = rand_tensor(ctx, TSR_TYPE_F32, k, m, 0.5f, 0.0f, &w);
    const int64_t ne[2] = {k, 1};
    tsr_tensor *x = tsr_input(ctx, TSR_TYPE_F32, 2, ne, NULL);
    tsr_tensor *out = tsr_mul_mat(ctx, tw, x), *other = tsr_scale(ctx, tsr_mul_mat(ctx, tw, x), 2.0f);
    CHECK(x && out && other && xv && got);
    for (int step = 0; step < 6 && x && out && other && xv && got; step++) {
        for (int64_t i = 0; i < k; i++) xv[i] = frand() + 0.1f * step;
        CHECK_OK(tsr_tensor_write(x, xv, 0, (size_t)k * sizeof *xv));
        if (step == 4) /* another plan in between */
            CHECK_OK(tsr_compute(ctx, &other, 1));
        const unsigned long long keys = emu_graph_keys(), syncs = emu_syncs();
        CHECK_OK(tsr_compute(ctx, &out, 1));
        const unsigned long long dk = emu_graph_keys() - keys, ds = emu_syncs() - syncs;
        CHECK(tsr_tensor_device(out) == cuda0);
        /* step 0 plans and builds it; 1 captures, 2 and 3 replay: kept plan;
         * 4 plans again (after `other`) and builds it; 5 replays */
        const unsigned long long want = step == 0 || step == 4;
        CHECK(dk == want, "step %d: %llu graph descriptions built, want %llu", step, dk, want);
        /* (the stream's first compute: up to 2) */
        CHECK(step == 0 ? ds <= 2 : ds == 1, "step %d: %llu host syncs in the compute, want 1", step, ds);
        CHECK_OK(tsr_tensor_read(out, got, 0, (size_t)m * sizeof *got));
        double want_v[37];
        for (int64_t j = 0; j < m; j++) {
            want_v[j] = 0;
            for (int64_t i = 0; i < k; i++) want_v[j] += (double)w[j * k + i] * xv[i];
        }
        char what[64];
        snprintf(what, sizeof what, "graph replay, step %d", step);
        check_close(what, got, want_v, m, 1e-9);
    }
    free(w), free(xv), free(got);
    tsr_context_close(ctx);
    tsr_backend_free(b);
}

int main(int argc, char **argv) {
    cuda0 = tsr_device_by_name("CUDA0");
    if (!cuda0)
        SKIP("no CUDA0 (run by tests/test-ops-cuda-emu.sh, which loads the emulated module)");
    const char *mod = getenv("TSR_BACKEND_PATH");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL; /* the module the core loaded */
    if (h) {
        *(void **)&emu_mallocs = dlsym(h, "tcu_emu_mallocs");
        *(void **)&emu_launches = dlsym(h, "tcu_emu_launches");
        *(void **)&emu_syncs = dlsym(h, "tcu_emu_syncs");
        *(void **)&emu_graph_keys = dlsym(h, "tcu_emu_graph_keys");
        dlclose(h); /* the core's reference keeps it loaded */
    }
    if (argc == 7 && !strcmp(argv[1], "launches"))
        return launches_main(argv);
    test_placement();
    test_unaligned_views();
    test_no_matrices();
    test_stream_bytes();
    test_reserve_covers();
    test_fusions();
    test_mat_vec_cols();
    test_graph_key();
    return tsrtest_done("test-cuda-emu");
}
