#!/bin/sh
# test-cuda-tools.sh - the tools and the Python binding with the CUDA module
# in the module path, on this machine: without a GPU, tensr-run
# --list-devices and `import libtensr` work unchanged (the CPU alone) and the
# info log says why the module added no device. With CUDA0 present the tool
# lists it. Skips (77) when the module is not built.
top=${top_builddir:-.}
mod=$top/cuda/.libs/libtensr-cuda.so
[ -f "$mod" ] || { echo "SKIP: the CUDA module is not built (./configure --enable-cuda)"; exit 77; }
export TSR_BACKEND_PATH=$mod TSR_LOG_LEVEL=info
rc=0
out=$("$top/examples/tensr-run" --list-devices 2>&1) || { echo "FAIL: tensr-run --list-devices"; rc=1; }
echo "$out"
if echo "$out" | grep -q 'CUDA0'; then
    echo "ok: CUDA0 listed"
else
    echo "$out" | grep -q 'cuda: no CUDA device' || { echo "FAIL: no reason logged for the missing GPU"; rc=1; }
    echo "$out" | grep -q 'backends: cpu' || { echo "FAIL: tensr-run lists other backends than the CPU"; rc=1; }
fi
py=${PYTHON3:-python3}
if command -v "$py" >/dev/null 2>&1; then
    LIBTENSR_PATH=$top/.libs/libtensr.so PYTHONPATH=${top_srcdir:-.}/examples/python \
        "$py" -c 'import libtensr; print("python: backends", libtensr.backends_available())' 2>&1 ||
        { echo "FAIL: import libtensr"; rc=1; }
else
    echo "(no python3: the binding not checked)"
fi
exit $rc
