/*
 * core/crypto.c — SHA-256, HMAC-SHA256 and the constant-time comparison from
 * OpenSSL's libcrypto (EVP), kernel random bytes, hex and wiping. The test
 * vectors (FIPS 180-4, RFC 4231) are in tests/test_job_token.c.
 */
#include "core/crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/random.h>
#include <unistd.h>

/* SHA-256 and HMAC through EVP (OpenSSL 3's non-deprecated interfaces). A failure there is an
 * allocation failing inside libcrypto: reported, never a silently wrong digest. */
static ts_status ossl_error(const char *what) {
    unsigned long e = ERR_get_error();
    char buf[256] = "no detail";
    if (e) ERR_error_string_n(e, buf, sizeof buf);
    ERR_clear_error();
    return ts_error(TS_ERR_NOMEM, "libcrypto: %s failed: %s", what, buf);
}

ts_status ts__sha256_init(ts__sha256 *c) {
    c->ctx = EVP_MD_CTX_new();
    c->bad = !c->ctx || EVP_DigestInit_ex(c->ctx, EVP_sha256(), NULL) != 1;
    return c->bad ? ossl_error("SHA-256 init") : TS_OK;
}

void ts__sha256_update(ts__sha256 *c, const void *data, size_t n) {
    if (!c->bad && n && EVP_DigestUpdate(c->ctx, data, n) != 1) c->bad = true;
}

ts_status ts__sha256_final(ts__sha256 *c, uint8_t out[TS__SHA256_BYTES]) {
    unsigned int len = 0;
    bool ok = !c->bad && EVP_DigestFinal_ex(c->ctx, out, &len) == 1 && len == TS__SHA256_BYTES;
    EVP_MD_CTX_free(c->ctx); /* cleanses the state */
    c->ctx = NULL;
    if (ok) return TS_OK;
    memset(out, 0, TS__SHA256_BYTES);
    return ossl_error("SHA-256");
}

ts_status ts__sha256_hash(const void *data, size_t n, uint8_t out[TS__SHA256_BYTES]) {
    unsigned int len = 0;
    if (EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) == 1 && len == TS__SHA256_BYTES) return TS_OK;
    memset(out, 0, TS__SHA256_BYTES);
    return ossl_error("SHA-256");
}

ts_status ts__hmac_sha256(const void *key, size_t keylen, int n, const void *const *parts, const size_t *lens,
                          uint8_t out[TS__SHA256_BYTES]) {
    static const uint8_t empty = 0; /* EVP_MAC_init wants a key pointer even for an empty key */
    EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = m ? EVP_MAC_CTX_new(m) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_END};
    size_t len = 0;
    bool ok = ctx && EVP_MAC_init(ctx, keylen ? key : &empty, keylen, params) == 1;
    for (int i = 0; ok && i < n; i++)
        if (lens[i]) ok = EVP_MAC_update(ctx, parts[i], lens[i]) == 1;
    ok = ok && EVP_MAC_final(ctx, out, &len, TS__SHA256_BYTES) == 1 && len == TS__SHA256_BYTES;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(m);
    if (ok) return TS_OK;
    memset(out, 0, TS__SHA256_BYTES);
    return ossl_error("HMAC-SHA256");
}

int ts__ct_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

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

void ts__wipe(void *p, size_t n) { OPENSSL_cleanse(p, n); }
