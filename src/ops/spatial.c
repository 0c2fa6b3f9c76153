/*
 * ops/spatial.c — TEMPORARY scaffolding so the library links while the
 * spatial ops are written in parallel; replaced by conv2d/pool/batchnorm.
 */
#include "tensor/tensor.h"
#include "tessera/ops.h"

#define SCAFFOLD(name) return ts_error(TS_ERR_UNSUPPORTED, name ": being written")
ts_status ts_conv2d(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, ts_conv2d_params p, ts_tensor **out) { SCAFFOLD("conv2d"); }
ts_status ts_maxpool2d(const ts_tensor *x, ts_pool2d_params p, ts_tensor **out) { SCAFFOLD("maxpool2d"); }
ts_status ts_avgpool2d(const ts_tensor *x, ts_pool2d_params p, ts_tensor **out) { SCAFFOLD("avgpool2d"); }
ts_status ts_global_avgpool2d(const ts_tensor *x, ts_tensor **out) { SCAFFOLD("global_avgpool2d"); }
ts_status ts_batchnorm2d(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias, ts_tensor *running_mean,
                         ts_tensor *running_var, bool training, float momentum, float eps, ts_tensor **out) { SCAFFOLD("batchnorm2d"); }
