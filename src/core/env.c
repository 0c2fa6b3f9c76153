/*
 * core/env.c — the registry of Tessera's TS_* environment variables: one row per variable (type, accepted
 * range or names, default, section of docs/env.md, one line of doc) and the typed accessors by id
 * (core/env.h); the public listing is include/tessera/env.h (`tessera env` prints it). The only place in
 * src/ and tools/ that calls getenv on a TS_* name (tests/docs_check.sh checks that, and that docs/env.md
 * has a row for every variable here and none for a variable not here).
 *
 * Adding a variable: an id in core/env.h (in its section's place), a row here, a row in docs/env.md.
 */
#include "core/env.h"
#include "core/internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <strings.h>

enum {
    KF_LIVE = 1,     /* read at every use, parsed again when the text changed; else read once */
    KF_STRICT = 2,   /* a bad value is the reader's error (ts_env_check), not a warning */
    KF_INTERNAL = 4, /* set by `tessera run` for its ranks */
    KF_SECRET = 8,   /* never shown */
    KF_OFF = 16,     /* numbers: 0 and "off" are accepted (0: off) whatever the range */
    KF_CLAMP_LO = 32, /* numbers: a value below the range is taken as its least (with a warning) */
    KF_CLAMP_HI = 64, /* numbers: a value above the range is taken as its largest (with a warning) */
    KF_CLAMP = KF_CLAMP_LO | KF_CLAMP_HI,
};

typedef struct knob {
    const char *name;
    ts_env_type type;
    const char *section;
    const char *names; /* enum: the values' names, ',' between values, '|' between aliases of one value */
    double lo, hi;     /* int, size, double: the accepted range */
    double def;        /* int, size, double, bool, enum (the index): the value when unset or not accepted */
    const char *def_str;      /* string, path: what ts_env_str gives when unset (may be NULL) */
    const char *default_text; /* what unset means, for people */
    const char *values;       /* what is accepted, for people; NULL: made from the type and range */
    unsigned flags;
    const char *doc;
} knob;

#define NUMBERS "Numbers and kernels"
#define DEVICES "Devices and memory"
#define LIMITS "Input limits"
#define DIST "Distributed"
#define LOGGING "Logging"
#define KiB 1024.0
#define MiB (1024.0 * 1024.0)
#define GiB (1024.0 * 1024.0 * 1024.0)

#define ENUM(nm, sec, nms, d, dt, fl, doc) [TS_ENV_##nm] = {"TS_" #nm, TS_ENV_TYPE_ENUM, sec, nms, 0, 0, d, NULL, dt, NULL, fl, doc}
#define NUM(nm, ty, sec, lo, hi, d, dt, vals, fl, doc) [TS_ENV_##nm] = {"TS_" #nm, ty, sec, NULL, lo, hi, d, NULL, dt, vals, fl, doc}
#define KBOOL(nm, sec, d, dt, fl, doc) [TS_ENV_##nm] = {"TS_" #nm, TS_ENV_TYPE_BOOL, sec, NULL, 0, 1, d, NULL, dt, NULL, fl, doc}
#define STR(nm, ty, sec, ds, dt, vals, fl, doc) [TS_ENV_##nm] = {"TS_" #nm, ty, sec, NULL, 0, 0, 0, ds, dt, vals, fl, doc}

