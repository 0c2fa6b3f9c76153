/*
 * ops/cpu/winograd.h — 3x3 stride-1 convolutions by Winograd's minimal
 * filtering F(2x2, 3x3) and F(4x4, 3x3): the CPU spatial kernels (spatial.c)
 * hand such a conv2d here when ts__cpu_wino_ok says so.
 */
#ifndef TS_OPS_CPU_WINOGRAD_H
#define TS_OPS_CPU_WINOGRAD_H

#include "device/k_spatial.h"

/* Whether conv2d of this geometry goes through Winograd: 3x3 kernel, stride 1,
 * dilation 1, one group, padding at most 2, and the algorithm setting
 * (ts_get_conv_algo): AUTO also needs at least WINO_MIN_CHANNELS input and
 * output channels (fewer, and the transforms cost more than they save). */
bool ts__cpu_wino_ok(const ts_conv2d_geom *g);

/* The k_spatial conv2d / conv2d_backward contracts, for geometries ts__cpu_wino_ok accepts; the bias
 * gradient (a sum of gout, nothing of Winograd's) stays with the caller. */
ts_status ts__cpu_wino_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                              const ts_tensor *b);
ts_status ts__cpu_wino_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                       const ts_tensor *w, ts_tensor *gx, ts_tensor *gw);

#endif
