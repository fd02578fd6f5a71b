#!/bin/sh
# test-serve-ray.sh - runs tests/serve-ray-client.py with a python that has
# ray: $PYTHON3 when it has it, else the venv of tests/test-server.sh
# (tests/.venv-server), into which a missing "ray[serve]" is installed
# (about 40 s from PyPI), so a fresh machine's make check runs this test;
# it skips with a message only when the install fails (no network).
# A sanitizer build (.ci/run sets TSR_SANITIZER) skips: Ray's own processes
# would load the instrumented library without its runtime; the plain build
# runs this test.
if [ -n "${TSR_SANITIZER:-}" ]; then
    echo "SKIP: sanitizer build (TSR_SANITIZER=$TSR_SANITIZER): Ray's workers cannot load the ASan library"
    exit 77
fi
builddir=${top_builddir:-.}
srcdir=${top_srcdir:-.}
py=${PYTHON3:-python3}
if ! "$py" -c 'import ray.serve' >/dev/null 2>&1; then
    venv=$builddir/tests/.venv-server
    if ! "$venv/bin/python" -c 'import ray.serve' >/dev/null 2>&1; then
        echo "installing ray[serve] into $venv"
        { [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"; } && "$venv/bin/python" -m pip install -q "ray[serve]"
    fi
    [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import ray.serve' >/dev/null 2>&1 && py=$venv/bin/python
fi
exec "$py" "$srcdir/tests/serve-ray-client.py"
