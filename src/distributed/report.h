/*
 * distributed/report.h — the failure report: what a rank whose process group
 * failed leaves for its launcher, and the one definition of its format. The
 * writer is the group's failure path (flight.c, from pg.c); the reader is the
 * launcher's liveness verdict (src/launch/verdict.c). Both go through this
 * header's table, so a key cannot be spelled twice.
 *
 * File: $TS_RUN_DIR/failure-<group>-rank<R>.txt (<group>: the group's name with
 * characters outside [A-Za-z0-9._-] as '_'), written to a temporary file and
 * renamed, so a reader sees all of it or nothing. Text, one "key=value" line per
 * field of TS__REPORT_FIELDS, in that order; values never hold a newline or
 * another control character (they become spaces). The first line is
 * "version=<TS__REPORT_VERSION>"; a reader skips a file of another version and
 * ignores keys it does not know, so a field may be added without a new version
 * (a change of meaning needs one). Fields:
 *     version         TS__REPORT_VERSION
 *     rank, world, pid, host, group   who wrote it
 *     status          the group's failure status ("TS_ERR_TIMEOUT", ...)
 *     cause           heartbeat | error | timeout | abort (ts__fail_cause)
 *     blame_rank      the peer this rank waited for and found silent (-1: none),
 *     blame_pid, blame_host, silent_s    with what it knew of it,
 *     blame_position  that peer's last heartbeat: "in collective #S", ...
 *     op              a description of the operation this rank was in, or "none"
 *     op_seq, op_name, op_state, op_for_s (seconds since it started)
 *     behind          comma-separated ranks whose last heartbeat said they had not
 *                     started that collective (may be empty)
 *     reason          the abort reason
 */
#ifndef TS_DIST_REPORT_H
#define TS_DIST_REPORT_H

#include "core/internal.h"

#include <stdint.h>

#define TS__REPORT_VERSION 1
#define TS__REPORT_MAX_BEHIND 64

/* Why a group failed. */
typedef enum ts__fail_cause {
    TS__CAUSE_ERROR = 0,  /* a collective failed (a peer went away, a transport error) */
    TS__CAUSE_TIMEOUT,    /* a collective did not finish within the group's timeout */
    TS__CAUSE_HEARTBEAT,  /* a peer this rank waited on stopped sending heartbeats */
    TS__CAUSE_ABORT,      /* ts_pg_abort */
    TS__CAUSE_COUNT
} ts__fail_cause;

const char *ts__fail_cause_name(ts__fail_cause c);

/* One report, as written and as read back. Strings are cut to fit. */
typedef struct ts__fail_report {
    int version;
    int rank, world, pid;
    char host[256], group[80];
    char status[32];
    ts__fail_cause cause;
    int blame_rank, blame_pid;
    char blame_host[256];
    double silent_s;
    char blame_position[96];
    char op[200];
    uint64_t op_seq;
    char op_name[48], op_state[16];
    double op_for_s;
    int behind[TS__REPORT_MAX_BEHIND], nbehind;
    char reason[1024];
} ts__fail_report;

/* The format: X(key, kind, member) for each line, in file order. Kinds: INT (int), U64, SECONDS (double, one
 * decimal), STR (char array), CAUSE (ts__fail_cause by name), RANKS (behind/nbehind). */
#define TS__REPORT_FIELDS(X)                          \
    X(version, INT, version)                          \
    X(rank, INT, rank)                                \
    X(world, INT, world)                              \
    X(pid, INT, pid)                                  \
    X(host, STR, host)                                \
    X(group, STR, group)                              \
    X(status, STR, status)                            \
    X(cause, CAUSE, cause)                            \
    X(blame_rank, INT, blame_rank)                    \
    X(blame_pid, INT, blame_pid)                      \
    X(blame_host, STR, blame_host)                    \
    X(silent_s, SECONDS, silent_s)                    \
    X(blame_position, STR, blame_position)            \
    X(op, STR, op)                                    \
    X(op_seq, U64, op_seq)                            \
    X(op_name, STR, op_name)                          \
    X(op_state, STR, op_state)                        \
    X(op_for_s, SECONDS, op_for_s)                    \
    X(behind, RANKS, behind)                          \
    X(reason, STR, reason)

/* A report with nothing known: version set, ranks -1, "none" for the operation. */
void ts__fail_report_init(ts__fail_report *r);

/* Writes r to dir/failure-<group>-rank<rank>.txt atomically. TS_ERR_IO names the path. */
ts_status ts__fail_report_write(const char *dir, const ts__fail_report *r);

/* Reads one report. TS_ERR_IO when it cannot be opened; TS_ERR_FORMAT when it has
 * another version or no rank. */
ts_status ts__fail_report_read(const char *path, ts__fail_report *r);

/* A group's name as report (and flight recorder) file names spell it: at most 64 characters of
 * [A-Za-z0-9._-], anything else (and a leading '.') as '_'. */
void ts__report_group_name(const char *group, char *out, size_t n);

/* Whether a directory entry's name is a report's ("failure-*.txt"). */
bool ts__fail_report_is_name(const char *name);

/* Removes every report in dir (before a new attempt; at the end of a run). */
void ts__fail_report_remove_all(const char *dir);

#endif /* TS_DIST_REPORT_H */
