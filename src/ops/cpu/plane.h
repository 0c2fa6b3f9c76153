/*
 * ops/cpu/plane.h — kernels over one contiguous plane of float32 or bfloat16
 * elements (bf16 true: uint16_t bfloat16, widened to float32 on load, results
 * rounded once on store): the sums of BatchNorm's statistics and backward and of
 * the conv bias gradient (spatial.c), of LayerNorm's and GroupNorm's rows
 * (norm.c, float32), and BatchNorm's and GroupNorm's per-plane affine maps.
 *
 * The sums have one fixed order, the same for both element types and on every
 * CPU (plane.c): the whole blocks of 16 elements are cut into runs of at most
 * TS_PLANE_RUN blocks; within a run element i goes to float partial sum i % 16,
 * which adds its elements in index order (products rounded to float first: no
 * FMA); at the end of each run float lane j is added to double lane j (in run
 * order); the 16 double lanes are totalled by a fixed tree: t[j] = lane j +
 * lane j + 8 for j < 8, then t[j] += t[j + 4] for j < 4, t[j] += t[j + 2] for
 * j < 2, and t[0] + t[1]; the last n % 16 elements are added to that in double,
 * in order. A float lane adds at most TS_PLANE_RUN terms, so the error does not
 * grow with n. A bfloat16 plane gives exactly the sums of its float32 widening,
 * and an AVX2 machine the AVX-512 machine's bits.
 *
 * The maps are centred on the mean m: (x - m) s + t, never x s + (t - m s),
 * which rounds x s (|m| / std times larger than the result) and then cancels it.
 */
#ifndef TS_OPS_CPU_PLANE_H
#define TS_OPS_CPU_PLANE_H

#include <stdbool.h>
#include <stdint.h>

#define TS_PLANE_LANES 16 /* float partial sums per reduction (plane.c's fixed order) */
#define TS_PLANE_RUN 16   /* blocks of TS_PLANE_LANES elements a float lane sums before it goes to double */

/* sum of p[0..n) */
double ts__cpu_plane_sum(const void *p, int64_t n, bool bf16);

/* *s1 += sum of (p[i] - m); *s2 += sum of (p[i] - m)^2: BatchNorm's statistics in one pass, about a shift m
 * near the mean, so the variance does not cancel */
void ts__cpu_plane_shifted_sums(const void *p, int64_t n, float m, bool bf16, double *s1, double *s2);

/* *sg += sum of g[i]; *sgx += sum of g[i] * (x[i] - m) (BatchNorm's backward) */
void ts__cpu_plane_dot_dev(const void *g, const void *x, int64_t n, float m, bool bf16, double *sg, double *sgx);

/* o[i] = a g[i] + b (x[i] - m) + k (BatchNorm's input gradient) */
void ts__cpu_plane_axpbyc(void *o, const void *g, const void *x, int64_t n, float a, float b, float m, float k,
                          bool bf16);

/* o[i] = (x[i] - m) s + t (BatchNorm's and GroupNorm's affine) */
void ts__cpu_plane_affine(void *o, const void *x, int64_t n, float m, float s, float t, bool bf16);

#endif
