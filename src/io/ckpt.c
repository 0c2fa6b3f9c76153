/*
 * io/ckpt.c — checkpoint files (format in include/tessera/ckpt.h).
 *
 * Saving streams the entries through a running CRC32 into "<path>.tmp.<pid>"
 * and renames it into place only after fsync, so a crash leaves either the old
 * file or the complete new one. Loading also streams (no second copy of the
 * tensors in memory): the header has its own CRC, the file length is checked
 * against the header before any record is parsed, and the whole-file CRC is
 * compared at the end. When a record is malformed the CRC of the whole file is
 * computed first, so a flipped byte reads as "checksum mismatch" wherever it is.
 *
 * Hostile files: only regular files are opened (ts__open_regular: a FIFO or a
 * device is refused, never waited on); every size is checked against the bytes
 * left before anything is allocated (a tensor's non-zero dimensions multiply to
 * at most the bytes left, so shapes and strides cannot overflow); duplicate names
 * are found by sorting once the records are read (not a quadratic scan); names
 * are printed through ts__printable. Saving goes through the library's one atomic
 * writer (core/file.c, ts__atomic_open/close): only a regular file is replaced (a
 * device such as /dev/full, a FIFO or a socket at the path is refused), and
 * "<name>.tmp.<pid>" files that writers killed mid-save left next to it go first.
 */
#include "tensor/tensor.h"
#include "tessera/ckpt.h"

#include "io/ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt.c writes tensors' raw bytes and assumes a little-endian host"
#endif

#define CK_MAGIC "TSCKPT\0\1"
#define CK_HEADER_BYTES 32
#define CK_SECTION_BYTES 16
#define CK_MAX_NAME 65536
#define CK_NKINDS 4

static const char ck_tags[CK_NKINDS][5] = {"TENS", "I64 ", "F64 ", "BLOB"}; /* by ts_ckpt_kind */

typedef struct ck_entry {
    char *name; /* owned */
    union {
        int64_t i;
        double f;
        struct {
            unsigned char *p; /* owned */
            size_t n;
        } b;
        ts_tensor *t; /* owned reference */
    } v;
} ck_entry;

struct ts_ckpt {
    ck_entry *e[CK_NKINDS];
    int n[CK_NKINDS], cap[CK_NKINDS];
    uint32_t version;
};

ts_ckpt *ts_ckpt_new(void) {
    ts_ckpt *ck = ts__calloc(1, sizeof *ck);
    if (ck) ck->version = TS_CKPT_VERSION;
    return ck;
}

static void entry_clear(ts_ckpt_kind k, ck_entry *e) {
    free(e->name);
    if (k == TS_CKPT_BYTES) free(e->v.b.p);
    if (k == TS_CKPT_TENSOR) ts_tensor_release(e->v.t);
}

void ts_ckpt_free(ts_ckpt *ck) {
    if (!ck) return;
    for (int k = 0; k < CK_NKINDS; k++) {
        for (int i = 0; i < ck->n[k]; i++) entry_clear((ts_ckpt_kind)k, &ck->e[k][i]);
        free(ck->e[k]);
    }
    free(ck);
}

uint32_t ts_ckpt_version(const ts_ckpt *ck) { return ck->version; }

static ck_entry *find(const ts_ckpt *ck, ts_ckpt_kind k, const char *name) {
    for (int i = 0; i < ck->n[k]; i++)
        if (strcmp(ck->e[k][i].name, name) == 0) return &ck->e[k][i];
    return NULL;
}

/* Appends an entry with a copy of name (other fields zeroed). */
static ts_status push(ts_ckpt *ck, ts_ckpt_kind k, const char *name, ck_entry **out) {
    if (ck->n[k] == ck->cap[k]) {
        int cap = ck->cap[k] ? ck->cap[k] * 2 : 16;
        ck_entry *ne = realloc(ck->e[k], sizeof *ne * (size_t)cap);
        if (!ne) return ts_error(TS_ERR_NOMEM, "checkpoint: out of memory");
        ck->e[k] = ne;
        ck->cap[k] = cap;
    }
    ck_entry *e = &ck->e[k][ck->n[k]];
    memset(e, 0, sizeof *e);
    if (!(e->name = ts__strdup(name))) return TS_ERR_NOMEM;
    ck->n[k]++;
    *out = e;
    return TS_OK;
}

