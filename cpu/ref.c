/*
 * ref.c - scalar reference dot products (weight row x activation row in
 * the weight's dot type) and the kernel table selection. The SIMD variants
 * (avx2/, avx512/) must agree with these within rounding.
 */
#include "cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

static void dot_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0; /* accumulate wide: the scalar path is the reference */
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * y[i];
    *s = (float)sum;
}

static void dot_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)TSR_FP16_TO_FP32(x[i]) * TSR_FP16_TO_FP32(y[i]);
    *s = (float)sum;
}

static void dot_bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx;
    const float *y = vy;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)tsr__bf16_to_fp32(x[i]) * y[i];
    *s = (float)sum;
}

static void dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_0 *x = vx;
    const tsr_block_q8_0 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d);
    }
    *s = sum;
}

static void dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_1 *x = vx;
    const tsr_block_q8_1 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++) sumi += (x[i].qs[j] & 0xF) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d) +
               TSR_FP16_TO_FP32(x[i].m) * TSR_FP16_TO_FP32(y[i].s);
    }
    *s = sum;
}

static void dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q5_0 *x = vx;
    const tsr_block_q8_0 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = ((x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            const int q1 = ((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            sumi += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
        }
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d);
    }
    *s = sum;
}

static void dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q5_1 *x = vx;
    const tsr_block_q8_1 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = (x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            const int q1 = (x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            sumi += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
        }
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d) +
               TSR_FP16_TO_FP32(x[i].m) * TSR_FP16_TO_FP32(y[i].s);
    }
    *s = sum;
}

static void dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q8_0 *x = vx, *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sum += (float)sumi * TSR_FP16_TO_FP32(x[i].d) * TSR_FP16_TO_FP32(y[i].d);
    }
    *s = sum;
}

/* Q4_K/Q5_K: sum over 8 sub-blocks of d*sc*sum(q*q8) - dmin*m*sum(q8), the
 * last from the Q8_K group sums. */
static void dot_q4_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q4_K *x = vx;
    const tsr_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            tsr__get_scale_min_k4(j, x[i].scales, &sc, &m);
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            const int8_t *q8 = y[i].qs + 32 * j;
            int d = 0;
            for (int l = 0; l < 32; l++) d += (j & 1 ? q[l] >> 4 : q[l] & 0xF) * q8[l];
            sumi += sc * d;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        sum += y[i].d * (TSR_FP16_TO_FP32(x[i].d) * (float)sumi - TSR_FP16_TO_FP32(x[i].dmin) * (float)summ);
    }
    *s = sum;
}

static void dot_q5_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q5_K *x = vx;
    const tsr_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            tsr__get_scale_min_k4(j, x[i].scales, &sc, &m);
            const uint8_t *q = x[i].qs + 32 * (j / 2);
            const int8_t *q8 = y[i].qs + 32 * j;
            int d = 0;
            for (int l = 0; l < 32; l++) {
                const int lo = j & 1 ? q[l] >> 4 : q[l] & 0xF;
                d += (lo | (((x[i].qh[l] >> j) & 1) << 4)) * q8[l];
            }
            sumi += sc * d;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        sum += y[i].d * (TSR_FP16_TO_FP32(x[i].d) * (float)sumi - TSR_FP16_TO_FP32(x[i].dmin) * (float)summ);
    }
    *s = sum;
}

static void dot_q6_K_q8_K(int64_t n, float *s, const void *vx, const void *vy) {
    const tsr_block_q6_K *x = vx;
    const tsr_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / TSR_QK_K; i++) {
        int sumi = 0;
        for (int e0 = 0; e0 < TSR_QK_K; e0 += 16) {
            const int c = e0 / 128, g = (e0 % 128) / 32, l0 = e0 % 32;
            const uint8_t *ql = x[i].ql + 64 * c + (g & 1) * 32, *qh = x[i].qh + 32 * c;
            int d = 0;
            for (int l = l0; l < l0 + 16; l++) {
                const int lo = g < 2 ? ql[l] & 0xF : ql[l] >> 4;
                d += ((lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32) * y[i].qs[128 * c + 32 * g + l];
            }
            sumi += x[i].scales[8 * c + 2 * g + l0 / 16] * d;
        }
        sum += y[i].d * TSR_FP16_TO_FP32(x[i].d) * (float)sumi;
    }
    *s = sum;
}

static double exp_sum_ref(int64_t n, float *y, float max) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (y[i] = expf(y[i] - max));
    return sum;
}

static void gemm_f32_ref(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                         int64_t ldb, float *c, int64_t ldc, bool acc) {
    for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        if (!acc)
            memset(ci, 0, (size_t)n * sizeof *ci);
        for (int64_t l = 0; l < k; l++) {
            const float av = a[i * lda + l];
            if (b_f16) {
                const uint16_t *bl = (const uint16_t *)b + l * ldb;
                for (int64_t j = 0; j < n; j++) ci[j] += av * TSR_FP16_TO_FP32(bl[j]);
            } else {
                const float *bl = (const float *)b + l * ldb;
                for (int64_t j = 0; j < n; j++) ci[j] += av * bl[j];
            }
        }
    }
}