static const knob table[TS_ENV_COUNT] = {
    /* ---- Numbers and kernels ---- */
    ENUM(AUTOCAST, NUMBERS, "fp32|float32|f32,bf16|bfloat16", 0, "off; bf16 under tessera train --precision bf16", KF_LIVE,
         "bfloat16 autocast; when set it overrides the choice of tessera train --precision"),
    ENUM(MATMUL_PRECISION, NUMBERS, "fp32|float32|f32,bf16|bfloat16,fp16|float16|f16|half", 0, "fp32", 0,
         "the precision of matrix products (ts_set_matmul_precision)"),
    ENUM(CONV_ALGO, NUMBERS, "auto,im2col,winograd,winograd-f2,winograd-f4,onednn", 0, "auto", 0,
         "the algorithm of CPU convolutions, as --conv-algo"),
    ENUM(GEMM, NUMBERS, "onednn,openblas", 0, "onednn where built", 0, "the CPU's float32 GEMM library"),
    ENUM(CUDNN_ALGO, NUMBERS, "heuristic,find,benchmark", 0, "heuristic", 0,
         "how cuDNN's convolution algorithms are chosen"),
    KBOOL(CUDA_CONV_BF16, NUMBERS, 1, "on", 0,
         "0 keeps CUDA convolutions in float32 under bf16/fp16 precision (A/B measurements)"),
    /* ---- Devices and memory ---- */
    NUM(CPU_DEVICES, TS_ENV_TYPE_INT, DEVICES, 1, 1 << 20, 2, "2", "a count (at most 16 devices are made)", KF_LIVE,
        "virtual CPU devices cpu:0..N-1"),
    NUM(CPU_DEVICE_THREADS, TS_ENV_TYPE_INT, DEVICES, 1, 1 << 20, 0, "cores / devices", NULL, 0,
        "kernel threads of each virtual CPU device"),
    NUM(CPU_CACHE_MB, TS_ENV_TYPE_INT, DEVICES, 0, 1 << 24, 2048, "2048; 0 in sanitizer builds", NULL, 0,
        "MiB the CPU allocator keeps of freed blocks; 0 turns the cache off"),
    NUM(CUDA_CACHE_MB, TS_ENV_TYPE_INT, DEVICES, 0, 1 << 24, -1, "unbounded", NULL, 0,
        "MiB the CUDA caching allocator keeps at most"),
    STR(NVJPEG_LIB, TS_ENV_TYPE_PATH, DEVICES, NULL, "libnvjpeg.so.13 on the loader's path", NULL, 0,
        "the nvJPEG library for --decode mixed (the only one tried when set)"),
    /* ---- Input limits ---- */
    NUM(MAX_IMAGE_PIXELS, TS_ENV_TYPE_SIZE, LIMITS, 1, 1152921504606846976.0, 64 * MiB, "64M", "pixels, at least 1 (k, m, g suffixes)",
        KF_LIVE | KF_CLAMP_HI, "the largest image (pixels) a header may promise"),
    NUM(IDX_MAX_BYTES, TS_ENV_TYPE_SIZE, LIMITS, 0, 281474976710656.0, 16 * GiB, "16g", "bytes, at most 2^48 (k, m, g suffixes)", KF_LIVE | KF_CLAMP_HI,
        "the largest IDX data (bytes) a file may hold"),
    /* ---- Distributed ---- */
    STR(JOB_TOKEN, TS_ENV_TYPE_STRING, DIST, NULL, "none; tessera run makes one", "a secret", KF_LIVE | KF_SECRET,
        "authenticates every TCP connection of a job"),
    KBOOL(ALLOW_UNAUTHENTICATED, DIST, 0, "off: without a token, this host's processes only", KF_LIVE,
          "without a job token, accept TCP connections from other hosts too"),
    NUM(DIST_TIMEOUT, TS_ENV_TYPE_DOUBLE, DIST, 0.1, 1e7, 1800, "1800", NULL, KF_LIVE | KF_STRICT,
        "seconds a rank waits for the others (--timeout)"),
    NUM(HEARTBEAT_TIMEOUT, TS_ENV_TYPE_DOUBLE, DIST, 0.5, 1e7, 30, "30", NULL,
        KF_LIVE | KF_STRICT | KF_OFF, "seconds a peer may be silent while a rank waits on it before the group fails"),
    NUM(HEARTBEAT_INTERVAL, TS_ENV_TYPE_DOUBLE, DIST, 0.01, 3600, -1, "timeout / 10, within 0.05-1", NULL,
        KF_LIVE | KF_STRICT | KF_OFF, "seconds between heartbeats (0: the least, 0.01)"),
    ENUM(DIST_TRANSPORT, DIST, "auto,shm,tcp", TS_ENV_TRANSPORT_AUTO, "auto: shared memory within a host",
         KF_LIVE | KF_STRICT, "tcp makes ranks on one host talk TCP"),
    STR(SOCKET_IFNAME, TS_ENV_TYPE_STRING, DIST, NULL, "the interface that reaches the store",
        "eth0, =eth0, ^docker,lo, eth,ib", KF_LIVE, "which interface carries the TCP links (NCCL_SOCKET_IFNAME's syntax)"),
    STR(DIST_IFADDR, TS_ENV_TYPE_STRING, DIST, NULL, "none", "an address", KF_LIVE,
        "the address to publish when TS_SOCKET_IFNAME is unset"),
    NUM(DIST_RING_THRESHOLD, TS_ENV_TYPE_SIZE, DIST, 0, 281474976710656.0, 256 * KiB, "256k", NULL, KF_LIVE,
        "all-reduces up to this many bytes run recursive doubling, larger ones the ring"),
    NUM(DIST_SHM_BYTES, TS_ENV_TYPE_SIZE, DIST, 64 * KiB, 1099511627776.0, 1 * MiB, "1m", NULL, KF_LIVE | KF_CLAMP,
        "bytes of the shared-memory rings per link"),
    NUM(DIST_SHM_CHUNK, TS_ENV_TYPE_SIZE, DIST, 4 * KiB, 1099511627776.0, 0, "256k, at most a quarter of a ring", NULL,
        KF_LIVE | KF_CLAMP, "the most bytes a transfer moves through a ring at a time"),
    NUM(DIST_SPIN, TS_ENV_TYPE_INT, DIST, 0, 1 << 30, 300, "300", NULL, KF_LIVE,
        "iterations a waiting rank spins before it polls or yields"),
    STR(SHM_DIR, TS_ENV_TYPE_PATH, DIST, "/dev/shm", "/dev/shm", "a folder", KF_LIVE,
        "where the shared-memory segments are made"),
    KBOOL(MPI_CHECK, DIST, 0, "off", KF_LIVE, "the mpi backend checks that ranks agree on each collective's size"),
    NUM(MPI_MAX_COUNT, TS_ENV_TYPE_INT, DIST, 1, INT_MAX - 1.0, INT_MAX, "INT_MAX", NULL, KF_LIVE,
        "the mpi backend's largest piece per call, in elements (for tests)"),
    STR(FLIGHT_RECORDER_DIR, TS_ENV_TYPE_PATH, DIST, NULL, "none: the log only", "a folder", KF_LIVE,
        "where each rank writes its last operations on a failure"),
    STR(RUN_DIR, TS_ENV_TYPE_PATH, DIST, NULL, "set by tessera run", "a folder", KF_LIVE | KF_INTERNAL,
        "where ranks write failure reports for the launcher (tessera run uses a given one)"),
    STR(LAUNCHED_BY, TS_ENV_TYPE_STRING, DIST, NULL, "set by tessera run", "tessera-run", KF_LIVE | KF_INTERNAL,
        "the launcher's mark: who started the rank"),
    NUM(STORE_LISTEN_FD, TS_ENV_TYPE_INT, DIST, 3, INT_MAX, -1, "set by tessera run", "a descriptor", KF_LIVE | KF_INTERNAL,
        "the listening socket rank 0's store serves on"),
    NUM(OUTPUT_TERMINAL, TS_ENV_TYPE_INT, DIST, 0, 3, 0, "set by tessera run", "1 stdout, 2 stderr, 3 both",
        KF_LIVE | KF_INTERNAL, "the rank's output (a pipe) ends on a terminal that redraws \\r lines"),
    /* ---- Logging ---- */
    ENUM(LOG_LEVEL, LOGGING, "debug,info,warn|warning,error,off", TS_LOG_WARN, "warn", 0, "what the library logs"),
};

