/*
 * core/log.c — the logger: a level (TS_LOG_LEVEL) and a replaceable sink.
 */
#include "core/env.h"
#include "core/internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static ts_log_level ts_level = (ts_log_level)-1; /* unset: read the environment */
static ts_log_fn ts_sink;
static void *ts_sink_user;
static pthread_mutex_t ts_log_mu = PTHREAD_MUTEX_INITIALIZER;

/* TS_LOG_LEVEL (core/env.c: debug, info, warn, error, off in any case; a bad value warns and gives warn) */
static ts_log_level level_from_env(void) { return (ts_log_level)ts_env_enum(TS_ENV_LOG_LEVEL); }

void ts_log_set_level(ts_log_level level) { ts_level = level; }

ts_log_level ts_log_get_level(void) {
    if ((int)ts_level < 0) ts_level = level_from_env();
    return ts_level;
}

void ts_log_set_sink(ts_log_fn fn, void *user) {
    pthread_mutex_lock(&ts_log_mu);
    ts_sink = fn;
    ts_sink_user = user;
    pthread_mutex_unlock(&ts_log_mu);
}

void ts_log(ts_log_level level, const char *fmt, ...) {
    if (level < ts_log_get_level() || level >= TS_LOG_OFF) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts__escape_controls(msg, sizeof msg, true); /* multi-line reports (the flight recorder) stay so */
    pthread_mutex_lock(&ts_log_mu);
    if (ts_sink) {
        ts_sink(level, msg, ts_sink_user);
    } else {
        static const char *tags[] = {"debug", "info", "warn", "error"};
        fprintf(stderr, "tessera %s: %s\n", tags[level], msg);
    }
    pthread_mutex_unlock(&ts_log_mu);
}

double ts_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
