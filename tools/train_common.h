/*
 * tools/train_common.h — the training step and evaluation shared by
 * `tessera train` and `tessera bench`.
 */
#ifndef TS_TOOLS_TRAIN_COMMON_H
#define TS_TOOLS_TRAIN_COMMON_H

#include "strategy.h"
#include "tessera.h"

/* forward (through ddp when not NULL: gradients averaged across ranks),
 * cross-entropy, backward, optimizer step, zero_grad; *loss gets this rank's batch loss. */
ts_status train_step(ts_module *model, ts_ddp *ddp, ts_optimizer *opt, ts_tensor *x, ts_tensor *y,
                     float label_smoothing, float *loss);
/* train_step for a `--strategy` runner (tools/strategy.h): the strategy's
 * forward_backward, when it has one, replaces forward + cross-entropy +
 * backward; then the optimizer step and zero_grad. s NULL: train_step without DDP. */
ts_status train_step_strategy(ts_module *runner, const train_strategy *s, ts_optimizer *opt, ts_tensor *x,
                              ts_tensor *y, float label_smoothing, float *loss);
/* Accuracy of model (put in eval mode, no grad) over ds in batches; leaves the model in eval mode. */
ts_status evaluate(ts_module *model, ts_dataset *ds, int64_t batch_size, double *accuracy);

#endif
