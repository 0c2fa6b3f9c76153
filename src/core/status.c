/*
 * core/status.c — status names and the thread-local last-error message.
 */
#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>


static _Thread_local char ts_errmsg[TS_ERRMSG_MAX];

static const struct {
    ts_status s;
    const char *name, *str;
} ts_status_table[] = {
    {TS_OK, "TS_OK", "success"},
    {TS_ERR_INVALID_ARG, "TS_ERR_INVALID_ARG", "invalid argument"},
    {TS_ERR_SHAPE, "TS_ERR_SHAPE", "shape mismatch"},
    {TS_ERR_DTYPE, "TS_ERR_DTYPE", "unsupported dtype"},
    {TS_ERR_DEVICE, "TS_ERR_DEVICE", "device error"},
    {TS_ERR_NOMEM, "TS_ERR_NOMEM", "out of memory"},
    {TS_ERR_IO, "TS_ERR_IO", "I/O error"},
    {TS_ERR_FORMAT, "TS_ERR_FORMAT", "malformed data"},
    {TS_ERR_STATE, "TS_ERR_STATE", "invalid state"},
    {TS_ERR_UNSUPPORTED, "TS_ERR_UNSUPPORTED", "unsupported"},
    {TS_ERR_TIMEOUT, "TS_ERR_TIMEOUT", "timed out"},
    {TS_ERR_REMOTE, "TS_ERR_REMOTE", "remote peer failed"},
    {TS_ERR_INTERNAL, "TS_ERR_INTERNAL", "internal error"},
};

const char *ts_status_name(ts_status s) {
    for (size_t i = 0; i < TS_ARRAY_LEN(ts_status_table); i++)
        if (ts_status_table[i].s == s) return ts_status_table[i].name;
    return "TS_ERR_UNKNOWN";
}

const char *ts_status_str(ts_status s) {
    for (size_t i = 0; i < TS_ARRAY_LEN(ts_status_table); i++)
        if (ts_status_table[i].s == s) return ts_status_table[i].str;
    return "unknown status";
}

const char *ts_last_error(void) { return ts_errmsg; }

void ts_clear_error(void) { ts_errmsg[0] = '\0'; }

ts_status ts_error(ts_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ts_errmsg, sizeof ts_errmsg, fmt, ap);
    va_end(ap);
    return s;
}

ts_status ts__error_prefix(ts_status s, const char *fmt, ...) {
    char prev[TS_ERRMSG_MAX], ctx[256];
    memcpy(prev, ts_errmsg, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    const char *rest = prev[0] ? prev : ts_status_str(s);
    size_t n = strlen(ctx);
    if (n > TS_ERRMSG_MAX - 3) n = TS_ERRMSG_MAX - 3;
    memcpy(ts_errmsg, ctx, n);
    memcpy(ts_errmsg + n, ": ", 2);
    size_t room = TS_ERRMSG_MAX - n - 3;
    size_t m = strlen(rest);
    if (m > room) m = room;
    memcpy(ts_errmsg + n + 2, rest, m);
    ts_errmsg[n + 2 + m] = '\0';
    return s;
}

void *ts__malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) ts_error(TS_ERR_NOMEM, "out of host memory allocating %zu bytes", n);
    return p;
}

void *ts__calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) ts_error(TS_ERR_NOMEM, "out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

char *ts__strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = ts__malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}
