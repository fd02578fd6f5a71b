/*
 * internal.h - private declarations shared by the core (libtensr/) and the
 * backends: the tensor and context structs, op numbering and parameters,
 * error recording, the allocation wrappers. Never installed.
 */
#ifndef TSR_INTERNAL_H
#define TSR_INTERNAL_H

#include "libtensr.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define TSR_MAX_SRC 6
#define TSR_MAX_OP_PARAMS 16
#define TSR_MAX_NAME 64
#define TSR_ALIGN 64 /* alignment of host buffers and of tensors inside compute buffers */

#if defined(__GNUC__)
#define TSR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define TSR_UNUSED __attribute__((unused))
#else
#define TSR_PRINTF(a, b)
#define TSR_UNUSED
#endif

/* ---- errors (status.c) --------------------------------------------------
 * tsr__error sets the thread-local detail and returns the status, so a
 * failure is reported as `return tsr__error(TSR_E_IO, "%s: %s", path, ...)`. */
tsr_status tsr__error(tsr_status s, const char *fmt, ...) TSR_PRINTF(2, 3);
tsr_status tsr__verror(tsr_status s, const char *fmt, va_list ap);
/* Prefixes the current thread-local detail with "prefix: ". */
void tsr__error_prefix(const char *fmt, ...) TSR_PRINTF(1, 2);

/* ---- logging (log.c) ---------------------------------------------------- */
bool tsr__log_enabled(tsr_log_level level);
/* fields: n_fields pairs of (key, value) strings. Formats into stack memory. */
void tsr__log(tsr_log_level level, const char *msg, size_t n_fields, ...);
/* Same, with the fields as an array of 2 * n_fields strings (key, value, ...). */
void tsr__log_fields(tsr_log_level level, const char *msg, size_t n_fields, const char *const *kv);
/* key/value where value is printf-formatted: tsr__logf(level, msg, "k1", "%d", x, NULL) is
 * not offered; format values with tsr__fmt into small stack buffers instead. */
const char *tsr__fmt(char *buf, size_t size, const char *fmt, ...) TSR_PRINTF(3, 4);

/* ---- memory (alloc wrappers, status.c) -----------------------------------
 * Every allocation in the library goes through these, so tests can fail the
 * Nth one (tsr__test_fail_alloc_after) and count them (tsr__alloc_count). */
void *tsr__malloc(size_t size);
void *tsr__calloc(size_t n, size_t size);
void *tsr__realloc(void *p, size_t size);
void tsr__free(void *p);
char *tsr__strdup(const char *s);
/* Aligned host memory (TSR_ALIGN or larger power of two); freed with tsr__aligned_free. */
void *tsr__aligned_alloc(size_t alignment, size_t size);
void tsr__aligned_free(void *p);
/* Growable arrays: makes *arr (elements of elem bytes, *cap of them) hold at
 * least need elements, doubling from 16; false, with nothing changed, on
 * overflow or when memory runs out (the caller reports TSR_E_NOMEM). */
bool tsr__grow(void **arr, size_t *cap, size_t need, size_t elem);
#define TSR_GROW(arr, cap, need) tsr__grow((void **)&(arr), &(cap), (need), sizeof *(arr))
/* Test hooks: exported for the test suite as tsr_test_* via a private header (tests/). */
uint64_t tsr__alloc_count(void);
void tsr__fail_alloc_after(int64_t n); /* -1 = never fail */
/* Graphs planned by every scheduler so far (a compute run on its last plan
 * counts none; sched.c). */
uint64_t tsr__plan_count(void);
/* The same, but only that one allocation fails: those after it succeed (the
 * paths that recover from a failure, and what they do next, are walked too). */
void tsr__fail_alloc_once(int64_t n);
/* Allocations made through the wrappers and not yet freed (a leak check
 * without a sanitizer: the same number before and after a workload). */
int64_t tsr__alloc_live(void);

