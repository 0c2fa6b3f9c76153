/*
 * distributed/builtin/builtin.c — the built-in backend: connection setup through the
 * store, a progress engine that drives one send stream and one receive stream
 * at a time over any transport, and the collective algorithms written once
 * over it.
 *
 * ---- Connections --------------------------------------------------------------------------------
 * Every rank publishes "host/<rank>" (its host name). A pair of ranks on the
 * same host talks through shared memory (shm.c), other pairs through TCP
 * (tcp.c); TS_DIST_TRANSPORT=tcp forces TCP for every pair. Keys live under
 * "builtin/<n>/" where n counts how often this rank joined a group of this
 * name, so a store can host successive groups with one name. Shared memory
 * is reserved up front (shm_setup): the host's first rank picks a ring size
 * that lets every rank of the host fit in the segment directory and publishes
 * it ("shmring/<rank>"); each rank publishes its segment's name, or "-" when
 * it could not reserve one (a full /dev/shm), and a pair where either side has
 * no segment uses TCP instead, with a warning.
 *
 * ---- Framing and checks -----------------------------------------------------------------------
 * The first bytes a rank sends to a peer in each operation are a 24-byte
 * header (op kind, dtype, reduce op, root or tag, element count). The
 * receiver compares it with its own call, so ranks that disagree about the
 * collective, its size, dtype, root, op or tag get an error naming both
 * calls and both ranks instead of exchanging garbage; that rank then aborts
 * the group and its peers see TS_ERR_REMOTE naming it. Every ring or chain
 * links all ranks, so any disagreement is seen by at least one rank.
 *
 * ---- Progress engine ----------------------------------------------------------------------------
 * run() moves a list of send steps to one peer and a list of receive steps
 * from one peer at the same time (so a ring step never deadlocks on full
 * buffers). A receive step either copies or reduces the incoming f32
 * elements into place (straight out of the shared-memory ring). Gating
 * expresses pipelining: with lag L >= 0, byte j of send step k may leave only
 * once byte j of receive step k - L has arrived (and been reduced) — the
 * forwarding chains of broadcast/reduce (L = 0) and the rings (L = 1) stream
 * at segment granularity with no bubble between steps. GATE_RX_BY_TX is the
 * converse (receive-reduce into bytes already sent), used by recursive
 * doubling to combine in place. Waiting spins TS_DIST_SPIN (default 300)
 * iterations (~10 us: latency matters while a collective is in
 * flight), then polls the sockets (TCP) or yields the core for up to 2 ms
 * (ranks sharing cores, e.g. 8 thread ranks on 2 cores), then sleeps 50 us
 * at a time; it checks the abort flag, the
 * deadline (the group's timeout per operation) and every 50 ms whether the
 * peers are still alive.
 *
 * ---- Algorithms (n ranks, this rank r, next = r+1, prev = r-1 mod n) -------------------------
 * all_reduce, bytes <= TS_DIST_RING_THRESHOLD (default 256 KiB): recursive
 *   doubling. p = largest power of two <= n; ranks r >= p first send their
 *   data to r - p (which reduces it in), the first p ranks exchange with
 *   r ^ 1, r ^ 2, ... r ^ (p/2) reducing each partner's data into their buffer
 *   (log2 p steps, full message per step; IEEE + / max / min are commutative
 *   so partners compute identical bits), then r < n - p send the result back.
 * all_reduce, larger: ring reduce-scatter then ring all-gather. The buffer is
 *   cut into n chunks of count/n elements, the first count % n chunks one
 *   element longer (so any count works, including count < n). Step
 *   k = 0 .. 2n-3 sends chunk (r-k) mod n to next and receives chunk
 *   (r-k-1) mod n from prev; steps k < n-1 reduce what arrives (after step n-2
 *   rank r holds the full reduction of chunk r+1; avg scales it by 1/n in that
 *   same pass), later steps copy. Send step k forwards what receive step k-1
 *   produced (L = 1), and a transfer moves at most TS_DIST_SHM_CHUNK bytes
 *   (default 256 KiB) at a time through rings of TS_DIST_SHM_BYTES (default
 *   1 MiB), so about four segments are in flight per link and reduction
 *   overlaps transfer. Each rank sends and receives 2(n-1)/n of the buffer.
 * broadcast(root): a pipelined chain root -> root+1 -> ... -> root-1; each
 *   rank forwards bytes as they arrive (L = 0).
 * reduce(root): the chain root+1 -> root+2 -> ... -> root, each rank reducing
 *   into its buffer and forwarding the partial result as it is produced.
 * all_gather: ring; step k = 0 .. n-2 sends block (r-k) and receives block
 *   (r-k-1), forwarding what it received one step earlier (L = 1).
 * reduce_scatter: the reduce-scatter half of the ring on a scratch copy of
 *   the input, with chunks = blocks shifted so rank r ends with block r.
 * barrier: a recursive-doubling all-reduce of one float.
 * send/recv: one stream; the header carries the tag, which must match.
 */
