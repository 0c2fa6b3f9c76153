#!/usr/bin/env bash
# tests/cli_run.sh — `tessera run`, the launcher: the environment each rank
# sees, "[rank R] " prefixes on stdout and stderr, multi-node rank numbering,
# a failing or signalled rank stopping the others (exit status, message, no
# hang), SIGTERM / double SIGINT to the launcher leaving no process behind,
# --grace escalating to SIGKILL, and usage errors (exit 2).
#
# Time checks use bash's SECONDS and generous bounds: they catch hangs (the
# other ranks sleep 30 s), they are not benchmarks.
set -u
TS=${1:?usage: cli_run.sh path/to/tessera}
command -v pgrep >/dev/null || { echo "skip: no pgrep"; exit 77; }
T=$(mktemp -d)
ID="$$$RANDOM"
MARK="30.$ID" # unique in the process table: the ranks run sleep "$MARK" (30.something seconds)
# kills, by pid, whatever this script started that is still there
kill_marked() { local p; for p in $(pgrep -f -- "$MARK"); do kill -KILL "$p" 2>/dev/null; done; }
cleanup() { kill_marked; rm -rf "$T"; }
trap cleanup EXIT
. "$(dirname "$0")/testlib.sh"

# expect_exit CODE NEEDLE CMD...: exit status CODE and stderr+stdout mentioning NEEDLE
# no process carrying the marker may be left
no_leftovers() {
  local left
  left=$(pgrep -af -- "$MARK")
  if [ -n "$left" ]; then bad "$1: processes left behind: $left"; kill_marked; else ok "$1: nothing left behind"; fi
}
# wait_for_ranks N: until N sleeps with the marker run (5 s at most)
wait_for_ranks() {
  for _ in $(seq 50); do
    [ "$(pgrep -fc -- "^sleep $MARK")" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

# ---- usage -------------------------------------------------------------------------
expect_exit 0 "--master-port" "$TS" run --help
expect_exit 0 "launch N processes" "$TS" --help
expect_exit 2 "missing PROGRAM" "$TS" run
expect_exit 2 "missing PROGRAM" "$TS" run -n 2
expect_exit 2 "unknown flag '--bogus'" "$TS" run --bogus true
expect_exit 2 "unknown flag '-x'" "$TS" run -x true
expect_exit 2 "-n must be in [1, 1024], got 0" "$TS" run -n 0 true
expect_exit 2 "-n expects an integer, got 'two'" "$TS" run -n two true
expect_exit 2 "--grace expects a number" "$TS" run --grace soon true
expect_exit 2 "--nnodes needs a value" "$TS" run --nnodes
expect_exit 2 "--master-port is required" "$TS" run -n 2 --nnodes 2 true
expect_exit 2 "--node-rank 2 must be less than --nnodes 2" "$TS" run --nnodes 2 --node-rank 2 --master-port 29500 true
expect_exit 2 "--master-port must be in" "$TS" run --master-port 70000 true
expect_exit 2 "cannot run 'no-such-program-$ID': not found on PATH" "$TS" run -n 2 "no-such-program-$ID"
expect_exit 2 "cannot run '$T/nothing'" "$TS" run -n 2 "$T/nothing"
printf '#!/bin/sh\necho hi\n' > "$T/noexec.sh"
expect_exit 2 "cannot run '$T/noexec.sh': not executable" "$TS" run "$T/noexec.sh"
expect_exit 2 "is a directory" "$TS" run "$T"
# exec failing in the child anyway (an interpreter that is not there): 127, naming program and rank
printf '#!/no/such/interpreter\n' > "$T/badinterp"; chmod +x "$T/badinterp"
expect_exit 127 "rank 0: cannot run '$T/badinterp'" "$TS" run "$T/badinterp"

# ---- environment ---------------------------------------------------------------------
ENVS='echo "$RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$MASTER_ADDR/$MASTER_PORT/$GROUP_RANK/$TS_LAUNCHED_BY"'
if "$TS" run -n 3 sh -c "$ENVS" > "$T/env.out" 2> "$T/env.err"; then ok "run -n 3 exits 0"; else bad "run -n 3: $(cat "$T/env.err")"; fi
port=$(sed -n 's|^\[rank 0\] 0/3/0/3/127\.0\.0\.1/\([0-9]*\)/0/tessera-run$|\1|p' "$T/env.out")
if [ -n "$port" ] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ]; then ok "rank 0 environment (free port $port)"; else bad "rank 0 environment: $(cat "$T/env.out")"; fi
for r in 0 1 2; do
  grep -qx "\[rank $r\] $r/3/$r/3/127.0.0.1/$port/0/tessera-run" "$T/env.out" && ok "rank $r environment" || bad "rank $r environment: $(cat "$T/env.out")"
done
[ "$(wc -l < "$T/env.out")" -eq 3 ] && ok "one line per rank" || bad "line count: $(cat "$T/env.out")"
# the port is ours from the start: the launcher holds its listening socket and hands it to rank 0 alone
# (TS_STORE_LISTEN_FD), so nothing else can bind MASTER_PORT before rank 0's store serves on it
"$TS" run -n 2 sh -c 'echo "fd=${TS_STORE_LISTEN_FD:-none}"' > "$T/lfd.out" 2>&1
grep -qx '\[rank 0\] fd=[0-9]*' "$T/lfd.out" && grep -qx '\[rank 1\] fd=none' "$T/lfd.out" && ok "listening socket for rank 0 only" \
  || bad "TS_STORE_LISTEN_FD: $(cat "$T/lfd.out")"
if command -v python3 >/dev/null; then
  "$TS" run -n 2 python3 -c 'import os, socket
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(os.environ["MASTER_PORT"]))); print("bound")
except OSError as e:
    print("in use" if e.errno == 98 else e)' > "$T/bind.out" 2>&1
  [ "$(grep -c '] in use$' "$T/bind.out")" -eq 2 ] && ok "MASTER_PORT is taken before any rank binds it" \
    || bad "MASTER_PORT bindable by another process: $(cat "$T/bind.out")"