static const char *const type_names[TS_ENV_TYPE_COUNT] = {"int", "size", "double", "bool", "enum", "string", "path"};

/* ---- parsing -------------------------------------------------------------------------------------- */

typedef struct value {
    bool set, ok;   /* set: non-empty text; ok: it parsed (unset is ok) */
    int64_t i;      /* int, size, bool, enum */
    double d;       /* double */
    char why[160];  /* when !ok, or clamped: what went wrong ("" otherwise) */
} value;

static bool at_end(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    return *p == 0;
}

/* An enum's value: the index of the name (or alias) t matches in any case, -1 when none. */
static int enum_index(const char *names, const char *t) {
    size_t tn = strlen(t);
    int idx = 0;
    for (const char *p = names; *p;) {
        size_t n = strcspn(p, ",|");
        if (n == tn && strncasecmp(p, t, n) == 0) return idx;
        p += n;
        if (*p == ',') idx++;
        if (*p) p++;
    }
    return -1;
}

static bool parse_number(const knob *k, const char *t, double *out) {
    char *end = NULL;
    errno = 0;
    if (k->type == TS_ENV_TYPE_DOUBLE) {
        *out = strtod(t, &end);
        return end != t && errno == 0 && isfinite(*out) && at_end(end);
    }
    while (*t == ' ' || *t == '\t') t++;
    if (k->type == TS_ENV_TYPE_INT) {
        long long x = strtoll(t, &end, 10);
        *out = (double)x;
        return end != t && errno == 0 && at_end(end);
    }
    if (*t == '-' || *t == '+') return false;
    unsigned long long x = strtoull(t, &end, 10);
    if (end == t || errno) return false;
    int sh = 0;
    switch (*end) {
    case 'k': case 'K': sh = 10; break;
    case 'm': case 'M': sh = 20; break;
    case 'g': case 'G': sh = 30; break;
    default: break;
    }
    *out = ldexp((double)x, sh);
    return at_end(end + (sh != 0));
}

