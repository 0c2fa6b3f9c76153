#!/usr/bin/env bash
# tests/cli_liveness.sh — a rank that is stopped (SIGSTOP), not dead, in the middle of DDP
# training under `tessera run`: the other ranks fail within the heartbeat timeout (not the
# collective timeout, 600 s here), and the launcher names the stopped rank and the collective
# the others waited in, SIGKILLs it and leaves no process and no run directory behind. Trials:
# 2 ranks with rank 1 stopped by the test, 3 ranks with rank 0 (the store's host) stopped,
# 3 ranks with rank 2 stopping itself (kill -STOP $$ from its wrapper), and one trial at the
# default heartbeat timeout (30 s; TS_TEST_QUICK=1 skips it). With heartbeats off the launcher
# still names a stopped rank once the collective timeout ends the others (it reads /proc). A
# rank stopped for less than the heartbeat timeout and continued (SIGCONT) must not fail anything.
set -u
TS=${1:?usage: cli_liveness.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
T=$(mktemp -d)
mkdir -p "$T/tmp"
lp=
# kills, by pid, what this script started that may still be there
cleanup() {
  local f
  [ -n "$lp" ] && kill -KILL "$lp" 2>/dev/null
  for f in "$T"/pid.*; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/testlib.sh"
now()  { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
lt()   { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a < b)}'; }

# Each rank records its pid, then becomes the trainer (exec: the same pid). STOP_RANK and
# STOP_AFTER make that rank stop itself STOP_AFTER seconds after it started.
cat > "$T/rank.sh" <<EOS
#!/bin/sh
echo \$\$ > "$T/pid.\$RANK"
if [ -n "\${STOP_AFTER:-}" ] && [ "\$RANK" = "\$STOP_RANK" ]; then (sleep "\$STOP_AFTER"; kill -STOP \$\$) & fi
exec "$TS" train --model cnn --batch-size 32 --seed 1 --quiet --timeout 600 "\$@"
EOS
chmod +x "$T/rank.sh"

# start_run WORLD ARGS...: the launcher in the background ($lp), output in $T/out and $T/err
start_run() {
  local world=$1; shift
  rm -f "$T"/pid.* "$T/out" "$T/err"
  TMPDIR="$T/tmp" "$TS" run -n "$world" --grace 5 "$T/rank.sh" "$@" > "$T/out" 2> "$T/err" &
  lp=$!
}
# wait_training: until rank 0 announces training (60 s at most)
wait_training() {
  for _ in $(seq 600); do grep -q "training cnn" "$T/out" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# wait_launcher SECONDS: waits for the launcher; kills it (and fails) after SECONDS. Sets rc.
wait_launcher() {
  local deadline=$(( SECONDS + $1 ))
  while kill -0 "$lp" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "$lp" 2>/dev/null; then
    bad "the launcher still runs $1 s later: $(tail -5 "$T/err")"
    kill -KILL "$lp"
  fi
  wait "$lp"; rc=$?
  lp=
}
# check_verdict NAME STOPPED_RANK HB_TIMEOUT T0: the launcher's verdict on a stopped rank
check_verdict() {
  local name=$1 stopped=$2 hb=$3 t0=$4 dt pid f
  dt=$(since "$t0")
  pid=$(cat "$T/pid.$stopped")
  [ "$rc" -ne 0 ] && ok "$name: launcher exited $rc" || bad "$name: launcher exited 0"
  if grep -qE "^tessera run: rank $stopped \(pid $pid on [^)]+\) stopped responding: rank [0-9]+ (waited for it|failed) in collective #[0-9]+ [a-z_]+ " "$T/err"; then
    ok "$name: $(grep -m1 'stopped responding' "$T/err" | cut -c1-220)..."
  else
    bad "$name: no verdict naming rank $stopped and a collective: $(grep '^tessera run' "$T/err")"
  fi
  grep -q "it is stopped (SIGSTOP" "$T/err" && ok "$name: says it is stopped" || bad "$name: does not say rank $stopped is stopped: $(grep '^tessera run' "$T/err")"
  grep -qF "killing rank $stopped (pid $pid, SIGKILL)" "$T/err" && ok "$name: kills it" || bad "$name: does not kill rank $stopped"
  if grep -qE "tessera run: rank [0-9]+ \(pid [0-9]+\) exited with status 1 after waiting for rank $stopped$" "$T/err"; then
    ok "$name: the survivor's exit is put down to rank $stopped"
  else
    bad "$name: exit line: $(grep '^tessera run' "$T/err")"
  fi
  # survivors fail at the heartbeat timeout, not before and not at the collective timeout (600 s)
  if lt "$(awk -v h="$hb" 'BEGIN{print h * 0.8}')" "$dt" && lt "$dt" "$(awk -v h="$hb" 'BEGIN{print h + 10}')"; then
    ok "$name: over in $dt s after the stop (heartbeat timeout $hb s)"
  else
    bad "$name: over in $dt s after the stop (heartbeat timeout $hb s)"
  fi
  for f in "$T"/pid.*; do
    if kill -0 "$(cat "$f")" 2>/dev/null; then bad "$name: ${f##*/} ($(cat "$f")) is still there"; kill -KILL "$(cat "$f")"; fi
  done
  [ -z "$(ls -A "$T/tmp")" ] && ok "$name: nothing left behind" || bad "$name: left in TMPDIR: $(ls -A "$T/tmp")"
  rm -rf "${T:?}"/tmp/*
}

# trial_stop NAME WORLD STOPPED HB [ENV]: the test stops rank STOPPED once training runs; the
# heartbeat timeout is HB seconds, set as TS_HEARTBEAT_TIMEOUT=ENV (default: HB; "": the default)
trial_stop() {
  local name=$1 world=$2 stopped=$3 hb=$4 env=${5-$4} t0
  TS_HEARTBEAT_TIMEOUT=$env start_run "$world" --epochs 50
  if ! wait_training; then bad "$name: training did not start: $(tail -5 "$T/err")"; wait_launcher 1; return; fi
  sleep 1
  t0=$(now)
  kill -STOP "$(cat "$T/pid.$stopped")"
  wait_launcher $((hb + 30))
  check_verdict "$name" "$stopped" "$hb" "$t0"
}

trial_stop "2 ranks, rank 1 stopped" 2 1 3
trial_stop "3 ranks, rank 0 stopped" 3 0 3

# rank 2 stops itself (kill -STOP $$ in its wrapper) 8 s after it started
t0=$(now)
STOP_RANK=2 STOP_AFTER=8 TS_HEARTBEAT_TIMEOUT=3 start_run 3 --epochs 50
wait_launcher 45
check_verdict "3 ranks, rank 2 stops itself" 2 3 "$(awk -v t="$t0" 'BEGIN{printf "%.3f", t + 8}')"

# heartbeats off: rank 0's collective times out (--timeout 4) and the launcher finds rank 1 stopped in /proc
TS_HEARTBEAT_TIMEOUT=0 start_run 2 --epochs 50 --timeout 4
if wait_training; then
  sleep 1
  p=$(cat "$T/pid.1")
  t0=$(now)
  kill -STOP "$p"
  wait_launcher 40
  dt=$(since "$t0")
  if grep -qE "^tessera run: rank 1 \(pid $p\) is stopped \(SIGSTOP or job control\); rank 0 failed in collective #[0-9]+ " "$T/err" \
     && grep -qF "killing rank 1 (pid $p, SIGKILL)" "$T/err" && [ "$rc" -ne 0 ]; then
    ok "heartbeats off: $(grep -m1 'is stopped' "$T/err" | cut -c1-160)... (${dt} s)"
  else
    bad "heartbeats off: $(grep '^tessera run' "$T/err")"
  fi
  lt "$dt" 20 || bad "heartbeats off: over in $dt s after the stop (collective timeout 4 s)"
  kill -0 "$p" 2>/dev/null && bad "heartbeats off: rank 1 is still there"
else
  bad "heartbeats off: training did not start: $(tail -5 "$T/err")"; wait_launcher 1
fi

# a stall shorter than the heartbeat timeout is not a failure: stop rank 1 for 1.5 s of 4
TS_HEARTBEAT_TIMEOUT=4 start_run 2 --epochs 1 --max-steps 200
if wait_training; then
  sleep 0.5
  p=$(cat "$T/pid.1")
  kill -STOP "$p"; sleep 1.5; kill -CONT "$p"
  wait_launcher 120
  [ "$rc" -eq 0 ] && grep -q "^\[rank 0\] done: 200 steps" "$T/out" && ok "a 1.5 s stall (heartbeat timeout 4 s): training completes" \
    || bad "a 1.5 s stall failed the run ($rc): $(grep -v '^\[rank 0\]   ' "$T/err" | tail -8)"
else
  bad "short stall: training did not start: $(tail -5 "$T/err")"; wait_launcher 1
fi

# the default heartbeat timeout (30 s): named within 45 s
if [ "${TS_TEST_QUICK:-0}" != 1 ]; then
  trial_stop "default settings, rank 1 of 2 stopped" 2 1 30 ""
fi

cli_summary
