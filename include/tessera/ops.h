/*
 * tessera/ops.h — differentiable tensor operations.
 *
 * Every op: inputs are borrowed, the result is a new reference in *out, inputs
 * must share one device, and the op records an autograd node when grad mode is
 * on and any input requires grad. Float ops take TS_F32; index inputs TS_I64.
 * Results are contiguous. Shapes follow PyTorch (NCHW for images).
 */
#ifndef TESSERA_OPS_H
#define TESSERA_OPS_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise (numpy broadcasting for binary ops) --------------------------------- */
ts_status ts_add(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_sub(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_mul(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
ts_status ts_div(const ts_tensor *a, const ts_tensor *b, ts_tensor **out); /* a / b (IEEE: x / 0 is inf or nan) */
ts_status ts_scale(const ts_tensor *a, float s, ts_tensor **out); /* s * a */
ts_status ts_relu(const ts_tensor *x, ts_tensor **out);

/* ---- activations ------------------------------------------------------------------------------ */
ts_status ts_sigmoid(const ts_tensor *x, ts_tensor **out);
ts_status ts_tanh(const ts_tensor *x, ts_tensor **out);
/* tanh_approx false: x Phi(x) with erf (PyTorch approximate='none');
 * true: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (approximate='tanh'). */
ts_status ts_gelu(const ts_tensor *x, bool tanh_approx, ts_tensor **out);
ts_status ts_silu(const ts_tensor *x, ts_tensor **out); /* x sigmoid(x) */
/* exp(x) / sum exp(x) along dim (negative counts from the end), max-shifted. */
ts_status ts_softmax(const ts_tensor *x, int dim, ts_tensor **out);

/* ---- reductions --------------------------------------------------------------------------- */
ts_status ts_sum(const ts_tensor *x, ts_tensor **out);  /* all elements -> shape [] (ndim 0) */
ts_status ts_mean(const ts_tensor *x, ts_tensor **out); /* all elements -> shape [] */
/* Sum (mean) over dims[0..ndims) (negative values count from the end; a dim
 * twice or out of range is an error; ndims 0 reduces every dim, as PyTorch's
 * dim=[]). keepdim: reduced dims stay as size 1, else they are removed. */
ts_status ts_sum_dims(const ts_tensor *x, int ndims, const int *dims, bool keepdim, ts_tensor **out);
ts_status ts_mean_dims(const ts_tensor *x, int ndims, const int *dims, bool keepdim, ts_tensor **out);
/* torch.max(x, dim, keepdim): *values (F32, differentiable: the gradient goes to
 * the first position of each maximum) and *indices (TS_I64, that position); either
 * out-pointer may be NULL when not wanted. The dim must not be empty. */
ts_status ts_max_dim(const ts_tensor *x, int dim, bool keepdim, ts_tensor **values, ts_tensor **indices);

/* ---- linear algebra ------------------------------------------------------------------------ */
/* a: (..., M, K), b: (..., K, N) -> (..., M, N): torch.matmul, the batch dims (all but the
 * last two) broadcast as numpy does. (M, K) x (K, N) -> (M, N). A 1-D operand is a vector as in
 * torch.matmul: (K) x (K) -> () (the dot product), (K) x (..., K, N) -> (..., N),
 * (..., M, K) x (K) -> (..., M). */
ts_status ts_matmul(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
/* a: (B, M, K), b: (B, K, N) -> (B, M, N) (torch.bmm: no broadcasting). */
ts_status ts_bmm(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
/* x: (N, in), w: (out, in), b: (out) or NULL -> (N, out) = x w^T + b. */
ts_status ts_linear(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, ts_tensor **out);

/* ---- convolution and pooling -------------------------------------------------------------------- */
typedef struct ts_conv2d_params {
    int stride[2];   /* (h, w), >= 1 */
    int padding[2];  /* zero padding (h, w), >= 0 */
    int dilation[2]; /* >= 1 */
    int groups;      /* >= 1, divides C_in and C_out */
} ts_conv2d_params;
#define TS_CONV2D_DEFAULT ((ts_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 1})

/* x: (N, C_in, H, W), w: (C_out, C_in/groups, kH, kW), b: (C_out) or NULL
 * -> (N, C_out, H_out, W_out), H_out = (H + 2p - d(k-1) - 1)/s + 1. */
ts_status ts_conv2d(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, ts_conv2d_params p,
                    ts_tensor **out);

typedef struct ts_pool2d_params {
    int kernel[2];
    int stride[2];  /* 0 means = kernel */
    int padding[2]; /* <= kernel/2; max pool pads with -inf, avg pool counts padding (count_include_pad) */
    int dilation[2]; /* max pool only; 0 or 1 means 1 */
    bool ceil_mode;
    /* avg pool only: divide by the number of input elements in the window, not counting
     * padding (PyTorch's count_include_pad=False). false (zero-initialised) counts the
     * padding, clipped at H + pad, W + pad when ceil_mode windows run past it, as PyTorch. */
    bool exclude_pad;
} ts_pool2d_params;

ts_status ts_maxpool2d(const ts_tensor *x, ts_pool2d_params p, ts_tensor **out);
ts_status ts_avgpool2d(const ts_tensor *x, ts_pool2d_params p, ts_tensor **out);
/* (N, C, H, W) -> (N, C, 1, 1). */
ts_status ts_global_avgpool2d(const ts_tensor *x, ts_tensor **out);
/* (N, C, H, W) or (C, H, W) -> (..., out_h, out_w): output row i averages input rows
 * [floor(i H / out_h), ceil((i + 1) H / out_h)), likewise for columns (PyTorch's
 * adaptive_avg_pool2d; windows overlap when the sizes do not divide). */
ts_status ts_adaptive_avgpool2d(const ts_tensor *x, int out_h, int out_w, ts_tensor **out);

/* ---- normalisation ------------------------------------------------------------------------------ */
/* x: (N, C, H, W); weight, bias: (C) or NULL; running_mean/var: (C) or NULL.
 * training: normalise with batch statistics (biased variance) and, when running
 * stats are given, update them in place: r = (1 - momentum) r + momentum * stat,
 * with the unbiased variance, as PyTorch does. Eval: normalise with running stats. */
ts_status ts_batchnorm2d(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                         ts_tensor *running_mean, ts_tensor *running_var, bool training, float momentum,
                         float eps, ts_tensor **out);
/* BatchNorm1d: ts_batchnorm2d's arguments and semantics for x: (N, C) or (N, C, L),
 * statistics per channel over the N (or N*L) values. Output shaped like x. */
ts_status ts_batchnorm1d(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                         ts_tensor *running_mean, ts_tensor *running_var, bool training, float momentum,
                         float eps, ts_tensor **out);
/* F.layer_norm over the last normalized_ndim dims of x (1 <= normalized_ndim <= ndim):
 * each slice over those dims is normalised by its own mean and biased variance
 * (1 / sqrt(var + eps)), then multiplied by weight and shifted by bias, both shaped
 * like those dims (x.shape[-normalized_ndim:]) or NULL. Output shaped like x. */
ts_status ts_layer_norm(const ts_tensor *x, int normalized_ndim, const ts_tensor *weight, const ts_tensor *bias,
                        float eps, ts_tensor **out);
/* F.group_norm: x (N, C, *) with C divisible by num_groups; each sample's group of
 * C/num_groups channels (all their positions) is normalised by its own mean and biased
 * variance, then weight, bias: (C) or NULL scale and shift per channel. */
ts_status ts_group_norm(const ts_tensor *x, int num_groups, const ts_tensor *weight, const ts_tensor *bias, float eps,
                        ts_tensor **out);

/* ---- indexing and shapes ----------------------------------------------------------------------------- */
/* idx: any shape, TS_I64 in [0, num); weight: (num, dim) -> idx.shape + (dim). */
ts_status ts_embedding(const ts_tensor *idx, const ts_tensor *weight, ts_tensor **out);
/* A view with a new shape (one entry may be -1); shares storage when contiguous. */
ts_status ts_reshape(const ts_tensor *x, int ndim, const int64_t *shape, ts_tensor **out);
/* Flattens dims [start_dim, end) into one: (N, C, H, W), 1 -> (N, C*H*W). */
ts_status ts_flatten(const ts_tensor *x, int start_dim, ts_tensor **out);
ts_status ts_concat(ts_tensor *const *xs, int n, int dim, ts_tensor **out);
/* Elements [start, end) along dim (negative values count from the end). */
ts_status ts_slice(const ts_tensor *x, int dim, int64_t start, int64_t end, ts_tensor **out);
/* Flattens dims [start_dim, end_dim] (inclusive, negative counts from the end) into one:
 * torch.flatten(x, start_dim, end_dim). */
ts_status ts_flatten_range(const ts_tensor *x, int start_dim, int end_dim, ts_tensor **out);
/* out dim d is x's dim perm[d] (perm: x->ndim entries, a permutation; negative
 * values count from the end); a contiguous copy, as every result here. */
ts_status ts_permute(const ts_tensor *x, const int *perm, ts_tensor **out);
/* Swaps dims dim0 and dim1 (negative count from the end); a contiguous copy. */
ts_status ts_transpose(const ts_tensor *x, int dim0, int dim1, ts_tensor **out);

/* ---- attention ------------------------------------------------------------------------------------------ */
/* torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale) without a mask
 * tensor or dropout: out = softmax(scale q k^T + mask) v over the keys, per batch and head.
 * q: (B, H, Tq, D), k and v: (B, H, Tk, D) (Tk >= 1, D >= 1) -> out (B, H, Tq, D). scale 0 means
 * 1 / sqrt(D); it must be finite. causal: query i sees keys j <= i — PyTorch's is_causal, a top-left
 * aligned mask, also when Tq != Tk (so every query sees key 0; with Tq > Tk the last Tq - Tk queries see
 * every key). float32, or bfloat16/float16 (all three of one dtype: computed in float32, the result
 * rounded to that dtype); under ts_set_autocast(TS_BF16) float32 inputs are cast to bfloat16 first, as
 * PyTorch's CPU autocast does. Memory grows with T, not T^2 (FlashAttention-2's tiling): the graph keeps
 * q, k, v, out and two floats per query row; backward recomputes the scores. CPU and CUDA devices (CUDA:
 * head dims up to 256); a device without the kernels, or a larger head dim on CUDA, gives TS_ERR_UNSUPPORTED
 * naming the device. */
ts_status ts_scaled_dot_product_attention(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, bool causal,
                                          double scale, ts_tensor **out);

/* ---- regularisation ------------------------------------------------------------------------------------ */
/* Inverted dropout: zeroes with probability p and scales by 1/(1-p) when training. */
ts_status ts_dropout(const ts_tensor *x, float p, bool training, ts_rng *rng, ts_tensor **out);

/* ---- losses and activations ------------------------------------------------------------------------------ */
ts_status ts_log_softmax(const ts_tensor *x, int dim, ts_tensor **out);
/* logits: (N, C) (or (N, C, d1, ...), see ts_cross_entropy_ex), target: (N) TS_I64 -> mean loss, shape [].
 * label_smoothing in [0, 1]; targets of -100 are ignored (PyTorch ignore_index). */
ts_status ts_cross_entropy(const ts_tensor *logits, const ts_tensor *target, float label_smoothing,
                           ts_tensor **out);
/* How a loss reduces its per-sample values (zero-initialised: the mean). */
typedef enum ts_reduction {
    TS_REDUCTION_MEAN = 0, /* sum / (number of samples, or for cross-entropy the weight of those counted) */
    TS_REDUCTION_SUM,
    TS_REDUCTION_NONE /* one value per sample */
} ts_reduction;

/* torch.nn.functional.cross_entropy's options; start from TS_CROSS_ENTROPY_OPTS_INIT. */
typedef struct ts_cross_entropy_opts {
    ts_reduction reduction;
    const ts_tensor *weight; /* (C) F32 class weights on the logits' device (borrowed), or NULL (all 1) */
    int64_t ignore_index;    /* samples with this target add nothing and are not counted (default -100) */
    float label_smoothing;   /* in [0, 1] */
} ts_cross_entropy_opts;
#define TS_CROSS_ENTROPY_OPTS_INIT ((ts_cross_entropy_opts){TS_REDUCTION_MEAN, NULL, -100, 0.0f})

/* logits: (N, C), target: (N) TS_I64 in [0, C) or o->ignore_index (o NULL: the defaults);
 * or logits (N, C, d1, ...) and target (N, d1, ...): a sample per position, classes along dim 1.
 * Per sample, with w = weight (1 without) and eps = label smoothing:
 *   l_i = (1 - eps) w[t_i] (lse_i - x_i[t_i]) + eps / C * sum_c w[c] (lse_i - x_i[c]),
 * 0 for ignored samples. TS_REDUCTION_NONE -> target's shape; SUM -> []; MEAN -> [] = sum / the sum
 * of w[t_i] over samples not ignored (NaN when there are none), as PyTorch. A target out
 * of range is TS_ERR_INVALID_ARG naming it and its sample — on a CUDA device not from this call
 * but from the device's next synchronisation (a copy to the host, ts_device_synchronize) or its
 * next cross-entropy, the loss being NaN meanwhile (embedding's indices likewise). The weight gets
 * no gradient. */
ts_status ts_cross_entropy_ex(const ts_tensor *logits, const ts_tensor *target, const ts_cross_entropy_opts *o,
                              ts_tensor **out);
/* Mean squared error over all elements -> shape []. */
ts_status ts_mse_loss(const ts_tensor *pred, const ts_tensor *target, ts_tensor **out);

/* ---- device movement --------------------------------------------------------------------------------------- */
/* A copy of x on dev (a new reference to x when already there); gradients flow back. */
ts_status ts_to_device(const ts_tensor *x, ts_device *dev, ts_tensor **out);
/* x converted to dtype dt (F32, F16 or BF16; x too), rounding to nearest even (ts_f32_to_bf16): a new
 * contiguous tensor on x's device (a new reference to x when it has that dtype already). Gradients flow
 * back converted to x's dtype (torch's Tensor.to(dtype)). Exported to ONNX as Cast. */
ts_status ts_to_dtype(const ts_tensor *x, ts_dtype dt, ts_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_OPS_H */
