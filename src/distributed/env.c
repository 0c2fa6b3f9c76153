/*
 * distributed/env.c — where this process sits, from the variables its launcher set
 * (ts_dist_env_read, ts_dist_env_detect), and Slurm's host-list syntax.
 *
 * ---- which launcher ------------------------------------------------------------------------------
 * Candidates, innermost launcher first (a launcher started under another one
 * inherits the outer one's variables, which then describe the launcher, not us):
 *     RANK family  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE. source "torchrun" when
 *                  TORCHELASTIC_RUN_ID is set, "tessera-run" when TS_LAUNCHED_BY is, else "env"
 *                  (set by hand, Kubernetes, a job script). TS_LAUNCHED_BY wins over
 *                  TORCHELASTIC_RUN_ID (`tessera train --nproc 2` relaunched under torchrun),
 *                  and a tessera run child never uses torchrun's agent store.
 *     mpirun       OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE            (Open MPI)
 *     hydra        PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS  (MPICH/Intel mpiexec, srun --mpi=pmi2)
 *     pmix         PMIX_RANK                     (a rank only: PMIx keeps the size out of the environment;
 *                  alone, PMIX_RANK=0 is an MPI singleton, world of one, and any other rank an error)
 *     srun         SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID, and this
 *                  node's count in SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE /
 *                  SLURM_NTASKS_PER_NODE ("2(x3),1") at index SLURM_NODEID.
 *                  Only a task of a job step counts (SLURM_STEP_ID or SLURM_STEPID set): an
 *                  sbatch script or salloc shell also has SLURM_PROCID=0 and SLURM_NTASKS=N, but
 *                  is one process, not rank 0 of N.
 * The first candidate with its rank or size variable set describes this process;
 * its rank and size must both be there (else an error naming what is set and
 * what is missing). Rank-only candidates (hydra without PMI_SIZE, pmix) defer to
 * the next complete one, whose rank they must equal (srun --mpi=pmix sets
 * PMIX_RANK = SLURM_PROCID). Contradictions are errors naming both variables
 * and their values:
 *   - rank >= size, local rank >= local size, local size > size;
 *   - a RANK family set by hand (not torchrun's, not tessera run's) and the next
 *     launcher present disagreeing on the rank or the size (RANK=1 under
 *     srun with SLURM_PROCID=0); nested launchers are never compared: under
 *     `srun torchrun ...` SLURM_PROCID is the agent's index, RANK ours.
 * An empty variable counts as unset; a value that is not a decimal integer in
 * range is an error naming the variable and its value.
 *
 * ---- rendezvous address ------------------------------------------------------------------------
 * MASTER_ADDR and MASTER_PORT win when set. Otherwise, per launcher:
 *     srun    address: the first host of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
 *             (SLURM_NODELIST), where rank 0 runs; else SLURM_LAUNCH_NODE_IPADDR (srun's
 *             own host, right when srun runs inside the allocation).
 *             port: 10000 + SLURM_JOB_ID % 20000.
 *     mpirun, hydra  address: 127.0.0.1 when every rank is on this host (local size ==
 *             size); port: 10000 + job id % 20000 (OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE,
 *             PMI_JOBID; hashed when not a number).
 * master_addr_from / master_port_from name the variable each came from.
 *
 * torchrun's agent serves a PyTorch TCPStore on MASTER_PORT and says so with
 * TORCHELASTIC_USE_AGENT_STORE=True (torch_agent_store); rendezvous.c then
 * connects every rank to it (store_torch.c) instead of serving one itself.
 */
#include "distributed/rendezvous.h"
#include "core/env.h"

#include <limits.h>
#include <stdio.h>

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

/* ---- Slurm host lists ----------------------------------------------------------------------------- */

#define NL_MAX_GROUPS 8
#define NL_MAX_HOSTS (1 << 24)

/* One bracket group "[01-03,07]": its ranges, as text. */
typedef struct nl_group {
    const char *p; /* after '[' */
    size_t len;    /* up to ']' */
    long count;
} nl_group;

