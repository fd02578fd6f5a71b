/*
 * emu.cc - the CUDA emulator's engine, for tests: the execution model of
 * tcu_emu.h (each block's threads as fibers that switch at barriers and
 * warp exchanges, deadlocks reported), the runtime calls of
 * cuda_runtime_api.h (device memory as exact-size host allocations, so
 * ASan sees a kernel index past its buffer; streams that run their work at
 * once or record it while captured; graphs that replay the record) and
 * cublasGemmEx as a reference GEMM. One emulated device, CUDA0, with an
 * H100's limits (TCU_EMU_MEMORY bytes of memory, default 8 GiB).
 *
 * Not modeled: timing, concurrency between blocks (they run one after
 * another, so races between blocks and the memory model go unseen),
 * registers (a block over 256 threads must declare __launch_bounds__),
 * host memory read by a kernel (one address space).
 */
#include "cublas_v2.h"
#include "tcu_emu.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#if !defined(__x86_64__) || defined(TCU_EMU_UCONTEXT)
#define TCU_EMU_UCONTEXT 1
#include <ucontext.h>
#endif

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define TCU_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TCU_EMU_ASAN 1
#endif
#endif
#ifdef TCU_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TCU_EMU_STACK (1u << 20)
#else
#define TCU_EMU_STACK (256u << 10)
#endif

#define TCU_EMU_EXPORT extern "C"

