"""tessera.train: the library's training run from Python (what `tessera train` runs), and the exports."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from . import _tessera

PathLike = Union[str, "os.PathLike[str]"]
Event = dict
Callback = Callable[[Event], None]


def run_fields() -> list[dict]:
    """Every field `tessera.train` takes — `tessera train`'s flags, '-' as '_' — as dicts with its name, flag,
    kind ("int", "float", "str", "bool", "enum"), default, choices (enums), min/max (numbers) and help."""
    return _tessera.run_fields()


def _print_progress(ev: Event) -> None:
    """The command's epoch lines, on rank 0."""
    if ev["rank"] != 0:
        return
    tokens = ev["tokens_per_second"] > 0  # token data: validation loss and tokens/s
    if ev["kind"] in ("epoch_end", "eval") and ev["eval"] is not None and tokens:
        e = ev["eval"]
        where = f"step {ev['step']}" if ev["kind"] == "eval" else f"epoch {ev['epoch'] + 1}/{ev['epochs']}"
        print(f"{where}: train loss {ev['mean_loss']:.4f}, val loss {e['loss']:.4f} ({e['samples']} tokens), "
              f"{ev['tokens_per_second']:.0f} tokens/s", flush=True)
    elif ev["kind"] == "eval" and ev["eval"] is not None:
        print(f"step {ev['step']}: train loss {ev['mean_loss']:.4f}, test loss {ev['eval']['loss']:.4f}, "
              f"{ev['images_per_second']:.0f} images/s", flush=True)
    elif ev["kind"] == "epoch_end" and ev["eval"] is not None:
        e = ev["eval"]
        print(f"epoch {ev['epoch'] + 1}/{ev['epochs']}: train loss {ev['mean_loss']:.4f}, test accuracy "
              f"{100 * e['accuracy']:.2f}%, top-5 {100 * e['top5_accuracy']:.2f}%, test loss {e['loss']:.4f} "
              f"({e['samples']} images), {ev['images_per_second']:.0f} images/s", flush=True)
    elif ev["kind"] == "checkpoint":
        print(f"saved checkpoint to {ev['checkpoint']} (epoch {ev['epoch'] + 1}, step {ev['step']})", flush=True)


def train(config: Optional[Mapping[str, Any]] = None, /, *, callback: Optional[Callback] = None,
          progress: bool = True, **fields: Any) -> dict:
    """Trains as `tessera train` does, in this process: the fields are the command's flags with '_' for '-'
    (`tessera.run_fields()` lists them; `config` a dict of them, keyword arguments win), e.g.

        tessera.train(model="resnet18", data="/data/imagenette", image_size=64, precision="bf16", max_steps=500)

    Under a launcher (`tessera run -n N python script.py`, torchrun, mpirun, srun) this process is one DDP rank
    of the job. `callback(event)` runs on every rank after each optimizer step, epoch end and checkpoint with a
    dict: kind ("step", "epoch_end", "eval" — every eval_every steps —, "checkpoint"), rank, epoch (from 0),
    epochs, batch, num_batches, step, loss, mean_loss, lr, images_per_second, tokens_per_second (token data;
    else 0), grad_norm, eval (epoch ends and "eval" on rank 0: samples — token data: positions —, accuracy,
    top5_accuracy, loss; else None) and checkpoint (the path written). An exception in it — or Ctrl-C — stops
    the run at the next event and is raised here (the job's other ranks then fail fast). progress=True prints
    the command's epoch and checkpoint lines on rank 0.

    Returns the run's figures: steps, epochs, images, train_seconds, images_per_second, tokens,
    tokens_per_second, final_loss, eval (rank
    0's latest: samples, accuracy, top5_accuracy, loss), skipped_steps, loss_scale, skipped_samples, rank,
    world_size, model, num_classes, image_size. A bad field is a tessera.ArgumentError naming it."""
    merged = dict(config or {})
    merged.update(fields)
    cb = callback
    if progress:
        if callback is None:
            cb = _print_progress
        else:
            def cb(ev: Event) -> None:
                _print_progress(ev)
                callback(ev)
    return _tessera.train(merged, cb)


def export_safetensors(checkpoint: PathLike, out: PathLike) -> int:
    """Writes the model tensors of a Tessera checkpoint as a safetensors file under PyTorch's names (what
    `tessera ckpt export` writes); returns how many."""
    return _tessera.export_safetensors(checkpoint, out)


def save_safetensors(tensors: Mapping[str, Any], path: PathLike, metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes {name: tensor} (torch tensors, NumPy arrays, tessera.Tensors: read in place, any strides) as a
    safetensors file, atomically (a temporary file renamed into place)."""
    _tessera.save_safetensors(dict(tensors), path, None if metadata is None else dict(metadata))


def export_onnx(out: PathLike, checkpoint: Optional[PathLike] = None, model: Optional[str] = None,
                input_shape: Optional[Sequence[int]] = None, seed: int = 0, dynamic_batch: bool = True) -> str:
    """Writes a model as ONNX (IR 8, opset 17), as `tessera export --format onnx`: a checkpoint's model, or the
    zoo's `model` with fresh weights from seed, traced on an example input of input_shape (default: 1 x the
    model's input); the batch dimension is symbolic unless dynamic_batch=False. Returns the model's name."""
    return _tessera.export_onnx(out, checkpoint, model, None if input_shape is None else list(input_shape), seed,
                                dynamic_batch)
