#!/usr/bin/env bash
# scripts/liveness_trials.sh — the issue's acceptance run: N trials of DDP training under
# `tessera run` in which one rank (chosen at random) is stopped with SIGSTOP at a random
# moment of training; each trial passes when the launcher's verdict names the stopped rank
# and a collective, it is over within LIMIT seconds of the stop, and no rank is left.
#
#   scripts/liveness_trials.sh build/tessera [N=20] [WORLD=2] [LIMIT=45]
#
# TS_HEARTBEAT_TIMEOUT in the environment is passed on (unset: the default, 30 s).
set -u
TS=${1:?usage: liveness_trials.sh path/to/tessera [trials] [world] [limit_s]}
N=${2:-20}; W=${3:-2}; LIMIT=${4:-45}
T=$(mktemp -d)
trap 'for f in "$T"/pid.*; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done; rm -rf "$T"' EXIT
cat > "$T/rank.sh" <<EOS
#!/bin/sh
echo \$\$ > "$T/pid.\$RANK"
exec "$TS" train --model cnn --batch-size 32 --seed 1 --quiet --timeout 1800 --epochs 50
EOS
chmod +x "$T/rank.sh"
pass=0; times=()
for i in $(seq 1 "$N"); do
  rm -f "$T"/pid.* "$T/out" "$T/err"
  "$TS" run -n "$W" "$T/rank.sh" > "$T/out" 2> "$T/err" &
  lp=$!
  for _ in $(seq 600); do grep -q "training cnn" "$T/out" 2>/dev/null && break; sleep 0.1; done
  sleep "$(awk -v s="$RANDOM" 'BEGIN{printf "%.2f", 0.2 + (s % 300) / 100}')"
  r=$(( RANDOM % W ))
  pid=$(cat "$T/pid.$r")
  t0=$(date +%s.%N)
  kill -STOP "$pid"
  while kill -0 "$lp" 2>/dev/null; do
    if awk -v a="$t0" -v b="$(date +%s.%N)" -v l="$LIMIT" 'BEGIN{exit !(b - a > l + 30)}'; then kill -KILL "$lp"; fi
    sleep 0.1
  done
  wait "$lp"; rc=$?
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
  verdict=$(grep -m1 "stopped responding" "$T/err")
  left=""
  for f in "$T"/pid.*; do kill -0 "$(cat "$f")" 2>/dev/null && left="$left ${f##*/}"; done
  if [ "$rc" -ne 0 ] && grep -qE "^tessera run: rank $r \(pid $pid on [^)]+\) stopped responding: rank [0-9]+ (waited for it|failed) in collective #[0-9]+ " <<<"$verdict" \
     && awk -v d="$dt" -v l="$LIMIT" 'BEGIN{exit !(d < l)}' && [ -z "$left" ]; then
    pass=$((pass + 1)); res=ok
  else
    res=FAIL
  fi
  times+=("$dt")
  echo "trial $i: $res, rank $r of $W stopped, launcher exit $rc after $dt s${left:+, left:$left}: ${verdict:-$(grep '^tessera run' "$T/err" | head -3)}" | cut -c1-400
  for f in "$T"/pid.*; do kill -KILL "$(cat "$f")" 2>/dev/null; done
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
echo "$pass/$N passed; seconds from SIGSTOP to the launcher's exit: min $(head -1 <<<"$sorted"), median $(sed -n "$(( (N + 1) / 2 ))p" <<<"$sorted"), max $(tail -1 <<<"$sorted")"
[ "$pass" -eq "$N" ]
