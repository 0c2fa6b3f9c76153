/*
 * tests/test_dlpack.c — DLPack (include/tessera/dlpack.h): a tensor exported shares its memory (the
 * struct's data is the tensor's, shape and strides its own, a view's strides too) and stays alive until
 * the consumer's deleter; a view's memory too; every dtype's code and bits; foreign memory imported without a copy (writes
 * visible both ways, strided and offset views, the producer's deleter called exactly once, after the
 * last view); every refusal naming its reason and leaving the producer's struct untouched.
 * tests/dlpack_torch.py checks the same against PyTorch's own DLPack.
 */
#include "test_util.h"

#include "tessera/dlpack.h"

static void test_export(void) {
    int64_t shape[2] = {2, 3};
    float data[6] = {1, 2, 3, 4, 5, 6};
    ts_tensor *t = tu_tensor(2, shape, data);
    DLManagedTensorVersioned *m = NULL;
    CHECK_OK(ts_tensor_to_dlpack(t, &m));
    if (!m) return;
    CHECK(m->version.major == 1 && m->flags == 0);
    CHECK(m->dl_tensor.data == ts_tensor_data(t) && m->dl_tensor.byte_offset == 0);
    CHECK(m->dl_tensor.device.device_type == kDLCPU && m->dl_tensor.device.device_id == 0);
    CHECK(m->dl_tensor.ndim == 2 && m->dl_tensor.shape[0] == 2 && m->dl_tensor.shape[1] == 3);
    CHECK(m->dl_tensor.strides[0] == 3 && m->dl_tensor.strides[1] == 1);
    CHECK(m->dl_tensor.dtype.code == kDLFloat && m->dl_tensor.dtype.bits == 32 && m->dl_tensor.dtype.lanes == 1);
    ts_tensor_release(t); /* the consumer's reference keeps the memory */
    CHECK(((float *)m->dl_tensor.data)[5] == 6);
    m->deleter(m); /* frees it (ASan: no leak, no use after free) */

    /* a reshaped view: the same memory, its own shape */
    t = tu_tensor(2, shape, data);
    ts_tensor *v = NULL;
    int64_t vs[2] = {3, 2};
    CHECK_OK(ts_reshape(t, 2, vs, &v));
    DLManagedTensor *u = NULL;
    CHECK_OK(ts_tensor_to_dlpack_unversioned(v, &u));
    if (u) {
        CHECK(u->dl_tensor.shape[0] == 3 && u->dl_tensor.shape[1] == 2);
        CHECK(u->dl_tensor.strides[0] == 2 && u->dl_tensor.strides[1] == 1);
        CHECK(u->dl_tensor.data == ts_tensor_data(t));
        u->deleter(u);
    }
    ts_tensor_release(v);
    /* requires grad: refused, as torch refuses */
    ts_tensor_set_requires_grad(t, true);
    CHECK_STATUS(ts_tensor_to_dlpack(t, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("requires grad");
    ts_tensor_release(t);
}

static void test_dtypes(void) {
    const struct {
        ts_dtype dt;
        uint8_t code, bits;
    } want[] = {{TS_F32, kDLFloat, 32}, {TS_F16, kDLFloat, 16}, {TS_BF16, kDLBfloat, 16},
                {TS_I64, kDLInt, 64},   {TS_I32, kDLInt, 32},   {TS_U8, kDLUInt, 8}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t shape[1] = {4};
        ts_tensor *t = NULL, *back = NULL;
        CHECK_OK(ts_tensor_zeros(NULL, want[i].dt, 1, shape, &t));
        DLManagedTensorVersioned *m = NULL;
        CHECK_OK(ts_tensor_to_dlpack(t, &m));
        CHECK(m && m->dl_tensor.dtype.code == want[i].code && m->dl_tensor.dtype.bits == want[i].bits);
        CHECK_OK(ts_tensor_from_dlpack(m, &back)); /* round trip: the same memory, the same dtype */
        CHECK(back && ts_tensor_dtype(back) == want[i].dt && ts_tensor_data(back) == ts_tensor_data(t));
        ts_tensor_release(back); /* runs m's deleter */
        ts_tensor_release(t);
    }
}

/* ---- import ---------------------------------------------------------------------------------------- */

typedef struct producer {
    DLManagedTensorVersioned m;
    DLManagedTensor u;
    int64_t shape[3], strides[3];
    float buf[64];
    int deleted;
} producer;

static void producer_delete(DLManagedTensorVersioned *m) { ((producer *)m->manager_ctx)->deleted++; }
static void producer_delete_u(DLManagedTensor *m) { ((producer *)m->manager_ctx)->deleted++; }

/* p describes its buffer as ndim x shape with strides (NULL: compact) from byte offset off. */
static void produce(producer *p, int ndim, const int64_t *shape, const int64_t *strides, uint64_t off) {
    memset(p, 0, sizeof *p);
    for (int i = 0; i < 64; i++) p->buf[i] = (float)i;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        if (strides) p->strides[i] = strides[i];
    }
    DLTensor dl = {p->buf, {kDLCPU, 0}, ndim, {kDLFloat, 32, 1}, p->shape, strides ? p->strides : NULL, off};
    p->m = (DLManagedTensorVersioned){{1, 1}, p, producer_delete, 0, dl};
    p->u = (DLManagedTensor){dl, p, producer_delete_u};
}

static void test_import(void) {
    producer p;
    int64_t shape[2] = {3, 4};
    produce(&p, 2, shape, NULL, 0);
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_dlpack(&p.m, &t));
    if (!t) return;
    CHECK(ts_tensor_data(t) == p.buf && ts_tensor_is_contiguous(t) && ts_tensor_dim(t, 0) == 3);
    ts_tensor_data_f32(t)[5] = -1; /* writes are the producer's */
    CHECK(p.buf[5] == -1);
    p.buf[6] = -2;
    CHECK(ts_tensor_data_f32(t)[6] == -2);
    ts_tensor *c = NULL; /* a copy reads through it */
    CHECK_OK(ts_tensor_clone(t, &c));
    CHECK(c && ts_tensor_data_f32(c)[11] == 11);
    ts_tensor_release(c);
    ts_tensor *v = NULL;
    int64_t flat[1] = {12};
    CHECK_OK(ts_reshape(t, 1, flat, &v)); /* a view outlives the tensor: the deleter waits for it */
    CHECK(v && ts_tensor_data(v) == p.buf);
    ts_tensor_release(t);
    CHECK(p.deleted == 0);
    ts_tensor_release(v);
    CHECK(p.deleted == 1);

    /* strided (every other column of a 4 x 8 buffer) from a byte offset of one row */
    int64_t sh2[2] = {3, 4}, st2[2] = {8, 2};
    produce(&p, 2, sh2, st2, 8 * sizeof(float));
    CHECK_OK(ts_tensor_from_dlpack_unversioned(&p.u, &t));
    if (t) {
        CHECK(!ts_tensor_is_contiguous(t) && ts_tensor_strides(t)[0] == 8 && ts_tensor_strides(t)[1] == 2);
        CHECK_OK(ts_tensor_clone(t, &c)); /* row r, column k: buf[8 + 8r + 2k] */
        const float *f = c ? ts_tensor_data_f32(c) : NULL;
        CHECK(f && f[0] == 8 && f[1] == 10 && f[4] == 16 && f[11] == 8 + 16 + 6);
        ts_tensor_release(c);
        DLManagedTensorVersioned *m = NULL; /* exported again: the same memory and strides */
        CHECK_OK(ts_tensor_to_dlpack(t, &m));
        if (m) {
            CHECK(m->dl_tensor.data == p.buf + 8 && m->dl_tensor.strides[0] == 8 && m->dl_tensor.strides[1] == 2);
            ts_tensor_release(t);
            CHECK(p.deleted == 0); /* the consumer's reference holds it */
            m->deleter(m);
        } else {
            ts_tensor_release(t);
        }
    }
    CHECK(p.deleted == 1);

    /* empty and 0-d tensors */
    int64_t sh0[1] = {0};
    produce(&p, 1, sh0, NULL, 0);
    CHECK_OK(ts_tensor_from_dlpack(&p.m, &t));
    CHECK(t && ts_tensor_numel(t) == 0);
    ts_tensor_release(t);
    CHECK(p.deleted == 1);
    produce(&p, 0, NULL, NULL, 4 * sizeof(float));
    CHECK_OK(ts_tensor_from_dlpack(&p.m, &t));
    CHECK(t && ts_tensor_ndim(t) == 0 && ts_tensor_data_f32(t)[0] == 4);
    ts_tensor_release(t);
    CHECK(p.deleted == 1);
}

