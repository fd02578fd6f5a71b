/*
 * unpack.h - a block of 32 values of a quantized weight row as bytes in a
 * 256-bit vector, for the interleaving gemms (avx2/gemm.c, avx512/gemm.c);
 * included only by files compiled with at least -mavx2 -mfma -mf16c, after
 * cpu.h and simd.h.
 */
#ifndef TSR_CPU_UNPACK_H
#define TSR_CPU_UNPACK_H

/* Block b (32 values) of a row of a quantized type as bytes: Q8_0's signed
 * values; otherwise the unsigned stored values (Q4_0, Q4_1, Q4_K: 0..15;
 * Q5_0, Q5_1, Q5_K: 0..31; Q6_K: 0..63), with the block's scale d and
 * minimum m (Q4_1, Q5_1, Q4_K, Q5_K: value = d * q + m; Q4_0, Q5_0, Q6_K
 * d * (q - 8, 16, 32); Q6_K: d for values 0..15, m the scale of 16..31). */
static inline __attribute__((always_inline)) __m256i tsr__blk32_bytes(tsr_type t, const char *row, int64_t b, float *d,
                                                                      float *m) {
    *m = 0.0f;
    switch (t) {
    case TSR_TYPE_Q8_0: {
        const tsr_block_q8_0 *q = (const tsr_block_q8_0 *)row + b;
        *d = TSR_FP16_TO_FP32(q->d);
        return _mm256_loadu_si256((const __m256i *)q->qs);
    }
    case TSR_TYPE_Q4_0: {
        const tsr_block_q4_0 *q = (const tsr_block_q4_0 *)row + b;
        *d = TSR_FP16_TO_FP32(q->d);
        return nibbles32(q->qs);
    }
    case TSR_TYPE_Q5_0: {
        const tsr_block_q5_0 *q = (const tsr_block_q5_0 *)row + b;
        *d = TSR_FP16_TO_FP32(q->d);
        return _mm256_or_si256(nibbles32(q->qs), _mm256_and_si256(bits_to_bytes32(q->qh), _mm256_set1_epi8(0x10)));
    }
    case TSR_TYPE_Q4_1: {
        const tsr_block_q4_1 *q = (const tsr_block_q4_1 *)row + b;
        *d = TSR_FP16_TO_FP32(q->d);
        *m = TSR_FP16_TO_FP32(q->m);
        return nibbles32(q->qs);
    }
    case TSR_TYPE_Q5_1: {
        const tsr_block_q5_1 *q = (const tsr_block_q5_1 *)row + b;
        *d = TSR_FP16_TO_FP32(q->d);
        *m = TSR_FP16_TO_FP32(q->m);
        return _mm256_or_si256(nibbles32(q->qs), _mm256_and_si256(bits_to_bytes32(q->qh), _mm256_set1_epi8(0x10)));
    }
    case TSR_TYPE_Q4_K:
    case TSR_TYPE_Q5_K: {
        /* sub-block j of the super-block: nibbles of bytes 32 * (j / 2) .. +31, low for even j */
        const int j = (int)(b % 8);
        const uint8_t *scales, *qs;
        float dd, dmin;
        __m256i hi = _mm256_setzero_si256();
        if (t == TSR_TYPE_Q4_K) {
            const tsr_block_q4_K *q = (const tsr_block_q4_K *)row + b / 8;
            dd = TSR_FP16_TO_FP32(q->d), dmin = TSR_FP16_TO_FP32(q->dmin), scales = q->scales, qs = q->qs;
        } else {
            const tsr_block_q5_K *q = (const tsr_block_q5_K *)row + b / 8;
            dd = TSR_FP16_TO_FP32(q->d), dmin = TSR_FP16_TO_FP32(q->dmin), scales = q->scales, qs = q->qs;
            /* bit j of qh[l] is the fifth bit of value l */
            const __m256i h = _mm256_loadu_si256((const __m256i *)q->qh);
            hi = _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h, j), 4), _mm256_set1_epi8(0x10));
        }
        uint8_t sc, mn;
        tsr__get_scale_min_k4(j, scales, &sc, &mn);
        *d = dd * sc;
        *m = -dmin * mn;
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
        if (j & 1)
            v = _mm256_srli_epi16(v, 4);
        return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)), hi);
    }
    default: { /* TSR_TYPE_Q6_K: sub-block j of 32 = t of the 128-value half h */
        const tsr_block_q6_K *q = (const tsr_block_q6_K *)row + b / 8;
        const int j = (int)(b % 8), h = j / 4, tt = j % 4;
        const float dd = TSR_FP16_TO_FP32(q->d);
        *d = dd * q->scales[8 * h + 2 * tt];
        *m = dd * q->scales[8 * h + 2 * tt + 1];
        __m256i lo = _mm256_loadu_si256((const __m256i *)(q->ql + 64 * h + 32 * (tt & 1)));
        if (tt >= 2)
            lo = _mm256_srli_epi16(lo, 4);
        lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0F));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(q->qh + 32 * h));
        hb = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * tt), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
    }
    }
}

#endif /* TSR_CPU_UNPACK_H */
