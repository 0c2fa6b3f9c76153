/*
 * distributed/rendezvous.h — how a process group finds its peers: reading the launch
 * environment (env.c) and the store-based join (rendezvous.c).
 * Not installed; not part of the public API.
 *
 * Keys the join leaves in the returned store (already under "<group>/"):
 *     rank/<r>/host     rank r's host name (gethostname)
 *     rank/<r>/joined   "1" (a second join with the same rank is an error)
 *     rank/<r>/world    the world size rank r was given (each compares with the first arrival's)
 *     rank/<r>/beat     a counter rank r bumps every heartbeat interval while it waits
 *     joined            the number of ranks that arrived
 *     slot/<n>          the rank that arrived n-th (1-based): whom a waiting rank watches, and
 *                       how a timeout names the missing ranks in O(arrivals)
 *     world_size        rank 0's world size
 *     failed            why the rendezvous failed, set by the rank that found out first; every
 *                       waiting rank reads it within an interval and fails with it
 *     all_joined        set by the last rank to arrive
 */
#ifndef TS_DIST_RENDEZVOUS_H
#define TS_DIST_RENDEZVOUS_H

#include "distributed/store.h"

/* Flags for ts__dist_env_read. */
#define TS__ENV_NEED_RANK 1u   /* no rank variable at all is an error (else rank/world_size = -1) */
#define TS__ENV_NEED_MASTER 2u /* MASTER_ADDR unset is an error (else master_addr = "") */

/* ts_dist_env_read with a choice of what is required. Fields the environment does
 * not give are -1 (local_rank, local_world_size; rank/world_size without
 * TS__ENV_NEED_RANK), master_port 0, source "none". Malformed values are always errors. */
ts_status ts__dist_env_read(ts_dist_env *out, unsigned flags);

/* Slurm's host-list syntax ("node[01-03,07],gpu[1-2]-ib"): *count (NULL is fine)
 * gets the number of hosts and out (NULL is fine) the index-th, zero-padded like
 * its range ("node01"). TS_ERR_INVALID_ARG naming var and the list when it is
 * malformed or has no host index. Brackets may repeat in one name (the last
 * varies fastest); no nesting. */
ts_status ts__slurm_nodelist_host(const char *var, const char *list, int index, char *out, size_t cap, int *count);

/* Validates opts (NULL: TS_PG_OPTIONS_INIT), resolves the timeout (opts->timeout_s > 0,
 * else TS_DIST_TIMEOUT, else TS_DIST_DEFAULT_TIMEOUT_S), builds the store (opts->store
 * retained, else from init_method: "env://" (default; a client of torchrun's
 * agent store under TORCHELASTIC_USE_AGENT_STORE=True, its keys under
 * "tessera/attempt_<TORCHELASTIC_RESTART_COUNT>"), "tcp://host:port",
 * "torch-tcp://host:port", "file:///path"), wraps it in a prefix store "<group_name or default>" whose timeout
 * is the resolved one, and joins: blocks until all world_size ranks arrived
 * (TS_ERR_TIMEOUT saying how many of how many arrived and which ranks are missing, at a cost of
 * O(arrivals) store calls). World sizes over TS_DIST_MAX_WORLD_SIZE are refused. Ranks that
 * disagree on the world size, and a rank that joined and then stopped beating for the heartbeat
 * timeout (ts__heartbeat_resolve_timeout of opts->heartbeat_timeout_s; 0: not watched), fail every
 * waiting rank at once through the "failed" key; so does a store that stops answering for that
 * long.
 * local_rank/local_world_size come from opts, else the environment, else the ranks'
 * host names. On success *store is a new reference (the caller releases it); on
 * failure nothing is left allocated. Rank 0 of a TCP rendezvous hosts the server:
 * its store must outlive the other ranks' use of theirs. */
ts_status ts__rendezvous(const ts_pg_options *opts, ts_store **store, int *rank, int *world_size, int *local_rank,
                         int *local_world_size, double *timeout_s);

/* A rank of a launched job (launcher variables present) takes its share of the CPUs and a
 * line-buffered stdout when that is a pipe (launched.c). group_local_world: the ranks on this host
 * as the group's join found them, for launchers that do not say. Once per process. */
void ts__launched_setup(int group_local_world);

#endif /* TS_DIST_RENDEZVOUS_H */
