/*
 * ONNX export (src/export, src/ops/trace.h): the protobuf writer against
 * known encodings; exported models decoded with a tiny protobuf reader
 * (ModelProto header, node types, initializer names, the symbolic batch);
 * the errors (an op without a mapping, training-mode batchnorm and dropout,
 * a view made outside the ops, nested traces); training flags, grad mode and
 * the model left as they were; no file or temporary left after a failure.
 * When python3 has onnx and onnxruntime, a residual network, a functional
 * forward over most mapped ops and an embedding model are compared with
 * onnxruntime (tests/onnx_check.py, 1e-4), and a GPT-2 (causal attention, LayerNorm, tanh GELU, int64
 * token ids in); otherwise that part says it skipped.
 */
#include "export/pb.h"
#include "nn/module.h"
#include "ops/trace.h"
#include "test_util.h"

#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- a tiny protobuf reader -------------------------------------------------------------- */
typedef struct pbr {
    const uint8_t *p, *end;
} pbr;

typedef struct pbf {
    int field, wire;
    uint64_t v;            /* varint / fixed value */
    const uint8_t *data;   /* wire type 2 */
    size_t len;
} pbf;

static bool rd_varint(pbr *r, uint64_t *v) {
    *v = 0;
    for (int s = 0; s < 64 && r->p < r->end; s += 7) {
        uint8_t b = *r->p++;
        *v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* Next field of the message; false at the end (or on malformed input, which fails a CHECK). */
static bool rd_field(pbr *r, pbf *f) {
    if (r->p >= r->end) return false;
    uint64_t key;
    bool ok = rd_varint(r, &key);
    f->field = (int)(key >> 3);
    f->wire = (int)(key & 7);
    f->data = NULL;
    f->len = 0;
    if (ok && f->wire == 0) ok = rd_varint(r, &f->v);
    else if (ok && f->wire == 5 && r->end - r->p >= 4) {
        f->v = (uint64_t)r->p[0] | (uint64_t)r->p[1] << 8 | (uint64_t)r->p[2] << 16 | (uint64_t)r->p[3] << 24;
        r->p += 4;
    } else if (ok && f->wire == 2 && rd_varint(r, &f->v) && f->v <= (uint64_t)(r->end - r->p)) {
        f->data = r->p;
        f->len = (size_t)f->v;
        r->p += f->len;
    } else {
        ok = false;
    }
    CHECK(ok);
    return ok;
}

static pbr sub(const pbf *f) { return (pbr){f->data, f->data + f->len}; }

/* What test cases read back from an exported file. */
typedef struct model_info {
    int64_t ir_version, opset;
    char producer[32];
    char ops[64][32];        /* node op types in order */
    int nops;
    char inits[128][64];     /* initializer names */
    int ninits;
    char input[32], output[32], input_dim0[16], output_dim0[16];
} model_info;

static void copy_str(char *dst, size_t cap, const pbf *f) {
    size_t n = f->len < cap - 1 ? f->len : cap - 1;
    memcpy(dst, f->data, n);
    dst[n] = '\0';
}

/* ValueInfoProto -> name and dim 0 ("N" or the number). */
static void read_value_info(pbr r, char *name, char *dim0) {
    pbf f;
    while (rd_field(&r, &f)) {
        if (f.field == 1) copy_str(name, 32, &f);
        if (f.field != 2) continue;
        pbr ty = sub(&f), tt, sh, dm;
        pbf a, b, c, d;
        while (rd_field(&ty, &a))
            if (a.field == 1)
                for (tt = sub(&a); rd_field(&tt, &b);)
                    if (b.field == 2)
                        for (sh = sub(&b); rd_field(&sh, &c);)
                            if (c.field == 1) {
                                for (dm = sub(&c); rd_field(&dm, &d);) {
                                    if (d.field == 2) copy_str(dim0, 16, &d);
                                    if (d.field == 1) snprintf(dim0, 16, "%llu", (unsigned long long)d.v);
                                }
                                goto done; /* dim 0 only */
                            }
    done:;
    }
}

static bool read_model(const char *path, model_info *mi) {
    memset(mi, 0, sizeof *mi);
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    bool ok = buf && fread(buf, 1, (size_t)n, fp) == (size_t)n;
    fclose(fp);
    pbr r = {buf, buf + (ok ? n : 0)};
    pbf f;
    while (ok && rd_field(&r, &f)) {
        if (f.field == 1) mi->ir_version = (int64_t)f.v;
        if (f.field == 2) copy_str(mi->producer, sizeof mi->producer, &f);
        if (f.field == 8)
            for (pbr o = sub(&f); rd_field(&o, &f);)
                if (f.field == 2) mi->opset = (int64_t)f.v;
        if (f.field != 7) continue;
        pbr g = sub(&f);
        pbf gf;
        while (rd_field(&g, &gf)) {
            if (gf.field == 1 && mi->nops < 64) {
                pbf nf;
                for (pbr nd = sub(&gf); rd_field(&nd, &nf);)
                    if (nf.field == 4) copy_str(mi->ops[mi->nops], 32, &nf);
                mi->nops++;
            }
            if (gf.field == 5 && mi->ninits < 128) {
                pbf tf;
                for (pbr t = sub(&gf); rd_field(&t, &tf);)
                    if (tf.field == 8) copy_str(mi->inits[mi->ninits], 64, &tf);
                mi->ninits++;
            }
            if (gf.field == 11) read_value_info(sub(&gf), mi->input, mi->input_dim0);
            if (gf.field == 12) read_value_info(sub(&gf), mi->output, mi->output_dim0);
        }
    }
    free(buf);
    return ok;
}

static int count_op(const model_info *mi, const char *op) {
    int c = 0;
    for (int i = 0; i < mi->nops; i++) c += strcmp(mi->ops[i], op) == 0;
    return c;
}
static bool has_init(const model_info *mi, const char *name) {
    for (int i = 0; i < mi->ninits; i++)
        if (strcmp(mi->inits[i], name) == 0) return true;
    return false;
}

/* ---- .npy files and the onnxruntime comparison ----------------------------------------------- */
static void write_npy(const char *path, ts_tensor *t) {
    int nd = ts_tensor_ndim(t);
    char shape[128] = "", dict[256];
    size_t k = 0;
    for (int d = 0; d < nd; d++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%lld%s", (long long)ts_tensor_dim(t, d),
                              nd == 1 || d + 1 < nd ? ", " : "");
    int hl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                      ts_tensor_dtype(t) == TS_I64 ? "<i8" : "<f4", shape);
    size_t pad = (64 - (10 + (size_t)hl + 1) % 64) % 64;
    uint16_t hlen = (uint16_t)((size_t)hl + pad + 1);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f);
    fputc(hlen >> 8, f);
    fwrite(dict, 1, (size_t)hl, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(ts_tensor_data(t), 1, ts_tensor_nbytes(t), f);
    CHECK(fclose(f) == 0);
}

static int ort_skipped;

/* Exports m on x to DIR/name.onnx, runs it through onnx_check.py against Tessera's output. */
static void export_and_compare(ts_module *m, ts_tensor *x, const char *name, const char *extra) {
    char model[512], in[512], out[512], cmd[2048];
    snprintf(model, sizeof model, "%s/%s.onnx", tu_tmpdir(), name);
    snprintf(in, sizeof in, "%s/%s.input.npy", tu_tmpdir(), name);
    snprintf(out, sizeof out, "%s/%s.output.npy", tu_tmpdir(), name);
    CHECK_OK(ts_export_onnx(m, x, model, NULL));
    ts_tensor *y = NULL;
    ts_module_train(m, false);
    bool g = ts_grad_set_enabled(false);
    CHECK_OK(ts_module_forward(m, x, &y));
    ts_grad_set_enabled(g);
    if (!y) return;
    write_npy(in, x);
    write_npy(out, y);
    ts_tensor_release(y);
    /* the Python tests/find_python.sh finds (the .pyvenv install-deps makes, or python3), else skip */
    snprintf(cmd, sizeof cmd,
             "PY=$(bash '%s/find_python.sh' numpy onnx onnxruntime) || exit 77; \"$PY\" '%s/onnx_check.py' '%s' '%s' "
             "'%s' %s",
             TS_TEST_DIR, TS_TEST_DIR, model, in, out, extra ? extra : "");
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    if (rc == 77 || rc == 127) {
        ort_skipped = 1;
        return;
    }
    CHECK(rc == 0);
    if (rc != 0) fprintf(stderr, "  %s: onnxruntime comparison failed (%s)\n", name, cmd);
}

/* ---- models -------------------------------------------------------------------------------------- */
/* Random values in BatchNorm2d's running statistics and affine parameters, so eval mode is not the identity. */
static void randomize_buffers(ts_module *m, ts_rng *r) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &l));
    for (int i = 0; i < l.n; i++) {
        if (ts_tensor_dtype(l.tensors[i]) != TS_F32) continue;
        const char *n = l.names[i];
        size_t len = strlen(n);
        if (len > 11 && strcmp(n + len - 11, "running_var") == 0)
            CHECK_OK(ts_tensor_uniform_(l.tensors[i], 0.5f, 2.0f, r));
        else if (strstr(n, "running_mean") || strstr(n, "bn") || strstr(n, "downsample.1"))
            CHECK_OK(ts_tensor_uniform_(l.tensors[i], -0.5f, 0.5f, r));
    }
    ts_tensor_list_clear(&l);
}

