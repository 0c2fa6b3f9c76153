#!/usr/bin/env python3
"""Renders a few steps of a Tessera trace (tessera train --trace, merged with tessera trace merge) as a
PNG timeline: one row per (rank, lane), events as bars, nested events drawn thinner on top of their
parents, so the README can show what chrome://tracing / ui.perfetto.dev show. Needs matplotlib.

usage: python3 scripts/trace_png.py MERGED.json OUT.png [FIRST_STEP] [STEPS] [TITLE]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"step": "#dddddd", "data wait": "#f4d03f", "forward_backward": "#c8d6e5", "forward": "#54a0ff",
          "backward": "#ee5253", "allreduce wait": "#8395a7", "optimizer step": "#10ac84", "allreduce": "#5f27cd",
          "evaluate": "#ff9f43", "checkpoint": "#222f3e"}


def main():
    src, out = sys.argv[1], sys.argv[2]
    first = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    nsteps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    d = json.load(open(src))
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in d["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps = sorted((e for e in ev if e["name"] == "step" and e["pid"] == 0), key=lambda e: e["ts"])
    if len(steps) < first + nsteps:
        first = max(0, len(steps) - nsteps)
    t0 = steps[first]["ts"]
    t1 = steps[min(first + nsteps, len(steps)) - 1]["ts"] + steps[min(first + nsteps, len(steps)) - 1]["dur"]
    ev = [e for e in ev if e["ts"] + e["dur"] >= t0 and e["ts"] <= t1]
    lanes = sorted({(e["pid"], e["tid"]) for e in ev})
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(lanes) + 1.2))
    for row, lane in enumerate(lanes):
        mine = sorted((e for e in ev if (e["pid"], e["tid"]) == lane), key=lambda e: -e["dur"])
        for e in mine:  # depth = how many longer events of the lane contain it
            depth = sum(1 for o in mine if o is not e and o["ts"] <= e["ts"] and
                        o["ts"] + o["dur"] >= e["ts"] + e["dur"] and o["dur"] > e["dur"])
            h = 0.8 * (0.75 ** depth)
            ax.barh(row, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=h,
                    color=COLORS.get(e["name"], "#999999"), edgecolor="none")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {p}: {names.get((p, t), t)}" for p, t in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(0, (t1 - t0) / 1e3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for n, c in COLORS.items() if any(e["name"] == n for e in ev)]
    labels = [n for n in COLORS if any(e["name"] == n for e in ev)]
    ax.legend(handles, labels, ncol=(len(labels) + 1) // 2, loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=8,
              frameon=False)
    ax.set_title(f"{sys.argv[5] if len(sys.argv) > 5 else src}: steps {first}..{first + nsteps - 1}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
