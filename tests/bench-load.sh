#!/bin/sh
# bench-load.sh - load speed of tsr_backend_load_gguf (not part of make check).
#
# For SmolLM2-135M-Instruct Q4_1 and Q8_0 it measures, RUNS times each
# (median reported):
#   1. local file, warm page cache: `cat file > /dev/null` versus the loader
#      (examples/tensr-load-bench) with 1 and 4 I/O threads;
#   2. the same file over a network file system on loopback: sshfs to a
#      private sshd on 127.0.0.1:$SSH_PORT (generated keys), with no added
#      latency and with $NET_DELAY_MS ms of netem delay per packet on the sshd
#      port only (so the RTT grows by twice that). Without the rights for tc
#      the delayed run is skipped and the script says so.
# The Q8_0 model is made from the Q4_1 one when absent (dequantized and
# requantized with the gguf Python package; not committed anywhere).
#
# Environment: top_builddir (.), BENCH (driver), RUNS (5), THREADS ("1 4"),
# SSH_PORT (22522), NET_DELAY_MS (2), TSR_MODEL_DIR (~/.cache/libtensr).
# Needs: sshfs, sshd (openssh-server), fusermount, python3 + gguf for Q8_0.
set -eu

top_builddir=${top_builddir:-.}
BENCH=${BENCH:-$top_builddir/examples/tensr-load-bench}
RUNS=${RUNS:-5}
THREADS=${THREADS:-"1 4"}
SSH_PORT=${SSH_PORT:-22522}
NET_DELAY_MS=${NET_DELAY_MS:-2}
DIR=${TSR_MODEL_DIR:-$HOME/.cache/libtensr}
Q41=SmolLM2-135M-Instruct.Q4_1.gguf
Q80=SmolLM2-135M-Instruct.Q8_0.gguf

[ -x "$BENCH" ] || { echo "bench-load: $BENCH not built (make examples/tensr-load-bench)"; exit 1; }
[ -r "$DIR/$Q41" ] || { echo "bench-load: $DIR/$Q41 absent (make run fetches it)"; exit 1; }

make_q8_0() {
    python3 - "$DIR/$Q41" "$DIR/$Q80.tmp" <<'EOF'
import sys, numpy as np, gguf
from gguf import GGMLQuantizationType as T
r = gguf.GGUFReader(sys.argv[1])
arch = r.fields['general.architecture'].contents()
w = gguf.GGUFWriter(sys.argv[2], arch)
for f in r.fields.values():
    if f.name == 'general.architecture' or f.name.startswith('GGUF.'):
        continue
    v = 7 if f.name == 'general.file_type' else f.contents()  # 7 = MOSTLY_Q8_0
    sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(f.name, v, f.types[0], sub_type=sub)
for t in r.tensors:
    if t.tensor_type in (T.F32, T.F16, T.BF16):
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    else:
        x = gguf.quants.dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, gguf.quants.quantize(x, T.Q8_0), raw_dtype=T.Q8_0)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
EOF
    mv "$DIR/$Q80.tmp" "$DIR/$Q80"
}
[ -r "$DIR/$Q80" ] || { echo "making $DIR/$Q80 ..."; make_q8_0; }

median() { sort -n | awk '{a[NR] = $1} END {if (NR == 0) print "n/a"; else if (NR % 2) printf "%.3f\n", a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# seconds of each of RUNS cats of $1
time_cat() {
    i=0
    while [ $i -lt "$RUNS" ]; do
        s=$(date +%s%N); cat "$1" > /dev/null; e=$(date +%s%N)
        awk -v a="$s" -v b="$e" 'BEGIN {printf "%.4f\n", (b - a) / 1e9}'
        i=$((i + 1))
    done
}
time_load() { "$BENCH" "$1" -t "$2" -n "$RUNS" | sed -n 's/^seconds=\([0-9.]*\).*/\1/p'; }

# one table row per model: cat, then each thread count
row() { # label file
    c=$(time_cat "$2" | median)
    line=$(printf "| %-22s | %-16s | %8s" "$1" "$(basename "$2" .gguf | sed 's/.*Instruct\.//')" "$c")
    for t in $THREADS; do
        line="$line | $(printf %8s "$(time_load "$2" "$t" | median)")"
    done
    echo "$line |"
}

header() {
    h="| where                  | model            |  cat (s)"
    sep="|------------------------|------------------|---------"
    for t in $THREADS; do h="$h | load -t$t"; sep="$sep|----------"; done
    echo "$h |"; echo "$sep|"
}

echo "median of $RUNS runs each; load = tsr_backend_load_gguf (GGUF parse + placement + reads), seconds"
header
for m in "$DIR/$Q41" "$DIR/$Q80"; do
    cat "$m" > /dev/null   # warm the page cache
    row "local, warm cache" "$m"
done

# ---- network file system over loopback ------------------------------------
W=$(mktemp -d /tmp/tsr-bench-load.XXXXXX)
TC=0
cleanup() {
    fusermount -u "$W/mnt" 2>/dev/null || umount "$W/mnt" 2>/dev/null || true
    [ -f "$W/sshd.pid" ] && kill "$(cat "$W/sshd.pid")" 2>/dev/null || true
    [ $TC = 1 ] && tc qdisc del dev lo root 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT INT TERM

command -v sshfs > /dev/null || { echo "sshfs is not installed: network file system part skipped"; exit 0; }
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
ssh-keygen -q -t ed25519 -N '' -f "$W/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$W/user_key"
cp "$W/user_key.pub" "$W/authorized_keys"
cat > "$W/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $W/host_key
AuthorizedKeysFile $W/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $W/sshd.pid
Subsystem sftp internal-sftp
EOF
mkdir -p /run/sshd "$W/mnt"
"$SSHD" -f "$W/sshd_config" -E "$W/sshd.log"
sleep 0.5
sshfs -p "$SSH_PORT" -o "IdentityFile=$W/user_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,ro" \
    "$(id -un)@127.0.0.1:$DIR" "$W/mnt"
for m in "$Q41" "$Q80"; do
    cmp -s "$DIR/$m" "$W/mnt/$m" || { echo "bench-load: sshfs copy of $m differs"; exit 1; }
done
# FUSE drops a file's page cache when it is opened again, so every run reads
# over the network (the server side reads from its warm page cache).
for m in "$Q41" "$Q80"; do row "sshfs loopback" "$W/mnt/$m"; done

# netem delay on the sshd port only (both directions), nothing else on lo
if tc qdisc add dev lo root handle 1: prio bands 4 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1 2>/dev/null; then
    TC=1
    tc qdisc add dev lo parent 1:4 handle 40: netem delay "${NET_DELAY_MS}ms"
    tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport "$SSH_PORT" 0xffff flowid 1:4
    tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dport "$SSH_PORT" 0xffff flowid 1:4
    rtt=$((2 * NET_DELAY_MS))
    for m in "$Q41" "$Q80"; do row "sshfs +${rtt} ms RTT" "$W/mnt/$m"; done
else
    echo "(tc/netem not permitted here: no run with added latency)"
fi
