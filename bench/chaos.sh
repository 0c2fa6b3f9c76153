#!/usr/bin/env bash
# bench/chaos.sh — reliability as a measured figure: a long `tessera train` under `tessera run --nnodes 2
# --nproc-per-node 2 --max-restarts K --checkpoint-dir` on two namespace hosts (tests/netns_hosts.sh) while a
# seeded schedule injects faults one at a time, each followed by a recovery wait:
#   kill-rank       SIGKILL of a rank
#   stop-rank       SIGSTOP of a rank, SIGCONT after a while shorter than the heartbeat timeout, or never
#   stop-at-rdzv    a rank killed, then a rank of the next attempt SIGSTOPped before its rendezvous
#   kill-launcher   SIGKILL of a node's `tessera run` (the harness starts it again, as systemd or a pod would)
#   stop-launcher   SIGSTOP of a node's `tessera run`, SIGCONT a few seconds later
#   link-cut        a host's cable cut (host_link down), restored after a short or a long while
#   link-slow       a delay (tc netem, where the kernel has it) or a rate limit (tc tbf) on a host's link
#   shm-full        the host's /dev/shm (a small private tmpfs) filled, then a rank of it killed: the
#                   restart meets a full /dev/shm; freed a few seconds later
#   disk-full       the checkpoint folder's file system (a small tmpfs) filled for a few checkpoint periods
#   store-flood     a hostile client at MASTER_PORT: hundreds of connections, garbage, a connect/close
#                   storm; with a rank killed meanwhile half the time (a rendezvous under the flood)
# It then prints a table: faults injected and survived (by kind), restarts, time lost against an uninterrupted
# run of the same seed, checkpoints lost, the final parameters against the uninterrupted run's (ckpt diff --tol
# 0), and the longest time any rank waited without a verdict (from the fault to the first line of either
# launcher naming it, or to the run's progress resuming). A fault is survived when the run recovered from it
# (a new checkpoint past the fault's step, no relaunch by the harness) and no rank waited longer than the
# heartbeat timeout + 5 s (35 s by default) for a verdict: a wait that only --timeout ended is a hang.
# Exit status: 0 when every fault was survived, no checkpoint was lost and the parameters are equal; 1
# otherwise; 77 when namespaces or Fashion-MNIST are missing.
#
#   bench/chaos.sh [--faults N] [--seed S] [--kinds k1,k2] [--heartbeat S] [--timeout S] [--json FILE]
#                  [--in-order] [--tessera PATH] [--keep-logs DIR]
# --in-order takes the kinds in the order given (cycling) instead of at random; the rest stays seeded.
# --quick: 30-60 steps between faults (else 60-240) and a checkpoint every 25 steps (else 50), for tests.
# Needs root (network, UTS and mount namespaces, tmpfs mounts). Everything it starts or mounts goes on exit.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
FAULTS=6 SEED=1 KINDS=all IN_ORDER=0 QUICK=0 HB=30 TIMEOUT=60 JSON= TS= KEEP_LOGS= EVERY=50 KEEP=3
ALL_KINDS="kill-rank stop-rank stop-at-rdzv kill-launcher stop-launcher link-cut link-slow shm-full disk-full store-flood"
usage() {
  sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
  echo "defaults: --faults $FAULTS --seed $SEED --kinds all ($ALL_KINDS) --heartbeat $HB (TS_HEARTBEAT_TIMEOUT)"
  echo "          --timeout $TIMEOUT (tessera train --timeout: bounds every wait of a rank, the rendezvous's too)"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --faults) FAULTS=${2:-}; shift ;;
    --seed) SEED=${2:-}; shift ;;
    --kinds) KINDS=${2:-}; shift ;;
    --heartbeat) HB=${2:-}; shift ;;
    --timeout) TIMEOUT=${2:-}; shift ;;
    --json) JSON=${2:-}; shift ;;
    --tessera) TS=${2:-}; shift ;;
    --keep-logs) KEEP_LOGS=${2:-}; shift ;;
    --in-order) IN_ORDER=1; shift; continue ;;
    --quick) QUICK=1; shift; continue ;;
    -h|--help) usage; exit 0 ;;
    *) echo "chaos.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
