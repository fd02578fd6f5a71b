/*
 * kernels.h - the launchers of the CUDA kernels (the .cu files of cuda/), callable from C
 * (cuda/cuda.c). A tensor crosses as a tcu_tensor: type, shape, byte
 * strides and device address, all 64-bit. Each launcher enqueues on the
 * stream and returns cudaGetLastError() of the launch (cudaSuccess or why
 * the launch failed); it never synchronizes. Grids keep every dimension
 * within 65,535 blocks and loop (grid-stride) over what is left.
 */
#ifndef TCU_KERNELS_H
#define TCU_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tcu_tensor {
    int type; /* tsr_type */
    int64_t ne[4];
    int64_t nb[4];
    char *data;
} tcu_tensor;

#define TCU_MAX_GRID 65535

/* backend.c: counts one kernel launch (every launcher calls it per kernel). */
void tcu_count_launch(void);

enum { TCU_ADD, TCU_SUB, TCU_MUL, TCU_DIV };
enum { TCU_SILU, TCU_GELU, TCU_SIGMOID };

/* elementwise.cu: dst F32; a, b F32/F16/BF16 (b broadcasts over a). */
cudaError_t tcu_binary(cudaStream_t s, int op, tcu_tensor dst, tcu_tensor a, tcu_tensor b);
cudaError_t tcu_scale(cudaStream_t s, tcu_tensor dst, tcu_tensor a, float scale);
cudaError_t tcu_unary(cudaStream_t s, int op, tcu_tensor dst, tcu_tensor a); /* TCU_SILU, TCU_GELU, TCU_SIGMOID */
cudaError_t tcu_glu(cudaStream_t s, int op, tcu_tensor dst, tcu_tensor a, tcu_tensor b);

/* norm.cu: rows of F32 (contiguous rows). mask NULL = none. */
cudaError_t tcu_norm(cudaStream_t s, int rms, tcu_tensor dst, tcu_tensor a, float eps);
/* The same, and dst2 = dst * w (w F32, broadcast over dst; dst2 F32 of
 * dst's shape, contiguous rows): a norm and its weight in one launch; yq
 * (not NULL): dst2 also as the mat-vec's Q8_1 activations (what
 * tcu_activations writes for an integer weight type; ne0 % 32 == 0). */
cudaError_t tcu_norm_mul(cudaStream_t s, int rms, tcu_tensor dst, tcu_tensor a, float eps, tcu_tensor dst2,
                         tcu_tensor w, void *yq);
cudaError_t tcu_softmax(cudaStream_t s, tcu_tensor dst, tcu_tensor a, const tcu_tensor *mask, float scale);

/* rope.cu: params are the node's op_params (TSR_ROPE_P_* of internal.h). */
cudaError_t tcu_rope(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor pos, const tcu_tensor *ff,
                     const int32_t *params);
/* The same, and (cache not NULL) set_rows of one token's rotated rows
 * (dst [hd, n_head_kv, 1]) into the cache [hd, n_ctx, n_head_kv]: element
 * (i0, h) at element i0 of row idx[0] (I32 or I64; a row past the cache
 * is skipped) of plane h; cache F32, F16 or BF16. */
cudaError_t tcu_rope_set_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor pos, const tcu_tensor *ff,
                              const int32_t *params, const tcu_tensor *cache, const tcu_tensor *idx);

/* rows.cu: gathers, scatters, copies with conversion, concat, argmax. */
cudaError_t tcu_get_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor idx);
cudaError_t tcu_set_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor src, tcu_tensor idx);
cudaError_t tcu_cpy(cudaStream_t s, tcu_tensor dst, tcu_tensor src);
cudaError_t tcu_concat(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor b, int dim);
cudaError_t tcu_argmax(cudaStream_t s, tcu_tensor dst, tcu_tensor a);

/* matmul.cu. Matrix (i2, i3) of a (any readable type) as a contiguous
 * [ne1][ne0] F16 (to_f16) or F32 (to_f32) array. */
cudaError_t tcu_matrix_to_f16(cudaStream_t s, void *out, tcu_tensor a, int64_t i2, int64_t i3);
cudaError_t tcu_matrix_to_f32(cudaStream_t s, float *out, tcu_tensor a, int64_t i2, int64_t i3);
/* dst = a x b for few columns: y holds all of b's rows (b->ne[1]*ne[2]*ne[3]
 * of them, in order) converted once by tcu_activations for a's type: Q8_1
 * blocks for the integer types (tcu_dot_q8_1_type), contiguous F32 for the
 * float ones; a block of several warps takes a row of a and dots it with
 * every column (the column count a template argument: one kernel per count
 * up to TCU_MMV_MAX_COLS). */
