/*
 * core/status.c — status names and the thread-local last-error message.
 */
#include "core/internal.h"

#include <stdarg.h>
#include <stdatomic.h>
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

const char *ts__name_list(const char *const *names, int n, char *buf, size_t cap) {
    int left = 0, k = 0;
    for (int i = 0; i < n; i++) left += names[i] != NULL;
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        if (names[i]) {
            k++;
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", k == 1 ? "" : k == left ? " or " : ", ", names[i]);
        }
    return buf;
}

/* Whether byte c is written as \xNN: control characters (newlines too, unless lines are kept). */
static bool escaped(unsigned char c, bool keep_lines) { return (c < 0x20 && !(keep_lines && c == '\n')) || c == 0x7f; }

void ts__escape_controls(char *msg, size_t cap, bool keep_lines) {
    size_t n = strlen(msg), extra = 0;
    for (size_t i = 0; i < n; i++) extra += escaped((unsigned char)msg[i], keep_lines) ? 3 : 0;
    if (!extra) return;
    /* from the end, so that each byte moves once; what does not fit in cap is cut */
    size_t out = n + extra < cap ? n + extra : cap - 1;
    for (size_t i = n, o = n + extra; i-- > 0;) {
        unsigned char c = (unsigned char)msg[i];
        if (escaped(c, keep_lines)) {
            char e[5];
            snprintf(e, sizeof e, "\\x%02x", c);
            for (int k = 3; k >= 0; k--)
                if (--o < out) msg[o] = e[k];
        } else if (--o < out) {
            msg[o] = (char)c;
        }
    }
    msg[out] = 0; /* last: when cut, the byte at out was still to be read */
}

ts_status ts_error(ts_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ts_errmsg, sizeof ts_errmsg, fmt, ap);
    va_end(ap);
    ts__escape_controls(ts_errmsg, sizeof ts_errmsg, false);
    return s;
}

ts_status ts__error_prefix(ts_status s, const char *fmt, ...) {
    char prev[TS_ERRMSG_MAX], ctx[256];
    memcpy(prev, ts_errmsg, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    ts__escape_controls(ctx, sizeof ctx, false);
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

/* ---- allocation and failure injection ----------------------------------------------------------- */
/* Allocations still to succeed before injected failures start; -1: disarmed. */
static _Atomic long ts_fail_countdown = -1;
static _Atomic bool ts_fail_once;       /* disarm after the first injected failure */
static _Atomic long ts_fail_injected;   /* failures injected since the last arming */
static _Atomic long ts_fail_seen;       /* allocations seen since the last arming */

static void fail_arm(long n, bool once) {
    atomic_store(&ts_fail_countdown, -1); /* quiet while the counters reset */
    atomic_store(&ts_fail_injected, 0);
    atomic_store(&ts_fail_seen, 0);
    atomic_store(&ts_fail_once, once);
    atomic_store(&ts_fail_countdown, n < 0 ? -1 : n);
}

void ts__alloc_fail_after(long n) { fail_arm(n, false); }
void ts__alloc_fail_once_after(long n) { fail_arm(n, true); }
long ts__alloc_failures(void) { return atomic_load(&ts_fail_injected); }
long ts__alloc_count(void) { return atomic_load(&ts_fail_seen); }

bool ts__alloc_injected_failure(void) {
    long c = atomic_load_explicit(&ts_fail_countdown, memory_order_relaxed);
    if (c < 0) return false; /* disarmed: the common case costs one load */
    atomic_fetch_add(&ts_fail_seen, 1);
    for (;;) {
        if (c < 0) return false;
        if (c > 0) {
            if (atomic_compare_exchange_weak(&ts_fail_countdown, &c, c - 1)) return false;
            continue;
        }
        if (atomic_load(&ts_fail_once) && !atomic_compare_exchange_weak(&ts_fail_countdown, &c, -1)) continue;
        atomic_fetch_add(&ts_fail_injected, 1);
        return true;
    }
}

void *ts__malloc(size_t n) {
    void *p = ts__alloc_injected_failure() ? NULL : malloc(n ? n : 1);
    if (!p) ts_error(TS_ERR_NOMEM, "out of host memory allocating %zu bytes", n);
    return p;
}

void *ts__calloc(size_t n, size_t size) {
    void *p = ts__alloc_injected_failure() ? NULL : calloc(n ? n : 1, size ? size : 1);
    if (!p) ts_error(TS_ERR_NOMEM, "out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *ts__realloc(void *old, size_t n) {
    void *p = ts__alloc_injected_failure() ? NULL : realloc(old, n ? n : 1);
    if (!p) ts_error(TS_ERR_NOMEM, "out of host memory growing a block to %zu bytes", n);
    return p;
}

char *ts__strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = ts__malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- assertions (debug builds) ------------------------------------------------------------------- */
_Noreturn void ts__assert_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* straight to stderr, not the logger: the process is about to abort and a
     * sink or a level must not hide why */
    fprintf(stderr, "tessera: internal assertion failed at %s:%d: %s: %s\n", file, line, cond, msg);
    fflush(stderr);
    abort();
}