/* conv-bn-relu, BasicBlock(8, 8), BasicBlock(8, 16, stride 2: downsample), global pool, linear. */
static ts_module *residual_net(ts_rng *r) {
    ts_module *s = NULL, *c = NULL;
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    CHECK_OK(ts_nn_sequential_new(&s));
    CHECK_OK(ts_nn_conv2d_new(3, 8, 3, 3, p, false, r, &c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_batchnorm2d_new(8, 1e-5f, 0.1f, true, true, &c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_relu_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_residual_block_new(8, 8, 1, r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "layer1", c));
    CHECK_OK(ts_nn_residual_block_new(8, 16, 2, r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "layer2", c));
    CHECK_OK(ts_nn_global_avgpool2d_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_flatten_new(&c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_dropout_new(0.5f, r, &c));
    CHECK_OK(ts_nn_sequential_add(s, NULL, c));
    CHECK_OK(ts_nn_linear_new(16, 5, true, r, &c));
    CHECK_OK(ts_nn_sequential_add(s, "fc", c));
    randomize_buffers(s, r);
    return s;
}

/* A module whose forward is a C function calling ops directly (what the functional module type will be). */
static ts_module *functional(ts_status (*fwd)(ts_module *, const ts_tensor *, ts_tensor **), int nparams,
                             const char *const *names, ts_tensor **params) {
    static ts_module_vt vts[16]; /* one type per forward function */
    static int nvt;
    ts_module_vt *vt = NULL;
    for (int i = 0; i < nvt && !vt; i++)
        if (vts[i].forward == fwd) vt = &vts[i];
    if (!vt) {
        if (nvt == 16) abort();
        vt = &vts[nvt++];
        *vt = (ts_module_vt){.name = "Functional", .forward = fwd};
    }
    ts_module *m = NULL;
    CHECK_OK(ts__module_new(vt, 0, &m));
    for (int i = 0; i < nparams; i++) CHECK_OK(ts__module_add_param(m, names[i], params[i]));
    return m;
}

#define TRY(e)                          \
    do {                                \
        st = (e);                       \
        if (st != TS_OK) goto fail;     \
    } while (0)
#define KEEP(t) (tmp[ntmp++] = (t))

/* x (N, 3, 8, 8): conv, max pool (padding, ceil), avg pool (ceil, partial windows), scale, sub, mul,
 * broadcast add, flatten, reshape (-1), slice, concat, linear, matmul, dropout (eval), reshape keeping
 * the batch, flatten, log_softmax. Parameters: shift (4,1,1); children conv {w (4,3,3,3), b (4)} and
 * head {w (5, F), b (5), mix (5, 5)}: state-dict names "conv.w", "head.mix". */
static ts_status many_ops_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *tmp[32] = {NULL}, *t = NULL;
    int ntmp = 0;
    ts_status st;
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.padding[0] = cp.padding[1] = 1;
    ts_module *conv = m->children[0], *head = m->children[1];
    TRY(ts_conv2d(x, conv->params[0], conv->params[1], cp, &t));
    ts_tensor *a = KEEP(t);
    TRY(ts_maxpool2d(a, (ts_pool2d_params){{3, 3}, {2, 2}, {1, 1}, {1, 1}, true, false}, &t));
    ts_tensor *b = KEEP(t);
    TRY(ts_avgpool2d(b, (ts_pool2d_params){{2, 2}, {2, 2}, {0, 0}, {1, 1}, true, false}, &t));
    ts_tensor *c = KEEP(t);
    TRY(ts_scale(c, 0.5f, &t));
    ts_tensor *d = KEEP(t);
    TRY(ts_sub(d, c, &t));
    ts_tensor *e = KEEP(t);
    TRY(ts_mul(e, c, &t));
    ts_tensor *f = KEEP(t);
    TRY(ts_add(f, m->params[0], &t));
    ts_tensor *g = KEEP(t);
    TRY(ts_flatten(g, 1, &t));
    ts_tensor *h = KEEP(t);
    int64_t F = ts_tensor_dim(h, 1);
    TRY(ts_reshape(h, 2, (int64_t[]){-1, F}, &t));
    ts_tensor *i = KEEP(t);
    TRY(ts_slice(i, 1, 0, F - 3, &t));
    ts_tensor *j1 = KEEP(t);
    TRY(ts_slice(i, -1, F - 3, F, &t));
    ts_tensor *j2 = KEEP(t);
    TRY(ts_concat((ts_tensor *[]){j1, j2}, 2, 1, &t));
    ts_tensor *j = KEEP(t);
    TRY(ts_linear(j, head->params[0], head->params[1], &t));
    ts_tensor *k = KEEP(t);
    TRY(ts_matmul(k, head->params[2], &t));
    ts_tensor *l = KEEP(t);
    TRY(ts_dropout(l, 0.3f, false, NULL, &t));
    ts_tensor *l2 = KEEP(t);
    TRY(ts_reshape(l2, 3, (int64_t[]){ts_tensor_dim(l2, 0), 5, 1}, &t));
    ts_tensor *r = KEEP(t);
    TRY(ts_flatten(r, 1, &t));
    ts_tensor *s = KEEP(t);
    TRY(ts_log_softmax(s, 1, out));
fail:
    for (int q = 0; q < ntmp; q++) ts_tensor_release(tmp[q]);
    return st;
}

static ts_module *many_ops_model(ts_rng *r, int64_t F) {
    const char *cn[2] = {"w", "b"}, *hn[3] = {"w", "b", "mix"}, *rn[1] = {"shift"};
    ts_tensor *cp[2] = {tu_rand(r, 4, (int64_t[]){4, 3, 3, 3}, -0.5f, 0.5f, false),
                        tu_rand(r, 1, (int64_t[]){4}, -0.5f, 0.5f, false)};
    ts_tensor *hp[3] = {tu_rand(r, 2, (int64_t[]){5, F}, -0.5f, 0.5f, false),
                        tu_rand(r, 1, (int64_t[]){5}, -0.5f, 0.5f, false),
                        tu_rand(r, 2, (int64_t[]){5, 5}, -0.5f, 0.5f, false)};
    ts_tensor *rp[1] = {tu_rand(r, 3, (int64_t[]){4, 1, 1}, -0.5f, 0.5f, false)};
    ts_module *m = functional(many_ops_forward, 1, rn, rp);
    CHECK_OK(ts__module_add_child(m, "conv", functional(NULL, 2, cn, cp)));
    CHECK_OK(ts__module_add_child(m, "head", functional(NULL, 3, hn, hp)));
    return m;
}

/* idx (N, 3) int64 -> embedding (10, 4) -> (N, 12) + mean(table) + sum(bias) + mse(table, table / 2)
 * (scalars broadcast). */
static ts_status embedding_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *e = NULL, *f = NULL, *mean = NULL, *sum = NULL, *g = NULL, *half = NULL, *mse = NULL, *h = NULL;
    ts_status st;
    TRY(ts_embedding(x, m->params[0], &e));
    TRY(ts_flatten(e, 1, &f));
    TRY(ts_mean(m->params[0], &mean));
    TRY(ts_sum(m->params[1], &sum));
    TRY(ts_scale(m->params[0], 0.5f, &half));
    TRY(ts_mse_loss(m->params[0], half, &mse));
    TRY(ts_add(f, mean, &g));
    TRY(ts_add(g, sum, &h));
    TRY(ts_add(h, mse, out));
fail:
    ts_tensor_release(half);
    ts_tensor_release(mse);
    ts_tensor_release(h);
    ts_tensor_release(e);
    ts_tensor_release(f);
    ts_tensor_release(mean);
    ts_tensor_release(sum);
    ts_tensor_release(g);
    return st;
}

/* ---- tests --------------------------------------------------------------------------------------------- */
static bool bytes_are(const ts__pb *w, const char *hex) {
    char got[256] = "";
    for (size_t i = 0; i < w->len && 2 * i + 2 < sizeof got; i++) snprintf(got + 2 * i, 3, "%02x", w->buf[i]);
    if (strcmp(got, hex) == 0) return true;
    fprintf(stderr, "  encoded %s, expected %s\n", got, hex);
    return false;
}

static void test_protobuf_writer(void) {
    CHECK(ts__pb_varint_size(0) == 1 && ts__pb_varint_size(127) == 1 && ts__pb_varint_size(128) == 2);
    CHECK(ts__pb_varint_size(UINT64_MAX) == 10);
    ts__pb w = TS_PB_INIT;
    ts__pb_int(&w, 1, 150); /* the protobuf documentation's examples */
    CHECK(bytes_are(&w, "089601"));
    ts__pb_free(&w);
    ts__pb_varint(&w, 300);
    CHECK(bytes_are(&w, "ac02"));
    ts__pb_free(&w);
    ts__pb_string(&w, 2, "testing");
    CHECK(bytes_are(&w, "120774657374696e67"));
    ts__pb_free(&w);
    size_t m = ts__pb_begin(&w, 3);
    ts__pb_int(&w, 1, 150);
    ts__pb_end(&w, m);
    CHECK(bytes_are(&w, "1a03089601"));
    ts__pb_free(&w);
    ts__pb_int(&w, 1, -1); /* int64 -1: ten bytes */
    CHECK(bytes_are(&w, "08ffffffffffffffffff01"));
    ts__pb_free(&w);
    ts__pb_float(&w, 2, 1.0f);
    CHECK(bytes_are(&w, "150000803f"));
    ts__pb_free(&w);
    ts__pb_bytes(&w, 9, NULL, 0);
    CHECK(bytes_are(&w, "4a00"));
    ts__pb_free(&w);

    /* nested messages whose bodies need a 2- and 3-byte length, read back */
    uint8_t big[20000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)i;
    size_t outer = ts__pb_begin(&w, 7);
    size_t inner = ts__pb_begin(&w, 5);
    ts__pb_bytes(&w, 9, big, 200);
    ts__pb_end(&w, inner);
    inner = ts__pb_begin(&w, 5);
    ts__pb_bytes(&w, 9, big, sizeof big);
    ts__pb_int(&w, 2, 7);
    ts__pb_end(&w, inner);
    ts__pb_end(&w, outer);
    CHECK_OK(ts__pb_status(&w, "test"));
    pbr r = {w.buf, w.buf + w.len};
    pbf f, g, h;
    CHECK(rd_field(&r, &f) && f.field == 7 && f.wire == 2 && f.data + f.len == w.buf + w.len);
    pbr o = sub(&f);
    CHECK(rd_field(&o, &g) && g.field == 5);
    pbr i1 = sub(&g);
    CHECK(rd_field(&i1, &h) && h.field == 9 && h.len == 200 && memcmp(h.data, big, 200) == 0);
    CHECK(rd_field(&o, &g) && g.field == 5);
    pbr i2 = sub(&g);
    CHECK(rd_field(&i2, &h) && h.field == 9 && h.len == sizeof big && memcmp(h.data, big, sizeof big) == 0);
    CHECK(rd_field(&i2, &h) && h.field == 2 && h.wire == 0 && h.v == 7);
    CHECK(!rd_field(&o, &g));
    ts__pb_free(&w);

    /* an allocation failure is sticky and reported once */
    ts__alloc_fail_after(0);
    ts__pb_string(&w, 1, "x");
    ts__alloc_fail_after(-1);
    ts__pb_int(&w, 1, 1);
    CHECK_STATUS(ts__pb_status(&w, "test"), TS_ERR_NOMEM);
    ts__pb_free(&w);
}

static void test_cnn_structure(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    ts_module *m = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &m));
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 1, 28, 28}, -1, 1, false);
    char path[512];
    snprintf(path, sizeof path, "%s/cnn.onnx", tu_tmpdir());
    ts_onnx_opts o = TS_ONNX_OPTS_INIT;
    o.input_name = "image";
    o.output_name = "logits";
    CHECK_OK(ts_export_onnx(m, x, path, &o));
    model_info mi;
    CHECK(read_model(path, &mi));
    CHECK(mi.ir_version == 8 && mi.opset == 17 && strcmp(mi.producer, "tessera") == 0);
    /* Sequential runs ReLU -> MaxPool2d as MaxPool2d -> ReLU (they commute; nn/containers.c), and the trace
     * records what ran */
    static const char *const want[] = {"Conv", "BatchNormalization", "MaxPool", "Relu", "Conv", "BatchNormalization",
                                       "MaxPool", "Relu", "Flatten", "Gemm", "Relu", "Gemm"};
    CHECK(mi.nops == 12);
    for (int i = 0; i < 12 && i < mi.nops; i++) CHECK(strcmp(mi.ops[i], want[i]) == 0);
    CHECK(has_init(&mi, "0.weight") && has_init(&mi, "1.running_var") && has_init(&mi, "11.bias"));
    CHECK(!has_init(&mi, "1.num_batches_tracked")); /* not read by any op */
    CHECK(mi.ninits == 16);
    CHECK(strcmp(mi.input, "image") == 0 && strcmp(mi.input_dim0, "N") == 0);
    CHECK(strcmp(mi.output, "logits") == 0 && strcmp(mi.output_dim0, "N") == 0);

    o.dynamic_batch = false;
    CHECK_OK(ts_export_onnx(m, x, path, &o));
    CHECK(read_model(path, &mi));
    CHECK(strcmp(mi.input_dim0, "2") == 0 && strcmp(mi.output_dim0, "2") == 0);
    ts_tensor_release(x);
    ts_module_free(m);
}

