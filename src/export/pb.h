/*
 * export/pb.h — a minimal protocol-buffers writer (internal), enough for ONNX.
 *
 * The wire format (developers.google.com/protocol-buffers/docs/encoding): a
 * message is a sequence of fields, each a key varint (field_number << 3 |
 * wire_type) and a value: wire type 0 a varint (int32/int64/enum/bool, negative
 * int64 as 10 bytes of two's complement), 1 eight little-endian bytes, 2 a
 * varint length then that many bytes (strings, bytes, nested messages, packed
 * repeated scalars), 5 four little-endian bytes (float). A varint is 7 bits per
 * byte, least significant group first, the high bit set on every byte but the
 * last.
 *
 * Everything is appended to one growing buffer. A nested message is opened
 * with ts__pb_begin (writes the key, remembers where the body starts) and
 * closed with ts__pb_end, which moves the body up by the size of its length
 * varint and writes the length in front: the encoding is the canonical one
 * (minimal varints), at the cost of one memmove per nesting level.
 *
 * Errors are sticky: the first allocation failure sets oom and every later
 * call does nothing; the caller checks ts__pb_status once at the end.
 */
#ifndef TS_EXPORT_PB_H
#define TS_EXPORT_PB_H

#include "core/internal.h"

typedef struct ts__pb {
    uint8_t *buf;
    size_t len, cap;
    bool oom;
} ts__pb;

#define TS_PB_INIT ((ts__pb){NULL, 0, 0, false})

/* Bytes the varint encoding of v takes (1..10). */
int ts__pb_varint_size(uint64_t v);
void ts__pb_varint(ts__pb *w, uint64_t v);                     /* a bare varint */
void ts__pb_int(ts__pb *w, int field, int64_t v);             /* wire type 0 */
void ts__pb_float(ts__pb *w, int field, float v);             /* wire type 5 */
void ts__pb_bytes(ts__pb *w, int field, const void *p, size_t n); /* wire type 2 */
void ts__pb_string(ts__pb *w, int field, const char *s);      /* wire type 2 */
/* Opens a nested message in field; returns the mark ts__pb_end needs. */
size_t ts__pb_begin(ts__pb *w, int field);
void ts__pb_end(ts__pb *w, size_t mark);
/* TS_OK, or TS_ERR_NOMEM naming what (when an allocation failed). */
ts_status ts__pb_status(const ts__pb *w, const char *what);
void ts__pb_free(ts__pb *w);

#endif
