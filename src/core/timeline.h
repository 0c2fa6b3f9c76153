/*
 * core/timeline.h — the timeline recorder behind `tessera train --trace` and
 * `--metrics-csv` (internal; not installed).
 *
 * One recorder per process, off unless started. While it records, any thread
 * may add complete events (a name, a lane, start and end on ts_time_now's
 * monotonic clock, up to two integer arguments) and add to counters; the
 * trainer writes the events as a Chrome / Perfetto trace ("traceEvents" JSON)
 * at the end of its run. Who records what:
 *
 *   src/train/trainer.c   lane TRAINER: step, data wait, forward_backward,
 *                         optimizer step, evaluate, checkpoint; starts, writes
 *                         and stops the recorder; reads the ALLREDUCE counter
 *                         for the metrics CSV
 *   src/train/strategy*.c lane TRAINER: forward, backward (where the strategy
 *                         runs them on the calling thread)
 *   src/parallel/ddp.c    lane TRAINER: allreduce wait (the hook that ends the
 *                         pass waiting for the buckets); lane COMM: each
 *                         bucket's all-reduce as the communication thread ran
 *                         it (the flight recorder's start and end), with its
 *                         bytes and index; counter ALLREDUCE: their seconds
 *   src/parallel/pipeline_parallel.c  lane DEVICE + s: forward / backward of
 *                         micro-batch i on stage s, on the stage's worker
 *   src/parallel/data_parallel.c      lane DEVICE + i: forward / backward of
 *                         replica i, on its device's worker
 *
 * Whose events: the recorder belongs to the thread that started it (the
 * trainer's). ts__tl_on() is true on that thread only, so another trainer
 * running in the same process at the same time (ranks as threads, tests) does
 * not leak its spans into this trace. Work that runs on other threads for the
 * owner is recorded by passing the decision along: the pipeline's run notes
 * ts__tl_on() on the calling thread and its stage workers call ts__tl_event
 * (which any thread may call while the recorder runs); DDP reads its
 * communication thread's times from the flight recorder on the owner's thread.
 *
 * Cost when off: ts__tl_on() is one thread-local load and a branch; callers
 * test it (or time with ts__tl_now(), 0 when off) before doing anything else.
 * Memory is bounded: events beyond max_events are dropped and counted, and the
 * file says how many. Events are kept in chunks allocated as they fill, under
 * one mutex (events are coarse: a few per step and micro-batch).
 */
#ifndef TS_CORE_TIMELINE_H
#define TS_CORE_TIMELINE_H

#include "core/internal.h"

#include <stdatomic.h>

/* Lanes: the trace's thread ids (tid). */
#define TS__TL_TRAINER 0 /* the thread running the trainer */
#define TS__TL_COMM 1    /* the process group's communication thread (DDP buckets) */
#define TS__TL_DEVICE 2  /* + s: device s's worker (pipeline stage s) */
#define TS__TL_MAX_LANES 80

/* Counters (ts__tl_count / ts__tl_take). */
typedef enum ts__tl_counter {
    TS__TL_ALLREDUCE_S = 0, /* seconds of DDP bucket all-reduces (as the communication thread ran them) */
    TS__TL_NUM_COUNTERS
} ts__tl_counter;

/* Events kept at most by default (about 64 bytes each). */
#define TS__TL_DEFAULT_MAX_EVENTS ((int64_t)1 << 20)

extern atomic_bool ts__tl_active;   /* the recorder runs (any thread may add events) */
extern _Thread_local bool ts__tl_mine; /* ...and this thread started it */

/* True on the thread that started the recorder, while it records. */
static inline bool ts__tl_on(void) { return ts__tl_mine; }
/* ts_time_now() while recording, else 0: `double t0 = ts__tl_now(); ...; ts__tl_span(lane, "x", t0);` */
static inline double ts__tl_now(void) { return ts__tl_on() ? ts_time_now() : 0.0; }

/* Starts recording for the calling thread with room for max_events events (0: counters only, no
 * events kept). Zero of the trace's clock: now (and the wall-clock time of now, for lining up ranks).
 * TS_ERR_STATE when the process already records (one recorder per process: a second trainer tracing
 * at the same time). */
ts_status ts__tl_start(int64_t max_events);
/* Stops recording and frees the events (call it on the thread that started). Events other threads
 * add from now on are ignored. */
void ts__tl_stop(void);

/* Names lane (copied; the latest name wins). Ignored when not recording or out of range. */
void ts__tl_lane(int lane, const char *name);
/* A complete event [t0, t1] (ts_time_now seconds) on lane, from any thread. name and the argument keys
 * are static strings (not copied); a NULL key means no argument. Ignored when not recording or t0 is 0. */
void ts__tl_event(int lane, const char *name, double t0, double t1, const char *k0, int64_t v0, const char *k1,
                  int64_t v1);
/* ts__tl_event(lane, name, t0, now) without arguments: closes a span opened with ts__tl_now(). */
void ts__tl_span(int lane, const char *name, double t0);
/* Adds v to counter c (any thread) / returns it and sets it to 0 (0 when not recording). */
void ts__tl_count(ts__tl_counter c, double v);
double ts__tl_take(ts__tl_counter c);

/* Events kept and dropped so far. */
int64_t ts__tl_events(void);
int64_t ts__tl_dropped(void);

/* Writes what was recorded so far to path as a Chrome / Perfetto trace (JSON object: traceEvents,
 * displayTimeUnit, otherData with the wall-clock zero, rank, world size and dropped events), pid =
 * rank, one tid per lane; atomically (temporary file + rename). TS_ERR_STATE when not recording;
 * TS_ERR_IO naming path. */
ts_status ts__tl_write(const char *path, int rank, int world_size);

/* The trace file of `rank` for a run of world_size processes: path itself for one process, else
 * path with ".rank<R>" before its extension (trace.json -> trace.rank0.json; no extension:
 * appended). Into buf (n bytes); false when it does not fit. */
bool ts__tl_rank_path(const char *path, int rank, int world_size, char *buf, size_t n);

#endif /* TS_CORE_TIMELINE_H */
