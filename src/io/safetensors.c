/*
 * io/safetensors.c — safetensors files (format and dtype table in include/tessera/safetensors.h).
 *
 * Writing builds the JSON header in memory exactly as the Python library (its Rust core,
 * safetensors/src/tensor.rs: `prepare` sorts by dtype, largest first, then by name) lays it
 * out — "__metadata__" first, then the tensors in data order, no spaces, serde_json's string
 * escapes, spaces up to a multiple of 8 — then streams the tensors through the atomic writer
 * ts_ckpt_save uses (io/ckpt_internal.h). Files re-saved from what safetensors 0.8 wrote are
 * byte-identical to it (names with control characters, quotes, UTF-8; metadata with one key: the
 * library orders several keys by a HashMap, so its own files differ from run to run there).
 *
 * Reading under hostile input, in this order, before any tensor is allocated:
 *   1. the 8-byte length N: at most TS_SAFETENSORS_MAX_HEADER and within the file;
 *   2. the N header bytes: valid UTF-8 (no overlong forms, surrogates or code points past
 *      U+10FFFF), then one JSON object read by core/json.h's strict reader: strings with every
 *      JSON escape (surrogate pairs joined, \u0000 refused since names are C strings), integers
 *      for shapes and offsets (non-negative, below 2^63, no fraction or exponent), other values
 *      of a tensor's entry skipped (nesting at most 64), only whitespace after the object;
 *   3. per tensor: a known dtype that Tessera can hold, at most TS_MAX_DIMS dimensions, the
 *      non-zero sizes multiplying to at most the data's bytes (2^40 for an empty tensor), and
 *      numel x size == end - begin;
 *   4. no duplicate names (sorted once), and the tensors sorted by offset covering the data
 *      [0, file size - 8 - N) exactly, as the Python library's Metadata::validate demands.
 * Then the data is read in offset order (one pass, no seeking), converting dtypes Tessera
 * lacks in 64 KiB chunks. Names reach messages through ts__printable.
 */
#include "tensor/tensor.h"
#include "tessera/safetensors.h"

#include "io/ckpt_internal.h"
#include "io/safetensors_internal.h"

#include "core/json.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes tensors' raw bytes and assumes a little-endian host"
#endif

#define ST_MAX_DEPTH 64             /* nesting of the header's JSON values */
#define ST_EMPTY_LIMIT ((uint64_t)1 << 40) /* non-zero sizes of an empty tensor multiply to at most this */
#define ST_CHUNK 65536

/* ---- dtypes -------------------------------------------------------------------------------------------- */
typedef struct st_dtype {
    const char *name;
    int rank;  /* the Python library's Dtype order (writing sorts by it, largest first) */
    int size;  /* bytes per element (0: not byte-sized) */
    int to;    /* the ts_dtype it is read as, -1: unsupported */
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"BOOL", 0, 1, TS_U8},       {"U8", 1, 1, TS_U8},          {"I8", 2, 1, TS_I32},      {"F8_E5M2", 3, 1, -1},
    {"F8_E4M3", 4, 1, -1},       {"I16", 5, 2, TS_I32},        {"U16", 6, 2, TS_I32},     {"F16", 7, 2, TS_F16},
    {"BF16", 8, 2, TS_BF16},     {"I32", 9, 4, TS_I32},        {"U32", 10, 4, TS_I64},    {"F32", 11, 4, TS_F32},
    {"F64", 12, 8, TS_F32},      {"I64", 13, 8, TS_I64},       {"U64", 14, 8, TS_I64},    {"F4", -1, 0, -1},
    {"F6_E2M3", -1, 0, -1},      {"F6_E3M2", -1, 0, -1},       {"F8_E8M0", -1, 1, -1},    {"C64", -1, 8, -1},
};
enum { ST_BOOL = 0, ST_U8 = 1, ST_I8 = 2, ST_I16 = 5, ST_U16 = 6, ST_F16 = 7, ST_BF16 = 8, ST_I32 = 9,
       ST_U32 = 10, ST_F32 = 11, ST_F64 = 12, ST_I64 = 13, ST_U64 = 14 };

/* The safetensors dtype a Tessera dtype is written as (index into st_dtypes). */
static int st_of_ts(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return ST_F32;
    case TS_F16: return ST_F16;
    case TS_BF16: return ST_BF16;
    case TS_I64: return ST_I64;
    case TS_I32: return ST_I32;
    case TS_U8: return ST_U8;
    default: return -1;
    }
}