#include "core/env.h"
#include "distributed/backend.h"
#include "distributed/builtin/transport.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define HDR_MAGIC 0x54534844u /* "TSHD" */

static const char *const op_names[] = {"sum", "avg", "max", "min"};

typedef struct hdr {
    uint32_t magic;
    uint8_t kind; /* a ts_coll_kind; a receive expects its sender's TS_COLL_SEND */
    uint8_t dtype, op, pad;
    int32_t arg; /* root or tag */
    uint32_t pad2;
    uint64_t count;
} hdr;

typedef struct peer {
    ts__link *link;
    uint64_t tx_seq, rx_seq; /* the operation whose header was sent / received */
    size_t tx_hdr, rx_hdr;   /* header bytes moved so far */
    hdr rxh;
} peer;

typedef struct step {
    size_t off, len; /* bytes, relative to the stream's base */
    ts__rop op;
    float scale;
} step;

typedef struct stream {
    peer *p;
    char *base;
    const step *steps;
    int n, cur;
    size_t done; /* bytes of steps[cur] moved */
} stream;

#define GATE_NONE (-1)
#define GATE_RX_BY_TX (-2)

typedef struct builtin {
    int rank, world;
    double timeout_s, deadline;
    const atomic_int *aborted;
    peer *peers;
    ts__shm_seg *seg;
    size_t ring_threshold;
    unsigned spin_limit;
    uint64_t seq;
    hdr cur;
    const char *opname;
    step *tx_steps, *rx_steps; /* 2 * world entries */
    void *scratch;
    size_t scratch_cap;
    char links[600]; /* how this rank reaches its peers (log_transports, bi_describe) */
    bool logged_algo[2]; /* TS_LOG_LEVEL=debug: all_reduce's ring [0] / recursive doubling [1] logged once */
} builtin;

/* ---- framing -------------------------------------------------------------------------------------- */
static void begin(builtin *b, ts_coll_kind kind, ts_dtype dt, int op, int arg, uint64_t count) {
    b->seq++;
    memset(&b->cur, 0, sizeof b->cur);
    b->cur.magic = HDR_MAGIC;
    b->cur.kind = (uint8_t)(kind == TS_COLL_RECV ? TS_COLL_SEND : kind);
    b->cur.dtype = (uint8_t)dt;
    b->cur.op = (uint8_t)op;
    b->cur.arg = arg;
    b->cur.count = count;
    b->opname = ts_coll_kind_name(kind);
    b->deadline = ts_time_now() + b->timeout_s;
}

static ts_status check_hdr(builtin *b, int peer_rank, const hdr *h) {
    const hdr *m = &b->cur;
    const char *what = b->opname;
    if (h->magic != HDR_MAGIC)
        return ts_error(TS_ERR_REMOTE, "%s: rank %d sent a corrupt header (ranks are out of step)", what, peer_rank);
    if (h->kind != m->kind)
        return ts_error(TS_ERR_INVALID_ARG, "collective mismatch: rank %d called %s while rank %d (this rank) called %s",
                        peer_rank, ts_coll_kind_name((ts_coll_kind)h->kind), b->rank, what);
    if (h->count != m->count || h->dtype != m->dtype)
        return ts_error(TS_ERR_SHAPE, "%s: size mismatch: rank %d passed %llu %s elements, rank %d (this rank) %llu %s",
                        what, peer_rank, (unsigned long long)h->count, ts_dtype_name((ts_dtype)h->dtype), b->rank,
                        (unsigned long long)m->count, ts_dtype_name((ts_dtype)m->dtype));
    if (h->op != m->op)
        return ts_error(TS_ERR_INVALID_ARG, "%s: reduce op mismatch: rank %d used %s, rank %d (this rank) %s", what,
                        peer_rank, h->op < 4 ? op_names[h->op] : "?", b->rank, m->op < 4 ? op_names[m->op] : "?");
    if (h->arg != m->arg)
        return ts_error(TS_ERR_INVALID_ARG, "%s: %s mismatch: rank %d passed %d, rank %d (this rank) %d", what,
                        ts_coll_kind_is_p2p((ts_coll_kind)m->kind) ? "tag" : "root", peer_rank, (int)h->arg, b->rank, (int)m->arg);
    return TS_OK;
}

/* Returns 1 when the header is through, 0 when it must wait, < 0 on error. */
static long hdr_tx(builtin *b, peer *p, bool *prog) {
    if (p->tx_seq != b->seq) {
        p->tx_seq = b->seq;
        p->tx_hdr = 0;
    }
    while (p->tx_hdr < sizeof(hdr)) {
        long r = p->link->vt->try_send(p->link, (char *)&b->cur + p->tx_hdr, sizeof(hdr) - p->tx_hdr);
        if (r <= 0) return r;
        p->tx_hdr += (size_t)r;
        *prog = true;
    }
    return 1;
}

