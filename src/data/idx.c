/*
 * data/idx.c — the IDX file format (MNIST, Fashion-MNIST), plain or gzip.
 *
 * Layout (big-endian): u32 magic = 0x0000 | dtype (0x08: unsigned byte) << 8 |
 * ndim, then ndim u32 dimensions, then prod(dims) elements. zlib's gzread reads
 * plain files transparently, so one path serves both; whether a file is gzip is
 * decided by its content, not its name.
 */
#include "tensor/tensor.h"
#include "tessera/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_MAX_BYTES (1ull << 40) /* refuse absurd headers before allocating */

/* Reads up to n bytes. Returns the count read (< n at end of data) and sets
 * *gzerr to a zlib message when the stream is corrupt (NULL otherwise). A gzip
 * stream that simply ends early counts as end of data, not corruption. */
static uint64_t read_full(gzFile gz, void *buf, uint64_t n, const char **gzerr) {
    uint64_t got = 0;
    *gzerr = NULL;
    while (got < n) {
        unsigned chunk = (unsigned)TS_MIN(n - got, (uint64_t)1 << 30);
        int r = gzread(gz, (char *)buf + got, chunk);
        if (r < 0) {
            int errnum = 0;
            const char *msg = gzerror(gz, &errnum);
            if (errnum != Z_BUF_ERROR) { /* Z_BUF_ERROR: unexpected end of file */
                const char *sep = strstr(msg, ": ");
                *gzerr = (strncmp(msg, "<fd:", 4) == 0 && sep) ? sep + 2 : msg; /* drop zlib's "<fd:3>: " */
            }
            break;
        }
        if (r == 0) break;
        got += (uint64_t)r;
    }
    return got;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static const char *payload_name(int ndim) { return ndim == 3 ? "pixels" : ndim == 1 ? "labels" : "data"; }

ts_status ts_idx_read(const char *path, int expect_ndim, ts_tensor **out) {
    TS_ARG(path && out, "ts_idx_read: NULL argument");
    TS_ARG(expect_ndim >= 0 && expect_ndim <= 4, "ts_idx_read: expect_ndim %d is out of range [0, 4]", expect_ndim);
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return ts_error(TS_ERR_IO, "%s: is a directory, expected an IDX file", path);
    }
    if (S_ISREG(sb.st_mode) && sb.st_size == 0) {
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
    uint64_t total = 1;
    for (int i = 0; i < ndim; i++) {
        shape[i] = be32(hdr + 4 + 4 * i);
        total *= (uint64_t)shape[i];
        if (total > IDX_MAX_BYTES) {
            st = ts_error(TS_ERR_FORMAT, "%s: dimensions promise more than %llu bytes", path,
                          (unsigned long long)IDX_MAX_BYTES);
            goto fail;
        }
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
    got = read_full(gz, extra, sizeof extra, &zerr);
    if (zerr) {
        st = ts_error(TS_ERR_FORMAT, "%s: corrupt gzip data at the end: %s", path, zerr);
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
