#!/bin/sh
# check-header.sh - the public header must compile warning-free, alone, as
# C99, C11, C17 and C++11, C++17, C++20 with -Wall -Wextra -Wpedantic -Werror
# (gcc/g++ and, when installed, clang/clang++). Standards a compiler does not
# know are skipped with a note; a missing C++ compiler skips the C++ part.
set -u
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tsr-header.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
flags="-Wall -Wextra -Wpedantic -Werror -fsyntax-only -I$srcdir"

# A translation unit that includes the header and touches a few declarations,
# so that unused-function/-parameter style warnings would show.
cat > "$tmp/t.c" <<'SRC'
#include <libtensr.h>
int main(void)
{
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    return (int)tsr_version() == TSR_VERSION_NUMBER ? TSR_OK : TSR_E_INVALID;
}
SRC
cp "$tmp/t.c" "$tmp/t.cpp"

fails=0; runs=0
try() { # compiler std file
    if ! printf 'int x;\n' | "$1" -std="$2" -x "$4" -fsyntax-only - 2>/dev/null; then
        echo "skip: $1 does not know -std=$2"; return 0
    fi
    runs=$((runs + 1))
    if "$1" -std="$2" $flags "$3" 2>"$tmp/err"; then
        echo "ok: $1 -std=$2"
    else
        echo "FAIL: $1 -std=$2"; cat "$tmp/err"; fails=$((fails + 1))
    fi
}
for cc in ${CC:-cc} clang; do
    command -v "$cc" >/dev/null 2>&1 || continue
    for std in c99 c11 c17; do try "$cc" "$std" "$tmp/t.c" c; done
done
for cxx in ${CXX:-c++} clang++; do
    command -v "$cxx" >/dev/null 2>&1 || continue
    for std in c++11 c++17 c++20; do try "$cxx" "$std" "$tmp/t.cpp" c++; done
done
[ "$runs" -gt 0 ] || { echo "SKIP: no C compiler found"; exit 77; }
echo "$runs compilations, $fails failed"
[ "$fails" -eq 0 ]
