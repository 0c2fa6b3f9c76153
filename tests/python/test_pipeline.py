"""tests/python/test_pipeline.py: tessera.data.ImagePipeline — the same batches bit for bit as the C pipeline with the
same options (tests/pipeline_dump.c), DALI's reader order (tests/golden/dali_reader.txt, from nvidia-dali's own
readers.file), torchvision's evaluation transform, len / epochs / reset / exact resume, sharding, zero copy and
batches that stay valid while kept, Ctrl-C during a long call, and errors as exceptions. Plain asserts (run by
tests/python_tests.sh); prints one line per check."""
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import torch
from PIL import Image

import tessera
import tessera.data
from tessera.data import ImagePipeline
from testutil import check

HERE = os.path.dirname(os.path.abspath(__file__))


def raises(exc, fn, needle, what):
    try:
        fn()
    except exc as e:
        check(needle in str(e), f"{what}: {type(e).__name__} ({e})")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: {type(e).__name__} ({e}), expected {exc.__name__}")
    check(False, f"{what}: no exception")


T = tempfile.mkdtemp(prefix="ts_pypipe_")
rng = np.random.default_rng(7)

# ---- a folder of 3 classes: RGB and gray JPEGs, PNGs, sizes from 20 to 60 pixels ---------------------------
ROOT = os.path.join(T, "imgs")
N = 23
for i in range(N):
    cdir = os.path.join(ROOT, f"class_{i % 3}")
    os.makedirs(cdir, exist_ok=True)
    w, h = 20 + (i * 7) % 41, 20 + (i * 11) % 37
    yy, xx = np.mgrid[0:h, 0:w]
    base = (xx * 200 // w + yy * 40 // h + i * 9) % 256
    pic = np.stack([base, (base + 60) % 256, 255 - base], -1) + rng.integers(-8, 8, (h, w, 3))
    im = Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8))
    if i % 5 == 1:
        im = im.convert("L")
    im.save(os.path.join(cdir, f"img_{i:03d}." + ("png" if i % 4 == 3 else "jpg")), quality=90)

# ---- the same batches as the C pipeline (tests/pipeline_dump.c) --------------------------------------------
DUMP = os.path.join(os.path.dirname(os.environ.get("TESSERA_BIN", "")), "pipeline_dump")  # beside the command


def c_batches(batch, size, shard, shards, seed, threads, epochs, train, shuffle, last_batch, color):
    out = os.path.join(T, "dump.bin")
    subprocess.run([DUMP, out, ROOT] + [str(v) for v in (batch, size, shard, shards, seed, threads, epochs,
                                                           int(train), shuffle, last_batch, color)], check=True)
    raw = open(out, "rb").read()
    c = 1 if color == "gray" else 3
    res, off = [], 0
    while off < len(raw):
        e, b, n = np.frombuffer(raw, np.int64, 3, off)
        off += 24
        y = np.frombuffer(raw, np.int64, n, off)
        off += 8 * n
        x = np.frombuffer(raw, np.float32, n * c * size * size, off).reshape(n, c, size, size)
        off += 4 * x.size
        res.append((int(e), int(b), x, y))
    return res


def py_batches(epochs, **kw):
    p = ImagePipeline(ROOT, **kw)
    res = []
    for _ in range(epochs):
        e = p.epoch
        for b, (x, y) in enumerate(p):
            res.append((e, b, x.numpy().copy(), y.numpy().copy()))
    p.close()
    return res


if os.access(DUMP, os.X_OK):
    for (batch, size, shard, shards, seed, threads, train, shuffle, last, color) in [
            (4, 16, 0, 2, 5, 2, True, "epoch", "partial", "rgb"),
            (5, 24, 1, 2, 9, 3, False, "none", "drop", "gray"),
            (6, 12, 0, 1, 3, 1, True, "buffer", "fill", "rgb")]:
        cb = c_batches(batch, size, shard, shards, seed, threads, 3, train, shuffle, last, color)
        extra = dict(mean=(0.485,), std=(0.229,)) if color == "gray" else {}
        pb = py_batches(3, batch_size=batch, image_size=size, shard_id=shard, num_shards=shards, seed=seed,
                        threads=threads, train=train, shuffle=shuffle, last_batch=last, color=color,
                        **extra)
        same = len(cb) == len(pb) and all(a[0] == b[0] and a[1] == b[1] and np.array_equal(a[3], b[3]) and
                                          a[2].tobytes() == b[2].tobytes() for a, b in zip(cb, pb))
        check(same and len(cb) > 3, f"{len(pb)} batches equal the C pipeline's bit for bit (train={train}, "
              f"shuffle={shuffle}, last_batch={last}, {color}, shard {shard}/{shards})")
