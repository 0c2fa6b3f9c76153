/*
 * distributed/rendezvous.c — ts__rendezvous: options check, timeout, store creation
 * from an init method (env:// serves or joins a tessera TCP store at
 * MASTER_ADDR:MASTER_PORT, or under torchrun's TORCHELASTIC_USE_AGENT_STORE=True
 * joins the agent's PyTorch TCPStore), and the join every rank performs (see
 * rendezvous.h for the keys it leaves behind).
 *
 * Join, for rank r of world_size W, in the group's prefix store:
 *   1. add("rank/r/joined", 1) must return 1 (else: rank r joined twice);
 *   2. set("rank/r/host", hostname), set("rank/r/world", W); rank 0 also sets "world_size";
 *   3. n = add("joined", 1); set("slot/n", r);
 *   4. n > 1: compare W with the world of slot 1's rank; a difference fails everyone
 *      ("failed" key, naming both values and ranks); n > W is an error too; the rank that
 *      makes n == W sets "all_joined";
 *   5. wait for "all_joined" one heartbeat interval at a time (1 s with heartbeats off), until
 *      the timeout. Between two waits: read "failed" (another rank's verdict: fail with it);
 *      with heartbeats on, bump "rank/r/beat" and watch the rank in the next arrival slot
 *      (slot n % arrived + 1: every arrival is watched by one other, O(1) calls each): if its
 *      beat has not moved for the heartbeat timeout it joined and then stopped or died, so set
 *      "failed" naming it. A store that does not answer for the heartbeat timeout (rank 0
 *      stopped) fails the wait too. A loop that itself did not run for a while (this process
 *      was stopped) restarts the clocks, as heartbeat.c does. On timeout the error counts the
 *      arrivals and names the first missing ranks from the slots (O(arrivals), bounded);
 *   6. if local_rank or local_world_size is still unknown, read every rank's
 *      host: local_world_size = ranks on my host, local_rank = those below me.
 */
#include "distributed/rendezvous.h"
#include "core/env.h"

#include "distributed/heartbeat.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#define TS__RDZV_LIST_PROBES 4096 /* store calls a timeout report may make to name missing ranks */
#define TS__RDZV_LIST_NAMED 16    /* missing ranks it names */
#define TS__RDZV_VOID_WAIT_S 30.0 /* a restarted rank waits at most this long for a void round's store to go */

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

static ts_status check_world_cap(int w) {
    if (w <= TS_DIST_MAX_WORLD_SIZE) return TS_OK;
    return ts_error(TS_ERR_INVALID_ARG, "world size %d (WORLD_SIZE or ts_pg_options.world_size) is over the limit of %d ranks",
                    w, TS_DIST_MAX_WORLD_SIZE);
}

/* Rank r's TCP store (rank 0 serves it): the server sizes its limits for w ranks and keeps slots
 * for them; every connection identifies as rank r. */
static ts_status tcp_store_as_rank(const char *host, int port, int r, int w, double timeout, ts_store **out) {
    ts_store_tcp_options so = TS_STORE_TCP_OPTIONS_INIT;
    so.world_size = w;
    so.rank = r;
    return ts_store_tcp_new_ex(host, port, r == 0, timeout, &so, out);
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
        TS_TRY(check_world_cap(*w));
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
    TS_TRY(check_world_cap(*w));
    if (strncmp(im, "env://", 6) == 0 && env.torch_agent_store) {
        TS_TRY(agent_store(&env, timeout, base));
    } else if (strncmp(im, "env://", 6) == 0) {
        ts_log(TS_LOG_INFO, "rendezvous: rank %d of %d, store at %s:%d (address from %s)%s", *r, *w,
               env.master_addr, env.master_port, env.master_addr_from && *env.master_addr_from ? env.master_addr_from : "options",
               *r == 0 ? ", served by this rank" : "");
        TS_TRY(tcp_store_as_rank(env.master_addr, env.master_port, *r, *w, timeout, base));
    } else if (strncmp(im, "torch-tcp://", 12) == 0) {
        char host[256];
        int port = 0;
        TS_TRY(parse_tcp(im, host, sizeof host, &port));
        TS_TRY(ts_store_torch_new(host, port, timeout, base));
    } else if (im[0] == 't') {
        char host[256];
        int port = 0;
        TS_TRY(parse_tcp(im, host, sizeof host, &port));
        TS_TRY(tcp_store_as_rank(host, port, *r, *w, timeout, base));
    } else {
        const char *path = im + 7;
        if (!path[0]) return ts_error(TS_ERR_INVALID_ARG, "init_method '%s' names no file (use file:///path)", im);
        TS_TRY(ts_store_file_new(path, timeout, base));
    }
    return TS_OK;
}