namespace tcu_emu {

thread_local const thread_state *t_thread;
thread_local const block_state *t_block;

/* ---- fibers ------------------------------------------------------------------ */

/* A fiber's saved context. On x86-64 a switch saves the callee-saved
 * registers on the stack it leaves and loads the other's (no system call,
 * unlike swapcontext's signal mask: a block switches at every barrier). */
#ifdef TCU_EMU_UCONTEXT
struct ctx {
    ucontext_t uc;
};
static void ctx_make(ctx *c, char *stack, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
static void ctx_swap(ctx *from, ctx *to) { swapcontext(&from->uc, &to->uc); }
#else
extern "C" void tcu_emu_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl tcu_emu_switch\n"
    ".hidden tcu_emu_switch\n"
    ".type tcu_emu_switch,@function\n"
    "tcu_emu_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size tcu_emu_switch, .-tcu_emu_switch\n");
struct ctx {
    void *sp;
};
/* The first switch to c pops six zero registers and returns into entry,
 * with the stack aligned as at a call (entry never returns). */
static void ctx_make(ctx *c, char *stack, size_t size, void (*entry)()) {
    void **sp = (void **)((uintptr_t)(stack + size) & ~(uintptr_t)15);
    *--sp = nullptr;
    *--sp = (void *)entry;
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    c->sp = sp;
}
static void ctx_swap(ctx *from, ctx *to) { tcu_emu_switch(&from->sp, to->sp); }
#endif

enum { F_READY, F_WAIT, F_DONE };

struct fiber {
    ctx uc;
    char *stack; /* above a guard page */
    int state;
    bool at_warp; /* waiting at a warp exchange, else at __syncthreads */
    const char *what, *file;
    int line;
    thread_state ts;
    void *fake;
};

struct warp_sync {
    unsigned arrived, mask, gen;
    const char *what, *file;
    int line;
    uint64_t slot[2][32];
};

/* The launch being run (one at a time: g_lock). */
struct exec {
    const char *name;
    dim3 grid, block;
    thunk fn;
    void *args;
    int n;
    block_state bs;
    fiber *cur;
    int bar_arrived, bar_kind;
    unsigned bar_gen;
    const char *bar_file;
    int bar_line;
    int vote_acc[2], vote_res[2];
    std::vector<warp_sync> warps;
    bool failed;
    int bound; /* __launch_bounds__ declared by the kernel, 0 none */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static exec *g_exec;
static ctx g_sched;
static std::vector<fiber *> &g_pool =
    *new std::vector<fiber *>(); /* never destroyed: the fibers stay reachable (LSan) */
static bool g_pool_dirty;        /* a failed launch left frames on fiber stacks */
#ifdef TCU_EMU_ASAN
static const void *g_sched_bottom;
static size_t g_sched_size;
#endif

static void to_sched(fiber *f, bool dying) {
#ifdef TCU_EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &f->fake, g_sched_bottom, g_sched_size);
#else
    (void)dying;
#endif
    ctx_swap(&f->uc, &g_sched);
#ifdef TCU_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake, &g_sched_bottom, &g_sched_size);
#endif
}

static void to_fiber(fiber *f) {
#ifdef TCU_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, TCU_EMU_STACK);
#endif
    t_thread = &f->ts;
    g_exec->cur = f;
    ctx_swap(&g_sched, &f->uc);
#ifdef TCU_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

static void fiber_main() {
    exec *e = g_exec;
    fiber *f = e->cur;
#ifdef TCU_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_sched_bottom, &g_sched_size);
#endif
    e->fn(e->args);
    f->state = F_DONE;
    to_sched(f, true);
    abort(); /* a finished fiber is never resumed */
}

static fiber *pool_get(int i) {
    while ((int)g_pool.size() <= i) {
        fiber *f = new fiber();
        const size_t page = 4096;
        char *m = (char *)mmap(nullptr, TCU_EMU_STACK + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "tcu-emu: cannot map a fiber stack\n");
            abort();
        }
        mprotect(m, page, PROT_NONE); /* a stack overflow faults */
        f->stack = m + page;
        g_pool.push_back(f);
    }
    return g_pool[i];
}

/* ---- reports ------------------------------------------------------------------- */

static void report(const char *msg) {
    exec *e = g_exec;
    fprintf(stderr, "tcu-emu: kernel %s, block (%u,%u,%u) of (%u,%u,%u), %u threads: %s\n", e->name, e->bs.idx.x,
            e->bs.idx.y, e->bs.idx.z, e->grid.x, e->grid.y, e->grid.z, e->block.x * e->block.y * e->block.z, msg);
    if (getenv("TCU_EMU_ABORT"))
        abort();
}

void fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    exec *e = g_exec;
    char full[640];
    snprintf(full, sizeof full, "thread (%u,%u,%u): %s", t_thread->idx.x, t_thread->idx.y, t_thread->idx.z, msg);
    report(full);
    e->failed = true;
    g_pool_dirty = true;
    fiber *f = e->cur;
    f->state = F_DONE;
    to_sched(f, true);
    abort();
}

/* ---- barriers --------------------------------------------------------------------- */

static void wait_here(fiber *f, bool warp, const char *what, const char *file, int line) {
    f->state = F_WAIT;
    f->at_warp = warp;
    f->what = what;
    f->file = file;
    f->line = line;
    to_sched(f, false);
}

static int block_barrier(int pred, int kind, const char *file, int line) {
    exec *e = g_exec;
    fiber *f = e->cur;
    const unsigned g = e->bar_gen;
    if (e->bar_arrived == 0) {
        e->bar_file = file;
        e->bar_line = line;
        e->bar_kind = kind;
        e->vote_acc[g & 1] = kind == 1 ? 1 : 0;
    } else if (e->bar_line != line || strcmp(e->bar_file, file) || e->bar_kind != kind) {
        fail("__syncthreads at %s:%d while %d threads of the block wait at %s:%d (a barrier in divergent code)", file,
             line, e->bar_arrived, e->bar_file, e->bar_line);
    }
    int &acc = e->vote_acc[g & 1];
    acc = kind == 1 ? (acc && pred) : kind == 2 ? acc + pred : (acc || pred);
    if (++e->bar_arrived == e->n) {
        e->bar_arrived = 0;
        e->vote_res[g & 1] = acc;
        e->bar_gen++;
        for (int i = 0; i < e->n; i++)
            if (g_pool[i]->state == F_WAIT && !g_pool[i]->at_warp)
                g_pool[i]->state = F_READY;
        return e->vote_res[g & 1];
    }
    wait_here(f, false, "__syncthreads", file, line);
    return e->vote_res[g & 1];
}

void syncthreads(const char *file, int line) { (void)block_barrier(0, -1, file, line); }

int syncthreads_vote(int pred, int kind, const char *file, int line) { return block_barrier(pred, kind, file, line); }

const uint64_t *warp_exchange(unsigned mask, uint64_t v, const char *what, const char *file, int line) {
    exec *e = g_exec;
    fiber *f = e->cur;
    const int lane = f->ts.lane, w = f->ts.warp;
    const int in_warp = e->n - 32 * w < 32 ? e->n - 32 * w : 32;
    const unsigned live = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1;
    if (mask & ~live)
        fail("%s:%d: %s with mask 0x%08x names lanes that do not exist (warp %d has %d threads)", file, line, what,
             mask, w, in_warp);
    if (!(mask >> lane & 1u))
        fail("%s:%d: %s with mask 0x%08x from lane %d, outside its own mask", file, line, what, mask, lane);
    warp_sync &ws = e->warps[w];
    if (ws.arrived == 0) {
        ws.mask = mask;
        ws.what = what;
        ws.file = file;
        ws.line = line;
    } else if (ws.mask != mask || strcmp(ws.what, what)) {
        fail("%s:%d: %s (mask 0x%08x) while other lanes of warp %d wait at %s (%s:%d, mask 0x%08x)", file, line, what,
             mask, w, ws.what, ws.file, ws.line, ws.mask);
    }
    const unsigned g = ws.gen;
    ws.slot[g & 1][lane] = v;
    ws.arrived |= 1u << lane;
    if (ws.arrived == mask) {
        ws.arrived = 0;
        ws.gen++;
        for (int i = 32 * w; i < 32 * w + in_warp; i++)
            if (g_pool[i]->state == F_WAIT && g_pool[i]->at_warp)
                g_pool[i]->state = F_READY;
        return ws.slot[g & 1];
    }
    wait_here(f, true, what, file, line);
    return e->warps[w].slot[g & 1];
}

void syncwarp(unsigned mask, const char *file, int line) { (void)warp_exchange(mask, 0, "__syncwarp", file, line); }

void *dynamic_shared(void) { return g_exec->bs.dyn_shared; }

void launch_bounds(int n) { g_exec->bound = n; }

/* ---- running a launch ----------------------------------------------------------- */

/* Why nothing can run while some threads have not finished. */
static void report_deadlock(exec *e) {
    int done = 0, at_bar = 0, at_warp = 0;
    const fiber *bar = nullptr, *warp = nullptr;
    for (int i = 0; i < e->n; i++) {
        const fiber *f = g_pool[i];
        if (f->state == F_DONE)
            done++;
        else if (f->at_warp)
            at_warp++, warp = warp ? warp : f;
        else
            at_bar++, bar = bar ? bar : f;
    }
    char msg[512];
    int k = snprintf(msg, sizeof msg, "deadlock: ");
    if (at_bar)
        k += snprintf(msg + k, sizeof msg - k, "%d threads wait at __syncthreads (%s:%d), ", at_bar, bar->file,
                      bar->line);
    if (at_warp)
        k += snprintf(msg + k, sizeof msg - k, "%d wait at %s (%s:%d, thread %u), ", at_warp, warp->what, warp->file,
                      warp->line, warp->ts.idx.x);
    snprintf(msg + k, sizeof msg - k, "%d exited: a barrier that not every thread it names reaches", done);
    report(msg);
    e->failed = true;
    g_pool_dirty = true;
}

static void run_block(exec *e) {
    for (int i = 0; i < e->n; i++) {
        fiber *f = pool_get(i);
        ctx_make(&f->uc, f->stack, TCU_EMU_STACK, fiber_main);
        f->state = F_READY;
        f->at_warp = false;
        const unsigned bx = e->block.x, by = e->block.y;
        f->ts.idx = uint3{(unsigned)i % bx, (unsigned)i / bx % by, (unsigned)i / (bx * by)};
        f->ts.lane = i % 32;
        f->ts.warp = i / 32;
    }
    e->bar_arrived = 0;
    for (warp_sync &w : e->warps) w.arrived = 0;
    static const bool reverse = getenv("TCU_EMU_REVERSE") && getenv("TCU_EMU_REVERSE")[0] == '1';
    for (;;) {
        bool progress = false;
        int done = 0;
        for (int k = 0; k < e->n; k++) {
            fiber *f = g_pool[reverse ? e->n - 1 - k : k]; /* TCU_EMU_REVERSE=1: the last thread first */
            if (f->state == F_READY) {
                to_fiber(f);
                progress = true;
                if (e->failed)
                    return;
            }
            done += f->state == F_DONE;
        }
        if (done == e->n)
            return;
        if (!progress) {
            report_deadlock(e);
            return;
        }
    }
}

/* The context's sticky error (a failed kernel poisons it, as on a GPU) and
 * the thread's last error. */
static cudaError_t g_sticky = cudaSuccess;
static thread_local cudaError_t t_last = cudaSuccess;

static cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess && t_last == cudaSuccess)
        t_last = e;
    return e;
}

