#!/usr/bin/env python3
"""Tabulates scripts/gpu-session.sh's gemm-algos stage: one mixtune_bench_projections JSON per heuristic rank
(gemm_algos_rankN.json, MIXTUNE_GEMM_ALGO_RANK=N). Per GEMM row: each rank's algorithm, ms per call at the boost
clock, sustained TFLOP/s and pJ/FLOP, and the rank with the fewest pJ/FLOP against rank 0 (the one training uses).

usage: bench/gemm_algos.py gemm_algos_rank0.json gemm_algos_rank1.json ...
       bench/gemm_algos.py --pick-env MIN_GAIN_PCT FILES...
The second form prints MIXTUNE_GEMM_ALGO_RANKS's value ("MxNxK=rank,..."): for each GEMM the rank with the fewest
pJ/FLOP, averaged over the files of each rank (gemm_algos_rankN[_roundR].json), where it beats rank 0 by at least
MIN_GAIN_PCT percent.
"""
import json
import re
import sys


def load(path):
    m = re.search(r"rank(\d+)(_round\d+)?\.json$", path)
    if not m:
        sys.exit(f"gemm_algos: {path}: expected a name ending in rankN.json or rankN_roundR.json")
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
            best.append(f"| {op} | {base['pj_per_flop']:.3f} | {rank} | {pj:.3f} | {100 * (pj / base['pj_per_flop'] - 1):+.1f}% | "
                        f"{base['ms']:.4f} → {r['ms']:.4f} |")
    print()
    print("| op | rank 0 pJ/FLOP | fewest-joules rank | its pJ/FLOP | change | ms rank 0 → it |")
    print("|---|--:|--:|--:|--:|---|")
    for line in best:
        print(line)


def pick_env(min_gain_pct, paths):
    runs = [load(p) for p in paths]
    pj = {}  # (op, m, n, k) -> rank -> [pJ/FLOP per file]
    for rank, j in runs:
        for r in j["rows"]:
            if r.get("pj_per_flop"):
                pj.setdefault((r["op"], r["m"], r["n"], r["k"]), {}).setdefault(rank, []).append(r["pj_per_flop"])
    picks = []
    for (op, m, n, k), by_rank in pj.items():
        mean = {rank: sum(v) / len(v) for rank, v in by_rank.items()}
        if 0 not in mean:
            continue
        rank = min(mean, key=mean.get)
        gain = 100 * (1 - mean[rank] / mean[0])
        print(f"{op}: rank 0 {mean[0]:.3f} pJ/FLOP, rank {rank} {mean[rank]:.3f} ({gain:+.1f}% fewer)", file=sys.stderr)
        pick = f"{m}x{n}x{k}={rank}"
        if rank != 0 and gain >= min_gain_pct and pick not in picks:
            picks.append(pick)
    print(",".join(picks))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--pick-env":
        if len(sys.argv) < 4:
            sys.exit(__doc__)
        pick_env(float(sys.argv[2]), sys.argv[3:])
    else:
        main(sys.argv[1:])
