#!/usr/bin/env python3
"""Transformers' bf16 reference at realistic shapes, for the CUDA engine (tests/models/cuda/gpu_vs_transformers_test.cpp).

Runs on the GPU machine (Transformers 5.17, torch 2.11, one H100/H200). Writes into OUT:
  ckpt/                     a random Qwen3-MoE with Qwen3-30B-A3B's layer shapes (hidden 2048, 32/4 heads of
                            dim 128, 128 experts top-8, moe_intermediate 768, vocabulary 151,936, untied, aux loss
                            coef 0.001), sliced to LAYERS layers, saved in bf16 by save_pretrained
  batch.safetensors         one micro-batch: 1 x TOKENS packed documents (positions restart, the first label of
                            each document and every 11th label -100), random token ids
  bf16.safetensors          Transformers in bf16 (sdpa, grouped_mm, as a user trains): logits (bf16 [T, V]) and
                            grad.<param> (bf16, v5 in-memory names); router_logits_{bf16,fp32}.<layer> (fp32 [T, E])
                            of the bf16 and the fp32 run
  trajectory.safetensors    STEPS micro-batches (learnable: every document counts up from a random start)
  meta.json                 bf16 and fp32 loss / ce / aux; for every tensor the distance of Transformers' bf16 result
                            from its fp32 result (same weights, upcast; eager experts, sdpa in fp32): max-norm and
                            rel-L2 as tests/kernels/cuda/cuda_test_util.h defines them, and per-row logits errors;
                            the STEPS-step losses of pure-bf16 training (bf16 params and AdamW states, torch's fused
                            AdamW) and of fp32 training, both from the same checkpoint.
The fp32-vs-bf16 distances are Transformers' own bf16 rounding noise on this input: the test derives its tolerances from
them (tests/models/cuda/gpu_vs_transformers_test.cpp says how).
"""
import argparse
import json
import os
import shutil
import time

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

OPT = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
MAX_GRAD_NORM = 1.0


def config(layers):
    return Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, initializer_range=0.02,
        output_router_logits=True, router_aux_loss_coef=0.001, tie_word_embeddings=False,
        attention_dropout=0.0, use_sliding_window=False, bos_token_id=151643, eos_token_id=151645,
        architectures=["Qwen3MoeForCausalLM"])


def doc_lengths(total, gen, lo, hi):
    lens = []
    while sum(lens) < total:
        lens.append(min(int(torch.randint(lo, hi + 1, (1,), generator=gen)), total - sum(lens)))
    return lens


def make_batch(tokens, gen, vocab, counting):
    lens = doc_lengths(tokens, gen, 200, 1500)
    ids, pos, labels = [], [], []
    for n in lens:
        if counting:  # learnable: the document counts up from a random start
            start = int(torch.randint(0, vocab - n, (1,), generator=gen))
            d = list(range(start, start + n))
        else:
            d = torch.randint(0, vocab, (n,), generator=gen).tolist()
        ids += d
        pos += list(range(n))
        labels += [-100] + d[1:]  # DataCollatorWithFlattening: a document's first label is ignored
    for i in range(0, tokens, 11):
        labels[i] = -100
    t = lambda v: torch.tensor([v], dtype=torch.int64)
    return dict(input_ids=t(ids), labels=t(labels), position_ids=t(pos))


class RouterLogits:
    """Each MoE layer's router logits as the model computes them (F.linear of the gate's input in the model's dtype;
    top-k of their softmax = top-k of the logits), recorded in layer order."""

    def __init__(self, model):
        self.logits, self.handles = [], []
        for name, mod in model.named_modules():
            if name.endswith("mlp.gate") and hasattr(mod, "weight"):
                self.handles.append(mod.register_forward_pre_hook(self.hook))

    def hook(self, mod, args):
        x = args[0].detach()
        self.logits.append(torch.nn.functional.linear(x.reshape(-1, x.shape[-1]), mod.weight.detach()).float())

    def remove(self):
        for h in self.handles:
            h.remove()


def run(model, b):
    out = model(**{k: v.cuda() for k, v in b.items()}, use_cache=False)
    aux = float(out.aux_loss)
    loss = float(out.loss)
    return out, dict(loss=loss, aux_loss=aux, ce_loss=loss - model.config.router_aux_loss_coef * aux)


def err(got, want):
    """max-norm and rel-L2 of got against want (cuda_test_util.h's definitions), in float64 on the GPU."""
    g, w = got.double(), want.double()
    d = (g - w).abs()
    return dict(max_norm=float(d.max() / w.abs().max().clamp_min(1e-30)),
                rel_l2=float(d.norm() / w.norm().clamp_min(1e-30)))


