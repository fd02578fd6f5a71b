"""server_helpers.py - what the Python clients of the server tests share
(server-client.py, server-raw.py, server-page.py, serve-ray-client.py, each
run by its tests/test-*.sh with this folder first on sys.path): checks that
count failures and the exit that reports them, a skip that CI=true turns
into a failure, a free port, and waiting for a server to answer."""
import os
import socket
import sys
import time
import urllib.error
import urllib.request

failures = 0


def check(cond, what):
    """Counts a failure (and prints what) unless cond holds; returns cond."""
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, flush=True)
    return cond


def done(name):
    """Prints the count of failures and exits 1 when there were any."""
    print(f"{name}: {failures} failed")
    sys.exit(1 if failures else 0)


def skip(why):
    """Exits 77 (skipped), or 1 under CI=true, which requires every test."""
    print("SKIP:", why)
    if os.environ.get("CI") == "true":
        print("FAIL: CI=true requires it")
        sys.exit(1)
    sys.exit(77)


def free_port():
    """A TCP port of 127.0.0.1 free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url, seconds=30):
    """Waits until GET url answers 200 (tensr-server's /health once the
    model is loaded); False when it did not within seconds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    return False
