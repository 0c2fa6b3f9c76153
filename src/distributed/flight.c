/*
 * distributed/flight.c — the flight recorder of a process group (see flight.h):
 * a ring of the last TS_PG_FLIGHT_RECORDER_SIZE operations, the operation
 * running now, dumps (log and file) and the failure report `tessera run` reads.
 *
 * Slots: operation k (k = 1, 2, ... in call order, its "fid") lives in slot
 * k % SIZE while fid[slot] == k; an update for an operation whose slot was
 * taken over by a later one (more than SIZE calls queued behind it) only
 * updates `cur`. The running operation is also copied into `cur`, so the
 * heartbeat thread can always say what this rank is waiting in.
 *
 * The failure report `tessera run` reads is distributed/report.h's format;
 * ts__flight_report fills one from the group's failure and the ring.
 */
#include "distributed/flight.h"
#include "core/env.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define SIZE TS_PG_FLIGHT_RECORDER_SIZE
#define LOG_LINES 8 /* operations a dump logs at ERROR (the file gets all) */

void ts__flight_init(ts__flight *f) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    atomic_init(&f->coll_started, 0);
    atomic_init(&f->coll_completed, 0);
}

void ts__flight_destroy(ts__flight *f) { pthread_mutex_destroy(&f->mu); }

const char *ts_pg_op_state_name(ts_pg_op_state s) {
    switch (s) {
    case TS_PG_OP_ISSUED: return "issued";
    case TS_PG_OP_STARTED: return "started";
    case TS_PG_OP_COMPLETED: return "completed";
    case TS_PG_OP_FAILED: return "failed";
    }
    return "?";
}

const char *ts_coll_kind_name(ts_coll_kind k) {
    static const char *const names[TS_COLL_KIND_COUNT] = {
        [TS_COLL_INIT] = "init",           [TS_COLL_ALL_REDUCE] = "all_reduce",
        [TS_COLL_BROADCAST] = "broadcast", [TS_COLL_REDUCE] = "reduce",
        [TS_COLL_ALL_GATHER] = "all_gather", [TS_COLL_REDUCE_SCATTER] = "reduce_scatter",
        [TS_COLL_BARRIER] = "barrier",     [TS_COLL_SEND] = "send",
        [TS_COLL_RECV] = "recv",
    };
    return (unsigned)k < TS_COLL_KIND_COUNT ? names[k] : "?";
}

bool ts_coll_kind_is_p2p(ts_coll_kind k) { return k == TS_COLL_SEND || k == TS_COLL_RECV; }

static bool is_p2p(const ts_pg_op_record *r) { return ts_coll_kind_is_p2p(r->kind); }

uint64_t ts__flight_issue(ts__flight *f, ts_coll_kind kind, ts_dtype dt, int reduce_op, size_t count, int peer,
                          bool async, bool started) {
    double now = ts_time_now();
    bool p2p = ts_coll_kind_is_p2p(kind), setup = kind == TS_COLL_INIT; /* the backend connecting: no number */
    pthread_mutex_lock(&f->mu);
    uint64_t fid = ++f->next_fid, seq = setup ? 0 : p2p ? ++f->p2p_seq : ++f->coll_seq;
    size_t slot = (size_t)(fid % SIZE);
    ts_pg_op_record *r = &f->ring[slot];
    *r = (ts_pg_op_record){seq,  kind,  dt, reduce_op, count, count * ts_dtype_size(dt), peer, async,
                           started ? TS_PG_OP_STARTED : TS_PG_OP_ISSUED, now, started ? now : 0.0, 0.0};
    f->fid[slot] = fid;
    if (started) {
        f->cur_fid = fid;
        f->cur = *r;
        if (!p2p && !setup) atomic_store_explicit(&f->coll_started, seq, memory_order_relaxed);
    }
    pthread_mutex_unlock(&f->mu);
    return fid;
}

void ts__flight_start(ts__flight *f, uint64_t fid) {
    double now = ts_time_now();
    pthread_mutex_lock(&f->mu);
    size_t slot = (size_t)(fid % SIZE);
    if (f->fid[slot] == fid) {
        ts_pg_op_record *r = &f->ring[slot];
        r->state = TS_PG_OP_STARTED;
        r->started_s = now;
        f->cur = *r;
        f->cur_fid = fid;
        if (!is_p2p(r)) atomic_store_explicit(&f->coll_started, r->seq, memory_order_relaxed);
    }
    pthread_mutex_unlock(&f->mu);
}

void ts__flight_end(ts__flight *f, uint64_t fid, bool ok) {
    double now = ts_time_now();
    pthread_mutex_lock(&f->mu);
    size_t slot = (size_t)(fid % SIZE);
    ts_pg_op_record *r = f->fid[slot] == fid ? &f->ring[slot] : f->cur_fid == fid ? &f->cur : NULL;
    if (r) {
        r->state = ok ? TS_PG_OP_COMPLETED : TS_PG_OP_FAILED;
        r->ended_s = now;
        if (r->started_s == 0) r->started_s = now; /* failed before the backend saw it (aborted group) */
        if (ok && !is_p2p(r) && r->seq) atomic_store_explicit(&f->coll_completed, r->seq, memory_order_relaxed);
    }
    if (f->cur_fid == fid) f->cur_fid = 0;
    pthread_mutex_unlock(&f->mu);
}

