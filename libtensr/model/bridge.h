/*
 * bridge.h - the one door from the model layer (libtensr/model/) into the
 * core: the model sources include libtensr.h and this file only, so they
 * remain the proof that the public op API suffices; what they take from the
 * core is the thread-local error detail behind tsr_last_error(), so the
 * model layer has the library's one error channel. The declarations are
 * those of libtensr/internal.h (status.c defines them).
 */
#ifndef TSR_MODEL_BRIDGE_H
#define TSR_MODEL_BRIDGE_H

#include "libtensr.h"

#include <stdarg.h>

/* Set the thread-local detail from fmt and return s. */
tsr_status tsr__verror(tsr_status s, const char *fmt, va_list ap);
tsr_status tsr__error(tsr_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
