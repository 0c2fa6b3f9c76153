"""tests/python/test_ops.py: tessera.ops — every op against torch.nn.functional, forward and gradients (float32,
1e-5 scaled by the values' size), the Tensor's operators and autograd (requires_grad, grad, backward,
no_grad), tessera.tensor / randn, and the errors: shapes that do not fit (tessera.ShapeError naming the
shapes), wrong dtypes (tessera.DtypeError), bad arguments, strided inputs."""

import numpy as np
import torch
import torch.nn.functional as F

import tessera
from tessera import ops
from testutil import check, raises


def T(x):
    return torch.from_dlpack(x.detach())


def close(a, b, tol=1e-5):
    a, b = a.detach().double(), b.detach().double()
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=tol * 10, atol=tol * max(1.0, b.abs().max().item())))


torch.manual_seed(0)


def compare(name, tfn, ref, inputs, grads=None, tol=1e-5):
    """tfn(*tessera inputs) against ref(*torch inputs): the output, then the gradients of sum(out * r) for a
    fixed random r into the inputs listed in grads (default: every float input)."""
    grads = [i for i, x in enumerate(inputs) if x is not None and x.is_floating_point()] if grads is None else grads
    tin = [None if x is None else x.clone().requires_grad_(i in grads) for i, x in enumerate(inputs)]
    sin = []
    for i, x in enumerate(inputs):
        if x is None:
            sin.append(None)
            continue
        t = tessera.tensor(x)
        if i in grads:
            t.requires_grad_(True)
        sin.append(t)
    want = ref(*tin)
    got = tfn(*sin)
    want0, got0 = (want[0], got[0]) if isinstance(want, tuple) else (want, got)
    ok = close(T(got0), want0, tol)
    if ok and grads:
        r = torch.randn(want0.shape)
        (want0 * r).sum().backward()
        (ops.sum(ops.mul(got0, tessera.tensor(r)))).backward()
        for i in grads:
            ok = ok and sin[i].grad is not None and close(T(sin[i].grad), tin[i].grad, tol)
            if not ok:
                print("  gradient of input", i, "differs")
    check(ok, f"{name}: forward{' and gradients' if grads else ''} as torch")


x = torch.randn(4, 5)
y = torch.randn(4, 5)
compare("add (broadcast)", ops.add, torch.add, [x, torch.randn(5)])
compare("sub", ops.sub, torch.sub, [x, y])
compare("mul (broadcast)", ops.mul, torch.mul, [x, torch.randn(4, 1)])
compare("div", ops.div, torch.div, [x, y.abs() + 0.5])
compare("scale", lambda a: ops.scale(a, 2.5), lambda a: 2.5 * a, [x])
compare("relu", ops.relu, F.relu, [x])
compare("sigmoid", ops.sigmoid, torch.sigmoid, [x])
compare("tanh", ops.tanh, torch.tanh, [x])
compare("silu", ops.silu, F.silu, [x])
compare("gelu", ops.gelu, F.gelu, [x])
compare("gelu tanh", lambda a: ops.gelu(a, approximate="tanh"), lambda a: F.gelu(a, approximate="tanh"), [x])
compare("softmax", lambda a: ops.softmax(a, 1), lambda a: F.softmax(a, 1), [x])
compare("log_softmax dim 0", lambda a: ops.log_softmax(a, 0), lambda a: F.log_softmax(a, 0), [x])
compare("sum", ops.sum, torch.sum, [x])
compare("mean", ops.mean, torch.mean, [x])
compare("sum over dim 1, keepdim", lambda a: ops.sum(a, 1, True), lambda a: a.sum(1, keepdim=True), [x])
compare("mean over dims (0, 2)", lambda a: ops.mean(a, (0, 2)), lambda a: a.mean((0, 2)), [torch.randn(2, 3, 4)])
compare("max over dim", lambda a: ops.max(a, 1), lambda a: torch.max(a, 1), [x])
vi, ii = ops.max(tessera.tensor(x), 1)
check(torch.equal(T(ii), torch.max(x, 1).indices) and ii.dtype == "int64", "max: int64 indices as torch's")
compare("matmul", ops.matmul, torch.matmul, [torch.randn(3, 4), torch.randn(4, 6)])
compare("matmul (batch broadcast)", ops.matmul, torch.matmul, [torch.randn(2, 3, 4), torch.randn(4, 5)])
compare("bmm", ops.bmm, torch.bmm, [torch.randn(2, 3, 4), torch.randn(2, 4, 5)])
compare("linear", ops.linear, F.linear, [torch.randn(6, 4), torch.randn(3, 4), torch.randn(3)])
compare("linear without bias", ops.linear, F.linear, [torch.randn(6, 4), torch.randn(3, 4)])
img = torch.randn(2, 3, 9, 9)
compare("conv2d", lambda a, w, b: ops.conv2d(a, w, b, stride=2, padding=1),
        lambda a, w, b: F.conv2d(a, w, b, stride=2, padding=1), [img, torch.randn(4, 3, 3, 3), torch.randn(4)], tol=1e-4)
