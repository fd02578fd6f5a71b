/*
 * tcu_emu.h - the CUDA execution model on the host, for tests: force-included
 * (g++ -include) into the kernel files (the .cu files of cuda/), which cuda/emu/cu2cc.awk
 * has rewritten as C++ (a launch `k<<<grid, block, shmem, stream>>>(args)`
 * becomes `tcu_emu::launch(grid, block, shmem, stream).go(k, "k")(args)`,
 * `extern __shared__ T name[];` the launch's dynamic shared memory, and
 * `__launch_bounds__(n)` a call that declares it to the launch).
 *
 * Each block's threads run as cooperative fibers (cuda/emu/emu.cc) that
 * switch only at barriers: __syncthreads (all the block's threads, at the
 * same place), __syncwarp and the warp shuffles and votes (the lanes of the
 * mask). A barrier that cannot complete (a thread exited or waits
 * elsewhere) fails the launch with a report, never hangs. Blocks run one
 * after another, so __shared__ variables are static storage.
 */
#ifndef TCU_EMU_H
#define TCU_EMU_H

#include "cuda_fp16.h"
#include "cuda_runtime_api.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <utility>

/* The device code's paths (cuda/quant.h): plain loads, __dp4a, the
 * hardware's half conversions, here the emulator's. */
#define __CUDA_ARCH__ 900

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)

