#!/usr/bin/env bash
# tests/cli_mpi.sh — `tessera train --backend mpi`: two DDP ranks under plain
# `mpirun -n 2` (no MASTER_ADDR: MPI is the rendezvous), `--nproc 2 --backend
# mpi` starting mpirun itself, `tessera bench allreduce --backend mpi`, and
# a bad --backend (exit 2). Skips (77) without mpirun or an MPI-enabled build.
#
# OpenMPI settings (as environment variables, so they reach the mpirun that
# `--nproc` starts too): shared memory only (btl self,vader), no binding (the
# ranks share 2 cores with whatever else runs), and no CMA single copy, which
# containers without CAP_SYS_PTRACE refuse (see tests/test_mpi_collectives.c).
set -u
TS=${1:?usage: cli_mpi.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
command -v mpirun >/dev/null || { echo "skip: no mpirun (apt-get install openmpi-bin)"; exit 77; }
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
export OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=(mpirun)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
. "$(dirname "$0")/testlib.sh"
test_tmpdir

common=(train --model mlp --batch-size 32 --seed 3 --quiet --epochs 1 --max-steps 12 --timeout 60 --threads 1)
# 1. plain mpirun: every rank is one DDP rank
timeout 300 "${MPIRUN[@]}" -n 2 "$TS" "${common[@]}" --backend mpi --checkpoint "$T/m.ckpt" \
  --metrics-json "$T/m.json" > "$T/a.log" 2>&1
rc=$?
if grep -q "not built into this Tessera" "$T/a.log"; then echo "skip: built without MPI"; exit 77; fi
[ $rc -eq 0 ] && ok "mpirun -n 2 tessera train --backend mpi" || bad "mpirun -n 2 train (exit $rc): $(cat "$T/a.log")"
grep -q "training mlp.*2 ranks (DDP)" "$T/a.log" && ok "2 DDP ranks" || bad "no DDP banner: $(cat "$T/a.log")"
[ "$(grep -c "test accuracy" "$T/a.log")" -ge 1 ] && ok "rank 0 evaluated" || bad "no evaluation: $(cat "$T/a.log")"
grep -q '"processes": 2' "$T/m.json" 2>/dev/null && ok "metrics: 2 processes" || bad "metrics: $(cat "$T/m.json" 2>&1)"
grep -q '"steps": 12' "$T/m.json" 2>/dev/null && ok "metrics: 12 steps" || bad "metrics steps: $(cat "$T/m.json" 2>&1)"

# 2. the same run through the built-in backend (tessera run) gives the same parameters, bit for bit
#    (two ranks: a + b is the same sum in any order, and halving is exact)
"$TS" "${common[@]}" --nproc 2 --checkpoint "$T/b.ckpt" > "$T/b.log" 2>&1 || bad "--nproc 2 builtin: $(cat "$T/b.log")"
out=$("$TS" ckpt diff "$T/m.ckpt" "$T/b.ckpt" --tol 0 2>&1) && ok "mpi and builtin runs give the same parameters" \
  || bad "mpi vs builtin checkpoints differ: $out"

# 3. --nproc 2 --backend mpi starts mpirun itself
timeout 300 "$TS" "${common[@]}" --nproc 2 --backend mpi > "$T/c.log" 2>&1 && ok "--nproc 2 --backend mpi" \
  || bad "--nproc 2 --backend mpi: $(cat "$T/c.log")"
grep -q "2 ranks (DDP)" "$T/c.log" && ok "--nproc 2 --backend mpi ran 2 ranks" || bad "no DDP banner: $(cat "$T/c.log")"

# 4. usage errors
out=$("$TS" train --backend carrier-pigeon 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown --backend 'carrier-pigeon'" <<<"$out" && ok "bad --backend -> 2" || bad "bad --backend ($rc): $out"
out=$("$TS" bench allreduce --backend mpi 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "runs under mpirun" <<<"$out" && ok "bench --backend mpi outside mpirun -> 2" || bad "bench outside mpirun ($rc): $out"

# 5. the benchmark's exact check, under mpirun
out=$(timeout 120 "${MPIRUN[@]}" -n 2 "$TS" bench allreduce --backend mpi --max-bytes 1M --step 4 --time 0.02 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "backend mpi" <<<"$out" && ok "bench allreduce --backend mpi" || bad "bench allreduce --backend mpi ($rc): $out"

cli_summary
