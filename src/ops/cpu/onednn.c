/*
 * ops/cpu/onednn.c — the shared oneDNN pieces of the CPU kernels (onednn.h).
 */
#ifdef TS_HAVE_DNNL
#include "ops/cpu/onednn.h"

#include <pthread.h>

static pthread_once_t eng_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t eng;

static void eng_init(void) {
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) eng = NULL;
}

dnnl_engine_t ts__dnnl_engine(void) {
    pthread_once(&eng_once, eng_init);
    return eng;
}

size_t ts__dnnl_scratchpad_bytes(const_dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return sp ? dnnl_memory_desc_get_size(sp) : 0;
}

bool ts__dnnl_bytes_memory(void *p, size_t n, dnnl_memory_t *out) {
    dnnl_memory_desc_t md;
    dnnl_dims_t d = {(int64_t)n};
    return dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_a) == dnnl_success &&
           dnnl_memory_create(out, &md, ts__dnnl_engine(), p) == dnnl_success;
}
#else
typedef int ts__onednn_not_built; /* (this build has no oneDNN) */
#endif