compare("conv2d dilation, groups", lambda a, w: ops.conv2d(a, w, None, 1, (1, 2), 2, 3),
        lambda a, w: F.conv2d(a, w, None, 1, (1, 2), 2, 3), [img, torch.randn(6, 1, 3, 3)], tol=1e-4)
compare("max_pool2d", lambda a: ops.max_pool2d(a, 3, 2, 1), lambda a: F.max_pool2d(a, 3, 2, 1), [img])
compare("max_pool2d ceil_mode", lambda a: ops.max_pool2d(a, 2, ceil_mode=True),
        lambda a: F.max_pool2d(a, 2, ceil_mode=True), [img])
compare("avg_pool2d", lambda a: ops.avg_pool2d(a, 3, 2, 1), lambda a: F.avg_pool2d(a, 3, 2, 1), [img])
compare("avg_pool2d count_include_pad=False", lambda a: ops.avg_pool2d(a, 3, 2, 1, count_include_pad=False),
        lambda a: F.avg_pool2d(a, 3, 2, 1, count_include_pad=False), [img])
compare("adaptive_avg_pool2d", lambda a: ops.adaptive_avg_pool2d(a, (4, 3)),
        lambda a: F.adaptive_avg_pool2d(a, (4, 3)), [img])
compare("global_avg_pool2d", ops.global_avg_pool2d, lambda a: F.adaptive_avg_pool2d(a, 1), [img])
rm, rv = torch.randn(3), torch.rand(3) + 0.5
compare("batch_norm (eval)", lambda a, w, b: ops.batch_norm(a, tessera.tensor(rm), tessera.tensor(rv), w, b),
        lambda a, w, b: F.batch_norm(a, rm, rv, w, b), [img, torch.randn(3), torch.randn(3)])
trm, trv = tessera.tensor(rm), tessera.tensor(rv)
rm2, rv2 = rm.clone(), rv.clone()
compare("batch_norm (training)", lambda a, w, b: ops.batch_norm(a, trm, trv, w, b, training=True, momentum=0.2),
        lambda a, w, b: F.batch_norm(a, rm2, rv2, w, b, training=True, momentum=0.2),
        [img, torch.randn(3), torch.randn(3)], tol=1e-4)
check(close(T(trm), rm2) and close(T(trv), rv2), "batch_norm (training): running statistics updated as torch's")
compare("batch_norm 1d", lambda a: ops.batch_norm(a, None, None, training=True),
        lambda a: F.batch_norm(a, None, None, training=True), [torch.randn(8, 5)], tol=1e-4)
compare("layer_norm", lambda a, w, b: ops.layer_norm(a, (4, 5), w, b), lambda a, w, b: F.layer_norm(a, (4, 5), w, b),
        [torch.randn(3, 4, 5), torch.randn(4, 5), torch.randn(4, 5)], tol=1e-4)
compare("group_norm", lambda a, w, b: ops.group_norm(a, 3, w, b), lambda a, w, b: F.group_norm(a, 3, w, b),
        [torch.randn(2, 6, 4, 4), torch.randn(6), torch.randn(6)], tol=1e-4)
