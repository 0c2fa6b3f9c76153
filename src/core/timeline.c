/*
 * core/timeline.c — the timeline recorder (core/timeline.h): complete events
 * from any thread into chunks under one mutex, counters, and the Chrome /
 * Perfetto trace file.
 *
 * File format (Chrome's "JSON Object Format" of the Trace Event Format):
 *   {"traceEvents":[
 *     {"ph":"M","pid":R,"tid":0,"name":"process_name","args":{"name":"rank R"}},   metadata: process and
 *     {"ph":"M","pid":R,"tid":L,"name":"thread_name","args":{"name":"trainer"}},     lane names, sort order
 *     {"ph":"X","pid":R,"tid":L,"name":"backward","cat":"train","ts":1234.567,"dur":89.012,"args":{...}},
 *     ...],
 *    "displayTimeUnit":"ms",
 *    "otherData":{"producer":"tessera","rank":R,"world_size":W,"clock":"CLOCK_MONOTONIC",
 *                 "wall_clock_zero_us":<CLOCK_REALTIME at ts 0, microseconds since 1970>,
 *                 "events":N,"dropped_events":D,"max_events":M}}
 * ts and dur are microseconds (three decimals: nanoseconds) since the recorder
 * started; pid is the rank, tid the lane. `tessera trace merge` lines ranks up
 * by wall_clock_zero_us. When events were dropped, a process_labels entry says
 * so as well, so a viewer shows it.
 */
#include "core/timeline.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#define TL_CHUNK 4096 /* events per chunk */

typedef struct tl_event {
    const char *name;
    const char *key[2];
    int64_t val[2];
    double t0, t1;
    int lane;
} tl_event;

atomic_bool ts__tl_active = false;
_Thread_local bool ts__tl_mine = false;

static pthread_mutex_t tl_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool on;                   /* guarded by tl_mu (ts__tl_active is its unlocked shadow) */
    double zero;               /* ts_time_now() at start */
    double wall_zero_us;       /* CLOCK_REALTIME at zero, microseconds */
    int64_t max, n, dropped;
    tl_event **chunks;         /* ceil(max / TL_CHUNK) pointers, chunks allocated as they fill */
    char *lane_name[TS__TL_MAX_LANES];
    double counter[TS__TL_NUM_COUNTERS];
} tl;

static double realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void clear_locked(void) {
    for (int64_t c = 0; tl.chunks && c < (tl.max + TL_CHUNK - 1) / TL_CHUNK; c++) free(tl.chunks[c]);
    free(tl.chunks);
    for (int i = 0; i < TS__TL_MAX_LANES; i++) free(tl.lane_name[i]);
    memset(&tl, 0, sizeof tl);
}

ts_status ts__tl_start(int64_t max_events) {
    TS_ARG(max_events >= 0 && max_events <= ((int64_t)1 << 32), "ts__tl_start: max_events %lld outside [0, 2^32]",
           (long long)max_events);
    pthread_mutex_lock(&tl_mu);
    if (tl.on) {
        pthread_mutex_unlock(&tl_mu);
        return ts_error(TS_ERR_STATE, "trace: this process already records a timeline (one trace per process: "
                                      "another trainer traces at the same time)");
    }
    clear_locked();
    tl.max = max_events;
    if (max_events > 0 && !(tl.chunks = ts__calloc((size_t)((max_events + TL_CHUNK - 1) / TL_CHUNK), sizeof *tl.chunks))) {
        pthread_mutex_unlock(&tl_mu);
        return TS_ERR_NOMEM;
    }
    /* the wall-clock time of the monotonic zero: read between two monotonic readings */
    double a = ts_time_now(), w = realtime_us(), b = ts_time_now();
    tl.zero = 0.5 * (a + b);
    tl.wall_zero_us = w;
    tl.on = true;
    atomic_store(&ts__tl_active, true);
    ts__tl_mine = true;
    pthread_mutex_unlock(&tl_mu);
    return TS_OK;
}

