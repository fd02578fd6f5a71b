#!/bin/sh
# bench/build-llama.sh - builds llama.cpp's llama-bench and llama-quantize
# natively (-DGGML_NATIVE=ON, Release) from the llama.cpp source vendored in
# the llama-cpp-python sdist, fetched with pip download. Everything lives in
# a cache outside the tracked tree and is reused: a second run does nothing.
# Prints the folder that holds the programs.
#   LLAMA_TARGETS the programs (default "llama-bench llama-quantize";
#                 make bench-server asks for llama-server)
#   LCP_VERSION   llama-cpp-python version (default 0.3.36)
#   TSR_CACHE     cache folder (default ${XDG_CACHE_HOME:-~/.cache}/libtensr)
#   JOBS          parallel compile jobs (default 2)
#   LLAMA_CMAKE_ARGS  the ISA flags (default -DGGML_NATIVE=ON; e.g. for an
#                 AVX2-only llama.cpp on an AVX-512 machine: "-DGGML_NATIVE=OFF
#                 -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON");
#                 each setting builds in its own folder
set -eu
LCP_VERSION=${LCP_VERSION:-0.3.36}
TSR_CACHE=${TSR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/libtensr}
JOBS=${JOBS:-2}
sdist_dir=$TSR_CACHE/sdist
src=$TSR_CACHE/llama.cpp-$LCP_VERSION
LLAMA_CMAKE_ARGS=${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=ON}
if [ "$LLAMA_CMAKE_ARGS" = "-DGGML_NATIVE=ON" ]; then
    build=$src/build-native
else
    build=$src/build-$(printf '%s' "$LLAMA_CMAKE_ARGS" | cksum | cut -d' ' -f1)
fi
bin=$build/bin
LLAMA_TARGETS=${LLAMA_TARGETS:-llama-bench llama-quantize}

have=1
for t in $LLAMA_TARGETS; do [ -x "$bin/$t" ] || have=0; done
if [ $have = 1 ]; then
    echo "$bin"
    exit 0
fi
mkdir -p "$sdist_dir"
tarball=$sdist_dir/llama_cpp_python-$LCP_VERSION.tar.gz
if [ ! -f "$tarball" ]; then
    # An sdist already in the cache folder (e.g. the one tests/make-llama-refs.sh fetched) is reused.
    if [ -f "$TSR_CACHE/llama_cpp_python-$LCP_VERSION.tar.gz" ]; then
        cp "$TSR_CACHE/llama_cpp_python-$LCP_VERSION.tar.gz" "$tarball"
    else
        python3 -m pip download --no-deps --no-binary :all: \
            -d "$sdist_dir" "llama-cpp-python==$LCP_VERSION" >&2
    fi
fi
if [ ! -f "$src/CMakeLists.txt" ]; then
    tmp=$src.tmp
    rm -rf "$tmp"
    mkdir -p "$tmp"
    tar xzf "$tarball" -C "$tmp" "llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"
    rm -rf "$src"
    mv "$tmp/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp" "$src"
    rm -rf "$tmp"
fi
# shellcheck disable=SC2086 # the flags are words
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release $LLAMA_CMAKE_ARGS -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
# shellcheck disable=SC2086 # the targets are words
nice -n 19 cmake --build "$build" --target $LLAMA_TARGETS -j "$JOBS" >&2
echo "$bin"
