#!/usr/bin/env python3
"""PEFT-made LoRA adapters on Transformers-made checkpoints of shapes the fixtures lack, checked against mixtune.

Run on the GPU machine (torch 2.11, transformers 5.17, peft 0.21; all the math on the CPU, fp32 unless stated):
    verify_lora_unseen.py MIXTUNE_BINARY WORK_DIR [--random N] [--seed S] [--only NAME ...]
    verify_lora_unseen.py --list [--random N] [--seed S]     # the variants and their checks; no torch needed

Issue 39: "checked also on adapters you have not seen". Each variant is a tiny Qwen3-MoE (with mlp_only_layers /
decoder_sparse_step dense layers), dense Qwen3 or GPT-OSS checkpoint that Transformers builds (perturbed as
make_family_fixtures.perturb does) and saves in float32 or bfloat16, and an adapter that PEFT makes on it
(get_peft_model with init_lora_weights=False, then every A and B drawn at random by make_peft_fixture.randomise:
B = 0 would hide a wrong layout; a router trained in full is perturbed too) and saves with save_pretrained. The
LoRA settings vary: r 1, 2, 8, 16; alpha; use_rslora; targets given as mixtune's names (docs/lora.md) and spelled
for PEFT the way docs/peft-format.md says: attention projections (target_modules), a dense MLP (target_modules for
Qwen3; 2-D target_parameters `mlp.<proj>.weight` for Qwen3-MoE's dense layers, since PEFT rewrites
gate/up/down_proj in a qwen3_moe target_modules into the fused experts), both expert stacks (target_parameters),
the router (modules_to_save). A seed is redrawn until no top-k decision of the adapted fp32 model on the test rows
is within 1e-4. Checks per variant:
  score          `mixtune score --model BASE --adapter A --dtype float32 --logits` on 2 rows of 32 tokens (labels
                 -100 on a few) vs PeftModel.from_pretrained(fp32 base, A): loss rel <= 1e-5, logits max abs <= 1e-4
  merge          `mixtune merge` vs PEFT's merge_and_unload().save_pretrained() of the base in its stored dtype: the
                 same tensor names and dtypes in the files; fp32: every tensor max |a-b| / max |b| <= 1e-6; bf16:
                 every element within one bf16 ulp and at most 1e-3 of the elements different (the same rounding
                 policy differs only where the fp32 deltas, summed in other orders, straddle a rounding boundary:
                 ~1e-5 of the elements; a different policy, e.g. bf16(W + bf16(delta)) against bf16(W + delta), moves
                 ~10%); and Transformers loads mixtune's merged directory without missing/unexpected/mismatched keys
  finetune       one `mixtune finetune` step (CPU engine, model dtype float32; `model.adapter: A` plus a `peft:`
                 section that repeats A's settings; AdamW lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.01 on
                 every trained tensor; constant lr; no clipping) on one 32-token row vs one torch.optim.AdamW step of
                 PeftModel.from_pretrained(fp32 base, A, is_trainable=True) on the same row: step loss rel <= 1e-5;
                 every saved adapter tensor abs <= 1e-5, except where torch's gradient is nonzero and below 1e-6
                 (Adam divides by |g| + eps: ill-conditioned, held to 2 x lr); each tensor with nonzero gradients
                 must keep at least half of them well-conditioned (verify_gpt_oss_unseen.py's rule)
  final-in-peft  PeftModel.from_pretrained(fp32 base, our final/): PEFT's adapter state holds exactly our tensors
                 (no missing or unexpected key, every value equal), and its logits on the score rows equal
                 `mixtune score --adapter final/` (max abs <= 1e-4, loss rel <= 1e-5)
Refusal variants (refuse_*): PEFT makes adapters mixtune does not support (DoRA, lora_bias, a regex target_modules,
one expert stack only, rank_pattern, layers_to_transform; fan_in_fan_out, which PEFT resets to false for
nn.Linear, is set in the saved config); `mixtune score --adapter` and `mixtune merge` must each exit non-zero with
exactly one stderr line, `mixtune: error: <dir>/adapter_config.json: ...`, holding the expected text.
Prints a PASS/FAIL table and WORK_DIR/results.json; exit status 0 when every check passed, 1 otherwise, 2 on a
usage error. Each variant's files stay in WORK_DIR/<variant>/.
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
import verify_gpt_oss_unseen as G  # noqa: E402  (pure Python at import: the GPT-OSS config base)

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "fixtures"))
SEQ = G.SEQ        # 32 tokens per row (a multiple of 8: finetune rounds rows up to 8)
ROWS = 2           # score rows
ADAMW = G.ADAMW
TOL = dict(loss_rel=1e-5, logits_abs=1e-4, merge_rel=1e-6, merge_bf16_ulps=1, merge_bf16_share=1e-3,
           step_abs=1e-5, ill_grad=1e-6, ill_tensor_share=0.5, router_gap=1e-4)
STORAGE = ("float32", "bfloat16")
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# mixtune's LoRA target names per family, in the family's order (src/models/families/*.cpp, lora_targets)
FAMILY_TARGETS = {"qwen3": ATTN + MLP, "qwen3_moe": ATTN + MLP + ("experts", "router"),
                  "gpt_oss": ATTN + ("experts", "router")}
HF_CLASS = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
            "gpt_oss": ("GptOssConfig", "GptOssForCausalLM")}
ROUTER = {"qwen3_moe": ("mlp.gate", "softmax"), "gpt_oss": ("mlp.router", "biased_logits")}

# Qwen3 / Qwen3-MoE configs start from these (make_model_fixtures.py's conventions; RoPE unscaled, as mixtune's
# Qwen3 reads it); GPT-OSS from verify_gpt_oss_unseen.BASE (bos 1, eos 2, pad 0).
QWEN_BASE = dict(max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.2, rope_theta=10000.0,
                 hidden_act="silu", attention_dropout=0.0, use_sliding_window=False, bos_token_id=1, eos_token_id=2,
                 torch_dtype="float32", attention_bias=False)
QWEN_MOE_BASE = dict(QWEN_BASE, norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.02,
                     decoder_sparse_step=1, mlp_only_layers=[])
S, F = G.S, G.F

# (name, family, config over the family's base, storage, LoRA: (r, alpha, use_rslora, mixtune target names))
FIXED = [
    ("qwen3moe_dense_layers_all_targets_r8", "qwen3_moe",
     dict(vocab_size=150, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=8, num_experts=5,
          num_experts_per_tok=2, moe_intermediate_size=12, intermediate_size=40, num_hidden_layers=3,
          mlp_only_layers=[0, 2], router_aux_loss_coef=0.05, tie_word_embeddings=False),
     "float32", (8, 16, False, list(FAMILY_TARGETS["qwen3_moe"]))),
    ("qwen3moe_r1_rslora_qv_experts_bf16", "qwen3_moe",
     dict(vocab_size=130, hidden_size=40, num_attention_heads=4, num_key_value_heads=1, head_dim=12, num_experts=6,
          num_experts_per_tok=3, moe_intermediate_size=20, intermediate_size=32, num_hidden_layers=2,
          norm_topk_prob=False, output_router_logits=False, tie_word_embeddings=True),
     "bfloat16", (1, 3, True, ["q_proj", "v_proj", "experts"])),
    ("qwen3moe_sparse2_dense_mlp_router_r2_bf16", "qwen3_moe",
     dict(vocab_size=112, hidden_size=32, num_attention_heads=8, num_key_value_heads=4, head_dim=4, num_experts=3,
          num_experts_per_tok=1, moe_intermediate_size=8, intermediate_size=24, num_hidden_layers=4,
          decoder_sparse_step=2, mlp_only_layers=[1], tie_word_embeddings=False),
     "bfloat16", (2, 5, False, ["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "router"])),
    ("qwen3_dense_all_linear_r16", "qwen3",
     dict(vocab_size=140, hidden_size=48, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
          intermediate_size=56, num_hidden_layers=2, tie_word_embeddings=False),
     "float32", (16, 32, False, list(ATTN + MLP))),
    ("qwen3_dense_r2_rslora_v_up_down_bf16", "qwen3",
     dict(vocab_size=100, hidden_size=24, num_attention_heads=6, num_key_value_heads=3, head_dim=6,
          intermediate_size=20, num_hidden_layers=3, tie_word_embeddings=True),
     "bfloat16", (2, 4, True, ["v_proj", "up_proj", "down_proj"])),
    ("gptoss_attn_experts_router_r8", "gpt_oss",
     dict(vocab_size=120, hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=10,
          num_local_experts=5, num_experts_per_tok=2, intermediate_size=20, num_hidden_layers=2, sliding_window=6,
          layer_types=[S, F]),
     "float32", (8, 8, False, list(FAMILY_TARGETS["gpt_oss"]))),
    ("gptoss_experts_only_r16_rslora_bf16", "gpt_oss",
     dict(vocab_size=104, hidden_size=32, num_attention_heads=6, num_key_value_heads=3, head_dim=8,
          num_local_experts=4, num_experts_per_tok=1, intermediate_size=16, num_hidden_layers=3, sliding_window=3,
          layer_types=[S, F, S], tie_word_embeddings=True, output_router_logits=False),
     "bfloat16", (16, 4, True, ["experts"])),
    ("gptoss_o_proj_router_r1_all_experts", "gpt_oss",
     dict(vocab_size=96, hidden_size=36, num_attention_heads=3, num_key_value_heads=1, head_dim=12,
          num_local_experts=3, num_experts_per_tok=3, intermediate_size=12, num_hidden_layers=1, sliding_window=40,
          layer_types=[F]),
     "float32", (1, 2, False, ["o_proj", "router"])),
]

# Refusals: (check, LoraConfig keywords over r 4 / alpha 8, edits to the saved adapter_config.json, expected text).
REFUSE_QWEN3_MOE = [
    ("refuse-gate-up-only", dict(target_modules=["q_proj"], target_parameters=["mlp.experts.gate_up_proj"]), {},
     "target 'experts' covers"),
    ("refuse-down-only", dict(target_modules=["q_proj"], target_parameters=["mlp.experts.down_proj"]), {},
     "target 'experts' covers"),
    ("refuse-lora-bias", dict(target_modules=["q_proj", "v_proj"], lora_bias=True), {},
     "lora_bias: true is not supported"),
    ("refuse-fan-in-fan-out", dict(target_modules=["o_proj"]), {"fan_in_fan_out": True},
     "fan_in_fan_out: true is not supported"),
    ("refuse-rank-pattern", dict(target_modules=["q_proj", "k_proj"], rank_pattern={"k_proj": 2}), {},
     "rank_pattern: "),
    ("refuse-layers-to-transform", dict(target_modules=["q_proj"], layers_to_transform=[0]), {},
     "layers_to_transform: [0] is not supported"),
]
# A regex target_modules only on a model type without Transformers' checkpoint conversion (not qwen3_moe: PEFT
# resolves a regex there into a list of names before saving).
REFUSE_GPT_OSS = [
    ("refuse-regex-targets", dict(target_modules=r".*\.(q_proj|v_proj)"), {},
     "target_modules: expected a list of names"),
    ("refuse-dora", dict(target_modules=["q_proj", "v_proj"], use_dora=True), {}, "use_dora: true is not supported"),
    ("refuse-gate-up-only", dict(target_modules=[], target_parameters=["mlp.experts.gate_up_proj"]), {},
     "target 'experts' covers"),
]
REFUSALS = [
    ("refuse_qwen3moe", "qwen3_moe",
     dict(vocab_size=96, hidden_size=24, num_attention_heads=2, num_key_value_heads=2, head_dim=12, num_experts=3,
          num_experts_per_tok=2, moe_intermediate_size=10, intermediate_size=16, num_hidden_layers=2,
          tie_word_embeddings=False), REFUSE_QWEN3_MOE),
    ("refuse_gptoss", "gpt_oss",
     dict(vocab_size=96, hidden_size=24, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
          num_local_experts=3, num_experts_per_tok=2, intermediate_size=8, num_hidden_layers=2, sliding_window=4,
          layer_types=[S, F]), REFUSE_GPT_OSS),
]


# ---------------------------------------------------------------------------------------------------------------
# Variants (pure Python: --list works without torch)

def family_base(family):
    return dict(G.BASE) if family == "gpt_oss" else dict(QWEN_MOE_BASE if family == "qwen3_moe" else QWEN_BASE)


def variant(name, family, config, storage, lora=None, refusals=None):
    cfg = family_base(family)
    cfg.update(config)
    out = dict(name=name, family=family, config=cfg, storage=storage, lora=None, refusals=refusals)
    if lora is not None:
        r, alpha, rslora, targets = lora
        out["lora"] = dict(r=r, alpha=alpha, use_rslora=rslora, targets=list(targets))
    return out


def all_variants(n_random, seed):
    return ([variant(*f) for f in FIXED] + [variant(n, fam, c, "float32", refusals=rs) for n, fam, c, rs in REFUSALS]
            + random_variants(n_random, seed))


def moe_layers(c, family):
    """Layer i is a MoE layer (Transformers' rule): GPT-OSS always; Qwen3-MoE iff i not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0; dense Qwen3 never."""
    n = c["num_hidden_layers"]
    if family == "gpt_oss":
        return [True] * n
    if family == "qwen3":
        return [False] * n
    step = c.get("decoder_sparse_step", 1) or 1
    return [i not in (c.get("mlp_only_layers") or []) and (i + 1) % step == 0 for i in range(n)]


def peft_targets(family, targets):
    """mixtune's target names -> (target_modules, target_parameters, modules_to_save) as docs/peft-format.md spells
    them for PEFT."""
    modules, params, to_save = [], [], None
    for t in targets:
        if t in ATTN or (t in MLP and family == "qwen3"):
            modules.append(t)
        elif t in MLP:  # a Qwen3-MoE dense layer: PEFT's ParamWrapper on the 2-D weight
            params.append(f"mlp.{t}.weight")
        elif t == "experts":
            params += EXPERT_PARAMS
        elif t == "router":
            to_save = [ROUTER[family][0].split(".")[-1]]
    return modules, params, to_save


def signature(c, family):
    """The shapes that tell two checkpoints apart (config.json keys, either spelling)."""
    return (family, c.get("hidden_size"), c.get("num_attention_heads"), c.get("num_key_value_heads"),
            c.get("head_dim"), c.get("num_local_experts", c.get("num_experts")), c.get("num_experts_per_tok"),
            c.get("moe_intermediate_size") if family == "qwen3_moe" else None, c.get("intermediate_size"),
            c.get("num_hidden_layers"))


def fixture_signatures():
    sigs = set()
    for fam_dir in ("qwen3_moe", "gpt_oss"):
        root = os.path.join(FIXTURES, fam_dir)
        if not os.path.isdir(root):
            continue
        for v in sorted(os.listdir(root)):
            path = os.path.join(root, v, "ckpt", "config.json")
            if os.path.isfile(path):
                with open(path) as f:
                    c = json.load(f)
                sigs.add(signature(c, c.get("model_type", fam_dir)))
    return sigs


def problems(v):
    """What would make a variant invalid for Transformers, PEFT or mixtune (empty: fine)."""
    c, fam, out = v["config"], v["family"], []
    if fam not in FAMILY_TARGETS:
        out.append(f"family {fam!r} not one of {sorted(FAMILY_TARGETS)}")
        return out
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        out.append("num_attention_heads not a multiple of num_key_value_heads")
    if c["head_dim"] % 2:
        out.append("head_dim odd (RoPE rotates halves)")
    if fam != "qwen3":
        e = c.get("num_local_experts", c.get("num_experts"))
        if not 1 <= c["num_experts_per_tok"] <= e:
            out.append("num_experts_per_tok outside [1, experts]")
    if fam == "gpt_oss" and c.get("layer_types") is not None and len(c["layer_types"]) != c["num_hidden_layers"]:
        out.append("layer_types length != num_hidden_layers")
    if fam == "qwen3_moe" and any(not 0 <= i < c["num_hidden_layers"] for i in c.get("mlp_only_layers") or []):
        out.append("mlp_only_layers index out of range")
    if c["vocab_size"] < 16:
        out.append("vocabulary too small")
    if v["storage"] not in STORAGE:
        out.append(f"storage {v['storage']!r} not one of {STORAGE}")
    moe = moe_layers(c, fam)
    if fam in ("qwen3_moe", "gpt_oss") and not any(moe):
        out.append("no MoE layer (mlp_only_layers / decoder_sparse_step leave every layer dense)")
    if v["lora"] is not None:
        lo = v["lora"]
        unknown = [t for t in lo["targets"] if t not in FAMILY_TARGETS[fam]]
        if unknown:
            out.append(f"targets {unknown} not mixtune's for {fam}")
        if len(set(lo["targets"])) != len(lo["targets"]):
            out.append("a target listed twice")
        if not [t for t in lo["targets"] if t != "router"]:
            out.append("only the router: PEFT needs a target module or parameter")
        if any(t in ("experts", "router") for t in lo["targets"]) and not any(moe):
            out.append("experts/router targeted but no MoE layer")
        if fam == "qwen3_moe" and any(t in MLP for t in lo["targets"]) and all(moe):
            out.append("a dense MLP targeted but no dense layer")
        if lo["r"] < 1 or not lo["alpha"] > 0:
            out.append("r < 1 or alpha <= 0")
    elif not v["refusals"]:
        out.append("neither LoRA settings nor refusals")
    return out


def checks_of(v):
    if v["refusals"]:
        return [r[0] for r in v["refusals"]]
    return ["score", "merge", "finetune", "final-in-peft"]


def describe(v):
    c, fam = v["config"], v["family"]
    text = (f"{fam} H {c['hidden_size']}, heads {c['num_attention_heads']}/{c['num_key_value_heads']}x"
            f"{c['head_dim']}, ")
    if fam == "qwen3_moe":
        text += (f"E {c['num_experts']} top-{c['num_experts_per_tok']}, I {c['moe_intermediate_size']} (dense "
                 f"{c['intermediate_size']}), layers {''.join('M' if m else 'D' for m in moe_layers(c, fam))}, "
                 f"aux {'on' if c['output_router_logits'] else 'off'}, ")
    elif fam == "gpt_oss":
        types = "".join("S" if t == S else "F" for t in G.layer_types_of(c))
        text += (f"E {c['num_local_experts']} top-{c['num_experts_per_tok']}, I {c['intermediate_size']}, layers "
                 f"{types} window {c['sliding_window']}, aux {'on' if c['output_router_logits'] else 'off'}, ")
    else:
        text += f"I {c['intermediate_size']}, {c['num_hidden_layers']} layers, "
    text += f"{'tied' if c['tie_word_embeddings'] else 'untied'}, vocab {c['vocab_size']}, {v['storage']}"
    lo = v["lora"]
    if lo:
        modules, params, to_save = peft_targets(fam, lo["targets"])
        text += (f"; LoRA r {lo['r']} alpha {lo['alpha']}{' rslora' if lo['use_rslora'] else ''} on "
                 f"{', '.join(lo['targets'])} (PEFT: target_modules {modules}, target_parameters {params}, "
                 f"modules_to_save {to_save})")
    return text


def random_variants(n, seed):
    """n random (checkpoint, adapter) pairs from a seeded generator, each valid and unlike every fixture."""
    rng = random.Random(seed)
    fixtures = fixture_signatures()
    out = []
    while len(out) < n:
        fam = rng.choice(sorted(FAMILY_TARGETS))
        kv = rng.choice([1, 2, 3])
        layers = rng.randint(1, 4)
        cfg = dict(vocab_size=rng.randint(96, 256), hidden_size=rng.choice([24, 32, 40, 48, 56, 64]),
                   num_attention_heads=kv * rng.choice([1, 2, 3]), num_key_value_heads=kv,
                   head_dim=rng.choice([4, 6, 8, 12, 16]), num_hidden_layers=layers,
                   intermediate_size=rng.choice([12, 16, 24, 36, 48]), tie_word_embeddings=rng.random() < 0.5)
        if fam == "qwen3_moe":
            e = rng.randint(2, 8)
            cfg.update(num_experts=e, num_experts_per_tok=rng.randint(1, min(e, 4)),
                       moe_intermediate_size=rng.choice([8, 12, 16, 20]), norm_topk_prob=rng.random() < 0.5,
                       output_router_logits=rng.random() < 0.5, decoder_sparse_step=rng.choice([1, 1, 2]),
                       mlp_only_layers=sorted(rng.sample(range(layers), rng.randint(0, layers - 1))))
        elif fam == "gpt_oss":
            e = rng.randint(2, 8)
            cfg.update(num_local_experts=e, num_experts_per_tok=rng.randint(1, min(e, 4)),
                       sliding_window=rng.randint(1, 12), output_router_logits=rng.random() < 0.5,
                       layer_types=[rng.choice([S, F]) for _ in range(layers)])
        choices = list(FAMILY_TARGETS[fam])
        targets = [t for t in choices if rng.random() < 0.4] or [rng.choice(choices)]
        lora = (rng.choice([1, 2, 8, 16]), rng.choice([1, 2, 4, 8, 16, 32]), rng.random() < 0.3, targets)
        v = variant(f"random{seed}_{len(out)}", fam, cfg, rng.choice(STORAGE), lora)
        if not problems(v) and signature(v["config"], fam) not in fixtures:
            out.append(v)
    return out


def print_list(variants):
    fixtures = fixture_signatures()
    bad = 0
    for v in variants:
        p = problems(v) + (["same shapes as a fixture"] if signature(v["config"], v["family"]) in fixtures else [])
        bad += bool(p)
        print(f"{v['name']}: {describe(v)}\n    checks: {', '.join(checks_of(v))}"
              + (f"\n    INVALID: {'; '.join(p)}" if p else ""))
    print(f"{len(variants)} variants, {sum(len(checks_of(v)) for v in variants)} checks; fixtures read: "
          f"{len(fixtures)} ({FIXTURES})" + (f"; {bad} invalid" if bad else ""))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------------------------
# Helpers (torch side)

def run_cmd(args, cwd=None, timeout=900):
    """(exit status, stdout, stderr) without raising: the refusal checks want the failure."""
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def rows_for(v, gen, torch):
    """(score rows [ROWS, SEQ] + labels, finetune row [1, SEQ] + labels); ids from 3 up, never a special id."""
    vocab = v["config"]["vocab_size"]
    score_ids = torch.randint(3, vocab, (ROWS, SEQ), generator=gen)
    score_labels = score_ids.clone()
    score_labels[0, :4] = -100
    score_labels[1, SEQ // 2] = -100
    ft_ids = torch.randint(3, vocab, (1, SEQ), generator=gen)
    ft_labels = ft_ids.clone()
    ft_labels[0, :5] = -100
    return (score_ids, score_labels), (ft_ids, ft_labels)


def saved_key(live):
    """A PeftModel parameter name -> its adapter_model.safetensors key (the adapter name taken out)."""
    return (live.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
            .replace(".modules_to_save.default.", "."))


def read_safetensors_dir(d, torch):
    """{name: tensor} over every *.safetensors file of a directory."""
    from safetensors import safe_open
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), framework="pt") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
    return out


