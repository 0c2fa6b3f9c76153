/*
 * core/env.h — the library's typed accessors for its TS_* environment variables (NCCL_PARAM's idea): every
 * variable is declared once, in core/env.c's table (name, type, range or names, default, one line of doc, its
 * section of docs/env.md); code reads it by id, never by name, and never calls getenv("TS_...") itself.
 *
 *   - A variable read "once" is read at its first use and kept (ts_env_reload forgets it); a "live" one is
 *     read at every use (the launcher sets it per child, a tool or a test sets it while the program runs) and
 *     parsed again only when its text has changed.
 *   - A value that does not parse, or lies out of range, gives one warning (through the logger) naming the
 *     variable, the value and what is accepted, and the default is used. For a "strict" variable it is an
 *     error instead: the part that reads it calls ts_env_check first and fails with its message; the typed
 *     accessor then gives the default without a warning.
 *   - Enum names and booleans match in any case; sizes take k, m, g suffixes (x 2^10, 2^20, 2^30).
 *
 * Thread-safe. The public listing (index == id) is include/tessera/env.h.
 */
#ifndef TS_CORE_ENV_H
#define TS_CORE_ENV_H

#include "tessera/core.h"
#include "tessera/env.h"

#include <stdint.h>

/* One id per variable, in the table's order (core/env.c); grouped as docs/env.md's sections. */
typedef enum ts_env_id {
    /* Numbers and kernels */
    TS_ENV_AUTOCAST,
    TS_ENV_MATMUL_PRECISION,
    TS_ENV_CONV_ALGO,
    TS_ENV_GEMM,
    TS_ENV_CUDNN_ALGO,
    TS_ENV_CUDA_CONV_BF16,
    /* Devices and memory */
    TS_ENV_CPU_DEVICES,
    TS_ENV_CPU_DEVICE_THREADS,
    TS_ENV_CPU_CACHE_MB,
    TS_ENV_CUDA_CACHE_MB,
    TS_ENV_NVJPEG_LIB,
    /* Input limits */
    TS_ENV_MAX_IMAGE_PIXELS,
    TS_ENV_IDX_MAX_BYTES,
    /* Distributed */
    TS_ENV_JOB_TOKEN,
    TS_ENV_ALLOW_UNAUTHENTICATED,
    TS_ENV_DIST_TIMEOUT,
    TS_ENV_HEARTBEAT_TIMEOUT,
    TS_ENV_HEARTBEAT_INTERVAL,
    TS_ENV_DIST_TRANSPORT,
    TS_ENV_SOCKET_IFNAME,
    TS_ENV_DIST_IFADDR,
    TS_ENV_DIST_RING_THRESHOLD,
    TS_ENV_DIST_SHM_BYTES,
    TS_ENV_DIST_SHM_CHUNK,
    TS_ENV_DIST_SPIN,
    TS_ENV_SHM_DIR,
    TS_ENV_MPI_CHECK,
    TS_ENV_MPI_MAX_COUNT,
    TS_ENV_FLIGHT_RECORDER_DIR,
    TS_ENV_RUN_DIR,
    TS_ENV_LAUNCHED_BY,
    TS_ENV_STORE_LISTEN_FD,
    TS_ENV_OUTPUT_TERMINAL,
    /* Logging */
    TS_ENV_LOG_LEVEL,
    TS_ENV_COUNT
} ts_env_id;

/* The values of the enum-typed variables, in the order of their names in the table. */
typedef enum { TS_ENV_GEMM_ONEDNN, TS_ENV_GEMM_OPENBLAS } ts_env_gemm;
typedef enum { TS_ENV_CUDNN_HEURISTIC, TS_ENV_CUDNN_FIND, TS_ENV_CUDNN_BENCHMARK } ts_env_cudnn_algo;
typedef enum { TS_ENV_TRANSPORT_AUTO, TS_ENV_TRANSPORT_SHM, TS_ENV_TRANSPORT_TCP } ts_env_transport;
/* TS_AUTOCAST and TS_MATMUL_PRECISION: fp32, bf16, fp16 (TS_AUTOCAST takes the first two) */
typedef enum { TS_ENV_PREC_FP32, TS_ENV_PREC_BF16, TS_ENV_PREC_FP16 } ts_env_precision;
/* TS_CONV_ALGO: ts_conv_algo's order; TS_LOG_LEVEL: ts_log_level's */

/* The variable's name ("TS_DIST_TIMEOUT"). */
const char *ts_env_name(ts_env_id id);

/* Whether the variable is set to a non-empty value now (whether or not it parses). */
bool ts_env_is_set(ts_env_id id);

/* TS_OK when the value is unset or accepted; else TS_ERR_INVALID_ARG naming the variable, the value and what
 * is accepted. For the strict variables (TS_DIST_TIMEOUT, TS_HEARTBEAT_*, TS_DIST_TRANSPORT). */
ts_status ts_env_check(ts_env_id id);

/* The value, or the registered default when unset or not accepted. int and size variables: ts_env_int;
 * double: ts_env_double; bool: ts_env_bool; enum: ts_env_enum (the index of the name); string and path:
 * ts_env_str (the default text's string when unset, which may be NULL; a live variable's pointer is the
 * environment's own, valid until it is changed; a read-once one's until ts_env_reload). Asking a variable of
 * another type is a programming error (the default of the asked type is given, and a debug assertion fires). */
int64_t ts_env_int(ts_env_id id);
double ts_env_double(ts_env_id id);
bool ts_env_bool(ts_env_id id);
int ts_env_enum(ts_env_id id);
const char *ts_env_str(ts_env_id id);

#endif
