/*
 * core/crypto.c — SHA-256 (FIPS 180-4 section 6.2), HMAC-SHA256 (RFC 2104),
 * a constant-time comparison and kernel random bytes. See crypto.h for why
 * these live here; the test vectors are in tests/test_job_token.c.
 */
#include "core/crypto.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/random.h>
#include <unistd.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block into the state (FIPS 180-4 6.2.2). */
static void compress(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
    ts__wipe(w, sizeof w);
}

void ts__sha256_init(ts__sha256 *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->nbytes = 0;
    c->nbuf = 0;
}

void ts__sha256_update(ts__sha256 *c, const void *data, size_t n) {
    const uint8_t *p = data;
    c->nbytes += n;
    if (c->nbuf) {
        size_t take = TS_MIN(n, 64 - c->nbuf);
        memcpy(c->buf + c->nbuf, p, take);
        c->nbuf += take;
        p += take;
        n -= take;
        if (c->nbuf < 64) return;
        compress(c->h, c->buf);
        c->nbuf = 0;
    }
    for (; n >= 64; p += 64, n -= 64) compress(c->h, p);
    if (n) memcpy(c->buf, p, n);
    c->nbuf = n;
}

void ts__sha256_final(ts__sha256 *c, uint8_t out[TS__SHA256_BYTES]) {
    /* Padding (5.1.1): 0x80, zeros to 56 mod 64, the length in bits as a big-endian u64. */
    uint64_t bits = c->nbytes * 8;
    c->buf[c->nbuf++] = 0x80;
    if (c->nbuf > 56) {
        memset(c->buf + c->nbuf, 0, 64 - c->nbuf);
        compress(c->h, c->buf);
        c->nbuf = 0;
    }
    memset(c->buf + c->nbuf, 0, 56 - c->nbuf);
    for (int i = 0; i < 8; i++) c->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress(c->h, c->buf);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    ts__wipe(c, sizeof *c);
}

void ts__sha256_hash(const void *data, size_t n, uint8_t out[TS__SHA256_BYTES]) {
    ts__sha256 c;
    ts__sha256_init(&c);
    ts__sha256_update(&c, data, n);
    ts__sha256_final(&c, out);
}

/* HMAC(K, m) = H((K0 ^ opad) || H((K0 ^ ipad) || m)), K0 the key padded to a
 * block (hashed first when longer than a block). */
void ts__hmac_sha256(const void *key, size_t keylen, int n, const void *const *parts, const size_t *lens,
                     uint8_t out[TS__SHA256_BYTES]) {
    uint8_t k0[TS__SHA256_BLOCK] = {0}, pad[TS__SHA256_BLOCK], inner[TS__SHA256_BYTES];
    if (keylen > TS__SHA256_BLOCK) ts__sha256_hash(key, keylen, k0);
    else if (keylen) memcpy(k0, key, keylen);
    ts__sha256 c;
    for (int i = 0; i < TS__SHA256_BLOCK; i++) pad[i] = k0[i] ^ 0x36;
    ts__sha256_init(&c);
    ts__sha256_update(&c, pad, sizeof pad);
    for (int i = 0; i < n; i++) ts__sha256_update(&c, parts[i], lens[i]);
    ts__sha256_final(&c, inner);
    for (int i = 0; i < TS__SHA256_BLOCK; i++) pad[i] = k0[i] ^ 0x5c;
    ts__sha256_init(&c);
    ts__sha256_update(&c, pad, sizeof pad);
    ts__sha256_update(&c, inner, sizeof inner);
    ts__sha256_final(&c, out);
    ts__wipe(k0, sizeof k0);
    ts__wipe(pad, sizeof pad);
    ts__wipe(inner, sizeof inner);
}

int ts__ct_equal(const void *a, const void *b, size_t n) {
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++) d |= (uint8_t)(x[i] ^ y[i]);
    return 1 & ((d - 1u) >> 8); /* d == 0 -> 1, without a branch on d */
}

ts_status ts__random_bytes(void *buf, size_t n) {
    uint8_t *p = buf;
    size_t done = 0;
    int err = 0;
    while (done < n) {
        ssize_t r = getrandom(p + done, n - done, 0);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        err = errno;
        break;
    }
    if (done == n) return TS_OK;
    /* Kernels before 3.17 (ENOSYS) or a seccomp filter: the device. */
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_error(TS_ERR_IO, "cannot get random bytes: getrandom: %s; /dev/urandom: %s", strerror(err),
                        strerror(errno));
    while (done < n) {
        ssize_t r = read(fd, p + done, n - done);
        if (r > 0) {
            done += (size_t)r;
        } else if (!(r < 0 && errno == EINTR)) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            return ts_error(TS_ERR_IO, "cannot get random bytes: reading /dev/urandom: %s", strerror(e));
        }
    }
    close(fd);
    return TS_OK;
}

void ts__hex(const void *data, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = 0;
}

void ts__wipe(void *p, size_t n) {
    volatile uint8_t *v = p;
    while (n--) *v++ = 0;
}
