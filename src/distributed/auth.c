/*
 * distributed/auth.c — the job token and the challenge-response handshake
 * (the protocol is specified in auth.h), plus the rate-limited log of refused
 * connections that the TCP store's server and the TCP transport share.
 */
#include "distributed/auth.h"

#include "core/crypto.h"
#include "core/env.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

static const uint8_t MAGIC[4] = {'T', 'S', 'A', '1'};
static const char LABEL_CLIENT[] = "tessera-auth-v1 client";
static const char LABEL_SERVER[] = "tessera-auth-v1 server";

static atomic_int warned_no_token;

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Open MPI's mpirun gives every process of a job the same 128 random bits from /dev/urandom
 * (orte_pre_condition_transports: "<16 hex>-<16 hex>", meant as a job key for PSM-style fabrics),
 * readable, like any environment, only by the job's user and root. Under mpirun without
 * TS_JOB_TOKEN the token is derived from it: HMAC-SHA256(key, DERIVE_LABEL) in hex, so the key
 * itself never goes on the wire and the token is Tessera's alone. Job ids (Slurm's, torchrun's
 * run id, PMIx namespaces) are no secrets and are never used. Returns the token in out (65
 * bytes), or "" when there is no such key. */
static const char DERIVE_LABEL[] = "tessera-job-token-v1 open-mpi precondition_transports";
static ts_status derived_token(char out[2 * TS__SHA256_BYTES + 1], const char **from) {
    static const char *const vars[] = {"OMPI_MCA_orte_precondition_transports", "OMPI_MCA_opal_precondition_transports"};
    out[0] = 0;
    const char *size = getenv("OMPI_COMM_WORLD_SIZE");
    if (!size || !*size) return TS_OK;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *k = getenv(vars[i]);
        if (!k || strlen(k) < 16) continue; /* not the key we know: 2 x 64 bits in hex */
        uint8_t mac[TS__SHA256_BYTES];
        const void *parts[1] = {DERIVE_LABEL};
        const size_t lens[1] = {sizeof DERIVE_LABEL - 1};
        TS_TRY(ts__hmac_sha256(k, strlen(k), 1, parts, lens, mac));
        ts__hex(mac, sizeof mac, out);
        ts__wipe(mac, sizeof mac);
        *from = vars[i];
        return TS_OK;
    }
    return TS_OK;
}

ts_status ts__auth_init(ts__auth *a, const char *token, const char *what) {
    memset(a, 0, sizeof *a);
    bool from_env = token == NULL;
    char derived[2 * TS__SHA256_BYTES + 1] = "";
    if (from_env) token = ts_env_str(TS_ENV_JOB_TOKEN);
    if (from_env && !(token && *token)) {
        const char *src = NULL;
        TS_TRY(derived_token(derived, &src));
        if (derived[0]) {
            token = derived;
            static atomic_int told;
            if (!atomic_exchange(&told, 1))
                ts_log(TS_LOG_INFO, "%s: job token derived from Open MPI's per-job key (%s); TS_JOB_TOKEN overrides it",
                       what, src);
        }
    }
    size_t n = token ? strlen(token) : 0;
    if (n > TS__AUTH_MAX_TOKEN)
        return ts_error(TS_ERR_INVALID_ARG, "%s: the job token (%s) is %zu characters long; at most %d are allowed",
                        what, from_env ? "TS_JOB_TOKEN" : "ts_store_tcp_options.token", n, TS__AUTH_MAX_TOKEN);
    if (n == 0) {
        a->remote_ok = ts_env_bool(TS_ENV_ALLOW_UNAUTHENTICATED);
        if (!atomic_exchange(&warned_no_token, 1))
            ts_log(TS_LOG_WARN,
                   "%s: no job token (TS_JOB_TOKEN is not set): %s. `tessera run` and mpirun give their ranks one; "
                   "with other launchers export the same secret TS_JOB_TOKEN to every rank (e.g. 32 random bytes "
                   "in hex)",
                   what,
                   a->remote_ok ? "this job's TCP store and TCP links accept any process that can reach them "
                                  "(TS_ALLOW_UNAUTHENTICATED is set)"
                                : "this job's TCP store and TCP links accept any process of this host and none of "
                                  "another (TS_ALLOW_UNAUTHENTICATED=1 would let other hosts in unauthenticated)");
        return TS_OK;
    }
    a->has_token = true;
    if (n > sizeof a->key) {
        TS_TRY(ts__sha256_hash(token, n, a->key));
        a->keylen = TS__SHA256_BYTES;
    } else {
        memcpy(a->key, token, n);
        a->keylen = n;
    }
    ts__wipe(derived, sizeof derived);
    return TS_OK;
}

