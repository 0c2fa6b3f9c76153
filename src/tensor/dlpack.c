/*
 * tensor/dlpack.c — DLPack export and import (include/tessera/dlpack.h): a tensor's memory described
 * for another framework, another framework's memory wrapped as a tensor; never a copy.
 */
#include "tessera/dlpack.h"

#include "tensor/tensor.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- dtypes and devices ------------------------------------------------------------------------------ */

static const struct {
    ts_dtype dt;
    uint8_t code, bits;
} DTYPES[] = {
    {TS_F32, kDLFloat, 32}, {TS_F16, kDLFloat, 16}, {TS_BF16, kDLBfloat, 16},
    {TS_I64, kDLInt, 64},   {TS_I32, kDLInt, 32},   {TS_U8, kDLUInt, 8},
};

static DLDataType dl_dtype(ts_dtype dt) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (DTYPES[i].dt == dt) return (DLDataType){DTYPES[i].code, DTYPES[i].bits, 1};
    return (DLDataType){kDLOpaqueHandle, 0, 0}; /* not reached: every ts_dtype is in the table */
}

static const char *code_name(uint8_t code) {
    switch (code) {
    case kDLInt: return "int";
    case kDLUInt: return "uint";
    case kDLFloat: return "float";
    case kDLBfloat: return "bfloat";
    case kDLComplex: return "complex";
    case kDLBool: return "bool";
    default: return "opaque";
    }
}

static ts_status ts_dtype_of(DLDataType d, ts_dtype *out) {
    if (d.lanes == 1)
        for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
            if (DTYPES[i].code == d.code && DTYPES[i].bits == d.bits) {
                *out = DTYPES[i].dt;
                return TS_OK;
            }
    return ts_error(TS_ERR_DTYPE, "from DLPack: dtype %s%u%s is not one Tessera has (float32, float16, bfloat16, "
                    "int64, int32, uint8)", code_name(d.code), (unsigned)d.bits,
                    d.lanes == 1 ? "" : " with lanes > 1");
}

static ts_status device_of(DLDevice d, ts_device **out) {
    if (d.device_type == kDLCPU || d.device_type == kDLCUDAHost) {
        *out = ts_device_cpu();
        return TS_OK;
    }
    if (d.device_type == kDLCUDA) {
        char name[32], why[256] = "";
        snprintf(name, sizeof name, "cuda:%d", (int)d.device_id);
        int n = ts_cuda_device_count(why, sizeof why);
        if (d.device_id < 0 || d.device_id >= n || ts_device_get(name, out) != TS_OK)
            return ts_error(TS_ERR_DEVICE, "from DLPack: a tensor on %s, which this Tessera does not have (%s)", name,
                            n == 0 ? why : "fewer CUDA devices");
        return TS_OK;
    }
    return ts_error(TS_ERR_DEVICE, "from DLPack: device type %d (DLDeviceType) is not one Tessera has (kDLCPU, "
                    "kDLCUDAHost, kDLCUDA)", (int)d.device_type);
}

/* ---- export ------------------------------------------------------------------------------------------ */

typedef struct exported {
    union {
        DLManagedTensorVersioned v;
        DLManagedTensor u;
    } m;
    ts_tensor *t; /* the reference the consumer holds */
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
} exported;

static void exported_free(exported *e) {
    ts_tensor_release(e->t);
    free(e);
}
static void delete_versioned(DLManagedTensorVersioned *m) { if (m) exported_free(m->manager_ctx); }
static void delete_unversioned(DLManagedTensor *m) { if (m) exported_free(m->manager_ctx); }

static ts_status export_tensor(ts_tensor *t, exported **out, DLTensor *dl) {
    TS_ARG(t, "to DLPack: NULL tensor");
    if (t->requires_grad)
        return ts_error(TS_ERR_INVALID_ARG, "to DLPack: the tensor requires grad; share ts_tensor_detach's result "
                        "instead (the consumer cannot take part in autograd)");
    ts_device *dev = t->storage->device;
    if (ts_device_type_of(dev) == TS_DEVICE_CUDA) TS_TRY(ts_device_synchronize(dev)); /* no stream to hand over */
    exported *e = ts__calloc(1, sizeof *e);
    if (!e) return TS_ERR_NOMEM;
    e->t = ts_tensor_retain(t);
    for (int i = 0; i < t->ndim; i++) {
        e->shape[i] = t->shape[i];
        e->strides[i] = t->stride[i];
    }
    *dl = (DLTensor){
        .data = ts_tensor_address(t),
        .device = ts_device_type_of(dev) == TS_DEVICE_CUDA ? (DLDevice){kDLCUDA, ts_device_index(dev)} : (DLDevice){kDLCPU, 0},
        .ndim = t->ndim,
        .dtype = dl_dtype(t->dtype),
        .shape = e->shape,
        .strides = e->strides,
        .byte_offset = 0,
    };
    *out = e;
    return TS_OK;
}

