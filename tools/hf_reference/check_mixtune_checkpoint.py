#!/usr/bin/env python3
"""Does Transformers load a checkpoint mixtune trained, and compute the loss mixtune's scorer computes? (the
dsv3-recipe stage of scripts/gpu-session.sh; run where transformers 5.17 + torch exist, CPU, float32.)

    check_mixtune_checkpoint.py --binary MIXTUNE --model DIR --work DIR [--rows 2] [--seq 32] [--vocab N]
                                [--seed 1] [--router-gap 1e-5] [--expect-bias-moved]

Rows of random token ids (below --vocab: the tokenizer's size, default the model's; labels -100 on a few) are
drawn from --seed on; with a DeepSeek-V3 model a draw is replaced until no routing decision on it (group choice or
top-k, on the biased sigmoid scores: dsv3_reference.RouterProbe) is within --router-gap, since a near-tie
would make the fp32 comparison arbitrary. The default 1e-5 is looser than the verifiers' 1e-4, which 64 experts
rarely meet over many tokens, and by an estimate still ~40 times what two fp32 summation orders move a score here (a
router logit of O(1) summed over 2048 products, relative error ~1e-6, times sigmoid' <= 1/4). Then
`mixtune score --model DIR --dtype float32 --logits` on the same rows against Transformers' fp32 forward (its default
attention, the experts on the per-expert loop). Exits 1 naming the
failing check:
  loss      rel <= 1e-5
  logits    max abs <= 1e-4
  bias      (--expect-bias-moved) every MoE layer's e_score_correction_bias holds a nonzero element: the
            auxiliary-loss-free update ran (the checkpoint came from zero biases)
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dsv3_reference as D  # noqa: E402  (RouterProbe, the per-expert loop)

LOSS_REL, LOGITS_ABS = 1e-5, 1e-4


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=0, help="ids below this (default: the model's vocab_size)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--router-gap", type=float, default=1e-5)
    ap.add_argument("--tries", type=int, default=30)
    ap.add_argument("--expect-bias-moved", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    m = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                          experts_implementation=D.EXPERTS)
    m = D.eager_experts(m)
    m.eval()
    cfg = m.config
    vocab = a.vocab or cfg.vocab_size
    dsv3 = cfg.model_type == "deepseek_v3"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; {type(m).__name__}, "
          f"{sum(p.numel() for p in m.parameters())} parameters, {cfg.num_hidden_layers} layers; "
          f"attention {getattr(cfg, '_attn_implementation', None)}, "
          f"experts {getattr(cfg, '_experts_implementation', None)}",
          flush=True)
    failed = []
    for attempt in range(a.tries):
        gen = torch.Generator().manual_seed(a.seed + attempt)
        ids = torch.randint(0, vocab, (a.rows, a.seq), generator=gen)
        labels = ids.clone()
        labels[0, :3] = -100
        probe = D.RouterProbe(torch, m, cfg) if dsv3 else None
        with torch.no_grad():
            out = m(input_ids=ids, labels=labels, use_cache=False)
        gap = math.inf
        if probe:
            probe.remove()
            gap = probe.min_gap
        if gap > a.router_gap:
            break
        print(f"rows of seed {a.seed + attempt}: routing gap {gap:.2e} <= {a.router_gap:g}, redrawn", flush=True)
    else:
        failed.append("rows")
        print(f"rows: no draw in {a.tries} with every routing gap above {a.router_gap:g}")
    if probe:
        print(f"rows of seed {a.seed + attempt}: routing gap {gap:.3g} over {probe.tokens} routed tokens "
              f"(the bias moves {probe.bias_flips} of them; a 0.0 group mask would move {probe.mask_flips})")
    data = os.path.join(a.work, "check.jsonl")
    with open(data, "w") as f:
        for r in range(a.rows):
            f.write(json.dumps({"input_ids": ids[r].tolist(), "labels": labels[r].tolist()}) + "\n")
    npy = os.path.join(a.work, "mixtune-logits.npy")
    r = subprocess.run([a.binary, "score", "--model", a.model, "--data", data, "--dtype", "float32", "--logits", npy],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"mixtune score exit {r.returncode}: {r.stderr.strip()[-400:]}")
        print("FAILED: score")
        sys.exit(1)
    got = json.loads(r.stdout)
    ref_loss = float(out.loss)
    rel = abs(got["loss"] - ref_loss) / abs(ref_loss)
    mine = np.load(npy)
    ref = out.logits.float().numpy()
    err = float(np.abs(mine - ref).max()) if mine.shape == ref.shape else math.inf
    print(f"loss: mixtune {got['loss']:.7f} vs Transformers {ref_loss:.7f}, rel {rel:.2e} (limit {LOSS_REL:g})")
    print(f"logits {list(ref.shape)}: max abs {err:.3g} (limit {LOGITS_ABS:g})"
          + ("" if mine.shape == ref.shape else f"; mixtune's shape {list(mine.shape)}"))
    if not rel <= LOSS_REL:
        failed.append("loss")
    if not err <= LOGITS_ABS:
        failed.append("logits")
    biases = {n: b for n, b in m.named_buffers() if n.endswith("e_score_correction_bias")}
    if biases:
        stats = [f"{n.split('.')[2]}: max |b| {float(b.abs().max()):.4g}, {int((b != 0).sum())}/{b.numel()} nonzero"
                 for n, b in biases.items()]
        print("e_score_correction_bias per MoE layer: " + "; ".join(stats))
    if a.expect_bias_moved and (not biases or any(int((b != 0).sum()) == 0 for b in biases.values())):
        failed.append("bias")
    if failed:
        print("FAILED:", ", ".join(failed))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