/* Counts the numbers of a bracket group, checking its syntax. *why on error. */
static bool nl_group_count(nl_group *g, const char **why) {
    g->count = 0;
    const char *p = g->p, *end = g->p + g->len;
    if (p == end) {
        *why = "an empty []";
        return false;
    }
    while (p < end) {
        const char *q = p;
        long lo = 0, hi;
        while (q < end && *q >= '0' && *q <= '9' && q - p < 10) lo = lo * 10 + (*q++ - '0');
        if (q == p) {
            *why = "a range that is not a number";
            return false;
        }
        hi = lo;
        if (q < end && *q == '-') {
            const char *r = ++q;
            hi = 0;
            while (q < end && *q >= '0' && *q <= '9' && q - r < 10) hi = hi * 10 + (*q++ - '0');
            if (q == r) {
                *why = "a range without an upper bound";
                return false;
            }
        }
        if (q < end && *q >= '0' && *q <= '9') {
            *why = "a number of more than 10 digits";
            return false;
        }
        if (hi < lo) {
            *why = "a range whose upper bound is below its lower bound";
            return false;
        }
        if (q < end && *q != ',') {
            *why = "an unexpected character in []";
            return false;
        }
        g->count += hi - lo + 1;
        if (g->count > NL_MAX_HOSTS) {
            *why = "too many hosts";
            return false;
        }
        p = q < end ? q + 1 : q;
        if (q < end && p == end) {
            *why = "a trailing ',' in []";
            return false;
        }
    }
    return true;
}

/* Appends the k-th number of group g (zero-padded like its range's lower bound) to out. */
static void nl_group_put(const nl_group *g, long k, char *out, size_t cap, size_t *n) {
    const char *p = g->p, *end = g->p + g->len;
    while (p < end) {
        const char *q = p;
        long lo = 0, hi;
        while (q < end && *q >= '0' && *q <= '9') lo = lo * 10 + (*q++ - '0');
        int width = (int)(q - p);
        hi = lo;
        if (q < end && *q == '-') {
            q++;
            hi = 0;
            while (q < end && *q >= '0' && *q <= '9') hi = hi * 10 + (*q++ - '0');
        }
        if (k <= hi - lo) {
            if (*n < cap) *n += (size_t)snprintf(out + *n, cap - *n, "%0*ld", width, lo + k);
            return;
        }
        k -= hi - lo + 1;
        p = q + 1;
    }
}

ts_status ts__slurm_nodelist_host(const char *var, const char *list, int index, char *out, size_t cap, int *count) {
    const char *why = NULL, *s = list;
    long total = 0;
    bool found = false;
    if (out && cap) out[0] = 0;
    if (!list || !*list) {
        why = "it is empty";
        goto bad;
    }
    while (*s) {
        /* one item: up to a ',' outside brackets */
        const char *item = s;
        nl_group g[NL_MAX_GROUPS];
        int ng = 0;
        while (*s && *s != ',') {
            if (*s == ']') {
                why = "a ']' without '['";
                goto bad;
            }
            if (*s != '[') {
                s++;
                continue;
            }
            const char *close = strchr(s, ']');
            const char *open2 = strchr(s + 1, '[');
            if (!close || (open2 && open2 < close)) {
                why = "a '[' without ']'";
                goto bad;
            }
            if (ng == NL_MAX_GROUPS) {
                why = "too many [] groups in one name";
                goto bad;
            }
            g[ng].p = s + 1;
            g[ng].len = (size_t)(close - s - 1);
            if (!nl_group_count(&g[ng], &why)) goto bad;
            ng++;
            s = close + 1;
        }
        const char *item_end = s;
        if (item_end == item) {
            why = "an empty host name";
            goto bad;
        }
        long n = 1;
        for (int i = 0; i < ng; i++) {
            n *= g[i].count;
            if (n > NL_MAX_HOSTS) {
                why = "too many hosts";
                goto bad;
            }
        }
        if (!found && index >= total && index < total + n && out) {
            /* the (index - total)-th name of this item: the last group varies fastest */
            long k = index - total, idx[NL_MAX_GROUPS];
            for (int i = ng - 1; i >= 0; i--) {
                idx[i] = k % g[i].count;
                k /= g[i].count;
            }
            size_t w = 0;
            const char *p = item;
            for (int i = 0; i <= ng; i++) {
                const char *stop = i < ng ? g[i].p - 1 : item_end;
                size_t tl = (size_t)(stop - p);
                if (w < cap) w += (size_t)snprintf(out + w, cap - w, "%.*s", (int)tl, p);
                if (i < ng) {
                    nl_group_put(&g[i], idx[i], out, cap, &w);
                    p = g[i].p + g[i].len + 1;
                }
            }
            if (w >= cap) {
                why = "a host name that is too long";
                goto bad;
            }
            found = true;
        }
        total += n;
        if (total > NL_MAX_HOSTS) {
            why = "too many hosts";
            goto bad;
        }
        if (*s == ',') {
            s++;
            if (!*s) {
                why = "a trailing ','";
                goto bad;
            }
        }
    }
    if (count) *count = (int)total;
    if (out && !found)
        return ts_error(TS_ERR_INVALID_ARG, "%s='%.200s' has %ld hosts; there is no host %d", var, list, total, index);
    return TS_OK;
bad:
    return ts_error(TS_ERR_INVALID_ARG, "%s='%.200s' is not a Slurm host list (%s)", var, list ? list : "", why);
}

