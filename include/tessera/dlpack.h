/*
 * tessera/dlpack.h — tensors shared with other frameworks without a copy, through DLPack
 * (https://dmlc.github.io/dlpack/latest/): PyTorch (torch.from_dlpack / torch.utils.dlpack), NumPy
 * (np.from_dlpack), CuPy, JAX and others exchange DLManagedTensor(Versioned) structs.
 *
 * The structs below are DLPack 1.1's, laid out as its dlpack.h lays them out; when that header was
 * included first (DLPACK_MAJOR_VERSION defined), its definitions are used instead.
 *
 * Export: ts_tensor_to_dlpack (versioned, DLPack >= 1.0) and ts_tensor_to_dlpack_unversioned (the struct
 * of DLPack < 1.0, what torch 1.x reads) describe t's memory — no copy: the consumer sees t's own
 * elements, shape and strides (in elements), and t stays alive until the consumer calls the struct's
 * deleter. CPU tensors (any virtual CPU device) are kDLCPU device 0; CUDA tensors kDLCUDA with their
 * index, the device synchronised first so that the consumer's streams see finished data. Tensors that
 * require grad are refused (detach them first, as torch asks).
 *
 * Import: ts_tensor_from_dlpack / _unversioned wrap the producer's memory — no copy — in a tensor on
 * "cpu" (kDLCPU, kDLCUDAHost) or "cuda:<id>" (kDLCUDA, where Tessera has that device). On success the
 * tensor owns m: the deleter runs when the last tensor or view over it is released. On failure m is
 * left to the caller (its deleter not called). Refused, with the reason: dtypes other than float32,
 * float16, bfloat16, int64, int32 and uint8 (lanes 1), more than TS_MAX_DIMS dimensions, negative
 * strides (copy a flipped view first), data not aligned to its element size, read-only tensors
 * (DLPACK_FLAG_BITMASK_READ_ONLY: Tessera's tensors are writable), and devices Tessera does not have.
 */
#ifndef TESSERA_DLPACK_H
#define TESSERA_DLPACK_H

#include "tessera/tensor.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef DLPACK_MAJOR_VERSION
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;
typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
} DLDeviceType;
typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;
typedef enum {
    kDLInt = 0U,
    kDLUInt = 1U,
    kDLFloat = 2U,
    kDLOpaqueHandle = 3U,
    kDLBfloat = 4U,
    kDLComplex = 5U,
    kDLBool = 6U,
} DLDataTypeCode;
typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

/* t shared as DLPack (see above); *out is the consumer's until it calls (*out)->deleter(*out). */
ts_status ts_tensor_to_dlpack(ts_tensor *t, DLManagedTensorVersioned **out);
ts_status ts_tensor_to_dlpack_unversioned(ts_tensor *t, DLManagedTensor **out);
/* A tensor over m's memory (see above); *out is a new reference. */
ts_status ts_tensor_from_dlpack(DLManagedTensorVersioned *m, ts_tensor **out);
ts_status ts_tensor_from_dlpack_unversioned(DLManagedTensor *m, ts_tensor **out);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_DLPACK_H */
