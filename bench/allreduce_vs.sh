#!/usr/bin/env bash
# All-reduce between N processes on this host, side by side in one run:
# Tessera's built-in backend, Tessera's "mpi" backend (OpenMPI's nonblocking
# MPI_Iallreduce behind Tessera's process group), OpenMPI's MPI_Allreduce and PyTorch's gloo,
# from 8 B to MAX bytes in x2 steps. Prints time (us) and busbw (GB/s) each.
#
# usage: bench/allreduce_vs.sh [BUILD_DIR] [N] [MAX_BYTES]
# Needs: python3-torch (gloo) and openmpi-bin + libopenmpi-dev (MPI, and a BUILD_DIR configured with MPI
# for the ts-mpi column):
#   TS_WITH_TORCH=1 scripts/install-deps
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
N=${2:-2}
MAX=${3:-268435456}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BUILD/tessera" bench allreduce -n "$N" --step 2 --max-bytes "$MAX" --json |
  sed -n 's/.*"bytes": \([0-9]*\).*"time_us": \([0-9.e+-]*\).*"busbw_gbs": \([0-9.e+-]*\).*/\1 \2 \3/p' > "$T/ts"
if command -v mpirun >/dev/null; then
  mpirun --allow-run-as-root --oversubscribe -np "$N" "$BUILD/tessera" bench allreduce --backend mpi --step 2 \
    --max-bytes "$MAX" --json 2>"$T/tsmpi.err" |
    sed -n 's/.*"bytes": \([0-9]*\).*"time_us": \([0-9.e+-]*\).*"busbw_gbs": \([0-9.e+-]*\).*/\1 \2 \3/p' > "$T/tsmpi"
  [ -s "$T/tsmpi" ] || echo "allreduce_vs: no ts-mpi column (was $BUILD built with MPI?): $(head -3 "$T/tsmpi.err")" >&2
else
  : > "$T/tsmpi"
fi
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 bench/mpi/allreduce_mpi.c -o "$T/mpi_ar"
  mpirun --allow-run-as-root --oversubscribe -np "$N" "$T/mpi_ar" "$MAX" |
    sed -n 's/.*"bytes": \([0-9]*\).*"time_us": \([0-9.e+-]*\).*"busbw": \([0-9.e+-]*\).*/\1 \2 \3/p' > "$T/mpi"
else
  echo "allreduce_vs: no OpenMPI (apt-get install openmpi-bin libopenmpi-dev); MPI column left empty" >&2
  : > "$T/mpi"
fi
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  /usr/bin/python3 bench/allreduce_gloo.py "$N" "$MAX" |
    sed -n 's/.*"bytes": \([0-9]*\).*"time_us": \([0-9.e+-]*\).*"busbw": \([0-9.e+-]*\).*/\1 \2 \3/p' > "$T/gloo"
else
  echo "allreduce_vs: no PyTorch (apt-get install python3-torch); gloo column left empty" >&2
  : > "$T/gloo"
fi
printf '%d processes; time in us, busbw in GB/s\n' "$N"
printf '%12s | %10s %8s | %10s %8s | %10s %8s | %10s %8s\n' bytes tessera busbw ts-mpi busbw mpi busbw gloo busbw
# one stream of "column bytes time busbw" (a column whose tool is missing is simply empty)
for f in ts tsmpi mpi gloo; do sed "s/^/$f /" "$T/$f"; done |
  awk '{c = $1 == "ts" ? 1 : $1 == "tsmpi" ? 2 : $1 == "mpi" ? 3 : 4;
        t[c,$2]=$3; b[c,$2]=$4; if (c==1) order[++n]=$2}
     END {for (i=1;i<=n;i++) {s=order[i];
       printf "%12d |", s;
       for (f=1; f<=4; f++) if ((f,s) in t) printf " %10.2f %8.3f |", t[f,s], b[f,s]; else printf " %10s %8s |", "-", "-";
       printf "\n"}}'
