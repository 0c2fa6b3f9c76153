/*
 * distributed/auth.h — the job token and the handshake that every TCP
 * connection of a job (the TCP store's and the built-in backend's links) runs
 * before anything else (internal).
 *
 * ---- the job token ------------------------------------------------------------------------------
 * A secret shared by every rank of a job: TS_JOB_TOKEN in the environment
 * (`tessera run` generates 32 random bytes in hex for its ranks unless the
 * variable is already set), an explicit token (ts_store_tcp_options.token), or
 * under Open MPI's mpirun, one derived from the random per-job key it gives
 * every process (OMPI_MCA_orte_precondition_transports).
 * The HMAC key is the token's bytes. Without a token the same handshake runs
 * with an empty key: it proves nothing, so the process logs one warning, but it
 * keeps one protocol, still makes half-open and non-speaking connections
 * evictable, and lets each side say clearly when only one of them has a token.
 * A server without a token accepts only peers of its own host (a loopback
 * address, or the address the peer reached it on: a local connection's source)
 * unless TS_ALLOW_UNAUTHENTICATED is set; others get TS__AUTH_REMOTE_NO_TOKEN.
 *
 * ---- handshake (all integers big-endian) ----------------------------------------------------------
 *   server -> client  CHALLENGE 48 bytes: "TSA1" | u8 kind | u8 flags | u16 0 | u32 f1 | u32 f2 | nonce_s[32]
 *   client -> server  RESPONSE  80 bytes: "TSA1" | u8 kind | u8 flags | u16 0 | u32 f1 | u32 f2 | nonce_c[32]
 *                                         | mac_c[32]
 *   server -> client  VERDICT   36 bytes: u8 code | 3 x 0 | mac_s[32]   (mac_s zero unless code is OK)
 * kind: 1 store, 2 link. flags bit 0: the sender has a token. The fields:
 *   store: challenge f1, f2 = the server's max key and max value bytes; response f1 = the client's
 *          rank + 1 and f2 = its world size (0, 0: not a rank's; the server seats ranks first)
 *   link:  challenge f1 = the listening rank, f2 = world; response f1 = the connecting rank, f2 = world
 * With T = CHALLENGE || RESPONSE[0..48) (the transcript, both nonces fresh from
 * the kernel's CSPRNG):
 *   mac_c = HMAC-SHA256(token, "tessera-auth-v1 client" || T)
 *   mac_s = HMAC-SHA256(token, "tessera-auth-v1 server" || T)
 * The server checks mac_c in constant time and answers a verdict; the client
 * checks mac_s before it sends a single byte of data, so a rank never talks to
 * a listener that does not know the token (mutual authentication). Distinct
 * labels stop one side's proof being reflected as the other's; the nonces stop
 * replays. Authentication only: the bytes that follow are neither encrypted nor
 * integrity-protected.
 */
#ifndef TS_DIST_AUTH_H
#define TS_DIST_AUTH_H

#include "core/internal.h"
#include "tessera/dist.h"

#include <stdint.h>
#include <sys/socket.h>

#define TS__AUTH_CHALLENGE_BYTES 48
#define TS__AUTH_RESPONSE_BYTES 80
#define TS__AUTH_VERDICT_BYTES 36
#define TS__AUTH_MAX_TOKEN 4096            /* characters */
#define TS__AUTH_DEFAULT_TIMEOUT_S 10.0    /* a handshake must finish within this */

enum { TS__AUTH_STORE = 1, TS__AUTH_LINK = 2 };

/* Verdict codes (and what a client makes of the server's answer). */
enum {
    TS__AUTH_OK = 0,
    TS__AUTH_BAD_TOKEN = 1,  /* mac_c did not verify: a different token */
    TS__AUTH_NEED_TOKEN = 2, /* the server has a token, the client none */
    TS__AUTH_NO_TOKEN = 3,   /* the client has a token, the server none */
    TS__AUTH_BAD_PEER = 4,   /* link: the connecting rank is not one the listener expects */
    TS__AUTH_MALFORMED = 5,  /* not this protocol (wrong magic, kind or size) */
    TS__AUTH_UNPROVEN = 6,   /* client side only: the server accepted but mac_s did not verify */
    TS__AUTH_REMOTE_NO_TOKEN = 7, /* neither has a token and the client is on another host */
};

