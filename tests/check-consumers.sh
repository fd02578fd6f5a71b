#!/bin/sh
# check-consumers.sh - a program outside the tree needs nothing but the
# installed package: install into a temporary DESTDIR, then build
# examples/minimal.c, examples/minimal.cpp and examples/model-demo.c with only
# `pkg-config --cflags --libs libtensr` (shared) and
# `pkg-config --static --cflags --libs libtensr` (fully static), and run them.
# model-demo runs on the default model when it is cached (or TSR_MODEL names
# it): load, tokenize, generate, two sequences in one batch, statuses.
# Also checks that the header, the .pc file and the man pages were installed.
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-$srcdir}
MAKE=${MAKE:-make}
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: pkg-config not installed"; exit 77; }
# A sanitizer build (.ci/run sets TSR_SANITIZER): the installed library needs
# the sanitizer's runtime, which a consumer built with the plain flags (and a
# fully static one at all) cannot have. The plain build runs this check.
if [ -n "${TSR_SANITIZER:-}" ]; then
    echo "SKIP: sanitizer build (TSR_SANITIZER=$TSR_SANITIZER): consumers link the installed library without its runtime"
    exit 77
fi
[ -f "$builddir/Makefile" ] || { echo "SKIP: no configured build tree at $builddir"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr-consumer.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
dest=$tmp/root

# Install quietly; unset MAKEFLAGS so that the check run's flags (-k, jobserver)
# do not leak into this nested make.
if ! env -u MAKEFLAGS -u MFLAGS "$MAKE" -C "$builddir" install DESTDIR="$dest" >"$tmp/install.log" 2>&1; then
    echo "FAIL: make install DESTDIR=$dest"; tail -30 "$tmp/install.log"; exit 1
fi
# libdir and friends as configured (absolute paths under DESTDIR).
pcfile=$(find "$dest" -name libtensr.pc | head -1)
[ -n "$pcfile" ] || { echo "FAIL: libtensr.pc was not installed"; exit 1; }
pcdir=$(dirname "$pcfile")
libdir=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir libtensr)
rc=0
for f in include/libtensr.h; do
    find "$dest" -path "*/$f" | grep -q . || { echo "FAIL: $f not installed"; rc=1; }
done
for f in man3/tsr_mul_mat.3 man3/tsr_backend_new.3 man7/libtensr.7 man1/tensr-run.1; do
    find "$dest" -path "*/$f" | grep -q . || { echo "FAIL: $f not installed"; rc=1; }
done

# pkg-config prefixes -I and -L with the sysroot: the installed tree is used
# exactly as a consumer would use it under its real prefix.
PKG_CONFIG_SYSROOT_DIR=$dest; PKG_CONFIG_PATH=$pcdir; PKG_CONFIG_LIBDIR=$pcdir
export PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH PKG_CONFIG_LIBDIR
cflags=$(pkg-config --cflags libtensr) && libs=$(pkg-config --libs libtensr) &&
    slibs=$(pkg-config --static --libs libtensr) || { echo "FAIL: pkg-config libtensr"; exit 1; }
echo "pkg-config: cflags '$cflags' libs '$libs' static '$slibs'"
CC=${CC:-cc}; CXX=${CXX:-c++}

build_run() { # name compiler source linkmode [program arguments...]
    name=$1; comp=$2; src=$3; mode=$4; shift 4
    if [ "$mode" = static ]; then
        link="-static $slibs"
    else
        link=$libs
    fi
    # shellcheck disable=SC2086
    if ! $comp -o "$tmp/$name" "$srcdir/$src" $cflags $link -lm >"$tmp/$name.log" 2>&1; then
        if [ "$mode" = static ] && grep -q "cannot find -l\(c\|stdc++\|m\|pthread\)" "$tmp/$name.log"; then
            echo "skip: $name: no static system libraries"; return 0
        fi
        echo "FAIL: build $name"; cat "$tmp/$name.log"; rc=1; return 0
    fi
    if [ "$mode" = shared ] && ! LD_LIBRARY_PATH=$dest$libdir ldd "$tmp/$name" | grep -q "$dest$libdir/libtensr"; then
        echo "FAIL: $name does not use the installed libtensr.so"; rc=1
    fi
    if LD_LIBRARY_PATH=$dest$libdir "$tmp/$name" "$@" >"$tmp/$name.out" 2>&1; then
        echo "ok: $name ($mode)"
    else
        echo "FAIL: run $name ($mode)"; cat "$tmp/$name.out"; rc=1
    fi
}
build_run minimal-c-shared "$CC" examples/minimal.c shared
build_run minimal-cpp-shared "$CXX" examples/minimal.cpp shared
model=${TSR_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -f "$model" ]; then
    build_run model-demo-shared "$CC" examples/model-demo.c shared "$model"
else
    echo "skip: model-demo (no $model)"
fi
if [ -n "$(find "$dest" -name libtensr.a)" ]; then
    build_run minimal-c-static "$CC" examples/minimal.c static
    build_run minimal-cpp-static "$CXX" examples/minimal.cpp static
else
    echo "skip: static builds (libtensr.a not installed: --disable-static)"
fi
exit $rc
