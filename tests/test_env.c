/*
 * tests/test_env.c — the registry of TS_* environment variables (core/env.c, tessera/env.h): every row
 * complete, good values of each type, a bad value warns once and gives the default, ranges (refused or
 * clamped), strict variables are errors and not warnings, enum names in any case, read-once variables kept
 * until ts_env_reload and live ones read at each use, secrets hidden, the logger's own variable.
 */
#include "test_util.h"

#include "core/env.h"

#include <limits.h>
#include <pthread.h>

/* ---- the log, captured ---- */
static int n_warn;
static char last_warn[1024];

static void sink(ts_log_level level, const char *msg, void *user) {
    (void)user;
    if (level != TS_LOG_WARN) return;
    n_warn++;
    snprintf(last_warn, sizeof last_warn, "%s", msg);
}

static void capture(void) {
    n_warn = 0;
    last_warn[0] = 0;
    ts_log_set_sink(sink, NULL);
}

static void release(void) { ts_log_set_sink(NULL, NULL); }

/* First: the logger reads TS_LOG_LEVEL through the registry, and a bad value's warning goes through the
 * logger, which asks for the level again (no deadlock, no endless recursion). */
static void test_log_level_bad(void) {
    setenv("TS_LOG_LEVEL", "loud", 1);
    ts_env_reload();
    capture();
    ts_log(TS_LOG_WARN, "hello");
    CHECK(ts_env_enum(TS_ENV_LOG_LEVEL) == TS_LOG_WARN);
    CHECK(strcmp(last_warn, "hello") == 0);
    CHECK(n_warn >= 1);
    release();
    unsetenv("TS_LOG_LEVEL");
    ts_env_reload();
}

