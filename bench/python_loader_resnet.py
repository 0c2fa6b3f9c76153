#!/usr/bin/env python3
"""bench/python_loader_resnet.py — torchvision's ResNet-18 trained one epoch on Fashion-MNIST exported as JPEG folders,
fed once by tessera.data.ImagePipeline and once by torchvision's ImageFolder + transforms + DataLoader
(num_workers = --threads), the same model initialisation, optimiser and augmentation (RandomResizedCrop +
RandomHorizontalFlip + Normalize at 28x28, gray as 3 channels); prints both test accuracies and the epoch times
side by side. tests/python/test_pipeline_train.py is the test-sized version.

    build/tessera data export fashion-mnist --format jpeg --out /tmp/fm     # fm/{train,test}/<class>/*.jpg
    PYTHONPATH=build/python .pyvenv/bin/python3 bench/python_loader_resnet.py /tmp/fm --threads 2

Options: --epochs (1), --batch-size (64), --lr (0.05), --limit N (train on the first N batches only; 0: all).
"""
import argparse
import os
import time

import torch
import torchvision
from torchvision import transforms

import tessera.data

MEAN, STD = (0.286, 0.286, 0.286), (0.353, 0.353, 0.353)  # Fashion-MNIST's, per (repeated) channel


def model():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def run(train, test, epochs, lr, limit):
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    t0 = time.perf_counter()
    for _ in range(epochs):
        m.train()
        for i, (x, y) in enumerate(train):
            if limit and i >= limit:
                break
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    dt = time.perf_counter() - t0
    m.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in test:
            right += int((m(x).argmax(1) == y).sum())
            total += len(y)
    return right / total, dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="the exported folder (with train/ and test/)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    tr_dir, te_dir = os.path.join(a.root, "train"), os.path.join(a.root, "test")

    common = dict(image_size=28, mean=MEAN, std=STD, threads=a.threads)
    tr = tessera.data.ImagePipeline(tr_dir, a.batch_size, seed=1, **common)
    te = tessera.data.ImagePipeline(te_dir, 256, train=False, crop_fraction=1.0, **common)
    acc_ts, dt_ts = run(tr, te, a.epochs, a.lr, a.limit)

    rgb = transforms.Lambda(lambda im: im.convert("RGB"))
    tv_tr = torchvision.datasets.ImageFolder(tr_dir, transforms.Compose([
        rgb, transforms.RandomResizedCrop(28), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(MEAN, STD)]))
    tv_te = torchvision.datasets.ImageFolder(te_dir, transforms.Compose([
        rgb, transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    dl_tr = torch.utils.data.DataLoader(tv_tr, a.batch_size, shuffle=True, num_workers=a.threads)
    dl_te = torch.utils.data.DataLoader(tv_te, 256, num_workers=a.threads)
    acc_tv, dt_tv = run(dl_tr, dl_te, a.epochs, a.lr, a.limit)

    print(f"| loader | epochs | test accuracy | training seconds |\n|---|--:|--:|--:|")
    print(f"| tessera.data.ImagePipeline (threads={a.threads}) | {a.epochs} | {100 * acc_ts:.2f}% | {dt_ts:.0f} |")
    print(f"| ImageFolder + DataLoader (num_workers={a.threads}) | {a.epochs} | {100 * acc_tv:.2f}% | {dt_tv:.0f} |")
    print(f"difference: {100 * (acc_ts - acc_tv):+.2f} points (torch {torch.__version__}, "
          f"{len(tv_tr)} training images{f', first {a.limit} batches' if a.limit else ''})")


if __name__ == "__main__":
    main()
