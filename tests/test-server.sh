#!/bin/sh
# test-server.sh - tensr-server against the real `openai` Python client on
# 127.0.0.1 with SmolLM2 (tests/server-client.py does the talking). openai and
# httpx come from the tests' python or, when missing, are installed into the
# tests' venv (tests/common.sh), so a fresh machine runs this test too.
# Skips (77) without the server (./configure found no libmicrohttpd/jansson),
# without the model or without the packages and no network to fetch them;
# with CI=true each of those fails instead. The server runs the machine's
# best CPU kernels with its default --batch-invariant on: equality at
# temperature 0 (concurrent against sequential, a prompt again from its
# cached prefix) is the test's point; TSR_TEST_SERVER_ARGS="--batch-invariant
# off" shows it failing on an AVX2/AVX-512 machine.
. "${top_srcdir:-.}/tests/common.sh"
need_server
use_python "openai, httpx" openai httpx ||
    skip "openai and httpx are not installed and could not be installed into $venv (no network?)"
# shellcheck disable=SC2086
start_server "$builddir/tests/test-server.server-log" -c 1024 -np 4 -t 2 -b 64 -ub 32 --api-key test-key \
    --max-queued 8 ${TSR_TEST_SERVER_ARGS:-}
"$py" "$srcdir/tests/server-client.py" "http://127.0.0.1:$port" test-key
rc=$?
kill -TERM $pid
stop_server $rc
