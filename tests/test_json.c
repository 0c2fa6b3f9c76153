/*
 * tests/test_json.c — the JSON reader (src/core/json.c, core/json.h) that safetensors headers and
 * `tessera trace merge` read through: values walked and decoded (escapes, surrogate pairs, UTF-8),
 * exact integers, numbers with their text's span, and every error naming the text, the problem and
 * its byte: bad syntax, bad escapes and UTF-8, leading zeros, depth and size limits, trailing text.
 * (tests/fuzz/fuzz_json.c fuzzes the same reader.) The writer: any C string read back as itself
 * (invalid UTF-8 as U+FFFD). And the escaping every error message and log line gets.
 */
#include "test_util.h"

#include "core/json.h"

static ts__json reader(const char *s, int depth) {
    ts__json j;
    ts__json_init(&j, s, strlen(s), "t.json", "malformed JSON", depth);
    return j;
}

/* Skips one value of s and expects an error mentioning problem at byte at. */
static void bad(const char *s, const char *problem, size_t at) {
    ts__json j = reader(s, 0);
    ts_status st = ts__json_skip(&j);
    if (st == TS_OK) st = ts__json_end(&j, "the value");
    char where[64];
    snprintf(where, sizeof where, "at byte %zu of %zu", at, strlen(s));
    tu_checks++;
    if (st != TS_ERR_FORMAT || !strstr(ts_last_error(), problem) || !strstr(ts_last_error(), where) ||
        !strstr(ts_last_error(), "t.json: malformed JSON: ")) {
        tu_failures++;
        fprintf(stderr, "'%s': got %s '%s', want '%s' %s\n", s, ts_status_name(st), ts_last_error(), problem, where);
    }
}