else:
    print(f"skip: no {DUMP} (the build's tests/pipeline_dump.c): the comparison with the C pipeline")

# ---- DALI's reader order: the streams nvidia-dali's fn.readers.file produced --------------------------------
LIST = os.path.join(T, "golden.txt")
one = os.path.join(T, "one.png")
Image.fromarray(np.full((4, 4), 128, np.uint8)).save(one)
lines = [ln.split() for ln in open(os.path.join(HERE, "..", "golden", "dali_reader.txt")) if not ln.startswith("#")]
picked = [ln for k, ln in enumerate(lines) if int(ln[0]) <= 61 and (k % 9 == 0 or int(ln[6]) or int(ln[8]))]
bad, compared = 0, 0
for ln in picked:
    n, S, shard, B, stick, pad, shuf, fill, sae, seed, count = (int(v) for v in ln[:11])
    want = " ".join(ln[12:])
    with open(LIST, "w") as f:
        f.writelines(f"one.png {i}\n" for i in range(n))
    p = ImagePipeline(file_list=LIST, batch_size=B, shard_id=shard, num_shards=S, stick_to_shard=bool(stick),
                      last_batch="fill" if pad else "partial", shuffle="buffer" if shuf else "epoch" if sae else "none",
                      initial_fill=fill, seed=seed, image_size=2, train=False, threads=1, prefetch=1,
                      output="numpy", mean=None, std=None, color="gray")
    toks = []
    while len(toks) < count:
        for _x, y in p:
            toks += [str(int(v)) for v in y]
        toks[-1] += "|"
    p.close()
    got = " ".join(toks[:count])
    compared += 1
    if got.replace("|", "| ").split() != want.replace("|", "| ").split():
        bad += 1
        if bad <= 3:
            print("  mismatch:", " ".join(ln[:11]), "\n   want", want[:100], "\n   got ", got[:100])
check(bad == 0 and compared > 200, f"{compared} of DALI's reader streams ({len(lines)} in the golden file) in the same "
      "order, epoch ends included")

# ---- torchvision's evaluation transform on ImageFolder: the same images ------------------------------------
import torchvision  # noqa: E402
from torchvision import transforms  # noqa: E402

tf = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(28), transforms.ToTensor(),
                         transforms.Normalize(tessera.data.IMAGENET_MEAN, tessera.data.IMAGENET_STD)])
ref = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(ROOT, tf), batch_size=8)
ours = ImagePipeline(ROOT, 8, image_size=28, train=False)
diff, rows, labels_same = 0.0, 0, True
for (x, y), (rx, ry) in zip(ours, ref):
    diff = max(diff, float((x - rx).abs().max()))
    labels_same &= torch.equal(y, ry)
    rows += x.shape[0]
check(rows == N and labels_same and diff < 1e-5, f"train=False equals torchvision's Resize(32) + CenterCrop(28) + "
      f"Normalize on ImageFolder (labels equal, largest difference {diff:.2g})")
check(ours.classes == ref.dataset.classes, f"classes as ImageFolder's: {ours.classes}")

# ---- len, epochs, reset, exact resume ----------------------------------------------------------------------
opts = dict(batch_size=4, image_size=12, seed=11, threads=2)
p = ImagePipeline(ROOT, **opts)
check(len(p) == 6, f"len = ceil(23 / 4) = {len(p)}")
full = []
for e in range(3):
    check(p.epoch == e, f"loop {e} is epoch {e}")
    full.append([(x.clone(), y.clone()) for x, y in p])
check([len(b) for b in full] == [6, 6, 6] and full[0][-1][0].shape[0] == 3, "three epochs of 6 batches, the last of 3")
check(not all(torch.equal(a[1], b[1]) for a, b in zip(full[0], full[1])), "shuffle=True: epochs in different orders")
p.close()

q = ImagePipeline(ROOT, **opts)
it = iter(q)
for _ in range(6 + 2):  # epoch 0, and 2 batches of epoch 1 (a loop left early)
    try:
        next(it)
    except StopIteration:
        it = iter(q)
        next(it)
state = q.state_dict()
check(state["epoch"] == 1 and state["batch"] == 2, f"state_dict after 1 epoch + 2 batches: {state}")
q.close()
r = ImagePipeline(ROOT, **opts)
r.load_state_dict(state)
rest = [(x.clone(), y.clone()) for x, y in r]
check(len(rest) == 4 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, full[1][2:])),
      "load_state_dict: the rest of epoch 1 equals the uninterrupted run's, bit for bit")
