/*
 * ops/loss.h — the cross-entropy of a sequence model, for the layers above that score one: the trainer's
 * strategies and evaluation (train/) and the pipeline's last stage (parallel/pipeline_parallel.c).
 */
#ifndef TS_OPS_LOSS_H
#define TS_OPS_LOSS_H

#include "tensor/tensor.h"

/* Whether logits (B, T, ..., V) go with targets of their leading shape (B, T, ...): a sequence model's
 * output, the class dimension last (ndim >= 3). */
bool ts__class_last(const ts_tensor *logits, const ts_tensor *y);
/* ts_cross_entropy(logits, y); a sequence model's logits (B, T, ..., V) with targets (B, T, ...) — the class
 * dimension last, as a language model's — are scored as (B*T*..., V) rows against the flattened targets: the
 * mean over every position. */
ts_status ts__cross_entropy_seq(const ts_tensor *logits, const ts_tensor *y, float label_smoothing, ts_tensor **out);

#endif /* TS_OPS_LOSS_H */