namespace tcu_emu {

struct thread_state {
    uint3 idx;
    int lane, warp;
};
struct block_state {
    uint3 idx;
    dim3 dim, grid;
    void *dyn_shared;
};
extern thread_local const thread_state *t_thread;
extern thread_local const block_state *t_block;

void syncthreads(const char *file, int line);
int syncthreads_vote(int pred, int kind, const char *file, int line); /* kind 0 or, 1 and, 2 count */
void syncwarp(unsigned mask, const char *file, int line);
struct syncwarp_at { /* __syncwarp(mask = all lanes) */
    const char *file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { syncwarp(mask, file, line); }
};
/* Each lane of mask gives v; the 32 lanes' values after all arrived. */
const uint64_t *warp_exchange(unsigned mask, uint64_t v, const char *what, const char *file, int line);
void *dynamic_shared(void);
void launch_bounds(int n);
/* Fails the launch with a report; never returns to the calling thread. */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A launch: the configuration, then the kernel and its arguments (copied,
 * as the kernel's parameters are). */
typedef void (*thunk)(void *args);
cudaError_t run(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t s, thunk fn,
                void *args, void (*free_args)(void *));

template <class... P> struct bound {
    typedef std::tuple<typename std::decay<P>::type...> args_t;
    struct packed {
        void (*k)(P...);
        args_t args;
    };
    void (*k)(P...);
    const char *name;
    dim3 grid, block;
    size_t shmem;
    cudaStream_t s;
    template <class... A> cudaError_t operator()(A &&...a) const {
        packed *p = new packed{k, args_t(std::forward<A>(a)...)};
        return run(name, (const void *)k, grid, block, shmem, s, &invoke, p, &destroy);
    }
    static void invoke(void *p) {
        packed *q = (packed *)p;
        std::apply(q->k, q->args);
    }
    static void destroy(void *p) { delete (packed *)p; }
};

struct launcher {
    dim3 grid, block;
    size_t shmem;
    cudaStream_t s;
    template <class... P> bound<P...> go(void (*k)(P...), const char *name) const {
        return bound<P...>{k, name, grid, block, shmem, s};
    }
};
static inline launcher launch(dim3 grid, dim3 block, size_t shmem = 0, cudaStream_t s = 0) {
    return launcher{grid, block, shmem, s};
}

template <class T> static inline uint64_t bits(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
/* The value of lane src (in the width-lane segment of the caller) after the exchange. */
template <class T>
static inline T shfl(const char *what, const char *file, int line, unsigned mask, T v, int src, int width) {
    const uint64_t *all = warp_exchange(mask, bits(v), what, file, line);
    if (src < 0 || src >= 32 || !(mask >> src & 1u))
        fail("%s:%d: %s: lane %d reads lane %d, outside the mask 0x%08x", file, line, what, t_thread->lane, src, mask);
    (void)width;
    return from_bits<T>(all[src]);
}
static inline int seg_src(int lane, int src, int width) { return (lane & ~(width - 1)) | (src & (width - 1)); }

} // namespace tcu_emu

#define threadIdx (::tcu_emu::t_thread->idx)
#define blockIdx (::tcu_emu::t_block->idx)
#define blockDim (::tcu_emu::t_block->dim)
#define gridDim (::tcu_emu::t_block->grid)

#define __syncthreads() ::tcu_emu::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(p) ::tcu_emu::syncthreads_vote((p) != 0, 0, __FILE__, __LINE__)
#define __syncthreads_and(p) ::tcu_emu::syncthreads_vote((p) != 0, 1, __FILE__, __LINE__)
#define __syncthreads_count(p) ::tcu_emu::syncthreads_vote((p) != 0, 2, __FILE__, __LINE__)
#define __syncwarp(...) ::tcu_emu::syncwarp_at{__FILE__, __LINE__}(__VA_ARGS__)

#define __shfl_xor_sync(mask, v, o, ...)                                \
    ::tcu_emu::shfl("__shfl_xor_sync", __FILE__, __LINE__, (mask), (v), \
                    ::tcu_emu::seg_src(::tcu_emu::t_thread->lane, ::tcu_emu::t_thread->lane ^ (o), 32), 32)
#define __shfl_sync(mask, v, src, ...) \
    ::tcu_emu::shfl("__shfl_sync", __FILE__, __LINE__, (mask), (v), (int)(src)&31, 32)
#define __shfl_down_sync(mask, v, d, ...)                                                            \
    ::tcu_emu::shfl("__shfl_down_sync", __FILE__, __LINE__, (mask), (v),                             \
                    ::tcu_emu::t_thread->lane + (int)(d) < 32 ? ::tcu_emu::t_thread->lane + (int)(d) \
                                                              : ::tcu_emu::t_thread->lane,           \
                    32)
#define __shfl_up_sync(mask, v, d, ...)                                                              \
    ::tcu_emu::shfl("__shfl_up_sync", __FILE__, __LINE__, (mask), (v),                               \
                    ::tcu_emu::t_thread->lane - (int)(d) >= 0 ? ::tcu_emu::t_thread->lane - (int)(d) \
                                                              : ::tcu_emu::t_thread->lane,           \
                    32)

namespace tcu_emu {
static inline unsigned ballot(unsigned mask, int pred, const char *file, int line) {
    const uint64_t *all = warp_exchange(mask, pred != 0, "__ballot_sync", file, line);
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && all[l])
            r |= 1u << l;
    return r;
}
} // namespace tcu_emu
#define __ballot_sync(mask, p) ::tcu_emu::ballot((mask), (p), __FILE__, __LINE__)
#define __any_sync(mask, p) (::tcu_emu::ballot((mask), (p), __FILE__, __LINE__) != 0)
#define __all_sync(mask, p) (::tcu_emu::ballot((mask), (p), __FILE__, __LINE__) == (unsigned)(mask))

/* Atomics: the blocks' threads are fibers of one host thread, launches
 * are serialized, so a plain read-modify-write is atomic. */
template <class T> static inline T atomicAdd(T *p, T v) {
    const T o = *p;
    *p = o + v;
    return o;
}
template <class T> static inline T atomicMax(T *p, T v) {
    const T o = *p;
    *p = o > v ? o : v;
    return o;
}
template <class T> static inline T atomicMin(T *p, T v) {
    const T o = *p;
    *p = o < v ? o : v;
    return o;
}
template <class T> static inline T atomicExch(T *p, T v) {
    const T o = *p;
    *p = v;
    return o;
}
template <class T> static inline T atomicCAS(T *p, T cmp, T v) {
    const T o = *p;
    if (o == cmp)
        *p = v;
    return o;
}

static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> 8 * i) * (int)(int8_t)(b >> 8 * i);
    return c;
}
static inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) c += (unsigned)(uint8_t)(a >> 8 * i) * (unsigned)(uint8_t)(b >> 8 * i);
    return c;
}

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }

#endif /* TCU_EMU_H */
