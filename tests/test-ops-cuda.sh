#!/bin/sh
# test-ops-cuda.sh - the op harness on CUDA0 against the CPU (every case),
# through the CUDA module (TSR_BACKEND_PATH). Skips (77) when the module is
# not built or there is no GPU: test-ops itself skips when CUDA0 is absent.
top=${top_builddir:-.}
mod=$top/cuda/.libs/libtensr-cuda.so
[ -f "$mod" ] || { echo "SKIP: the CUDA module is not built (./configure --enable-cuda)"; exit 77; }
TSR_BACKEND_PATH=$mod TSR_TEST_DEVICE=CUDA0 exec "$top/tests/test-ops" "$@"
