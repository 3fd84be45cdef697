"""What NCCL gives PyTorch for mixtune's EP exchanges on this machine (the reference for mixtune's probe).

  torchrun --nproc-per-node 2 bench/nccl_probe.py [--rows 4096] [--hidden 2048]

Times 20 back-to-back all_gather_into_tensor ([rows, hidden] bf16 per rank) and reduce_scatter_tensor
([ranks·rows, hidden] -> [rows, hidden]) calls with CUDA events, each burst twice: right after the host
queues it (host-paced) and queued behind a GPU sleep (the GPU's time alone). Rank 0 prints one JSON line.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def burst(fn, behind_sleep):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if behind_sleep:
        torch.cuda._sleep(40_000_000)  # ~20 ms at ~2 GHz: longer than queueing 20 calls
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    host_ms = (time.perf_counter() - t0) * 1e3 / 20
    e1.record()
    torch.cuda.synchronize()
    return {"ms_per_call": e0.elapsed_time(e1) / 20, "host_enqueue_ms_per_call": host_ms}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2048)
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    x = torch.randn(a.rows, a.hidden, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(world * a.rows, a.hidden, device="cuda", dtype=torch.bfloat16)
    remote = (world - 1) * x.numel() * 2
    out = {"ranks": world, "rows": a.rows, "hidden": a.hidden, "remote_bytes_per_call": remote,
           "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    for name, fn in (("all_gather", lambda: dist.all_gather_into_tensor(y, x)),
                     ("reduce_scatter", lambda: dist.reduce_scatter_tensor(x, y))):
        paced, alone = burst(fn, False), burst(fn, True)
        out[name] = {"host_paced": paced, "gpu_paced": alone,
                     "gpu_paced_gb_per_s": remote / (alone["ms_per_call"] * 1e-3) / 1e9}
    if rank == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