/* "2(x3),1" at index node: the count for that node; -1 with no node index and unequal counts. */
static ts_status tasks_per_node(const char *var, int node, int *out) {
    *out = -1;
    const char *v = env_get(var), *p = v;
    if (!v) return TS_OK;
    int seen = 0, first = -1;
    bool uniform = true;
    while (*p) {
        long c = 0, rep = 1;
        const char *d = p;
        while (*p >= '0' && *p <= '9' && c <= INT_MAX) c = c * 10 + (*p++ - '0');
        if (p == d || c < 1 || c > INT_MAX) goto bad;
        if (*p == '(') {
            if (p[1] != 'x') goto bad;
            p += 2;
            d = p;
            rep = 0;
            while (*p >= '0' && *p <= '9' && rep <= INT_MAX) rep = rep * 10 + (*p++ - '0');
            if (p == d || *p != ')' || rep < 1) goto bad;
            p++;
        }
        if (*p && *p != ',') goto bad;
        if (*p == ',') p++;
        if (first < 0) first = (int)c;
        if (c != first) uniform = false;
        if (node >= 0 && node >= seen && node < seen + rep) *out = (int)c;
        seen = (int)TS_MIN((long)seen + rep, (long)INT_MAX);
    }
    if (node < 0 && uniform) *out = first;
    if (node >= seen)
        return ts_error(TS_ERR_INVALID_ARG, "%s='%.100s' lists %d nodes but SLURM_NODEID is %d", var, v, seen, node);
    return TS_OK;
bad:
    return ts_error(TS_ERR_INVALID_ARG, "environment variable %s='%.100s' is not a Slurm task count list such as "
                    "'2(x3),1'", var, v);
}

/* ---- launchers -------------------------------------------------------------------------------------- */

typedef enum lk { L_RANKVARS, L_MPIRUN, L_HYDRA, L_PMIX, L_SRUN, L_COUNT } lk;

/* What one launcher's variables say (-1: not set). Names are the variables read. */
typedef struct lpos {
    const char *source;
    const char *rank_var, *world_var, *lrank_var, *lworld_var;
    int rank, world, lrank, lworld;
    bool present;
} lpos;

static ts_status read_rankvars(lpos *l) {
    *l = (lpos){"env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", -1, -1, -1, -1, false};
    if (ts_env_is_set(TS_ENV_LAUNCHED_BY)) l->source = "tessera-run"; /* tessera train --nproc under torchrun: innermost */
    else if (env_get("TORCHELASTIC_RUN_ID")) l->source = "torchrun";
    l->present = env_get("RANK") || env_get("WORLD_SIZE");
    if (!l->present) return TS_OK;
    TS_TRY(env_int("RANK", 0, INT_MAX - 1, false, &l->rank));
    TS_TRY(env_int("WORLD_SIZE", 1, INT_MAX, false, &l->world));
    TS_TRY(env_int("LOCAL_RANK", 0, INT_MAX - 1, false, &l->lrank));
    return env_int("LOCAL_WORLD_SIZE", 1, INT_MAX, false, &l->lworld);
}

static ts_status read_mpirun(lpos *l) {
    *l = (lpos){"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE", -1, -1, -1, -1, false};
    l->present = env_get(l->rank_var) || env_get(l->world_var);
    if (!l->present) return TS_OK;
    TS_TRY(env_int(l->rank_var, 0, INT_MAX - 1, false, &l->rank));
    TS_TRY(env_int(l->world_var, 1, INT_MAX, false, &l->world));
    TS_TRY(env_int(l->lrank_var, 0, INT_MAX - 1, false, &l->lrank));
    return env_int(l->lworld_var, 1, INT_MAX, false, &l->lworld);
}

