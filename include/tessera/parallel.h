/*
 * tessera/parallel.h — one process, many devices: the data-parallel
 * primitives of torch.nn.parallel (replicate, scatter, gather,
 * parallel_apply, data_parallel, DataParallel), model parallelism in depth,
 * pipeline parallelism (GPipe and 1F1B schedules) and tile (spatial)
 * parallelism.
 *
 * Devices are "cpu", the virtual CPU devices "cpu:0".."cpu:N-1" (see
 * tessera/core.h: each has its own memory and its own worker thread, so
 * replicas really run at the same time) and, later, "cuda:K". Autograd follows
 * tensors across devices: every function here records what backward needs, so
 * a loss computed on one device sends gradients back to every device that
 * took part.
 *
 * Wrapper modules (DataParallel, ModelParallel, Pipeline, TileParallel) take
 * ownership of the module they wrap and hold it as their child "module", so
 * their state-dict keys are the wrapped model's prefixed with "module." (as
 * PyTorch's DataParallel); ts_module_child(wrapper, "module") is the plain model.
 * Their forward takes an input on any device and returns the output on the
 * output device they were given.
 *
 * Sections of this header are filled in by the engineers building each part;
 * every declaration here is implemented and tested.
 */
#ifndef TESSERA_PARALLEL_H
#define TESSERA_PARALLEL_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- data-parallel primitives ------------------------------------------------------------------ */
/* (declarations added by the data-parallel work: ts_replicate, ts_scatter, ts_gather,
 *  ts_parallel_apply, ts_data_parallel, ts_nn_data_parallel_new) */

/* ---- model parallelism ------------------------------------------------------------------------- */
/* (ts_nn_to_device_new, ts_nn_model_parallel_new) */

/* ---- pipeline parallelism ---------------------------------------------------------------------- */
/* (ts_nn_pipeline_new, ts_pipeline_train_step, ts_pipeline_stats) */

/* ---- tile (spatial) parallelism ---------------------------------------------------------------- */
/* (ts_nn_tile_parallel_new) */

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_PARALLEL_H */
