#!/bin/sh
# tests/py-deps.sh PYTHON VENV - prints the python3 the tests run with: PYTHON
# itself when it imports numpy and gguf (the tiny models' writer and the
# binding's tests need them), else the tests' virtual environment VENV
# (tests/pyvenv under the build tree; made here, or added to, with pip
# install numpy gguf), so that `make check` on a fresh machine runs those
# tests instead of skipping them. The server tests install what else they
# need into the same venv (tests/common.sh). Without network or venv it
# prints PYTHON, and the tests say what is missing (and fail under CI=true).
. "$(dirname "$0")/common.sh"
py=${1:-python3}
venv=$2
need="import numpy, gguf"
if "$py" -c "$need" > /dev/null 2>&1; then
    echo "$py"
    exit 0
fi
if [ -x "$venv/bin/python3" ] && "$venv/bin/python3" -c "$need" > /dev/null 2>&1; then
    echo "$venv/bin/python3"
    exit 0
fi
echo "py-deps: $py lacks numpy or gguf: installing them into $venv" >&2
if venv_install "$venv" "$py" numpy gguf >&2 && "$venv/bin/python3" -c "$need" > /dev/null 2>&1; then
    echo "$venv/bin/python3"
else
    echo "py-deps: could not install them into $venv (no venv module or no network): tests needing numpy and gguf will say so" >&2
    echo "$py"
fi
