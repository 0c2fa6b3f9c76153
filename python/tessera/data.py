"""tessera.data: the library's DALI-style input pipeline for PyTorch (and NumPy).

`ImagePipeline` reads a folder of class folders (torchvision's ImageFolder layout, DALI's `readers.file`) or a
file list, decodes JPEG/PNG files and augments them on the library's worker threads (no Python, no worker
processes), and yields ready `(images, labels)` batches as torch tensors sharing the pipeline's memory through
DLPack (no copy): images (B, C, H, W) float32, labels (B,) int64.

    import torch, torchvision, tessera.data
    train = tessera.data.ImagePipeline("fm/train", batch_size=64, image_size=28, threads=2, seed=1)
    model = torchvision.models.resnet18(num_classes=train.num_classes)
    for epoch in range(10):
        for x, y in train:                 # one epoch per loop, as a DataLoader
            loss = torch.nn.functional.cross_entropy(model(x), y)
            ...

The reader is DALI's `readers.file` rule for rule (shards, their rotation per epoch, padding, both shufflings,
DALI's random streams), so a DALI pipeline with the same options reads the same samples in the same order;
the augmentation is torchvision's `RandomResizedCrop` + `RandomHorizontalFlip` + `Normalize` (training) or
`Resize` + `CenterCrop` + `Normalize` with Pillow's resampling (evaluation). docs/python.md has the details.

Text: `Tokenizer.bytes()` and `Tokenizer.gpt2(vocab_json, merges_txt)` (GPT-2's byte-level BPE; the ids equal
tiktoken's and transformers'), `tokenize(files, out_dir)` (llm.c token shards, as `tessera data tokenize`) and
`token_shard_info(path)` (as `tessera data info`):

    tok = tessera.data.Tokenizer.gpt2("vocab.json", "merges.txt")
    ids = tok.encode("Hello world")           # [15496, 995]
    r = tessera.data.tokenize(["a.txt", "b.txt"], "tok", tokenizer=tok, val_fraction=0.05)
"""
from __future__ import annotations

import os
import struct
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _tessera
from ._tessera import ArgumentError

