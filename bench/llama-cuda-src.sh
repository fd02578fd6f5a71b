#!/bin/sh
# bench/llama-cuda-src.sh - a trimmed copy of the llama.cpp source vendored in
# the llama-cpp-python sdist, for building llama.cpp's CUDA llama-bench on
# the GPU machine (tests/gpu/check.sh), which has no network and takes at
# most 64 MiB carried beside the tree: the build files, include/, src/,
# common/, the vendored headers common needs, ggml's core, its CPU and CUDA
# backends and tools/llama-bench (tools/CMakeLists.txt cut to that one
# tool); no models, docs, tests, other backends or tools. Writes
# llama-cuda-src.tar.xz (about 4 MB) into the folder given (default .) and
# prints its path. The sdist comes from pip download, cached as by
# bench/build-llama.sh.
#   LCP_VERSION  llama-cpp-python version (default 0.3.36)
#   TSR_CACHE    cache folder (default ${XDG_CACHE_HOME:-~/.cache}/libtensr)
set -eu
LCP_VERSION=${LCP_VERSION:-0.3.36}
TSR_CACHE=${TSR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/libtensr}
out_dir=$(cd "${1:-.}" && pwd)
sdist_dir=$TSR_CACHE/sdist
tarball=$sdist_dir/llama_cpp_python-$LCP_VERSION.tar.gz
mkdir -p "$sdist_dir"
if [ ! -f "$tarball" ]; then
    if [ -f "$TSR_CACHE/llama_cpp_python-$LCP_VERSION.tar.gz" ]; then
        cp "$TSR_CACHE/llama_cpp_python-$LCP_VERSION.tar.gz" "$tarball"
    else
        python3 -m pip download --no-deps --no-binary :all: -d "$sdist_dir" "llama-cpp-python==$LCP_VERSION" >&2
    fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
v=llama_cpp_python-$LCP_VERSION/vendor/llama.cpp
tar xzf "$tarball" -C "$tmp" "$v"
src=$tmp/$v
dst=$tmp/llama.cpp
mkdir -p "$dst/tools" "$dst/ggml/src"
for p in CMakeLists.txt LICENSE cmake include src common vendor; do
    [ -e "$src/$p" ] && cp -R "$src/$p" "$dst/"
done
cp -R "$src/tools/llama-bench" "$dst/tools/"
cat > "$dst/tools/CMakeLists.txt" << 'CM'
# trimmed by libtensr's bench/llama-cuda-src.sh: llama-bench only
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
CM
for p in CMakeLists.txt cmake include; do cp -R "$src/ggml/$p" "$dst/ggml/"; done
for f in "$src"/ggml/src/*; do
    [ -f "$f" ] && cp "$f" "$dst/ggml/src/"
done
cp -R "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$dst/ggml/src/"
# ggml-cuda's CMakeLists may reach into the HIP/MUSA folders' headers: keep their build files only
for b in ggml-hip ggml-musa; do
    [ -d "$src/ggml/src/$b" ] && mkdir -p "$dst/ggml/src/$b" && cp "$src/ggml/src/$b/CMakeLists.txt" "$dst/ggml/src/$b/" 2>/dev/null || true
done
out=$out_dir/llama-cuda-src.tar.xz
tar cJf "$out" -C "$tmp" llama.cpp
echo "$out"
