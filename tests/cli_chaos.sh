#!/usr/bin/env bash
# tests/cli_chaos.sh — the short version of bench/chaos.sh: `tessera train` on 2 namespace hosts x 2 ranks under
# `tessera run --max-restarts K --checkpoint-dir` (TS_HEARTBEAT_TIMEOUT=3, train --timeout 20), with five seeded
# faults one after the other: a rank SIGKILLed, a rank SIGSTOPped, a node's launcher SIGKILLed (and started
# again, as its supervisor would), the checkpoint file system full, a hostile client flooding the store. Every
# fault is survived, no checkpoint reported saved is lost, the final parameters equal the uninterrupted run's
# (ckpt diff --tol 0), every wait for a verdict ends within 15 s, and the harness leaves no namespace, mount
# or process behind. Skips (77) without root (namespaces, tmpfs mounts) or Fashion-MNIST.
set -u
TS=${1:?usage: cli_chaos.sh path/to/tessera}
case "$TS" in /*) ;; *) TS="$PWD/$TS" ;; esac
CHAOS="$(cd "$(dirname "$0")/.." && pwd)/bench/chaos.sh"
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TS_LAUNCHED_BY TS_RUN_DIR
. "$(dirname "$0")/testlib.sh"
test_tmpdir

timeout -k 10 400 bash "$CHAOS" --tessera "$TS" --quick --faults 5 --seed 2 --heartbeat 3 --timeout 20 --in-order \
  --kinds kill-rank,stop-rank,kill-launcher,disk-full,store-flood --json "$T/chaos.json" > "$T/out" 2>&1
rc=$?
cat "$T/out"
[ $rc = 77 ] && { echo "skip: $(grep -m1 '^skip' "$T/out")"; exit 77; }
[ $rc = 0 ] && ok "chaos.sh: exit 0" || bad "chaos.sh: exit $rc"
grep -Eq '^all +5 +5$' "$T/out" && ok "5 faults injected, 5 survived" || bad "faults: $(grep -E '^all ' "$T/out")"
for k in kill-rank stop-rank kill-launcher disk-full store-flood; do
  grep -Eq "^$k +1 +1$" "$T/out" || bad "$k: not injected once and survived: $(grep -E "^$k " "$T/out")"
done
grep -Eq '^checkpoints lost +0 ' "$T/out" && ok "no checkpoint lost" || bad "$(grep '^checkpoints lost' "$T/out")"
grep -Eq '^final parameters vs uninterrupted +equal \(ckpt diff --tol 0\)' "$T/out" && ok "final parameters equal" ||
  bad "$(grep '^final parameters' "$T/out")"
grep -q '"params_equal":true' "$T/chaos.json" && grep -q '"checkpoints_lost":0' "$T/chaos.json" &&
  ok "--json: $(cut -c1-160 "$T/chaos.json")" || bad "--json: $(cat "$T/chaos.json" 2>&1)"
n=$(grep -o '"kind":' "$T/chaos.json" | wc -l)
[ "$n" = 5 ] && ok "--json: 5 faults listed" || bad "--json lists $n faults"
if command -v python3 > /dev/null && python3 -c 'import json' 2> /dev/null; then
  python3 -m json.tool "$T/chaos.json" > /dev/null 2>&1 && ok "--json parses" || bad "--json does not parse: $(cat "$T/chaos.json")"
fi
w=$(grep -o '"longest_wait_s":"[^"]*"' "$T/chaos.json" | cut -d'"' -f4)
awk -v w="${w:-x}" 'BEGIN { exit !(w ~ /^[0-9.]+$/ && w + 0 <= 15) }' && ok "longest wait without a verdict: ${w}s" ||
  bad "longest wait without a verdict: '${w}' (more than 15 s at a 3 s heartbeat)"
# the restarts the kill, the stop, the launcher and the full disk caused
r=$(grep -E '^restarts' "$T/out" | grep -oE '[0-9]+' | head -1)
[ "${r:-0}" -ge 3 ] && ok "restarts: $r" || bad "restarts: '$r' (the faults should have caused some)"
# nothing left behind: its namespaces, tmpfs mounts, folder, processes
pre=$(grep -o 'namespaces ts[0-9]*' "$T/out" | head -1 | cut -d' ' -f2)
dir=$(grep -o 'folder /tmp/chaos\.[A-Za-z0-9]*' "$T/out" | head -1 | cut -d' ' -f2)
if [ -n "$pre" ] && [ -n "$dir" ]; then
  left="$(ip netns list 2> /dev/null | grep "^$pre")$(grep " $dir" /proc/mounts)$(ls -d "$dir" 2> /dev/null)$(pgrep -f "$dir/" 2> /dev/null)"
  [ -z "$left" ] && ok "no namespace, mount, folder or process left ($pre, $dir)" || bad "left behind: $left"
else
  bad "chaos.sh did not name its namespaces and folder"
fi
cli_summary