static void test_residual_and_state(void) {
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_module *m = residual_net(&r);
    ts_module_train(m, true);
    ts_module_train(ts_module_child(m, "layer1"), false); /* mixed flags come back as they were */
    ts_tensor_list before = TS_TENSOR_LIST_INIT, after = TS_TENSOR_LIST_INIT;
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    for (int i = 0; i < sd.n; i++) {
        ts_tensor *c = NULL;
        CHECK_OK(ts_tensor_clone(sd.tensors[i], &c));
        CHECK_OK(ts_tensor_list_append(&before, sd.names[i], c));
        ts_tensor_release(c);
    }
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){3, 3, 12, 12}, -1, 1, false);
    char path[512];
    snprintf(path, sizeof path, "%s/resnet.onnx", tu_tmpdir());
    CHECK_OK(ts_export_onnx(m, x, path, NULL));
    CHECK(ts_grad_is_enabled());
    CHECK(ts_module_is_training(m) && !ts_module_is_training(ts_module_child(m, "layer1")));
    CHECK(ts_module_is_training(ts_module_child(m, "layer2")));
    CHECK_OK(ts_module_state_dict(m, &after));
    for (int i = 0; i < after.n; i++) /* nothing changed: no running statistics update, no step count */
        CHECK(memcmp(ts_tensor_data(after.tensors[i]), ts_tensor_data(before.tensors[i]),
                     ts_tensor_nbytes(after.tensors[i])) == 0);
    model_info mi;
    CHECK(read_model(path, &mi));
    CHECK(count_op(&mi, "Add") == 2 && count_op(&mi, "Conv") == 6 && count_op(&mi, "GlobalAveragePool") == 1);
    CHECK(count_op(&mi, "Identity") == 0); /* eval dropout returns its input: no node */
    CHECK(has_init(&mi, "layer1.conv1.weight") && has_init(&mi, "layer2.downsample.0.weight"));
    CHECK(has_init(&mi, "layer2.downsample.1.running_mean") && has_init(&mi, "fc.weight"));
    struct stat sb;
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(stat(tmp, &sb) != 0); /* renamed into place */
    export_and_compare(m, x, "resnet", "--rerun-batch 2 --expect-op Add");
    ts_tensor_list_clear(&before);
    ts_tensor_list_clear(&after);
    ts_tensor_list_clear(&sd);
    ts_tensor_release(x);
    ts_module_free(m);
}

