#!/bin/sh
# check-man.sh - every function libtensr.h exports has a section-3 man page
# that resolves (man/NAME.3 is a page, or a `.so man3/PAGE.3` link to an
# existing page), the page's SYNOPSIS declares the function, and every
# prototype in any page's SYNOPSIS is exactly the header's (whitespace and
# roff font escapes aside). Also: every page is distributed (man/man.am) and,
# when groff is installed, renders without warnings.
#
# Every page (each man/*.1 and man/*.7, each man/*.3 that is not a .so link)
# has exactly one .TH, whose section is the file's, and NAME as its first
# section. Then, each exactly once:
#   section 3  NAME, SYNOPSIS, DESCRIPTION, RETURN VALUE (for a void
#              function the page says it returns no value and what matters
#              instead, e.g. that NULL is a no-op)
#   section 1  NAME, SYNOPSIS, DESCRIPTION, EXIT STATUS (a command's return
#              value, as man-pages(7) names it)
#   section 7  NAME, DESCRIPTION (an overview has no call to return from;
#              SYNOPSIS and the rest are optional)
# A page pasted twice into one file fails here (two .TH, two NAME).
# Every .TH names the version libtensr.h defines (tests/man-version.sh;
# after a version bump, make update-man-version rewrites them).
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

# page structure: one .TH, the sections its man section requires (above)
structure() { # FILE SECTION REQUIRED ("A|B|...")
    awk -v sec="$2" -v req="$3" '
        /^\.TH([ \t]|$)/ { n_th++; if (n_th == 1) { split($0, a, /[ \t]+/); th_sec = a[3] } }
        /^\.SH([ \t]|$)/ {
            h = $0; sub(/^\.SH[ \t]*/, "", h); gsub(/"/, "", h); sub(/[ \t]+$/, "", h)
            if (++n_sh == 1) first = h
            seen[h]++
        }
        END {
            if (n_th != 1) printf "%d .TH lines (want exactly one)\n", n_th
            else if (th_sec != sec) printf ".TH says section %s, the file name says %s\n", th_sec, sec
            if (first != "NAME") printf "first section is \"%s\", not NAME\n", first
            n = split(req, r, "|")
            for (i = 1; i <= n; i++)
                if (!seen[r[i]]) printf "no %s section\n", r[i]
                else if (seen[r[i]] > 1) printf "%d %s sections (want exactly one)\n", seen[r[i]], r[i]
        }' "$1"
}
for f in "$man"/*.[137]; do
    [ -f "$f" ] || continue
    [ -n "$(link_of "$f")" ] && continue
    case $f in
    *.3) req="NAME|SYNOPSIS|DESCRIPTION|RETURN VALUE" ;;
    *.1) req="NAME|SYNOPSIS|DESCRIPTION|EXIT STATUS" ;;
    *.7) req="NAME|DESCRIPTION" ;;
    esac
    structure "$f" "${f##*.}" "$req" > "$tmp/struct"
    while IFS= read -r why; do err "$(basename "$f"): $why"; done < "$tmp/struct"
done

# every page's .TH version is libtensr.h's
top_srcdir=$srcdir sh "$srcdir/tests/man-version.sh" > "$tmp/version" || rc=1
cat "$tmp/version"

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
[ $rc -eq 0 ] && echo "ok: every exported function has a page whose synopsis matches libtensr.h; every page has one .TH (with libtensr.h's version) and its sections"
exit $rc
