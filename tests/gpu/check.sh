#!/bin/sh
# tests/gpu/check.sh - the CUDA backend on a GPU machine, in one call that
# fits in about nine minutes: run from the top of an unpacked `make dist`
# tarball (no Autotools needed there), e.g. through the device tool:
#   tar xzf libtensr-*.tar.gz && cd libtensr-*/ && tests/gpu/check.sh
# Steps, each with its own timeout, each log under $OUT (default ./gpu-logs;
# the model and the logits go to ./gpu-work, too large to bring back):
#   build    ./configure --enable-cuda=yes --with-cuda-arch=90, make -j16
#   module   tests/test-cuda-module: CUDA0 listed, x + w exact on it, the
#            pinned CUDA0_Host type, more than the card is TSR_E_DEVICE_NOMEM,
#            twenty create/free cycles give the memory back (64 MiB)
#   ops      tests/test-ops with TSR_TEST_DEVICE=CUDA0: every case on the GPU
#            against the reference and the CPU's result; then its op x type
#            table (ops-table in $OUT: what ran on CUDA0, what fell back)
#   large    tests/test-ops -L on CUDA0: mat-vec and GEMM over more than
#            65,535 weight rows, get_rows of more than 65,535 indices, a copy
#            of more than 2^31 bytes (tens of GB of host memory for the
#            double-precision references)
#   sched    tests/test-sched (without the module: it counts the fake
#            devices) and tests/test-attention-devices, whose KV-cache split
#            runs again over CPU, CUDA0 and a fake device (TSR_TEST_DEVICE)
#   kl       a SmolLM2-shaped random-weight F16 model written by
#            tests/gpu/gpu-model.c (the project's GGUF writer): logits of a
#            64-token prompt with -ngl 99 against the CPU, flash attention
#            off and on; mean KL(cpu || gpu) must stay below 0.01
#            (gpu-model kl)
#   bench    tensr-bench pp512/tg128 -ngl 99 on that model and on its Q4_0
#            copy (tensr-quantize), CUDA graphs on and off, the CPU beside
#   llama    tensr-bench beside llama.cpp's CUDA llama-bench (ratios) on
#            the same two files, -ngl 99; llama-bench built on
#            the device from llama-cuda-src.tar.xz (bench/llama-cuda-src.sh:
#            the trimmed llama.cpp of the llama-cpp-python sdist, carried
#            beside the libtensr tarball, found as ../llama-cuda-src.tar.xz
#            or $LLAMA_CUDA_SRC); the build starts first, in the background
#            (nice), and the step waits for it; llama-bench on PATH instead
#            when there is one
# A short table of the results comes last (each row is written as its step
# ends, so a run cut short still leaves the rows it reached). Exit status 0
# when every step passed and CUDA0 was there. GPU_CHECK_DEADLINE (default
# 570 s) bounds the wait for the llama.cpp build.
# GPU_CHECK_STEPS="build module ops" runs some steps only.
set -u
t_start=$(date +%s)
deadline=${GPU_CHECK_DEADLINE:-570} # seconds from the start the whole run must end within
OUT=${OUT:-$PWD/gpu-logs}
WORK=$PWD/gpu-work # the model and the logits (hundreds of MB): not under $OUT
mkdir -p "$OUT" "$WORK"
steps=${GPU_CHECK_STEPS:-"build module ops large sched kl bench llama"}
table=$OUT/table.txt
: > "$table"
rc=0
export TSR_BACKEND_PATH=$PWD/cuda/.libs/libtensr-cuda.so
export top_builddir=$PWD top_srcdir=$PWD

row() { printf '%-8s %-6s %s\n' "$1" "$2" "$3" >> "$table"; }

# step NAME TIMEOUT CMD...: runs CMD with the timeout, log in $OUT/NAME.log.
step() {
    name=$1 limit=$2
    shift 2
    t0=$(date +%s)
    timeout "$limit" sh -c "$*" > "$OUT/$name.log" 2>&1
    r=$?
    t=$(( $(date +%s) - t0 ))
    case $r in
    0) res=PASS ;;
    77) res=SKIP ;;
    124) res=TIMEOUT ;;
    *) res=FAIL ;;
    esac
    [ "$res" = PASS ] || [ "$res" = SKIP ] || rc=1
    echo "== $name: $res ($t s, exit $r)"
    tail -n 15 "$OUT/$name.log"
    last_res=$res last_time=$t
}

