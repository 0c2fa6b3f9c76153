"""tests/python/test_nn.py: tessera.nn — a model written in Python (nn.Module with parameters, buffers, built-in
and Python children) has PyTorch's state-dict names, loads torch's weights and then computes what the same torch
model computes, forward and gradients; the built-in layers against torch.nn's; train/eval; the library's limits
and misuse as clear exceptions; an exception raised in forward comes back as itself."""
import gc

import torch

import tessera
from tessera import nn, ops
from testutil import check, raises


def T(x):
    return torch.from_dlpack(x.detach())


def close(a, b, tol=1e-5):
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.detach().double(), rtol=1e-4, atol=tol))


def load_from_torch(model, tmodel):
    model.load_state_dict({k: v.detach().clone() for k, v in tmodel.state_dict().items()})


torch.manual_seed(0)


# ---- a model in Python and the same in torch --------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.gate = nn.Parameter(tessera.tensor([0.5] * c).reshape(1, c, 1, 1))

    def forward(self, x):
        return x + ops.relu(self.bn(self.conv(x))) * self.gate


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.block = Block(4)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 7 * 7, 10))
        self.register_buffer("steps", tessera.tensor([0.0]))

    def forward(self, x):
        x = ops.max_pool2d(self.stem(x), 2)
        x = ops.avg_pool2d(self.block(x), 2)
        return self.head(x)


class TBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(c)
        self.gate = torch.nn.Parameter(torch.full((1, c, 1, 1), 0.5))

    def forward(self, x):
        return x + torch.relu(self.bn(self.conv(x))) * self.gate


class TNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.block = TBlock(4)
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4 * 7 * 7, 10))
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(self.stem(x), 2)
        x = torch.nn.functional.avg_pool2d(self.block(x), 2)
        return self.head(x)


net, tnet = Net(), TNet()
check(list(net.state_dict()) == list(tnet.state_dict()), f"state_dict: torch's names and order ({len(tnet.state_dict())})")
check([n for n, _ in net.named_parameters()] == [n for n, _ in tnet.named_parameters()], "named_parameters as torch")
check([n for n, _ in net.named_buffers()] == [n for n, _ in tnet.named_buffers()], "named_buffers as torch")
load_from_torch(net, tnet)
x = torch.randn(3, 1, 28, 28)
for mode in ("train", "eval"):
    getattr(net, mode)()
    getattr(tnet, mode)()
    check(net.training == (mode == "train") and net.block.bn.training == net.training, f"{mode}(): the whole tree")
    xs = tessera.tensor(x)
    out, tout = net(xs), tnet(x)
    check(close(T(out), tout, 1e-4), f"forward ({mode}): as torch")
    r = torch.randn(3, 10)
    net.zero_grad()
    tnet.zero_grad()
    ops.sum(out * tessera.tensor(r)).backward()
    (tout * r).sum().backward()
    tg = dict(tnet.named_parameters())
    ok = all(p.grad is not None and close(T(p.grad), tg[n].grad, 1e-4) for n, p in net.named_parameters())
    check(ok, f"gradients ({mode}) into every parameter, as torch")
check(close(T(net.state_dict()["block.bn.running_mean"]), tnet.block.bn.running_mean), "BatchNorm's running stats")
check(net.block.gate.shape == (1, 4, 1, 1) and net.steps.shape == (1,), "attributes read the registered tensors")
sd = net.state_dict()
tnet2 = TNet()
tnet2.load_state_dict({k: T(v).clone() for k, v in sd.items()})
check(all(torch.equal(tnet2.state_dict()[k], T(v)) for k, v in sd.items()), "torch loads tessera's state_dict")
check([type(c).__name__ for c in net.children()] == ["Conv2d", "Block", "Sequential"] and
      len(list(net.modules())) == 8, "children(), modules()")

# torch tensors as input, a Python child called with several arguments
check(close(T(net(x)), tnet(x), 1e-4), "a torch tensor as input (DLPack)")


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, a, b):
        return self.fc(a) + b


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.two = Two()

    def forward(self, x):
        return self.two(x, x)


o = Outer()
xa = tessera.randn([2, 4])
w, b = T(o.two.fc.weight), T(o.two.fc.bias)
check(close(T(o(xa)), T(xa) @ w.t() + b + T(xa)), "a Python child whose forward takes two tensors")

