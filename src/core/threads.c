/*
 * core/threads.c — one knob for the CPU thread count of our OpenMP kernels.
 * OpenBLAS stays single-threaded; src/ops/cpu/blas.c splits large products over
 * these threads itself (see there why OpenBLAS's own count is never changed).
 */
#include "core/internal.h"

#include <omp.h>

void ts_set_num_threads(int n) {
    if (n < 1) n = 1;
    omp_set_num_threads(n);
}

int ts_get_num_threads(void) { return omp_get_max_threads(); }

size_t ts_dtype_size(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return 4;
    case TS_F16: return 2;
    case TS_BF16: return 2;
    case TS_I64: return 8;
    case TS_I32: return 4;
    case TS_U8: return 1;
    default: return 0;
    }
}

const char *ts_dtype_name(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return "float32";
    case TS_F16: return "float16";
    case TS_BF16: return "bfloat16";
    case TS_I64: return "int64";
    case TS_I32: return "int32";
    case TS_U8: return "uint8";
    default: return "unknown";
    }
}