def row_errors(got, want):
    """Per row (token) rel-L2 of the logits: the largest, and the 99th percentile."""
    g, w = got.double(), want.double()
    r = (g - w).norm(dim=-1) / w.norm(dim=-1).clamp_min(1e-30)
    return dict(max=float(r.max()), p99=float(torch.quantile(r.float(), 0.99)), mean=float(r.mean()))


def train(ckpt, dtype, batches, experts_impl):
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, experts_implementation=experts_impl).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), fused=True, **OPT)
    losses, norms = [], []
    for b in batches:
        opt.zero_grad(set_to_none=True)
        out, vals = run(model, b)
        out.loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)))
        opt.step()
        losses.append(vals["loss"])
    del model, opt
    torch.cuda.empty_cache()
    return losses, norms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    t0 = time.time()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    cfg = config(a.layers)
    torch.manual_seed(a.seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    ckpt = os.path.join(a.out, "ckpt")
    model.save_pretrained(ckpt)
    del model
    gen = torch.Generator().manual_seed(a.seed)
    batch = make_batch(a.tokens, gen, cfg.vocab_size, counting=False)
    save_file({k: v.contiguous() for k, v in batch.items()}, os.path.join(a.out, "batch.safetensors"))
    meta = dict(transformers=transformers.__version__, torch=torch.__version__, gpu=torch.cuda.get_device_name(),
                layers=a.layers, tokens=a.tokens, seed=a.seed, optimizer=dict(OPT, betas=list(OPT["betas"])),
                max_grad_norm=MAX_GRAD_NORM, schedule="constant")

    # bf16 as a user trains (dtype=bfloat16: sdpa attention, grouped_mm experts), then fp32 on the same weights.
    results, router = {}, {}
    for name, dtype, experts in [("bf16", torch.bfloat16, "grouped_mm"), ("fp32", torch.float32, "eager")]:
        m = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, experts_implementation=experts,
                                                 attn_implementation="sdpa").cuda()
        m.train()
        rec = RouterLogits(m)
        out, vals = run(m, batch)
        rec.remove()
        assert len(rec.logits) == a.layers, f"recorded {len(rec.logits)} router calls for {a.layers} layers"
        router[name] = rec.logits
        out.loss.backward()
        meta[name] = vals
        grads = {n: p.grad.detach() for n, p in m.named_parameters()}
        results[name] = (out.logits.detach()[0], grads)
        print(name, vals, f"{time.time() - t0:.0f}s", flush=True)
        del m, out
        torch.cuda.empty_cache()
    logits16, grads16 = results["bf16"]
    logits32, grads32 = results["fp32"]
    meta["noise"] = {"logits": err(logits16.float(), logits32), "logits_rows": row_errors(logits16.float(), logits32)}
    for n in grads16:
        meta["noise"]["grad." + n] = err(grads16[n].float(), grads32[n])
    tensors = {"logits": logits16.contiguous()}
    for l in range(a.layers):  # router logits per layer: bf16 run (bf16 values, stored as fp32) and fp32 run
        tensors[f"router_logits_bf16.{l}"] = router["bf16"][l].contiguous()
        tensors[f"router_logits_fp32.{l}"] = router["fp32"][l].contiguous()
    tensors.update({"grad." + n: g.contiguous() for n, g in grads16.items()})
    save_file(tensors, os.path.join(a.out, "bf16.safetensors"))
    del results, logits16, logits32, grads16, grads32, tensors
    torch.cuda.empty_cache()

    traj = [make_batch(a.tokens, gen, cfg.vocab_size, counting=True) for _ in range(a.steps)]
    save_file({f"{k}.{i}": v.contiguous() for i, b in enumerate(traj) for k, v in b.items()},
              os.path.join(a.out, "trajectory.safetensors"))
    l16, n16 = train(ckpt, torch.bfloat16, traj, "grouped_mm")
    print("bf16 trajectory", [round(x, 4) for x in l16], f"{time.time() - t0:.0f}s", flush=True)
    l32, n32 = train(ckpt, torch.float32, traj, "eager")
    print("fp32 trajectory", [round(x, 4) for x in l32], f"{time.time() - t0:.0f}s", flush=True)
    meta["trajectory"] = dict(bf16=l16, fp32=l32, bf16_grad_norm=n16, fp32_grad_norm=n32)
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"realistic fixture done in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
