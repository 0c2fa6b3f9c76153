/*
 * tests/golden_io.h — reads the golden-value files written by
 * scripts/gen_golden.py (PyTorch reference values; torch is not needed here).
 * Header-only; every function is static inline.
 *
 * File format ("TSG1"), all integers and data little-endian:
 *
 *   file   := magic[8] = "TSGOLD1\n", u32 count, record * count
 *   record := u32 name_len, name[name_len] (no NUL),
 *             u8 dtype (ts_dtype codes: 0 = f32, 3 = i64, 4 = i32),
 *             u32 ndim, i64 shape[ndim], data[numel * dtype size]
 *
 * Data is in row-major order; ndim 0 is a scalar. A file may be gzip-compressed
 * as a whole: zlib's gzread reads compressed and plain files alike. See
 * scripts/gen_golden.py for what each file holds and how names are formed.
 *
 * Usage:
 *   ts_tensor_list g = TS_TENSOR_LIST_INIT;
 *   if (tg_load(TS_TEST_DIR "/golden/ops.tsg", &g) != TS_OK) ...;
 *   ts_tensor *y = tg_get(&g, "relu:basic/y");     // borrowed; NULL if absent
 *   ts_tensor_list_clear(&g);
 */
#ifndef TS_GOLDEN_IO_H
#define TS_GOLDEN_IO_H

#include "tessera.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define TG_MAGIC "TSGOLD1\n"
#define TG_MAX_NAME 4096

/* Reads exactly n bytes; false on a short read or an error. */
static inline bool tg__read(gzFile f, void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int got = gzread(f, p, chunk);
        if (got <= 0) return false;
        p += got;
        n -= (size_t)got;
    }
    return true;
}

static inline uint32_t tg__u32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline int64_t tg__i64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return (int64_t)v;
}

/* Reads record r of f and appends it to *out. */
static inline ts_status tg__record(gzFile f, const char *path, uint32_t r, ts_tensor_list *out) {
    unsigned char b[8];
    char name[TG_MAX_NAME + 1];
    if (!tg__read(f, b, 4)) return ts_error(TS_ERR_FORMAT, "golden: %s: truncated at record %u", path, r);
    uint32_t nlen = tg__u32(b);
    if (nlen == 0 || nlen > TG_MAX_NAME)
        return ts_error(TS_ERR_FORMAT, "golden: %s: record %u: bad name length %u", path, r, nlen);
    if (!tg__read(f, name, nlen) || !tg__read(f, b, 5))
        return ts_error(TS_ERR_FORMAT, "golden: %s: truncated in record %u", path, r);
    name[nlen] = '\0';
    ts_dtype dt = (ts_dtype)b[0];
    uint32_t ndim = tg__u32(b + 1);
    if ((dt != TS_F32 && dt != TS_I64 && dt != TS_I32) || ndim > TS_MAX_DIMS)
        return ts_error(TS_ERR_FORMAT, "golden: %s: record '%s': bad dtype %d or ndim %u", path, name, (int)b[0],
                        ndim);
    int64_t shape[TS_MAX_DIMS];
    int64_t numel = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (!tg__read(f, b, 8)) return ts_error(TS_ERR_FORMAT, "golden: %s: truncated in '%s'", path, name);
        shape[i] = tg__i64(b);
        if (shape[i] < 0 || shape[i] > ((int64_t)1 << 32))
            return ts_error(TS_ERR_FORMAT, "golden: %s: record '%s': bad shape", path, name);
        numel *= shape[i];
    }
    size_t nbytes = (size_t)numel * ts_dtype_size(dt);
    void *data = malloc(nbytes ? nbytes : 1);
    if (!data) return ts_error(TS_ERR_NOMEM, "golden: out of memory");
    ts_status st = TS_OK;
    ts_tensor *t = NULL;
    /* The file is little-endian; so is every host we build on. */
    if (!tg__read(f, data, nbytes))
        st = ts_error(TS_ERR_FORMAT, "golden: %s: truncated in '%s'", path, name);
    else
        st = ts_tensor_from_data(ts_device_cpu(), dt, (int)ndim, shape, data, &t);
    if (st == TS_OK) st = ts_tensor_list_append(out, name, t);
    ts_tensor_release(t);
    free(data);
    return st;
}

/* Appends every record of the file at `path` to *out (names copied, tensors on
 * the CPU, no requires_grad). On failure *out may hold the records read so far
 * (the caller clears it either way) and the error says which record broke. */
static inline ts_status tg_load(const char *path, ts_tensor_list *out) {
    gzFile f = gzopen(path, "rb");
    if (!f) return ts_error(TS_ERR_IO, "golden: cannot open %s", path);
    ts_status st = TS_OK;
    unsigned char hdr[12];
    if (!tg__read(f, hdr, 12) || memcmp(hdr, TG_MAGIC, 8) != 0) {
        st = ts_error(TS_ERR_FORMAT, "golden: %s: not a TSGOLD1 file", path);
    } else {
        uint32_t count = tg__u32(hdr + 8);
        for (uint32_t r = 0; r < count && st == TS_OK; r++) st = tg__record(f, path, r, out);
    }
    gzclose(f);
    return st;
}

