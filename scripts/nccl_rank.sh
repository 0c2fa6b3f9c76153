#!/usr/bin/env bash
# Runs one rank of a job whose ranks share one GPU through the nccl backend, for tests on a one-GPU
# machine: NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"), so each rank gets a
# host id of its own (NCCL_HOSTID) and they talk over NCCL's socket transport on the loopback interface,
# as two machines would. Not for real jobs: give every rank its own GPU (--device cuda).
#
# usage: tessera run -n 2 scripts/nccl_rank.sh tessera train --device cuda:0 --backend nccl ...
export NCCL_HOSTID="tessera-test-rank-${RANK:?RANK is not set: run under tessera run or torchrun}"
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=1
exec "$@"
