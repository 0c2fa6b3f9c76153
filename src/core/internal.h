/*
 * core/internal.h — helpers shared by all of the library's source files.
 * Not installed; not part of the public API.
 */
#ifndef TS_CORE_INTERNAL_H
#define TS_CORE_INTERNAL_H

#include "tessera/core.h"
#include "tessera/tensor.h"

#include <stdlib.h>
#include <string.h>

#define TS_UNUSED(x) ((void)(x))
#define TS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TS_ERRMSG_MAX 1024 /* bytes of a thread's last error message */

/* Propagate a failing status: TS_TRY(ts_foo(...)); */
#define TS_TRY(expr)                        \
    do {                                    \
        ts_status ts__s = (expr);           \
        if (ts__s != TS_OK) return ts__s;   \
    } while (0)

/* In functions with a single `fail:` label and a `ts_status st` variable. */
#define TS_CHECK_GOTO(expr)                 \
    do {                                    \
        st = (expr);                        \
        if (st != TS_OK) goto fail;         \
    } while (0)

/* Argument check that sets an error naming the function. */
#define TS_ARG(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) return ts_error(TS_ERR_INVALID_ARG, __VA_ARGS__);      \
    } while (0)

/* Allocation that reports failure through the error message. */
void *ts__malloc(size_t n);
void *ts__calloc(size_t n, size_t size);
char *ts__strdup(const char *s);

/* Appends context to the current thread's error message: "ctx: <previous>". */
ts_status ts__error_prefix(ts_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* TS_CORE_INTERNAL_H */
