/*
 * tools/cmd_trace.c — `tessera trace merge OUT IN...`: the per-rank traces of
 * `tessera train --trace` (src/core/timeline.c writes them) on one timeline.
 *
 * Each input is a Chrome / Perfetto trace whose timestamps count from its own
 * zero; otherData.wall_clock_zero_us says when that zero was on the wall clock
 * (CLOCK_REALTIME, microseconds). The output's zero is the earliest input's:
 * every event's "ts" moves by (its file's zero - the earliest zero), everything
 * else of the event is copied as it was (pid stays the rank). Two inputs of
 * the same rank are refused (their lanes would mix). Ranks on different hosts
 * line up as well as the hosts' clocks agree (NTP: typically well under a
 * millisecond).
 *
 * The reader is a strict JSON parser (RFC 8259 syntax, nesting <= 64) that
 * keeps each event's text and only finds its "ts"; errors name the file, the
 * byte and what is wrong.
 */
#include "cli.h"
#include "commands.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TRACE_MAX_BYTES ((size_t)4 << 30) /* refuse larger inputs */
#define TRACE_MAX_DEPTH 64

/* ---- a strict JSON reader over one file's bytes ------------------------------------------------------ */
typedef struct jr {
    const char *p;
    size_t n, i;
    const char *file;
    char err[512];
} jr;

