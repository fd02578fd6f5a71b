#!/bin/sh
# test-server-raw.sh - tensr-server over raw sockets (tests/server-raw.py,
# Python's standard library only): exact SSE bytes, UTF-8 across chunks,
# keep-alive comments, CORS, garbage/truncated/oversized/deep requests, slow
# clients, and SIGTERM (streams finish, exit 0). With TSR_VALGRIND set (make
# check VALGRIND=valgrind) the server runs under valgrind, and an error or a
# definite leak fails the test. Skips (77) without the server or the model;
# with CI=true those fail instead. Scalar CPU kernels, as test-server.sh.
. "${top_srcdir:-.}/tests/common.sh"
need_server
limit=120
if [ -n "${TSR_VALGRIND:-}" ]; then
    server_run="$builddir/libtool --mode=execute $TSR_VALGRIND -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite"
    limit=1200
fi
TSR_CPU_KERNELS=scalar
export TSR_CPU_KERNELS
start_server "$builddir/tests/test-server-raw.server-log" -c 1024 -np 2 -t 2 -b 64 -ub 32 --max-queued 2 \
    --cors-origin http://ok.example --sse-keepalive 1
# the server's own pid (libtool --mode=execute execs, so $! is it)
"$py" "$srcdir/tests/server-raw.py" 127.0.0.1 "$port" "$pid"
rc=$?
# the script sent SIGTERM at its end; when it stopped before (a failure),
# stop the server here rather than wait for ever
[ $rc -ne 0 ] && kill -TERM $pid 2> /dev/null
stop_server $rc $limit
