/*
 * export/onnx.c — ts_export_onnx: trace one forward, write it as an ONNX model.
 *
 * 1. Trace. The model runs on the example input in eval mode under
 *    no-grad, with a tracer (ops/trace.h) on this thread: every op reports
 *    (kind, inputs, result, attributes). The log retains each input and
 *    result, so no tensor seen during the trace is freed and no address is
 *    reused for another tensor: a tensor's pointer is its identity.
 * 2. Prune and check. Walking the log backwards from the forward's result
 *    marks the ops it depends on; the rest (an op whose result was dropped) is
 *    skipped. A second traced run on another input (values moved, or int64
 *    rows rolled) must run the same ops, and every tensor that would become a
 *    constant (read by an op, made by none, not the model's) must hold the
 *    same values: otherwise the forward branches on the input's values or
 *    computed something outside the op layer (a clone, another thread), and the
 *    export fails rather than freeze an input-dependent value into the graph.
 *    Wrappers that run the model on worker threads (DataParallel, TileParallel,
 *    PipelineParallel) are refused up front.
 * 3. Name. The example input is the graph input; an op's result is the value
 *    "<op>_<k>" (k: its position in the trace) or, for the forward's result,
 *    the graph output. Any other tensor an op reads is an initializer: a
 *    parameter or buffer of the model (matched by pointer, or as the same view
 *    of the same storage, as ts_module_state_dict's detached aliases are)
 *    under its state-dict name, else a constant "const_<k>" with the tensor's
 *    current values. A tensor that shares storage with the input or an op's
 *    result but did not come out of a traced op (a view made outside the op
 *    layer) cannot be expressed: that is an error, not a silent constant.
 * 4. Map. A table indexed by ts__op_kind gives each op its writer; an op
 *    without one fails the export with its name. Each writer emits one or a
 *    few ONNX nodes (opset 17) and says whether its result keeps the batch
 *    dimension (dim 0 of the input, "N" in the graph): reshapes then write 0
 *    ("copy this dimension") instead of the example's batch size, so the graph
 *    runs for any batch.
 * 5. Encode (export/pb.h): ModelProto{ir_version 8, producer "tessera",
 *    opset_import {"" 17}, graph{node*, initializer* (TensorProto with
 *    little-endian raw_data), input, output (ValueInfoProto with shapes)}},
 *    written to "<path>.tmp.<pid>" and renamed into place.
 *
 * Limits: in-place changes to a traced result (ts_tensor_copy_ into it) are
 * not seen; a reshape whose first dimension is neither the batch nor -1, or a
 * slice/concat along dim 0, fixes the graph to the example's batch size there.
 * Pooling with ceil_mode whose last window would start in the right padding:
 * Tessera, PyTorch and onnxruntime drop that window, ONNX's shape inference
 * counts it (only the inferred shapes of such graphs are off, not the results).
 */
#include "export/pb.h"
#include "nn/module.h"
#include "ops/trace.h"
#include "tensor/tensor.h"
#include "tessera/export.h"

#include <math.h>
#include <stdio.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "export/onnx.c writes tensors' host bytes as ONNX raw_data, which is little-endian"
#endif

/* ---- ONNX field numbers and enums (onnx/onnx.proto) ------------------------------------------ */
enum {
    MODEL_IR_VERSION = 1, MODEL_PRODUCER_NAME = 2, MODEL_PRODUCER_VERSION = 3, MODEL_GRAPH = 7,
    MODEL_OPSET_IMPORT = 8,
    OPSET_DOMAIN = 1, OPSET_VERSION = 2,
    GRAPH_NODE = 1, GRAPH_NAME = 2, GRAPH_INITIALIZER = 5, GRAPH_INPUT = 11, GRAPH_OUTPUT = 12,
    NODE_INPUT = 1, NODE_OUTPUT = 2, NODE_NAME = 3, NODE_OP_TYPE = 4, NODE_ATTRIBUTE = 5,
    ATTR_NAME = 1, ATTR_F = 2, ATTR_I = 3, ATTR_INTS = 8, ATTR_TYPE = 20,
    TENSOR_DIMS = 1, TENSOR_DATA_TYPE = 2, TENSOR_NAME = 8, TENSOR_RAW_DATA = 9,
    VALUE_NAME = 1, VALUE_TYPE = 2,
    TYPE_TENSOR = 1, TENSOR_TYPE_ELEM = 1, TENSOR_TYPE_SHAPE = 2,
    SHAPE_DIM = 1, DIM_VALUE = 1, DIM_PARAM = 2,
};
enum { ATTR_TYPE_FLOAT = 1, ATTR_TYPE_INT = 2, ATTR_TYPE_INTS = 7 };
enum { ONNX_FLOAT = 1, ONNX_UINT8 = 2, ONNX_INT32 = 6, ONNX_INT64 = 7, ONNX_FLOAT16 = 10, ONNX_BFLOAT16 = 16 };

#define ONNX_IR_VERSION 8
#define ONNX_OPSET 17
#define NAME_MAX_LEN 512

/* ---- the trace log ----------------------------------------------------------------------------- */
typedef struct rec {
    ts__op_kind op;
    int nin;
    ts_tensor **in; /* retained; NULL entries for absent optional inputs */
    ts_tensor *out; /* retained */
    ts__trace_attrs a;
    bool live;
} rec;

typedef struct trace_log {
    rec *r;
    int n, cap;
} trace_log;

static ts_status record(void *user, const ts__trace_event *ev) {
    trace_log *L = user;
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 64;
        rec *r = ts__realloc(L->r, (size_t)cap * sizeof *r);
        if (!r) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory recording op %s", ts__op_name(ev->op));
        L->r = r;
        L->cap = cap;
    }
    ts_tensor **in = ts__calloc((size_t)(ev->nin > 0 ? ev->nin : 1), sizeof *in);
    if (!in) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory recording op %s", ts__op_name(ev->op));
    for (int i = 0; i < ev->nin; i++) in[i] = ev->in[i] ? ts_tensor_retain((ts_tensor *)ev->in[i]) : NULL;
    L->r[L->n++] = (rec){ev->op, ev->nin, in, ts_tensor_retain((ts_tensor *)ev->out), *ev->a, false};
    return TS_OK;
}

static void log_free(trace_log *L) {
    for (int i = 0; i < L->n; i++) {
        for (int k = 0; k < L->r[i].nin; k++) ts_tensor_release(L->r[i].in[k]);
        free(L->r[i].in);
        ts_tensor_release(L->r[i].out);
    }
    free(L->r);
    *L = (trace_log){NULL, 0, 0};
}

/* Marks the ops y depends on (quadratic in the trace length, which is hundreds for a ResNet). */
static void mark_live(trace_log *L, const ts_tensor *y) {
    for (int j = L->n - 1; j >= 0; j--) {
        rec *r = &L->r[j];
        r->live = r->out == y;
        for (int k = j + 1; k < L->n && !r->live; k++) {
            if (!L->r[k].live) continue;
            for (int i = 0; i < L->r[k].nin; i++)
                if (L->r[k].in[i] == r->out) r->live = true;
        }
    }
}

/* ---- values and the exporter -------------------------------------------------------------------- */
typedef struct value {
    const ts_tensor *t; /* borrowed: kept alive by the log, the model or the caller */
    char *name;
    bool batch;  /* dim 0 is the batch */
    bool traced; /* the input or an op's result (depends on the input) */
} value;

typedef struct exporter {
    ts__pb pb;
    value *v;
    int nv, capv;
    ts_tensor_list state; /* the model's live parameters and buffers, with their names */
    int nconst;
    bool dynamic;
} exporter;

static ts_status add_value(exporter *e, const ts_tensor *t, const char *name, bool batch, bool traced) {
    if (e->nv == e->capv) {
        int cap = e->capv ? 2 * e->capv : 128;
        value *v = ts__realloc(e->v, (size_t)cap * sizeof *v);
        if (!v) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory naming values");
        e->v = v;
        e->capv = cap;
    }
    char *copy = ts__strdup(name);
    if (!copy) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory naming values");
    e->v[e->nv++] = (value){t, copy, batch, traced};
    return TS_OK;
}