nxt = [(x.clone(), y.clone()) for x, y in r]
check(all(torch.equal(a[0], b[0]) for a, b in zip(nxt, full[2])) and len(nxt) == 6, "and epoch 2 after it")
check(r.state_dict()["epoch"] == 3 and r.state_dict()["batch"] == 0, "state_dict at an epoch's end: the next epoch")
r.set_epoch(1)
it = iter(r)
x, y = next(it)
check(torch.equal(x, full[1][0][0]), "set_epoch(1): epoch 1's first batch")
r.reset()
check(r.epoch == 2 and [torch.equal(x, b[0]) for (x, _), b in zip(r, full[2])] == [True] * 6,
      "reset() mid-epoch: the next loop is epoch 2, as the uninterrupted run's")
raises(tessera.ArgumentError, lambda: r.load_state_dict(dict(state, batch_size=8)), "batch_size is 8",
       "a state from another batch size")
raises(tessera.ArgumentError, lambda: r.load_state_dict({"epoch": 1}), "'batch'", "a state without batch")
raises(tessera.ArgumentError, lambda: r.load_state_dict({"epoch": 0, "batch": 99}), "past the",
       "a position past the epoch")
r.close()

# ---- sharding: num_shards=2 partitions every epoch as the C reader does (shards rotate per epoch) -----------
seen = {}
for sh in range(2):
    p = ImagePipeline(ROOT, batch_size=5, image_size=8, shard_id=sh, num_shards=2, train=False, shuffle=False)
    check(p.shard == (sh, 2) and len(p) == (3 if sh == 0 else 3), f"shard {sh} of 2: {len(p)} batches")
    for e in range(2):
        idx = []
        for _ in p:
            idx += p.pipeline.indices()
        seen[(sh, e)] = idx
    p.close()
check(seen[(0, 0)] == list(range(0, 11)) and seen[(1, 0)] == list(range(11, 23)),
      "epoch 0: shard 0 reads [0, 11), shard 1 [11, 23) (floor(N i / S))")
check(seen[(0, 1)] == seen[(1, 0)] and seen[(1, 1)] == seen[(0, 0)], "epoch 1: the shards rotate (DALI's rule)")
for e in range(2):
    p0 = ImagePipeline(ROOT, batch_size=4, image_size=8, shard_id=0, num_shards=2, seed=3, shuffle="epoch")
    p1 = ImagePipeline(ROOT, batch_size=4, image_size=8, shard_id=1, num_shards=2, seed=3, shuffle="epoch")
    a, b = [], []
    for pp, acc in ((p0, a), (p1, b)):
        pp.set_epoch(e)
        for _ in pp:
            acc += pp.pipeline.indices()
        pp.close()
    check(sorted(a + b) == list(range(N)) and not set(a) & set(b), f"shuffle='epoch', epoch {e}: the two shards "
          "partition the data set")
os.environ["RANK"], os.environ["WORLD_SIZE"] = "1", "3"
check(tessera.data.default_shard() == (1, 3), "shard from RANK / WORLD_SIZE when torch.distributed is not initialised")
p = ImagePipeline(ROOT, batch_size=4, image_size=8)
check(p.shard == (1, 3) and p.pipeline.shard_size == 8, f"ImagePipeline takes it: shard {p.shard}, 8 samples")
p.close()
del os.environ["RANK"], os.environ["WORLD_SIZE"]
check(tessera.data.default_shard() == (0, 1), "without a launcher: (0, 1)")

# ---- zero copy; batches stay valid while kept ------------------------------------------------------------
p = ImagePipeline(ROOT, batch_size=4, image_size=12, seed=11, threads=2)
raw = p.pipeline
x, y, info = raw.next()
tx = torch.from_dlpack(x)
check(tx.data_ptr() == x.data_ptr() and torch.from_dlpack(y).data_ptr() == y.data_ptr(),
      "torch.from_dlpack(batch): the pipeline's memory, no copy")
check(np.asarray(x).ctypes.data == x.data_ptr(), "numpy: the pipeline's memory, no copy")
p.set_epoch(0)
kept = list(p)  # no clone: each batch kept as the pipeline handed it out
check(all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(kept, full[0])),
      "batches kept across later next() calls are never overwritten")
ptrs = {k[0].data_ptr() for k in kept}
check(len(ptrs) == len(kept), f"{len(kept)} kept batches in {len(ptrs)} distinct memories")
del kept
p.close()