static void test_functional_ops(void) {
    ts_rng r;
    ts_rng_seed(&r, 7);
    /* (N,3,8,8) -conv-> (N,4,8,8) -maxpool k3 s2 p1 ceil-> (N,4,5,5) -avgpool 2 ceil-> (N,4,3,3): F = 36 */
    ts_module *m = many_ops_model(&r, 36);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){4, 3, 8, 8}, -1, 1, false);
    export_and_compare(m, x, "functional", "--rerun-batch 3 --expect-op Slice --expect-op Concat --expect-op MatMul");
    char path[512];
    snprintf(path, sizeof path, "%s/functional.onnx", tu_tmpdir());
    model_info mi;
    CHECK(read_model(path, &mi));
    CHECK(count_op(&mi, "Reshape") == 2 && count_op(&mi, "LogSoftmax") == 1 && count_op(&mi, "AveragePool") == 1);
    CHECK(has_init(&mi, "shift") && has_init(&mi, "head.mix") && has_init(&mi, "conv.w"));
    ts_tensor_release(x);
    ts_module_free(m);

    const char *names[2] = {"table", "bias"};
    ts_tensor *p[2] = {tu_rand(&r, 2, (int64_t[]){10, 4}, -1, 1, false), tu_rand(&r, 1, (int64_t[]){3}, -1, 1, false)};
    m = functional(embedding_forward, 2, names, p);
    int64_t idx[12] = {0, 9, 3, 4, 4, 1, 7, 2, 8, 5, 6, 0};
    ts_tensor *ix = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 2, (int64_t[]){4, 3}, idx, &ix));
    export_and_compare(m, ix, "embedding", "--rerun-batch 1 --expect-op Gather --expect-op ReduceMean");
    ts_tensor_release(ix);
    ts_module_free(m);
}