static const value *find_value(const exporter *e, const ts_tensor *t) {
    for (int i = 0; i < e->nv; i++)
        if (e->v[i].t == t) return &e->v[i];
    return NULL;
}

static bool onnx_dtype(ts_dtype dt, int *out) {
    switch (dt) {
    case TS_F32: *out = ONNX_FLOAT; return true;
    case TS_I64: *out = ONNX_INT64; return true;
    case TS_I32: *out = ONNX_INT32; return true;
    case TS_U8: *out = ONNX_UINT8; return true;
    case TS_F16: *out = ONNX_FLOAT16; return true;
    case TS_BF16: *out = ONNX_BFLOAT16; return true;
    default: return false;
    }
}

/* An initializer (TensorProto) from host data. */
static ts_status write_const(exporter *e, const char *name, ts_dtype dt, int ndim, const int64_t *shape,
                             const void *data) {
    int ot;
    if (!onnx_dtype(dt, &ot))
        return ts_error(TS_ERR_UNSUPPORTED, "tensor '%s' has dtype %s, which ONNX export does not write", name,
                        ts_dtype_name(dt));
    ts__pb *w = &e->pb;
    size_t m = ts__pb_begin(w, GRAPH_INITIALIZER);
    for (int d = 0; d < ndim; d++) ts__pb_int(w, TENSOR_DIMS, shape[d]);
    ts__pb_int(w, TENSOR_DATA_TYPE, ot);
    ts__pb_string(w, TENSOR_NAME, name);
    ts__pb_bytes(w, TENSOR_RAW_DATA, data, (size_t)ts__numel(ndim, shape) * ts_dtype_size(dt));
    ts__pb_end(w, m);
    return ts__pb_status(w, "ts_export_onnx");
}

/* An initializer holding t's current values (copied to the host). */
static ts_status write_tensor(exporter *e, const char *name, const ts_tensor *t) {
    size_t nb = ts_tensor_nbytes(t);
    void *host = ts__malloc(nb ? nb : 1);
    if (!host) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory copying tensor '%s'", name);
    ts_status st = ts_tensor_to_host(t, host, nb);
    if (st == TS_OK) st = write_const(e, name, t->dtype, t->ndim, t->shape, host);
    free(host);
    return st;
}

static bool same_view(const ts_tensor *a, const ts_tensor *b) {
    if (a->storage != b->storage || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d])) return false;
    return true;
}

/* The graph name of a tensor an op reads; writes its initializer the first time. */
static ts_status resolve(exporter *e, const ts_tensor *t, const char **name) {
    const value *v = find_value(e, t);
    if (v) {
        *name = v->name;
        return TS_OK;
    }
    const char *state_name = NULL;
    for (int i = 0; i < e->state.n && !state_name; i++)
        if (e->state.tensors[i] == t) state_name = e->state.names[i];
    for (int i = 0; i < e->state.n && !state_name; i++)
        if (same_view(e->state.tensors[i], t)) state_name = e->state.names[i];
    char buf[64];
    if (!state_name) {
        for (int i = 0; i < e->nv; i++)
            if (e->v[i].traced && e->v[i].t->storage == t->storage) {
                char s[96];
                return ts_error(TS_ERR_UNSUPPORTED,
                                "a tensor of shape %s shares memory with '%s' but was not made by a traced op (a view "
                                "made outside the op layer?); use ts_reshape/ts_slice/... so the export can follow it",
                                ts_shape_str(t->ndim, t->shape, s, sizeof s), e->v[i].name);
            }
        snprintf(buf, sizeof buf, "const_%d", e->nconst++);
        state_name = buf;
    }
    TS_TRY(write_tensor(e, state_name, t));
    TS_TRY(add_value(e, t, state_name, false, false));
    *name = e->v[e->nv - 1].name;
    return TS_OK;
}

/* ---- checks before writing ------------------------------------------------------------------------- */
/* Wrappers whose forward runs the model on other threads: the trace (this thread's) would miss it. */
static ts_status refuse_wrappers(const ts_module *m, const char *path) {
    ts_module_kind_id k = ts_module_kind(m);
    if (k == TS_MODULE_DATA_PARALLEL || k == TS_MODULE_TILE_PARALLEL || k == TS_MODULE_PIPELINE_PARALLEL)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "module '%s' is a %s, whose forward runs on device worker threads that the trace does not "
                        "see; export the model it wraps (its child \"module\") instead",
                        path[0] ? path : "(root)", ts_module_type_name(m));
    for (int i = 0; i < m->nchildren; i++) {
        char sub[NAME_MAX_LEN];
        snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", m->child_names[i]);
        TS_TRY(refuse_wrappers(m->children[i], sub));
    }
    return TS_OK;
}

static ts_status trace_forward(ts_module *m, const ts_tensor *x, trace_log *L, ts_tensor **y) {
    TS_TRY(ts__trace_begin(record, L));
    ts_status st = ts_module_forward(m, x, y);
    ts__trace_end();
    return st;
}

/* A second input unlike x: F32 values moved (0.75 v + 0.125), other dtypes with two or more rows
 * rolled by one row; *out NULL when neither applies (an int64 batch of one). */
static ts_status second_input(const ts_tensor *x, ts_tensor **out) {
    *out = NULL;
    size_t nb = ts_tensor_nbytes(x);
    bool f32 = x->dtype == TS_F32, roll = !f32 && x->ndim >= 1 && x->shape[0] >= 2;
    if (!f32 && !roll) return TS_OK;
    char *a = ts__malloc(nb ? nb : 1), *b = ts__malloc(nb ? nb : 1);
    ts_status st = (a && b) ? ts_tensor_to_host(x, a, nb) : ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
    if (st == TS_OK && f32) {
        for (size_t i = 0; i < nb / sizeof(float); i++) ((float *)b)[i] = 0.75f * ((const float *)a)[i] + 0.125f;
    } else if (st == TS_OK) {
        size_t row = nb / (size_t)x->shape[0];
        memcpy(b, a + row, nb - row);
        memcpy(b + nb - row, a, row);
    }
    if (st == TS_OK) st = ts_tensor_empty(x->storage->device, x->dtype, x->ndim, x->shape, out);
    if (st == TS_OK) st = ts_tensor_from_host(*out, b, nb);
    free(a);
    free(b);
    return st;
}

static bool is_state(const ts_tensor_list *s, const ts_tensor *t) {
    for (int i = 0; i < s->n; i++)
        if (s->tensors[i] == t || same_view(s->tensors[i], t)) return true;
    return false;
}

/* t is the input or the result of an op before record j. */
static bool made_by_trace(const trace_log *L, int j, const ts_tensor *x, const ts_tensor *t) {
    if (t == x) return true;
    for (int k = 0; k < j; k++)
        if (L->r[k].out == t) return true;
    return false;
}

static ts_status equal_values(const ts_tensor *a, const ts_tensor *b, bool *eq) {
    *eq = false;
    if (a->dtype != b->dtype || !ts__same_shape(a, b)) return TS_OK;
    size_t nb = ts_tensor_nbytes(a);
    char *p = ts__malloc(nb ? nb : 1), *q = ts__malloc(nb ? nb : 1);
    ts_status st = (p && q) ? ts_tensor_to_host(a, p, nb) : ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
    if (st == TS_OK) st = ts_tensor_to_host(b, q, nb);
    if (st == TS_OK) *eq = memcmp(p, q, nb) == 0;
    free(p);
    free(q);
    return st;
}

/* The trace A of the example against the trace B of a second input: the same ops, and every tensor
 * a live op of A reads that is neither traced nor the model's (what would become a constant) equal
 * in B. A constant that changes with the input was computed outside the traced ops. */
