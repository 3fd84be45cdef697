#!/usr/bin/env python3
"""Per-kernel GPU time of one training step from an ncu CSV (scripts/gpu-session.sh stage `profile`).

The bench runs a warm-up step and a timed step; the step is everything after the warm-up's last AdamW launch.
Prints a markdown table: total ms per kernel name, launches, share of the step.
    python3 bench/kernel_profile.py profile.csv
"""
import collections
import csv
import io
import re
import signal
import sys


def main(path):
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError as e:
        sys.exit(f"{path}: cannot read: {e.strerror}")
    head = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if head is None:
        sys.exit(f"{path}: no ncu CSV header (\"ID\", ...) found")
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines[head:])))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    kernels = [(int(r["ID"]), r["Kernel Name"], float(r["Metric Value"].replace(",", ""))) for r in rows]
    adamw = [i for i, name, _ in kernels if "adamw" in name]
    # The warm-up step ends with its AdamW launches: the first run of consecutive ids.
    start = 0
    if adamw:
        start = adamw[0]
        for i in adamw[1:]:
            if i != start + 1:
                break
            start = i
    step = [(name, ns) for i, name, ns in kernels if i > start]
    total = sum(ns for _, ns in step) or 1.0
    by = collections.defaultdict(lambda: [0, 0.0])
    for name, ns in step:
        short = re.sub(r"\(.*", "", name)[:90]
        by[short][0] += 1
        by[short][1] += ns
    print(f"{len(step)} kernels, {total / 1e6:.2f} ms (each kernel alone: ncu serialises them)\n")
    print("| ms | launches | share | kernel |\n|--:|--:|--:|---|")
    for short, (n, ns) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {ns / 1e6:.3f} | {n} | {100 * ns / total:.1f}% | `{short}` |")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` is fine
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
