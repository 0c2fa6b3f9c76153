/*
 * io/ckpt_internal.h — checkpoint loading from memory (internal: the fuzz target
 * tests/fuzz/fuzz_ckpt.c and tests use it to reach the parser without a file).
 */
#ifndef TS_IO_CKPT_INTERNAL_H
#define TS_IO_CKPT_INTERNAL_H

#include "tessera/ckpt.h"
#include "core/internal.h"

#include <stddef.h>
#include <stdio.h>

/* ts_ckpt_load over the n bytes at buf (borrowed); name stands for the path in messages. */
ts_status ts__ckpt_load_mem(const void *buf, size_t n, const char *name, ts_ckpt **out);

/* The atomic writer ts_ckpt_save and ts_safetensors_save share: ts__atomic_open/close (core/internal.h). */

#endif /* TS_IO_CKPT_INTERNAL_H */
