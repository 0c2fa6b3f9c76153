#!/usr/bin/env bash
# bench/store_load.sh — the rendezvous store under load, side by side in one run:
#   echo     a bare single-thread echo server over the same loopback: one request, one reply, no work
#            (the limit a request/response store can reach here)
#   tessera  Tessera's TCP store (authenticated connections, as under `tessera run`)
#   torch    PyTorch's TCPStore server (the newest torch found: .pyvenv-torch, then TS_PYTHON, .pyvenv,
#            python3), driven by the same C clients speaking torch's protocol
# For each client count: ops/s (set, get, add, check in turn, each client its own connection) and the
# per-op p50 / p99 latency, best of --rounds rounds by ops/s, and how long all clients took to connect at
# once (the clock starts after that). Then a rendezvous of --ranks simulated ranks
# (threads, each its own connection, the join ts_pg_new runs) against Tessera's store.
#
#   bench/store_load.sh [--clients "16 64 256"] [--seconds 3] [--rounds 3] [--ranks 1024] [--build DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build CLIENTS="16 64 256" SECONDS_PER=3 ROUNDS=3 RANKS=1024
while [ $# -gt 0 ]; do
  case $1 in
    --clients) CLIENTS=$2; shift 2 ;;
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "usage: $0 [--clients LIST] [--seconds S] [--rounds N] [--ranks R] [--build DIR]" >&2; exit 2 ;;
  esac
done
B=$BUILD/bench_store_load
[ -x "$B" ] || { echo "store_load.sh: no $B (cmake --build $BUILD --target bench_store_load)" >&2; exit 2; }
PY=
for p in "$ROOT/.pyvenv-torch/bin/python3" "${TS_PYTHON:-}" "$ROOT/.pyvenv/bin/python3" python3; do
  [ -n "$p" ] && "$p" -c 'import torch.distributed' 2>/dev/null && { PY=$p; break; }
done
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
export TS_JOB_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')

# start_server NAME CMD...: runs CMD with a stdin that stays open until exit; waits for its port file
start_server() {
  local name=$1; shift
  mkfifo "$T/$name.in"
  "$@" "$T/$name" < "$T/$name.in" > "$T/$name.log" 2>&1 &
  PIDS+=($!)
  exec {fd}> "$T/$name.in"   # keeps the server's stdin open
  for _ in $(seq 600); do [ -s "$T/$name" ] && return 0; sleep 0.1; done
  echo "store_load.sh: the $name server did not start: $(cat "$T/$name.log")" >&2; return 1
}
start_server echo "$B" --echo
start_server tessera "$B" --serve
TORCH_VER="(no torch found)"
if [ -n "$PY" ]; then
  start_server torch "$PY" "$ROOT/bench/store_load_torch.py" && TORCH_VER="torch $(cut -d' ' -f2,3 "$T/torch") server"
fi

best() { # target port clients -> the best round's line
  local line bestline= bestops=-1 ops
  for _ in $(seq "$ROUNDS"); do
    line=$("$B" --target "$1" --port "$2" --clients "$3" --seconds "$SECONDS_PER") || { echo "$line"; return 1; }
    ops=$(awk '{for (i=1;i<NF;i++) if ($i=="ops_per_s") print $(i+1)}' <<<"$line")
    [ "$ops" -gt "$bestops" ] && { bestops=$ops; bestline=$line; }
  done
  echo "$bestline"
}
field() { awk -v k="$1" '{for (i=1;i<NF;i++) if ($i==k) print $(i+1)}' <<<"$2"; }

echo "# store load: $(nproc) cores, $(uname -r), best of $ROUNDS x ${SECONDS_PER}s; torch: $TORCH_VER"
printf "# %-8s %12s %14s %14s %10s %20s %20s %16s\n" clients "echo ops/s" "tessera ops/s" "torch ops/s" "tess/torch" \
  "tessera p50/p99 us" "torch p50/p99 us" "connect tess/torch s"
for c in $CLIENTS; do
  e=$(best echo "$(cat "$T/echo")" "$c")
  t=$(best tessera "$(cat "$T/tessera")" "$c")
  if [ -s "$T/torch" ]; then
    p=$(best torch "$(cut -d' ' -f1 "$T/torch")" "$c")
    to=$(field ops_per_s "$p"); tl="$(field p50_us "$p")/$(field p99_us "$p")"; tc=$(field connect_all_s "$p")
    ratio=$(awk -v a="$(field ops_per_s "$t")" -v b="$to" 'BEGIN { printf "%.2fx", a / b }')
  else to=-; tl=-; ratio=-; tc=-; fi
  printf "  %-8s %12s %14s %14s %10s %20s %20s %16s\n" "$c" "$(field ops_per_s "$e")" "$(field ops_per_s "$t")" "$to" \
    "$ratio" "$(field p50_us "$t")/$(field p99_us "$t")" "$tl" "$(field connect_all_s "$t")/$tc"
done
r=$("$B" --rdzv "$RANKS" --port "$(cat "$T/tessera")" --rounds "$ROUNDS")
echo "# rendezvous of $RANKS ranks (threads, one connection each, authenticated), best of $ROUNDS: $(field best_s "$r") s"
