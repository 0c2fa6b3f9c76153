/*
 * ops/cpu/spatial.c — CPU kernels of the spatial family (conv2d, pooling, batchnorm2d).
 */
#include "ops/k_spatial.h"

const struct ts_kernels_spatial ts_cpu_kernels_spatial = {0};
