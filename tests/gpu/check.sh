#!/bin/sh
# tests/gpu/check.sh - the CUDA backend on a GPU machine, in one call of at
# most GPU_CHECK_DEADLINE seconds (default 330: a lent machine gives 15
# minutes in all, its start included, so a first call must leave time for a
# second). Run from the top of an unpacked `make dist` tarball (no Autotools
# needed there), e.g. through the device tool:
#   tar xzf libtensr-*.tar.gz && cd libtensr-*/ && tests/gpu/check.sh
# A second call on the same (warm) machine reuses the build (make is
# incremental) and the models; GPU_CHECK_STEPS="kl ops" runs some steps only.
# Steps, in order of what they tell, each with its own time limit cut to
# what is left, each log under $OUT (default ./gpu-logs; the models and the
# logits go to ./gpu-work, too large to bring back):
#   build    ./configure --enable-cuda=yes --with-cuda-arch=90 (once), make -j16
#   module   tests/test-cuda-module: CUDA0 listed, an exact add, the pinned
#            CUDA0_Host type, TSR_E_DEVICE_NOMEM past the card, memory given
#            back; tests/test-cuda-emu on the real CUDA0: placement, unaligned
#            views refused, the decode layer's fused pairs (norm x weight with
#            its Q8_1, product + residual, swiglu) against a double reference
#   kl       a SmolLM2-shaped random-weight F16 model (tests/gpu/gpu-model.c)
#            and its Q4_0 copy (tensr-quantize): logits of a 64-token prompt
#            with -ngl 99 against the CPU's, at -ub 64 (cuBLAS, the prompt
#            paths) and -ub 1 (token by token: the mat-vecs, Q8_1/dp4a,
#            split-K decode attention, get_rows), flash attention off and on;
#            mean KL(cpu || gpu) below 0.01 (gpu-model kl)
#   ops      the op harness on CUDA0 (tests/test-ops -d CUDA0 -o OP), one
#            process per op a model uses, so that a faulting kernel fails its
#            op alone; every source lives on the device and every node CUDA0
#            claims must run there
#   memcheck compute-sanitizer --tool memcheck on the small model, a 4-token
#            prompt and 2 decoded tokens with -ngl 99
#   bench    tensr-bench pp512/tg128 -ngl 99 on both models, CUDA graphs on
#            and off (TSR_CUDA_GRAPHS=0); then tg16 --profile on the Q4_0
#            model: the module's kernel launches of a decode token (row
#            launches)
#   llama    llama.cpp's CUDA llama-bench beside (ratios), when its build
#            (started first, in the background, from ../llama-cuda-src.tar.xz
#            or $LLAMA_CUDA_SRC: bench/llama-cuda-src.sh) finished in time
# nvcc --version and the driver come first; a table of the results comes
# last (each row written as its step ends, so a run cut short still leaves
# the rows it reached). Exit status 0 when every step passed and CUDA0 was there.
# Not in the default list: large (test-ops -L: grid limits, offsets past
# 2^31 bytes) and sched (test-attention-devices over CPU, CUDA0 and FAKE1).
set -u
t_start=$(date +%s)
deadline=${GPU_CHECK_DEADLINE:-330}
OUT=${OUT:-$PWD/gpu-logs}
WORK=$PWD/gpu-work
mkdir -p "$OUT" "$WORK"
steps=${GPU_CHECK_STEPS:-"build module kl ops memcheck bench llama"}
table=$OUT/table.txt
: > "$table"
rc=0
export TSR_BACKEND_PATH=$PWD/cuda/.libs/libtensr-cuda.so
export top_builddir=$PWD top_srcdir=$PWD

row() { printf '%-9s %-7s %s\n' "$1" "$2" "$3" >> "$table"; }
left() { echo $((deadline - ($(date +%s) - t_start))); }
want() { case " $steps " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# step NAME LIMIT CMD...: runs CMD with LIMIT seconds (or what is left of
# the deadline, less a reserve for the table), log in $OUT/NAME.log.
step() {
    name=$1 limit=$2
    shift 2
    l=$(($(left) - 10))
    [ "$l" -lt "$limit" ] && limit=$l
    if [ "$limit" -lt 5 ]; then
        echo "== $name: no time left"
        last_res=NOTIME last_time=0 rc=1
        return
    fi
    t0=$(date +%s)
    timeout "$limit" sh -c "$*" > "$OUT/$name.log" 2>&1
    r=$?
    t=$(($(date +%s) - t0))
    case $r in
    0) res=PASS ;;
    77) res=SKIP ;;
    124) res=TIMEOUT ;;
    *) res=FAIL ;;
    esac
    [ "$res" = PASS ] || [ "$res" = SKIP ] || rc=1
    echo "== $name: $res ($t s, exit $r)"
    tail -n 12 "$OUT/$name.log"
    last_res=$res last_time=$t
}