bool ts__flight_current(ts__flight *f, ts_pg_op_record *out) {
    pthread_mutex_lock(&f->mu);
    bool has = f->cur_fid != 0;
    if (has) *out = f->cur;
    pthread_mutex_unlock(&f->mu);
    return has;
}

bool ts__flight_get(ts__flight *f, uint64_t fid, ts_pg_op_record *out) {
    pthread_mutex_lock(&f->mu);
    size_t slot = (size_t)(fid % SIZE);
    bool has = fid != 0 && f->fid[slot] == fid;
    if (has) *out = f->ring[slot];
    else if (fid != 0 && f->cur_fid == fid) *out = f->cur, has = true;
    pthread_mutex_unlock(&f->mu);
    return has;
}

bool ts__flight_last(ts__flight *f, ts_pg_op_record *out) {
    pthread_mutex_lock(&f->mu);
    size_t slot = (size_t)(f->next_fid % SIZE);
    bool has = f->next_fid != 0 && f->fid[slot] == f->next_fid;
    if (has) *out = f->ring[slot];
    pthread_mutex_unlock(&f->mu);
    return has;
}

int ts__flight_snapshot(ts__flight *f, ts_pg_op_record *out, int cap) {
    ts_pg_op_record all[SIZE];
    int n = 0;
    pthread_mutex_lock(&f->mu);
    uint64_t first = f->next_fid >= SIZE ? f->next_fid - SIZE + 1 : 1;
    for (uint64_t k = first; k <= f->next_fid; k++) {
        size_t slot = (size_t)(k % SIZE);
        if (f->fid[slot] == k) all[n++] = f->ring[slot];
    }
    pthread_mutex_unlock(&f->mu);
    int skip = n > cap ? n - cap : 0; /* keep the newest */
    for (int i = skip; i < n; i++) out[i - skip] = all[i];
    return n - skip;
}

static void human_bytes(size_t b, char *buf, size_t n) {
    if (b < 1024) snprintf(buf, n, "%zu B", b);
    else if (b < ((size_t)1 << 20)) snprintf(buf, n, "%.4g KiB", (double)b / 1024.0);
    else if (b < ((size_t)1 << 30)) snprintf(buf, n, "%.4g MiB", (double)b / 1048576.0);
    else snprintf(buf, n, "%.4g GiB", (double)b / 1073741824.0);
}

void ts__flight_describe(const ts_pg_op_record *r, char *buf, size_t n) {
    static const char *const rops[] = {"sum", "avg", "max", "min"};
    char bytes[32], extra[48] = "";
    human_bytes(r->bytes, bytes, sizeof bytes);
    bool p2p = is_p2p(r);
    if (r->reduce_op >= 0 && r->reduce_op < 4) snprintf(extra, sizeof extra, ", %s", rops[r->reduce_op]);
    if (r->peer >= 0)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", %s rank %d",
                 p2p ? (r->kind == TS_COLL_SEND ? "to" : "from") : "root", r->peer);
    if (r->kind == TS_COLL_INIT)
        snprintf(buf, n, "the process group's setup (the backend connecting to every rank)");
    else if (r->kind == TS_COLL_BARRIER)
        snprintf(buf, n, "collective #%llu barrier", (unsigned long long)r->seq);
    else
        snprintf(buf, n, "%s #%llu %s (%s x %zu, %s%s)", p2p ? "p2p" : "collective", (unsigned long long)r->seq,
                 ts_coll_kind_name(r->kind), (unsigned)r->dtype < TS_DTYPE_COUNT ? ts_dtype_name(r->dtype) : "?",
                 r->count, bytes, extra);
}

/* One dump line: the description, the state and its times relative to now. */
static void dump_line(const ts_pg_op_record *r, double now, char *buf, size_t n) {
    char d[200];
    ts__flight_describe(r, d, sizeof d);
    int k = snprintf(buf, n, "  %s%s: %s", d, r->async ? " async" : "", ts_pg_op_state_name(r->state));
    if (k < 0 || (size_t)k >= n) return;
    char *p = buf + k;
    size_t left = n - (size_t)k;
    switch (r->state) {
    case TS_PG_OP_ISSUED: snprintf(p, left, ", queued %.3f s ago", now - r->issued_s); break;
    case TS_PG_OP_STARTED:
        snprintf(p, left, " %.3f s ago (issued %.3f s ago), still running", now - r->started_s, now - r->issued_s);
        break;
    default:
        snprintf(p, left, " %.3f s ago after %.3f s (issued %.3f s ago)", now - r->ended_s, r->ended_s - r->started_s,
                 now - r->issued_s);
        break;
    }
}