for v in FAULTS SEED HB TIMEOUT; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "chaos.sh: --${v,,} wants a whole number, not '${!v}'" >&2; exit 2; }
done
[ "$KINDS" = all ] && KINDS=$ALL_KINDS
KINDS=${KINDS//,/ }
for k in $KINDS; do
  [[ " $ALL_KINDS " == *" $k "* ]] || { echo "chaos.sh: unknown fault kind '$k' (kinds: $ALL_KINDS)" >&2; exit 2; }
done
read -r -a KIND_LIST <<< "$KINDS"
if [ -z "$TS" ]; then
  for c in "$HERE/../build/tessera" "$HERE/../build-dev/tessera" "$(command -v tessera 2>/dev/null)"; do
    [ -n "$c" ] && [ -x "$c" ] && { TS=$c; break; }
  done
fi
[ -n "$TS" ] && [ -x "$TS" ] || { echo "chaos.sh: no tessera binary (build it, or --tessera PATH)" >&2; exit 2; }
case "$TS" in /*) ;; *) TS="$PWD/$TS" ;; esac
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
command -v perl > /dev/null || { echo "skip: no perl (the timestamps and the hostile client)"; exit 77; }

# ---- the schedule: everything random is drawn here, from the seed, before anything else uses $RANDOM ----
RANDOM=$SEED
# steps of progress between a recovery and the next fault; past the fault's step: "progress" (a stall is
# over: no fault lets that many steps through), "recovered"
GAP_MIN=60 GAP_MAX=240 PROGRESS=10 MARGIN=30
[ $QUICK = 1 ] && GAP_MIN=30 GAP_MAX=60 EVERY=25
declare -a F_KIND F_HOST F_LOCAL F_DUR F_VAR F_GAP
for ((i = 0; i < FAULTS; i++)); do
  F_KIND[i]=${KIND_LIST[RANDOM % ${#KIND_LIST[@]}]}
  [ $IN_ORDER = 1 ] && F_KIND[i]=${KIND_LIST[i % ${#KIND_LIST[@]}]}
  F_HOST[i]=$((RANDOM % 2)); F_LOCAL[i]=$((RANDOM % 2)); F_VAR[i]=$((RANDOM % 2))
  F_DUR[i]=$((RANDOM % 1000)) # a fraction (per mille) of the kind's range, scaled below
  F_GAP[i]=$((GAP_MIN + RANDOM % (GAP_MAX - GAP_MIN + 1)))
done
STEPS=$((200 + FAULTS * (GAP_MAX + MARGIN + EVERY)))
# dur LO HI PERMILLE: a duration in [LO, HI] seconds (one decimal)
dur() { awk -v lo="$1" -v hi="$2" -v p="$3" 'BEGIN { printf "%.1f", lo + (hi - lo) * p / 1000 }'; }

. "$HERE/../tests/netns_hosts.sh"
hosts_check || { echo "skip: $HOSTS_WHY"; exit 77; }
unshare --mount true 2> /dev/null || { echo "skip: cannot create mount namespaces"; exit 77; }
T=$(mktemp -d /tmp/chaos.XXXXXX)
LPID=(0 0) SPID=(0 0)
cleanup() {
  local i p
  for i in 0 1; do [ "${LPID[i]}" != 0 ] && kill -KILL "${LPID[i]}" 2> /dev/null; done
  hosts_down
  for p in $(jobs -p); do kill -KILL "$p" 2> /dev/null; wait "$p" 2> /dev/null; done
  for m in "$T/ckfs" "$T/shm0" "$T/shm1"; do mountpoint -q "$m" && umount -l "$m"; done
  if [ -n "$KEEP_LOGS" ]; then mkdir -p "$KEEP_LOGS" && cp -r "$T"/*.log "$T"/*.tsv "$T"/logs "$KEEP_LOGS"/ 2> /dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
# bash's own "Killed" notices for the launchers this harness kills are noise
exec 2> >(grep --line-buffered -v -E 'line [0-9]+: +[0-9]+ Killed' >&2)
trap 'exit 130' INT TERM HUP
hosts_up 2 || { echo "chaos.sh: could not set up the hosts" >&2; exit 1; }
A0=$(host_addr 0)
PORT=29500
mkdir -p "$T/ckfs" "$T/shm0" "$T/shm1" "$T/logs"
CKSIZE=$((16 * 1024 * 1024)) SHMSIZE=$((64 * 1024 * 1024))
mount -t tmpfs -o size=$CKSIZE chaos-ck "$T/ckfs" && mount -t tmpfs -o size=$SHMSIZE chaos-shm0 "$T/shm0" &&
  mount -t tmpfs -o size=$SHMSIZE chaos-shm1 "$T/shm1" || { echo "chaos.sh: could not mount the tmpfs" >&2; exit 1; }
CK="$T/ckfs/run"
CSV="$T/metrics.csv"
export TS_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export TS_HEARTBEAT_TIMEOUT=$HB OMP_NUM_THREADS=1
K=$((3 * FAULTS + 3))
TRAIN=(train --model mlp --batch-size 16 --epochs 1000 --seed "$SEED" --quiet --threads 1 --timeout "$TIMEOUT"
       --max-steps "$STEPS" --checkpoint-every "$EVERY" --keep "$KEEP")
NETEM=0; host_qdisc_ok 1 netem delay 1ms && NETEM=1
now() { echo "$EPOCHREALTIME"; }
T_START=$(now)
echo "chaos.sh: namespaces ${HOSTS_PRE}h0, ${HOSTS_PRE}h1, ${HOSTS_PRE}sw; folder $T (all removed on exit)"
rel() { awk -v t="$1" -v s="$T_START" 'BEGIN { printf "%.1f", t - s }'; }
say() { echo "[$(rel "$(now)")s] $*"; }

# node_exec I CMD...: CMD on host I (its network and UTS namespaces) with its own /dev/shm ($T/shmI), in place
# of the calling (sub)shell: `node_exec I cmd &` makes $! the command's pid
node_exec() {
  local i=$1; shift
  exec ip netns exec "${HOSTS_PRE}h$i" unshare --uts --mount sh -c \
    'hostname "host$0" && mount --bind "$1" /dev/shm && shift && exec "$@"' "$i" "$T/shm$i" "$@"
}
# launch_node NAME I CKDIR [CSV]: node I's `tessera run` in the background (LPID[I]), its output timestamped
# (seconds since the epoch, then the line) into $T/NAME.nI.log
launch_node() {
  local name=$1 i=$2 dir=$3 csv=${4:-} fifo="$T/$1.n$2.fifo" extra=()
  [ -p "$fifo" ] || mkfifo "$fifo"
  perl -MTime::HiRes=time -ne 'BEGIN { $| = 1 } printf "%.3f %s", time, $_' < "$fifo" >> "$T/$name.n$i.log" &
  SPID[i]=$!
  [ -n "$csv" ] && [ "$i" = 0 ] && extra=(--metrics-csv "$csv")
  ( node_exec "$i" "$TS" run --nnodes 2 --node-rank "$i" -n 2 --grace 3 --max-restarts "$K" --master-addr "$A0" \
    --master-port "$PORT" --log-dir "$T/logs/$name.n$i" "$TS" "${TRAIN[@]}" --checkpoint-dir "$dir" "${extra[@]}" \
    > "$fifo" 2>&1 ) &
  LPID[i]=$!
}
alive() { kill -0 "${LPID[$1]}" 2> /dev/null; }
# reap I: the exit status of node I's launcher, which has ended
reap() { wait "${LPID[$1]}" 2> /dev/null; local rc=$?; LPID[$1]=0; return $rc; }
kill_nodes() {
  local i p
  for i in 0 1; do [ "${LPID[i]}" != 0 ] && kill -KILL "${LPID[i]}" 2> /dev/null; done
  for i in 0 1; do for p in $(host_pids "$i"); do kill -KILL "$p" 2> /dev/null; done; done
  for i in 0 1; do [ "${LPID[i]}" != 0 ] && { wait "${LPID[i]}" 2> /dev/null; LPID[i]=0; }; done
}
# newest_ckpt: the step of the newest checkpoint in the folder (0: none)
newest_ckpt() {
  local f
  f=$(ls "$CK" 2> /dev/null | grep -E '^step-[0-9]+\.ckpt$' | sort | tail -1)
  f=${f#step-}; f=${f%.ckpt}; f=$((10#${f:-0})); echo "$f"
}
cur_step() {
  local l
  l=$(tail -n 3 "$CSV" 2> /dev/null | grep -E '^[0-9]+,[0-9]' | tail -1)
  echo "${l%%,*}"
}
# rank_pid I L: the pid of node I's rank with LOCAL_RANK L, the newest when a restart overlaps two attempts,
# empty when there is none
rank_pid() {
  local p
  for p in $(ps --ppid "${LPID[$1]}" -o pid= --sort=-start_time 2> /dev/null); do
    tr '\0' '\n' 2> /dev/null < "/proc/$p/environ" | grep -qx "LOCAL_RANK=$2" && { echo "$p"; return; }
  done
}
# wait_rank I L SECONDS: rank_pid, waiting for the attempt's ranks to exist
wait_rank() {
  local p end=$(( SECONDS + $3 ))
  while [ $SECONDS -lt $end ]; do p=$(rank_pid "$1" "$2"); [ -n "$p" ] && { echo "$p"; return; }; sleep 0.05; done
}
fill() { dd if=/dev/zero of="$1" bs=64k oflag=append conv=notrunc status=none 2> /dev/null; true; } # until full
# fill_for FILE SECONDS: keeps the file system full (space freed meanwhile, by ranks that end, is taken again
# within 20 ms) for SECONDS, then removes FILE
# (FILLS: the loops, stopped with their files at the end of the fault's window)
FILLS=()
fill_for() {
  fill "$1"
  ( end=$(( ${EPOCHREALTIME/./} + $(awk -v d="$2" 'BEGIN { printf "%d", d * 1e6 }') ))
    while (( ${EPOCHREALTIME/./} < end )); do fill "$1"; sleep 0.02; done
    rm -f "$1" ) &
  FILLS+=("$!:$1")
}
stop_fills() {
  local f
  for f in "${FILLS[@]}"; do kill -KILL "${f%%:*}" 2> /dev/null; wait "${f%%:*}" 2> /dev/null; rm -f "${f#*:}"; done
  FILLS=()
}
# The hostile client: N connections held open (garbage on some, a 1 GiB length prefix on others, one byte on
# the rest), and a connect/send/close storm until SECONDS have passed.
flood() {
  ( node_exec 1 sh -c 'ulimit -n 8192 2>/dev/null; exec perl -e "$0" "$@"' '
    use IO::Socket::INET; use Time::HiRes qw(time sleep);
    my ($host, $port, $secs, $n) = @ARGV; my $end = time + $secs; my @s; srand(7);
    my $junk = join("", map { chr(int(rand(256))) } 1 .. 4096);
    for my $i (1 .. $n) {
      my $c = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Timeout => 1) or next;
      $c->blocking(0);
      syswrite($c, $i % 3 == 0 ? $junk : $i % 3 == 1 ? pack("N N", 0xffffffff, 0x40000000) . "x" x 64 : "G");
      push @s, $c;
    }
    while (time < $end) {
      my $c = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Timeout => 1);
      if ($c) { $c->blocking(0); syswrite($c, $junk); close($c) } else { sleep 0.01 }
    }' "$A0" "$PORT" "$1" "$2" > /dev/null 2>&1 ) &
}

# ---- the uninterrupted run ------------------------------------------------------------------------
say "uninterrupted run: 2 hosts x 2 ranks, mlp, $STEPS steps, seed $SEED (the reference)"
t0=$(now)
launch_node ref 0 "$T/ref"; launch_node ref 1 "$T/ref"
end=$((SECONDS + 60 + STEPS / 2))
while { alive 0 || alive 1; } && [ $SECONDS -lt $end ]; do sleep 0.2; done
REF_SECS=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
kill_nodes
REF="$T/ref/step-$(printf %012d "$STEPS").ckpt"
[ -f "$REF" ] || { echo "chaos.sh: the uninterrupted run did not finish: $(tail -5 "$T/ref.n0.log")" >&2; exit 1; }
say "uninterrupted: ${REF_SECS}s"

# ---- the run under faults ---------------------------------------------------------------------------
# Per fault (TSV, $T/faults.tsv): index, kind, detail, injected at, step then, verdict at, the verdict's line,
# progress at, recovered at, result
VERDICT_RE='tessera run:|error|has not been heard|stopped responding|timed out|warn|lost|could not|refused'
verdict_after() { # T0 [RE]: "time line" of the first line of either launcher at or after T0 naming a failure
  cat "$T/chaos.n0.log" "$T/chaos.n1.log" 2> /dev/null | awk -v t0="$1" -v re="${2:-$VERDICT_RE}" \
    '$1 >= t0 && tolower($0) ~ re' | sort -n -k1,1 | head -1
}
UNDO_AT=() UNDO=() # actions due later (SIGCONT, link up, ...) run by the wait loop
schedule_undo() { UNDO_AT+=("$(awk -v t="$(now)" -v d="$1" 'BEGIN { printf "%.3f", t + d }')"); UNDO+=("$2"); }
run_undos() { # FORCE: run every pending action, due or not
  local j t
  t=$(now)
  for j in "${!UNDO[@]}"; do
    if [ "${1:-}" = force ] || awk -v a="$t" -v b="${UNDO_AT[j]}" 'BEGIN { exit !(a >= b) }'; then
      eval "${UNDO[j]}"; unset 'UNDO[j]' 'UNDO_AT[j]'
    fi
  done
}
RELAUNCHES=0 SUPERVISED=0
start_job() { launch_node chaos 0 "$CK" "$CSV"; launch_node chaos 1 "$CK" "$CSV"; }
# supervise EXPECT_KILLED_NODE: restarts a launcher this fault killed (as its supervisor would); returns 1
# when the job is over (both launchers ended: FINISHED=1 when both ended with status 0) or a node failed
supervise() {
  local i rc
  for i in 0 1; do
    [ "${LPID[i]}" = 0 ] && continue
    alive "$i" && continue
    reap "$i"; rc=$?
    if [ "$1" = "$i" ] && [ $rc = 137 ]; then launch_node chaos "$i" "$CK" "$CSV"; SUPERVISED=$((SUPERVISED + 1)); continue; fi
    NODE_RC[i]=$rc
    [ $rc != 0 ] && { JOB_FAILED="node $i's tessera run exited with status $rc"; return 1; }
  done
  [ "${LPID[0]}" = 0 ] && [ "${LPID[1]}" = 0 ] && { FINISHED=1; return 1; }
  return 0
}
NODE_RC=(- -) FINISHED=0 JOB_FAILED=
: > "$T/faults.tsv"
say "run under faults: --max-restarts $K, --checkpoint-every $EVERY --keep $KEEP in a ${CKSIZE}-byte tmpfs," \
  "TS_HEARTBEAT_TIMEOUT=$HB, tessera train --timeout $TIMEOUT (bounds the rendezvous and every collective)"
T_CHAOS=$(now)
start_job
RECOVER_LIMIT=$((HB + 2 * TIMEOUT + 60))
GOAL=$((HB + 5)) # seconds a rank may wait for a verdict: the heartbeat timeout and a little (35 s by default) # seconds a fault may take to recover from before the job is relaunched
last_ok=0 # the step the previous recovery was confirmed at
for ((i = 0; i < FAULTS; i++)); do
  # wait for GAP steps of progress past the previous recovery (and a step to start from)
  end=$((SECONDS + RECOVER_LIMIT))
  while s=$(cur_step); [ "${s:-0}" -lt $((last_ok + F_GAP[i])) ] && [ $SECONDS -lt $end ]; do
    supervise - || break; run_undos; sleep 0.2
  done
  [ $FINISHED = 1 ] || [ -n "$JOB_FAILED" ] && break
  s0=$(cur_step); s0=${s0:-0}
  if [ "$s0" -ge $((STEPS - MARGIN - EVERY)) ]; then say "the run is nearly over at step $s0: no more faults"; break; fi
  kind=${F_KIND[i]} h=${F_HOST[i]} l=${F_LOCAL[i]} p=${F_DUR[i]} killed_node=- detail= vre=$VERDICT_RE
  r=$((2 * h + l))
  t_f=$(now)
  case $kind in
    kill-rank)
      pid=$(wait_rank "$h" "$l" 10); kill -KILL "$pid" 2> /dev/null; detail="rank $r (host$h) SIGKILL" ;;
    stop-rank)
      pid=$(wait_rank "$h" "$l" 10); kill -STOP "$pid" 2> /dev/null
      if [ "${F_VAR[i]}" = 0 ]; then
        d=$(dur 1 "$(awk -v h="$HB" 'BEGIN { print h * 0.6 }')" "$p"); schedule_undo "$d" "kill -CONT $pid 2>/dev/null"
        detail="rank $r (host$h) SIGSTOP, SIGCONT after ${d}s"
      else detail="rank $r (host$h) SIGSTOP, never continued"; fi ;;
    stop-at-rdzv)
      old=" $(rank_pid 0 0) $(rank_pid 0 1) $(rank_pid 1 0) $(rank_pid 1 1) "
      pid=$(wait_rank 1 0 10); kill -KILL "$pid" 2> /dev/null
      end2=$((SECONDS + 30)); pid=
      while [ $SECONDS -lt $end2 ]; do
        q=$(rank_pid "$h" "$l"); [ -n "$q" ] && [[ "$old" != *" $q "* ]] && { pid=$q; break; }; sleep 0.01
      done
      [ -n "$pid" ] && kill -STOP "$pid"
      t_f=$(now) # the fault measured is the stop: its verdict names the pid, or a timeout
      vre="pid $pid[^0-9]|timed out|has not been heard|stopped responding"
      detail="rank 2 killed, then rank $r (host$h) of the next attempt SIGSTOPped as it started" ;;
    kill-launcher)
      kill -KILL "${LPID[h]}"; killed_node=$h; detail="host$h's tessera run SIGKILL (restarted by the harness)" ;;
    stop-launcher)
      d=$(dur 2 20 "$p"); kill -STOP "${LPID[h]}"; schedule_undo "$d" "kill -CONT ${LPID[h]} 2>/dev/null"
      detail="host$h's tessera run SIGSTOP, SIGCONT after ${d}s" ;;
    link-cut)
      if [ "${F_VAR[i]}" = 0 ]; then d=$(dur 1 "$(awk -v h="$HB" 'BEGIN { print h * 0.5 }')" "$p")
      else d=$(dur "$((HB + 3))" "$((HB + 20))" "$p"); fi
      host_link "$h" down; schedule_undo "$d" "host_link $h up"; detail="host$h's cable cut for ${d}s" ;;
    link-slow)
      d=$(dur 3 15 "$p")
      if [ $NETEM = 1 ]; then
        ms=$((20 + p / 5)); host_netem "$h" "delay ${ms}ms"; schedule_undo "$d" "host_netem $h ''"
        detail="host$h's link delayed ${ms} ms (netem) for ${d}s"
      else
        rate=$((1 + p / 50))mbit; host_tbf "$h" "$rate"; schedule_undo "$d" "host_tbf $h ''"
        detail="host$h's link limited to $rate (tbf; no netem in this kernel) for ${d}s"
      fi ;;
    shm-full)
      d=$(dur 3 15 "$p"); fill_for "$T/shm$h/chaos-fill" "$d"; pid=$(wait_rank "$h" "$l" 10); kill -KILL "$pid" 2> /dev/null
      detail="host$h's /dev/shm full for ${d}s, rank $r SIGKILLed in it" ;;
    disk-full)
      d=$(dur 3 10 "$p"); fill_for "$T/ckfs/chaos-fill" "$d"
      detail="checkpoint file system full for ${d}s" ;;
    store-flood)
      d=$(dur 5 15 "$p"); flood "$d" 600
      if [ "${F_VAR[i]}" = 1 ]; then
        sleep 1; pid=$(wait_rank "$h" "$l" 10); kill -KILL "$pid" 2> /dev/null
        detail="600 connections + garbage at the store for ${d}s, rank $r SIGKILLed 1s in"
      else detail="600 connections + garbage at the store for ${d}s"; fi ;;
  esac
  # the step at the fault: read after it (a lookup before it can take a few steps' time on a busy machine)
  s0=$(cur_step); s0=${s0:-0}
  say "fault $((i + 1))/$FAULTS at step $s0: $kind: $detail"
  # wait for a verdict or progress (the wait), then for MARGIN steps past s0 (the recovery)
  t_v= line= t_p= t_r= result=
  end=$((SECONDS + RECOVER_LIMIT))
  while [ $SECONDS -lt $end ]; do
    run_undos
    if ! supervise "$killed_node"; then break; fi
    [ -z "$t_v" ] && { v=$(verdict_after "$t_f" "$vre"); [ -n "$v" ] && { t_v=${v%% *}; line=${v#* }; }; }
    s=$(cur_step); s=${s:-0}
    [ -z "$t_p" ] && [ "$s" -ge $((s0 + PROGRESS)) ] && t_p=$(now)
    c=$(newest_ckpt)
    [ "$c" -ge $((s0 + PROGRESS)) ] && [ "$s" -ge $((s0 + MARGIN)) ] && { t_r=$(now); last_ok=$s; break; }
    sleep 0.2
  done
  run_undos force; stop_fills
  [ -z "$t_v" ] && { v=$(verdict_after "$t_f" "$vre"); [ -n "$v" ] && { t_v=${v%% *}; line=${v#* }; }; }
  # the line shown: a rank's own error or warning, or the launcher's, when there is one (the first line is
  # often a rank's flight recorder)
  for re in 'tessera train: |stopped responding|tessera warn' '^[0-9.]+ tessera run: rank'; do
    [ -n "$t_v" ] && v=$(verdict_after "$t_f" "$re") && [ -n "$v" ] && { line=${v#* }; break; }
  done
  if [ -n "$t_r" ]; then result=survived
  elif [ $FINISHED = 1 ]; then result=survived; t_r=$(now)
  else
    result="not survived: ${JOB_FAILED:-no progress for ${RECOVER_LIMIT}s}"
    say "$result: the harness starts the job again"
    kill_nodes; rm -f "$T/ckfs/chaos-fill" "$T/shm0/chaos-fill" "$T/shm1/chaos-fill"
    JOB_FAILED= NODE_RC=(- -); RELAUNCHES=$((RELAUNCHES + 1)); start_job; last_ok=$(cur_step); last_ok=${last_ok:-0}
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$((i + 1))" "$kind" "$detail" "$t_f" "$s0" "${t_v:--}" \
    "${line:--}" "${t_p:--}" "${t_r:--}" "$result" >> "$T/faults.tsv"
  say "  -> $result${t_v:+; verdict after $(awk -v a="$t_f" -v b="$t_v" 'BEGIN { printf "%.1f", b - a }')s: ${line:0:150}}"
done
# let the run finish
end=$((SECONDS + 120 + STEPS / 5))
while [ $FINISHED = 0 ] && [ $SECONDS -lt $end ]; do
  supervise - || { [ $FINISHED = 1 ] && break; say "the job failed after the faults: $JOB_FAILED: starting it again"
    kill_nodes; JOB_FAILED=; RELAUNCHES=$((RELAUNCHES + 1)); start_job; }
  sleep 0.2
done
CHAOS_SECS=$(awk -v a="$T_CHAOS" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
[ $FINISHED = 1 ] || say "the run did not finish within the limit"
kill_nodes

# ---- the figures ---------------------------------------------------------------------------------------
FINAL="$CK/step-$(printf %012d "$STEPS").ckpt"
if [ -f "$FINAL" ] && "$TS" ckpt diff "$REF" "$FINAL" --tol 0 > "$T/diff.log" 2>&1; then PARAMS="equal (ckpt diff --tol 0)"; PARAMS_OK=1
elif [ -f "$FINAL" ]; then PARAMS="DIFFERENT: $(grep -m1 -i 'differ\|max' "$T/diff.log")"; PARAMS_OK=0
else PARAMS="no final checkpoint (the run did not finish)"; PARAMS_OK=0; fi
# checkpoints: every step rank 0 reported saved is either in the folder and loads, or older than the newest
# KEEP saved (pruned by --keep by design); every resume took the newest checkpoint reported saved before it
grep -h 'saved checkpoint to ' "$T/chaos.n0.log" | sed -E 's/^([0-9.]+) .*step-0*([0-9]+)\.ckpt.*/\1 \2/' > "$T/saves"
grep -h 'resumed from ' "$T/chaos.n0.log" | grep '\[rank 0\]' | sed -E 's/^([0-9.]+) .*step-0*([0-9]+)\.ckpt.*/\1 \2/' > "$T/resumes"
SAVED=$(awk '{ print $2 }' "$T/saves" | sort -un | wc -l)
LOST=0 LOST_WHY=
for s in $(awk '{ print $2 }' "$T/saves" | sort -un | tail -n "$KEEP"); do
  f="$CK/step-$(printf %012d "$s").ckpt"
  if [ ! -f "$f" ]; then LOST=$((LOST + 1)); LOST_WHY+=" step $s missing;"
  elif ! "$TS" ckpt show "$f" > /dev/null 2>&1; then LOST=$((LOST + 1)); LOST_WHY+=" step $s does not load;"; fi
done
while read -r t s; do
  newest=$(awk -v t="$t" '$1 < t { print $2 }' "$T/saves" | sort -n | tail -1)
  if [ -n "$newest" ] && [ "$s" -lt "$newest" ]; then LOST=$((LOST + 1)); LOST_WHY+=" a restart resumed from step $s, not $newest;"; fi
done < "$T/resumes"
STRAY=$(ls -A "$CK" 2> /dev/null | grep -v -E '^step-[0-9]+\.ckpt$' | tr '\n' ' ')
RESTARTS=$(cat "$T/chaos.n0.log" "$T/chaos.n1.log" | grep -c 'restarting all')
LOST_TIME=$(awk -v a="$CHAOS_SECS" -v b="$REF_SECS" 'BEGIN { printf "%.1f", a - b }')

# per fault: the wait (to a verdict or to progress, whichever came first), the recovery
awk -F'\t' -v OFS='\t' '{
    w = "-"; src = ""
    if ($6 != "-") { w = $6 - $4; src = "verdict" }
    if ($8 != "-" && (w == "-" || $8 - $4 < w)) { w = $8 - $4; src = "progress" }
    if (w == "-" && $9 != "-") { w = $9 - $4; src = "progress" }
    if (w == "-") { src = "none" }
    rec = $9 != "-" ? sprintf("%.1f", $9 - $4) : "-"
    print $0, (w == "-" ? "-" : sprintf("%.1f", w)), src, rec
  }' "$T/faults.tsv" > "$T/faults2.tsv"
