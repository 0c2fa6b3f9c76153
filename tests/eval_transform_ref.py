"""tests/eval_transform_ref.py OUTDIR: 20 images of varied sizes and aspect ratios (PNG, JPEG, one gray) and
torchvision's evaluation transform of each, for tests/test_eval_transform.c.

For every image and crop size S (224, and 32 for the small ones) it writes
  OUTDIR/<name>.<S>.f32   Compose([Resize(int(S / 0.875)), CenterCrop(S), ToTensor(), Normalize(ImageNet)])
                          of Image.open(path).convert("RGB"): 3 x S x S float32, C order
  OUTDIR/<name>.<S>.tv2   the same transform on a uint8 tensor (torchvision's tensor path, antialias=True:
                          what transforms.v2 does), rounded back to uint8 pixels, S x S x 3
and a manifest OUTDIR/list.txt of "path S" lines. The pixels are made by numpy: gradients, hard edges,
noise and flat areas, so rounding and the filter's edges are both exercised."""
import os
import sys

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as F

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# (width, height, format); every ratio from 1:10 to 10:1, odd sizes, sizes equal to or just around the
# resize targets (256, 36), and images smaller than the crop.
SIZES = [(500, 375, "png"), (375, 500, "png"), (256, 256, "png"), (224, 224, "png"), (257, 255, "png"),
         (640, 480, "jpg"), (480, 640, "jpg"), (1000, 100, "png"), (100, 1000, "png"), (299, 299, "png"),
         (800, 533, "jpg"), (37, 29, "png"), (29, 37, "png"), (36, 50, "png"), (33, 33, "png"),
         (31, 300, "png"), (300, 256, "png"), (1023, 767, "png"), (200, 150, "gray"), (120, 90, "jpg")]


def pixels(rng, w, h, channels):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.empty((h, w, channels))
    for c in range(channels):
        fx, fy = rng.uniform(0.5, 6.0, 2)
        img[..., c] = 127.5 + 90 * np.sin(fx * 2 * np.pi * x / w + c) * np.cos(fy * 2 * np.pi * y / h)
    # hard-edged blocks, some saturated, and noise
    for _ in range(6):
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        img[y0:y0 + rng.integers(1, h // 3 + 2), x0:x0 + rng.integers(1, w // 3 + 2)] = rng.choice([0, 255, 60])
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def main(out):
    rng = np.random.default_rng(20261128)
    lines = []
    for i, (w, h, fmt) in enumerate(SIZES):
        gray = fmt == "gray"
        px = pixels(rng, w, h, 1 if gray else 3)
        im = Image.fromarray(px[..., 0] if gray else px, "L" if gray else "RGB")
        path = os.path.join(out, f"img{i:02d}_{w}x{h}.{'jpg' if fmt == 'jpg' else 'png'}")
        if fmt == "jpg":
            im.save(path, quality=90)
        else:
            im.save(path)
        for S in [224] + ([32] if min(w, h) < 400 else []):
            rgb = Image.open(path).convert("RGB")
            tf = T.Compose([T.Resize(int(S / 0.875)), T.CenterCrop(S), T.ToTensor(), T.Normalize(MEAN, STD)])
            tf(rgb).numpy().astype(np.float32).tofile(f"{path}.{S}.f32")
            t = torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)
            t = F.center_crop(F.resize(t, int(S / 0.875), antialias=True), S)
            t.permute(1, 2, 0).contiguous().numpy().astype(np.uint8).tofile(f"{path}.{S}.tv2")
            lines.append(f"{path} {S}\n")
    with open(os.path.join(out, "list.txt"), "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main(sys.argv[1])
