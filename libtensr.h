/*
 * libtensr.h - the one public header of libtensr, an embeddable C11 library
 * that runs transformer inference graphs on CPUs and NVIDIA GPUs.
 *
 * Conventions (see libtensr(7)):
 *  - Every object is an opaque handle; X_new/X_free (or open/close) pairs;
 *    X_free(NULL) is a no-op.
 *  - Fallible functions return tsr_status (TSR_OK = 0) or NULL; the detail is
 *    in tsr_last_error(), which is thread-local.
 *  - Parameter structs begin with `size_t size` and are filled by
 *    tsr_X_params_init(&p, sizeof p): the library reads only the fields that
 *    the caller was compiled with.
 *  - Enum values are explicit and only ever appended.
 *  - Thread model: one backend (and everything made from it) is driven by one
 *    thread at a time; different backends are independent. Functions that take
 *    no backend/context/gguf handle are thread-safe unless said otherwise.
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef LIBTENSR_H
#define LIBTENSR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The one source of the version: configure.ac reads these three lines. */
#define TSR_VERSION_MAJOR 0
#define TSR_VERSION_MINOR 4
#define TSR_VERSION_PATCH 0
#define TSR_VERSION_NUMBER ((TSR_VERSION_MAJOR << 16) | (TSR_VERSION_MINOR << 8) | TSR_VERSION_PATCH)

#if defined(_WIN32) && defined(TSR_BUILDING_LIBRARY)
#define TSR_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define TSR_API __attribute__((visibility("default")))
#else
#define TSR_API
#endif

/* ------------------------------------------------------------------------ */
/* Handles                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct tsr_device tsr_device;
typedef struct tsr_buffer_type tsr_buffer_type;
typedef struct tsr_buffer tsr_buffer;
typedef struct tsr_backend tsr_backend;
typedef struct tsr_context tsr_context;
typedef struct tsr_tensor tsr_tensor;
typedef struct tsr_gguf tsr_gguf;
typedef struct tsr_gguf_writer tsr_gguf_writer;
typedef struct tsr_kv_cache tsr_kv_cache;

/* ------------------------------------------------------------------------ */
/* Version, status, errors                                                  */
/* ------------------------------------------------------------------------ */

/* Runtime version: (major << 16) | (minor << 8) | patch. Thread-safe. */
TSR_API unsigned tsr_version(void);
/* Runtime version as "MAJOR.MINOR.PATCH"; static storage. Thread-safe. */
TSR_API const char *tsr_version_string(void);

/* Status codes. Numeric values are forever. */
typedef enum tsr_status {
    TSR_OK = 0,
    TSR_E_INVALID = 1,      /* invalid argument (NULL, bad shape, bad type, ...) */
    TSR_E_NOMEM = 2,        /* host out of memory */
    TSR_E_DEVICE_NOMEM = 3, /* device out of memory (device, size asked, free memory in detail) */
    TSR_E_IO = 4,           /* I/O error; detail carries the OS error text */
    TSR_E_MALFORMED = 5,    /* malformed file or data */
    TSR_E_UNSUPPORTED = 6,  /* type/op not supported (on this device) */
    TSR_E_NOT_FOUND = 7,    /* no such tensor/device/buffer type/key */
    TSR_E_DEVICE = 8,       /* device (driver) error */
    TSR_E_CANCELLED = 9,    /* cancelled by a callback */
    TSR_E_FULL = 10,        /* KV cache has no room for the batch */
    TSR_E_TYPE = 11,        /* value has another type than the one asked for */
    TSR_E_STATE = 12,       /* object not in a state that allows the call */
    TSR_E_RANGE = 13        /* index or size out of range */
} tsr_status;

/* Short constant description of a status ("invalid argument"); never NULL.
 * Thread-safe. */
TSR_API const char *tsr_status_string(tsr_status s);
/* Detail of the last error on this thread ("" when none); valid until the
 * next libtensr call on this thread. Thread-safe (thread-local). */
TSR_API const char *tsr_last_error(void);
/* Clears this thread's last error. */
TSR_API void tsr_clear_error(void);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum tsr_log_level {
    TSR_LOG_DEBUG = 0,
    TSR_LOG_INFO = 1,
    TSR_LOG_WARN = 2,
    TSR_LOG_ERROR = 3,
    TSR_LOG_NONE = 4
} tsr_log_level;

/* One key/value field of a structured log record. */
typedef struct tsr_log_field {
    const char *key;
    const char *value;
} tsr_log_field;

/* Receives one record; the strings are valid only during the call. May be
 * called from any thread that calls into the library. */
typedef void (*tsr_log_fn)(tsr_log_level level, const char *msg, const tsr_log_field *fields, size_t n_fields,
                           void *user);

/* Sets the log callback (NULL restores the default, which writes logfmt lines
 * to stderr). Not thread-safe with concurrent logging: call it at start-up. */
TSR_API void tsr_log_set(tsr_log_fn fn, void *user);
/* Sets the minimum level delivered (default: TSR_LOG_LEVEL from the
 * environment, "debug|info|warn|error|none", else warn). */
TSR_API void tsr_log_set_level(tsr_log_level level);
TSR_API tsr_log_level tsr_log_get_level(void);

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

/* Tensor types, numbered as GGUF numbers them. */
typedef enum tsr_type {
    TSR_TYPE_F32 = 0,
    TSR_TYPE_F16 = 1,
    TSR_TYPE_Q4_0 = 2,
    TSR_TYPE_Q4_1 = 3,
    /* 4 and 5 (Q4_2, Q4_3) no longer exist */
    TSR_TYPE_Q5_0 = 6,
    TSR_TYPE_Q5_1 = 7,
    TSR_TYPE_Q8_0 = 8,
    TSR_TYPE_Q8_1 = 9,
    TSR_TYPE_Q2_K = 10,
    TSR_TYPE_Q3_K = 11,
    TSR_TYPE_Q4_K = 12,
    TSR_TYPE_Q5_K = 13,
    TSR_TYPE_Q6_K = 14,
    TSR_TYPE_Q8_K = 15,
    TSR_TYPE_IQ2_XXS = 16,
    TSR_TYPE_IQ2_XS = 17,
    TSR_TYPE_IQ3_XXS = 18,
    TSR_TYPE_IQ1_S = 19,
    TSR_TYPE_IQ4_NL = 20,
    TSR_TYPE_IQ3_S = 21,
    TSR_TYPE_IQ2_S = 22,
    TSR_TYPE_IQ4_XS = 23,
    TSR_TYPE_I8 = 24,
    TSR_TYPE_I16 = 25,
    TSR_TYPE_I32 = 26,
    TSR_TYPE_I64 = 27,
    TSR_TYPE_F64 = 28,
    TSR_TYPE_IQ1_M = 29,
    TSR_TYPE_BF16 = 30,
    TSR_TYPE_COUNT = 31 /* one past the largest number this version knows */
} tsr_type;

/* Name of a type ("q4_K", "f32"); NULL for a number that is not a type. */
TSR_API const char *tsr_type_name(tsr_type type);
/* Type by its name (case-insensitive); TSR_E_NOT_FOUND when unknown. */
TSR_API tsr_status tsr_type_by_name(const char *name, tsr_type *out);
/* Elements per block (1 for plain types); 0 for a number that is not a type. */
TSR_API int64_t tsr_type_block_size(tsr_type type);
/* Bytes per block; 0 for a number that is not a type. */
TSR_API size_t tsr_type_block_bytes(tsr_type type);
/* 1 for block-quantized types. */
TSR_API int tsr_type_is_quantized(tsr_type type);
/* Bytes of a row of n elements; 0 when n is not a multiple of the block size,
 * the type is unknown or the size overflows. */
TSR_API size_t tsr_row_size(tsr_type type, int64_t n);
/* Reference quantization of n floats (n a multiple of the block size) into
 * dst (tsr_row_size(type, n) bytes). Byte-identical to llama.cpp's reference
 * quantizer. TSR_E_INVALID / TSR_E_UNSUPPORTED on bad input. Thread-safe. */
TSR_API tsr_status tsr_quantize(tsr_type type, const float *src, void *dst, int64_t n);
/* Reference dequantization of n elements of `type` to floats. Thread-safe. */
TSR_API tsr_status tsr_dequantize(tsr_type type, const void *src, float *dst, int64_t n);
/* IEEE half and bfloat16 conversions (round to nearest even). */
TSR_API uint16_t tsr_fp32_to_fp16(float f);
TSR_API float tsr_fp16_to_fp32(uint16_t h);
TSR_API uint16_t tsr_fp32_to_bf16(float f);
TSR_API float tsr_bf16_to_fp32(uint16_t h);

/* ------------------------------------------------------------------------ */
/* Devices and buffer types                                                 */
/* ------------------------------------------------------------------------ */

typedef enum tsr_device_class { TSR_DEVICE_CPU = 0, TSR_DEVICE_GPU = 1, TSR_DEVICE_ACCEL = 2 } tsr_device_class;
typedef tsr_device_class tsr_device_kind_t; /* the old name, kept for callers */

/* Devices: GPUs in driver order, then the CPU. The first call enumerates
 * them (and logs system info once). Thread-safe. Device handles live until
 * the process ends. */