# ---- built-in layers against torch.nn ---------------------------------------------------------------------------
img = torch.randn(2, 4, 8, 8)
cases = [
    ("Linear", lambda: nn.Linear(8, 3), lambda: torch.nn.Linear(8, 3), torch.randn(5, 8)),
    ("Conv2d", lambda: nn.Conv2d(4, 6, (3, 1), stride=2, padding=(1, 0), groups=2),
     lambda: torch.nn.Conv2d(4, 6, (3, 1), stride=2, padding=(1, 0), groups=2), img),
    ("BatchNorm2d", lambda: nn.BatchNorm2d(4), lambda: torch.nn.BatchNorm2d(4), img),
    ("BatchNorm1d", lambda: nn.BatchNorm1d(8), lambda: torch.nn.BatchNorm1d(8), torch.randn(5, 8)),
    ("LayerNorm", lambda: nn.LayerNorm([8, 8]), lambda: torch.nn.LayerNorm([8, 8]), img),
    ("GroupNorm", lambda: nn.GroupNorm(2, 4), lambda: torch.nn.GroupNorm(2, 4), img),
    ("ReLU", nn.ReLU, torch.nn.ReLU, img),
    ("MaxPool2d", lambda: nn.MaxPool2d(3, 2, 1), lambda: torch.nn.MaxPool2d(3, 2, 1), img),
    ("AvgPool2d", lambda: nn.AvgPool2d(2), lambda: torch.nn.AvgPool2d(2), img),
    ("AdaptiveAvgPool2d", lambda: nn.AdaptiveAvgPool2d(1), lambda: torch.nn.AdaptiveAvgPool2d(1), img),
    ("Flatten", nn.Flatten, torch.nn.Flatten, img),
    ("Sequential", lambda: nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)),
     lambda: torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)), torch.randn(5, 8)),
]
for name, mk, tmk, inp in cases:
    m, tm = mk(), tmk()
    load_from_torch(m, tm)
    ok = list(m.state_dict()) == list(tm.state_dict()) and close(T(m(tessera.tensor(inp))), tm(inp), 1e-4)
    check(ok, f"nn.{name}: names and forward as torch.nn.{name}")
emb, temb = nn.Embedding(10, 3), torch.nn.Embedding(10, 3)
load_from_torch(emb, temb)
ix = torch.tensor([[1, 9], [0, 0]])
check(close(T(emb(tessera.tensor(ix))), temb(ix)), "nn.Embedding as torch's")
dr = nn.Dropout(0.5).eval()
check(torch.equal(T(dr(tessera.tensor(img))), img), "nn.Dropout in eval mode: the identity")

# ---- limits and misuse ------------------------------------------------------------------------------------------
class Many(nn.Module):
    def __init__(self, n):
        super().__init__()
        for i in range(n):
            setattr(self, f"p{i}", nn.Parameter(tessera.tensor([1.0])))


check(len(list(Many(8).parameters())) == 8, "8 parameters in one module")
raises(tessera.ArgumentError, "8", Many, 9)
m = Block(2)
raises(tessera.ArgumentError, "'gate' is registered already", setattr, m, "gate", nn.Parameter(tessera.tensor([1.0])))
raises(tessera.ArgumentError, "cannot be deleted", delattr, m, "conv")
shared = nn.Linear(2, 2)
p1 = nn.Sequential(shared)
raises(tessera.ArgumentError, "already the child '0' of a Sequential", nn.Sequential, shared)


class NoSuper(nn.Module):
    def __init__(self):
        self.fc = nn.Linear(2, 2)


raises(AttributeError, "super().__init__()", NoSuper)


class Raises(nn.Module):
    def forward(self, x):
        raise KeyError("no such thing")


class Returns(nn.Module):
    def forward(self, x):
        return [1, 2]


class Wraps(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Raises()

    def forward(self, x):
        return self.inner(x)


raises(KeyError, "no such thing", Raises(), tessera.randn([2]))
raises(KeyError, "no such thing", Wraps(), tessera.randn([2]))
raises(KeyError, "no such thing", nn.Sequential(nn.ReLU(), Raises()), tessera.randn([2]))
raises(TypeError, "Returns.forward returned list, not a tensor", Returns(), tessera.randn([2]))
raises(NotImplementedError, "forward", nn.Module(), tessera.randn([2]))
raises(tessera.ShapeError, "", nn.Linear(3, 2), tessera.randn([2, 4]))
raises(tessera.ShapeError, "0.weight", lambda: nn.Sequential(nn.Linear(2, 2)).load_state_dict(
    {"0.weight": torch.zeros(3, 2), "0.bias": torch.zeros(2)}))
raises(tessera.ArgumentError, "bias", nn.Sequential(nn.Linear(2, 2)).load_state_dict, {"0.weight": torch.zeros(2, 2)})
raises(tessera.UnsupportedError, "output_size 1", nn.AdaptiveAvgPool2d, 2)
raises(TypeError, "takes one tensor", nn.ReLU(), tessera.randn([2]), tessera.randn([2]))

# a child outlives its parent's Python object: the tree stays alive through it
child = Net().block
gc.collect()
check(child(tessera.randn([1, 4, 4, 4])).shape == (1, 4, 4, 4), "a child kept after its parent is dropped still runs")
print("all passed")
