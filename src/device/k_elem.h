/*
 * device/k_elem.h — the per-element arithmetic of the elementwise, softmax-family and optimizer
 * kernels, written once for every backend: the CPU loops (src/ops/cpu/ew.c, misc.c, optim.c) and
 * the CUDA kernels (src/ops/cuda/ew.cu, misc.cu, optim.cu) call these, so the two backends run the
 * same formula in the same operation order. Plain C11 that also compiles as CUDA C++ (TS_HD marks the functions
 * __host__ __device__ there); no library headers, so .cu files can include it.
 *
 * exp, erf and tanh: the activations take them through TS_ELEM_EXPF / TS_ELEM_ERFF / TS_ELEM_TANHF,
 * expf, erff and tanhf unless the includer defines them first. The CPU kernels define them as the
 * vectorising polynomials of ops/cpu/vmath.h (ts__vexpf, ts__verff, ts__vtanhf); the CUDA kernels keep
 * the libm ones.
 * Define them before the first include of this header in a file: the functions below are
 * compiled with whatever the macros say there.
 *
 * Floating-point contraction: GCC (C11 mode) never fuses a * b + c; nvcc does by default
 * (--fmad=true), so CUDA results can differ from the CPU's in the last bit or so.
 */
#ifndef TS_DEVICE_K_ELEM_H
#define TS_DEVICE_K_ELEM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/hd.h" /* TS_HD */

#ifndef TS_ELEM_EXPF
#define TS_ELEM_EXPF expf
#endif
#ifndef TS_ELEM_ERFF
#define TS_ELEM_ERFF erff
#endif
#ifndef TS_ELEM_TANHF
#define TS_ELEM_TANHF tanhf
#endif

/* ---- binary ops: op is a ts_binop (device/k_ew.h): 0 add, 1 sub, 2 mul, 3 div ----------------------- */
enum { TS_ELEM_ADD = 0, TS_ELEM_SUB = 1, TS_ELEM_MUL = 2, TS_ELEM_DIV = 3 };

/* Called with a constant op inside a loop (one loop per op), so the switch folds away. */
static inline TS_HD float ts_elem_binary(int op, float a, float b) {
    switch (op) {
    case TS_ELEM_ADD: return a + b;
    case TS_ELEM_SUB: return a - b;
    case TS_ELEM_MUL: return a * b;
    default: return a / b;
    }
}

/* y + alpha x (axpy; alpha == 1 gives y + x exactly) */
static inline TS_HD float ts_elem_axpy(float y, float alpha, float x) { return y + alpha * x; }

/* ---- relu ----------------------------------------------------------------------------------------- */
/* max(x, 0); NaN gives 0 */
static inline TS_HD float ts_elem_relu(float x) { return x > 0.0f ? x : 0.0f; }
/* the gradient passes where the forward output y is positive (a select, not a branch) */
static inline TS_HD float ts_elem_relu_backward(float g, float y) { return y > 0.0f ? g : 0.0f; }

/* ---- activations: op is a ts_unop (device/k_ew.h) --------------------------------------------------- */
enum { TS_ELEM_SIGMOID = 0, TS_ELEM_TANH = 1, TS_ELEM_GELU = 2, TS_ELEM_GELU_TANH = 3, TS_ELEM_SILU = 4 };

#define TS_ELEM_SQRT_2_OVER_PI 0.7978845608028654f
#define TS_ELEM_INV_SQRT_2 0.7071067811865476f
#define TS_ELEM_INV_SQRT_2PI 0.3989422804014327f
#define TS_ELEM_GELU_TANH_C 0.044715f

