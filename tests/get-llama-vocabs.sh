#!/bin/sh
# get-llama-vocabs.sh - fetches llama.cpp's tokenizer test vocabularies
# (models/ggml-vocab-*.gguf with their .inp/.out cases) into
# ${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/llama-vocabs-VERSION/ and prints
# that folder. Does nothing but print it when it is already there.
#
# The files come from the llama.cpp source that the llama-cpp-python sdist
# vendors (PyPI): the sdist is fetched once (pip download), its SHA-256
# checked, kept in the cache, and only the vocabulary files are extracted.
#
#   LLAMA_CPP_PYTHON_VERSION  the sdist's version (default below; another
#                             version is taken without a checksum)
set -eu

die() { echo "get-llama-vocabs.sh: $*" >&2; exit 1; }

DEFAULT_VERSION=0.3.36
DEFAULT_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
VERSION=${LLAMA_CPP_PYTHON_VERSION:-$DEFAULT_VERSION}
SDIST=llama_cpp_python-$VERSION.tar.gz

dir="${XDG_CACHE_HOME:-$HOME/.cache}/libtensr"
out="$dir/llama-vocabs-$VERSION"

if [ -f "$out/.complete" ]; then
    echo "$out"
    exit 0
fi

sha_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

sdist_ok() {
    [ -f "$1" ] || return 1
    [ "$VERSION" != "$DEFAULT_VERSION" ] || [ "$(sha_of "$1")" = "$DEFAULT_SHA256" ]
}

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/get-llama-vocabs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

sdist="$dir/$SDIST"
if ! sdist_ok "$sdist"; then
    pip_cmd=""
    if command -v pip3 >/dev/null 2>&1; then
        pip_cmd=pip3
    elif command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
        pip_cmd="python3 -m pip"
    fi
    [ -n "$pip_cmd" ] || die "no pip to fetch llama-cpp-python $VERSION"
    $pip_cmd download --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$VERSION" >&2 &&
        [ -f "$tmp/$SDIST" ] || die "pip could not fetch llama-cpp-python $VERSION's sdist"
    sdist_ok "$tmp/$SDIST" || die "$SDIST: SHA-256 $(sha_of "$tmp/$SDIST"), expected $DEFAULT_SHA256"
    mv "$tmp/$SDIST" "$sdist"
fi

tar -xzf "$sdist" -C "$tmp" --wildcards '*/vendor/llama.cpp/models/ggml-vocab-*' ||
    die "$SDIST has no vendor/llama.cpp/models/ggml-vocab-* files"
mkdir -p "$tmp/vocabs"
mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-* "$tmp/vocabs/"
: > "$tmp/vocabs/.complete"
rm -rf "$out"
mv "$tmp/vocabs" "$out"
echo "$out"
