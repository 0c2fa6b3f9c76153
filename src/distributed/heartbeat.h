/*
 * distributed/heartbeat.h — liveness of a process group's peers (internal; see
 * heartbeat.c for the protocol and "liveness" in tessera/dist.h for the contract).
 */
#ifndef TS_DIST_HEARTBEAT_H
#define TS_DIST_HEARTBEAT_H

#include "distributed/flight.h"
#include "distributed/store.h"

typedef struct ts__heartbeat ts__heartbeat;

/* Whom the heartbeat blames when it fails a group. */
typedef struct ts__hb_blame {
    int rank, pid;      /* the silent peer */
    char host[64];
    double silent_s;    /* seconds since its last heartbeat */
    uint64_t started, completed; /* its last collectives started / completed, from that heartbeat */
    ts_pg_op_record op; /* what this rank was waiting in */
} ts__hb_blame;

/* Called once, on the heartbeat thread, when a peer this rank waits on has
 * been silent for the timeout: st is TS_ERR_TIMEOUT, reason the whole message.
 * The callee aborts the group (it must not stop the heartbeat). */
typedef void (*ts__hb_fail_fn)(void *user, ts_status st, const char *reason, const ts__hb_blame *blame);

/* The heartbeat timeout from the options' value: > 0 as is; < 0: off (0);
 * 0: TS_HEARTBEAT_TIMEOUT (seconds; 0 or "off": off), else
 * TS_HEARTBEAT_DEFAULT_TIMEOUT_S. A malformed variable, or a timeout below
 * ts__heartbeat_check_timeout's minimum, is TS_ERR_INVALID_ARG naming it. */
ts_status ts__heartbeat_resolve_timeout(double opt, double *out);

/* The interval between beats for a timeout: TS_HEARTBEAT_INTERVAL, else timeout / 10
 * within [0.05, 1] s (at least 0.01 s). */
ts_status ts__heartbeat_interval(double timeout_s, double *out);

/* A timeout (> 0; 0 is off and always fine) must span TS__HB_MIN_INTERVALS intervals,
 * or a beat that is merely late blames a healthy rank. TS_ERR_INVALID_ARG naming `what`
 * (the variable or option and its value), the value and the minimum. */
#define TS__HB_MIN_INTERVALS 5
ts_status ts__heartbeat_check_timeout(double timeout_s, const char *what);

/* Publishes this rank's heartbeat address in store (already the group's
 * prefix store; every rank must call this in the same order per group),
 * reads every peer's, and starts the heartbeat thread. fr is the group's
 * recorder (what this rank waits in, its position); both fr and user
 * outlive the heartbeat. world > 1 and timeout_s > 0. */
ts_status ts__heartbeat_start(ts_store *store, int rank, int world, double timeout_s, ts__flight *fr,
                              ts__hb_fail_fn fail, void *user, ts__heartbeat **out);

/* The same in steps, for an exchange without a store: _new opens the socket
 * (arguments as above), _address is this rank's entry (a string shorter than
 * TS__HB_ADDR_BYTES), _peers_from_table reads world entries of
 * TS__HB_ADDR_BYTES each (an all_gather of every rank's entry; an empty or
 * bad entry leaves that rank unjudged), _run starts the thread. */
#define TS__HB_ADDR_BYTES 256
ts_status ts__heartbeat_new(int rank, int world, double timeout_s, ts__flight *fr, ts__hb_fail_fn fail, void *user,
                            ts__heartbeat **out);
const char *ts__heartbeat_address(const ts__heartbeat *hb);
ts_status ts__heartbeat_peers_from_store(ts__heartbeat *hb, ts_store *store);
void ts__heartbeat_peers_from_table(ts__heartbeat *hb, const char *table);
ts_status ts__heartbeat_run(ts__heartbeat *hb);

/* Tells the peers this rank leaves, stops the thread, frees (also one that
 * never ran). NULL is fine. Any thread but the heartbeat's own. */
void ts__heartbeat_stop(ts__heartbeat *hb);

/* Test hook: while paused the thread sends nothing (peers see this rank as
 * stopped); it still listens. */
void ts__heartbeat_pause(ts__heartbeat *hb, bool paused);

/* After op failed because a peer went away (its connection closed, it
 * aborted): the peer op waited on that has been silent longest, if for a
 * while (2.5 intervals and a quarter of the timeout) — often the real cause,
 * when the peer that went away gave up on it first. Returns its rank with *b
 * filled and note = "; rank R (host H, pid P) has not been heard from for N s
 * either (stopped or hung?)...", else -1. hb NULL: -1. */
int ts__heartbeat_suspect(ts__heartbeat *hb, const ts_pg_op_record *op, ts__hb_blame *b, char *note, size_t n);

/* Peers whose last heartbeat said they had not started collective `seq`:
 * writes up to cap ranks into ranks and returns how many. */
int ts__heartbeat_behind(ts__heartbeat *hb, uint64_t seq, int *ranks, int cap);

#endif /* TS_DIST_HEARTBEAT_H */
