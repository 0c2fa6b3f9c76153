/*
 * ops/trace.c — the thread-local op tracer (ops/trace.h): one callback per
 * thread, called by every traced op after it succeeded.
 */
#include "ops/trace.h"

static _Thread_local ts__trace_fn tracer_fn;
static _Thread_local void *tracer_user;

static const char *const op_names[TS_OP_COUNT] = {
    [TS_OP_CONV2D] = "conv2d",
    [TS_OP_BATCHNORM2D] = "batchnorm2d",
    [TS_OP_RELU] = "relu",
    [TS_OP_ADD] = "add",
    [TS_OP_SUB] = "sub",
    [TS_OP_MUL] = "mul",
    [TS_OP_SCALE] = "scale",
    [TS_OP_SUM] = "sum",
    [TS_OP_MEAN] = "mean",
    [TS_OP_MATMUL] = "matmul",
    [TS_OP_LINEAR] = "linear",
    [TS_OP_MAXPOOL2D] = "maxpool2d",
    [TS_OP_AVGPOOL2D] = "avgpool2d",
    [TS_OP_GLOBAL_AVGPOOL2D] = "global_avgpool2d",
    [TS_OP_EMBEDDING] = "embedding",
    [TS_OP_RESHAPE] = "reshape",
    [TS_OP_FLATTEN] = "flatten",
    [TS_OP_CONCAT] = "concat",
    [TS_OP_SLICE] = "slice",
    [TS_OP_DROPOUT] = "dropout",
    [TS_OP_LOG_SOFTMAX] = "log_softmax",
    [TS_OP_CROSS_ENTROPY] = "cross_entropy",
    [TS_OP_MSE_LOSS] = "mse_loss",
    [TS_OP_TO_DEVICE] = "to_device",
    [TS_OP_DIV] = "div",
    [TS_OP_SIGMOID] = "sigmoid",
    [TS_OP_TANH] = "tanh",
    [TS_OP_SILU] = "silu",
    [TS_OP_GELU] = "gelu",
    [TS_OP_SOFTMAX] = "softmax",
    [TS_OP_SUM_DIMS] = "sum_dims",
    [TS_OP_MEAN_DIMS] = "mean_dims",
    [TS_OP_MAX_DIM] = "max_dim",
    [TS_OP_PERMUTE] = "permute",
    [TS_OP_ADAPTIVE_AVGPOOL2D] = "adaptive_avgpool2d",
    [TS_OP_LAYER_NORM] = "layer_norm",
    [TS_OP_GROUP_NORM] = "group_norm",
    [TS_OP_CAST] = "to_dtype",
    [TS_OP_ATTENTION] = "scaled_dot_product_attention",
};

const char *ts__op_name(ts__op_kind k) {
    return (k >= 0 && k < TS_OP_COUNT && op_names[k]) ? op_names[k] : "?";
}

ts_status ts__trace_begin(ts__trace_fn fn, void *user) {
    TS_ARG(fn, "ts__trace_begin: NULL tracer");
    if (tracer_fn) return ts_error(TS_ERR_STATE, "trace: this thread is already tracing (traces do not nest)");
    tracer_fn = fn;
    tracer_user = user;
    return TS_OK;
}

void ts__trace_end(void) {
    tracer_fn = NULL;
    tracer_user = NULL;
}

bool ts__trace_active(void) { return tracer_fn != NULL; }

ts_status ts__trace_op(ts__op_kind op, int nin, const ts_tensor *const *in, const ts_tensor *out,
                       const ts__trace_attrs *a) {
    if (!tracer_fn) return TS_OK;
    static const ts__trace_attrs none = {{0}, {0}};
    ts__trace_event ev = {op, nin, in, out, a ? a : &none};
    /* the callback may run ops itself (copies to the host): they are not part of the trace */
    ts__trace_fn fn = tracer_fn;
    void *user = tracer_user;
    tracer_fn = NULL;
    ts_status st = fn(user, &ev);
    tracer_fn = fn;
    tracer_user = user;
    return st;
}
