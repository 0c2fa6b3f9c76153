/*
 * distributed/builtin/shm.c — the shared-memory transport: one single-producer,
 * single-consumer byte ring per direction per pair of ranks on one host.
 *
 * Each rank creates one POSIX shm segment (shm_open + mmap) holding its
 * incoming rings, one slot per peer rank; peers map it and write into their
 * slot. The owner unlinks the name once every peer has mapped it, so nothing
 * is left in /dev/shm even if a rank is killed later.
 *
 * Ring protocol: `head` (bytes ever written, producer-owned) and `tail`
 * (bytes ever read, consumer-owned) are 64-bit counters on separate cache
 * lines; data is published with a release store of head after the copy and
 * read after an acquire load of head (tail symmetrically frees space). A
 * transfer moves at most `chunk` bytes per call so the consumer can start
 * reducing the first segment while the producer writes the next one
 * (ring_bytes / chunk segments in flight). The consumer can reduce straight
 * out of the ring into its buffer (no copy-then-reduce); an f32 element that
 * straddles the end of the ring is reassembled in a 4-byte temporary.
 *
 * Liveness: each side writes its pid and, when it aborts or leaves, a closed
 * flag and a reason into the ring header; a waiting rank checks both and
 * kill(pid, 0) + /proc/<pid>/stat (a zombie is gone too).
 */
#include "distributed/builtin/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x74736873686d3031ull /* "tsshm01" */
#define HDR_BYTES 4096u

typedef struct ring_hdr {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) atomic_int prod_pid;
    atomic_int cons_pid;
    atomic_int prod_closed;
    atomic_int cons_closed;
    char prod_reason[256];
    char cons_reason[256];
} ring_hdr;

typedef struct seg_hdr {
    uint64_t magic;
    uint64_t world;
    uint64_t ring_bytes;
    uint64_t stride;
} seg_hdr;

struct ts__shm_seg {
    atomic_int refs;
    char name[96];
    char *base;
    size_t size;
    int world;
    size_t ring_bytes, stride;
};

typedef struct shm_link {
    ts__link base;
    ts__shm_seg *mine, *theirs;
    ring_hdr *rx, *tx;
    unsigned char *rxdata, *txdata;
    size_t rxcap, txcap, chunk;
} shm_link;

static size_t env_size(const char *name, size_t def, size_t lo, size_t hi) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v) return def;
    if (*end == 'k' || *end == 'K') x <<= 10;
    else if (*end == 'm' || *end == 'M') x <<= 20;
    return TS_MAX(lo, TS_MIN(hi, (size_t)x));
}

bool ts__pid_alive(int pid) {
    if (pid <= 0) return true;
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return true; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X')) return false;
    return true;
}

static ring_hdr *seg_ring(ts__shm_seg *s, int slot) { return (ring_hdr *)(s->base + HDR_BYTES + (size_t)slot * s->stride); }
static unsigned char *seg_data(ts__shm_seg *s, int slot) { return (unsigned char *)seg_ring(s, slot) + HDR_BYTES; }

ts_status ts__shm_seg_create(int rank, int world, size_t ring_bytes, ts__shm_seg **out, const char **name) {
    static atomic_uint counter;
    ts__shm_seg *s = ts__calloc(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    ring_bytes = (ring_bytes + 4095) & ~(size_t)4095;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(s->name, sizeof s->name, "/tessera-%d-%u-%d-%lx", (int)getpid(), atomic_fetch_add(&counter, 1), rank,
             (unsigned long)ts.tv_nsec);
    s->world = world;
    s->ring_bytes = ring_bytes;
    s->stride = HDR_BYTES + ring_bytes;
    s->size = HDR_BYTES + (size_t)world * s->stride;
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        ts_status st = ts_error(TS_ERR_IO, "shm_open(%s): %s", s->name, strerror(errno));
        free(s);
        return st;
    }
    if (ftruncate(fd, (off_t)s->size) != 0) {
        ts_status st = ts_error(TS_ERR_IO, "ftruncate(%s, %zu): %s", s->name, s->size, strerror(errno));
        close(fd);
        shm_unlink(s->name);
        free(s);
        return st;
    }
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        ts_status st = ts_error(TS_ERR_NOMEM, "mmap(%s, %zu bytes): %s", s->name, s->size, strerror(errno));
        shm_unlink(s->name);
        free(s);
        return st;
    }
    s->base = p;
    seg_hdr *h = (seg_hdr *)p;
    h->world = (uint64_t)world;
    h->ring_bytes = ring_bytes;
    h->stride = s->stride;
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_MAGIC;
    atomic_init(&s->refs, 1);
    *out = s;
    *name = s->name;
    return TS_OK;
}

