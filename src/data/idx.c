/*
 * data/idx.c — the IDX file format (MNIST, Fashion-MNIST), plain or gzip.
 *
 * Layout (big-endian): u32 magic = 0x0000 | dtype (0x08: unsigned byte) << 8 |
 * ndim, then ndim u32 dimensions, then prod(dims) elements. zlib's gzread reads
 * plain files transparently, so one path serves both; whether a file is gzip is
 * decided by its content, not its name.
 *
 * Sizes are checked before the payload is allocated: a plain file must hold
 * exactly header + prod(dims) bytes; a gzip file cannot expand more than
 * deflate's 1032:1, so prod(dims) may be at most 1032 times its size; and either
 * must stay under TS_IDX_MAX_BYTES (default 16 GiB). So a 40-byte .gz whose
 * header claims 256 GiB is refused at once, naming both sizes. A gzip member
 * must end with its trailer (CRC-32 and length, which zlib verifies): one cut
 * off after the payload is refused as truncated. Only regular
 * files are opened (a FIFO or a device is refused, not waited on).
 */
#include "core/env.h"
#include "data/idx_internal.h"
#include "tensor/tensor.h"
#include "tessera/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_GZ_MAX_RATIO 1032u              /* deflate's largest expansion (258 bytes per 2 bits) */

/* TS_IDX_MAX_BYTES (bytes, with an optional k/m/g suffix; at most 2^48: no wrap below), else 16 GiB. */
static uint64_t idx_max_bytes(void) { return (uint64_t)ts_env_int(TS_ENV_IDX_MAX_BYTES); }

/* Reads up to n bytes. Returns the count read (< n at end of data) and sets
 * *gzerr to a zlib message when the stream is corrupt (NULL otherwise). A gzip
 * stream that simply ends early counts as end of data, not corruption, and sets
 * *cut (when given): the caller decides (the payload's length says whether data
 * is missing; after the payload it means the member lacks its CRC-32 + length
 * trailer, so nothing was verified). */
static uint64_t read_full_cut(gzFile gz, void *buf, uint64_t n, const char **gzerr, bool *cut) {
    uint64_t got = 0;
    *gzerr = NULL;
    if (cut) *cut = false;
    while (got < n) {
        unsigned chunk = (unsigned)TS_MIN(n - got, (uint64_t)1 << 30);
        int r = gzread(gz, (char *)buf + got, chunk);
        if (r < 0) {
            int errnum = 0;
            const char *msg = gzerror(gz, &errnum);
            if (errnum != Z_BUF_ERROR) { /* Z_BUF_ERROR: unexpected end of file */
                const char *sep = strstr(msg, ": ");
                *gzerr = (strncmp(msg, "<fd:", 4) == 0 && sep) ? sep + 2 : msg; /* drop zlib's "<fd:3>: " */
            } else if (cut) {
                *cut = true;
            }
            break;
        }
        if (r == 0) { /* zlib >= 1.2.9 reports a stream cut short as end of data plus Z_BUF_ERROR */
            int errnum = 0;
            (void)gzerror(gz, &errnum);
            if (cut && errnum == Z_BUF_ERROR) *cut = true;
            break;
        }
        got += (uint64_t)r;
    }
    return got;
}

