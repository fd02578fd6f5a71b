#!/bin/sh
# header-functions.sh HEADER - prints every public prototype of HEADER, one a
# line, normalized ("type name(args);" with single spaces, no TSR_API), by
# stripping comments with the preprocessor (no macro expansion) and joining
# declarations. Shared by check-symbols.sh and check-man.sh.
# With -n, prints the function names only.
names=0
[ "${1:-}" = -n ] && { names=1; shift; }
hdr=${1:?usage: header-functions.sh [-n] HEADER}
${CPP_FOR_HEADER:-cc} -fpreprocessed -dD -E -P -x c "$hdr" 2>/dev/null |
    awk -v names="$names" -f "$(dirname "$0")/normalize-decls.awk" -v want_api=1
