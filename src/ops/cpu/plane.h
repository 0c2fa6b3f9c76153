/*
 * ops/cpu/plane.h — kernels over one contiguous plane of float32 or bfloat16
 * elements (bf16 true: uint16_t bfloat16, widened to float32 on load, results
 * rounded once on store): the sums of BatchNorm's statistics and backward and of
 * the conv bias gradient (spatial.c), and BatchNorm's per-plane affine maps.
 *
 * The sums have one fixed order, the same for both element types and on every
 * CPU (plane.c): element i goes to float partial sum i % 16, each partial sum
 * adds its elements in index order (products rounded to float first: no FMA),
 * and the 16 are totalled in double by a fixed tree: t[j] = lane j + lane j + 8
 * for j < 8, then t[j] += t[j + 4] for j < 4, t[j] += t[j + 2] for j < 2, and
 * t[0] + t[1]. A bfloat16 plane therefore gives exactly the sums of its float32
 * widening, and an AVX2 machine the AVX-512 machine's bits.
 */
#ifndef TS_OPS_CPU_PLANE_H
#define TS_OPS_CPU_PLANE_H

#include <stdbool.h>
#include <stdint.h>

#define TS_PLANE_LANES 16 /* float partial sums per reduction (plane.c's fixed order) */

/* sum of p[0..n) */
double ts__cpu_plane_sum(const void *p, int64_t n, bool bf16);

/* *s1 += sum of (p[i] - m); *s2 += sum of (p[i] - m)^2: BatchNorm's statistics in one pass, about a shift m
 * near the mean, so the variance does not cancel */
void ts__cpu_plane_shifted_sums(const void *p, int64_t n, float m, bool bf16, double *s1, double *s2);

/* *sg += sum of g[i]; *sgx += sum of g[i] * (x[i] - m) (BatchNorm's backward) */
void ts__cpu_plane_dot_dev(const void *g, const void *x, int64_t n, float m, bool bf16, double *sg, double *sgx);

/* o[i] = a g[i] + b x[i] + k (BatchNorm's input gradient) */
void ts__cpu_plane_axpbyc(void *o, const void *g, const void *x, int64_t n, float a, float b, float k, bool bf16);

/* o[i] = x[i] s + t (BatchNorm's affine) */
void ts__cpu_plane_affine(void *o, const void *x, int64_t n, float s, float t, bool bf16);

#endif
