#!/usr/bin/env python3
"""Per-kernel GPU time of one training step from an ncu CSV (scripts/gpu-session.sh stages `profile`, `profile-bytes`).

The bench runs a warm-up step and a timed step; the step is everything after the warm-up's last AdamW launch
(where the profile filtered AdamW out, everything after the first half of the launches).
Prints a markdown table: total ms per kernel name, launches, share of the step; with the DRAM byte metrics
(`profile-bytes`) also GB read and written per launch and the achieved TB/s. With --sequence N, the step's first N
launches in order instead (one layer's forward and backward tell which GEMM is which shape).
    python3 bench/kernel_profile.py profile.csv [--sequence N]
"""
import collections
import csv
import io
import re
import signal
import sys


def main(path, sequence=0):
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError as e:
        sys.exit(f"{path}: cannot read: {e.strerror}")
    head = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if head is None:
        sys.exit(f"{path}: no ncu CSV header (\"ID\", ...) found")
    metrics = collections.defaultdict(dict)  # id -> {metric: value}
    names = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines[head:]))):
        try:
            v = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        metrics[int(r["ID"])][r.get("Metric Name")] = v
        names[int(r["ID"])] = r["Kernel Name"]
    kernels = [(i, names[i], m) for i, m in sorted(metrics.items()) if "gpu__time_duration.sum" in m]
    adamw = [i for i, name, _ in kernels if "adamw" in name]
    # The warm-up step ends with its AdamW launches: the first run of consecutive ids.
    start = -1
    if adamw:
        start = adamw[0]
        for i in adamw[1:]:
            if i != start + 1:
                break
            start = i
    elif kernels:
        start = kernels[(len(kernels) - 1) // 2][0]  # filtered profile: two equal steps
    step = [(name, m) for i, name, m in kernels if i > start]
    total = sum(m["gpu__time_duration.sum"] for _, m in step) or 1.0
    if sequence:
        print(f"first {min(sequence, len(step))} of the step's {len(step)} launches, in order\n")
        print("| # | us | kernel |\n|--:|--:|---|")
        for n, (name, m) in enumerate(step[:sequence]):
            print(f"| {n} | {m['gpu__time_duration.sum'] / 1e3:.1f} | `{re.sub(r'[(].*', '', name)[:90]}` |")
        return
    with_bytes = all("dram__bytes_read.sum" in m for _, m in step) and step
    by = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for name, m in step:
        short = re.sub(r"\(.*", "", name)[:90]
        b = by[short]
        b[0] += 1
        b[1] += m["gpu__time_duration.sum"]
        b[2] += m.get("dram__bytes_read.sum", 0.0)
        b[3] += m.get("dram__bytes_write.sum", 0.0)
    print(f"{len(step)} kernels, {total / 1e6:.2f} ms (each kernel alone: ncu serialises them)\n")
    if with_bytes:
        print("| ms | launches | share | GB read / launch | GB written / launch | TB/s | kernel |")
        print("|--:|--:|--:|--:|--:|--:|---|")
    else:
        print("| ms | launches | share | kernel |\n|--:|--:|--:|---|")
    for short, (n, ns, rd, wr) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        if with_bytes:
            print(f"| {ns / 1e6:.3f} | {n} | {100 * ns / total:.1f}% | {rd / n / 1e9:.3f} | {wr / n / 1e9:.3f} | "
                  f"{(rd + wr) / ns / 1e3:.2f} | `{short}` |")
        else:
            print(f"| {ns / 1e6:.3f} | {n} | {100 * ns / total:.1f}% | `{short}` |")

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` is fine
    if len(sys.argv) == 4 and sys.argv[2] == "--sequence" and sys.argv[3].isdigit():
        main(sys.argv[1], int(sys.argv[3]))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
