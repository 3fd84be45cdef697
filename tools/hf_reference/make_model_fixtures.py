#!/usr/bin/env python3
"""Parity fixtures made by Hugging Face Transformers itself (run where transformers 5.17 + torch exist).

For several tiny random Qwen3-MoE / Qwen3 models this writes:
  <variant>/ckpt/                  save_pretrained() output, sharded (config.json, index, shards)
  <variant>/ckpt_bf16/             (first variant) the same weights saved in bf16
  <variant>/<batch>.safetensors    input_ids, labels, position_ids (packed batches), fp32 logits,
                                   grad.<param> for every parameter (in-memory v5 names)
  <variant>/after_adamw.safetensors  every parameter after one torch AdamW step on the "plain" batch
  <variant>/meta.json              losses (fp32 and bf16), versions, optimizer settings, router margins
  train5/                          5 AdamW steps on two packed sequences: train.jsonl, meta.json, final/ (HF ckpt)
Everything runs on the CPU in float32 unless stated (bf16 rows load the checkpoint with dtype=torch.bfloat16).
"""
import argparse
import json
import os
import shutil
import sys
import traceback

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

ADAMW_ONE_STEP = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
ADAMW_TRAIN5 = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)

BASE = {
    "vocab_size": 128, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "initializer_range": 0.3, "rope_theta": 10000.0,
    "hidden_act": "silu", "attention_dropout": 0.0, "use_sliding_window": False, "bos_token_id": 1,
    "eos_token_id": 2, "torch_dtype": "float32",
}

# name -> (architecture, overrides). Together they cover: norm_topk_prob on/off, mlp_only_layers,
# decoder_sparse_step > 1, tied/untied, head_dim != hidden/heads and missing head_dim, GQA/MHA/MQA,
# aux loss on/off, top-k == num_experts, hub (legacy) config spellings, and the dense Qwen3.
VARIANTS = [
    ("moe_gqa_aux", "Qwen3MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        output_router_logits=True, router_aux_loss_coef=0.02, mlp_only_layers=[1], decoder_sparse_step=1,
        tie_word_embeddings=False)),
    ("moe_mha_tied_sparse2", "Qwen3MoeForCausalLM", dict(num_experts=6, num_experts_per_tok=3,
        norm_topk_prob=False, output_router_logits=False, mlp_only_layers=[], decoder_sparse_step=2,
        num_hidden_layers=4, num_key_value_heads=4, head_dim=None, tie_word_embeddings=True)),
    ("moe_mqa_legacy", "Qwen3MoeForCausalLM", dict(num_experts=4, num_experts_per_tok=4, norm_topk_prob=True,
        output_router_logits=True, router_aux_loss_coef=0.001, mlp_only_layers=[], decoder_sparse_step=1,
        num_hidden_layers=2, num_key_value_heads=1, tie_word_embeddings=True)),
    ("dense_qwen3", "Qwen3ForCausalLM", dict(num_hidden_layers=2, tie_word_embeddings=True)),
]


def make_config(arch, overrides):
    d = dict(BASE)
    d.update(overrides)
    if d.get("head_dim", 0) is None:
        del d["head_dim"]
    d["architectures"] = [arch]
    if arch == "Qwen3MoeForCausalLM":
        d["model_type"] = "qwen3_moe"
        return Qwen3MoeConfig.from_dict(d), Qwen3MoeForCausalLM
    d["model_type"] = "qwen3"
    return Qwen3Config.from_dict(d), Qwen3ForCausalLM


def batches(vocab, gen):
    out = {}
    ids = torch.randint(0, vocab, (2, 10), generator=gen)
    labels = ids.clone()
    labels[0, :3] = -100
    labels[1, 7] = -100
    out["plain"] = dict(input_ids=ids, labels=labels)
    # Packed like DataCollatorWithFlattening: positions restart, the first label of each document is -100.
    lens = [6, 8]
    ids = torch.randint(0, vocab, (1, sum(lens)), generator=gen)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    labels = ids.clone()
    start = 0
    for n in lens:
        labels[0, start] = -100
        start += n
    out["packed"] = dict(input_ids=ids, labels=labels, position_ids=pos)
    ids = torch.randint(0, vocab, (2, 12), generator=gen)
    pos = torch.stack([torch.cat([torch.arange(5), torch.arange(7)]), torch.cat([torch.arange(3), torch.arange(9)])])
    labels = ids.clone()
    labels[0, 5] = -100
    labels[1, 3] = -100
    labels[1, 0] = -100
    out["packed2"] = dict(input_ids=ids, labels=labels, position_ids=pos)
    return out