static void gemm_f32_nt_ref(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b, bool b_f16,
                            int64_t ldb, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float sum = 0;
            for (int64_t l = 0; l < k; l++)
                sum += a[i * lda + l] *
                       (b_f16 ? TSR_FP16_TO_FP32(((const uint16_t *)b)[j * ldb + l]) : ((const float *)b)[j * ldb + l]);
            c[i * ldc + j] = sum;
        }
}

static float softmax_step_ref(int64_t n, float *y, float scale, const float *mask, float *m, float slack) {
    float mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = y[i] * scale + (mask ? mask[i] : 0.0f);
        if (y[i] > mx)
            mx = y[i];
    }
    if (!tsr__cpu_softmax_max(mx, y, n, m, slack))
        return 0;
    for (int64_t i = 0; i < n; i++) sum += (y[i] = expf(y[i] - *m));
    return sum;
}

static void silu_mul_ref(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i])) * (g ? g[i] : 1.0f);
}

static void gelu_mul_ref(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i++) {
        const float u = TSR_GELU_C * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
        y[i] = x[i] / (1.0f + expf(-2.0f * u)) * (g ? g[i] : 1.0f);
    }
}

static void add_ref(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] + g[i];
}

static void mul_ref(int64_t n, float *y, const float *x, const float *g) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * g[i];
}

/* ggml's arithmetic: squares in float summed in double, the mean and the
 * scale in float. */
static void rms_norm_ref(int64_t n, float *y, const float *x, float eps) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((n ? (float)(sum / n) : 0.0f) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

void tsr__cpu_rope_ref(int64_t n_dims, bool neox, float *y, const float *x, const float *cs) {
    for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
        const int64_t j0 = neox ? i0 / 2 : i0, j1 = neox ? i0 / 2 + n_dims / 2 : i0 + 1;
        const float x0 = x[j0], x1 = x[j1];
        /* fused as GCC contracts ggml's rotate_pairs on FMA machines
         * (llama.cpp parity): x0*c - x1*s and x0*s + x1*c */
        y[j0] = fmaf(x0, cs[i0], -(x1 * cs[i0 + 1]));
        y[j1] = fmaf(x0, cs[i0 + 1], x1 * cs[i0]);
    }
}

static void f16_from_float_ref(const float *x, void *y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = tsr__fp32_to_fp16(x[i]);
}

static void f32_from_float(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof *x); }

void tsr__cpu_q8s_from_float_ref(const float *x, void *vy, int64_t k) {
    tsr_cpu_q8s *y = vy;
    for (int64_t b = 0; b < k / 32; b++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = tsr__cpu_q8s_inv(d, amax);
        int32_t sum = 0, lo = 0;
        for (int j = 0; j < 32; j++) {
            const float p = x[j] * id; /* NaN for a NaN, or an infinity (then id is 0) */
            const int q = p == p ? (int)lrintf(p) : 0;
            y[b].qs[j] = (int8_t)q;
            sum += q;
            if (j < 16)
                lo += q;
        }
        tsr__cpu_q8s_finish(&y[b], d, sum, lo);
    }
}

void tsr__cpu_q8s_to_float(const void *vy, float *x, int64_t k) {
    const tsr_cpu_q8s *y = vy;
    for (int64_t b = 0; b < k / 32; b++)
        for (int j = 0; j < 32; j++) x[b * 32 + j] = y[b].d * (float)y[b].qs[j];
}

void tsr__cpu_gemm_ref(tsr_type wt, tsr_type gt, int64_t k, int64_t m, int64_t n, const void *x, size_t xs,
                       const void *y, size_t ys, float *s, size_t ss, void *scratch) {
    float *xf = scratch, *yf = xf + k;
    for (int64_t j = 0; j < n; j++) {
        tsr__type_traits(gt)->to_float((const char *)y + (size_t)j * ys, yf, k);
        for (int64_t i = 0; i < m; i++) {
            tsr__type_traits(wt)->to_float((const char *)x + (size_t)i * xs, xf, k);
            double sum = 0;
            for (int64_t l = 0; l < k; l++) sum += (double)xf[l] * yf[l];
            s[(size_t)j * ss + (size_t)i] = (float)sum;
        }
    }
}

/* The scalar variant's batched matmul for F16 weights: F32 activations (not
 * rounded to F16), summed in double. */
static void gemm_f16_ref(int64_t k, int64_t m, int64_t n, const void *x, size_t xs, const void *y, size_t ys, float *s,
                         size_t ss, void *scratch) {
    tsr__cpu_gemm_ref(TSR_TYPE_F16, TSR_TYPE_F32, k, m, n, x, xs, y, ys, s, ss, scratch);
}