static long hdr_rx(builtin *b, peer *p, bool *prog) {
    if (p->rx_seq != b->seq) {
        p->rx_seq = b->seq;
        p->rx_hdr = 0;
    }
    if (p->rx_hdr >= sizeof(hdr)) return 1;
    while (p->rx_hdr < sizeof(hdr)) {
        long r = p->link->vt->try_recv(p->link, (char *)&p->rxh + p->rx_hdr, sizeof(hdr) - p->rx_hdr, TS__ROP_COPY,
                                       1.0f);
        if (r <= 0) return r;
        p->rx_hdr += (size_t)r;
        *prog = true;
    }
    ts_status st = check_hdr(b, p->link->peer, &p->rxh);
    return st == TS_OK ? 1 : st;
}

/* ---- progress engine ------------------------------------------------------------------------------ */
typedef struct waiter {
    unsigned spins;
    double next_check, idle_since;
} waiter;

static ts_status wait_idle(builtin *b, waiter *w, stream *tx, stream *rx) {
    if (atomic_load_explicit(b->aborted, memory_order_relaxed))
        return ts_error(TS_ERR_STATE, "%s: the process group was aborted", b->opname);
    if (++w->spins < b->spin_limit) {
        CPU_RELAX();
        return TS_OK;
    }
    bool rx_busy = rx && rx->cur < rx->n;
    peer *waiting_on = rx_busy ? rx->p : tx->p;
    double now = ts_time_now();
    if (w->idle_since == 0) w->idle_since = now;
    if (now >= b->deadline)
        return ts_error(TS_ERR_TIMEOUT, "%s timed out after %g s waiting for rank %d (%s)", b->opname, b->timeout_s,
                        waiting_on->link->peer, rx_busy ? "to receive" : "to send");
    if (now >= w->next_check) {
        w->next_check = now + 0.05;
        if (rx_busy) TS_TRY(rx->p->link->vt->check(rx->p->link));
        if (tx && tx->cur < tx->n) TS_TRY(tx->p->link->vt->check(tx->p->link));
    }
    struct pollfd fds[2];
    int nf = 0;
    if (rx_busy && rx->p->link->fd >= 0) fds[nf++] = (struct pollfd){rx->p->link->fd, POLLIN, 0};
    if (tx && tx->cur < tx->n && tx->p->link->fd >= 0) fds[nf++] = (struct pollfd){tx->p->link->fd, POLLOUT, 0};
    if (nf) {
        poll(fds, (nfds_t)nf, 2);
    } else if (now - w->idle_since < 0.002) { /* give the core to a peer sharing it, keep latency low */
        sched_yield();
    } else {
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
    }
    return TS_OK;
}

/* How many bytes of tx's current step may leave (gating by rx's progress). */
static size_t tx_allowed(const stream *tx, const stream *rx, int lag) {
    const step *s = &tx->steps[tx->cur];
    if (lag < 0 || tx->cur - lag < 0) return s->len;
    int j = tx->cur - lag;
    if (j < rx->cur) return s->len;
    if (j > rx->cur) return 0;
    return TS_MIN(rx->done, s->len);
}

static size_t rx_allowed(const stream *rx, const stream *tx, int gate) {
    const step *s = &rx->steps[rx->cur];
    if (gate != GATE_RX_BY_TX) return s->len;
    if (rx->cur < tx->cur) return s->len;
    if (rx->cur > tx->cur) return 0;
    size_t es = ts__rop_esize(s->op);
    return TS_MIN(tx->done, s->len) / es * es;
}

static ts_status run(builtin *b, stream *tx, stream *rx, int gate) {
    waiter w = {0, 0, 0};
    if (tx && tx->n == 0) tx = NULL;
    if (rx && rx->n == 0) rx = NULL;
    for (;;) {
        bool prog = false, busy = false;
        if (rx && rx->cur < rx->n) {
            long h = hdr_rx(b, rx->p, &prog);
            if (h < 0) return (ts_status)h;
            while (h > 0 && rx->cur < rx->n) {
                const step *s = &rx->steps[rx->cur];
                size_t lim = rx_allowed(rx, tx, gate);
                if (rx->done < lim) {
                    long r = rx->p->link->vt->try_recv(rx->p->link, rx->base + s->off + rx->done, lim - rx->done,
                                                       s->op, s->scale);
                    if (r < 0) return (ts_status)r;
                    if (r == 0) break;
                    rx->done += (size_t)r;
                    prog = true;
                }
                if (rx->done < s->len) break;
                rx->cur++;
                rx->done = 0;
            }
            busy |= rx->cur < rx->n;
        }
        if (tx && tx->cur < tx->n) {
            long h = hdr_tx(b, tx->p, &prog);
            if (h < 0) return (ts_status)h;
            while (h > 0 && tx->cur < tx->n) {
                const step *s = &tx->steps[tx->cur];
                size_t lim = rx ? tx_allowed(tx, rx, gate) : s->len;
                if (tx->done < lim) {
                    long r = tx->p->link->vt->try_send(tx->p->link, tx->base + s->off + tx->done, lim - tx->done);
                    if (r < 0) return (ts_status)r;
                    if (r == 0) break;
                    tx->done += (size_t)r;
                    prog = true;
                }
                if (tx->done < s->len) break;
                tx->cur++;
                tx->done = 0;
            }
            busy |= tx->cur < tx->n;
        }
        if (!busy) return TS_OK;
        if (prog) {
            w.spins = 0;
            w.idle_since = 0;
        } else TS_TRY(wait_idle(b, &w, tx, rx));
    }
}