static void test_walk_and_decode(void) {
    const char *s = " {\"name\": \"caf\\u00e9 \\ud83d\\ude00\\n\\\"q\\\"\", \"shape\": [2, 0, 30],"
                    " \"x\": -12.5e2, \"ok\": true, \"none\": null, \"\\u0041\": {}} ";
    ts__json j = reader(s, 0);
    CHECK(ts__json_peek(&j) == TS__JSON_OBJECT);
    CHECK_OK(ts__json_enter(&j, '{'));
    int members = 0;
    for (bool first = true, more;; first = false) {
        CHECK_OK(ts__json_next(&j, '}', first, &more));
        if (!more) break;
        char *k = NULL;
        CHECK_OK(ts__json_key(&j, &k));
        if (!k) break;
        members++;
        if (strcmp(k, "name") == 0) {
            char *v = NULL;
            CHECK_OK(ts__json_string(&j, &v));
            CHECK(v && strcmp(v, "caf\xc3\xa9 \xf0\x9f\x98\x80\n\"q\"") == 0);
            free(v);
        } else if (strcmp(k, "shape") == 0) {
            uint64_t want[3] = {2, 0, 30}, v = 0;
            int n = 0;
            CHECK_OK(ts__json_enter(&j, '['));
            for (bool f = true, m;; f = false) {
                CHECK_OK(ts__json_next(&j, ']', f, &m));
                if (!m) break;
                CHECK_OK(ts__json_u64(&j, 100, "shape", &v));
                CHECK(n < 3 && v == want[n]);
                n++;
            }
            CHECK(n == 3);
        } else if (strcmp(k, "x") == 0) {
            double v = 0;
            size_t a = 0, b = 0;
            CHECK(ts__json_peek(&j) == TS__JSON_NUMBER);
            CHECK_OK(ts__json_number(&j, &v, &a, &b));
            CHECK(v == -1250.0 && b - a == 7 && memcmp(s + a, "-12.5e2", 7) == 0);
        } else {
            CHECK(strcmp(k, "ok") == 0 || strcmp(k, "none") == 0 || strcmp(k, "A") == 0); /* \u0041 decoded */
            CHECK_OK(ts__json_skip(&j));
        }
        free(k);
    }
    CHECK(members == 6 && j.depth == 0);
    CHECK_OK(ts__json_end(&j, "the object"));
    /* spans: the raw text between the quotes, escapes as written; \u0000 is fine undecoded */
    ts__json k = reader("\"a\\u0000b\\n\"", 0);
    size_t a = 0, b = 0;
    CHECK_OK(ts__json_string_span(&k, &a, &b));
    CHECK(a == 1 && b == 11);
    k = reader("\"a\\u0000b\"", 0);
    char *v = NULL;
    CHECK_STATUS(ts__json_string(&k, &v), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("\\u0000 (NUL) in a string");
    CHECK(v == NULL);
}

static void test_integers(void) {
    uint64_t v = 0;
    ts__json j = reader("18446744073709551615", 0);
    CHECK_OK(ts__json_u64(&j, UINT64_MAX, "n", &v));
    CHECK(v == UINT64_MAX && j.pos == 20);
    j = reader("18446744073709551616", 0);
    CHECK_STATUS(ts__json_u64(&j, UINT64_MAX, "n", &v), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("integer too large in n");
    CHECK(j.pos == 0); /* the cursor stays at the integer */
    j = reader("9223372036854775808", 0);
    CHECK_STATUS(ts__json_u64(&j, (uint64_t)INT64_MAX, "data_offsets", &v), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("integer too large in data_offsets");
    const char *not_int[] = {"-1", "1.0", "1e3", "01", "x", ""};
    for (size_t i = 0; i < sizeof not_int / sizeof *not_int; i++) {
        j = reader(not_int[i], 0);
        CHECK_STATUS(ts__json_u64(&j, UINT64_MAX, "shape", &v), TS_ERR_FORMAT);
        CHECK_ERR_MENTIONS("expected a non-negative integer in shape at byte 0");
    }
}

static void test_errors_name_the_byte(void) {
    bad("[1,]", "expected a value", 3);
    bad("[1 2]", "expected ',' or ']'", 3);
    bad("{\"a\" 1}", "expected ':'", 5);
    bad("{\"a\":1,}", "expected a string", 7);
    bad("{1:2}", "expected a string", 1);
    bad("01", "bad number (leading zero)", 0);
    bad("1.", "bad number", 0);
    bad("-", "expected a value", 0);
    bad("nul", "expected a value", 0);
    bad("", "unexpected end", 0);
    bad("\"abc", "unterminated string", 4);
    bad("\"a\tb\"", "control character in a string", 2);
    bad("\"\\q\"", "bad escape", 2);
    bad("\"\\u12g4\"", "bad \\u escape", 3);
    bad("\"\\udc00\"", "lone low surrogate", 7);
    bad("\"\\ud800x\"", "high surrogate without its low half", 7);
    bad("\"\\ud800\\u0041\"", "bad low surrogate", 13);
    bad("\"\xc3\x28\"", "invalid UTF-8 in a string", 1);
    bad("\"\xc0\x80\"", "invalid UTF-8", 1);     /* overlong */
    bad("\"\xed\xa0\x80\"", "invalid UTF-8", 1); /* a surrogate's bytes */
    bad("[1] x", "trailing characters after the value", 4);
    /* depth: four levels against a limit of three */
    ts__json j = reader("[[[[1]]]]", 3);
    CHECK_STATUS(ts__json_skip(&j), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("values nested too deeply (more than 3 levels) at byte 3 of 9");
    j = reader("[[[1]]]", 3);
    CHECK_OK(ts__json_skip(&j));
    /* the near text is printable: control bytes escaped */
    j = reader("[\x01]", 0);
    CHECK_STATUS(ts__json_skip(&j), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("near '\\x01]'");
}

static void test_utf8(void) {
    size_t bad_at = 0;
    CHECK(ts__utf8_valid((const unsigned char *)"a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10, &bad_at) && bad_at == 10);
    CHECK(!ts__utf8_valid((const unsigned char *)"ab\xf4\x90\x80\x80", 6, &bad_at) && bad_at == 2); /* > U+10FFFF */
    CHECK(!ts__utf8_valid((const unsigned char *)"\xe0\x80\x80", 3, &bad_at) && bad_at == 0);      /* overlong */
    CHECK(!ts__utf8_valid((const unsigned char *)"x\xe2\x82", 3, &bad_at) && bad_at == 1);         /* truncated */
    CHECK(!ts__utf8_valid((const unsigned char *)"\x80", 1, NULL));
}

/* A long text walked in place: 200000 members, nothing kept but the cursor. */
static void test_large(void) {
    const int n = 200000;
    size_t cap = (size_t)n * 32 + 16, k = 0;
    char *s = malloc(cap);
    k += (size_t)snprintf(s + k, cap - k, "{");
    for (int i = 0; i < n; i++) k += (size_t)snprintf(s + k, cap - k, "%s\"k%d\":[%d,\"v\"]", i ? "," : "", i, i);
    k += (size_t)snprintf(s + k, cap - k, "}");
    ts__json j;
    ts__json_init(&j, s, k, "big.json", "malformed JSON", 0);
    CHECK_OK(ts__json_skip(&j));
    CHECK_OK(ts__json_end(&j, "the object"));
    free(s);
}

/* Writes s with ts__json_put_string and reads it back. */
static char *round_trip(const char *s) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ts__json_put_string(f, s);
    fclose(f);
    ts__json j = reader(buf, 4);
    char *out = NULL;
    CHECK_OK(ts__json_string(&j, &out));
    CHECK_OK(ts__json_end(&j, "the string"));
    free(buf);
    return out;
}

static void test_writer(void) {
    const char *same[] = {"", "plain", "q\"uote and back\\slash", "tab\tnew\nline\x1b[31m del\x7f",
                          "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char *o = round_trip(same[i]);
        CHECK(o && strcmp(o, same[i]) == 0);
        free(o);
    }
    char *o = round_trip("a\xff" "b\xc3"); /* a stray byte and a cut sequence */
    CHECK(o && strcmp(o, "a\xef\xbf\xbd" "b\xef\xbf\xbd") == 0);
    free(o);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ts__json_put_string(f, NULL);
    fclose(f);
    CHECK(strcmp(buf, "null") == 0);
    free(buf);
}

static void test_message_escapes(void) {
    ts_error(TS_ERR_IO, "%s: cannot open", "/tmp/e\x1b[2J\nforged line\t.ckpt");
    CHECK(strcmp(ts_last_error(), "/tmp/e\\x1b[2J\\x0aforged line\\x09.ckpt: cannot open") == 0);
    ts__error_prefix(TS_ERR_IO, "reading\r%s", "x");
    CHECK(strcmp(ts_last_error(), "reading\\x0dx: /tmp/e\\x1b[2J\\x0aforged line\\x09.ckpt: cannot open") == 0);
    char m[12] = "ab\x01\x02\x03";
    ts__escape_controls(m, sizeof m, false); /* "ab\x01\x02\x03" needs 14 bytes and a NUL: cut at 11 */
    CHECK(strcmp(m, "ab\\x01\\x02\\") == 0);
    char lines[32] = "one\ntwo\r\x1b[2J";
    ts__escape_controls(lines, sizeof lines, true); /* a log's own line break stays, the rest is escaped */
    CHECK(strcmp(lines, "one\ntwo\\x0d\\x1b[2J") == 0);
    char big[3000];
    memset(big, '\n', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ts_error(TS_ERR_IO, "%s", big); /* four times longer escaped than the message's room: cut, terminated */
    CHECK(strlen(ts_last_error()) < TS_ERRMSG_MAX && strncmp(ts_last_error(), "\\x0a\\x0a", 8) == 0);
}

TU_MAIN(T(test_writer), T(test_message_escapes), T(test_walk_and_decode), T(test_integers), T(test_errors_name_the_byte), T(test_utf8), T(test_large))