/* ---- the metadata map --------------------------------------------------------------------------------- */
ts_status ts_safetensors_meta_set(ts_safetensors_meta *m, const char *key, const char *value) {
    TS_ARG(m && key && value, "ts_safetensors_meta_set: NULL argument");
    char *v = ts__strdup(value);
    if (!v) return TS_ERR_NOMEM;
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) {
            free(m->values[i]);
            m->values[i] = v;
            return TS_OK;
        }
    char *k = ts__strdup(key);
    if (!k) {
        free(v);
        return TS_ERR_NOMEM;
    }
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 8;
        char **nk = ts__realloc(m->keys, sizeof *nk * (size_t)cap);
        if (nk) m->keys = nk;
        char **nv = nk ? ts__realloc(m->values, sizeof *nv * (size_t)cap) : NULL;
        if (nv) m->values = nv;
        if (!nk || !nv) {
            free(k);
            free(v);
            return TS_ERR_NOMEM;
        }
        m->cap = cap;
    }
    m->keys[m->n] = k;
    m->values[m->n++] = v;
    return TS_OK;
}

const char *ts_safetensors_meta_get(const ts_safetensors_meta *m, const char *key) {
    if (!m || !key) return NULL;
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) return m->values[i];
    return NULL;
}

void ts_safetensors_meta_clear(ts_safetensors_meta *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        free(m->keys[i]);
        free(m->values[i]);
    }
    free(m->keys);
    free(m->values);
    *m = TS_SAFETENSORS_META_INIT;
}

/* ---- JSON output ----------------------------------------------------------------------------------------- */
typedef struct st_buf {
    char *p;
    size_t n, cap;
    bool oom;
} st_buf;

static void buf_put(st_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = ts__realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void buf_str(st_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_u64(st_buf *b, uint64_t v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    buf_put(b, tmp, (size_t)n);
}

/* s as a JSON string, escaped as serde_json escapes: '"', '\\', and control characters
 * (\b \t \n \f \r, others \u00XX); everything else (UTF-8 included) as is. */
static void buf_json_string(st_buf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\t': e = "\\t"; break;
        case '\n': e = "\\n"; break;
        case '\f': e = "\\f"; break;
        case '\r': e = "\\r"; break;
        default: break;
        }
        if (e) {
            buf_str(b, e);
        } else if (c < 0x20) {
            char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
            buf_put(b, u, 6);
        } else {
            buf_put(b, (const char *)p, 1);
        }
    }
    buf_put(b, "\"", 1);
}

/* ---- save ------------------------------------------------------------------------------------------------ */
typedef struct st_order {
    const char *name;
    int rank;
    int index;
} st_order;