class RouterGap:
    """Smallest gap at the k-th routing decision of whatever router runs (a modules_to_save copy or the original):
    Qwen3-MoE on the softmax probabilities, GPT-OSS on the biased logits (make_peft_fixture.RouterMargin's rule)."""

    def __init__(self, model, family, k, torch):
        self.torch, self.k, self.min_gap, self.handles = torch, k, float("inf"), []
        self.suffix, self.how = ROUTER.get(family, (None, None))
        if self.suffix is None:
            return
        for name, mod in model.named_modules():
            w = mod._parameters.get("weight")
            plain = name.replace(".modules_to_save.default", "").replace(".original_module", "")
            if w is not None and w.dim() == 2 and plain.endswith(self.suffix):
                self.handles.append(mod.register_forward_pre_hook(self.hook))

    def hook(self, mod, args):
        torch = self.torch
        x = args[0].detach().double().reshape(-1, mod.weight.shape[1])
        z = x @ mod.weight.detach().double().t()
        z = torch.softmax(z, -1) if self.how == "softmax" else z + mod.bias.detach().double()
        if self.k < z.shape[-1]:
            s = torch.sort(z, dim=-1, descending=True).values
            self.min_gap = min(self.min_gap, float((s[:, self.k - 1] - s[:, self.k]).min()))

    def remove(self):
        for h in self.handles:
            h.remove()


