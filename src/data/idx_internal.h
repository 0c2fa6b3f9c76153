/*
 * data/idx_internal.h — the IDX reader over an open descriptor (internal: the
 * fuzz target tests/fuzz/fuzz_idx.c reaches the parser through it).
 */
#ifndef TS_DATA_IDX_INTERNAL_H
#define TS_DATA_IDX_INTERNAL_H

#include "core/internal.h"

/* ts_idx_read over fd (a regular file of `size` bytes, positioned at its start;
 * the call always closes it); path names it in messages. */
ts_status ts__idx_read_fd(int fd, uint64_t size, const char *path, int expect_ndim, ts_tensor **out);

#endif /* TS_DATA_IDX_INTERNAL_H */
