#!/bin/sh
# test-cuda-deps.sh - the core library never links the CUDA runtime or
# cuBLAS (no NEEDED entry naming cuda or cublas), and the CUDA module, when
# it is built, does (it links them, and nothing of libtensr: -Wl,-z,defs).
top=${top_builddir:-.}
command -v objdump >/dev/null 2>&1 || { echo "SKIP: no objdump"; exit 77; }
lib=$top/.libs/libtensr.so
[ -f "$lib" ] || { echo "SKIP: $lib not built"; exit 77; }
rc=0
if objdump -p "$lib" | grep NEEDED | grep -i -E 'cuda|cublas'; then
    echo "FAIL: $lib needs a CUDA library"; rc=1
else
    echo "ok: $lib needs no CUDA library"
fi
mod=$top/cuda/.libs/libtensr-cuda.so
if [ -f "$mod" ]; then
    needed=$(objdump -p "$mod" | grep NEEDED)
    echo "$needed"
    echo "$needed" | grep -q libcudart || { echo "FAIL: $mod does not need libcudart"; rc=1; }
    echo "$needed" | grep -q libcublas || { echo "FAIL: $mod does not need libcublas"; rc=1; }
    if echo "$needed" | grep -q 'libtensr\.so'; then echo "FAIL: $mod links libtensr"; rc=1; fi
    objdump -T "$mod" | grep -q 'tsr_backend_module_init' || { echo "FAIL: $mod exports no entry point"; rc=1; }
else
    echo "(the CUDA module is not built: only the core library checked)"
fi
exit $rc