bool ts_ckpt_has(const ts_ckpt *ck, ts_ckpt_kind kind, const char *name) {
    return ck && name && (int)kind >= 0 && kind < CK_NKINDS && find(ck, kind, name) != NULL;
}

int ts_ckpt_count(const ts_ckpt *ck, ts_ckpt_kind kind) {
    return (ck && (int)kind >= 0 && kind < CK_NKINDS) ? ck->n[kind] : 0;
}

const char *ts_ckpt_name(const ts_ckpt *ck, ts_ckpt_kind kind, int i) {
    if (!ck || (int)kind < 0 || kind >= CK_NKINDS || i < 0 || i >= ck->n[kind]) return NULL;
    return ck->e[kind][i].name;
}

/* ---- tensors ------------------------------------------------------------------------------- */
ts_status ts_ckpt_add_tensors(ts_ckpt *ck, const char *prefix, const ts_tensor_list *l) {
    TS_ARG(ck && l, "ts_ckpt_add_tensors: NULL argument");
    if (!prefix) prefix = "";
    size_t pl = strlen(prefix);
    char **names = ts__calloc((size_t)(l->n ? l->n : 1), sizeof *names);
    if (!names) return TS_ERR_NOMEM;
    ts_status st = TS_OK;
    for (int i = 0; i < l->n && st == TS_OK; i++) {
        if (!l->names[i] || !l->tensors[i]) {
            st = ts_error(TS_ERR_INVALID_ARG, "ts_ckpt_add_tensors: entry %d has no name or tensor", i);
            break;
        }
        size_t nl = strlen(l->names[i]);
        if (pl + nl >= CK_MAX_NAME) {
            st = ts_error(TS_ERR_INVALID_ARG, "ts_ckpt_add_tensors: name '%s%s' is too long", prefix, l->names[i]);
            break;
        }
        if (!(names[i] = ts__malloc(pl + nl + 1))) {
            st = TS_ERR_NOMEM;
            break;
        }
        memcpy(names[i], prefix, pl);
        memcpy(names[i] + pl, l->names[i], nl + 1);
        bool dup = find(ck, TS_CKPT_TENSOR, names[i]) != NULL;
        for (int j = 0; j < i && !dup; j++) dup = strcmp(names[j], names[i]) == 0;
        if (dup) st = ts_error(TS_ERR_INVALID_ARG, "ts_ckpt_add_tensors: duplicate tensor name '%s'", names[i]);
    }
    int added = 0;
    for (int i = 0; i < l->n && st == TS_OK; i++) {
        ck_entry *e = NULL;
        st = push(ck, TS_CKPT_TENSOR, names[i], &e);
        if (st == TS_OK) {
            e->v.t = ts_tensor_retain(l->tensors[i]);
            added++;
        }
    }
    if (st != TS_OK) /* all or nothing */
        for (; added > 0; added--) entry_clear(TS_CKPT_TENSOR, &ck->e[TS_CKPT_TENSOR][--ck->n[TS_CKPT_TENSOR]]);
    for (int i = 0; i < l->n; i++) free(names[i]);
    free(names);
    return st;
}

ts_status ts_ckpt_get_tensors(const ts_ckpt *ck, const char *prefix, ts_tensor_list *out) {
    TS_ARG(ck && out, "ts_ckpt_get_tensors: NULL argument");
    if (!prefix) prefix = "";
    size_t pl = strlen(prefix);
    for (int i = 0; i < ck->n[TS_CKPT_TENSOR]; i++) {
        const ck_entry *e = &ck->e[TS_CKPT_TENSOR][i];
        if (strncmp(e->name, prefix, pl) == 0) TS_TRY(ts_tensor_list_append(out, e->name + pl, e->v.t));
    }
    return TS_OK;
}

ts_tensor *ts_ckpt_find_tensor(const ts_ckpt *ck, const char *name) {
    const ck_entry *e = (ck && name) ? find(ck, TS_CKPT_TENSOR, name) : NULL;
    return e ? e->v.t : NULL;
}