void ts__tl_stop(void) {
    ts__tl_mine = false;
    pthread_mutex_lock(&tl_mu);
    atomic_store(&ts__tl_active, false);
    clear_locked();
    pthread_mutex_unlock(&tl_mu);
}

void ts__tl_lane(int lane, const char *name) {
    if (!atomic_load_explicit(&ts__tl_active, memory_order_relaxed) || lane < 0 || lane >= TS__TL_MAX_LANES || !name)
        return;
    char *copy = strdup(name); /* plain strdup: tracing stays invisible to allocation-failure injection */
    pthread_mutex_lock(&tl_mu);
    if (tl.on && copy) {
        free(tl.lane_name[lane]);
        tl.lane_name[lane] = copy;
        copy = NULL;
    }
    pthread_mutex_unlock(&tl_mu);
    free(copy);
}

void ts__tl_event(int lane, const char *name, double t0, double t1, const char *k0, int64_t v0, const char *k1,
                  int64_t v1) {
    if (!atomic_load_explicit(&ts__tl_active, memory_order_relaxed) || t0 <= 0.0 || !name || lane < 0 ||
        lane >= TS__TL_MAX_LANES)
        return;
    pthread_mutex_lock(&tl_mu);
    if (tl.on) {
        int64_t c = tl.n / TL_CHUNK;
        if (tl.n < tl.max && !tl.chunks[c]) tl.chunks[c] = malloc(sizeof(tl_event) * TL_CHUNK);
        if (tl.n >= tl.max || !tl.chunks[c]) {
            if (tl.max > 0) tl.dropped++; /* max 0: counters only, events are not wanted */
        } else {
            tl.chunks[c][tl.n % TL_CHUNK] = (tl_event){name, {k0, k1}, {v0, v1}, t0, t1 < t0 ? t0 : t1, lane};
            tl.n++;
        }
    }
    pthread_mutex_unlock(&tl_mu);
}

void ts__tl_span(int lane, const char *name, double t0) {
    if (t0 > 0.0) ts__tl_event(lane, name, t0, ts_time_now(), NULL, 0, NULL, 0);
}

void ts__tl_count(ts__tl_counter c, double v) {
    if (!atomic_load_explicit(&ts__tl_active, memory_order_relaxed) || (int)c < 0 || c >= TS__TL_NUM_COUNTERS)
        return;
    pthread_mutex_lock(&tl_mu);
    if (tl.on) tl.counter[c] += v;
    pthread_mutex_unlock(&tl_mu);
}

double ts__tl_take(ts__tl_counter c) {
    if ((int)c < 0 || c >= TS__TL_NUM_COUNTERS) return 0.0;
    pthread_mutex_lock(&tl_mu);
    double v = tl.counter[c];
    tl.counter[c] = 0.0;
    pthread_mutex_unlock(&tl_mu);
    return v;
}

int64_t ts__tl_events(void) {
    pthread_mutex_lock(&tl_mu);
    int64_t n = tl.n;
    pthread_mutex_unlock(&tl_mu);
    return n;
}

int64_t ts__tl_dropped(void) {
    pthread_mutex_lock(&tl_mu);
    int64_t n = tl.dropped;
    pthread_mutex_unlock(&tl_mu);
    return n;
}

bool ts__tl_rank_path(const char *path, int rank, int world_size, char *buf, size_t n) {
    if (!path || !buf || n == 0) return false;
    if (world_size <= 1) return (size_t)snprintf(buf, n, "%s", path) < n;
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (!dot || (slash && dot < slash) || dot == (slash ? slash + 1 : path)) /* no extension (or a dot file) */
        return (size_t)snprintf(buf, n, "%s.rank%d", path, rank) < n;
    return (size_t)snprintf(buf, n, "%.*s.rank%d%s", (int)(dot - path), path, rank, dot) < n;
}

/* ---- the file ---------------------------------------------------------------------------------------- */
typedef struct tl_buf {
    char *p;
    size_t len, cap;
    bool oom;
} tl_buf;

static void put(tl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(tl_buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)k < b->cap) {
            b->len += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap <= b->len + (size_t)k) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* s as a JSON string (quotes included). */
