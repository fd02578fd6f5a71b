#!/bin/sh
# check-symbols.sh - the shared library must export exactly the symbols listed
# in abi/libtensr.sym (name@@VERSION_NODE, sorted), and every function that
# libtensr.h declares with TSR_API must be among them. A difference fails the
# test and prints the diff: adding or removing an export is a deliberate act
# (update abi/libtensr.sym, the version script, and -version-info; see
# abi/README). Run `tests/check-symbols.sh --update` to rewrite the list.
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-$srcdir}
lib=$builddir/.libs/libtensr.so
list=$srcdir/abi/libtensr.sym
[ -f "$lib" ] || { echo "SKIP: $lib not built (--disable-shared?)"; exit 77; }
command -v nm >/dev/null 2>&1 || { echo "SKIP: nm not found"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr-sym.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

# Defined dynamic symbols with their version; the version node's own
# definition (an absolute symbol named like the node) is not an export.
nm -D --defined-only --with-symbol-versions "$lib" |
    awk '$2 != "A" { print $3 }' | LC_ALL=C sort > "$tmp/built"
if [ "${1:-}" = --update ]; then cp "$tmp/built" "$list"; echo "wrote $list"; exit 0; fi

rc=0
if ! diff -u "$list" "$tmp/built" > "$tmp/diff"; then
    echo "FAIL: exported symbols differ from abi/libtensr.sym (- committed, + built):"
    grep '^[-+][^-+]' "$tmp/diff"
    echo "If the change is intended: update abi/libtensr.sym (tests/check-symbols.sh --update),"
    echo "then bump -version-info in configure.ac: a new export -> current+1, revision=0, age+1;"
    echo "a removed or changed export -> current+1, revision=0, age=0 (and a new version node)."
    rc=1
fi
sh "$srcdir/tests/header-functions.sh" -n "$srcdir/libtensr.h" | LC_ALL=C sort -u > "$tmp/header"
sed 's/@.*//' "$tmp/built" | LC_ALL=C sort -u > "$tmp/names"
missing=$(LC_ALL=C comm -23 "$tmp/header" "$tmp/names")
extra=$(LC_ALL=C comm -13 "$tmp/header" "$tmp/names")
if [ -n "$missing" ]; then
    echo "FAIL: declared in libtensr.h but not exported by the library:"; echo "$missing" | sed 's/^/  /'
    rc=1
fi
if [ -n "$extra" ]; then
    echo "FAIL: exported but not declared in libtensr.h:"; echo "$extra" | sed 's/^/  /'
    rc=1
fi
unversioned=$(grep -v '@@LIBTENSR_' "$tmp/built")
if [ -n "$unversioned" ]; then
    echo "FAIL: exports without a LIBTENSR_ version node:"; echo "$unversioned" | sed 's/^/  /'
    rc=1
fi
[ $rc -eq 0 ] && echo "ok: $(wc -l < "$tmp/built") exports match abi/libtensr.sym and libtensr.h"
exit $rc