# restarts between a fault and the next one
cut -f4 "$T/faults2.tsv" > "$T/fault_times"
cat "$T/chaos.n0.log" "$T/chaos.n1.log" | grep 'restarting all' | awk '{ print $1 }' | sort -n > "$T/restart_times"

echo
echo "== chaos: $(date -u +%Y-%m-%d), seed $SEED, $FAULTS faults drawn from: ${KIND_LIST[*]}"
echo "   2 hosts x 2 ranks (network/UTS/mount namespaces), tessera train --model mlp --max-steps $STEPS"
echo "   --checkpoint-every $EVERY --keep $KEEP --timeout $TIMEOUT, tessera run --max-restarts $K, TS_HEARTBEAT_TIMEOUT=$HB"
echo
printf '%-3s %-8s %-14s %-72s %-9s %-9s %-8s %s\n' "#" "step" "kind" "fault" "wait(s)" "recov(s)" "restarts" "result"
n_inj=0 n_surv=0 worst=0 worst_f=-
declare -A INJ SURV
while IFS=$'\t' read -r idx kind detail tf s0 tv line tp tr result w src rec; do
  # a recovery that needed more than the wait goal was a hang that --timeout happened to end
  if [ "$result" = survived ] && [ "$w" != - ] && awk -v a="$w" -v g="$GOAL" 'BEGIN { exit !(a > g) }'; then
    result="not survived: ${w}s without a verdict (goal <= ${GOAL}s); --timeout $TIMEOUT ended it"
  fi
  nxt=$(awk -v i="$idx" 'NR == i + 1' "$T/fault_times"); nxt=${nxt:-9e18}
  rs=$(awk -v a="$tf" -v b="$nxt" '$1 >= a && $1 < b' "$T/restart_times" | wc -l)
  printf '%-3s %-8s %-14s %-72s %-9s %-9s %-8s %s\n' "$idx" "$s0" "$kind" "${detail:0:72}" "$w${src:+ }${src:0:1}" "$rec" "$rs" "$result"
  [ "$line" != - ] && printf '    verdict: %s\n' "${line:0:160}"
  n_inj=$((n_inj + 1)); INJ[$kind]=$(( ${INJ[$kind]:-0} + 1 ))
  printf '%s\t%s\n' "$idx" "$result" >> "$T/results"
  [ "$result" = survived ] && { n_surv=$((n_surv + 1)); SURV[$kind]=$(( ${SURV[$kind]:-0} + 1 )); }
  if [ "$w" != - ] && awk -v a="$w" -v b="$worst" 'BEGIN { exit !(a > b) }'; then worst=$w; worst_f="#$idx $kind"; fi
  if [ "$w" = - ]; then worst=">$RECOVER_LIMIT"; worst_f="#$idx $kind (no verdict, no progress)"; fi