static std::map<const void *, int> g_max_dyn; /* cudaFuncAttributeMaxDynamicSharedMemorySize */

struct launch_rec {
    const char *name;
    const void *kernel;
    dim3 grid, block;
    size_t shmem;
    thunk fn;
    std::shared_ptr<void> args;
};

static uint64_t g_launches;

static cudaError_t execute(const launch_rec &r) {
    if (g_sticky != cudaSuccess)
        return g_sticky;
    pthread_mutex_lock(&g_lock);
    g_launches++;
    static const bool trace = getenv("TCU_EMU_TRACE") && getenv("TCU_EMU_TRACE")[0] == '1';
    if (trace) /* each launch's kernel and grid on stderr */
        fprintf(stderr, "tcu-emu: launch %s grid (%u,%u,%u) block (%u,%u,%u)\n", r.name, r.grid.x, r.grid.y,
                r.grid.z, r.block.x, r.block.y, r.block.z);
    exec e{};
    e.name = r.name;
    e.grid = r.grid;
    e.block = r.block;
    e.fn = r.fn;
    e.args = r.args.get();
    e.n = (int)(r.block.x * r.block.y * r.block.z);
    e.warps.assign((size_t)(e.n + 31) / 32, warp_sync{});
    e.bs.dim = r.block;
    e.bs.grid = r.grid;
    g_exec = &e;
    t_block = &e.bs;
    if (g_pool_dirty) { /* frames abandoned by a failed launch: their redzones unpoisoned */
#ifdef TCU_EMU_ASAN
        for (fiber *f : g_pool) __asan_unpoison_memory_region(f->stack, TCU_EMU_STACK);
#endif
        g_pool_dirty = false;
    }
    void *dyn = malloc(r.shmem); /* exactly the bytes asked: ASan sees an index past them */
    for (unsigned z = 0; z < r.grid.z && !e.failed; z++)
        for (unsigned y = 0; y < r.grid.y && !e.failed; y++)
            for (unsigned x = 0; x < r.grid.x && !e.failed; x++) {
                e.bs.idx = uint3{x, y, z};
                if (dyn)
                    memset(dyn, 0xff, r.shmem); /* NaNs: shared memory starts undefined */
                e.bs.dyn_shared = dyn;
                run_block(&e);
                if (!e.failed && e.n > 256 && e.bound < e.n) {
                    char msg[200];
                    snprintf(msg, sizeof msg,
                             "a block of %d threads, and the kernel %s: its registers are not capped for it (the "
                             "launch may fail with too many resources requested)",
                             e.n, e.bound ? "declares __launch_bounds__ for fewer" : "declares no __launch_bounds__");
                    report(msg);
                    free(dyn);
                    g_exec = nullptr;
                    t_thread = nullptr;
                    t_block = nullptr;
                    pthread_mutex_unlock(&g_lock);
                    return cudaErrorLaunchOutOfResources;
                }
            }
    free(dyn);
    g_exec = nullptr;
    t_thread = nullptr;
    t_block = nullptr;
    const bool failed = e.failed;
    pthread_mutex_unlock(&g_lock);
    if (failed) {
        g_sticky = cudaErrorLaunchFailure;
        return g_sticky;
    }
    return cudaSuccess;
}

} // namespace tcu_emu