void ts__auth_wipe(ts__auth *a) { ts__wipe(a, sizeof *a); }

ts_status ts_job_token_new(char out[TS_JOB_TOKEN_CHARS + 1]) {
    TS_ARG(out, "ts_job_token_new: out is NULL");
    uint8_t b[TS_JOB_TOKEN_CHARS / 2];
    TS_TRY(ts__random_bytes(b, sizeof b));
    ts__hex(b, sizeof b, out);
    ts__wipe(b, sizeof b);
    return TS_OK;
}

/* The 48-byte head shared by challenge and response. */
static void head(const ts__auth *a, int kind, uint32_t f1, uint32_t f2, uint8_t *p) {
    memcpy(p, MAGIC, 4);
    p[4] = (uint8_t)kind;
    p[5] = a->has_token ? 1 : 0;
    p[6] = p[7] = 0;
    put32(p + 8, f1);
    put32(p + 12, f2);
}

static bool head_ok(const uint8_t *p, int kind) {
    return memcmp(p, MAGIC, 4) == 0 && p[4] == kind && (p[5] & ~1u) == 0 && p[6] == 0 && p[7] == 0;
}

/* false when libcrypto failed (out is then zero and must not be compared: every caller refuses). */
static bool mac(const ts__auth *a, const char *label, const uint8_t *ch, const uint8_t *resp, uint8_t out[32]) {
    const void *parts[3] = {label, ch, resp};
    const size_t lens[3] = {strlen(label), TS__AUTH_CHALLENGE_BYTES, 48};
    return ts__hmac_sha256(a->key, a->keylen, 3, parts, lens, out) == TS_OK;
}

ts_status ts__auth_challenge(const ts__auth *a, int kind, uint32_t f1, uint32_t f2,
                             uint8_t ch[TS__AUTH_CHALLENGE_BYTES]) {
    head(a, kind, f1, f2, ch);
    return ts__random_bytes(ch + 16, 32);
}

int ts__auth_respond(const ts__auth *a, int kind, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES], uint32_t f1,
                     uint32_t f2, uint32_t *server_f1, uint32_t *server_f2, uint8_t resp[TS__AUTH_RESPONSE_BYTES]) {
    if (!head_ok(ch, kind)) return TS__AUTH_MALFORMED;
    *server_f1 = get32(ch + 8);
    *server_f2 = get32(ch + 12);
    head(a, kind, f1, f2, resp);
    ts_status st = ts__random_bytes(resp + 16, 32);
    if (st != TS_OK) return st;
    if (!mac(a, LABEL_CLIENT, ch, resp, resp + 48)) return TS_ERR_NOMEM;
    return TS__AUTH_OK;
}

int ts__auth_check(const ts__auth *a, int kind, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES],
                   const uint8_t resp[TS__AUTH_RESPONSE_BYTES], bool peer_local, uint32_t *client_f1,
                   uint32_t *client_f2) {
    if (!head_ok(resp, kind)) return TS__AUTH_MALFORMED;
    *client_f1 = get32(resp + 8);
    *client_f2 = get32(resp + 12);
    uint8_t want[32];
    int same = mac(a, LABEL_CLIENT, ch, resp, want) && ts__ct_equal(want, resp + 48, 32);
    ts__wipe(want, sizeof want);
    bool client_token = resp[5] & 1;
    if (a->has_token && !client_token) return TS__AUTH_NEED_TOKEN;
    if (!a->has_token && client_token) return TS__AUTH_NO_TOKEN;
    if (!a->has_token && !peer_local && !a->remote_ok) return TS__AUTH_REMOTE_NO_TOKEN;
    return same ? TS__AUTH_OK : TS__AUTH_BAD_TOKEN;
}

int ts__auth_verdict(const ts__auth *a, int code, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES],
                      const uint8_t resp[TS__AUTH_RESPONSE_BYTES], uint8_t v[TS__AUTH_VERDICT_BYTES]) {
    memset(v, 0, TS__AUTH_VERDICT_BYTES);
    v[0] = (uint8_t)code;
    if (code == TS__AUTH_OK && !mac(a, LABEL_SERVER, ch, resp, v + 4)) v[0] = TS__AUTH_BAD_TOKEN; /* refuse */
    return v[0];
}

