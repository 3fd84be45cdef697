"""Sustained dense bf16 GEMM rate on one GPU: 8192³ matmuls back to back for --seconds, the rate printed per
window, so a power- or thermally-capped clock shows up (a short burst runs at the boost clock).
Usage: python3 bench/sustained_gemm.py [--seconds 10] [--window 1.0] > sustained.json"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--n", type=int, default=8192)
    a = ap.parse_args()
    n = a.n
    x = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(n, n, dtype=torch.bfloat16, device="cuda")
    flop = 2.0 * n * n * n
    for _ in range(5):
        torch.matmul(x, w, out=y)
    torch.cuda.synchronize()
    windows, t_end = [], time.time() + a.seconds
    while time.time() < t_end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 0
        start.record()
        t0 = time.time()
        while time.time() - t0 < a.window:
            for _ in range(10):
                torch.matmul(x, w, out=y)
            reps += 10
            torch.cuda.synchronize()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop)
        windows.append({"t_s": round(time.time() - (t_end - a.seconds), 2), "reps": reps,
                        "tflops": round(flop * reps / (ms * 1e-3) / 1e12, 1)})
    print(json.dumps({"n": n, "device": torch.cuda.get_device_name(), "windows": windows}, indent=1))


if __name__ == "__main__":
    main()