static ts_status check_second_run(const trace_log *A, const trace_log *B, const ts_tensor *x,
                                  const ts_tensor_list *state) {
    if (A->n != B->n)
        return ts_error(TS_ERR_UNSUPPORTED,
                        "the forward ran %d ops on the example input and %d on another input: which ops run depends "
                        "on the input's values, which a traced graph cannot express",
                        A->n, B->n);
    for (int j = 0; j < A->n; j++) {
        const rec *a = &A->r[j], *b = &B->r[j];
        if (a->op != b->op || a->nin != b->nin)
            return ts_error(TS_ERR_UNSUPPORTED,
                            "op %d is %s on the example input but %s on another input: which ops run depends on the "
                            "input's values, which a traced graph cannot express",
                            j, ts__op_name(a->op), ts__op_name(b->op));
        if (!a->live) continue;
        for (int i = 0; i < a->nin; i++) {
            const ts_tensor *t = a->in[i];
            if (!t || made_by_trace(A, j, x, t) || is_state(state, t)) continue;
            char sh[96];
            for (int k = -1; k < j; k++) {
                const ts_tensor *v = k < 0 ? x : A->r[k].out;
                if (v->storage != t->storage) continue;
                char who[64] = "the input";
                if (k >= 0) snprintf(who, sizeof who, "the result of op %d (%s)", k, ts__op_name(A->r[k].op));
                return ts_error(TS_ERR_UNSUPPORTED,
                                "op %d (%s) reads a tensor of shape %s that shares memory with %s but was not made "
                                "by a traced op (a view made outside the op layer?); use ts_reshape/ts_slice/... so "
                                "the export can follow it",
                                j, ts__op_name(a->op), ts_shape_str(t->ndim, t->shape, sh, sizeof sh), who);
            }
            bool eq = false;
            if (b->in[i]) TS_TRY(equal_values(t, b->in[i], &eq));
            if (!eq) {
                return ts_error(TS_ERR_UNSUPPORTED,
                                "op %d (%s) reads a tensor of shape %s that no traced op made, yet it changes with the "
                                "input: it was computed outside the op layer (a clone or copy, another thread, random "
                                "values); compute it with ops so the export can follow it",
                                j, ts__op_name(a->op), ts_shape_str(t->ndim, t->shape, sh, sizeof sh));
            }
        }
    }
    return TS_OK;
}

/* ---- nodes ----------------------------------------------------------------------------------------- */
typedef struct attr {
    const char *name;
    int type;
    int64_t i;
    float f;
    int n;
    const int64_t *ints;
} attr;
#define A_INT(nm, v) ((attr){(nm), ATTR_TYPE_INT, (v), 0.0f, 0, NULL})
#define A_FLOAT(nm, v) ((attr){(nm), ATTR_TYPE_FLOAT, 0, (v), 0, NULL})
#define A_INTS(nm, cnt, p) ((attr){(nm), ATTR_TYPE_INTS, 0, 0.0f, (cnt), (p)})

/* A NodeProto: inputs (NULL: an absent optional input, written ""), one output, attributes. */
static ts_status node(exporter *e, const char *op_type, const char *name, int nin, const char *const *in,
                      const char *out, int nattr, const attr *at) {
    ts__pb *w = &e->pb;
    size_t m = ts__pb_begin(w, GRAPH_NODE);
    for (int i = 0; i < nin; i++) ts__pb_string(w, NODE_INPUT, in[i] ? in[i] : "");
    ts__pb_string(w, NODE_OUTPUT, out);
    ts__pb_string(w, NODE_NAME, name);
    ts__pb_string(w, NODE_OP_TYPE, op_type);
    for (int k = 0; k < nattr; k++) {
        size_t a = ts__pb_begin(w, NODE_ATTRIBUTE);
        ts__pb_string(w, ATTR_NAME, at[k].name);
        ts__pb_int(w, ATTR_TYPE, at[k].type);
        if (at[k].type == ATTR_TYPE_INT) ts__pb_int(w, ATTR_I, at[k].i);
        if (at[k].type == ATTR_TYPE_FLOAT) ts__pb_float(w, ATTR_F, at[k].f);
        if (at[k].type == ATTR_TYPE_INTS)
            for (int j = 0; j < at[k].n; j++) ts__pb_int(w, ATTR_INTS, at[k].ints[j]);
        ts__pb_end(w, a);
    }
    ts__pb_end(w, m);
    return ts__pb_status(w, "ts_export_onnx");
}

/* What a mapping gets: the record, its inputs' names and values, the output's name. */
typedef struct emit_args {
    const rec *r;
    const char **in;     /* nin names; NULL for absent inputs */
    const value **inv;   /* nin values; NULL for absent inputs */
    const char *out;     /* the result's value name */
    const char *onnx;    /* the table's ONNX op type */
    char node_name[NAME_MAX_LEN];
    bool batch;          /* set: whether the result's dim 0 is the batch (preset by the default rule) */
} emit_args;

typedef ts_status (*emit_fn)(exporter *e, emit_args *x);

/* Name of an auxiliary constant of node x: "<out>_<what>". */
static const char *aux_name(const emit_args *x, const char *what, char *buf, size_t cap) {
    snprintf(buf, cap, "%s_%s", x->out, what);
    return buf;
}

/* A mapping that needs more than one node writes the extra ones with step(): named "<node>/<what>",
 * computing intermediate values it names with aux_name(x, "<what>", ...); the last node writes x->out.
 * SiLU, for instance: step(e, x, "sigmoid", "Sigmoid", 1, x->in, aux_name(x, "sigmoid", s, sizeof s), 0,
 * NULL), then node(e, "Mul", x->node_name, 2, (const char *[]){x->in[0], s}, x->out, 0, NULL). */
static ts_status step(exporter *e, const emit_args *x, const char *what, const char *op_type, int nin,
                      const char *const *in, const char *out, int nattr, const attr *at) {
    char name[NAME_MAX_LEN];
    snprintf(name, sizeof name, "%.400s/%.100s", x->node_name, what);
    return node(e, op_type, name, nin, in, out, nattr, at);
}

/* One node of the table's op type on the inputs present, no attributes (Relu, Add, Identity, ...). */
static ts_status emit_plain(exporter *e, emit_args *x) {
    int n = x->r->nin;
    while (n > 0 && !x->in[n - 1]) n--; /* trailing optional inputs left out */
    return node(e, x->onnx, x->node_name, n, x->in, x->out, 0, NULL);
}

static ts_status emit_conv(exporter *e, emit_args *x) {
    const int64_t *a = x->r->a.i;
    const ts_tensor *w = x->r->in[1];
    int64_t ks[2] = {w->shape[2], w->shape[3]}, st[2] = {a[0], a[1]}, pads[4] = {a[2], a[3], a[2], a[3]},
            dil[2] = {a[4], a[5]};
    attr at[] = {A_INTS("kernel_shape", 2, ks), A_INTS("strides", 2, st), A_INTS("pads", 4, pads),
                 A_INTS("dilations", 2, dil), A_INT("group", a[6])};
    return node(e, "Conv", x->node_name, x->in[2] ? 3 : 2, x->in, x->out, 5, at);
}

static ts_status emit_batchnorm(exporter *e, emit_args *x) {
    if (x->r->a.i[0])
        return ts_error(TS_ERR_UNSUPPORTED,
                        "batchnorm2d normalises with batch statistics (training mode, or a BatchNorm2d without "
                        "running statistics), which ONNX inference cannot express; export runs the model in eval "
                        "mode, so a functional forward must pass training = false");
    const char *in[5] = {x->in[0], x->in[1], x->in[2], x->in[3], x->in[4]};
    int64_t C = x->r->in[0]->shape[1];
    char sn[NAME_MAX_LEN], bn[NAME_MAX_LEN];
    float *ones = NULL;
    if (!in[1] || !in[2]) { /* affine=False: scale 1, bias 0 */
        if (!(ones = ts__calloc((size_t)C, sizeof *ones)))
            return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
        ts_status st = TS_OK;
        if (!in[2]) {
            st = write_const(e, aux_name(x, "bias", bn, sizeof bn), TS_F32, 1, &C, ones);
            in[2] = bn;
        }
        for (int64_t c = 0; c < C; c++) ones[c] = 1.0f;
        if (st == TS_OK && !in[1]) {
            st = write_const(e, aux_name(x, "scale", sn, sizeof sn), TS_F32, 1, &C, ones);
            in[1] = sn;
        }
        free(ones);
        TS_TRY(st);
    }
    attr at[] = {A_FLOAT("epsilon", (float)x->r->a.f[0])};
    return node(e, "BatchNormalization", x->node_name, 5, in, x->out, 1, at);
}

