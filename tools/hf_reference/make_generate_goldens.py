#!/usr/bin/env python3
"""Greedy generation goldens made by Hugging Face Transformers itself (run where transformers 5.17 + torch exist).

For every tiny fixture checkpoint tests/fixtures/qwen3_moe/<variant>/ckpt this writes
  <variant>/generate.json   {"prompts": [[ids]], "outputs": [[ids]], "max_new_tokens": 12, versions}
where outputs[i] are the tokens model.generate() appends to prompts[i] (the EOS that stopped it included, as
generate() returns it): fp32 on the CPU, do_sample=False, use_cache=True, max_new_tokens=12, the checkpoint's
generation_config (eos_token_id 2). Each prompt runs alone (batch 1, no padding).
tests/models/generate_test.cpp (GreedyEqualsTransformersGoldens) checks mixtune's KV-cache greedy decode against it.
The GPT-OSS, DeepSeek-V3 and Nemotron-H goldens (same format, prompts kept only when greedy decoding is unambiguous)
are made with the rest of those families' fixtures by make_family_fixtures.py --family F; tests/models/
gpt_oss_parity_test.cpp and deepseek_v3_generate_test.cpp read them.

Usage: make_generate_goldens.py [FIXTURES_DIR]   (default: tests/fixtures/qwen3_moe next to this script's repo)
"""
import argparse
import json
import os
import sys
import traceback

import torch
import transformers
from transformers import AutoModelForCausalLM

VARIANTS = ["moe_gqa_aux", "moe_mha_tied_sparse2", "moe_mqa_legacy", "dense_qwen3"]
# Fixed token ids (the fixture vocabulary is 128; id 2 is EOS, so it is kept out of the prompts).
PROMPTS = [
    [5, 17, 99, 3, 42, 7],
    [100, 64, 1, 27, 88, 9, 120, 33, 11, 56, 70],
]
MAX_NEW_TOKENS = 12


def make_variant(vdir):
    ckpt = os.path.join(vdir, "ckpt")
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.eval()
    outputs = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([p], dtype=torch.long)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 use_cache=True, max_new_tokens=MAX_NEW_TOKENS, num_beams=1,
                                 pad_token_id=model.generation_config.eos_token_id)
            outputs.append(out[0, len(p):].tolist())
    g = dict(prompts=PROMPTS, outputs=outputs, max_new_tokens=MAX_NEW_TOKENS,
             eos_token_id=model.generation_config.eos_token_id, transformers=transformers.__version__,
             torch=torch.__version__)
    with open(os.path.join(vdir, "generate.json"), "w") as f:
        json.dump(g, f, indent=2)
        f.write("\n")
    print(os.path.basename(vdir), "outputs", outputs, flush=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures", nargs="?", default=os.path.join(here, "..", "..", "tests", "fixtures", "qwen3_moe"))
    args = ap.parse_args()
    torch.set_num_threads(4)
    failed = 0
    for name in VARIANTS:
        try:
            make_variant(os.path.join(args.fixtures, name))
        except Exception:
            failed += 1
            traceback.print_exc()
    print("generate goldens done, failures:", failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