static uint64_t read_full(gzFile gz, void *buf, uint64_t n, const char **gzerr) {
    return read_full_cut(gz, buf, n, gzerr, NULL);
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static const char *payload_name(int ndim) { return ndim == 3 ? "pixels" : ndim == 1 ? "labels" : "data"; }

ts_status ts_idx_read(const char *path, int expect_ndim, ts_tensor **out) {
    TS_ARG(path && out, "ts_idx_read: NULL argument");
    TS_ARG(expect_ndim >= 0 && expect_ndim <= 4, "ts_idx_read: expect_ndim %d is out of range [0, 4]", expect_ndim);
    *out = NULL;
    int fd = -1;
    uint64_t size = 0;
    TS_TRY(ts__open_regular(path, "an IDX file", &fd, &size));
    char esc[TS__PATH_ESC]; /* the reader names the file in messages only */
    return ts__idx_read_fd(fd, size, ts__path(path, esc), expect_ndim, out);
}

ts_status ts__idx_read_fd(int fd, uint64_t size, const char *path, int expect_ndim, ts_tensor **out) {
    *out = NULL;
    if (size == 0) {
        close(fd);
        return ts_error(TS_ERR_FORMAT, "%s: empty file (0 bytes), expected an IDX header", path);
    }
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        close(fd);
        return ts_error(TS_ERR_NOMEM, "%s: cannot start a zlib reader", path);
    }
    gzbuffer(gz, 1u << 17);

    ts_status st = TS_OK;
    ts_tensor *t = NULL;
    const char *zerr = NULL;
    unsigned char hdr[4 * 5];
    uint64_t got = read_full(gz, hdr, 4, &zerr);
    if (zerr) {
        st = ts_error(TS_ERR_FORMAT, "%s: corrupt gzip data: %s", path, zerr);
        goto fail;
    }
    if (got < 4) {
        st = ts_error(TS_ERR_FORMAT, "%s: truncated: expected a 4-byte magic number, got %llu bytes", path,
                      (unsigned long long)got);
        goto fail;
    }
    uint32_t magic = be32(hdr);
    int ndim = (int)(magic & 0xff), code = (int)((magic >> 8) & 0xff);
    uint32_t want = 0x800u | (uint32_t)(expect_ndim > 0 ? expect_ndim : ndim);
    if ((magic >> 16) != 0) {
        st = ts_error(TS_ERR_FORMAT, "%s: bad magic 0x%08x (expected 0x%08x): not an IDX file", path, magic, want);
        goto fail;
    }
    if (code != 0x08) {
        st = ts_error(TS_ERR_FORMAT,
                      "%s: unsupported element type 0x%02x in magic 0x%08x (expected 0x08, unsigned byte)", path,
                      code, magic);
        goto fail;
    }
    if ((expect_ndim > 0 && ndim != expect_ndim) || ndim < 1 || ndim > 4) {
        st = ts_error(TS_ERR_FORMAT, "%s: bad magic 0x%08x (expected 0x%08x): %d dimensions", path, magic, want, ndim);
        goto fail;
    }
    got = read_full(gz, hdr + 4, 4 * (uint64_t)ndim, &zerr);
    if (zerr) {
        st = ts_error(TS_ERR_FORMAT, "%s: corrupt gzip data: %s", path, zerr);
        goto fail;
    }
    if (got < 4 * (uint64_t)ndim) {
        st = ts_error(TS_ERR_FORMAT, "%s: truncated header: expected %d bytes of dimensions, got %llu", path,
                      4 * ndim, (unsigned long long)got);
        goto fail;
    }
    int64_t shape[4];
    uint64_t total = 1, hdr_bytes = 4 + 4 * (uint64_t)ndim, limit = idx_max_bytes();
    char dims[64] = "";
    bool over = false;
    for (int i = 0; i < ndim; i++) {
        shape[i] = be32(hdr + 4 + 4 * i);
        over |= __builtin_mul_overflow(total, (uint64_t)shape[i], &total);
        size_t dl = strlen(dims);
        snprintf(dims + dl, sizeof dims - dl, "%s%lld", i ? " x " : "", (long long)shape[i]);
    }
    if (over || total > limit) {
        st = ts_error(TS_ERR_FORMAT, "%s: the header's dimensions %s promise more than %llu bytes (TS_IDX_MAX_BYTES)",
                      path, dims, (unsigned long long)limit);
        goto fail;
    }
    /* before allocating: what the file can hold */
    if (gzdirect(gz)) {
        if (hdr_bytes + total > size) {
            st = ts_error(TS_ERR_FORMAT, "%s: truncated: expected %llu bytes of %s, got %llu (dimensions %s)", path,
                          (unsigned long long)total, payload_name(ndim), (unsigned long long)(size - hdr_bytes), dims);
            goto fail;
        }
        if (hdr_bytes + total < size) {
            st = ts_error(TS_ERR_FORMAT, "%s: trailing data: more than the %llu bytes of %s the header promises "
                                         "(%s); the file has %llu after the %llu-byte header",
                          path, (unsigned long long)total, payload_name(ndim), dims,
                          (unsigned long long)(size - hdr_bytes), (unsigned long long)hdr_bytes);
            goto fail;
        }
    } else if (total / IDX_GZ_MAX_RATIO > size) {
        st = ts_error(TS_ERR_FORMAT, "%s: the header promises %llu bytes of %s (%s), more than a %llu-byte gzip "
                                     "file can hold (deflate expands at most %u:1): corrupt or truncated",
                      path, (unsigned long long)total, payload_name(ndim), dims, (unsigned long long)size,
                      IDX_GZ_MAX_RATIO);
        goto fail;
    }
    TS_CHECK_GOTO(ts__new(ts_device_cpu(), TS_U8, ndim, shape, &t));
    got = read_full(gz, ts__ptr(t), total, &zerr);
    if (zerr) {
        st = ts_error(TS_ERR_FORMAT, "%s: corrupt gzip data after %llu bytes of %s: %s", path,
                      (unsigned long long)got, payload_name(ndim), zerr);
        goto fail;
    }
    if (got < total) {
        st = ts_error(TS_ERR_FORMAT, "%s: truncated: expected %llu bytes of %s, got %llu", path,
                      (unsigned long long)total, payload_name(ndim), (unsigned long long)got);
        goto fail;
    }
    unsigned char extra[256];
    bool cut = false;
    got = read_full_cut(gz, extra, sizeof extra, &zerr, &cut);
    if (zerr) {
        st = ts_error(TS_ERR_FORMAT, "%s: corrupt gzip data at the end: %s", path, zerr);
        goto fail;
    }
    if (cut && got == 0) { /* zlib checks CRC-32 and length only when the trailer is there */
        st = ts_error(TS_ERR_FORMAT, "%s: truncated gzip file: the data ends without the gzip trailer (CRC-32 and "
                      "length), so it cannot be verified", path);
        goto fail;
    }
    if (got > 0) {
        st = ts_error(TS_ERR_FORMAT, "%s: trailing data: more than the %llu bytes of %s the header promises", path,
                      (unsigned long long)total, payload_name(ndim));
        goto fail;
    }
    gzclose(gz);
    *out = t;
    return TS_OK;
fail:
    gzclose(gz);
    ts_tensor_release(t);
    return st;
}