/* Largest dtype first, then by name (bytewise), as the Python library writes. */
static int cmp_order(const void *a, const void *b) {
    const st_order *x = a, *y = b;
    if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_order_name(const void *a, const void *b) {
    return strcmp(((const st_order *)a)->name, ((const st_order *)b)->name);
}

/* Checks l's names and dtypes and meta's strings; *order gets l's indices in file order. */
static ts_status save_check(const char *path, const ts_tensor_list *l, const ts_safetensors_meta *meta,
                            st_order **order) {
    char nb[128];
    size_t bad = 0;
    st_order *o = ts__calloc((size_t)(l->n ? l->n : 1), sizeof *o);
    if (!o) return TS_ERR_NOMEM;
    ts_status st = TS_OK;
    for (int i = 0; i < l->n && st == TS_OK; i++) {
        const char *name = l->names[i];
        if (!name || !l->tensors[i])
            st = ts_error(TS_ERR_INVALID_ARG, "%s: entry %d has no name or tensor", path, i);
        else if (!name[0])
            st = ts_error(TS_ERR_INVALID_ARG, "%s: entry %d has an empty name", path, i);
        else if (strcmp(name, "__metadata__") == 0)
            st = ts_error(TS_ERR_INVALID_ARG, "%s: a tensor cannot be named '__metadata__' (the header's metadata key)",
                          path);
        else if (!ts__utf8_valid((const unsigned char *)name, strlen(name), &bad))
            st = ts_error(TS_ERR_INVALID_ARG, "%s: tensor name '%s' is not valid UTF-8 (byte %zu)", path,
                          ts__printable(name, nb, sizeof nb), bad);
        else if (st_of_ts(ts_tensor_dtype(l->tensors[i])) < 0)
            st = ts_error(TS_ERR_DTYPE, "%s: tensor '%s' has dtype %s, which safetensors cannot hold", path,
                          ts__printable(name, nb, sizeof nb), ts_dtype_name(ts_tensor_dtype(l->tensors[i])));
        else
            o[i] = (st_order){name, st_dtypes[st_of_ts(ts_tensor_dtype(l->tensors[i]))].rank, i};
    }
    if (st == TS_OK && l->n > 1) {
        qsort(o, (size_t)l->n, sizeof *o, cmp_order_name);
        for (int i = 1; i < l->n && st == TS_OK; i++)
            if (strcmp(o[i - 1].name, o[i].name) == 0)
                st = ts_error(TS_ERR_INVALID_ARG, "%s: duplicate tensor name '%s'", path,
                              ts__printable(o[i].name, nb, sizeof nb));
    }
    for (int i = 0; meta && i < meta->n && st == TS_OK; i++) {
        const char *k = meta->keys[i], *v = meta->values[i];
        if (!k || !v)
            st = ts_error(TS_ERR_INVALID_ARG, "%s: metadata entry %d has no key or value", path, i);
        else if (!ts__utf8_valid((const unsigned char *)k, strlen(k), &bad) ||
                 !ts__utf8_valid((const unsigned char *)v, strlen(v), &bad))
            st = ts_error(TS_ERR_INVALID_ARG, "%s: metadata '%s' is not valid UTF-8", path,
                          ts__printable(k, nb, sizeof nb));
    }
    if (st != TS_OK) {
        free(o);
        return st;
    }
    qsort(o, (size_t)l->n, sizeof *o, cmp_order);
    *order = o;
    return TS_OK;
}

/* The header (padded) for the tensors in `order`. */
static ts_status save_header(const char *path, const ts_tensor_list *l, const ts_safetensors_meta *meta,
                             const st_order *order, st_buf *b) {
    buf_str(b, "{");
    bool first = true;
    if (meta && meta->n) {
        buf_str(b, "\"__metadata__\":{");
        for (int i = 0; i < meta->n; i++) {
            if (i) buf_str(b, ",");
            buf_json_string(b, meta->keys[i]);
            buf_str(b, ":");
            buf_json_string(b, meta->values[i]);
        }
        buf_str(b, "}");
        first = false;
    }
    uint64_t off = 0;
    for (int k = 0; k < l->n; k++) {
        const ts_tensor *t = l->tensors[order[k].index];
        if (!first) buf_str(b, ",");
        first = false;
        buf_json_string(b, order[k].name);
        buf_str(b, ":{\"dtype\":\"");
        buf_str(b, st_dtypes[st_of_ts(ts_tensor_dtype(t))].name);
        buf_str(b, "\",\"shape\":[");
        for (int d = 0; d < ts_tensor_ndim(t); d++) {
            if (d) buf_str(b, ",");
            buf_u64(b, (uint64_t)ts_tensor_shape(t)[d]);
        }
        buf_str(b, "],\"data_offsets\":[");
        buf_u64(b, off);
        buf_str(b, ",");
        off += ts_tensor_nbytes(t);
        buf_u64(b, off);
        buf_str(b, "]}");
    }
    buf_str(b, "}");
    while (!b->oom && b->n % 8) buf_str(b, " ");
    if (b->oom) return ts_error(TS_ERR_NOMEM, "%s: out of memory building the header", path);
    if (b->n > TS_SAFETENSORS_MAX_HEADER)
        return ts_error(TS_ERR_INVALID_ARG, "%s: the header would be %zu bytes, more than the format's %d", path, b->n,
                        TS_SAFETENSORS_MAX_HEADER);
    return TS_OK;
}

/* Writes t's values in C order; non-CPU or strided tensors go through a host copy. */
static ts_status save_data(FILE *f, const ts_tensor *t, int *werr) {
    size_t nb = ts_tensor_nbytes(t);
    if (*werr || nb == 0) return TS_OK;
    if (t->storage->device->host_accessible && ts_tensor_is_contiguous(t)) {
        if (fwrite(ts__ptr(t), 1, nb, f) != nb) *werr = errno ? errno : EIO;
        return TS_OK;
    }
    void *tmp = ts__malloc(nb);
    if (!tmp) return TS_ERR_NOMEM;
    ts_status st = ts_tensor_to_host(t, tmp, nb);
    if (st == TS_OK && fwrite(tmp, 1, nb, f) != nb) *werr = errno ? errno : EIO;
    free(tmp);
    return st;
}

ts_status ts_safetensors_save(const char *path, const ts_tensor_list *l, const ts_safetensors_meta *meta) {
    TS_ARG(path && path[0] && l, "ts_safetensors_save: NULL argument");
    st_order *order = NULL;
    TS_TRY(save_check(path, l, meta, &order));
    st_buf b = {NULL, 0, 0, false};
    ts_status st = save_header(path, l, meta, order, &b);
    FILE *f = NULL;
    char tmp[4096];
    if (st == TS_OK) st = ts__atomic_open(path, "a safetensors file", tmp, sizeof tmp, &f);
    if (st != TS_OK) {
        free(b.p);
        free(order);
        return st;
    }
    int werr = 0;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
    if (fwrite(len, 1, 8, f) != 8 || fwrite(b.p, 1, b.n, f) != b.n) werr = errno ? errno : EIO;
    for (int k = 0; k < l->n && st == TS_OK && !werr; k++) {
        st = save_data(f, l->tensors[order[k].index], &werr);
        if (st != TS_OK) {
            char nb[128];
            ts__error_prefix(st, "%s: tensor '%s'", path, ts__printable(order[k].name, nb, sizeof nb));
        }
    }
    free(b.p);
    free(order);
    return ts__atomic_close(path, tmp, f, st, werr);
}

/* ---- JSON input (core/json.h's reader) ----------------------------------------------------------------- */
typedef struct st_entry {
    char *name; /* owned */
    int dt;     /* index into st_dtypes */
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

typedef struct st_parser {
    ts__json j; /* over the header; errors read "<path>: malformed header: ... at byte N of M" */
    const char *path;
    uint64_t data_len;
    st_entry *e;
    int ne, cap;
    ts_safetensors_meta *meta; /* where "__metadata__" goes (the loader's own map) */
    bool seen_meta;
} st_parser;

static ts_status syntax(st_parser *p, const char *what) { return ts__json_error(&p->j, "%s", what); }

/* Appends (k, v) to m, taking both (freed on failure); no lookup: duplicates are found by sorting. */
static ts_status meta_push(ts_safetensors_meta *m, char *k, char *v) {
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 8;
        char **nk = ts__realloc(m->keys, sizeof *nk * (size_t)cap);
        if (nk) m->keys = nk;
        char **nv = nk ? ts__realloc(m->values, sizeof *nv * (size_t)cap) : NULL;
        if (nv) m->values = nv;
        if (!nk || !nv) {
            free(k);
            free(v);
            return TS_ERR_NOMEM;
        }
        m->cap = cap;
    }
    m->keys[m->n] = k;
    m->values[m->n++] = v;
    return TS_OK;
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* "__metadata__": null or {"key": "value", ...} (string values only; no duplicate keys) into p->meta. */
static ts_status parse_meta(st_parser *p) {
    if (p->seen_meta) return syntax(p, "a second \"__metadata__\"");
    p->seen_meta = true;
    ts__json *j = &p->j;
    if (ts__json_peek(j) == TS__JSON_LITERAL && j->n - j->pos >= 4 && memcmp(j->s + j->pos, "null", 4) == 0) {
        j->pos += 4;
        return TS_OK;
    }
    if (ts__json_peek(j) != TS__JSON_OBJECT) return syntax(p, "\"__metadata__\" is not an object");
    TS_TRY(ts__json_enter(j, '{'));
    ts_safetensors_meta *m = p->meta;
    ts_status st = TS_OK;
    bool more = true;
    for (bool first = true; st == TS_OK; first = false) {
        st = ts__json_next(j, '}', first, &more);
        if (st != TS_OK || !more) break;
        char *k = NULL, *v = NULL;
        st = ts__json_key(j, &k);
        if (st == TS_OK && ts__json_peek(j) != TS__JSON_STRING) st = syntax(p, "a \"__metadata__\" value is not a string");
        if (st == TS_OK) st = ts__json_string(j, &v);
        if (st == TS_OK) {
            st = meta_push(m, k, v);
        } else {
            free(k);
            free(v);
        }
    }
    if (st != TS_OK || m->n < 2) return st;
    char **keys = ts__malloc(sizeof *keys * (size_t)m->n);
    if (!keys) return TS_ERR_NOMEM;
    memcpy(keys, m->keys, sizeof *keys * (size_t)m->n);
    qsort(keys, (size_t)m->n, sizeof *keys, cmp_str_ptr);
    for (int i = 1; i < m->n && st == TS_OK; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            char nb[128];
            st = ts_error(TS_ERR_FORMAT, "%s: malformed header: duplicate \"__metadata__\" key '%s'", p->path,
                          ts__printable(keys[i], nb, sizeof nb));
        }
    free(keys);
    return st;
}

static ts_status entry_error(st_parser *p, ts_status s, const char *name, const char *fmt, const char *arg) {
    char nb[128], msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return ts_error(s, "%s: tensor '%s': %s", p->path, ts__printable(name, nb, sizeof nb), msg);
}

/* "dtype": a known name that Tessera can hold, into e->dt. */
static ts_status parse_dtype(st_parser *p, st_entry *e) {
    char *dt = NULL;
    TS_TRY(ts__json_string(&p->j, &dt));
    e->dt = -1;
    for (int i = 0; i < (int)TS_ARRAY_LEN(st_dtypes); i++)
        if (strcmp(dt, st_dtypes[i].name) == 0) e->dt = i;
    ts_status st = TS_OK;
    char db[64];
    if (e->dt < 0)
        st = entry_error(p, TS_ERR_FORMAT, e->name, "unknown dtype '%s'", ts__printable(dt, db, sizeof db));
    else if (st_dtypes[e->dt].to < 0)
        st = entry_error(p, TS_ERR_UNSUPPORTED, e->name,
                         "dtype %s has no Tessera equivalent (supported: F32, F16, BF16, F64, I64, I32, I16, I8, U64, "
                         "U32, U16, U8, BOOL)",
                         dt);
    free(dt);
    return st;
}

/* "shape" (which 1) or "data_offsets" (2): an array of integers below 2^63 into e. */
static ts_status parse_ints(st_parser *p, st_entry *e, int which) {
    uint64_t v[TS_MAX_DIMS + 1];
    int k = 0;
    const char *what = which == 1 ? "shape" : "data_offsets";
    if (ts__json_peek(&p->j) != TS__JSON_ARRAY)
        return entry_error(p, TS_ERR_FORMAT, e->name, "\"%s\" is not an array", what);
    TS_TRY(ts__json_enter(&p->j, '['));
    for (bool first = true, more;; first = false) {
        TS_TRY(ts__json_next(&p->j, ']', first, &more));
        if (!more) break;
        TS_TRY(ts__json_u64(&p->j, (uint64_t)INT64_MAX, what, &v[k]));
        if (++k == TS_MAX_DIMS + 1) {
            char lim[16];
            snprintf(lim, sizeof lim, "%d", which == 1 ? TS_MAX_DIMS : 2);
            return entry_error(p, which == 1 ? TS_ERR_UNSUPPORTED : TS_ERR_FORMAT, e->name,
                               which == 1 ? "more than %s dimensions (Tessera's limit)"
                                          : "\"data_offsets\" holds more than %s integers",
                               lim);
        }
    }
    if (which == 1) {
        e->ndim = k;
        for (int d = 0; d < k; d++) e->shape[d] = (int64_t)v[d];
        return TS_OK;
    }
    if (k != 2)
        return entry_error(p, TS_ERR_FORMAT, e->name, "%s", "\"data_offsets\" must hold exactly two integers [begin, end]");
    e->begin = v[0];
    e->end = v[1];
    return TS_OK;
}

/* One tensor's entry: {"dtype": ..., "shape": [...], "data_offsets": [b, e], other fields skipped}. */
static ts_status parse_entry(st_parser *p, st_entry *e) {
    static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
    if (ts__json_peek(&p->j) != TS__JSON_OBJECT)
        return entry_error(p, TS_ERR_FORMAT, e->name, "%s", "its entry is not an object");
    TS_TRY(ts__json_enter(&p->j, '{'));
    bool have[3] = {false, false, false};
    for (bool first = true, more;; first = false) {
        TS_TRY(ts__json_next(&p->j, '}', first, &more));
        if (!more) break;
        char *key = NULL;
        TS_TRY(ts__json_key(&p->j, &key));
        int which = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(key, fields[i]) == 0) which = i;
        free(key);
        if (which < 0) {
            TS_TRY(ts__json_skip(&p->j));
            continue;
        }
        if (have[which]) return entry_error(p, TS_ERR_FORMAT, e->name, "duplicate field \"%s\"", fields[which]);
        have[which] = true;
        TS_TRY(which == 0 ? parse_dtype(p, e) : parse_ints(p, e, which));
    }
    for (int i = 0; i < 3; i++)
        if (!have[i]) return entry_error(p, TS_ERR_FORMAT, e->name, "missing field \"%s\"", fields[i]);
    return TS_OK;
}

/* A new entry named name (taking it) at the end of p->e. */
static ts_status new_entry(st_parser *p, char *name, st_entry **out) {
    if (p->ne == p->cap) {
        int cap = p->cap ? p->cap * 2 : 64;
        st_entry *ne = ts__realloc(p->e, sizeof *ne * (size_t)cap);
        if (!ne) {
            free(name);
            return TS_ERR_NOMEM;
        }
        p->e = ne;
        p->cap = cap;
    }
    st_entry *e = &p->e[p->ne++];
    memset(e, 0, sizeof *e);
    e->name = name;
    *out = e;
    return TS_OK;
}

/* The whole header: one object, then only whitespace. */
static ts_status parse_header(st_parser *p) {
    if (ts__json_peek(&p->j) != TS__JSON_OBJECT) return syntax(p, "the header is not a JSON object");
    TS_TRY(ts__json_enter(&p->j, '{'));
    for (bool first = true, more;; first = false) {
        TS_TRY(ts__json_next(&p->j, '}', first, &more));
        if (!more) break;
        char *name = NULL;
        TS_TRY(ts__json_key(&p->j, &name));
        if (strcmp(name, "__metadata__") == 0) {
            free(name);
            TS_TRY(parse_meta(p));
            continue;
        }
        st_entry *e = NULL;
        TS_TRY(new_entry(p, name, &e));
        if (!name[0]) /* the Python library accepts "" as a name; Tessera's state dicts cannot hold it */
            return ts_error(TS_ERR_FORMAT, "%s: a tensor has an empty name", p->path);
        TS_TRY(parse_entry(p, e));
    }
    return ts__json_end(&p->j, "the header's object");
}

/* ---- checks on the parsed entries ---------------------------------------------------------------------- */
static int cmp_entry_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

static int cmp_entry_offset(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Sizes against the data, duplicates, and exact coverage; *sorted gets the entries by offset. */
static ts_status check_entries(st_parser *p, st_entry ***sorted) {
    char nb[128], sb[160];
    st_entry **v = ts__malloc(sizeof *v * (size_t)(p->ne ? p->ne : 1));
    if (!v) return TS_ERR_NOMEM;
    ts_status st = TS_OK;
    for (int i = 0; i < p->ne && st == TS_OK; i++) {
        st_entry *e = &p->e[i];
        v[i] = e;
        uint64_t prod = 1, limit = p->data_len;
        bool empty = false;
        for (int d = 0; d < e->ndim; d++) empty |= e->shape[d] == 0;
        if (empty) limit = ST_EMPTY_LIMIT;
        for (int d = 0; d < e->ndim && st == TS_OK; d++) {
            uint64_t f = e->shape[d] ? (uint64_t)e->shape[d] : 1;
            if (f > limit || prod > limit / f)
                st = ts_error(TS_ERR_FORMAT, "%s: tensor '%s': shape %s is larger than the file's %llu bytes of data",
                              p->path, ts__printable(e->name, nb, sizeof nb), ts_shape_str(e->ndim, e->shape, sb, sizeof sb),
                              (unsigned long long)p->data_len);
            prod *= f;
        }
        if (st != TS_OK) break;
        uint64_t esz = (uint64_t)st_dtypes[e->dt].size;
        uint64_t want = empty ? 0 : prod > UINT64_MAX / esz ? UINT64_MAX : prod * esz;
        if (e->end < e->begin || e->end - e->begin != want)
            st = ts_error(TS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] hold %s%llu bytes, but %s %s needs %llu",
                          p->path, ts__printable(e->name, nb, sizeof nb), (unsigned long long)e->begin,
                          (unsigned long long)e->end, e->end < e->begin ? "-" : "",
                          (unsigned long long)(e->end < e->begin ? e->begin - e->end : e->end - e->begin),
                          st_dtypes[e->dt].name, ts_shape_str(e->ndim, e->shape, sb, sizeof sb), (unsigned long long)want);
    }
    if (st == TS_OK && p->ne > 1) {
        qsort(v, (size_t)p->ne, sizeof *v, cmp_entry_name);
        for (int i = 1; i < p->ne && st == TS_OK; i++)
            if (strcmp(v[i - 1]->name, v[i]->name) == 0)
                st = ts_error(TS_ERR_FORMAT, "%s: malformed header: duplicate tensor name '%s'", p->path,
                              ts__printable(v[i]->name, nb, sizeof nb));
    }
    if (st == TS_OK) {
        qsort(v, (size_t)p->ne, sizeof *v, cmp_entry_offset);
        uint64_t at = 0;
        for (int i = 0; i < p->ne && st == TS_OK; i++) {
            if (v[i]->begin != at)
                st = ts_error(TS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] %s byte %llu of the data "
                                             "(tensors must cover it without gaps or overlaps)",
                              p->path, ts__printable(v[i]->name, nb, sizeof nb), (unsigned long long)v[i]->begin,
                              (unsigned long long)v[i]->end, v[i]->begin > at ? "leave a gap before" : "overlap",
                              (unsigned long long)(v[i]->begin > at ? at : v[i]->begin));
            at = v[i]->end;
        }
        if (st == TS_OK && at != p->data_len)
            st = ts_error(TS_ERR_FORMAT, "%s: the tensors cover %llu bytes of data, the file holds %llu after the header%s",
                          p->path, (unsigned long long)at, (unsigned long long)p->data_len,
                          at > p->data_len ? " (truncated?)" : " (trailing bytes)");
    }
    if (st != TS_OK) {
        free(v);
        return st;
    }
    *sorted = v;
    return TS_OK;
}

