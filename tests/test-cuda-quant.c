/*
 * test-cuda-quant.c - the element loaders and the Q8_0 quantizer of the CUDA
 * kernels (cuda/quant.h: plain C that nvcc also compiles for the device),
 * checked on the CPU against the library's reference: for every type the
 * kernels read, each element of rows quantized by the reference quantizer
 * equals the reference dequantizer's value; F16 and BF16 conversions agree
 * with the library's on a sweep of floats; Q8_0 blocks are byte-identical;
 * the mat-vec kernels' Q8_1 activation quantizer and its integer dot
 * products (a host __dp4a) agree with the float dot of the dequantized values.
 * Needs no GPU and no CUDA toolkit.
 */
#include "internal.h"
#include "tsrtest.h"

#include "../cuda/quant.h"
#include "quant/quants.h"

#include <math.h>
#include <stdlib.h>

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((float)((*s >> 8) & 0xffff) / 65535.0f - 0.5f) * 4.0f;
}

int main(void) {
    _Static_assert((int)TCU_F32 == (int)TSR_TYPE_F32 && (int)TCU_Q4_K == (int)TSR_TYPE_Q4_K &&
                       (int)TCU_BF16 == (int)TSR_TYPE_BF16 && (int)TCU_I64 == (int)TSR_TYPE_I64,
                   "type numbers");
    const tsr_type types[] = {TSR_TYPE_F16,  TSR_TYPE_BF16, TSR_TYPE_Q4_0, TSR_TYPE_Q4_1, TSR_TYPE_Q5_0,
                              TSR_TYPE_Q5_1, TSR_TYPE_Q8_0, TSR_TYPE_Q4_K, TSR_TYPE_Q5_K, TSR_TYPE_Q6_K};
    enum { N = 1024 };
    static float x[N], ref[N];
    static unsigned char q[N * 4];
    unsigned seed = 42;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        const tsr_type_traits *tr = tsr__type_traits(types[t]);
        CHECK(tr && tr->from_float && tr->to_float);
        CHECK_EQ_INT(tcu_block_size(types[t]), (int)tr->block_size);
        CHECK_EQ_INT(tcu_block_bytes(types[t]), (int)tr->block_bytes);
        for (int i = 0; i < N; i++) x[i] = frand(&seed) * (i % 97 == 0 ? 10.0f : 1.0f);
        tr->from_float(x, q, N);
        tr->to_float(q, ref, N);
        int bad = 0;
        for (int64_t i = 0; i < N; i++) {
            const float got = tcu_load(types[t], q, i, (int64_t)tr->block_bytes);
            if (fabsf(got - ref[i]) > 1e-6f * (1.0f + fabsf(ref[i])) && bad++ < 3)
                fprintf(stderr, "%s element %lld: %g, reference %g\n", tr->name, (long long)i, got, ref[i]);
        }
        CHECK(bad == 0);
        printf("%-5s %d elements as the reference dequantizer\n", tr->name, N);
        /* the integer dot products with Q8_1 activations: each 32-value
         * segment as the float dot of the dequantized weights with the
         * activations' values d * qs */
        CHECK_EQ_INT(tcu_dot_q8_1_type(types[t]), types[t] != TSR_TYPE_F16 && types[t] != TSR_TYPE_BF16);
        if (!tcu_dot_q8_1_type(types[t]))
            continue;
        static float y[N];
        static tcu_q8_1 yq[N / 32];
        for (int i = 0; i < N; i++) y[i] = frand(&seed) * (i % 61 == 0 ? 8.0f : 1.0f);
        int bad_q = 0, bad_dot = 0;
        for (int g = 0; g < N / 32; g++) {
            tcu_quantize_q8_1(y + 32 * g, &yq[g]);
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                sum += yq[g].qs[i];
                bad_q += fabsf(y[32 * g + i] - yq[g].d * yq[g].qs[i]) > 0.5f * yq[g].d * (1 + 1e-5f) + 1e-30f;
            }
            bad_q += yq[g].s != yq[g].d * (float)sum;
            const int spb = (int)tr->block_size / 32;
            const float got = tcu_dot_q8_1(types[t], q + (size_t)(g / spb) * tr->block_bytes, g % spb, &yq[g]);
            double want = 0, mag = 0;
            for (int i = 0; i < 32; i++) {
                const double w = ref[32 * g + i], v = (double)yq[g].d * yq[g].qs[i];
                want += w * v;
                mag += fabs(w * v) + fabs(w) * fabs(v) * 16; /* the offset terms of the formulas */
            }
            if (fabs(got - want) > 2e-6 * mag + 1e-30 && bad_dot++ < 3)
                fprintf(stderr, "%s segment %d: dot %.9g, reference %.9g\n", tr->name, g, got, want);
            /* as the mat-vec splits a segment: four parts of two 4-value groups */
            const unsigned char *blk = q + (size_t)(g / spb) * tr->block_bytes;
            float parts = 0;
            for (int p = 0; p < 4; p++) parts += tcu_dot_q8_1_part(types[t], blk, g % spb, &yq[g], 2 * p, 2 * p + 2);
            if (fabs(parts - want) > 2e-6 * mag + 1e-30 && bad_dot++ < 3)
                fprintf(stderr, "%s segment %d: dot in 4 parts %.9g, reference %.9g\n", tr->name, g, parts, want);
        }
        CHECK(bad_q == 0 && bad_dot == 0, "%s: %d quantized values off, %d dots off", tr->name, bad_q, bad_dot);
        printf("%-5s %d segments: Q8_1 integer dots (whole and in 4 parts) as the float reference\n", tr->name, N / 32);
    }
    int bad = 0;
    for (uint32_t bits = 0; bits < 0xffffffffu - 99991u; bits += 99991u) {
        float f;
        memcpy(&f, &bits, 4);
        const uint16_t h = tcu_float_to_half(f), href = tsr__fp32_to_fp16(f);
        const uint16_t b = tcu_float_to_bf16(f), bref = tsr__fp32_to_bf16(f);
        if (isnan(f))
            bad += (h & 0x7c00) != 0x7c00 || !(h & 0x3ff);
        else
            bad += h != href || b != bref;
        bad += tcu_half_to_float(href) != tsr__fp16_to_fp32(href) && !isnan(tsr__fp16_to_fp32(href));
    }
    CHECK_EQ_INT(bad, 0);
    for (int i = 0; i < N; i++) x[i] = frand(&seed);
    static unsigned char a[N / 32 * 34], b[N / 32 * 34];
    tsr__type_traits(TSR_TYPE_Q8_0)->from_float(x, a, N);
    for (int i = 0; i < N / 32; i++) tcu_quantize_q8_0(x + 32 * i, b + 34 * i);
    CHECK(memcmp(a, b, sizeof a) == 0);
    return tsrtest_done("test-cuda-quant");
}