static ts_status read_hydra(lpos *l) {
    *l = (lpos){"hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", -1, -1, -1, -1, false};
    l->present = env_get(l->rank_var) || env_get(l->world_var);
    if (!l->present) return TS_OK;
    TS_TRY(env_int(l->rank_var, 0, INT_MAX - 1, false, &l->rank));
    TS_TRY(env_int(l->world_var, 1, INT_MAX, false, &l->world));
    TS_TRY(env_int(l->lrank_var, 0, INT_MAX - 1, false, &l->lrank));
    return env_int(l->lworld_var, 1, INT_MAX, false, &l->lworld);
}

static ts_status read_pmix(lpos *l) {
    *l = (lpos){"pmix", "PMIX_RANK", NULL, NULL, NULL, -1, -1, -1, -1, false};
    l->present = env_get(l->rank_var) != NULL;
    return l->present ? env_int(l->rank_var, 0, INT_MAX - 1, false, &l->rank) : TS_OK;
}

static ts_status read_srun(lpos *l) {
    *l = (lpos){"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", NULL, -1, -1, -1, -1, false};
    l->present = env_get("SLURM_PROCID") && (env_get("SLURM_STEP_ID") || env_get("SLURM_STEPID"));
    if (!l->present) return TS_OK;
    if (!env_get(l->world_var)) l->world_var = "SLURM_NTASKS";
    if (!env_get(l->world_var) && env_get("SLURM_NPROCS")) l->world_var = "SLURM_NPROCS";
    TS_TRY(env_int(l->rank_var, 0, INT_MAX - 1, false, &l->rank));
    TS_TRY(env_int(l->world_var, 1, INT_MAX, false, &l->world));
    TS_TRY(env_int(l->lrank_var, 0, INT_MAX - 1, false, &l->lrank));
    int node = -1;
    TS_TRY(env_int("SLURM_NODEID", 0, INT_MAX - 1, false, &node));
    static const char *const lists[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < TS_ARRAY_LEN(lists); i++)
        if (env_get(lists[i])) {
            l->lworld_var = lists[i];
            return tasks_per_node(lists[i], node, &l->lworld);
        }
    return TS_OK;
}

static const char *val(const char *name) {
    const char *v = env_get(name);
    return v ? v : "(unset)";
}

/* A complete position: rank and size, in range. */
static ts_status check_complete(const lpos *l) {
    if (l->rank < 0 && l->world_var)
        return ts_error(TS_ERR_INVALID_ARG,
                        "incomplete launch environment: %s=%s is set but %s is not (launcher %s): set both, or "
                        "neither",
                        l->world_var, val(l->world_var), l->rank_var, l->source);
    if (l->world < 0 && !l->world_var)
        return ts_error(TS_ERR_INVALID_ARG,
                        "incomplete launch environment: %s=%s is set (launcher %s) but no world size: %s puts none in "
                        "the environment; set WORLD_SIZE and RANK (and MASTER_ADDR, MASTER_PORT), or launch with "
                        "mpirun, srun or torchrun",
                        l->rank_var, val(l->rank_var), l->source, l->source);
    if (l->world < 0)
        return ts_error(TS_ERR_INVALID_ARG,
                        "incomplete launch environment: %s=%s is set but %s is not (launcher %s): set both, or "
                        "neither",
                        l->rank_var, val(l->rank_var), l->world_var, l->source);
    if (l->rank >= l->world)
        return ts_error(TS_ERR_INVALID_ARG, "contradictory launch environment: %s=%d is not less than %s=%d", l->rank_var,
                        l->rank, l->world_var, l->world);
    if (l->lrank >= 0 && l->lworld >= 0 && l->lrank >= l->lworld)
        return ts_error(TS_ERR_INVALID_ARG, "contradictory launch environment: %s=%d is not less than %s=%d",
                        l->lrank_var, l->lrank, l->lworld_var, l->lworld);
    if (l->lworld > l->world)
        return ts_error(TS_ERR_INVALID_ARG, "contradictory launch environment: %s=%d is larger than %s=%d", l->lworld_var,
                        l->lworld, l->world_var, l->world);
    return TS_OK;
}

