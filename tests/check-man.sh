#!/bin/sh
# check-man.sh - every function libtensr.h exports has a section-3 man page
# that resolves (man/NAME.3 is a page, or a `.so man3/PAGE.3` link to an
# existing page), the page's SYNOPSIS declares the function, and every
# prototype in any page's SYNOPSIS is exactly the header's (whitespace and
# roff font escapes aside). Also: every page is distributed (man/man.am) and,
# when groff or mandoc is installed, renders without warnings.
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
man=$srcdir/man
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr-man.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
rc=0
err() { echo "FAIL: $*"; rc=1; }

sh "$srcdir/tests/header-functions.sh" "$srcdir/libtensr.h" > "$tmp/header"
[ -s "$tmp/header" ] || { echo "ERROR: no prototypes read from libtensr.h"; exit 99; }

# link target of a man file, or "" when it is a page
link_of() { sed -n '1{s/^\.so[ \t]*man3\/\([^ \t]*\)$/\1/p;}' "$1"; }

# SYNOPSIS prototypes of a page, normalized like the header's
synopsis() {
    awk '/^\.SH/ { on = ($0 ~ /SYNOPSIS/); next } on' "$1" |
        grep -v -e '^\.' -e '^#include' |
        sed -e 's/\\f[BIRP]//g' -e 's/\\-/-/g' -e 's/\\e/\\/g' -e 's/\\&//g' |
        awk -v want_api=0 -v names=0 -f "$srcdir/tests/normalize-decls.awk"
}

n_pages=0; n_links=0
for f in "$man"/*.3; do
    [ -f "$f" ] || continue
    base=$(basename "$f")
    target=$(link_of "$f")
    if [ -n "$target" ]; then
        n_links=$((n_links + 1))
        if [ ! -f "$man/$target" ] || [ -n "$(link_of "$man/$target")" ]; then
            err "$base: .so link to man3/$target, which is not a page in man/"
        fi
        continue
    fi
    n_pages=$((n_pages + 1))
    synopsis "$f" > "$tmp/syn"
    [ -s "$tmp/syn" ] || err "$base: no prototypes in SYNOPSIS"
    while IFS= read -r proto; do
        if ! grep -qxF "$proto" "$tmp/header"; then
            name=$(printf '%s\n' "$proto" | sed 's/(.*//; s/.*[ *]//')
            want=$(grep -F "$name(" "$tmp/header" | grep -F " $name(" ; grep -F "*$name(" "$tmp/header")
            err "$base: SYNOPSIS prototype differs from libtensr.h:"
            echo "    page:   $proto"; echo "    header: ${want:-(not declared)}"
        fi
    done < "$tmp/syn"
    sed "s|^|$base |" "$tmp/syn" >> "$tmp/documented"
done

while IFS= read -r proto; do
    name=$(printf '%s\n' "$proto" | sed 's/(.*//; s/.*[ *]//')
    f=$man/$name.3
    if [ ! -f "$f" ]; then err "$name: no man page man/$name.3 (page or .so link)"; continue; fi
    page=$(link_of "$f"); page=${page:-$name.3}
    grep -qF "$page $proto" "$tmp/documented" 2>/dev/null ||
        err "$name: man/$name.3 resolves to $page, whose SYNOPSIS does not declare it"
done < "$tmp/header"

# every file under man/ is distributed and installed
if [ -f "$man/man.am" ]; then
    for f in "$man"/*.[137]; do
        grep -q "man/$(basename "$f")\( \|$\)" "$man/man.am" || err "man/$(basename "$f") is not listed in man/man.am"
    done
fi

# pages render cleanly
if command -v groff >/dev/null 2>&1; then
    for f in "$man"/*.[137]; do
        [ -n "$(link_of "$f")" ] && continue
        out=$(groff -man -Tutf8 -ww -z "$f" 2>&1)
        [ -z "$out" ] || err "$(basename "$f"): groff warnings:
$out"
    done
fi

echo "$(wc -l < "$tmp/header") functions, $n_pages section-3 pages, $n_links .so links"
[ $rc -eq 0 ] && echo "ok: every exported function has a page whose synopsis matches libtensr.h"
exit $rc