done < "$T/faults2.tsv"
echo "    (wait: from the fault to the first launcher line naming a failure (v) or to progress resuming (p))"
echo
printf '%-16s %9s %9s\n' "kind" "injected" "survived"
for k in $ALL_KINDS; do
  [ -n "${INJ[$k]:-}" ] && printf '%-16s %9s %9s\n' "$k" "${INJ[$k]}" "${SURV[$k]:-0}"
done
printf '%-16s %9s %9s\n' "all" "$n_inj" "$n_surv"
echo
echo "restarts (node launchers' 'restarting all')  $RESTARTS; launchers started again by the harness: $SUPERVISED; whole-job relaunches: $RELAUNCHES"
echo "time lost                                    ${LOST_TIME}s (${CHAOS_SECS}s under faults, ${REF_SECS}s uninterrupted)"
echo "checkpoints lost                             $LOST (of $SAVED steps reported saved; --keep $KEEP prunes the rest by design)${LOST_WHY:+:$LOST_WHY}"
[ -n "$STRAY" ] && echo "stray files in the checkpoint folder         $STRAY"
echo "final parameters vs uninterrupted            $PARAMS"
echo "longest wait without a verdict               ${worst}s ($worst_f; goal <= ${GOAL}s, the heartbeat timeout + 5 s; bounded here by --timeout $TIMEOUT)"
if [ -n "$JSON" ]; then
  {
    printf '{"date":"%s","seed":%s,"faults":%s,"steps":%s,"heartbeat_timeout":%s,"timeout":%s,' "$(date -u +%F)" "$SEED" "$FAULTS" "$STEPS" "$HB" "$TIMEOUT"
    printf '"injected":%s,"survived":%s,"restarts":%s,"relaunches":%s,"time_lost_s":%s,"checkpoints_lost":%s,' "$n_inj" "$n_surv" "$RESTARTS" "$RELAUNCHES" "$LOST_TIME" "$LOST"
    printf '"params_equal":%s,"longest_wait_s":"%s","per_fault":[' "$([ $PARAMS_OK = 1 ] && echo true || echo false)" "$worst"
    awk -F'\t' 'NR == FNR { r[$1] = $2; next } { $10 = r[$1]; gsub(/"/, "\\\"", $3); gsub(/"/, "\\\"", $10); printf "%s{\"kind\":\"%s\",\"fault\":\"%s\",\"wait_s\":\"%s\",\"recovered_s\":\"%s\",\"result\":\"%s\"}", (FNR > 1 ? "," : ""), $2, $3, $11, $13, $10 }' "$T/results" "$T/faults2.tsv"
    printf ']}\n'
  } > "$JSON"
fi
[ "$n_surv" = "$n_inj" ] && [ "$LOST" = 0 ] && [ "$PARAMS_OK" = 1 ] && [ $FINISHED = 1 ]