static ts_status emit_scale(exporter *e, emit_args *x) {
    char sn[NAME_MAX_LEN];
    float s = (float)x->r->a.f[0];
    TS_TRY(write_const(e, aux_name(x, "s", sn, sizeof sn), TS_F32, 0, NULL, &s));
    const char *in[2] = {x->in[0], sn};
    return node(e, "Mul", x->node_name, 2, in, x->out, 0, NULL);
}

static ts_status emit_reduce_all(exporter *e, emit_args *x) {
    attr at[] = {A_INT("keepdims", 0)};
    x->batch = false;
    return node(e, x->onnx, x->node_name, 1, x->in, x->out, 1, at);
}

static ts_status emit_linear(exporter *e, emit_args *x) {
    attr at[] = {A_INT("transB", 1)};
    x->batch = x->inv[0]->batch;
    return node(e, "Gemm", x->node_name, x->in[2] ? 3 : 2, x->in, x->out, 1, at);
}

static ts_status emit_pool(exporter *e, emit_args *x) {
    const int64_t *a = x->r->a.i;
    int64_t ks[2] = {a[0], a[1]}, st[2] = {a[2], a[3]}, pads[4] = {a[4], a[5], a[4], a[5]}, dil[2] = {a[6], a[7]};
    if (x->r->op == TS_OP_MAXPOOL2D) {
        attr at[] = {A_INTS("kernel_shape", 2, ks), A_INTS("strides", 2, st), A_INTS("pads", 4, pads),
                     A_INTS("dilations", 2, dil), A_INT("ceil_mode", a[8])};
        return node(e, "MaxPool", x->node_name, 1, x->in, x->out, 5, at);
    }
    attr at[] = {A_INTS("kernel_shape", 2, ks), A_INTS("strides", 2, st), A_INTS("pads", 4, pads),
                 A_INT("ceil_mode", a[8]), A_INT("count_include_pad", !a[9])};
    return node(e, "AveragePool", x->node_name, 1, x->in, x->out, 5, at);
}

static ts_status emit_embedding(exporter *e, emit_args *x) {
    const char *in[2] = {x->in[1], x->in[0]}; /* Gather(weight, indices) */
    attr at[] = {A_INT("axis", 0)};
    x->batch = x->inv[0]->batch;
    return node(e, "Gather", x->node_name, 2, in, x->out, 1, at);
}

/* Reshape to shape s (nd entries; 0 copies the input's dimension, -1 is inferred). */
static ts_status reshape_node(exporter *e, emit_args *x, int nd, const int64_t *s) {
    char sn[NAME_MAX_LEN];
    int64_t n = nd;
    TS_TRY(write_const(e, aux_name(x, "shape", sn, sizeof sn), TS_I64, 1, &n, s));
    const char *in[2] = {x->in[0], sn};
    return node(e, "Reshape", x->node_name, 2, in, x->out, 0, NULL);
}

static ts_status emit_reshape(exporter *e, emit_args *x) {
    const ts_tensor *in = x->r->in[0], *out = x->r->out;
    int nd = (int)x->r->a.i[0];
    int64_t s[TS_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        s[i] = x->r->a.i[1 + i];
        if (s[i] == 0) {
            char b[96];
            return ts_error(TS_ERR_UNSUPPORTED, "reshape to %s: a 0-sized dimension cannot be exported",
                            ts_shape_str(out->ndim, out->shape, b, sizeof b));
        }
    }
    x->batch = false;
    if (x->inv[0]->batch && nd >= 1 && in->ndim >= 1) {
        if (s[0] == in->shape[0]) { /* keeps the batch: copy it, whatever its size */
            s[0] = 0;
            x->batch = true;
        } else if (s[0] == -1 && out->shape[0] == in->shape[0]) {
            x->batch = true;
        }
    }
    return reshape_node(e, x, nd, s);
}

static ts_status emit_flatten(exporter *e, emit_args *x) {
    int d = (int)x->r->a.i[0];
    const ts_tensor *in = x->r->in[0];
    x->batch = x->inv[0]->batch && d >= 1;
    if (d == 1 && in->ndim >= 2) {
        attr at[] = {A_INT("axis", 1)};
        return node(e, "Flatten", x->node_name, 1, x->in, x->out, 1, at);
    }
    int64_t s[TS_MAX_DIMS];
    for (int i = 0; i < d; i++) s[i] = 0; /* dims before start_dim copied, the rest merged */
    s[d] = -1;
    return reshape_node(e, x, d + 1, s);
}

static ts_status emit_concat(exporter *e, emit_args *x) {
    attr at[] = {A_INT("axis", x->r->a.i[0])};
    if (x->r->a.i[0] == 0) x->batch = false;
    return node(e, "Concat", x->node_name, x->r->nin, x->in, x->out, 1, at);
}

static ts_status emit_slice(exporter *e, emit_args *x) {
    const int64_t *a = x->r->a.i;
    int64_t one = 1;
    char s0[NAME_MAX_LEN], s1[NAME_MAX_LEN], s2[NAME_MAX_LEN];
    TS_TRY(write_const(e, aux_name(x, "starts", s0, sizeof s0), TS_I64, 1, &one, &a[1]));
    TS_TRY(write_const(e, aux_name(x, "ends", s1, sizeof s1), TS_I64, 1, &one, &a[2]));
    TS_TRY(write_const(e, aux_name(x, "axes", s2, sizeof s2), TS_I64, 1, &one, &a[0]));
    if (a[0] == 0) x->batch = false;
    const char *in[4] = {x->in[0], s0, s1, s2};
    return node(e, "Slice", x->node_name, 4, in, x->out, 0, NULL);
}

static ts_status emit_dropout(exporter *e, emit_args *x) {
    if (x->r->a.i[0])
        return ts_error(TS_ERR_UNSUPPORTED,
                        "dropout in training mode (p = %g) draws a random mask; export runs the model in eval mode, "
                        "so a functional forward must pass training = false",
                        x->r->a.f[0]);
    return node(e, "Identity", x->node_name, 1, x->in, x->out, 0, NULL);
}

static ts_status emit_log_softmax(exporter *e, emit_args *x) {
    attr at[] = {A_INT("axis", x->r->a.i[0])};
    return node(e, "LogSoftmax", x->node_name, 1, x->in, x->out, 1, at);
}

/* mean((pred - target)^2) over all elements -> []. */
static ts_status emit_mse_loss(exporter *e, emit_args *x) {
    char d[NAME_MAX_LEN], sq[NAME_MAX_LEN];
    TS_TRY(step(e, x, "sub", "Sub", 2, x->in, aux_name(x, "diff", d, sizeof d), 0, NULL));
    TS_TRY(step(e, x, "square", "Mul", 2, (const char *[]){d, d}, aux_name(x, "square", sq, sizeof sq), 0, NULL));
    attr at[] = {A_INT("keepdims", 0)};
    x->batch = false;
    return node(e, "ReduceMean", x->node_name, 1, (const char *[]){sq}, x->out, 1, at);
}

