#!/usr/bin/env bash
# tests/cli_torchrun.sh — the real torchrun (python3 -m torch.distributed.run,
# static rendezvous: its agent serves a TCPStore on MASTER_PORT and sets
# TORCHELASTIC_USE_AGENT_STORE=True) starting two `tessera train` ranks: they join
# the agent's store as clients (no "Address already in use"), form one 2-rank job
# and end with the parameters of `tessera train --nproc 2` (ckpt diff --tol 1e-5).
# Then torchrun --max-restarts 1 with rank 1 SIGKILLed on attempt 0 once a checkpoint
# exists: attempt 1 (its keys under tessera/attempt_1 in the agent's store) resumes
# from --checkpoint-dir and ends equal to an uninterrupted `tessera run -n 2` run.
# Skips (77) without python3 + torch: CI does not install torch.
set -u
TS=${1:?usage: cli_torchrun.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
python3 -c "import torch" >/dev/null 2>&1 || {
  echo "skip: python3 cannot import torch (pip install torch to run this test; CI does not install it)"; exit 77; }
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TS_LAUNCHED_BY
for v in $(env | grep -o -E '^(SLURM_|OMPI_COMM_|PMI_|PMIX_|TORCHELASTIC_)[A-Z_]*'); do unset "$v"; done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0; passes=0
ok()   { passes=$((passes+1)); echo "ok: $1"; }
bad()  { fails=$((fails+1)); echo "FAIL: $1"; }

common=(train --model mlp --max-steps 20 --batch-size 32 --seed 5 --quiet --epochs 1 --timeout 60 --threads 1)
"$TS" "${common[@]}" --nproc 2 --checkpoint "$T/ref.ckpt" > "$T/ref.log" 2>&1 || bad "--nproc 2: $(cat "$T/ref.log")"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
  --no-python "$TS" "${common[@]}" --checkpoint "$T/torchrun.ckpt" > "$T/torchrun.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "torchrun --nproc-per-node 2 tessera train" || bad "torchrun (exit $rc): $(cat "$T/torchrun.log")"
grep -q "Address already in use" "$T/torchrun.log" && bad "a rank tried to serve the agent's port: $(cat "$T/torchrun.log")"
[ "$(grep -c "training mlp.*2 ranks (DDP)" "$T/torchrun.log")" = 1 ] && ok "one 2-rank job" \
  || bad "not one 2-rank job: $(cat "$T/torchrun.log")"
[ "$(grep -c "saved checkpoint to" "$T/torchrun.log")" = 1 ] && ok "one checkpoint written (rank 0)" \
  || bad "checkpoint lines: $(cat "$T/torchrun.log")"
out=$("$TS" ckpt diff "$T/ref.ckpt" "$T/torchrun.ckpt" --tol 1e-5 2>&1) \
  && ok "torchrun run equals --nproc 2 ($(tail -1 <<<"$out"))" || bad "checkpoints differ: $out"

# torchrun's restarts: a killed rank, attempt 1 resumes from the checkpoint folder
long=(train --model mlp --batch-size 32 --seed 7 --quiet --threads 1 --timeout 60 --max-steps 200 --checkpoint-every 10 --keep 2)
"$TS" run -n 2 "$TS" "${long[@]}" --checkpoint-dir "$T/ref_dir" > "$T/ref_dir.log" 2>&1 || bad "tessera run -n 2: $(cat "$T/ref_dir.log")"
cat > "$T/kill1.sh" <<EOF
#!/bin/sh
if [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "\$RANK" = 1 ]; then
  ( while ! ls "$T/k"/step-*.ckpt > /dev/null 2>&1; do sleep 0.01; done; kill -KILL \$\$ ) &
fi
exec "$TS" ${long[*]} --checkpoint-dir "$T/k"
EOF
chmod +x "$T/kill1.sh"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TS_JOB_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n') timeout 300 python3 -m torch.distributed.run \
  --nproc-per-node 2 --max-restarts 1 --master-addr 127.0.0.1 --master-port "$port" --no-python "$T/kill1.sh" \
  > "$T/restart.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "torchrun --max-restarts 1: finished after a killed rank" \
  || bad "torchrun --max-restarts (exit $rc): $(cat "$T/restart.log")"
grep -q "resumed from $T/k/step-" "$T/restart.log" && ok "attempt 1 resumed from the checkpoint folder" \
  || bad "no resume: $(cat "$T/restart.log")"
out=$("$TS" ckpt diff "$T/ref_dir/step-000000000200.ckpt" "$T/k/step-000000000200.ckpt" --tol 1e-5 2>&1) \
  && ok "restarted torchrun run equals an uninterrupted one ($(tail -1 <<<"$out"))" || bad "restart: $out"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
