/*
 * distributed/flight.h — a process group's flight recorder and failure report
 * (internal; the public view is ts_pg_flight_recorder in tessera/dist.h).
 *
 * The recorder is a ring of the group's last TS_PG_FLIGHT_RECORDER_SIZE
 * operations. pg.c records each one when it is called (issued), when the
 * backend starts it and when it ends; the heartbeat thread asks which one is
 * running now; a failure dumps the ring (ts_log at ERROR, and a file under
 * TS_FLIGHT_RECORDER_DIR) and writes a report for the launcher (TS_RUN_DIR).
 * Every function may be called from any thread (one mutex per recorder, never
 * held while calling out).
 */
#ifndef TS_DIST_FLIGHT_H
#define TS_DIST_FLIGHT_H

#include "core/internal.h"
#include "distributed/report.h"
#include "tessera/dist.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct ts__flight {
    pthread_mutex_t mu;
    ts_pg_op_record ring[TS_PG_FLIGHT_RECORDER_SIZE];
    uint64_t fid[TS_PG_FLIGHT_RECORDER_SIZE]; /* which operation a slot holds (0: none) */
    uint64_t next_fid;                        /* operations recorded so far */
    uint64_t coll_seq, p2p_seq;               /* numbers handed out */
    uint64_t cur_fid;                         /* the operation the backend runs now, 0: none */
    ts_pg_op_record cur;
    /* This rank's position, for heartbeats: the last collective started / completed. */
    _Atomic uint64_t coll_started, coll_completed;
} ts__flight;

void ts__flight_init(ts__flight *f);
void ts__flight_destroy(ts__flight *f);

/* Records a newly called operation and returns its id (never 0). TS_COLL_INIT
 * gets no number, send/recv are numbered apart from the collectives. started:
 * the backend runs it at once (a blocking call on an idle group). */
uint64_t ts__flight_issue(ts__flight *f, ts_coll_kind kind, ts_dtype dt, int reduce_op, size_t count, int peer,
                          bool async, bool started);
void ts__flight_start(ts__flight *f, uint64_t fid);
void ts__flight_end(ts__flight *f, uint64_t fid, bool ok);

/* The operation the backend is running now: true with *out filled, else false. */
bool ts__flight_current(ts__flight *f, ts_pg_op_record *out);
/* Operation fid, if the ring still holds it: true with *out filled. */
bool ts__flight_get(ts__flight *f, uint64_t fid, ts_pg_op_record *out);
/* The most recent operation (any state): true with *out filled, else false (none yet). */
bool ts__flight_last(ts__flight *f, ts_pg_op_record *out);
/* Oldest first into out[0 .. cap); returns how many. */
int ts__flight_snapshot(ts__flight *f, ts_pg_op_record *out, int cap);

/* "collective #57 all_reduce (f32 x 1024, 4 KiB, sum)" / "recv #3 (f32 x 10, 40 B, from rank 1)". */
void ts__flight_describe(const ts_pg_op_record *r, char *buf, size_t n);

/* Why a group failed and whom it blames (a failure report's contents). */
typedef struct ts__fail_info {
    const char *group, *host;
    int rank, world, pid;
    ts_status status;
    ts__fail_cause cause;
    const char *reason; /* the abort reason (one line is written) */
    const ts_pg_op_record *op; /* the operation that failed or was running, or NULL */
    /* The peer this rank waited for (cause "heartbeat"; -1: none), with what it knows of it. */
    int blame_rank, blame_pid;
    const char *blame_host;
    double silent_s;
    uint64_t blame_started, blame_completed; /* its position by its last heartbeat */
    /* Peers whose last heartbeat said they had not started the collective this rank was in. */
    const int *behind;
    int nbehind;
} ts__fail_info;

/* Logs the recorder at ERROR (a header naming rank, host, pid and the reason,
 * then one line per operation), and writes it to
 * $TS_FLIGHT_RECORDER_DIR/flight-<group>-rank<R>-pid<P>.txt when that is set. */
void ts__flight_dump(ts__flight *f, const ts__fail_info *fi);
/* Writes the failure report (distributed/report.h) into $TS_RUN_DIR when
 * TS_RUN_DIR is set; nothing otherwise. */
void ts__flight_report(ts__flight *f, const ts__fail_info *fi);

#endif /* TS_DIST_FLIGHT_H */