class Case:
    """One variant's checkpoint, adapter(s) and rows, made by Transformers and PEFT, and its references."""

    def __init__(self, v, work, m):
        self.v, self.m, self.torch = v, m, m.torch
        self.family = v["family"]
        self.moe = self.family != "qwen3"
        self.dir = os.path.join(work, v["name"])
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.adapter = os.path.join(self.dir, "adapter")
        self.cls = getattr(m.tf, HF_CLASS[self.family][1])
        self.make()

    # -- the checkpoint and the adapter under test
    def build_model(self):
        tf, c = self.m.tf, dict(self.v["config"])
        c["model_type"] = self.family
        c["architectures"] = [HF_CLASS[self.family][1]]
        config = getattr(tf, HF_CLASS[self.family][0]).from_dict(c)
        model = self.cls(config).float()
        return G.eager_experts(model) if self.moe else model

    def stored_dtype(self):
        return self.torch.float32 if self.v["storage"] == "float32" else self.torch.bfloat16

    def load_base(self, dtype):
        kw = dict(experts_implementation=G.EXPERTS) if self.moe else {}
        model = self.cls.from_pretrained(self.ckpt, dtype=dtype, **kw)
        model = G.eager_experts(model) if self.moe else model
        model.eval()
        return model

    def peft(self, dtype, adapter, trainable=False):
        return self.m.PeftModel.from_pretrained(self.load_base(dtype), adapter, is_trainable=trainable)

    def lora_config(self, **kw):
        base = dict(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM")
        base.update(kw)
        return self.m.LoraConfig(**base)

    def make(self):
        torch, v = self.torch, self.v
        name_idx = sum(map(ord, v["name"])) % 997
        k = v["config"].get("num_experts_per_tok", 0)
        for attempt in range(20):
            seed = 200000 + 1000 * name_idx + attempt
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            model = self.build_model()
            self.m.fx.perturb(model, self.family, gen)
            (self.score_ids, self.score_labels), (self.ft_ids, self.ft_labels) = rows_for(v, gen, torch)
            shutil.rmtree(self.ckpt, ignore_errors=True)
            (model if v["storage"] == "float32" else model.to(torch.bfloat16)).save_pretrained(self.ckpt)
            if v["refusals"]:
                self.seed, self.gap = seed, float("inf")
                break
            self.make_adapter(gen)
            ref = self.peft(torch.float32, self.adapter)
            gap = RouterGap(ref, self.family, k, torch)
            with torch.no_grad():
                ref(input_ids=self.score_ids, use_cache=False)
                ref(input_ids=self.ft_ids, use_cache=False)
            gap.remove()
            self.seed, self.gap = seed, gap.min_gap
            if gap.min_gap > TOL["router_gap"]:
                break
            print(f"{v['name']}: seed {seed} has a router gap of {gap.min_gap:.2e}, redrawn", flush=True)
        self.facts = dict(seed=self.seed, router_gap=None if math.isinf(self.gap) else self.gap,
                          peft=self.m.peft.__version__)
        if v["lora"]:
            with open(os.path.join(self.adapter, "adapter_config.json")) as f:
                self.facts["adapter_config"] = {k2: v2 for k2, v2 in json.load(f).items() if k2 in (
                    "r", "lora_alpha", "use_rslora", "target_modules", "target_parameters", "modules_to_save")}
            self.facts["adapter_tensors"] = len(read_safetensors_dir(self.adapter, torch))
        print(f"{v['name']}: seed {self.seed}, router gap {self.gap:.3g}; {self.facts}", flush=True)

    def make_adapter(self, gen):
        """PEFT's adapter on the stored checkpoint (its own dtype): random A and B (make_peft_fixture.randomise),
        a router trained in full moved away from the base by ~0.3 of its std."""
        torch, L, lo = self.torch, self.m.L, self.v["lora"]
        modules, params, to_save = peft_targets(self.family, lo["targets"])
        base = self.load_base(self.stored_dtype())
        table = L.module_table(base)
        base_sd = {k: t.detach().float().clone() for k, t in base.state_dict().items()}
        pm = self.m.get_peft_model(base, self.lora_config(
            r=lo["r"], lora_alpha=lo["alpha"], use_rslora=lo["use_rslora"], target_modules=modules,
            target_parameters=params or None, modules_to_save=to_save))
        cfg = dict(r=lo["r"], lora_alpha=lo["alpha"], use_rslora=lo["use_rslora"], target_modules=modules,
                   target_parameters=params)
        w_std = {t["full"]: float(base_sd[t["full"]].std()) for _, t, _ in L.doc_keys(table, modules, params)}
        self.m.pf.randomise(pm, table, cfg, w_std, gen)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if ".modules_to_save.default." in n:
                    p.add_((0.3 * p.float().std() * torch.randn(p.shape, generator=gen)).to(p.dtype))
        shutil.rmtree(self.adapter, ignore_errors=True)
        pm.save_pretrained(self.adapter)
        readme = os.path.join(self.adapter, "README.md")
        if os.path.exists(readme):  # PEFT's model card template: nothing reads it
            os.remove(readme)


def score_with_mixtune(case, binary, adapter, tag):
    """mixtune's fp32 score of the score rows with `adapter`: (its JSON, its logits as a tensor)."""
    import numpy as np
    torch = case.torch
    data = os.path.join(case.dir, "score.jsonl")
    H.write_jsonl(data, case.score_ids, case.score_labels)
    npy = os.path.join(case.dir, f"score_{tag}.npy")
    got = json.loads(H.sh([binary, "score", "--model", case.ckpt, "--adapter", adapter, "--data", data,
                           "--dtype", "float32", "--logits", npy]))
    return got, torch.from_numpy(np.load(npy))


def compare_scores(case, got, mine, pm):
    torch = case.torch
    pm.eval()
    with torch.no_grad():
        out = pm(input_ids=case.score_ids, labels=case.score_labels, use_cache=False)
    ref = out.logits.float()
    if tuple(mine.shape) != tuple(ref.shape):
        return False, f"logits shape {tuple(mine.shape)} vs PEFT {tuple(ref.shape)}"
    ref_loss = float(out.loss)
    rel = abs(got["loss"] - ref_loss) / abs(ref_loss)
    d = float((mine.float() - ref).abs().max())
    aux = getattr(out, "aux_loss", None)
    aux_text = f" (aux {got['aux_loss']:.6f} vs {float(aux):.6f})" if aux is not None and "aux_loss" in got else ""
    ok = rel <= TOL["loss_rel"] and d <= TOL["logits_abs"]
    return ok, (f"loss {got['loss']:.7f} vs PEFT {ref_loss:.7f}{aux_text}: rel {rel:.1e} (<= {TOL['loss_rel']:g}); "
                f"logits max abs {d:.1e} (<= {TOL['logits_abs']:g})")


# ---------------------------------------------------------------------------------------------------------------
# Checks: each returns (passed, detail)

def check_score(case, binary):
    got, mine = score_with_mixtune(case, binary, case.adapter, "adapter")
    return compare_scores(case, got, mine, case.peft(case.torch.float32, case.adapter))


def bf16_ulp(x, torch):
    """One bf16 ulp at |x| (8 significant bits): 2^(e - 8) for |x| in [2^(e-1), 2^e); the smallest normal's ulp at 0."""
    e = torch.frexp(x.float().abs().clamp_min(2.0 ** -126)).exponent
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)


