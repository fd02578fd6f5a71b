#!/bin/sh
# bench/compare.sh - libtensr against llama.cpp on this machine, side by side.
#
# Builds llama.cpp's llama-bench and llama-quantize natively from the source
# vendored in the llama-cpp-python sdist (bench/build-llama.sh; cached),
# requantizes the cached SmolLM2 model to the types compared (cached),
# measures the machine's read bandwidth and arithmetic peaks with
# bench/bandwidth.c and bench/peak.c, then runs tensr-bench and llama-bench
# ALTERNATELY (one repetition of each in turn, each with its warm-up) on the
# same files, threads and tests, and prints one markdown table: llama.cpp
# and libtensr tokens/s (mean ± sd over the repetitions), their ratio,
# generation as % of the bandwidth ceiling (model bytes x t/s / bandwidth)
# and prompt processing as % of the F32 FMA (F16 models) or int8 dot
# (quantized models) peak (2 x parameters x t/s / peak; the peak per
# CPU-second x threads, so that a shared machine does not lower it), with
# the CPU model, its SIMD flags and the load before and after. On a shared
# machine every figure is noisy: read the ratios, and compare -t 1 too.
#
# usage: bench/compare.sh [options]
#   -m LIST    models: a comma list of files, of types to requantize the
#              cached SmolLM2 to, or of 1b:TYPE, the 1B-class random-weight
#              model of bench/make-dense.py (TinyLlama-1.1B's shape, made
#              once and cached, then quantized from F16 by llama-quantize);
#              an entry may end in @D+D... for its own depths (-d for the
#              others). Default: Q4_1,Q4_0,Q8_0,Q4_K_M,F16 (SmolLM2-135M,
#              in cache) and 1b:Q4_0,1b:Q4_K_M@0+4096,1b:Q5_K_M,1b:Q8_0,1b:F16
#              (streamed from memory).
#   -t LIST    threads (comma list; default: the cores)
#   -r N       alternations (repetitions of each tool; default 5)
#   -p N       prompt tokens of the pp test (default 512)
#   -n N       tokens of the tg test (default 128)
#   -d LIST    depths (comma list; default 0)
#   -k NAME    TSR_CPU_KERNELS for libtensr (scalar|avx2|avx512; default: best)
#   -fa 0|1    flash attention, both tools (default 1)
#   -o FILE    also write the raw results (JSON lines) to FILE and the
#              machine's figures to FILE.machine (bench/compare-table.py
#              prints the table again from the two)
# Environment: TSR_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/libtensr),
# TENSR_BENCH (default examples/tensr-bench of this build), JOBS (make -j
# of the llama.cpp build, default 2), LLAMA_CMAKE_ARGS (llama.cpp's ISA,
# default -DGGML_NATIVE=ON; see bench/build-llama.sh: with -k avx2 on an
# AVX-512 machine, an AVX2 llama.cpp compares like with like).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
TSR_CACHE=${TSR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/libtensr}
export TSR_CACHE
models=Q4_1,Q4_0,Q8_0,Q4_K_M,F16,1b:Q4_0,1b:Q4_K_M@0+4096,1b:Q5_K_M,1b:Q8_0,1b:F16
threads=$(nproc 2>/dev/null || echo 1)
reps=5 n_prompt=512 n_gen=128 depths=0 kernels='' fa=1 raw=''
while [ $# -gt 0 ]; do
    case $1 in
    -m) models=$2 ;;
    -t) threads=$2 ;;
    -r) reps=$2 ;;
    -p) n_prompt=$2 ;;
    -n) n_gen=$2 ;;
    -d) depths=$2 ;;
    -k) kernels=$2 ;;
    -fa) fa=$2 ;;
    -o) raw=$2 ;;
    -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown option $1 (see -h)" >&2; exit 2 ;;
    esac
    shift 2
done
tensr_bench=${TENSR_BENCH:-$top/examples/tensr-bench}
[ -x "$tensr_bench" ] || { echo "compare.sh: no $tensr_bench (run make first)" >&2; exit 1; }
base=$TSR_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf

echo "compare.sh: building llama.cpp (cached after the first run; nice -n 19)" >&2
lbin=$("$here/build-llama.sh")

tools=$TSR_CACHE/bench-tools
mkdir -p "$tools"
for p in bandwidth peak; do # a second each: always from the source at hand
    ${CC:-cc} -O2 -march=native -pthread -o "$tools/$p" "$here/$p.c"
done