static void test_registry_complete(void) {
    static const char *const sections[] = {"Numbers and kernels", "Devices and memory", "Input limits", "Distributed",
                                           "Logging"};
    CHECK(ts_env_count() == TS_ENV_COUNT);
    int sec = 0;
    for (int i = 0; i < ts_env_count(); i++) {
        ts_env_info in;
        CHECK_OK(ts_env_info_get(i, &in));
        CHECK(strncmp(in.name, "TS_", 3) == 0 && strcmp(in.name, ts_env_name((ts_env_id)i)) == 0);
        CHECK(in.doc && in.doc[0] && in.default_text && in.default_text[0] && in.values && in.values[0]);
        CHECK(in.type_name && (int)in.type < TS_ENV_TYPE_COUNT);
        /* the sections in docs/env.md's order, each one contiguous */
        while (sec < 5 && strcmp(in.section, sections[sec]) != 0) sec++;
        CHECK(sec < 5);
        int j = -1;
        CHECK_OK(ts_env_find(in.name, &j));
        CHECK(j == i); /* names unique */
    }
    ts_env_info in;
    CHECK_STATUS(ts_env_info_get(TS_ENV_COUNT, &in), TS_ERR_INVALID_ARG);
    int j = 0;
    CHECK_STATUS(ts_env_find("TS_NO_SUCH_THING", &j), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_NO_SUCH_THING");
}

/* The enum-typed variables list their names in the order of the library's enums. */
static void test_enum_orders(void) {
    ts_env_info in;
    CHECK_OK(ts_env_info_get(TS_ENV_CONV_ALGO, &in));
    char want[256] = "";
    for (int a = 0; a <= TS_CONV_ONEDNN; a++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", a ? ", " : "", ts_conv_algo_name((ts_conv_algo)a));
    CHECK(strcmp(in.values, want) == 0);
    CHECK_OK(ts_env_info_get(TS_ENV_LOG_LEVEL, &in));
    CHECK(strcmp(in.values, "debug, info, warn, error, off") == 0);
    CHECK_OK(ts_env_info_get(TS_ENV_DIST_TRANSPORT, &in));
    CHECK(strcmp(in.values, "auto, shm, tcp") == 0);
    CHECK_OK(ts_env_info_get(TS_ENV_MATMUL_PRECISION, &in));
    CHECK(strcmp(in.values, "fp32, bf16, fp16") == 0);
}

static void test_defaults(void) {
    static const char *const vars[] = {"TS_DIST_TIMEOUT", "TS_HEARTBEAT_TIMEOUT", "TS_SHM_DIR", "TS_JOB_TOKEN",
                                       "TS_DIST_SPIN", "TS_MPI_MAX_COUNT", "TS_MAX_IMAGE_PIXELS", "TS_DIST_TRANSPORT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    CHECK(ts_env_double(TS_ENV_DIST_TIMEOUT) == TS_DIST_DEFAULT_TIMEOUT_S);
    CHECK(ts_env_double(TS_ENV_HEARTBEAT_TIMEOUT) == TS_HEARTBEAT_DEFAULT_TIMEOUT_S);
    CHECK(strcmp(ts_env_str(TS_ENV_SHM_DIR), "/dev/shm") == 0);
    CHECK(ts_env_str(TS_ENV_JOB_TOKEN) == NULL && !ts_env_is_set(TS_ENV_JOB_TOKEN));
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 300);
    CHECK(ts_env_int(TS_ENV_MPI_MAX_COUNT) == INT_MAX);
    CHECK(ts_env_int(TS_ENV_MAX_IMAGE_PIXELS) == 64ll << 20);
    CHECK(ts_env_enum(TS_ENV_DIST_TRANSPORT) == TS_ENV_TRANSPORT_AUTO);
    CHECK_OK(ts_env_check(TS_ENV_DIST_TIMEOUT));
    setenv("TS_DIST_SPIN", "", 1); /* empty is unset */
    CHECK(!ts_env_is_set(TS_ENV_DIST_SPIN) && ts_env_int(TS_ENV_DIST_SPIN) == 300);
    unsetenv("TS_DIST_SPIN");
}

/* Good values of each type (live variables: read at each use). */
static void test_good_values(void) {
    capture();
    setenv("TS_DIST_RING_THRESHOLD", "2m", 1);
    CHECK(ts_env_int(TS_ENV_DIST_RING_THRESHOLD) == 2 << 20);
    setenv("TS_DIST_RING_THRESHOLD", "64K", 1);
    CHECK(ts_env_int(TS_ENV_DIST_RING_THRESHOLD) == 64 << 10);
    setenv("TS_DIST_RING_THRESHOLD", " 1000 ", 1);
    CHECK(ts_env_int(TS_ENV_DIST_RING_THRESHOLD) == 1000);
    setenv("TS_DIST_RING_THRESHOLD", "0", 1);
    CHECK(ts_env_int(TS_ENV_DIST_RING_THRESHOLD) == 0);
    unsetenv("TS_DIST_RING_THRESHOLD");
    setenv("TS_DIST_TIMEOUT", "2.5", 1);
    CHECK(ts_env_double(TS_ENV_DIST_TIMEOUT) == 2.5);
    unsetenv("TS_DIST_TIMEOUT");
    setenv("TS_MAX_IMAGE_PIXELS", "1M", 1);
    CHECK(ts_env_int(TS_ENV_MAX_IMAGE_PIXELS) == 1 << 20);
    unsetenv("TS_MAX_IMAGE_PIXELS");
    static const char *const yes[] = {"1", "true", "YES", "On"}, *const no[] = {"0", "false", "no", "OFF"};
    for (int i = 0; i < 4; i++) {
        setenv("TS_MPI_CHECK", yes[i], 1);
        CHECK(ts_env_bool(TS_ENV_MPI_CHECK));
        setenv("TS_MPI_CHECK", no[i], 1);
        CHECK(!ts_env_bool(TS_ENV_MPI_CHECK));
    }
    unsetenv("TS_MPI_CHECK");
    setenv("TS_DIST_TRANSPORT", "TCP", 1); /* names in any case */
    CHECK(ts_env_enum(TS_ENV_DIST_TRANSPORT) == TS_ENV_TRANSPORT_TCP);
    setenv("TS_DIST_TRANSPORT", "shm", 1);
    CHECK(ts_env_enum(TS_ENV_DIST_TRANSPORT) == TS_ENV_TRANSPORT_SHM);
    unsetenv("TS_DIST_TRANSPORT");
    setenv("TS_AUTOCAST", "BFloat16", 1); /* an alias */
    CHECK(ts_env_enum(TS_ENV_AUTOCAST) == TS_ENV_PREC_BF16);
    unsetenv("TS_AUTOCAST");
    setenv("TS_SHM_DIR", "/tmp/x", 1);
    CHECK(strcmp(ts_env_str(TS_ENV_SHM_DIR), "/tmp/x") == 0);
    unsetenv("TS_SHM_DIR");
    CHECK(n_warn == 0);
    release();
}

/* A value that does not parse: one warning naming the variable, the value and what is accepted; the default. */
static void test_bad_value_warns_once(void) {
    capture();
    setenv("TS_DIST_SPIN", "lots", 1);
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 300);
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 300);
    CHECK(ts_env_is_set(TS_ENV_DIST_SPIN));
    CHECK(n_warn == 1);
    CHECK(strstr(last_warn, "TS_DIST_SPIN='lots'") && strstr(last_warn, "an integer in [0, ") &&
          strstr(last_warn, "default (300)"));
    setenv("TS_DIST_SPIN", "12x", 1); /* another bad value: warned again, once */
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 300 && ts_env_int(TS_ENV_DIST_SPIN) == 300);
    CHECK(n_warn == 2);
    setenv("TS_DIST_SPIN", "7", 1);
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 7 && n_warn == 2);
    unsetenv("TS_DIST_SPIN");
    setenv("TS_DIST_TRANSPORT", "carrier-pigeon", 1);
    CHECK(ts_env_enum(TS_ENV_DIST_TRANSPORT) == TS_ENV_TRANSPORT_AUTO);
    CHECK(n_warn == 2); /* strict: the reader's error, not a warning */
    CHECK_STATUS(ts_env_check(TS_ENV_DIST_TRANSPORT), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_DIST_TRANSPORT='carrier-pigeon'");
    CHECK_ERR_MENTIONS("auto, shm, tcp");
    unsetenv("TS_DIST_TRANSPORT");
    CHECK_OK(ts_env_check(TS_ENV_DIST_TRANSPORT));
    release();
}

