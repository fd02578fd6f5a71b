#!/bin/sh
# test-serve-ray.sh - runs tests/serve-ray-client.py with a python that has
# ray: the tests' python when it has it, else the tests' venv
# (tests/common.sh), into which a missing "ray[serve]" is installed (about
# 40 s from PyPI), so a fresh machine's make check runs this test; it skips
# with a message only when the install fails (no network).
# A sanitizer build (.ci/run sets TSR_SANITIZER) skips: Ray's own processes
# would load the instrumented library without its runtime; the plain build
# runs this test.
. "${top_srcdir:-.}/tests/common.sh"
if [ -n "${TSR_SANITIZER:-}" ]; then
    echo "SKIP: sanitizer build (TSR_SANITIZER=$TSR_SANITIZER): Ray's workers cannot load the ASan library"
    exit 77
fi
# numpy for the binding: ray brings it, and a venv that py-deps.sh made has it
use_python "ray.serve, numpy" "ray[serve]" numpy
exec "$py" "$srcdir/tests/serve-ray-client.py"
