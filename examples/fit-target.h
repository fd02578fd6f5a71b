/*
 * fit-target.h - the --fit-target MiB[,MiB...] option of tensr-run and
 * tensr-server, included by both (public API only): one value is the
 * margin tsr_fit keeps free on every GPU, several are one per device in
 * the order of tsr_backend_device (GPUs, then the CPU).
 */
#ifndef TSR_EXAMPLES_FIT_TARGET_H
#define TSR_EXAMPLES_FIT_TARGET_H

#include "libtensr.h"

#include <stdlib.h>

/* Sets fp's margins from spec, through margins (TSR_FIT_MAX_DEVICES
 * entries, which fp then points to): 0, or -1 when a value is not a whole
 * number of MiB in 0..2^40 or there are more values than that. */
static int fit_target_parse(const char *spec, tsr_fit_params *fp, size_t *margins) {
    size_t n = 0;
    for (const char *s = spec; *s;) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || v > (1LL << 40) || (*end && *end != ',') || n == TSR_FIT_MAX_DEVICES)
            return -1;
        margins[n++] = (size_t)v << 20;
        s = *end ? end + 1 : end;
    }
    if (n == 0)
        return -1;
    if (n == 1) {
        fp->gpu_margin = margins[0];
    } else {
        fp->margins = margins;
        fp->n_margins = n;
    }
    return 0;
}

#endif
