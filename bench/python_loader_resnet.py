#!/usr/bin/env python3
"""bench/python_loader_resnet.py — torchvision's ResNet-18 trained on Fashion-MNIST exported as JPEG folders, fed by
tessera.data.ImagePipeline and by torchvision's ImageFolder + transforms + DataLoader (num_workers = --threads), for
each of several seeds; prints every run's test accuracy and each loader's mean and spread over the seeds.
tests/python/test_pipeline_train.py is the test-sized version.

    build/tessera data export fashion-mnist --format jpeg --out /tmp/fm     # fm/{train,test}/<class>/*.jpg
    PYTHONPATH=build/python .pyvenv/bin/python3 bench/python_loader_resnet.py /tmp/fm --threads 2 --seed 1 2 3

Both loaders get the same recipe: RandomResizedCrop(28) + RandomHorizontalFlip + Normalize (Fashion-MNIST's mean
and std, gray as 3 channels), SGD (momentum 0.9, weight decay 5e-4, batch 64), evaluation on the 10,000 test
images untransformed. A seed sets the model's initialisation, the DataLoader's shuffling and augmentation
(its generator; its workers derive their seeds from it) and ImagePipeline's `seed` (shuffling and augmentation).

The learning rate follows a cosine from --lr to 0 over the run's steps (--schedule cosine, the default), not a
constant: with a constant rate the accuracy after the last step is that of one noisy iterate, and it moves by
several points from seed to seed (and from one batch to the next), so two loaders cannot be compared to half a
point with the seeds a run can afford; annealing to 0 makes the end accuracy a property of the data the model was
fed. --schedule constant gives the constant rate.

Options: --epochs (1), --batch-size (64), --lr (0.05), --limit N (train on the first N batches of each epoch
only; 0: all; the schedule spans the steps actually run), --seed S [S ...] (1), --loader both|tessera|torchvision.
"""
import argparse
import math
import os
import statistics
import time

import torch
import torchvision
from torchvision import transforms

import tessera.data

MEAN, STD = (0.286, 0.286, 0.286), (0.353, 0.353, 0.353)  # Fashion-MNIST's, per (repeated) channel


def run(train, test, seed, a):
    torch.manual_seed(seed)
    m = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    per_epoch = min(a.limit, len(train)) if a.limit else len(train)
    steps = a.epochs * per_epoch
    if a.schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        m.train()
        for i, (x, y) in enumerate(train):
            if i >= per_epoch:
                break
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            sched.step()
    dt = time.perf_counter() - t0
    m.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in test:
            right += int((m(x).argmax(1) == y).sum())
            total += len(y)
    return 100 * right / total, dt


def loaders(a, seed):
    tr_dir, te_dir = os.path.join(a.root, "train"), os.path.join(a.root, "test")
    if a.name == "tessera":
        common = dict(image_size=28, mean=MEAN, std=STD, threads=a.threads)
        return (tessera.data.ImagePipeline(tr_dir, a.batch_size, seed=seed, **common),
                tessera.data.ImagePipeline(te_dir, 256, train=False, crop_fraction=1.0, **common))
    rgb = transforms.Lambda(lambda im: im.convert("RGB"))
    tv_tr = torchvision.datasets.ImageFolder(tr_dir, transforms.Compose([
        rgb, transforms.RandomResizedCrop(28), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(MEAN, STD)]))
    tv_te = torchvision.datasets.ImageFolder(te_dir, transforms.Compose([
        rgb, transforms.ToTensor(), transforms.Normalize(MEAN, STD)]))
    g = torch.Generator()
    g.manual_seed(seed)
    return (torch.utils.data.DataLoader(tv_tr, a.batch_size, shuffle=True, num_workers=a.threads, generator=g),
            torch.utils.data.DataLoader(tv_te, 256, num_workers=a.threads))


def spread(v):
    return f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="the exported folder (with train/ and test/)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--seed", type=int, nargs="+", default=[1])
    ap.add_argument("--loader", choices=("both", "tessera", "torchvision"), default="both")
    a = ap.parse_args()
    names = {"tessera": f"tessera.data.ImagePipeline (threads={a.threads})",
             "torchvision": f"ImageFolder + DataLoader (num_workers={a.threads})"}
    which = ["tessera", "torchvision"] if a.loader == "both" else [a.loader]
    acc = {n: [] for n in which}
    print("| loader | seed | test accuracy | training seconds |\n|---|--:|--:|--:|", flush=True)
    for seed in a.seed:
        for n in which:
            a.name = n
            tr, te = loaders(a, seed)
            v, dt = run(tr, te, seed, a)
            acc[n].append(v)
            print(f"| {names[n]} | {seed} | {v:.2f}% | {dt:.0f} |", flush=True)
    steps = f"first {a.limit} batches of each epoch" if a.limit else "every batch"
    print(f"\n{a.epochs} epoch(s), {steps}, lr {a.lr} {a.schedule}, seeds {' '.join(map(str, a.seed))}, "
          f"torch {torch.__version__}: test accuracy mean ± standard deviation over the seeds")
    for n in which:
        print(f"  {names[n]}: {spread(acc[n])}%")
    if len(which) == 2:
        d = [t - v for t, v in zip(acc["tessera"], acc["torchvision"])]
        print(f"  difference (ImagePipeline - ImageFolder): {statistics.mean(d):+.2f} points"
              + (f" (per seed {' '.join(f'{x:+.2f}' for x in d)})" if len(d) > 1 else ""))


if __name__ == "__main__":
    main()
