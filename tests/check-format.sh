#!/bin/sh
# check-format.sh - libtensr.h, libtensr/ and cpu/ (cuda/ once it has code)
# are formatted as .clang-format says: `clang-format --dry-run -Werror` on
# each file. Skips (77) without clang-format; .ci/run installs it, so CI
# fails on a formatting diff. Fix with: clang-format -i FILE.
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
command -v "$CLANG_FORMAT" >/dev/null 2>&1 || { echo "SKIP: $CLANG_FORMAT not installed"; exit 77; }
[ -f "$srcdir/.clang-format" ] || { echo "ERROR: $srcdir/.clang-format is missing"; exit 99; }
cd "$srcdir" || exit 99
files=$(find libtensr.h libtensr cpu cuda -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
        2>/dev/null | sort)
[ -n "$files" ] || { echo "ERROR: no sources found under $srcdir"; exit 99; }
rc=0 n=0
for f in $files; do
    n=$((n + 1))
    if ! "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
        echo "FAIL: $f is not formatted (clang-format -i $f); first differences:"
        "$CLANG_FORMAT" --style=file "$f" | diff "$f" - | head -n 10
        rc=1
    fi
done
echo "$n files checked with $("$CLANG_FORMAT" --version)"
exit $rc