/* GELU: erf form 0.5 x (1 + erf(x / sqrt 2)); tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (opset 17 has no Gelu operator). */
static ts_status emit_gelu(exporter *e, emit_args *x) {
    char c1[NAME_MAX_LEN], c2[NAME_MAX_LEN], c3[NAME_MAX_LEN], t1[NAME_MAX_LEN], t2[NAME_MAX_LEN],
        t3[NAME_MAX_LEN], t4[NAME_MAX_LEN], t5[NAME_MAX_LEN];
    const float one = 1.0f, half = 0.5f;
    TS_TRY(write_const(e, aux_name(x, "one", c1, sizeof c1), TS_F32, 0, NULL, &one));
    TS_TRY(write_const(e, aux_name(x, "half", c2, sizeof c2), TS_F32, 0, NULL, &half));
    if (!x->r->a.i[0]) {
        const float inv_sqrt2 = 0.70710678118654752f;
        TS_TRY(write_const(e, aux_name(x, "inv_sqrt2", c3, sizeof c3), TS_F32, 0, NULL, &inv_sqrt2));
        TS_TRY(step(e, x, "scale", "Mul", 2, (const char *[]){x->in[0], c3}, aux_name(x, "scaled", t1, sizeof t1), 0,
                    NULL));
        TS_TRY(step(e, x, "erf", "Erf", 1, (const char *[]){t1}, aux_name(x, "erf", t2, sizeof t2), 0, NULL));
    } else {
        const float k = 0.79788456080286536f, c = 0.044715f;
        char ck[NAME_MAX_LEN], cc[NAME_MAX_LEN], x2[NAME_MAX_LEN], x3[NAME_MAX_LEN];
        TS_TRY(write_const(e, aux_name(x, "k", ck, sizeof ck), TS_F32, 0, NULL, &k));
        TS_TRY(write_const(e, aux_name(x, "c", cc, sizeof cc), TS_F32, 0, NULL, &c));
        TS_TRY(step(e, x, "x2", "Mul", 2, (const char *[]){x->in[0], x->in[0]}, aux_name(x, "x2", x2, sizeof x2), 0,
                    NULL));
        TS_TRY(step(e, x, "x3", "Mul", 2, (const char *[]){x2, x->in[0]}, aux_name(x, "x3", x3, sizeof x3), 0, NULL));
        TS_TRY(step(e, x, "cx3", "Mul", 2, (const char *[]){x3, cc}, aux_name(x, "cx3", t3, sizeof t3), 0, NULL));
        TS_TRY(step(e, x, "inner", "Add", 2, (const char *[]){x->in[0], t3}, aux_name(x, "inner", t4, sizeof t4), 0,
                    NULL));
        TS_TRY(step(e, x, "scale", "Mul", 2, (const char *[]){t4, ck}, aux_name(x, "scaled", t1, sizeof t1), 0, NULL));
        TS_TRY(step(e, x, "tanh", "Tanh", 1, (const char *[]){t1}, aux_name(x, "erf", t2, sizeof t2), 0, NULL));
    }
    TS_TRY(step(e, x, "plus1", "Add", 2, (const char *[]){t2, c1}, aux_name(x, "plus1", t5, sizeof t5), 0, NULL));
    TS_TRY(step(e, x, "times_x", "Mul", 2, (const char *[]){t5, x->in[0]}, aux_name(x, "times_x", t3, sizeof t3), 0,
                NULL));
    return node(e, "Mul", x->node_name, 2, (const char *[]){t3, c2}, x->out, 0, NULL);
}

/* SiLU: x sigmoid(x). */
static ts_status emit_silu(exporter *e, emit_args *x) {
    char sg[NAME_MAX_LEN];
    TS_TRY(step(e, x, "sigmoid", "Sigmoid", 1, x->in, aux_name(x, "sigmoid", sg, sizeof sg), 0, NULL));
    return node(e, "Mul", x->node_name, 2, (const char *[]){x->in[0], sg}, x->out, 0, NULL);
}

static ts_status emit_softmax(exporter *e, emit_args *x) {
    attr at[] = {A_INT("axis", x->r->a.i[0])};
    return node(e, "Softmax", x->node_name, 1, x->in, x->out, 1, at);
}

/* sum_dims / mean_dims / max_dim: the reduced dims (a bit mask, or max_dim's one dim); opset 17's
 * ReduceSum takes them as an input, ReduceMean and ReduceMax as an attribute. */
static ts_status emit_reduce_dims(exporter *e, emit_args *x) {
    const ts_tensor *in = x->r->in[0];
    int64_t axes[TS_MAX_DIMS], keep;
    int64_t n = 0;
    if (x->r->op == TS_OP_MAX_DIM) {
        axes[n++] = x->r->a.i[0];
        keep = x->r->a.i[1];
    } else {
        keep = x->r->a.i[0];
        for (int d = 0; d < in->ndim; d++)
            if (x->r->a.i[1] & ((int64_t)1 << d)) axes[n++] = d;
    }
    x->batch = x->inv[0]->batch && in->ndim > 0 && !(n > 0 && axes[0] == 0);
    if (in->ndim == 0) /* a 0-d input: nothing to reduce */
        return node(e, "Identity", x->node_name, 1, x->in, x->out, 0, NULL);
    if (x->r->op == TS_OP_SUM_DIMS) {
        char an[NAME_MAX_LEN];
        TS_TRY(write_const(e, aux_name(x, "axes", an, sizeof an), TS_I64, 1, &n, axes));
        attr at[] = {A_INT("keepdims", keep)};
        return node(e, "ReduceSum", x->node_name, 2, (const char *[]){x->in[0], an}, x->out, 1, at);
    }
    attr at[] = {A_INTS("axes", (int)n, axes), A_INT("keepdims", keep)};
    return node(e, x->r->op == TS_OP_MAX_DIM ? "ReduceMax" : "ReduceMean", x->node_name, 1, x->in, x->out, 2, at);
}

static ts_status emit_permute(exporter *e, emit_args *x) {
    int64_t nd = x->r->a.i[0], perm[TS_MAX_DIMS];
    for (int64_t d = 0; d < nd; d++) perm[d] = x->r->a.i[1 + d];
    x->batch = x->inv[0]->batch && nd > 0 && perm[0] == 0;
    attr at[] = {A_INTS("perm", (int)nd, perm)};
    return node(e, "Transpose", x->node_name, 1, x->in, x->out, 1, at);
}

/* Scaled-dot-product attention as its formula: Softmax(MatMul(q, Transpose(k)) * scale [+ mask]) then MatMul with
 * v. The causal mask is a constant (Tq, Tk) of 0 and -inf (key j > query i: top-left aligned, as the op), so the
 * sequence lengths are the example's (the batch stays symbolic). */
static ts_status emit_attention(exporter *e, emit_args *x) {
    const int64_t tq = x->r->in[0]->shape[2], tk = x->r->in[1]->shape[2];
    char kt[NAME_MAX_LEN], s[NAME_MAX_LEN], sc[NAME_MAX_LEN], ss[NAME_MAX_LEN], mk[NAME_MAX_LEN], sm[NAME_MAX_LEN],
        p[NAME_MAX_LEN];
    const int64_t perm[4] = {0, 1, 3, 2};
    attr tr[] = {A_INTS("perm", 4, perm)}, ax[] = {A_INT("axis", -1)};
    const float scale = (float)x->r->a.f[0];
    x->batch = x->inv[0]->batch;
    TS_TRY(step(e, x, "kt", "Transpose", 1, (const char *[]){x->in[1]}, aux_name(x, "kt", kt, sizeof kt), 1, tr));
    TS_TRY(step(e, x, "qk", "MatMul", 2, (const char *[]){x->in[0], kt}, aux_name(x, "qk", s, sizeof s), 0, NULL));
    TS_TRY(write_const(e, aux_name(x, "scale", sc, sizeof sc), TS_F32, 0, NULL, &scale));
    TS_TRY(step(e, x, "scaled", "Mul", 2, (const char *[]){s, sc}, aux_name(x, "scaled", ss, sizeof ss), 0, NULL));
    const char *logits = ss;
    if (x->r->a.i[0]) {
        float *m = ts__malloc(sizeof(float) * (size_t)(tq * tk));
        if (!m) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory for a %lld x %lld attention mask",
                                (long long)tq, (long long)tk);
        for (int64_t i = 0; i < tq; i++)
            for (int64_t j = 0; j < tk; j++) m[i * tk + j] = j > i ? -INFINITY : 0.0f;
        ts_status st = write_const(e, aux_name(x, "causal_mask", mk, sizeof mk), TS_F32, 2, (int64_t[]){tq, tk}, m);
        free(m);
        TS_TRY(st);
        TS_TRY(step(e, x, "masked", "Add", 2, (const char *[]){ss, mk}, aux_name(x, "masked", sm, sizeof sm), 0, NULL));
        logits = sm;
    }
    TS_TRY(step(e, x, "softmax", "Softmax", 1, (const char *[]){logits}, aux_name(x, "p", p, sizeof p), 1, ax));
    return node(e, "MatMul", x->node_name, 2, (const char *[]){p, x->in[2]}, x->out, 0, NULL);
}