/* ---- metadata ----------------------------------------------------------------------------------- */
static ts_status set_entry(ts_ckpt *ck, ts_ckpt_kind k, const char *name, ck_entry **out) {
    TS_ARG(ck && name, "ts_ckpt_set: NULL argument");
    TS_ARG(strlen(name) < CK_MAX_NAME, "ts_ckpt_set: name is too long (%zu bytes)", strlen(name));
    ck_entry *e = find(ck, k, name);
    if (e) {
        *out = e;
        return TS_OK;
    }
    return push(ck, k, name, out);
}

static ts_status get_entry(const ts_ckpt *ck, ts_ckpt_kind k, const char *name, const ck_entry **out) {
    static const char *kinds[] = {"tensor", "int64", "float64", "bytes"};
    TS_ARG(ck && name, "ts_ckpt_get: NULL argument");
    *out = find(ck, k, name);
    if (!*out) return ts_error(TS_ERR_INVALID_ARG, "checkpoint has no %s entry '%s'", kinds[k], name);
    return TS_OK;
}

ts_status ts_ckpt_set_i64(ts_ckpt *ck, const char *name, int64_t v) {
    ck_entry *e = NULL;
    TS_TRY(set_entry(ck, TS_CKPT_I64, name, &e));
    e->v.i = v;
    return TS_OK;
}

ts_status ts_ckpt_get_i64(const ts_ckpt *ck, const char *name, int64_t *v) {
    const ck_entry *e = NULL;
    TS_ARG(v, "ts_ckpt_get_i64: NULL out");
    TS_TRY(get_entry(ck, TS_CKPT_I64, name, &e));
    *v = e->v.i;
    return TS_OK;
}

ts_status ts_ckpt_set_f64(ts_ckpt *ck, const char *name, double v) {
    ck_entry *e = NULL;
    TS_TRY(set_entry(ck, TS_CKPT_F64, name, &e));
    e->v.f = v;
    return TS_OK;
}

ts_status ts_ckpt_get_f64(const ts_ckpt *ck, const char *name, double *v) {
    const ck_entry *e = NULL;
    TS_ARG(v, "ts_ckpt_get_f64: NULL out");
    TS_TRY(get_entry(ck, TS_CKPT_F64, name, &e));
    *v = e->v.f;
    return TS_OK;
}

ts_status ts_ckpt_set_bytes(ts_ckpt *ck, const char *name, const void *data, size_t len) {
    TS_ARG(data || len == 0, "ts_ckpt_set_bytes: NULL data");
    unsigned char *copy = ts__malloc(len);
    if (!copy) return TS_ERR_NOMEM;
    if (len) memcpy(copy, data, len);
    ck_entry *e = NULL;
    ts_status st = set_entry(ck, TS_CKPT_BYTES, name, &e);
    if (st != TS_OK) {
        free(copy);
        return st;
    }
    free(e->v.b.p);
    e->v.b.p = copy;
    e->v.b.n = len;
    return TS_OK;
}

ts_status ts_ckpt_get_bytes(const ts_ckpt *ck, const char *name, const void **data, size_t *len) {
    const ck_entry *e = NULL;
    TS_ARG(data && len, "ts_ckpt_get_bytes: NULL out");
    TS_TRY(get_entry(ck, TS_CKPT_BYTES, name, &e));
    *data = e->v.b.p;
    *len = e->v.b.n;
    return TS_OK;
}

/* ---- little-endian encoding --------------------------------------------------------------------- */
static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Bytes of one record's payload after its name. */
static uint64_t record_bytes(ts_ckpt_kind k, const ck_entry *e) {
    uint64_t n = 4 + strlen(e->name);
    switch (k) {
    case TS_CKPT_TENSOR: return n + 8 + 8 * (uint64_t)e->v.t->ndim + 8 + ts_tensor_nbytes(e->v.t);
    case TS_CKPT_I64:
    case TS_CKPT_F64: return n + 8;
    case TS_CKPT_BYTES: return n + 8 + e->v.b.n;
    }
    return n;
}

/* ---- save ------------------------------------------------------------------------------------------- */
typedef struct ck_writer {
    FILE *f;
    uLong crc;
    int err; /* errno of the first failure, 0 if none */
} ck_writer;

static void wr(ck_writer *w, const void *p, size_t n) {
    if (w->err || n == 0) return;
    if (fwrite(p, 1, n, w->f) != n) {
        w->err = errno ? errno : EIO;
        return;
    }
    /* crc32 takes uInt lengths */
    for (size_t o = 0; o < n;) {
        uInt c = (uInt)TS_MIN(n - o, (size_t)1 << 30);
        w->crc = crc32(w->crc, (const Bytef *)p + o, c);
        o += c;
    }
}