/* ---- the join ------------------------------------------------------------------------------------ */

/* n with thousands separated by commas ("999,997"). */
static const char *commas(int64_t n, char *buf, size_t cap) {
    char d[32];
    int len = snprintf(d, sizeof d, "%" PRId64, n < 0 ? -n : n), k = 0;
    size_t o = 0;
    if (n < 0 && o + 1 < cap) buf[o++] = '-';
    for (int i = 0; i < len && o + 2 < cap; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = d[i];
        k++;
    }
    buf[o] = 0;
    return buf;
}

/* Marks in seen[] (w bits) the ranks that took arrival slots 1..arrived; false when a slot
 * could not be read within `probe` (a rank that died between its two calls, a store gone). */
static bool read_slots(ts_store *s, int64_t arrived, int w, double probe, uint8_t *seen) {
    for (int64_t n = 1; n <= arrived; n++) {
        char key[48];
        void *v = NULL;
        size_t vl = 0;
        snprintf(key, sizeof key, "slot/%" PRId64, n);
        if (ts__store_get_timeout(s, key, probe, &v, &vl) != TS_OK) return false;
        long r = strtol(v, NULL, 10);
        free(v);
        if (r >= 0 && r < w) seen[r / 8] |= (uint8_t)(1u << (r % 8));
    }
    return true;
}

/* "0, 3, 5, ... and 999,997 more" into list: the first missing ranks and how many more there are.
 * Costs O(arrived) store calls up to TS__RDZV_LIST_PROBES, never O(world): past that many arrivals
 * the first TS__RDZV_LIST_PROBES ranks are checked one by one instead. false: nothing could be read. */
static bool missing_list(ts_store *s, int w, int64_t arrived, double probe, char *list, size_t cap) {
    int64_t missing = w - arrived;
    int named = 0;
    size_t len = 0;
    list[0] = 0;
    uint8_t *seen = arrived <= TS__RDZV_LIST_PROBES ? calloc((size_t)w / 8 + 1, 1) : NULL;
    bool ok = seen && read_slots(s, arrived, w, probe, seen);
    int limit = ok ? w : (int)TS_MIN(w, TS__RDZV_LIST_PROBES);
    for (int i = 0; i < limit && named < TS__RDZV_LIST_NAMED && named < missing; i++) {
        bool ex = true;
        if (ok) {
            ex = seen[i / 8] & (1u << (i % 8));
        } else {
            char key[48];
            snprintf(key, sizeof key, "rank/%d/joined", i);
            if (s->vt->check(s, key, probe, &ex) != TS_OK) break;
        }
        if (ex) continue;
        len += (size_t)snprintf(list + len, cap - len, "%s%d", named ? ", " : "", i);
        named++;
    }
    free(seen);
    if (!named) return false;
    if (missing > named) {
        char b[32];
        snprintf(list + len, cap - len, ", ... and %s more", commas(missing - named, b, sizeof b));
    }
    return true;
}

/* The rendezvous timed out: how many arrived and which ranks never did (O(arrived), see missing_list). */
static ts_status join_timeout(ts_store *s, const char *group, int w, double timeout) {
    int64_t arrived = -1;
    double probe = TS_MIN(1.0, timeout);
    if (s->vt->add(s, "joined", 0, probe, &arrived) != TS_OK || arrived < 0 || arrived > w)
        return ts_error(TS_ERR_TIMEOUT, "rendezvous of group '%s' timed out after %.3g s waiting for %d ranks", group,
                        timeout, w);
    char list[512], a[32], b[32];
    if (!missing_list(s, w, arrived, probe, list, sizeof list)) snprintf(list, sizeof list, "unknown");
    return ts_error(TS_ERR_TIMEOUT,
                    "rendezvous of group '%s' timed out after %.3g s: %s of %s ranks arrived (missing ranks: %s)",
                    group, timeout, commas(arrived, a, sizeof a), commas(w, b, sizeof b), list);
}

/* Ends the rendezvous for every rank: the reason goes to the "failed" key that the others poll
 * while they wait (best effort: a store that is gone is the others' news already), and is this
 * rank's error. */