/* x (N, 4, 6, 6) through the newer ops, as a public custom module (ts_nn_module_new): adaptive pooling
 * 6x6 -> 3x3, sigmoid, tanh, SiLU, GELU (erf and tanh forms), div, permute, transpose, batched matmul,
 * sum/mean over dims (keepdim both ways), max over a dim, softmax, flatten_range. Parameter "w" (4, 4). */
static ts_status new_ops_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *tmp[40] = {NULL}, *t = NULL;
    int ntmp = 0;
    ts_status st;
    TRY(ts_adaptive_avgpool2d(x, 3, 3, &t));
    ts_tensor *a = KEEP(t); /* (N, 4, 3, 3) */
    TRY(ts_sigmoid(a, &t));
    ts_tensor *b = KEEP(t);
    TRY(ts_tanh(a, &t));
    ts_tensor *c = KEEP(t);
    TRY(ts_silu(c, &t));
    ts_tensor *d = KEEP(t);
    TRY(ts_gelu(d, false, &t));
    ts_tensor *e = KEEP(t);
    TRY(ts_gelu(a, true, &t));
    ts_tensor *f = KEEP(t);
    TRY(ts_add(b, f, &t));
    ts_tensor *g0 = KEEP(t);
    TRY(ts_add(e, g0, &t));
    ts_tensor *g1 = KEEP(t);
    TRY(ts_div(g1, b, &t));
    ts_tensor *g = KEEP(t);                         /* (N, 4, 3, 3) */
    TRY(ts_permute(g, (int[]){0, 2, 3, 1}, &t));
    ts_tensor *h = KEEP(t);                         /* (N, 3, 3, 4) */
    TRY(ts_flatten_range(h, 1, 2, &t));
    ts_tensor *i = KEEP(t);                         /* (N, 9, 4) */
    TRY(ts_matmul(i, ts_module_param(self, "w"), &t));
    ts_tensor *j = KEEP(t);                         /* (N, 9, 4) */
    TRY(ts_transpose(j, 1, 2, &t));
    ts_tensor *k = KEEP(t);                         /* (N, 4, 9) */
    TRY(ts_bmm(k, i, &t));
    ts_tensor *l = KEEP(t);                         /* (N, 4, 4) */
    TRY(ts_sum_dims(l, 1, (int[]){-1}, true, &t));
    ts_tensor *m1 = KEEP(t);                        /* (N, 4, 1) */
    TRY(ts_mean_dims(l, 1, (int[]){1}, false, &t));
    ts_tensor *m2 = KEEP(t);                        /* (N, 4) */
    TRY(ts_max_dim(l, 2, false, &t, NULL));
    ts_tensor *m3 = KEEP(t);                        /* (N, 4) */
    TRY(ts_flatten(m1, 1, &t));
    ts_tensor *m4 = KEEP(t);                        /* (N, 4) */
    TRY(ts_add(m2, m3, &t));
    ts_tensor *m5 = KEEP(t);
    TRY(ts_add(m5, m4, &t));
    ts_tensor *m6 = KEEP(t);
    TRY(ts_softmax(m6, -1, out));
fail:
    for (int q = 0; q < ntmp; q++) ts_tensor_release(tmp[q]);
    return st;
}

static void test_new_ops(void) {
    ts_rng r;
    ts_rng_seed(&r, 11);
    ts_module *m = NULL;
    CHECK_OK(ts_nn_module_new("NewOps", new_ops_forward, NULL, NULL, &m));
    CHECK_OK(ts_module_add_parameter(m, "w", tu_rand(&r, 2, (int64_t[]){4, 4}, -0.5f, 0.5f, false)));
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){3, 4, 6, 6}, -2, 2, false);
    export_and_compare(m, x, "new_ops",
                       "--rerun-batch 2 --expect-op Erf --expect-op Tanh --expect-op Transpose --expect-op ReduceMax "
                       "--expect-op ReduceSum --expect-op Softmax --expect-op Div --expect-op AveragePool");
    ts_tensor_release(x);
    /* adaptive pooling 7x7 -> 3x3 has windows of different sizes (rows 0-2, 2-4, 4-6: overlapping), which ONNX
     * pooling cannot say: exported as the pooling matrix (Reshape, MatMul, Reshape) */
    ts_tensor *y = tu_rand(&r, 4, (int64_t[]){2, 4, 7, 7}, -1, 1, false);
    export_and_compare(m, y, "uneven", "--rerun-batch 3 --expect-op MatMul --expect-op Reshape");
    ts_tensor_release(y);
    ts_module_free(m);
}

