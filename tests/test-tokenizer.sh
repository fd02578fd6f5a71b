#!/bin/sh
# test-tokenizer.sh - runs tests/test-tokenizer against llama.cpp's recorded
# token ids: on SmolLM2-135M-Instruct (fetched by examples/get-model.sh when
# CI=true, else skipped when absent), on Gemma 3 270M (fetched by
# examples/get-model.sh gemma3) and on the tiny SentencePiece and BPE
# models that tests/make_tiny_models.py regenerates (needs python3 with
# numpy and gguf; skipped without them unless CI=true).
set -u
srcdir=${top_srcdir:-.}
builddir=${top_builddir:-.}
refs=$srcdir/tests/data/refs
bin=$builddir/tests/test-tokenizer
ci=${CI:-}
set --

model=${TSR_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -f "$model" ] && [ "$ci" = true ]; then
    model=$(sh "$srcdir/examples/get-model.sh") || { echo "FAIL: could not fetch the model"; exit 1; }
fi
if [ -f "$model" ]; then
    set -- "$@" "$refs/tokenizer-smollm2.json" "$model"
else
    echo "SKIP part: $model absent (run examples/get-model.sh)"
fi

# Gemma 3 270M (SentencePiece, 262,144 tokens, byte fallback): fetched when
# absent; skipped only when it cannot be fetched (no network), except
# under CI=true
gemma=${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/gemma-3-270m-q4_k_m.gguf
if [ ! -f "$gemma" ]; then
    gemma=$(sh "$srcdir/examples/get-model.sh" gemma3 2>/dev/null) || gemma=
fi
if [ -n "$gemma" ] && [ -f "$gemma" ]; then
    set -- "$@" "$refs/tokenizer-gemma3.json" "$gemma"
elif [ "$ci" = true ]; then
    echo "FAIL: could not fetch Gemma 3 270M (examples/get-model.sh gemma3)"
    exit 1
else
    echo "SKIP part: Gemma 3 270M absent and not fetched (no network?)"
fi

tiny=$(mktemp -d)
trap 'rm -rf "$tiny"' EXIT INT TERM
py=${PYTHON3:-python3}
if "$py" -c 'import numpy, gguf' 2>/dev/null && "$py" "$srcdir/tests/make_tiny_models.py" "$tiny" >/dev/null; then
    for m in tiny-mistral-spm-f32 tiny-mistral-bpe-f16; do
        set -- "$@" "$refs/tokenizer-$m.json" "$tiny/$m.gguf"
    done
elif [ "$ci" = true ]; then
    echo "FAIL: python3 with numpy and gguf is needed to make the tiny models"
    exit 1
else
    echo "SKIP part: python3 with numpy and gguf absent (tiny models)"
fi

if [ $# -eq 0 ]; then
    echo "SKIP: neither the model nor the tiny models are available"
    exit 77
fi
"$bin" "$@"
