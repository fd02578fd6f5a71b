/*
 * fuzz-gguf.c - fuzz target for the GGUF reader: opens the input from
 * memory and, when it opens, walks every key through every getter and reads
 * every tensor, so that anything the reader accepted is safe to use.
 *
 * Built with clang -fsanitize=fuzzer (make fuzz-gguf, see Makefile.am) it
 * fuzzes for real. Built normally (make check) its main() replays the
 * committed seed corpus tests/fuzz/corpus-gguf/ (or the files and
 * directories given as arguments).
 */
#include "libtensr.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk_key(const tsr_gguf *g, const char *key) {
    uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f; double d; int b;
    const char *s; size_t len; const void *p; tsr_gguf_type et; uint64_t n;
    (void)tsr_gguf_get_u32(g, key, &u32);
    (void)tsr_gguf_get_i32(g, key, &i32);
    (void)tsr_gguf_get_u64(g, key, &u64);
    (void)tsr_gguf_get_i64(g, key, &i64);
    (void)tsr_gguf_get_f32(g, key, &f);
    (void)tsr_gguf_get_f64(g, key, &d);
    (void)tsr_gguf_get_bool(g, key, &b);
    if (tsr_gguf_get_str(g, key, &s, &len) == TSR_OK && strlen(s) > len) abort();
    if (tsr_gguf_get_arr_info(g, key, &et, &n) != TSR_OK) return;
    if (tsr_gguf_get_arr_data(g, key, &p) == TSR_OK && n) {
        volatile uint8_t sink = ((const uint8_t *)p)[0];
        (void)sink;
    }
    for (uint64_t i = 0; i < n && i < 1000; i++)
        if (tsr_gguf_get_arr_str(g, key, i, &s, &len) == TSR_OK && strlen(s) > len) abort();
    (void)tsr_gguf_get_arr_str(g, key, n, &s, &len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tsr_gguf *g;
    if (tsr_gguf_open_memory(data, size, "fuzz.gguf", 1, &g) != TSR_OK) {
        if (!tsr_last_error()[0]) abort(); /* every failure explains itself */
        return 0;
    }
    for (int64_t i = 0; i < tsr_gguf_n_keys(g); i++) {
        const void *raw;
        size_t rsize;
        (void)tsr_gguf_get_raw(g, i, &raw, &rsize);
        walk_key(g, tsr_gguf_key_name(g, i));
        if (tsr_gguf_find_key(g, tsr_gguf_key_name(g, i)) != i) abort();
    }
    for (int64_t i = 0; i < tsr_gguf_n_tensors(g); i++) {
        size_t n = tsr_gguf_tensor_size(g, i);
        if (tsr_gguf_find_tensor(g, tsr_gguf_tensor_name(g, i)) != i) abort();
        if (tsr_gguf_tensor_offset(g, i) % tsr_gguf_alignment(g)) abort();
        if (tsr_gguf_data_offset(g) + tsr_gguf_tensor_offset(g, i) + n > size && n) abort();
        if (n > (64u << 20)) continue;
        void *buf = malloc(n ? n : 1);
        if (buf && tsr_gguf_read_tensor(g, i, buf, n) != TSR_OK) abort();
        free(buf);
    }
    tsr_gguf_close(g);
    return 0;
}

#define FUZZ_NAME "gguf"
#include "fuzz-replay.h"
