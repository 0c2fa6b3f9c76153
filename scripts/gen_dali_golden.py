#!/usr/bin/env python3
"""
scripts/gen_dali_golden.py — golden sample streams for tests/test_pipeline.c, from NVIDIA DALI itself.

Runs DALI's real `fn.readers.file` (CPU pipelines: no GPU needed) over a folder of tiny files whose
content is their listing index, in the configurations the reader test covers (shard_id / num_shards,
stick_to_shard, pad_last_batch, random_shuffle + initial_fill + seed, shuffle_after_epoch, batch sizes
1..16, N up to 70000, three or more epochs), and writes what comes out:

    pip install nvidia-dali-cuda130            # or any nvidia-dali-* wheel
    python3 scripts/gen_dali_golden.py > tests/golden/dali_reader.txt

Output: a '#' header line naming DALI's package and version, then one line per stream:
N S shard_id B stick_to_shard pad_last_batch random_shuffle initial_fill shuffle_after_epoch seed
count ':' then `count` listing indices; an index followed by '|' ends an epoch. `seed` is the reader's
`seed` (the shuffling buffer's) with random_shuffle, `shuffle_after_epoch_seed` with
shuffle_after_epoch (the two exclude each other), unused (0) otherwise.

- The indices are the labels DALI returns (`files=` with `labels=` = listing position), in the order of
  the pipeline's batches (DALI's reader calls Loader::ReadOne(i == 0, i == B - 1) for i in [0, B));
  every sample's bytes are checked to hold the same index.
- Epoch ends: DALI has no per-sample epoch flag; its loader advances `consumer_epoch_` where
  IsEpochDepleted() && !ShouldPadBatch(is_end_of_batch), which a pipeline built with
  enable_checkpointing=True exposes after every batch (the reader's checkpoint holds that epoch and the
  number of samples returned since its start). The marks are placed by the rule "an epoch is the
  shard read in it (shard_id, or (shard_id + e) % S without stick_to_shard), padded up to a whole
  batch of ceil(N/S) samples with pad_last_batch" and every batch is checked against DALI's
  checkpoints: the number of epochs that ended in it and the position of the last one. (With
  checkpointing on, DALI reshuffles shuffle_after_epoch lists from the first order rather than from the
  previous epoch's, so the streams themselves come from pipelines without checkpointing; only the
  epoch marks are taken from the checkpointing run.)

Deterministic: a rerun with the same DALI version rewrites the identical file.
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np


def shard_start(i, S, n):
    return n * i // S


def configs():
    """The configurations (those of the C++ mirror this script replaced, plus shuffle_after_epoch_seed)."""
    out = []

    def num_samples(S, n):
        return -(-n // S)

    def add(n, S, shard, B, stick, pad, shuffle, fill, sae, seed, count):
        out.append(dict(n=n, S=S, shard=shard, B=B, stick=stick, pad=pad, shuffle=shuffle, fill=fill, sae=sae,
                        seed=seed, count=count))

    # Sharding, rotation and padding without shuffling: many (N, S), every shard, 3+ epochs.
    for n in (1, 2, 3, 5, 7, 10, 13, 16, 31, 50):
        for S in (1, 2, 3, 4, 7, 8):
            if S > n:
                continue
            for shard in range(S):
                for B in (1, 3, 4):
                    for stick in (0, 1):
                        for pad in (0, 1):
                            per_epoch = -(-num_samples(S, n) // B) * B
                            add(n, S, shard, B, stick, pad, 0, 1, 0, 0, 3 * per_epoch + 2)
    # The shuffling buffer (random_shuffle) and shuffle_after_epoch, with seeds.
    for n in (7, 20, 61):
        for S in (1, 2, 3):
            for shard in range(S):
                for fill in (1, 4, 16, 1024):
                    for pad in (0, 1):
                        for seed in (42, -1, 123456789012):
                            if seed != 42 and fill != 16:
                                continue
                            B = 4
                            per_epoch = -(-num_samples(S, n) // B) * B
                            add(n, S, shard, B, 0, pad, 1, fill, 0, seed, 3 * per_epoch)
    # shuffle_after_epoch: the seed column is shuffle_after_epoch_seed (524287 is DALI's default).
    for n in (5, 64, 150):
        for S in (1, 2, 4):
            for shard in range(S):
                for pad in (0, 1):
                    for seed in (524287, 0, -1, 123456789012):
                        if seed != 524287 and (n != 64 or pad):
                            continue
                        B = 8
                        per_epoch = -(-num_samples(S, n) // B) * B
                        add(n, S, shard, B, 0, pad, 0, 1, 1, seed, 3 * per_epoch)
    # A list larger than 65535 entries takes std::shuffle(mt19937)'s one-swap-per-draw path.
    add(70000, 1, 0, 1, 0, 0, 0, 1, 1, 524287, 50)
    add(70000, 3, 2, 16, 0, 0, 1, 8, 0, 7, 50)
    return out


def epoch_marks(c):
    """Positions (in the stream) of the samples that end an epoch, by the rule in the docstring."""
    n, S, B, count = c["n"], c["S"], c["B"], c["count"]
    stick = c["stick"] or c["sae"]
    marks, pos, e = [], 0, 0
    while True:
        if c["pad"]:
            length = -(-(-(-n // S)) // B) * B
        else:
            sh = c["shard"] if stick else (c["shard"] + e) % S
            length = shard_start(sh + 1, S, n) - shard_start(sh, S, n)
        pos += length
        if pos > count:
            return marks
        marks.append(pos - 1)
        e += 1


def parse_proto(buf):
    """A minimal protobuf wire-format reader: {field number: [values]} (varints and byte strings)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 2:
            ln, i = varint(buf, i)
            v, i = bytes(buf[i:i + ln]), i + ln
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        out.setdefault(field, []).append(v)
    return out


def varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def reader_states(ckpt):
    """{reader name: (consumer epoch, samples returned since the epoch's start)} from pipe.checkpoint()."""
    states = {}
    for op in parse_proto(ckpt).get(1, []):
        m = parse_proto(op)
        name = m[1][0].decode()
        if not name.startswith("r") or not name[1:].isdigit():
            continue
        snap = parse_proto(parse_proto(m[2][0])[1][0])
        states[name] = (snap.get(2, [0])[0], snap.get(3, [0])[0])
    return states


def run_group(group, files, checkpointing):
    """Runs one pipeline holding a reader per configuration (all of the same batch size B); returns,
    per configuration, the label stream and, with checkpointing, the (epoch, age) after every batch."""
    from nvidia.dali import fn, pipeline_def

    B = group[0]["B"]
    iters = max(-(-c["count"] // B) for c in group)

    @pipeline_def(batch_size=B, num_threads=1, device_id=None, seed=1, prefetch_queue_depth=1,
                  enable_checkpointing=checkpointing)
    def pipe():
        outs = []
        for j, c in enumerate(group):
            kw = dict(random_shuffle=True, initial_fill=c["fill"], seed=c["seed"]) if c["shuffle"] else {}
            if c["sae"]:
                kw = dict(shuffle_after_epoch_seed=c["seed"])
            data, label = fn.readers.file(files=files[:c["n"]], labels=list(range(c["n"])), name=f"r{j}",
                                          shard_id=c["shard"], num_shards=c["S"], stick_to_shard=bool(c["stick"]),
                                          pad_last_batch=bool(c["pad"]),
                                          shuffle_after_epoch=bool(c["sae"]), **kw)
            outs += [data, label]
        return tuple(outs)

    p = pipe()
    p.build()
    streams = [[] for _ in group]
    states = [[] for _ in group]
    for _ in range(iters):
        out = p.run()
        for j in range(len(group)):
            data, label = out[2 * j], out[2 * j + 1]
            for k in range(B):
                lab = int(np.array(label[k]).reshape(-1)[0])
                content = int(bytes(np.array(data[k])).decode())
                if content != lab:
                    sys.exit(f"gen_dali_golden: sample content {content} != label {lab}")
                streams[j].append(lab)
        if checkpointing:
            st = reader_states(p.checkpoint())
            for j in range(len(group)):
                states[j].append(st[f"r{j}"])
    del p
    return streams, states


def check_marks(c, marks, states):
    """The marks agree with DALI's checkpoints: per batch, how many epochs ended and where the last did."""
    B = c["B"]
    mset = set(marks)
    prev_epoch, prev_age = 0, 0
    for b, (epoch, age) in enumerate(states):
        lo, hi = b * B, (b + 1) * B
        if hi > c["count"]:
            break
        inside = [m for m in range(lo, hi) if m in mset]
        want_age = hi - 1 - inside[-1] if inside else prev_age + B
        if epoch - prev_epoch != len(inside) or age != want_age:
            sys.exit(f"gen_dali_golden: epoch marks disagree with DALI's checkpoint in batch {b} of {c}: "
                     f"DALI says epoch {epoch} age {age}, the rule says {prev_epoch + len(inside)} / {want_age}")
        prev_epoch, prev_age = epoch, age


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--files-dir", help="folder for the tiny sample files (default: a temporary one)")
    ap.add_argument("--group", type=int, default=48, help="readers per pipeline")
    a = ap.parse_args()
    import nvidia.dali
    pkg = next((d for d in ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110")
                if _has_dist(d)), "nvidia-dali")
    cs = configs()
    nmax = max(c["n"] for c in cs)
    tmp = None
    root = a.files_dir
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="dali_golden_")
        root = tmp.name
    os.makedirs(root, exist_ok=True)
    files = []
    for i in range(nmax):
        path = os.path.join(root, f"f{i}.bin")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(str(i).encode())
        files.append(path)

    results = [None] * len(cs)
    by_b = {}
    for i, c in enumerate(cs):
        by_b.setdefault(c["B"], []).append(i)
    for B, idx in sorted(by_b.items()):
        for g0 in range(0, len(idx), a.group):
            ids = idx[g0:g0 + a.group]
            group = [cs[i] for i in ids]
            streams, _ = run_group(group, files, False)
            cstreams, states = run_group(group, files, True)
            for i, c, s, cst, st in zip(ids, group, streams, cstreams, states):
                s = s[:c["count"]]
                if not c["sae"] and cst[:c["count"]] != s:
                    sys.exit(f"gen_dali_golden: checkpointing changed the stream of {c}")
                marks = epoch_marks(c)
                check_marks(c, marks, st)
                results[i] = (s, set(marks))
            print(f"gen_dali_golden: B={B}: {g0 + len(ids)}/{len(idx)} streams", file=sys.stderr)

    print(f"# DALI fn.readers.file sample streams: {pkg} {nvidia.dali.__version__} (CPU pipelines), "
          f"made by scripts/gen_dali_golden.py")
    for c, (s, marks) in zip(cs, results):
        head = " ".join(str(c[k]) for k in ("n", "S", "shard", "B", "stick", "pad", "shuffle", "fill", "sae", "seed",
                                               "count"))
        body = "".join(f" {v}{'|' if i in marks else ''}" for i, v in enumerate(s))
        print(f"{head} :{body}")
    if tmp:
        tmp.cleanup()


def _has_dist(name):
    try:
        from importlib.metadata import version
        version(name)
        return True
    except Exception:
        return False


if __name__ == "__main__":
    main()
