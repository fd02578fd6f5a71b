/*
 * elementwise.cu - add/sub/mul/div with broadcasting, scale, silu, gelu,
 * sigmoid, swiglu and geglu. One thread per output element over a grid-stride loop;
 * the element's coordinates come from its flat index over dst's shape, the
 * sources are read through their own byte strides (views, permutations).
 */
#include "common.cuh"

__device__ __forceinline__ void tcu_coords(const tcu_tensor &t, int64_t i, int64_t c[4]) {
    c[0] = i % t.ne[0];
    i /= t.ne[0];
    c[1] = i % t.ne[1];
    i /= t.ne[1];
    c[2] = i % t.ne[2];
    c[3] = i / t.ne[2];
}

__device__ __forceinline__ float tcu_gelu(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

__global__ void k_binary(int op, tcu_tensor dst, tcu_tensor a, tcu_tensor b, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c[4];
        tcu_coords(dst, i, c);
        const float x = tcu_get(a, c[0], c[1], c[2], c[3]);
        const float y = tcu_get(b, c[0] % b.ne[0], c[1] % b.ne[1], c[2] % b.ne[2], c[3] % b.ne[3]);
        float r;
        switch (op) {
        case TCU_ADD: r = x + y; break;
        case TCU_SUB: r = x - y; break;
        case TCU_MUL: r = x * y; break;
        default: r = x / y; break;
        }
        *(float *)tcu_at(dst, c[0], c[1], c[2], c[3]) = r;
    }
}

/* kind: 0 scale, 1 silu, 2 gelu, 3 swiglu, 4 geglu, 5 sigmoid */
__global__ void k_unary(int kind, tcu_tensor dst, tcu_tensor a, tcu_tensor b, float s, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c[4];
        tcu_coords(dst, i, c);
        const float x = tcu_get(a, c[0], c[1], c[2], c[3]);
        float r;
        switch (kind) {
        case 0: r = x * s; break;
        case 1: r = tcu_silu(x); break;
        case 2: r = tcu_gelu(x); break;
        case 3: r = tcu_silu(x) * tcu_get(b, c[0], c[1], c[2], c[3]); break;
        case 5: r = 1.0f / (1.0f + expf(-x)); break;
        default: r = tcu_gelu(x) * tcu_get(b, c[0], c[1], c[2], c[3]); break;
        }
        *(float *)tcu_at(dst, c[0], c[1], c[2], c[3]) = r;
    }
}

static int64_t tcu_nelem(const tcu_tensor &t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }

extern "C" cudaError_t tcu_binary(cudaStream_t s, int op, tcu_tensor dst, tcu_tensor a, tcu_tensor b) {
    const int64_t n = tcu_nelem(dst);
    if (n == 0)
        return cudaSuccess;
    k_binary<<<tcu_blocks(n, 256), 256, 0, s>>>(op, dst, a, b, n);
    return TCU_LAUNCHED();
}

static cudaError_t tcu_unary_launch(cudaStream_t s, int kind, tcu_tensor dst, tcu_tensor a, tcu_tensor b, float f) {
    const int64_t n = tcu_nelem(dst);
    if (n == 0)
        return cudaSuccess;
    k_unary<<<tcu_blocks(n, 256), 256, 0, s>>>(kind, dst, a, b, f, n);
    return TCU_LAUNCHED();
}

extern "C" cudaError_t tcu_scale(cudaStream_t s, tcu_tensor dst, tcu_tensor a, float scale) {
    return tcu_unary_launch(s, 0, dst, a, a, scale);
}

extern "C" cudaError_t tcu_unary(cudaStream_t s, int op, tcu_tensor dst, tcu_tensor a) {
    return tcu_unary_launch(s, op == TCU_SILU ? 1 : op == TCU_GELU ? 2 : 5, dst, a, a, 0.0f);
}

extern "C" cudaError_t tcu_glu(cudaStream_t s, int op, tcu_tensor dst, tcu_tensor a, tcu_tensor b) {
    return tcu_unary_launch(s, op == TCU_SILU ? 3 : 4, dst, a, b, 0.0f);
}
