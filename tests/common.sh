# tests/common.sh - sourced (". tests/common.sh") by the tests of
# tensr-server and serve_ray.py (test-server.sh, test-server-raw.sh,
# test-server-page.sh, test-serve-ray.sh) and by tests/py-deps.sh: where
# the server, the model and the tests' venv are, skipping, the python that
# has the packages a test needs, and starting and stopping the server.
#
# The tests have one venv, tests/pyvenv under the build tree: py-deps.sh
# makes it (before the tests run) when $PYTHON3 lacks numpy or gguf, and a
# test that needs more (openai and httpx, ray[serve]) installs them into
# it, so a fresh machine's `make check` runs every test; a test skips only
# when the install fails (no network), and fails then under CI=true.
builddir=${top_builddir:-.}
srcdir=${top_srcdir:-.}
server=$builddir/examples/server/tensr-server
model=${TSR_TEST_MODEL:-$HOME/.cache/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf}
venv=$builddir/tests/pyvenv
py=${PYTHON3:-python3}

# skip WHY: exit 77, or 1 under CI=true (which requires every test to run)
skip() {
    echo "SKIP: $*"
    if [ "${CI:-}" = true ]; then
        echo "FAIL: CI=true requires it"
        exit 1
    fi
    exit 77
}

# need_server: the server built and the model there, else skip
need_server() {
    [ -x "$server" ] || skip "tensr-server is not built (./configure found no libmicrohttpd or jansson)"
    [ -f "$model" ] || skip "model $model is absent (make run fetches it)"
}

# venv_install VENV PYTHON PACKAGE...: pip installs the packages into VENV,
# made with PYTHON when absent (seeing PYTHON's own packages); one install
# at a time (flock, when there: make -j runs tests side by side)
venv_install() {
    _venv=$1 _py=$2
    shift 2
    mkdir -p "$(dirname "$_venv")" || return 1
    (
        command -v flock > /dev/null 2>&1 && flock 9
        { [ -x "$_venv/bin/python3" ] || "$_py" -m venv --system-site-packages "$_venv"; } &&
            "$_venv/bin/python3" -m pip install -q "$@"
    ) 9> "$_venv.lock"
}

# use_python MODULES PACKAGE...: py = $PYTHON3 when it imports MODULES
# (as an import statement lists them), else the tests' venv, into which
# the packages are installed when it lacks them; 1 when neither has them
use_python() {
    _mods=$1
    shift
    py=${PYTHON3:-python3}
    "$py" -c "import $_mods" > /dev/null 2>&1 && return 0
    if ! "$venv/bin/python3" -c "import $_mods" > /dev/null 2>&1; then
        echo "installing $* into $venv"
        venv_install "$venv" "$py" "$@"
    fi
    "$venv/bin/python3" -c "import $_mods" > /dev/null 2>&1 || return 1
    py=$venv/bin/python3
}

# start_server LOG ARG...: tensr-server on the model and a free port ($port)
# in the background ($pid, killed if the test exits early), with its
# output in LOG; $server_run (valgrind) goes before it
start_server() {
    log=$1
    shift
    port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # shellcheck disable=SC2086
    ${server_run:-} "$server" -m "$model" --port "$port" "$@" > "$log" 2>&1 &
    pid=$!
    trap 'kill $pid 2>/dev/null' EXIT
}

# stop_server RC [LIMIT]: waits up to LIMIT seconds (default 120) for the
# server to exit after the SIGTERM the test sent, kills it past that, and
# returns RC, or 1 when the server did not exit 0 by itself (with its log)
stop_server() {
    _rc=$1 _i=0 _limit=$((${2:-120} * 10))
    while kill -0 "$pid" 2> /dev/null && [ $_i -lt $_limit ]; do
        sleep 0.1
        _i=$((_i + 1))
    done
    if kill -0 "$pid" 2> /dev/null; then
        echo "FAIL: tensr-server still runs $((_limit / 10)) s after SIGTERM"
        kill -KILL "$pid"
        _rc=1
    fi
    wait "$pid"
    _st=$?
    trap - EXIT
    if [ $_st -ne 0 ]; then
        echo "FAIL: tensr-server exited $_st after SIGTERM; its log:"
        tail -n 60 "$log"
        _rc=1
    fi
    return $_rc
}
