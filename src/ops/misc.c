/*
 * ops/misc.c — TEMPORARY scaffolding so the library links while these ops
 * are written in parallel; replaced by the real shape/index/loss ops.
 */
#include "tensor/tensor.h"
#include "tessera/ops.h"

#define SCAFFOLD(name) return ts_error(TS_ERR_UNSUPPORTED, name ": being written")
ts_status ts_embedding(const ts_tensor *idx, const ts_tensor *weight, ts_tensor **out) { SCAFFOLD("embedding"); }
ts_status ts_reshape(const ts_tensor *x, int ndim, const int64_t *shape, ts_tensor **out) { SCAFFOLD("reshape"); }
ts_status ts_flatten(const ts_tensor *x, int start_dim, ts_tensor **out) { SCAFFOLD("flatten"); }
ts_status ts_concat(ts_tensor *const *xs, int n, int dim, ts_tensor **out) { SCAFFOLD("concat"); }
ts_status ts_slice(const ts_tensor *x, int dim, int64_t start, int64_t end, ts_tensor **out) { SCAFFOLD("slice"); }
ts_status ts_dropout(const ts_tensor *x, float p, bool training, ts_rng *rng, ts_tensor **out) { SCAFFOLD("dropout"); }
ts_status ts_log_softmax(const ts_tensor *x, int dim, ts_tensor **out) { SCAFFOLD("log_softmax"); }
ts_status ts_cross_entropy(const ts_tensor *logits, const ts_tensor *target, float label_smoothing, ts_tensor **out) { SCAFFOLD("cross_entropy"); }
ts_status ts_mse_loss(const ts_tensor *pred, const ts_tensor *target, ts_tensor **out) { SCAFFOLD("mse_loss"); }
