/*
 * ops/cpu/vmath.h — float exp and erf that vectorise. glibc's expf and erff are
 * scalar calls (about 5 and 20 ns), so a loop over them runs one element at a
 * time; these are branch-free polynomials that GCC turns into AVX code inside
 * the kernels' loops (-O3 -march=native), at a few ulp.
 */
#ifndef TS_CPU_VMATH_H
#define TS_CPU_VMATH_H

#include <math.h>
#include <stdint.h>

/* exp(x) within 1.5 ulp for results above 2.7e-38 (smaller ones flush to 0);
 * inf above 88.72, nan stays nan. exp(x) = 2^n exp(r), n = round(x / ln 2),
 * r = x - n ln 2 (Cody-Waite, two parts), |r| <= ln 2 / 2, exp(r) = 1 + r +
 * r^2 P(r) with Cephes' expf polynomial; 2^(n-1) is built in the exponent bits
 * (n - 1 keeps n = 128 representable) and the product doubled. */
static inline float ts__vexpf(float x) {
    float xc = x < -86.6f ? -86.6f : x > 88.7228391f ? 88.7228391f : x;
    xc = xc == xc ? xc : 0.0f;
    /* round to nearest by the 1.5 * 2^23 trick (floorf would be a call the loop cannot vectorise) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 126) << 23}; /* (a union, not memcpy: this vectorises inside OpenMP loops) */
    y = y * s.f * 2.0f;
    y = x < -86.6f ? 0.0f : y;
    y = x > 88.7228391f ? INFINITY : y;
    return x == x ? y : x;
}

/* erf(x) as a rational function, x P(x^2) / Q(x^2) on [-4, 4] (outside it erf
 * is +-1 in float): the approximation Eigen and XLA use for float erf, within
 * 4.2e-7 of erf everywhere. */
static inline float ts__verff(float x) {
    x = x < -4.0f ? -4.0f : x > 4.0f ? 4.0f : x; /* (not fminf/fmaxf: these vectorise; nan stays nan) */
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return x * p / q;
}

/* tanh(x) as a rational function, x P(x^2) / Q(x^2) on [-7.9053, 7.9053] (beyond, tanh is +-1 in float) and
 * x itself below 4e-4: the minimax form Eigen and XLA use for float tanh, within 7 ulp (4.1e-7 relative) of
 * tanh over every float in [-12, 12]; nan stays nan. */
static inline float ts__vtanhf(float x) {
    const float c = 7.90531110763549805f;
    float xc = x < -c ? -c : x > c ? c : x;
    float x2 = xc * xc;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 - 8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    float y = xc * p / q;
    return (x < 4e-4f && x > -4e-4f) ? x : y;
}

#endif /* TS_CPU_VMATH_H */
