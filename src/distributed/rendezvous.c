/*
 * distributed/rendezvous.c — ts__rendezvous: options check, timeout, store creation
 * from an init method (env:// serves or joins a tessera TCP store at
 * MASTER_ADDR:MASTER_PORT, or under torchrun's TORCHELASTIC_USE_AGENT_STORE=True
 * joins the agent's PyTorch TCPStore), and the join every rank performs (see
 * rendezvous.h for the keys it leaves behind).
 *
 * Join, for rank r of world_size W, in the group's prefix store:
 *   1. add("rank/r/joined", 1) must return 1 (else: rank r joined twice);
 *   2. set("rank/r/host", hostname); rank 0 also sets "world_size" = W;
 *   3. n = add("joined", 1); n > W is an error; the rank that makes n == W
 *      sets "all_joined";
 *   4. wait("all_joined") within the timeout; on timeout the error counts the
 *      arrivals and lists the ranks whose "rank/i/joined" is missing;
 *   5. ranks other than 0 compare their W with rank 0's "world_size";
 *   6. if local_rank or local_world_size is still unknown, read every rank's
 *      host: local_world_size = ranks on my host, local_rank = those below me.
 */
#include "distributed/rendezvous.h"
#include "core/env.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <unistd.h>

static ts_status check_options(const ts_pg_options *o) {
    if (o->size != sizeof(ts_pg_options))
        return ts_error(TS_ERR_INVALID_ARG,
                        "ts_pg_options.size is %zu, expected %zu (initialise options with TS_PG_OPTIONS_INIT)",
                        o->size, sizeof(ts_pg_options));
    if (o->magic != TS_PG_OPTIONS_MAGIC)
        return ts_error(TS_ERR_INVALID_ARG,
                        "ts_pg_options.magic is 0x%08x, expected 0x%08x (initialise options with TS_PG_OPTIONS_INIT)",
                        o->magic, TS_PG_OPTIONS_MAGIC);
    if (o->version != TS_PG_OPTIONS_VERSION)
        return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.version is %u; this library supports version %u",
                        o->version, TS_PG_OPTIONS_VERSION);
    if (o->world_size != -1 && o->world_size < 1)
        return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.world_size is %d (expected -1 or >= 1)", o->world_size);
    if (o->rank < -1 || (o->rank >= 0 && o->world_size >= 1 && o->rank >= o->world_size))
        return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.rank is %d (expected -1 or 0..world_size-1 = %d)",
                        o->rank, o->world_size - 1);
    if (o->local_world_size != -1 && o->local_world_size < 1)
        return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.local_world_size is %d (expected -1 or >= 1)",
                        o->local_world_size);
    if (o->local_rank < -1 || (o->local_rank >= 0 && o->local_world_size >= 1 && o->local_rank >= o->local_world_size))
        return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.local_rank is %d (expected -1 or 0..local_world_size-1)",
                        o->local_rank);
    if (o->group_name && !o->group_name[0])
        return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.group_name is empty (NULL means \"default\")");
    if (isnan(o->timeout_s))
        return ts_error(TS_ERR_INVALID_ARG, "ts_pg_options.timeout_s is NaN");
    return TS_OK;
}

static ts_status resolve_timeout(double opt, double *out) {
    if (opt > 0) {
        *out = opt;
        return TS_OK;
    }
    TS_TRY(ts_env_check(TS_ENV_DIST_TIMEOUT)); /* seconds in [0.1, 1e7]; unset: TS_DIST_DEFAULT_TIMEOUT_S */
    *out = ts_env_double(TS_ENV_DIST_TIMEOUT);
    return TS_OK;
}

/* "host:port" or "[v6addr]:port" after the scheme ("tcp://", "torch-tcp://"). */
static ts_status parse_tcp(const char *im, char *host, size_t hostcap, int *port) {
    const char *p = strstr(im, "://") + 3, *colon;
    size_t hl;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close || close[1] != ':') goto bad;
        p++;
        hl = (size_t)(close - p);
        colon = close + 1;
    } else {
        colon = strrchr(p, ':');
        if (!colon) goto bad;
        hl = (size_t)(colon - p);
    }
    if (hl == 0 || hl >= hostcap) goto bad;
    memcpy(host, p, hl);
    host[hl] = 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || (*end && *end != '/') || v < 1 || v > 65535) goto bad;
    *port = (int)v;
    return TS_OK;
bad:
    return ts_error(TS_ERR_INVALID_ARG, "init_method '%.200s' is not of the form %.*shost:port (port 1..65535)", im,
                    (int)(strstr(im, "://") + 3 - im), im);
}

/* torchrun's agent already serves a TCPStore on MASTER_PORT: every rank, rank 0
 * too, is a client of it (serving one ourselves fails: the port is taken). Our
 * keys go under "tessera/attempt_<restart>", as torch's workers put theirs under
 * "/worker/attempt_<restart>": a restarted attempt never meets the last one's. */