/* Uneven adaptive average pooling (windows of different sizes, possibly overlapping, which ONNX pooling
 * cannot say) as the linear map it is: x (N, C, H, W) -> Reshape (N, C, H*W) -> MatMul with the constant
 * P (H*W, OH*OW), P[h*W + w][i*OW + j] = 1 / |window (i, j)| where (h, w) is in it -> Reshape (N, C, OH, OW).
 * Windows are PyTorch's: rows [floor(i H / OH), ceil((i + 1) H / OH)), columns likewise. */
static ts_status adaptive_as_matmul(exporter *e, emit_args *x, int64_t H, int64_t W, int64_t oh, int64_t ow) {
    const int64_t hw = H * W, o = oh * ow;
    if (hw * o > ((int64_t)1 << 24))
        return ts_error(TS_ERR_UNSUPPORTED, "adaptive_avgpool2d from %lld x %lld to %lld x %lld: the pooling matrix "
                        "(%lld x %lld) is too large to export", (long long)H, (long long)W, (long long)oh, (long long)ow,
                        (long long)hw, (long long)o);
    float *P = ts__calloc((size_t)(hw * o), sizeof(float));
    if (!P) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
    for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
            int64_t h0 = i * H / oh, h1 = ((i + 1) * H + oh - 1) / oh, w0 = j * W / ow, w1 = ((j + 1) * W + ow - 1) / ow;
            float inv = 1.0f / (float)((h1 - h0) * (w1 - w0));
            for (int64_t h = h0; h < h1; h++)
                for (int64_t w = w0; w < w1; w++) P[(h * W + w) * o + i * ow + j] = inv;
        }
    char pn[NAME_MAX_LEN], s1[NAME_MAX_LEN], s2[NAME_MAX_LEN], flat[NAME_MAX_LEN], mm[NAME_MAX_LEN];
    int64_t pshape[2] = {hw, o}, n3 = 3, n4 = 4, shape1[3] = {0, 0, -1}, shape2[4] = {0, 0, oh, ow};
    ts_status st = write_const(e, aux_name(x, "pool_matrix", pn, sizeof pn), TS_F32, 2, pshape, P);
    free(P);
    TS_TRY(st);
    TS_TRY(write_const(e, aux_name(x, "flat_shape", s1, sizeof s1), TS_I64, 1, &n3, shape1));
    TS_TRY(write_const(e, aux_name(x, "out_shape", s2, sizeof s2), TS_I64, 1, &n4, shape2));
    TS_TRY(step(e, x, "flatten", "Reshape", 2, (const char *[]){x->in[0], s1}, aux_name(x, "flat", flat, sizeof flat),
                0, NULL));
    TS_TRY(step(e, x, "pool", "MatMul", 2, (const char *[]){flat, pn}, aux_name(x, "pooled", mm, sizeof mm), 0, NULL));
    return node(e, "Reshape", x->node_name, 2, (const char *[]){mm, s2}, x->out, 0, NULL);
}

/* Adaptive average pooling: GlobalAveragePool for a 1x1 output, AveragePool when the output divides
 * the input (equal windows), else the pooling matrix (adaptive_as_matmul). */
static ts_status emit_adaptive_avgpool(exporter *e, emit_args *x) {
    const ts_tensor *in = x->r->in[0];
    int64_t oh = x->r->a.i[0], ow = x->r->a.i[1], H = in->shape[in->ndim - 2], W = in->shape[in->ndim - 1];
    if (in->ndim != 4)
        return ts_error(TS_ERR_UNSUPPORTED, "adaptive_avgpool2d of a 3-d (C, H, W) input has no ONNX mapping; give "
                                            "it a batch dimension");
    if (oh == 1 && ow == 1) return node(e, "GlobalAveragePool", x->node_name, 1, x->in, x->out, 0, NULL);
    if (H % oh || W % ow) return adaptive_as_matmul(e, x, H, W, oh, ow);
    int64_t ks[2] = {H / oh, W / ow}, pads[4] = {0, 0, 0, 0};
    attr at[] = {A_INTS("kernel_shape", 2, ks), A_INTS("strides", 2, ks), A_INTS("pads", 4, pads)};
    return node(e, "AveragePool", x->node_name, 1, x->in, x->out, 3, at);
}

/* LayerNormalization over the last k dims (axis -k); opset 17 requires the scale: ones when absent. */
static ts_status emit_layer_norm(exporter *e, emit_args *x) {
    const ts_tensor *in = x->r->in[0];
    const int64_t k = x->r->a.i[0], D = ts__numel((int)k, in->shape + in->ndim - k);
    const char *ins[3] = {x->in[0], x->in[1], x->in[2]};
    char sn[NAME_MAX_LEN];
    if (!ins[1]) {
        float *ones = ts__malloc(sizeof(float) * (size_t)(D ? D : 1));
        if (!ones) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
        for (int64_t i = 0; i < D; i++) ones[i] = 1.0f;
        ts_status st = write_const(e, aux_name(x, "scale", sn, sizeof sn), TS_F32, (int)k,
                                   in->shape + in->ndim - k, ones);
        free(ones);
        TS_TRY(st);
        ins[1] = sn;
    }
    attr at[] = {A_INT("axis", -k), A_FLOAT("epsilon", (float)x->r->a.f[0])};
    return node(e, "LayerNormalization", x->node_name, ins[2] ? 3 : 2, ins, x->out, 2, at);
}

/* GroupNorm (opset 17 has no GroupNormalization): x (N, C, *) -> Reshape (N, G, -1) ->
 * InstanceNormalization (scale 1, bias 0: each (n, g) row normalised) -> Reshape to Shape(x) -> * weight
 * and + bias reshaped to (C, 1, ..., 1). */
static ts_status emit_group_norm(exporter *e, emit_args *x) {
    const ts_tensor *in = x->r->in[0];
    const int64_t G = x->r->a.i[0], C = in->shape[1];
    char s1[NAME_MAX_LEN], r1[NAME_MAX_LEN], sc[NAME_MAX_LEN], bi[NAME_MAX_LEN], nn[NAME_MAX_LEN], sh[NAME_MAX_LEN],
        r2[NAME_MAX_LEN], ws[NAME_MAX_LEN], wr[NAME_MAX_LEN], br[NAME_MAX_LEN], mw[NAME_MAX_LEN];
    const int64_t three = 3, shape1[3] = {0, G, -1};
    TS_TRY(write_const(e, aux_name(x, "grouped_shape", s1, sizeof s1), TS_I64, 1, &three, shape1));
    TS_TRY(step(e, x, "group", "Reshape", 2, (const char *[]){x->in[0], s1}, aux_name(x, "grouped", r1, sizeof r1), 0,
                NULL));
    float *ones = ts__malloc(sizeof(float) * (size_t)G * 2);
    if (!ones) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
    for (int64_t g = 0; g < G; g++) ones[g] = 1.0f, ones[G + g] = 0.0f;
    ts_status st = write_const(e, aux_name(x, "ones", sc, sizeof sc), TS_F32, 1, &G, ones);
    if (st == TS_OK) st = write_const(e, aux_name(x, "zeros", bi, sizeof bi), TS_F32, 1, &G, ones + G);
    free(ones);
    TS_TRY(st);
    attr at[] = {A_FLOAT("epsilon", (float)x->r->a.f[0])};
    TS_TRY(step(e, x, "normalize", "InstanceNormalization", 3, (const char *[]){r1, sc, bi},
                aux_name(x, "normalized", nn, sizeof nn), 1, at));
    TS_TRY(step(e, x, "shape", "Shape", 1, x->in, aux_name(x, "input_shape", sh, sizeof sh), 0, NULL));
    const char *w = x->in[1], *b = x->in[2];
    const char *last = w || b ? aux_name(x, "ungrouped", r2, sizeof r2) : x->out;
    if (!w && !b) return node(e, "Reshape", x->node_name, 2, (const char *[]){nn, sh}, last, 0, NULL);
    TS_TRY(step(e, x, "ungroup", "Reshape", 2, (const char *[]){nn, sh}, last, 0, NULL));
    int64_t pshape[TS_MAX_DIMS], pn = in->ndim - 1;
    pshape[0] = C;
    for (int64_t d = 1; d < pn; d++) pshape[d] = 1;
    TS_TRY(write_const(e, aux_name(x, "param_shape", ws, sizeof ws), TS_I64, 1, &pn, pshape));
    if (w) {
        TS_TRY(step(e, x, "weight_shape", "Reshape", 2, (const char *[]){w, ws}, aux_name(x, "weight", wr, sizeof wr), 0,
                    NULL));
        if (!b) return node(e, "Mul", x->node_name, 2, (const char *[]){last, wr}, x->out, 0, NULL);
        TS_TRY(step(e, x, "scale", "Mul", 2, (const char *[]){last, wr}, aux_name(x, "scaled", mw, sizeof mw), 0, NULL));
        last = mw;
    }
    TS_TRY(step(e, x, "bias_shape", "Reshape", 2, (const char *[]){b, ws}, aux_name(x, "bias", br, sizeof br), 0, NULL));
    return node(e, "Add", x->node_name, 2, (const char *[]){last, br}, x->out, 0, NULL);
}

