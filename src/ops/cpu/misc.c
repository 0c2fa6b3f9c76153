/*
 * ops/cpu/misc.c — CPU kernels of the misc family (embedding, concat/slice, dropout, log_softmax, losses).
 */
#include "ops/k_misc.h"

const struct ts_kernels_misc ts_cpu_kernels_misc = {0};