static stream mk(peer *p, void *base, const step *steps, int n) {
    return (stream){p, base, steps, n, 0, 0};
}

/* One exchange of a whole region: send [0, n) to `to` while receiving from `from`. */
static ts_status exchange(builtin *b, int to, const void *sbuf, int from, void *rbuf, size_t n, ts__rop op,
                          float scale, int gate) {
    step ts = {0, n, TS__ROP_COPY, 1.0f}, rs = {0, n, op, scale};
    stream tx = mk(to >= 0 ? &b->peers[to] : NULL, (void *)sbuf, &ts, to >= 0 ? 1 : 0);
    stream rx = mk(from >= 0 ? &b->peers[from] : NULL, rbuf, &rs, from >= 0 ? 1 : 0);
    return run(b, to >= 0 ? &tx : NULL, from >= 0 ? &rx : NULL, gate);
}

/* ---- algorithms ------------------------------------------------------------------------------------ */
/* The receive op of a reduction over dt elements (F32 or BF16: pg.c checks). */
static ts__rop rop_of(ts_reduce_op op, ts_dtype dt) {
    bool bf = dt == TS_BF16;
    switch (op) {
    case TS_REDUCE_MAX: return bf ? TS__ROP_MAX_BF16 : TS__ROP_MAX;
    case TS_REDUCE_MIN: return bf ? TS__ROP_MIN_BF16 : TS__ROP_MIN;
    default: return bf ? TS__ROP_SUM_BF16 : TS__ROP_SUM;
    }
}

