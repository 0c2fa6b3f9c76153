/*
 * distributed/builtin/shm.c — the shared-memory transport: one single-producer,
 * single-consumer byte ring per direction per pair of ranks on one host.
 *
 * Each rank creates one segment — a file in the segment directory (TS_SHM_DIR,
 * default /dev/shm, where shm_open would put it), mmap'ed — holding its
 * incoming rings, one slot per rank on its host (slot = the rank's position
 * among them); peers map it and write into their slot. The owner unlinks the
 * name once every peer has mapped it, so nothing is left in /dev/shm even if a
 * rank is killed later.
 *
 * Space and leaks:
 *  - The whole segment is reserved with posix_fallocate when it is created: a
 *    full tmpfs (Docker's 64 MB /dev/shm) is an error at setup — the caller
 *    then uses TCP for that rank's pairs — never a SIGBUS at the first write
 *    into an unbacked page. ts__shm_pick_ring sizes the rings so that every
 *    rank of the host fits in the directory's free space (the host's first rank
 *    decides; builtin.c), halving them down to 64 KiB with a warning.
 *  - Until it is unlinked, a segment's path is in a registry that a
 *    SIGTERM/SIGINT/SIGHUP handler empties (unlink is async-signal-safe) before
 *    the signal takes its course (the previous disposition: default, or the
 *    application's handler). The handler is installed only while a segment is
 *    registered, and never over SIG_IGN.
 *  - SIGKILL cannot be caught: a new segment first removes segments of dead
 *    processes (the creator's pid is in the name) older than 30 s.
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
#include "core/env.h"
#include "core/half.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x74736873686d3031ull /* "tsshm01" */
#define HDR_BYTES 4096u
#define SHM_PREFIX "tessera-"
#define SHM_PATH_MAX 512
#define STALE_AGE_S 30

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
    char name[96];          /* "tessera-<pid>-<n>-<rank>-<ns>", published to the peers */
    char path[SHM_PATH_MAX]; /* <dir>/<name>; empty once unlinked (or for a peer's segment) */
    int reg;                /* registry slot while the path exists, else -1 */
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

const char *ts__shm_dir(void) {
    return ts_env_str(TS_ENV_SHM_DIR); /* /dev/shm when unset */
}

size_t ts__shm_seg_bytes(int slots, size_t ring_bytes) {
    ring_bytes = (ring_bytes + 4095) & ~(size_t)4095;
    return HDR_BYTES + (size_t)slots * (HDR_BYTES + ring_bytes);
}

/* ---- the cleanup registry: segment paths a terminating signal unlinks ------------------------------ */
#define REG_SLOTS 64
enum { REG_FREE = 0, REG_BUSY, REG_READY };
static struct {
    atomic_int state;
    char path[SHM_PATH_MAX];
} reg_slots[REG_SLOTS];
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static int reg_count;
static const int reg_sigs[] = {SIGTERM, SIGINT, SIGHUP};
static struct sigaction reg_old[3];
static bool reg_ours[3];

static void reg_on_signal(int sig, siginfo_t *info, void *uctx) {
    int saved = errno;
    for (int i = 0; i < REG_SLOTS; i++)
        if (atomic_load(&reg_slots[i].state) == REG_READY) (void)unlink(reg_slots[i].path);
    errno = saved;
    for (int k = 0; k < 3; k++) {
        if (reg_sigs[k] != sig) continue;
        const struct sigaction *o = &reg_old[k];
        if (o->sa_flags & SA_SIGINFO) {
            if (o->sa_sigaction) o->sa_sigaction(sig, info, uctx);
        } else if (o->sa_handler != SIG_DFL && o->sa_handler != SIG_IGN) {
            o->sa_handler(sig);
        } else { /* the default action: terminate, as if we had never been here */
            struct sigaction dfl;
            memset(&dfl, 0, sizeof dfl);
            dfl.sa_handler = SIG_DFL;
            sigemptyset(&dfl.sa_mask);
            sigaction(sig, &dfl, NULL);
            raise(sig); /* blocked while this handler runs: delivered when it returns */
        }
    }
}

static int reg_add(const char *path) {
    pthread_mutex_lock(&reg_mu);
    int slot = -1;
    for (int i = 0; i < REG_SLOTS && slot < 0; i++)
        if (atomic_load(&reg_slots[i].state) == REG_FREE) slot = i;
    if (slot >= 0) {
        atomic_store(&reg_slots[slot].state, REG_BUSY);
        snprintf(reg_slots[slot].path, sizeof reg_slots[slot].path, "%s", path);
        atomic_store(&reg_slots[slot].state, REG_READY);
        if (reg_count++ == 0)
            for (int k = 0; k < 3; k++) {
                struct sigaction cur, act;
                reg_ours[k] = false;
                if (sigaction(reg_sigs[k], NULL, &cur) != 0 || (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN))
                    continue; /* an ignored signal terminates nothing */
                memset(&act, 0, sizeof act);
                act.sa_sigaction = reg_on_signal;
                act.sa_flags = SA_SIGINFO | SA_RESTART;
                sigemptyset(&act.sa_mask);
                reg_old[k] = cur;
                reg_ours[k] = sigaction(reg_sigs[k], &act, NULL) == 0;
            }
    }
    pthread_mutex_unlock(&reg_mu);
    return slot;
}

