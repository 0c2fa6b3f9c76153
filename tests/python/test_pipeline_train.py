"""tests/python/test_pipeline_train.py: a PyTorch training loop fed by tessera.data.ImagePipeline learns as well as the
same loop fed by torchvision's ImageFolder + transforms + DataLoader: a small CNN trained 3 epochs on 1,200
Fashion-MNIST images exported as JPEG folders, evaluated on 400 test images (each loop with its own evaluation
input: the pipeline's train=False, torchvision's ToTensor + Normalize). The test-sized version of
bench/python_loader_resnet.py. Skips (prints why, passes) without Debian's Fashion-MNIST."""
import gzip
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torchvision
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
export("train", 1200, os.path.join(T, "train"))
export("t10k", 400, os.path.join(T, "test"))
torch.set_num_threads(2)
MEAN, STD = (0.5,), (0.5,)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))


def train_eval(train_batches, test_batches, epochs=3):
    m = model()  # seeds torch: the same initial weights, and the DataLoader's shuffling after it
    opt = torch.optim.SGD(m.parameters(), lr=0.02, momentum=0.9)
    for _ in range(epochs):
        m.train()
        for x, y in train_batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    m.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in test_batches:
            right += int((m(x).argmax(1) == y).sum())
            total += len(y)
    return right / total, total


common = dict(image_size=28, color="gray", mean=MEAN, std=STD, threads=2)
tr = ImagePipeline(os.path.join(T, "train"), 32, scale=(0.8, 1.0), seed=1, **common)
te = ImagePipeline(os.path.join(T, "test"), 100, train=False, crop_fraction=1.0, **common)
acc_ts, n_ts = train_eval(tr, te)

gray = transforms.Grayscale()
tv_train = torchvision.datasets.ImageFolder(os.path.join(T, "train"), transforms.Compose([
    gray, transforms.RandomResizedCrop(28, scale=(0.8, 1.0)), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
    transforms.Normalize(MEAN, STD)]))
tv_test = torchvision.datasets.ImageFolder(os.path.join(T, "test"), transforms.Compose([
    gray, transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
acc_tv, n_tv = train_eval(torch.utils.data.DataLoader(tv_train, 32, shuffle=True),
                          torch.utils.data.DataLoader(tv_test, 100))
print(f"test accuracy after 3 epochs on 1200 images: ImagePipeline {100 * acc_ts:.1f}%, "
      f"ImageFolder + DataLoader {100 * acc_tv:.1f}%")
check(n_ts == n_tv == 400, "both evaluated on the same 400 test images")
check(acc_ts > 0.6 and acc_tv > 0.6, "both loops learn (accuracy above 60%; 10% is chance)")
check(abs(acc_ts - acc_tv) < 0.08, f"within 8 points of each other ({100 * (acc_ts - acc_tv):+.1f})")
shutil.rmtree(T)
