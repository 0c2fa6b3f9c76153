/*
 * distributed/pg.h — process-group internals shared with other parts of src/distributed
 * and src/parallel (not installed).
 */
#ifndef TS_DIST_PG_H
#define TS_DIST_PG_H

#include "distributed/backend.h"

/* Aborts the group with a status other than TS_ERR_STATE: later calls fail
 * with `status` and "process group '<name>' was aborted: <reason>". The first
 * abort wins; later ones are ignored. Any thread. */
void ts__pg_abort_status(ts_process_group *pg, ts_status status, const char *reason);
/* The group's name ("default" unless given). Borrowed. */
const char *ts__pg_name(const ts_process_group *pg);
/* The device whose memory the group's backend takes (the nccl backend's GPU), or NULL (host memory only). */
ts_device *ts__pg_device(const ts_process_group *pg);
/* Has the group been aborted? */
bool ts__pg_aborted(const ts_process_group *pg);
/* Test hook: a paused group sends no heartbeats (its peers see it as stopped). */
void ts__pg_heartbeat_pause(ts_process_group *pg, bool paused);

#endif /* TS_DIST_PG_H */