static void wr32(ck_writer *w, uint32_t v) {
    unsigned char b[4];
    put32(b, v);
    wr(w, b, 4);
}
static void wr64(ck_writer *w, uint64_t v) {
    unsigned char b[8];
    put64(b, v);
    wr(w, b, 8);
}

static void wr_name(ck_writer *w, const char *name) {
    size_t n = strlen(name);
    wr32(w, (uint32_t)n);
    wr(w, name, n);
}

/* Writes the tensor's values in C order; non-CPU or strided tensors go through a host copy. */
static ts_status wr_tensor_data(ck_writer *w, const ts_tensor *t) {
    size_t nb = ts_tensor_nbytes(t);
    if (t->storage->device->host_accessible && ts_tensor_is_contiguous(t)) {
        wr(w, ts__ptr(t), nb);
        return TS_OK;
    }
    void *buf = ts__malloc(nb);
    if (!buf) return TS_ERR_NOMEM;
    ts_status st = ts_tensor_to_host(t, buf, nb);
    if (st == TS_OK) wr(w, buf, nb);
    free(buf);
    return st;
}

ts_status ts_ckpt_check_writable(const char *path) {
    TS_ARG(path && path[0], "ts_ckpt_check_writable: empty path");
    return ts_outfile_check(path, "a checkpoint");
}

ts_status ts_ckpt_save(const ts_ckpt *ck, const char *path) {
    TS_ARG(ck && path && path[0], "ts_ckpt_save: NULL argument");
    char tmp[4096];
    uint64_t file_size = CK_HEADER_BYTES + 4, payload[CK_NKINDS] = {0};
    uint32_t nsec = 0;
    for (int k = 0; k < CK_NKINDS; k++) {
        if (!ck->n[k]) continue;
        for (int i = 0; i < ck->n[k]; i++) payload[k] += record_bytes((ts_ckpt_kind)k, &ck->e[k][i]);
        file_size += CK_SECTION_BYTES + payload[k];
        nsec++;
    }

    ts_status st = TS_OK;
    ck_writer w = {NULL, crc32(0L, Z_NULL, 0), 0};
    TS_TRY(ts__atomic_open(path, "a checkpoint", tmp, sizeof tmp, &w.f));

    unsigned char hdr[CK_HEADER_BYTES];
    memcpy(hdr, CK_MAGIC, 8);
    put32(hdr + 8, TS_CKPT_VERSION);
    put32(hdr + 12, 0);
    put64(hdr + 16, file_size);
    put32(hdr + 24, nsec);
    put32(hdr + 28, (uint32_t)crc32(crc32(0L, Z_NULL, 0), hdr, 28));
    wr(&w, hdr, sizeof hdr);
    for (int k = 0; k < CK_NKINDS && st == TS_OK; k++) {
        if (!ck->n[k]) continue;
        wr(&w, ck_tags[k], 4);
        wr32(&w, (uint32_t)ck->n[k]);
        wr64(&w, payload[k]);
        for (int i = 0; i < ck->n[k] && st == TS_OK && !w.err; i++) {
            const ck_entry *e = &ck->e[k][i];
            wr_name(&w, e->name);
            switch ((ts_ckpt_kind)k) {
            case TS_CKPT_I64: wr64(&w, (uint64_t)e->v.i); break;
            case TS_CKPT_F64: {
                uint64_t bits;
                memcpy(&bits, &e->v.f, 8);
                wr64(&w, bits);
                break;
            }
            case TS_CKPT_BYTES:
                wr64(&w, e->v.b.n);
                wr(&w, e->v.b.p, e->v.b.n);
                break;
            case TS_CKPT_TENSOR: {
                const ts_tensor *t = e->v.t;
                wr32(&w, (uint32_t)t->dtype);
                wr32(&w, (uint32_t)t->ndim);
                for (int d = 0; d < t->ndim; d++) wr64(&w, (uint64_t)t->shape[d]);
                wr64(&w, ts_tensor_nbytes(t));
                st = wr_tensor_data(&w, t);
                if (st != TS_OK) ts__error_prefix(st, "%s: tensor '%s'", path, e->name);
                break;
            }
            }
        }
    }
    if (st == TS_OK) {
        unsigned char b[4];
        put32(b, (uint32_t)w.crc);
        wr(&w, b, 4);
    }
    return ts__atomic_close(path, tmp, w.f, st, w.err);
}