# ---- Ctrl-C during a long call; the GIL is released while it waits -----------------------------------------
big = os.path.join(T, "big.jpg")
Image.fromarray(rng.integers(0, 256, (1500, 1500, 3), dtype=np.uint8)).save(big, quality=95)
with open(LIST, "w") as f:
    f.writelines(f"big.jpg {i % 2}\n" for i in range(64))
p = ImagePipeline(file_list=LIST, batch_size=64, image_size=32, train=False, threads=1, prefetch=1)
ticks = [0]
stop = threading.Event()


def counter():
    while not stop.is_set():
        ticks[0] += 1
        time.sleep(0.001)


th = threading.Thread(target=counter)
th.start()
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
interrupted = False
try:
    p.pipeline.next()
except KeyboardInterrupt:
    interrupted = True
stop.set()
th.join()
check(interrupted, "Ctrl-C (SIGINT) interrupts next() while it waits for a long decode: KeyboardInterrupt")
check(ticks[0] > 20, f"another Python thread ran while next() waited ({ticks[0]} ticks): the GIL is released")
x, y, info = p.pipeline.next()
check(x.shape == (64, 3, 32, 32) and info["batch"] == 0, "after it the pipeline goes on: the same batch 0")
p.close()

# ---- errors: exceptions with clear messages, never a crash ------------------------------------------------
missing = os.path.join(T, "no-such-folder")
raises(tessera.FileError, lambda: ImagePipeline(missing), missing, "a missing folder: tessera.FileError naming it")
raises(OSError, lambda: ImagePipeline(file_list=os.path.join(T, "none.txt")), "none.txt", "a missing file list")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, 0), "batch_size 0", "batch_size=0")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, shuffle="yes"), "shuffle 'yes': expected none, buffer or epoch",
       "shuffle='yes'")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, last_batch="keep"), "expected partial, drop or fill",
       "last_batch='keep'")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, color="cmyk"), "color 'cmyk'", "color='cmyk'")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, decode="gpu"), "decode device 'gpu'", "decode='gpu'")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, decode="mixed"), "no image decoder",
       "decode='mixed' on the CPU")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, output="jax"), "output='jax'", "output='jax'")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, image_size=(1, 2, 3)), "image_size", "image_size=(1, 2, 3)")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, image_size=0), "output size 0 x 0", "image_size=0")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, mean=(0.5, 0.5)), "mean has 2 values for 3 channels",
       "mean of 2 values")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, scale=(0.5, 0.1)), "scale (0.5, 0.1)", "scale=(0.5, 0.1)")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, flip=2.0), "flip_prob 2", "flip=2")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, threads=0), "num_threads 0", "threads=0")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, shard_id=3, num_shards=2), "shard", "shard_id=3 of 2")
raises(tessera.ArgumentError, lambda: ImagePipeline(ROOT, num_shards=30, shard_id=0), "cannot make 30 shards",
       "more shards than samples")
raises(TypeError, lambda: ImagePipeline(ROOT, batch_size="8"), "", "batch_size='8': TypeError")
raises(tessera.ArgumentError, lambda: ImagePipeline(), "give root", "neither root nor file_list")
p = ImagePipeline(ROOT, 4, image_size=8)
p.close()
p.close()
raises(tessera.Error, lambda: next(iter(p)), "closed", "iterating a closed pipeline: tessera.Error")
raises(tessera.Error, lambda: len(p), "closed", "len() of a closed pipeline")
raises(tessera.Error, lambda: p.state_dict(), "closed", "state_dict() of a closed pipeline")
check(repr(p) == "tessera.data.ImagePipeline(closed)", "repr of a closed pipeline")
with ImagePipeline(ROOT, 4, image_size=8) as p:
    check(len(p) == 6, f"as a context manager: {p!r}")
check(p.pipeline.closed, "closed when the with block ends")

bad_root = os.path.join(T, "corrupt")
shutil.copytree(ROOT, bad_root)
victim = os.path.join(bad_root, "class_1", "img_004.jpg")
with open(victim, "r+b") as f:
    f.truncate(200)
raises(tessera.FormatError, lambda: [b for b in ImagePipeline(bad_root, 4, image_size=8, shuffle=False)],
       "img_004.jpg", "a truncated JPEG: tessera.FormatError naming the file")
p = ImagePipeline(bad_root, 4, image_size=8, skip_corrupt=True, shuffle=False)
rows = sum(x.shape[0] for x, _ in p)
check(rows == N - 1 and p.counts()[1] >= 1, f"skip_corrupt: {rows} rows, {p.counts()[1]} skipped")
p.close()

shutil.rmtree(T)
print("all pipeline checks passed")
