"""tests/python/test_pipeline_train.py: tessera.data.ImagePipeline's training augmentation is torchvision's
(RandomResizedCrop + RandomHorizontalFlip, Pillow's bilinear resampling) and a PyTorch loop learns from it as it
does from ImageFolder + transforms + DataLoader, on 1,200 Fashion-MNIST training and 400 test images exported as
JPEG folders. The test-sized version of bench/python_loader_resnet.py. Three checks:

1. Sample by sample: with a fixed window size (scale and ratio pinned) each augmented image equals torchvision's
   resized_crop (+ hflip) of its file for one window position and flip, within Pillow's 8-bit rounding (1/255),
   gray repeated as PIL's convert("RGB"), the label the file's class; the positions cover every offset and about
   half the samples are flipped. Shrinking (20 -> 14 rows) and enlarging (20 -> 24 columns) both.
2. In distribution, with the default scale (0.08, 1) and ratio (3/4, 4/3): over several epochs the per-pixel mean
   of the augmented images and of their gradient magnitudes agree with torchvision's to within the sampling noise
   (mean squared z-score under 3; two torchvision seeds give 0.3-1.4), while a pipeline without flips or with a
   narrower scale range is caught (z-score above 3).
3. Training: a small CNN, 3 epochs with the learning rate annealed to 0 (cosine), from each loader (the same
   seed): both learn and end within 6 points. One run's accuracy moves by a few points with the seed; the
   augmentation itself is held to 1. and 2.

Skips (prints why, passes) without Debian's Fashion-MNIST."""
import gzip
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torchvision
import torchvision.transforms.functional as F
from PIL import Image
from torchvision import transforms

from tessera.data import ImagePipeline
from testutil import check

FM = "/usr/share/datasets/fashion-mnist"


def idx(name):
    with gzip.open(os.path.join(FM, name)) as f:
        raw = f.read()
    return np.frombuffer(raw, np.uint8, offset=16 if raw[3] == 3 else 8)


def export(split, count, out):
    images = idx(f"{split}-images-idx3-ubyte.gz").reshape(-1, 28, 28)
    labels = idx(f"{split}-labels-idx1-ubyte.gz")
    for i in range(count):
        d = os.path.join(out, f"{labels[i]}")
        os.makedirs(d, exist_ok=True)
        Image.fromarray(images[i]).save(os.path.join(d, f"{i:05d}.jpg"), quality=95)


if not os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz")):
    print(f"skip: no {FM} (Debian's dataset-fashion-mnist)")
    sys.exit(0)
T = tempfile.mkdtemp(prefix="ts_pytrain_")
TRAIN, TEST = os.path.join(T, "train"), os.path.join(T, "test")
export("train", 1200, TRAIN)
export("t10k", 400, TEST)
torch.set_num_threads(2)
BILINEAR = transforms.InterpolationMode.BILINEAR

# ---- 1. sample by sample -------------------------------------------------------------------------------------
# scale 400/784 with ratio 1: a 20 x 20 window at a random position of the 28 x 28 image, to 14 rows x 24 columns
WIN, OUT_H, OUT_W = 20, 14, 24
p = ImagePipeline(TRAIN, 50, image_size=(OUT_H, OUT_W), scale=(WIN * WIN / 784, WIN * WIN / 784), ratio=(1.0, 1.0),
                  mean=None, std=None, threads=2, seed=3)
worst, bad_labels, flips, xs, ys, n = 0.0, 0, 0, [], [], 0
for b, (x, y) in enumerate(p):
    if b == 4:
        break
    check(tuple(x.shape) == (50, 3, OUT_H, OUT_W), f"batch shape {tuple(x.shape)}")
    for k, i in enumerate(p.pipeline.indices()):
        path = p.pipeline.path(i)
        bad_labels += p.classes[int(y[k])] != os.path.basename(os.path.dirname(path))
        src = Image.open(path).convert("RGB")
        got = x[k].numpy().transpose(1, 2, 0) * 255
        best = None
        for top in range(28 - WIN + 1):
            for left in range(28 - WIN + 1):
                ref = F.resized_crop(src, top, left, WIN, WIN, [OUT_H, OUT_W], BILINEAR)
                for flip in (False, True):
                    r = np.asarray(F.hflip(ref) if flip else ref, np.float32)
                    d = float(np.abs(got - r).max())
                    if best is None or d < best[0]:
                        best = (d, left, top, flip)
        worst = max(worst, best[0])
        xs.append(best[1])
        ys.append(best[2])
        flips += best[3]
        n += 1
p.close()
print(f"sample by sample: {n} samples, largest difference from torchvision's {worst:.3f}/255, "
      f"flipped {flips}, window columns {sorted(set(xs))}, rows {sorted(set(ys))}")
check(bad_labels == 0, f"{bad_labels} labels are not their file's class")
check(worst <= 1.01, f"an augmented image is {worst:.3f}/255 from torchvision's resized_crop at every position")
check(0.35 * n < flips < 0.65 * n, f"{flips} of {n} samples flipped (probability 0.5)")
check(sorted(set(xs)) == list(range(28 - WIN + 1)) and sorted(set(ys)) == list(range(28 - WIN + 1)),
      f"window positions cover every offset: columns {sorted(set(xs))}, rows {sorted(set(ys))}")
