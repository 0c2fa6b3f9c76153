#!/usr/bin/env bash
# tests/cli_launch.sh — what `tessera run` gives each rank and how it ends them:
#   1. every rank's share of the CPUs (OMP_NUM_THREADS = CPUs / N, OMP_WAIT_POLICY=passive) unless the
#      user set them; `tessera train --nproc 2` reports the share, and --threads or OMP_NUM_THREADS win;
#   2. `timeout` (SIGTERM to the launcher, twice): forwarded once; ranks that clean up on SIGTERM
#      finish and are said to have ended by themselves, nobody is SIGKILLed; exit 124 (timeout's);
#   3. --log-dir: each rank's output, unprefixed, in DIR/attempt_<A>/rank_<R>.log;
#   4. in a terminal (script(1) gives a pty), `tessera train --nproc 2`'s progress bar redraws in
#      place ('\r' then the rank's prefix again), and its last draw comes before the epoch summary;
#   5. a rank stopped before its heartbeats run (SIGSTOP in its first moments) ends the job after the heartbeat
#      timeout + 3 s, named and killed, instead of holding the others until the rendezvous timeout;
#   6. a rank's `setsid` children (outside its process group) end with the launcher: normally, after a
#      failure, after a signal.
# The library's side (a rank's line reaching the output while it runs, the redraw rules, SIGTERM's
# grace) is tests/test_launch.c. Time checks only catch hangs.
set -u
TS=${1:?usage: cli_launch.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
T=$(mktemp -d)
ID="$$$RANDOM"
MARK="30.$ID"
kill_marked() { local p; for p in $(pgrep -f -- "$MARK"); do kill -KILL "$p" 2>/dev/null; done; }
trap 'kill_marked; rm -rf "$T"' EXIT
. "$(dirname "$0")/testlib.sh"
for v in $(env | grep -o -E '^(SLURM_|OMPI_COMM_|PMI_|PMIX_|TORCHELASTIC_)[A-Z_]*'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT TS_LAUNCHED_BY OMP_NUM_THREADS OMP_WAIT_POLICY

cpus=$(nproc)
share=$(( cpus / 2 > 0 ? cpus / 2 : 1 ))

# ---- 1. the CPU share --------------------------------------------------------------------------
out=$("$TS" run -n 2 sh -c 'echo "$OMP_NUM_THREADS/$OMP_WAIT_POLICY"' 2>&1)
[ "$(grep -c "^\[rank [01]\] $share/passive$" <<<"$out")" = 2 ] && ok "each rank gets $share threads, passive waiting" \
  || bad "default share ($cpus CPUs): $out"
out=$(OMP_NUM_THREADS=3 OMP_WAIT_POLICY=active "$TS" run -n 2 sh -c 'echo "$OMP_NUM_THREADS/$OMP_WAIT_POLICY"' 2>&1)
[ "$(grep -c '^\[rank [01]\] 3/active$' <<<"$out")" = 2 ] && ok "the user's OMP_NUM_THREADS and OMP_WAIT_POLICY win" \
  || bad "user's settings: $out"
if [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  train=(train --model mlp --max-steps 1 --epochs 1 --quiet --timeout 120)
  out=$("$TS" "${train[@]}" --nproc 2 2>&1)
  grep -q ", $share threads per rank" <<<"$out" && ok "tessera train --nproc 2: $share threads per rank" \
    || bad "train's share: $out"
  out=$("$TS" "${train[@]}" --nproc 2 --threads 3 2>&1)
  grep -q ", 3 threads per rank" <<<"$out" && ok "--threads 3 wins" || bad "--threads 3: $out"
  out=$(OMP_NUM_THREADS=3 "$TS" "${train[@]}" --nproc 2 2>&1)
  grep -q ", 3 threads per rank" <<<"$out" && ok "OMP_NUM_THREADS=3 wins" || bad "OMP_NUM_THREADS=3: $out"
else
  echo "skip: tessera train's share (no $DATA)"
fi

# ---- 2. timeout -------------------------------------------------------------------------------
if command -v timeout >/dev/null; then
  SECONDS=0
  timeout -s TERM 2 "$TS" run -n 2 --grace 60 sh -c \
    'trap "sleep 0.5; echo bye \$RANK; exit 0" TERM; sleep '"$MARK"' & wait' > "$T/to.out" 2>&1
  rc=$?; took=$SECONDS
  [ $rc -eq 124 ] && ok "timeout: exit 124" || bad "timeout: exit $rc: $(cat "$T/to.out")"
  [ "$took" -lt 30 ] && ok "timeout: the ranks ended by themselves in ${took}s" || bad "timeout took ${took}s"
  grep -qx '\[rank 0\] bye 0' "$T/to.out" && grep -qx '\[rank 1\] bye 1' "$T/to.out" \
    && ok "timeout: both ranks finished their cleanup" || bad "timeout: cleanup cut short: $(cat "$T/to.out")"
  grep -q "got SIGTERM; forwarding it to the ranks" "$T/to.out" && ok "timeout: the signal is forwarded" \
    || bad "timeout: no forwarding message: $(cat "$T/to.out")"
  grep -q "after SIGTERM: ranks 0 (status 0), 1 (status 0) ended by themselves$" "$T/to.out" \
    && ok "timeout: says how the ranks ended" || bad "timeout: outcome: $(cat "$T/to.out")"
  grep -q "sending SIGKILL\|killing\|killed" "$T/to.out" && bad "timeout: something was killed: $(cat "$T/to.out")" \
    || ok "timeout: nothing killed"
else
  echo "skip: timeout (no timeout(1))"
fi
# the same with the second SIGTERM well after the first (a pending signal cannot absorb it)
"$TS" run -n 2 --grace 60 sh -c 'trap "sleep 1; echo bye \$RANK; exit 0" TERM; sleep '"$MARK"' & wait' > "$T/tt.out" 2>&1 &
lp=$!
for _ in $(seq 100); do [ "$(pgrep -fc -- "^sleep $MARK")" -ge 2 ] && break; sleep 0.1; done
kill -TERM "$lp"; sleep 0.3; kill -TERM "$lp"
wait "$lp"; rc=$?
[ $rc -eq 143 ] && grep -qx '\[rank 0\] bye 0' "$T/tt.out" && grep -qx '\[rank 1\] bye 1' "$T/tt.out" \
  && ! grep -q "killed\|killing" "$T/tt.out" && ok "a second SIGTERM leaves the grace period alone (exit 143)" \
  || bad "second SIGTERM: exit $rc: $(cat "$T/tt.out")"

# ---- 3. --log-dir -------------------------------------------------------------------------------
"$TS" run -n 2 --log-dir "$T/logs" sh -c 'echo out $RANK; echo err $RANK >&2' > "$T/ld.out" 2>&1
for r in 0 1; do
  f="$T/logs/attempt_0/rank_$r.log"
  grep -qx "out $r" "$f" 2>/dev/null && grep -qx "err $r" "$f" && ok "--log-dir: rank $r's file, unprefixed" \
    || bad "--log-dir rank $r: $(cat "$f" 2>&1)"
done
grep -qx '\[rank 1\] out 1' "$T/ld.out" && ok "--log-dir: the console still gets the lines" || bad "console: $(cat "$T/ld.out")"

# ---- 4. the progress bar on a terminal ----------------------------------------------------------------
if command -v script >/dev/null && [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  script -qfec "'$TS' train --model mlp --max-steps 20 --epochs 1 --nproc 2 --timeout 120" "$T/tty.out" > /dev/null 2>&1
  if grep -q $'\r\[rank 0\] epoch 1/1 \[' "$T/tty.out"; then ok "the bar redraws in place under --nproc"
  else bad "no redraw: $(od -c "$T/tty.out" | head -20)"; fi
  last_bar=$(grep -b -o $'\r\[rank 0\] epoch 1/1 \[' "$T/tty.out" | tail -1 | cut -d: -f1)
  summary=$(grep -b -o '\[rank 0\] epoch 1/1: train loss' "$T/tty.out" | head -1 | cut -d: -f1)
  [ -n "$last_bar" ] && [ -n "$summary" ] && [ "$last_bar" -lt "$summary" ] \
    && ok "the bar's last draw comes before the epoch summary" || bad "order: bar at ${last_bar:-?}, summary at ${summary:-?}"
else
  echo "skip: the progress bar on a terminal (no script(1) or no $DATA)"
fi

# ---- 5. a rank stopped in its first moments (before any heartbeat): the launcher names it ----------
# rank 1 stops itself at once; rank 0 waits as a rank in the rendezvous would. With a heartbeat timeout
# of 2 s the launcher fails the job after 5 s stopped (2 s + 3 s), not at the rendezvous timeout (1800 s).
SECONDS=0
TS_HEARTBEAT_TIMEOUT=2 timeout 120 "$TS" run -n 2 --grace 2 sh -c \
  'if [ "$RANK" = 1 ]; then echo $$ > '"$T"'/stopped.pid; kill -STOP $$; fi; sleep '"$MARK" > "$T/st.out" 2>&1
rc=$?; took=$SECONDS
sp=$(cat "$T/stopped.pid" 2>/dev/null)
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qE "rank 1 \(pid $sp\) has been stopped \(SIGSTOP or job control\) for [0-9.]+ s" "$T/st.out" \
   && grep -qF "killing rank 1 (pid $sp, SIGKILL)" "$T/st.out"; then
  ok "a rank stopped before its heartbeats: named and killed in ${took}s (exit $rc)"
else
  bad "a rank stopped early: exit $rc after ${took}s: $(cat "$T/st.out")"
fi
[ "$took" -lt 60 ] || bad "a rank stopped early: the job took ${took}s"
[ -n "$sp" ] && kill -0 "$sp" 2>/dev/null && { bad "the stopped rank ($sp) is still there"; kill -KILL "$sp"; }

# ---- 6. descendants that left their rank's process group (setsid) end with the launcher ----------------
# each rank starts `setsid sleep &` (its own session: signals to the rank's group miss it); after a normal
# end, a failure, and a signal to the launcher, none of them is left running
for how in normal failure signal; do
  rm -f "$T"/grand.*
  # the rank goes on once its child is in a session of its own (else a group kill could reach it first)
  script='setsid sleep '"$MARK"' < /dev/null > /dev/null 2>&1 & g=$!; echo $g > '"$T"'/grand.$RANK; '\
'for i in $(seq 200); do [ "$(cut -d" " -f6 /proc/$g/stat 2>/dev/null)" = "$g" ] && break; sleep 0.02; done; '
  case $how in
    normal) "$TS" run -n 2 sh -c "$script"' exit 0' > "$T/gc.out" 2>&1 ;;
    failure) "$TS" run -n 2 --grace 2 sh -c "$script"' [ "$RANK" = 1 ] && exit 3; sleep '"$MARK" > "$T/gc.out" 2>&1 ;;
    signal)
      "$TS" run -n 2 --grace 2 sh -c "$script"' sleep '"$MARK" > "$T/gc.out" 2>&1 &
      lp=$!
      for _ in $(seq 100); do [ -s "$T/grand.0" ] && [ -s "$T/grand.1" ] && break; sleep 0.1; done
      sleep 0.2; kill -TERM "$lp"; wait "$lp" ;;
  esac
  left=""
  for r in 0 1; do
    g=$(cat "$T/grand.$r" 2>/dev/null)
    [ -n "$g" ] || { bad "setsid grandchildren ($how): rank $r did not start one: $(cat "$T/gc.out")"; continue; }
    if kill -0 "$g" 2>/dev/null; then left+="$g "; kill -KILL "$g"; fi
  done
  [ -z "$left" ] && ok "setsid grandchildren ($how): none left after the launcher exits" \
    || bad "setsid grandchildren ($how): still running: $left; $(cat "$T/gc.out")"
  # exactly the two setsid children are named: a rank's own children still finishing the group's signal are not
  if grep -q "ended 2 processes the ranks left running outside their process groups" "$T/gc.out"; then
    ok "setsid grandchildren ($how): the launcher says it ended them"
  else bad "setsid grandchildren ($how): no message: $(cat "$T/gc.out")"; fi
done

cli_summary
