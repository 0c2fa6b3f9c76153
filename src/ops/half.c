/*
 * ops/half.c — 16-bit inputs of float ops: up to float32, the op, and back (see half.h).
 */
#include "ops/half.h"
#include "device/k_ew.h"
#include "device/k_spatial.h"
#include "tessera/ops.h"

static bool is_half(const ts_tensor *t) { return t && (t->dtype == TS_F16 || t->dtype == TS_BF16); }

bool ts__any_half(const ts_tensor *a, const ts_tensor *b) { return is_half(a) || is_half(b); }

ts_status ts__half_op(ts__op2_fn fn, const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    TS_ARG(a && out, "16-bit op: NULL argument");
    return ts__half_op_as(fn, a, b, arg, b && b->dtype != a->dtype ? TS_F32 : a->dtype, out);
}

bool ts__bf16_native(const ts_tensor *x) {
    const ts_device *d = x->storage->device;
    return d->k_ew->bf16 && d->k_spatial->bf16;
}

bool ts__bf16_kept(const ts_tensor *x) { return x && x->dtype == TS_BF16 && ts__bf16_native(x); }

ts_status ts__autocast(const ts_tensor *x, ts_tensor **out) {
    TS_ARG(x && out, "autocast: NULL argument");
    if (x->dtype == TS_F32 && ts_get_autocast() == TS_BF16 && ts__bf16_native(x)) return ts_to_dtype(x, TS_BF16, out);
    *out = ts_tensor_retain((ts_tensor *)x);
    return TS_OK;
}

ts_status ts__half_op_as(ts__op2_fn fn, const ts_tensor *a, const ts_tensor *b, const void *arg, ts_dtype dt,
                         ts_tensor **out) {
    TS_ARG(a && out, "16-bit op: NULL argument");
    ts_tensor *fa = NULL, *fb = NULL, *o = NULL;
    ts_status st = ts_to_dtype(a, TS_F32, &fa);
    if (st == TS_OK && b) st = ts_to_dtype(b, TS_F32, &fb);
    if (st == TS_OK) st = fn(fa, fb, arg, &o);
    if (st == TS_OK) st = ts_to_dtype(o, ts_tensor_dtype(o) == TS_F32 ? dt : ts_tensor_dtype(o), out);
    ts_tensor_release(o);
    ts_tensor_release(fa);
    ts_tensor_release(fb);
    return st;
}
