/*
 * tessera/export.h — exporting a model for inference (ONNX).
 *
 * ts_export_onnx runs the model on an example input, in eval mode and
 * without autograd, records every op the forward calls (as torch.onnx.export
 * traces) and writes the recorded graph as an ONNX model: IR version 8, opset
 * 17, parameters and buffers as initializers under their state-dict names
 * ("0.weight", "layer1.0.bn1.running_mean"), the input's first dimension as the
 * symbolic batch "N". Any forward exports — Sequential, residual blocks, a
 * forward calling ops directly — as long as every op it runs has an ONNX
 * mapping and its tensors come from ops, parameters, buffers or constants.
 * The forward runs twice: a second traced run on an input derived from the
 * example (float values moved, or integer rows rolled) must run the same ops
 * and see the same constants, which catches control flow on the input's
 * values and tensors computed outside the op layer.
 *
 * Errors (the message names the op and its position in the trace):
 *   TS_ERR_UNSUPPORTED  an op without an ONNX mapping (cross_entropy), an op
 *                       in a training form (batch-statistics batchnorm,
 *                       dropout drawing a mask), a tensor derived from the
 *                       input outside the traced ops (a view, a clone), ops
 *                       that change with the input's values, a wrapper that
 *                       runs the model on worker threads (DataParallel,
 *                       TileParallel, PipelineParallel: export its child);
 *   TS_ERR_IO           the file could not be written (an existing file is
 *                       left as it was: the model goes to "<path>.tmp.<pid>"
 *                       and is renamed into place);
 *   and whatever the forward itself returns.
 */
#ifndef TESSERA_EXPORT_H
#define TESSERA_EXPORT_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_onnx_opts {
    const char *input_name;  /* the graph input's name; NULL: "input" */
    const char *output_name; /* the graph output's name; NULL: "output" */
    bool dynamic_batch;      /* dimension 0 of the input (and of results that keep it) is "N";
                                false: the example's sizes are fixed in the graph */
} ts_onnx_opts;

#define TS_ONNX_OPTS_INIT ((ts_onnx_opts){NULL, NULL, true})

/* Writes m as an ONNX model to path. example_input (borrowed; any batch size)
 * is fed through m's forward once; m's training flag and the thread's grad mode
 * are restored afterwards, and no parameter or buffer changes. opts may be NULL
 * (TS_ONNX_OPTS_INIT). */
ts_status ts_export_onnx(ts_module *m, const ts_tensor *example_input, const char *path, const ts_onnx_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_EXPORT_H */
