#!/bin/sh
# make-llama-refs.sh - regenerates tests/data/refs/ from llama.cpp.
#
# llama.cpp comes from the llama-cpp-python package on PyPI (it vendors
# llama.cpp's source and builds it), installed once into a cached virtual
# environment; on two cores the build takes several minutes. Then
# tests/make_llama_refs.py records token ids, greedy continuations, top-5
# logits, perplexity, the tiny models' logits, and (kl-smollm2.json)
# llama.cpp's distributions teacher-forced along its greedy continuations
# with flash attention off and on, which tests/test-model.py's KL test
# compares libtensr with. Commit the result.
#
# Usage: tests/make-llama-refs.sh [--skip-ppl] [--name=gemma3] [PART...]
#   PART: tokenizer, tiny, arch, deepseek2, greedy, ppl, kl (default: all). Only the parts
#   named are recorded again, e.g. `tests/make-llama-refs.sh kl` rewrites
#   kl-smollm2.json alone (from the committed greedy-smollm2.json).
#   --name=gemma3 records the references of Gemma 3 270M (named ...-gemma3)
#   (examples/get-model.sh gemma3) instead of SmolLM2's.
#
# Environment: LLAMA_CPP_PYTHON_VERSION (default 0.3.36, the version the
# committed refs were made with), LLAMA_VENV (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/llama-venv), TSR_MODEL (default:
# what examples/get-model.sh prints).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
venv=${LLAMA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/llama-venv}

if ! "$venv/bin/python" -c "import llama_cpp, gguf, numpy, jinja2, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
    echo "make-llama-refs.sh: building llama-cpp-python $version in $venv (takes a while)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF}" \
        CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
        "$venv/bin/pip" install "llama-cpp-python==$version" numpy gguf jinja2
fi

which=smollm2
for a in "$@"; do
    case "$a" in --name=*) which=${a#--name=} ;; esac
done
model=${TSR_MODEL:-$(sh "$top/examples/get-model.sh" "$which")}
tiny=$(mktemp -d)
trap 'rm -rf "$tiny"' EXIT INT TERM
"$venv/bin/python" "$here/make_llama_refs.py" "$model" "$tiny" "$here/data/refs" "$@"