static void put_str(tl_buf *b, const char *s) {
    put(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            put(b, "\\%c", *c);
        else if (*c < 0x20)
            put(b, "\\u%04x", *c);
        else
            put(b, "%c", *c);
    }
    put(b, "\"");
}

static const char *lane_category(int lane) {
    return lane == TS__TL_TRAINER ? "train" : lane == TS__TL_COMM ? "comm" : "device";
}

static void put_metadata(tl_buf *b, int rank, bool *used) {
    put(b, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}},\n", rank,
        rank);
    put(b, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}},\n", rank,
        rank);
    if (tl.dropped > 0)
        put(b, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_labels\",\"args\":{\"labels\":\"%lld events "
               "dropped (more than %lld recorded)\"}},\n", rank, (long long)tl.dropped, (long long)tl.max);
    for (int l = 0; l < TS__TL_MAX_LANES; l++) {
        if (!used[l] && !tl.lane_name[l]) continue;
        char fallback[32];
        const char *nm = tl.lane_name[l];
        if (!nm) {
            snprintf(fallback, sizeof fallback, l == TS__TL_TRAINER ? "trainer" : l == TS__TL_COMM ? "communication"
                                                                                                   : "device %d",
                     l - TS__TL_DEVICE);
            nm = fallback;
        }
        put(b, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", rank, l);
        put_str(b, nm);
        put(b, "}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}},\n",
            rank, l, l);
    }
}

ts_status ts__tl_write(const char *path, int rank, int world_size) {
    TS_ARG(path, "ts__tl_write: NULL path");
    tl_buf b = {0};
    pthread_mutex_lock(&tl_mu);
    if (!tl.on) {
        pthread_mutex_unlock(&tl_mu);
        return ts_error(TS_ERR_STATE, "trace %s: the timeline recorder is not running", path);
    }
    bool used[TS__TL_MAX_LANES] = {false};
    for (int64_t i = 0; i < tl.n; i++) used[tl.chunks[i / TL_CHUNK][i % TL_CHUNK].lane] = true;
    put(&b, "{\"traceEvents\":[\n");
    put_metadata(&b, rank, used);
    for (int64_t i = 0; i < tl.n && !b.oom; i++) {
        const tl_event *e = &tl.chunks[i / TL_CHUNK][i % TL_CHUNK];
        put(&b, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"cat\":\"%s\",\"ts\":%.3f,\"dur\":%.3f", rank,
            e->lane, e->name, lane_category(e->lane), (e->t0 - tl.zero) * 1e6, (e->t1 - e->t0) * 1e6);
        if (e->key[0] || e->key[1]) {
            put(&b, ",\"args\":{");
            for (int k = 0, first = 1; k < 2; k++)
                if (e->key[k]) {
                    put(&b, "%s\"%s\":%lld", first ? "" : ",", e->key[k], (long long)e->val[k]);
                    first = 0;
                }
            put(&b, "}");
        }
        put(&b, "}%s\n", i + 1 < tl.n ? "," : "");
    }
    if (tl.n == 0 && b.len >= 2 && !b.oom) b.len -= 2; /* the metadata's trailing ",\n" */
    put(&b, "],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"producer\":\"tessera %d.%d.%d\",\"rank\":%d,"
            "\"world_size\":%d,\"clock\":\"CLOCK_MONOTONIC\",\"wall_clock_zero_us\":%.3f,\"events\":%lld,"
            "\"dropped_events\":%lld,\"max_events\":%lld}}\n",
        TS_VERSION_MAJOR, TS_VERSION_MINOR, TS_VERSION_PATCH, rank, world_size, tl.wall_zero_us, (long long)tl.n,
        (long long)tl.dropped, (long long)tl.max);
    pthread_mutex_unlock(&tl_mu);
    ts_status st = b.oom ? ts_error(TS_ERR_NOMEM, "trace %s: out of memory formatting the events", path)
                         : ts__write_file_atomic(path, "a trace", b.p, b.len);
    free(b.p);
    return st;
}
