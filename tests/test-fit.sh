#!/bin/sh
# test-fit.sh - tsr_fit scenarios on fake devices (tests/test-fit, one
# process per scenario: TSR_FAKE_DEVICES is read once per process), on the
# tiny dense and MoE models of tests/make_tiny_models.py (python3 with numpy
# and gguf; skipped without them unless CI=true) and on SmolLM2-135M when
# it is cached. Each passing scenario prints one row of the table:
# | scenario | devices | model | user flags | placement (tensr-run flags) |
#   planned/measured MiB per device | time of the fit |
# (measured: the fake device's memory in use after tsr_model_load +
# tsr_session_new with the placement; for the CPU the backend's real plan).
set -u
builddir=${top_builddir:-.}
bin=$builddir/tests/test-fit
py=${PYTHON3:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
if ! "$py" -c 'import numpy, gguf' 2>/dev/null || ! "$py" "${top_srcdir:-.}/tests/make_tiny_models.py" "$tmp" >/dev/null; then
    if [ "${CI:-}" = true ]; then
        echo "FAIL: python3 with numpy and gguf is needed to make the tiny models"
        exit 1
    fi
    echo "SKIP: python3 with numpy and gguf absent (tiny models)"
    exit 77
fi
export TSR_LOG_LEVEL=${TSR_LOG_LEVEL:-error}
unset TSR_FIT_SYSMEM TSR_FIT_PROC_ROOT TSR_FAKE_STREAM_BYTES
fail=0
# run DEVICES LABEL MODEL [test-fit args]
run() {
    devs=$1 label=$2 model=$3
    shift 3
    TSR_FAKE_DEVICES=$devs "$bin" "$model" "$label" "$@" || { echo "FAIL: $label"; fail=1; }
}
mix=$tmp/tiny-mixtral-spm-f32.gguf q3moe=$tmp/tiny-qwen3moe-bpe-f32.gguf ds2=$tmp/tiny-ds2lite-bpe-f32.gguf
dense=$tmp/tiny-mistral-spm-f32.gguf

echo "| scenario | devices | model | user flags | placement | planned/measured MiB | fit |"
echo "|---|---|---|---|---|---|---|"
# dense, one device: loose (everything), tight (some layers), too small (CPU only)
run FAKE0:64MiB dense-loose "$dense"
run FAKE0:400KiB dense-tight "$dense"
run FAKE0:150KiB dense-cpu "$dense"
# dense, two devices, a long context that must shrink (context preferred / speed)
run FAKE0:1MiB,FAKE1:3MiB dense-2dev-ctx "$dense" -c 65536 --ctx-min 1024
run FAKE0:1MiB,FAKE1:3MiB dense-2dev-speed "$dense" -c 65536 --ctx-min 1024 --speed 1 --check-ctx 1
run FAKE0:600KiB,FAKE1:600KiB dense-2dev-ts "$dense" -ts 1,3
# the caller's -ngl is kept; the context shrinks around it
run FAKE0:2MiB dense-ngl-kept "$dense" -ngl 1 -c 65536 --ctx-min 512 --check-ctx 1
# -ngl 0 is a choice too (every layer on the CPU), kept though it is the default value
run FAKE0:64MiB dense-ngl0-kept "$dense" -ngl 0
# MoE: experts to system memory from the last layer, then fewer layers
run FAKE0:64MiB mixtral-loose "$mix"
run FAKE0:1100KiB mixtral-tight "$mix"
run FAKE0:500KiB mixtral-tighter "$mix"
run FAKE0:900KiB,FAKE1:300KiB qwen3moe-2dev "$q3moe"
run FAKE0:1100KiB ds2-tight "$ds2"
# what llama.cpp's fit gives up on: the user's exps=CPU, the rest placed around it
run FAKE0:900KiB mixtral-user-exps "$mix" -ot "exps=CPU"
run FAKE0:700KiB,FAKE1:700KiB ds2-user-exps "$ds2" -ot "exps=CPU"
# the device's stream memory (a CUDA stream's cuBLAS workspace and scratch) counted
TSR_FAKE_STREAM_BYTES=256KiB run FAKE0:1100KiB mixtral-stream "$mix"
# system memory: a simulated small machine (TSR_FIT_SYSMEM), a cgroup v2 and
# a cgroup v1 limit (TSR_FIT_PROC_ROOT): the layers stay on the CPU (the
# GPU is too small) and the context shrinks until system memory holds them
TSR_FIT_SYSMEM=3MiB run FAKE0:400KiB dense-sysmem "$dense" -c 16384 --ctx-min 256 --check-ctx 1
root=$tmp/root
mkdir -p "$root/proc/self" "$root/sys/fs/cgroup/job" "$root/sys/fs/cgroup/memory/job1"
printf 'MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n' > "$root/proc/meminfo"
printf '0::/job\n' > "$root/proc/self/cgroup"
printf '4194304\n' > "$root/sys/fs/cgroup/job/memory.max"
printf '1048576\n' > "$root/sys/fs/cgroup/job/memory.current"
TSR_FIT_PROC_ROOT=$root run FAKE0:400KiB dense-cgroup2 "$dense" -c 16384 --ctx-min 256 --check-ctx 1
printf '4:memory:/job1\n1:name=systemd:/job1\n' > "$root/proc/self/cgroup"
printf '2097152\n' > "$root/sys/fs/cgroup/memory/job1/memory.limit_in_bytes"
printf '0\n' > "$root/sys/fs/cgroup/memory/job1/memory.usage_in_bytes"
TSR_FIT_PROC_ROOT=$root run FAKE0:400KiB dense-cgroup1 "$dense" -c 16384 --ctx-min 256 --check-ctx 1
printf 'max\n' > "$root/sys/fs/cgroup/job/memory.max"
printf '0::/job\n' > "$root/proc/self/cgroup"
printf 'MemTotal: 67108864 kB\nMemAvailable: 2048 kB\n' > "$root/proc/meminfo"
TSR_FIT_PROC_ROOT=$root run FAKE0:400KiB dense-memavail "$dense" -c 16384 --ctx-min 256 --check-ctx 1
# SmolLM2-135M (30 layers) when cached: two devices, then the context kept
smol=${TSR_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/libtensr/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -f "$smol" ]; then
    run FAKE0:60MiB,FAKE1:40MiB smollm2-2dev "$smol" -c 8192 --ctx-min 2048
    # the split: the room each GPU has at full offload (where the output
    # layer and its compute buffer sit on the last GPU) is not what it has
    # at partial offload; no GPU may keep room for one more layer
    run FAKE0:30MiB,FAKE1:70MiB smollm2-2dev-uneven "$smol" -c 8192 --ctx-min 2048
    run FAKE0:45MiB,FAKE1:45MiB smollm2-2dev-even "$smol" -c 2048 --ctx-min 2048
    run FAKE0:120MiB smollm2-ctx-kept "$smol" -c 8192 --keep-ctx 1
else
    echo "SKIP part: $smol absent (SmolLM2 scenarios)"
fi
# an older caller's struct sizes
run FAKE0:1MiB old-abi "$mix" --old-abi 1
# tensr-run --fit-print: the flags it prints reproduce the placement (a run
# with them and -fit off loads, generates and prints the same plan)
run_bin=$builddir/examples/tensr-run
flags=$(TSR_FAKE_DEVICES=FAKE0:1200KiB,FAKE1:600KiB "$run_bin" -m "$mix" --fit-print --fit-target 0 -c 256) ||
    { echo "FAIL: tensr-run --fit-print"; fail=1; }
echo "tensr-run --fit-print: $flags"
case $flags in *"-ngl "*"-ot "*"-c "*) ;; *) echo "FAIL: --fit-print printed no placement"; fail=1 ;; esac
eval "set -- $flags"
TSR_FAKE_DEVICES=FAKE0:1200KiB,FAKE1:600KiB "$run_bin" -m "$mix" "$@" -fit off -n 2 -p "a b" > /dev/null 2>&1 ||
    { echo "FAIL: tensr-run with the printed flags does not run"; fail=1; }