/* Two launchers' variables describing the same process must agree. */
static ts_status check_agree(const lpos *a, const lpos *b) {
    if (a->rank >= 0 && b->rank >= 0 && a->rank != b->rank)
        return ts_error(TS_ERR_INVALID_ARG,
                        "contradictory launch environment: %s=%d (%s) but %s=%d (%s); they describe the same "
                        "process: unset one, or make them agree",
                        a->rank_var, a->rank, a->source, b->rank_var, b->rank, b->source);
    if (a->world >= 0 && b->world >= 0 && a->world != b->world)
        return ts_error(TS_ERR_INVALID_ARG,
                        "contradictory launch environment: %s=%d (%s) but %s=%d (%s); they describe the same "
                        "job: unset one, or make them agree",
                        a->world_var, a->world, a->source, b->world_var, b->world, b->source);
    return TS_OK;
}

/* 10000 + id % 20000, id the decimal value of v or else a hash of it. */
static int port_from_id(const char *v) {
    uint64_t x = 0;
    bool num = *v != 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9') num = false;
        x = num ? x * 10 + (uint64_t)(*p - '0') : 0;
        if (!num) break;
    }
    if (!num) {
        x = 1469598103934665603ull; /* FNV-1a */
        for (const unsigned char *p = (const unsigned char *)v; *p; p++) x = (x ^ *p) * 1099511628211ull;
    }
    return 10000 + (int)(x % 20000);
}

