#!/usr/bin/env bash
# tests/cli_launchers.sh — `tessera train` started by other launchers joins their
# job (ts_dist_env_detect) instead of running N independent copies:
#   1. plain `mpirun -n 2 tessera train` (builtin backend over OMPI_COMM_WORLD_*), with TS_JOB_TOKEN
#      and without (a token derived from mpirun's per-job key: no warning)
#   2. an srun-style environment (SLURM_* per rank, as srun sets them, two
#      processes started here; MASTER_ADDR from SLURM_JOB_NODELIST, MASTER_PORT
#      from SLURM_JOB_ID)
# each give ONE 2-rank job: one banner, one checkpoint written (by rank 0), equal
# to `tessera train --nproc 2` (ckpt diff --tol 1e-5; the measured maximum is
# printed). Then contradictory or partial variables exit 2 naming them, and an
# sbatch script's environment (no job step) trains alone. Parts needing mpirun
# are skipped without it (the rest still runs).
set -u
TS=${1:?usage: cli_launchers.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
export OMPI_MCA_rmaps_base_oversubscribe=1
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TS_LAUNCHED_BY
# other launchers set no job token: give the ranks one, as a job script would (see README)
export TS_JOB_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
for v in $(env | grep -o -E '^(SLURM_|OMPI_COMM_|PMI_|PMIX_|TORCHELASTIC_)[A-Z_]*'); do unset "$v"; done
. "$(dirname "$0")/testlib.sh"
test_tmpdir
count() { grep -c "$1" "$2" 2>/dev/null || true; }

common=(train --model mlp --max-steps 20 --batch-size 32 --seed 5 --quiet --epochs 1 --timeout 60 --threads 1)
# the reference: two ranks through tessera run
"$TS" "${common[@]}" --nproc 2 --checkpoint "$T/ref.ckpt" > "$T/ref.log" 2>&1 || bad "--nproc 2: $(cat "$T/ref.log")"

# One 2-rank job: one banner and one checkpoint line (rank 0's), and the reference's parameters.
same_job() { # name log ckpt
  [ "$(count "training mlp.*2 ranks (DDP)" "$2")" = 1 ] && ok "$1: one 2-rank job" || bad "$1: not one 2-rank job: $(cat "$2")"
  [ "$(count "saved checkpoint to" "$2")" = 1 ] && ok "$1: one checkpoint written" \
    || bad "$1: $(count "saved checkpoint to" "$2") checkpoint lines: $(cat "$2")"
  [ "$(count "^done:" "$2")" = 1 ] && ok "$1: rank 0 alone reports" || bad "$1: $(count "^done:" "$2") done lines"
  out=$("$TS" ckpt diff "$T/ref.ckpt" "$3" --tol 1e-5 2>&1) && ok "$1: parameters equal --nproc 2 ($(tail -1 <<<"$out"))" \
    || bad "$1: checkpoint differs from --nproc 2: $out"
}

# 1. plain mpirun, no --backend: the builtin backend over mpirun's variables
if command -v mpirun >/dev/null; then
  MPIRUN=(mpirun -n 2)
  [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
  timeout 300 "${MPIRUN[@]}" "$TS" "${common[@]}" --checkpoint "$T/mpi.ckpt" > "$T/mpi.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && ok "mpirun -n 2 tessera train" || bad "mpirun -n 2 train (exit $rc): $(cat "$T/mpi.log")"
  same_job "mpirun" "$T/mpi.log" "$T/mpi.ckpt"
  # without TS_JOB_TOKEN: the ranks derive one from mpirun's per-job key (no warning, same job)
  timeout 300 env -u TS_JOB_TOKEN "${MPIRUN[@]}" "$TS" "${common[@]}" --checkpoint "$T/mpi2.ckpt" > "$T/mpi2.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && ! grep -q "no job token" "$T/mpi2.log" && ok "mpirun without TS_JOB_TOKEN: authenticated, no warning" \
    || bad "mpirun without TS_JOB_TOKEN (exit $rc): $(cat "$T/mpi2.log")"
else
  echo "skip: no mpirun (apt-get install openmpi-bin): the mpirun part did not run"
fi

# 2. srun-style: what srun -n 2 sets for each task (one node), no MASTER_*
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
jobid=$(( (RANDOM << 8 | RANDOM) % 900000 + 100000 ))
while ! port_free $((10000 + jobid % 20000)); do jobid=$((jobid + 1)); done
for r in 0 1; do
  env SLURM_JOB_ID=$jobid SLURM_JOB_NODELIST=localhost SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2 \
      SLURM_STEP_TASKS_PER_NODE=2 SLURM_TASKS_PER_NODE=2 SLURM_NODEID=0 SLURM_PROCID=$r SLURM_LOCALID=$r \
      timeout 300 "$TS" "${common[@]}" --checkpoint "$T/srun.ckpt" > "$T/srun$r.log" 2>&1 &
  pids[$r]=$!
done
wait ${pids[0]}; rc0=$?
wait ${pids[1]}; rc1=$?
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && ok "srun-style environment: both ranks exit 0" \
  || bad "srun-style (exit $rc0, $rc1): $(cat "$T/srun0.log" "$T/srun1.log")"
cat "$T/srun0.log" "$T/srun1.log" > "$T/srun.log"
same_job "srun-style" "$T/srun.log" "$T/srun.ckpt"
[ -s "$T/srun1.log" ] && bad "srun rank 1 printed: $(cat "$T/srun1.log")" || ok "srun rank 1 printed nothing"

# 3. contradictory or partial variables: exit 2, naming them
out=$(env RANK=1 WORLD_SIZE=2 SLURM_PROCID=0 SLURM_STEP_ID=0 SLURM_NTASKS=2 "$TS" "${common[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "RANK=1" <<<"$out" && grep -q "SLURM_PROCID=0" <<<"$out" \
  && ok "RANK=1 under SLURM_PROCID=0 -> exit 2" || bad "RANK vs SLURM_PROCID ($rc): $out"
out=$(env RANK=1 "$TS" "${common[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "RANK=1 is set but WORLD_SIZE is not" <<<"$out" && ok "RANK without WORLD_SIZE -> exit 2" \
  || bad "RANK alone ($rc): $out"
out=$(env RANK=2 WORLD_SIZE=2 "$TS" "${common[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "RANK=2 is not less than WORLD_SIZE=2" <<<"$out" && ok "RANK >= WORLD_SIZE -> exit 2" \
  || bad "RANK >= WORLD_SIZE ($rc): $out"
out=$(env OMPI_COMM_WORLD_RANK=1 "$TS" "${common[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "OMPI_COMM_WORLD_SIZE is not" <<<"$out" && ok "partial mpirun variables -> exit 2" \
  || bad "OMPI rank alone ($rc): $out"
out=$(env SLURM_PROCID=0 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_JOB_NODELIST='node[01-' "$TS" "${common[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "SLURM_JOB_NODELIST='node\[01-' is not a Slurm host list" <<<"$out" \
  && ok "bad SLURM_JOB_NODELIST -> exit 2" || bad "bad nodelist ($rc): $out"

# 4. an sbatch script's own environment (no job step): one process, trains alone
out=$(env SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_JOB_ID=1 SLURM_JOB_NODELIST='node[1-4]' timeout 120 "$TS" train \
  --model mlp --max-steps 2 --batch-size 32 --quiet --epochs 1 --threads 1 2>&1); rc=$?
[ $rc -eq 0 ] && ! grep -q "ranks (DDP)" <<<"$out" && ok "sbatch script environment trains alone" \
  || bad "sbatch environment ($rc): $out"

cli_summary