/* x (N, 6, 5, 5): group_norm (3 groups, affine) -> layer_norm over the last 2 dims (no affine) -> layer_norm
 * over the last dim (affine) -> avg pool 3x3 s2 p1 with count_include_pad off -> batchnorm1d (eval) on
 * (N, 6, 9). Parameters gw, gb (6), lw, lb (3); buffers rm, rv (6). */
static ts_status norm_ops_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *tmp[16] = {NULL}, *t = NULL;
    int ntmp = 0;
    ts_status st;
    TRY(ts_group_norm(x, 3, ts_module_param(self, "gw"), ts_module_param(self, "gb"), 1e-5f, &t));
    ts_tensor *a = KEEP(t);
    TRY(ts_layer_norm(a, 2, NULL, NULL, 1e-5f, &t));
    ts_tensor *b = KEEP(t);
    TRY(ts_avgpool2d(b, (ts_pool2d_params){{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, true}, &t));
    ts_tensor *c = KEEP(t); /* (N, 6, 3, 3) */
    TRY(ts_layer_norm(c, 1, ts_module_param(self, "lw"), ts_module_param(self, "lb"), 1e-3f, &t));
    ts_tensor *d = KEEP(t);
    TRY(ts_flatten(d, 2, &t));
    ts_tensor *e = KEEP(t); /* (N, 6, 9) */
    TRY(ts_batchnorm1d(e, NULL, NULL, ts_module_buffer(self, "rm"), ts_module_buffer(self, "rv"), false, 0.1f, 1e-5f,
                       out));
fail:
    for (int q = 0; q < ntmp; q++) ts_tensor_release(tmp[q]);
    return st;
}

static void test_norm_ops(void) {
    ts_rng r;
    ts_rng_seed(&r, 13);
    ts_module *m = NULL;
    CHECK_OK(ts_nn_module_new("NormOps", norm_ops_forward, NULL, NULL, &m));
    CHECK_OK(ts_module_add_parameter(m, "gw", tu_rand(&r, 1, (int64_t[]){6}, 0.5f, 1.5f, false)));
    CHECK_OK(ts_module_add_parameter(m, "gb", tu_rand(&r, 1, (int64_t[]){6}, -0.5f, 0.5f, false)));
    CHECK_OK(ts_module_add_parameter(m, "lw", tu_rand(&r, 1, (int64_t[]){3}, 0.5f, 1.5f, false)));
    CHECK_OK(ts_module_add_parameter(m, "lb", tu_rand(&r, 1, (int64_t[]){3}, -0.5f, 0.5f, false)));
    CHECK_OK(ts_module_add_buffer(m, "rm", tu_rand(&r, 1, (int64_t[]){6}, -0.2f, 0.2f, false)));
    CHECK_OK(ts_module_add_buffer(m, "rv", tu_rand(&r, 1, (int64_t[]){6}, 0.5f, 2.0f, false)));
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){3, 6, 5, 5}, -2, 2, false);
    export_and_compare(m, x, "norm_ops",
                       "--rerun-batch 2 --expect-op LayerNormalization --expect-op InstanceNormalization "
                       "--expect-op AveragePool --expect-op BatchNormalization");
    ts_tensor_release(x);
    ts_module_free(m);
}

static ts_status loss_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *h = NULL, *target = NULL;
    ts_status st = ts_flatten(x, 1, &h);
    if (st == TS_OK) st = ts_tensor_zeros(ts_device_cpu(), TS_I64, 1, ts_tensor_shape(x), &target);
    if (st == TS_OK) st = ts_cross_entropy(h, target, 0.0f, out);
    ts_tensor_release(h);
    ts_tensor_release(target);
    return st;
}
static ts_status bn_training_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_batchnorm2d(x, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f, out);
}
static ts_status dropout_training_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_dropout(x, 0.5f, true, NULL, out);
}
static ts_status outside_view_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *alias = NULL;
    ts_status st = ts_tensor_detach(x, &alias); /* shares x's storage, made by no op */
    if (st == TS_OK) st = ts_relu(alias, out);
    ts_tensor_release(alias);
    return st;
}
static ts_status clone_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *c = NULL;
    ts_status st = ts_tensor_clone(x, &c); /* a copy no op made: would be a constant */
    if (st == TS_OK) st = ts_relu(c, out);
    ts_tensor_release(c);
    return st;
}
static ts_status branch_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    if (ts_tensor_item(x, 0) > -0.2) return ts_relu(x, out); /* control flow on the input's values */
    ts_tensor *h = NULL;
    ts_status st = ts_scale(x, 2.0f, &h);
    if (st == TS_OK) st = ts_relu(h, out);
    ts_tensor_release(h);
    return st;
}
static ts_status dead_loss_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *loss = NULL;
    ts_tensor *h = NULL, *target = NULL;
    ts_status st = ts_flatten(x, 1, &h); /* a loss computed, then dropped: not part of the graph */
    if (st == TS_OK) st = ts_tensor_zeros(ts_device_cpu(), TS_I64, 1, ts_tensor_shape(x), &target);
    if (st == TS_OK) st = ts_cross_entropy(h, target, 0.0f, &loss);
    ts_tensor_release(h);
    ts_tensor_release(target);
    ts_tensor_release(loss);
    if (st == TS_OK) st = ts_relu(x, out);
    return st;
}
static ts_status identity_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    *out = ts_tensor_retain((ts_tensor *)x);
    return TS_OK;
}
static ts_status const_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *c = NULL, *alias = NULL, *h = NULL;
    ts_status st = ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){4}, 0.25f, &c);
    if (st == TS_OK) st = ts_tensor_detach(m->params[0], &alias); /* an alias of a parameter keeps its name */
    if (st == TS_OK) st = ts_add(x, c, &h);
    if (st == TS_OK) st = ts_mul(h, alias, out);
    ts_tensor_release(c);
    ts_tensor_release(alias);
    ts_tensor_release(h);
    return st;
}