/* ---- load ------------------------------------------------------------------------------------------- */
typedef struct ck_reader {
    FILE *f;
    const char *path;
    uLong crc;
    uint64_t pos, end; /* end: offset of the trailer */
} ck_reader;

/* Reads n bytes of the body; a record running past the trailer is TS_ERR_FORMAT. */
static ts_status rd(ck_reader *r, void *p, uint64_t n) {
    if (n > r->end - r->pos)
        return ts_error(TS_ERR_FORMAT, "%s: malformed: a record at offset %llu runs past the end of the data", r->path,
                        (unsigned long long)r->pos);
    if (n && fread(p, 1, (size_t)n, r->f) != n)
        return ts_error(TS_ERR_IO, "%s: read failed at offset %llu: %s", r->path, (unsigned long long)r->pos,
                        ferror(r->f) ? strerror(errno) : "unexpected end of file");
    for (uint64_t o = 0; o < n;) {
        uInt c = (uInt)TS_MIN(n - o, (uint64_t)1 << 30);
        r->crc = crc32(r->crc, (const Bytef *)p + o, c);
        o += c;
    }
    r->pos += n;
    return TS_OK;
}

static ts_status rd32(ck_reader *r, uint32_t *v) {
    unsigned char b[4];
    TS_TRY(rd(r, b, 4));
    *v = get32(b);
    return TS_OK;
}
static ts_status rd64(ck_reader *r, uint64_t *v) {
    unsigned char b[8];
    TS_TRY(rd(r, b, 8));
    *v = get64(b);
    return TS_OK;
}

/* Skips n bytes, still feeding the CRC. */
static ts_status rd_skip(ck_reader *r, uint64_t n) {
    unsigned char buf[4096];
    while (n) {
        uint64_t c = TS_MIN(n, (uint64_t)sizeof buf);
        TS_TRY(rd(r, buf, c));
        n -= c;
    }
    return TS_OK;
}

static ts_status rd_name(ck_reader *r, char **out) {
    uint32_t n = 0;
    TS_TRY(rd32(r, &n));
    if (n >= CK_MAX_NAME || n > r->end - r->pos)
        return ts_error(TS_ERR_FORMAT, "%s: malformed: name length %u at offset %llu", r->path, n,
                        (unsigned long long)r->pos);
    char *s = ts__malloc((size_t)n + 1);
    if (!s) return TS_ERR_NOMEM;
    ts_status st = rd(r, s, n);
    if (st != TS_OK) {
        free(s);
        return st;
    }
    s[n] = '\0';
    if (strlen(s) != n) {
        free(s);
        return ts_error(TS_ERR_FORMAT, "%s: malformed: name with a NUL byte at offset %llu", r->path,
                        (unsigned long long)r->pos);
    }
    *out = s;
    return TS_OK;
}