/* ---- streams and graphs ------------------------------------------------------------ */

typedef std::function<cudaError_t()> tcu_op;

struct CUstream_st {
    bool capturing, invalidated;
    std::vector<tcu_op> ops;
};
struct CUgraph_st {
    std::vector<tcu_op> ops;
};
struct CUgraphExec_st {
    std::vector<tcu_op> ops;
};

using namespace tcu_emu;

/* Runs op now (work is ordered: everything runs at once) or records it
 * while s is captured. */
static cudaError_t enqueue(cudaStream_t s, tcu_op op) {
    if (g_sticky != cudaSuccess)
        return set_error(g_sticky);
    if (s && s->capturing) {
        s->ops.push_back(std::move(op));
        return cudaSuccess;
    }
    return set_error(op());
}

cudaError_t tcu_emu::run(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t s,
                         thunk fn, void *args, void (*free_args)(void *)) {
    launch_rec r{name, kernel, grid, block, shmem, fn, std::shared_ptr<void>(args, free_args)};
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "tcu-emu: kernel %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)\n", name, grid.x,
                grid.y, grid.z, block.x, block.y, block.z);
        return set_error(cudaErrorInvalidConfiguration);
    }
    if (shmem > 48 * 1024) {
        auto it = g_max_dyn.find(kernel);
        if (it == g_max_dyn.end() || (size_t)it->second < shmem) {
            fprintf(stderr,
                    "tcu-emu: kernel %s: %zu bytes of dynamic shared memory without "
                    "cudaFuncAttributeMaxDynamicSharedMemorySize for them\n",
                    name, shmem);
            return set_error(cudaErrorInvalidValue);
        }
    }
    return enqueue(s, [r]() { return execute(r); });
}