/* ---- data -------------------------------------------------------------------------------------------------- */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0 && m == 0) {
        bits = sign;
    } else if (e == 0) { /* subnormal: normalise */
        int shift = 0;
        while (!(m & 0x400)) m <<= 1, shift++;
        bits = sign | (uint32_t)(127 - 15 + 1 - shift) << 23 | (m & 0x3ff) << 13;
    } else if (e == 31) {
        bits = sign | 0x7f800000u | m << 13;
    } else {
        bits = sign | (e + 127 - 15) << 23 | m << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Converts n elements of safetensors dtype `from` at src into dst (ts dtype `to`); false when a
 * U64 value does not fit int64. */
static bool convert(const unsigned char *src, size_t n, int from, void *dst) {
    for (size_t i = 0; i < n; i++) {
        const unsigned char *s = src + i * (size_t)st_dtypes[from].size;
        switch (from) {
        case ST_BOOL: ((uint8_t *)dst)[i] = s[0] != 0; break;
        case ST_I8: ((int32_t *)dst)[i] = (int8_t)s[0]; break;
        case ST_I16: {
            int16_t x;
            memcpy(&x, s, 2);
            ((int32_t *)dst)[i] = x;
            break;
        }
        case ST_U16: {
            uint16_t x;
            memcpy(&x, s, 2);
            ((int32_t *)dst)[i] = x;
            break;
        }
        case ST_U32: {
            uint32_t x;
            memcpy(&x, s, 4);
            ((int64_t *)dst)[i] = x;
            break;
        }
        case ST_U64: {
            uint64_t x;
            memcpy(&x, s, 8);
            if (x > (uint64_t)INT64_MAX) return false;
            ((int64_t *)dst)[i] = (int64_t)x;
            break;
        }
        case ST_F64: {
            double x;
            memcpy(&x, s, 8);
            ((float *)dst)[i] = (float)x;
            break;
        }
        case ST_F16: {
            uint16_t x;
            memcpy(&x, s, 2);
            ((float *)dst)[i] = f16_to_f32(x);
            break;
        }
        case ST_BF16: {
            uint16_t x;
            memcpy(&x, s, 2);
            uint32_t bits = (uint32_t)x << 16;
            memcpy((float *)dst + i, &bits, 4);
            break;
        }
        default: return false; /* not reached: read_tensor converts only the dtypes above */
        }
    }
    return true;
}

static ts_status read_bytes(FILE *f, const char *path, void *p, size_t n) {
    if (n && fread(p, 1, n, f) != n)
        return ts_error(TS_ERR_IO, "%s: read failed: %s", path, ferror(f) ? strerror(errno) : "unexpected end of file");
    return TS_OK;
}

/* The ts_dtype entry e is read as. */
static ts_dtype target_dtype(const st_entry *e, unsigned flags) {
    if ((flags & TS_SAFETENSORS_F32) && (e->dt == ST_F16 || e->dt == ST_BF16)) return TS_F32;
    return (ts_dtype)st_dtypes[e->dt].to;
}

/* Whether e's bytes are the tensor's bytes as they are (else convert() runs). */
static bool is_direct(const st_entry *e, unsigned flags) {
    ts_dtype to = target_dtype(e, flags);
    return (e->dt == ST_F32 && to == TS_F32) || e->dt == ST_I64 || e->dt == ST_I32 || e->dt == ST_U8 ||
           (e->dt == ST_F16 && to == TS_F16) || (e->dt == ST_BF16 && to == TS_BF16);
}

/* Reads e's bytes (the stream is at its begin) into a new tensor. */
static ts_status read_tensor(FILE *f, const char *path, const st_entry *e, unsigned flags, unsigned char *chunk,
                             ts_tensor **out) {
    ts_dtype to = target_dtype(e, flags);
    ts_tensor *t = NULL;
    TS_TRY(ts__new(ts_device_cpu(), to, e->ndim, e->shape, &t));
    ts_status st = TS_OK;
    size_t esz = (size_t)st_dtypes[e->dt].size, nbytes = (size_t)(e->end - e->begin);
    if (is_direct(e, flags)) {
        st = read_bytes(f, path, ts__ptr(t), nbytes);
    } else {
        size_t per = ST_CHUNK / esz, done = 0, n = nbytes / esz;
        unsigned char *dst = ts__ptr(t);
        size_t osz = ts_dtype_size(to);
        while (done < n && st == TS_OK) {
            size_t k = TS_MIN(per, n - done);
            st = read_bytes(f, path, chunk, k * esz);
            if (st == TS_OK && !convert(chunk, k, e->dt, dst + done * osz)) {
                char nb[128];
                st = ts_error(TS_ERR_FORMAT, "%s: tensor '%s': a U64 value does not fit int64", path,
                              ts__printable(e->name, nb, sizeof nb));
            }
            done += k;
        }
    }
    if (st != TS_OK) {
        ts_tensor_release(t);
        return st;
    }
    *out = t;
    return TS_OK;
}

/* ---- load ------------------------------------------------------------------------------------------------- */
static ts_status load_stream(FILE *f, uint64_t size, const char *path, unsigned flags, ts_tensor_list *out,
                             ts_safetensors_meta *meta) {
    unsigned char lb[8];
    if (size < 8)
        return ts_error(TS_ERR_FORMAT, "%s: truncated: %llu bytes, shorter than the 8-byte header length", path,
                        (unsigned long long)size);
    TS_TRY(read_bytes(f, path, lb, 8));
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++) hn |= (uint64_t)lb[i] << (8 * i);
    if (hn > TS_SAFETENSORS_MAX_HEADER)
        return ts_error(TS_ERR_FORMAT, "%s: header length %llu is above the format's limit of %d bytes (not a "
                                       "safetensors file?)",
                        path, (unsigned long long)hn, TS_SAFETENSORS_MAX_HEADER);
    if (hn > size - 8)
        return ts_error(TS_ERR_FORMAT, "%s: truncated: the header length is %llu bytes, the file has %llu after it",
                        path, (unsigned long long)hn, (unsigned long long)(size - 8));
    ts_status st = TS_OK;
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    st_parser p = {.path = path, .data_len = size - 8 - hn, .meta = &m};
    st_entry **sorted = NULL;
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    unsigned char *chunk = NULL;
    char *hdr = ts__malloc((size_t)hn + 1);
    if (!hdr) return TS_ERR_NOMEM;
    TS_CHECK_GOTO(read_bytes(f, path, hdr, (size_t)hn));
    hdr[hn] = '\0';
    ts__json_init(&p.j, hdr, (size_t)hn, path, "malformed header", ST_MAX_DEPTH);
    size_t bad = 0;
    if (!ts__utf8_valid((const unsigned char *)hdr, (size_t)hn, &bad)) {
        st = ts_error(TS_ERR_FORMAT, "%s: malformed header: invalid UTF-8 at byte %zu", path, bad);
        goto fail;
    }
    if (memchr(hdr, '\0', (size_t)hn)) { /* JSON has no raw NUL; say so plainly */
        p.j.pos = (size_t)((char *)memchr(hdr, '\0', (size_t)hn) - hdr);
        st = syntax(&p, "NUL byte in the header");
        goto fail;
    }
    TS_CHECK_GOTO(parse_header(&p));
    TS_CHECK_GOTO(check_entries(&p, &sorted));
    int nf64 = 0;
    for (int i = 0; i < p.ne; i++) {
        const st_entry *e = sorted[i];
        if (!is_direct(e, flags) && !chunk && !(chunk = ts__malloc(ST_CHUNK))) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
        ts_tensor *t = NULL;
        TS_CHECK_GOTO(read_tensor(f, path, e, flags, chunk, &t));
        st = ts_tensor_list_append(&l, e->name, t);
        ts_tensor_release(t);
        if (st != TS_OK) goto fail;
        nf64 += e->dt == ST_F64;
    }
    if (nf64) ts_log(TS_LOG_INFO, "%s: %d float64 tensor%s read as float32", path, nf64, nf64 == 1 ? "" : "s");
    /* hand over: nothing is appended to out or meta before this point */
    int n0 = out->n;
    for (int i = 0; i < l.n && st == TS_OK; i++) st = ts_tensor_list_append(out, l.names[i], l.tensors[i]);
    if (meta && meta->n == 0 && st == TS_OK) { /* the usual case: hand the map over */
        ts_safetensors_meta_clear(meta);
        *meta = m;
        m = TS_SAFETENSORS_META_INIT;
    }
    for (int i = 0; meta && i < m.n && st == TS_OK; i++) st = ts_safetensors_meta_set(meta, m.keys[i], m.values[i]);
    if (st != TS_OK) { /* out of memory: undo */
        for (int i = n0; i < out->n; i++) {
            free(out->names[i]);
            ts_tensor_release(out->tensors[i]);
        }
        out->n = n0;
    }
fail:
    for (int i = 0; i < p.ne; i++) free(p.e[i].name);
    free(p.e);
    free(sorted);
    free(chunk);
    free(hdr);
    ts_tensor_list_clear(&l);
    ts_safetensors_meta_clear(&m);
    return st;
}