static ts_status emit_cast(exporter *e, emit_args *x) {
    int to;
    if (!onnx_dtype((ts_dtype)x->r->a.i[0], &to))
        return ts_error(TS_ERR_UNSUPPORTED, "to_dtype: ONNX has no type for %s", ts_dtype_name((ts_dtype)x->r->a.i[0]));
    attr at[] = {A_INT("to", to)};
    return node(e, "Cast", x->node_name, 1, x->in, x->out, 1, at);
}

/* The mapping table: one line per traced op kind; a kind left out has no ONNX mapping.
 * A new elementwise op with a same-named ONNX operator is one line: {emit_plain, "Sigmoid"}. */
static const struct {
    emit_fn fn;
    const char *onnx; /* the ONNX op type emit_plain and emit_reduce_all write; documentation for the others */
} mappings[TS_OP_COUNT] = {
    [TS_OP_CONV2D] = {emit_conv, "Conv"},
    [TS_OP_BATCHNORM2D] = {emit_batchnorm, "BatchNormalization"},
    [TS_OP_RELU] = {emit_plain, "Relu"},
    [TS_OP_ADD] = {emit_plain, "Add"},
    [TS_OP_SUB] = {emit_plain, "Sub"},
    [TS_OP_MUL] = {emit_plain, "Mul"},
    [TS_OP_SCALE] = {emit_scale, "Mul"},
    [TS_OP_SUM] = {emit_reduce_all, "ReduceSum"},
    [TS_OP_MEAN] = {emit_reduce_all, "ReduceMean"},
    [TS_OP_MATMUL] = {emit_plain, "MatMul"},
    [TS_OP_LINEAR] = {emit_linear, "Gemm"},
    [TS_OP_MAXPOOL2D] = {emit_pool, "MaxPool"},
    [TS_OP_AVGPOOL2D] = {emit_pool, "AveragePool"},
    [TS_OP_GLOBAL_AVGPOOL2D] = {emit_plain, "GlobalAveragePool"},
    [TS_OP_EMBEDDING] = {emit_embedding, "Gather"},
    [TS_OP_RESHAPE] = {emit_reshape, "Reshape"},
    [TS_OP_FLATTEN] = {emit_flatten, "Flatten"},
    [TS_OP_CONCAT] = {emit_concat, "Concat"},
    [TS_OP_SLICE] = {emit_slice, "Slice"},
    [TS_OP_DROPOUT] = {emit_dropout, "Identity"},
    [TS_OP_LOG_SOFTMAX] = {emit_log_softmax, "LogSoftmax"},
    [TS_OP_MSE_LOSS] = {emit_mse_loss, "Sub+Mul+ReduceMean"},
    [TS_OP_TO_DEVICE] = {emit_plain, "Identity"},
    [TS_OP_DIV] = {emit_plain, "Div"},
    [TS_OP_SIGMOID] = {emit_plain, "Sigmoid"},
    [TS_OP_TANH] = {emit_plain, "Tanh"},
    [TS_OP_SILU] = {emit_silu, "Sigmoid+Mul"},
    [TS_OP_GELU] = {emit_gelu, "Erf (or Tanh) + Mul/Add"},
    [TS_OP_SOFTMAX] = {emit_softmax, "Softmax"},
    [TS_OP_SUM_DIMS] = {emit_reduce_dims, "ReduceSum"},
    [TS_OP_MEAN_DIMS] = {emit_reduce_dims, "ReduceMean"},
    [TS_OP_MAX_DIM] = {emit_reduce_dims, "ReduceMax"},
    [TS_OP_PERMUTE] = {emit_permute, "Transpose"},
    [TS_OP_ADAPTIVE_AVGPOOL2D] = {emit_adaptive_avgpool, "GlobalAveragePool / AveragePool / MatMul"},
    [TS_OP_LAYER_NORM] = {emit_layer_norm, "LayerNormalization"},
    [TS_OP_GROUP_NORM] = {emit_group_norm, "Reshape+InstanceNormalization+Reshape+Mul+Add"},
    [TS_OP_CAST] = {emit_cast, "Cast"},
    [TS_OP_ATTENTION] = {emit_attention, "Transpose+MatMul+Mul(+Add)+Softmax+MatMul"},
    /* no mapping: TS_OP_CROSS_ENTROPY (takes class indices; export the logits instead) */
};

/* "conv2d, batchnorm2d, ..." : the ops with a mapping, for messages. */
static const char *mapped_ops(char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < TS_OP_COUNT; i++) {
        if (!mappings[i].fn) continue;
        int n = snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", ts__op_name((ts__op_kind)i));
        if (n < 0 || (size_t)n >= cap - k) break;
        k += (size_t)n;
    }
    return buf;
}

/* Writes the nodes (and initializers) of live record j. */
static ts_status emit_record(exporter *e, const trace_log *L, int j, const ts_tensor *y, const char *output_name) {
    const rec *r = &L->r[j];
    if (r->op < 0 || r->op >= TS_OP_COUNT || !mappings[r->op].fn) {
        char ops[1024];
        return ts_error(TS_ERR_UNSUPPORTED, "op %s has no ONNX mapping (ops that export: %s)", ts__op_name(r->op),
                        mapped_ops(ops, sizeof ops));
    }
    ts_status st = TS_OK;
    const char **in = ts__calloc((size_t)(r->nin > 0 ? r->nin : 1), sizeof *in);
    const value **inv = ts__calloc((size_t)(r->nin > 0 ? r->nin : 1), sizeof *inv);
    if (!in || !inv) {
        st = ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
        goto fail;
    }
    /* resolve every input first: initializers are written outside the node */
    for (int i = 0; i < r->nin; i++) {
        if (!r->in[i]) continue;
        TS_CHECK_GOTO(resolve(e, r->in[i], &in[i]));
    }
    for (int i = 0; i < r->nin; i++) /* after resolving: add_value may move the array */
        if (r->in[i]) inv[i] = find_value(e, r->in[i]);
    char out[NAME_MAX_LEN];
    if (r->out == y)
        snprintf(out, sizeof out, "%s", output_name);
    else
        snprintf(out, sizeof out, "%s_%d", ts__op_name(r->op), j);
    emit_args x = {.r = r, .in = in, .inv = inv, .out = out, .onnx = mappings[r->op].onnx, .batch = false};
    snprintf(x.node_name, sizeof x.node_name, "/%s_%d", ts__op_name(r->op), j);
    /* default: the result keeps the batch when an input of its rank does (elementwise, conv, pool, ...) */
    for (int i = 0; i < r->nin; i++)
        if (inv[i] && inv[i]->batch && r->in[i]->ndim == r->out->ndim && r->out->ndim > 0) x.batch = true;
    TS_CHECK_GOTO(mappings[r->op].fn(e, &x));
    TS_CHECK_GOTO(add_value(e, r->out, out, x.batch && e->dynamic, true));
fail:
    free(in);
    free(inv);
    return st;
}

