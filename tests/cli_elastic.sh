#!/usr/bin/env bash
# tests/cli_elastic.sh — `tessera run --max-restarts K`: a failed group is started
# again and training goes on from the newest checkpoint in --checkpoint-dir.
#   1. rank 1 is SIGKILLed once the first checkpoint exists (attempt 0): the
#      launcher restarts both ranks, they resume, and the final checkpoint equals
#      an uninterrupted run's (ckpt diff --tol 1e-6; the measured maximum is printed)
#   2. rank 1 stops itself (SIGSTOP) on attempt 0: heartbeats (3 s) name it, the
#      launcher kills it and restarts; the run finishes
#   3. a rank that always fails: K+1 attempts, then the last status, "no restarts left"
#   4. SIGTERM to the launcher: forwarded, no restart, status 143
#   5. bad --max-restarts values exit 2
set -u
TS=${1:?usage: cli_elastic.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
case "$TS" in /*) ;; *) TS="$PWD/$TS" ;; esac
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TS_LAUNCHED_BY TS_RUN_DIR
for v in $(env | grep -o -E '^(SLURM_|OMPI_COMM_|PMI_|PMIX_|TORCHELASTIC_)[A-Z_]*'); do unset "$v"; done
T=$(mktemp -d)
trap 'pkill -KILL -f "$T/" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $T" || rm -rf "$T"' EXIT
. "$(dirname "$0")/testlib.sh"

train=(train --model mlp --batch-size 32 --seed 7 --quiet --threads 1 --timeout 60 --max-steps 300
       --checkpoint-every 10 --keep 3)

# The uninterrupted reference: two ranks under tessera run.
"$TS" run -n 2 "$TS" "${train[@]}" --checkpoint-dir "$T/ref" > "$T/ref.log" 2>&1 || bad "reference run: $(cat "$T/ref.log")"
REF="$T/ref/step-000000000300.ckpt"
[ -f "$REF" ] || bad "reference run wrote no step-300 checkpoint: $(ls "$T/ref" 2>&1)"

# 1. rank 1 killed on attempt 0, once a checkpoint exists
cat > "$T/kill1.sh" <<EOF
#!/bin/sh
# attempt 0, rank 1: SIGKILL once the first checkpoint exists (\$\$ is the training process after exec)
if [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "\$RANK" = 1 ]; then
  ( while ! ls "$T/k"/step-*.ckpt > /dev/null 2>&1; do sleep 0.01; done; kill -KILL \$\$ ) &
fi
exec "$TS" ${train[*]} --checkpoint-dir "$T/k"
EOF
chmod +x "$T/kill1.sh"
"$TS" run -n 2 --max-restarts 1 "$T/kill1.sh" > "$T/k.log" 2>&1
rc=$?
[ $rc = 0 ] && ok "killed rank: the restarted run finished (exit 0)" || bad "killed rank: exit $rc: $(cat "$T/k.log")"
grep -q "rank 1 (pid [0-9]*) was killed by signal SIGKILL" "$T/k.log" && ok "killed rank: the failure is reported" \
  || bad "killed rank: no failure line: $(cat "$T/k.log")"
grep -q "restarting all 2 ranks (restart 1 of 1) after rank 1 failed with status 137" "$T/k.log" \
  && ok "killed rank: restart announced" || bad "killed rank: no restart line: $(cat "$T/k.log")"
grep -q "\[rank 0\] resumed from $T/k/step-" "$T/k.log" && ok "killed rank: attempt 1 resumed from a checkpoint" \
  || bad "killed rank: no resume: $(cat "$T/k.log")"
if [ -f "$REF" ] && [ -f "$T/k/step-000000000300.ckpt" ]; then
  d=$("$TS" ckpt diff "$REF" "$T/k/step-000000000300.ckpt" --tol 1e-6 2>&1)
  if [ $? = 0 ]; then ok "killed rank: final checkpoint equals the uninterrupted run's ($(echo "$d" | grep -o 'max abs difference.*' | head -1))"
  else bad "killed rank: final checkpoint differs: $d"; fi
else
  bad "killed rank: no final checkpoint: $(ls "$T/k" 2>&1)"
fi
ls "$T/k" | grep -q 'tmp' && bad "killed rank: temporary files left: $(ls "$T/k")" || ok "killed rank: no temporary files left"

# 2. rank 1 stops itself on attempt 0: the heartbeat verdict names it, then a restart
cat > "$T/stop1.sh" <<EOF
#!/bin/sh
# attempt 0, rank 1: SIGSTOP once the first checkpoint exists (\$\$ is the training process after exec)
if [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "\$RANK" = 1 ]; then
  ( while ! ls "$T/s"/step-*.ckpt > /dev/null 2>&1; do sleep 0.01; done; kill -STOP \$\$ ) &
fi
exec "$TS" ${train[*]} --checkpoint-dir "$T/s"
EOF
chmod +x "$T/stop1.sh"
start=$(date +%s)
TS_HEARTBEAT_TIMEOUT=3 timeout 120 "$TS" run -n 2 --max-restarts 2 --grace 2 "$T/stop1.sh" > "$T/s.log" 2>&1
rc=$?
[ $rc = 0 ] && ok "stopped rank: the restarted run finished in $(( $(date +%s) - start )) s" \
  || bad "stopped rank: exit $rc: $(cat "$T/s.log")"
grep -q "stopped responding" "$T/s.log" && ok "stopped rank: named by the liveness verdict" \
  || bad "stopped rank: no verdict: $(cat "$T/s.log")"
grep -q "restarting all 2 ranks (restart 1 of 2)" "$T/s.log" && ok "stopped rank: one restart" \
  || bad "stopped rank: no restart: $(cat "$T/s.log")"
grep -q "restart 2 of 2" "$T/s.log" && bad "stopped rank: a second restart: $(cat "$T/s.log")"
if [ -f "$REF" ] && [ -f "$T/s/step-000000000300.ckpt" ]; then
  "$TS" ckpt diff "$REF" "$T/s/step-000000000300.ckpt" --tol 1e-6 > "$T/sd.log" 2>&1 \
    && ok "stopped rank: final checkpoint equals the uninterrupted run's" || bad "stopped rank: $(cat "$T/sd.log")"
fi

# 3. restarts run out: K+1 attempts, the last failure's status (rank 1 counts them: rank 0 may be
#    stopped before it writes)
cat > "$T/fail.sh" <<EOF
#!/bin/sh
echo "attempt \$TORCHELASTIC_RESTART_COUNT of \$TORCHELASTIC_MAX_RESTARTS" >> "$T/attempts.\$RANK"
[ "\$RANK" = 1 ] && exit 5
sleep 30
EOF
chmod +x "$T/fail.sh"
"$TS" run -n 2 --max-restarts 2 --grace 1 "$T/fail.sh" > "$T/f.log" 2>&1
rc=$?
[ $rc = 5 ] && ok "restarts run out: exit 5" || bad "restarts run out: exit $rc: $(cat "$T/f.log")"
[ "$(cat "$T/attempts.1" 2>/dev/null | tr '\n' ',')" = "attempt 0 of 2,attempt 1 of 2,attempt 2 of 2," ] \
  && ok "restarts run out: three attempts, numbered" || bad "attempts: $(cat "$T"/attempts.* 2>&1)"
grep -q "rank 1 failed again; no restarts left (--max-restarts 2)" "$T/f.log" && ok "restarts run out: said so" \
  || bad "restarts run out: $(cat "$T/f.log")"

# 4. a signal to the launcher stops everything, with no restart
cat > "$T/sleep.sh" <<EOF
#!/bin/sh
echo "attempt \$TORCHELASTIC_RESTART_COUNT" >> "$T/sig.\$RANK"
exec sleep 30
EOF
chmod +x "$T/sleep.sh"
"$TS" run -n 2 --max-restarts 3 --grace 1 "$T/sleep.sh" > "$T/sig.log" 2>&1 &
lp=$!
for _ in $(seq 200); do [ -f "$T/sig.1" ] && [ -f "$T/sig.0" ] && break; sleep 0.05; done
kill -TERM $lp
wait $lp
rc=$?
[ $rc = 143 ] && ok "SIGTERM: exit 143" || bad "SIGTERM: exit $rc: $(cat "$T/sig.log")"
grep -q restarting "$T/sig.log" && bad "SIGTERM: restarted: $(cat "$T/sig.log")" || ok "SIGTERM: no restart"
[ "$(cat "$T/sig.0" "$T/sig.1" | sort -u)" = "attempt 0" ] && ok "SIGTERM: one attempt" || bad "SIGTERM: $(cat "$T"/sig.*)"

# 5. bad values
for v in -1 x 1e3 ""; do
  "$TS" run -n 2 --max-restarts "$v" /bin/true > "$T/b.log" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q -- "--max-restarts" "$T/b.log" && ok "--max-restarts '$v': exit 2 naming it" \
    || bad "--max-restarts '$v': exit $rc: $(cat "$T/b.log")"
done

cli_summary