TSR_API size_t tsr_device_count(void);
TSR_API tsr_device *tsr_device_get(size_t i);             /* NULL (TSR_E_RANGE) when i >= count */
TSR_API tsr_device *tsr_device_by_name(const char *name); /* case-insensitive: "CPU", "CUDA0" */
TSR_API const char *tsr_device_name(const tsr_device *d);
TSR_API const char *tsr_device_description(const tsr_device *d);
TSR_API tsr_device_class tsr_device_kind(const tsr_device *d);
/* Index of the device among devices with the same description (0, 1, ...). */
TSR_API int tsr_device_index_in_model(const tsr_device *d);
TSR_API tsr_status tsr_device_memory(const tsr_device *d, size_t *free, size_t *total);
/* The device's own buffer type. */
TSR_API tsr_buffer_type *tsr_device_buffer_type(const tsr_device *d);
/* Pinned host staging buffer type of a GPU ("CUDA_Host"); NULL for the CPU. */
TSR_API tsr_buffer_type *tsr_device_host_buffer_type(const tsr_device *d);
/* Names of the backends found at run time, comma separated ("cpu", "cpu,cuda"). */
TSR_API const char *tsr_backends_available(void);

/* Buffer types by name, case-insensitive ("CPU", "CUDA0", "CUDA_Host"). */
TSR_API tsr_buffer_type *tsr_buffer_type_by_name(const char *name);
TSR_API const char *tsr_buffer_type_name(const tsr_buffer_type *bt);
TSR_API tsr_device *tsr_buffer_type_device(const tsr_buffer_type *bt);
/* Allocates `size` bytes on the buffer type. TSR_E_DEVICE_NOMEM (or
 * TSR_E_NOMEM for host memory) names the device, the size and the free memory. */
TSR_API tsr_status tsr_buffer_alloc(tsr_buffer_type *bt, size_t size, tsr_buffer **out);
TSR_API void tsr_buffer_free(tsr_buffer *b);
TSR_API size_t tsr_buffer_size(const tsr_buffer *b);
TSR_API tsr_buffer_type *tsr_buffer_get_type(const tsr_buffer *b);

/* Override list entry: tensors whose name matches `pattern` (POSIX extended
 * regex, matched anywhere in the name) are placed on `buft`. Lists end with
 * an entry whose pattern is NULL. */
typedef struct tsr_buft_override {
    const char *pattern;
    tsr_buffer_type *buft;
} tsr_buft_override;

/* Parses "pattern=BUFT,pattern=BUFT" (llama.cpp's -ot syntax) into a
 * NULL-terminated list owned by the caller (free with tsr_buft_overrides_free).
 * Unknown buffer type names and invalid regexes are errors that list the
 * valid names / say what is wrong; *out is NULL then. */
TSR_API tsr_status tsr_buft_overrides_parse(const char *spec, tsr_buft_override **out);
TSR_API void tsr_buft_overrides_free(tsr_buft_override *list);

/* ------------------------------------------------------------------------ */
/* Backend                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum tsr_flash_attn_mode {
    TSR_FLASH_ATTN_AUTO = -1,
    TSR_FLASH_ATTN_OFF = 0,
    TSR_FLASH_ATTN_ON = 1
} tsr_flash_attn_mode;
typedef tsr_flash_attn_mode tsr_flash_attn_t; /* the old name, kept for callers */

typedef struct tsr_backend_params {
    size_t size;                /* sizeof(tsr_backend_params), set by _init */
    tsr_device *const *devices; /* NULL-terminated devices to use; NULL = all */
    int n_threads;              /* CPU threads; 0 = number of cores; more than the cores
                                 * (online, within the affinity mask) = the cores, logged */
    int flash_attn;             /* tsr_flash_attn_mode; default AUTO */
    size_t attn_max_batch;      /* bytes of K*Q scores (with their softmax) per attention step; 0 = no limit */
    int batch_invariant;        /* appended with LIBTENSR_6: 1 = the CPU device's matmuls and attention give a
                                 * token the same bits whatever else is in its batch (one decode path for any
                                 * column count; single-sequence decode is slower); default 0 */
} tsr_backend_params;

TSR_API void tsr_backend_params_init(tsr_backend_params *p, size_t size); /* size = sizeof *p */
/* Creates a backend (devices, one stream each, one scheduler). p may be NULL. */
TSR_API tsr_status tsr_backend_new(const tsr_backend_params *p, tsr_backend **out);
/* Frees the backend, its weights, scheduler and buffers (NULL is a no-op).
 * Close its contexts and KV caches first: while any is open, the backend
 * stays alive (logged at warn level) and is freed when the last of them
 * closes, so they never dangle. */
TSR_API void tsr_backend_free(tsr_backend *b);
TSR_API size_t tsr_backend_n_devices(const tsr_backend *b);
TSR_API tsr_device *tsr_backend_device(const tsr_backend *b, size_t i);
/* The CPU threads in effect (n_threads as resolved and clamped). */
TSR_API int tsr_backend_n_threads(const tsr_backend *b);
/* 1 when flash attention is in use (ON, or AUTO and every device supports it). */
TSR_API int tsr_backend_flash_attn(const tsr_backend *b);
TSR_API size_t tsr_backend_attn_max_batch(const tsr_backend *b);

/* Progress of a load: return non-zero to cancel (TSR_E_CANCELLED). */
typedef int (*tsr_progress_fn)(uint64_t done, uint64_t total, void *user);

typedef struct tsr_load_params {
    size_t size;                        /* sizeof(tsr_load_params), set by _init */
    int n_gpu_layers;                   /* last N repeating layers on GPUs; -1 = all; default 0 */
    int main_gpu;                       /* index among the backend's GPU devices */
    const float *tensor_split;          /* one weight per GPU device of the backend; NULL = by free memory */
    const tsr_buft_override *overrides; /* NULL-terminated; NULL = none */
    int use_mmap;                       /* mmap CPU-resident weights; default 0 */
    int n_io_threads;                   /* 0 = automatic */
    tsr_progress_fn progress;           /* may be NULL */
    void *progress_user;
    int verify;     /* check float data and block scales for NaN/Inf */
    int plan_only;  /* compute and log the memory plan, allocate and read nothing */
    int vocab_only; /* tsr_model_load: hyper-parameters, vocabulary and chat template only; default 0 */
} tsr_load_params;

TSR_API void tsr_load_params_init(tsr_load_params *p, size_t size);
/* Loads a GGUF file's tensors as the backend's weights: placement plan,
 * memory check (TSR_E_DEVICE_NOMEM naming the device and the bytes missing),
 * one buffer per device, parallel reads. p may be NULL. On failure nothing
 * stays allocated. */
TSR_API tsr_status tsr_backend_load_gguf(tsr_backend *b, const char *path, const tsr_load_params *p);
/* Declares a weight without data (for models built through the API); placed
 * and allocated by tsr_backend_place_weights. */
TSR_API tsr_status tsr_backend_declare_weight(tsr_backend *b, const char *name, tsr_type type, int n_dims,
                                              const int64_t *ne);
/* Places and allocates every declared weight that has no buffer yet. */
TSR_API tsr_status tsr_backend_place_weights(tsr_backend *b, const tsr_load_params *p);
/* A weight by name (NULL and TSR_E_NOT_FOUND when absent). Owned by the backend. */
TSR_API tsr_tensor *tsr_backend_weight(const tsr_backend *b, const char *name);
/* A weight's copy on device `dev` (for tensors shared by layers on several
 * devices, e.g. rope_freqs), else the weight itself; NULL when absent. */
TSR_API tsr_tensor *tsr_backend_weight_on(const tsr_backend *b, const char *name, const tsr_device *dev);
TSR_API size_t tsr_backend_n_weights(const tsr_backend *b);
TSR_API tsr_tensor *tsr_backend_weight_at(const tsr_backend *b, size_t i);
/* Buffer type holding repeating layer il (after placement); NULL if none. */
TSR_API tsr_buffer_type *tsr_backend_layer_buffer_type(const tsr_backend *b, int il);
/* Number of repeating layers found in weight names (blk.N.). */
TSR_API int tsr_backend_n_layers(const tsr_backend *b);
/* The memory plan / accounting of device i of the backend, in bytes. Any
 * pointer may be NULL. */
TSR_API tsr_status tsr_backend_memory_plan(const tsr_backend *b, size_t i, size_t *weights, size_t *kv_cache,
                                           size_t *compute);
/* Logs the memory plan at info level. */
TSR_API void tsr_backend_log_plan(const tsr_backend *b);

/* ------------------------------------------------------------------------ */
/* Contexts and tensors                                                     */
/* ------------------------------------------------------------------------ */

/* Creates a context: an arena for tensor metadata and the owner of every
 * input and tensor made through it. NULL on failure (see tsr_last_error). */
TSR_API tsr_context *tsr_context_new(tsr_backend *b);
/* Frees everything allocated through the context. NULL is a no-op. */
TSR_API void tsr_context_close(tsr_context *ctx);
/* First error recorded by an op in this context; NULL while no op has failed. */
TSR_API const char *tsr_context_error(const tsr_context *ctx);
/* Status of the first error recorded in this context; TSR_OK when none. */
TSR_API tsr_status tsr_context_status(const tsr_context *ctx);
TSR_API tsr_backend *tsr_context_backend(const tsr_context *ctx);

