#!/bin/sh
# valgrind-wrap.sh - the log compiler of the C test programs (LOG_COMPILER
# in Makefile.am):
#   valgrind-wrap.sh VALGRIND LIBTOOL VALGRIND_FLAGS PROGRAM [ARGS...]
# With VALGRIND empty (a plain make check) it runs PROGRAM as it is. With
# make check VALGRIND=valgrind it runs PROGRAM under $VALGRIND $VALGRIND_FLAGS
# through `libtool --mode=execute`: a test linked to the uninstalled shared
# library is a libtool wrapper script in the build tree, and libtool puts the
# real binary (tests/.libs/...) and its library path in its place. Exit
# statuses pass through (77 still skips); with the default flags a memory
# error or a definite leak makes the test fail (1).
valgrind=$1 libtool=$2 flags=$3
shift 3
if [ -z "$valgrind" ]; then
    exec "$@"
fi
# LIBTOOL and the flags are word lists ("/bin/bash ./libtool"): unquoted.
exec $libtool --mode=execute $valgrind $flags "$@"
