#!/usr/bin/env python3
"""Can a memory-bound optimizer update hide under compute-bound GEMMs on one GPU at its power cap?

Times (CUDA events, PyTorch on the GPU machine): a run of bf16 GEMMs alone, a fused AdamW step over bf16
parameters/gradients/moments alone, and both at once — the GEMMs on a high-priority stream, the AdamW on a
low-priority one — each repeated ROUNDS times after a warm-up. Hidden fraction = (gemm + adamw − both) / adamw:
1 means the update cost nothing, 0 that the two just took turns. The GEMM shape defaults to the standard
workload's attention projection (4096 × 4096 × 2048); --n 8192 gives a dense square one.
    python3 bench/overlap_probe.py [--gemms 200] [--m 4096 --n 4096 --k 2048] [--adamw-gelems 1.0] [--rounds 3]
Prints one JSON object.
"""
import argparse
import json

import torch


def timed(stream_fns):
    """Runs each (stream, fn) pair's fn on its stream, all queued together; returns wall ms from first to last."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    cur = torch.cuda.current_stream()
    start.record(cur)
    ends = []
    for s, fn in stream_fns:
        s.wait_event(start)
        with torch.cuda.stream(s):
            fn()
            e = torch.cuda.Event()
            e.record(s)
            ends.append(e)
    for e in ends:
        cur.wait_event(e)
    end.record(cur)
    end.synchronize()
    return start.elapsed_time(end)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gemms", type=int, default=200)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--adamw-gelems", type=float, default=1.0, help="parameters updated, in units of 2^30")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for name in ("gemms", "m", "n", "k", "rounds"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be a positive integer, found {getattr(a, name)}")
    if not 0 < a.adamw_gelems <= 16:
        ap.error(f"--adamw-gelems must be in (0, 16], found {a.adamw_gelems}")

    dev = "cuda"
    x = torch.randn(a.m, a.k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(a.n, a.k, device=dev, dtype=torch.bfloat16)
    y = torch.empty(a.m, a.n, device=dev, dtype=torch.bfloat16)
    chunk = 64 << 20
    count = max(1, int(a.adamw_gelems * (1 << 30)) // chunk)
    params = [torch.nn.Parameter(torch.randn(chunk, device=dev, dtype=torch.bfloat16) * 0.02) for _ in range(count)]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    opt.step()  # creates the bf16 moments

    def gemms():
        for _ in range(a.gemms):
            torch.matmul(x, w.t(), out=y)

    def adamw():
        opt.step()

    lo, hi = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
    torch.cuda.synchronize()
    timed([(hi, gemms)]), timed([(lo, adamw)])  # warm-up
    rows = []
    for _ in range(a.rounds):
        g = timed([(hi, gemms)])
        o = timed([(lo, adamw)])
        b = timed([(hi, gemms), (lo, adamw)])
        rows.append({"gemm_ms": round(g, 3), "adamw_ms": round(o, 3), "both_ms": round(b, 3),
                     "hidden_fraction": round((g + o - b) / o, 3)})
    flop = 2.0 * a.m * a.n * a.k * a.gemms
    nbytes = sum(p.numel() for p in params) * 14  # read p, g, m, v; write p, m, v (bf16)
    print(json.dumps({"device": torch.cuda.get_device_name(), "gemm": [a.m, a.n, a.k], "gemms": a.gemms,
                      "gemm_tflops_alone": round(flop / (rows[-1]["gemm_ms"] * 1e-3) / 1e12, 1),
                      "adamw_params": sum(p.numel() for p in params),
                      "adamw_tbps_alone": round(nbytes / (rows[-1]["adamw_ms"] * 1e-3) / 1e12, 2),
                      "rounds": rows}, indent=1))


if __name__ == "__main__":
    main()