def check_merge(case, binary):
    torch = case.torch
    ours, theirs = os.path.join(case.dir, "merged_mixtune"), os.path.join(case.dir, "merged_peft")
    for d in (ours, theirs):
        shutil.rmtree(d, ignore_errors=True)
    H.sh([binary, "merge", "--model", case.ckpt, "--adapter", case.adapter, "--out", ours])
    case.peft(case.stored_dtype(), case.adapter).merge_and_unload().save_pretrained(theirs)
    a, b = read_safetensors_dir(ours, torch), read_safetensors_dir(theirs, torch)
    if set(a) != set(b):
        return False, (f"tensor names differ: only in mixtune's {sorted(set(a) - set(b))[:4]}, only in PEFT's "
                       f"{sorted(set(b) - set(a))[:4]}")
    dtypes = [n for n in a if a[n].dtype != b[n].dtype or a[n].shape != b[n].shape]
    if dtypes:
        n = dtypes[0]
        return False, f"{len(dtypes)} tensors differ in dtype/shape, e.g. {n}: {a[n].dtype} {tuple(a[n].shape)} vs " \
                      f"{b[n].dtype} {tuple(b[n].shape)}"
    changed = sum(not torch.equal(a[n], b[n]) for n in a)
    if case.v["storage"] == "float32":
        worst, at = 0.0, None
        for n in a:
            rel = float((a[n].double() - b[n].double()).abs().max() / b[n].double().abs().max().clamp_min(1e-30))
            if rel > worst:
                worst, at = rel, n
        ok = worst <= TOL["merge_rel"]
        detail = (f"{len(a)} tensors, {changed} not bit-identical; max rel {worst:.1e} (<= {TOL['merge_rel']:g})"
                  + (f" at {at}" if at else ""))
    else:
        over, diff, elems, worst_ulps = 0, 0, 0, 0.0
        for n in a:
            if torch.equal(a[n], b[n]):
                continue
            x, y = a[n].float(), b[n].float()
            ulp = bf16_ulp(torch.maximum(x.abs(), y.abs()), torch)
            ulps = (x - y).abs() / ulp
            worst_ulps = max(worst_ulps, float(ulps.max()))
            over += int((ulps > TOL["merge_bf16_ulps"]).sum())
            diff += int((x != y).sum())
            elems += x.numel()
        share = diff / elems if elems else 0.0
        ok = over == 0 and share <= TOL["merge_bf16_share"]
        detail = (f"{len(a)} tensors, {changed} not bit-identical; {diff} of {elems} elements of those differ "
                  f"(share {share:.1e} <= {TOL['merge_bf16_share']:g}), worst {worst_ulps:.2g} bf16 ulp "
                  f"(<= {TOL['merge_bf16_ulps']})")
    loaded = case.cls.from_pretrained(ours, dtype=case.stored_dtype(), output_loading_info=True)
    if not isinstance(loaded, tuple):
        return False, detail + "; Transformers returned no loading info (output_loading_info=True), load unchecked"
    info = loaded[1] if isinstance(loaded[1], dict) else vars(loaded[1])
    bad = {k: sorted(map(str, info.get(k) or []))[:3] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")
           if info.get(k)}
    if bad:
        ok = False
    return ok, detail + (f"; Transformers' load of mixtune's merge: {bad}" if bad else
                         "; Transformers loads mixtune's merge (no missing/unexpected/mismatched keys)")


