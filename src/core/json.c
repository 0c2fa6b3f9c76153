/*
 * core/json.c — the strict JSON pull reader of core/json.h.
 *
 * Every function starts after whitespace it skips itself and leaves the cursor right after what it
 * consumed, or at the offending byte with the error set. Recursion only in ts__json_skip, bounded
 * by max_depth.
 */
#include "core/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void ts__json_init(ts__json *j, const char *s, size_t n, const char *what, const char *context, int max_depth) {
    j->s = s;
    j->n = n;
    j->pos = 0;
    j->depth = 0;
    j->max_depth = max_depth > 0 ? max_depth : TS__JSON_DEFAULT_DEPTH;
    j->what = what ? what : "JSON";
    j->context = context ? context : "malformed JSON";
}

ts_status ts__json_error(ts__json *j, const char *fmt, ...) {
    char problem[256], near[24], nb[100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof problem, fmt, ap);
    va_end(ap);
    size_t k = 0;
    for (size_t i = j->pos; i < j->n && k < 16; i++, k++) near[k] = j->s[i] ? j->s[i] : ' ';
    near[k] = '\0';
    return ts_error(TS_ERR_FORMAT, "%s: %s: %s at byte %zu of %zu (near '%s')", j->what, j->context, problem, j->pos,
                    j->n, ts__printable(near, nb, sizeof nb));
}

static void skip_ws(ts__json *j) {
    while (j->pos < j->n) {
        char c = j->s[j->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        j->pos++;
    }
}

ts__json_kind ts__json_peek(ts__json *j) {
    skip_ws(j);
    if (j->pos >= j->n) return TS__JSON_NONE;
    switch (j->s[j->pos]) {
    case '{': return TS__JSON_OBJECT;
    case '[': return TS__JSON_ARRAY;
    case '"': return TS__JSON_STRING;
    case 't':
    case 'f':
    case 'n': return TS__JSON_LITERAL;
    default: {
        char c = j->s[j->pos];
        return c == '-' || (c >= '0' && c <= '9') ? TS__JSON_NUMBER : TS__JSON_NONE;
    }
    }
}

bool ts__json_eat(ts__json *j, char c) {
    skip_ws(j);
    if (j->pos < j->n && j->s[j->pos] == c) {
        j->pos++;
        return true;
    }
    return false;
}

/* ---- containers ---------------------------------------------------------------------------------- */

ts_status ts__json_enter(ts__json *j, char open) {
    skip_ws(j);
    if (j->pos >= j->n || j->s[j->pos] != open) return ts__json_error(j, "expected '%c'", open);
    if (j->depth >= j->max_depth)
        return ts__json_error(j, "values nested too deeply (more than %d levels)", j->max_depth);
    j->pos++;
    j->depth++;
    return TS_OK;
}

ts_status ts__json_next(ts__json *j, char close, bool first, bool *more) {
    *more = false;
    if (ts__json_eat(j, close)) { /* after ',' a value must come: "[1,]" fails in the caller's value */
        j->depth--;
        return TS_OK;
    }
    if (!first && !ts__json_eat(j, ','))
        return ts__json_error(j, "expected ',' or '%c'", close);
    *more = true;
    return TS_OK;
}

/* ---- strings --------------------------------------------------------------------------------------- */

/* The length of the UTF-8 sequence at s[0..n) (shortest form, no surrogate, at most U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

bool ts__utf8_valid(const unsigned char *s, size_t n, size_t *bad) {
    size_t i = 0, len;
    while (i < n && (len = utf8_seq(s + i, n - i)) != 0) i += len;
    if (bad) *bad = i;
    return i == n;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(ts__json *j, uint32_t *v) {
    if (j->n - j->pos < 4) return false;
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(j->s[j->pos + (size_t)i]);
        if (h < 0) return false;
        x = x << 4 | (uint32_t)h;
    }
    j->pos += 4;
    *v = x;
    return true;
}

/* Writes code point cp as UTF-8 at o + *k. */
static void put_utf8(char *o, size_t *k, uint32_t cp) {
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xc0 | cp >> 6);
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xe0 | cp >> 12);
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        o[(*k)++] = (char)(0xf0 | cp >> 18);
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    }
}

