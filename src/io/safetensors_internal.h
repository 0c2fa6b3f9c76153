/*
 * io/safetensors_internal.h — safetensors loading from memory (internal: the fuzz target
 * tests/fuzz/fuzz_safetensors.c reaches the parser through it without a file).
 */
#ifndef TS_IO_SAFETENSORS_INTERNAL_H
#define TS_IO_SAFETENSORS_INTERNAL_H

#include "tessera/safetensors.h"

#include <stddef.h>

/* ts_safetensors_load over the n bytes at buf (borrowed); name stands for the path in messages. */
ts_status ts__safetensors_load_mem(const void *buf, size_t n, const char *name, unsigned flags, ts_tensor_list *out,
                                   ts_safetensors_meta *meta);

#endif /* TS_IO_SAFETENSORS_INTERNAL_H */
