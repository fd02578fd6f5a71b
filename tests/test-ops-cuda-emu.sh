#!/bin/sh
# test-ops-cuda-emu.sh - the op harness on CUDA0 of the emulated CUDA module
# (tests/libtensr-cuda-emu.la: cuda/cuda.c and every kernel of cuda/*.cu
# built for the host against cuda/emu/, see cuda/README.md), loaded through
# TSR_BACKEND_PATH as the real module is. Every case's sources live in
# CUDA0's memory, each node the module claims must run there, and the
# result must match the reference and the CPU element by element (test-ops
# -d). A kernel that indexes past a buffer (under ASan), misses a barrier,
# reaches a barrier in divergent code or computes a wrong value fails here.
# First tests/test-cuda-emu.c (the module's host-side rules) and
# tests/test-cuda-module.c's device cases (memory, pinned buffers, CUDA
# graphs captured and replayed, a bad expert id in a replay) on the same
# CUDA0. Arguments go to test-ops (e.g. -o rms_norm).
top=${top_builddir:-.}
mod=$top/tests/.libs/libtensr-cuda-emu.so
[ -f "$mod" ] || { echo "FAIL: $mod is not built"; exit 1; }
TSR_BACKEND_PATH=$mod "$top/tests/test-cuda-emu" || exit 1
TCU_EMU_REVERSE=1 TSR_BACKEND_PATH=$mod "$top/tests/test-cuda-emu" > /dev/null 2>&1 ||
    { echo "FAIL: test-cuda-emu with each block's threads in reverse order (TCU_EMU_REVERSE=1)"; exit 1; }
log=$(mktemp "${TMPDIR:-/tmp}/tsr-cuda-emu.XXXXXX") || exit 99
# Kernel launches per decode layer: at most 15 with flash attention (llama.cpp's
# 12-16), 16 without (the transposed V cache's write is a launch of its own): one
# token of a llama-shaped model (tests/gpu/gpu-model small, 64 wide) with 1
# and with 3 layers, the difference halved; F16 and Q8_0 weights, flash
# attention off and on.
if [ $# -eq 0 ]; then
    d=$log.d
    mkdir "$d" || exit 99
    for n in 1 3; do
        "$top/tests/gpu/gpu-model" "$d/f16-$n.gguf" small $n > /dev/null &&
            "$top/examples/tensr-quantize" "$d/f16-$n.gguf" "$d/q8_0-$n.gguf" q8_0 > /dev/null 2>&1 ||
            { rm -rf "$d" "$log"; echo "FAIL: writing the small models (gpu-model, tensr-quantize)"; exit 1; }
    done
    for w in f16 q8_0; do
        for fa in 0 1; do
            printf '%s: ' $w
            TSR_EMU_LAUNCH_LIMIT=${TSR_EMU_LAUNCH_LIMIT:-$((15 + 1 - fa))} TSR_BACKEND_PATH=$mod "$top/tests/test-cuda-emu" launches $fa "$d/$w-1.gguf" 1 "$d/$w-3.gguf" 3 > "$log" 2>&1
            r=$?
            grep -h 'launches per decode\|FAIL' "$log"
            [ $r -eq 0 ] || { rm -rf "$d" "$log"; exit 1; }
        done
    done
    rm -rf "$d"
fi
TSR_TEST_CUDA_MODULE=$mod "$top/tests/test-cuda-module" > "$log" 2>&1 ||
    { tail -n 30 "$log"; rm -f "$log"; echo "FAIL: test-cuda-module on the emulated module"; exit 1; }
tail -n 1 "$log"
rm -f "$log"
# The kernels with barriers and warp exchanges again, each block's threads
# run last first (TCU_EMU_REVERSE=1): a missing barrier hides when the
# writer runs before the reader, and in one of the two orders it does not.
if [ $# -eq 0 ]; then
    for op in rms_norm norm softmax set_rows argmax sum_rows argsort top_k flash_attn mul_mat_id; do
        TCU_EMU_REVERSE=1 TSR_BACKEND_PATH=$mod "$top/tests/test-ops" -d CUDA0 -o $op > /dev/null 2>&1 ||
            { echo "FAIL: $op with each block's threads in reverse order (TCU_EMU_REVERSE=1 test-ops -d CUDA0 -o $op)"; exit 1; }
    done
    echo "again with threads in reverse order: rms_norm norm softmax set_rows argmax sum_rows argsort top_k flash_attn mul_mat_id"
fi
TSR_BACKEND_PATH=$mod exec "$top/tests/test-ops" -d CUDA0 "$@"