ts_status ts__shm_seg_open(const char *name, int owner_rank, ts__shm_seg **out) {
    ts__shm_seg *s = ts__calloc(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    snprintf(s->name, sizeof s->name, "%s", name);
    int fd = shm_open(name, O_RDWR, 0600);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || (size_t)sb.st_size < HDR_BYTES) {
        ts_status st = ts_error(TS_ERR_IO, "shared memory of rank %d (%s): %s", owner_rank, name,
                                fd < 0 ? strerror(errno) : "too small");
        if (fd >= 0) close(fd);
        free(s);
        return st;
    }
    s->size = (size_t)sb.st_size;
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        ts_status st = ts_error(TS_ERR_NOMEM, "mmap(%s): %s", name, strerror(errno));
        free(s);
        return st;
    }
    s->base = p;
    const seg_hdr *h = (const seg_hdr *)p;
    if (h->magic != SHM_MAGIC || HDR_BYTES + h->world * h->stride > s->size) {
        munmap(p, s->size);
        free(s);
        return ts_error(TS_ERR_FORMAT, "shared memory %s of rank %d is not a Tessera segment", name, owner_rank);
    }
    s->world = (int)h->world;
    s->ring_bytes = h->ring_bytes;
    s->stride = h->stride;
    atomic_init(&s->refs, 1);
    *out = s;
    return TS_OK;
}

void ts__shm_seg_unlink(ts__shm_seg *s) {
    if (s && s->name[0]) {
        shm_unlink(s->name);
        s->name[0] = 0;
    }
}

void ts__shm_seg_release(ts__shm_seg *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    munmap(s->base, s->size);
    free(s);
}