/* Ranges: out of range is refused (the default, or the reader's error), or clamped where the table says. */
static void test_ranges(void) {
    capture();
    setenv("TS_MPI_MAX_COUNT", "0", 1);
    CHECK(ts_env_int(TS_ENV_MPI_MAX_COUNT) == INT_MAX && n_warn == 1);
    unsetenv("TS_MPI_MAX_COUNT");
    setenv("TS_DIST_TIMEOUT", "0.001", 1);
    CHECK_STATUS(ts_env_check(TS_ENV_DIST_TIMEOUT), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_DIST_TIMEOUT='0.001'");
    setenv("TS_DIST_TIMEOUT", "soon", 1);
    CHECK_STATUS(ts_env_check(TS_ENV_DIST_TIMEOUT), TS_ERR_INVALID_ARG);
    CHECK(ts_env_double(TS_ENV_DIST_TIMEOUT) == TS_DIST_DEFAULT_TIMEOUT_S);
    unsetenv("TS_DIST_TIMEOUT");
    /* heartbeats: 0 or off turns them off; otherwise at least half a second */
    static const char *const off[] = {"0", "off", "OFF"};
    for (int i = 0; i < 3; i++) {
        setenv("TS_HEARTBEAT_TIMEOUT", off[i], 1);
        CHECK_OK(ts_env_check(TS_ENV_HEARTBEAT_TIMEOUT));
        CHECK(ts_env_double(TS_ENV_HEARTBEAT_TIMEOUT) == 0);
    }
    setenv("TS_HEARTBEAT_TIMEOUT", "0.001", 1);
    CHECK_STATUS(ts_env_check(TS_ENV_HEARTBEAT_TIMEOUT), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("0 or off, or a number in [0.5, ");
    setenv("TS_HEARTBEAT_TIMEOUT", "-3", 1);
    CHECK_STATUS(ts_env_check(TS_ENV_HEARTBEAT_TIMEOUT), TS_ERR_INVALID_ARG);
    unsetenv("TS_HEARTBEAT_TIMEOUT");
    CHECK(n_warn == 1);
    /* clamped with a warning: rings of at least 64 KiB, IDX payloads of at most 2^48 bytes */
    setenv("TS_DIST_SHM_BYTES", "1000", 1);
    CHECK(ts_env_int(TS_ENV_DIST_SHM_BYTES) == 64 << 10);
    CHECK(n_warn == 2 && strstr(last_warn, "TS_DIST_SHM_BYTES='1000'") && strstr(last_warn, "using 64k"));
    unsetenv("TS_DIST_SHM_BYTES");
    setenv("TS_IDX_MAX_BYTES", "99999999999g", 1);
    CHECK(ts_env_int(TS_ENV_IDX_MAX_BYTES) == 1ll << 48);
    setenv("TS_IDX_MAX_BYTES", "1m", 1);
    CHECK(ts_env_int(TS_ENV_IDX_MAX_BYTES) == 1 << 20);
    unsetenv("TS_IDX_MAX_BYTES");
    setenv("TS_OUTPUT_TERMINAL", "-1", 1);
    CHECK(ts_env_int(TS_ENV_OUTPUT_TERMINAL) == 0 && n_warn == 4);
    unsetenv("TS_OUTPUT_TERMINAL");
    release();
}

/* Read once: the first use's value is kept until ts_env_reload; live ones follow the environment. */
static void test_once_and_live(void) {
    setenv("TS_CPU_DEVICE_THREADS", "3", 1);
    ts_env_reload();
    CHECK(ts_env_int(TS_ENV_CPU_DEVICE_THREADS) == 3);
    setenv("TS_CPU_DEVICE_THREADS", "5", 1);
    CHECK(ts_env_int(TS_ENV_CPU_DEVICE_THREADS) == 3);
    ts_env_reload();
    CHECK(ts_env_int(TS_ENV_CPU_DEVICE_THREADS) == 5);
    unsetenv("TS_CPU_DEVICE_THREADS");
    CHECK(ts_env_int(TS_ENV_CPU_DEVICE_THREADS) == 5);
    ts_env_reload();
    CHECK(ts_env_int(TS_ENV_CPU_DEVICE_THREADS) == 0); /* unset: the device layer's cores / devices */
    ts_env_info in;
    CHECK_OK(ts_env_info_get(TS_ENV_CPU_DEVICE_THREADS, &in));
    CHECK(!in.live);
    CHECK_OK(ts_env_info_get(TS_ENV_DIST_SPIN, &in));
    CHECK(in.live);
    setenv("TS_DIST_SPIN", "5", 1);
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 5);
    setenv("TS_DIST_SPIN", "6", 1);
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 6);
    unsetenv("TS_DIST_SPIN");
    CHECK(ts_env_int(TS_ENV_DIST_SPIN) == 300);
}

