#!/usr/bin/env bash
# Shared memory on a small /dev/shm (issue 10), in a private mount namespace (`unshare -rm`; skipped
# where the system does not allow one): 16 ranks of `tessera bench allreduce` on Docker's 64 MB default
# shrink their rings and finish (no SIGBUS), on 8 MB the ranks that cannot reserve a segment talk over
# TCP, and ranks terminated with SIGTERM mid-run leave no segment behind.
# (Run by ctest as: bash cli_shm.sh /path/to/tessera.)
set -u
TS=${1:?usage: cli_shm.sh path/to/tessera}
if ! unshare -rm true 2>/dev/null; then
  echo "skip: no private mount namespace here (unshare -rm fails)"
  exit 77
fi
exec unshare -rm bash -s "$TS" <<'INNER'
set -u
TS=$1
mount -t tmpfs -o size=64m tmpfs /dev/shm 2>/dev/null || { echo "skip: cannot mount a tmpfs"; exit 77; }
fails=0
ok()  { echo "ok: $1"; }
bad() { fails=$((fails+1)); echo "FAIL: $1"; }
segments() { find /dev/shm -maxdepth 1 -name 'tessera-*' | wc -l; }

run16() { # run16 NAME NEEDLE: 16 ranks, exit 0, no rank killed, output mentions NEEDLE
  local out rc
  out=$(timeout 300 "$TS" bench allreduce -n 16 --max-bytes 256K --time 0.01 2>&1); rc=$?
  if [ $rc -ne 0 ] || grep -q "killed by signal" <<<"$out"; then bad "$1: exit $rc: $(tail -n 8 <<<"$out")"
  elif ! grep -qF -- "$2" <<<"$out"; then bad "$1: output lacks '$2': $(head -n 5 <<<"$out")"
  elif [ "$(segments)" -ne 0 ]; then bad "$1: $(segments) segments left in /dev/shm"
  else ok "$1"; fi
}
run16 "16 ranks on a 64 MB /dev/shm" "KiB rings"
umount /dev/shm && mount -t tmpfs -o size=8m tmpfs /dev/shm
run16 "16 ranks on an 8 MB /dev/shm" "over TCP"
umount /dev/shm && mount -t tmpfs -o size=64m tmpfs /dev/shm

# SIGTERM in the middle: the bench and its ranks in one process group, terminated together
for round in 1 2 3; do
  setsid "$TS" bench allreduce -n 12 --max-bytes 4M --time 0.5 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 $((round * 200))); do [ "$(segments)" -gt 0 ] && break; sleep 0.005; done
  seen=$(segments)
  kill -TERM -- -"$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  sleep 0.2
  left=$(segments)
  if [ "$left" -ne 0 ]; then bad "SIGTERM round $round: $seen segments before, $left left"
  else ok "SIGTERM round $round: $seen segments before, none left"; fi
done
echo "$fails failure(s)"
[ $fails -eq 0 ]
INNER