static void fmt_num(const knob *k, double v, char *buf, size_t len) {
    if (k->type == TS_ENV_TYPE_SIZE && v >= KiB) {
        static const char sfx[] = "gmk";
        for (int i = 0; i < 3; i++) {
            double unit = ldexp(1.0, 30 - 10 * i);
            if (v >= unit && fmod(v, unit) == 0) {
                snprintf(buf, len, "%.0f%c", v / unit, sfx[i]);
                return;
            }
        }
    }
    if (v == floor(v) && fabs(v) < 1e15) snprintf(buf, len, "%.0f", v);
    else snprintf(buf, len, "%g", v);
}

/* What the variable accepts, for messages and listings. */
static void values_text(const knob *k, char *buf, size_t len) {
    if (k->values) {
        snprintf(buf, len, "%s", k->values);
        return;
    }
    char lo[32], hi[32];
    fmt_num(k, k->lo, lo, sizeof lo);
    fmt_num(k, k->hi, hi, sizeof hi);
    const char *off = k->flags & KF_OFF ? "0 or off, or " : "";
    switch (k->type) {
    case TS_ENV_TYPE_INT: snprintf(buf, len, "%san integer in [%s, %s]", off, lo, hi); return;
    case TS_ENV_TYPE_SIZE: snprintf(buf, len, "%sa count in [%s, %s] (k, m, g suffixes)", off, lo, hi); return;
    case TS_ENV_TYPE_DOUBLE: snprintf(buf, len, "%sa number in [%s, %s]", off, lo, hi); return;
    case TS_ENV_TYPE_BOOL: snprintf(buf, len, "1 or 0 (true/false, yes/no, on/off)"); return;
    case TS_ENV_TYPE_ENUM: break;
    default: snprintf(buf, len, "%s", k->type == TS_ENV_TYPE_PATH ? "a path" : "text"); return;
    }
    /* an enum: the first name of each value, ", " between */
    size_t n = 0;
    buf[0] = 0;
    bool first = true;
    for (const char *p = k->names; *p && n + 1 < len;) {
        size_t w = strcspn(p, ",|");
        if (first) n += (size_t)snprintf(buf + n, len - n, "%s%.*s", n ? ", " : "", (int)w, p);
        p += w;
        first = *p == ',';
        if (*p) p++;
        if (n >= len) n = len - 1;
    }
}

static bool in_range(const knob *k, double v) {
    return (v >= k->lo && v <= k->hi) || ((k->flags & KF_OFF) && v == 0);
}