fi

# two nodes, this is node 1: ranks 2 and 3 of 4; the given address and port
TS_JOB_TOKEN=cli-run-test "$TS" run -n 2 --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 29555 sh -c "$ENVS" > "$T/mn.out" 2>&1
for l in 0 1; do
  r=$((2 + l))
  grep -qx "\[rank $r\] $r/4/$l/2/10.1.2.3/29555/1/tessera-run" "$T/mn.out" && ok "node 1 rank $r" || bad "node 1 rank $r: $(cat "$T/mn.out")"
done
# flags in --flag=value and -nN forms, and "--" before the program
TS_JOB_TOKEN=cli-run-test "$TS" run -n2 --nnodes=3 --node-rank=2 --master-port=29556 -- sh -c 'echo $RANK/$WORLD_SIZE' > "$T/eq.out" 2>&1
grep -qx '\[rank 4\] 4/6' "$T/eq.out" && grep -qx '\[rank 5\] 5/6' "$T/eq.out" && ok "--flag=value, -nN, --" || bad "--flag=value: $(cat "$T/eq.out")"
# a program found on PATH, with its arguments passed as they are
"$TS" run -n 1 printf '%s|' a 'b c' '' > "$T/args.out" 2>&1
grep -qx '\[rank 0\] a|b c||' "$T/args.out" && ok "arguments passed through" || bad "arguments: $(cat "$T/args.out")"

# ---- output ----------------------------------------------------------------------------
"$TS" run -n 2 sh -c 'echo out$RANK; echo err$RANK >&2; printf "two\nlines\nand a partial"' > "$T/o.out" 2> "$T/o.err"
for r in 0 1; do
  grep -qx "\[rank $r\] out$r" "$T/o.out" && ok "rank $r stdout prefixed" || bad "rank $r stdout: $(cat "$T/o.out")"
  grep -qx "\[rank $r\] err$r" "$T/o.err" && ok "rank $r stderr prefixed, on stderr" || bad "rank $r stderr: $(cat "$T/o.err")"
  grep -qx "\[rank $r\] and a partial" "$T/o.out" && ok "rank $r partial last line flushed" || bad "rank $r partial line: $(cat "$T/o.out")"
done
! grep -q err "$T/o.out" && ! grep -q out "$T/o.err" && ok "stdout and stderr kept apart" || bad "streams mixed"
[ "$(grep -c . "$T/o.out")" -eq 8 ] && ok "every stdout line accounted for" || bad "stdout lines: $(cat "$T/o.out")"
# --no-prefix: unchanged
"$TS" run -n 2 --no-prefix sh -c 'echo "$RANK/$WORLD_SIZE"' > "$T/np.out" 2>&1
[ "$(sort "$T/np.out" | tr '\n' ' ')" = "0/2 1/2 " ] && ok "--no-prefix passes output through" || bad "--no-prefix: $(cat "$T/np.out")"
# lots of output from several ranks at once: no line torn or lost
"$TS" run -n 3 seq 1 20000 > "$T/big.out" 2>&1
n=$(grep -cE '^\[rank [012]\] [0-9]+$' "$T/big.out")
[ "$n" -eq 60000 ] && [ "$(wc -l < "$T/big.out")" -eq 60000 ] && ok "60000 lines, none torn" || bad "big output: $n good lines of $(wc -l < "$T/big.out")"
[ "$(grep -c '^\[rank 2\] ' "$T/big.out")" -eq 20000 ] && ok "rank 2 wrote all its lines" || bad "rank 2 lines"

