/*
 * ops/k_optim.h — the optim kernel family: fused optimizer updates (SGD, AdamW).
 */
#ifndef TS_K_OPTIM_H
#define TS_K_OPTIM_H

#include "tensor/tensor.h"

struct ts_kernels_optim {
    int reserved; /* kernels are added here */
};

#endif