want() { case " $steps " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"

# llama.cpp's CUDA build, in the background from the start (about 150 nvcc
# objects: minutes on 16 cores)
llama_src=${LLAMA_CUDA_SRC:-}
for f in ../llama-cuda-src.tar.xz ./llama-cuda-src.tar.xz; do
    [ -z "$llama_src" ] && [ -f "$f" ] && llama_src=$f
done
llama_bin=
llama_pid=
if want llama && ! command -v llama-bench > /dev/null 2>&1 && [ -n "$llama_src" ]; then
    llama_dir=$WORK/llama
    llama_bin=$llama_dir/build/bin/llama-bench
    llama_cmd="rm -rf '$llama_dir' && mkdir -p '$llama_dir' && tar xJf '$llama_src' -C '$llama_dir' && \
        cmake -S '$llama_dir/llama.cpp' -B '$llama_dir/build' -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF && \
        nice -n 10 cmake --build '$llama_dir/build' --target llama-bench -j 16"
    # its own process group (setsid), so that running out of time stops the whole build
    if command -v setsid > /dev/null 2>&1; then
        setsid sh -c "$llama_cmd" > "$OUT/llama-build.log" 2>&1 &
    else
        sh -c "$llama_cmd" > "$OUT/llama-build.log" 2>&1 &
    fi
    llama_pid=$!
elif command -v llama-bench > /dev/null 2>&1; then
    llama_bin=$(command -v llama-bench)
fi

if want build; then
    step configure 180 "./configure --enable-cuda=yes --with-cuda-arch=90"
    row configure "$last_res" "${last_time}s"
    step build 360 "make -j16 && make -j16 tests/test-ops tests/test-sched tests/test-attention-devices \
        tests/test-cuda-module tests/model-eval"
    row build "$last_res" "${last_time}s (nvcc sm_90)"
    cc -std=gnu11 -O2 -I. tests/gpu/gpu-model.c .libs/libtensr.so -lm -Wl,-rpath,$PWD/.libs -o tests/gpu/gpu-model \
        > "$OUT/gpu-model-build.log" 2>&1 || { echo "gpu-model did not build"; rc=1; }
fi

if want module; then
    step module 60 "tests/test-cuda-module"
    row module "$last_res" "$(grep -E '^(CUDA0|out of memory|free memory)|no CUDA device' "$OUT/module.log" | tr '\n' ';' | cut -c1-160)"
fi

if want ops; then
    step ops 240 "TSR_TEST_DEVICE=CUDA0 tests/test-ops -t 16 && TSR_TEST_DEVICE=CUDA0 tests/test-ops list -t 16 \
        > '$OUT/ops-table.md'"
    row ops "$last_res" "$(grep -E 'passed|failed' "$OUT/ops.log" | tail -n 1 | cut -c1-120)"
fi

if want large; then
    step large 200 "TSR_TEST_DEVICE=CUDA0 tests/test-ops -L -t 16"
    row large "$last_res" "$(grep -E 'passed|failed' "$OUT/large.log" | tail -n 1 | cut -c1-120)"
fi

if want sched; then
    step sched 90 "TSR_BACKEND_PATH= tests/test-sched && TSR_TEST_DEVICE=CUDA0 tests/test-attention-devices"
    row sched "$last_res" "test-sched (fake devices only: it counts them); KV cache split CPU/CUDA0/FAKE1: $(grep -c "split again" "$OUT/sched.log") run"
fi

# Without CUDA0 (the module found no GPU) the model steps compare the CPU
# with itself: say so in the table.
# That fails the run: this script is for a GPU machine.
gpu_note=
if want module && ! grep -q '^CUDA0:' "$OUT/module.log" 2>/dev/null; then
    gpu_note=" (NO CUDA0: CPU against CPU)"
    rc=1
    row gpu FAIL "no CUDA0: the module found no GPU (module.log says why)"
fi
model=$WORK/smollm2-shape-random-f16.gguf
if want kl; then
    kl_cmd="tests/gpu/gpu-model '$model' && prompt=\$(awk 'BEGIN{s=\"logits 1\"; x=7; for(i=0;i<63;i++){x=(x*1103515245+12345)%2147483648; s=s\" \"(300+x%40000)}; print s}') && \
      for fa in 0 1; do \
        echo \"\$prompt\" | tests/model-eval -t 16 -c 512 -fa \$fa '$model' > '$WORK/logits-cpu-fa'\$fa.txt && \
        echo \"\$prompt\" | tests/model-eval -t 16 -c 512 -fa \$fa -ngl 99 '$model' > '$WORK/logits-gpu-fa'\$fa.txt && \
        tests/gpu/gpu-model kl '$WORK/logits-cpu-fa'\$fa.txt '$WORK/logits-gpu-fa'\$fa.txt 0.01 || exit 1; \
      done"
    step kl 240 "$kl_cmd"
    row kl "$last_res" "$(grep -E '^KL' "$OUT/kl.log" | tr '\n' ';' | cut -c1-160)$gpu_note"
fi

model_q=$WORK/smollm2-shape-random-q4_0.gguf
if want bench; then
    step bench 240 "{ test -f '$model' || tests/gpu/gpu-model '$model'; } && \
        { test -f '$model_q' || ./examples/tensr-quantize '$model' '$model_q' q4_0 -j 16; } && \
        for m in '$model' '$model_q'; do \
          ./examples/tensr-bench -m \$m -ngl 99 -p 512 -n 128 -r 3 -fa on --no-llama && \
          TSR_CUDA_GRAPHS=0 ./examples/tensr-bench -m \$m -ngl 99 -p 0 -n 128 -r 3 -fa on --no-llama \
            > '$WORK/graphs-off.txt' && sed 's/tg128/tg128 (CUDA graphs off)/' '$WORK/graphs-off.txt' && \
          ./examples/tensr-bench -m \$m -ngl 0 -p 512 -n 128 -r 1 -t 16 -fa on --no-llama || exit 1; \
        done"
    row bench "$last_res" "$(grep -E 'pp512|tg128' "$OUT/bench.log" | tr -s ' ' | tr '\n' ';' | cut -c1-400)$gpu_note"
fi

if want llama; then
    if [ -n "$llama_pid" ]; then # the background build: wait for it while 100 s are left for the benchmark
        while kill -0 "$llama_pid" 2> /dev/null && [ $(($(date +%s) - t_start)) -lt $((deadline - 100)) ]; do
            sleep 5
        done
        if kill -0 "$llama_pid" 2> /dev/null; then
            kill -- "-$llama_pid" 2> /dev/null || kill "$llama_pid"
            echo "llama.cpp build: out of time" >> "$OUT/llama-build.log"
        fi
        wait "$llama_pid" 2> /dev/null
        echo "== llama.cpp build: $(tail -n 3 "$OUT/llama-build.log" | tr '\n' ' ')"
    fi
    if [ -n "$llama_bin" ] && [ -x "$llama_bin" ]; then
        left=$((deadline - ($(date +%s) - t_start)))
        [ "$left" -gt 30 ] || left=30
        step llama "$left" "{ test -f '$model' || tests/gpu/gpu-model '$model'; } && \
            { test -f '$model_q' || ./examples/tensr-quantize '$model' '$model_q' q4_0 -j 16; } && \
            ./examples/tensr-bench -m '$model' -m '$model_q' -ngl 99 -p 512 -n 128 -r 3 -fa on --llama-bench '$llama_bin'"
        row llama "$last_res" "$(grep -E 'pp512|tg128' "$OUT/llama.log" | tr -s ' ' | tr '\n' ';' | cut -c1-400)"
    else
        rc=1
        row llama FAIL "no llama.cpp CUDA llama-bench (llama-cuda-src.tar.xz not carried, or its build failed: llama-build.log)"
    fi
fi

echo
echo "== summary (logs in $OUT)"
cat "$table"
exit $rc
