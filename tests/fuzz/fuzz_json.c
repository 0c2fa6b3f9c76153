/*
 * tests/fuzz/fuzz_json.c — libFuzzer target: the JSON reader (src/core/json.c) on arbitrary bytes.
 * Each input is read twice: once by a full walk (every object entered, every key and string
 * decoded or taken as a span — the input's first byte chooses —, numbers as values and spans,
 * exact integers tried first), once by ts__json_skip. The two must agree on success and on where
 * the value ended; a walk that succeeds leaves depth 0, every decoded string is valid UTF-8 with
 * no NUL inside, every span lies in the input. A small depth limit (the first byte again) reaches
 * the limit's error path. Seeds: tests/fuzz/corpus/json; dictionary: tests/fuzz/json.dict.
 */
#include "core/json.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ts_log_set_level(TS_LOG_OFF);
    return 0;
}

static void check_span(const ts__json *j, size_t a, size_t b) {
    if (a > b || b > j->n) __builtin_trap();
}

static void check_decoded(const char *s) {
    if (!s) __builtin_trap();
    if (!ts__utf8_valid((const unsigned char *)s, strlen(s), NULL)) __builtin_trap();
}

static ts_status walk(ts__json *j, bool decode) {
    size_t a = 0, b = 0;
    bool more;
    switch (ts__json_peek(j)) {
    case TS__JSON_OBJECT:
    case TS__JSON_ARRAY: {
        bool obj = ts__json_peek(j) == TS__JSON_OBJECT;
        int depth = j->depth;
        TS_TRY(ts__json_enter(j, obj ? '{' : '['));
        if (j->depth != depth + 1) __builtin_trap();
        for (bool first = true;; first = false) {
            TS_TRY(ts__json_next(j, obj ? '}' : ']', first, &more));
            if (!more) break;
            if (obj && decode) {
                char *k = NULL;
                TS_TRY(ts__json_key(j, &k));
                check_decoded(k);
                free(k);
            } else if (obj) {
                TS_TRY(ts__json_key_span(j, &a, &b));
                check_span(j, a, b);
            }
            TS_TRY(walk(j, decode));
        }
        if (j->depth != depth) __builtin_trap();
        return TS_OK;
    }
    case TS__JSON_STRING:
        if (decode) {
            char *s = NULL;
            TS_TRY(ts__json_string(j, &s));
            check_decoded(s);
            free(s);
            return TS_OK;
        }
        TS_TRY(ts__json_string_span(j, &a, &b));
        check_span(j, a, b);
        return TS_OK;
    case TS__JSON_NUMBER: {
        size_t at = j->pos;
        uint64_t u;
        if (ts__json_u64(j, UINT64_MAX, "fuzz", &u) == TS_OK) {
            size_t end = j->pos;
            j->pos = at; /* the same text as a number */
            double v;
            TS_TRY(ts__json_number(j, &v, &a, &b));
            if (b != end || v < 0) __builtin_trap();
            return TS_OK;
        }
        if (j->pos != at) __builtin_trap(); /* a refused integer leaves the cursor where it was */
        double v;
        TS_TRY(ts__json_number(j, &v, &a, &b));
        check_span(j, a, b);
        return TS_OK;
    }
    default: return ts__json_skip(j);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    bool decode = size && (data[0] & 1);
    int depth = size && (data[0] & 2) ? 3 : TS__JSON_DEFAULT_DEPTH;
    ts__json w, s;
    ts__json_init(&w, (const char *)data, size, "fuzz.json", "malformed JSON", depth);
    ts__json_init(&s, (const char *)data, size, "fuzz.json", "malformed JSON", depth);
    ts_status a = walk(&w, decode), b = ts__json_skip(&s);
    if (w.pos > size || s.pos > size) __builtin_trap();
    if (a == TS_ERR_NOMEM || b == TS_ERR_NOMEM) return 0;
    /* the walk decodes: only it refuses \u0000 in a decoded string */
    if (a == TS_OK && b != TS_OK) __builtin_trap();
    if (!decode && (a == TS_OK) != (b == TS_OK)) __builtin_trap();
    if (a == TS_OK && (w.pos != s.pos || w.depth != 0)) __builtin_trap();
    if (a == TS_OK) (void)ts__json_end(&w, "the value");
    return 0;
}