# Models: a path is used as it is; a type name is the cached SmolLM2
# requantized to it (from Q4_1, as the issue measures; --allow-requantize).
files=
for spec in $(echo "$models" | tr ',' ' '); do
    m=${spec%%@*}
    d=$depths
    [ "$m" = "$spec" ] || d=$(echo "${spec#*@}" | tr '+' ',')
    case $m in
    1b:*)
        t=${m#1b:}
        f16=$TSR_CACHE/dense/dense-F16.gguf
        mkdir -p "$TSR_CACHE/dense"
        if [ ! -f "$f16" ]; then
            echo "compare.sh: writing the 1B-class model (bench/make-dense.py, 2.2 GB)" >&2
            python3 "$here/make-dense.py" "$f16.tmp" >/dev/null ||
                { echo "compare.sh: bench/make-dense.py failed (it needs numpy and gguf)" >&2; rm -f "$f16.tmp"; exit 1; }
            mv "$f16.tmp" "$f16"
        fi
        f=$TSR_CACHE/dense/dense-$t.gguf
        if [ ! -f "$f" ]; then
            "$lbin/llama-quantize" "$f16" "$f.tmp" "$t" >/dev/null 2>&1 ||
                { echo "compare.sh: llama-quantize to $t failed" >&2; rm -f "$f.tmp"; exit 1; }
            mv "$f.tmp" "$f"
        fi
        ;;
    */* | *.gguf) f=$m ;;
    Q4_1) f=$base ;;
    *)
        f=$TSR_CACHE/quant/SmolLM2-135M-Instruct.$m.gguf
        if [ ! -f "$f" ]; then
            [ -f "$base" ] || { echo "compare.sh: no $base (examples/get-model.sh fetches it)" >&2; exit 1; }
            mkdir -p "$TSR_CACHE/quant"
            "$lbin/llama-quantize" --allow-requantize "$base" "$f.tmp" "$m" >/dev/null 2>&1 ||
                { echo "compare.sh: llama-quantize to $m failed" >&2; rm -f "$f.tmp"; exit 1; }
            mv "$f.tmp" "$f"
        fi
        ;;
    esac
    files="$files $f@$d"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load0=$(uptime)
: >"$tmp/machine"
# the peaks of the ISA libtensr's kernels use (-k avx2: AVX2; else the best)
isa=best
[ "$kernels" = avx2 ] && isa=avx2
echo "isa $isa" >>"$tmp/machine"
# tg's bytes per token: a model's weights but its token embedding, of which
# a token reads one row (unless the output reuses it: tied)
dump=$top/tests/gguf-dump
for fd in $files; do
    f=${fd%@*}
    [ -x "$dump" ] || break
    "$dump" "$f" 2>/dev/null | python3 -c '
import re, sys
ts = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"\"name\": \"([^\"]*)\"[^{}]*?\"size\": ([0-9]+)", sys.stdin.read()))
if "token_embd.weight" in ts and "output.weight" in ts:
    print("embd %s %d" % (sys.argv[1], ts["token_embd.weight"]))
' "$(basename "$f")" >>"$tmp/machine" || true
done
for t in $(echo "$threads" | tr ',' ' '); do
    echo "bw $t $("$tools/bandwidth" "$t" 1024 2>/dev/null)" >>"$tmp/machine"
    echo "fma $t $("$tools/peak" fma "$t" $isa 2>/dev/null | cut -d' ' -f1)" >>"$tmp/machine"
    echo "int8 $t $("$tools/peak" int8 "$t" $isa 2>/dev/null | cut -d' ' -f1)" >>"$tmp/machine"
done

: >"$tmp/raw"
for fd in $files; do
    f=${fd%@*} d=${fd##*@}
    for t in $(echo "$threads" | tr ',' ' '); do
        i=1
        while [ "$i" -le "$reps" ]; do
            echo "compare.sh: $(basename "$f") -t $t: alternation $i of $reps" >&2
            # llama.cpp first on odd rounds, libtensr first on even ones
            for side in 1 2; do
                if [ $(((i + side) % 2)) -eq 0 ]; then
                    "$lbin/llama-bench" -m "$f" -t "$t" -p "$n_prompt" -n "$n_gen" -d "$d" -r 1 \
                        -fa "$fa" -o jsonl 2>/dev/null | sed 's/^/llama /' >>"$tmp/raw"
                else
                    if [ -n "$kernels" ]; then
                        TSR_CPU_KERNELS=$kernels "$tensr_bench" -m "$f" -t "$t" -p "$n_prompt" -n "$n_gen" \
                            -d "$d" -r 1 -fa "$fa" -o json --no-llama 2>/dev/null
                    else
                        "$tensr_bench" -m "$f" -t "$t" -p "$n_prompt" -n "$n_gen" -d "$d" -r 1 \
                            -fa "$fa" -o json --no-llama 2>/dev/null
                    fi | grep '"engine"' | sed 's/^ *//; s/,$//; s/^/tensr /' >>"$tmp/raw"
                fi
            done
            i=$((i + 1))
        done
    done
done
load1=$(uptime)
[ -z "$raw" ] || { cp "$tmp/raw" "$raw" && cp "$tmp/machine" "$raw.machine"; }

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -1 | tr ' ' '\n' |
    grep -E '^(avx|avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|avx512_bf16|amx_.*)$' |
    tr '\n' ' ')
python3 "$here/compare-table.py" "$tmp/raw" "$tmp/machine" "$cpu" "$flags" "$load0" "$load1" "${kernels:-best}"
