/*
 * ops/trace.h — recording the ops a thread runs, for export (internal).
 *
 * torch.onnx.export's approach: run the model once and record every op it
 * calls, rather than walk module types, so any forward (a Sequential, a
 * residual block, a user's functional forward calling ops directly) exports
 * the same way. The op layer owns this header (it sits below src/nn and
 * src/export): while a tracer is installed on the calling thread, each op
 * reports itself after it succeeded, with its inputs, its new result and its
 * attributes, through ts__trace_op. The tracer is thread-local, so other
 * threads' ops are never recorded.
 *
 * Adding an op to tracing: an enum entry below (with its inputs and attributes
 * documented), its name in trace.c, and one ts__trace_op call at the end of the
 * op, just before it hands out its result. An exporter (src/export/onnx.c)
 * then maps the kind in its table; a kind without a mapping fails the export
 * with a message naming the op.
 */
#ifndef TS_OPS_TRACE_H
#define TS_OPS_TRACE_H

#include "tensor/tensor.h"

/* The recorded op kinds. in[]: the op's inputs in this order (an absent
 * optional input is NULL); i[] / f[]: the attributes, as the op normalised
 * them (negative dims wrapped, stride 0 replaced by the kernel, ...). */
typedef enum ts__op_kind {
    TS_OP_CONV2D,           /* in: x, w, b|NULL; i: stride h w, padding h w, dilation h w, groups */
    TS_OP_BATCHNORM2D,      /* in: x, weight|NULL, bias|NULL, running_mean|NULL, running_var|NULL;
                               i[0]: training (batch statistics); f[0]: eps */
    TS_OP_RELU,             /* in: x */
    TS_OP_ADD,              /* in: a, b (broadcast) */
    TS_OP_SUB,              /* in: a, b (broadcast) */
    TS_OP_MUL,              /* in: a, b (broadcast) */
    TS_OP_SCALE,            /* in: a; f[0]: s */
    TS_OP_SUM,              /* in: x (all elements -> []) */
    TS_OP_MEAN,             /* in: x (all elements -> []) */
    TS_OP_MATMUL,           /* in: a (M, K), b (K, N) */
    TS_OP_LINEAR,           /* in: x (N, in), w (out, in), b|NULL */
    TS_OP_MAXPOOL2D,        /* in: x; i: kernel h w, stride h w, padding h w, dilation h w, ceil_mode */
    TS_OP_AVGPOOL2D,        /* in: x; i: as maxpool2d (dilation 1 1), i[9]: exclude_pad (count_include_pad off) */
    TS_OP_GLOBAL_AVGPOOL2D, /* in: x */
    TS_OP_EMBEDDING,        /* in: idx (I64), weight */
    TS_OP_RESHAPE,          /* in: x; i[0]: ndim, i[1..ndim]: the shape asked for (one may be -1) */
    TS_OP_FLATTEN,          /* in: x; i[0]: start_dim (wrapped) */
    TS_OP_CONCAT,           /* in: the n tensors; i[0]: dim (wrapped) */
    TS_OP_SLICE,            /* in: x; i[0]: dim (wrapped), i[1]: start, i[2]: end (clamped) */
    TS_OP_DROPOUT,          /* in: x; i[0]: training; f[0]: p (recorded only when it draws a mask) */
    TS_OP_LOG_SOFTMAX,      /* in: x; i[0]: dim (wrapped) */
    TS_OP_CROSS_ENTROPY,    /* in: logits, target; f[0]: label_smoothing */
    TS_OP_MSE_LOSS,         /* in: pred, target */
    TS_OP_TO_DEVICE,        /* in: x (recorded only when it copies) */
    TS_OP_DIV,              /* in: a, b (broadcast) */
    TS_OP_SIGMOID,          /* in: x */
    TS_OP_TANH,             /* in: x */
    TS_OP_SILU,             /* in: x */
    TS_OP_GELU,             /* in: x; i[0]: tanh approximation */
    TS_OP_SOFTMAX,          /* in: x; i[0]: dim (wrapped) */
    TS_OP_SUM_DIMS,         /* in: x; i[0]: keepdim, i[1]: bit d set when dim d is reduced */
    TS_OP_MEAN_DIMS,        /* in: x; as sum_dims */
    TS_OP_MAX_DIM,          /* in: x; i[0]: dim (wrapped), i[1]: keepdim; out: the values (indices not traced) */
    TS_OP_PERMUTE,          /* in: x; i[0]: ndim, i[1..ndim]: the permutation (transpose too) */
    TS_OP_ADAPTIVE_AVGPOOL2D, /* in: x (N, C, H, W) or (C, H, W); i[0], i[1]: output h, w */
    TS_OP_LAYER_NORM,       /* in: x, weight|NULL, bias|NULL; i[0]: normalized_ndim; f[0]: eps */
    TS_OP_GROUP_NORM,       /* in: x (N, C, *), weight|NULL, bias|NULL; i[0]: num_groups; f[0]: eps */
    TS_OP_CAST,             /* in: x; i[0]: the ts_dtype converted to */
    TS_OP_ATTENTION,        /* in: q, k, v (B, H, T, D); i[0]: causal; f[0]: scale (0 resolved to 1/sqrt(D)) */
    TS_OP_COUNT
} ts__op_kind;

/* The op's public name without "ts_" ("conv2d"); "?" for a kind out of range. */
const char *ts__op_name(ts__op_kind k);

#define TS_TRACE_MAX_INTS (2 + TS_MAX_DIMS)
typedef struct ts__trace_attrs {
    int64_t i[TS_TRACE_MAX_INTS];
    double f[2];
} ts__trace_attrs;

/* One recorded call. Everything is borrowed for the duration of the callback
 * (retain what you keep). */
typedef struct ts__trace_event {
    ts__op_kind op;
    int nin;
    const ts_tensor *const *in;
    const ts_tensor *out;
    const ts__trace_attrs *a; /* never NULL */
} ts__trace_event;

/* Called for every recorded op; a failing status fails the op (which then
 * releases its result and returns that status). */
typedef ts_status (*ts__trace_fn)(void *user, const ts__trace_event *ev);

/* Installs fn (with user) as the calling thread's tracer. TS_ERR_STATE when one
 * is already installed: traces do not nest. */
ts_status ts__trace_begin(ts__trace_fn fn, void *user);
/* Removes the calling thread's tracer (nothing when none). */
void ts__trace_end(void);
bool ts__trace_active(void);

/* The ops' hook: TS_OK at once when the thread has no tracer; else the
 * tracer's status for this event. a may be NULL (no attributes). */
ts_status ts__trace_op(ts__op_kind op, int nin, const ts_tensor *const *in, const ts_tensor *out,
                       const ts__trace_attrs *a);

#endif
