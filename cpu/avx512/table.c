/*
 * avx512/table.c - the AVX-512 kernel table (F, BW, VL; VNNI for the
 * 8-bit kernels): the AVX2 table with what each file of this folder
 * implements put over it. This folder has no quantize.c: its activations
 * are quantized by AVX2's.
 */
#include "../cpu.h"

#include <string.h>

void tsr__cpu_kernels_avx512(tsr_cpu_kernels *k, bool vnni) {
    k->name = vnni ? "avx512_vnni" : "avx512";
    /* the interleaved layout has AVX2 kernels only; the AVX-512 ones read the stored layout */
    memset(k->gemv_il8, 0, sizeof k->gemv_il8);
    memset(k->gemm_il8, 0, sizeof k->gemm_il8);
    tsr__cpu_avx512_rows(k);
    tsr__cpu_avx512_dot(k, vnni);
    tsr__cpu_avx512_gemv(k, vnni);
    tsr__cpu_avx512_gemm(k, vnni);
}
