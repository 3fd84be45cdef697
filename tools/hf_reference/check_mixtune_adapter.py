#!/usr/bin/env python3
"""Does PEFT load an adapter mixtune wrote, and compute what mixtune computes? (issue 39: "our saved adapter loads in
PEFT and gives our logits"; run where transformers 5.17 + peft + torch exist, CPU, float32.)

    check_mixtune_adapter.py --base CKPT --adapter DIR --data FILE.jsonl --logits MIXTUNE.npy [--merged DIR]

--logits: `mixtune score --model CKPT --adapter DIR --data FILE.jsonl --logits MIXTUNE.npy --dtype float32` (every
line of FILE.jsonl one length, so mixtune's logits are [B, S, V]). --merged: `mixtune merge --model CKPT --adapter
DIR --out MERGED`, compared with PEFT's merge_and_unload(). Exits 1 naming the failing check:
  logits    PeftModel.from_pretrained(base, DIR) logits vs mixtune's, max abs <= 1e-4
  merge     every tensor of merge_and_unload().state_dict() vs MERGED loaded by Transformers, max rel <= 1e-6
"""
import argparse
import json
import sys

import numpy as np
import torch
import transformers
from peft import PeftModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--merged")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.data) if line.strip()]
    ids = torch.tensor([r["input_ids"] for r in rows], dtype=torch.long)
    base = transformers.AutoModelForCausalLM.from_pretrained(a.base, dtype=torch.float32)
    base.train()  # as mixtune's fixtures (no dropout in these models)
    pm = PeftModel.from_pretrained(base, a.adapter)
    failed = []
    with torch.no_grad():
        got = pm(input_ids=ids, use_cache=False).logits.float()
    ours = torch.from_numpy(np.load(a.logits)).float().reshape(got.shape)
    err = float((got - ours).abs().max())
    print(f"logits: max abs {err:.3g} (limit 1e-4), peft {__import__('peft').__version__}, "
          f"transformers {transformers.__version__}")
    if not err <= 1e-4:
        failed.append("logits")
    if a.merged:
        merged = pm.merge_and_unload().state_dict()
        theirs = transformers.AutoModelForCausalLM.from_pretrained(a.merged, dtype=torch.float32).state_dict()
        worst, at = 0.0, ""
        for k, v in merged.items():
            if k not in theirs:
                failed.append(f"merge: {k} missing in {a.merged}")
                continue
            rel = float((theirs[k].double() - v.double()).abs().max() / v.double().abs().max().clamp_min(1e-30))
            if rel > worst:
                worst, at = rel, k
        print(f"merge: max rel {worst:.3g} at {at} (limit 1e-6)")
        if not worst <= 1e-6:
            failed.append("merge")
    if failed:
        print("FAILED:", ", ".join(failed))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
