/*
 * ops/half.h — float ops on bfloat16 / float16 tensors (op layer, internal):
 * PyTorch's CPU rule for 16-bit elementwise math and reductions — the values
 * go up to float32 (exact), the op runs in float32 (reductions accumulate
 * there), and the result is rounded to the inputs' dtype (nearest even), or
 * stays float32 when the inputs' dtypes differ (torch's type promotion:
 * bfloat16 + float32 -> float32). The casts are ts_to_dtype nodes, so
 * gradients flow back in each input's dtype. An op opts in with one line at
 * its top: if (ts__any_half(a, b)) return ts__half_op(thunk, a, b, &args, out);
 */
#ifndef TS_OPS_HALF_H
#define TS_OPS_HALF_H

#include "tensor/tensor.h"

/* Whether a or b (NULL: absent) is F16 or BF16. */
bool ts__any_half(const ts_tensor *a, const ts_tensor *b);

/* The op on float32 inputs: a, b (b may be NULL), the op's own arguments in arg. */
typedef ts_status (*ts__op2_fn)(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out);

/* fn on float32 copies of a and b, its result in the result dtype described above. */
ts_status ts__half_op(ts__op2_fn fn, const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out);

/* The same with the result in dtype dt (conv2d and linear: their input's dtype, whatever the weight's). */
ts_status ts__half_op_as(ts__op2_fn fn, const ts_tensor *a, const ts_tensor *b, const void *arg, ts_dtype dt,
                         ts_tensor **out);

/* Whether x's device keeps bfloat16 activations natively: its elementwise and spatial kernels take them
 * (device/k_ew.h, k_spatial.h: bf16). */
bool ts__bf16_native(const ts_tensor *x);

/* Whether x is a bfloat16 activation its device's kernels take as it is (x non-NULL, BF16, ts__bf16_native):
 * the ops that keep bfloat16 (batchnorm, relu, max pooling, conv2d, linear) run their kernels on it. */
bool ts__bf16_kept(const ts_tensor *x);

/* Autocast (ts_set_autocast) for an op of its list: *out = x cast to bfloat16 (a ts_to_dtype node) when
 * autocast is on, x is float32 and its device keeps bfloat16 activations; else x itself (a new reference). */
ts_status ts__autocast(const ts_tensor *x, ts_tensor **out);

#endif
