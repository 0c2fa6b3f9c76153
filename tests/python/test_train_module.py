"""tests/python/test_train_module.py: tessera.train(model=<tessera.nn.Module>) — models written in Python trained
by the library's run. The zoo's MLP rebuilt from Python's built-in layers, and again with a Python forward,
trains to the same weights as `model="mlp"` from the same start (init_from); a small CNN with a Python forward
learns (the loss falls), its checkpoint loads back into the same Python class with identical outputs;
DataParallel (strategy data, two virtual CPU devices) runs the Python forward on its replicas and reaches what
one device reaches; an exception in forward stops the run and comes back as itself."""
import os
import subprocess
import sys
import tempfile

import torch

import tessera
from tessera import nn, ops
from testutil import check

FMNIST = "/usr/share/datasets/fashion-mnist"


def T(x):
    return torch.from_dlpack(x.detach())


if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
    print(f"skip: no Fashion-MNIST in {FMNIST} (scripts/install-deps)")
    sys.exit(0)


class PyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(ops.relu(self.fc1(ops.flatten(x, 1))))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 14 * 14, 10)

    def forward(self, x):
        x = ops.max_pool2d(ops.relu(self.bn(self.conv(x))), 2)
        return self.fc(ops.flatten(x, 1))


common = {"max_steps": 8, "epochs": 1, "batch_size": 32, "threads": 1, "seed": 5, "lr": 0.05}
TO_PY = {"1.weight": "fc1.weight", "1.bias": "fc1.bias", "3.weight": "fc2.weight", "3.bias": "fc2.bias"}

with tempfile.TemporaryDirectory() as d:
    tessera.manual_seed(11)
    seq = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    start = {k: T(v).clone() for k, v in seq.state_dict().items()}
    init = os.path.join(d, "init.safetensors")
    tessera.save_safetensors(start, init)
    zoo_ck = os.path.join(d, "zoo.ckpt")
    tessera.train(common, progress=False, model="mlp", init_from=init, checkpoint=zoo_ck)
    zoo = {k: T(v) for k, v in tessera.load_checkpoint(zoo_ck).items()}

    r = tessera.train(common, progress=False, model=seq)
    check(r["model"] == "Sequential" and r["steps"] == 8, f"a Sequential of built-in layers trains ({r['model']})")
    got = {k: T(v) for k, v in seq.state_dict().items()}
    check(all(torch.equal(got[k], zoo[k]) for k in zoo), "built-in layers from Python: the zoo's mlp weights, bit for bit")

    py = PyMLP()
    py.load_state_dict({TO_PY[k]: v for k, v in start.items()})
    py_ck = os.path.join(d, "py.ckpt")
    r = tessera.train(common, progress=False, model=py, checkpoint=py_ck)
    got = {k: T(v) for k, v in py.state_dict().items()}
    check(r["model"] == "PyMLP" and all(torch.equal(got[TO_PY[k]], zoo[k]) for k in zoo),
          "a Python forward over the same layers: the same weights, bit for bit")
    saved = tessera.load_checkpoint(py_ck)
    check(sorted(saved) == sorted(got) and all(torch.equal(T(saved[k]), got[k]) for k in got),
          "its checkpoint holds the module's state dict under its names")

    # DataParallel over cpu:0, cpu:1: the Python forward runs on each replica (its own tensors)
    dp = PyMLP()
    dp.load_state_dict({TO_PY[k]: v for k, v in start.items()})
    tessera.train(common, progress=False, model=dp, strategy="data", devices="cpu:0,cpu:1")
    got_dp = {k: T(v) for k, v in dp.state_dict().items()}
    worst = max((got_dp[TO_PY[k]] - zoo[k]).abs().max().item() for k in zoo)
    check(worst < 1e-5, f"strategy data (two replicas): the one-device weights within {worst:.1e}")

    # a small CNN learns; its checkpoint loads back into the same class with the same outputs
    tessera.manual_seed(2)
    cnn = SmallCNN()
    losses = []
    ck = os.path.join(d, "cnn.ckpt")
    r = tessera.train(common, progress=False, model=cnn, max_steps=40, lr=0.05, checkpoint=ck,
                      callback=lambda ev: ev["kind"] == "step" and losses.append(ev["loss"]))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    check(len(losses) == 40 and last < first * 0.8, f"the CNN's loss falls: {first:.3f} -> {last:.3f}")
    check(r["eval"]["accuracy"] > 0.3, f"test accuracy {100 * r['eval']['accuracy']:.1f}% after 40 steps")
    back = SmallCNN()
    back.load_state_dict(tessera.load_checkpoint(ck))
    x = tessera.tensor(torch.randn(4, 1, 28, 28))
    cnn.eval()
    back.eval()
    check(torch.equal(T(cnn(x)), T(back(x))), "checkpoint -> load_state_dict: identical outputs")

    # an exception in forward stops the run and comes back as itself
    class Flaky(PyMLP):
        calls = 0

        def forward(self, x):
            Flaky.calls += 1
            if Flaky.calls == 3:
                raise ArithmeticError("third batch")
            return super().forward(x)

    try:
        tessera.train(common, progress=False, model=Flaky())
        check(False, "an exception in forward stops the run")
    except ArithmeticError as e:
        check("third batch" in str(e) and Flaky.calls == 3, f"the forward's exception from tessera.train: {e!r}")
    try:
        tessera.train(common, progress=False, model=SmallCNN(), strategy="pipeline", devices="cpu:0,cpu:1")
        check(False, "pipeline refuses a module that is not a Sequential")
    except tessera.Error as e:
        check("Sequential" in str(e), f"pipeline and a Python module: {str(e)[:150]}")

# DDP: two ranks (`tessera run -n 2 python SCRIPT`), each with its Python model: the same weights on both
DDP_SCRIPT = """
import torch, tessera
from tessera import nn, ops
class PyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)
    def forward(self, x):
        return self.fc2(ops.relu(self.fc1(ops.flatten(x, 1))))
tessera.manual_seed(1 + int(__import__("os").environ["RANK"]))  # different starts: rank 0's are broadcast
m = PyMLP()
r = tessera.train(model=m, max_steps=4, epochs=1, batch_size=16, threads=1, progress=False)
print("weights", r["rank"], r["world_size"], repr(float(torch.from_dlpack(m.fc1.weight.detach()).double().sum())))
"""
TS = os.environ.get("TESSERA_BIN", "")
if TS and os.path.exists(TS):
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "ddp.py")
        with open(script, "w") as f:
            f.write(DDP_SCRIPT)
        p = subprocess.run([TS, "run", "-n", "2", sys.executable, script], capture_output=True, text=True, timeout=300)
        got = sorted(tuple(ln.split("weights ", 1)[1].split()) for ln in p.stdout.splitlines() if "weights " in ln)
        check(p.returncode == 0 and [g[:2] for g in got] == [("0", "2"), ("1", "2")] and got[0][2] == got[1][2],
              f"DDP over 2 ranks: the same weights on both ({got}{p.stderr[-300:]})")
print("all passed")