idx = torch.tensor([[0, 3], [2, 2]])
compare("embedding", ops.embedding, F.embedding, [idx, torch.randn(5, 3)], grads=[1])
compare("reshape", lambda a: ops.reshape(a, (5, -1)), lambda a: a.reshape(5, -1), [x])
compare("flatten", lambda a: ops.flatten(a, 1), lambda a: torch.flatten(a, 1), [img])
compare("flatten range", lambda a: ops.flatten(a, 1, 2), lambda a: torch.flatten(a, 1, 2), [img])
compare("transpose", lambda a: ops.transpose(a, 0, 2), lambda a: a.transpose(0, 2), [torch.randn(2, 3, 4)])
compare("permute", lambda a: ops.permute(a, (2, 0, 1)), lambda a: a.permute(2, 0, 1), [torch.randn(2, 3, 4)])
compare("narrow", lambda a: ops.narrow(a, 1, 1, 3), lambda a: a.narrow(1, 1, 3), [x])
compare("cat", lambda a, b: ops.cat([a, b], 1), lambda a, b: torch.cat([a, b], 1), [x, torch.randn(4, 2)])
compare("mse_loss", ops.mse_loss, F.mse_loss, [x, y], grads=[0])
tgt = torch.tensor([0, 2, 1, 4])
compare("cross_entropy", ops.cross_entropy, F.cross_entropy, [x, tgt])
compare("cross_entropy (weight, label smoothing, ignore_index)",
        lambda a, t, w: ops.cross_entropy(a, t, w, ignore_index=1, label_smoothing=0.1),
        lambda a, t, w: F.cross_entropy(a, t, w, ignore_index=1, label_smoothing=0.1), [x, tgt, torch.rand(5)],
        grads=[0])
compare("cross_entropy reduction none", lambda a, t: ops.cross_entropy(a, t, reduction="none"),
        lambda a, t: F.cross_entropy(a, t, reduction="none"), [x, tgt])


def sdpa_ref(q, k, v, causal=False, scale=None):  # torch 1.13 has no F.scaled_dot_product_attention
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


qkv = [torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)]
compare("scaled_dot_product_attention", ops.scaled_dot_product_attention, sdpa_ref, qkv, tol=1e-4)
compare("scaled_dot_product_attention causal, scale", lambda q, k, v: ops.scaled_dot_product_attention(
    q, k, v, is_causal=True, scale=0.3), lambda q, k, v: sdpa_ref(q, k, v, True, 0.3), qkv, tol=1e-4)
d = ops.dropout(tessera.tensor(torch.ones(1000)), 0.25)
vals = np.unique(np.asarray(d))
check(len(vals) == 2 and vals[0] == 0 and abs(vals[1] - 1 / 0.75) < 1e-6 and 0.6 < np.asarray(d).mean() < 1.4, "dropout: zeros or 1/(1-p)")
check(torch.equal(T(ops.dropout(tessera.tensor(x), 0.5, training=False)), x), "dropout: identity when not training")
h = ops.to(tessera.tensor(x), dtype="bfloat16")
check(h.dtype == "bfloat16" and close(T(h).float(), x, 1e-2), "to(dtype=bfloat16)")

# ---- operators and autograd on tessera.Tensor ----------------------------------------------------------------
a, b = tessera.tensor(x, requires_grad=True), tessera.tensor(y)
check(a.requires_grad and a.is_leaf and not b.requires_grad, "requires_grad, is_leaf")
z = ((a + b) * 2.0 - 1 - a * b / 2.0) @ tessera.tensor(torch.randn(5, 3))
check(not z.is_leaf and z.requires_grad, "an op's result records autograd")
compare("operators + - * / @ and unary -", lambda p, q, r: -((p + q) * 2.0 - 1 - p * q / 2.0 + 3) @ r,
        lambda p, q, r: -((p + q) * 2.0 - 1 - p * q / 2.0 + 3) @ r, [x, y, torch.randn(5, 3)])
compare("reversed operators: number - t, number / t, number * t", lambda p: 1 - p + 2 / (p * p + 1) + 3 * p,
        lambda p: 1 - p + 2 / (p * p + 1) + 3 * p, [x])
tx = torch.randn(4, 5)
check(close(T(tessera.tensor(x) + tx), x + tx), "tessera.Tensor + torch tensor (DLPack)")
a.grad = None
ops.sum(a * a).backward()
check(close(T(a.grad), 2 * x), "backward: d sum(a*a)/da = 2a")
ops.sum(a * a).backward()
check(close(T(a.grad), 4 * x), "gradients accumulate into .grad over backward calls, as torch")
a.grad = None
check(a.grad is None, ".grad = None clears it")
w = tessera.tensor(x, requires_grad=True)
out = w * 3.0
out.backward(tessera.tensor(torch.ones(4, 5)))
check(close(T(w.grad), torch.full((4, 5), 3.0)), "backward(gradient) for a non-scalar")
raises(tessera.Error, "", (w * 3.0).backward)
with tessera.no_grad():
    check(not tessera.is_grad_enabled(), "no_grad: grad mode off inside")
    n = w * 2.0