static ts_status rd_record(ck_reader *r, ts_ckpt *ck, ts_ckpt_kind k) {
    char *name = NULL;
    TS_TRY(rd_name(r, &name));
    ts_status st = TS_OK;
    ts_tensor *t = NULL;
    ck_entry *e = NULL;
    uint64_t v = 0; /* duplicate names are looked for once every record is read (check_duplicates) */
    switch (k) {
    case TS_CKPT_I64:
    case TS_CKPT_F64:
        TS_CHECK_GOTO(rd64(r, &v));
        TS_CHECK_GOTO(push(ck, k, name, &e));
        if (k == TS_CKPT_I64)
            e->v.i = (int64_t)v;
        else
            memcpy(&e->v.f, &v, 8);
        break;
    case TS_CKPT_BYTES: {
        TS_CHECK_GOTO(rd64(r, &v));
        if (v > r->end - r->pos) {
            char nb[128];
            st = ts_error(TS_ERR_FORMAT, "%s: malformed: blob '%s' at offset %llu claims %llu bytes, %llu are left",
                          r->path, ts__printable(name, nb, sizeof nb), (unsigned long long)r->pos,
                          (unsigned long long)v, (unsigned long long)(r->end - r->pos));
            goto fail;
        }
        unsigned char *p = ts__malloc((size_t)v);
        if (!p) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
        st = rd(r, p, v);
        if (st == TS_OK) st = push(ck, k, name, &e);
        if (st != TS_OK) {
            free(p);
            goto fail;
        }
        e->v.b.p = p;
        e->v.b.n = (size_t)v;
        break;
    }
    case TS_CKPT_TENSOR: {
        uint32_t dt = 0, nd = 0;
        TS_CHECK_GOTO(rd32(r, &dt));
        TS_CHECK_GOTO(rd32(r, &nd));
        if (dt >= TS_DTYPE_COUNT || nd > TS_MAX_DIMS) {
            char nb[128];
            st = ts_error(TS_ERR_FORMAT, "%s: malformed: tensor '%s' at offset %llu has dtype code %u, ndim %u",
                          r->path, ts__printable(name, nb, sizeof nb), (unsigned long long)r->pos, dt, nd);
            goto fail;
        }
        int64_t shape[TS_MAX_DIMS];
        uint64_t prod = 1, nbytes = 0, limit = r->end - r->pos;
        bool empty = false;
        for (uint32_t d = 0; d < nd; d++) {
            TS_CHECK_GOTO(rd64(r, &v));
            shape[d] = (int64_t)v;
            /* the non-zero sizes multiply to at most the bytes left: a (0, 2^40, 2^40) tensor is malformed too */
            uint64_t f = v ? v : 1;
            if (v > limit || prod > limit / f) {
                char nb[128];
                st = ts_error(TS_ERR_FORMAT, "%s: malformed: tensor '%s' has size %llu in dim %u (%llu bytes left)",
                              r->path, ts__printable(name, nb, sizeof nb), (unsigned long long)v, d,
                              (unsigned long long)limit);
                goto fail;
            }
            prod *= f;
            empty |= v == 0;
        }
        uint64_t numel = empty ? 0 : prod;
        TS_CHECK_GOTO(rd64(r, &nbytes));
        if (nbytes != numel * ts_dtype_size((ts_dtype)dt) || nbytes > r->end - r->pos) {
            char nb[128];
            st = ts_error(TS_ERR_FORMAT, "%s: malformed: tensor '%s' at offset %llu claims %llu bytes for %llu "
                                         "elements (%llu bytes left)",
                          r->path, ts__printable(name, nb, sizeof nb), (unsigned long long)r->pos,
                          (unsigned long long)nbytes, (unsigned long long)numel,
                          (unsigned long long)(r->end - r->pos));
            goto fail;
        }
        TS_CHECK_GOTO(ts__new(ts_device_cpu(), (ts_dtype)dt, (int)nd, shape, &t));
        TS_CHECK_GOTO(rd(r, ts__ptr(t), nbytes));
        TS_CHECK_GOTO(push(ck, k, name, &e));
        e->v.t = t;
        t = NULL;
        break;
    }
    }
fail:
    ts_tensor_release(t);
    free(name);
    return st;
}

/* The CRC of the file's first n bytes (to tell corruption from malformed records). */
static bool file_crc(FILE *f, uint64_t n, uLong *out) {
    unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    if (fseek(f, 0, SEEK_SET) != 0) return false;
    while (n) {
        size_t k = (size_t)TS_MIN(n, (uint64_t)sizeof buf);
        if (fread(buf, 1, k, f) != k) return false;
        c = crc32(c, buf, (uInt)k);
        n -= k;
    }
    *out = c;
    return true;
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp((*(const ck_entry *const *)a)->name, (*(const ck_entry *const *)b)->name);
}