int ts__auth_accepted(const ts__auth *a, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES],
                      const uint8_t resp[TS__AUTH_RESPONSE_BYTES], const uint8_t v[TS__AUTH_VERDICT_BYTES]) {
    if (v[0] != TS__AUTH_OK)
        return v[0] <= TS__AUTH_MALFORMED || v[0] == TS__AUTH_REMOTE_NO_TOKEN ? v[0] : TS__AUTH_MALFORMED;
    if (v[1] || v[2] || v[3]) return TS__AUTH_MALFORMED;
    uint8_t want[32];
    int same = mac(a, LABEL_SERVER, ch, resp, want) && ts__ct_equal(want, v + 4, 32);
    ts__wipe(want, sizeof want);
    return same ? TS__AUTH_OK : TS__AUTH_UNPROVEN;
}

const char *ts__auth_client_reason(int code) {
    switch (code) {
    case TS__AUTH_OK: return "accepted";
    case TS__AUTH_BAD_TOKEN:
        return "wrong job token (this process's TS_JOB_TOKEN differs from the one the job was started with)";
    case TS__AUTH_NEED_TOKEN:
        return "it requires a job token and this process has none (set TS_JOB_TOKEN to the job's token; "
               "tessera run sets it for its ranks)";
    case TS__AUTH_NO_TOKEN:
        return "it runs without a job token but this process has one (give every rank the same TS_JOB_TOKEN)";
    case TS__AUTH_BAD_PEER: return "it does not expect a connection from this rank";
    case TS__AUTH_REMOTE_NO_TOKEN:
        return "it runs without a job token and so accepts no other host (give every rank the same TS_JOB_TOKEN; "
               "TS_ALLOW_UNAUTHENTICATED=1 where it runs lets other hosts in without one)";
    case TS__AUTH_UNPROVEN:
        return "it accepted this process but could not prove it knows the job token (it is not the job's "
               "endpoint: a stranger's listener, or a different job)";
    default: return "malformed handshake (not a Tessera endpoint of this version)";
    }
}

const char *ts__auth_server_reason(int code) {
    switch (code) {
    case TS__AUTH_OK: return "accepted";
    case TS__AUTH_BAD_TOKEN: return "wrong job token";
    case TS__AUTH_NEED_TOKEN: return "no job token";
    case TS__AUTH_NO_TOKEN: return "it has a job token and this endpoint has none";
    case TS__AUTH_BAD_PEER: return "not a rank this listener expects";
    case TS__AUTH_REMOTE_NO_TOKEN:
        return "another host's process and this job has no job token (TS_JOB_TOKEN; TS_ALLOW_UNAUTHENTICATED=1 "
               "accepts other hosts without one)";
    default: return "malformed handshake";
    }
}

void ts__sockaddr_str(const struct sockaddr *sa, socklen_t len, char *out, size_t cap) {
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof ip);
        snprintf(out, cap, "%s:%d", ip, ntohs(s4->sin_port));
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof ip);
        snprintf(out, cap, "[%s]:%d", ip, ntohs(s6->sin6_port));
    } else {
        snprintf(out, cap, "?");
    }
}

void ts__peer_str(int fd, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(out, cap, "?");
        return;
    }
    ts__sockaddr_str((struct sockaddr *)&ss, sl, out, cap);
}

static bool loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family != AF_INET6) return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool ts__addr_is_local(const struct sockaddr *peer, const struct sockaddr *local) {
    if (loopback(peer)) return true;
    if (peer->sa_family != local->sa_family) return false;
    if (peer->sa_family == AF_INET)
        return ((const struct sockaddr_in *)peer)->sin_addr.s_addr == ((const struct sockaddr_in *)local)->sin_addr.s_addr;
    if (peer->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)peer)->sin6_addr, &((const struct sockaddr_in6 *)local)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

bool ts__peer_is_local(int fd) {
    struct sockaddr_storage p, l;
    socklen_t pl = sizeof p, ll = sizeof l;
    if (getpeername(fd, (struct sockaddr *)&p, &pl) != 0 || getsockname(fd, (struct sockaddr *)&l, &ll) != 0)
        return false;
    return ts__addr_is_local((const struct sockaddr *)&p, (const struct sockaddr *)&l);
}

void ts__refusal(ts__refusal_log *l, const char *fmt, ...) {
    double now = ts_time_now();
    l->total++;
    if (now - l->window_start >= TS__REFUSAL_WINDOW_S) {
        if (l->suppressed)
            ts_log(TS_LOG_WARN, "... and %ld more refused connections in the last %.0f s", l->suppressed,
                   now - l->window_start);
        l->window_start = now;
        l->logged = 0;
        l->suppressed = 0;
    }
    if (l->logged >= TS__REFUSAL_BURST) {
        l->suppressed++;
        return;
    }
    l->logged++;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts_log(TS_LOG_WARN, "%s", msg);
}