check(not n.requires_grad and tessera.is_grad_enabled(), "no_grad: no history recorded; grad mode back after")
check(tessera.no_grad()(lambda: w * 2.0)().requires_grad is False, "no_grad as a decorator")
check(abs(ops.sum(tessera.tensor(x)).item() - x.sum().item()) < 1e-4 and isinstance(ops.sum(tessera.tensor(x)).item(), float),
      "item() of a one-element tensor")
check(w.detach().requires_grad is False and w.detach().data_ptr() == w.data_ptr(), "detach: same memory, no grad")
check(w.clone().data_ptr() != w.data_ptr(), "clone: a copy")

# ---- new tensors ---------------------------------------------------------------------------------------------
t = tessera.tensor([[1.0, 2.0], [3.0, 4.5]])
check(t.shape == (2, 2) and t.dtype == "float32" and np.asarray(t).tolist() == [[1, 2], [3, 4.5]], "tensor(lists)")
check(tessera.tensor([1, 2, 3]).dtype == "int64" and tessera.tensor(2.5).shape == (), "tensor: int64 from ints, 0-d")
tessera.manual_seed(3)
r1 = np.asarray(tessera.randn([1000]))
tessera.manual_seed(3)
check(np.array_equal(r1, np.asarray(tessera.randn([1000]))) and abs(r1.mean()) < 0.15 and 0.85 < r1.std() < 1.15,
      "randn: N(0, 1), reproducible with manual_seed")
check(t.reshape(4).shape == (4,) and t.t().shape == (2, 2) and abs(t.sum().item() - 10.5) < 1e-6, "Tensor methods")
raises(tessera.ShapeError, "ragged", tessera.tensor, [[1.0, 2.0], [3.0]])

# ---- errors: a clear exception, never a crash -----------------------------------------------------------------
raises(tessera.ShapeError, "[4, 5]", ops.matmul, tessera.tensor(x), tessera.tensor(y))
raises(tessera.ShapeError, "[3]", ops.add, tessera.tensor(x), tessera.tensor(torch.randn(3)))
raises(ValueError, "[4, 5]", lambda: tessera.tensor(x) @ tessera.tensor(y))
raises(tessera.ShapeError, "normalized_shape [3] does not match the last dims of x [4, 5]", ops.layer_norm,
       tessera.tensor(x), [3])
raises(tessera.DtypeError, "int64", ops.relu, tessera.tensor([1, 2, 3]))
raises(tessera.DtypeError, "", ops.cross_entropy, tessera.tensor(x), tessera.tensor(tgt.float()))
raises(tessera.ArgumentError, "approximate 'fast'", ops.gelu, tessera.tensor(x), approximate="fast")
raises(tessera.ArgumentError, "reduction 'avg'", ops.cross_entropy, tessera.tensor(x), tessera.tensor(tgt),
       reduction="avg")
raises(TypeError, "__dlpack__", ops.relu, [1.0, 2.0])
raises(TypeError, "pair of ints", ops.max_pool2d, tessera.tensor(img), (2, 2, 2))
raises(tessera.DtypeError, "float64", lambda: tessera.tensor([1.0]).requires_grad_() and
       ops.add(tessera.from_dlpack(torch.zeros(2, dtype=torch.float64)), 1.0))
raises(tessera.DtypeError, "int64 tensor cannot require grad", tessera.tensor([1, 2]).requires_grad_)
raises(tessera.ArgumentError, "leaf", lambda: (w * 2.0).requires_grad_())
# strided (non-contiguous) inputs: a transposed torch view, taken as it is
xt = x.t()
res = ops.relu(tessera.from_dlpack(xt))
check(close(T(res), F.relu(xt)), "relu of a transposed (non-contiguous) torch view: as torch")
mm = ops.matmul(tessera.from_dlpack(xt), tessera.tensor(torch.randn(4, 2)))
check(mm.shape == (5, 2), "matmul of a transposed view")
print("all passed")