static int nevents;
static ts_status count_events(void *user, const ts__trace_event *ev) {
    nevents++;
    return TS_OK;
}

static void expect_failure(ts_status (*fwd)(ts_module *, const ts_tensor *, ts_tensor **), const char *file,
                           ts_status want, const char *m1, const char *m2) {
    ts_rng r;
    ts_rng_seed(&r, 9);
    ts_module *m = functional(fwd, 0, NULL, NULL);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 4, 4}, -1, 1, false);
    ts_tensor_data_f32(x)[0] = -0.3f; /* the second input's first value is -0.1 */
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), file);
    CHECK_STATUS(ts_export_onnx(m, x, path, NULL), want);
    CHECK_ERR_MENTIONS(m1);
    CHECK_ERR_MENTIONS(m2);
    struct stat sb;
    CHECK(stat(path, &sb) != 0); /* nothing written */
    CHECK(!ts__trace_active());
    CHECK(ts_grad_is_enabled());
    ts_tensor_release(x);
    ts_module_free(m);
}

static void test_errors(void) {
    expect_failure(loss_forward, "loss.onnx", TS_ERR_UNSUPPORTED, "cross_entropy", "no ONNX mapping");
    expect_failure(bn_training_forward, "bn.onnx", TS_ERR_UNSUPPORTED, "batchnorm2d", "batch statistics");
    expect_failure(dropout_training_forward, "dropout.onnx", TS_ERR_UNSUPPORTED, "dropout", "training");
    expect_failure(outside_view_forward, "view.onnx", TS_ERR_UNSUPPORTED, "shares memory", "the input");
    expect_failure(clone_forward, "clone.onnx", TS_ERR_UNSUPPORTED, "changes with the", "no traced op made");
    expect_failure(branch_forward, "branch.onnx", TS_ERR_UNSUPPORTED, "depends on the input's values", "ops");

    /* a BatchNorm2d without running statistics always normalises with the batch's */
    ts_module *bn = NULL;
    CHECK_OK(ts_nn_batchnorm2d_new(3, 1e-5f, 0.1f, true, false, &bn));
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 4, 4}, -1, 1, false);
    char path[512];
    snprintf(path, sizeof path, "%s/bn2.onnx", tu_tmpdir());
    CHECK_STATUS(ts_export_onnx(bn, x, path, NULL), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("batchnorm2d");
    ts_module_free(bn);

    /* a failing forward: its own error, with the export's context */
    ts_module *lin = NULL;
    CHECK_OK(ts_nn_linear_new(5, 2, true, &r, &lin));
    CHECK_STATUS(ts_export_onnx(lin, x, path, NULL), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("traced forward");
    CHECK_ERR_MENTIONS("linear");
    ts_module_free(lin);

    /* bad arguments and paths */
    CHECK_STATUS(ts_export_onnx(NULL, x, path, NULL), TS_ERR_INVALID_ARG);
    ts_module *relu = NULL;
    CHECK_OK(ts_nn_relu_new(&relu));
    CHECK_STATUS(ts_export_onnx(relu, x, tu_tmpdir(), NULL), TS_ERR_IO); /* a directory */
    CHECK_STATUS(ts_export_onnx(relu, x, "/nonexistent-dir/m.onnx", NULL), TS_ERR_IO);
    ts_onnx_opts o = TS_ONNX_OPTS_INIT;
    o.input_name = o.output_name = "same";
    CHECK_STATUS(ts_export_onnx(relu, x, path, &o), TS_ERR_INVALID_ARG);
    ts_module *seq = NULL;
    CHECK_OK(ts_model_mlp(&r, &seq));
    o = TS_ONNX_OPTS_INIT;
    o.input_name = "1.weight"; /* a parameter's name */
    ts_tensor *img = tu_rand(&r, 4, (int64_t[]){2, 1, 28, 28}, -1, 1, false);
    CHECK_STATUS(ts_export_onnx(seq, img, path, &o), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("1.weight");
    ts_tensor_release(img);
    ts_module_free(seq);
    ts_module_free(relu);

    /* traces do not nest */
    CHECK_OK(ts_nn_relu_new(&relu));
    CHECK_OK(ts__trace_begin(count_events, NULL));
    CHECK_STATUS(ts_export_onnx(relu, x, path, NULL), TS_ERR_STATE);
    CHECK_ERR_MENTIONS("already tracing");
    ts__trace_end();
    ts_module_free(relu);
    ts_tensor_release(x);
}

/* Every allocation of an export failing in turn: TS_ERR_NOMEM, nothing written, nothing leaked (ASan). */
static void test_alloc_failures(void) {
    ts_rng r;
    ts_rng_seed(&r, 13);
    ts_module *m = residual_net(&r);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){1, 3, 6, 6}, -1, 1, false);
    char path[512];
    snprintf(path, sizeof path, "%s/oom.onnx", tu_tmpdir());
    ts__alloc_fail_after(LONG_MAX);
    CHECK_OK(ts_export_onnx(m, x, path, NULL));
    long total = ts__alloc_count();
    ts__alloc_fail_after(-1);
    CHECK(total > 50);
    printf("export: %ld allocations, each failed in turn\n", total);
    unlink(path);
    int nomem = 0;
    for (long n = 0; n < total; n++) {
        ts__alloc_fail_after(n);
        ts_status st = ts_export_onnx(m, x, path, NULL);
        ts__alloc_fail_after(-1);
        CHECK(st == TS_ERR_NOMEM);
        if (st != TS_ERR_NOMEM) fprintf(stderr, "  allocation %ld: %s (%s)\n", n, ts_status_name(st), ts_last_error());
        nomem += st == TS_ERR_NOMEM;
        struct stat sb;
        CHECK(stat(path, &sb) != 0);
        CHECK(!ts__trace_active() && ts_grad_is_enabled());
    }
    CHECK(nomem == total);
    ts_tensor_release(x);
    ts_module_free(m);
}

