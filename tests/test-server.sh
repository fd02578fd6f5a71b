#!/bin/sh
# test-server.sh - tensr-server against the real `openai` Python client on
# 127.0.0.1 with SmolLM2 (tests/server-client.py does the talking). openai and
# httpx come from the system's Python or, when missing, from a venv under the
# build tree (tests/.venv-server), so a fresh machine runs this test too.
# Skips (77) without the server (./configure found no libmicrohttpd/jansson),
# without the model or without the packages and no network to fetch them;
# with CI=true each of those fails instead. The server runs the machine's
# best CPU kernels with its default --batch-invariant on: equality at
# temperature 0 (concurrent against sequential, a prompt again from its
# cached prefix) is the test's point; TSR_TEST_SERVER_ARGS="--batch-invariant
# off" shows it failing on an AVX2/AVX-512 machine.
builddir=${top_builddir:-.}
srcdir=${top_srcdir:-.}
server=$builddir/examples/server/tensr-server
model=${TSR_TEST_MODEL:-$HOME/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf}
skip() {
    echo "SKIP: $*"
    if [ "$CI" = true ]; then echo "FAIL: CI=true requires it"; exit 1; fi
    exit 77
}
[ -x "$server" ] || skip "tensr-server is not built (./configure found no libmicrohttpd or jansson)"
[ -f "$model" ] || skip "model $model is absent (make run fetches it)"
py=${PYTHON3:-python3}
if ! "$py" -c 'import openai, httpx' >/dev/null 2>&1; then
    venv=$builddir/tests/.venv-server
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai, httpx' >/dev/null 2>&1; then
        echo "installing openai and httpx into $venv"
        { "$py" -m venv "$venv" && "$venv/bin/python" -m pip install -q openai httpx; } ||
            skip "openai and httpx are not installed and could not be installed into $venv (no network?)"
    fi
    py=$venv/bin/python
fi
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$builddir/tests/test-server.server-log
# shellcheck disable=SC2086
"$server" -m "$model" --port "$port" -c 1024 -np 4 -t 2 -b 64 -ub 32 --api-key test-key --max-queued 8 \
    ${TSR_TEST_SERVER_ARGS:-} >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
"$py" "$srcdir/tests/server-client.py" "http://127.0.0.1:$port" test-key
rc=$?
kill -TERM $pid
wait $pid
src=$?
trap - EXIT
if [ $src -ne 0 ]; then
    echo "FAIL: tensr-server exited $src after SIGTERM; its log:"
    cat "$log"
    rc=1
fi
exit $rc