static inline TS_HD float ts_elem_sigmoid(float x) { return 1.0f / (1.0f + TS_ELEM_EXPF(-x)); }
static inline TS_HD float ts_elem_tanh(float x) { return TS_ELEM_TANHF(x); }
/* x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
static inline TS_HD float ts_elem_gelu(float x) { return 0.5f * x * (1.0f + TS_ELEM_ERFF(x * TS_ELEM_INV_SQRT_2)); }
/* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
static inline TS_HD float ts_elem_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + TS_ELEM_TANHF(TS_ELEM_SQRT_2_OVER_PI * (x + TS_ELEM_GELU_TANH_C * x * x * x)));
}
static inline TS_HD float ts_elem_silu(float x) { return x * ts_elem_sigmoid(x); }

static inline TS_HD float ts_elem_unary(int op, float x) {
    switch (op) {
    case TS_ELEM_SIGMOID: return ts_elem_sigmoid(x);
    case TS_ELEM_TANH: return ts_elem_tanh(x);
    case TS_ELEM_GELU: return ts_elem_gelu(x);
    case TS_ELEM_GELU_TANH: return ts_elem_gelu_tanh(x);
    default: return ts_elem_silu(x);
    }
}

/* Backward: g times the derivative. Sigmoid and tanh take the forward output y, the rest x. */
/* s' = s (1 - s) */
static inline TS_HD float ts_elem_sigmoid_backward(float g, float y) { return g * y * (1.0f - y); }
/* t' = 1 - t^2 */
static inline TS_HD float ts_elem_tanh_backward(float g, float y) { return g * (1.0f - y * y); }
/* Phi(x) + x phi(x) */
static inline TS_HD float ts_elem_gelu_backward(float g, float x) {
    float cdf = 0.5f * (1.0f + TS_ELEM_ERFF(x * TS_ELEM_INV_SQRT_2));
    float pdf = TS_ELEM_INV_SQRT_2PI * TS_ELEM_EXPF(-0.5f * x * x);
    return g * (cdf + x * pdf);
}
/* u = c (x + k x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2) */
static inline TS_HD float ts_elem_gelu_tanh_backward(float g, float x) {
    float x2 = x * x;
    float t = TS_ELEM_TANHF(TS_ELEM_SQRT_2_OVER_PI * (x + TS_ELEM_GELU_TANH_C * x2 * x));
    float du = TS_ELEM_SQRT_2_OVER_PI * (1.0f + 3.0f * TS_ELEM_GELU_TANH_C * x2);
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}
/* s (1 + x (1 - s)) */
static inline TS_HD float ts_elem_silu_backward(float g, float x) {
    float s = ts_elem_sigmoid(x);
    return g * s * (1.0f + x * (1.0f - s));
}

/* v: y for sigmoid and tanh, x for the others */
static inline TS_HD float ts_elem_unary_backward(int op, float g, float v) {
    switch (op) {
    case TS_ELEM_SIGMOID: return ts_elem_sigmoid_backward(g, v);
    case TS_ELEM_TANH: return ts_elem_tanh_backward(g, v);
    case TS_ELEM_GELU: return ts_elem_gelu_backward(g, v);
    case TS_ELEM_GELU_TANH: return ts_elem_gelu_tanh_backward(g, v);
    default: return ts_elem_silu_backward(g, v);
    }
}

/* v is the new maximum over best: larger, or the first NaN (NaN propagates as in torch.max); a
 * scan that keeps the first winner gives the first position of the maximum. */
static inline TS_HD bool ts_elem_max_wins(float v, float best) { return v > best || (v != v && best == best); }

/* ---- the softmax family (device/k_misc.h: softmax, log_softmax, cross-entropy) -------------------------- *
 * A row of n logits x_c is reduced to its max m and s = sum_c exp(x_c - m), s accumulated in double (the
 * reductions themselves are the kernels': SIMD lanes on the CPU, thread groups on CUDA); every output
 * element is then one of the formulas below. PyTorch's order: the shift x - m first (exact for the
 * logits near the max), then log s subtracted or s divided. Never x - (m + log s): m + log s rounded
 * to float loses up to half an ulp of m (0.03 at logits of 1e6) in every output. A row whose max is
 * -inf (all -inf) or +inf gives NaN, as PyTorch; a -inf entry beside finite ones gives softmax 0 and
 * log_softmax -inf. */

