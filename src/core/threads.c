/*
 * core/threads.c — process-wide CPU execution settings: the thread count of our
 * OpenMP kernels (and a launched rank's share of the CPUs), OpenMP's wait policy
 * default, and the conv2d algorithm. OpenBLAS stays single-threaded;
 * src/ops/cpu/blas.c splits large products over these threads itself (see
 * there why OpenBLAS's own count is never changed).
 */
#include "core/env.h"
#include "core/internal.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- thread count -------------------------------------------------------------------------------
 * OpenMP's own default (OMP_NUM_THREADS, else the CPUs of the affinity mask) until either the program
 * chooses (ts_set_num_threads: `explicit_threads`) or a launched rank learns how many ranks share its
 * host (ts__threads_share, from ts_pg_new): then CPUs / local ranks, unless OMP_NUM_THREADS was set or
 * the program chose. OpenMP's count is per thread (the calling thread's ICV); both set the caller's. */
static _Atomic int explicit_threads;

void ts_set_num_threads(int n) {
    if (n < 1) n = 1;
    atomic_store(&explicit_threads, 1);
    omp_set_num_threads(n);
}

int ts_get_num_threads(void) { return omp_get_max_threads(); }

int ts__cpu_count(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n;
}

int ts__threads_share(int local_ranks) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (local_ranks < 1 || atomic_load(&explicit_threads) || (env && *env)) return ts_get_num_threads();
    int n = ts__cpu_count() / local_ranks;
    omp_set_num_threads(n < 1 ? 1 : n);
    return ts_get_num_threads();
}

/* OpenMP's environment as Tessera wants it where the user said nothing (ts_threads_env_defaults). */
static const char *const env_defaults[] = {"OMP_WAIT_POLICY=passive", NULL};

const char *const *ts__threads_env_default_list(void) { return env_defaults; }

bool ts_threads_env_defaults(void) {
    bool changed = false;
    for (const char *const *d = env_defaults; *d; d++) {
        char name[64];
        size_t n = strcspn(*d, "=");
        snprintf(name, sizeof name, "%.*s", (int)n, *d);
        const char *v = getenv(name);
        if (!(v && *v)) changed |= setenv(name, *d + n + 1, 1) == 0;
    }
    return changed;
}

/* ---- conv algorithm (read by the CPU spatial kernels) ---- */
static _Atomic int conv_algo = -1; /* -1: not yet read from TS_CONV_ALGO */

static int conv_algo_index(const char *s) {
    static const char *const names[] = {"auto", "im2col", "winograd", "winograd-f2", "winograd-f4", "onednn"};
    for (int i = 0; s && i < 6; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

ts_status ts_conv_algo_parse(const char *s, ts_conv_algo *out) {
    int i = conv_algo_index(s);
    if (i >= 0) {
        *out = (ts_conv_algo)i;
        return TS_OK;
    }
    return ts_error(TS_ERR_INVALID_ARG, "conv algorithm '%s': expected auto, im2col, winograd, winograd-f2, winograd-f4 or onednn", s ? s : "(null)");
}

const char *ts_conv_algo_name(ts_conv_algo a) {
    switch (a) {
    case TS_CONV_AUTO: return "auto";
    case TS_CONV_IM2COL: return "im2col";
    case TS_CONV_WINOGRAD: return "winograd";
    case TS_CONV_WINOGRAD_F2: return "winograd-f2";
    case TS_CONV_WINOGRAD_F4: return "winograd-f4";
    case TS_CONV_ONEDNN: return "onednn";
    default: return "unknown";
    }
}

void ts_set_conv_algo(ts_conv_algo a) { conv_algo = (int)a; }

/* ---- matmul precision (read by the CPU blas kernels and the conv dispatch) ---- */
static _Atomic int matmul_precision = -1; /* -1: not yet read from TS_MATMUL_PRECISION */

ts_status ts_set_matmul_precision(ts_dtype dt) {
    TS_ARG(dt == TS_F32 || dt == TS_BF16 || dt == TS_F16, "ts_set_matmul_precision: %s (want float32, bfloat16 or float16)",
           ts_dtype_name(dt));
    matmul_precision = (int)dt;
    return TS_OK;
}

/* A dtype setting *v, read once from environment variable id while unset (-1): fp32, bf16 or fp16 (core/env.c
 * names the values it takes; another value warns there and gives fp32) */
static ts_dtype dtype_setting(_Atomic int *v, ts_env_id id) {
    int p = *v;
    if (p < 0) {
        static const ts_dtype dts[] = {[TS_ENV_PREC_FP32] = TS_F32, [TS_ENV_PREC_BF16] = TS_BF16, [TS_ENV_PREC_FP16] = TS_F16};
        ts_dtype dt = dts[ts_env_enum(id)];
        int expect = -1;
        atomic_compare_exchange_strong(v, &expect, (int)dt);
        p = *v;
    }
    return (ts_dtype)p;
}

ts_dtype ts_get_matmul_precision(void) { return dtype_setting(&matmul_precision, TS_ENV_MATMUL_PRECISION); }

/* ---- autocast (read by the op layer: ops/half.c) ---- */
static _Atomic int autocast = -1; /* -1: not yet read from TS_AUTOCAST */

ts_status ts_set_autocast(ts_dtype dt) {
    TS_ARG(dt == TS_F32 || dt == TS_BF16, "ts_set_autocast: %s (want float32: off, or bfloat16)", ts_dtype_name(dt));
    autocast = (int)dt;
    return TS_OK;
}

ts_dtype ts_get_autocast(void) { return dtype_setting(&autocast, TS_ENV_AUTOCAST); }

ts_conv_algo ts_get_conv_algo(void) {
    int a = conv_algo;
    if (a < 0) { /* TS_CONV_ALGO's names are ts_conv_algo's order; a bad one warns (core/env.c), then auto */
        int v = ts_env_enum(TS_ENV_CONV_ALGO);
        int expect = -1;
        atomic_compare_exchange_strong(&conv_algo, &expect, v);
        a = conv_algo;
    }
    return (ts_conv_algo)a;
}
