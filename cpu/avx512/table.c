/*
 * avx512/table.c - the AVX-512 kernel table (F, BW, VL; VNNI for the
 * 8-bit kernels): the AVX2 table with what each file of this folder
 * implements put over it. This folder has no quantize.c: its activations
 * are quantized by AVX2's.
 */
#include "../cpu.h"

void tsr__cpu_kernels_avx512(tsr_cpu_kernels *k, bool vnni) {
    k->name = vnni ? "avx512_vnni" : "avx512";
    /* The interleaved layout (repack.c) keeps AVX2's gemv_il8: decode reads
     * 8 rows as one stream, summing in the layout's lanes with no
     * horizontal sums (Zen 4, one thread, TinyLlama-1.1B-shaped Q4_0 tg:
     * 30 t/s with this folder's gemv of the stored layout, 42 with it); the
     * gemms (gemm.c) read it through their own packs, without VNNI AVX2's. */
    tsr__cpu_avx512_rows(k);
    tsr__cpu_avx512_dot(k, vnni);
    tsr__cpu_avx512_gemv(k, vnni);
    tsr__cpu_avx512_gemm(k, vnni);
}