static ts_status agent_store(const ts_dist_env *env, double timeout, ts_store **base) {
    ts_store *t = NULL;
    ts_status st = ts_store_torch_new(env->master_addr, env->master_port, timeout, &t);
    if (st != TS_OK)
        return ts__error_prefix(st, "torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR=%s, "
                                    "MASTER_PORT=%d)", env->master_addr, env->master_port);
    char prefix[48];
    snprintf(prefix, sizeof prefix, "tessera/attempt_%d", env->restart_count);
    st = ts_store_prefix_new(t, prefix, base);
    ts_store_release(t);
    return st;
}

/* Builds the base store from the options (and environment); fills in what the environment knows. */
static ts_status make_store(const ts_pg_options *o, double timeout, ts_store **base, int *r, int *w, int *lr,
                            int *lw) {
    *r = o->rank;
    *w = o->world_size;
    *lr = o->local_rank;
    *lw = o->local_world_size;
    if (o->store) {
        /* Ranks as threads share one environment: never take positions from it. */
        if (*r < 0 || *w < 0)
            return ts_error(TS_ERR_INVALID_ARG,
                            "ts_pg_options.rank and ts_pg_options.world_size must be given with ts_pg_options.store");
        *base = ts_store_retain(o->store);
        return TS_OK;
    }
    const char *im = o->init_method ? o->init_method : "env://";
    bool need_rank = *r < 0 || *w < 0;
    ts_dist_env env;
    if (strncmp(im, "env://", 6) == 0) {
        TS_TRY(ts__dist_env_read(&env, TS__ENV_NEED_MASTER | (need_rank ? TS__ENV_NEED_RANK : 0)));
        if (env.master_port == 0)
            return ts_error(TS_ERR_INVALID_ARG, "MASTER_PORT is not set (env:// needs MASTER_ADDR and MASTER_PORT)");
    } else if (strncmp(im, "tcp://", 6) == 0 || strncmp(im, "torch-tcp://", 12) == 0 ||
               strncmp(im, "file://", 7) == 0) {
        TS_TRY(ts__dist_env_read(&env, 0));
    } else {
        const char *sep = strstr(im, "://");
        return ts_error(TS_ERR_INVALID_ARG,
                        "unknown init_method scheme '%.*s' in '%.200s' (expected env://, tcp://host:port, "
                        "torch-tcp://host:port or file:///path)",
                        sep ? (int)TS_MIN(sep - im + 3, 64) : (int)TS_MIN(strlen(im), 64u), im, im);
    }
    if (*r < 0) *r = env.rank;
    if (*w < 0) *w = env.world_size;
    if (*lr < 0) *lr = env.local_rank;
    if (*lw < 0) *lw = env.local_world_size;
    if (*r < 0 || *w < 0)
        return ts_error(TS_ERR_INVALID_ARG,
                        "%s rendezvous needs the rank and world size: set ts_pg_options.rank/world_size or RANK and "
                        "WORLD_SIZE",
                        im);
    if (*r >= *w) return ts_error(TS_ERR_INVALID_ARG, "rank %d is not less than world size %d", *r, *w);
    if (strncmp(im, "env://", 6) == 0 && env.torch_agent_store) {
        TS_TRY(agent_store(&env, timeout, base));
    } else if (strncmp(im, "env://", 6) == 0) {
        ts_log(TS_LOG_INFO, "rendezvous: rank %d of %d, store at %s:%d (address from %s)%s", *r, *w,
               env.master_addr, env.master_port, env.master_addr_from && *env.master_addr_from ? env.master_addr_from : "options",
               *r == 0 ? ", served by this rank" : "");
        TS_TRY(ts_store_tcp_new(env.master_addr, env.master_port, *r == 0, timeout, base));
    } else if (strncmp(im, "torch-tcp://", 12) == 0) {
        char host[256];
        int port = 0;
        TS_TRY(parse_tcp(im, host, sizeof host, &port));
        TS_TRY(ts_store_torch_new(host, port, timeout, base));
    } else if (im[0] == 't') {
        char host[256];
        int port = 0;
        TS_TRY(parse_tcp(im, host, sizeof host, &port));
        TS_TRY(ts_store_tcp_new(host, port, *r == 0, timeout, base));
    } else {
        const char *path = im + 7;
        if (!path[0]) return ts_error(TS_ERR_INVALID_ARG, "init_method '%s' names no file (use file:///path)", im);
        TS_TRY(ts_store_file_new(path, timeout, base));
    }
    return TS_OK;
}

/* The rendezvous timed out: count arrivals and name the missing ranks. */
static ts_status join_timeout(ts_store *s, const char *group, int w, double timeout) {
    int64_t arrived = -1;
    double probe = TS_MIN(1.0, timeout);
    if (s->vt->add(s, "joined", 0, probe, &arrived) != TS_OK) arrived = -1;
    char list[256] = "";
    size_t len = 0;
    int nmissing = 0;
    for (int i = 0; i < w; i++) {
        char key[48];
        bool ex = true;
        snprintf(key, sizeof key, "rank/%d/joined", i);
        if (s->vt->check(s, key, probe, &ex) != TS_OK) break;
        if (ex) continue;
        if (nmissing < 16 && len < sizeof list - 16)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", nmissing ? ", " : "", i);
        else if (nmissing == 16)
            len += (size_t)snprintf(list + len, sizeof list - len, ", ...");
        nmissing++;
    }
    if (arrived < 0)
        return ts_error(TS_ERR_TIMEOUT, "rendezvous of group '%s' timed out after %.3g s waiting for %d ranks", group,
                        timeout, w);
    return ts_error(TS_ERR_TIMEOUT,
                    "rendezvous of group '%s' timed out after %.3g s: %" PRId64 " of %d ranks arrived (missing "
                    "ranks: %s)",
                    group, timeout, arrived, w, nmissing ? list : "unknown");
}

