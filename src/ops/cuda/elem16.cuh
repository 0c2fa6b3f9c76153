/*
 * ops/cuda/elem16.cuh — loads and stores of the CUDA kernels' floating-point elements in any of the
 * float types (TS_CU_F32, TS_CU_F16, TS_CU_BF16 of ew_cu.h), through float32 as the CPU's kernels do:
 * a 16-bit element widens exactly, a float32 result rounds once (nearest even, core/half.h). Included by
 * the .cu files whose kernels take bfloat16 activations (ts_set_autocast) and by the cast kernel.
 */
#ifndef TS_OPS_CUDA_ELEM16_CUH
#define TS_OPS_CUDA_ELEM16_CUH

#include "core/half.h"
#include "ops/cuda/ew_cu.h"

template <int D>
static __device__ __forceinline__ float ts_cu_load(const void *p, int64_t i) {
    if constexpr (D == TS_CU_F32)
        return ((const float *)p)[i];
    else if constexpr (D == TS_CU_F16)
        return ts__f16_to_f32(((const uint16_t *)p)[i]);
    else
        return ts__bf16_to_f32(((const uint16_t *)p)[i]);
}

template <int D>
static __device__ __forceinline__ void ts_cu_store(void *p, int64_t i, float v) {
    if constexpr (D == TS_CU_F32)
        ((float *)p)[i] = v;
    else if constexpr (D == TS_CU_F16)
        ((uint16_t *)p)[i] = ts__f16_from_f32(v);
    else
        ((uint16_t *)p)[i] = ts__bf16_from_f32(v);
}

#endif