# ---- failures ------------------------------------------------------------------------
# rank 1 exits 3 while the others sleep 30 s: exit 3 at once, naming rank 1
SECONDS=0
"$TS" run -n 3 sh -c 'if [ "$RANK" = 1 ]; then echo failing; exit 3; fi; sleep '"$MARK" > "$T/f.out" 2> "$T/f.err"
rc=$?; took=$SECONDS
[ "$rc" -eq 3 ] && ok "failing rank's status 3 is the launcher's" || bad "exit $rc, expected 3: $(cat "$T/f.err")"
[ "$took" -lt 10 ] && ok "stopped the others quickly (${took}s)" || bad "took ${took}s"
grep -qE '^tessera run: rank 1 \(pid [0-9]+\) exited with status 3$' "$T/f.err" && ok "names rank 1" || bad "message: $(cat "$T/f.err")"
grep -qx '\[rank 1\] failing' "$T/f.out" && ok "the failing rank's output is kept" || bad "output: $(cat "$T/f.out")"
no_leftovers "after a failing rank"

# a rank killed by a signal: 128+10, named
SECONDS=0
"$TS" run -n 2 sh -c 'if [ "$RANK" = 0 ]; then kill -USR1 $$; fi; sleep '"$MARK" > /dev/null 2> "$T/s.err"
rc=$?; took=$SECONDS
[ "$rc" -eq 138 ] && ok "killed rank -> 128+SIGUSR1" || bad "exit $rc, expected 138: $(cat "$T/s.err")"
grep -qE '^tessera run: rank 0 \(pid [0-9]+\) was killed by signal SIGUSR1$' "$T/s.err" && ok "names the signal" || bad "message: $(cat "$T/s.err")"
[ "$took" -lt 10 ] && ok "no hang after a killed rank (${took}s)" || bad "took ${took}s"
no_leftovers "after a killed rank"

# a rank that ignores SIGTERM is SIGKILLed after --grace (rank 0 fails once rank 1 has set its trap)
SECONDS=0
"$TS" run -n 2 --grace 1 sh -c 'if [ "$RANK" = 0 ]; then while [ ! -e "$0" ]; do sleep 0.05; done; exit 5; fi
  trap "" TERM; touch "$0"; sleep '"$MARK" "$T/trapped" > /dev/null 2> "$T/g.err"
rc=$?; took=$SECONDS
[ "$rc" -eq 5 ] && ok "--grace: exit 5" || bad "--grace: exit $rc: $(cat "$T/g.err")"
[ "$took" -lt 10 ] && ok "--grace 1 escalates to SIGKILL (${took}s)" || bad "--grace took ${took}s"
grep -q "sending SIGKILL" "$T/g.err" && ok "says it sends SIGKILL" || bad "no SIGKILL message: $(cat "$T/g.err")"
no_leftovers "after --grace"

# a rank that succeeds but leaves a background process holding its stdout
SECONDS=0
"$TS" run -n 2 sh -c 'sleep '"$MARK"' & echo started' > "$T/bg.out" 2>&1
rc=$?; took=$SECONDS
[ "$rc" -eq 0 ] && [ "$took" -lt 10 ] && ok "background leftovers: exit 0 in ${took}s" || bad "background leftovers: exit $rc in ${took}s: $(cat "$T/bg.out")"
no_leftovers "after background leftovers"

# ---- signals to the launcher ---------------------------------------------------------
# SIGTERM: forwarded; the launcher dies of it (143) and nothing is left
"$TS" run -n 3 sh -c 'sleep '"$MARK" > /dev/null 2> "$T/t.err" &
lp=$!
if wait_for_ranks 3; then ok "3 ranks running"; else bad "ranks did not start: $(cat "$T/t.err")"; fi
SECONDS=0
kill -TERM "$lp"
wait "$lp"; rc=$?; took=$SECONDS
[ "$rc" -eq 143 ] && ok "SIGTERM -> launcher exits 143" || bad "after SIGTERM: exit $rc: $(cat "$T/t.err")"
[ "$took" -lt 10 ] && ok "SIGTERM handled in ${took}s" || bad "SIGTERM took ${took}s"
no_leftovers "after SIGTERM to the launcher"

# SIGINT twice: ranks ignoring SIGINT are SIGKILLed by the second one. A
# background job's SIGINT is ignored (and a shell cannot undo that), so perl
# restores the default before starting the launcher.
if command -v perl >/dev/null; then
  perl -e '$SIG{INT} = "DEFAULT"; exec @ARGV or die' -- \
    "$TS" run -n 2 --grace 60 sh -c 'trap "" INT; sleep '"$MARK" > /dev/null 2> "$T/i.err" &
  lp=$!
  if wait_for_ranks 2; then ok "2 ranks running"; else bad "ranks did not start: $(cat "$T/i.err")"; fi
  SECONDS=0
  kill -INT "$lp"; sleep 0.5
  kill -INT "$lp"
  wait "$lp"; rc=$?; took=$SECONDS
  [ "$rc" -eq 130 ] && ok "double SIGINT -> launcher exits 130" || bad "after 2 SIGINT: exit $rc: $(cat "$T/i.err")"
  [ "$took" -lt 10 ] && ok "second SIGINT kills at once (${took}s)" || bad "double SIGINT took ${took}s"
  grep -q "again; killing" "$T/i.err" && ok "says it kills" || bad "no kill message: $(cat "$T/i.err")"
  no_leftovers "after SIGINT twice"
else
  echo "skip: double SIGINT (no perl to un-ignore SIGINT)"
fi

cli_summary