static void reg_remove(int slot) {
    if (slot < 0) return;
    pthread_mutex_lock(&reg_mu);
    atomic_store(&reg_slots[slot].state, REG_FREE);
    if (--reg_count == 0)
        for (int k = 0; k < 3; k++) {
            struct sigaction cur;
            if (reg_ours[k] && sigaction(reg_sigs[k], NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
                cur.sa_sigaction == reg_on_signal)
                sigaction(reg_sigs[k], &reg_old[k], NULL); /* unless the application replaced ours meanwhile */
            reg_ours[k] = false;
        }
    pthread_mutex_unlock(&reg_mu);
}

/* Removes segments that processes killed with SIGKILL left in dir: "tessera-<pid>-..." files of ours
 * whose pid is gone, older than STALE_AGE_S (a segment's life is setup, seconds). */
static void sweep_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0) continue;
        char *end = NULL;
        long pid = strtol(e->d_name + strlen(SHM_PREFIX), &end, 10);
        if (pid <= 0 || !end || *end != '-' || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
            sb.st_uid != geteuid() || now - sb.st_mtime < STALE_AGE_S)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            ts_log(TS_LOG_INFO, "shared memory: removed %s/%s, left by process %ld that is gone", dir, e->d_name, pid);
    }
    closedir(d);
}

size_t ts__shm_pick_ring(int nlocal, size_t want) {
    const size_t min_ring = 64u << 10;
    want = TS_MAX((want + 4095) & ~(size_t)4095, min_ring);
    const char *dir = ts__shm_dir();
    struct statvfs vf;
    if (statvfs(dir, &vf) != 0) return want; /* creating the segment will say what is wrong */
    double avail = (double)vf.f_bavail * (double)vf.f_frsize * 0.9; /* leave room for others */
    size_t ring = want;
    while (ring > min_ring && (double)nlocal * (double)ts__shm_seg_bytes(nlocal, ring) > avail) ring /= 2;
    ring = TS_MAX(ring, min_ring);
    double need = (double)nlocal * (double)ts__shm_seg_bytes(nlocal, want), got = (double)nlocal * (double)ts__shm_seg_bytes(nlocal, ring);
    if (ring < want && got <= avail)
        ts_log(TS_LOG_WARN, "shared memory: %s has %.1f MiB free, %d ranks on this host need %.1f MiB for %zu KiB "
                            "rings (TS_DIST_SHM_BYTES): using %zu KiB rings (%.1f MiB); a larger %s is faster "
                            "(docker run --shm-size=1g)",
               dir, avail / 0.9 / 1048576.0, nlocal, need / 1048576.0, want >> 10, ring >> 10, got / 1048576.0, dir);
    else if (got > avail)
        ts_log(TS_LOG_WARN, "shared memory: %s has %.1f MiB free, %d ranks on this host need %.1f MiB even with %zu "
                            "KiB rings: ranks that cannot reserve their segment talk over TCP (enlarge %s, e.g. docker "
                            "run --shm-size=1g)",
               dir, avail / 0.9 / 1048576.0, nlocal, got / 1048576.0, ring >> 10, dir);
    return ring;
}

