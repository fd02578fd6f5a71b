#!/bin/sh
# test-server-raw.sh - tensr-server over raw sockets (tests/server-raw.py,
# Python's standard library only): exact SSE bytes, UTF-8 across chunks,
# keep-alive comments, CORS, garbage/truncated/oversized/deep requests, slow
# clients, and SIGTERM (streams finish, exit 0). With TSR_VALGRIND set (make
# check VALGRIND=valgrind) the server runs under valgrind, and an error or a
# definite leak fails the test. Skips (77) without the server or the model;
# with CI=true those fail instead. Scalar CPU kernels, as test-server.sh.
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
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$builddir/tests/test-server-raw.server-log
run=
if [ -n "$TSR_VALGRIND" ]; then
    run="$builddir/libtool --mode=execute $TSR_VALGRIND -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite"
fi
TSR_CPU_KERNELS=scalar $run "$server" -m "$model" --port "$port" -c 1024 -np 2 -t 2 -b 64 -ub 32 --max-queued 2 \
    --cors-origin http://ok.example --sse-keepalive 1 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
# the server's own pid (libtool --mode=execute execs, so $! is it)
"$py" "$srcdir/tests/server-raw.py" 127.0.0.1 "$port" "$pid"
rc=$?
# the script sent SIGTERM at its end; when it stopped before (a failure), or
# the server ignores it, stop the server here rather than wait for ever
limit=120
[ -n "$TSR_VALGRIND" ] && limit=1200
i=0
while kill -0 $pid 2>/dev/null && [ $i -lt $limit ]; do
    [ $rc -ne 0 ] && [ $i -eq 0 ] && kill -TERM $pid 2>/dev/null
    sleep 1
    i=$((i + 1))
done
if kill -0 $pid 2>/dev/null; then
    echo "FAIL: tensr-server still runs $limit s after SIGTERM"
    kill -KILL $pid
    rc=1
fi
wait $pid
src=$?
trap - EXIT
if [ $src -ne 0 ]; then
    echo "FAIL: tensr-server exited $src after SIGTERM; its log:"
    tail -n 60 "$log"
    rc=1
fi
exit $rc
