/*
 * ops/cpu/dnnl_conv.h — convolutions through oneDNN's convolution primitives
 * (what PyTorch's CPU build runs): the CPU spatial kernels (spatial.c) hand a
 * conv2d here when ts__cpu_dnnl_conv_ok says so, and fall back to their own
 * algorithms when oneDNN cannot make a primitive for the geometry.
 */
#ifndef TS_OPS_CPU_DNNL_CONV_H
#define TS_OPS_CPU_DNNL_CONV_H

#include "device/k_spatial.h"

/* Output planes of at most this many positions (ResNet-18's layer4 at 64x64: 2x2) are "tiny": under
 * TS_CONV_AUTO and TS_CONV_WINOGRAD their forward runs oneDNN's direct kernels and their backward the
 * batched im2col path of spatial.c (one sgemm per pass over the batch), which beat oneDNN's direct
 * backward and our Winograd there. */
#define TS_CONV_TINY_PLANE 4

/* Whether conv2d of this geometry goes to oneDNN: built with it (TS_HAVE_DNNL) and GEMMs on oneDNN
 * (ts_cpu_gemm_library), one group, and the algorithm setting TS_CONV_ONEDNN or TS_CONV_AUTO, or
 * TS_CONV_WINOGRAD where oneDNN's Winograd fits, for convolutions other than 3x3 stride 1, and for tiny
 * planes. */
bool ts__cpu_dnnl_conv_ok(const ts_conv2d_geom *g);

/* The k_spatial conv2d / conv2d_backward contracts. The backward writes the bias gradient *gb (may be NULL)
 * with the weights' and sets *gb to NULL when it does (gw wanted); otherwise it stays with the caller. They return
 * false, having touched nothing, when oneDNN cannot run the geometry (the caller then runs its own
 * algorithm); true with *st the outcome otherwise. Under bfloat16 matmul precision the operands are
 * rounded to bfloat16 and the results accumulated and stored in float32. bfloat16 activations (x, out,
 * gout, gx of dtype TS_BF16: autocast) are read and written as bfloat16, the products bfloat16 whatever
 * the precision setting; weights and their gradient stay float32. */
bool ts__cpu_dnnl_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                         const ts_tensor *b, ts_status *st);
bool ts__cpu_dnnl_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                  const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor **gb, ts_status *st);

#endif