def check_finetune(case, binary):
    """One mixtune finetune step from the PEFT-made adapter vs one torch AdamW step of PEFT's model."""
    torch, lo = case.torch, case.v["lora"]
    run = os.path.join(case.dir, "finetune_run")
    shutil.rmtree(run, ignore_errors=True)
    data = os.path.join(case.dir, "finetune.jsonl")
    H.write_jsonl(data, case.ft_ids, case.ft_labels)
    recipe = os.path.join(case.dir, "finetune.yaml")
    y = H.yaml_float
    with open(recipe, "w") as f:
        f.write(f"model: {{path: {case.ckpt}, dtype: float32, adapter: {case.adapter}}}\n"
                f"peft: {{method: lora, r: {lo['r']}, alpha: {y(lo['alpha'])}, dropout: 0.0, "
                f"use_rslora: {'true' if lo['use_rslora'] else 'false'}, target: [{', '.join(lo['targets'])}]}}\n"
                f"data: {{train: {data}, seq_len: {SEQ}, pack: false}}\n"
                "train: {micro_batch_size: 1, grad_accum: 1, max_steps: 1, seed: 1, device: cpu, log_every: 1}\n"
                f"optimizer: {{name: adamw, lr: {y(ADAMW['lr'])}, betas: [{y(ADAMW['betas'][0])}, "
                f"{y(ADAMW['betas'][1])}], eps: {y(ADAMW['eps'])}, weight_decay: {y(ADAMW['weight_decay'])}, "
                "decay_norms_and_biases: true}\n"
                "schedule: {name: constant}\n"
                "clip: {max_grad_norm: 0}\n"
                f"checkpoint: {{dir: {run}}}\n")
    H.sh([binary, "finetune", recipe], cwd=case.dir)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        got_loss = float(json.loads(next(line for line in f if line.strip()))["loss"])
    pm = case.peft(torch.float32, case.adapter, trainable=True)
    pm.train()
    trained = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
    out = pm(input_ids=case.ft_ids, labels=case.ft_labels, use_cache=False)
    ref_loss = float(out.loss)
    out.loss.backward()
    grads = {saved_key(n): p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for n, p in trained}
    opt = torch.optim.AdamW([p for _, p in trained], foreach=False, **ADAMW)
    opt.step()
    want = {k: t.detach().float() for k, t in case.m.get_peft_model_state_dict(pm).items()}
    got = read_safetensors_dir(os.path.join(run, "final"), torch)
    if set(grads) != set(want):
        return False, f"PEFT's trained parameters {sorted(set(grads) ^ set(want))[:4]} do not map to its saved keys"
    missing, unexpected = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    worst, worst_name, bad, ill, total, untested = 0.0, None, 0, 0, 0, []
    for n, w in want.items():
        if n not in got:
            continue
        g, gr = got[n].float(), grads[n].float()
        if g.shape != w.shape:
            missing.append(f"{n} (shape {tuple(g.shape)} vs {tuple(w.shape)})")
            continue
        diff = (g - w).abs()
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
    ok = not missing and not unexpected and rel <= TOL["loss_rel"] and bad == 0 and not untested
    detail = (f"step loss {got_loss:.7f} vs PEFT {ref_loss:.7f} rel {rel:.1e}; {len(want)} adapter tensors: {bad} of "
              f"{total} elements outside the bound, worst well-conditioned {worst:.1e} ({worst_name}), {ill} "
              f"ill-conditioned (|g| < 1e-6)")
    if missing or unexpected:
        detail += f"; final/ lacks {missing[:3]}, has extra {unexpected[:3]}"
    if untested:
        detail += f"; mostly ill-conditioned, so not really compared: {untested[:3]}"
    return ok, detail


