#!/bin/sh
# check-abi.sh - `make check-abi`: compares the ABI of the built shared
# library with the committed baseline abi/libtensr.abi (libabigail's abidw
# XML, public header's types only) using abidiff, and says what the change
# means for libtool's -version-info (configure.ac):
#   no ABI change, code changed          -> revision+1
#   interfaces added (compatible)        -> current+1, revision=0, age+1
#   interfaces removed/changed           -> current+1, revision=0, age=0
#                                           (and a new major version + version node)
# Fails on any incompatible change: a removed or changed function, a changed
# struct layout, a changed enum value. `check-abi.sh --update` rewrites the
# baseline (a deliberate act, reviewed in the diff).
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-$srcdir}
ABIDW=${ABIDW:-abidw}; ABIDIFF=${ABIDIFF:-abidiff}
lib=$builddir/.libs/libtensr.so
base=$srcdir/abi/libtensr.abi
command -v "$ABIDW" >/dev/null 2>&1 && command -v "$ABIDIFF" >/dev/null 2>&1 ||
    { echo "SKIP: abidw/abidiff not installed (Debian: apt-get install abigail-tools)"; exit 77; }
[ -f "$lib" ] || { echo "SKIP: $lib not built"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr-abi.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

# Only types declared in libtensr.h are public; the internal structs behind
# the opaque handles stay declaration-only. --headers-dir with a folder that
# holds nothing but the public header matches however the build named it
# (-I. in-tree, an absolute path elsewhere); --header-file does not.
mkdir "$tmp/public" && cp "$srcdir/libtensr.h" "$tmp/public/" || exit 99
if ! "$ABIDW" --headers-dir "$tmp/public" --drop-private-types --no-corpus-path \
        --no-comp-dir-path --out-file "$tmp/current.abi" "$lib" 2>"$tmp/abidw.err"; then
    cat "$tmp/abidw.err"
    echo "SKIP: abidw could not read $lib (built without -g?)"; exit 77
fi
if [ "${1:-}" = --update ]; then
    cp "$tmp/current.abi" "$base"; echo "wrote $base"; exit 0
fi
[ -f "$base" ] || { echo "FAIL: no baseline $base (run tests/check-abi.sh --update)"; exit 1; }

"$ABIDIFF" --suppressions "$srcdir/abi/libtensr.suppr" "$base" "$tmp/current.abi" > "$tmp/report" 2>&1
st=$?
cat "$tmp/report"
lt=$(sed -n 's/^AC_SUBST(\[TSR_LT_VERSION\], \[\(.*\)\])/\1/p' "$srcdir/configure.ac")
if [ $((st & 1)) -ne 0 ] || [ $((st & 2)) -ne 0 ]; then
    echo "ERROR: abidiff failed (status $st)"; exit 99
fi
# abidiff flags only removals as "incompatible" (bit 8); a changed struct
# layout, parameter or enum value is a "Changed" function in the summary
# (harmless changes such as an appended enumerator are filtered by default).
removed_or_changed=$(sed -n -e "s/^\(Functions\|Variables\) changes summary: \([0-9]*\) Removed[^,]*, \([0-9]*\) Changed.*/\2 \3/p" -e "s/^\(Function\|Variable\) symbols changes summary: \([0-9]*\) Removed.*/\2/p" "$tmp/report" |
    awk '{ n += $1 + $2 } END { print n + 0 }')
if [ $((st & 8)) -ne 0 ] || [ "$removed_or_changed" -gt 0 ]; then
    echo "FAIL: incompatible ABI change against abi/libtensr.abi (-version-info now $lt)."
    echo "  Undo it, or make it deliberately: current+1, revision=0, age=0 in configure.ac,"
    echo "  a new TSR_VERSION_MAJOR and version node, then tests/check-abi.sh --update."
    exit 1
elif [ $((st & 4)) -ne 0 ]; then
    echo "NOTE: compatible ABI change (interfaces added; -version-info now $lt)."
    echo "  Bump -version-info: current+1, revision=0, age+1; update abi/libtensr.sym"
    echo "  (tests/check-symbols.sh --update) and the baseline (tests/check-abi.sh --update)."
    exit 0
fi
echo "ok: ABI identical to abi/libtensr.abi (-version-info $lt; if code changed: revision+1)"
