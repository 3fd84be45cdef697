#!/usr/bin/env python3
"""Tabulates scripts/gpu-session.sh's gemm-algos stage: one mixtune_bench_projections JSON per heuristic rank
(gemm_algos_rankN.json, MIXTUNE_GEMM_ALGO_RANK=N). Per GEMM row: each rank's algorithm, ms per call at the boost
clock, sustained TFLOP/s and pJ/FLOP, and the rank with the fewest pJ/FLOP against rank 0 (the one training uses).

usage: bench/gemm_algos.py gemm_algos_rank0.json gemm_algos_rank1.json ...
The sustained energy of one row moves by 5-13% between calls (bench/NOTES.md 95): compare within a call, and
check a difference in the whole step (gpu-session stage mixtune-standard-algoN).
"""
import json
import re
import sys


def load(path):
    m = re.search(r"rank(\d+)\.json$", path)
    if not m:
        sys.exit(f"gemm_algos: {path}: expected a name ending in rankN.json")
    try:
        with open(path) as f:
            return int(m.group(1)), json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"gemm_algos: {path}: {e}")


def main(paths):
    if not paths:
        sys.exit(__doc__)
    runs = sorted(load(p) for p in paths)
    ops = [r["op"] for r in runs[0][1]["rows"]]
    print("| op | rank | algorithm | ms | sustained TFLOP/s | pJ/FLOP |")
    print("|---|--:|---|--:|--:|--:|")
    best = []
    for i, op in enumerate(ops):
        seen = set()
        rows = []
        for rank, j in runs:
            r = j["rows"][i]
            algo = r.get("algo", "?")
            key = algo.split(": ", 1)[-1]
            if key in seen:  # the heuristic offered fewer algorithms: the last one again
                continue
            seen.add(key)
            rows.append((rank, r))
            print(f"| {op} | {rank} | {key} | {r['ms']:.4f} | {r.get('sustained_tflops', 0):.1f} | "
                  f"{r.get('pj_per_flop', float('nan')):.3f} |")
        with_energy = [(r.get("pj_per_flop"), rank, r) for rank, r in rows if r.get("pj_per_flop")]
        if with_energy and rows[0][0] == 0 and rows[0][1].get("pj_per_flop"):
            pj, rank, r = min(with_energy, key=lambda t: t[0])
            base = rows[0][1]
            change = 100 * (pj / base["pj_per_flop"] - 1)
            best.append(f"| {op} | {base['pj_per_flop']:.3f} | {rank} | {pj:.3f} | {change:+.1f}% | "
                        f"{base['ms']:.4f} → {r['ms']:.4f} |")
    print()
    print("| op | rank 0 pJ/FLOP | fewest-joules rank | its pJ/FLOP | change | ms rank 0 → it |")
    print("|---|--:|--:|--:|--:|---|")
    for line in best:
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
