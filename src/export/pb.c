/*
 * export/pb.c — the protocol-buffers writer of export/pb.h.
 */
#include "export/pb.h"

#include <string.h>

/* Makes room for n more bytes; false (and oom set) when that fails. */
static bool reserve(ts__pb *w, size_t n) {
    if (w->oom) return false;
    if (n <= w->cap - w->len) return true;
    size_t cap = w->cap ? w->cap : 4096;
    while (cap - w->len < n) {
        if (cap > SIZE_MAX / 2) {
            w->oom = true;
            return false;
        }
        cap *= 2;
    }
    uint8_t *p = ts__realloc(w->buf, cap);
    if (!p) {
        w->oom = true;
        return false;
    }
    w->buf = p;
    w->cap = cap;
    return true;
}

int ts__pb_varint_size(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v's varint at p (room checked); returns the bytes written. */
static int put_varint(uint8_t *p, uint64_t v) {
    int n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

void ts__pb_varint(ts__pb *w, uint64_t v) {
    if (!reserve(w, 10)) return;
    w->len += (size_t)put_varint(w->buf + w->len, v);
}

static void key(ts__pb *w, int field, int wire) { ts__pb_varint(w, ((uint64_t)field << 3) | (uint64_t)wire); }

void ts__pb_int(ts__pb *w, int field, int64_t v) {
    key(w, field, 0);
    ts__pb_varint(w, (uint64_t)v); /* negative: ten bytes of two's complement, as protobuf's int64 */
}

void ts__pb_float(ts__pb *w, int field, float v) {
    key(w, field, 5);
    if (!reserve(w, 4)) return;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; i++) w->buf[w->len++] = (uint8_t)(bits >> (8 * i)); /* little-endian */
}

void ts__pb_bytes(ts__pb *w, int field, const void *p, size_t n) {
    key(w, field, 2);
    ts__pb_varint(w, n);
    if (!n || !reserve(w, n)) return;
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

void ts__pb_string(ts__pb *w, int field, const char *s) { ts__pb_bytes(w, field, s, strlen(s)); }

size_t ts__pb_begin(ts__pb *w, int field) {
    key(w, field, 2);
    return w->len;
}

void ts__pb_end(ts__pb *w, size_t mark) {
    if (w->oom) return;
    size_t body = w->len - mark;
    int n = ts__pb_varint_size(body);
    if (!reserve(w, (size_t)n)) return;
    memmove(w->buf + mark + n, w->buf + mark, body);
    put_varint(w->buf + mark, body);
    w->len += (size_t)n;
}

ts_status ts__pb_status(const ts__pb *w, const char *what) {
    if (w->oom) return ts_error(TS_ERR_NOMEM, "%s: out of memory encoding %zu bytes", what, w->len);
    return TS_OK;
}

void ts__pb_free(ts__pb *w) {
    free(w->buf);
    *w = TS_PB_INIT;
}
