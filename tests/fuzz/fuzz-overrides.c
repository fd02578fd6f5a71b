/*
 * fuzz-overrides.c - fuzz target for the buffer-type override parser
 * (tsr_buft_overrides_parse, llama.cpp's -ot "pattern=BUFT,..." syntax):
 * the input is the spec as a NUL-terminated string. Every failure must
 * explain itself and leave *out NULL; every success is a NULL-terminated
 * list of non-empty patterns on real buffer types, freed again.
 *
 * make fuzz builds it with libFuzzer; make check replays
 * tests/fuzz/corpus-overrides/ (fuzz-replay.h).
 */
#include "libtensr.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = malloc(size + 1);
    if (!spec) return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    tsr_buft_override *list = (tsr_buft_override *)&list; /* must be overwritten */
    tsr_status st = tsr_buft_overrides_parse(spec, &list);
    if (st != TSR_OK) {
        if (list != NULL || !tsr_last_error()[0]) abort();
    } else {
        if (!list) abort();
        for (tsr_buft_override *o = list; o->pattern; o++)
            if (!o->buft || !tsr_buffer_type_name(o->buft)) abort();
    }
    tsr_buft_overrides_free(list);
    free(spec);
    return 0;
}

#define FUZZ_NAME "overrides"
#include "fuzz-replay.h"
