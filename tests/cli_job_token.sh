#!/usr/bin/env bash
# tests/cli_job_token.sh — the job token at the command line: `tessera run` gives its ranks a
# fresh TS_JOB_TOKEN (64 hex digits, the same for every rank, new for every run), keeps one the
# user set, refuses a multi-node job without one unless TS_ALLOW_UNAUTHENTICATED=1 (then warns); a two-rank DDP run over
# TCP authenticates without a warning, and a rank with another token is refused with an error
# that says so (and the launcher reports the failure, no hang).
set -u
TS=${1:?usage: cli_job_token.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
test_tmpdir
unset TS_JOB_TOKEN

# ---- the launcher's token ------------------------------------------------------------------------
"$TS" run -n 2 sh -c 'echo "$TS_JOB_TOKEN"' > "$T/a.out" 2>&1 || bad "run -n 2: $(cat "$T/a.out")"
"$TS" run -n 2 sh -c 'echo "$TS_JOB_TOKEN"' > "$T/b.out" 2>&1 || bad "run -n 2 again: $(cat "$T/b.out")"
ta=$(sed -n 's/^\[rank 0\] //p' "$T/a.out"); ta1=$(sed -n 's/^\[rank 1\] //p' "$T/a.out")
tb=$(sed -n 's/^\[rank 0\] //p' "$T/b.out")
if [[ "$ta" =~ ^[0-9a-f]{64}$ ]]; then ok "a 64-hex-digit token"; else bad "token '$ta'"; fi
[ "$ta" = "$ta1" ] && ok "the same token for every rank" || bad "rank tokens differ: $(cat "$T/a.out")"
[ "$ta" != "$tb" ] && ok "a new token for every run" || bad "two runs share token $ta"
out=$(TS_JOB_TOKEN=users-own-secret "$TS" run -n 2 sh -c 'echo "$TS_JOB_TOKEN"' 2>&1)
[ "$(grep -c '^\[rank [01]\] users-own-secret$' <<<"$out")" = 2 ] && ok "a token the user set is kept" \
  || bad "user token not kept: $out"
out=$("$TS" run --nnodes 2 --node-rank 1 --master-port 29999 -n 1 sh -c 'echo "[${TS_JOB_TOKEN:-none}]"' 2>&1)
rc=$?
if [ $rc = 2 ] && grep -q "TS_JOB_TOKEN is not set: with 2 nodes every node needs the same token" <<<"$out" \
   && grep -q "TS_ALLOW_UNAUTHENTICATED=1" <<<"$out" && ! grep -q '^\[rank' <<<"$out"; then
  ok "multi-node without TS_JOB_TOKEN: refused up front (exit 2), naming both ways on"
else
  bad "multi-node without a token: exit $rc: $out"
fi
out=$(TS_ALLOW_UNAUTHENTICATED=1 "$TS" run --nnodes 2 --node-rank 1 --master-port 29999 -n 1 sh -c 'echo "[${TS_JOB_TOKEN:-none}]"' 2>&1)
if grep -q "runs unauthenticated" <<<"$out" && grep -q '^\[rank 1\] \[none\]$' <<<"$out"; then
  ok "multi-node with TS_ALLOW_UNAUTHENTICATED=1: warned, no per-node token"
else
  bad "multi-node, TS_ALLOW_UNAUTHENTICATED=1: $out"
fi

# ---- a real job over TCP -----------------------------------------------------------------------
DATA=/usr/share/datasets/fashion-mnist
if [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  common=(train --model mlp --seed 1 --quiet --max-steps 3 --epochs 1 --batch-size 16 --timeout 60)
  if TS_DIST_TRANSPORT=tcp "$TS" run -n 2 "$TS" "${common[@]}" > "$T/good.log" 2>&1; then
    ok "two ranks over TCP with the launcher's token"
  else
    bad "two ranks over TCP: $(cat "$T/good.log")"
  fi
  grep -q "no job token" "$T/good.log" && bad "a warning about a missing token: $(cat "$T/good.log")" \
    || ok "no warning about a missing token"
  # rank 1 brings another token: refused at once with a message naming the token; rank 0 gives up
  SECONDS=0
  TS_DIST_TRANSPORT=tcp "$TS" run -n 2 --grace 2 sh -c \
    'if [ "$RANK" = 1 ]; then export TS_JOB_TOKEN=an-intruders-guess; fi; exec "$0" "$@"' \
    "$TS" "${common[@]}" --timeout 20 > "$T/bad.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && grep -q "rank 1\].*wrong job token" "$T/bad.log"; then
    ok "a rank with another token is refused (exit $rc, ${SECONDS}s)"
  else
    bad "mismatched token: exit $rc: $(cat "$T/bad.log")"
  fi
  [ $SECONDS -lt 15 ] && ok "no waiting out the timeout" || bad "took ${SECONDS}s"
else
  echo "skip: no $DATA (the training runs)"
fi

cli_summary