static ts_status fail_all(ts_store *s, const char *group, ts_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ts_status fail_all(ts_store *s, const char *group, ts_status code, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    (void)s->vt->set(s, "failed", why, strlen(why), TS_MIN(2.0, ts__store_timeout(s)));
    return ts_error(code, "rendezvous of group '%s': %s", group, why);
}

/* Every rank compares its world size with the first arrival's, before it can count towards
 * all_joined: the first disagreement fails every rank. */
static ts_status check_world(ts_store *s, const char *group, int r, int w, int64_t n) {
    if (n == 1) return TS_OK;
    void *v = NULL;
    size_t vl = 0;
    TS_TRY(ts_store_get(s, "slot/1", &v, &vl));
    long r1 = strtol(v, NULL, 10);
    free(v);
    char key[48];
    snprintf(key, sizeof key, "rank/%ld/world", r1);
    TS_TRY(ts_store_get(s, key, &v, &vl));
    long w1 = strtol(v, NULL, 10);
    free(v);
    if (w1 == w) return TS_OK;
    return fail_all(s, group, TS_ERR_INVALID_ARG,
                    "ranks disagree on the world size: rank %ld has WORLD_SIZE=%ld but rank %d has WORLD_SIZE=%d "
                    "(give every rank the same world size)",
                    r1, w1, r, w);
}

/* What a waiting rank watches: the rank of the next arrival slot (the last watches the first),
 * so every rank that joined is watched by one other, at O(1) store calls per interval each. */
typedef struct watch {
    int64_t slot;      /* watched slot (0: none yet) */
    int rank;          /* its rank */
    int64_t beat;      /* its beat counter when last read (-1: not yet) */
    double changed_at; /* when that changed */
} watch;

/* One look at the watched rank. TS_OK, TS_ERR_TIMEOUT (the store did not answer within probe:
 * the caller counts that), or the error that ended the rendezvous for everyone. */
static ts_status watch_round(ts_store *s, const char *group, int r, int64_t my_slot, double hb, double probe,
                             double now, watch *wt) {
    char key[48];
    int64_t n = 0, v = 0;
    snprintf(key, sizeof key, "rank/%d/beat", r);
    TS_TRY(s->vt->add(s, key, 1, probe, &v));
    TS_TRY(s->vt->add(s, "joined", 0, probe, &n));
    if (n < 2) return TS_OK;
    int64_t slot = my_slot % n + 1;
    if (slot == my_slot) return TS_OK;
    if (slot != wt->slot) {
        void *val = NULL;
        size_t vl = 0;
        snprintf(key, sizeof key, "slot/%" PRId64, slot);
        TS_TRY(ts__store_get_timeout(s, key, probe, &val, &vl));
        *wt = (watch){slot, (int)strtol(val, NULL, 10), -1, now};
        free(val);
    }
    snprintf(key, sizeof key, "rank/%d/beat", wt->rank);
    TS_TRY(s->vt->add(s, key, 0, probe, &v));
    if (v != wt->beat) {
        wt->beat = v;
        wt->changed_at = now;
        return TS_OK;
    }
    if (now - wt->changed_at <= hb) return TS_OK;
    char host[256] = "?";
    void *val = NULL;
    size_t vl = 0;
    snprintf(key, sizeof key, "rank/%d/host", wt->rank);
    if (ts__store_get_timeout(s, key, probe, &val, &vl) == TS_OK) snprintf(host, sizeof host, "%s", (char *)val);
    free(val);
    return fail_all(s, group, TS_ERR_TIMEOUT,
                    "rank %d (host %s) joined and then went silent for %.1f s while waiting for the other ranks "
                    "(stopped, hung or dead?; noticed by rank %d, heartbeat timeout %g s)",
                    wt->rank, host, now - wt->changed_at, r, hb);
}

/* Waits for all_joined until the timeout, one heartbeat interval at a time: in between, the
 * "failed" key (another rank's verdict) and, with heartbeats on (hb > 0), one peer's beats. */
static ts_status wait_all(ts_store *s, const char *group, int r, int w, int64_t my_slot, double timeout, double hb) {
    double iv = 1.0, t0 = ts_time_now(), deadline = t0 + timeout, last_ok = t0, last_round = t0;
    if (hb > 0) TS_TRY(ts__heartbeat_interval(hb, &iv));
    double stall = hb > 0 ? fmax(3 * iv, hb / 2) : INFINITY;
    watch wt = {0, -1, -1, t0};
    const char *all = "all_joined";
    for (;;) {
        double now = ts_time_now();
        if (now >= deadline) return join_timeout(s, group, w, timeout);
        ts_status st = ts_store_wait(s, &all, 1, TS_MIN(iv, deadline - now));
        if (st == TS_OK) return TS_OK;
        if (st != TS_ERR_TIMEOUT) return ts__error_prefix(st, "rendezvous of group '%s'", group);
        now = ts_time_now();
        if (now - last_round > stall) wt.changed_at = last_ok = now; /* this process was stopped: not theirs */
        last_round = now;
        bool failed = false;
        st = s->vt->check(s, "failed", iv, &failed);
        if (st == TS_OK && failed) {
            void *why = NULL;
            size_t wl = 0;
            st = ts__store_get_timeout(s, "failed", iv, &why, &wl);
            if (st == TS_OK) {
                st = ts_error(TS_ERR_REMOTE, "rendezvous of group '%s' failed (rank %d of %d): %s", group, r, w,
                              (const char *)why);
                free(why);
                return st;
            }
        }
        if (st == TS_OK && hb > 0) st = watch_round(s, group, r, my_slot, hb, iv, now, &wt);
        if (st == TS_OK) last_ok = now;
        else if (st != TS_ERR_TIMEOUT) return st;
        else if (hb > 0 && now - last_ok > hb)
            return ts_error(TS_ERR_TIMEOUT,
                            "rendezvous of group '%s': the store has not answered for %.1f s (the rank serving it, "
                            "rank 0 for a TCP store, stopped or hung?; heartbeat timeout %g s)",
                            group, now - last_ok, hb);
    }
}

/* A restarted rank that finds its earlier self in the round: that round is void (fail_all told its
 * members); its store goes when they do. Waiting here until it has gone (at most limit_s) lets the
 * launcher's next attempt meet a new store instead of failing against the old one again at once,
 * restart after restart. The error stays fail_all's. */
static ts_status wait_round_gone(ts_store *s, ts_status code, double limit_s) {
    char why[TS_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", ts_last_error());
    double t0 = ts_time_now();
    while (ts_time_now() - t0 < limit_s) {
        bool ex = false;
        ts_status st = s->vt->check(s, "failed", 1.0, &ex);
        if (st != TS_OK && st != TS_ERR_TIMEOUT) break; /* the server is gone */
        nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
    }
    return ts_error(code, "%s", why);
}

static ts_status join(ts_store *s, const char *group, int r, int w, double timeout, double hb, int *lr, int *lw) {
    char key[64], host[256];
    int64_t n = 0;
    snprintf(key, sizeof key, "rank/%d/joined", r);
    TS_TRY(ts_store_add(s, key, 1, &n));
    if (n > 1) {
        ts_dist_env env;
        bool restarted = ts_dist_env_detect(&env, NULL) == TS_OK && env.restart_count > 0;
        ts_status st = fail_all(s, group, TS_ERR_STATE,
                                "rank %d joined twice (%s)", r,
                                restarted ? "this is a restarted attempt and its earlier self had joined this round, "
                                            "which is over: the next attempt meets a new one"
                                          : "two processes with the same rank, a reused group name, or a store left "
                                            "over from an earlier run");
        return restarted ? wait_round_gone(s, st, fmin(timeout, TS__RDZV_VOID_WAIT_S)) : st;
    }
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = 0;
    snprintf(key, sizeof key, "rank/%d/host", r);
    TS_TRY(ts_store_set(s, key, host, strlen(host)));
    char ws[16];
    snprintf(ws, sizeof ws, "%d", w);
    snprintf(key, sizeof key, "rank/%d/world", r);
    TS_TRY(ts_store_set(s, key, ws, strlen(ws)));
    if (r == 0) TS_TRY(ts_store_set(s, "world_size", ws, strlen(ws)));
    TS_TRY(ts_store_add(s, "joined", 1, &n));
    char rs[16];
    snprintf(rs, sizeof rs, "%d", r);
    snprintf(key, sizeof key, "slot/%" PRId64, n);
    TS_TRY(ts_store_set(s, key, rs, strlen(rs)));
    TS_TRY(check_world(s, group, r, w, n));
    if (n > w)
        return fail_all(s, group, TS_ERR_STATE,
                        "%" PRId64 " ranks joined but world_size is %d (a store left over from an earlier run?)", n, w);
    if (n == w) TS_TRY(ts_store_set(s, "all_joined", "1", 1));
    ts_log(TS_LOG_INFO, "rendezvous of group '%s': rank %d of %d on host %s joined (%" PRId64 " of %d arrived)", group,
           r, w, host, n, w);
    double t0 = ts_time_now();
    TS_TRY(wait_all(s, group, r, w, n, timeout, hb));
    ts_log(TS_LOG_INFO, "rendezvous of group '%s': all %d ranks joined (rank %d waited %.3f s)", group, w, r,
           ts_time_now() - t0);
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
    double hb = 0;
    TS_TRY(ts__heartbeat_resolve_timeout(o.heartbeat_timeout_s, &hb));
    TS_TRY(make_store(&o, timeout, &base, &r, &w, &lr, &lw));
    ts_status st = ts_store_prefix_new(base, group, &s);
    ts_store_release(base);
    TS_TRY(st);
    ts_store_set_timeout(s, timeout);
    st = join(s, group, r, w, timeout, hb, &lr, &lw);
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
