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
/* Test hooks: exported for the test suite as tsr_test_* via a private header (tests/). */
uint64_t tsr__alloc_count(void);
void tsr__fail_alloc_after(int64_t n); /* -1 = never fail */

/* Overflow-checked arithmetic: false on overflow. */
static inline bool tsr__mul_overflow(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool tsr__add_overflow(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline size_t tsr__pad(size_t x, size_t align) { return (x + align - 1) / align * align; }

/* Copies the caller's struct (the first `size` bytes it knows about) over
 * defaults; fields beyond the caller's size keep their defaults. */
#define TSR_PARAMS_COPY(dst, src)                                                       \
    do {                                                                                \
        size_t n_ = (src)->size < sizeof *(dst) ? (src)->size : sizeof *(dst);          \
        if (n_ > sizeof(size_t))                                                        \
            memcpy((char *)(dst) + sizeof(size_t), (const char *)(src) + sizeof(size_t), \
                   n_ - sizeof(size_t));                                                \
    } while (0)

/* ---- types (type.c) ----------------------------------------------------- */
typedef void (*tsr_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*tsr_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct tsr_type_traits {
    const char *name;
    int64_t block_size;        /* 0 = not a type this version knows */
    size_t block_bytes;
    bool quantized;
    tsr_to_float_fn to_float;       /* reference dequantize; NULL if unsupported */
    tsr_from_float_fn from_float;   /* reference quantize; NULL if unsupported */
} tsr_type_traits;

/* Traits of a type; NULL for a number that is not a known type. */
const tsr_type_traits *tsr__type_traits(tsr_type type);

/* ---- ops ---------------------------------------------------------------- */
typedef enum tsr_op {
    TSR_OP_NONE = 0,   /* leaf: input, weight, new_tensor, empty, KV cache */
    TSR_OP_VIEW,       /* view/reshape/permute/transpose: metadata over view_src */
    TSR_OP_ADD,
    TSR_OP_SUB,
    TSR_OP_MUL,
    TSR_OP_DIV,
    TSR_OP_SCALE,      /* f32 param 0: scale */
    TSR_OP_MUL_MAT,
    TSR_OP_GET_ROWS,
    TSR_OP_SET_ROWS,   /* src0 = dst tensor (written in place), src1 = rows, src2 = idx */
    TSR_OP_RMS_NORM,   /* f32 param 0: eps */
    TSR_OP_NORM,       /* f32 param 0: eps */
    TSR_OP_ROPE,       /* src0 a, src1 pos, src2 freq_factors|NULL; params below */
    TSR_OP_SOFTMAX,    /* src0 a, src1 mask|NULL; f32 param 0: scale */
    TSR_OP_SILU,
    TSR_OP_GELU,
    TSR_OP_SWIGLU,
    TSR_OP_GEGLU,
    TSR_OP_CONCAT,     /* i32 param 0: dim */
    TSR_OP_ARGMAX,
    TSR_OP_CPY,        /* src0 = from, src1 = to (written in place); result is a view of src1 */
    TSR_OP_CONT,       /* contiguous copy, with type conversion when types differ */
    TSR_OP_FLASH_ATTN, /* src0 q, src1 k, src2 v, src3 mask|NULL; f32 param 0: scale */
    TSR_OP_COUNT
} tsr_op;

const char *tsr__op_name(tsr_op op);

/* Rope op params: i32[0] n_dims, i32[1] mode, i32[2] n_ctx_orig,
 * f32[3] freq_base, f32[4] freq_scale, f32[5] ext_factor, f32[6] attn_factor,
 * f32[7] beta_fast, f32[8] beta_slow. */
enum { TSR_ROPE_P_N_DIMS = 0, TSR_ROPE_P_MODE, TSR_ROPE_P_N_CTX_ORIG, TSR_ROPE_P_FREQ_BASE,
       TSR_ROPE_P_FREQ_SCALE, TSR_ROPE_P_EXT_FACTOR, TSR_ROPE_P_ATTN_FACTOR,
       TSR_ROPE_P_BETA_FAST, TSR_ROPE_P_BETA_SLOW };

/* Tensor flags. */
enum {
    TSR_FLAG_INPUT = 1u << 0,    /* lives in system memory, copied to the device that needs it */
    TSR_FLAG_WEIGHT = 1u << 1,   /* backend weight */
    TSR_FLAG_PERSIST = 1u << 2,  /* has its own memory (new_tensor, KV cache) */
    TSR_FLAG_OUTPUT = 1u << 3,   /* an output of the current compute */
    TSR_FLAG_INPLACE = 1u << 4,  /* node writes into src[0]'s (SET_ROWS) or src[1]'s (CPY) memory */
};

struct tsr_tensor {
    tsr_type type;
    int n_dims;
    int64_t ne[TSR_MAX_DIMS];
    size_t nb[TSR_MAX_DIMS];

    tsr_op op;
    int32_t op_params[TSR_MAX_OP_PARAMS];
    tsr_tensor *src[TSR_MAX_SRC];
    tsr_tensor *view_src;       /* for views and in-place results: the tensor whose memory this is */
    size_t view_offs;           /* byte offset into view_src's memory */

    tsr_buffer *buffer;         /* memory, once allocated (NULL for system-memory inputs) */
    void *data;                 /* address of element 0 in its buffer (device address for GPU buffers) */
    uint64_t generation;        /* backend compute generation that produced data (for non-leaf nodes) */

    tsr_context *ctx;           /* owning context; NULL for backend weights and cache tensors */
    uint32_t flags;
    int device_id;              /* scheduler: index of the backend device that runs/holds it; -1 = none */
    int32_t sched_scratch[4];   /* scheduler/allocator bookkeeping */
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
int64_t tsr__nrows(const tsr_tensor *t);               /* ne1*ne2*ne3 */
size_t tsr__nbytes(const tsr_tensor *t);               /* bytes spanned in memory (strided extent) */
size_t tsr__row_bytes(const tsr_tensor *t);            /* tsr_row_size(type, ne0) */
bool tsr__is_contiguous(const tsr_tensor *t);
bool tsr__is_contiguous_rows(const tsr_tensor *t);     /* each row contiguous (nb0 == element size) */
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