#define TSR_MAX_DIMS 4

/* A tensor in system memory, `data` copied in (may be NULL: zero-filled).
 * 1 <= n_dims <= 4; ne[i] >= 0. Freed when the context closes. NULL on error
 * (recorded in the context). */
TSR_API tsr_tensor *tsr_input(tsr_context *ctx, tsr_type type, int n_dims, const int64_t *ne, const void *data);
/* A tensor allocated now on buft (NULL = CPU), zero-filled, freed on close. */
TSR_API tsr_tensor *tsr_new_tensor(tsr_context *ctx, tsr_buffer_type *buft, tsr_type type, int n_dims,
                                   const int64_t *ne);
/* A tensor whose memory the graph allocator provides when it is computed
 * (a destination for tsr_cpy / tsr_set_rows inside one graph). */
TSR_API tsr_tensor *tsr_empty(tsr_context *ctx, tsr_type type, int n_dims, const int64_t *ne);

TSR_API tsr_tensor *tsr_set_name(tsr_tensor *t, const char *name); /* returns t; copies name (63 bytes max) */
TSR_API const char *tsr_tensor_name(const tsr_tensor *t);          /* "" when unnamed */
TSR_API tsr_type tsr_tensor_type(const tsr_tensor *t);
TSR_API int tsr_tensor_n_dims(const tsr_tensor *t);
TSR_API int64_t tsr_tensor_ne(const tsr_tensor *t, int dim); /* 1 for dim >= n_dims; -1 for bad input */
TSR_API size_t tsr_tensor_nb(const tsr_tensor *t, int dim);  /* byte stride; 0 for bad input */
TSR_API int64_t tsr_tensor_nelements(const tsr_tensor *t);
TSR_API size_t tsr_tensor_nbytes(const tsr_tensor *t); /* bytes of its contents, contiguous */
TSR_API int tsr_tensor_is_contiguous(const tsr_tensor *t);
/* Buffer type of the memory the tensor lives in; NULL when not allocated. */
TSR_API tsr_buffer_type *tsr_tensor_buffer_type(const tsr_tensor *t);
/* Reads/writes bytes of the tensor's contents in contiguous row-major order
 * (as tsr_cont would lay them out): offset + size <= tsr_tensor_nbytes(t).
 * The tensor must hold data: a weight, an input, a tsr_new_tensor, or an
 * output of the latest tsr_compute on its backend (TSR_E_STATE otherwise).
 * A weight the CPU backend keeps with its rows interleaved is put back as
 * stored first, for good (TSR_E_NOMEM when host memory for that lacks). */
TSR_API tsr_status tsr_tensor_read(const tsr_tensor *t, void *dst, size_t offset, size_t size);
TSR_API tsr_status tsr_tensor_write(tsr_tensor *t, const void *src, size_t offset, size_t size);

/* ------------------------------------------------------------------------ */
/* Ops: each builds a graph node; shapes and types are checked here. A bad  */
/* call returns NULL and records the error in the context (first error      */
/* wins); an op given a NULL source returns NULL.                           */
/* ------------------------------------------------------------------------ */

/* Element-wise a (op) b; b broadcasts over a (a->ne[i] % b->ne[i] == 0).
 * Result: F32 of a's shape. a and b: F32, F16 or BF16. */
