#!/usr/bin/env python3
"""Checks mixtune's outputs with Transformers itself (run on the GPU machine, CPU math in fp32).

1. `mixtune convert` of each fixture checkpoint (same dtype, and to bf16) loads in Transformers and gives the
   same logits as the source checkpoint loaded by Transformers (bit-identical weights expected).
2. A larger random checkpoint written by `mixtune init` loads in Transformers; `mixtune score` on it matches
   Transformers' loss (1e-5 relative) and logits (1e-4 absolute), plain and packed rows.
usage: verify_mixtune.py MIXTUNE_BINARY FIXTURES_DIR WORK_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def sh(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{args}: {r.stderr.strip()}")
    return r.stdout


def hf_logits(path, ids, pos=None, dtype=torch.float32):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    m.eval()
    with torch.no_grad():
        kw = dict(input_ids=ids, labels=ids, use_cache=False)
        if pos is not None:
            kw["position_ids"] = pos
        out = m(**kw)
    return out


def main():
    binary, fixtures, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    failures = 0
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(5))
    for v in ["moe_gqa_aux", "moe_mha_tied_sparse2", "moe_mqa_legacy", "dense_qwen3"]:
        src = os.path.join(fixtures, v, "ckpt")
        for dt, tdt in [(None, torch.float32), ("bfloat16", torch.bfloat16)]:
            out = os.path.join(work, f"{v}_{dt or 'same'}")
            args = [binary, "convert", "--in", src, "--out", out] + (["--dtype", dt] if dt else [])
            sh(*args)
            a = hf_logits(src, ids, dtype=tdt).logits.float()
            b = hf_logits(out, ids, dtype=tdt).logits.float()
            d = float((a - b).abs().max())
            ok = d == 0.0
            failures += not ok
            print(f"convert {v} dtype={dt or 'same'}: HF loads it, max |logits diff| vs source = {d:.3g}",
                  "OK" if ok else "FAIL", flush=True)
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 4096,
           "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "num_experts": 16,
           "num_experts_per_tok": 4, "norm_topk_prob": True, "output_router_logits": True,
           "router_aux_loss_coef": 0.01, "mlp_only_layers": [2], "decoder_sparse_step": 1, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "tie_word_embeddings": False, "initializer_range": 0.05,
           "max_position_embeddings": 4096, "hidden_act": "silu", "torch_dtype": "float32"}
    cfg_path = os.path.join(work, "big_config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    big = os.path.join(work, "big")
    sh(binary, "init", "--config", cfg_path, "--seed", "7", big)
    g = torch.Generator().manual_seed(9)
    rows = torch.randint(0, 4096, (3, 96), generator=g)
    pos = torch.cat([torch.arange(40), torch.arange(56)]).unsqueeze(0)
    for name, ids2, p in [("plain", rows, None), ("packed", rows[:1], pos)]:
        data = os.path.join(work, f"big_{name}.jsonl")
        with open(data, "w") as f:
            for r in range(ids2.shape[0]):
                rec = {"input_ids": ids2[r].tolist()}
                if p is not None:
                    rec["position_ids"] = p[r].tolist()
                f.write(json.dumps(rec) + "\n")
        npy = os.path.join(work, f"big_{name}.npy")
        got = json.loads(sh(binary, "score", "--model", big, "--data", data, "--logits", npy))
        out = hf_logits(big, ids2, p)
        ref_loss = float(out.loss)
        rel = abs(got["loss"] - ref_loss) / abs(ref_loss)
        dl = float(np.abs(np.load(npy) - out.logits.float().numpy()).max())
        ok = rel <= 1e-5 and dl <= 1e-4
        failures += not ok
        print(f"score big {name}: mixtune loss {got['loss']:.7f} (aux {got['aux_loss']:.6f}) vs Transformers "
              f"{ref_loss:.7f} (aux {float(out.aux_loss):.6f}): rel {rel:.2e}; max |logits diff| {dl:.2e}",
              "OK" if ok else "FAIL", flush=True)
    print("verify failures:", failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
