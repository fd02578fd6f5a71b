/*
 * avx2/table.c - the AVX2+FMA+F16C kernel table: the scalar table
 * (../ref.c) with what each file of this folder implements put over it
 * (built with -mavx2 -mfma -mf16c, used only when the CPU has them).
 */
#include "../cpu.h"

void tsr__cpu_kernels_avx2(tsr_cpu_kernels *k) {
    k->name = "avx2";
    tsr__cpu_avx2_rows(k);
    tsr__cpu_avx2_dot(k);
    tsr__cpu_avx2_quantize(k);
    tsr__cpu_avx2_gemv(k);
    tsr__cpu_avx2_gemm(k);
}
