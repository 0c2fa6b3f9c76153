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
 * The reader is the library's strict JSON reader (core/json.h: RFC 8259
 * syntax, nesting <= 64), walked in place: each event's text is kept and only
 * its "ts" found; errors name the file, the byte and what is wrong.
 */
#include "cli.h"
#include "commands.h"

#include "core/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TRACE_MAX_BYTES ((size_t)4 << 30) /* refuse larger inputs */
#define TRACE_MAX_DEPTH 64

static bool key_is(const char *text, size_t a, size_t b, const char *want) {
    return strlen(want) == b - a && memcmp(text + a, want, b - a) == 0;
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

/* otherData: wall_clock_zero_us and rank. */
static ts_status read_other(ts__json *j, trace_in *t) {
    if (ts__json_peek(j) != TS__JSON_OBJECT) return ts__json_error(j, "otherData is not an object");
    TS_TRY(ts__json_enter(j, '{'));
    for (bool first = true, more;; first = false) {
        size_t a, b;
        TS_TRY(ts__json_next(j, '}', first, &more));
        if (!more) return TS_OK;
        TS_TRY(ts__json_key_span(j, &a, &b));
        if (key_is(j->s, a, b, "wall_clock_zero_us") && ts__json_peek(j) == TS__JSON_NUMBER) {
            TS_TRY(ts__json_number(j, &t->zero_us, NULL, NULL));
            t->has_zero = isfinite(t->zero_us);
        } else if (key_is(j->s, a, b, "rank") && ts__json_peek(j) == TS__JSON_NUMBER) {
            double v;
            TS_TRY(ts__json_number(j, &v, NULL, NULL));
            t->has_rank = v >= 0 && v < 1e9 && v == floor(v);
            t->rank = (int64_t)v;
        } else {
            TS_TRY(ts__json_skip(j));
        }
    }
}

/* The trace's object: traceEvents (its text's span kept) and otherData; the rest skipped. */
static ts_status read_top(ts__json *j, trace_in *t) {
    if (ts__json_peek(j) != TS__JSON_OBJECT) return ts__json_error(j, "expected a JSON object with traceEvents");
    TS_TRY(ts__json_enter(j, '{'));
    for (bool first = true, more;; first = false) {
        size_t a, b;
        TS_TRY(ts__json_next(j, '}', first, &more));
        if (!more) break;
        TS_TRY(ts__json_key_span(j, &a, &b));
        if (key_is(j->s, a, b, "traceEvents")) {
            if (ts__json_peek(j) != TS__JSON_ARRAY) return ts__json_error(j, "traceEvents is not an array");
            t->events_at = j->pos + 1;
            TS_TRY(ts__json_skip(j));
            t->events_end = j->pos - 1;
            t->has_events = true;
        } else if (key_is(j->s, a, b, "otherData")) {
            TS_TRY(read_other(j, t));
        } else {
            TS_TRY(ts__json_skip(j));
        }
    }
    return ts__json_end(j, "the trace's object");
}

/* Reads and checks one input; returns 0 or prints the error and returns 1. */
static int trace_read(trace_in *t) {
    if (ts_read_file(t->file, "a trace", TRACE_MAX_BYTES, &t->text, &t->size) != TS_OK) { /* never a FIFO */
        fprintf(stderr, "tessera trace merge: %s\n", ts_last_error());
        return 1;
    }
    ts__json j;
    ts__json_init(&j, t->text, t->size, t->file, "not a trace", TRACE_MAX_DEPTH);
    if (read_top(&j, t) != TS_OK) {
        fprintf(stderr, "tessera trace merge: %s\n", ts_last_error());
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
/* One event object: its text with "ts" moved by shift_us, from *copied (the text before it is written). */
static ts_status write_event(ts__json *j, FILE *f, double shift_us, size_t *copied) {
    TS_TRY(ts__json_enter(j, '{'));
    for (bool first = true, more;; first = false) {
        size_t a, b;
        TS_TRY(ts__json_next(j, '}', first, &more));
        if (!more) return TS_OK;
        TS_TRY(ts__json_key_span(j, &a, &b));
        if (!key_is(j->s, a, b, "ts") || ts__json_peek(j) != TS__JSON_NUMBER) {
            TS_TRY(ts__json_skip(j));
            continue;
        }
        double ts;
        TS_TRY(ts__json_number(j, &ts, &a, &b));
        fwrite(j->s + *copied, 1, a - *copied, f);
        fprintf(f, "%.3f", ts + shift_us);
        *copied = b;
    }
}

/* Writes t's events with their ts moved by shift_us; *first: no comma before the first event. */
static int write_events(FILE *f, trace_in *t, double shift_us, bool *first, int64_t *count) {
    ts__json j;
    ts__json_init(&j, t->text, t->events_end, t->file, "not a trace", TRACE_MAX_DEPTH);
    j.pos = t->events_at;
    ts_status st = TS_OK;
    while (st == TS_OK && ts__json_peek(&j) != TS__JSON_NONE) {
        size_t copied = j.pos;
        if (!*first) fputs(",\n", f);
        *first = false;
        if (ts__json_peek(&j) == TS__JSON_OBJECT) st = write_event(&j, f, shift_us, &copied);
        else st = ts__json_skip(&j); /* not an event object: copied as it is */
        if (st != TS_OK) break;
        fwrite(t->text + copied, 1, j.pos - copied, f);
        ++*count;
        ts__json_eat(&j, ',');
    }
    if (st != TS_OK) {
        fprintf(stderr, "tessera trace merge: %s\n", ts_last_error());
        return 1;
    }
    return 0;
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
    ts_outfile *o = NULL;
    if (ts_outfile_open(pos[0], "a merged trace", &o) != TS_OK) {
        fprintf(stderr, "tessera trace merge: %s\n", ts_last_error());
        goto done;
    }
    FILE *f = ts_outfile_stream(o);
    fputs("{\"traceEvents\":[\n", f);
    bool first = true, bad = false;
    int64_t events = 0;
    for (int k = 0; k < n && !bad; k++) bad = write_events(f, &in[k], in[k].zero_us - zero, &first, &events) != 0;
    fprintf(f, "],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"producer\":\"tessera trace merge\","
               "\"clock\":\"CLOCK_REALTIME-aligned\",\"wall_clock_zero_us\":%.3f,\"sources\":[", zero);
    for (int k = 0; k < n; k++) {
        fprintf(f, "%s{\"file\":", k ? "," : "");
        ts__json_put_string(f, in[k].file);
        if (in[k].has_rank) fprintf(f, ",\"rank\":%lld", (long long)in[k].rank);
        fprintf(f, ",\"shift_us\":%.3f}", in[k].zero_us - zero);
    }
    fputs("]}}\n", f);
    if (bad) { /* no half-written output */
        ts_outfile_discard(o);
        goto done;
    }
    if (ts_outfile_close(o) != TS_OK) {
        fprintf(stderr, "tessera trace merge: %s\n", ts_last_error());
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
