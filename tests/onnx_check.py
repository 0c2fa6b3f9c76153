#!/usr/bin/env python3
"""Checks an ONNX file Tessera exported: onnx.checker (full check with shape
inference), then onnxruntime on the reference input, compared with Tessera's
reference output (max |difference| <= --tol). Optionally runs a second batch
size (--rerun-batch B: the first B rows of the input, compared with the first B
rows of the output) to check that the batch dimension is symbolic.

usage: onnx_check.py MODEL.onnx REF.input.npy REF.output.npy [--tol 1e-4] [--rerun-batch B]
       [--expect-initializer NAME]... [--expect-op OP]...
Exit status: 0 pass, 1 fail, 77 onnx or onnxruntime missing.
"""
import argparse
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:  # the caller turns 77 into a skip
    print(f"skip: python3 lacks numpy/onnx/onnxruntime ({e})")
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("inp")
ap.add_argument("out")
ap.add_argument("--tol", type=float, default=1e-4)
ap.add_argument("--rerun-batch", type=int, default=0)
ap.add_argument("--expect-initializer", action="append", default=[])
ap.add_argument("--expect-op", action="append", default=[])
a = ap.parse_args()

m = onnx.load(a.model)
onnx.checker.check_model(m, full_check=True)
g = m.graph
assert m.ir_version == 8, m.ir_version
assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)], m.opset_import
assert m.producer_name == "tessera", m.producer_name
names = [i.name for i in g.initializer] + [v.name for v in g.input] + [n for node in g.node for n in node.output]
assert len(names) == len(set(names)), "value names are not unique"
inits = {i.name for i in g.initializer}
for n in a.expect_initializer:
    assert n in inits, f"initializer {n} missing (have {sorted(inits)})"
ops = [n.op_type for n in g.node]
for op in a.expect_op:
    assert op in ops, f"no {op} node (have {ops})"
dim0 = g.input[0].type.tensor_type.shape.dim[0]
print(f"{a.model}: {len(g.node)} nodes ({', '.join(sorted(set(ops)))}), {len(g.initializer)} initializers, "
      f"input dim 0 = {dim0.dim_param or dim0.dim_value}")

x = np.load(a.inp)
want = np.load(a.out)
sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
iname = sess.get_inputs()[0].name
got = sess.run(None, {iname: x})[0]
assert got.shape == want.shape, f"onnxruntime output shape {got.shape}, Tessera's {want.shape}"
diff = float(np.max(np.abs(got - want))) if want.size else 0.0
print(f"onnxruntime vs Tessera: max |diff| = {diff:.3g} over {want.shape} (tolerance {a.tol:g})")
ok = diff <= a.tol
if a.rerun_batch:
    b = a.rerun_batch
    got_b = sess.run(None, {iname: x[:b]})[0]
    diff_b = float(np.max(np.abs(got_b - want[:b])))
    print(f"batch {b}: max |diff| = {diff_b:.3g}")
    ok = ok and diff_b <= a.tol
sys.exit(0 if ok else 1)