/* Every refusal: an error naming why, nothing made, the producer's deleter not called. */
static void refused(producer *p, bool versioned, ts_status want, const char *why) {
    ts_tensor *t = NULL;
    ts_status st = versioned ? ts_tensor_from_dlpack(&p->m, &t) : ts_tensor_from_dlpack_unversioned(&p->u, &t);
    CHECK_STATUS(st, want);
    CHECK(t == NULL && p->deleted == 0);
    CHECK_ERR_MENTIONS(why);
}

static void test_refusals(void) {
    producer p;
    int64_t shape[2] = {2, 3}, neg[2] = {-3, 1};
    produce(&p, 2, shape, NULL, 0);
    p.m.dl_tensor.dtype = (DLDataType){kDLComplex, 64, 1};
    refused(&p, true, TS_ERR_DTYPE, "dtype complex64 is not one Tessera has");
    p.m.dl_tensor.dtype = (DLDataType){kDLFloat, 32, 4};
    refused(&p, true, TS_ERR_DTYPE, "float32 with lanes > 1");
    p.u.dl_tensor.dtype = (DLDataType){kDLBool, 8, 1};
    refused(&p, false, TS_ERR_DTYPE, "bool8");
    produce(&p, 2, shape, neg, 0);
    refused(&p, true, TS_ERR_INVALID_ARG, "stride -3 in dim 0 is negative");
    produce(&p, 2, shape, NULL, 2);
    refused(&p, true, TS_ERR_INVALID_ARG, "not aligned to its 4-byte elements");
    produce(&p, 2, shape, NULL, 0);
    p.m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    refused(&p, true, TS_ERR_INVALID_ARG, "read-only");
    produce(&p, 2, shape, NULL, 0);
    p.m.version.major = 2;
    refused(&p, true, TS_ERR_UNSUPPORTED, "version 2.1");
    produce(&p, 2, shape, NULL, 0);
    p.m.dl_tensor.device = (DLDevice){kDLROCM, 0};
    refused(&p, true, TS_ERR_DEVICE, "device type 10");
    p.m.dl_tensor.device = (DLDevice){kDLCUDA, 7};
    refused(&p, true, TS_ERR_DEVICE, "a tensor on cuda:7, which this Tessera does not have");
    produce(&p, 2, shape, NULL, 0);
    p.m.dl_tensor.ndim = TS_MAX_DIMS + 1;
    refused(&p, true, TS_ERR_SHAPE, "dimensions; Tessera's tensors have at most");
}

TU_MAIN(T(test_export), T(test_dtypes), T(test_import), T(test_refusals))