def check_final_in_peft(case, binary):
    """PEFT loads mixtune's final/ as it is, holding exactly its tensors, and computes what mixtune computes."""
    torch = case.torch
    final = os.path.join(case.dir, "finetune_run", "final")
    if not os.path.isfile(os.path.join(final, "adapter_config.json")):
        return False, f"no {final}/adapter_config.json (the finetune check did not write it)"
    pm = case.peft(torch.float32, final)
    live = case.m.get_peft_model_state_dict(pm)
    ours = read_safetensors_dir(final, torch)
    missing, unexpected = sorted(set(live) - set(ours)), sorted(set(ours) - set(live))
    unequal = [k for k in live if k in ours and (live[k].shape != ours[k].shape
                                                 or not torch.equal(live[k].float(), ours[k].float()))]
    got, mine = score_with_mixtune(case, binary, final, "final")
    ok, detail = compare_scores(case, got, mine, pm)
    ok = ok and not missing and not unexpected and not unequal
    load = (f"PEFT holds our {len(ours)} tensors" if not (missing or unexpected or unequal) else
            f"PEFT's adapter state: missing in final/ {missing[:3]}, unexpected {unexpected[:3]}, "
            f"loaded other values {unequal[:3]}")
    return ok, f"{load}; {detail}"


def check_refusal(case, binary, name, peft_kw, edit, expect):
    """PEFT makes the adapter; mixtune score and merge must refuse it in one line naming the config field."""
    adir = os.path.join(case.dir, name)
    shutil.rmtree(adir, ignore_errors=True)
    pm = case.m.get_peft_model(case.load_base(case.torch.float32), case.lora_config(**peft_kw))
    pm.save_pretrained(adir)
    cfg_path = os.path.join(adir, "adapter_config.json")
    if edit:
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg.update(edit)
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
    data = os.path.join(case.dir, "refusal.jsonl")
    H.write_jsonl(data, case.score_ids, case.score_labels)
    out = []
    ok = True
    for cmd in (["score", "--model", case.ckpt, "--adapter", adir, "--data", data],
                ["merge", "--model", case.ckpt, "--adapter", adir, "--out", os.path.join(case.dir, "merge_refused")]):
        rc, _, err = run_cmd([binary] + cmd)
        lines = [line for line in err.splitlines() if line.strip()]
        want_prefix = f"mixtune: error: {cfg_path}: "
        good = rc != 0 and len(lines) == 1 and lines[0].startswith(want_prefix) and expect in lines[0]
        ok = ok and good
        out.append(f"{cmd[0]} exit {rc}, {len(lines)} stderr line(s)" + (f": {lines[-1][:200]}" if lines else ""))
    return ok, f"expects '{expect}' after '{cfg_path}: '; " + "; ".join(out)


