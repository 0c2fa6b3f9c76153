#!/usr/bin/env python3
"""Per-kernel GPU time table from Nsight Compute's CSV (--metrics gpu__time_duration.sum --csv
--print-units base): milliseconds per step and launches per step by kernel name, where a step is one
launch of MARKER (a kernel that runs once per training step).

usage: kernel_table.py ncu FILE.csv MARKER [ROWS]
"""
import csv
import sys
from collections import defaultdict


def short(name):
    name = name.split("(")[0]
    return name if len(name) <= 70 else name[:67] + "..."


def main():
    _, fmt, path, marker = sys.argv[:4]
    rows = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    assert fmt == "ncu"
    with open(path) as f:
        lines = [ln for ln in f if ln.startswith('"')]
    t, n = defaultdict(float), defaultdict(int)
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        k = short(r["Kernel Name"])
        t[k] += float(r["Metric Value"].replace(",", "")) / 1e6
        n[k] += 1
    steps = max(1, sum(c for k, c in n.items() if k.startswith(marker)))
    total = sum(t.values()) / steps
    print(f"{steps} steps, {sum(n.values()) / steps:.0f} launches and {total:.2f} ms of kernels per step")
    for k in sorted(t, key=t.get, reverse=True)[:rows]:
        print(f"{t[k] / steps:9.3f} ms {100 * t[k] / steps / total:5.1f}% {n[k] / steps:6.1f}x  {k}")


if __name__ == "__main__":
    main()