/* Overflow-checked arithmetic: false on overflow. */
static inline bool tsr__mul_overflow(size_t a, size_t b, size_t *out) { return __builtin_mul_overflow(a, b, out); }
static inline bool tsr__add_overflow(size_t a, size_t b, size_t *out) { return __builtin_add_overflow(a, b, out); }
static inline size_t tsr__pad(size_t x, size_t align) { return (x + align - 1) / align * align; }

/* Copies the caller's struct (the first `size` bytes it knows about) over
 * defaults; fields beyond the caller's size keep their defaults. */
#define TSR_PARAMS_COPY(dst, src)                                                                              \
    do {                                                                                                       \
        size_t n_ = (src)->size < sizeof *(dst) ? (src)->size : sizeof *(dst);                                 \
        if (n_ > sizeof(size_t))                                                                               \
            memcpy((char *)(dst) + sizeof(size_t), (const char *)(src) + sizeof(size_t), n_ - sizeof(size_t)); \
    } while (0)

/* ---- types (type.c) ----------------------------------------------------- */
typedef void (*tsr_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*tsr_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct tsr_type_traits {
    const char *name;
    int64_t block_size; /* 0 = not a type this version knows */
    size_t block_bytes;
    bool quantized;
    tsr_to_float_fn to_float;     /* reference dequantize; NULL if unsupported */
    tsr_from_float_fn from_float; /* reference quantize; NULL if unsupported */
} tsr_type_traits;

/* Traits of a type; NULL for a number that is not a known type. */
const tsr_type_traits *tsr__type_traits(tsr_type type);

/* ---- ops ----------------------------------------------------------------
 * The op table: every op is declared here once, and the enum, the names,
 * the allocator's in-place rules and each backend's table follow from it.
 * Adding an op is a line here, an entry in each backend's table (cpu/cpu.c),
 * a builder in graph/ops.c, a kernel and its op-harness case.
 *
 * X(NAME, name, n_src, donors, writes, params)
 *   n_src   sources the op reads (optional ones count; they are NULL when absent)
 *   donors  bit mask of the sources whose memory the result may take over
 *           when the source dies at the node: the kernel reads each element
 *           (row) of them before it writes the same element (row) of the result
 *   writes  the source the op writes in place (its result is a view of it), or -1
 *   params  layout of op_params, one letter per 32-bit slot: 'i' int32, 'f' float */
#define TSR_OPS(X)                                                                         \
    X(NONE, "none", 0, 0x0, -1, "") /* leaf: input, weight, new_tensor, KV cache */        \
    X(VIEW, "view", 0, 0x0, -1, "") /* view/reshape/permute/transpose of view_src */       \
    X(ADD, "add", 2, 0x3, -1, "")                                                          \
    X(SUB, "sub", 2, 0x3, -1, "")                                                          \
    X(MUL, "mul", 2, 0x3, -1, "")                                                          \
    X(DIV, "div", 2, 0x3, -1, "")                                                          \
    X(SCALE, "scale", 1, 0x1, -1, "f") /* scale */                                         \
    X(MUL_MAT, "mul_mat", 2, 0x0, -1, "")                                                  \
    X(GET_ROWS, "get_rows", 2, 0x0, -1, "")  /* a, idx */                                  \
    X(SET_ROWS, "set_rows", 3, 0x0, 0, "")   /* dst (written), rows, idx */                \
    X(RMS_NORM, "rms_norm", 1, 0x1, -1, "f") /* eps */                                     \
    X(NORM, "norm", 1, 0x1, -1, "f")         /* eps */                                     \
    X(ROPE, "rope", 3, 0x1, -1, "iiiffffff") /* a, pos, freq_factors|NULL; TSR_ROPE_P_* */ \
    X(SOFTMAX, "softmax", 2, 0x1, -1, "f")   /* a, mask|NULL; scale */                     \
    X(SILU, "silu", 1, 0x1, -1, "")                                                        \
    X(GELU, "gelu", 1, 0x1, -1, "")                                                        \
    X(SWIGLU, "swiglu", 2, 0x3, -1, "")                                                    \
    X(GEGLU, "geglu", 2, 0x3, -1, "")                                                      \
    X(CONCAT, "concat", 2, 0x0, -1, "i") /* dim */                                         \
    X(ARGMAX, "argmax", 1, 0x0, -1, "")                                                    \
    X(CPY, "cpy", 2, 0x0, 1, "")                 /* from, to (written) */                  \
    X(CONT, "cont", 1, 0x0, -1, "")              /* contiguous copy, converting types */   \
    X(FLASH_ATTN, "flash_attn", 4, 0x0, -1, "f") /* q, k, v, mask|NULL; scale */           \
    X(MUL_MAT_ID, "mul_mat_id", 3, 0x0, -1, "")  /* as (experts), b, ids */                \
    X(ARGSORT, "argsort", 1, 0x0, -1, "i")       /* order (tsr_sort_order) */              \
    X(TOP_K, "top_k", 1, 0x0, -1, "i")           /* k */                                   \
    X(SIGMOID, "sigmoid", 1, 0x1, -1, "")                                                  \
    X(SUM_ROWS, "sum_rows", 1, 0x0, -1, "")

typedef enum tsr_op {
#define TSR_OP_ENUM_(NAME, name, n_src, donors, writes, params) TSR_OP_##NAME,
    TSR_OPS(TSR_OP_ENUM_)
#undef TSR_OP_ENUM_
        TSR_OP_COUNT
} tsr_op;

typedef struct tsr_op_info {
    const char *name;
    int n_src;
    unsigned donors;
    int writes;
    const char *params;
} tsr_op_info;

/* The table entry of op; NULL for a number that is not an op. */
const tsr_op_info *tsr__op_info(tsr_op op);
const char *tsr__op_name(tsr_op op); /* "?" for a number that is not an op */

/* ---- per-token profile (profile.c; TSR_PROFILE=1) ---------------------------- */
/* Slots: the fixed parts, then one per op (TSR_PROF_OP0 + op). */
enum { TSR_PROF_BUILD, TSR_PROF_PLAN, TSR_PROF_RUN, TSR_PROF_BARRIER, TSR_PROF_OP0 };
bool tsr__prof_on(void);     /* TSR_PROFILE set (read once) */
int64_t tsr__prof_now(void); /* monotonic ns */
void tsr__prof_add(int slot, int64_t ns);
void tsr__prof_tokens(int64_t n); /* one micro-batch of n tokens decoded */
void tsr__prof_print(FILE *f);    /* the table; at exit when on */

/* Rope op params: i32[0] n_dims, i32[1] mode, i32[2] n_ctx_orig,
 * f32[3] freq_base, f32[4] freq_scale, f32[5] ext_factor, f32[6] attn_factor,
 * f32[7] beta_fast, f32[8] beta_slow. */
enum {
    TSR_ROPE_P_N_DIMS = 0,
    TSR_ROPE_P_MODE,
    TSR_ROPE_P_N_CTX_ORIG,
    TSR_ROPE_P_FREQ_BASE,
    TSR_ROPE_P_FREQ_SCALE,
    TSR_ROPE_P_EXT_FACTOR,
    TSR_ROPE_P_ATTN_FACTOR,
    TSR_ROPE_P_BETA_FAST,
    TSR_ROPE_P_BETA_SLOW
};

/* Tensor flags. */
enum {
    TSR_FLAG_INPUT = 1u << 0,   /* lives in system memory, copied to the device that needs it */
    TSR_FLAG_WEIGHT = 1u << 1,  /* backend weight */
    TSR_FLAG_PERSIST = 1u << 2, /* has its own memory (new_tensor, KV cache) */
    TSR_FLAG_OUTPUT = 1u << 3,  /* an output of the current compute */
    TSR_FLAG_INPLACE = 1u << 4, /* node writes into src[0]'s (SET_ROWS) or src[1]'s (CPY) memory */
    /* Two bits of the buffer type's own layout (tsr_buft_iface.to_stored;
     * the core only turns a tensor back and clears them on a copy): */
    TSR_FLAG_OWN_LAYOUT = 1u << 5,  /* its bytes are in its buffer type's own layout, not as stored */
    TSR_FLAG_KEEP_STORED = 1u << 6, /* its buffer type is to keep it as stored */
    TSR_FLAG_BATCHINV = 1u << 7,    /* planned by a batch-invariant stream: the same bits whatever the batch */
};

struct tsr_tensor {
    tsr_type type;
    int n_dims;
    int64_t ne[TSR_MAX_DIMS];
    size_t nb[TSR_MAX_DIMS];

    tsr_op op;
    int32_t op_params[TSR_MAX_OP_PARAMS];
    tsr_tensor *src[TSR_MAX_SRC];
    tsr_tensor *view_src; /* for views and in-place results: the tensor whose memory this is */
    size_t view_offs;     /* byte offset into view_src's memory */

    tsr_buffer *buffer;  /* memory, once allocated (NULL for system-memory inputs) */
    void *data;          /* address of element 0 in its buffer (device address for GPU buffers) */
    uint64_t generation; /* backend compute generation that produced data (for non-leaf nodes) */

    tsr_context *ctx; /* owning context; NULL for backend weights and cache tensors */
    uint32_t flags;
    int device_id; /* scheduler: index of the backend device that runs/holds it; -1 = none */
    /* Bookkeeping of one compute, each slot owned by one pass: */
    uint32_t visit_mark;  /* graph.c: traversal mark (the backend's visit_mark when visited) */
    int32_t alloc_id;     /* alloc.c: allocation id in the plan; -1 = no compute memory */
    int32_t shadow_head;  /* sched.c: first shadow (per-device copy) entry ... */
    uint32_t shadow_mark; /* ... valid while this equals the backend's visit_mark */
    char name[TSR_MAX_NAME];
};

static inline float tsr__get_f32_param(const tsr_tensor *t, int i) {
    float f;
    memcpy(&f, &t->op_params[i], sizeof f);
    return f;
}
static inline void tsr__set_f32_param(tsr_tensor *t, int i, float f) { memcpy(&t->op_params[i], &f, sizeof f); }

/* ---- tensor helpers (tensor.c) ------------------------------------------ */
int64_t tsr__nelements(const tsr_tensor *t);
int64_t tsr__nrows(const tsr_tensor *t);    /* ne1*ne2*ne3 */
size_t tsr__nbytes(const tsr_tensor *t);    /* bytes spanned in memory (strided extent) */
size_t tsr__row_bytes(const tsr_tensor *t); /* tsr_row_size(type, ne0) */
bool tsr__is_contiguous(const tsr_tensor *t);
bool tsr__is_contiguous_rows(const tsr_tensor *t); /* each row contiguous (nb0 == element size) */
bool tsr__same_shape(const tsr_tensor *a, const tsr_tensor *b);
bool tsr__can_repeat(const tsr_tensor *small, const tsr_tensor *big); /* big->ne[i] % small->ne[i] == 0 */
/* Sets nb for a contiguous layout of ne; false on overflow. */
bool tsr__set_contiguous_strides(tsr_tensor *t);
/* The tensor that owns the memory (follows view_src). */
tsr_tensor *tsr__view_root(tsr_tensor *t);
/* True when t's data lives in memory it or its view root holds permanently
 * (leaf with memory: input, weight, persistent). */
bool tsr__has_static_data(const tsr_tensor *t);

/* ---- contexts (context.c) ------------------------------------------------ */
/* A new tensor struct in the context's arena (zeroed, ctx set, device_id -1). */
tsr_tensor *tsr__new_tensor_struct(tsr_context *ctx);
/* Records the first error of the context (and the thread's last error) and
 * returns NULL, so ops write `return tsr__op_error(ctx, TSR_E_INVALID, "...")`. */
tsr_tensor *tsr__op_error(tsr_context *ctx, tsr_status s, const char *fmt, ...) TSR_PRINTF(3, 4);
/* Registers memory freed when the context closes (aligned host memory or a buffer). */
tsr_status tsr__context_own_host(tsr_context *ctx, void *aligned_mem);
tsr_status tsr__context_own_buffer(tsr_context *ctx, tsr_buffer *buf);

#endif /* TSR_INTERNAL_H */
