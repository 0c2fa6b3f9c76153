/*
 * io/ckpt_internal.h — checkpoint loading from memory (internal: the fuzz target
 * tests/fuzz/fuzz_ckpt.c and tests use it to reach the parser without a file),
 * and the atomic file writing that ts_ckpt_save and ts_safetensors_save share.
 */
#ifndef TS_IO_CKPT_INTERNAL_H
#define TS_IO_CKPT_INTERNAL_H

#include "tessera/ckpt.h"

#include <stddef.h>
#include <stdio.h>

/* ts_ckpt_load over the n bytes at buf (borrowed); name stands for the path in messages. */
ts_status ts__ckpt_load_mem(const void *buf, size_t n, const char *name, ts_ckpt **out);

/* Atomic replacement of path. ts__atomic_open: path must be a regular file or absent
 * (ts__check_write_target; `what` names the kind of file in messages), "<path>.tmp.<pid>" files
 * of dead writers are removed, and tmp (cap bytes) gets "<path>.tmp.<pid>", created exclusively
 * (never through a symbolic link) and opened as *f. ts__atomic_close: when st is TS_OK and werr
 * (the errno of a failed write, or 0) is 0, flushes, fsyncs and closes f, renames tmp over path
 * and fsyncs the directory; otherwise (or when any of that fails) closes f and removes tmp.
 * Returns st, or TS_ERR_IO naming path, tmp and the errno text. */
ts_status ts__atomic_open(const char *path, const char *what, char *tmp, size_t cap, FILE **f);
ts_status ts__atomic_close(const char *path, const char *tmp, FILE *f, ts_status st, int werr);

#endif /* TS_IO_CKPT_INTERNAL_H */
