"""tessera.nn: models written in Python, PyTorch style, that are real Tessera modules.

    import tessera
    from tessera import nn, ops

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8 * 14 * 14, 10)
            self.scale = nn.Parameter(tessera.tensor([1.0]))

        def forward(self, x):
            x = ops.max_pool2d(ops.relu(self.bn(self.conv(x))), 2)
            return self.fc(ops.flatten(x, 1)) * self.scale

    model = Block()
    tessera.train(model=model, max_steps=100)     # the library's trainer, any strategy, checkpoints

Every nn.Module is a ts_module of the C library (ts_nn_module_new) whose forward calls the Python forward:
the trainer, DataParallel and the other strategies, DDP and checkpoints use it as they use the zoo's models.
Parameters (nn.Parameter, or a tensor attribute with requires_grad), buffers (register_buffer) and children
(Module attributes) are registered with the C module under their attribute names, so state_dict() has
PyTorch's dotted names. The built-in layers (Linear, Conv2d, BatchNorm2d, ...) are the library's own.

Limits (the library's): at most 8 parameters and 8 buffers per module (children: any number; put more
tensors in child modules); an attribute registered once cannot be replaced or deleted; a module is the child
of one parent only; forward takes and returns one tensor when a strategy or the trainer calls it.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _tessera
from ._tessera import Tensor

__all__ = [
    "Module", "Parameter", "Linear", "Conv2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm", "ReLU",
    "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten", "Dropout", "Embedding", "Sequential", "zoo", "GPT",
]

_PARAM, _BUFFER = 0, 1
_tls = threading.local()  # this thread's bindings: id(module) -> the handle its forward runs on


def Parameter(data: Any, requires_grad: bool = True) -> Tensor:
    """A tensor to register as a parameter (a leaf with requires_grad): tessera.Tensors as they are (detached
    when they have history), anything else through tessera.tensor (torch tensors, lists: a copy)."""
    from .ops import tensor
    t = data if isinstance(data, Tensor) else tensor(data)
    if not t.is_leaf:
        t = t.detach()
    t.requires_grad_(requires_grad)
    return t


def _bindings() -> dict:
    b = getattr(_tls, "b", None)
    if b is None:
        b = _tls.b = {}
    return b


class Module:
    """The base of models written in Python (torch.nn.Module's shape): set parameters, buffers and child
    modules as attributes in __init__ (after super().__init__()), write forward(x)."""

    _h: Any
    _parent: Optional["Module"]
    _name: Optional[str]

    def __init__(self) -> None:
        self._init_handle(_tessera._module_new(self, type(self).__name__))

    def _init_handle(self, h: Any) -> None:
        d = self.__dict__
        d["_h"] = h
        d["_parent"] = None
        d["_name"] = None
        d["_modules"] = {}
        d["_param_names"] = []
        d["_buffer_names"] = []

    # ---- registration ------------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_h" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before setting attributes")
        if name in self._modules or name in self._param_names or name in self._buffer_names:
            raise _tessera.ArgumentError(f"{type(self).__name__}: '{name}' is registered already; a module's "
                                         f"parameters, buffers and children cannot be replaced")
        if isinstance(value, Module):
            self.add_module(name, value)
        elif isinstance(value, Tensor) and value.requires_grad:
            self.register_parameter(name, value)
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._modules or name in self._param_names or name in self._buffer_names:
            raise _tessera.ArgumentError(f"{type(self).__name__}: '{name}' cannot be deleted")
        object.__delattr__(self, name)

    def register_parameter(self, name: str, value: Optional[Tensor]) -> None:
        """Registers value (a float32 tensor; it becomes a leaf with requires_grad; None: an absent one)."""
        _tessera._module_add(self._h, _PARAM, name, value)
        self._param_names.append(name)

    def register_buffer(self, name: str, value: Optional[Tensor]) -> None:
        """Registers value as a buffer: state without gradients that state_dict and checkpoints keep."""
        _tessera._module_add(self._h, _BUFFER, name, value)
        self._buffer_names.append(name)

    def add_module(self, name: str, module: "Module") -> None:
        """Registers module as a child (also: an attribute set to a Module). The parent owns it from then on."""
        if module._parent is not None:
            raise _tessera.ArgumentError(f"{type(self).__name__}: '{name}' ({type(module).__name__}) is already "
                                         f"the child '{module._name}' of a {type(module._parent).__name__}")
        _tessera._module_add_child(self._h, name, module._h)
        module.__dict__["_parent"] = self
        module.__dict__["_name"] = name
        self._modules[name] = module

    def __getattr__(self, name: str) -> Any:  # only for names not found the usual way
        d = self.__dict__
        if "_h" in d:
            if name in d["_param_names"]:
                return _tessera._module_tensor(self._bound(), _PARAM, name)
            if name in d["_buffer_names"]:
                return _tessera._module_tensor(self._bound(), _BUFFER, name)
            if name in d["_modules"]:
                return d["_modules"][name]
            if isinstance(self, _Builtin) and not name.startswith("_"):  # the C layer's own: weight, bias, ...
                for what in (_PARAM, _BUFFER):
                    t = _tessera._module_tensor(self._bound(), what, name)
                    if t is not None:
                        return t
        raise AttributeError(f"{type(self).__name__} has no attribute '{name}'")

    # ---- running ---------------------------------------------------------------------------------------------
    def _bound(self) -> Any:
        """The C module this module's forward runs on now: a replica's under DataParallel (bound by the C
        forward), else this module's own."""
        b = getattr(_tls, "b", None)
        if not b:
            return self._h
        h = b.get(id(self))
        if h is not None:
            return h
        p = self._parent
        if p is not None:
            ph = p._bound()
            if ph is not p._h:
                return _tessera._module_child(ph, self._name)
        return self._h

    def _tessera_forward(self, h: Any, x: Tensor) -> Any:
        """Called by the C module's forward with the module it runs on (h) and the input."""
        if _tessera._module_same(h, self._h):
            return self.forward(x)
        b = _bindings()
        prev = b.get(id(self))
        b[id(self)] = h
        try:
            return self.forward(x)
        finally:
            if prev is None:
                del b[id(self)]
            else:
                b[id(self)] = prev

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs:
            return _tessera._module_forward(self._bound(), args[0])
        if isinstance(self, _Builtin):
            raise TypeError(f"{type(self).__name__} takes one tensor")
        return self._call_many(args, kwargs)

    def _call_many(self, args: tuple, kwargs: dict) -> Any:
        """forward(*args, **kwargs) directly in Python (the C modules take one tensor), bound like a C call."""
        h = self._bound()
        b = _bindings()
        prev = b.get(id(self))
        b[id(self)] = h
        try:
            return self.forward(*args, **kwargs)
        finally:
            if prev is None:
                del b[id(self)]
            else:
                b[id(self)] = prev

    def forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.forward is not written")

    # ---- what it holds -------------------------------------------------------------------------------------
    def named_parameters(self) -> Iterator[Tuple[str, Tensor]]:
        """(dotted name, parameter) for every parameter, PyTorch's order (the module's own, then each child's)."""
        return iter(_tessera._module_tensors(self._h, 0))

    def parameters(self) -> Iterator[Tensor]:
        return (t for _, t in _tessera._module_tensors(self._h, 0))

    def named_buffers(self) -> Iterator[Tuple[str, Tensor]]:
        return iter(_tessera._module_tensors(self._h, 1))

    def buffers(self) -> Iterator[Tensor]:
        return (t for _, t in _tessera._module_tensors(self._h, 1))

    def state_dict(self) -> Dict[str, Tensor]:
        """{dotted name: tensor}: parameters and buffers, detached aliases of the module's own (PyTorch's names
        and order: torch's load_state_dict takes it through torch.from_dlpack)."""
        return dict(_tessera._module_tensors(self._h, 2))

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> None:
        """Copies values (tessera.Tensors, torch tensors, NumPy arrays) into the parameters and buffers; checks
        every key and shape before copying anything (tessera.ShapeError / ArgumentError naming the key)."""
        _tessera._module_load_state_dict(self._h, dict(state_dict), strict)

    def named_children(self) -> Iterator[Tuple[str, "Module"]]:
        return iter(list(self._modules.items()))

    def children(self) -> Iterator["Module"]:
        return iter(list(self._modules.values()))

    def modules(self) -> Iterator["Module"]:
        yield self
        for c in self._modules.values():
            yield from c.modules()

    # ---- mode and place --------------------------------------------------------------------------------------
    @property
    def training(self) -> bool:
        return _tessera._module_train(self._h, None)

    def train(self, mode: bool = True) -> "Module":
        _tessera._module_train(self._h, bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def to(self, device: str) -> "Module":
        """Moves every parameter and buffer to device ("cpu", "cuda:0", ...)."""
        _tessera._module_to(self._h, device)
        return self

    def zero_grad(self) -> None:
        _tessera._module_zero_grad(self._h)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}("]
        for n, c in self._modules.items():
            lines.append(f"  ({n}): " + repr(c).replace("\n", "\n  "))
        return "\n".join(lines) + ")" if len(lines) > 1 else f"{type(self).__name__}()"


class _Builtin(Module):
    """A layer of the library (tessera/nn.h): its forward is C."""

    def __init__(self, h: Any) -> None:
        self._init_handle(h)

    def forward(self, x: Tensor) -> Tensor:
        return _tessera._module_forward(self._bound(), x)


class Linear(_Builtin):
    """y = x W^T + b: weight (out, in), bias (out); PyTorch's initialisation."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(_tessera._nn_linear(in_features, out_features, bias))


class Conv2d(_Builtin):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: Union[int, Sequence[int]], stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True) -> None:
        super().__init__(_tessera._nn_conv2d(in_channels, out_channels, _pair(kernel_size), _pair(stride),
                                             _pair(padding), _pair(dilation), groups, bias))


class BatchNorm2d(_Builtin):
    """momentum None: the cumulative average (PyTorch's momentum=None)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(_tessera._nn_batchnorm(2, num_features, eps, momentum, affine, track_running_stats))


class BatchNorm1d(_Builtin):
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(_tessera._nn_batchnorm(1, num_features, eps, momentum, affine, track_running_stats))


class LayerNorm(_Builtin):
    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True) -> None:
        shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
        super().__init__(_tessera._nn_layernorm(shape, eps, elementwise_affine))


class GroupNorm(_Builtin):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__(_tessera._nn_groupnorm(num_groups, num_channels, eps, affine))


class ReLU(_Builtin):
    def __init__(self) -> None:
        super().__init__(_tessera._nn_simple("relu"))


class Flatten(_Builtin):
    """(N, C, H, W) -> (N, C*H*W) (start_dim 1, as PyTorch's default)."""

    def __init__(self) -> None:
        super().__init__(_tessera._nn_simple("flatten"))


class AdaptiveAvgPool2d(_Builtin):
    """output_size 1 only: (N, C, H, W) -> (N, C, 1, 1); other sizes: tessera.ops.adaptive_avg_pool2d."""

    def __init__(self, output_size: Union[int, Sequence[int]] = 1) -> None:
        if _pair(output_size) != (1, 1):
            raise _tessera.UnsupportedError(f"AdaptiveAvgPool2d({output_size}): the layer takes output_size 1; "
                                            f"use tessera.ops.adaptive_avg_pool2d in a forward for others")
        super().__init__(_tessera._nn_simple("global_avg_pool2d"))


class MaxPool2d(_Builtin):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 ceil_mode: bool = False) -> None:
        super().__init__(_tessera._nn_pool2d(True, _pair(kernel_size), None if stride is None else _pair(stride),
                                             _pair(padding), _pair(dilation), ceil_mode, True))


class AvgPool2d(_Builtin):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> None:
        super().__init__(_tessera._nn_pool2d(False, _pair(kernel_size), None if stride is None else _pair(stride),
                                             _pair(padding), (1, 1), ceil_mode, count_include_pad))


class Dropout(_Builtin):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__(_tessera._nn_dropout(p))


class Embedding(_Builtin):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(_tessera._nn_embedding(num_embeddings, embedding_dim))


class Sequential(_Builtin):
    """Runs its children in order (the library's Sequential: model and pipeline parallelism split it)."""

    def __init__(self, *modules: Module) -> None:
        super().__init__(_tessera._nn_simple("sequential"))
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)