/* exp(x - m): softmax's numerator and the terms of s */
static inline TS_HD float ts_elem_shift_exp(float x, float m) { return TS_ELEM_EXPF(x - m); }
/* log_softmax(x) = (x - m) - log s, log_s = (float)log(s) */
static inline TS_HD float ts_elem_log_softmax(float x, float m, float log_s) { return (x - m) - log_s; }
/* cross-entropy's per-class term lse - x = (m - x) + log s, in double (the loss accumulates in double) */
static inline TS_HD double ts_elem_lse_minus(float x, float m, double log_s) { return ((double)m - x) + log_s; }

/* ---- optimizers (device/k_optim.h; torch.optim's single-tensor formulas, same order) ---------------- */
/* SGD's element constants, from ts_sgd_args by TS_ELEM_SGD_ARGS (C files) */
typedef struct ts_elem_sgd_args {
    float lr, momentum, damp1, wd; /* damp1 = 1 - dampening */
    bool nesterov, maximize, first;
} ts_elem_sgd_args;

#define TS_ELEM_SGD_ARGS(a)                                                                               \
    ((ts_elem_sgd_args){.lr = (a)->lr, .momentum = (a)->momentum, .damp1 = 1.0f - (a)->dampening,         \
                        .wd = (a)->weight_decay, .nesterov = (a)->nesterov, .maximize = (a)->maximize,    \
                        .first = (a)->first})

/* The new p; with momentum (has_buf), also updates *buf, the momentum buffer. Called with a constant
 * has_buf, so a loop has no branch on it. */
static inline TS_HD float ts_elem_sgd(float p, float g, bool has_buf, float *buf, const ts_elem_sgd_args *a) {
    float d = a->maximize ? -g : g;
    if (a->wd != 0.0f) d = d + a->wd * p;
    if (has_buf) {
        float b = a->first ? d : *buf * a->momentum + a->damp1 * d;
        *buf = b;
        d = a->nesterov ? d + a->momentum * b : b;
    }
    return p + (-a->lr) * d;
}

/* AdamW's element constants, from ts_adamw_args by TS_ELEM_ADAMW_ARGS (C files) */
typedef struct ts_elem_adamw_args {
    float w1, beta2, w2, eps; /* w1 = 1 - beta1, w2 = 1 - beta2 */
    float decay, neg_step, bc2_sqrt;
    bool maximize, apply_decay;
} ts_elem_adamw_args;

#define TS_ELEM_ADAMW_ARGS(a)                                                                              \
    ((ts_elem_adamw_args){.w1 = 1.0f - (a)->beta1, .beta2 = (a)->beta2, .w2 = 1.0f - (a)->beta2,          \
                          .eps = (a)->eps, .decay = (a)->decay, .neg_step = -(a)->step_size,              \
                          .bc2_sqrt = (a)->bc2_sqrt, .maximize = (a)->maximize,                           \
                          .apply_decay = (a)->weight_decay != 0.0f})

/* The new p; updates *m, *v and, with amsgrad, *vmax (a constant amsgrad, as has_buf above). */
static inline TS_HD float ts_elem_adamw(float p, float g, float *m, float *v, bool amsgrad, float *vmax,
                                        const ts_elem_adamw_args *a) {
    float gi = a->maximize ? -g : g;
    float x = a->apply_decay ? p * a->decay : p;
    float mi = *m;
    /* torch.lerp(m, g, w1) */
    mi = a->w1 < 0.5f ? mi + a->w1 * (gi - mi) : gi - (gi - mi) * (1.0f - a->w1);
    *m = mi;
    float vi = *v * a->beta2 + a->w2 * (gi * gi);
    *v = vi;
    if (amsgrad) {
        vi = fmaxf(*vmax, vi);
        *vmax = vi;
    }
    float denom = sqrtf(vi) / a->bc2_sqrt + a->eps;
    return x + a->neg_step * (mi / denom);
}

/* grad_scale: whether g is inf or NaN (tested before scaling), and g scaled */
static inline TS_HD bool ts_elem_nonfinite(float g) { return !isfinite(g); }
static inline TS_HD float ts_elem_scale(float g, float factor) { return g * factor; }

/* grad_sumsq's term, in double */
static inline TS_HD double ts_elem_sq(float g) { return (double)g * (double)g; }

#endif /* TS_DEVICE_K_ELEM_H */
