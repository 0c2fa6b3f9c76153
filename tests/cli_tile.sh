#!/usr/bin/env bash
# `tessera train --strategy tile`: the reference CNN cut into bands of rows over
# virtual CPU devices trains, and its loss after 3 steps equals a one-device run's
# (tile parallelism computes the same thing). Skips (77) without the data set or
# while `tessera train` has no --strategy flag.
set -u
TS=${1:?usage: cli_tile.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
"$TS" train --help 2>&1 | grep -q -- "--strategy" || { echo "skip: tessera train has no --strategy yet"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
ok()  { echo "ok: $1"; }
bad() { fails=$((fails+1)); echo "FAIL: $1"; }

common=(--model cnn --threads 2 --batch-size 16 --seed 3 --quiet --max-steps 3)
loss_of() { sed -n 's/.*"final_loss": *\([-0-9.eE+]*\).*/\1/p' "$1"; }

if "$TS" train "${common[@]}" --metrics-json "$T/one.json" > "$T/one.log" 2>&1; then
  ok "one device"
else
  bad "one device: $(cat "$T/one.log")"
fi
for devs in cpu:0,cpu:1 cpu:0,cpu:1,cpu:2; do
  if TS_CPU_DEVICES=3 "$TS" train "${common[@]}" --strategy tile --devices "$devs" --metrics-json "$T/tile.json" \
       > "$T/tile.log" 2>&1; then
    ok "--strategy tile --devices $devs"
  else
    bad "--strategy tile --devices $devs: $(cat "$T/tile.log")"
    continue
  fi
  grep -q '"steps": 3' "$T/tile.json" && ok "3 steps" || bad "steps: $(cat "$T/tile.json")"
  a=$(loss_of "$T/one.json"); b=$(loss_of "$T/tile.json")
  if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4) }'; then
    ok "final loss $b equals one device's $a"
  else
    bad "final loss '$b' differs from one device's '$a'"
  fi
done

# a device list the image cannot be cut into is an error, not a crash
out=$(TS_CPU_DEVICES=3 "$TS" train "${common[@]}" --strategy tile --devices cpu:0,cpu:7 2>&1); rc=$?
[ "$rc" -ne 0 ] && grep -q "cpu:7" <<<"$out" && ok "bad device -> $rc" || bad "bad device: rc $rc: $out"

[ "$fails" -eq 0 ] || { echo "$fails failures"; exit 1; }
echo "all passed"