/* Parses text t (NULL: unset) as variable k into *v. */
static void parse(const knob *k, const char *t, value *v) {
    memset(v, 0, sizeof *v);
    v->set = t && *t;
    v->ok = true;
    v->i = (int64_t)k->def;
    v->d = k->def;
    if (!v->set || k->type == TS_ENV_TYPE_STRING || k->type == TS_ENV_TYPE_PATH) return;
    double x = 0;
    bool ok;
    if (k->type == TS_ENV_TYPE_ENUM) {
        int idx = enum_index(k->names, t);
        ok = idx >= 0;
        x = idx;
    } else if (k->type == TS_ENV_TYPE_BOOL) {
        int idx = enum_index("0|false|no|off,1|true|yes|on", t);
        ok = idx >= 0;
        x = idx;
    } else {
        ok = ((k->flags & KF_OFF) && strcasecmp(t, "off") == 0) || parse_number(k, t, &x);
        bool clamp = ok && !in_range(k, x) && (k->flags & (x < k->lo ? KF_CLAMP_LO : KF_CLAMP_HI));
        if (clamp) {
            char b[32];
            x = x < k->lo ? k->lo : k->hi;
            fmt_num(k, x, b, sizeof b);
            snprintf(v->why, sizeof v->why, "out of range; using %s", b);
        } else if (ok && !in_range(k, x)) {
            ok = false;
        }
    }
    if (!ok) {
        v->ok = false;
        values_text(k, v->why, sizeof v->why);
        return;
    }
    v->i = (int64_t)x;
    v->d = x;
}

/* ---- the cache -------------------------------------------------------------------------------------- */

typedef struct slot {
    atomic_int ready; /* the value below is read (read-once variables: for good) */
    char *raw;        /* the text it was parsed from (NULL: unset) */
    value val;
} slot;

static slot slots[TS_ENV_COUNT];
static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;

