#!/bin/sh
# man-version.sh [--update] - the version in every man page's .TH line
# ("libtensr X.Y.Z", the fourth field) is the one libtensr.h defines
# (TSR_VERSION_MAJOR/MINOR/PATCH, which configure.ac reads too). Without
# arguments, prints the pages that differ and exits 1 if any does (run by
# check-man.sh); with --update, rewrites those .TH lines (make
# update-man-version, after a version bump).
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
v() { sed -n "s/^#define TSR_VERSION_$1 \([0-9][0-9]*\).*/\1/p" "$srcdir/libtensr.h"; }
version=$(v MAJOR).$(v MINOR).$(v PATCH)
case $version in
*[!0-9.]* | .* | *..* | *.) echo "ERROR: no TSR_VERSION_MAJOR/MINOR/PATCH in $srcdir/libtensr.h"; exit 99 ;;
esac
rc=0
for f in "$srcdir"/man/*.[137]; do
    [ -f "$f" ] || continue
    grep -q '^\.TH' "$f" || continue # a .so link
    got=$(sed -n 's/^\.TH.*"libtensr \([0-9][^"]*\)".*/\1/p' "$f" | head -n 1)
    [ "$got" = "$version" ] && continue
    if [ "${1:-}" = --update ]; then
        sed 's/^\(\.TH.*"libtensr \)[0-9][^"]*\(".*\)/\1'"$version"'\2/' "$f" > "$f.tmp" && mv "$f.tmp" "$f" || exit 99
        echo "updated $(basename "$f"): ${got:-(none)} -> $version"
    else
        echo "FAIL: man/$(basename "$f"): .TH says libtensr ${got:-(no version)}, libtensr.h $version (make update-man-version)"
        rc=1
    fi
done
exit $rc
