#!/bin/sh
# test-server-page.sh - tensr-server's chat page (GET /) in headless
# Chromium (Debian's chromium package), driven over the DevTools protocol
# by tests/server-page.py (Python's standard library only): send a message,
# see the reply stream, press Stop; the screenshot goes to
# tests/server-page.png under the build tree. Skips (77) without the
# server, the model or chromium; with CI=true each of those fails instead.
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
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser)}
[ -n "$chromium" ] || skip "chromium is not installed (Debian: apt-get install chromium)"
py=${PYTHON3:-python3}
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$builddir/tests/test-server-page.server-log
"$server" -m "$model" --port "$port" -c 1024 -np 2 -t 2 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
for i in $(seq 100); do
    "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health')" 2>/dev/null && break
    sleep 0.1
done
"$py" "$srcdir/tests/server-page.py" "$chromium" "http://127.0.0.1:$port" "$builddir/tests/server-page.png"
rc=$?
kill -TERM $pid
wait $pid || { echo "FAIL: tensr-server exited $? after SIGTERM"; rc=1; }
trap - EXIT
exit $rc
