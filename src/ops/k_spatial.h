/*
 * ops/k_spatial.h — the spatial kernel family: conv2d, pooling, batchnorm2d.
 */
#ifndef TS_K_SPATIAL_H
#define TS_K_SPATIAL_H

#include "tensor/tensor.h"

struct ts_kernels_spatial {
    int reserved; /* kernels are added here */
};

#endif
