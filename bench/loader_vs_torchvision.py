#!/usr/bin/python3
"""bench/loader_vs_torchvision.py — the torchvision and DALI halves of bench/loader_vs_torchvision.sh.

  loader_vs_torchvision.py make-photos --out DIR      cut JPEG photographs (MATE's backgrounds,
                                                      Debian package mate-backgrounds) into
                                                      ImageNet-sized 500x375 crops, one folder per photo
  loader_vs_torchvision.py run DIR --threads T        images/s of torch.utils.data.DataLoader over
                                                      torchvision's ImageFolder with RandomResizedCrop,
                                                      RandomHorizontalFlip, ToTensor, Normalize — the
                                                      same work as `tessera bench loader`
  loader_vs_torchvision.py gpu-decode DIR --threads T images/s of torchvision's nvJPEG decoding
                           [--device cuda]            (torchvision.io.decode_jpeg on the GPU, batched) with the
                                                      random resized crop, flip and normalisation on the GPU:
                                                      the reference for `tessera bench loader --decode mixed`
  loader_vs_torchvision.py python DIR --threads T     images/s of tessera.data.ImagePipeline (the build's
                                                      python/ on PYTHONPATH), batches handed to torch
  loader_vs_torchvision.py dali DIR --threads T       images/s of an NVIDIA DALI CPU pipeline doing the
                                                      same: fn.readers.file (random_shuffle) ->
                                                      fn.decoders.image_random_crop (device="cpu") ->
                                                      fn.resize -> fn.crop_mirror_normalize with a
                                                      fn.random.coin_flip mirror, num_threads=T

Both print one JSON line with images/s and images per CPU-second (the CPU time of the process and, for
the DataLoader, of its worker processes: every thread counted, so the rate holds on a shared machine).
`run` needs Debian's python3-torch, python3-torchvision and python3-pil (TS_WITH_BENCH=1
scripts/install-deps; run it with /usr/bin/python3); `dali` needs `pip install nvidia-dali-cuda130`
(or another nvidia-dali wheel: its CPU pipelines run without a GPU).
"""
import argparse
import glob
import json
import os
import sys
import time


def make_photos(out, pattern, w, h, quality):
    from PIL import Image
    files = sorted(glob.glob(pattern, recursive=True))
    if not files:
        sys.exit(f"make-photos: no files match {pattern} (install mate-backgrounds)")
    n = 0
    for f in files:
        im = Image.open(f).convert("RGB")
        cls = os.path.join(out, os.path.splitext(os.path.basename(f))[0])
        os.makedirs(cls, exist_ok=True)
        k = 0
        for y in range(0, im.height - h + 1, h):
            for x in range(0, im.width - w + 1, w):
                im.crop((x, y, x + w, y + h)).save(os.path.join(cls, f"{k:04d}.jpg"), quality=quality)
                k += 1
        n += k
    print(f"make-photos: {n} crops of {w}x{h} from {len(files)} photographs in {out}")


def proc_cpu_seconds(pids):
    """User + system CPU seconds of this process (all threads) and of the live processes `pids`."""
    t = os.times()
    total = t.user + t.system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
        except OSError:
            pass
    return total


def data_root(root):
    return os.path.join(root, "train") if os.path.isdir(os.path.join(root, "train")) else root


def run(root, threads, batch, size, seconds, gray):
    import torch
    import torchvision.datasets as D
    import torchvision.transforms as T
    from PIL import Image
    torch.set_num_threads(1)
    root = data_root(root)
    mean, std = ([0.5], [0.25]) if gray else ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])

    def load(path):
        with open(path, "rb") as f:
            im = Image.open(f)
            return im.convert("L" if gray else "RGB")

    ds = D.ImageFolder(root, transform=tf, loader=load)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=threads,
                                     persistent_workers=threads > 0)
    it = iter(dl)
    next(it)  # warm-up batch (workers start), not timed
    pids = [w.pid for w in getattr(it, "_workers", [])]  # persistent workers: the same processes throughout
    images, batches, t0, c0 = 0, 0, time.perf_counter(), proc_cpu_seconds(pids)
    while time.perf_counter() - t0 < seconds:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(dl)
            continue
        images += len(y)
        batches += 1
    dt, cpu = time.perf_counter() - t0, proc_cpu_seconds(pids) - c0
    print(json.dumps({"framework": "torchvision", "torch": torch.__version__, "threads": threads,
                      "files": len(ds), "batch_size": batch, "size": size, "channels": 1 if gray else 3,
                      "images_per_second": round(images / dt, 1), "images_per_cpu_second": round(images / cpu, 1),
                      "batches": batches, "seconds": round(dt, 3)}))


def run_python(root, threads, batch, size, seconds, gray):
    """tessera.data.ImagePipeline (PYTHONPATH: the build's python/) with the same work, each batch handed to
    torch (torch.from_dlpack) and read there, as a training loop takes it."""
    import torch
    import tessera
    import tessera.data
    torch.set_num_threads(1)
    root = data_root(root)
    mean, std = ([0.5], [0.25]) if gray else ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    p = tessera.data.ImagePipeline(root, batch, image_size=size, threads=threads, color="gray" if gray else "rgb",
                                   mean=mean, std=std, shuffle="buffer", seed=1)
    it = iter(p)
    next(it)  # warm-up batch, not timed
    images, batches, t0, c0 = 0, 0, time.perf_counter(), proc_cpu_seconds([])
    while time.perf_counter() - t0 < seconds:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(p)
            continue
        assert isinstance(x, torch.Tensor) and x.dtype == torch.float32
        images += len(y)
        batches += 1
    dt, cpu = time.perf_counter() - t0, proc_cpu_seconds([]) - c0
    print(json.dumps({"framework": "tessera-python", "torch": torch.__version__, "threads": threads,
                      "files": p.dataset_size, "batch_size": batch, "size": size, "channels": 1 if gray else 3,
                      "images_per_second": round(images / dt, 1), "images_per_cpu_second": round(images / cpu, 1),
                      "batches": batches, "seconds": round(dt, 3)}))
    p.close()