/* A ValueInfoProto: name, element type and shape (dim 0 "N" when batch). */
static ts_status value_info(exporter *e, int field, const char *name, const ts_tensor *t, bool batch) {
    int ot;
    if (!onnx_dtype(t->dtype, &ot))
        return ts_error(TS_ERR_UNSUPPORTED, "'%s' has dtype %s, which ONNX export does not write", name,
                        ts_dtype_name(t->dtype));
    ts__pb *w = &e->pb;
    size_t vi = ts__pb_begin(w, field);
    ts__pb_string(w, VALUE_NAME, name);
    size_t ty = ts__pb_begin(w, VALUE_TYPE);
    size_t tt = ts__pb_begin(w, TYPE_TENSOR);
    ts__pb_int(w, TENSOR_TYPE_ELEM, ot);
    size_t sh = ts__pb_begin(w, TENSOR_TYPE_SHAPE);
    for (int d = 0; d < t->ndim; d++) {
        size_t dm = ts__pb_begin(w, SHAPE_DIM);
        if (d == 0 && batch)
            ts__pb_string(w, DIM_PARAM, "N");
        else
            ts__pb_int(w, DIM_VALUE, t->shape[d]);
        ts__pb_end(w, dm);
    }
    ts__pb_end(w, sh);
    ts__pb_end(w, tt);
    ts__pb_end(w, ty);
    ts__pb_end(w, vi);
    return ts__pb_status(w, "ts_export_onnx");
}

/* The whole ModelProto into e->pb. */
static ts_status write_model(exporter *e, const trace_log *L, const ts_tensor *x, const ts_tensor *y,
                             const ts_onnx_opts *o) {
    const char *in_name = o->input_name ? o->input_name : "input";
    const char *out_name = o->output_name ? o->output_name : "output";
    ts__pb *w = &e->pb;
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d.%d", TS_VERSION_MAJOR, TS_VERSION_MINOR, TS_VERSION_PATCH);
    ts__pb_int(w, MODEL_IR_VERSION, ONNX_IR_VERSION);
    ts__pb_string(w, MODEL_PRODUCER_NAME, "tessera");
    ts__pb_string(w, MODEL_PRODUCER_VERSION, ver);
    size_t os = ts__pb_begin(w, MODEL_OPSET_IMPORT);
    ts__pb_string(w, OPSET_DOMAIN, "");
    ts__pb_int(w, OPSET_VERSION, ONNX_OPSET);
    ts__pb_end(w, os);

    size_t g = ts__pb_begin(w, MODEL_GRAPH);
    ts__pb_string(w, GRAPH_NAME, "tessera");
    bool dyn = e->dynamic && x->ndim >= 1;
    TS_TRY(add_value(e, x, in_name, dyn, true));
    bool produced = false;
    for (int j = 0; j < L->n; j++) {
        if (!L->r[j].live) continue;
        ts_status st = emit_record(e, L, j, y, out_name);
        if (st != TS_OK) return ts__error_prefix(st, "ts_export_onnx: op %d (%s)", j, ts__op_name(L->r[j].op));
        produced |= L->r[j].out == y;
    }
    if (!produced) { /* the forward returned its input or a parameter */
        if (y != x && !is_state(&e->state, y))
            return ts_error(TS_ERR_UNSUPPORTED,
                            "ts_export_onnx: the forward's result was not made by a traced op (computed on another "
                            "thread or outside the op layer?)");
        const char *src = NULL;
        TS_TRY(resolve(e, y, &src));
        const value *v = find_value(e, y);
        bool batch = v && v->batch;
        TS_TRY(node(e, "Identity", "/output", 1, &src, out_name, 0, NULL));
        TS_TRY(add_value(e, y, out_name, batch, true)); /* find_value still returns the earlier entry */
    }
    for (int i = 0; i < e->nv; i++) /* the input's and output's names against the model's and the ops' */
        for (int j = i + 1; j < e->nv; j++)
            if (strcmp(e->v[i].name, e->v[j].name) == 0)
                return ts_error(TS_ERR_INVALID_ARG,
                                "ts_export_onnx: two values are named '%s' (choose other input/output names)",
                                e->v[i].name);
    TS_TRY(value_info(e, GRAPH_INPUT, in_name, x, dyn));
    bool ybatch = false;
    for (int i = e->nv - 1; i >= 0; i--)
        if (e->v[i].t == y && strcmp(e->v[i].name, out_name) == 0) {
            ybatch = e->v[i].batch;
            break;
        }
    TS_TRY(value_info(e, GRAPH_OUTPUT, out_name, y, ybatch));
    ts__pb_end(w, g);
    return ts__pb_status(w, "ts_export_onnx");
}

/* ---- training flags: saved per module, restored after the trace --------------------------------------- */
static int count_modules(const ts_module *m) {
    int n = 1;
    for (int i = 0; i < m->nchildren; i++) n += count_modules(m->children[i]);
    return n;
}
static void save_flags(const ts_module *m, bool *f, int *k) {
    f[(*k)++] = m->training;
    for (int i = 0; i < m->nchildren; i++) save_flags(m->children[i], f, k);
}
static void restore_flags(ts_module *m, const bool *f, int *k) {
    m->training = f[(*k)++];
    for (int i = 0; i < m->nchildren; i++) restore_flags(m->children[i], f, k);
}

ts_status ts_export_onnx(ts_module *m, const ts_tensor *example_input, const char *path, const ts_onnx_opts *opts) {
    TS_ARG(m && example_input && path && path[0], "ts_export_onnx: NULL argument");
    TS_TRY(refuse_wrappers(m, ""));
    ts_onnx_opts o = opts ? *opts : TS_ONNX_OPTS_INIT;
    TS_ARG(!o.input_name || o.input_name[0], "ts_export_onnx: empty input name");
    TS_ARG(!o.output_name || o.output_name[0], "ts_export_onnx: empty output name");
    TS_ARG(strcmp(o.input_name ? o.input_name : "input", o.output_name ? o.output_name : "output") != 0,
           "ts_export_onnx: input and output names are both '%s'", o.input_name ? o.input_name : "input");
    ts_status st = TS_OK;
    trace_log L = {NULL, 0, 0}, L2 = {NULL, 0, 0};
    exporter e = {.pb = TS_PB_INIT, .state = TS_TENSOR_LIST_INIT, .dynamic = o.dynamic_batch};
    ts_tensor *y = NULL, *x2 = NULL, *y2 = NULL;
    bool *flags = ts__malloc((size_t)count_modules(m) * sizeof *flags);
    if (!flags) return ts_error(TS_ERR_NOMEM, "ts_export_onnx: out of memory");
    int k = 0;
    save_flags(m, flags, &k);

    /* 1. trace one forward in eval mode without autograd, and one on a second input */
    ts_module_train(m, false);
    bool grad = ts_grad_set_enabled(false);
    st = trace_forward(m, example_input, &L, &y);
    if (st != TS_OK) ts__error_prefix(st, "ts_export_onnx: the traced forward failed");
    if (st == TS_OK) st = second_input(example_input, &x2);
    if (st == TS_OK && x2) {
        st = trace_forward(m, x2, &L2, &y2);
        if (st != TS_OK) ts__error_prefix(st, "ts_export_onnx: the forward on a second input failed");
    }
    ts_grad_set_enabled(grad);
    k = 0;
    restore_flags(m, flags, &k);
    free(flags);
    if (st != TS_OK) goto fail;

    /* 2. prune, and check against the second run */
    mark_live(&L, y);
    TS_CHECK_GOTO(ts_module_parameters(m, &e.state));
    TS_CHECK_GOTO(ts_module_buffers(m, &e.state));
    if (x2) {
        st = check_second_run(&L, &L2, example_input, &e.state);
        if (st != TS_OK) {
            ts__error_prefix(st, "ts_export_onnx");
            goto fail;
        }
    }
    log_free(&L2);

    /* 3-5. name, map, encode, write */
    TS_CHECK_GOTO(write_model(&e, &L, example_input, y, &o));
    TS_CHECK_GOTO(ts__write_file_atomic(path, "an ONNX model", e.pb.buf, e.pb.len));
fail:
    ts_tensor_release(y);
    ts_tensor_release(x2);
    ts_tensor_release(y2);
    log_free(&L);
    log_free(&L2);
    ts_tensor_list_clear(&e.state);
    for (int i = 0; i < e.nv; i++) free(e.v[i].name);
    free(e.v);
    ts__pb_free(&e.pb);
    return st;
}