static bool jr_fail(jr *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool jr_fail(jr *r, const char *fmt, ...) {
    if (r->err[0]) return false;
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(r->err, sizeof r->err, "%s: not a trace: %s at byte %zu", r->file, what, r->i);
    return false;
}

static void jr_ws(jr *r) {
    while (r->i < r->n && (r->p[r->i] == ' ' || r->p[r->i] == '\t' || r->p[r->i] == '\n' || r->p[r->i] == '\r')) r->i++;
}

static bool jr_peek(jr *r, char c) {
    jr_ws(r);
    return r->i < r->n && r->p[r->i] == c;
}

static bool jr_expect(jr *r, char c) {
    if (!jr_peek(r, c)) return jr_fail(r, "expected '%c'", c);
    r->i++;
    return true;
}

/* A string; [*a, *b) is its text between the quotes (escapes not decoded). */
static bool jr_string(jr *r, size_t *a, size_t *b) {
    if (!jr_expect(r, '"')) return false;
    *a = r->i;
    while (r->i < r->n && r->p[r->i] != '"') {
        unsigned char c = (unsigned char)r->p[r->i];
        if (c < 0x20) return jr_fail(r, "control character in a string");
        if (c == '\\') {
            if (++r->i >= r->n) break;
            char e = r->p[r->i];
            if (e == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (r->i + k >= r->n || !strchr("0123456789abcdefABCDEF", r->p[r->i + k]) || !r->p[r->i + k])
                        return jr_fail(r, "bad \\u escape");
                r->i += 4;
            } else if (!strchr("\"\\/bfnrt", e) || !e) {
                return jr_fail(r, "bad escape");
            }
        }
        r->i++;
    }
    if (r->i >= r->n) return jr_fail(r, "unterminated string");
    *b = r->i++;
    return true;
}

static bool jr_number(jr *r, double *v) {
    jr_ws(r);
    size_t s = r->i;
    if (r->i < r->n && r->p[r->i] == '-') r->i++;
    if (r->i >= r->n || r->p[r->i] < '0' || r->p[r->i] > '9') return jr_fail(r, "expected a value");
    if (r->p[r->i] == '0') r->i++;
    else while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
    if (r->i < r->n && r->p[r->i] == '.') {
        if (++r->i >= r->n || r->p[r->i] < '0' || r->p[r->i] > '9') return jr_fail(r, "bad number");
        while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
    }
    if (r->i < r->n && (r->p[r->i] == 'e' || r->p[r->i] == 'E')) {
        r->i++;
        if (r->i < r->n && (r->p[r->i] == '+' || r->p[r->i] == '-')) r->i++;
        if (r->i >= r->n || r->p[r->i] < '0' || r->p[r->i] > '9') return jr_fail(r, "bad number");
        while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9') r->i++;
    }
    char buf[64];
    size_t len = r->i - s < sizeof buf - 1 ? r->i - s : sizeof buf - 1;
    memcpy(buf, r->p + s, len);
    buf[len] = '\0';
    if (v) *v = strtod(buf, NULL);
    return true;
}

static bool jr_value(jr *r, int depth);

/* Calls member(key text, key length, ctx) with the reader at each member's value; member must consume
 * the value (NULL: skip every value). */
typedef bool (*jr_member_fn)(jr *r, const char *key, size_t klen, void *ctx, int depth);

static bool jr_object(jr *r, int depth, jr_member_fn member, void *ctx) {
    if (depth > TRACE_MAX_DEPTH) return jr_fail(r, "nested more than %d deep", TRACE_MAX_DEPTH);
    if (!jr_expect(r, '{')) return false;
    if (jr_peek(r, '}')) {
        r->i++;
        return true;
    }
    for (;;) {
        size_t a, b;
        if (!jr_string(r, &a, &b) || !jr_expect(r, ':')) return false;
        if (!(member ? member(r, r->p + a, b - a, ctx, depth + 1) : jr_value(r, depth + 1))) return false;
        if (jr_peek(r, ',')) {
            r->i++;
            continue;
        }
        return jr_expect(r, '}');
    }
}

static bool jr_value(jr *r, int depth) {
    if (depth > TRACE_MAX_DEPTH) return jr_fail(r, "nested more than %d deep", TRACE_MAX_DEPTH);
    jr_ws(r);
    if (r->i >= r->n) return jr_fail(r, "unexpected end of file");
    char c = r->p[r->i];
    size_t a, b;
    if (c == '{') return jr_object(r, depth, NULL, NULL);
    if (c == '"') return jr_string(r, &a, &b);
    if (c == '[') {
        r->i++;
        if (jr_peek(r, ']')) {
            r->i++;
            return true;
        }
        for (;;) {
            if (!jr_value(r, depth + 1)) return false;
            if (jr_peek(r, ',')) {
                r->i++;
                continue;
            }
            return jr_expect(r, ']');
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(words[k]);
        if (r->n - r->i >= len && memcmp(r->p + r->i, words[k], len) == 0) {
            r->i += len;
            return true;
        }
    }
    return jr_number(r, NULL);
}

static bool key_is(const char *key, size_t klen, const char *want) {
    return strlen(want) == klen && memcmp(key, want, klen) == 0;
}

/* ---- one input trace ------------------------------------------------------------------------------- */
typedef struct trace_in {
    const char *file;
    char *text;
    size_t size;
    size_t events_at, events_end; /* the traceEvents array's text, brackets excluded */
    bool has_events, has_zero, has_rank;
    double zero_us;
    int64_t rank;
} trace_in;

static bool other_member(jr *r, const char *key, size_t klen, void *ctx, int depth) {
    trace_in *t = ctx;
    if (key_is(key, klen, "wall_clock_zero_us")) {
        if (!jr_number(r, &t->zero_us)) return false;
        t->has_zero = isfinite(t->zero_us);
        return true;
    }
    if (key_is(key, klen, "rank") && !jr_peek(r, '"')) {
        double v;
        if (!jr_number(r, &v)) return false;
        t->has_rank = v >= 0 && v < 1e9 && v == floor(v);
        t->rank = (int64_t)v;
        return true;
    }
    return jr_value(r, depth);
}

static bool top_member(jr *r, const char *key, size_t klen, void *ctx, int depth) {
    trace_in *t = ctx;
    if (key_is(key, klen, "traceEvents")) {
        if (!jr_peek(r, '[')) return jr_fail(r, "traceEvents is not an array");
        size_t start = r->i + 1;
        if (!jr_value(r, depth)) return false;
        t->events_at = start;
        t->events_end = r->i - 1;
        t->has_events = true;
        return true;
    }
    if (key_is(key, klen, "otherData")) {
        if (!jr_peek(r, '{')) return jr_fail(r, "otherData is not an object");
        return jr_object(r, depth, other_member, t);
    }
    return jr_value(r, depth);
}

/* Reads and checks one input; returns 0 or prints the error and returns 1. */
static int trace_read(trace_in *t) {
    struct stat sb;
    if (stat(t->file, &sb) != 0) {
        fprintf(stderr, "tessera trace merge: %s: %s\n", t->file, strerror(errno));
        return 1;
    }
    if (!S_ISREG(sb.st_mode) || (size_t)sb.st_size > TRACE_MAX_BYTES) {
        fprintf(stderr, "tessera trace merge: %s: %s\n", t->file,
                S_ISREG(sb.st_mode) ? "larger than 4 GiB" : "not a regular file");
        return 1;
    }
    FILE *f = fopen(t->file, "rb");
    t->size = (size_t)sb.st_size;
    t->text = malloc(t->size + 1);
    if (!f || !t->text || fread(t->text, 1, t->size, f) != t->size) {
        fprintf(stderr, "tessera trace merge: %s: %s\n", t->file, f && t->text ? "read error" : strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    fclose(f);
    t->text[t->size] = '\0';
    jr r = {t->text, t->size, 0, t->file, ""};
    if (!jr_peek(&r, '{')) {
        jr_fail(&r, "expected a JSON object with traceEvents");
    } else if (jr_object(&r, 0, top_member, t)) {
        jr_ws(&r);
        if (r.i != r.n) jr_fail(&r, "text after the trace's object");
    }
    if (r.err[0]) {
        fprintf(stderr, "tessera trace merge: %s\n", r.err);
        return 1;
    }
    if (!t->has_events) {
        fprintf(stderr, "tessera trace merge: %s: not a trace: no traceEvents array\n", t->file);
        return 1;
    }
    if (!t->has_zero) {
        fprintf(stderr, "tessera trace merge: %s: no wall-clock zero (otherData.wall_clock_zero_us), so it cannot "
                        "be lined up with the others; traces of `tessera train --trace` have one\n", t->file);
        return 1;
    }
    return 0;
}

/* ---- the merged file -------------------------------------------------------------------------------- */
typedef struct out_ctx {
    FILE *f;
    double shift_us;
    size_t copied; /* the event's text up to here is written */
    const char *text;
} out_ctx;

/* At the event's "ts": writes the text before the value, then the moved value. */
static bool event_member(jr *r, const char *key, size_t klen, void *ctx, int depth) {
    out_ctx *o = ctx;
    if (!key_is(key, klen, "ts") || jr_peek(r, '"')) return jr_value(r, depth);
    double ts;
    jr_ws(r);
    size_t at = r->i;
    if (!jr_number(r, &ts)) return false;
    fwrite(o->text + o->copied, 1, at - o->copied, o->f);
    fprintf(o->f, "%.3f", ts + o->shift_us);
    o->copied = r->i;
    return true;
}

/* Writes t's events with their ts moved by shift_us; *first: no comma before the first event. */
static int write_events(FILE *f, trace_in *t, double shift_us, bool *first, int64_t *count) {
    jr r = {t->text, t->events_end, t->events_at, t->file, ""};
    for (;;) {
        jr_ws(&r);
        if (r.i >= r.n) break;
        size_t start = r.i;
        out_ctx o = {f, shift_us, start, t->text};
        if (!*first) fputs(",\n", f);
        *first = false;
        if (jr_peek(&r, '{')) {
            if (!jr_object(&r, 0, event_member, &o)) break;
        } else if (!jr_value(&r, 0)) { /* not an event object: copied as it is */
            break;
        }
        fwrite(t->text + o.copied, 1, r.i - o.copied, f);
        ++*count;
        if (jr_peek(&r, ',')) r.i++;
    }
    if (r.err[0]) {
        fprintf(stderr, "tessera trace merge: %s\n", r.err);
        return 1;
    }
    return 0;
}

static void put_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

static int cmd_merge(int argc, char **argv) {
    const char *pos[1024];
    int npos = 0;
    const cli_command cmd = {
        "trace merge", "tessera trace merge OUT IN...",
        "Puts the traces of `tessera train --trace` (one per rank: trace.rank0.json, trace.rank1.json, ...)\n"
        "on one timeline: each file's events move by the difference between its wall-clock zero and the\n"
        "earliest one (otherData.wall_clock_zero_us), pid stays the rank; OUT is one Chrome / Perfetto\n"
        "trace (chrome://tracing, ui.perfetto.dev). Two files of the same rank are refused.",
        NULL, 0};
    int rc = cli_parse(&cmd, argc, argv, pos, (int)(sizeof pos / sizeof pos[0]), &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos < 2) return cli_usage_error(&cmd, "needs OUT and at least one IN (usage: %s)", cmd.usage);
    int n = npos - 1, status = 1;
    trace_in *in = calloc((size_t)n, sizeof *in);
    if (!in) return 1;
    double zero = INFINITY;
    for (int k = 0; k < n; k++) {
        in[k].file = pos[k + 1];
        if (strcmp(in[k].file, pos[0]) == 0) {
            fprintf(stderr, "tessera trace merge: %s is both the output and an input\n", pos[0]);
            goto done;
        }
        if (trace_read(&in[k]) != 0) goto done;
        for (int j = 0; j < k; j++)
            if (in[j].has_rank && in[k].has_rank && in[j].rank == in[k].rank) {
                fprintf(stderr, "tessera trace merge: %s and %s are both rank %lld (traces of two runs?)\n",
                        in[j].file, in[k].file, (long long)in[k].rank);
                goto done;
            }
        if (in[k].zero_us < zero) zero = in[k].zero_us;
    }
    FILE *f = fopen(pos[0], "w");
    if (!f) {
        fprintf(stderr, "tessera trace merge: %s: %s\n", pos[0], strerror(errno));
        goto done;
    }
    fputs("{\"traceEvents\":[\n", f);
    bool first = true, bad = false;
    int64_t events = 0;
    for (int k = 0; k < n && !bad; k++) bad = write_events(f, &in[k], in[k].zero_us - zero, &first, &events) != 0;
    fprintf(f, "],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"producer\":\"tessera trace merge\","
               "\"clock\":\"CLOCK_REALTIME-aligned\",\"wall_clock_zero_us\":%.3f,\"sources\":[", zero);
    for (int k = 0; k < n; k++) {
        fprintf(f, "%s{\"file\":", k ? "," : "");
        put_json_string(f, in[k].file);
        if (in[k].has_rank) fprintf(f, ",\"rank\":%lld", (long long)in[k].rank);
        fprintf(f, ",\"shift_us\":%.3f}", in[k].zero_us - zero);
    }
    fputs("]}}\n", f);
    bool werr = ferror(f) != 0;
    if (fclose(f) != 0 || werr) {
        fprintf(stderr, "tessera trace merge: writing %s: %s\n", pos[0], strerror(errno));
        bad = true;
    }
    if (bad) {
        remove(pos[0]); /* no half-written output */
        goto done;
    }
    printf("merged %d traces (%lld events) into %s\n", n, (long long)events, pos[0]);
    for (int k = 0; k < n; k++)
        printf("  %s%s: shifted by %.3f ms\n", in[k].file, in[k].has_rank ? "" : " (no rank)",
               (in[k].zero_us - zero) / 1000.0);
    status = 0;
done:
    for (int k = 0; k < n; k++) free(in[k].text);
    free(in);
    return status ? 1 : 0;
}

#define TRACE_USAGE                                                                                              \
    "usage: tessera trace merge OUT IN...\n\n"                                                                   \
    "  merge   put the per-rank traces of `tessera train --trace` on one timeline (Chrome / Perfetto JSON)\n"

int ts_cmd_trace(int argc, char **argv) {
    if (argc < 2) {
        fputs(TRACE_USAGE, stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(TRACE_USAGE, stdout);
        return 0;
    }
    if (strcmp(argv[1], "merge") == 0) return cmd_merge(argc - 1, argv + 1);
    fprintf(stderr, "tessera trace: unknown subcommand '%s'\n%s", argv[1], TRACE_USAGE);
    return CLI_EXIT_USAGE;
}
