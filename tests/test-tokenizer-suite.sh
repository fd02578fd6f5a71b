#!/bin/sh
# test-tokenizer-suite.sh - llama.cpp's tokenizer suite: every
# models/ggml-vocab-*.gguf that has .inp/.out cases, fetched by
# tests/get-llama-vocabs.sh, run through tests/test-tokenizer-suite. Skipped
# only when the vocabularies cannot be fetched (no network), except under
# CI=true, where that fails.
#
# UNSUPPORTED lists the vocabularies (file names without ggml-vocab- and
# .gguf) whose tokenizer model is not implemented yet: each must fail to
# load with TSR_E_UNSUPPORTED naming it, and is reported as such.
set -u
srcdir=${top_srcdir:-.}
builddir=${top_builddir:-.}
bin=$builddir/tests/test-tokenizer-suite
UNSUPPORTED=""

vocabs=$(sh "$srcdir/tests/get-llama-vocabs.sh") || vocabs=
if [ -z "$vocabs" ] || [ ! -d "$vocabs" ]; then
    if [ "${CI:-}" = true ]; then
        echo "FAIL: could not fetch llama.cpp's vocabularies (tests/get-llama-vocabs.sh)"
        exit 1
    fi
    echo "SKIP: could not fetch llama.cpp's vocabularies (tests/get-llama-vocabs.sh; no network?)"
    exit 77
fi

set --
skipped=
for out in "$vocabs"/ggml-vocab-*.gguf.out; do
    v=${out%.out}
    name=$(basename "$v" .gguf)
    name=${name#ggml-vocab-}
    case " $UNSUPPORTED " in
    *" $name "*) skipped="$skipped $v" ;;
    *) set -- "$@" "$v" ;;
    esac
done
[ $# -gt 0 ] || { echo "FAIL: no vocabulary with an .out file in $vocabs"; exit 1; }
# shellcheck disable=SC2086
"$bin" "$@" --unsupported $skipped