# ---- what the machine has ----
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
{
    "$nvcc_bin" --version 2>&1 | tail -n 2
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
row machine - "$(tr '\n' ';' < "$OUT/machine.txt" | cut -c1-200)"

# ---- llama.cpp's CUDA build, in the background from the start ----
llama_src=${LLAMA_CUDA_SRC:-}
for f in ../llama-cuda-src.tar.xz ./llama-cuda-src.tar.xz ../llama-cuda-src.tar.gz ./llama-cuda-src.tar.gz; do
    [ -z "$llama_src" ] && [ -f "$f" ] && llama_src=$(cd "$(dirname "$f")" && pwd)/$(basename "$f")
done
llama_dir=$WORK/llama
llama_bin=
llama_pid=
if command -v llama-bench > /dev/null 2>&1; then
    llama_bin=$(command -v llama-bench)
elif [ -x "$llama_dir/build/bin/llama-bench" ]; then
    llama_bin=$llama_dir/build/bin/llama-bench # built by an earlier call
elif want llama && [ -n "$llama_src" ]; then
    llama_bin=$llama_dir/build/bin/llama-bench
    # tar's own xz when there is one, else Python's lzma (a bare machine may lack xz)
    unpack="tar xf '$llama_src' -C '$llama_dir' 2>/dev/null || \
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' '$llama_src' '$llama_dir'"
    llama_cmd="rm -rf '$llama_dir' && mkdir -p '$llama_dir' && { $unpack; } && \
        cmake -S '$llama_dir/llama.cpp' -B '$llama_dir/build' -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF && \
        cmake --build '$llama_dir/build' --target llama-bench -j 16"
    if command -v setsid > /dev/null 2>&1; then # its own process group: stopped whole when time is up
        setsid sh -c "$llama_cmd" > "$OUT/llama-build.log" 2>&1 &
    else
        sh -c "$llama_cmd" > "$OUT/llama-build.log" 2>&1 &
    fi
    llama_pid=$!
fi

# ---- build ----
if want build; then
    if [ ! -f config.status ] || ! grep -q 'enable-cuda=yes' config.status; then
        step configure 60 "./configure -q --enable-cuda=yes --with-cuda-arch=90"
        row configure "$last_res" "${last_time}s"
    fi
    step build 200 "make -j16 && make -j16 tests/test-ops tests/test-cuda-module tests/model-eval \
        tests/test-attention-devices tests/test-cuda-emu tests/gpu/gpu-model"
    row build "$last_res" "${last_time}s (nvcc sm_90, -j16)"
fi

# ---- module ----
gpu_note=
if want module; then
    step module 30 "tests/test-cuda-module && tests/test-cuda-emu"
    row module "$last_res" "$(grep -E '^(CUDA0|out of memory|free memory)|no CUDA device' "$OUT/module.log" | tr '\n' ';' | cut -c1-160)"
    if ! grep -q '^CUDA0:' "$OUT/module.log" 2> /dev/null; then
        gpu_note=" (NO CUDA0: CPU against CPU)"
        rc=1
        row gpu FAIL "no CUDA0: the module found no GPU (module.log says why)"
    fi
fi

# ---- models ----
model=$WORK/smollm2-shape-random-f16.gguf
model_q=$WORK/smollm2-shape-random-q4_0.gguf
model_s=$WORK/small-random-f16.gguf
make_models="{ test -f '$model' || tests/gpu/gpu-model '$model'; } && \
    { test -f '$model_q' || ./examples/tensr-quantize '$model' '$model_q' q4_0 -j 16; } && \
    { test -f '$model_s' || tests/gpu/gpu-model '$model_s' small; }"

# ---- KL against the CPU: F16 and Q4_0, -ub 64 and -ub 1, flash off and on ----
if want kl; then
    kl_cmd="$make_models && prompt=\$(awk 'BEGIN{s=\"logits 1\"; x=7; for(i=0;i<63;i++){x=(x*1103515245+12345)%2147483648; s=s\" \"(300+x%40000)}; print s}') && \
      for m in '$model' '$model_q'; do for ub in 64 1; do for fa in 0 1; do \
        tag=\$(basename \$m .gguf)-ub\$ub-fa\$fa; \
        echo \"\$prompt\" | tests/model-eval -t 16 -c 512 -ub \$ub -fa \$fa \$m > '$WORK'/cpu-\$tag.txt && \
        echo \"\$prompt\" | tests/model-eval -t 16 -c 512 -ub \$ub -fa \$fa -ngl 99 \$m > '$WORK'/gpu-\$tag.txt && \
        printf '%s: ' \$tag && tests/gpu/gpu-model kl '$WORK'/cpu-\$tag.txt '$WORK'/gpu-\$tag.txt 0.01 || exit 1; \
      done; done; done"
    step kl 120 "$kl_cmd"
    row kl "$last_res" "$(grep -E 'KL' "$OUT/kl.log" | sed 's/smollm2-shape-random-//' | tr '\n' ';' | cut -c1-600)$gpu_note"
fi

# ---- the op harness on CUDA0, one process per op ----
if want ops; then
    ops_cmd="bad=; for op in mul_mat mul_mat_id get_rows set_rows rms_norm rope softmax flash_attn add mul scale \
        swiglu geglu cpy cont argsort top_k sum_rows sigmoid; do \
        timeout 30 tests/test-ops -d CUDA0 -t 16 -o \$op > '$OUT'/ops-\$op.log 2>&1; r=\$?; \
        printf '%-11s exit %-3s %s\n' \$op \$r \"\$(grep -E 'passed|op nodes' '$OUT'/ops-\$op.log | tr '\n' ' ')\"; \
        [ \$r -eq 0 ] || bad=\"\$bad \$op\"; done; \
        tests/test-ops -d CUDA0 list > '$OUT'/ops-table.md 2>&1; [ -z \"\$bad\" ] || { echo failed:\$bad; exit 1; }"
    step ops 100 "$ops_cmd"
    row ops "$last_res" "$(grep -c ' exit 0 ' "$OUT/ops.log") ops passed; $(grep -E '^failed:' "$OUT/ops.log" | cut -c1-200)"
fi

# ---- not in the default list (a later call may ask for them) ----
if want large; then # more than 65,535 rows and indices, a copy past 2^31 bytes
    step large 200 "tests/test-ops -d CUDA0 -L -t 16"
    row large "$last_res" "$(grep -E 'passed|failed' "$OUT/large.log" | tail -n 1 | cut -c1-120)"
fi
if want sched; then # the KV cache split over CPU, CUDA0 and a fake device
    step sched 90 "TSR_TEST_DEVICE=CUDA0 tests/test-attention-devices"
    row sched "$last_res" "$(grep -c 'split again' "$OUT/sched.log") KV-cache splits run"
fi

# ---- compute-sanitizer on the small model ----
if want memcheck; then
    san=$(command -v compute-sanitizer || echo "$(dirname "$nvcc_bin")/compute-sanitizer")
    step memcheck 60 "$make_models && printf 'logits 1 5 9 13\ngreedy 2 -1 1 5 9 13\n' | \
        '$san' --tool memcheck --error-exitcode 3 tests/model-eval -t 4 -c 64 -ngl 99 '$model_s' > /dev/null"
    row memcheck "$last_res" "$(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)"
fi

# ---- tensr-bench, graphs on and off ----
if want bench; then
    step bench 60 "$make_models && for m in '$model' '$model_q'; do \
          ./examples/tensr-bench -m \$m -ngl 99 -p 512 -n 128 -r 2 -fa on --no-llama && \
          TSR_CUDA_GRAPHS=0 ./examples/tensr-bench -m \$m -ngl 99 -p 0 -n 128 -r 2 -fa on --no-llama \
            | sed 's/tg128/tg128 (CUDA graphs off)/' || exit 1; done && \
          ./examples/tensr-bench -m '$model_q' -ngl 99 -p 0 -n 16 -r 1 -fa on --no-llama --profile"
    row bench "$last_res" "$(grep -E 'pp512|tg128' "$OUT/bench.log" | tr -s ' ' | tr '\n' ';' | cut -c1-400)$gpu_note"
    row launches "$last_res" "$(grep -o 'the last compute.*' "$OUT/bench.log" | tail -n 1) (Q4_0, 30 layers: per layer ~ (N - 3) / 30)"
fi

# ---- llama.cpp beside, if its build is done ----
if want llama; then
    if [ -n "$llama_pid" ]; then # wait while time is left for the benchmark itself
        while kill -0 "$llama_pid" 2> /dev/null && [ "$(left)" -gt 45 ]; do sleep 3; done
        if kill -0 "$llama_pid" 2> /dev/null; then
            kill -- "-$llama_pid" 2> /dev/null || kill "$llama_pid"
            echo "llama.cpp build: out of time (a second call finds what it built)" >> "$OUT/llama-build.log"
        fi
        wait "$llama_pid" 2> /dev/null
    fi
    if [ -n "$llama_bin" ] && [ -x "$llama_bin" ]; then
        step llama 40 "$make_models && ./examples/tensr-bench -m '$model' -m '$model_q' -ngl 99 -p 512 -n 128 -r 2 \
            -fa on --llama-bench '$llama_bin'"
        row llama "$last_res" "$(grep -E 'pp512|tg128' "$OUT/llama.log" | tr -s ' ' | tr '\n' ';' | cut -c1-400)"
    else
        row llama SKIP "no llama.cpp CUDA llama-bench yet (llama-build.log: $(tail -n 1 "$OUT/llama-build.log" 2> /dev/null | cut -c1-80))"
    fi
fi

echo
echo "== summary ($(($(date +%s) - t_start)) s; logs in $OUT)"
cat "$table"
exit $rc
