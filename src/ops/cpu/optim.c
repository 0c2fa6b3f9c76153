/*
 * ops/cpu/optim.c — CPU kernels of the optim family (fused optimizer updates (SGD, AdamW)).
 */
#include "ops/k_optim.h"

const struct ts_kernels_optim ts_cpu_kernels_optim = {0};