ts_status ts_tensor_to_dlpack(ts_tensor *t, DLManagedTensorVersioned **out) {
    TS_ARG(out, "ts_tensor_to_dlpack: NULL out");
    exported *e = NULL;
    DLTensor dl;
    TS_TRY(export_tensor(t, &e, &dl));
    e->m.v = (DLManagedTensorVersioned){{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}, e, delete_versioned, 0, dl};
    *out = &e->m.v;
    return TS_OK;
}

ts_status ts_tensor_to_dlpack_unversioned(ts_tensor *t, DLManagedTensor **out) {
    TS_ARG(out, "ts_tensor_to_dlpack_unversioned: NULL out");
    exported *e = NULL;
    DLTensor dl;
    TS_TRY(export_tensor(t, &e, &dl));
    e->m.u = (DLManagedTensor){dl, e, delete_unversioned};
    *out = &e->m.u;
    return TS_OK;
}

/* ---- import ------------------------------------------------------------------------------------------ */

static void release_versioned(void *ctx) {
    DLManagedTensorVersioned *m = ctx;
    if (m->deleter) m->deleter(m);
}

static void release_unversioned(void *ctx) {
    DLManagedTensor *m = ctx;
    if (m->deleter) m->deleter(m);
}

static ts_status import(const DLTensor *dl, void (*release)(void *), void *ctx, ts_tensor **out) {
    TS_ARG(out, "from DLPack: NULL out");
    if (dl->ndim < 0 || dl->ndim > TS_MAX_DIMS)
        return ts_error(TS_ERR_SHAPE, "from DLPack: %d dimensions; Tessera's tensors have at most %d", (int)dl->ndim,
                        TS_MAX_DIMS);
    TS_ARG(dl->ndim == 0 || dl->shape, "from DLPack: NULL shape for %d dimensions", (int)dl->ndim);
    ts_dtype dt = TS_F32;
    TS_TRY(ts_dtype_of(dl->dtype, &dt));
    ts_device *dev = NULL;
    TS_TRY(device_of(dl->device, &dev));
    size_t es = ts_dtype_size(dt);
    char *p = (char *)dl->data + dl->byte_offset;
    if ((uintptr_t)p % es)
        return ts_error(TS_ERR_INVALID_ARG, "from DLPack: the data (%p + byte_offset %llu) is not aligned to its "
                        "%zu-byte elements", dl->data, (unsigned long long)dl->byte_offset, es);
    int64_t strides[TS_MAX_DIMS], span = 1, numel = 1; /* span: elements from the first to one past the last */
    for (int i = dl->ndim - 1; i >= 0; i--) {
        if (dl->shape[i] < 0)
            return ts_error(TS_ERR_SHAPE, "from DLPack: negative size %lld in dim %d", (long long)dl->shape[i], i);
        strides[i] = dl->strides ? dl->strides[i] : (i == dl->ndim - 1 ? 1 : strides[i + 1] * dl->shape[i + 1]);
        if (strides[i] < 0)
            return ts_error(TS_ERR_INVALID_ARG, "from DLPack: stride %lld in dim %d is negative (a flipped view); "
                            "Tessera takes non-negative strides only: copy it first", (long long)strides[i], i);
        numel *= dl->shape[i];
        if (dl->shape[i] > 0) span += (dl->shape[i] - 1) * strides[i];
    }
    size_t nbytes = numel == 0 ? 0 : (size_t)span * es;
    return ts__tensor_wrap(dev, dt, dl->ndim, dl->shape, strides, p, nbytes, release, ctx, out);
}

ts_status ts_tensor_from_dlpack(DLManagedTensorVersioned *m, ts_tensor **out) {
    TS_ARG(m, "ts_tensor_from_dlpack: NULL tensor");
    if (m->version.major != DLPACK_MAJOR_VERSION)
        return ts_error(TS_ERR_UNSUPPORTED, "from DLPack: version %u.%u; Tessera reads major version %d",
                        (unsigned)m->version.major, (unsigned)m->version.minor, DLPACK_MAJOR_VERSION);
    if (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
        return ts_error(TS_ERR_INVALID_ARG, "from DLPack: the tensor is read-only, and Tessera's tensors are "
                        "writable: share a writable copy");
    return import(&m->dl_tensor, release_versioned, m, out);
}

ts_status ts_tensor_from_dlpack_unversioned(DLManagedTensor *m, ts_tensor **out) {
    TS_ARG(m, "ts_tensor_from_dlpack_unversioned: NULL tensor");
    return import(&m->dl_tensor, release_unversioned, m, out);
}