/* The tensor named `name`, or NULL. Borrowed (owned by the list). */
static inline ts_tensor *tg_get(const ts_tensor_list *l, const char *name) { return ts_tensor_list_find(l, name); }

/* tg_get with a printf-style name ("%s/grad_%s"). */
static inline ts_tensor *tg_getf(const ts_tensor_list *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline ts_tensor *tg_getf(const ts_tensor_list *l, const char *fmt, ...) {
    char name[TG_MAX_NAME];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return ts_tensor_list_find(l, name);
}

/* Integer element i of an i64 or i32 tensor (0 when t is NULL or i out of range). */
static inline int64_t tg_int(ts_tensor *t, int64_t i) {
    if (!t || i < 0 || i >= ts_tensor_numel(t)) return 0;
    if (ts_tensor_dtype(t) == TS_I64) return ((const int64_t *)ts_tensor_data(t))[i];
    if (ts_tensor_dtype(t) == TS_I32) return ((const int32_t *)ts_tensor_data(t))[i];
    return (int64_t)ts_tensor_data_f32(t)[i];
}

/* Float element i of an f32 tensor (NAN when t is NULL or i out of range). */
static inline float tg_float(ts_tensor *t, int64_t i) {
    if (!t || i < 0 || i >= ts_tensor_numel(t) || ts_tensor_dtype(t) != TS_F32) return NAN;
    return ts_tensor_data_f32(t)[i];
}

/* ---- comparison ------------------------------------------------------------------------------ */
typedef struct tg_diff {
    double max_abs;   /* largest |got - want| */
    double ratio;     /* largest |got - want| / (atol + rtol |want|); <= 1 passes */
    int64_t worst;    /* flat index of the worst ratio */
    double got, want; /* values there */
    bool shape_ok;
} tg_diff;

/* A copy of t on dev as a new leaf (no autograd history), or t itself (retained) when it is there.
 * Aborts on failure: a test fixture, not a subject. */
static inline ts_tensor *tg_on_device(ts_tensor *t, ts_device *dev) {
    if (ts_tensor_device(t) == dev) return ts_tensor_retain(t);
    ts_tensor *o = NULL;
    if (ts_tensor_empty(dev, ts_tensor_dtype(t), ts_tensor_ndim(t), ts_tensor_shape(t), &o) != TS_OK ||
        ts_tensor_copy_(o, t) != TS_OK) {
        fprintf(stderr, "copying a test tensor to %s: %s\n", ts_device_name(dev), ts_last_error());
        abort();
    }
    return o;
}

/* Compares two f32 tensors element by element (any strides; both read as
 * contiguous copies). A shape mismatch gives shape_ok false and ratio INFINITY;
 * NaN anywhere gives ratio INFINITY. */
static inline tg_diff tg_compare(const ts_tensor *got, const ts_tensor *want, double atol, double rtol) {
    tg_diff d = {0, 0, -1, 0, 0, false};
    int nd = ts_tensor_ndim(got);
    if (nd != ts_tensor_ndim(want) || memcmp(ts_tensor_shape(got), ts_tensor_shape(want), sizeof(int64_t) * (size_t)nd) ||
        ts_tensor_dtype(got) != TS_F32 || ts_tensor_dtype(want) != TS_F32) {
        d.ratio = INFINITY;
        return d;
    }
    d.shape_ok = true;
    int64_t n = ts_tensor_numel(got);
    float *a = malloc(sizeof(float) * (size_t)(n ? n : 1)), *b = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!a || !b || ts_tensor_to_host(got, a, sizeof(float) * (size_t)n) != TS_OK ||
        ts_tensor_to_host(want, b, sizeof(float) * (size_t)n) != TS_OK) {
        d.ratio = INFINITY;
        free(a);
        free(b);
        return d;
    }
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        double r = e / (atol + rtol * fabs((double)b[i]));
        if (isnan(e)) r = e = INFINITY;
        d.max_abs = fmax(d.max_abs, e);
        if (r > d.ratio || d.worst < 0) {
            d.ratio = r;
            d.worst = i;
            d.got = a[i];
            d.want = b[i];
        }
    }
    free(a);
    free(b);
    return d;
}

/* ---- the portable initialiser of cnn_step.tsg.gz (init_uniform() in the script) ------------------ */
static inline uint64_t tg_splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fills dst[0..n) with U(-b, b), b = 1/sqrt(fan_in): element i is
 * float(k - 2^23) * (b * 2^-23) with k the top 24 bits of splitmix64((seed << 32) + i),
 * one float32 rounding, so it matches numpy bit for bit. */
static inline void tg_init_uniform(float *dst, int64_t n, uint64_t seed, int64_t fan_in) {
    float bound = (float)(1.0 / sqrt((double)fan_in));
    float scale = bound * 0x1p-23f;
    for (int64_t i = 0; i < n; i++) {
        int32_t k = (int32_t)(tg_splitmix64((seed << 32) + (uint64_t)i) >> 40);
        dst[i] = (float)(k - (1 << 23)) * scale; /* the conversion is exact: |k - 2^23| <= 2^23 */
    }
}

#endif