void tsr__cpu_kernels_scalar(tsr_cpu_kernels *k) {
    memset(k, 0, sizeof *k);
    k->name = "scalar";
    for (int t = 0; t < TSR_TYPE_COUNT; t++) {
        const tsr_type_traits *tt = tsr__type_traits((tsr_type)t);
        k->dot_type[t] = TSR_TYPE_F32;
        if (tt) {
            k->to_float[t] = tt->to_float;
            k->from_float[t] = tt->from_float;
        }
    }
    k->exp_sum = exp_sum_ref;
    k->silu_mul = silu_mul_ref;
    k->gelu_mul = gelu_mul_ref;
    k->add = add_ref;
    k->mul = mul_ref;
    k->rms_norm = rms_norm_ref;
    k->rope = tsr__cpu_rope_ref;
    k->gemm_f32 = gemm_f32_ref;
    k->gemm_f32_nt = gemm_f32_nt_ref;
    k->q8s_from_float = tsr__cpu_q8s_from_float_ref;
    k->softmax_step = softmax_step_ref;
    k->from_float[TSR_TYPE_F16] = f16_from_float_ref;
    k->from_float[TSR_TYPE_F32] = f32_from_float;
    k->vec_dot[TSR_TYPE_F32] = dot_f32;
    k->vec_dot[TSR_TYPE_F16] = dot_f16;
    k->dot_type[TSR_TYPE_F16] = TSR_TYPE_F16;
    k->gemm[TSR_TYPE_F16] = gemm_f16_ref;
    k->gemm_type[TSR_TYPE_F16] = TSR_TYPE_F32;
    k->vec_dot[TSR_TYPE_BF16] = dot_bf16;
    k->vec_dot[TSR_TYPE_Q4_0] = dot_q4_0_q8_0;
    k->dot_type[TSR_TYPE_Q4_0] = TSR_TYPE_Q8_0;
    k->vec_dot[TSR_TYPE_Q4_1] = dot_q4_1_q8_1;
    k->dot_type[TSR_TYPE_Q4_1] = TSR_TYPE_Q8_1;
    k->vec_dot[TSR_TYPE_Q5_0] = dot_q5_0_q8_0;
    k->dot_type[TSR_TYPE_Q5_0] = TSR_TYPE_Q8_0;
    k->vec_dot[TSR_TYPE_Q5_1] = dot_q5_1_q8_1;
    k->dot_type[TSR_TYPE_Q5_1] = TSR_TYPE_Q8_1;
    k->vec_dot[TSR_TYPE_Q8_0] = dot_q8_0_q8_0;
    k->dot_type[TSR_TYPE_Q8_0] = TSR_TYPE_Q8_0;
    k->vec_dot[TSR_TYPE_Q4_K] = dot_q4_K_q8_K;
    k->dot_type[TSR_TYPE_Q4_K] = TSR_TYPE_Q8_K;
    k->vec_dot[TSR_TYPE_Q5_K] = dot_q5_K_q8_K;
    k->dot_type[TSR_TYPE_Q5_K] = TSR_TYPE_Q8_K;
    k->vec_dot[TSR_TYPE_Q6_K] = dot_q6_K_q8_K;
    k->dot_type[TSR_TYPE_Q6_K] = TSR_TYPE_Q8_K;
}

/* ---- run-time selection ------------------------------------------------- */

static bool have_avx2(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    /* F16C through cpuid: clang before 15 rejects __builtin_cpu_supports("f16c"). */
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C);
#else
    return false;
#endif
}

static bool have_avx512(bool *vnni) {
    *vnni = false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl")))
        return false;
    *vnni = __builtin_cpu_supports("avx512vnni");
    return true;
#else
    return false;
#endif
}

void tsr__cpu_kernels_select(tsr_cpu_kernels *k, const char *cap) {
    tsr__fp16_table_init();
    tsr__cpu_kernels_scalar(k);
    if (cap && strcmp(cap, "scalar") == 0)
        return;
#ifdef TSR_HAVE_AVX2_BUILD
    if (!have_avx2())
        return;
    tsr__cpu_kernels_avx2(k);
    if (cap && strcmp(cap, "avx2") == 0)
        return;
#ifdef TSR_HAVE_AVX512_BUILD
    bool vnni;
    if (have_avx512(&vnni))
        tsr__cpu_kernels_avx512(k, vnni);
#endif
#else
    (void)have_avx2;
    (void)have_avx512;
#endif
}

static tsr_cpu_kernels best_kernels;
static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

static void kernels_init(void) { tsr__cpu_kernels_select(&best_kernels, getenv("TSR_CPU_KERNELS")); }

const tsr_cpu_kernels *tsr__cpu_kernels(void) {
    pthread_once(&kernels_once, kernels_init);
    return &best_kernels;
}

const char *tsr__cpu_features_string(void) {
    static char buf[96];
    bool vnni = false;
    bool a512 = have_avx512(&vnni);
    snprintf(buf, sizeof buf, "AVX2=%d AVX512=%d AVX512_VNNI=%d kernels=%s", have_avx2(), a512, vnni,
             tsr__cpu_kernels()->name);
    return buf;
}
