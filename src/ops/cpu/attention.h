/*
 * ops/cpu/attention.h — the CPU's scaled-dot-product attention kernels (ops/cpu/attention.c), which
 * ops/cpu/misc.c puts in the misc table (device/k_misc.h: attention_forward, attention_backward).
 */
#ifndef TS_CPU_ATTENTION_H
#define TS_CPU_ATTENTION_H

#include "tensor/tensor.h"

ts_status ts__cpu_attention_forward(ts_tensor *out, ts_tensor *stats, const ts_tensor *q, const ts_tensor *k,
                                    const ts_tensor *v, bool causal, float scale);
ts_status ts__cpu_attention_backward(ts_tensor *gq, ts_tensor *gk, ts_tensor *gv, const ts_tensor *gout,
                                     const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, const ts_tensor *out,
                                     const ts_tensor *stats, bool causal, float scale);

#endif
