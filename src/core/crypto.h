/*
 * core/crypto.h — the few cryptographic primitives the job token needs
 * (internal): SHA-256, HMAC-SHA256 and a constant-time comparison, all from
 * OpenSSL's libcrypto (crypto.c wraps its EVP interfaces), and random bytes
 * from the kernel. tests/test_job_token.c checks them against the FIPS 180-4
 * examples and every RFC 4231 test case. A libcrypto failure (out of memory
 * inside it) is an error, never a wrong digest. Not installed; not part of the
 * public API.
 */
#ifndef TS_CORE_CRYPTO_H
#define TS_CORE_CRYPTO_H

#include "core/internal.h"

#include <stdint.h>

#define TS__SHA256_BYTES 32
#define TS__SHA256_BLOCK 64

typedef struct ts__sha256 {
    void *ctx; /* libcrypto's EVP_MD_CTX */
    bool bad;  /* an update failed: final reports it */
} ts__sha256;

/* A streaming digest: init, any number of updates, final (which frees the context, also on
 * failure; after a failed init, call final to learn the error or drop c). */
ts_status ts__sha256_init(ts__sha256 *c);
void ts__sha256_update(ts__sha256 *c, const void *data, size_t n);
ts_status ts__sha256_final(ts__sha256 *c, uint8_t out[TS__SHA256_BYTES]);
ts_status ts__sha256_hash(const void *data, size_t n, uint8_t out[TS__SHA256_BYTES]);

/* HMAC-SHA256 over the concatenation of n parts (parts[i], lens[i]); any key length. On failure
 * out is zeroed and the error set: callers must not compare it. */
ts_status ts__hmac_sha256(const void *key, size_t keylen, int n, const void *const *parts, const size_t *lens,
                          uint8_t out[TS__SHA256_BYTES]);

/* 1 when a[0..n) == b[0..n), else 0; the time taken depends on n only. */
int ts__ct_equal(const void *a, const void *b, size_t n);

/* Fills buf with n bytes from the kernel's CSPRNG (getrandom, else /dev/urandom).
 * TS_ERR_IO naming the cause when neither works. */
ts_status ts__random_bytes(void *buf, size_t n);

/* Writes 2n lowercase hex digits and a NUL into out (2n + 1 bytes). */
void ts__hex(const void *data, size_t n, char *out);

/* Overwrites n bytes in a way the compiler does not remove. */
void ts__wipe(void *p, size_t n);

#endif /* TS_CORE_CRYPTO_H */