TCU_EMU_EXPORT cudaError_t tcu_emu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 232448)
        return set_error(cudaErrorInvalidValue);
    g_max_dyn[func] = value;
    return cudaSuccess;
}

/* Kernel launches since the process started (the launch counts per decode
 * step of the tests). */
extern "C" __attribute__((visibility("default"))) unsigned long long tcu_emu_launches(void) { return g_launches; }

/* ---- devices, errors ------------------------------------------------------------------ */

static size_t emu_total(void) {
    static size_t total;
    if (!total) {
        const char *env = getenv("TCU_EMU_MEMORY");
        total = env && atoll(env) > 0 ? (size_t)atoll(env) : (size_t)8 << 30;
    }
    return total;
}

static int g_device;

TCU_EMU_EXPORT cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    if (device != 0)
        return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "libtensr CUDA emulator (sm_90 limits)");
    p->totalGlobalMem = emu_total();
    p->sharedMemPerBlock = 48 * 1024;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (device != 0)
        return set_error(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 232448; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    }
    return set_error(cudaErrorInvalidValue);
}

TCU_EMU_EXPORT cudaError_t cudaSetDevice(int device) {
    if (device != 0)
        return set_error(cudaErrorInvalidDevice);
    g_device = device;
    return g_sticky != cudaSuccess ? set_error(g_sticky) : cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaGetDevice(int *device) {
    *device = g_device;
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaGetLastError(void) {
    const cudaError_t e = t_last != cudaSuccess ? t_last : g_sticky;
    t_last = cudaSuccess;
    return e;
}

TCU_EMU_EXPORT cudaError_t cudaPeekAtLastError(void) { return t_last != cudaSuccess ? t_last : g_sticky; }

TCU_EMU_EXPORT const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define X(n) \
    case n: return #n;
        X(cudaSuccess)
        X(cudaErrorInvalidValue)
        X(cudaErrorMemoryAllocation)
        X(cudaErrorInitializationError)
        X(cudaErrorInvalidConfiguration)
        X(cudaErrorInvalidDevice)
        X(cudaErrorInvalidResourceHandle)
        X(cudaErrorNotSupported)
        X(cudaErrorIllegalAddress)
        X(cudaErrorLaunchOutOfResources)
        X(cudaErrorLaunchTimeout)
        X(cudaErrorHardwareStackError)
        X(cudaErrorIllegalInstruction)
        X(cudaErrorMisalignedAddress)
        X(cudaErrorInvalidAddressSpace)
        X(cudaErrorInvalidPc)
        X(cudaErrorLaunchFailure)
        X(cudaErrorAssert)
        X(cudaErrorECCUncorrectable)
        X(cudaErrorContextIsDestroyed)
        X(cudaErrorNoDevice)
        X(cudaErrorStreamCaptureUnsupported)
        X(cudaErrorStreamCaptureInvalidated)
        X(cudaErrorUnknown)
#undef X
    }
    return "cudaErrorUnknown";
}

