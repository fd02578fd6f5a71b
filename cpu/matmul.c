/*
 * matmul.c - CPU matrix multiplication. The activations (src1) are
 * converted ONCE per call into the weight type's dot type (Q8_0, Q8_1, Q8_K,
 * F16 or F32) in the work buffer, all threads sharing the conversion; then
 * the output is cut into tiles of weight rows x activation columns, handed
 * out dynamically (an atomic counter), so each weight row is reused from
 * cache across the columns of its tile.
 */
#include "cpu.h"

#define TILE_ROWS 16
#define TILE_COLS 16
#define GEMM_TILE_COLS 24  /* F16: a multiple of the AVX2 gemm's 3 columns */
#define QGEMM_TILE_COLS 64 /* quantized: each 8-row repack serves 64 columns */

/* How dst is computed: ggml's tinyBLAS order for F16 (sgemm), the kernel
 * table's register-tiled gemm (>= 2 activation columns), or the dot
 * products; returns the type the activations are converted to. */
typedef enum { MM_DOT, MM_SGEMM, MM_GEMM } mm_path;

static tsr_type mm_plan(const tsr_cpu_kernels *k, const tsr_tensor *dst, mm_path *path) {
    const tsr_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t nr1 = b->ne[1] * b->ne[2] * b->ne[3];
    /* ggml hands F16 matmuls of >= 2 columns to llamafile's tinyBLAS, which
     * sums in another order than its vec_dot: the AVX-512 kernels follow it. */
    if (a->type == TSR_TYPE_F16 && k->dot_type[a->type] == TSR_TYPE_F16 && k->sgemm_kn > 0 && b->ne[1] >= 2 &&
        a->ne[0] % k->sgemm_kn == 0 && a->ne[1] % 4 == 0) {
        *path = MM_SGEMM;
        return TSR_TYPE_F16;
    }
    if (k->gemm[a->type] && nr1 >= 2 && dst->nb[0] == sizeof(float)) {
        *path = MM_GEMM;
        return k->gemm_type[a->type];
    }
    *path = MM_DOT;
    return k->dot_type[a->type];
}

static size_t conv_bytes(const tsr_tensor *dst, tsr_type dt, size_t *row_bytes) {
    const tsr_tensor *b = dst->src[1];
    *row_bytes = tsr__pad(tsr_row_size(dt, b->ne[0]), 4);
    return tsr__pad(*row_bytes * (size_t)(b->ne[1] * b->ne[2] * b->ne[3]), TSR_ALIGN);
}

/* Per-thread scratch: a row of src1 as F32 (conversion), then the gemm's. */
static size_t thread_bytes(const tsr_tensor *dst, mm_path path) {
    const int64_t k = dst->src[1]->ne[0];
    size_t b = (size_t)k * sizeof(float);
    if (path == MM_GEMM && TSR_CPU_GEMM_SCRATCH(k) > b)
        b = TSR_CPU_GEMM_SCRATCH(k);
    return tsr__pad(b, TSR_ALIGN);
}

size_t tsr__cpu_mul_mat_work(const tsr_tensor *dst, int nth) {
    size_t row_bytes;
    mm_path path;
    const size_t conv = conv_bytes(dst, mm_plan(tsr__cpu_kernels(), dst, &path), &row_bytes);
    return conv + (size_t)nth * thread_bytes(dst, path);
}

/* Phase 1: rows of src1 -> dot type, split over threads. */
static void convert_src1(const tsr_compute_params *p, const tsr_tensor *b, tsr_type dt, char *wdata, size_t row_bytes,
                         float *tmp) {
    int64_t r0, r1;
    tsr__cpu_split(b->ne[1] * b->ne[2] * b->ne[3], p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % b->ne[1], i2 = (r / b->ne[1]) % b->ne[2], i3 = r / (b->ne[1] * b->ne[2]);
        const char *src = (const char *)b->data + i1 * (int64_t)b->nb[1] + i2 * (int64_t)b->nb[2] +
                          i3 * (int64_t)b->nb[3];
        const float *x = (const float *)src;
        if (b->type != TSR_TYPE_F32 || b->nb[0] != sizeof(float)) {
            for (int64_t i = 0; i < b->ne[0]; i++) tmp[i] = tsr__cpu_load_f(b->type, src + i * (int64_t)b->nb[0]);
            x = tmp;
        }
        p->k->from_float[dt](x, wdata + (size_t)r * row_bytes, b->ne[0]);
    }
}

