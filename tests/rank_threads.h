/*
 * tests/rank_threads.h — ranks as threads (gloo's test style): one process runs
 * a function on N threads, each rank with its own process group over one shared
 * in-memory store, and collects every rank's status, error message and results.
 * Header-only; include test_util.h first.
 *
 * A test declares its per-rank context with the harness's fields first, then
 * has the harness define the runner for that type:
 *
 *     typedef struct rank_ctx rank_ctx;
 *     struct rank_ctx {
 *         TU_RANK_FIELDS(rank_ctx); // rank, world, arg, st, err (and two private fields)
 *         float *values;            // the test's own results, filled by the rank function
 *     };
 *     TU_RANK_THREADS(rank_ctx, run_ranks)
 *
 * which defines
 *
 *     static bool run_ranks(int world, ts_status (*fn)(rank_ctx *c, ts_process_group *pg),
 *                           const void *arg, rank_ctx *c);
 *
 * run_ranks zeroes c[0 .. world-1], sets their rank, world and arg, and runs fn on
 * `world` threads. Each rank thread first sets its kernel thread budget to
 * TU_RANK_NUM_THREADS (default 1; OpenMP's count is per thread, so it must be set on
 * the rank's own thread — the calling thread's budget is left alone), then joins a
 * process group of `world` ranks over the shared memory store (timeout
 * TU_RANK_TIMEOUT_S, default 60 s), calls fn and frees the group. run_ranks counts one
 * check per rank; a rank whose group or fn failed is reported with its error message
 * (c[r].st, c[r].err) and makes run_ranks return false. At most TU_RANK_MAX_WORLD
 * (default 8) ranks. Freeing what fn stored in the contexts is the test's business.
 *
 * Rank threads never use CHECK (its counters are not atomic): a rank function
 * returns a status and records its results in its context; the calling thread
 * checks them after run_ranks returns.
 */
#ifndef TS_TEST_RANK_THREADS_H
#define TS_TEST_RANK_THREADS_H

#include "test_util.h"

#include <pthread.h>

#ifndef TU_RANK_MAX_WORLD
#define TU_RANK_MAX_WORLD 8
#endif
#ifndef TU_RANK_NUM_THREADS
#define TU_RANK_NUM_THREADS 1
#endif
#ifndef TU_RANK_TIMEOUT_S
#define TU_RANK_TIMEOUT_S 60
#endif

/* The harness's fields of a rank context `type` (put them first). */
#define TU_RANK_FIELDS(type)                                                                                  \
    int rank, world;                                  /* this rank, the number of ranks */                    \
    const void *arg;                                  /* the test's shared, read-only configuration */        \
    ts_status st;                                     /* the group's or fn's status */                        \
    char err[600];                                    /* the rank thread's ts_last_error() when st != TS_OK */ \
    ts_store *tu_store;                               /* private: the shared memory store */                  \
    ts_status (*tu_fn)(type * c, ts_process_group * pg) /* private: the rank function */

/* A rank thread's start: its kernel thread budget and its process group. */
static inline ts_status tu_rank_join(ts_store *store, int rank, int world, ts_process_group **pg) {
    ts_set_num_threads(TU_RANK_NUM_THREADS);
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = store;
    o.rank = rank;
    o.world_size = world;
    o.timeout_s = TU_RANK_TIMEOUT_S;
    *pg = NULL;
    return ts_pg_new(&o, pg);
}

/* A rank thread's end: keeps its error message, frees its group. */
static inline void tu_rank_leave(ts_status st, char *err, size_t err_size, ts_process_group *pg) {
    if (st != TS_OK) snprintf(err, err_size, "%s", ts_last_error());
    ts_pg_free(pg);
}

/* The shared store for `world` ranks; NULL (a failed check) when world is out of range. */
static inline ts_store *tu_ranks_store(int world) {
    tu_checks++;
    if (world < 1 || world > TU_RANK_MAX_WORLD) {
        tu_failures++;
        fprintf(stderr, "run_ranks: world %d is not in 1..%d (TU_RANK_MAX_WORLD)\n", world, TU_RANK_MAX_WORLD);
        return NULL;
    }
    ts_store *store = NULL;
    CHECK_OK(ts_store_memory_new(&store));
    return store;
}

/* One check per rank; false after reporting when the rank failed. */
static inline bool tu_rank_report(int rank, int world, ts_status st, const char *err) {
    tu_checks++;
    if (st == TS_OK) return true;
    tu_failures++;
    fprintf(stderr, "rank %d of %d failed: %s: %s\n", rank, world, ts_status_name(st), err);
    return false;
}

/* Defines `static bool name(world, fn, arg, c)` (see the top of this file) and its thread function. */
#define TU_RANK_THREADS(type, name)                                                                  \
    static void *name##_thread(void *v) {                                                            \
        type *c = v;                                                                                 \
        ts_process_group *pg = NULL;                                                                 \
        c->st = tu_rank_join(c->tu_store, c->rank, c->world, &pg);                                   \
        if (c->st == TS_OK) c->st = c->tu_fn(c, pg);                                                 \
        tu_rank_leave(c->st, c->err, sizeof c->err, pg);                                             \
        return NULL;                                                                                 \
    }                                                                                                \
    static bool name(int world, ts_status (*fn)(type * c, ts_process_group * pg), const void *arg,   \
                     type *c) {                                                                      \
        ts_store *store = tu_ranks_store(world);                                                     \
        if (!store) return false;                                                                    \
        pthread_t th[TU_RANK_MAX_WORLD];                                                             \
        for (int r = 0; r < world; r++) {                                                            \
            memset(&c[r], 0, sizeof c[r]);                                                           \
            c[r].rank = r;                                                                           \
            c[r].world = world;                                                                      \
            c[r].arg = arg;                                                                          \
            c[r].tu_store = store;                                                                   \
            c[r].tu_fn = fn;                                                                         \
            if (pthread_create(&th[r], NULL, name##_thread, &c[r]) != 0) abort();                    \
        }                                                                                            \
        for (int r = 0; r < world; r++) pthread_join(th[r], NULL);                                   \
        bool ok = true;                                                                              \
        for (int r = 0; r < world; r++) ok &= tu_rank_report(r, world, c[r].st, c[r].err);           \
        ts_store_release(store);                                                                     \
        return ok;                                                                                   \
    }

#endif