static void chunk_of(size_t count, int n, int i, size_t *off, size_t *len) {
    size_t base = count / (size_t)n, extra = count % (size_t)n, ui = (size_t)i;
    *off = ui * base + TS_MIN(ui, extra);
    *len = base + (ui < extra ? 1 : 0);
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

static ts_status rd_all_reduce(builtin *b, void *buf, size_t count, ts_dtype dt, ts_reduce_op op) {
    int n = b->world, r = b->rank, p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    int rem = n - p2;
    size_t bytes = count * ts_dtype_size(dt);
    ts__rop rop = rop_of(op, dt);
    float scale = op == TS_REDUCE_AVG ? 1.0f / (float)n : 1.0f;
    if (r >= p2) { /* fold in, then receive the result */
        TS_TRY(exchange(b, r - p2, buf, -1, NULL, bytes, TS__ROP_COPY, 1.0f, GATE_NONE));
        return exchange(b, -1, NULL, r - p2, buf, bytes, TS__ROP_COPY, 1.0f, GATE_NONE);
    }
    if (r < rem) TS_TRY(exchange(b, -1, NULL, r + p2, buf, bytes, rop, p2 == 1 ? scale : 1.0f, GATE_NONE));
    for (int mask = 1; mask < p2; mask <<= 1) {
        int partner = r ^ mask;
        float s = mask * 2 == p2 ? scale : 1.0f;
        /* Receive-reduce into bytes already sent (GATE_RX_BY_TX): no temporary. */
        TS_TRY(exchange(b, partner, buf, partner, buf, bytes, rop, s, GATE_RX_BY_TX));
    }
    if (r < rem) TS_TRY(exchange(b, r + p2, buf, -1, NULL, bytes, TS__ROP_COPY, 1.0f, GATE_NONE));
    return TS_OK;
}

/* Ring over n chunks of `count` elements of esize bytes split by chunk_of (or blocks of
 * `block` elements when block > 0); steps k0 .. k1-1 of the 2n-2 step
 * schedule, chunk indices shifted by `shift`. */
static ts_status ring(builtin *b, char *base, size_t count, size_t block, size_t esize, int k0, int k1, int shift,
                      ts__rop rop, float last_scale) {
    int n = b->world, r = b->rank, ns = 0;
    for (int k = k0; k < k1; k++, ns++) {
        size_t so, sl, ro, rl;
        int sc = mod(r - k + shift, n), rc = mod(r - k - 1 + shift, n);
        if (block) {
            so = (size_t)sc * block, sl = block, ro = (size_t)rc * block, rl = block;
        } else {
            chunk_of(count, n, sc, &so, &sl);
            chunk_of(count, n, rc, &ro, &rl);
        }
        bool reduce = rop != TS__ROP_COPY && k < n - 1;
        b->tx_steps[ns] = (step){so * esize, sl * esize, TS__ROP_COPY, 1.0f};
        b->rx_steps[ns] = (step){ro * esize, rl * esize, reduce ? rop : TS__ROP_COPY,
                                 reduce && k == n - 2 ? last_scale : 1.0f};
    }
    stream tx = mk(&b->peers[mod(r + 1, n)], base, b->tx_steps, ns);
    stream rx = mk(&b->peers[mod(r - 1, n)], base, b->rx_steps, ns);
    return run(b, &tx, &rx, 1);
}

static ts_status bi_all_reduce(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op) {
    builtin *b = st;
    begin(b, TS_COLL_ALL_REDUCE, dt, (int)op, 0, count);
    if (b->world == 1) return TS_OK;
    size_t es = ts_dtype_size(dt);
    bool rd = count * es <= b->ring_threshold;
    if (!b->logged_algo[rd] && ts_log_get_level() <= TS_LOG_DEBUG) { /* once per algorithm and group */
        b->logged_algo[rd] = true;
        ts_log(TS_LOG_DEBUG, "rank %d: all_reduce of %zu bytes by %s (TS_DIST_RING_THRESHOLD %zu bytes; %s)", b->rank,
               count * es, rd ? "recursive doubling" : "ring reduce-scatter + all-gather", b->ring_threshold, b->links);
    }
    if (rd) return rd_all_reduce(b, buf, count, dt, op);
    float scale = op == TS_REDUCE_AVG ? 1.0f / (float)b->world : 1.0f;
    return ring(b, buf, count, 0, es, 0, 2 * b->world - 2, 0, rop_of(op, dt), scale);
}

static ts_status bi_broadcast(void *st, void *buf, size_t count, ts_dtype dt, int root) {
    builtin *b = st;
    begin(b, TS_COLL_BROADCAST, dt, 0, root, count);
    int n = b->world, pos = mod(b->rank - root, n);
    if (n == 1) return TS_OK;
    size_t bytes = count * ts_dtype_size(dt);
    return exchange(b, pos < n - 1 ? mod(b->rank + 1, n) : -1, buf, pos > 0 ? mod(b->rank - 1, n) : -1, buf, bytes,
                    TS__ROP_COPY, 1.0f, 0);
}

static ts_status bi_reduce(void *st, void *buf, size_t count, ts_dtype dt, ts_reduce_op op, int root) {
    builtin *b = st;
    begin(b, TS_COLL_REDUCE, dt, (int)op, root, count);
    int n = b->world, pos = mod(b->rank - root - 1, n); /* root+1 starts the chain, root ends it */
    if (n == 1) return TS_OK;
    float scale = op == TS_REDUCE_AVG && pos == n - 1 ? 1.0f / (float)n : 1.0f;
    return exchange(b, pos < n - 1 ? mod(b->rank + 1, n) : -1, buf, pos > 0 ? mod(b->rank - 1, n) : -1, buf,
                    count * ts_dtype_size(dt), rop_of(op, dt), scale, 0);
}

static ts_status bi_all_gather(void *st, void *out, const void *in, size_t count, ts_dtype dt) {
    builtin *b = st;
    begin(b, TS_COLL_ALL_GATHER, dt, 0, 0, count);
    size_t es = ts_dtype_size(dt);
    char *mine = (char *)out + (size_t)b->rank * count * es;
    if (mine != in && count) memmove(mine, in, count * es);
    if (b->world == 1) return TS_OK;
    return ring(b, out, 0, count, es, 0, b->world - 1, 0, TS__ROP_COPY, 1.0f);
}

static ts_status bi_reduce_scatter(void *st, void *out, const void *in, size_t count, ts_dtype dt,
                                   ts_reduce_op op) {
    builtin *b = st;
    begin(b, TS_COLL_REDUCE_SCATTER, dt, (int)op, 0, count);
    size_t es = ts_dtype_size(dt), bytes = count * es, total = bytes * (size_t)b->world;
    if (b->world == 1) {
        if (out != in && bytes) memmove(out, in, bytes);
        return TS_OK;
    }
    if (b->scratch_cap < total) {
        void *p = realloc(b->scratch, total);
        if (!p) return ts_error(TS_ERR_NOMEM, "reduce_scatter: %zu bytes of scratch", total);
        b->scratch = p;
        b->scratch_cap = total;
    }
    if (total) memcpy(b->scratch, in, total);
    float scale = op == TS_REDUCE_AVG ? 1.0f / (float)b->world : 1.0f;
    /* shift -1: send block r-k-1, receive block r-k-2, so rank r finishes block r. */
    TS_TRY(ring(b, b->scratch, 0, count, es, 0, b->world - 1, -1, rop_of(op, dt), scale));
    if (bytes) memcpy(out, (char *)b->scratch + (size_t)b->rank * bytes, bytes);
    return TS_OK;
}

static ts_status bi_barrier(void *st) {
    builtin *b = st;
    begin(b, TS_COLL_BARRIER, TS_F32, 0, 0, 1);
    if (b->world == 1) return TS_OK;
    float v = 0;
    return rd_all_reduce(b, &v, 1, TS_F32, TS_REDUCE_SUM);
}

static ts_status bi_send(void *st, const void *buf, size_t count, ts_dtype dt, int dst, int tag) {
    builtin *b = st;
    begin(b, TS_COLL_SEND, dt, 0, tag, count);
    return exchange(b, dst, buf, -1, NULL, count * ts_dtype_size(dt), TS__ROP_COPY, 1.0f, GATE_NONE);
}

static ts_status bi_recv(void *st, void *buf, size_t count, ts_dtype dt, int src, int tag) {
    builtin *b = st;
    begin(b, TS_COLL_RECV, dt, 0, tag, count);
    return exchange(b, -1, NULL, src, buf, count * ts_dtype_size(dt), TS__ROP_COPY, 1.0f, GATE_NONE);
}

static void bi_abort(void *st, const char *reason) {
    builtin *b = st;
    char msg[256];
    snprintf(msg, sizeof msg, "rank %d aborted: %s", b->rank, reason ? reason : "ts_pg_abort");
    for (int i = 0; i < b->world; i++)
        if (b->peers[i].link) b->peers[i].link->vt->close(b->peers[i].link, msg);
}

static void bi_destroy(void *st) {
    builtin *b = st;
    if (!b) return;
    for (int i = 0; b->peers && i < b->world; i++)
        if (b->peers[i].link) b->peers[i].link->vt->destroy(b->peers[i].link);
    if (b->seg) {
        ts__shm_seg_unlink(b->seg);
        ts__shm_seg_release(b->seg);
    }
    free(b->peers);
    free(b->tx_steps);
    free(b->rx_steps);
    free(b->scratch);
    free(b);
}

/* ---- setup ------------------------------------------------------------------------------------------- */
/* A setup key a peer published; a value starting with '!' is that peer's failure (publish_failure):
 * TS_ERR_REMOTE with its message, so this rank stops waiting at once. */
static ts_status key_get_str(ts_store *s, const char *key, char *out, size_t cap) {
    void *v = NULL;
    size_t len = 0;
    TS_TRY(ts_store_get(s, key, &v, &len));
    snprintf(out, cap, "%.*s", (int)TS_MIN(len, cap - 1), (const char *)v);
    free(v);
    if (out[0] == '!') return ts_error(TS_ERR_REMOTE, "%s", out + 1);
    return TS_OK;
}

/* A rank whose connection setup fails writes its error into every setup key its peers may be waiting
 * on (its TCP address, shared-memory segment and ring size), so they fail at once naming it instead of
 * waiting out the timeout. Best effort: the store may be gone too. */
static void publish_failure(ts_store *s, const char *pre, int r, const char *host, const char *msg) {
    char key[128], val[1200];
    snprintf(val, sizeof val, "!rank %d (host %.64s) could not connect to the process group: %.1000s", r, host, msg);
    static const char *const what[] = {"addr", "shm", "shmring"};
    for (size_t k = 0; k < TS_ARRAY_LEN(what); k++) {
        snprintf(key, sizeof key, "%s/%s/%d", pre, what[k], r);
        (void)ts_store_set(s, key, val, strlen(val));
    }
}

/* Shared memory for the same-host peers (shm[j]): reserves this rank's segment (one slot per rank of
 * the host) and publishes its name or "-"; then every pair in which a side has no segment goes to
 * TCP (shm[j] = false). Leaves b->seg NULL when no pair uses it. */
static ts_status shm_setup(builtin *b, ts_store *store, const char *pre, bool *shm, int *nshm,
                           int *ntcp) {
    int n = b->world, r = b->rank, nlocal = 1, leader = r;
    char key[128], val[256];
    for (int j = 0; j < n; j++)
        if (j != r && shm[j]) {
            nlocal++;
            leader = TS_MIN(leader, j);
        }
    size_t want = (size_t)ts_env_int(TS_ENV_DIST_SHM_BYTES), ring = want; /* at least 64 KiB */
    snprintf(key, sizeof key, "%s/shmring/%d", pre, leader);
    if (leader == r) { /* one decision per host: ranks deciding on their own would see others' segments */
        ring = ts__shm_pick_ring(nlocal, want);
        snprintf(val, sizeof val, "%zu", ring);
        TS_TRY(ts_store_set(store, key, val, strlen(val)));
    } else {
        TS_TRY(key_get_str(store, key, val, sizeof val));
        unsigned long long v = strtoull(val, NULL, 10);
        ring = v >= (64u << 10) && v <= ((uint64_t)1 << 32) ? (size_t)v : want;
    }
    const char *name = "-";
    if (ts__shm_seg_create(r, nlocal, ring, &b->seg, &name) != TS_OK) {
        ts_log(TS_LOG_WARN, "rank %d: %s; it talks to its %d peers on this host over TCP", r, ts_last_error(),
               nlocal - 1);
        b->seg = NULL;
        name = "-";
    }
    snprintf(key, sizeof key, "%s/shm/%d", pre, r);
    TS_TRY(ts_store_set(store, key, name, strlen(name)));
    for (int j = 0; j < n; j++) {
        if (j == r || !shm[j]) continue;
        snprintf(key, sizeof key, "%s/shm/%d", pre, j);
        TS_TRY(key_get_str(store, key, val, sizeof val));
        if (b->seg && strcmp(val, "-") != 0) continue;
        shm[j] = false; /* this pair talks over TCP */
        (*nshm)--;
        (*ntcp)++;
    }
    if (*nshm == 0 && b->seg) {
        ts__shm_seg_release(b->seg); /* unlinks it */
        b->seg = NULL;
    }
    return TS_OK;
}

/* b->links: which peers this rank reaches through shared memory and which through TCP; logged at
 * TS_LOG_LEVEL=info. */
static void log_transports(builtin *b, const char *host, const bool *shm, const char *tcp_addr) {
    int r = b->rank, n = b->world;
    char lists[2][256];
    for (int k = 0; k < 2; k++) {
        size_t len = (size_t)snprintf(lists[k], sizeof lists[k], "ranks ");
        for (int j = 0; j < n && len < sizeof lists[k] - 16; j++)
            if (j != r && shm[j] == (k == 0))
                len += (size_t)snprintf(lists[k] + len, sizeof lists[k] - len, "%s%d", len > 6 ? "," : "", j);
        if (len == 6) snprintf(lists[k], sizeof lists[k], "no ranks");
    }
    snprintf(b->links, sizeof b->links, "shared memory with %s; TCP with %s", lists[0], lists[1]);
    ts_log(TS_LOG_INFO, "rank %d of %d on host %s: %s%s%s", r, n, host, b->links, tcp_addr ? ", listening on " : "",
           tcp_addr ? tcp_addr : "");
}

static void bi_describe(void *st, char *buf, size_t n) { snprintf(buf, n, "%s", ((builtin *)st)->links); }

static ts_status connect_all(builtin *b, const ts__backend_ctx *ctx) {
    ts_status st = TS_OK;
    int n = b->world, r = b->rank, listen_fd = -1;
    char key[128], pre[64] = "", val[256], host[256] = "localhost", hint[64] = "";
    bool *shm = NULL, *expect = NULL;
    int *slot = NULL;
    ts__link **in = NULL;
    ts__auth auth = {0};
    int64_t gen = 0;
    snprintf(key, sizeof key, "builtin/join/%d", r);
    TS_CHECK_GOTO(ts_store_add(ctx->store, key, 1, &gen));
    snprintf(pre, sizeof pre, "builtin/%lld", (long long)gen);

    TS_CHECK_GOTO(ts_env_check(TS_ENV_DIST_TRANSPORT)); /* auto, shm or tcp */
    bool force_tcp = ts_env_enum(TS_ENV_DIST_TRANSPORT) == TS_ENV_TRANSPORT_TCP;
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "%s/host/%d", pre, r);
    TS_CHECK_GOTO(ts_store_set(ctx->store, key, host, strlen(host)));
    shm = ts__calloc((size_t)n, sizeof *shm);
    slot = ts__calloc((size_t)n, sizeof *slot);
    if (!shm || !slot) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    int nshm = 0, ntcp = 0, nlocal = 0;
    bool cross_host = false; /* a peer on another host */
    for (int j = 0; j < n; j++) {
        if (j != r) {
            snprintf(key, sizeof key, "%s/host/%d", pre, j);
            TS_CHECK_GOTO(key_get_str(ctx->store, key, val, sizeof val));
            cross_host |= strcmp(val, host) != 0;
            shm[j] = !force_tcp && strcmp(val, host) == 0;
            nshm += shm[j];
            ntcp += !shm[j];
        }
        slot[j] = j == r || shm[j] ? nlocal++ : -1;
    }
    if (nshm) TS_CHECK_GOTO(shm_setup(b, ctx->store, pre, shm, &nshm, &ntcp));
    if (ntcp) {
        TS_CHECK_GOTO(ts__tcp_job_auth(ctx->store, &auth, hint, sizeof hint));
        TS_CHECK_GOTO(ts__tcp_listen(hint, cross_host, &listen_fd, val, sizeof val));
        snprintf(key, sizeof key, "%s/addr/%d", pre, r);
        TS_CHECK_GOTO(ts_store_set(ctx->store, key, val, strlen(val)));
    }
    log_transports(b, host, shm, ntcp ? val : NULL);
    for (int j = 0; j < n; j++) {
        if (j == r || !shm[j]) continue;
        snprintf(key, sizeof key, "%s/shm/%d", pre, j);
        TS_CHECK_GOTO(key_get_str(ctx->store, key, val, sizeof val));
        ts__shm_seg *theirs = NULL;
        TS_CHECK_GOTO(ts__shm_seg_open(val, j, &theirs));
        st = ts__shm_link_new(b->seg, theirs, slot[r], slot[j], j, &b->peers[j].link);
        ts__shm_seg_release(theirs);
        if (st != TS_OK) goto fail;
    }
    if (nshm) {
        snprintf(key, sizeof key, "%s/shmok/%d", pre, r);
        TS_CHECK_GOTO(ts_store_set(ctx->store, key, "1", 1));
    }
    double deadline = ts_time_now() + b->timeout_s;
    int accepts = 0;
    for (int j = 0; j < n; j++) {
        if (j == r || shm[j]) continue;
        if (j > r) {
            accepts++;
            continue;
        }
        snprintf(key, sizeof key, "%s/addr/%d", pre, j);
        TS_CHECK_GOTO(key_get_str(ctx->store, key, val, sizeof val));
        TS_CHECK_GOTO(ts__tcp_connect(&auth, val, r, j, n, deadline, &b->peers[j].link));
    }
    for (int j = r + 1; j < n && accepts > 0; j++) { /* a higher rank that failed to set up says so here */
        if (shm[j]) continue;
        snprintf(key, sizeof key, "%s/addr/%d", pre, j);
        TS_CHECK_GOTO(key_get_str(ctx->store, key, val, sizeof val));
    }
    if (accepts > 0) { /* every higher rank over TCP connects to us */
        expect = ts__calloc((size_t)n, sizeof *expect);
        in = ts__calloc((size_t)n, sizeof *in);
        if (!expect || !in) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
        for (int j = r + 1; j < n; j++) expect[j] = !shm[j];
        st = ts__tcp_accept_peers(&auth, listen_fd, r, n, expect, deadline, in);
        for (int j = 0; j < n; j++)
            if (in[j]) b->peers[j].link = in[j];
        if (st != TS_OK) goto fail;
    }
    /* Every shm peer has mapped our segment: remove its name. */
    for (int j = 0; j < n; j++) {
        if (j == r || !shm[j]) continue;
        snprintf(key, sizeof key, "%s/shmok/%d", pre, j);
        const char *keys[1] = {key};
        TS_CHECK_GOTO(ts_store_wait(ctx->store, keys, 1, -1));
    }
    if (b->seg) ts__shm_seg_unlink(b->seg);
fail:
    if (st != TS_OK && st != TS_ERR_REMOTE && pre[0]) { /* a peer's own failure is that peer's to publish */
        char msg[TS_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", ts_last_error());
        publish_failure(ctx->store, pre, r, host, msg);
        ts_error(st, "%s", msg); /* publishing may have overwritten this thread's message */
    }
    if (listen_fd >= 0) close(listen_fd);
    if (b->seg && st != TS_OK) ts__shm_seg_unlink(b->seg);
    ts__auth_wipe(&auth);
    free(in);
    free(expect);
    free(shm);
    free(slot);
    return st;
}

static ts_status bi_init(const ts__backend_ctx *ctx, void **state) {
    builtin *b = ts__calloc(1, sizeof *b);
    if (!b) return TS_ERR_NOMEM;
    b->rank = ctx->rank;
    b->world = ctx->world_size;
    b->timeout_s = ctx->timeout_s;
    b->aborted = ctx->aborted;
    b->ring_threshold = (size_t)ts_env_int(TS_ENV_DIST_RING_THRESHOLD);
    b->spin_limit = (unsigned)ts_env_int(TS_ENV_DIST_SPIN);
    b->peers = ts__calloc((size_t)b->world, sizeof *b->peers);
    b->tx_steps = ts__calloc((size_t)b->world * 2, sizeof(step));
    b->rx_steps = ts__calloc((size_t)b->world * 2, sizeof(step));
    ts_status st = TS_OK;
    if (!b->peers || !b->tx_steps || !b->rx_steps) st = TS_ERR_NOMEM;
    if (st == TS_OK && b->world > 1) st = connect_all(b, ctx);
    /* Once everyone is through the barrier no rank needs the store any more
     * (rank 0 of a TCP rendezvous may then free the group and its server). */
    if (st == TS_OK && b->world > 1) st = bi_barrier(b);
    if (st != TS_OK) {
        bi_destroy(b);
        return ts__error_prefix(st, "builtin backend, rank %d of %d", ctx->rank, ctx->world_size);
    }
    *state = b;
    return TS_OK;
}

const ts__backend_ops ts__builtin_backend = {
    .name = "builtin",
    .init = bi_init,
    .all_reduce = bi_all_reduce,
    .broadcast = bi_broadcast,
    .reduce = bi_reduce,
    .all_gather = bi_all_gather,
    .reduce_scatter = bi_reduce_scatter,
    .barrier = bi_barrier,
    .send = bi_send,
    .recv = bi_recv,
    .abort = bi_abort,
    .destroy = bi_destroy,
    .describe = bi_describe,
    .reduces_bf16 = true,
};
