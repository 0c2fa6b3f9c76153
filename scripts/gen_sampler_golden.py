#!/usr/bin/python3
"""
scripts/gen_sampler_golden.py — PyTorch reference index lists for Tessera's
distributed sampler (src/data/sampler.c, tests/test_sampler.c).

Regenerate (needs Debian's python3-torch; the tests never need torch):

    /usr/bin/python3 scripts/gen_sampler_golden.py

Use /usr/bin/python3 explicitly: a pyenv `python3` earlier on PATH has no torch.
The output is deterministic; a rerun with the same torch (1.13) rewrites an
identical file.

Output: tests/golden/sampler.tsg, in the TSGOLD1 format of scripts/gen_golden.py
(read by tests/golden_io.h). Records:

  "cases"        i32 (K, 7): one row per sampler case k:
                 [N, num_replicas, seed, epoch, shuffle, drop_last, num_samples]
  "data"         i32: the cases' index lists back to back, in case order: case k
                 takes num_replicas * num_samples entries, and rank r's list
                     list(DistributedSampler(range(N), num_replicas, rank=r,
                          shuffle, seed, drop_last)) after set_epoch(epoch)
                 starts r * num_samples entries into them.
  "perm"         i64 (P, 3): rows [n, seed, stride] for raw torch.randperm(n)
                 with torch.Generator().manual_seed(seed):
  "perm<p>/head" i32: the first 500 entries
  "perm<p>/tail" i32: the last 500 entries
  "perm<p>/every" i32: entries 0, stride, 2 stride, ...
  "perm<p>/hash" i64 (1): sum over i of mix(perm[i] + (i << 32)) modulo 2^64
                 (mix = the splitmix64 finaliser, tg_splitmix64 in golden_io.h),
                 stored as the two's-complement int64, which pins all n entries.

What was checked when this was written (torch 1.13, CPU): randperm(n) equals
    r = arange(n); for i in 0..n-2: z = g.random() % (n - i); swap(r[i], r[i + z])
with g.random() the next 32-bit output of the mt19937 that manual_seed(s)
initialises from s & 0xffffffff, for every n tried: 0..300, 1000, 4097, 65536,
100000, 2^24 + 1, and on both sides of 2^32 / 20 = 214748364 (where newer
torch releases switch to a 64-bit inside-out shuffle; 1.13 does not).
"""
import os
import sys

import numpy as np
import torch
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import write  # noqa: E402  (the TSGOLD1 writer)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "sampler.tsg")


def sampler_lists(n, replicas, seed, epoch, shuffle, drop_last):
    rows = []
    for rank in range(replicas):
        s = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        rows.append(list(s))
        assert len(rows[-1]) == len(s)
    return np.array(rows, dtype=np.int32).reshape(replicas, len(rows[0]) if rows else 0)


def cases():
    """(N, R, seed, epoch, shuffle, drop_last) combinations: the full cross product
    of replicas 1..8 and seeds {0, 1, 12345} x epochs 0..3 for tiny N (a third of
    it with drop_last)
    (N < R, N = R, N divisible by R and not, all occur), thinning as N grows so
    the file stays under ~300 KB."""
    seeds_epochs = [(s, e) for s in (0, 1, 12345) for e in range(4)]
    out = []
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 24, 31, 33):
        for r in range(1, 9):
            for drop in (False, True):
                out.append((n, r, 0, 0, False, drop))
                if n <= 17:
                    picks = seeds_epochs if not drop else seeds_epochs[(r + n) % 3::3]
                else:
                    picks = seeds_epochs[(r + drop) % 3::3]
                out += [(n, r, s, e, True, drop) for s, e in picks]
    for n in (63, 64, 100, 127, 200, 255, 256):
        for r in range(1, 9):
            drop = (r + n) % 2 == 1
            if r in (3, 8):
                out.append((n, r, 0, 0, False, drop))
            s, e = seeds_epochs[(r * 2 + drop + n) % 12]
            out.append((n, r, s, e, True, drop))
    for i, n in enumerate((997, 1000, 1024, 2047, 3001)):
        if n in (997, 1000):
            out.append((n, 3 + i, 0, 0, False, bool(i)))
        for j, r in enumerate((1 + i, 8 - i)):
            s, e = seeds_epochs[(5 * i + j) % 12]
            out.append((n, r, s, e, True, (i + j) % 2 == 1))
    return out


def mix64(x):
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def perm_records():
    recs, rows = [], []
    for p, (n, seed, stride) in enumerate([(100000, 0, 197), (100000, 12345, 211), (1000003, 7, 1999),
                                           (16777217, 3, 32771)]):
        g = torch.Generator()
        g.manual_seed(seed)
        perm = torch.randperm(n, generator=g).numpy()
        rows.append([n, seed, stride])
        recs.append(("perm%d/head" % p, perm[:500].astype(np.int32)))
        recs.append(("perm%d/tail" % p, perm[-500:].astype(np.int32)))
        recs.append(("perm%d/every" % p, perm[::stride].astype(np.int32)))
        with np.errstate(over="ignore"):
            v = perm.astype(np.uint64) + (np.arange(n, dtype=np.uint64) << np.uint64(32))
            h = int(mix64(v).sum(dtype=np.uint64))
        recs.append(("perm%d/hash" % p, np.array([h - (1 << 64) if h >= 1 << 63 else h], dtype=np.int64)))
    return [("perm", np.array(rows, dtype=np.int64))] + recs


def main():
    torch.set_num_threads(1)
    chunks, table, off = [], [], 0
    for n, r, s, e, sh, drop in cases():
        m = sampler_lists(n, r, s, e, sh, drop)
        table.append([n, r, s, e, int(sh), int(drop), m.shape[1]])
        chunks.append(m.reshape(-1))
        off += m.size
    recs = [("cases", np.array(table, dtype=np.int32)), ("data", np.concatenate(chunks))] + perm_records()
    print("%d sampler cases, %d indices" % (len(table), off))
    write(OUT, recs)


if __name__ == "__main__":
    main()