class RouterMargin:
    """Smallest gap between the k-th and (k+1)-th router probability seen, so top-k ties would be noticed."""

    def __init__(self, model, k):
        self.k = k
        self.min_gap = float("inf")
        self.handles = []
        for name, mod in model.named_modules():
            if name.endswith("mlp.gate") and hasattr(mod, "weight"):
                self.handles.append(mod.register_forward_pre_hook(self.hook))

    def hook(self, mod, args):
        x = args[0].detach().double().reshape(-1, args[0].shape[-1])
        p = torch.softmax(x @ mod.weight.detach().double().t(), dim=-1)
        if self.k < p.shape[-1]:
            s = torch.sort(p, dim=-1, descending=True).values
            self.min_gap = min(self.min_gap, float((s[:, self.k - 1] - s[:, self.k]).min()))

    def remove(self):
        for h in self.handles:
            h.remove()


def ce_loss(logits, labels):
    z = logits.float()[:, :-1].reshape(-1, logits.shape[-1])
    y = labels[:, 1:].reshape(-1)
    n = int((y != -100).sum())
    return float(F.cross_entropy(z, y, ignore_index=-100, reduction="sum")) / max(n, 1), n


def run_batch(model, b):
    kw = {k: v for k, v in b.items()}
    kw["use_cache"] = False  # with a cache HF 5.17 skips the packed-document mask
    out = model(**kw)
    aux = getattr(out, "aux_loss", None)
    ce, n = ce_loss(out.logits.detach(), b["labels"])
    return out, dict(loss=float(out.loss), aux_loss=None if aux is None else float(aux), ce_loss=ce, tokens=n)


def perturb_norms(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))


