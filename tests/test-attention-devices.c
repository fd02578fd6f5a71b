/*
 * test-attention-devices.c - the KV cache across devices, on fake devices
 * (TSR_FAKE_DEVICES, set before the first libtensr call): each layer's K/V
 * live on the layer's device (one buffer per device, counted in the memory
 * plan), attention over a cache split across CPU, FAKE0 and FAKE1 gives the
 * CPU-only result on every path, and a cache that does not fit a device
 * fails cleanly with TSR_E_DEVICE_NOMEM naming it. With TSR_TEST_DEVICE
 * naming a real device (CUDA0 through the CUDA module: tests/gpu/check.sh)
 * the split runs again with that device in FAKE0's place (its memory
 * accounting is the driver's, so only the results are compared, within
 * 1e-3: the device's kernels round in their own order).
 */
#include "tsrtest.h"

#include "internal.h"

#include <strings.h>

enum { N_LAYERS = 3, N_HEAD = 6, N_HEAD_KV = 2, HD = 32 };

static tsr_device *dev(const char *name) { return tsr_device_by_name(name); }

static size_t used(const char *name) {
    size_t fr = 0, tot = 0;
    tsr_device_memory(dev(name), &fr, &tot);
    return tot - fr;
}

/* A backend on the named fake devices (NULL: CPU only); layers placed with
 * n_gpu_layers over them. */
static tsr_backend *backend_on(const char *d0, const char *d1, int flash, size_t amb, int ngl) {
    tsr_device *list[3] = {d0 ? dev(d0) : dev("CPU"), d1 ? dev(d1) : NULL, NULL};
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.devices = list;
    p.n_threads = 2;
    p.flash_attn = flash ? TSR_FLASH_ATTN_ON : TSR_FLASH_ATTN_OFF;
    p.attn_max_batch = amb;
    tsr_backend *b = NULL;
    CHECK_OK(tsr_backend_new(&p, &b));
    if (!b)
        return NULL;
    tsr_load_params lp;
    tsr_load_params_init(&lp, sizeof lp);
    lp.n_gpu_layers = ngl;
    float split[2] = {1, 1};
    lp.tensor_split = d0 && d1 ? split : NULL;
    CHECK_OK(tsr__place_layers(b, N_LAYERS, &lp));
    return b;
}

static tsr_kv_cache *new_cache(tsr_backend *b, int64_t n_ctx, tsr_status want) {
    tsr_kv_cache_params p;
    tsr_kv_cache_params_init(&p, sizeof p);
    p.n_layers = N_LAYERS;
    p.n_ctx = n_ctx;
    p.n_head_kv = N_HEAD_KV;
    p.head_dim_k = p.head_dim_v = HD;
    tsr_kv_cache *c = NULL;
    CHECK_STATUS(tsr_kv_cache_new(b, &p, &c), want);
    return c;
}

/* Two batches over every layer; returns the outputs of the second batch
 * ([N_LAYERS][n_head * HD * nt], malloc'ed). */
static float *run(tsr_backend *b, tsr_kv_cache *c) {
    static const int sizes[2] = {21, 7};
    float *res = NULL;
    for (int bi = 0; bi < 2; bi++) {
        int nt = sizes[bi];
        tsr_context *ctx = tsr_context_new(b);
        CHECK_OK(tsr_kv_cache_begin(c, ctx, nt, NULL, NULL));
        tsr_tensor *outs[N_LAYERS];
        size_t qn = (size_t)HD * N_HEAD * nt, kn = (size_t)HD * N_HEAD_KV * nt;
        float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4);
        for (int il = 0; il < N_LAYERS; il++) {
            tsrtest_fill(q, qn, 100 * bi + il);
            tsrtest_fill(k, kn, 200 * bi + il);
            tsrtest_fill(v, kn, 300 * bi + il);
            int64_t neq[3] = {HD, N_HEAD, nt}, nek[3] = {HD, N_HEAD_KV, nt};
            outs[il] = tsr_attention(ctx, c, il, tsr_input(ctx, TSR_TYPE_F32, 3, neq, q),
                                     tsr_input(ctx, TSR_TYPE_F32, 3, nek, k), tsr_input(ctx, TSR_TYPE_F32, 3, nek, v),
                                     0.25f);
            CHECK(outs[il] != NULL);
        }
        free(q), free(k), free(v);
        tsr_status s = outs[0] && outs[1] && outs[2] ? tsr_compute(ctx, outs, N_LAYERS) : TSR_E_INVALID;
        CHECK_OK(s);
        if (s == TSR_OK && bi == 1) {
            size_t on = (size_t)N_HEAD * HD * nt;
            res = calloc(N_LAYERS * on, sizeof *res);
            for (int il = 0; il < N_LAYERS; il++)
                CHECK_OK(tsr_tensor_read(outs[il], res + il * on, 0, on * sizeof *res));
        }
        tsr_context_close(ctx);
    }
    return res;
}