ts_status ts__shm_seg_create(int rank, int slots, size_t ring_bytes, ts__shm_seg **out, const char **name) {
    static atomic_uint counter;
    ts__shm_seg *s = ts__calloc(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    s->reg = -1;
    ring_bytes = (ring_bytes + 4095) & ~(size_t)4095;
    const char *dir = ts__shm_dir();
    sweep_stale(dir);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(s->name, sizeof s->name, SHM_PREFIX "%d-%u-%d-%lx", (int)getpid(), atomic_fetch_add(&counter, 1), rank,
             (unsigned long)ts.tv_nsec);
    if ((size_t)snprintf(s->path, sizeof s->path, "%s/%s", dir, s->name) >= sizeof s->path) {
        free(s);
        return ts_error(TS_ERR_INVALID_ARG, "shared memory: TS_SHM_DIR '%.200s' is too long", dir);
    }
    s->world = slots;
    s->ring_bytes = ring_bytes;
    s->stride = HDR_BYTES + ring_bytes;
    s->size = ts__shm_seg_bytes(slots, ring_bytes);
    /* Registered before it exists: a SIGTERM between open and registration would otherwise leave it behind
     * (the launcher's ranks are often terminated exactly while they create their segments); unlinking a name
     * not created yet is harmless, and the name (pid, counter, clock) is ours alone. */
    s->reg = reg_add(s->path);
    int fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        ts_status st = ts_error(TS_ERR_IO, "shared memory: cannot create %s: %s", s->path, strerror(errno));
        reg_remove(s->reg);
        free(s);
        return st;
    }
    /* Reserve every page now: on a full tmpfs this fails here, instead of a SIGBUS at the first write. */
    int e = posix_fallocate(fd, 0, (off_t)s->size);
    if (e != 0) {
        struct statvfs vf;
        double avail = statvfs(dir, &vf) == 0 ? (double)vf.f_bavail * (double)vf.f_frsize : -1.0;
        ts_status st = ts_error(TS_ERR_NOMEM, "shared memory: cannot reserve %.1f MiB in %s (%.1f MiB free): %s",
                                (double)s->size / 1048576.0, dir, avail / 1048576.0, strerror(e));
        close(fd);
        ts__shm_seg_unlink(s);
        free(s);
        return st;
    }
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        ts_status st = ts_error(TS_ERR_NOMEM, "mmap(%s, %zu bytes): %s", s->path, s->size, strerror(errno));
        ts__shm_seg_unlink(s);
        free(s);
        return st;
    }
    s->base = p;
    seg_hdr *h = (seg_hdr *)p;
    h->world = (uint64_t)slots;
    h->ring_bytes = ring_bytes;
    h->stride = s->stride;
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_MAGIC;
    atomic_init(&s->refs, 1);
    ts_log(TS_LOG_DEBUG, "shared memory: rank %d reserved %zu bytes (%d rings of %zu KiB) at %s", rank, s->size,
           slots, ring_bytes >> 10, s->path);
    *out = s;
    *name = s->name;
    return TS_OK;
}

ts_status ts__shm_seg_open(const char *name, int owner_rank, ts__shm_seg **out) {
    /* a name from the store: one of ours, inside the segment directory */
    if (strncmp(name, SHM_PREFIX, strlen(SHM_PREFIX)) != 0 || strchr(name, '/') || strlen(name) >= 96)
        return ts_error(TS_ERR_REMOTE, "rank %d published '%.100s', not a shared memory segment name", owner_rank, name);
    ts__shm_seg *s = ts__calloc(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    s->reg = -1;
    snprintf(s->name, sizeof s->name, "%s", name);
    char path[SHM_PATH_MAX + 100];
    snprintf(path, sizeof path, "%s/%s", ts__shm_dir(), name);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size < HDR_BYTES) {
        ts_status st = ts_error(TS_ERR_IO, "shared memory of rank %d (%s): %s", owner_rank, path,
                                fd < 0 ? strerror(errno) : "not a segment (too small)");
        if (fd >= 0) close(fd);
        free(s);
        return st;
    }
    s->size = (size_t)sb.st_size;
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        ts_status st = ts_error(TS_ERR_NOMEM, "mmap(%s): %s", path, strerror(errno));
        free(s);
        return st;
    }
    s->base = p;
    const seg_hdr *h = (const seg_hdr *)p;
    if (h->magic != SHM_MAGIC || h->world == 0 || h->world > (1u << 20) || h->ring_bytes == 0 ||
        h->ring_bytes % 4096 || h->ring_bytes > ((uint64_t)1 << 40) || h->stride != HDR_BYTES + h->ring_bytes ||
        ts__shm_seg_bytes((int)h->world, (size_t)h->ring_bytes) > s->size) {
        munmap(p, s->size);
        free(s);
        return ts_error(TS_ERR_FORMAT, "shared memory %s of rank %d is not a Tessera segment", path, owner_rank);
    }
    s->world = (int)h->world;
    s->ring_bytes = h->ring_bytes;
    s->stride = h->stride;
    atomic_init(&s->refs, 1);
    *out = s;
    return TS_OK;
}

void ts__shm_seg_unlink(ts__shm_seg *s) {
    if (s && s->path[0]) {
        unlink(s->path);
        s->path[0] = 0;
    }
    if (s && s->reg >= 0) {
        reg_remove(s->reg);
        s->reg = -1;
    }
}

void ts__shm_seg_release(ts__shm_seg *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    ts__shm_seg_unlink(s); /* normally done at setup; here when setup failed half-way */
    munmap(s->base, s->size);
    free(s);
}

/* ---- the reduction kernel (also used by tcp.c and builtin.c) ---------------------------------- */
static inline float ldf(const unsigned char *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float ldbf(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return ts__bf16_to_f32(v);
}

static inline void stbf(unsigned char *p, float f) {
    uint16_t v = ts__bf16_from_f32(f);
    memcpy(p, &v, sizeof v);
}

/* the sum (DDP's case): one branch-free loop the compiler vectorises, at the CPU's width (clones) */
TS_CLONES static void sum_bf16(unsigned char *restrict d, const unsigned char *restrict s, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) stbf(d + 2 * i, (ldbf(d + 2 * i) + ldbf(s + 2 * i)) * scale);
}