#define TCU_MMV_MAX_COLS 8
cudaError_t tcu_activations(cudaStream_t s, void *y, tcu_tensor b, int wtype);
/* The node after the product in the same launch (epi NULL: none): dst
 * still gets the product v, and epi->dst (F32, dst's shape) gets v + x
 * (TCU_EPI_ADD: the residual), silu(v) * x (TCU_EPI_SWIGLU_A: v is the
 * gate) or silu(x) * v (TCU_EPI_SWIGLU_B: v is the up projection), x F32
 * of dst's shape, read and written at v's coordinates. TCU_EPI_SWIGLU_PAIR:
 * two products of the same activations in one launch, v = a x b (the gate)
 * into dst and u = epi->a2 x b (the up projection; a2 of a's type and
 * shape) into epi->x, and silu(v) * u into epi->dst. */
enum { TCU_EPI_NONE, TCU_EPI_ADD, TCU_EPI_SWIGLU_A, TCU_EPI_SWIGLU_B, TCU_EPI_SWIGLU_PAIR };
typedef struct tcu_mmv_epi {
    int mode;
    tcu_tensor dst, x, a2;
} tcu_mmv_epi;
/* y NULL: float weights read b (F32, contiguous rows, row strides whole
 * floats) in place. */
cudaError_t tcu_mat_vec(cudaStream_t s, tcu_tensor dst, tcu_tensor a, tcu_tensor b, const void *y,
                        const tcu_mmv_epi *epi);
/* Every element of a into contiguous F32 (rows in order). */
cudaError_t tcu_tensor_to_f32(cudaStream_t s, float *out, tcu_tensor a);

/* mul_mat_id (dst [m, n_used, n_tokens], as [k, m, n_expert], ids I32
 * [n_used, n_tokens]). Few tokens: tcu_mat_vec_id, y = b ([k, n_b, n_tokens])
 * by tcu_activations; a pair whose id is outside 0..n_expert-1 gets zeros
 * and the first such is recorded in status (int[5]: flag, node, id, token,
 * slot). More tokens: the host groups the pairs (t * n_used + slot) by
 * expert, tcu_mmid_gather puts their rows of b in that order (F16 or F32),
 * cuBLAS multiplies each expert's rows, tcu_mmid_scatter puts the products
 * (c, contiguous, m wide) back into dst. */
cudaError_t tcu_mat_vec_id(cudaStream_t s, tcu_tensor dst, tcu_tensor as, tcu_tensor ids, const void *y, int64_t n_b,
                           int node, int *status);
cudaError_t tcu_mmid_gather(cudaStream_t s, void *out, int f16, tcu_tensor b, const int *pairs, int64_t n_pairs,
                            int64_t n_used);
cudaError_t tcu_mmid_scatter(cudaStream_t s, tcu_tensor dst, const float *c, const int *pairs, int64_t n_pairs,
                             int64_t n_used);

/* sort.cu: F32 rows; sum_rows into F32 [1, ne1, ne2, ne3]; argsort and
 * top_k (the first k of the descending argsort) into I32, rows of at most
 * TCU_SORT_MAX values. */
#define TCU_SORT_MAX 1024
cudaError_t tcu_sum_rows(cudaStream_t s, tcu_tensor dst, tcu_tensor a);
cudaError_t tcu_argsort(cudaStream_t s, tcu_tensor dst, tcu_tensor a, int desc, int k);

/* fattn.cu: tiles of query rows against tiles of keys in shared memory,
 * the keys split over blocks when the rows alone leave multiprocessors idle
 * (n_sm: the device's), the vector kernel for head dimensions too large for
 * a tile; K/V F32, F16 or Q8_0. The splits' partial results need scratch
 * of tcu_flash_attn_scratch bytes (0: none); a launch with less returns
 * cudaErrorInvalidValue. */
size_t tcu_flash_attn_scratch(tcu_tensor q, tcu_tensor k, tcu_tensor v, int n_sm);
cudaError_t tcu_flash_attn(cudaStream_t s, tcu_tensor dst, tcu_tensor q, tcu_tensor k, tcu_tensor v,
                           const tcu_tensor *mask, float scale, int n_sm, void *scratch, size_t scratch_size);

#ifdef __cplusplus
}
#endif

#endif /* TCU_KERNELS_H */
