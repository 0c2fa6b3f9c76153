/*
 * ops/cuda/reduce.cuh — group reductions shared by the .cu files that reduce rows (misc.cu, norm.cu):
 * a row is handled by one thread, one warp or one block (GThread, GWarp, GBlock), and sum/max over
 * the group return the same value in every thread, from a tree whose shape depends only on the group
 * size (deterministic). Included inside each file's anonymous namespace region: file-local copies.
 */
#ifndef TS_OPS_CUDA_REDUCE_CUH
#define TS_OPS_CUDA_REDUCE_CUH

#include "ops/cuda/cu.h"

#include <math.h>

#define TS_CU_FULL_MASK 0xffffffffu
#define ROW_BLOCK 512 /* threads of a GBlock row */

namespace {

/* ---- group reductions ---------------------------------------------------------------------------- */
template <class T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TS_CU_FULL_MASK, v, o);
    return v; /* every lane holds the same total (each tree node is a commutative a + b) */
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(TS_CU_FULL_MASK, v, o));
    return v;
}

/* One thread per row (rows strided across the whole grid). */
struct GThread {
    static __device__ int lane() { return 0; }
    static __device__ int size() { return 1; }
    static __device__ int64_t first() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
    static __device__ int64_t stride() { return (int64_t)gridDim.x * blockDim.x; }
    template <class T> static __device__ T sum(T v) { return v; }
    static __device__ float max(float v) { return v; }
};

/* One warp per row. */
struct GWarp {
    static __device__ int lane() { return threadIdx.x & 31; }
    static __device__ int size() { return 32; }
    static __device__ int64_t first() { return ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; }
    static __device__ int64_t stride() { return ((int64_t)gridDim.x * blockDim.x) >> 5; }
    template <class T> static __device__ T sum(T v) { return warp_sum(v); }
    static __device__ float max(float v) { return warp_max(v); }
};

/* One block per row; blockDim.x a multiple of 32, at most 1024. Every thread gets the result. The
 * leading barrier keeps a previous call's readers of sh ahead of this call's writers. */
struct GBlock {
    static __device__ int lane() { return threadIdx.x; }
    static __device__ int size() { return blockDim.x; }
    static __device__ int64_t first() { return blockIdx.x; }
    static __device__ int64_t stride() { return gridDim.x; }
    template <class T> static __device__ T sum(T v) {
        __shared__ T sh[32];
        v = warp_sum(v);
        __syncthreads();
        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
        __syncthreads();
        const int l = threadIdx.x & 31;
        v = l < (int)(blockDim.x >> 5) ? sh[l] : (T)0;
        return warp_sum(v); /* each warp sums the same partials in the same order */
    }
    static __device__ float max(float v) {
        __shared__ float sh[32];
        v = warp_max(v);
        __syncthreads();
        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
        __syncthreads();
        const int l = threadIdx.x & 31;
        v = l < (int)(blockDim.x >> 5) ? sh[l] : -INFINITY;
        return warp_max(v);
    }
};

} // namespace

#endif