def to_legacy_config(path):
    with open(path) as f:
        c = json.load(f)
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    if "num_local_experts" in c:
        c["num_experts"] = c.pop("num_local_experts")
    rp = c.pop("rope_parameters", None)
    if rp is not None:
        c["rope_theta"] = rp.get("rope_theta", 10000.0)
        c["rope_scaling"] = None
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def make_variant(out_dir, idx, name, arch, overrides):
    vdir = os.path.join(out_dir, name)
    shutil.rmtree(vdir, ignore_errors=True)
    os.makedirs(vdir)
    for attempt in range(20):
        seed = 1000 * (idx + 1) + attempt
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        config, cls = make_config(arch, overrides)
        model = cls(config).float()
        perturb_norms(model, gen)
        model.train()
        k = getattr(config, "num_experts_per_tok", 0) or 0
        margin = RouterMargin(model, k) if k else None
        bs = batches(config.vocab_size, gen)
        with torch.no_grad():
            for b in bs.values():
                model(**b, use_cache=False)
        gap = margin.min_gap if margin else float("inf")
        if gap > 1e-4:
            break
        print(f"{name}: seed {seed} has router gap {gap:.2e}, retrying", flush=True)
    print(f"{name}: seed {seed}, router gap {gap:.3e}, config {config.to_dict()}", flush=True)
    meta = dict(variant=name, architecture=arch, seed=seed, router_min_gap=gap if gap != float("inf") else None,
                transformers=transformers.__version__, torch=torch.__version__,
                adamw_one_step=dict(ADAMW_ONE_STEP, betas=list(ADAMW_ONE_STEP["betas"])), batches={})
    ckpt = os.path.join(vdir, "ckpt")
    model.save_pretrained(ckpt, max_shard_size="40KB")
    if name == "moe_mqa_legacy":
        to_legacy_config(os.path.join(ckpt, "config.json"))
    # Batches: fp32 forward + backward. "plain" goes last so its gradients feed the AdamW step.
    for bname in ["packed", "packed2", "plain"]:
        b = bs[bname]
        model.zero_grad(set_to_none=False)
        out, vals = run_batch(model, b)
        out.loss.backward()
        tensors = {k2: v.contiguous() for k2, v in b.items()}
        tensors["logits"] = out.logits.detach().float().contiguous()
        for pname, p in model.named_parameters():
            tensors["grad." + pname] = p.grad.detach().float().contiguous()
        save_file(tensors, os.path.join(vdir, bname + ".safetensors"), metadata={"format": "pt"})
        meta["batches"][bname] = dict(fp32=vals)
    opt = torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW_ONE_STEP)
    opt.step()
    save_file({n: p.detach().float().contiguous() for n, p in model.named_parameters()},
              os.path.join(vdir, "after_adamw.safetensors"), metadata={"format": "pt"})
    # Reload the saved checkpoint (checks it is self-consistent, and the legacy spelling loads) in fp32 and bf16.
    reload32 = cls.from_pretrained(ckpt, dtype=torch.float32)
    m16 = cls.from_pretrained(ckpt, dtype=torch.bfloat16)
    reload32.train()
    m16.train()
    with torch.no_grad():
        for bname, b in bs.items():
            _, v32 = run_batch(reload32, b)
            assert abs(v32["loss"] - meta["batches"][bname]["fp32"]["loss"]) < 1e-5, (bname, v32)
            out16, v16 = run_batch(m16, b)
            meta["batches"][bname]["bf16"] = v16
            if bname == "plain":
                save_file({"logits": out16.logits.detach().float().contiguous()},
                          os.path.join(vdir, "plain_bf16_logits.safetensors"), metadata={"format": "pt"})
    if idx == 0:
        m16.save_pretrained(os.path.join(vdir, "ckpt_bf16"), max_shard_size="40KB")
    with open(os.path.join(vdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return ckpt, cls


def make_train5(out_dir, ckpt, cls):
    """Five AdamW steps on two sequences packed into one micro-batch (constant lr, no clipping)."""
    tdir = os.path.join(out_dir, "train5")
    shutil.rmtree(tdir, ignore_errors=True)
    os.makedirs(tdir)
    gen = torch.Generator().manual_seed(77)
    seqs = []
    for n, prompt in [(9, 3), (7, 0)]:
        ids = torch.randint(0, 128, (n,), generator=gen).tolist()
        labels = [-100] * prompt + ids[prompt:]
        seqs.append(dict(input_ids=ids, labels=labels))
    with open(os.path.join(tdir, "train.jsonl"), "w") as f:
        for s in seqs:
            f.write(json.dumps(s) + "\n")
    # DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)
    ids, labels, pos = [], [], []
    for s in seqs:
        ids += s["input_ids"]
        labels += [-100] + s["labels"][1:]
        pos += list(range(len(s["input_ids"])))
    b = dict(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]), position_ids=torch.tensor([pos]))
    model = cls.from_pretrained(ckpt, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW_TRAIN5)
    steps = []
    for step in range(5):
        opt.zero_grad(set_to_none=False)
        out, vals = run_batch(model, b)
        out.loss.backward()
        opt.step()
        steps.append(vals)
        print("train5 step", step + 1, vals, flush=True)
    model.save_pretrained(os.path.join(tdir, "final"), max_shard_size="40KB")
    meta = dict(source="moe_gqa_aux/ckpt", adamw=dict(ADAMW_TRAIN5, betas=list(ADAMW_TRAIN5["betas"])),
                schedule="constant", max_grad_norm=0, packed=dict(input_ids=ids, labels=labels, position_ids=pos),
                steps=steps, transformers=transformers.__version__, torch=torch.__version__)
    with open(os.path.join(tdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    args = ap.parse_args()
    torch.set_num_threads(4)
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    first = None
    for idx, (name, arch, ov) in enumerate(VARIANTS):
        try:
            r = make_variant(args.out, idx, name, arch, ov)
            if idx == 0:
                first = r
        except Exception:
            failed += 1
            traceback.print_exc()
    try:
        if first:
            make_train5(args.out, *first)
    except Exception:
        failed += 1
        traceback.print_exc()
    print("model fixtures done, failures:", failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