/* One \u escape after its backslash and 'u' were consumed: a code point, surrogate pairs joined. */
static ts_status unicode_escape(ts__json *j, uint32_t *cp) {
    uint32_t lo = 0;
    if (!read_hex4(j, cp)) return ts__json_error(j, "bad \\u escape");
    if (*cp >= 0xdc00 && *cp <= 0xdfff) return ts__json_error(j, "lone low surrogate in a \\u escape");
    if (*cp >= 0xd800 && *cp <= 0xdbff) {
        if (j->n - j->pos < 2 || j->s[j->pos] != '\\' || j->s[j->pos + 1] != 'u')
            return ts__json_error(j, "high surrogate without its low half");
        j->pos += 2;
        if (!read_hex4(j, &lo) || lo < 0xdc00 || lo > 0xdfff)
            return ts__json_error(j, "bad low surrogate in a \\u escape");
        *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    return TS_OK;
}

/* A string at the cursor (after whitespace): checked; with o, decoded into o (room for the raw
 * text: decoding only shrinks) up to *k; [*a, *b) its raw text. */
static ts_status scan_string(ts__json *j, char *o, size_t *k, size_t *a, size_t *b) {
    skip_ws(j);
    if (j->pos >= j->n || j->s[j->pos] != '"') return ts__json_error(j, "expected a string");
    j->pos++;
    *a = j->pos;
    for (;;) {
        if (j->pos >= j->n) return ts__json_error(j, "unterminated string");
        unsigned char c = (unsigned char)j->s[j->pos];
        if (c == '"') break;
        if (c < 0x20) return ts__json_error(j, "control character in a string");
        if (c >= 0x80) {
            size_t len = utf8_seq((const unsigned char *)j->s + j->pos, j->n - j->pos);
            if (!len) return ts__json_error(j, "invalid UTF-8 in a string");
            if (o) memcpy(o + *k, j->s + j->pos, len), *k += len;
            j->pos += len;
            continue;
        }
        if (c != '\\') {
            if (o) o[(*k)++] = (char)c;
            j->pos++;
            continue;
        }
        j->pos++;
        char e = j->pos < j->n ? j->s[j->pos] : '\0', lit = 0;
        switch (e) {
        case '"': lit = '"'; break;
        case '\\': lit = '\\'; break;
        case '/': lit = '/'; break;
        case 'b': lit = '\b'; break;
        case 'f': lit = '\f'; break;
        case 'n': lit = '\n'; break;
        case 'r': lit = '\r'; break;
        case 't': lit = '\t'; break;
        case 'u': break;
        default: return ts__json_error(j, "bad escape in a string");
        }
        j->pos++;
        if (lit) {
            if (o) o[(*k)++] = lit;
            continue;
        }
        uint32_t cp = 0;
        TS_TRY(unicode_escape(j, &cp));
        if (cp == 0 && o) return ts__json_error(j, "\\u0000 (NUL) in a string");
        if (o) put_utf8(o, k, cp); /* at most 4 bytes for the 6 or 12 of the escape */
    }
    *b = j->pos++;
    return TS_OK;
}

ts_status ts__json_string(ts__json *j, char **out) {
    size_t a, b;
    if (!out) return scan_string(j, NULL, NULL, &a, &b);
    *out = NULL;
    skip_ws(j);
    size_t end = j->pos + 1; /* room: up to the closing quote, or the end of the text */
    while (end < j->n && j->s[end] != '"') end += j->s[end] == '\\' ? 2 : 1;
    char *o = ts__malloc(TS_MIN(end, j->n) - j->pos + 1);
    if (!o) return TS_ERR_NOMEM;
    size_t k = 0;
    ts_status st = scan_string(j, o, &k, &a, &b);
    if (st != TS_OK) {
        free(o);
        return st;
    }
    o[k] = '\0';
    *out = o;
    return TS_OK;
}

ts_status ts__json_string_span(ts__json *j, size_t *a, size_t *b) { return scan_string(j, NULL, NULL, a, b); }

ts_status ts__json_key(ts__json *j, char **key) {
    if (key) *key = NULL;
    TS_TRY(ts__json_string(j, key));
    if (ts__json_eat(j, ':')) return TS_OK;
    if (key) {
        free(*key);
        *key = NULL;
    }
    return ts__json_error(j, "expected ':'");
}

ts_status ts__json_key_span(ts__json *j, size_t *a, size_t *b) {
    TS_TRY(ts__json_string_span(j, a, b));
    return ts__json_eat(j, ':') ? TS_OK : ts__json_error(j, "expected ':'");
}

/* ---- numbers and literals -------------------------------------------------------------------------- */

static bool is_digit(const ts__json *j, size_t i) { return i < j->n && j->s[i] >= '0' && j->s[i] <= '9'; }

/* The end of the number at i: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, or 0 with *why. */
static size_t number_end(const ts__json *j, size_t i, const char **why) {
    if (i < j->n && j->s[i] == '-') i++;
    if (!is_digit(j, i)) return *why = "expected a value", 0;
    if (j->s[i] == '0') {
        if (is_digit(j, ++i)) return *why = "bad number (leading zero)", 0;
    } else {
        while (is_digit(j, i)) i++;
    }
    if (i < j->n && j->s[i] == '.') {
        if (!is_digit(j, ++i)) return *why = "bad number", 0;
        while (is_digit(j, i)) i++;
    }
    if (i < j->n && (j->s[i] == 'e' || j->s[i] == 'E')) {
        i++;
        if (i < j->n && (j->s[i] == '+' || j->s[i] == '-')) i++;
        if (!is_digit(j, i)) return *why = "bad number", 0;
        while (is_digit(j, i)) i++;
    }
    return i;
}

ts_status ts__json_number(ts__json *j, double *v, size_t *a, size_t *b) {
    skip_ws(j);
    const char *why = NULL;
    size_t start = j->pos, end = number_end(j, start, &why);
    if (!end) return ts__json_error(j, "%s", why);
    if (v) {
        char small[128], *buf = small;
        size_t len = end - start;
        if (len >= sizeof small && !(buf = ts__malloc(len + 1))) return TS_ERR_NOMEM;
        memcpy(buf, j->s + start, len);
        buf[len] = '\0';
        *v = strtod(buf, NULL);
        if (buf != small) free(buf);
    }
    if (a) *a = start;
    if (b) *b = end;
    j->pos = end;
    return TS_OK;
}

ts_status ts__json_u64(ts__json *j, uint64_t max, const char *what, uint64_t *v) {
    skip_ws(j);
    size_t start = j->pos;
    uint64_t x = 0;
    if (j->pos < j->n && j->s[j->pos] == '0') {
        j->pos++;
    } else {
        while (is_digit(j, j->pos)) {
            unsigned d = (unsigned)(j->s[j->pos] - '0');
            if (d > max || x > (max - d) / 10) {
                j->pos = start;
                return ts__json_error(j, "integer too large in %s (at most %llu)", what, (unsigned long long)max);
            }
            x = x * 10 + d;
            j->pos++;
        }
    }
    if (j->pos == start || (j->pos < j->n && memchr(".eE0123456789-+", j->s[j->pos], 15))) {
        j->pos = start;
        return ts__json_error(j, "expected a non-negative integer in %s", what);
    }
    *v = x;
    return TS_OK;
}

ts_status ts__json_skip(ts__json *j) {
    size_t a, b;
    bool more;
    switch (ts__json_peek(j)) {
    case TS__JSON_STRING: return ts__json_string_span(j, &a, &b);
    case TS__JSON_NUMBER: return ts__json_number(j, NULL, NULL, NULL);
    case TS__JSON_OBJECT:
        TS_TRY(ts__json_enter(j, '{'));
        for (bool first = true;; first = false) {
            TS_TRY(ts__json_next(j, '}', first, &more));
            if (!more) return TS_OK;
            TS_TRY(ts__json_key_span(j, &a, &b));
            TS_TRY(ts__json_skip(j));
        }
    case TS__JSON_ARRAY:
        TS_TRY(ts__json_enter(j, '['));
        for (bool first = true;; first = false) {
            TS_TRY(ts__json_next(j, ']', first, &more));
            if (!more) return TS_OK;
            TS_TRY(ts__json_skip(j));
        }
    case TS__JSON_LITERAL: {
        static const char *const lits[] = {"true", "false", "null"};
        for (int i = 0; i < 3; i++) {
            size_t l = strlen(lits[i]);
            if (j->n - j->pos >= l && memcmp(j->s + j->pos, lits[i], l) == 0) {
                j->pos += l;
                return TS_OK;
            }
        }
        return ts__json_error(j, "expected a value");
    }
    case TS__JSON_NONE: break;
    }
    return ts__json_error(j, j->pos >= j->n ? "unexpected end (expected a value)" : "expected a value");
}

ts_status ts__json_end(ts__json *j, const char *what_value) {
    skip_ws(j);
    if (j->pos != j->n) return ts__json_error(j, "trailing characters after %s", what_value);
    return TS_OK;
}

void ts__json_put_string(FILE *f, const char *s) {
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    while (n) {
        size_t bad = 0;
        ts__utf8_valid(p, n, &bad); /* [p, p + bad) is valid */
        for (size_t i = 0; i < bad; i++) {
            unsigned char c = p[i];
            if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
            else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
        if (bad == n) break;
        fputs("\\ufffd", f); /* one invalid byte */
        p += bad + 1;
        n -= bad + 1;
    }
    fputc('"', f);
}
