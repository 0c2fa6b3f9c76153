/*
 * core/json.h — the one JSON reader (internal): a strict pull parser over a text in memory,
 * RFC 8259 syntax, for every reader of JSON in Tessera (safetensors headers, src/io/safetensors.c;
 * Chrome traces, tools/cmd_trace.c). Nothing is built: the caller walks the text value by value
 * and takes what it needs (a decoded string, an exact integer, a number and its text's span) or
 * skips the rest, so memory stays O(1) beyond the strings it asks for, and a 4 GiB trace is read
 * in place.
 *
 * Walking an object (arrays the same with '[' / ']' and no keys):
 *     TS_TRY(ts__json_enter(j, '{'));
 *     for (bool first = true, more;; first = false) {
 *         TS_TRY(ts__json_next(j, '}', first, &more));
 *         if (!more) break;
 *         TS_TRY(ts__json_key(j, &key));   // the member's name, then its ':'
 *         ... one value: ts__json_string / _u64 / _number / _skip / a nested enter ...
 *     }
 *
 * Limits: nesting at most max_depth (enter and skip count it), the text's length is the caller's.
 * Strings: valid UTF-8 (shortest forms, no surrogates, at most U+10FFFF), no raw control
 * characters, only JSON's escapes, \u surrogates in pairs; decoded strings refuse \u0000 (they
 * are C strings). Integers (_u64) are exact: no sign, fraction, exponent or leading zero.
 *
 * Errors are TS_ERR_FORMAT (TS_ERR_NOMEM for memory) with one message that names the text, says
 * what is wrong and where:  "<what>: <context>: <problem> at byte <pos> of <n> (near '<16 bytes>')",
 * e.g. "model.safetensors: malformed header: expected ':' at byte 41 of 120 (near '{\"dtype\"...')".
 * After an error the cursor is where it was found; the reader holds no resources.
 */
#ifndef TS_CORE_JSON_H
#define TS_CORE_JSON_H

#include "core/internal.h"

typedef enum ts__json_kind {
    TS__JSON_NONE = 0, /* end of the text, or a byte no value starts with */
    TS__JSON_OBJECT,
    TS__JSON_ARRAY,
    TS__JSON_STRING,
    TS__JSON_NUMBER,
    TS__JSON_LITERAL, /* true, false or null */
} ts__json_kind;

typedef struct ts__json {
    const char *s;       /* the text (need not be NUL-terminated) */
    size_t n, pos;       /* its length; the cursor */
    int depth, max_depth;
    const char *what;    /* the text's name in messages (a file path) */
    const char *context; /* what a syntax error makes of it ("malformed header", "not a trace") */
} ts__json;

#define TS__JSON_DEFAULT_DEPTH 64

/* A reader at the start of s[0..n). what and context are borrowed for its lifetime. */
void ts__json_init(ts__json *j, const char *s, size_t n, const char *what, const char *context, int max_depth);

/* The error message above for problem (printf-style), at the cursor; returns TS_ERR_FORMAT. */
ts_status ts__json_error(ts__json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Skips whitespace and says what the next value is (by its first byte). */
ts__json_kind ts__json_peek(ts__json *j);
/* Skips whitespace; consumes c when it is next (true), else leaves the cursor there. */
bool ts__json_eat(ts__json *j, char c);

/* Consumes '{' or '[' (open), one level deeper; "expected '{'" otherwise, or too deep. */
ts_status ts__json_enter(ts__json *j, char open);
/* Before each member / element of the object or array entered: *more true with the cursor at it
 * (the ',' before it consumed unless first), or false with the closing bracket consumed (one level
 * up). "expected ',' or '}'" otherwise. */
ts_status ts__json_next(ts__json *j, char close, bool first, bool *more);
/* An object member's name and its ':'. *key (NULL: not wanted) gets the decoded name (malloc'd). */
ts_status ts__json_key(ts__json *j, char **key);
/* As ts__json_key, the name's raw text between its quotes as [*a, *b) of j->s (escapes as written). */
ts_status ts__json_key_span(ts__json *j, size_t *a, size_t *b);

/* A string value: *out (NULL: skip it) gets the decoded text, malloc'd and NUL-terminated. */
ts_status ts__json_string(ts__json *j, char **out);
/* A string value's raw text between its quotes, [*a, *b) of j->s (checked, not decoded). */
ts_status ts__json_string_span(ts__json *j, size_t *a, size_t *b);
/* A non-negative integer at most max; what names it in messages ("expected a non-negative integer
 * in <what>", "integer too large in <what>"). */
ts_status ts__json_u64(ts__json *j, uint64_t max, const char *what, uint64_t *v);
/* Any number: *v (may be NULL) its value as strtod reads it, [*a, *b) (may be NULL) its text. */
ts_status ts__json_number(ts__json *j, double *v, size_t *a, size_t *b);
/* Any one value (nested ones to max_depth in all). */
ts_status ts__json_skip(ts__json *j);
/* Only whitespace may follow: "trailing characters after <what_value>" otherwise. */
ts_status ts__json_end(ts__json *j, const char *what_value);

/* Whether s[0..n) is valid UTF-8 (RFC 3629: shortest forms, no surrogates, at most U+10FFFF);
 * *bad (may be NULL) gets the offset of the first invalid byte, or n. */
bool ts__utf8_valid(const unsigned char *s, size_t n, size_t *bad);

/* The one JSON string writer: s (NULL: null) between quotes on f, with '"', '\\' and control
 * characters escaped and every byte that is not part of valid UTF-8 as \ufffd, so that any C
 * string (a file name, a user's model name) makes valid JSON. */
void ts__json_put_string(FILE *f, const char *s);

#endif /* TS_CORE_JSON_H */