typedef struct ts__auth {
    bool has_token;
    bool remote_ok; /* without a token: other hosts' peers accepted too (TS_ALLOW_UNAUTHENTICATED) */
    size_t keylen;
    uint8_t key[64]; /* the token's bytes, or SHA-256 of a token longer than 64 bytes (HMAC's own rule) */
} ts__auth;

/* token NULL: TS_JOB_TOKEN from the environment, else under Open MPI's mpirun one
 * derived from the job key mpirun gives every process (auth.c, derived_token); ""
 * or none of those: no token (one warning per process naming `what`, e.g. "tcp
 * store 10.0.0.1:29500").
 * TS_ERR_INVALID_ARG for a token over TS__AUTH_MAX_TOKEN characters. */
ts_status ts__auth_init(ts__auth *a, const char *token, const char *what);
void ts__auth_wipe(ts__auth *a);
/* New job tokens: ts_job_token_new (tessera/dist.h). */

/* Server: a fresh challenge. */
ts_status ts__auth_challenge(const ts__auth *a, int kind, uint32_t f1, uint32_t f2,
                             uint8_t ch[TS__AUTH_CHALLENGE_BYTES]);
/* Client: checks the challenge (TS__AUTH_MALFORMED if it is not one of `kind`),
 * reports the server's fields and writes the response. Returns a code, or a
 * negative status when no nonce could be drawn. */
int ts__auth_respond(const ts__auth *a, int kind, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES], uint32_t f1,
                     uint32_t f2, uint32_t *server_f1, uint32_t *server_f2, uint8_t resp[TS__AUTH_RESPONSE_BYTES]);
/* Server: checks a response to ch from a peer of this host (peer_local: ts__peer_is_local) or
 * another; reports the client's fields. */
int ts__auth_check(const ts__auth *a, int kind, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES],
                   const uint8_t resp[TS__AUTH_RESPONSE_BYTES], bool peer_local, uint32_t *client_f1,
                   uint32_t *client_f2);
/* Server: the verdict message for code (with mac_s when code is TS__AUTH_OK). Returns the code sent:
 * code, or a refusal when libcrypto could not compute mac_s. */
int ts__auth_verdict(const ts__auth *a, int code, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES],
                     const uint8_t resp[TS__AUTH_RESPONSE_BYTES], uint8_t v[TS__AUTH_VERDICT_BYTES]);
/* Client: the server's verdict: TS__AUTH_OK only when it accepted and proved the token. */
int ts__auth_accepted(const ts__auth *a, const uint8_t ch[TS__AUTH_CHALLENGE_BYTES],
                      const uint8_t resp[TS__AUTH_RESPONSE_BYTES], const uint8_t v[TS__AUTH_VERDICT_BYTES]);

/* Why a client's handshake failed, for its error message ("... refused this
 * process: <text>"). Static strings. */
const char *ts__auth_client_reason(int code);
/* Why a server refused a client, for its log line. Static strings. */
const char *ts__auth_server_reason(int code);

/* "ip:port" / "[ip6]:port" of a socket address (numeric). */
void ts__sockaddr_str(const struct sockaddr *sa, socklen_t len, char *out, size_t cap);
/* The peer address of a connected socket, as above ("?" when unknown). */
void ts__peer_str(int fd, char *out, size_t cap);
/* Whether peer is on this host, seen from a connection whose local end is local: a loopback
 * address (127/8, ::1, their v4-mapped forms), or local's own address (a connection to one of
 * this host's addresses comes from that address). */
bool ts__addr_is_local(const struct sockaddr *peer, const struct sockaddr *local);
/* ts__addr_is_local for an accepted socket (false when either end is unknown). */
bool ts__peer_is_local(int fd);

/* ---- rate-limited refusal log --------------------------------------------------------------------
 * Strangers are logged (TS_LOG_WARN) with their address, at most
 * TS__REFUSAL_BURST lines per TS__REFUSAL_WINDOW_S seconds per logger; the rest
 * are counted and summed up in the next line after the window. Not thread-safe:
 * one per server thread. */
#define TS__REFUSAL_BURST 20
#define TS__REFUSAL_WINDOW_S 10.0
typedef struct ts__refusal_log {
    double window_start;
    int logged;
    long suppressed;
    long total; /* every refusal, logged or not */
} ts__refusal_log;
void ts__refusal(ts__refusal_log *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* TS_DIST_AUTH_H */
