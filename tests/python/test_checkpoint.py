"""tests/python/test_checkpoint.py: tessera.load_checkpoint — a checkpoint's tensors as {name: Tensor} with
the prefix stripped, every dtype, names that are not printable, shared with torch by DLPack; a damaged file
and a missing one raise tessera exceptions naming the path. Uses the checkpoints of tests/fuzz/corpus/ckpt
(real files of the format, made by tests/fuzz/make_seeds.c)."""
import os
import shutil
import tempfile

import torch

import tessera
from testutil import check

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus", "ckpt")


sd = tessera.load_checkpoint(os.path.join(CORPUS, "trainer"))
check(sorted(sd) == ["0.bias", "0.weight"], f"the model's tensors, 'model.' stripped: {sorted(sd)}")
w = torch.from_dlpack(sd["0.weight"])
check(w.shape == (3, 2) and w.dtype == torch.float32, "0.weight: float32 [3, 2] through DLPack")
everything = tessera.load_checkpoint(os.path.join(CORPUS, "trainer"), prefix="")
check(len(everything) == 6 and "optim.step" in everything and everything["optim.step"].dtype == "int64",
      "prefix='': every tensor, the optimizer's too")

dt = tessera.load_checkpoint(os.path.join(CORPUS, "dtypes"), prefix="")
check({k: v.dtype for k, v in dt.items() if k in ("f16", "bf16", "i64", "i32", "u8", "scalar")} ==
      {"f16": "float16", "bf16": "bfloat16", "i64": "int64", "i32": "int32", "u8": "uint8", "scalar": "float32"},
      "every dtype")
check(dt["scalar"].shape == () and float(torch.from_dlpack(dt["scalar"])) == -0.5, "a 0-d tensor: -0.5")
check(dt["none"].shape == (2, 0, 4), "an empty tensor keeps its shape")
check("name\twith\x1b[31mescapes" in dt, "a name with a tab and an escape comes back as it was written")

with tempfile.TemporaryDirectory() as d:
    bad = os.path.join(d, "cut.ckpt")
    with open(os.path.join(CORPUS, "trainer"), "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    try:
        tessera.load_checkpoint(bad)
        check(False, "a truncated checkpoint is refused")
    except tessera.Error as e:
        check(bad in str(e) and isinstance(e, (tessera.FormatError, tessera.FileError)),
              f"a truncated file: {type(e).__name__}: {e}")
    try:
        tessera.load_checkpoint(os.path.join(d, "missing.ckpt"))
        check(False, "a missing checkpoint is refused")
    except tessera.FileError as e:
        check(isinstance(e, OSError) and "missing.ckpt" in str(e), f"a missing file: {e}")
    os.mkfifo(os.path.join(d, "fifo.ckpt"))
    try:
        tessera.load_checkpoint(os.path.join(d, "fifo.ckpt"))
        check(False, "a FIFO is refused")
    except tessera.FileError as e:
        check("FIFO" in str(e), f"a FIFO, refused without waiting: {e}")
print("done")
