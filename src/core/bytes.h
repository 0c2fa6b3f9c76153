/*
 * core/bytes.h — fixed-width integers in a byte order of their own (internal): the one
 * copy of the shift loops every wire format and file format uses (stores, heartbeats,
 * links). n is 1..8 bytes. Static inline, no dependencies.
 */
#ifndef TS_CORE_BYTES_H
#define TS_CORE_BYTES_H

#include <stdint.h>

static inline void ts__put_be(uint8_t *p, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}
static inline uint64_t ts__get_be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}
static inline void ts__put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++, v >>= 8) p[i] = (uint8_t)v;
}
static inline uint64_t ts__get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

#endif /* TS_CORE_BYTES_H */