void tsr__cpu_op_mul_mat(const tsr_compute_params *p, tsr_tensor *dst) {
    const tsr_tensor *a = dst->src[0], *b = dst->src[1];
    const tsr_cpu_kernels *k = p->k;
    mm_path path;
    const tsr_type dt = mm_plan(k, dst, &path);
    const bool sgemm = path == MM_SGEMM;
    const tsr_vec_dot_fn dot = sgemm ? k->sgemm_dot_f16 : k->vec_dot[a->type];
    void (*const dot4)(int64_t, float *, const void *, const void *, size_t) = sgemm ? k->sgemm_dot4_f16
                                                                                     : k->vec_dot4[a->type];
    size_t row_bytes;
    const size_t conv = conv_bytes(dst, dt, &row_bytes);
    char *wdata = p->work;
    void *scratch = (char *)p->work + conv + (size_t)p->ith * thread_bytes(dst, path);
    convert_src1(p, b, dt, wdata, row_bytes, scratch);
    if (p->ith == 0)
        atomic_store(&p->stream->chunk, p->nth);
    tsr__tp_barrier(p->stream->tp);

    const int64_t nr0 = a->ne[1], nr1 = b->ne[1] * b->ne[2] * b->ne[3];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const int64_t blk0 = nr1 == 1 ? 4 * TILE_ROWS : TILE_ROWS, blk1 = path != MM_GEMM ? TILE_COLS
                                                                      : tsr_type_block_size(a->type) > 1
                                                                          ? QGEMM_TILE_COLS
                                                                          : GEMM_TILE_COLS;
    const int64_t nc0 = (nr0 + blk0 - 1) / blk0, nc1 = (nr1 + blk1 - 1) / blk1;
    for (int64_t c = p->ith; c < nc0 * nc1; c = atomic_fetch_add(&p->stream->chunk, 1)) {
        const int64_t i0s = (c % nc0) * blk0, i0e = i0s + blk0 < nr0 ? i0s + blk0 : nr0;
        const int64_t j0s = (c / nc0) * blk1, j0e = j0s + blk1 < nr1 ? j0s + blk1 : nr1;
        for (int64_t j = j0s; j < j0e;) {
            const int64_t i11 = j % b->ne[1], i12 = (j / b->ne[1]) % b->ne[2], i13 = j / (b->ne[1] * b->ne[2]);
            const char *arow = (const char *)a->data + (i12 / r2) * (int64_t)a->nb[2] + (i13 / r3) * (int64_t)a->nb[3];
            const char *yrow = wdata + (size_t)j * row_bytes;
            char *drow = (char *)dst->data + i11 * (int64_t)dst->nb[1] + i12 * (int64_t)dst->nb[2] +
                         i13 * (int64_t)dst->nb[3];
            if (path == MM_GEMM) { /* the columns of this tile in the same matrix, at once */
                const int64_t je = j0e < j - i11 + b->ne[1] ? j0e : j - i11 + b->ne[1];
                k->gemm[a->type](a->ne[0], i0e - i0s, je - j, arow + i0s * (int64_t)a->nb[1], a->nb[1], yrow, row_bytes,
                                 (float *)drow + i0s, dst->nb[1] / sizeof(float), scratch);
                j = je;
                continue;
            }
            if (dot4 && j + 4 <= j0e && i11 + 4 <= b->ne[1]) { /* four columns of the same matrix */
                for (int64_t i = i0s; i < i0e; i++) {
                    float s4[4];
                    dot4(a->ne[0], s4, arow + i * (int64_t)a->nb[1], yrow, row_bytes);
                    for (int c = 0; c < 4; c++)
                        *(float *)(drow + c * (int64_t)dst->nb[1] + i * (int64_t)dst->nb[0]) = s4[c];
                }
                j += 4;
                continue;
            }
            for (int64_t i = i0s; i < i0e; i++)
                dot(a->ne[0], (float *)(drow + i * (int64_t)dst->nb[0]), arow + i * (int64_t)a->nb[1], yrow);
            j++;
        }
    }
}