/* MASTER_ADDR / MASTER_PORT, or the launcher's defaults (see the top). */
static ts_status read_master(ts_dist_env *e, lk which) {
    const char *addr = env_get("MASTER_ADDR");
    if (addr) {
        if (strlen(addr) >= sizeof e->master_addr)
            return ts_error(TS_ERR_INVALID_ARG,
                            "environment variable MASTER_ADDR='%.60s...' is longer than %zu characters", addr,
                            sizeof e->master_addr - 1);
        snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
        e->master_addr_from = "MASTER_ADDR";
    } else if (which == L_SRUN) {
        static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
        for (size_t i = 0; i < TS_ARRAY_LEN(lists) && !e->master_addr[0]; i++)
            if (env_get(lists[i])) {
                TS_TRY(ts__slurm_nodelist_host(lists[i], env_get(lists[i]), 0, e->master_addr, sizeof e->master_addr,
                                               NULL));
                e->master_addr_from = lists[i];
            }
        const char *ip = env_get("SLURM_LAUNCH_NODE_IPADDR");
        if (!e->master_addr[0] && ip && strlen(ip) < sizeof e->master_addr) {
            snprintf(e->master_addr, sizeof e->master_addr, "%s", ip);
            e->master_addr_from = "SLURM_LAUNCH_NODE_IPADDR";
        }
    } else if ((which == L_MPIRUN || which == L_HYDRA) && e->local_world_size == e->world_size) {
        snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
        e->master_addr_from = which == L_MPIRUN ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS";
    }
    int port;
    TS_TRY(env_int("MASTER_PORT", 1, 65535, false, &port));
    if (port > 0) {
        e->master_port = port;
        e->master_port_from = "MASTER_PORT";
        return TS_OK;
    }
    static const char *const srun_ids[] = {"SLURM_JOB_ID", "SLURM_JOBID"};
    static const char *const mpi_ids[] = {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID"};
    const char *const *ids = which == L_SRUN ? srun_ids : mpi_ids;
    size_t nids = which == L_SRUN ? TS_ARRAY_LEN(srun_ids) : which == L_MPIRUN || which == L_HYDRA ? TS_ARRAY_LEN(mpi_ids) : 0;
    for (size_t i = 0; i < nids; i++)
        if (env_get(ids[i])) {
            e->master_port = port_from_id(env_get(ids[i]));
            e->master_port_from = ids[i];
            break;
        }
    return TS_OK;
}

ts_status ts__dist_env_read(ts_dist_env *out, unsigned flags) {
    TS_ARG(out, "ts_dist_env_read: NULL argument");
    ts_dist_env e;
    memset(&e, 0, sizeof e);
    e.rank = e.world_size = e.local_rank = e.local_world_size = -1;
    e.source = "none";
    e.master_addr_from = e.master_port_from = "";
    lpos L[L_COUNT];
    ts_status (*const readers[L_COUNT])(lpos *) = {read_rankvars, read_mpirun, read_hydra, read_pmix, read_srun};
    int chosen = -1, rank_only = -1;
    for (int i = 0; i < L_COUNT && chosen < 0; i++) {
        TS_TRY(readers[i](&L[i]));
        if (!L[i].present) continue;
        if (L[i].world < 0 && (i == L_HYDRA || i == L_PMIX) && L[i].rank >= 0) { /* a rank only: see the top */
            if (rank_only < 0) rank_only = i;
            continue;
        }
        TS_TRY(check_complete(&L[i]));
        chosen = i;
    }
    /* A rank alone is an error naming what is missing, except PMIX_RANK=0: an MPI
     * singleton (Open MPI sets it in MPI_Init), or rank 0 of a size nobody told us. */
    if (chosen < 0 && rank_only >= 0 && !(rank_only == L_PMIX && L[rank_only].rank == 0))
        TS_TRY(check_complete(&L[rank_only]));
    if (chosen >= 0) {
        const lpos *c = &L[chosen];
        if (rank_only >= 0) TS_TRY(check_agree(&L[rank_only], c));
        if (chosen == L_RANKVARS && strcmp(c->source, "env") == 0) { /* set by hand: the launcher outside must agree */
            for (int i = chosen + 1; i < L_COUNT; i++) {
                TS_TRY(readers[i](&L[i]));
                if (!L[i].present) continue;
                TS_TRY(check_agree(c, &L[i]));
                break;
            }
        }
        e.source = c->source;
        e.rank = c->rank;
        e.world_size = c->world;
        e.local_rank = c->lrank;
        e.local_world_size = c->lworld;
    } else if (flags & TS__ENV_NEED_RANK) {
        return ts_error(TS_ERR_INVALID_ARG,
                        "no launch environment: RANK is not set (nor OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID "
                        "in an srun step); run under torchrun, tessera run, mpirun or srun, or set RANK, WORLD_SIZE, "
                        "MASTER_ADDR and MASTER_PORT");
    }
    const char *as = env_get("TORCHELASTIC_USE_AGENT_STORE");
    e.torch_agent_store = as && (strcmp(as, "True") == 0 || strcmp(as, "true") == 0 || strcmp(as, "1") == 0) &&
                          strcmp(e.source, "tessera-run") != 0; /* inherited from a torchrun around tessera run */
    int restarts;
    TS_TRY(env_int("TORCHELASTIC_RESTART_COUNT", 0, INT_MAX, false, &restarts));
    e.restart_count = restarts < 0 ? 0 : restarts;
    TS_TRY(read_master(&e, chosen < 0 ? L_COUNT : (lk)chosen));
    if (!e.master_addr[0] && (flags & TS__ENV_NEED_MASTER)) {
        if (chosen == L_MPIRUN || chosen == L_HYDRA)
            return ts_error(TS_ERR_INVALID_ARG,
                            "MASTER_ADDR is not set and the %d ranks of this %s job are not all on this host (%s=%d): "
                            "export the address of rank 0's host as MASTER_ADDR (mpirun -x MASTER_ADDR=...)",
                            e.world_size, L[chosen].source, L[chosen].lworld_var, e.local_world_size);
        return ts_error(TS_ERR_INVALID_ARG,
                        "MASTER_ADDR is not set: export the address of rank 0's host (and MASTER_PORT)%s%s",
                        chosen >= 0 ? " - launcher: " : "", chosen >= 0 ? e.source : "");
    }
    *out = e;
    return TS_OK;
}

ts_status ts_dist_env_read(ts_dist_env *out) {
    return ts__dist_env_read(out, TS__ENV_NEED_RANK | TS__ENV_NEED_MASTER);
}

ts_status ts_dist_env_detect(ts_dist_env *out, bool *in_job) {
    TS_ARG(out, "ts_dist_env_detect: NULL argument");
    if (in_job) *in_job = false;
    ts_dist_env e;
    TS_TRY(ts__dist_env_read(&e, 0));
    if (e.world_size < 0) { /* no launcher: the world of one */
        e.rank = e.local_rank = 0;
        e.world_size = e.local_world_size = 1;
    }
    if (in_job) *in_job = e.world_size > 1;
    *out = e;
    return TS_OK;
}