ts_status ts_safetensors_load(const char *path, unsigned flags, ts_tensor_list *out, ts_safetensors_meta *meta) {
    TS_ARG(path && out, "ts_safetensors_load: NULL argument");
    int fd = -1;
    uint64_t size = 0;
    TS_TRY(ts__open_regular(path, "a safetensors file", &fd, &size));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    ts_status st = load_stream(f, size, path, flags, out, meta);
    fclose(f);
    return st;
}

ts_status ts__safetensors_load_mem(const void *buf, size_t n, const char *name, unsigned flags, ts_tensor_list *out,
                                   ts_safetensors_meta *meta) {
    TS_ARG((buf || n == 0) && out, "ts__safetensors_load_mem: NULL argument");
    static unsigned char none[1];
    FILE *f = fmemopen(n ? (void *)buf : none, n ? n : 1, "rb");
    if (!f) return ts_error(TS_ERR_NOMEM, "%s: fmemopen: %s", name ? name : "<buffer>", strerror(errno));
    ts_status st = load_stream(f, n, name ? name : "<buffer>", flags, out, meta);
    fclose(f);
    return st;
}

bool ts_safetensors_probe(const char *path) {
    int fd = -1;
    uint64_t size = 0;
    if (!path || ts__open_regular(path, NULL, &fd, &size) != TS_OK) {
        ts_clear_error();
        return false;
    }
    unsigned char b[9];
    bool ok = size >= 10 && read(fd, b, 9) == 9;
    close(fd);
    if (!ok) return false;
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++) hn |= (uint64_t)b[i] << (8 * i);
    return hn >= 2 && hn <= TS_SAFETENSORS_MAX_HEADER && b[8] == '{'; /* a truncated file too: loading says so */
}
