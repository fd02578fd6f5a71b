#!/bin/sh
# bench-load.sh - load speed of tsr_backend_load_gguf (not part of make check).
#
# For SmolLM2-135M-Instruct Q4_1 and Q8_0 it measures, RUNS times each
# (median reported):
#   1. local file, warm page cache: `cat file > /dev/null` versus the loader
#      (examples/tensr-load-bench) with 1 and 4 I/O threads;
#   2. the same file over a network file system on loopback: sshfs to a
#      private sshd on 127.0.0.1:$SSH_PORT (generated keys), with one ssh
#      connection and with $NET_CONNS (sshfs max_conns), each without added
#      latency and with $NET_DELAY_MS ms added in each direction by
#      tests/delay-proxy.py (an ssh ProxyCommand; tc/netem is often not
#      available in containers, as here).
# The Q8_0 model is made from the Q4_1 one when absent (dequantized and
# requantized with the gguf Python package; not committed anywhere).
#
# Environment: top_builddir (.), BENCH (driver), RUNS (5), THREADS ("1 4"),
# SSH_PORT (22522), NET_DELAY_MS (2), NET_CONNS (4), TSR_MODEL_DIR
# (~/.cache/libtensr); LOCAL_ONLY=1 skips the network part.
# Needs: sshfs, sshd (openssh-server), fusermount, python3 + gguf for Q8_0.
set -eu

top_builddir=${top_builddir:-.}
BENCH=${BENCH:-$top_builddir/examples/tensr-load-bench}
RUNS=${RUNS:-5}
THREADS=${THREADS:-"1 4"}
SSH_PORT=${SSH_PORT:-22522}
NET_DELAY_MS=${NET_DELAY_MS:-2}
NET_CONNS=${NET_CONNS:-4}
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
time_parse() { "$BENCH" "$1" -p -n "$RUNS" | sed -n 's/^seconds=\([0-9.]*\).*/\1/p'; }

# one table row per model: cat, then each thread count
row() { # label file
    c=$(time_cat "$2" | median)
    line=$(printf "| %-22s | %-5s | %8s | %8s" "$1" "$(basename "$2" .gguf | sed 's/.*Instruct\.//')" "$c" \
        "$(time_parse "$2" | median)")
    for t in $THREADS; do
        line="$line | $(printf %8s "$(time_load "$2" "$t" | median)")"
    done
    echo "$line |"
}

header() {
    h="| where                  | model |  cat (s) | parse (s)"
    sep="|------------------------|-------|----------|----------"
    for t in $THREADS; do h="$h | load -t$t"; sep="$sep|----------"; done
    echo "$h |"; echo "$sep|"
}

echo "median of $RUNS runs each, seconds; load = tsr_backend_load_gguf (GGUF parse + placement + reads),"
echo "parse = tsr_gguf_open + close alone (the part of load before placement and reads)"
header
for m in "$DIR/$Q41" "$DIR/$Q80"; do
    cat "$m" > /dev/null   # warm the page cache
    row "local, warm cache" "$m"
done

# ---- network file system over loopback ------------------------------------
[ "${LOCAL_ONLY:-0}" = 1 ] && exit 0
W=$(mktemp -d /tmp/tsr-bench-load.XXXXXX)
cleanup() {
    for mnt in "$W"/mnt*; do [ -d "$mnt" ] && { fusermount -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || true; }; done
    [ -f "$W/sshd.pid" ] && kill "$(cat "$W/sshd.pid")" 2>/dev/null || true
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
mkdir -p /run/sshd
"$SSHD" -f "$W/sshd_config" -E "$W/sshd.log"
sleep 0.5

# mount_sshfs CONNS DELAY_MS: sshfs of $DIR on a new $MNT with CONNS ssh
# connections (sshfs max_conns: each open file uses one), through the
# delay proxy when DELAY_MS > 0
n_mnt=0
mount_sshfs() {
    n_mnt=$((n_mnt + 1)); MNT="$W/mnt$n_mnt"; mkdir -p "$MNT"
    opts="IdentityFile=$W/user_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,ro,max_conns=$1"
    if [ "$2" -gt 0 ]; then
        sshfs -p "$SSH_PORT" -o "$opts" \
            -o "ProxyCommand=python3 $PROXY 127.0.0.1 $SSH_PORT $2" "$(id -un)@127.0.0.1:$DIR" "$MNT"
    else
        sshfs -p "$SSH_PORT" -o "$opts" "$(id -un)@127.0.0.1:$DIR" "$MNT"
    fi
    for m in "$Q41" "$Q80"; do
        cmp -s "$DIR/$m" "$MNT/$m" || { echo "bench-load: sshfs copy of $m differs"; exit 1; }
    done
}
unmount_sshfs() { fusermount -u "$MNT" 2>/dev/null || umount "$MNT"; }

# tc/netem is the usual way to add latency; where it is missing (no
# sch_netem in the kernel, or no CAP_NET_ADMIN) this userspace proxy does it.
PROXY=$(cd "$(dirname "$0")" && pwd)/delay-proxy.py
# FUSE drops a file's page cache when it is opened again, so every run reads
# over the network (the server reads from its warm page cache).
for conns in 1 $NET_CONNS; do
    for delay in 0 $NET_DELAY_MS; do
        mount_sshfs "$conns" "$delay"
        label="sshfs c=$conns"
        [ "$delay" -gt 0 ] && label="$label +$((2 * delay))ms RTT"
        for m in "$Q41" "$Q80"; do row "$label" "$MNT/$m"; done
        unmount_sshfs
    done
done