static void test_split(const char *d0, int flash, size_t amb) {
    const int fake = strncmp(d0, "FAKE", 4) == 0;
    tsr_backend *cpu_b = backend_on(NULL, NULL, flash, amb, 0);
    tsr_kv_cache *cpu_c = new_cache(cpu_b, 100, TSR_OK);
    float *want = cpu_c ? run(cpu_b, cpu_c) : NULL;
    tsr_kv_cache_free(cpu_c);
    tsr_backend_free(cpu_b);

    size_t u0 = used(d0), u1 = used("FAKE1");
    tsr_backend *b = backend_on(d0, "FAKE1", flash, amb, 2); /* layer 0 CPU, 1 d0, 2 FAKE1 */
    tsr_kv_cache *c = new_cache(b, 100, TSR_OK);
    if (c) {
        const char *where[N_LAYERS] = {"CPU", d0, "FAKE1"};
        for (int il = 0; il < N_LAYERS; il++) {
            CHECK(strcasecmp(tsr_buffer_type_name(c->k[il].buffer->buft), where[il]) == 0);
            CHECK(c->v[il].buffer == c->k[il].buffer);
        }
        CHECK(c->n_grp == 3);
        size_t kv[3];
        for (size_t d = 0; d < 3; d++) {
            CHECK_OK(tsr_backend_memory_plan(b, d, NULL, &kv[d], NULL));
            CHECK(kv[d] >= 2 * (size_t)(flash ? 256 : 100) * HD * N_HEAD_KV * 2);
        }
        CHECK((!fake || used(d0) - u0 >= kv[0]) && used("FAKE1") - u1 >= kv[1]);
        float *got = run(b, c);
        if (got && want) {
            size_t n = (size_t)N_LAYERS * N_HEAD * HD * 7;
            double d = 0;
            for (size_t i = 0; i < n; i++)
                d = fmax(d, fabs((double)got[i] - want[i]));
            const double tol = fake ? 1e-5 : 1e-3;
            if (!(d < tol))
                fprintf(stderr, "split over %s (flash %d, amb %zu) differs from the CPU by %g\n", d0, flash, amb, d);
            CHECK(d < tol);
        }
        free(got);
    }
    tsr_kv_cache_free(c);
    tsr_backend_free(b); /* with its compute buffers */
    CHECK((!fake || used(d0) == u0) && used("FAKE1") == u1);
    free(want);
}

static void test_oom(void) {
    tsr_backend *b = backend_on("FAKE2", NULL, 0, 0, -1); /* every layer on the 1 MiB device */
    size_t before = used("FAKE2");
    tsr_kv_cache *c = new_cache(b, 4096, TSR_E_DEVICE_NOMEM); /* 3 x 2 x 4096 x 64 x 2 bytes = 3 MiB */
    CHECK(c == NULL && strstr(tsr_last_error(), "FAKE2") != NULL);
    size_t kv = 1;
    CHECK_OK(tsr_backend_memory_plan(b, 0, NULL, &kv, NULL));
    CHECK(kv == 0 && used("FAKE2") == before);
    c = new_cache(b, 256, TSR_OK); /* 192 KiB fits */
    tsr_kv_cache_free(c);
    CHECK(used("FAKE2") == before);
    tsr_backend_free(b);
}

int main(void) {
    setenv("TSR_FAKE_DEVICES", "FAKE0:64MiB,FAKE1:64MiB,FAKE2:1MiB", 1);
    if (!dev("FAKE0") || !dev("FAKE2"))
        SKIP("fake devices are not available in this build");
    test_split("FAKE0", 0, 0);
    test_split("FAKE0", 0, 16 * 1024); /* chunked */
    test_split("FAKE0", 1, 0);
    test_oom();
    const char *real = getenv("TSR_TEST_DEVICE");
    if (real && *real && dev(real) && tsr_device_kind(dev(real)) != TSR_DEVICE_CPU) {
        printf("the split again with %s (%s)\n", real, tsr_device_description(dev(real)));
        test_split(real, 0, 0);
        test_split(real, 0, 16 * 1024);
        test_split(real, 1, 0);
    }
    return tsrtest_done("test-attention-devices");
}