# ---------------------------------------------------------------------------------------------------------------

def main(argv=None):
    a, variants, binary = H.parse_args(__doc__, all_variants, problems, print_list, argv)
    if binary is None:
        return a.list_status

    import types
    import torch
    import transformers
    import peft
    from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
    import make_family_fixtures as fx  # perturb
    import make_peft_fixture as pf     # randomise
    import peft_layout as L            # module_table, doc_keys

    m = types.SimpleNamespace(torch=torch, tf=transformers, peft=peft, LoraConfig=LoraConfig, PeftModel=PeftModel,
                              get_peft_model=get_peft_model, get_peft_model_state_dict=get_peft_model_state_dict,
                              fx=fx, pf=pf, L=L)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(a.work, exist_ok=True)
    work = os.path.abspath(a.work)
    print(f"peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{len(variants)} variants; fixtures' shapes: {sorted(map(str, fixture_signatures()))}", flush=True)
    results = []
    for v in variants:
        t0 = time.monotonic()
        print(f"== {v['name']}: {describe(v)}", flush=True)
        try:
            case = Case(v, work, m)
        except Exception as e:  # noqa: BLE001 -- reported as the variant's build failure
            H.build_failure(results, v["name"], e)
            continue
        if v["refusals"]:
            runs = [(name, (lambda n=name, kw=kw, ed=ed, ex=ex: check_refusal(case, binary, n, kw, ed, ex)))
                    for name, kw, ed, ex in v["refusals"]]
        else:
            runs = [("score", lambda: check_score(case, binary)),
                    ("merge", lambda: check_merge(case, binary)),
                    ("finetune", lambda: check_finetune(case, binary)),
                    ("final-in-peft", lambda: check_final_in_peft(case, binary))]
        H.run_checks(results, v["name"], runs, t0)
        with open(os.path.join(case.dir, "facts.json"), "w") as f:
            json.dump(dict(variant=v, facts=case.facts), f, indent=2)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(dict(peft=peft.__version__, transformers=transformers.__version__, torch=torch.__version__,
                       tolerances=TOL, results=results), f, indent=2)
    counted, fails, _ = H.print_table(results)
    print(f"\nverify-lora: {counted - fails} passed, {fails} failed ({work}/results.json)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
