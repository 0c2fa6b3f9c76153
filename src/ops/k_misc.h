/*
 * ops/k_misc.h — the misc kernel family: embedding, concat/slice, dropout, log_softmax, losses.
 */
#ifndef TS_K_MISC_H
#define TS_K_MISC_H

#include "tensor/tensor.h"

struct ts_kernels_misc {
    int reserved; /* kernels are added here */
};

#endif