static void header(const ts__fail_info *fi, int nrec, char *buf, size_t n) {
    char what[48] = "no operations yet";
    if (nrec) snprintf(what, sizeof what, "the last %d operation%s, oldest first", nrec, nrec == 1 ? "" : "s");
    size_t rl = strlen(fi->reason);
    snprintf(buf, n, "flight recorder of rank %d of %d (host %s, pid %d), process group '%s', %s (%s: %.500s%s)",
             fi->rank, fi->world, fi->host, fi->pid, fi->group, what, ts__fail_cause_name(fi->cause), fi->reason, rl > 500 ? "..." : "");
}

void ts__flight_dump(ts__flight *f, const ts__fail_info *fi) {
    ts_pg_op_record rec[SIZE];
    int k = ts__flight_snapshot(f, rec, SIZE);
    double now = ts_time_now();
    char line[768], msg[2048];
    /* One log call (several lines): dumps of ranks sharing a process do not interleave. */
    header(fi, k, msg, sizeof msg);
    int from = k > LOG_LINES ? k - LOG_LINES : 0;
    if (from)
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg),
                 "\n  ... %d older operation%s (ts_pg_flight_recorder, TS_FLIGHT_RECORDER_DIR)", from,
                 from == 1 ? "" : "s");
    for (int i = from; i < k; i++) {
        dump_line(&rec[i], now, line, sizeof line);
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "\n%s", line);
    }
    ts_log(TS_LOG_ERROR, "%s", msg);

    const char *dir = ts_env_str(TS_ENV_FLIGHT_RECORDER_DIR);
    if (!dir || !*dir) return;
    char g[80], path[1024];
    ts__report_group_name(fi->group, g, sizeof g);
    snprintf(path, sizeof path, "%s/flight-%s-rank%d-pid%d.txt", dir, g, fi->rank, fi->pid);
    mkdir(dir, 0777); /* may exist already */
    FILE *fp = fopen(path, "w");
    if (!fp) {
        ts_log(TS_LOG_WARN, "TS_FLIGHT_RECORDER_DIR: cannot write %s: %s", path, strerror(errno));
        return;
    }
    header(fi, k, line, sizeof line);
    fprintf(fp, "%s\n", line);
    for (int i = 0; i < k; i++) {
        dump_line(&rec[i], now, line, sizeof line);
        fprintf(fp, "%s\n", line);
    }
    fclose(fp);
}

void ts__flight_report(ts__flight *f, const ts__fail_info *fi) {
    const char *dir = ts_env_str(TS_ENV_RUN_DIR);
    if (!dir || !*dir) return;
    ts__fail_report *r = ts__calloc(1, sizeof *r);
    if (!r) return;
    ts__fail_report_init(r);
    ts_pg_op_record op;
    bool in_op = fi->op ? (op = *fi->op, true) : ts__flight_last(f, &op);
    if (in_op) {
        ts__flight_describe(&op, r->op, sizeof r->op);
        r->op_seq = op.seq;
        snprintf(r->op_name, sizeof r->op_name, "%s", ts_coll_kind_name(op.kind));
        snprintf(r->op_state, sizeof r->op_state, "%s", ts_pg_op_state_name(op.state));
        r->op_for_s = op.started_s > 0 ? (op.ended_s > 0 ? op.ended_s : ts_time_now()) - op.started_s : 0.0;
    }
    r->rank = fi->rank;
    r->world = fi->world;
    r->pid = fi->pid;
    snprintf(r->host, sizeof r->host, "%s", fi->host ? fi->host : "");
    snprintf(r->group, sizeof r->group, "%s", fi->group ? fi->group : "");
    snprintf(r->status, sizeof r->status, "%s", ts_status_name(fi->status));
    r->cause = fi->cause;
    r->blame_rank = fi->blame_rank;
    r->blame_pid = fi->blame_pid;
    snprintf(r->blame_host, sizeof r->blame_host, "%s", fi->blame_host ? fi->blame_host : "");
    r->silent_s = fi->silent_s;
    if (fi->blame_rank >= 0 && fi->blame_started == 0)
        snprintf(r->blame_position, sizeof r->blame_position, "no collective started yet");
    else if (fi->blame_rank >= 0 && fi->blame_completed >= fi->blame_started)
        snprintf(r->blame_position, sizeof r->blame_position, "completed collective #%llu",
                 (unsigned long long)fi->blame_completed);
    else if (fi->blame_rank >= 0)
        snprintf(r->blame_position, sizeof r->blame_position, "in collective #%llu", (unsigned long long)fi->blame_started);
    for (int i = 0; i < fi->nbehind && r->nbehind < TS__REPORT_MAX_BEHIND; i++) r->behind[r->nbehind++] = fi->behind[i];
    snprintf(r->reason, sizeof r->reason, "%s", fi->reason ? fi->reason : "");
    if (ts__fail_report_write(dir, r) != TS_OK) ts_log(TS_LOG_WARN, "TS_RUN_DIR: %s", ts_last_error());
    free(r);
}
