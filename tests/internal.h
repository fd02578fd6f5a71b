/*
 * internal.h (tests/) - the only door from a test to the library's
 * internals: the private headers, spelled from the top of the source tree
 * (so that this file never includes itself; from tests/, a quoted
 * "internal.h" is this file, not libtensr/internal.h).
 *
 * The internal functions are hidden in the shared library, which exports
 * tsr_* only: a test that includes this file must link the static library
 * (tests_<name>_LDFLAGS = $(TSR_TEST_STATIC) in Makefile.am). Tests of the
 * public API include only libtensr.h and tsrtest.h.
 */
#ifndef TSRTEST_INTERNAL_H
#define TSRTEST_INTERNAL_H

#include "libtensr/internal.h"           /* tensor struct, ops, errors, tsr__fail_alloc_after */
#include "libtensr/core.h"               /* backend, context, graph, allocator, scheduler */
#include "libtensr/gguf/gguf.h"          /* GGUF reader/writer internals */
#include "libtensr/attention/kvcache.h"  /* the KV cache object */
#include "cpu/cpu.h"                     /* CPU streams, kernel tables, threadpool */

#endif