TSR_API tsr_tensor *tsr_add(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
TSR_API tsr_tensor *tsr_sub(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
TSR_API tsr_tensor *tsr_mul(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
TSR_API tsr_tensor *tsr_div(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
TSR_API tsr_tensor *tsr_scale(tsr_context *ctx, tsr_tensor *a, float s);
/* a: [k, m, ...] of any weight type; b: [k, n, ...] F32;
 * result [m, n, b->ne[2], b->ne[3]] F32, result[j][i] = sum_k a[i][k]*b[j][k];
 * a broadcasts over dims 2 and 3 (b->ne[2] % a->ne[2] == 0, same for 3). */
TSR_API tsr_tensor *tsr_mul_mat(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
/* Mixture-of-experts matmul: each (token, slot) pair multiplies its own
 * expert's matrix. as: the experts' weights [k, m, n_expert], any weight type
 * tsr_mul_mat takes (rows contiguous; expert e is the [k, m] matrix at byte
 * offset e * nb[2]); b: F32 [k, n_b, n_tokens] with n_b 1 (every slot reads
 * the token's one row) or n_used; ids: I32 [n_used, n_tokens], the expert of
 * each slot. Result F32 [m, n_used, n_tokens]:
 *   result[t][e][i] = sum_k as[ids[t][e]][i][k] * b[t][e % n_b][k].
 * An id outside 0..n_expert-1 is found when the graph runs: tsr_compute
 * returns TSR_E_RANGE naming the node, the id and n_expert (nothing is read
 * outside as). Shapes and types are checked here (NULL and the context's
 * error otherwise). */
TSR_API tsr_tensor *tsr_mul_mat_id(tsr_context *ctx, tsr_tensor *as, tsr_tensor *b, tsr_tensor *ids);
/* Rows of a ([k, rows, d2, d3], any type) picked by I32 indices
 * idx [n, d2, d3]; result F32 [k, n, d2, d3]. */
TSR_API tsr_tensor *tsr_get_rows(tsr_context *ctx, tsr_tensor *a, tsr_tensor *idx);
/* Writes rows of src ([k, n, d2, d3] F32) into dst ([k, rows, d2, d3],
 * F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1) at I32/I64 indices idx [n, d2, d3],
 * converting the type; returns a view of dst that depends on the write. */
TSR_API tsr_tensor *tsr_set_rows(tsr_context *ctx, tsr_tensor *dst, tsr_tensor *src, tsr_tensor *idx);
TSR_API tsr_tensor *tsr_rms_norm(tsr_context *ctx, tsr_tensor *a, float eps);
TSR_API tsr_tensor *tsr_norm(tsr_context *ctx, tsr_tensor *a, float eps);

typedef enum tsr_rope_mode {
    TSR_ROPE_NORMAL = 0, /* adjacent pairs rotate together (llama GGUF) */
    TSR_ROPE_NEOX = 2    /* first and second halves rotate together */
} tsr_rope_mode;

/* Rotary embedding of a [head_dim, n_head, n_tokens] (F32) at positions pos
 * (I32 [n_tokens]); the first n_dims elements of each head rotate. */
TSR_API tsr_tensor *tsr_rope(tsr_context *ctx, tsr_tensor *a, tsr_tensor *pos, int n_dims, int mode, float freq_base,
                             float freq_scale);
/* As tsr_rope, with per-dimension frequency factors (F32 [n_dims/2], may be
 * NULL) and YaRN parameters (ext_factor 0 = off; attn_factor 1 = none). */
TSR_API tsr_tensor *tsr_rope_ext(tsr_context *ctx, tsr_tensor *a, tsr_tensor *pos, tsr_tensor *freq_factors, int n_dims,
                                 int mode, int n_ctx_orig, float freq_base, float freq_scale, float ext_factor,
                                 float attn_factor, float beta_fast, float beta_slow);
/* softmax over rows of a. */
TSR_API tsr_tensor *tsr_softmax(tsr_context *ctx, tsr_tensor *a);
/* softmax(a * scale + mask): mask F32/F16 [ne0, >= ne1, d2?, d3?] broadcast
 * over a's dims 2 and 3 (a->ne[2] % mask->ne[2] == 0); may be NULL. */
TSR_API tsr_tensor *tsr_softmax_ext(tsr_context *ctx, tsr_tensor *a, tsr_tensor *mask, float scale);
TSR_API tsr_tensor *tsr_silu(tsr_context *ctx, tsr_tensor *a);
TSR_API tsr_tensor *tsr_gelu(tsr_context *ctx, tsr_tensor *a);
/* silu(a) * b and gelu(a) * b (fused gate); a and b the same shape. */
TSR_API tsr_tensor *tsr_swiglu(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
TSR_API tsr_tensor *tsr_geglu(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
/* Concatenation along dim (0..3); other dims equal; same type. */
TSR_API tsr_tensor *tsr_concat(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b, int dim);
/* Index of the largest element of each row: I32 [ne1, ne2, ne3]. */
TSR_API tsr_tensor *tsr_argmax(tsr_context *ctx, tsr_tensor *a);
/* Element-wise 1 / (1 + exp(-x)) of F32 a; result F32 of a's shape. */
TSR_API tsr_tensor *tsr_sigmoid(tsr_context *ctx, tsr_tensor *a);
/* The sum of each row of F32 a: F32 [1, ne1, ne2, ne3]. */
TSR_API tsr_tensor *tsr_sum_rows(tsr_context *ctx, tsr_tensor *a);

typedef enum tsr_sort_order { TSR_SORT_ASC = 0, TSR_SORT_DESC = 1 } tsr_sort_order;
/* Per row (ne0) of F32 a, the indices that sort it: I32 of a's shape. The
 * sort is stable: equal values keep their index order (NaN sorts as the
 * largest value in either order's sense: last ascending, first descending). */
TSR_API tsr_tensor *tsr_argsort(tsr_context *ctx, tsr_tensor *a, tsr_sort_order order);
/* Per row of F32 a, the indices of its k largest values, largest first, ties
 * to the lower index (argsort DESC's first k): I32 [k, ne1, ne2, ne3];
 * 1 <= k <= ne0. The indices of a MoE router's chosen experts. */
TSR_API tsr_tensor *tsr_top_k(tsr_context *ctx, tsr_tensor *a, int k);
/* Copies a into b (same number of elements), converting the type; returns a
 * view of b that depends on the copy. */
TSR_API tsr_tensor *tsr_cpy(tsr_context *ctx, tsr_tensor *a, tsr_tensor *b);
/* Contiguous copy of a (same type), and a contiguous copy converted to type. */
TSR_API tsr_tensor *tsr_cont(tsr_context *ctx, tsr_tensor *a);
TSR_API tsr_tensor *tsr_cast(tsr_context *ctx, tsr_tensor *a, tsr_type type);

/* Views (metadata only). Offsets and strides in bytes. */
TSR_API tsr_tensor *tsr_view_1d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, size_t offset);
TSR_API tsr_tensor *tsr_view_2d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset);
TSR_API tsr_tensor *tsr_view_3d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1,
                                size_t nb2, size_t offset);
TSR_API tsr_tensor *tsr_view_4d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                                size_t nb1, size_t nb2, size_t nb3, size_t offset);
/* Reshape a contiguous tensor to n_dims dims ne (same number of elements). */
TSR_API tsr_tensor *tsr_reshape(tsr_context *ctx, tsr_tensor *a, int n_dims, const int64_t *ne);
TSR_API tsr_tensor *tsr_reshape_1d(tsr_context *ctx, tsr_tensor *a, int64_t ne0);
TSR_API tsr_tensor *tsr_reshape_2d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1);
TSR_API tsr_tensor *tsr_reshape_3d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2);
TSR_API tsr_tensor *tsr_reshape_4d(tsr_context *ctx, tsr_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
/* Dim i of a becomes dim axis_i of the result (ggml's permute). */
TSR_API tsr_tensor *tsr_permute(tsr_context *ctx, tsr_tensor *a, int axis0, int axis1, int axis2, int axis3);
/* Swaps dims 0 and 1. */
TSR_API tsr_tensor *tsr_transpose(tsr_context *ctx, tsr_tensor *a);

/* Fused attention. q: F32 [head_dim_k, n_tokens, n_head, n_seq];
 * k: [head_dim_k, n_kv, n_head_kv, n_seq]; v: [head_dim_v, n_kv, n_head_kv, n_seq]
 * (F32, F16 or Q8_0; n_head % n_head_kv == 0); mask: F32/F16
 * [n_kv, >= n_tokens] or NULL. Result (ggml's flash_attn_ext layout):
 * F32 [head_dim_v, n_head, n_tokens, n_seq]. */
TSR_API tsr_tensor *tsr_flash_attn(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v, tsr_tensor *mask,
                                   float scale);

/* ------------------------------------------------------------------------ */
/* Compute                                                                  */
/* ------------------------------------------------------------------------ */

/* Builds the graph that produces outs, assigns nodes to devices, copies
 * inputs, allocates compute memory (reusing it), and runs it. Outputs hold
 * their values until the context closes or the next tsr_compute/tsr_reserve
 * on the same backend. Fails with the context's first op error if any. */
TSR_API tsr_status tsr_compute(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs);
/* Sizes and allocates every device's compute buffer for this (worst-case)
 * graph without running it. After it succeeds, computing any graph no
 * larger allocates no memory. */
TSR_API tsr_status tsr_reserve(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs);
/* Peak compute-buffer bytes the graph needs per backend device (measure
 * mode: allocates nothing); sizes has tsr_backend_n_devices() entries. */
TSR_API tsr_status tsr_measure(tsr_context *ctx, tsr_tensor *const *outs, size_t n_outs, size_t *sizes);
/* Number of splits and copies of the last compute/reserve (for tests/logs). */
TSR_API size_t tsr_backend_n_splits(const tsr_backend *b);
TSR_API size_t tsr_backend_n_copies(const tsr_backend *b);
/* Device that ran node t in the last compute (NULL when unknown). */
TSR_API tsr_device *tsr_tensor_device(const tsr_tensor *t);

/* ------------------------------------------------------------------------ */
/* KV cache and attention                                                   */
/* ------------------------------------------------------------------------ */

typedef struct tsr_kv_cache_params {
    size_t size; /* sizeof(tsr_kv_cache_params), set by _init */
    int n_layers;
    int64_t n_ctx; /* cells */
    int n_head_kv; /* K/V heads (all layers) */
    int head_dim_k;
    int head_dim_v;
    tsr_type type_k; /* F16 default; F32; Q8_0 with flash attention */
    tsr_type type_v;
    int n_seq;           /* sequences; default 1 */
    int64_t n_batch_max; /* largest batch begin() accepts (mask rows); default 512 */
    /* Per-layer shapes for models whose layers differ: n_layers entries each
     * (copied), NULL = the value above for every layer. */
    const int *n_head_kv_layer;
    const int *head_dim_k_layer;
    const int *head_dim_v_layer;
    /* Sliding-window attention: a layer flagged in swa_layers
     * lets the token at position p see only cells at positions p - n_swa + 1
     * .. p (a cell is masked when p - cell_pos >= n_swa, llama.cpp's standard
     * window). n_swa 0 (the default) = no window; swa_layers: n_layers flags
     * (copied), 1 = windowed, or NULL = every layer when n_swa > 0. The cache
     * still keeps every position (no cell is evicted), so n_ctx bounds the
     * whole sequence as without a window. */
    int64_t n_swa;
    const uint8_t *swa_layers;
    /* Latent attention (DeepSeek's MLA): 1 = the cache keeps K only and a
     * layer's V is the first head_dim_v (<= head_dim_k) values of each K
     * row; tsr_attention then takes v NULL. Default 0. */
    int v_in_k;
    /* appended with LIBTENSR_5: 1 = sequence s takes cells only from its own
     * range, cells [s * n_ctx / n_seq, (s + 1) * n_ctx / n_seq), lowest first,
     * so a sequence's cells lie together whatever the others do and the
     * attention's sums do not depend on them (batch invariance); 0 (the
     * default) = any free cell. */
    int per_seq_cells;
} tsr_kv_cache_params;

TSR_API void tsr_kv_cache_params_init(tsr_kv_cache_params *p, size_t size);
/* Allocates every layer's K and V whole, on the layer's device. */
TSR_API tsr_status tsr_kv_cache_new(tsr_backend *b, const tsr_kv_cache_params *p, tsr_kv_cache **out);
TSR_API void tsr_kv_cache_free(tsr_kv_cache *c);
/* Starts a batch of n_tokens with positions pos and sequence ids seq (NULL =
 * all 0; pos NULL = each sequence continues after its largest position):
 * finds cells (TSR_E_FULL when there is no room; nothing changes then),
 * marks them used, and builds the mask and cell indices as inputs of ctx.
 * TSR_E_RANGE when n_tokens > n_batch_max. Call it for every context before
 * tsr_attention; if the forward pass is abandoned, remove its positions. */
TSR_API tsr_status tsr_kv_cache_begin(tsr_kv_cache *c, tsr_context *ctx, int64_t n_tokens, const int32_t *pos,
                                      const int32_t *seq);
/* Starts the next batch on the inputs the last tsr_kv_cache_begin made in
 * ctx, so that the graph built on them is computed again instead of built
 * anew (a decode step built once and run for each token): finds and marks
 * cells as begin does, rewrites the cell indices and the masks in place and
 * allocates nothing. TSR_E_STATE, with nothing changed, when the last begin
 * was in another context, for another number of tokens, or when the
 * batch's cells make the graph read another number of cells (the last cell
 * in use, rounded up to 256): begin a new graph then. */
TSR_API tsr_status tsr_kv_cache_begin_again(tsr_kv_cache *c, tsr_context *ctx, int64_t n_tokens, const int32_t *pos,
                                            const int32_t *seq);
TSR_API void tsr_kv_cache_clear(tsr_kv_cache *c);
/* Removes cells of seq (-1 = any) with p0 <= pos < p1 (p1 < 0 = infinity). */
TSR_API tsr_status tsr_kv_cache_remove(tsr_kv_cache *c, int seq, int32_t p0, int32_t p1);
TSR_API int64_t tsr_kv_cache_used(const tsr_kv_cache *c);
TSR_API int64_t tsr_kv_cache_n_ctx(const tsr_kv_cache *c);
/* Largest position of sequence seq in the cache (-1 = any sequence); -1
 * when it has none. */
TSR_API int32_t tsr_kv_cache_seq_pos_max(const tsr_kv_cache *c, int seq);
/* The mask input built by the last begin (NULL before): the causal mask
 * of the layers without a window (begin builds a second, windowed mask for
 * the layers of swa_layers; tsr_attention picks each layer's). */
TSR_API tsr_tensor *tsr_kv_cache_mask(const tsr_kv_cache *c);
/* Builds the inputs of a worst-case batch of n_tokens over the whole cache
 * (every cell read) for sizing compute buffers with tsr_reserve or
 * tsr_measure; the cells are not touched. Do not tsr_compute such a graph. */
TSR_API tsr_status tsr_kv_cache_begin_reserve(tsr_kv_cache *c, tsr_context *ctx, int64_t n_tokens);
/* Copies the cells of sequence src with p0 <= pos < p1 (p1 < 0: to the
 * end) to sequence dst, whose cells are all forgotten first: dst then
 * holds src's keys and values at the same positions (a prompt prefix
 * decoded once, shared). src == dst does nothing. TSR_E_FULL, with nothing
 * changed, when the free cells and dst's own are too few; TSR_E_INVALID
 * for a sequence out of range. Same thread model as begin. */
TSR_API tsr_status tsr_kv_cache_seq_copy(tsr_kv_cache *c, int src, int dst, int32_t p0, int32_t p1);
/* Writes every cell of sequence seq (positions, keys, values) to buf, a
 * self-contained state in host memory. *size is the state's bytes, also
 * when cap is too small (TSR_E_RANGE; buf may be NULL when cap is 0). */
TSR_API tsr_status tsr_kv_cache_seq_save(const tsr_kv_cache *c, int seq, void *buf, size_t cap, size_t *size);
/* Replaces sequence seq with a state saved by tsr_kv_cache_seq_save from a
 * cache of the same shapes and types (TSR_E_INVALID otherwise;
 * TSR_E_MALFORMED for bytes that are no such state). TSR_E_FULL, with
 * nothing changed, when the free cells and seq's own are too few. */
TSR_API tsr_status tsr_kv_cache_seq_load(tsr_kv_cache *c, int seq, const void *buf, size_t size);

/* Attention over the cache for layer il: q [head_dim_k, n_head, n_tokens],
 * k [head_dim_k, n_head_kv, n_tokens], v [head_dim_v, n_head_kv, n_tokens]
 * (the batch of the last begin). Writes k/v into the cache and returns
 * [head_dim_v * n_head, n_tokens] F32. A layer with a sliding window (see
 * tsr_kv_cache_params) uses the windowed mask on every path. With a v_in_k
 * cache v must be NULL: V is the first head_dim_v values of the cached K
 * rows (one KV head of width kv_lora_rank + rope for DeepSeek's MLA). */
TSR_API tsr_tensor *tsr_attention(tsr_context *ctx, tsr_kv_cache *cache, int il, tsr_tensor *q, tsr_tensor *k,
                                  tsr_tensor *v, float scale);
/* Attention without a cache: q [head_dim_k, n_head, n_tokens], k
 * [head_dim_k, n_head_kv, n_kv], v [head_dim_v, n_head_kv, n_kv], mask
 * [n_kv, n_tokens] F32/F16 or NULL. Returns [head_dim_v * n_head, n_tokens]. */
TSR_API tsr_tensor *tsr_attention_nocache(tsr_context *ctx, tsr_tensor *q, tsr_tensor *k, tsr_tensor *v,
                                          tsr_tensor *mask, float scale);

/* ------------------------------------------------------------------------ */
/* GGUF                                                                     */
/* ------------------------------------------------------------------------ */

typedef enum tsr_gguf_type {
    TSR_GGUF_UINT8 = 0,
    TSR_GGUF_INT8 = 1,
    TSR_GGUF_UINT16 = 2,
    TSR_GGUF_INT16 = 3,
    TSR_GGUF_UINT32 = 4,
    TSR_GGUF_INT32 = 5,
    TSR_GGUF_FLOAT32 = 6,
    TSR_GGUF_BOOL = 7,
    TSR_GGUF_STRING = 8,
    TSR_GGUF_ARRAY = 9,
    TSR_GGUF_UINT64 = 10,
    TSR_GGUF_INT64 = 11,
    TSR_GGUF_FLOAT64 = 12
} tsr_gguf_type;

/* Opens and validates a GGUF v2/v3 file's metadata (tensor data is not read). */
TSR_API tsr_status tsr_gguf_open(const char *path, tsr_gguf **out);
/* Same from memory; the bytes are copied unless keep is non-zero, in which
 * case data must outlive the handle. `name` is used in errors (may be NULL). */
TSR_API tsr_status tsr_gguf_open_memory(const void *data, size_t size, const char *name, int keep, tsr_gguf **out);
TSR_API void tsr_gguf_close(tsr_gguf *g);
TSR_API uint32_t tsr_gguf_version(const tsr_gguf *g);
TSR_API int64_t tsr_gguf_n_tensors(const tsr_gguf *g);
TSR_API int64_t tsr_gguf_n_keys(const tsr_gguf *g);
TSR_API size_t tsr_gguf_alignment(const tsr_gguf *g);
TSR_API uint64_t tsr_gguf_data_offset(const tsr_gguf *g); /* absolute file offset of the data section */
TSR_API const char *tsr_gguf_path(const tsr_gguf *g);

/* Keys: index by name (-1 when absent), name and type by index. */
TSR_API int64_t tsr_gguf_find_key(const tsr_gguf *g, const char *key);
TSR_API const char *tsr_gguf_key_name(const tsr_gguf *g, int64_t i);
TSR_API tsr_gguf_type tsr_gguf_key_type(const tsr_gguf *g, int64_t i); /* (tsr_gguf_type)-1 for bad i */
/* Typed getters by key name: TSR_E_NOT_FOUND, TSR_E_TYPE on a type mismatch
 * (the integer getters accept any integer type whose value fits). */
TSR_API tsr_status tsr_gguf_get_u32(const tsr_gguf *g, const char *key, uint32_t *out);
TSR_API tsr_status tsr_gguf_get_i32(const tsr_gguf *g, const char *key, int32_t *out);
TSR_API tsr_status tsr_gguf_get_u64(const tsr_gguf *g, const char *key, uint64_t *out);
TSR_API tsr_status tsr_gguf_get_i64(const tsr_gguf *g, const char *key, int64_t *out);
TSR_API tsr_status tsr_gguf_get_f32(const tsr_gguf *g, const char *key, float *out); /* f32 or f64 */
TSR_API tsr_status tsr_gguf_get_f64(const tsr_gguf *g, const char *key, double *out);
TSR_API tsr_status tsr_gguf_get_bool(const tsr_gguf *g, const char *key, int *out);
/* String value (NUL-terminated, owned by g); *len may be NULL. */
TSR_API tsr_status tsr_gguf_get_str(const tsr_gguf *g, const char *key, const char **out, size_t *len);
/* Arrays: element type and length; raw elements (for numeric types; owned
 * by g); string elements by index. */
TSR_API tsr_status tsr_gguf_get_arr_info(const tsr_gguf *g, const char *key, tsr_gguf_type *elem_type, uint64_t *n);
TSR_API tsr_status tsr_gguf_get_arr_data(const tsr_gguf *g, const char *key, const void **data);
TSR_API tsr_status tsr_gguf_get_arr_str(const tsr_gguf *g, const char *key, uint64_t i, const char **out, size_t *len);
/* Raw value of a scalar key (bytes of its type, little-endian as in the file). */
TSR_API tsr_status tsr_gguf_get_raw(const tsr_gguf *g, int64_t i, const void **data, size_t *size);

/* Tensor infos: index by name (-1 when absent). */
TSR_API int64_t tsr_gguf_find_tensor(const tsr_gguf *g, const char *name);
TSR_API const char *tsr_gguf_tensor_name(const tsr_gguf *g, int64_t i);
TSR_API tsr_type tsr_gguf_tensor_type(const tsr_gguf *g, int64_t i);
TSR_API int tsr_gguf_tensor_n_dims(const tsr_gguf *g, int64_t i);
TSR_API int64_t tsr_gguf_tensor_ne(const tsr_gguf *g, int64_t i, int dim);
TSR_API uint64_t tsr_gguf_tensor_offset(const tsr_gguf *g, int64_t i); /* relative to the data section */
TSR_API size_t tsr_gguf_tensor_size(const tsr_gguf *g, int64_t i);
/* Reads tensor i's data (tsr_gguf_tensor_size bytes) into dst. */
TSR_API tsr_status tsr_gguf_read_tensor(const tsr_gguf *g, int64_t i, void *dst, size_t size);

/* Writer: collects keys and tensors, then writes the file (or memory). */
TSR_API tsr_status tsr_gguf_writer_new(tsr_gguf_writer **out);
TSR_API void tsr_gguf_writer_free(tsr_gguf_writer *w);
/* Sets general.alignment too. Power of two. */
TSR_API tsr_status tsr_gguf_writer_set_alignment(tsr_gguf_writer *w, size_t alignment);
/* Scalar keys (type given; value points at one value of that type). */
TSR_API tsr_status tsr_gguf_writer_set(tsr_gguf_writer *w, const char *key, tsr_gguf_type type, const void *value);
TSR_API tsr_status tsr_gguf_writer_set_str(tsr_gguf_writer *w, const char *key, const char *value);
/* Numeric array of n elements of elem_type. */
TSR_API tsr_status tsr_gguf_writer_set_arr(tsr_gguf_writer *w, const char *key, tsr_gguf_type elem_type,
                                           const void *data, uint64_t n);
TSR_API tsr_status tsr_gguf_writer_set_arr_str(tsr_gguf_writer *w, const char *key, const char *const *strs,
                                               uint64_t n);
/* Copies all keys of g (except general.alignment). */
TSR_API tsr_status tsr_gguf_writer_copy_keys(tsr_gguf_writer *w, const tsr_gguf *g);
/* Adds a tensor; data (tsr_row_size(type, ne0) * rows bytes) is copied
 * (NULL: zeros). */
TSR_API tsr_status tsr_gguf_writer_add_tensor(tsr_gguf_writer *w, const char *name, tsr_type type, int n_dims,
                                              const int64_t *ne, const void *data);
TSR_API tsr_status tsr_gguf_writer_write_file(tsr_gguf_writer *w, const char *path);
/* Writes to a malloc'ed buffer owned by the caller (free with tsr_free). */
TSR_API tsr_status tsr_gguf_writer_write_memory(tsr_gguf_writer *w, void **data, size_t *size);

/* ------------------------------------------------------------------------ */
/* Model layer: load a GGUF model, tokenize, decode, sample, format chats     */
/* ------------------------------------------------------------------------ */
/* Architectures: llama (dense, or with experts as Mixtral), mistral, qwen2,
 * qwen3, qwen3moe and gemma3, as llama.cpp defines them. A model, its
 * sessions and its samplers follow the thread model of the backend the
 * model lives in: one thread at a time. Errors: every fallible call returns
 * a status with the detail in tsr_last_error(). */

typedef struct tsr_model tsr_model;     /* weights, hyper-parameters, vocabulary; read-only after load */
typedef struct tsr_session tsr_session; /* a KV cache shared by up to n_seq_max sequences */
typedef struct tsr_sampler tsr_sampler;

/* Loads the model into backend b (b must hold no other weights and outlive
 * the model); lp may be NULL (everything on the CPU, defaults). Reads the
 * hyper-parameters, the weights (checked against them), the vocabulary and
 * the chat template. TSR_E_IO, TSR_E_MALFORMED, TSR_E_UNSUPPORTED (an
 * architecture, tensor or tokenizer it does not know, named),
 * TSR_E_DEVICE_NOMEM, TSR_E_STATE when b already holds weights.
 * With lp->vocab_only: the architecture's name and context length, the
 * vocabulary and the chat template only, from any GGUF file with a
 * vocabulary (weights or not, any architecture); nothing is read into or
 * allocated from b, which may be NULL. Tokenizing, detokenizing and chat
 * formatting work; tsr_session_new refuses such a model (TSR_E_STATE). */
TSR_API tsr_status tsr_model_load(tsr_backend *b, const char *path, const tsr_load_params *lp, tsr_model **out);
/* Frees the model (NULL is a no-op). Sessions still open keep it alive: it
 * is then freed with the last of them. Samplers do not refer to it. The
 * weights belong to the backend and are freed with it (tsr_backend_free);
 * load another model into a new backend. */
TSR_API void tsr_model_free(tsr_model *m);
/* general.architecture ("llama", "mistral", "qwen2", "qwen3", "qwen3moe",
 * "gemma3"); owned by the model. */
TSR_API const char *tsr_model_arch(const tsr_model *m);
TSR_API int32_t tsr_model_n_vocab(const tsr_model *m);
/* The context length the model was trained with (its context_length key). */
TSR_API int64_t tsr_model_n_ctx_train(const tsr_model *m);
TSR_API int32_t tsr_model_token_bos(const tsr_model *m); /* -1 when none */
TSR_API int32_t tsr_model_token_eos(const tsr_model *m); /* -1 when none */
/* 1 when token ends a generation (EOS, end of turn, ...), else 0. */
TSR_API int tsr_model_token_is_eog(const tsr_model *m, int32_t token);

#define TSR_TOKENIZE_ADD_SPECIAL 1u   /* BOS/EOS as the model's metadata asks */
#define TSR_TOKENIZE_PARSE_SPECIAL 2u /* "<|im_start|>" in the text becomes its control token */
/* Tokenizes text[0..len) as llama.cpp does. At most cap tokens are written;
 * *n_tokens is the count, also when cap is too small (TSR_E_RANGE; call
 * again with a larger buffer; tokens may be NULL when cap is 0).
 * TSR_E_INVALID for NULL arguments or unknown flags. */
TSR_API tsr_status tsr_model_tokenize(const tsr_model *m, const char *text, size_t len, unsigned flags, int32_t *tokens,
                                      size_t cap, size_t *n_tokens);
/* The bytes of one token (control tokens rendered when special != 0, else
 * nothing); may be part of a UTF-8 character. At most cap bytes are written
 * (no NUL); *len is the full length, also when cap is too small
 * (TSR_E_RANGE; buf may be NULL when cap is 0). TSR_E_INVALID for a token
 * outside the vocabulary. */
TSR_API tsr_status tsr_model_token_piece(const tsr_model *m, int32_t token, int special, char *buf, size_t cap,
                                         size_t *len);
/* The text of n tokens as llama.cpp's detokenizer writes it (control
 * tokens rendered when special != 0). *len is the full length (without the
 * NUL); the text and a NUL are written when len < cap, else TSR_E_RANGE
 * (buf may be NULL when cap is 0). TSR_E_INVALID for a token outside the
 * vocabulary. The bytes are raw: invalid UTF-8 stays as it is. */
TSR_API tsr_status tsr_model_detokenize(const tsr_model *m, const int32_t *tokens, size_t n, int special, char *buf,
                                        size_t cap, size_t *len);

typedef struct tsr_chat_message {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} tsr_chat_message;
/* Renders msgs[0..n) with the model's chat template (tokenizer.chat_template,
 * recognized as llama.cpp does: ChatML, llama-2, Mistral, llama-3, zephyr,
 * gemma, phi-3); add_assistant opens the assistant's turn. *len is the full
 * length; NUL-terminated when it fits (len < cap), else TSR_E_RANGE.
 * TSR_E_NOT_FOUND when the model has no template (a gemma3 file without one
 * gets gemma's), TSR_E_UNSUPPORTED when it is not one of those. Tokenize the
 * result with TSR_TOKENIZE_PARSE_SPECIAL. */
TSR_API tsr_status tsr_model_chat_format(const tsr_model *m, const tsr_chat_message *msgs, size_t n, int add_assistant,
                                         char *buf, size_t cap, size_t *len);

typedef struct tsr_session_params {
    size_t size;             /* sizeof(tsr_session_params), set by _init */
    int64_t n_ctx;           /* KV cells shared by all sequences; 0 = the training context */
    int64_t n_batch;         /* most tokens one decode call takes; default 2048 */
    int64_t n_ubatch;        /* tokens per graph; default 512 */
    int32_t n_seq_max;       /* sequence ids 0 .. n_seq_max-1; default 1 */
    int64_t n_outputs_max;   /* most logits rows of one micro-batch; 0 (the default) = n_seq_max */
    tsr_type type_k, type_v; /* KV cache types; default F16 */
    int32_t per_seq_cells;   /* appended with LIBTENSR_5: 1 = each sequence its own n_ctx / n_seq_max cells
                              * (tsr_kv_cache_params.per_seq_cells); default 0 */
} tsr_session_params;
TSR_API void tsr_session_params_init(tsr_session_params *p, size_t size);
/* Allocates the KV cache and reserves the worst-case compute buffers:
 * out-of-memory shows here (TSR_E_DEVICE_NOMEM / TSR_E_NOMEM), never in
 * decode. p may be NULL (defaults). n_ubatch and n_batch are capped at
 * n_ctx, n_outputs_max at n_ubatch. */
TSR_API tsr_status tsr_session_new(tsr_model *m, const tsr_session_params *p, tsr_session **out);
TSR_API void tsr_session_free(tsr_session *s); /* NULL is a no-op */
/* Token i at position pos[i] (pos NULL: each sequence continues after its
 * last position) of sequence seq[i] (NULL: all 0); logits kept where
 * want_logits[i] != 0 (NULL: the last token only). Tokens of several
 * sequences may share one call; the mask keeps them apart. The tokens go
 * through graphs of n_ubatch; the logits rows one graph keeps may not
 * exceed n_outputs_max (TSR_E_RANGE). TSR_E_FULL when the cache has fewer
 * free cells than n (checked first, before n_batch: nothing changes); TSR_E_INVALID for a token or sequence id out of
 * range or n > n_batch. On a failure in the middle, the cells this call took are forgotten again. */
TSR_API tsr_status tsr_session_decode(tsr_session *s, size_t n, const int32_t *tokens, const int32_t *pos,
                                      const int32_t *seq, const int8_t *want_logits);
/* n_vocab logits of token i of the last decode; NULL when none were asked
 * for. Valid until the next decode. */
TSR_API const float *tsr_session_logits(const tsr_session *s, size_t i);
/* Forgets positions p0 <= pos < p1 of sequence seq (seq -1: all; p1 < 0: to
 * the end). TSR_E_INVALID for a sequence id out of range. */
TSR_API tsr_status tsr_session_remove(tsr_session *s, int32_t seq, int32_t p0, int32_t p1);
/* Next position of seq (0 when it has none; -1 for a bad argument). */
TSR_API int32_t tsr_session_n_past(const tsr_session *s, int32_t seq);
/* KV cells of the session. */
TSR_API int64_t tsr_session_n_ctx(const tsr_session *s);
/* Copies sequence src's cells with p0 <= pos < p1 (p1 < 0: to the end) to
 * sequence dst, whose cells are all forgotten first (tsr_kv_cache_seq_copy):
 * a shared prompt prefix decoded once. TSR_E_FULL with nothing changed when
 * the cells are too few; TSR_E_INVALID for a sequence out of range. */
TSR_API tsr_status tsr_session_seq_copy(tsr_session *s, int32_t src, int32_t dst, int32_t p0, int32_t p1);
/* Saves sequence seq's state (its cells' positions, keys and values) to
 * host memory: *size is the bytes, also when cap is too small (TSR_E_RANGE;
 * buf may be NULL when cap is 0). */
TSR_API tsr_status tsr_session_seq_save(const tsr_session *s, int32_t seq, void *buf, size_t cap, size_t *size);
/* Replaces sequence seq with a state saved by tsr_session_seq_save from a
 * session of the same model and cache types (TSR_E_INVALID otherwise,
 * TSR_E_MALFORMED for other bytes); TSR_E_FULL with nothing changed when
 * the cells are too few. Decoding then continues after its last position. */
TSR_API tsr_status tsr_session_seq_load(tsr_session *s, int32_t seq, const void *buf, size_t size);

/* A bias added to one token's logit before any other step (OpenAI's
 * logit_bias); -INFINITY bans the token. */
typedef struct tsr_logit_bias {
    int32_t token;
    float bias;
} tsr_logit_bias;
typedef struct tsr_sampler_params {
    size_t size;           /* sizeof(tsr_sampler_params), set by _init */
    float temp;            /* 0 = greedy; default 0.8; finite, >= 0 */
    int32_t top_k;         /* default 40; <= 0 off; above n_vocab = n_vocab */
    float top_p, min_p;    /* defaults 0.95, 0.05; within 0..1; top_p 1 and min_p 0 are off */
    float repeat_penalty;  /* 1 = off (default); finite, > 0 */
    int32_t repeat_last_n; /* default 64; 0..1048576 */
    uint64_t seed;         /* default 0x5EED */
    /* appended with LIBTENSR_4: */
    float freq_penalty;     /* subtracted count times from a token's logit (repeat_last_n window); default 0 */
    float presence_penalty; /* subtracted once from a token's logit that occurs in the window; default 0 */
    const tsr_logit_bias *logit_bias; /* n_logit_bias entries added to the logits first (copied); NULL = none */
    size_t n_logit_bias;
} tsr_sampler_params;
TSR_API void tsr_sampler_params_init(tsr_sampler_params *p, size_t size);
/* llama.cpp's order: logit bias, penalties (repetition, frequency, presence), top-k, top-p, min-p, temperature,
 * then a draw (a seeded splitmix64: reproducible for a seed, not llama.cpp's
 * draws). p may be NULL (defaults). TSR_E_INVALID for a NULL model or out,
 * or a parameter outside its range (NaN included; penalties finite; a bias
 * not NaN nor +inf, on a token of the vocabulary). */
TSR_API tsr_status tsr_sampler_new(const tsr_model *m, const tsr_sampler_params *p, tsr_sampler **out);
TSR_API void tsr_sampler_free(tsr_sampler *s); /* NULL is a no-op */
/* Picks a token from n_vocab logits and remembers it for the penalties; -1
 * for NULL arguments. */
TSR_API int32_t tsr_sampler_sample(tsr_sampler *s, const float *logits);
/* Forgets the remembered tokens and restarts the draws from the seed. */
TSR_API void tsr_sampler_reset(tsr_sampler *s);
/* Remembers token for the penalties without drawing (the prompt's tokens,
 * as llama.cpp's penalties see them). TSR_E_INVALID for a NULL sampler or a
 * token outside the vocabulary. */
TSR_API tsr_status tsr_sampler_accept(tsr_sampler *s, int32_t token);
/* Log-probabilities of the model's distribution: the log-softmax of
 * logits[n_vocab] with the sampler's logit_bias added (before penalties,
 * filters and temperature, as OpenAI reports them). *logprob (may be NULL)
 * is token's; top_tokens/top_logprobs (may be NULL when n_top is 0) get the
 * n_top most likely, most likely first, ties by lower id (n_top above
 * n_vocab: n_vocab). Changes nothing in the sampler. TSR_E_INVALID for NULL
 * arguments or a token outside the vocabulary (token -1: none asked). */
TSR_API tsr_status tsr_sampler_logprobs(const tsr_sampler *s, const float *logits, int32_t token, float *logprob,
                                        size_t n_top, int32_t *top_tokens, float *top_logprobs);

/* ------------------------------------------------------------------------ */
/* Batching scheduler: continuous batching of requests over one session      */
/* ------------------------------------------------------------------------ */
/* A batcher owns a session of n_slots sequences (one per running request)
 * and a queue. Each tsr_batcher_step() runs ONE tsr_session_decode holding
 * the next token of every request in its decode phase and a chunk (at most
 * n_ubatch tokens) of each prompt in prefill, within n_batch tokens, so a
 * long prompt never stalls the others. A slot keeps its cells when its
 * request ends: the next request admitted to it keeps the longest common
 * prefix of its prompt and the slot's tokens (reported as n_cached). A
 * request waiting for a slot takes the free one with the longest such
 * prefix when that is at least half its prompt, else the free slot used
 * least recently (the others keep their prompts for later requests); a
 * longer prefix held by another slot, free or running, is copied in
 * (tsr_session_seq_copy) instead of decoded again. Batch invariance: at temperature 0 (or for a seed) a request's
 * tokens do not depend on the other requests or on its slot (exactly on
 * the flash-attention path; see tsr_session_seq_copy(3) for the plain one).
 *
 * Threads: tsr_batcher_submit, _cancel, _poll, _text, _release and
 * _counts may be called from any thread, concurrently with a step (a
 * mutex guards the queue and the requests); tsr_model_tokenize,
 * tsr_model_token_piece, tsr_model_detokenize and tsr_model_chat_format
 * read the loaded model only and may be called from any thread as well.
 * tsr_batcher_step and tsr_batcher_free belong to one stepping thread (the
 * one that drives the model's backend). Callbacks run on the stepping
 * thread, inside tsr_batcher_step, with the batcher locked: a callback
 * must not call the batcher (return non-zero to cancel its request). */
typedef struct tsr_batcher tsr_batcher;

typedef struct tsr_batcher_params {
    size_t size;         /* sizeof(tsr_batcher_params), set by _init */
    int32_t n_slots;     /* requests decoded side by side; default 4 */
    int64_t n_ctx_slot;  /* KV cells of each slot (prompt + generation); default 2048, at most the training context */
    int64_t n_batch;     /* most tokens of one step (one decode); default 512, at least n_slots */
    int64_t n_ubatch;    /* most prompt tokens of one request in one step, and tokens per graph; default 512 */
    int64_t n_queue_max; /* requests waiting for a slot; beyond it submit is TSR_E_FULL; 0 = no bound (default) */
    tsr_type type_k, type_v; /* KV cache types; default F16 */
} tsr_batcher_params;
TSR_API void tsr_batcher_params_init(tsr_batcher_params *p, size_t size);

typedef enum tsr_finish {
    TSR_FINISH_NONE = 0,      /* still queued or running */
    TSR_FINISH_STOP = 1,      /* an end-of-generation token or a stop string */
    TSR_FINISH_LENGTH = 2,    /* max_tokens reached, or the slot's cells */
    TSR_FINISH_CANCELLED = 3, /* tsr_batcher_cancel, or a callback's non-zero return */
    TSR_FINISH_ERROR = 4      /* the decode failed (tsr_batcher_step's status says why) */
} tsr_finish;

/* What a callback receives: one per generated token, and a last one with
 * finish set (token -1 unless a token came with it). Valid during the
 * callback only; fields may be appended (size). */
typedef struct tsr_batch_event {
    size_t size;      /* sizeof(tsr_batch_event) of the library */
    uint64_t id;      /* the request */
    int32_t token;    /* the token generated; -1 for none */
    float logprob;    /* its log-probability (tsr_sampler_logprobs) */
    const char *text; /* new text since the last event: whole UTF-8 characters, text that may begin */
    size_t text_len;  /* a stop string held back until it is known (not NUL-terminated) */
    int finish;       /* tsr_finish */
    int64_t n_prompt; /* prompt tokens */
    int64_t n_cached; /* of them, kept in the slot from an earlier request (not decoded again) */
    int64_t n_generated;
    /* appended: the n_top most likely tokens at this step and their
     * log-probabilities, most likely first (tsr_sampler_logprobs), when the
     * request asked for n_top_logprobs; else n_top 0 and NULL pointers */
    size_t n_top;
    const int32_t *top_tokens;
    const float *top_logprobs;
} tsr_batch_event;
typedef int (*tsr_batch_callback)(void *user, const tsr_batch_event *ev);

typedef struct tsr_request_params {
    size_t size;           /* sizeof(tsr_request_params), set by _init */
    const int32_t *tokens; /* the prompt as token ids (copied), or NULL and text: */
    size_t n_tokens;
    const char *text;                   /* tokenized with TSR_TOKENIZE_ADD_SPECIAL | TSR_TOKENIZE_PARSE_SPECIAL */
    const tsr_sampler_params *sampling; /* copied; NULL: greedy (temp 0) */
    int64_t max_tokens;                 /* most tokens generated; <= 0: until the slot is full (default) */
    const char *const *stop;            /* n_stop stop strings (copied): the text ends before the first */
    size_t n_stop;
    tsr_batch_callback callback; /* NULL: read the results with tsr_batcher_poll / _text */
    void *user;
    int32_t n_top_logprobs; /* 0..20: each token's event also names the most likely tokens (default 0) */
} tsr_request_params;
TSR_API void tsr_request_params_init(tsr_request_params *p, size_t size);

/* Creates a batcher over model m (p NULL: defaults): the session of
 * n_slots x n_ctx_slot cells and its compute are allocated here, so
 * out-of-memory shows now, never under load. TSR_E_INVALID for bad
 * parameters. */
TSR_API tsr_status tsr_batcher_new(tsr_model *m, const tsr_batcher_params *p, tsr_batcher **out);
/* Frees the batcher and every request (no more events). NULL is a no-op. */
TSR_API void tsr_batcher_free(tsr_batcher *b);
/* Queues a request; *id names it (never 0). TSR_E_INVALID for bad
 * parameters (no prompt, an empty one, a token outside the vocabulary, bad
 * sampling), TSR_E_RANGE when the prompt leaves no cell of n_ctx_slot for
 * a generated token, TSR_E_FULL when n_queue_max requests already wait.
 * Any thread. */
TSR_API tsr_status tsr_batcher_submit(tsr_batcher *b, const tsr_request_params *r, uint64_t *id);
/* Cancels a request in any phase (queued, prefill, decode): it ends with
 * TSR_FINISH_CANCELLED at the next step, which leaves it out of its decode.
 * A finished request is left as it is. TSR_E_NOT_FOUND for an unknown (or
 * released) id. Any thread. */
TSR_API tsr_status tsr_batcher_cancel(tsr_batcher *b, uint64_t id);
/* One step: admits queued requests to free slots, ends cancelled ones,
 * runs one decode and samples a token for each request whose prompt is
 * done. *n_active (may be NULL): requests queued or running after it (0:
 * nothing to do; a step with nothing to do returns at once). The stepping
 * thread only. A failed decode ends the requests in it with
 * TSR_FINISH_ERROR and returns its status. */
TSR_API tsr_status tsr_batcher_step(tsr_batcher *b, size_t *n_active);
/* The tokens generated so far (at most cap written; *n_tokens is the
 * count) and the request's tsr_finish in *finish (may be NULL).
 * TSR_E_NOT_FOUND for an unknown id. Any thread. */
TSR_API tsr_status tsr_batcher_poll(tsr_batcher *b, uint64_t id, int32_t *tokens, size_t cap, size_t *n_tokens,
                                    int *finish);
/* The text generated so far (stop string excluded): *len bytes, NUL-terminated
 * when len < cap, else TSR_E_RANGE. Any thread. */
TSR_API tsr_status tsr_batcher_text(tsr_batcher *b, uint64_t id, char *buf, size_t cap, size_t *len);
/* Forgets a finished request (a request with a callback is forgotten after
 * its last event by itself). TSR_E_STATE while it runs (cancel it first),
 * TSR_E_NOT_FOUND for an unknown id. Any thread. */
TSR_API tsr_status tsr_batcher_release(tsr_batcher *b, uint64_t id);
/* Requests running in slots and waiting in the queue, and KV cells in use
 * (any pointer may be NULL). Any thread. */
TSR_API void tsr_batcher_counts(tsr_batcher *b, size_t *running, size_t *waiting, int64_t *cells_used);

/* ------------------------------------------------------------------------ */
/* Auto-fit: the largest placement that fits the devices and system memory */
/* ------------------------------------------------------------------------ */
/* tsr_fit costs candidate placements of a model with the real planner (the
 * weights' placement, the KV cache, the compute buffers of the worst
 * micro-batch and what each device's stream holds beside buffers), in
 * process, without reading or allocating weights, and returns the largest
 * one that fits every device and system memory. */

#define TSR_FIT_MAX_DEVICES 16

typedef enum tsr_fit_prefer {
    TSR_FIT_PREFER_CONTEXT = 0, /* experts to system memory, then fewer GPU layers, then a smaller context */
    TSR_FIT_PREFER_SPEED = 1    /* a smaller context (down to n_ctx_min) first, then experts, then layers */
} tsr_fit_prefer;

typedef struct tsr_fit_params {
    size_t size; /* sizeof(tsr_fit_params), set by _init */
    /* Bytes kept free on each device of the backend, in tsr_backend_device
     * order (GPUs, then the CPU); n_margins entries, the rest default.
     * Defaults: gpu_margin on every GPU, host_margin on system memory. */
    const size_t *margins;
    size_t n_margins;
    size_t gpu_margin;     /* default 1 GiB */
    size_t host_margin;    /* default 0 */
    int64_t n_ctx_min;     /* the context is never shrunk below this; default 4096 */
    int prefer;            /* tsr_fit_prefer; default TSR_FIT_PREFER_CONTEXT */
    int keep_n_gpu_layers; /* 1: the load params' n_gpu_layers is a constraint, kept as given */
    int keep_n_ctx;        /* 1: the session params' n_ctx is a constraint (the context is not shrunk) */
} tsr_fit_params;

/* Fills p with the defaults and records size (= sizeof *p). */
TSR_API void tsr_fit_params_init(tsr_fit_params *p, size_t size);

typedef struct tsr_fit_result {
    size_t size;      /* the caller sets sizeof(tsr_fit_result); tsr_fit fills the fields within it */
    int n_gpu_layers; /* for tsr_load_params.n_gpu_layers */
    int n_cpu_moe;    /* the last n_cpu_moe layers' routed experts are in system memory (by the fit) */
    int64_t n_ctx;    /* for tsr_session_params.n_ctx */
    /* for tsr_load_params.tensor_split: one weight per GPU of the backend
     * (the caller's own when it gave one) */
    float tensor_split[TSR_FIT_MAX_DEVICES];
    /* for tsr_load_params.overrides: NULL-terminated, the caller's own
     * first, then the fit's ("blk\.(2[0-9])\.ffn_.*_exps" = CPU); owned by
     * the result (tsr_fit_result_free); NULL when there are none */
    tsr_buft_override *overrides;
    size_t n_devices; /* devices of the backend (GPUs, then the CPU) */
    /* per device: the planned bytes (weights + KV cache + compute + stream),
     * the memory the fit had (free memory less the margin; for the CPU,
     * system memory less the margin) */
    size_t planned[TSR_FIT_MAX_DEVICES];
    size_t available[TSR_FIT_MAX_DEVICES];
    int n_layers;     /* repeating layers of the model */
    int n_candidates; /* placements costed */
    double seconds;   /* the time the fit took */
} tsr_fit_result;

/* Finds the largest placement of the model at path that fits: every device
 * (its free memory less its margin) and system memory (MemAvailable and the
 * cgroup v1/v2 limit, less the host margin; CPU-resident weights count in
 * full, mapped or not, as the page cache they need). bp picks the devices
 * (as tsr_backend_new; NULL = all), lp and sp are the load and session
 * params as the caller set them (NULL = defaults), fp the fit's own (NULL
 * = defaults). Nothing the caller passed is changed; the caller applies
 * the result to copies of its params. The caller's overrides stay first
 * (the tensors they name stay where the caller put them), a caller's
 * tensor_split is kept, and so are n_gpu_layers and n_ctx when fp says so.
 * Then, for a mixture of experts, routed experts move to system memory
 * layer by layer from the last, then the GPU layer count goes down, then
 * the context shrinks to fp->n_ctx_min (or the context first with
 * TSR_FIT_PREFER_SPEED). TSR_E_DEVICE_NOMEM when not even the smallest
 * allowed placement fits: the detail names the device and the bytes
 * missing. TSR_E_INVALID, TSR_E_IO, TSR_E_MALFORMED, TSR_E_UNSUPPORTED as
 * tsr_model_load. Free the result with tsr_fit_result_free (also after a
 * failure). Free memory is read as it is at the call, so call it before
 * making the backend the result is loaded into: the plan counts that
 * backend's stream workspace and scratch, which a backend made first would
 * already hold (counted twice). Thread-safe with respect to other
 * backends. */
TSR_API tsr_status tsr_fit(const char *path, const tsr_backend_params *bp, const tsr_load_params *lp,
                           const tsr_session_params *sp, const tsr_fit_params *fp, tsr_fit_result *out);
/* Frees what the result owns (its override list) and clears the list; the
 * struct itself is the caller's. NULL is a no-op. */
TSR_API void tsr_fit_result_free(tsr_fit_result *r);
/* The placement as the flags of tensr-run that reproduce it
 * ("-ngl 27 -ts 1,3 -ot \"blk\.(2[0-9])\.ffn_.*_exps=CPU\" -c 16384"): at
 * most cap bytes written, NUL-terminated when *len < cap, else TSR_E_RANGE
 * (buf may be NULL when cap is 0); *len is the full length. */
TSR_API tsr_status tsr_fit_result_flags(const tsr_fit_result *r, char *buf, size_t cap, size_t *len);

/* Frees memory the library returned to the caller. */
TSR_API void tsr_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* LIBTENSR_H */