TCU_EMU_EXPORT const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorLaunchFailure: return "unspecified launch failure (the emulator reported why)";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "an emulated CUDA error";
    }
}

/* ---- memory ----------------------------------------------------------------------------- */

static std::map<void *, size_t> g_allocs;
static size_t g_used;
static uint64_t g_mallocs; /* cudaMalloc calls that succeeded (tcu_emu_mallocs) */
static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;

TCU_EMU_EXPORT cudaError_t cudaMalloc(void **p, size_t size) {
    *p = nullptr;
    if (g_sticky != cudaSuccess)
        return set_error(g_sticky);
    pthread_mutex_lock(&g_mem_lock);
    const bool room = size <= emu_total() - g_used;
    pthread_mutex_unlock(&g_mem_lock);
    if (!room || posix_memalign(p, 256, size ? size : 1))
        return set_error(cudaErrorMemoryAllocation);
    if (size <= (4u << 20))
        memset(*p, 0xff, size); /* NaNs: device memory starts undefined (not a cuBLAS workspace's 32 MiB) */
    pthread_mutex_lock(&g_mem_lock);
    g_allocs[*p] = size;
    g_used += size;
    g_mallocs++;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}

/* Device allocations so far: a test asserts a compute after reserve adds none. */
extern "C" __attribute__((visibility("default"))) unsigned long long tcu_emu_mallocs(void) {
    pthread_mutex_lock(&g_mem_lock);
    const uint64_t n = g_mallocs;
    pthread_mutex_unlock(&g_mem_lock);
    return n;
}

TCU_EMU_EXPORT cudaError_t cudaFree(void *p) {
    if (!p)
        return cudaSuccess;
    pthread_mutex_lock(&g_mem_lock);
    auto it = g_allocs.find(p);
    const bool known = it != g_allocs.end();
    if (known) {
        g_used -= it->second;
        g_allocs.erase(it);
    }
    pthread_mutex_unlock(&g_mem_lock);
    if (!known)
        return set_error(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

static std::map<void *, size_t> g_pinned; /* cudaMallocHost's allocations */

TCU_EMU_EXPORT cudaError_t cudaMallocHost(void **p, size_t size) {
    *p = malloc(size ? size : 1);
    if (!*p)
        return set_error(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mem_lock);
    g_pinned[*p] = size ? size : 1;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaFreeHost(void *p) {
    pthread_mutex_lock(&g_mem_lock);
    g_pinned.erase(p);
    pthread_mutex_unlock(&g_mem_lock);
    free(p);
    return cudaSuccess;
}

/* Whether p lies in one of the allocations of m (base -> size). */
static bool emu_within(const std::map<void *, size_t> &m, const void *p) {
    auto it = m.upper_bound((void *)p);
    if (it == m.begin())
        return false;
    --it;
    return (const char *)p < (const char *)it->first + it->second;
}

/* As CUDA 11 and later: plain host memory is cudaMemoryTypeUnregistered. */
TCU_EMU_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    pthread_mutex_lock(&g_mem_lock);
    const bool pinned = emu_within(g_pinned, p), dev = emu_within(g_allocs, p);
    pthread_mutex_unlock(&g_mem_lock);
    a->type = pinned ? cudaMemoryTypeHost : dev ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    a->device = pinned || dev ? 0 : -2;
    a->devicePointer = dev ? (void *)p : nullptr;
    a->hostPointer = dev ? nullptr : (void *)p;
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    pthread_mutex_lock(&g_mem_lock);
    *total = emu_total();
    *free_b = emu_total() - g_used;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                           cudaStream_t s) {
    (void)kind;
    return enqueue(s, [=]() {
        if (n)
            memmove(dst, src, n);
        return cudaSuccess;
    });
}

TCU_EMU_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}

TCU_EMU_EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                             size_t height, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)kind;
    if (height > 1 && (dpitch < width || spitch < width))
        return set_error(cudaErrorInvalidValue);
    return enqueue(s, [=]() {
        for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        return cudaSuccess;
    });
}