check(abs(np.mean(xs) - 4) < 1 and abs(np.mean(ys) - 4) < 1, f"window positions centred: {np.mean(xs)}, {np.mean(ys)}")

# ---- 2. in distribution --------------------------------------------------------------------------------------
EPOCHS = 6


def pipeline_images(seed, **kw):
    q = ImagePipeline(TRAIN, 100, image_size=28, color="gray", mean=None, std=None, threads=2, seed=seed, **kw)
    out = np.concatenate([x.numpy()[:, 0].copy() for _ in range(EPOCHS) for x, _ in q])
    q.close()
    return out


def torchvision_images(seed):
    ds = torchvision.datasets.ImageFolder(TRAIN, transforms.Compose([
        transforms.Grayscale(), transforms.RandomResizedCrop(28), transforms.RandomHorizontalFlip(),
        transforms.ToTensor()]))
    torch.manual_seed(seed)  # the transforms' random numbers (num_workers=0: the main process's)
    g = torch.Generator()
    g.manual_seed(seed)
    dl = torch.utils.data.DataLoader(ds, 100, shuffle=True, generator=g)
    return np.concatenate([x.numpy()[:, 0] for _ in range(EPOCHS) for x, _ in dl])


def z2(a, b):
    """Mean over the features of the squared z-score of the difference of a's and b's means."""
    var = a.var(0) / len(a) + b.var(0) / len(b)
    return float(((a.mean(0) - b.mean(0)) ** 2 / np.maximum(var, 1e-10)).mean())


def distance(a, b):
    """(mean image, mean gradient-magnitude image) squared z-scores of two sets of augmented images: the first
    sees where windows fall and flips, the second how much they zoom (an enlarged window has softer edges)."""
    def grad(v):
        return (np.abs(np.diff(v, axis=2))[:, :-1, :] + np.abs(np.diff(v, axis=1))[:, :, :-1]).reshape(len(v), -1)
    return z2(a.reshape(len(a), -1), b.reshape(len(b), -1)), z2(grad(a), grad(b))


tv = torchvision_images(5)
ours = pipeline_images(5)
same = distance(ours, tv)
no_flip = distance(pipeline_images(5, flip=0.0), tv)
narrow = distance(pipeline_images(5, scale=(0.25, 1.0)), tv)
print(f"in distribution ({len(tv)} images each): squared z-scores (mean image, gradient image) ImagePipeline "
      f"{same[0]:.2f} {same[1]:.2f}; controls: without flips {no_flip[0]:.2f} {no_flip[1]:.2f}, "
      f"scale (0.25, 1) {narrow[0]:.2f} {narrow[1]:.2f}")
check(len(ours) == len(tv) == EPOCHS * 1200, f"{len(ours)} and {len(tv)} augmented images")
check(max(same) < 3, f"ImagePipeline's augmented images are distributed as torchvision's (z^2 {same})")
check(max(no_flip) > 3 and max(narrow) > 3, f"the comparison tells a changed augmentation ({no_flip}, {narrow})")

# ---- 3. training ---------------------------------------------------------------------------------------------
MEAN, STD = (0.5,), (0.5,)


def train_eval(train_batches, test_batches, seed, epochs=3, lr=0.05):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
    steps = epochs * len(train_batches)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    for _ in range(epochs):
        m.train()
        for x, y in train_batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            sched.step()
    m.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in test_batches:
            right += int((m(x).argmax(1) == y).sum())
            total += len(y)
    return right / total, total


common = dict(image_size=28, color="gray", mean=MEAN, std=STD, threads=2)
tr = ImagePipeline(TRAIN, 32, scale=(0.8, 1.0), seed=1, **common)
te = ImagePipeline(TEST, 100, train=False, crop_fraction=1.0, **common)
acc_ts, n_ts = train_eval(tr, te, 1)

gray = transforms.Grayscale()
tv_train = torchvision.datasets.ImageFolder(TRAIN, transforms.Compose([
    gray, transforms.RandomResizedCrop(28, scale=(0.8, 1.0)), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
    transforms.Normalize(MEAN, STD)]))
tv_test = torchvision.datasets.ImageFolder(TEST, transforms.Compose([gray, transforms.ToTensor(),
                                                                     transforms.Normalize(MEAN, STD)]))
g = torch.Generator()
g.manual_seed(1)
acc_tv, n_tv = train_eval(torch.utils.data.DataLoader(tv_train, 32, shuffle=True, generator=g),
                          torch.utils.data.DataLoader(tv_test, 100), 1)
print(f"test accuracy after 3 epochs on 1200 images: ImagePipeline {100 * acc_ts:.1f}%, "
      f"ImageFolder + DataLoader {100 * acc_tv:.1f}%")
check(n_ts == n_tv == 400, "both evaluated on the same 400 test images")
check(acc_ts > 0.6 and acc_tv > 0.6, "both loops learn (accuracy above 60%; 10% is chance)")
check(abs(acc_ts - acc_tv) < 0.06, f"within 6 points of each other ({100 * (acc_ts - acc_tv):+.1f})")
shutil.rmtree(T)
