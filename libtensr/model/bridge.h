/*
 * bridge.h - the one door from the model layer (libtensr/model/) into the
 * core: the model sources include libtensr.h and this file only, so they
 * remain the proof that the public op API suffices; what they take from the
 * core is the thread-local error detail behind tsr_last_error(), so the
 * model layer has the library's one error channel. The declaration is the
 * one of libtensr/internal.h (status.c defines it).
 */
#ifndef TSR_MODEL_BRIDGE_H
#define TSR_MODEL_BRIDGE_H

#include "libtensr.h"

#include <stdarg.h>

/* Sets the thread-local detail from fmt and returns s. */
tsr_status tsr__verror(tsr_status s, const char *fmt, va_list ap);

#endif
