/*
 * device/cuda_check.h — the record behind a CUDA device's deferred index checks (device/cuda.h): what
 * the kernels of ops/cuda/misc.cu write on the device and device/cuda.c reads from its pinned host copy
 * at the next synchronisation. Plain C that .cu files include too.
 */
#ifndef TS_DEVICE_CUDA_CHECK_H
#define TS_DEVICE_CUDA_CHECK_H

#include <stddef.h>

#define TS_CU_NO_BAD 0xffffffffffffffffull /* no invalid position found */

/* Which op found a bad index, and the sizes its message names. */
enum { TS_CU_BAD_EMBEDDING = 1, TS_CU_BAD_CROSS_ENTROPY = 2 };
typedef struct ts_cu_bad_what {
    long long op;         /* TS_CU_BAD_EMBEDDING or TS_CU_BAD_CROSS_ENTROPY */
    long long a, b, c, d; /* embedding: n, num, dim, 0; cross_entropy: N, C, S, ignore_index */
} ts_cu_bad_what;

/* A device's index-check record (64 bytes, all ones when clear): one in device memory, written by the
 * kernels, and its pinned host copy (device/cuda.c). */
typedef struct ts_cu_bad_rec {
    unsigned long long pos; /* the first bad position kept until the host reports it; TS_CU_NO_BAD: none */
    long long val;          /* the index found there */
    ts_cu_bad_what what;    /* the op that found it */
    unsigned long long cur; /* the running op's first bad position (TS_CU_NO_BAD between ops) */
} ts_cu_bad_rec;

#endif /* TS_DEVICE_CUDA_CHECK_H */