class _Zoo(_Builtin):
    pass


def zoo(name: str, num_classes: int = 0) -> Module:
    """The zoo's model `name` ("cnn", "mlp", "resnet18", ..., the GPT-2 presets) as a module (weights from the
    default generator: tessera.manual_seed); its children are reached through state_dict() and
    named_parameters(). A GPT-2 preset gives a GPT (num_classes: its vocabulary; 0: the preset's)."""
    if name in _tessera._gpt_presets():
        return GPT(name, vocab_size=num_classes if num_classes > 0 else None)
    m = _Zoo(_tessera._model_new(name, num_classes))
    return m


_HF_CONFIG = {"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd", "n_positions": "seq_len",
              "vocab_size": "vocab_size", "layer_norm_epsilon": "layer_norm_eps", "initializer_range": "init_std"}


class GPT(_Builtin):
    """A GPT-2 family language model, the library's (ts_model_gpt: Hugging Face's GPT2LMHeadModel).

    GPT("gpt2-tiny"), GPT("gpt2", n_layer=6), GPT(n_layer=4, n_head=4, n_embd=128, seq_len=256, vocab_size=257,
    seed=1): a preset ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt2-tiny"; None: GPT-2 small's sizes)
    with the sizes given; dropout (embedding and residual, training mode only), layer_norm_eps and init_std as
    GPT-2's by default. Weights: GPT-2's initialisation from a generator seeded with `seed`, or from the default
    generator (tessera.manual_seed) when seed is None.

    model(tokens): int64 token ids (B, T), T <= seq_len -> logits (B, T, vocab_size), with autograd.
    state_dict() has GPT2LMHeadModel's names (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...;
    the tied lm_head.weight appears once, as transformer.wte.weight) and load_state_dict takes its state dict as
    it is (lm_head.weight, GPT2Model's names and the old attention-mask buffers too).
    """

    def __init__(self, preset: Optional[str] = None, *, n_layer: Optional[int] = None, n_head: Optional[int] = None,
                 n_embd: Optional[int] = None, seq_len: Optional[int] = None, vocab_size: Optional[int] = None,
                 dropout: Optional[float] = None, layer_norm_eps: Optional[float] = None,
                 init_std: Optional[float] = None, seed: Optional[int] = None) -> None:
        super().__init__(_tessera._gpt_new(preset, n_layer, n_head, n_embd, seq_len, vocab_size, dropout,
                                           layer_norm_eps, init_std, seed))

    @classmethod
    def _from_handle(cls, h: Any) -> "GPT":
        m = cls.__new__(cls)
        _Builtin.__init__(m, h)
        return m

    @classmethod
    def from_checkpoint(cls, path: Any) -> "GPT":
        """The GPT a Tessera training checkpoint holds (tessera.train / `tessera train --model gpt2...`), with
        the sizes it records (what `tessera generate --checkpoint` loads); another model is an ArgumentError."""
        return cls._from_handle(_tessera._gpt_from_checkpoint(path))

    @classmethod
    def from_safetensors(cls, path: Any, preset: Optional[str] = None, *, config: Any = None,
                         **sizes: Any) -> "GPT":
        """A GPT with weights from a safetensors file in Hugging Face's GPT-2 names (save_pretrained's
        model.safetensors, or save_safetensors's). The sizes: a preset and keywords as GPT(), or `config`, a
        Hugging Face GPT2Config as a dict or the path of its config.json (n_layer, n_head, n_embd, n_positions,
        vocab_size, layer_norm_epsilon, initializer_range); a file that does not fit them is a ShapeError naming
        the tensor."""
        if config is not None:
            if not isinstance(config, dict):
                import json
                with open(config, encoding="utf-8") as f:
                    config = json.load(f)
            sizes = {**{_HF_CONFIG[k]: v for k, v in config.items() if k in _HF_CONFIG}, **sizes}
        m = cls(preset, **sizes)
        m.load_safetensors(path)
        return m

    def load_safetensors(self, path: Any) -> None:
        """Loads a safetensors file in Hugging Face's GPT-2 names into this model (strict, as load_state_dict)."""
        _tessera._gpt_safetensors(self._h, path, False)

    def save_safetensors(self, path: Any) -> None:
        """Writes the weights as GPT2LMHeadModel.save_pretrained does (its names, no lm_head.weight, metadata
        {"format": "pt"}): transformers' from_pretrained reads it with a config of the same sizes."""
        _tessera._gpt_safetensors(self._h, path, True)

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> None:
        """As Module.load_state_dict; strict also takes Hugging Face's GPT-2 state dicts as they are
        (GPT2LMHeadModel's with lm_head.weight, which must equal wte; GPT2Model's without "transformer.")."""
        _tessera._module_load_state_dict(self._h, dict(state_dict), strict, strict)

    @property
    def config(self) -> Dict[str, Any]:
        """The sizes it was built with: n_layer, n_head, n_embd, seq_len, vocab_size, dropout, layer_norm_eps,
        init_std."""
        return _tessera._gpt_config(self._h)

    def generate(self, prompt_ids: Any, max_new_tokens: int = 16, temperature: float = 1.0, top_k: int = 0,
                 seed: int = 0) -> List[int]:
        """Continues prompt_ids (a list of token ids, or an int64 tensor (T) or (1, T)) by max_new_tokens tokens
        and returns the new ones (the prompt not included), with a key/value cache (ts_gpt_generate), the GIL
        released. Each step divides the last logits by `temperature`, keeps the `top_k` largest (0: all) and
        samples from their softmax with a generator seeded with `seed`; temperature 0 or top_k 1 is greedy
        (torch.argmax's first largest). Past seq_len the model sees the last seq_len tokens (nanoGPT's crop).
        Runs in eval mode without autograd (the mode is restored). Bad values are ArgumentErrors naming them."""
        return _tessera._gpt_generate(self._h, prompt_ids, max_new_tokens, temperature, top_k, seed)

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT(n_layer={c['n_layer']}, n_head={c['n_head']}, n_embd={c['n_embd']}, seq_len={c['seq_len']}, "
                f"vocab_size={c['vocab_size']})")


def _pair(v: Any) -> Tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