__all__ = ["ImagePipeline", "default_shard", "IMAGENET_MEAN", "IMAGENET_STD", "Tokenizer", "tokenize",
           "token_shard_info"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

PathLike = Union[str, bytes, "os.PathLike[str]"]  # noqa: F821


def default_shard() -> Tuple[int, int]:
    """(shard_id, num_shards) for this process: torch.distributed's (rank, world size) when a process group is
    initialised; else the launcher's environment as the C library reads it (torchrun's RANK / WORLD_SIZE,
    `tessera run`, mpirun's OMPI_COMM_WORLD_*, srun's SLURM_PROCID / SLURM_NTASKS, ...); else (0, 1)."""
    dist = sys.modules.get("torch.distributed")  # only when torch is in use: never imports it
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world, _source = _tessera._launch_shard()
    return rank, world


def _shuffle_name(shuffle: Union[bool, str, None], train: bool) -> str:
    if shuffle is None:
        shuffle = train
    if shuffle is True:
        return "epoch"
    if shuffle is False:
        return "none"
    if isinstance(shuffle, str):
        return shuffle  # the library's parser names the choices when it is none of them
    raise ArgumentError(f"tessera.data: shuffle={shuffle!r}: expected True, False, 'none', 'buffer' or 'epoch'")


class ImagePipeline:
    """Batches of images and labels from a folder of class folders or a file list, as torch tensors.

    Args:
        root: a folder with one sub-folder per class (label = the folder's position in byte order; files ending
            .jpg, .jpeg, .png in each), torchvision's ImageFolder layout. With `file_list`, the folder its paths
            are relative to.
        batch_size: samples per batch.
        file_list: a text file of "path label" lines (DALI's file_list); paths relative to `root`, else to the
            list's folder.
        shard_id, num_shards: this process reads shard `shard_id` of `num_shards` (DALI's sharding: shard i of S
            over N samples is [floor(N i / S), floor(N (i + 1) / S)), rotating by one shard per epoch unless
            `stick_to_shard`). None: `default_shard()` (torch.distributed, else the launcher's environment).
        image_size: output height and width (an int), or (height, width).
        train: True: random resized crop (`scale`, `ratio`) and horizontal flip (`flip`), shuffled; False:
            torchvision's evaluation transform, Resize(int(size / crop_fraction)) + CenterCrop(size), no flip, no
            shuffling.
        scale, ratio: RandomResizedCrop's area fraction and aspect-ratio ranges (training).
        flip: probability of a horizontal flip (None: 0.5 when training, else 0).
        crop_fraction: evaluation's centre crop (0.875: 256 -> 224, ImageNet's); 0 resizes the whole image.
        mean, std: Normalize's per-channel values for images in [0, 1] (one value or one per channel); None
            leaves the values in [0, 1].
        color: "rgb" (3 channels; gray images are repeated, as PIL's convert("RGB")) or "gray" (1 channel).
        threads: decoding worker threads.
        prefetch: batches prepared ahead of the one being used.
        seed: the augmentation's seed and the shuffling's (DALI's reader `seed` and `shuffle_after_epoch_seed`).
        shuffle: True (default when training) or "epoch": a new permutation of the whole data set every epoch,
            the same on every shard, each shard reading its part (DALI's shuffle_after_epoch; PyTorch's
            DistributedSampler). "buffer": DALI's random_shuffle, a buffer of `initial_fill` samples. False or
            "none": listing order.
        initial_fill: the shuffling buffer's size (shuffle="buffer").
        stick_to_shard: every epoch reads the same shard (DALI's stick_to_shard; implied by shuffle="epoch").
        last_batch: an epoch's last batch when the shard does not fill it: "partial" (returned smaller), "drop"
            (left out), "fill" (the last sample repeated; DALI's pad_last_batch, which also evens the shards out
            so every rank runs the same number of steps; `last_batch_info["real"]` counts the real rows).
        decode: "cpu" (worker threads) or "mixed" (JPEGs decoded on `device` with nvJPEG, as DALI's "mixed").
        device: where batches land: "cpu", "cuda:0", ...
        skip_corrupt: leave out files that cannot be decoded (counted) instead of raising tessera.FormatError.
        output: "torch" (torch.Tensor, through DLPack) or "numpy" (numpy.ndarray, through the buffer protocol;
            host devices only). Either way the memory is the pipeline's, not a copy.

    Iterating gives one epoch, then the next loop gives the next epoch (a DataLoader's behaviour, DALI's
    iterator with auto_reset). A loop left early continues where it stopped; `reset()` skips to the next
    epoch. `state_dict()` / `load_state_dict()` resume exactly: the batches after a load equal an
    uninterrupted run's. Batches stay valid as long as they are referenced (the pipeline writes new batches
    elsewhere).

    Errors are tessera.Error's subclasses: a missing folder is a tessera.FileError naming it, a bad option a
    tessera.ArgumentError naming it, an undecodable file a tessera.FormatError naming the file.
    """

    def __init__(
        self,
        root: Optional[PathLike] = None,
        batch_size: int = 64,
        *,
        file_list: Optional[PathLike] = None,
        shard_id: Optional[int] = None,
        num_shards: Optional[int] = None,
        image_size: Union[int, Tuple[int, int]] = 224,
        train: bool = True,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        flip: Optional[float] = None,
        crop_fraction: float = 0.875,
        mean: Optional[Sequence[float]] = IMAGENET_MEAN,
        std: Optional[Sequence[float]] = IMAGENET_STD,
        color: str = "rgb",
        threads: int = 2,
        prefetch: int = 2,
        seed: int = 0,
        shuffle: Union[bool, str, None] = None,
        initial_fill: int = 1024,
        stick_to_shard: bool = False,
        last_batch: str = "partial",
        decode: str = "cpu",
        device: str = "cpu",
        skip_corrupt: bool = False,
        output: str = "torch",
    ) -> None:
        if output not in ("torch", "numpy"):
            raise ArgumentError(f"tessera.data.ImagePipeline: output={output!r}: expected 'torch' or 'numpy'")
        if shard_id is None or num_shards is None:
            rank, world = default_shard()
            shard_id = rank if shard_id is None else shard_id
            num_shards = world if num_shards is None else num_shards
        if isinstance(image_size, int):
            height = width = image_size
        else:
            try:
                height, width = image_size
            except (TypeError, ValueError):
                raise ArgumentError(f"tessera.data.ImagePipeline: image_size={image_size!r}: expected an int or "
                                    "(height, width)") from None
        channels = 1 if color == "gray" else 3
        # pixel units, rounded as C computes `0.485f * 255` (float32), so a C program's batches are these
        pmean = [_f32(_f32(v) * 255.0) for v in _channels(mean, "mean", channels)] if mean is not None else [0.0]
        pstd = [_f32(_f32(v) * 255.0) for v in _channels(std, "std", channels)] if std is not None else [255.0]
        self._output = output
        self._batch_size = batch_size
        self._seed = seed
        self._shard = (shard_id, num_shards)
        self._last_info: Dict[str, Any] = {}
        self._torch = None
        self._np = None
        self._p = _tessera.Pipeline(
            root=root, file_list=file_list, batch_size=batch_size, width=width, height=height,
            shard_id=shard_id, num_shards=num_shards, random_resized_crop=bool(train), scale=scale, ratio=ratio,
            flip=(0.5 if train else 0.0) if flip is None else flip, center_crop=0.0 if train else crop_fraction,
            mean=pmean, std=pstd, color=color, threads=threads, prefetch=prefetch, seed=seed,
            shuffle=_shuffle_name(shuffle, train), initial_fill=initial_fill, shuffle_seed=seed,
            stick_to_shard=stick_to_shard, last_batch=last_batch, decode=decode, device=device,
            skip_corrupt=skip_corrupt)

    # ---- iteration ---------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        """The rest of the current epoch, batch by batch; the next loop gives the next epoch."""
        while True:
            x, y, info = self._p.next()
            self._last_info = info
            if x is None:
                return
            yield self._convert(x), self._convert(y)

    def __len__(self) -> int:
        """Batches in the current epoch for this shard."""
        return self._p.num_batches()

    def reset(self) -> None:
        """Skips the rest of the current epoch: the next loop starts the next epoch (a no-op at an epoch's
        start)."""
        if self._p.batch_index > 0:
            self._p.seek(self._p.epoch + 1, 0)

    def set_epoch(self, epoch: int) -> None:
        """The next loop gives epoch `epoch` from its start (DistributedSampler.set_epoch's use)."""
        self._p.seek(epoch, 0)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._p.epoch

    @property
    def last_batch_info(self) -> Dict[str, Any]:
        """The last batch's epoch, batch index, size, real rows (not last_batch='fill' repeats), skipped
        (corrupt) samples and whether it was the epoch's last."""
        return dict(self._last_info)

    # ---- resume ------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, int]:
        """The position of the next batch (and what it depends on), for load_state_dict."""
        epoch, batch = self._p.epoch, self._p.batch_index
        if batch > 0 and batch >= self._p.num_batches(epoch):  # after an epoch's last batch: the next one
            epoch, batch = epoch + 1, 0
        return {"epoch": epoch, "batch": batch, "batch_size": self._batch_size, "seed": self._seed,
                "shard_id": self._shard[0], "num_shards": self._shard[1]}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Continues at state's position: the batches that follow are those an uninterrupted run gives there.
        A state from a pipeline with another batch size, seed or sharding is a tessera.ArgumentError."""
        try:
            epoch, batch = int(state["epoch"]), int(state["batch"])
        except (KeyError, TypeError, ValueError):
            raise ArgumentError("tessera.data.ImagePipeline.load_state_dict: the state needs integer 'epoch' and "
                                "'batch' (from state_dict())") from None
        mine = self.state_dict()
        for k in ("batch_size", "seed", "shard_id", "num_shards"):
            if k in state and state[k] != mine[k]:
                raise ArgumentError(f"tessera.data.ImagePipeline.load_state_dict: the state's {k} is {state[k]}, "
                                    f"this pipeline's {mine[k]}: resuming needs the same options")
        self._p.seek(epoch, batch)

    # ---- the data set ------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return self._p.num_classes

    @property
    def classes(self) -> List[Optional[str]]:
        """Class names in label order (the folders' names; None where a file list gives no name)."""
        return self._p.class_names

    @property
    def dataset_size(self) -> int:
        """Samples in the whole data set (every shard)."""
        return self._p.size

    @property
    def shard(self) -> Tuple[int, int]:
        """(shard_id, num_shards)."""
        return self._shard

    @property
    def pipeline(self) -> "_tessera.Pipeline":
        """The C pipeline underneath (next() -> (x, y, info) as tessera.Tensors, seek, indices, counts)."""
        return self._p

    def counts(self) -> Tuple[int, int]:
        """(decoded, skipped as corrupt) samples so far, batches prepared ahead included."""
        return self._p.counts()

    # ---- closing -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the workers and frees the pipeline (batches already returned stay valid). Using it afterwards
        raises tessera.Error."""
        self._p.close()

    def __enter__(self) -> "ImagePipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._p.closed:
            return "tessera.data.ImagePipeline(closed)"
        c, h, w = self._p.sample_shape
        return (f"tessera.data.ImagePipeline({self._p.size} samples, shard {self._shard[0]} of {self._shard[1]}, "
                f"batch {self._batch_size}, {c}x{h}x{w}, epoch {self._p.epoch})")

    def _convert(self, t: "_tessera.Tensor") -> Any:
        if self._output == "torch":
            if self._torch is None:
                import torch
                self._torch = torch
            return self._torch.from_dlpack(t)
        if self._np is None:
            import numpy
            self._np = numpy
        return self._np.asarray(t)


def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


def _channels(v: Sequence[float], name: str, channels: int) -> List[float]:
    try:
        vals = [float(x) for x in v]
    except (TypeError, ValueError):
        raise ArgumentError(f"tessera.data.ImagePipeline: {name}={v!r}: expected numbers") from None
    if channels == 1 and (v is IMAGENET_MEAN or v is IMAGENET_STD):  # the defaults with color="gray": their mean
        vals = [sum(vals) / 3.0]
    return vals


# ---- text ----------------------------------------------------------------------------------------------------
_Bytes = bytes  # the built-in, which Tokenizer.bytes hides inside the class


class Tokenizer:
    """Text to token ids and back: the library's tokenizers (tessera/data.h).

    Tokenizer.bytes(): id = the byte (0..255), <|endoftext|> = 256 (vocabulary 257, no files).
    Tokenizer.gpt2(vocab_json, merges_txt): GPT-2's byte-level BPE from its two files (any vocabulary in that
    format); the ids equal tiktoken's and transformers.GPT2Tokenizer's. A malformed file is a
    tessera.FormatError naming it and the line, a missing one a tessera.FileError.

    A tokenizer is for one thread at a time (it caches the words it has seen): make one per thread.
    """

    def __init__(self, kind: str = "bytes", vocab_json: Optional[PathLike] = None,
                 merges_txt: Optional[PathLike] = None) -> None:
        self._h = _tessera._tokenizer_new(kind, vocab_json, merges_txt)  # the library names a bad kind
        self._kind = kind
        self._vocab_size, eot = _tessera._tokenizer_info(self._h)
        self._eot = eot if eot >= 0 else None

    @classmethod
    def bytes(cls) -> "Tokenizer":
        """The byte tokenizer: vocabulary 257, eot 256."""
        return cls("bytes")

    @classmethod
    def gpt2(cls, vocab_json: PathLike, merges_txt: PathLike) -> "Tokenizer":
        """GPT-2's BPE from vocab.json and merges.txt."""
        return cls("gpt2", vocab_json, merges_txt)

    @property
    def kind(self) -> str:
        """"bytes" or "gpt2"."""
        return self._kind

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eot(self) -> Optional[int]:
        """The id of <|endoftext|> (None when the vocabulary has none)."""
        return self._eot

    def encode(self, text: Union[str, _Bytes], special: bool = False) -> List[int]:
        """The ids of text (a str, encoded as UTF-8, or bytes: any bytes, UTF-8 or not, round-trip through
        decode_bytes). special=True: "<|endoftext|>" in the text is the EOT token (tiktoken's
        allowed_special="all", transformers'); False: ordinary text (tiktoken's encode_ordinary, llm.c's)."""
        return _tessera._tokenizer_encode(self._h, text, special)

    def decode(self, ids: Any) -> str:
        """The text of ids (a list of ints or an int64 tensor). Byte-level tokens can end in the middle of a
        UTF-8 character (a prefix of a sequence, one token of a multi-byte emoji): those bytes decode as U+FFFD,
        errors="replace" (tiktoken's and transformers' default); decode_bytes gives the bytes as they are. An id
        outside the vocabulary is a tessera.ArgumentError naming it and its position."""
        return _tessera._tokenizer_decode(self._h, ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Any) -> _Bytes:
        """The bytes of ids, exactly (the library's decode): decode_bytes(encode(b)) == b for any bytes b."""
        return _tessera._tokenizer_decode(self._h, ids)

    def __repr__(self) -> str:
        return f"tessera.data.Tokenizer({self._kind}, vocab_size={self._vocab_size}, eot={self._eot})"


def tokenize(files: Union[PathLike, Sequence[PathLike]], out_dir: PathLike,
             tokenizer: Union[str, Tokenizer] = "bytes", *, name: str = "tokens", val_fraction: float = 0.1,
             val_tokens: int = 0, shard_tokens: int = 100_000_000, special: bool = False) -> Dict[str, Any]:
    """Encodes text files into llm.c token shards, as `tessera data tokenize` (the GIL released while it runs).

    Each file is one document, preceded by <|endoftext|> (the tokenizer's EOT) as llm.c's data scripts do; the
    first tokens (`val_fraction` of them, rounded down, or exactly `val_tokens` when > 0) make the validation
    split, the rest the training split; each split is cut into shards of at most `shard_tokens`, written as
    OUT_DIR/<name>_val_000000.bin, ... then OUT_DIR/<name>_train_<k>.bin (out_dir is made when missing).
    `tessera.train(data=out_dir, model="gpt2"...)` trains on them. tokenizer: a Tokenizer, or "bytes".

    Returns {"bytes", "tokens", "val_tokens", "train_tokens", "val_shards", "train_shards", "vocab_size",
    "entropy_bits", "entropy_nats" (the training tokens' unigram entropy per token), "seconds"}.
    """
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]
    tok = Tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"tessera.data.tokenize: tokenizer: expected a Tokenizer or 'bytes', not "
                        f"{type(tokenizer).__name__}")
    return _tessera._tokenize(list(files), out_dir, tok._h, name, val_fraction, val_tokens, shard_tokens, special)


def token_shard_info(path: PathLike, vocab_size: int = 0) -> Dict[str, int]:
    """Checks an llm.c token shard whole (header, size; vocab_size > 0: every token below it) as `tessera data
    info`, and returns {"tokens", "max_id" (-1 when empty), "entropy_bits"}. A malformed shard is a
    tessera.FormatError naming the path and what is wrong."""
    return _tessera._token_shard_info(path, vocab_size)