TCU_EMU_EXPORT cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s) {
    return enqueue(s, [=]() {
        memset(dst, value, n);
        return cudaSuccess;
    });
}

/* ---- streams, graphs ---------------------------------------------------------------------- */

TCU_EMU_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = new CUstream_st();
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}

static std::atomic<unsigned long long> g_syncs; /* host waits on a stream (tcu_emu_syncs) */

extern "C" __attribute__((visibility("default"))) unsigned long long tcu_emu_syncs(void) { return g_syncs; }

TCU_EMU_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s && s->capturing) { /* as CUDA: not while capturing, and the capture is lost */
        s->invalidated = true;
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    g_syncs++;
    return g_sticky != cudaSuccess ? set_error(g_sticky) : cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    (void)mode;
    if (!s || s->capturing)
        return set_error(cudaErrorInvalidValue);
    s->capturing = true;
    s->invalidated = false;
    s->ops.clear();
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    *g = nullptr;
    if (!s || !s->capturing)
        return set_error(cudaErrorInvalidValue);
    s->capturing = false;
    if (s->invalidated) {
        s->ops.clear();
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    *g = new CUgraph_st{std::move(s->ops)};
    s->ops.clear();
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

static cudaError_t instantiate(cudaGraphExec_t *exec, cudaGraph_t g) {
    if (!g)
        return set_error(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{g->ops};
    return cudaSuccess;
}

#if CUDART_VERSION >= 12000
TCU_EMU_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    return instantiate(exec, g);
}
#else
TCU_EMU_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, cudaGraphNode_t *error_node,
                                                char *log, size_t log_size) {
    (void)error_node, (void)log, (void)log_size;
    return instantiate(exec, g);
}
#endif

TCU_EMU_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec)
        return set_error(cudaErrorInvalidValue);
    for (const tcu_op &op : exec->ops) {
        const cudaError_t e = enqueue(s, op);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

TCU_EMU_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

/* ---- cuBLAS: a reference GEMM in double ------------------------------------------------------ */

struct cublasContext {
    cudaStream_t s;
    void *ws;
    size_t ws_size;
};

TCU_EMU_EXPORT cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}

TCU_EMU_EXPORT cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

TCU_EMU_EXPORT cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->s = s;
    h->ws = nullptr; /* as cuBLAS: a new stream drops the user workspace */
    h->ws_size = 0;
    return CUBLAS_STATUS_SUCCESS;
}

TCU_EMU_EXPORT cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t size) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->ws = ws;
    h->ws_size = size;
    return CUBLAS_STATUS_SUCCESS;
}

TCU_EMU_EXPORT const char *cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

TCU_EMU_EXPORT const char *cublasGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "success" : "an emulated cuBLAS error";
}

static double gemm_load(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    return half_bits_to_float(((const uint16_t *)p)[i]);
}

/* C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C: A and B both
 * F32 or both F16, C F32, F32 compute, as cuda/cuda.c calls it. */
TCU_EMU_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                           int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                           const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C,
                                           cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                                           cublasGemmAlgo_t algo) {
    (void)algo;
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    const int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) || lda < (a_rows > 1 ? a_rows : 1) ||
        ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (at != bt || (at != CUDA_R_32F && at != CUDA_R_16F) || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const cudaError_t e = enqueue(h->s, [=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double acc = 0;
                for (int p = 0; p < k; p++) {
                    const size_t ai = ta == CUBLAS_OP_N ? (size_t)i + (size_t)p * lda : (size_t)p + (size_t)i * lda;
                    const size_t bi = tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * ldb : (size_t)j + (size_t)p * ldb;
                    acc += gemm_load(A, at, ai) * gemm_load(B, bt, bi);
                }
                float *c = (float *)C + (size_t)i + (size_t)j * ldc;
                *c = (float)(al * acc + (be != 0.0f ? be * (double)*c : 0.0));
            }
        return cudaSuccess;
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
