/*
 * distributed/builtin/transport.h — one connection to one peer (internal).
 *
 * The built-in backend picks a transport per pair of peers (NCCL's habit):
 * shared memory (shm.c) between ranks on the same host, TCP (tcp.c)
 * otherwise or when TS_DIST_TRANSPORT=tcp. Both are byte streams in each
 * direction with non-blocking primitives; the algorithms (builtin.c) are
 * written once over this table and drive several links at the same time, so
 * a ring step sends to the next rank while it receives from the previous one.
 *
 * Non-blocking primitives return the number of bytes moved (0: would block) or
 * a negative ts_status with the error message set (TS_ERR_REMOTE naming the
 * peer rank when it is gone, closed its end or aborted).
 */
#ifndef TS_DIST_BUILTIN_TRANSPORT_H
#define TS_DIST_BUILTIN_TRANSPORT_H

#include "core/internal.h"
#include "distributed/auth.h"
#include "tessera/dist.h"

#include <stdbool.h>
#include <stddef.h>

/* What a receive does with the incoming bytes. COPY moves bytes; the others
 * combine elements into the destination: dst[i] = op(dst[i], in[i]), then
 * dst[i] *= scale when scale != 1 (the last step of an average). The f32 ops
 * work on 4-byte elements; the _BF16 ones on 2-byte bfloat16 elements, each
 * combined in float32 and rounded back to nearest even (what NCCL does for
 * bf16). Reducing receives only consume whole elements (ts__rop_esize). */
typedef enum ts__rop {
    TS__ROP_COPY = 0,
    TS__ROP_SUM,
    TS__ROP_MAX,
    TS__ROP_MIN,
    TS__ROP_SUM_BF16,
    TS__ROP_MAX_BF16,
    TS__ROP_MIN_BF16,
} ts__rop;

/* Bytes per element a receive with op consumes at a time (1 for COPY). */
static inline size_t ts__rop_esize(ts__rop op) {
    return op == TS__ROP_COPY ? 1 : op >= TS__ROP_SUM_BF16 ? 2 : 4;
}

typedef struct ts__link ts__link;
typedef struct ts__link_vt {
    const char *name; /* "shm", "tcp" */
    long (*try_send)(ts__link *l, const void *buf, size_t n);
    long (*try_recv)(ts__link *l, void *dst, size_t n, ts__rop op, float scale);
    /* Called while waiting: TS_OK, or TS_ERR_REMOTE if the peer is gone or closed its end. */
    ts_status (*check)(ts__link *l);
    /* Marks this end closed with a reason peers can read (any thread). */
    void (*close)(ts__link *l, const char *reason);
    void (*destroy)(ts__link *l);
} ts__link_vt;

struct ts__link {
    const ts__link_vt *vt;
    int peer; /* the peer's rank */
    int fd;   /* a socket to poll() while idle, or -1 (shared memory: spin/yield) */
};

/* dst[i] = op(dst[i], src[i]) (then *scale when scale != 1) over n elements of
 * op's type (ts__rop_esize bytes each); src and dst may be unaligned (src often
 * points into a ring buffer). COPY copies n bytes. */
void ts__reduce(void *dst, const void *src, size_t n, ts__rop op, float scale);

/* ---- shared memory (shm.c) ---------------------------------------------------------------- */
/* A segment holds this rank's incoming rings, one per rank of its host (slot =
 * that rank's position among the host's ranks); peers map it and write into
 * their ring. Segments are files in ts__shm_dir(): TS_SHM_DIR, else /dev/shm. */
typedef struct ts__shm_seg ts__shm_seg;
const char *ts__shm_dir(void);
/* Bytes of a segment of `slots` rings of ring_bytes (rounded up to 4 KiB). */
size_t ts__shm_seg_bytes(int slots, size_t ring_bytes);
/* The ring size for nlocal ranks sharing the segment directory: `want` (rounded up to 4 KiB, at
 * least 64 KiB), halved until nlocal segments fit in 90% of its free space, not below 64 KiB;
 * logs a warning naming the free and the needed space when it shrinks or nothing fits. */
size_t ts__shm_pick_ring(int nlocal, size_t want);
/* Creates, reserves (posix_fallocate: TS_ERR_NOMEM naming the directory's free space and the size
 * needed when it is full) and maps this rank's segment with `slots` rings of ring_bytes; *name
 * receives its name (storage inside the segment object). Until ts__shm_seg_unlink, a SIGTERM,
 * SIGINT or SIGHUP unlinks it before the signal takes its course. */
ts_status ts__shm_seg_create(int rank, int slots, size_t ring_bytes, ts__shm_seg **out, const char **name);
/* Maps a peer's segment by name (a name from the store: "tessera-...", checked). */
ts_status ts__shm_seg_open(const char *name, int owner_rank, ts__shm_seg **out);
void ts__shm_seg_unlink(ts__shm_seg *s); /* removes the name (once every peer has mapped it) */
void ts__shm_seg_release(ts__shm_seg *s); /* unmaps; the last link using it also releases */
/* A link to rank `peer`: receives from mine (slot peer_slot), sends into theirs (slot my_slot).
 * Retains both segments. */
ts_status ts__shm_link_new(ts__shm_seg *mine, ts__shm_seg *theirs, int my_slot, int peer_slot, int peer,
                           ts__link **out);

/* ---- TCP (tcp.c) -------------------------------------------------------------------------- */
/* The token that authenticates the group's TCP links (the store's when it is a TCP
 * store, else TS_JOB_TOKEN) and, into hint, the local address of the store's
 * connection to rank 0 ("" when not a TCP store). */
ts_status ts__tcp_job_auth(ts_store *store, ts__auth *auth, char *hint, size_t cap);
/* Listens on the job's interface (distributed/netaddr.h: TS_SOCKET_IFNAME, TS_DIST_IFADDR, hint, the
 * route to MASTER_ADDR, 127.0.0.1; cross_host: a peer is on another host, so never loopback) on a free
 * port; *addr gets "ip:port" ("[ip6]:port") to publish. */
ts_status ts__tcp_listen(const char *hint, bool cross_host, int *fd, char *addr, size_t addr_len);
/* Connects to peer's "ip:port", authenticates both ways, introduces this rank. */
ts_status ts__tcp_connect(const ts__auth *auth, const char *addr, int rank, int peer, int world, double deadline,
                          ts__link **out);
/* Accepts and authenticates connections until every rank j with expect[j] has a link
 * in links[j] (world entries); strangers are refused and logged. */
ts_status ts__tcp_accept_peers(const ts__auth *auth, int listen_fd, int rank, int world, const bool *expect,
                               double deadline, ts__link **links);

/* Is the process alive (not gone, not a zombie)? */
bool ts__pid_alive(int pid);

#endif /* TS_DIST_BUILTIN_TRANSPORT_H */