/* ---- the reduction kernel (also used by tcp.c and builtin.c) ---------------------------------- */
static inline float ldf(const unsigned char *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

void ts__reduce_f32(float *restrict dst, const void *restrict src, size_t n, ts__rop op, float scale) {
    const unsigned char *s = src;
    switch (op) {
    case TS__ROP_SUM:
        if (scale != 1.0f)
            for (size_t i = 0; i < n; i++) dst[i] = (dst[i] + ldf(s + 4 * i)) * scale;
        else
            for (size_t i = 0; i < n; i++) dst[i] += ldf(s + 4 * i);
        return;
    case TS__ROP_MAX:
        for (size_t i = 0; i < n; i++) {
            float v = ldf(s + 4 * i);
            dst[i] = dst[i] > v ? dst[i] : v;
        }
        return;
    case TS__ROP_MIN:
        for (size_t i = 0; i < n; i++) {
            float v = ldf(s + 4 * i);
            dst[i] = dst[i] < v ? dst[i] : v;
        }
        return;
    case TS__ROP_COPY:
        memcpy(dst, src, n * 4);
        return;
    }
}

/* ---- the link ------------------------------------------------------------------------------------ */
static long shm_try_send(ts__link *l, const void *buf, size_t n) {
    shm_link *k = (shm_link *)l;
    ring_hdr *r = k->tx;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    size_t space = k->txcap - (size_t)(head - tail);
    size_t m = TS_MIN(TS_MIN(space, n), k->chunk);
    if (m == 0) return 0;
    size_t off = (size_t)(head % k->txcap), first = TS_MIN(m, k->txcap - off);
    memcpy(k->txdata + off, buf, first);
    if (m > first) memcpy(k->txdata, (const char *)buf + first, m - first);
    atomic_store_explicit(&r->head, head + m, memory_order_release);
    return (long)m;
}

static long shm_try_recv(ts__link *l, void *dst, size_t n, ts__rop op, float scale) {
    shm_link *k = (shm_link *)l;
    ring_hdr *r = k->rx;
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    size_t m = TS_MIN(TS_MIN((size_t)(head - tail), n), k->chunk);
    if (op != TS__ROP_COPY) m &= ~(size_t)3;
    if (m == 0) return 0;
    size_t off = (size_t)(tail % k->rxcap), first = TS_MIN(m, k->rxcap - off);
    unsigned char *d = dst;
    if (op == TS__ROP_COPY) {
        memcpy(d, k->rxdata + off, first);
        if (m > first) memcpy(d + first, k->rxdata, m - first);
    } else {
        size_t whole = first & ~(size_t)3;
        ts__reduce_f32((float *)d, k->rxdata + off, whole / 4, op, scale);
        size_t done = whole, from = 0; /* from: offset at the ring start for the rest */
        if (first != whole) {          /* an element straddles the end of the ring */
            unsigned char tmp[4];
            size_t a = first - whole;
            memcpy(tmp, k->rxdata + off + whole, a);
            memcpy(tmp + a, k->rxdata, 4 - a);
            ts__reduce_f32((float *)(d + whole), tmp, 1, op, scale);
            done += 4;
            from = 4 - a;
        }
        if (m > done) ts__reduce_f32((float *)(d + done), k->rxdata + from, (m - done) / 4, op, scale);
    }
    atomic_store_explicit(&r->tail, tail + m, memory_order_release);
    return (long)m;
}

static ts_status shm_check(ts__link *l) {
    shm_link *k = (shm_link *)l;
    if (atomic_load_explicit(&k->rx->prod_closed, memory_order_acquire))
        return ts_error(TS_ERR_REMOTE, "rank %d closed its connection: %.200s", l->peer, k->rx->prod_reason);
    if (atomic_load_explicit(&k->tx->cons_closed, memory_order_acquire))
        return ts_error(TS_ERR_REMOTE, "rank %d closed its connection: %.200s", l->peer, k->tx->cons_reason);
    int pid = atomic_load(&k->rx->prod_pid);
    if (!pid) pid = atomic_load(&k->tx->cons_pid);
    if (pid && !ts__pid_alive(pid)) return ts_error(TS_ERR_REMOTE, "rank %d (pid %d) is gone", l->peer, pid);
    return TS_OK;
}

static void shm_close(ts__link *l, const char *reason) {
    shm_link *k = (shm_link *)l;
    if (!atomic_load(&k->tx->prod_closed)) {
        snprintf(k->tx->prod_reason, sizeof k->tx->prod_reason, "%s", reason);
        atomic_store_explicit(&k->tx->prod_closed, 1, memory_order_release);
    }
    if (!atomic_load(&k->rx->cons_closed)) {
        snprintf(k->rx->cons_reason, sizeof k->rx->cons_reason, "%s", reason);
        atomic_store_explicit(&k->rx->cons_closed, 1, memory_order_release);
    }
}

static void shm_destroy(ts__link *l) {
    shm_link *k = (shm_link *)l;
    shm_close(l, "it left the process group");
    ts__shm_seg_release(k->mine);
    ts__shm_seg_release(k->theirs);
    free(k);
}

static const ts__link_vt shm_vt = {"shm", shm_try_send, shm_try_recv, shm_check, shm_close, shm_destroy};

ts_status ts__shm_link_new(ts__shm_seg *mine, ts__shm_seg *theirs, int rank, int peer, ts__link **out) {
    if (peer >= mine->world || rank >= theirs->world)
        return ts_error(TS_ERR_INTERNAL, "shm segments sized for %d/%d ranks, not %d/%d", mine->world, theirs->world,
                        peer + 1, rank + 1);
    shm_link *k = ts__calloc(1, sizeof *k);
    if (!k) return TS_ERR_NOMEM;
    k->base.vt = &shm_vt;
    k->base.peer = peer;
    k->base.fd = -1;
    atomic_fetch_add(&mine->refs, 1);
    atomic_fetch_add(&theirs->refs, 1);
    k->mine = mine;
    k->theirs = theirs;
    k->rx = seg_ring(mine, peer);
    k->rxdata = seg_data(mine, peer);
    k->tx = seg_ring(theirs, rank);
    k->txdata = seg_data(theirs, rank);
    k->rxcap = mine->ring_bytes; /* each ring is sized by its consumer */
    k->txcap = theirs->ring_bytes;
    k->chunk = env_size("TS_DIST_SHM_CHUNK", 256u << 10, 4096, TS_MIN(k->rxcap, k->txcap));
    k->chunk &= ~(size_t)63;
    atomic_store(&k->rx->cons_pid, (int)getpid());
    atomic_store(&k->tx->prod_pid, (int)getpid());
    *out = &k->base;
    return TS_OK;
}