static void test_pruning_identity_constants(void) {
    ts_rng r;
    ts_rng_seed(&r, 11);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 4, 4}, -1, 1, false);
    char path[512];
    model_info mi;
    snprintf(path, sizeof path, "%s/dead.onnx", tu_tmpdir());
    ts_module *m = functional(dead_loss_forward, 0, NULL, NULL);
    CHECK_OK(ts_export_onnx(m, x, path, NULL)); /* the unmapped loss is not in the graph */
    CHECK(read_model(path, &mi) && mi.nops == 1 && strcmp(mi.ops[0], "Relu") == 0);
    ts_module_free(m);

    m = functional(identity_forward, 0, NULL, NULL);
    snprintf(path, sizeof path, "%s/identity.onnx", tu_tmpdir());
    CHECK_OK(ts_export_onnx(m, x, path, NULL));
    CHECK(read_model(path, &mi) && mi.nops == 1 && strcmp(mi.ops[0], "Identity") == 0);
    CHECK(strcmp(mi.output_dim0, "N") == 0);
    ts_module_free(m);

    const char *names[1] = {"gain"};
    ts_tensor *p[1] = {tu_rand(&r, 1, (int64_t[]){4}, -1, 1, false)};
    m = functional(const_forward, 1, names, p);
    snprintf(path, sizeof path, "%s/const.onnx", tu_tmpdir());
    CHECK_OK(ts_export_onnx(m, x, path, NULL));
    CHECK(read_model(path, &mi) && mi.nops == 2 && has_init(&mi, "const_0") && has_init(&mi, "gain"));
    CHECK(mi.ninits == 2);
    export_and_compare(m, x, "const", "--rerun-batch 1");
    ts_module_free(m);
    ts_tensor_release(x);
}

static ts__trace_event last_event;
static ts__trace_attrs last_attrs;
static ts_status keep_event(void *user, const ts__trace_event *ev) {
    (*(int *)user)++;
    last_event = *ev;
    last_attrs = *ev->a;
    return user ? TS_OK : TS_ERR_INTERNAL;
}
static ts_status fail_event(void *user, const ts__trace_event *ev) {
    return ts_error(TS_ERR_UNSUPPORTED, "tracer says no to %s", ts__op_name(ev->op));
}

static void test_trace_hook(void) {
    /* the tracer sees each op once, after it ran, with its normalised attributes */
    ts_rng r;
    ts_rng_seed(&r, 2);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){1, 2, 5, 5}, -1, 1, false), *y = NULL;
    int n = 0;
    CHECK_OK(ts__trace_begin(keep_event, &n));
    CHECK(ts__trace_active());
    CHECK_OK(ts_maxpool2d(x, (ts_pool2d_params){{3, 3}, {0, 0}, {1, 1}, {0, 0}, true, false}, &y));
    CHECK(n == 1 && last_event.op == TS_OP_MAXPOOL2D && last_event.out == y && last_event.in[0] == x);
    CHECK(last_attrs.i[2] == 3 && last_attrs.i[3] == 3 && last_attrs.i[6] == 1 && last_attrs.i[8] == 1);
    ts_tensor_release(y);
    CHECK_OK(ts_slice(x, -1, -2, 100, &y));
    CHECK(n == 2 && last_event.op == TS_OP_SLICE && last_attrs.i[0] == 3 && last_attrs.i[1] == 3 &&
          last_attrs.i[2] == 5);
    ts_tensor_release(y);
    CHECK_OK(ts_dropout(x, 0.5f, false, NULL, &y)); /* eval: the input itself, nothing to record */
    CHECK(n == 2 && y == x);
    ts_tensor_release(y);
    ts__trace_end();
    CHECK(!ts__trace_active());
    CHECK_OK(ts_relu(x, &y));
    CHECK(n == 2);
    ts_tensor_release(y);
    /* a failing tracer fails the op, which returns no result */
    CHECK_OK(ts__trace_begin(fail_event, NULL));
    y = NULL;
    CHECK_STATUS(ts_relu(x, &y), TS_ERR_UNSUPPORTED);
    CHECK(y == NULL);
    CHECK_ERR_MENTIONS("relu");
    ts__trace_end();
    ts_tensor_release(x);
    CHECK(strcmp(ts__op_name(TS_OP_CONV2D), "conv2d") == 0 && strcmp(ts__op_name(TS_OP_COUNT), "?") == 0);
    for (int k = 0; k < TS_OP_COUNT; k++) CHECK(strcmp(ts__op_name((ts__op_kind)k), "?") != 0);
}

/* A GPT-2 (embeddings, LayerNorm, causal attention, tanh GELU, the tied head) against onnxruntime: int64 token ids in,
 * logits out; the batch symbolic (rerun with 1 row), the sequence length the example's. */
static void test_gpt(void) {
    ts_gpt_config c;
    CHECK_OK(ts_gpt_preset("gpt2-tiny", &c));
    c.n_head = 4;
    c.n_embd = 32;
    c.vocab_size = 97;
    c.init_std = 0.2f;
    ts_rng r;
    ts_rng_seed(&r, 17);
    ts_module *m = NULL;
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    int64_t ids[3 * 21];
    for (int i = 0; i < 3 * 21; i++) ids[i] = (int64_t)ts_rng_below(&r, 97);
    ts_tensor *x = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){3, 21}, ids, &x));
    if (m && x)
        export_and_compare(m, x, "gpt",
                           "--rerun-batch 1 --expect-initializer transformer.wte.weight --expect-initializer "
                           "transformer.h.1.attn.c_attn.weight --expect-op Softmax --expect-op Tanh");
    ts_tensor_release(x);
    ts_module_free(m);
}

static void test_report(void) {
    if (ort_skipped) printf("note: onnxruntime comparisons skipped (python3 lacks onnx/onnxruntime)\n");
    tu_rm_tmpdir();
}

TU_MAIN(T(test_protobuf_writer), T(test_gpt), T(test_trace_hook), T(test_cnn_structure), T(test_residual_and_state),
        T(test_functional_ops), T(test_new_ops), T(test_norm_ops), T(test_errors), T(test_pruning_identity_constants), T(test_alloc_failures),
        T(test_report))
