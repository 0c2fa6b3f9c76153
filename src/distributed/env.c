/*
 * distributed/env.c — ts_dist_env_read: where this process sits, from the variables
 * its launcher set. The first launcher whose rank variable is set supplies
 * every field (a mix of launchers is never combined):
 *     torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
 *     mpirun     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *     srun       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
 *                SLURM_NTASKS_PER_NODE (else SLURM_TASKS_PER_NODE; "2(x3)" reads as 2)
 * MASTER_ADDR and MASTER_PORT are read for every launcher; MASTER_ADDR has no
 * default (mpirun and srun never set it), MASTER_PORT is 0 when unset. An
 * empty variable counts as unset; anything else that is not a decimal integer
 * in range is an error naming the variable and its value.
 */
#include "distributed/rendezvous.h"

#include <limits.h>
#include <stdio.h>

typedef struct launcher {
    const char *source;
    const char *rank, *world, *local_rank, *local_world, *local_world_alt;
} launcher;

static const launcher launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", NULL},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", NULL},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"},
};

static const char *env_get(const char *name) {
    const char *v = name ? getenv(name) : NULL;
    return v && v[0] ? v : NULL;
}

/* Parses name's value as an integer in [lo, hi]; *out = -1 when unset. With
 * leading_only, text after the leading digits is ignored ("2(x3)"). */
static ts_status env_int(const char *name, long lo, long hi, bool leading_only, int *out) {
    *out = -1;
    const char *v = env_get(name);
    if (!v) return TS_OK;
    const char *p = v;
    while (*p == ' ' || *p == '\t') p++;
    long x = 0;
    bool digits = false;
    while (*p >= '0' && *p <= '9') {
        digits = true;
        x = x * 10 + (*p - '0');
        if (x > hi) break;
        p++;
    }
    while (!leading_only && (*p == ' ' || *p == '\t' || *p == '\n')) p++;
    if (!digits || (!leading_only && *p))
        return ts_error(TS_ERR_INVALID_ARG, "environment variable %s='%.100s' is not a non-negative integer", name, v);
    if (x < lo || x > hi)
        return ts_error(TS_ERR_INVALID_ARG, "environment variable %s='%.100s' is out of range (%ld..%ld)", name, v, lo,
                        hi);
    *out = (int)x;
    return TS_OK;
}

ts_status ts__dist_env_read(ts_dist_env *out, unsigned flags) {
    TS_ARG(out, "ts_dist_env_read: NULL argument");
    ts_dist_env e;
    memset(&e, 0, sizeof e);
    e.rank = e.world_size = e.local_rank = e.local_world_size = -1;
    e.source = "none";
    const launcher *L = NULL;
    for (size_t i = 0; i < TS_ARRAY_LEN(launchers) && !L; i++)
        if (env_get(launchers[i].rank)) L = &launchers[i];
    if (!L && (flags & TS__ENV_NEED_RANK))
        return ts_error(TS_ERR_INVALID_ARG,
                        "no launch environment: RANK is not set (nor OMPI_COMM_WORLD_RANK or SLURM_PROCID); run "
                        "under torchrun, mpirun or srun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
    if (L) {
        e.source = L->source;
        TS_TRY(env_int(L->rank, 0, INT_MAX - 1, false, &e.rank));
        TS_TRY(env_int(L->world, 1, INT_MAX, false, &e.world_size));
        if (e.world_size < 0)
            return ts_error(TS_ERR_INVALID_ARG, "%s is set (%s) but %s is not", L->rank, getenv(L->rank), L->world);
        if (e.rank >= e.world_size)
            return ts_error(TS_ERR_INVALID_ARG, "%s=%d is not less than %s=%d", L->rank, e.rank, L->world,
                            e.world_size);
        TS_TRY(env_int(L->local_rank, 0, INT_MAX - 1, false, &e.local_rank));
        const char *lw = L->local_world;
        if (!env_get(lw) && L->local_world_alt) lw = L->local_world_alt;
        TS_TRY(env_int(lw, 1, INT_MAX, strcmp(L->source, "srun") == 0, &e.local_world_size));
        if (e.local_rank >= 0 && e.local_world_size >= 0 && e.local_rank >= e.local_world_size)
            return ts_error(TS_ERR_INVALID_ARG, "%s=%d is not less than %s=%d", L->local_rank, e.local_rank, lw,
                            e.local_world_size);
        if (e.local_world_size > e.world_size)
            return ts_error(TS_ERR_INVALID_ARG, "%s=%d is larger than %s=%d", lw, e.local_world_size, L->world,
                            e.world_size);
    }
    const char *addr = env_get("MASTER_ADDR");
    if (!addr && (flags & TS__ENV_NEED_MASTER))
        return ts_error(TS_ERR_INVALID_ARG,
                        "MASTER_ADDR is not set: export the address of rank 0's host (and MASTER_PORT)%s%s",
                        L ? " - launcher: " : "", L ? L->source : "");
    if (addr && strlen(addr) >= sizeof e.master_addr)
        return ts_error(TS_ERR_INVALID_ARG, "environment variable MASTER_ADDR='%.60s...' is longer than %zu characters",
                        addr, sizeof e.master_addr - 1);
    if (addr) snprintf(e.master_addr, sizeof e.master_addr, "%s", addr);
    int port;
    TS_TRY(env_int("MASTER_PORT", 1, 65535, false, &port));
    e.master_port = port < 0 ? 0 : port;
    *out = e;
    return TS_OK;
}

ts_status ts_dist_env_read(ts_dist_env *out) {
    return ts__dist_env_read(out, TS__ENV_NEED_RANK | TS__ENV_NEED_MASTER);
}