# the tools keep a -ngl given, -ngl 0 included: tensr-run's fit keeps it,
# tensr-server does not fit at all (nothing for --fit-print to print)
flags=$(TSR_FAKE_DEVICES=FAKE0:64MiB "$run_bin" -m "$dense" -ngl 0 -fit on --fit-print --fit-target 0 -c 256)
echo "tensr-run -ngl 0 -fit on --fit-print: $flags"
case $flags in "-ngl 0 "*) ;; *) echo "FAIL: tensr-run -ngl 0 -fit on: the fit chose '$flags'"; fail=1 ;; esac
if [ -x "$builddir/examples/server/tensr-server" ]; then
    TSR_FAKE_DEVICES=FAKE0:64MiB "$builddir/examples/server/tensr-server" -m "$dense" -ngl 0 --fit-target 0 --fit-print \
        > /dev/null 2>&1
    [ $? -eq 2 ] || { echo "FAIL: tensr-server -ngl 0 --fit-print: the server fitted a placement the caller set"; fail=1; }
fi
# tensr-server fits before it makes its backend, so each device's stream
# scratch (TSR_FAKE_STREAM_BYTES) is counted once: FAKE0 holds the plan of
# every layer (the scratch included) and half a scratch more, so the whole
# model fits only when the scratch is counted once, and the server's fit
# must still choose it (made first, the backend's streams would hold their
# scratch and the fit's plan count it again: fewer layers)
srv=$builddir/examples/server/tensr-server
if [ -x "$srv" ]; then
    sb=262144
    fit_srv() { TSR_FAKE_STREAM_BYTES=$sb TSR_FAKE_DEVICES=$1 "$srv" -m "$dense" -c 512 -np 2 --fit-target 0 --fit-print 2>/dev/null; }
    loose=$(fit_srv FAKE0:64MiB) || { echo "FAIL: tensr-server --fit-print"; fail=1; }
    want=$(printf '%s\n' "$loose" | head -n 1)
    need=$(printf '%s\n' "$loose" | awk '$1 == "FAKE0" { print $3 }')
    tight=$(fit_srv "FAKE0:$((${need:-0} + sb / 2))") || { echo "FAIL: tensr-server --fit-print (tight)"; fail=1; }
    got=$(printf '%s\n' "$tight" | head -n 1)
    echo "| server-stream | FAKE0:$((${need:-0} + sb / 2)) stream $sb | tiny-mistral-spm-f32.gguf | tensr-server -c 512 -np 2 | $got | FAKE0 $(awk "BEGIN { printf \"%.2f\", ${need:-0} / 1048576 }") planned | - |"
    case $want in "-ngl 2 "*) ;; *) echo "FAIL: server-stream: the loose fit is '$want', not every layer"; fail=1 ;; esac
    [ "$got" = "$want" ] || { echo "FAIL: server-stream: '$got', not '$want': the stream scratch counted twice"; fail=1; }
else
    echo "SKIP part: $srv not built (server-stream)"
fi
# nothing fits: the error names the device and the bytes missing
run FAKE0:64MiB dense-nomem-ngl "$dense" -ngl 2 -c 4096 --margin 67000000 --expect nomem
TSR_FIT_SYSMEM=100KiB run FAKE0:64MiB dense-nomem-sys "$dense" --expect nomem
exit $fail
