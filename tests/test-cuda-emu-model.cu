/*
 * test-cuda-emu-model.cu - the emulator's own checks (cuda/emu/), on small
 * kernels of this file, built as the module's kernels are (cu2cc.awk, then
 * C++ against tcu_emu.h): warp shuffles, votes and a block reduction give
 * exact values; dynamic shared memory is per launch; a captured stream runs
 * nothing until its graph is launched. And each defect the emulator
 * stands for is reported as the GPU would fail, in a child process (an
 * error poisons the context): a __syncthreads in divergent code, a thread
 * that exits before a barrier the others wait at, a warp mask naming lanes
 * that do not exist, a block of 512 threads without __launch_bounds__,
 * more than 48 KiB of dynamic shared memory without the attribute.
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures, checks;
#define CHECK(c)                                                                  \
    do {                                                                          \
        checks++;                                                                 \
        if (!(c)) {                                                               \
            failures++;                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
        }                                                                         \
    } while (0)

__global__ void k_reduce(float *out, const float *x) {
    __shared__ float part[32];
    float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0;
        for (unsigned w = 0; w < blockDim.x / 32; w++) s += part[w];
        out[blockIdx.x] = s;
    }
}

__global__ void k_votes(int *out) {
    const int t = threadIdx.x;
    const int count = __syncthreads_count(t % 3 == 0), any = __syncthreads_or(t == 17), all = __syncthreads_and(t < 64);
    const unsigned ballot = __ballot_sync(0xffffffffu, t & 1);
    const int down = __shfl_down_sync(0xffffffffu, t, 1), src = __shfl_sync(0xffffffffu, t, 5);
    out[t] = count * 1000000 + any * 100000 + all * 10000 + (ballot == 0xaaaaaaaau) * 1000 +
             (down == (t % 32 == 31 ? t : t + 1)) * 100 + (src == (t / 32) * 32 + 5) * 10;
}

__global__ void k_dynamic(float *out) {
    extern __shared__ float sh[];
    sh[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = sh[blockDim.x - 1 - threadIdx.x];
}

__global__ void k_divergent(int *out) {
    if (threadIdx.x < 40)
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_exits(int *out) {
    if (threadIdx.x == 5)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_partial_warp(float *out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1); }

__global__ void k_large(int *out) { out[threadIdx.x] = 1; }

__global__ void __launch_bounds__(512) k_large_bounded(int *out) { out[threadIdx.x] = 1; }

/* Runs one faulty launch in a child; 0 when it fails with want. */
static int expect_failure(const char *what, int which, cudaError_t want) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        int *d = NULL;
        if (cudaMalloc((void **)&d, 1024 * sizeof(int)) != cudaSuccess)
            _exit(2);
        switch (which) {
        case 0: k_divergent<<<1, 64>>>(d); break;
        case 1: k_exits<<<1, 64>>>(d); break;
        case 2: k_partial_warp<<<1, 48>>>((float *)d); break;
        case 3: k_large<<<1, 512>>>(d); break;
        default: k_dynamic<<<1, 32, 64 * 1024>>>((float *)d); break;
        }
        const cudaError_t e = cudaGetLastError();
        fprintf(stderr, "  %s: %s\n", what, cudaGetErrorName(e));
        _exit(e == want ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 1;
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
    enum { B = 3, T = 256 };
    float *x = NULL, *out = NULL;
    CHECK(cudaMalloc((void **)&x, B * T * sizeof(float)) == cudaSuccess);
    CHECK(cudaMalloc((void **)&out, 512 * sizeof(float)) == cudaSuccess); /* k_large_bounded writes 512 */
    float hx[B * T], want[B] = {0, 0, 0};
    for (int i = 0; i < B * T; i++) {
        hx[i] = (float)(i % 7) - 2.5f;
        want[i / T] += hx[i];
    }
    CHECK(cudaMemcpyAsync(x, hx, sizeof hx, cudaMemcpyHostToDevice, 0) == cudaSuccess);
    k_reduce<<<B, T>>>(out, x);
    CHECK(cudaGetLastError() == cudaSuccess);
    float got[T];
    CHECK(cudaMemcpyAsync(got, out, B * sizeof(float), cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    for (int b = 0; b < B; b++) CHECK(got[b] == want[b]);

    int *votes = (int *)out, hv[96];
    k_votes<<<1, 96>>>(votes);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaMemcpyAsync(hv, votes, sizeof hv, cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    for (int t = 0; t < 96; t++) CHECK(hv[t] == 32 * 1000000 + 100000 + 0 + 1000 + 100 + 10);

    k_dynamic<<<1, 40, 40 * sizeof(float)>>>(out);
    CHECK(cudaMemcpyAsync(got, out, 40 * sizeof(float), cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    for (int t = 0; t < 40; t++) CHECK(got[t] == (float)(39 - t));

    /* a capture records; the graph's launch runs */
    cudaStream_t s = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMemsetAsync(out, 0, T * sizeof(float), 0) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    k_reduce<<<B, T, 0, s>>>(out, x);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(cudaMemcpyAsync(got, out, B * sizeof(float), cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    CHECK(got[0] == 0 && got[2] == 0);
    cudaGraphExec_t ge = NULL;
#if CUDART_VERSION >= 12000
    CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
#else
    CHECK(cudaGraphInstantiate(&ge, g, NULL, NULL, 0) == cudaSuccess);
#endif
    CHECK(cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(got, out, B * sizeof(float), cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    for (int b = 0; b < B; b++) CHECK(got[b] == want[b]);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);

    k_large_bounded<<<1, 512>>>((int *)out);
    CHECK(cudaGetLastError() == cudaSuccess);

    printf("the emulator's reports (each in a child; the GPU's error):\n");
    CHECK(expect_failure("__syncthreads in divergent code", 0, cudaErrorLaunchFailure) == 0);
    CHECK(expect_failure("a thread exits before a barrier", 1, cudaErrorLaunchFailure) == 0);
    CHECK(expect_failure("a full mask on a warp of 16 lanes", 2, cudaErrorLaunchFailure) == 0);
    CHECK(expect_failure("512 threads without __launch_bounds__", 3, cudaErrorLaunchOutOfResources) == 0);
    CHECK(expect_failure("64 KiB of dynamic shared memory", 4, cudaErrorInvalidValue) == 0);
    cudaFree(x);
    cudaFree(out);
    printf("test-cuda-emu-model: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
