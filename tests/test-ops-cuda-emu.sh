#!/bin/sh
# test-ops-cuda-emu.sh - the op harness on CUDA0 of the emulated CUDA module
# (tests/libtensr-cuda-emu.la: cuda/backend.c and every kernel of cuda/*.cu
# built for the host against cuda/emu/, see cuda/README.md), loaded through
# TSR_BACKEND_PATH as the real module is. Every case's sources live in
# CUDA0's memory, each node the module claims must run there, and the
# result must match the reference and the CPU element by element (test-ops
# -d). A kernel that indexes past a buffer (under ASan), misses a barrier,
# reaches a barrier in divergent code or computes a wrong value fails here.
# First tests/test-cuda-emu.c: the module's host-side rules on the same
# CUDA0. Arguments go to test-ops (e.g. -o rms_norm).
top=${top_builddir:-.}
mod=$top/tests/.libs/libtensr-cuda-emu.so
[ -f "$mod" ] || { echo "FAIL: $mod is not built"; exit 1; }
TSR_BACKEND_PATH=$mod "$top/tests/test-cuda-emu" || exit 1
TSR_BACKEND_PATH=$mod exec "$top/tests/test-ops" -d CUDA0 "$@"