static void *read_threads(void *arg) {
    *(int64_t *)arg = ts_env_int(TS_ENV_CPU_DEVICE_THREADS);
    return NULL;
}

/* Threads that read a variable for the first time at once all get the same value. */
static void test_threads(void) {
    setenv("TS_CPU_DEVICE_THREADS", "7", 1);
    ts_env_reload();
    pthread_t th[8];
    int64_t got[8];
    for (int i = 0; i < 8; i++) CHECK(pthread_create(&th[i], NULL, read_threads, &got[i]) == 0);
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        CHECK(got[i] == 7);
    }
    unsetenv("TS_CPU_DEVICE_THREADS");
    ts_env_reload();
}

/* The listing: values as set, secrets hidden, validation without warnings. */
static void test_listing(void) {
    capture();
    char buf[64];
    int tok = -1, gemm = -1;
    CHECK_OK(ts_env_find("TS_JOB_TOKEN", &tok));
    CHECK_OK(ts_env_find("TS_GEMM", &gemm));
    setenv("TS_JOB_TOKEN", "sesame", 1);
    CHECK(ts_env_value_text(tok, buf, sizeof buf) && strcmp(buf, "(set, hidden)") == 0);
    unsetenv("TS_JOB_TOKEN");
    CHECK(!ts_env_value_text(tok, buf, sizeof buf) && buf[0] == 0);
    setenv("TS_GEMM", "fortran", 1);
    CHECK(ts_env_value_text(gemm, buf, sizeof buf) && strcmp(buf, "fortran") == 0);
    CHECK_STATUS(ts_env_validate(gemm), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_GEMM='fortran'");
    CHECK_ERR_MENTIONS("onednn, openblas");
    setenv("TS_GEMM", "OpenBLAS", 1);
    CHECK_OK(ts_env_validate(gemm));
    unsetenv("TS_GEMM");
    CHECK_OK(ts_env_validate(gemm));
    CHECK(n_warn == 0);
    release();
}

TU_MAIN(T(test_log_level_bad), T(test_registry_complete), T(test_enum_orders), T(test_defaults), T(test_good_values),
        T(test_bad_value_warns_once), T(test_ranges), T(test_once_and_live), T(test_threads), T(test_listing))