/* bfloat16 elements: combined in float32, rounded back (x 1.0f is exact: the sum path always scales) */
static void reduce_bf16(unsigned char *restrict d, const unsigned char *restrict s, size_t n, ts__rop op, float scale) {
    if (op == TS__ROP_SUM_BF16) {
        sum_bf16(d, s, n, scale);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float a = ldbf(d + 2 * i), b = ldbf(s + 2 * i);
        float v = op == TS__ROP_MAX_BF16 ? (a > b ? a : b) : (a < b ? a : b);
        stbf(d + 2 * i, scale != 1.0f ? v * scale : v);
    }
}

static void reduce_f32(float *restrict dst, const void *restrict src, size_t n, ts__rop op, float scale) {
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
    default:
        return;
    }
}

void ts__reduce(void *restrict dst, const void *restrict src, size_t n, ts__rop op, float scale) {
    if (op == TS__ROP_COPY)
        memcpy(dst, src, n);
    else if (op >= TS__ROP_SUM_BF16)
        reduce_bf16(dst, src, n, op, scale);
    else if (((uintptr_t)dst & 3) == 0)
        reduce_f32(dst, src, n, op, scale);
    else { /* an unaligned destination (never from the collectives, which reduce into float buffers) */
        unsigned char *d = dst;
        for (size_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, d + 4 * i, 4);
            reduce_f32(&v, (const unsigned char *)src + 4 * i, 1, op, scale);
            memcpy(d + 4 * i, &v, 4);
        }
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
    size_t m = TS_MIN(TS_MIN((size_t)(head - tail), n), k->chunk), es = ts__rop_esize(op);
    m -= m % es;
    if (m == 0) return 0;
    size_t off = (size_t)(tail % k->rxcap), first = TS_MIN(m, k->rxcap - off);
    unsigned char *d = dst;
    if (op == TS__ROP_COPY) {
        memcpy(d, k->rxdata + off, first);
        if (m > first) memcpy(d + first, k->rxdata, m - first);
    } else {
        size_t whole = first - first % es;
        ts__reduce(d, k->rxdata + off, whole / es, op, scale);
        size_t done = whole, from = 0; /* from: offset at the ring start for the rest */
        if (first != whole) {          /* an element straddles the end of the ring */
            unsigned char tmp[4];
            size_t a = first - whole;
            memcpy(tmp, k->rxdata + off + whole, a);
            memcpy(tmp + a, k->rxdata, es - a);
            ts__reduce(d + whole, tmp, 1, op, scale);
            done += es;
            from = es - a;
        }
        if (m > done) ts__reduce(d + done, k->rxdata + from, (m - done) / es, op, scale);
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

ts_status ts__shm_link_new(ts__shm_seg *mine, ts__shm_seg *theirs, int my_slot, int peer_slot, int peer,
                           ts__link **out) {
    if (peer_slot < 0 || my_slot < 0 || peer_slot >= mine->world || my_slot >= theirs->world)
        return ts_error(TS_ERR_REMOTE, "shared memory segments of %d and %d slots, rank %d has slot %d, this rank %d",
                        mine->world, theirs->world, peer, peer_slot, my_slot);
    shm_link *k = ts__calloc(1, sizeof *k);
    if (!k) return TS_ERR_NOMEM;
    k->base.vt = &shm_vt;
    k->base.peer = peer;
    k->base.fd = -1;
    atomic_fetch_add(&mine->refs, 1);
    atomic_fetch_add(&theirs->refs, 1);
    k->mine = mine;
    k->theirs = theirs;
    k->rx = seg_ring(mine, peer_slot);
    k->rxdata = seg_data(mine, peer_slot);
    k->tx = seg_ring(theirs, my_slot);
    k->txdata = seg_data(theirs, my_slot);
    k->rxcap = mine->ring_bytes; /* each ring is sized by its consumer */
    k->txcap = theirs->ring_bytes;
    /* about four segments in flight per ring, so reduction overlaps transfer also in small rings */
    size_t cap = TS_MIN(k->rxcap, k->txcap), want = (size_t)ts_env_int(TS_ENV_DIST_SHM_CHUNK); /* 0: unset */
    k->chunk = want ? TS_MIN(cap, want) : TS_MIN((size_t)256u << 10, cap / 4);
    k->chunk &= ~(size_t)63;
    atomic_store(&k->rx->cons_pid, (int)getpid());
    atomic_store(&k->tx->prod_pid, (int)getpid());
    *out = &k->base;
    return TS_OK;
}
