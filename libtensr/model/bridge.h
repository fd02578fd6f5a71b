/*
 * bridge.h - the one door from the model layer (libtensr/model/) into the
 * core: the model sources include libtensr.h and this file only, so they
 * remain the proof that the public op API suffices; what they take from the
 * core is the thread-local error detail behind tsr_last_error(), so the
 * model layer has the library's one error channel, and the allocation
 * wrappers, so that every allocation of the model layer is counted and can
 * be made to fail like the core's (tsr__fail_alloc_after). The declarations
 * are those of libtensr/internal.h (status.c defines them): memory from
 * tsr__malloc/tsr__calloc/tsr__realloc/tsr__strdup is freed with tsr__free.
 */
#ifndef TSR_MODEL_BRIDGE_H
#define TSR_MODEL_BRIDGE_H

#include "libtensr.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Set the thread-local detail from fmt and return s. */
tsr_status tsr__verror(tsr_status s, const char *fmt, va_list ap);
tsr_status tsr__error(tsr_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A log record through the library's log callback: n_fields pairs of
 * (key, value) strings follow msg (log.c). */
void tsr__log(tsr_log_level level, const char *msg, size_t n_fields, ...);

/* The core's allocation wrappers (counted; the test hook can fail the Nth). */
void *tsr__malloc(size_t size);
void *tsr__calloc(size_t n, size_t size);
void *tsr__realloc(void *p, size_t size);
void tsr__free(void *p);
char *tsr__strdup(const char *s);

/* gguf/load.c: tsr_backend_load_gguf of the file g was parsed from (by
 * tsr_gguf_open), read through g's own descriptor: the model's metadata and
 * its weights come from one file, parsed once. */
tsr_status tsr__backend_load_parsed(tsr_backend *b, const tsr_gguf *g, const tsr_load_params *p);

/* The per-token profile (profile.c, TSR_PROFILE=1): graph build time and
 * tokens; slot 0 is the graph build. */
bool tsr__prof_on(void);
int64_t tsr__prof_now(void);
void tsr__prof_add(int slot, int64_t ns);
void tsr__prof_tokens(int64_t n);

/* ---- dry runs of the planner (runtime/backend.c, runtime/sysmem.c; tsr_fit) ---- */
/* A planning backend: loads with plan_only keep the planned weights declared
 * without memory, KV caches plan without allocating, tsr_reserve measures,
 * plan checks pass (the caller compares the plan itself). */
void tsr__backend_set_plan_mode(struct tsr_backend *b, bool on);
/* The parsed file the dry runs of a planning backend use (NULL: none; not owned). */
void tsr__backend_set_plan_gguf(struct tsr_backend *b, tsr_gguf *g);
tsr_gguf *tsr__backend_plan_gguf(const struct tsr_backend *b);
/* Forgets a dry run's weights and zeroes the plan. */
void tsr__backend_plan_reset(struct tsr_backend *b);
/* Bytes device i's stream holds beside buffers for the largest graph planned. */
size_t tsr__backend_plan_stream(const struct tsr_backend *b, size_t i);
/* System memory the process may still take: MemAvailable capped by the
 * cgroup (v1/v2) limit less usage; hooks TSR_FIT_SYSMEM, TSR_FIT_PROC_ROOT. */
size_t tsr__system_memory_available(void);
/* "64MiB", "2G", "123" -> bytes; false when malformed. */
bool tsr__parse_size(const char *s, size_t *out);

#endif
