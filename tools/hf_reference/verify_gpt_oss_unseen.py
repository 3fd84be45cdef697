#!/usr/bin/env python3
"""GPT-OSS checkpoints made by Transformers itself, of shapes the fixtures do not have, checked against mixtune.

Run on the GPU machine (torch 2.11, transformers 5.17; all the math on the CPU, fp32 unless stated):
    verify_gpt_oss_unseen.py MIXTUNE_BINARY WORK_DIR [--random N] [--seed S] [--only NAME ...]
    verify_gpt_oss_unseen.py --list [--random N] [--seed S]     # the variants and their checks; no torch needed

Each variant is a GptOssConfig the fixtures (tests/fixtures/gpt_oss, make_family_fixtures.py) do not cover: other
head counts and head dims (MHA, GQA, MQA, head_dim x heads != hidden), expert counts and top-k (1 and all experts),
windows (1 key to wider than the rows), layer_types patterns (full first, all sliding, all full, default), RoPE
(default, YaRN with and without truncation, an explicit attention_factor, mscale / mscale_all_dim), tied and untied
embeddings, the router aux loss on and off, stored in float32, bfloat16 or MXFP4 (experts as _blocks/_scales),
and one config.json in the hub's spellings. The fixed variants below are followed by --random N drawn from --seed.

Transformers builds each model (GptOssForCausalLM(config), then biases, sinks and norms perturbed and the
experts scaled as make_family_fixtures.perturb does, so that every code path is live) and writes it with
save_pretrained. Transformers cannot write MXFP4 here (its quantizer needs the `kernels` package, absent on the
GPU machines and unreachable offline), so the MXFP4 variant is quantised with make_family_fixtures.mxfp4_quantize,
as the fixture's ckpt_mxfp4 was, and Transformers loads it with Mxfp4Config(dequantize=True). A seed is redrawn
until no top-k decision of the stored model on the test rows is within 1e-4 (a near-tie would make the fp32
comparison arbitrary). Checks per variant:
  score-fp32         `mixtune score --dtype float32 --logits` on 2 rows of 32 tokens (labels -100 on a few) vs
                     Transformers' fp32 forward of the stored checkpoint: loss rel <= 1e-5, logits max abs <= 1e-4
  score-bf16         (INFO: reported, not counted) the same in bf16 on both sides against the CPU parity tests'
                     bounds, loss rel <= 1e-2 and logits rel L2 <= 2e-2: both round at the same points but sum in
                     other orders, and a bf16 router logit can tie or flip where the fp32 one does not
  convert            `mixtune convert` keeping the dtype (MXFP4: to bf16, as convert writes it), loaded by
                     Transformers: the same tensor names, every tensor and the logits identical to Transformers'
                     load of the source
  convert-<dtype>    `mixtune convert --dtype` to the other float dtype: identical to Transformers' own cast of
                     the source at load
  finetune           one `mixtune finetune` step (CPU engine, float32; AdamW lr 1e-3, betas (0.9, 0.95), eps 1e-8,
                     weight decay 0.01 on every parameter; constant lr; no clipping) on one 32-token row vs one
                     torch.optim.AdamW step of Transformers' fp32 model on the same row: step loss rel <= 1e-5;
                     every weight abs <= 1e-5, except where torch's gradient is nonzero and below 1e-6 (Adam divides
                     by |g| + eps, so those elements are ill-conditioned: held to 2 x lr); every parameter tensor
                     with nonzero gradients must keep at least half of them well-conditioned, so that each tensor is
                     really compared (the share of ill-conditioned elements is reported)
  finetune-pad-row   (variant pad_token_in_data only) the same with the config's pad_token_id among the row's
                     tokens: Transformers' nn.Embedding(padding_idx=pad_token_id) gives that row no gradient
Prints a PASS/FAIL table (INFO rows: within the bounds or not, never a failure) and WORK_DIR/results.json; exit
status 0 when every counted check passed, 1 otherwise, 2 on a usage error. Each variant's files stay in
WORK_DIR/<variant>/.
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import verify_harness as H  # noqa: E402  (command line, check loop, table)
from verify_harness import same_models, sh, write_jsonl, yaml_float  # noqa: E402,F401
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "fixtures", "gpt_oss"))
# Transformers' per-expert loop: its bf16 grouped_mm refuses expert widths whose strides are not multiples of
# 16 bytes ("strides should be multiple of 16 bytes"), which several variants have; the loop is the definition.
EXPERTS = "eager"


def eager_experts(model):
    """`model` on the per-expert loop (EXPERTS), whichever backend its construction or load chose."""
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(EXPERTS)
    return model


SEQ = 32          # tokens per row: longer than every fixed window, a multiple of 8 (finetune rounds rows up to 8)
ROWS = 2          # score rows
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
TOL = dict(loss_rel=1e-5, logits_abs=1e-4, bf16_loss_rel=1e-2, bf16_logits_rel_l2=2e-2, step_abs=1e-5,
           ill_grad=1e-6, ill_tensor_share=0.5, router_gap=1e-4)
STORAGE = ("float32", "bfloat16", "mxfp4")
INFO_CHECKS = ("score-bf16",)  # reported with their bounds, not counted in the exit status

# Every variant's config starts from these (the fixtures' conventions: bos 1, eos 2, pad 0).
BASE = dict(rms_norm_eps=1e-5, initializer_range=0.2, attention_bias=True, attention_dropout=0.0,
            max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            router_aux_loss_coef=0.02, output_router_logits=True, tie_word_embeddings=False)

S, F = "sliding_attention", "full_attention"
# (name, GptOssConfig keywords over BASE, storage, options). Options: legacy (rewrite config.json with the hub's
# spellings), pad_in_data (the finetune row holds pad_token_id: the finetune-pad-row check).
FIXED = [
    ("mha_window3_full_first_yarn_truncate",
     dict(vocab_size=160, hidden_size=48, num_attention_heads=6, num_key_value_heads=6, head_dim=8,
          num_local_experts=6, num_experts_per_tok=2, intermediate_size=24, num_hidden_layers=3, sliding_window=3,
          layer_types=[F, S, S], router_aux_loss_coef=0.05,
          rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, beta_fast=16.0, beta_slow=2.0,
                               original_max_position_embeddings=512, truncate=True)),
     "float32", {}),
    ("gqa3_tied_top1_all_sliding_default_rope",
     dict(vocab_size=200, hidden_size=64, num_attention_heads=6, num_key_value_heads=2, head_dim=12,
          num_local_experts=8, num_experts_per_tok=1, intermediate_size=40, num_hidden_layers=4, sliding_window=5,
          layer_types=[S, S, S, S], tie_word_embeddings=True, output_router_logits=False,
          rope_parameters=dict(rope_type="default", rope_theta=5000.0)),
     "bfloat16", {}),
    ("mqa_wide_heads_all_experts_all_full_attention_factor",
     dict(vocab_size=120, hidden_size=40, num_attention_heads=5, num_key_value_heads=1, head_dim=24,
          num_local_experts=5, num_experts_per_tok=5, intermediate_size=20, num_hidden_layers=2, sliding_window=7,
          layer_types=[F, F], router_aux_loss_coef=0.9,
          rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=16.0, beta_fast=32.0, beta_slow=1.0,
                               original_max_position_embeddings=1024, truncate=False, attention_factor=1.2)),
     "float32", {}),
    ("mxfp4_default_layer_types_yarn_mscale",
     dict(vocab_size=144, hidden_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
          num_local_experts=6, num_experts_per_tok=3, intermediate_size=64, num_hidden_layers=3, sliding_window=8,
          rope_parameters=dict(rope_type="yarn", rope_theta=50000.0, factor=4.0, beta_fast=24.0, beta_slow=1.5,
                               mscale=1.0, mscale_all_dim=0.7, original_max_position_embeddings=2048)),
     "mxfp4", {}),
    ("hub_spellings_window1_bf16",
     dict(vocab_size=96, hidden_size=56, num_attention_heads=4, num_key_value_heads=2, head_dim=14,
          num_local_experts=3, num_experts_per_tok=2, intermediate_size=28, num_hidden_layers=2, sliding_window=1,
          layer_types=[S, F], router_aux_loss_coef=0.9),
     "bfloat16", {"legacy": True}),
    ("pad_token_in_data",
     dict(vocab_size=112, hidden_size=36, num_attention_heads=3, num_key_value_heads=3, head_dim=10,
          num_local_experts=4, num_experts_per_tok=1, intermediate_size=18, num_hidden_layers=2, sliding_window=40,
          layer_types=[S, F], pad_token_id=7),
     "float32", {"pad_in_data": True}),
]


# ---------------------------------------------------------------------------------------------------------------
# Variants (pure Python: --list works without torch)

def variant(name, config, storage, options=None):
    cfg = dict(BASE)
    cfg.update(config)
    return dict(name=name, config=cfg, storage=storage, legacy=bool((options or {}).get("legacy")),
                pad_in_data=bool((options or {}).get("pad_in_data")))


def random_variants(n, seed):
    """n random configs from a seeded generator, each valid (problems() empty) and unlike every fixture."""
    rng = random.Random(seed)
    fixtures = fixture_signatures()
    out = []
    while len(out) < n:
        kv = rng.choice([1, 2, 3, 4])
        heads = kv * rng.choice([1, 2, 3])
        layers = rng.randint(1, 4)
        experts = rng.randint(2, 9)
        if rng.random() < 0.5:
            rope = dict(rope_type="default", rope_theta=rng.choice([1e4, 5e4, 1.5e5]))
        else:
            rope = dict(rope_type="yarn", rope_theta=rng.choice([1e4, 1.5e5]), factor=float(rng.choice([2, 4, 8, 32])),
                        beta_fast=float(rng.choice([8, 16, 32])), beta_slow=float(rng.choice([1, 2])),
                        original_max_position_embeddings=rng.choice([64, 256, 4096]),
                        truncate=rng.random() < 0.5)
        cfg = dict(vocab_size=rng.randint(96, 320), hidden_size=rng.choice([24, 32, 40, 48, 64, 72, 96]),
                   num_attention_heads=heads, num_key_value_heads=kv, head_dim=rng.choice([4, 6, 8, 12, 16, 20]),
                   num_local_experts=experts, num_experts_per_tok=rng.randint(1, min(experts, 4)),
                   intermediate_size=rng.choice([8, 12, 16, 24, 36, 48]), num_hidden_layers=layers,
                   sliding_window=rng.randint(1, 12), tie_word_embeddings=rng.random() < 0.5,
                   output_router_logits=rng.random() < 0.5, router_aux_loss_coef=rng.choice([0.01, 0.1, 0.9]),
                   rope_parameters=rope)
        if rng.random() < 0.7:
            cfg["layer_types"] = [rng.choice([S, F]) for _ in range(layers)]
        v = variant(f"random{seed}_{len(out)}", cfg, rng.choice(["float32", "bfloat16"]))
        if not problems(v) and signature(v["config"]) not in fixtures:
            out.append(v)
    return out


def all_variants(n_random, seed):
    return [variant(*f) for f in FIXED] + random_variants(n_random, seed)


def signature(c):
    """The shapes that tell two GPT-OSS configs apart (config.json keys, either spelling)."""
    return (c.get("hidden_size"), c.get("num_attention_heads"), c.get("num_key_value_heads"), c.get("head_dim"),
            c.get("num_local_experts", c.get("num_experts")), c.get("num_experts_per_tok", c.get("experts_per_token")),
            c.get("intermediate_size"), c.get("sliding_window"))


def fixture_signatures():
    sigs = set()
    if os.path.isdir(FIXTURES):
        for v in sorted(os.listdir(FIXTURES)):
            path = os.path.join(FIXTURES, v, "ckpt", "config.json")
            if os.path.isfile(path):
                with open(path) as f:
                    sigs.add(signature(json.load(f)))
    return sigs


def layer_types_of(c):
    n = c["num_hidden_layers"]
    return c.get("layer_types") or [S if (i + 1) % 2 else F for i in range(n)]  # Transformers' default rule


def problems(v):
    """What would make a variant invalid for Transformers or mixtune (empty: fine)."""
    c, out = v["config"], []
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        out.append("num_attention_heads not a multiple of num_key_value_heads")
    if c["head_dim"] % 2:
        out.append("head_dim odd (RoPE rotates halves)")
    if not 1 <= c["num_experts_per_tok"] <= c["num_local_experts"]:
        out.append("num_experts_per_tok outside [1, num_local_experts]")
    if c.get("layer_types") is not None and len(c["layer_types"]) != c["num_hidden_layers"]:
        out.append("layer_types length != num_hidden_layers")
    if c["sliding_window"] < 1:
        out.append("sliding_window < 1")
    if not 0 <= c["pad_token_id"] < c["vocab_size"] or c["vocab_size"] < 8:
        out.append("vocabulary too small for the special ids")
    if v["storage"] not in STORAGE:
        out.append(f"storage {v['storage']!r} not one of {STORAGE}")
    if v["storage"] == "mxfp4" and (c["hidden_size"] % 32 or c["intermediate_size"] % 32):
        out.append("MXFP4 needs hidden_size and intermediate_size multiples of 32 (one scale per 32 inputs)")
    return out


def checks_of(v):
    other = {"float32": "bfloat16", "bfloat16": "float32", "mxfp4": "float32"}[v["storage"]]
    names = ["score-fp32", "score-bf16", "convert", f"convert-{other}", "finetune"]
    return names + (["finetune-pad-row"] if v["pad_in_data"] else [])


def describe(v):
    c = v["config"]
    rope = c.get("rope_parameters") or {"rope_type": "yarn (GPT-OSS default)"}
    rope_text = rope["rope_type"] + "".join(f" {k}={rope[k]}" for k in ("factor", "truncate", "attention_factor",
                                                                         "mscale_all_dim") if k in rope)
    types = "".join("S" if t == S else "F" for t in layer_types_of(c))
    return (f"H {c['hidden_size']}, heads {c['num_attention_heads']}/{c['num_key_value_heads']}x{c['head_dim']}, "
            f"E {c['num_local_experts']} top-{c['num_experts_per_tok']}, I {c['intermediate_size']}, "
            f"layers {types} window {c['sliding_window']}, rope {rope_text}, "
            f"{'tied' if c['tie_word_embeddings'] else 'untied'}, aux {'on' if c['output_router_logits'] else 'off'}, "
            f"vocab {c['vocab_size']}, {v['storage']}" + (", hub spellings" if v["legacy"] else ""))


def print_list(variants):
    fixtures = fixture_signatures()
    bad = 0
    for v in variants:
        p = problems(v) + (["same shapes as a fixture"] if signature(v["config"]) in fixtures else [])
        bad += bool(p)
        print(f"{v['name']}: {describe(v)}\n    checks: {', '.join(checks_of(v))}"
              + (f"\n    INVALID: {'; '.join(p)}" if p else ""))
    print(f"{len(variants)} variants, {sum(len(checks_of(v)) for v in variants)} checks; fixtures read: "
          f"{len(fixtures)} ({FIXTURES})" + (f"; {bad} invalid" if bad else ""))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------------------------
# Helpers

def legacy_config(path):
    """config.json rewritten with the spellings of openai/gpt-oss-* hub checkpoints (hf-numerics.md §1.2, §4.1)."""
    with open(path) as f:
        c = json.load(f)
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    rp = dict(c.pop("rope_parameters", None) or {})
    if rp:
        c["rope_theta"] = rp.pop("rope_theta", 150000.0)
        c["rope_scaling"] = rp
    c["num_experts"] = c.pop("num_local_experts")
    c["experts_per_token"] = c["num_experts_per_tok"]
    c["swiglu_limit"] = 7.0
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def rows_for(v, gen, torch):
    """(score rows [ROWS, SEQ] with labels, finetune row [1, SEQ] with labels): ids avoid pad_token_id except in
    the pad_in_data variant's finetune row, which holds it three times."""
    c = v["config"]
    vocab, pad = c["vocab_size"], c["pad_token_id"]

    def ids(n):
        x = torch.randint(0, vocab - 1, (n, SEQ), generator=gen)
        return x + (x >= pad).long()  # every id but pad

    score_ids = ids(ROWS)
    score_labels = score_ids.clone()
    score_labels[0, :4] = -100
    score_labels[1, SEQ // 2] = -100
    ft_ids = ids(1)
    if v["pad_in_data"]:
        ft_ids[0, [3, 11, 20]] = pad
    ft_labels = ft_ids.clone()
    ft_labels[0, :5] = -100
    return (score_ids, score_labels), (ft_ids, ft_labels)


class Variant:
    """One variant's checkpoint and rows, made by Transformers, and its references."""

    def __init__(self, v, work, torch, transformers, fx):
        self.v, self.torch, self.tf, self.fx = v, torch, transformers, fx
        self.dir = os.path.join(work, v["name"])
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.make()

    # -- the checkpoint under test
    def make(self):
        torch, v = self.torch, self.v
        fam_idx = sum(map(ord, v["name"])) % 997
        for attempt in range(20):
            seed = 100000 + 1000 * fam_idx + attempt
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            config = self.tf.GptOssConfig(**v["config"])
            model = eager_experts(self.tf.GptOssForCausalLM(config).float())
            self.fx.perturb(model, "gpt_oss", gen)
            (self.score_ids, self.score_labels), (self.ft_ids, self.ft_labels) = rows_for(v, gen, torch)
            shutil.rmtree(self.ckpt, ignore_errors=True)
            self.save(model)
            ref = self.load(torch.float32)
            margin = self.fx.RouterMargin(ref, "gpt_oss", ref.config, "mlp.router")
            with torch.no_grad():
                ref(input_ids=self.score_ids, use_cache=False)
                ref(input_ids=self.ft_ids, use_cache=False)
            margin.remove()
            self.seed, self.gap = seed, margin.min_gap
            if margin.min_gap > TOL["router_gap"]:
                break
            print(f"{v['name']}: seed {seed} has a router gap of {margin.min_gap:.2e}, redrawn", flush=True)
        self.facts = dict(seed=self.seed, router_gap=None if math.isinf(self.gap) else self.gap,
                          attn_implementation=getattr(ref.config, "_attn_implementation", None),
                          experts_implementation=getattr(ref.config, "_experts_implementation", None),
                          layer_types=list(ref.config.layer_types), parameters=sum(p.numel() for p in ref.parameters()))
        print(f"{v['name']}: seed {self.seed}, router gap {self.gap:.3g}; {self.facts}", flush=True)

    def save(self, model):
        torch, v = self.torch, self.v
        if v["storage"] == "float32":
            model.save_pretrained(self.ckpt)
        elif v["storage"] == "bfloat16":
            model.to(torch.bfloat16).save_pretrained(self.ckpt)
        else:  # experts as MXFP4 blocks and scales, the rest bf16, as make_family_fixtures.make_quantized
            src = os.path.join(self.dir, "ckpt_fp32_source")
            shutil.rmtree(src, ignore_errors=True)
            model.save_pretrained(src)
            tensors = {}
            for n, t in self.fx.read_ckpt(src).items():
                if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
                    tensors[n + "_blocks"], tensors[n + "_scales"] = self.fx.mxfp4_quantize(t)
                else:
                    tensors[n] = t.to(torch.bfloat16)
            os.makedirs(self.ckpt)
            with open(os.path.join(src, "config.json")) as f:
                cfg = json.load(f)
            cfg["dtype"] = "bfloat16"
            cfg["quantization_config"] = {
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
            with open(os.path.join(self.ckpt, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2, sort_keys=True)
            gen_cfg = os.path.join(src, "generation_config.json")
            if os.path.isfile(gen_cfg):
                shutil.copy(gen_cfg, self.ckpt)
            self.fx.save_tensors(tensors, os.path.join(self.ckpt, "model.safetensors"))
        if v["legacy"]:
            legacy_config(os.path.join(self.ckpt, "config.json"))

    def load(self, dtype, path=None):
        """Transformers' load of `path` (default: the checkpoint under test) in `dtype`. MXFP4 is dequantised
        the way the fixtures' load ran (Mxfp4Config(dequantize=True), bf16: exact, every e2m1 x 2^e value is a
        bf16 value), then cast."""
        torch = self.torch
        path = path or self.ckpt
        with open(os.path.join(path, "config.json")) as f:
            quant = json.load(f).get("quantization_config")
        if quant:
            m = self.tf.GptOssForCausalLM.from_pretrained(
                path, dtype=torch.bfloat16, quantization_config=self.tf.Mxfp4Config(dequantize=True),
                experts_implementation=EXPERTS)
            # Only a real cast: Module.to(bf16) on the bf16 model would also round the fp32 RoPE inv_freq buffer
            # to bf16, which no plain bf16 load does (its logits then differ by ~0.7 with identical tensors).
            if dtype != torch.bfloat16:
                m = m.to(dtype)
        else:
            m = self.tf.GptOssForCausalLM.from_pretrained(path, dtype=dtype, experts_implementation=EXPERTS)
        m = eager_experts(m)
        m.eval()
        return m

    def stored_dtype(self):
        return self.torch.float32 if self.v["storage"] == "float32" else self.torch.bfloat16


# ---------------------------------------------------------------------------------------------------------------
# Checks: each returns (passed, detail)

def check_score(var, binary, dtype_name):
    torch, np = var.torch, __import__("numpy")
    dt = torch.float32 if dtype_name == "float32" else torch.bfloat16
    data = os.path.join(var.dir, "score.jsonl")
    write_jsonl(data, var.score_ids, var.score_labels)
    npy = os.path.join(var.dir, f"score_{dtype_name}.npy")
    got = json.loads(sh([binary, "score", "--model", var.ckpt, "--data", data, "--logits", npy, "--dtype",
                         dtype_name]))
    m = var.load(dt)
    with torch.no_grad():
        out = m(input_ids=var.score_ids, labels=var.score_labels, use_cache=False)
    ref_loss = float(out.loss)
    mine = np.load(npy)
    ref = out.logits.float().numpy()
    if mine.shape != ref.shape:
        return False, f"logits shape {mine.shape} vs Transformers {ref.shape}"
    rel = abs(got["loss"] - ref_loss) / abs(ref_loss)
    aux = getattr(out, "aux_loss", None)
    aux_text = f" (aux {got['aux_loss']:.6f} vs {float(aux):.6f})" if aux is not None else ""
    if dtype_name == "float32":
        d = float(np.abs(mine - ref).max())
        ok = rel <= TOL["loss_rel"] and d <= TOL["logits_abs"]
        return ok, (f"loss {got['loss']:.7f} vs {ref_loss:.7f}{aux_text}: rel {rel:.1e} (<= {TOL['loss_rel']:g}); "
                    f"logits max abs {d:.1e} (<= {TOL['logits_abs']:g})")
    l2 = float(np.linalg.norm(mine - ref) / max(np.linalg.norm(ref), 1e-30))
    ok = rel <= TOL["bf16_loss_rel"] and l2 <= TOL["bf16_logits_rel_l2"]
    return ok, (f"loss {got['loss']:.5f} vs {ref_loss:.5f}{aux_text}: rel {rel:.1e} (<= {TOL['bf16_loss_rel']:g}); "
                f"logits rel L2 {l2:.1e} (<= {TOL['bf16_logits_rel_l2']:g})")


def check_convert(var, binary, to_dtype=None):
    torch = var.torch
    out = os.path.join(var.dir, "convert_" + (to_dtype or "same"))
    shutil.rmtree(out, ignore_errors=True)
    sh([binary, "convert", "--in", var.ckpt, "--out", out] + (["--dtype", to_dtype] if to_dtype else []))
    dt = var.stored_dtype() if to_dtype is None else (torch.float32 if to_dtype == "float32" else torch.bfloat16)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    if "quantization_config" in cfg:
        return False, "the converted config.json still declares quantization_config"
    src = var.load(dt)
    conv = var.load(dt, out)
    ok, detail = same_models(var, src, conv)
    return ok, f"to {to_dtype or 'the same dtype'} ({cfg.get('dtype', cfg.get('torch_dtype'))}): {detail}"


def check_finetune(var, binary, whole_pad_row):
    """One mixtune finetune step vs one torch AdamW step. whole_pad_row False: the pad_token_id embedding row is
    left out of the comparison (reported by finetune-pad-row)."""
    torch = var.torch
    run = os.path.join(var.dir, "finetune_run")
    shutil.rmtree(run, ignore_errors=True)
    data = os.path.join(var.dir, "finetune.jsonl")
    write_jsonl(data, var.ft_ids, var.ft_labels)
    recipe = os.path.join(var.dir, "finetune.yaml")
    with open(recipe, "w") as f:
        f.write(f"model: {{path: {var.ckpt}, dtype: float32}}\n"
                f"data: {{train: {data}, seq_len: {SEQ}, pack: false}}\n"
                "train: {micro_batch_size: 1, grad_accum: 1, max_steps: 1, seed: 1, device: cpu, log_every: 1}\n"
                f"optimizer: {{name: adamw, lr: {yaml_float(ADAMW['lr'])}, betas: [{yaml_float(ADAMW['betas'][0])}, "
                f"{yaml_float(ADAMW['betas'][1])}], eps: {yaml_float(ADAMW['eps'])}, "
                f"weight_decay: {yaml_float(ADAMW['weight_decay'])}, decay_norms_and_biases: true}}\n"
                "schedule: {name: constant}\n"
                "clip: {max_grad_norm: 0}\n"
                f"checkpoint: {{dir: {run}}}\n")
    sh([binary, "finetune", recipe], cwd=var.dir)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        metrics = [json.loads(l) for l in f if l.strip()]
    got_loss = float(metrics[0]["loss"])
    model = var.load(torch.float32)
    model.train()
    out = model(input_ids=var.ft_ids, labels=var.ft_labels, use_cache=False)
    ref_loss = float(out.loss)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW)
    opt.step()
    want = {n: p.detach() for n, p in model.named_parameters()}
    got = var.load(torch.float32, os.path.join(run, "final")).state_dict()
    pad = var.v["config"]["pad_token_id"]
    worst, worst_name, bad, ill, total, missing, untested = 0.0, None, 0, 0, 0, [], []
    for n, w in want.items():
        if n not in got:
            missing.append(n)
            continue
        g, gr = got[n].float(), grads[n]
        diff = (g - w).abs()
        if not whole_pad_row and n == "model.embed_tokens.weight":
            diff[pad] = 0
        tiny = (gr != 0) & (gr.abs() < TOL["ill_grad"])
        bound = torch.where(tiny, torch.full_like(diff, 2 * ADAMW["lr"]), torch.full_like(diff, TOL["step_abs"]))
        bad += int((diff > bound).sum())
        ill += int(tiny.sum())
        nonzero = int((gr != 0).sum())
        if nonzero and int(tiny.sum()) > TOL["ill_tensor_share"] * nonzero:
            untested.append(f"{n} ({int(tiny.sum())} of {nonzero})")
        total += diff.numel()
        m = float(diff.masked_fill(tiny, 0).max()) if diff.numel() else 0.0
        if m > worst:
            worst, worst_name = m, n
    rel = abs(got_loss - ref_loss) / abs(ref_loss)
    ok = not missing and rel <= TOL["loss_rel"] and bad == 0 and not untested
    detail = (f"step loss {got_loss:.7f} vs {ref_loss:.7f} rel {rel:.1e}; weights: {bad} of {total} outside the "
              f"bound, worst well-conditioned {worst:.1e} ({worst_name}), {ill} ill-conditioned (|g| < 1e-6)")
    if missing:
        detail += f"; missing in final/: {missing[:3]}"
    if untested:
        detail += f"; mostly ill-conditioned, so not really compared: {untested[:3]}"
    if whole_pad_row:
        e = (got["model.embed_tokens.weight"].float() - want["model.embed_tokens.weight"]).abs()[pad]
        g = grads["model.embed_tokens.weight"][pad]
        detail = (f"pad row {pad}: Transformers' gradient max abs {float(g.abs().max()):.1e} (padding_idx), weights "
                  f"max abs diff {float(e.max()):.1e}; " + detail)
    return ok, detail


# ---------------------------------------------------------------------------------------------------------------

def main(argv=None):
    a, variants, binary = H.parse_args(__doc__, all_variants, problems, print_list, argv)
    if binary is None:
        return a.list_status

    import torch
    import transformers
    sys.path.insert(0, HERE)
    import make_family_fixtures as fx  # its perturb, RouterMargin, mxfp4_quantize, read_ckpt, save_tensors

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(a.work, exist_ok=True)
    work = os.path.abspath(a.work)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; {len(variants)} variants; "
          f"fixtures' shapes: {sorted(fixture_signatures())}", flush=True)
    results = []
    for v in variants:
        t0 = time.monotonic()
        print(f"== {v['name']}: {describe(v)}", flush=True)
        try:
            var = Variant(v, work, torch, transformers, fx)
        except Exception as e:  # noqa: BLE001 -- reported as the variant's build failure
            H.build_failure(results, v["name"], e)
            continue
        other = {"float32": "bfloat16", "bfloat16": "float32", "mxfp4": "float32"}[v["storage"]]
        runs = [("score-fp32", lambda: check_score(var, binary, "float32")),
                ("score-bf16", lambda: check_score(var, binary, "bfloat16")),
                ("convert", lambda: check_convert(var, binary)),
                (f"convert-{other}", lambda: check_convert(var, binary, other)),
                ("finetune", lambda: check_finetune(var, binary, whole_pad_row=False))]
        if v["pad_in_data"]:
            runs.append(("finetune-pad-row", lambda: check_finetune(var, binary, whole_pad_row=True)))
        H.run_checks(results, v["name"], runs, t0, INFO_CHECKS)
        with open(os.path.join(var.dir, "facts.json"), "w") as f:
            json.dump(dict(variant=v, facts=var.facts), f, indent=2)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(dict(transformers=transformers.__version__, torch=torch.__version__, tolerances=TOL,
                       results=results), f, indent=2)
    counted, fails, over = H.print_table(results)
    print(f"\n(INFO: reported, not counted; INFO!: outside the parity tests' bf16 bounds: {over})")
    print(f"verify-gpt-oss: {counted - fails} passed, {fails} failed ({work}/results.json)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