static ts_status join(ts_store *s, const char *group, int r, int w, double timeout, int *lr, int *lw) {
    char key[64], host[256];
    int64_t n = 0;
    snprintf(key, sizeof key, "rank/%d/joined", r);
    TS_TRY(ts_store_add(s, key, 1, &n));
    if (n > 1)
        return ts_error(TS_ERR_STATE,
                        "rendezvous of group '%s': rank %d joined twice (two processes with the same rank, a reused "
                        "group name, or a store left over from an earlier run)",
                        group, r);
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = 0;
    snprintf(key, sizeof key, "rank/%d/host", r);
    TS_TRY(ts_store_set(s, key, host, strlen(host)));
    char ws[16];
    snprintf(ws, sizeof ws, "%d", w);
    if (r == 0) TS_TRY(ts_store_set(s, "world_size", ws, strlen(ws)));
    TS_TRY(ts_store_add(s, "joined", 1, &n));
    if (n > w)
        return ts_error(TS_ERR_STATE,
                        "rendezvous of group '%s': %" PRId64 " ranks joined but world_size is %d (ranks disagree on "
                        "the world size, or a store left over from an earlier run)",
                        group, n, w);
    if (n == w) TS_TRY(ts_store_set(s, "all_joined", "1", 1));
    ts_log(TS_LOG_INFO, "rendezvous of group '%s': rank %d of %d on host %s joined (%" PRId64 " of %d arrived)", group,
           r, w, host, n, w);
    double t0 = ts_time_now();
    const char *all = "all_joined";
    ts_status st = ts_store_wait(s, &all, 1, timeout);
    if (st == TS_ERR_TIMEOUT) return join_timeout(s, group, w, timeout);
    if (st != TS_OK) return ts__error_prefix(st, "rendezvous of group '%s'", group);
    ts_log(TS_LOG_INFO, "rendezvous of group '%s': all %d ranks joined (rank %d waited %.3f s)", group, w, r,
           ts_time_now() - t0);
    if (r != 0) {
        void *v = NULL;
        size_t vl = 0;
        TS_TRY(ts_store_get(s, "world_size", &v, &vl));
        bool same = strcmp(v, ws) == 0;
        if (!same)
            st = ts_error(TS_ERR_STATE, "rendezvous of group '%s': rank %d has world_size %d but rank 0 has %s", group,
                          r, w, (const char *)v);
        free(v);
        TS_TRY(st);
    }
    if (*lr >= 0 && *lw >= 0) return TS_OK;
    int same = 0, below = 0;
    for (int i = 0; i < w; i++) {
        void *v = NULL;
        size_t vl = 0;
        snprintf(key, sizeof key, "rank/%d/host", i);
        TS_TRY(ts_store_get(s, key, &v, &vl));
        if (strcmp(v, host) == 0) {
            same++;
            below += i < r;
        }
        free(v);
    }
    if (*lr < 0) *lr = below;
    if (*lw < 0) *lw = same;
    if (*lr >= *lw)
        return ts_error(TS_ERR_INVALID_ARG, "local rank %d is not less than local world size %d", *lr, *lw);
    return TS_OK;
}

ts_status ts__rendezvous(const ts_pg_options *opts, ts_store **store, int *rank, int *world_size, int *local_rank,
                         int *local_world_size, double *timeout_s) {
    TS_ARG(store && rank && world_size && local_rank && local_world_size && timeout_s,
           "ts__rendezvous: NULL output argument");
    *store = NULL;
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    if (opts) {
        if (opts->size != sizeof o) TS_TRY(check_options(opts)); /* reads only the leading size field */
        o = *opts;
    }
    TS_TRY(check_options(&o));
    double timeout = TS_DIST_DEFAULT_TIMEOUT_S;
    TS_TRY(resolve_timeout(o.timeout_s, &timeout));
    const char *group = o.group_name ? o.group_name : "default";
    ts_store *base = NULL, *s = NULL;
    int r = -1, w = -1, lr = -1, lw = -1;
    TS_TRY(make_store(&o, timeout, &base, &r, &w, &lr, &lw));
    ts_status st = ts_store_prefix_new(base, group, &s);
    ts_store_release(base);
    TS_TRY(st);
    ts_store_set_timeout(s, timeout);
    st = join(s, group, r, w, timeout, &lr, &lw);
    if (st != TS_OK) {
        ts_store_release(s);
        return st;
    }
    *store = s;
    *rank = r;
    *world_size = w;
    *local_rank = lr;
    *local_world_size = lw;
    *timeout_s = timeout;
    return TS_OK;
}
