#!/usr/bin/env bash
# tests/cli_torchrun.sh — the real torchrun (python -m torch.distributed.run of the Python
# tests/find_python.sh finds with torch: Debian's python3-torch 1.13, or a pip torch 2.x)
# starting two `tessera train` ranks, with the flag spellings both generations accept
# (--nproc_per_node, --master_addr, --no_python: torch 1.13 refuses the dashed ones).
#  - static rendezvous (--master_addr/--master_port): the agent serves a TCPStore on
#    MASTER_PORT and sets TORCHELASTIC_USE_AGENT_STORE=True; the ranks join it as clients
#    (torch 1.x's query numbers or 2.x's, whichever it speaks; no "Address already in
#    use"), form one 2-rank job and end with the parameters of `tessera train --nproc 2`
#    (ckpt diff --tol 1e-5);
#  - --standalone (c10d rendezvous on the agent's side; rank 0 serves the ranks' store on
#    the MASTER_PORT the agent picked): the same parameters;
#  - torchrun --max_restarts 1 with rank 1 SIGKILLed on attempt 0 once a checkpoint exists:
#    attempt 1 (its keys under tessera/attempt_1 in the agent's store) resumes from
#    --checkpoint-dir and ends equal to an uninterrupted `tessera run -n 2` run.
# torch 1.13 under Python >= 3.11 (Debian 12) stops before it starts a worker unless
# --redirects and --tee name a stream (a torch bug: "'NoneType' object has no attribute
# 'get'"), so those runs pass `--redirects 2 --tee 2` (each rank's stderr through a log file,
# echoed with a rank prefix). Skips (77) without a Python that imports torch (fails under
# TS_REQUIRE_TORCH=1, as .ci/run sets).
set -u
TS=${1:?usage: cli_torchrun.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
PY=$(bash "$(dirname "$0")/find_python.sh" torch) || {
  echo "skip: no Python imports torch (Debian: apt-get install python3-torch; or TS_PYTHON=/path/to/python)"
  [ "${TS_REQUIRE_TORCH:-0}" = 1 ] && { echo "FAIL: TS_REQUIRE_TORCH=1 (CI) and no torch"; exit 1; }
  exit 77; }
echo "torchrun of $("$PY" -c 'import sys, torch; print("torch", torch.__version__, "on Python", sys.version.split()[0])')"
torchrun=("$PY" -m torch.distributed.run)
if "$PY" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) < 2 and sys.version_info >= (3, 11) else 1)'; then
  torchrun+=(--redirects 2 --tee 2)
fi
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TS_LAUNCHED_BY
for v in $(env | grep -o -E '^(SLURM_|OMPI_COMM_|PMI_|PMIX_|TORCHELASTIC_)[A-Z_]*'); do unset "$v"; done
. "$(dirname "$0")/testlib.sh"
test_tmpdir

common=(train --model mlp --max-steps 20 --batch-size 32 --seed 5 --quiet --epochs 1 --timeout 60 --threads 1)
"$TS" "${common[@]}" --nproc 2 --checkpoint "$T/ref.ckpt" > "$T/ref.log" 2>&1 || bad "--nproc 2: $(cat "$T/ref.log")"

port=$(free_port)
timeout 300 "${torchrun[@]}" --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" \
  --no_python "$TS" "${common[@]}" --checkpoint "$T/torchrun.ckpt" > "$T/torchrun.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "torchrun --nproc_per_node 2 tessera train (static rendezvous)" \
  || bad "torchrun (exit $rc): $(cat "$T/torchrun.log")"
grep -q "Address already in use" "$T/torchrun.log" && bad "a rank tried to serve the agent's port: $(cat "$T/torchrun.log")"
[ "$(grep -c "training mlp.*2 ranks (DDP)" "$T/torchrun.log")" = 1 ] && ok "one 2-rank job" \
  || bad "not one 2-rank job: $(cat "$T/torchrun.log")"
[ "$(grep -c "saved checkpoint to" "$T/torchrun.log")" = 1 ] && ok "one checkpoint written (rank 0)" \
  || bad "checkpoint lines: $(cat "$T/torchrun.log")"
out=$("$TS" ckpt diff "$T/ref.ckpt" "$T/torchrun.ckpt" --tol 1e-5 2>&1) \
  && ok "torchrun run equals --nproc 2 ($(tail -1 <<<"$out"))" || bad "checkpoints differ: $out"

# --standalone: torch 1.x serves its c10d rendezvous on port 29400 (2.x picks a free one); when
# 29400 is taken here, the same rendezvous on a free port (what --standalone expands to)
if "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 29400))' 2>/dev/null; then
  rdzv=(--standalone)
else
  echo "port 29400 is taken: --rdzv_backend c10d on a free port instead of --standalone"
  rdzv=(--rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$(free_port)" --rdzv_id "ts$$")
fi
timeout 300 "${torchrun[@]}" "${rdzv[@]}" --nproc_per_node 2 --no_python "$TS" "${common[@]}" \
  --checkpoint "$T/standalone.ckpt" > "$T/standalone.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "torchrun ${rdzv[0]} --nproc_per_node 2 tessera train" \
  || bad "torchrun ${rdzv[*]} (exit $rc): $(cat "$T/standalone.log")"
[ "$(grep -c "training mlp.*2 ranks (DDP)" "$T/standalone.log")" = 1 ] && ok "one 2-rank job (${rdzv[0]})" \
  || bad "not one 2-rank job: $(cat "$T/standalone.log")"
out=$("$TS" ckpt diff "$T/ref.ckpt" "$T/standalone.ckpt" --tol 1e-5 2>&1) \
  && ok "${rdzv[0]} run equals --nproc 2 ($(tail -1 <<<"$out"))" || bad "checkpoints differ (${rdzv[0]}): $out"

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
port=$(free_port)
TS_JOB_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n') timeout 300 "${torchrun[@]}" \
  --nproc_per_node 2 --max_restarts 1 --master_addr 127.0.0.1 --master_port "$port" --no_python "$T/kill1.sh" \
  > "$T/restart.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "torchrun --max_restarts 1: finished after a killed rank" \
  || bad "torchrun --max_restarts (exit $rc): $(cat "$T/restart.log")"
grep -q "resumed from $T/k/step-" "$T/restart.log" && ok "attempt 1 resumed from the checkpoint folder" \
  || bad "no resume: $(cat "$T/restart.log")"
out=$("$TS" ckpt diff "$T/ref_dir/step-000000000200.ckpt" "$T/k/step-000000000200.ckpt" --tol 1e-5 2>&1) \
  && ok "restarted torchrun run equals an uninterrupted one ($(tail -1 <<<"$out"))" || bad "restart: $out"

cli_summary
