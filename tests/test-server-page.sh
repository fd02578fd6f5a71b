#!/bin/sh
# test-server-page.sh - tensr-server's chat page (GET /) in headless
# Chromium (Debian's chromium package), driven over the DevTools protocol
# by tests/server-page.py (Python's standard library only): send a message,
# see the reply stream, press Stop; the screenshot goes to
# tests/server-page.png under the build tree. Skips (77) without the
# server, the model or chromium; with CI=true each of those fails instead.
. "${top_srcdir:-.}/tests/common.sh"
need_server
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser)}
[ -n "$chromium" ] || skip "chromium is not installed (Debian: apt-get install chromium)"
start_server "$builddir/tests/test-server-page.server-log" -c 1024 -np 2 -t 2
"$py" "$srcdir/tests/server-page.py" "$chromium" "http://127.0.0.1:$port" "$builddir/tests/server-page.png"
rc=$?
kill -TERM $pid
stop_server $rc