static bool same_text(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

/* The variable's value now (live) or as first read; *text: the string form (for strings and paths). */
static value lookup(ts_env_id id, const char **text) {
    const knob *k = &table[id];
    slot *s = &slots[id];
    bool live = k->flags & KF_LIVE;
    if (!live && atomic_load_explicit(&s->ready, memory_order_acquire)) {
        if (text) *text = s->raw;
        return s->val;
    }
    char warn[512] = "";
    pthread_mutex_lock(&env_mu);
    const char *e = getenv(k->name);
    if (e && !*e) e = NULL;
    if (!atomic_load_explicit(&s->ready, memory_order_relaxed) || (live && !same_text(e, s->raw))) {
        free(s->raw);
        s->raw = e ? strdup(e) : NULL;
        parse(k, e, &s->val);
        if (s->val.why[0] && !(k->flags & KF_STRICT && !s->val.ok)) {
            char dflt[64];
            if (s->val.ok) dflt[0] = 0;
            else snprintf(dflt, sizeof dflt, "; using the default (%s)", k->default_text);
            snprintf(warn, sizeof warn, "%s='%.100s': %s%s%s", k->name, e, s->val.ok ? "" : "expected ", s->val.why,
                     dflt);
        }
        atomic_store_explicit(&s->ready, 1, memory_order_release);
    }
    value v = s->val;
    if (text) *text = live ? e : s->raw;
    pthread_mutex_unlock(&env_mu);
    if (warn[0]) ts_log(TS_LOG_WARN, "%s", warn); /* outside the lock: the logger reads TS_LOG_LEVEL through here */
    return v;
}

/* ---- accessors -------------------------------------------------------------------------------------- */

static const knob *knob_of(ts_env_id id, ts_env_type want, ts_env_type or_also) {
    TS_ASSERT((int)id >= 0 && id < TS_ENV_COUNT, "ts_env: id %d", (int)id);
    const knob *k = &table[id];
    TS_ASSERT(k->type == want || k->type == or_also, "%s is a %s variable", k->name, type_names[k->type]);
    return k;
}

const char *ts_env_name(ts_env_id id) { return (int)id >= 0 && id < TS_ENV_COUNT ? table[id].name : "TS_(unknown)"; }

bool ts_env_is_set(ts_env_id id) { return lookup(id, NULL).set; }

ts_status ts_env_check(ts_env_id id) {
    const char *t = NULL;
    value v = lookup(id, &t);
    if (v.ok) return TS_OK;
    /* a live string's pointer is the environment's, read again under no lock: the text parsed is in raw */
    pthread_mutex_lock(&env_mu);
    char shown[104];
    snprintf(shown, sizeof shown, "%.100s", slots[id].raw ? slots[id].raw : "");
    pthread_mutex_unlock(&env_mu);
    return ts_error(TS_ERR_INVALID_ARG, "environment variable %s='%s' is not accepted: expected %s", table[id].name,
                    shown, v.why);
}

int64_t ts_env_int(ts_env_id id) {
    const knob *k = knob_of(id, TS_ENV_TYPE_INT, TS_ENV_TYPE_SIZE);
    value v = lookup(id, NULL);
    return v.ok ? v.i : (int64_t)k->def;
}

double ts_env_double(ts_env_id id) {
    const knob *k = knob_of(id, TS_ENV_TYPE_DOUBLE, TS_ENV_TYPE_DOUBLE);
    value v = lookup(id, NULL);
    return v.ok ? v.d : k->def;
}

bool ts_env_bool(ts_env_id id) {
    const knob *k = knob_of(id, TS_ENV_TYPE_BOOL, TS_ENV_TYPE_BOOL);
    value v = lookup(id, NULL);
    return (v.ok ? v.i : (int64_t)k->def) != 0;
}

int ts_env_enum(ts_env_id id) {
    const knob *k = knob_of(id, TS_ENV_TYPE_ENUM, TS_ENV_TYPE_ENUM);
    value v = lookup(id, NULL);
    return (int)(v.ok ? v.i : (int64_t)k->def);
}

const char *ts_env_str(ts_env_id id) {
    const knob *k = knob_of(id, TS_ENV_TYPE_STRING, TS_ENV_TYPE_PATH);
    const char *t = NULL;
    lookup(id, &t);
    return t ? t : k->def_str;
}

/* ---- the public listing (tessera/env.h) --------------------------------------------------------------- */

static char values_buf[TS_ENV_COUNT][160];
static pthread_once_t values_once = PTHREAD_ONCE_INIT;

static void values_init(void) {
    for (int i = 0; i < TS_ENV_COUNT; i++) values_text(&table[i], values_buf[i], sizeof values_buf[i]);
}

int ts_env_count(void) { return TS_ENV_COUNT; }

ts_status ts_env_info_get(int index, ts_env_info *out) {
    TS_ARG(out, "ts_env_info_get: NULL argument");
    TS_ARG(index >= 0 && index < TS_ENV_COUNT, "ts_env_info_get: index %d is not in [0, %d)", index, TS_ENV_COUNT);
    pthread_once(&values_once, values_init);
    const knob *k = &table[index];
    *out = (ts_env_info){k->name,           k->type,   type_names[k->type],
                         k->section,        values_buf[index], k->default_text,
                         k->doc,            (k->flags & KF_INTERNAL) != 0, (k->flags & KF_LIVE) != 0,
                         (k->flags & KF_SECRET) != 0};
    return TS_OK;
}

ts_status ts_env_find(const char *name, int *index) {
    TS_ARG(name && index, "ts_env_find: NULL argument");
    for (int i = 0; i < TS_ENV_COUNT; i++)
        if (strcmp(table[i].name, name) == 0) {
            *index = i;
            return TS_OK;
        }
    return ts_error(TS_ERR_INVALID_ARG, "'%s' is not one of Tessera's environment variables (tessera env lists them)",
                    name);
}

bool ts_env_value_text(int index, char *buf, size_t len) {
    if (len) buf[0] = 0;
    if (index < 0 || index >= TS_ENV_COUNT) return false;
    const char *e = getenv(table[index].name);
    if (!(e && *e)) return false;
    if (len) snprintf(buf, len, "%s", table[index].flags & KF_SECRET ? "(set, hidden)" : e);
    return true;
}

ts_status ts_env_validate(int index) {
    TS_ARG(index >= 0 && index < TS_ENV_COUNT, "ts_env_validate: index %d is not in [0, %d)", index, TS_ENV_COUNT);
    const knob *k = &table[index];
    const char *e = getenv(k->name);
    value v;
    parse(k, e, &v);
    if (v.ok) return TS_OK;
    return ts_error(TS_ERR_INVALID_ARG, "environment variable %s='%.100s' is not accepted: expected %s%s", k->name,
                    k->flags & KF_SECRET ? "(hidden)" : e, v.why,
                    k->flags & KF_STRICT ? " (an error where it is read)" : "; the default is used");
}

void ts_env_reload(void) {
    pthread_mutex_lock(&env_mu);
    for (int i = 0; i < TS_ENV_COUNT; i++) {
        atomic_store(&slots[i].ready, 0);
        free(slots[i].raw);
        slots[i].raw = NULL;
    }
    pthread_mutex_unlock(&env_mu);
}