/* Two entries of one kind with the same name: sorted once, O(n log n) for any count. */
static ts_status check_duplicates(const ts_ckpt *ck, const char *path) {
    for (int k = 0; k < CK_NKINDS; k++) {
        if (ck->n[k] < 2) continue;
        const ck_entry **v = ts__malloc(sizeof *v * (size_t)ck->n[k]);
        if (!v) return TS_ERR_NOMEM;
        for (int i = 0; i < ck->n[k]; i++) v[i] = &ck->e[k][i];
        qsort(v, (size_t)ck->n[k], sizeof *v, cmp_entry_name);
        ts_status st = TS_OK;
        for (int i = 1; i < ck->n[k] && st == TS_OK; i++)
            if (strcmp(v[i - 1]->name, v[i]->name) == 0) {
                char nb[128];
                st = ts_error(TS_ERR_FORMAT, "%s: malformed: duplicate %s entry '%s'", path, ck_tags[k],
                              ts__printable(v[i]->name, nb, sizeof nb));
            }
        free(v);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

/* Reads a checkpoint of `size` bytes from f (positioned at its start); path names it in messages.
 * meta: tensor sections are skipped by their length (seek) and the whole-file CRC is not compared. */
static ts_status load_stream(FILE *f, uint64_t size, const char *path, bool meta, ts_ckpt **out) {
    ts_status st = TS_OK;
    ts_ckpt *ck = NULL;
    unsigned char hdr[CK_HEADER_BYTES];
    size_t got = fread(hdr, 1, (size_t)TS_MIN(size, (uint64_t)sizeof hdr), f);
    if (got < sizeof hdr && ferror(f)) {
        st = ts_error(TS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        goto fail;
    }
    if (memcmp(hdr, CK_MAGIC, TS_MIN(got, (size_t)8)) != 0) {
        st = ts_error(TS_ERR_FORMAT, "%s: bad magic: not a Tessera checkpoint", path);
        goto fail;
    }
    if (got < sizeof hdr) {
        st = ts_error(TS_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the %d-byte header", path, got,
                      CK_HEADER_BYTES);
        goto fail;
    }
    uint32_t hcrc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), hdr, 28);
    if (hcrc != get32(hdr + 28)) {
        st = ts_error(TS_ERR_FORMAT, "%s: checksum mismatch in the header (stored 0x%08x, computed 0x%08x)", path,
                      get32(hdr + 28), hcrc);
        goto fail;
    }
    uint32_t version = get32(hdr + 8), flags = get32(hdr + 12), nsec = get32(hdr + 24);
    uint64_t want = get64(hdr + 16);
    if (version > TS_CKPT_VERSION || version == 0) {
        st = ts_error(TS_ERR_UNSUPPORTED, "%s: checkpoint format version %u, but this build reads versions 1 to %d",
                      path, version, TS_CKPT_VERSION);
        goto fail;
    }
    if (flags & ~(uint32_t)TS_CKPT_KNOWN_FLAGS) { /* a flag changes how the file reads: never guess */
        st = ts_error(TS_ERR_UNSUPPORTED, "%s: unknown header flag bits 0x%08x (flags 0x%08x; this build knows 0x%08x)",
                      path, flags & ~(uint32_t)TS_CKPT_KNOWN_FLAGS, flags, (uint32_t)TS_CKPT_KNOWN_FLAGS);
        goto fail;
    }
    if (size < want) {
        st = ts_error(TS_ERR_FORMAT, "%s: truncated: the header promises %llu bytes, the file has %llu", path,
                      (unsigned long long)want, (unsigned long long)size);
        goto fail;
    }
    if (size > want || want < CK_HEADER_BYTES + 4) {
        st = ts_error(TS_ERR_FORMAT, "%s: trailing data: the header promises %llu bytes, the file has %llu", path,
                      (unsigned long long)want, (unsigned long long)size);
        goto fail;
    }
    if (!(ck = ts_ckpt_new())) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    ck->version = version;
    ck_reader r = {f, path, crc32(crc32(0L, Z_NULL, 0), hdr, sizeof hdr), CK_HEADER_BYTES, size - 4};
    for (uint32_t s = 0; s < nsec && st == TS_OK; s++) {
        unsigned char tag[4];
        uint32_t count = 0;
        uint64_t bytes = 0;
        uint64_t at = r.pos;
        TS_CHECK_GOTO(rd(&r, tag, 4));
        TS_CHECK_GOTO(rd32(&r, &count));
        TS_CHECK_GOTO(rd64(&r, &bytes));
        if (bytes > r.end - r.pos) {
            st = ts_error(TS_ERR_FORMAT, "%s: malformed: section %u at offset %llu claims %llu bytes, %llu are left",
                          path, s, (unsigned long long)at, (unsigned long long)bytes,
                          (unsigned long long)(r.end - r.pos));
            goto fail;
        }
        int kind = -1;
        for (int k = 0; k < CK_NKINDS; k++)
            if (memcmp(tag, ck_tags[k], 4) == 0) kind = k;
        if (kind < 0) { /* a section from a later minor revision: skip it */
            TS_CHECK_GOTO(rd_skip(&r, bytes));
            continue;
        }
        if (meta && kind == TS_CKPT_TENSOR) { /* the size is within the file (checked above) */
            if (fseeko(f, (off_t)bytes, SEEK_CUR) != 0) {
                st = ts_error(TS_ERR_IO, "%s: seek failed at offset %llu: %s", path, (unsigned long long)r.pos,
                              strerror(errno));
                goto fail;
            }
            r.pos += bytes;
            continue;
        }
        uint64_t start = r.pos;
        for (uint32_t i = 0; i < count; i++) TS_CHECK_GOTO(rd_record(&r, ck, (ts_ckpt_kind)kind));
        if (r.pos - start != bytes) {
            st = ts_error(TS_ERR_FORMAT, "%s: malformed: section '%.4s' at offset %llu holds %llu bytes, its header "
                                         "says %llu",
                          path, ck_tags[kind], (unsigned long long)at, (unsigned long long)(r.pos - start),
                          (unsigned long long)bytes);
            goto fail;
        }
    }
    if (r.pos != r.end) {
        st = ts_error(TS_ERR_FORMAT, "%s: malformed: %llu unused bytes before the checksum", path,
                      (unsigned long long)(r.end - r.pos));
        goto fail;
    }
    unsigned char tb[4];
    if (meta) goto done;
    if (fread(tb, 1, 4, f) != 4) {
        st = ts_error(TS_ERR_IO, "%s: cannot read the checksum: %s", path, strerror(errno));
        goto fail;
    }
    if (get32(tb) != (uint32_t)r.crc) {
        st = ts_error(TS_ERR_FORMAT, "%s: checksum mismatch (stored 0x%08x, computed 0x%08x)", path, get32(tb),
                      (uint32_t)r.crc);
        goto fail;
    }
done:
    TS_CHECK_GOTO(check_duplicates(ck, path));
    *out = ck;
    return TS_OK;
fail:
    if (st == TS_ERR_FORMAT && ck && !meta) {
        /* A malformed record: if the bytes do not match their checksum, say so. */
        uLong c = 0;
        unsigned char tb2[4];
        if (size >= 4 && file_crc(f, size - 4, &c) && fread(tb2, 1, 4, f) == 4 && get32(tb2) != (uint32_t)c)
            st = ts_error(TS_ERR_FORMAT, "%s: checksum mismatch (stored 0x%08x, computed 0x%08x)", path, get32(tb2),
                          (uint32_t)c);
    }
    ts_ckpt_free(ck);
    return st;
}

static ts_status load_file(const char *path, bool meta, ts_ckpt **out) {
    *out = NULL;
    int fd = -1;
    uint64_t size = 0;
    TS_TRY(ts__open_regular(path, "a checkpoint file", &fd, &size));
    char esc[TS__PATH_ESC]; /* load_stream names the file in messages only */
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: cannot open: %s", ts__path(path, esc), strerror(e));
    }
    ts_status st = load_stream(f, size, ts__path(path, esc), meta, out);
    fclose(f);
    return st;
}

ts_status ts_ckpt_load(const char *path, ts_ckpt **out) {
    TS_ARG(path && out, "ts_ckpt_load: NULL argument");
    return load_file(path, false, out);
}

ts_status ts_ckpt_load_meta(const char *path, ts_ckpt **out) {
    TS_ARG(path && out, "ts_ckpt_load_meta: NULL argument");
    return load_file(path, true, out);
}

ts_status ts__ckpt_load_mem(const void *buf, size_t n, const char *name, ts_ckpt **out) {
    TS_ARG((buf || n == 0) && out, "ts__ckpt_load_mem: NULL argument");
    *out = NULL;
    static unsigned char none[1];
    FILE *f = fmemopen(n ? (void *)buf : none, n ? n : 1, "rb");
    if (!f) return ts_error(TS_ERR_NOMEM, "%s: fmemopen: %s", name ? name : "<buffer>", strerror(errno));
    ts_status st = load_stream(f, n, name ? name : "<buffer>", false, out);
    fclose(f);
    return st;
}
