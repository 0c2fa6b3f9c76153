/*
 * tessera/env.h — the TS_* environment variables Tessera reads, listed: one registry (src/core/env.c) declares
 * every variable once with its type, accepted values, default and a line of documentation; `tessera env` and
 * docs/env.md are made from it. This header enumerates the registry by index (0 .. ts_env_count() - 1), for
 * programs and front ends that show users their settings. The library reads the variables through its own
 * typed accessors; nothing here changes a value.
 */
#ifndef TESSERA_ENV_H
#define TESSERA_ENV_H

#include "tessera/core.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a variable's value is. */
typedef enum ts_env_type {
    TS_ENV_TYPE_INT,    /* a decimal integer */
    TS_ENV_TYPE_SIZE,   /* a count of bytes (or pixels), with an optional k, m or g suffix (x 2^10, 2^20, 2^30) */
    TS_ENV_TYPE_DOUBLE, /* a decimal number (seconds) */
    TS_ENV_TYPE_BOOL,   /* 1/0, true/false, yes/no, on/off (any case) */
    TS_ENV_TYPE_ENUM,   /* one of a list of names (any case) */
    TS_ENV_TYPE_STRING, /* text, taken as it is */
    TS_ENV_TYPE_PATH,   /* a file or folder */
    TS_ENV_TYPE_COUNT
} ts_env_type;

/* One variable of the registry. Every string is static: valid for the life of the program. */
typedef struct ts_env_info {
    const char *name;         /* "TS_DIST_TIMEOUT" */
    ts_env_type type;
    const char *type_name;    /* "int", "size", "double", "bool", "enum", "string", "path" */
    const char *section;      /* the heading of docs/env.md it is listed under: "Distributed" */
    const char *values;       /* what is accepted: "a number in [0.1, 1e+07]", "fp32, bf16" */
    const char *default_text; /* what an unset variable means: "1800", "shared memory within a host" */
    const char *doc;          /* one line */
    bool internal;            /* set by `tessera run` for its ranks, not by users */
    bool live;                /* read at each use (a program or launcher may change it while running); else read once */
    bool secret;              /* its value is never shown (ts_env_value_text says "(set, hidden)") */
} ts_env_info;

/* How many variables the registry holds. */
int ts_env_count(void);

/* The description of variable `index` (0 .. ts_env_count() - 1). */
ts_status ts_env_info_get(int index, ts_env_info *out);

/* The index of the variable named `name` ("TS_LOG_LEVEL"); TS_ERR_INVALID_ARG when the registry has none. */
ts_status ts_env_find(const char *name, int *index);

/* The variable's value in the environment now, into buf (truncated to len - 1 characters; "(set, hidden)" for
 * a secret). Returns true when it is set to a non-empty value, false (buf "") when it is not. */
bool ts_env_value_text(int index, char *buf, size_t len);

/* Whether the variable's value now is accepted: TS_OK when it is unset or parses and lies in range; otherwise
 * TS_ERR_INVALID_ARG with a message naming the variable, its value and what is accepted (the library then uses
 * the default, or refuses where the registry says a bad value is an error). */
ts_status ts_env_validate(int index);

/* Forgets the values read once, so that the next use reads the environment again (for tests and for programs
 * that set variables themselves before they start the library's parts again). Settings that a part keeps on
 * its own (the log level, the conv algorithm, the virtual CPU devices once created) are not reset. Call it
 * while no other thread uses the library. */
void ts_env_reload(void);

#ifdef __cplusplus
}
#endif

#endif