def run_dali(root, threads, batch, size, seconds, gray):
    import nvidia.dali as dali
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    root = data_root(root)
    mean, std = ([0.5 * 255], [0.25 * 255]) if gray else ([0.485 * 255, 0.456 * 255, 0.406 * 255],
                                                          [0.229 * 255, 0.224 * 255, 0.225 * 255])

    @dali.pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=1)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.GRAY if gray else types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10)
        images = fn.resize(images, resize_x=size, resize_y=size)  # linear, antialiased when shrinking
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std,
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    p = pipe()
    p.build()
    files = p.epoch_size("reader")
    p.run()  # warm-up batch, not timed
    images, batches, t0, c0 = 0, 0, time.perf_counter(), proc_cpu_seconds([])
    while time.perf_counter() - t0 < seconds:
        x, y = p.run()
        images += len(y)
        batches += 1
    dt, cpu = time.perf_counter() - t0, proc_cpu_seconds([]) - c0
    print(json.dumps({"framework": "dali", "dali": dali.__version__, "threads": threads, "files": files,
                      "batch_size": batch, "size": size, "channels": 1 if gray else 3,
                      "images_per_second": round(images / dt, 1), "images_per_cpu_second": round(images / cpu, 1),
                      "batches": batches, "seconds": round(dt, 3)}))


def run_gpu_decode(root, threads, batch, size, seconds, gray, device):
    """torchvision's nvJPEG path beside `tessera bench loader --decode mixed`: files read on `threads` threads,
    torchvision.io.decode_jpeg(list, device=DEVICE) batched, then per image RandomResizedCrop's window
    (torchvision's own get_params) resized with antialiasing, a coin-flip mirror and the normalisation on the
    device, stacked into one (B, C, S, S) batch. Images/s counts batches finished on the device."""
    import concurrent.futures
    import random
    import torch
    import torchvision
    import torchvision.transforms.v2 as T
    import torchvision.transforms.v2.functional as F
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    root = data_root(root)
    files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")) + glob.glob(os.path.join(root, "*", "*.jpeg")))
    if not files:
        sys.exit(f"gpu-decode: no JPEG files under {root}")
    mean = torch.tensor([0.5] if gray else [0.485, 0.456, 0.406], device=device).view(-1, 1, 1) * 255
    std = torch.tensor([0.25] if gray else [0.229, 0.224, 0.225], device=device).view(-1, 1, 1) * 255
    rrc = T.RandomResizedCrop(size)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads)
    mode = ImageReadMode.GRAY if gray else ImageReadMode.RGB

    def augment(images):
        out = []
        for im in images:
            top, left, h, w = T.RandomResizedCrop.get_params(im, rrc.scale, rrc.ratio)
            x = F.resized_crop(im, top, left, h, w, [size, size], antialias=True)
            if random.random() < 0.5:
                x = F.horizontal_flip(x)
            out.append((x.float() - mean) / std)
        return torch.stack(out)

    def step():
        names = random.sample(files, batch) if len(files) >= batch else random.choices(files, k=batch)
        datas = list(pool.map(read_file, names))
        return augment(decode_jpeg(datas, mode=mode, device=device))

    step()  # warm-up (nvJPEG's handles), not timed
    if device != "cpu":
        torch.cuda.synchronize()
    images, batches, t0, c0 = 0, 0, time.perf_counter(), proc_cpu_seconds([])
    while time.perf_counter() - t0 < seconds:
        step()
        images += batch
        batches += 1
    if device != "cpu":
        torch.cuda.synchronize()
    dt, cpu = time.perf_counter() - t0, proc_cpu_seconds([]) - c0
    print(json.dumps({"framework": "torchvision-" + ("nvjpeg" if device != "cpu" else "cpu"),
                      "torch": torch.__version__, "torchvision": torchvision.__version__, "device": device,
                      "threads": threads, "files": len(files), "batch_size": batch, "size": size,
                      "channels": 1 if gray else 3, "images_per_second": round(images / dt, 1),
                      "images_per_cpu_second": round(images / cpu, 1), "batches": batches, "seconds": round(dt, 3)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mp = sub.add_parser("make-photos")
    mp.add_argument("--out", required=True)
    mp.add_argument("--glob", default="/usr/share/backgrounds/mate/**/*.jpg")
    mp.add_argument("--width", type=int, default=500)
    mp.add_argument("--height", type=int, default=375)
    mp.add_argument("--quality", type=int, default=90)
    for name in ("run", "python", "dali", "gpu-decode"):
        rp = sub.add_parser(name)
        if name == "gpu-decode":
            rp.add_argument("--device", default="cuda")
        rp.add_argument("root")
        rp.add_argument("--threads", type=int, default=1)
        rp.add_argument("--batch-size", type=int, default=64)
        rp.add_argument("--size", type=int, default=224)
        rp.add_argument("--seconds", type=float, default=4.0)
        rp.add_argument("--gray", action="store_true")
    a = ap.parse_args()
    if a.cmd == "make-photos":
        make_photos(a.out, a.glob, a.width, a.height, a.quality)
    elif a.cmd == "gpu-decode":
        run_gpu_decode(a.root, a.threads, a.batch_size, a.size, a.seconds, a.gray, a.device)
    else:
        {"run": run, "python": run_python, "dali": run_dali}[a.cmd](a.root, a.threads, a.batch_size, a.size, a.seconds, a.gray)


if __name__ == "__main__":
    main()
