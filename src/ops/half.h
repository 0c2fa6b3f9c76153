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

#endif
