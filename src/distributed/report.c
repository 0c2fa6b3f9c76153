/*
 * distributed/report.c — writing and reading failure reports (the format is
 * report.h's TS__REPORT_FIELDS table; both directions walk it).
 */
#include "distributed/report.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const char *const cause_names[TS__CAUSE_COUNT] = {"error", "timeout", "heartbeat", "abort"};

const char *ts__fail_cause_name(ts__fail_cause c) {
    return c >= 0 && c < TS__CAUSE_COUNT ? cause_names[c] : "unknown";
}

static ts__fail_cause cause_parse(const char *s) {
    for (int i = 0; i < TS__CAUSE_COUNT; i++)
        if (strcmp(s, cause_names[i]) == 0) return (ts__fail_cause)i;
    return TS__CAUSE_ERROR;
}

void ts__fail_report_init(ts__fail_report *r) {
    memset(r, 0, sizeof *r);
    r->version = TS__REPORT_VERSION;
    r->rank = r->blame_rank = -1;
    snprintf(r->op, sizeof r->op, "none");
    snprintf(r->op_name, sizeof r->op_name, "none");
    snprintf(r->op_state, sizeof r->op_state, "none");
}

/* ---- the table, as offsets ---------------------------------------------------------------------- */

typedef enum { K_INT, K_U64, K_SECONDS, K_STR, K_CAUSE, K_RANKS } field_kind;

typedef struct field {
    const char *key;
    field_kind kind;
    size_t off, size;
} field;

static const field fields[] = {
#define TS__REPORT_ROW(key, kind, member) \
    {#key, K_##kind, offsetof(ts__fail_report, member), sizeof(((ts__fail_report *)0)->member)},
    TS__REPORT_FIELDS(TS__REPORT_ROW)
#undef TS__REPORT_ROW
};
#define NFIELDS (sizeof fields / sizeof fields[0])

/* Writes s on one line: newlines and other control characters become spaces. */
static void put_text(FILE *fp, const char *s) {
    for (; *s; s++) fputc((unsigned char)*s < 0x20 ? ' ' : *s, fp);
}

static void put_field(FILE *fp, const ts__fail_report *r, const field *f) {
    const char *p = (const char *)r + f->off;
    fprintf(fp, "%s=", f->key);
    switch (f->kind) {
    case K_INT: fprintf(fp, "%d", *(const int *)p); break;
    case K_U64: fprintf(fp, "%" PRIu64, *(const uint64_t *)p); break;
    case K_SECONDS: fprintf(fp, "%.1f", *(const double *)p); break;
    case K_STR: put_text(fp, p); break;
    case K_CAUSE: fputs(ts__fail_cause_name(*(const ts__fail_cause *)p), fp); break;
    case K_RANKS:
        for (int i = 0; i < r->nbehind && i < TS__REPORT_MAX_BEHIND; i++) fprintf(fp, "%s%d", i ? "," : "", r->behind[i]);
        break;
    }
    fputc('\n', fp);
}

void ts__report_group_name(const char *s, char *out, size_t n) {
    size_t i = 0;
    for (; s && s[i] && i + 1 < n && i < 64; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                  c == '_';
        out[i] = ok && !(i == 0 && c == '.') ? c : '_';
    }
    out[i] = 0;
}

ts_status ts__fail_report_write(const char *dir, const ts__fail_report *r) {
    TS_ARG(dir && *dir && r, "ts__fail_report_write: no directory or report");
    char g[80], path[PATH_MAX];
    ts__report_group_name(r->group, g, sizeof g);
    if ((size_t)snprintf(path, sizeof path, "%s/failure-%s-rank%d.txt", dir, g, r->rank) >= sizeof path)
        return ts_error(TS_ERR_IO, "failure report: the path under '%.200s' is too long", dir);
    ts_outfile *o = NULL; /* a temporary file renamed into place: readers see a whole report or none */
    TS_TRY(ts__error_prefix(ts_outfile_open(path, "a failure report", &o), "failure report"));
    FILE *fp = ts_outfile_stream(o);
    for (size_t i = 0; i < NFIELDS; i++) put_field(fp, r, &fields[i]);
    return ts__error_prefix(ts_outfile_close(o), "failure report");
}

static void get_field(ts__fail_report *r, const field *f, const char *v) {
    char *p = (char *)r + f->off;
    switch (f->kind) {
    case K_INT: *(int *)p = (int)strtol(v, NULL, 10); break;
    case K_U64: *(uint64_t *)p = strtoull(v, NULL, 10); break;
    case K_SECONDS: *(double *)p = strtod(v, NULL); break;
    case K_STR: snprintf(p, f->size, "%s", v); break;
    case K_CAUSE: *(ts__fail_cause *)p = cause_parse(v); break;
    case K_RANKS:
        r->nbehind = 0;
        for (const char *t = v; *t && r->nbehind < TS__REPORT_MAX_BEHIND;) {
            char *end = NULL;
            long x = strtol(t, &end, 10);
            if (end == t) break;
            r->behind[r->nbehind++] = (int)x;
            t = *end == ',' ? end + 1 : end;
        }
        break;
    }
}

ts_status ts__fail_report_read(const char *path, ts__fail_report *r) {
    ts__fail_report_init(r);
    r->version = 0;
    char *text = NULL;
    size_t n = 0;
    TS_TRY(ts__error_prefix(ts_read_file(path, "a failure report", 1 << 20, &text, &n), "failure report"));
    char line[1400];
    FILE *fp = fmemopen(text, n, "r");
    if (!fp) {
        free(text);
        return ts_error(TS_ERR_NOMEM, "failure report %s: out of memory", path);
    }
    while (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = 0;
        char *v = strchr(line, '=');
        if (!v) continue;
        *v++ = 0;
        for (size_t i = 0; i < NFIELDS; i++)
            if (strcmp(line, fields[i].key) == 0) get_field(r, &fields[i], v);
    }
    fclose(fp);
    free(text);
    if (r->version != TS__REPORT_VERSION)
        return ts_error(TS_ERR_FORMAT, "failure report %s: version %d, expected %d", path, r->version,
                        TS__REPORT_VERSION);
    if (r->rank < 0) return ts_error(TS_ERR_FORMAT, "failure report %s: no rank", path);
    return TS_OK;
}

bool ts__fail_report_is_name(const char *name) {
    size_t len = strlen(name);
    return strncmp(name, "failure-", 8) == 0 && len > 12 && strcmp(name + len - 4, ".txt") == 0;
}

void ts__fail_report_remove_all(const char *dir) {
    DIR *d = dir && *dir ? opendir(dir) : NULL;
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "failure-", 8) != 0) continue; /* reports and their temporary files */
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}
