/*
 * ops/cpu/onednn.h — what the CPU kernels that call oneDNN share (internal; builds with
 * TS_HAVE_DNNL only): the one CPU engine of the process, the size of a primitive's user
 * scratchpad, and a byte buffer as a oneDNN memory. blas.c (GEMMs) and dnnl_conv.c
 * (convolutions) build their primitives on this engine; every primitive takes its
 * scratchpad from the caller (dnnl_scratchpad_mode_user), so one primitive can run on
 * several threads at once.
 */
#ifndef TS_OPS_CPU_ONEDNN_H
#define TS_OPS_CPU_ONEDNN_H

#include <dnnl.h>
#include <stdbool.h>
#include <stddef.h>

/* The process's CPU engine, created on first use; NULL when oneDNN cannot make one. */
dnnl_engine_t ts__dnnl_engine(void);

/* Bytes of pd's scratchpad (0 when it needs none). */
size_t ts__dnnl_scratchpad_bytes(const_dnnl_primitive_desc_t pd);

/* A 1-D byte memory over p (n bytes) on the engine: a scratchpad argument. */
bool ts__dnnl_bytes_memory(void *p, size_t n, dnnl_memory_t *out);

#endif
