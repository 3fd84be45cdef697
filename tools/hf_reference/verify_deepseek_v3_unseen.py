#!/usr/bin/env python3
"""DeepSeek-V3 checkpoints made by Transformers itself, of shapes the fixtures do not have, checked against mixtune.

Run on the GPU machine (torch 2.11, transformers 5.17; all the math on the CPU, fp32 unless stated):
    verify_deepseek_v3_unseen.py MIXTUNE_BINARY WORK_DIR [--random N] [--seed S] [--only NAME ...]
    verify_deepseek_v3_unseen.py --list [--random N] [--seed S]     # the variants and their checks; no torch needed

Issue 40 for DeepSeek-V3 (verify_gpt_oss_unseen.py is the GPT-OSS twin; this file reuses its helpers and checks).
Each variant is a DeepseekV3Config the fixtures (tests/fixtures/deepseek_v3, make_family_fixtures.py) do not cover:
a plain q_proj or a q LoRA of other ranks; other kv_lora_rank, qk_nope / qk_rope / v head dims (v != nope, rope 2);
1 to 6 heads; expert counts and top-k (top-1 included); 1 group, several groups, topk_group = n_group; 1 or 2 shared
experts; first_k_dense_replace 0, 1, 2; norm_topk_prob on and off; routed_scaling_factor 0.7 to 3; default RoPE and
YaRN (mscale = mscale_all_dim, mscale_all_dim alone, mscale != mscale_all_dim with truncate false), RoPE written as
v5's rope_parameters or as the hub's rope_theta + rope_scaling ({type | rope_type: yarn} or null); interleaved and
plain RoPE; tied and untied embeddings; stored in float32, bfloat16 as Transformers' bf16 load saves it (the
e_score_correction_bias F32), bfloat16 as Module.to(bfloat16) saves it (the bias BF16 too) and FP8 e4m3 with 128x128
weight_scale_inv blocks (partial edge blocks in rows and columns); num_nextn_predict_layers 2 with the MTP layers'
tensors present (in a second shard: mixtune must drop them); a pad_token_id inside the data. Three refusal variants
are configs Transformers runs and mixtune refuses by design (attention_bias, scoring_func softmax, no shared expert).
The fixed variants are followed by --random N drawn from --seed.

Transformers builds each model (DeepseekV3ForCausalLM(config), then norms and e_score_correction_bias perturbed as
make_family_fixtures.perturb does: a zero bias would leave the biased selection untested) and writes it with
save_pretrained. FP8 is quantised with make_family_fixtures.fp8_quantize, as the fixture's ckpt_fp8 was (Transformers
cannot write it here). Transformers 5.17's own FP8 dequantisation (FineGrainedFP8Config(dequantize=True)) derives the
block size as rows // scale_rows, so a matrix with a dimension over 128 that is not a multiple of 128 (kv_b_proj's
168 rows here, 2 scale rows -> blocks of 84) is misread; as tests/models/deepseek_v3_family_test.cpp
(Fp8CheckpointLoadsToTheCeilBlockDequantisation) does, the reference for an FP8 checkpoint is Transformers' load of
its correct ceil-block dequantisation, f32(fp8) x scale_inv in f32 rounded once to the load's dtype (as a dequantising
load computes it, and mixtune's io/dequant.h), written as a bf16 and an fp32 checkpoint; the misread is reported
(fp8-hf-dequantize).
A seed is redrawn until, on the test rows of the stored model, no routing decision is within 1e-4 (neither the group
choice nor the top-k among the kept groups' experts, both on the biased sigmoid scores) and the bias changes at
least one token's experts. The facts also count the tokens whose experts would change if the groups left out were
masked with 0.0 instead of -inf (Transformers before #45441 used 0.0; mixtune uses -inf); the variant
negative_bias_mask_fill needs some. Checks per variant:
  score-fp32         `mixtune score --dtype float32 --logits` on 2 rows of 32 tokens (labels -100 on a few) vs
                     Transformers' fp32 forward of the stored checkpoint: loss rel <= 1e-5, logits max abs <= 1e-4
  score-bf16         (INFO) the same in bf16 against the CPU parity tests' bounds, loss rel <= 1e-2 and logits rel
                     L2 <= 2e-2
  convert            `mixtune convert` keeping the dtype (FP8: to bf16, as convert writes it), loaded by Transformers:
                     the same tensor names, every tensor and the logits identical to Transformers' load of the source
  convert-<dtype>    `mixtune convert --dtype` to the other float dtype: identical to Transformers' cast at load
  finetune           one `mixtune finetune` step (CPU engine, float32; AdamW lr 1e-3, betas (0.9, 0.95), eps 1e-8,
                     weight decay 0.01 on every parameter; constant lr; no clipping; moe.bias_update_rate 0, as
                     Transformers never changes the bias) on one 32-token row vs one torch.optim.AdamW step of
                     Transformers' fp32 model: step loss rel <= 1e-5; every weight abs <= 1e-5 with
                     verify_gpt_oss_unseen.py's ill-conditioning rule (|g| < 1e-6 held to 2 x lr; each tensor with
                     nonzero gradients at least half well-conditioned); every e_score_correction_bias unchanged
  finetune-pad-row   (pad_in_data only) the same with pad_token_id three times in the row: Transformers'
                     nn.Embedding(padding_idx) gives that row no gradient
  fp8-hf-dequantize  (INFO, FP8 only) Transformers' own FP8 dequantising loads, bf16 and fp32, against the ceil-block
                     references: they must differ exactly on the predicted matrices (a dimension over 128, not a
                     multiple of 128) or raise where the predicted block does not divide
  refused            (refuse_* only) `mixtune score` and `mixtune convert` each exit non-zero with exactly one stderr
                     line, `mixtune: error: <ckpt>/config.json: field '<field>'...`; Transformers' forward of the
                     same checkpoint ran (its loss is reported)
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
import verify_gpt_oss_unseen as G  # noqa: E402  (pure Python at import: its settings and checks)
from dsv3_reference import EXPERTS, FP8_BLOCK, RouterProbe, eager_experts, fp8_misread, in_memory_name  # noqa: E402

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "fixtures", "deepseek_v3"))
SEQ, ROWS, ADAMW = G.SEQ, G.ROWS, G.ADAMW
TOL = dict(G.TOL)
STORAGE = ("float32", "bfloat16", "bfloat16-all", "fp8")
OTHER_DTYPE = {"float32": "bfloat16", "bfloat16": "float32", "bfloat16-all": "float32", "fp8": "float32"}
INFO_CHECKS = ("score-bf16", "fp8-hf-dequantize")

# Every variant's config starts from these (the fixtures' conventions: bos 1, eos 2, no pad token).
BASE = dict(rms_norm_eps=1e-6, initializer_range=0.2, attention_bias=False, attention_dropout=0.0,
            max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, hidden_act="silu",
            tie_word_embeddings=False, rope_interleave=True, norm_topk_prob=True, routed_scaling_factor=2.5,
            n_shared_experts=1)


def default_rope(theta):
    return dict(rope_type="default", rope_theta=theta)


def yarn(theta, factor, original, **kw):
    return dict(rope_type="yarn", rope_theta=theta, factor=factor, beta_fast=kw.pop("beta_fast", 32.0),
                beta_slow=kw.pop("beta_slow", 1.0), original_max_position_embeddings=original, **kw)


# (name, DeepseekV3Config keywords over BASE, storage, options). Options: legacy ("type" or "rope_type": config.json
# rewritten with the hub's spellings, rope_scaling keyed so, or null for default RoPE), mtp (num_nextn_predict_layers
# with that many MTP layers' tensors in a second shard), pad_in_data (the finetune-pad-row check), bias_scale (the
# std of e_score_correction_bias, default perturb's 0.1), need_mask_flips (redraw until the 0.0 / -inf mask of the
# groups left out matters), config_extra (written into config.json last), refuse (the field mixtune must name).
FIXED = [
    ("plain_q_small_dims_top1_one_group_dense0",
     dict(vocab_size=96, hidden_size=24, num_attention_heads=3, q_lora_rank=None, kv_lora_rank=8,
          qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=6, n_routed_experts=4, num_experts_per_tok=1,
          n_group=1, topk_group=1, moe_intermediate_size=8, intermediate_size=20, num_hidden_layers=2,
          first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=0.7,
          rope_parameters=default_rope(5000.0)),
     "float32", {}),
    ("q_lora_groups4_keep2_top3_shared2_dense2_yarn_mscale_all_dim_only",
     dict(vocab_size=120, hidden_size=32, num_attention_heads=2, q_lora_rank=12, kv_lora_rank=24,
          qk_nope_head_dim=16, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=12, num_experts_per_tok=3,
          n_group=4, topk_group=2, moe_intermediate_size=12, intermediate_size=40, num_hidden_layers=3,
          first_k_dense_replace=2, n_shared_experts=2, routed_scaling_factor=1.8,
          rope_parameters=yarn(10000.0, 8.0, 512, mscale_all_dim=0.6)),
     "float32", {}),
    ("fp8_partial_blocks_mha6_q_lora",
     # kv_b_proj 6 x (16 + 12) = 168 rows and q_b_proj 6 x 24 = 144 rows: two 128-row blocks, the second partial;
     # the dense MLP's 136: partial rows in gate/up_proj, partial columns in down_proj.
     dict(vocab_size=128, hidden_size=48, num_attention_heads=6, q_lora_rank=20, kv_lora_rank=16,
          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2,
          n_group=2, topk_group=1, moe_intermediate_size=16, intermediate_size=136, num_hidden_layers=2,
          first_k_dense_replace=1, rope_parameters=yarn(10000.0, 16.0, 256, mscale=1.0, mscale_all_dim=1.0)),
     "fp8", {}),
    ("bf16_tied_all_groups_kept_legacy_type_yarn",
     dict(vocab_size=112, hidden_size=40, num_attention_heads=5, q_lora_rank=16, kv_lora_rank=12,
          qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10, n_routed_experts=6, num_experts_per_tok=2,
          n_group=3, topk_group=3, moe_intermediate_size=10, intermediate_size=24, num_hidden_layers=2,
          first_k_dense_replace=1, routed_scaling_factor=1.0, tie_word_embeddings=True,
          rope_parameters=yarn(10000.0, 40.0, 1024, mscale=0.9, mscale_all_dim=0.9)),
     "bfloat16", {"legacy": "type"}),
    ("moonlight_like_bias_bf16_plain_rope_legacy_null_scaling",
     dict(vocab_size=104, hidden_size=32, num_attention_heads=4, q_lora_rank=None, kv_lora_rank=16,
          qk_nope_head_dim=12, qk_rope_head_dim=4, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=3,
          n_group=1, topk_group=1, moe_intermediate_size=12, intermediate_size=36, num_hidden_layers=3,
          first_k_dense_replace=1, n_shared_experts=2, routed_scaling_factor=2.446, rms_norm_eps=1e-5,
          rope_interleave=False, rope_parameters=default_rope(50000.0)),
     "bfloat16-all", {"legacy": "rope_type"}),
    ("mtp2_keys_dropped_pad_in_data_yarn_no_truncate",
     dict(vocab_size=88, hidden_size=28, num_attention_heads=2, q_lora_rank=8, kv_lora_rank=10,
          qk_nope_head_dim=6, qk_rope_head_dim=8, v_head_dim=14, n_routed_experts=8, num_experts_per_tok=4,
          n_group=4, topk_group=3, moe_intermediate_size=6, intermediate_size=16, num_hidden_layers=2,
          first_k_dense_replace=1, norm_topk_prob=False, routed_scaling_factor=3.0, pad_token_id=5,
          rope_parameters=yarn(10000.0, 4.0, 2048, mscale=1.0, mscale_all_dim=0.707, truncate=False)),
     "float32", {"mtp": 2, "pad_in_data": True}),
    ("negative_bias_mask_fill",
     # One group of two experts kept for top-2, biases of std 0.8: a kept expert's biased score is often below 0,
     # where a 0.0-filled group left out would win (the mask-fill fact must be nonzero).
     dict(vocab_size=100, hidden_size=32, num_attention_heads=4, q_lora_rank=None, kv_lora_rank=8,
          qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2,
          n_group=4, topk_group=1, moe_intermediate_size=8, intermediate_size=16, num_hidden_layers=2,
          first_k_dense_replace=0, routed_scaling_factor=2.0, rope_parameters=default_rope(10000.0)),
     "float32", {"bias_scale": 0.8, "need_mask_flips": True}),
    ("refuse_attention_bias",
     dict(vocab_size=64, hidden_size=16, num_attention_heads=2, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4,
          qk_rope_head_dim=4, v_head_dim=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
          moe_intermediate_size=4, intermediate_size=8, num_hidden_layers=1, first_k_dense_replace=0,
          attention_bias=True, rope_parameters=default_rope(10000.0)),
     "float32", {"refuse": "attention_bias"}),
    ("refuse_scoring_func_softmax",
     dict(vocab_size=64, hidden_size=16, num_attention_heads=2, q_lora_rank=None, kv_lora_rank=8,
          qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, n_routed_experts=4, num_experts_per_tok=2,
          n_group=1, topk_group=1, moe_intermediate_size=4, intermediate_size=8, num_hidden_layers=1,
          first_k_dense_replace=0, rope_parameters=default_rope(10000.0)),
     "float32", {"legacy": "type", "config_extra": {"scoring_func": "softmax"}, "refuse": "scoring_func"}),
    ("refuse_no_shared_expert",
     dict(vocab_size=64, hidden_size=16, num_attention_heads=2, q_lora_rank=None, kv_lora_rank=8,
          qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, n_routed_experts=4, num_experts_per_tok=2,
          n_group=1, topk_group=1, moe_intermediate_size=4, intermediate_size=8, num_hidden_layers=1,
          first_k_dense_replace=0, n_shared_experts=0, rope_parameters=default_rope(10000.0)),
     "float32", {"refuse": "n_shared_experts"}),
]


# ---------------------------------------------------------------------------------------------------------------
# Variants (pure Python: --list works without torch)

def variant(name, config, storage, options=None):
    o = dict(options or {})
    cfg = dict(BASE)
    cfg.update(config)
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])  # MLA: one key/value head per query head
    return dict(name=name, config=cfg, storage=storage, legacy=o.get("legacy"), mtp=int(o.get("mtp", 0)),
                pad_in_data=bool(o.get("pad_in_data")), bias_scale=float(o.get("bias_scale", 0.1)),
                need_mask_flips=bool(o.get("need_mask_flips")), config_extra=o.get("config_extra") or {},
                refuse=o.get("refuse"))


def random_variants(n, seed):
    """n random configs from a seeded generator, each valid (problems() empty) and unlike every fixture."""
    rng = random.Random(seed)
    fixtures = fixture_signatures()
    out = []
    while len(out) < n:
        n_group = rng.choice([1, 1, 2, 3, 4])
        per_group = rng.choice([2, 3, 4]) if n_group > 1 else rng.randint(2, 10)
        experts = n_group * per_group
        topk_group = rng.randint(1, n_group)
        k = rng.randint(1, min(4, topk_group * per_group, experts - 1))
        layers = rng.randint(1, 4)
        if rng.random() < 0.5:
            rope = default_rope(rng.choice([1e4, 5e4]))
        else:
            extra = rng.choice([{}, dict(mscale=1.0, mscale_all_dim=1.0), dict(mscale_all_dim=0.8),
                                dict(mscale=1.0, mscale_all_dim=0.5)])
            rope = yarn(rng.choice([1e4, 5e4]), float(rng.choice([2, 4, 8, 40])), rng.choice([64, 256, 4096]),
                        beta_fast=float(rng.choice([16, 32])), beta_slow=float(rng.choice([1, 2])),
                        truncate=rng.random() < 0.7, **extra)
        cfg = dict(vocab_size=rng.randint(64, 256), hidden_size=rng.choice([16, 24, 32, 40, 48]),
                   num_attention_heads=rng.randint(1, 6), q_lora_rank=rng.choice([None, 8, 12, 16, 24]),
                   kv_lora_rank=rng.choice([4, 8, 12, 16, 24]), qk_nope_head_dim=rng.choice([2, 4, 6, 8, 12, 16]),
                   qk_rope_head_dim=rng.choice([2, 4, 6, 8]), v_head_dim=rng.choice([2, 4, 6, 8, 10, 16]),
                   n_routed_experts=experts, num_experts_per_tok=k, n_group=n_group, topk_group=topk_group,
                   moe_intermediate_size=rng.choice([4, 6, 8, 12, 16]), intermediate_size=rng.choice([8, 16, 24]),
                   num_hidden_layers=layers, first_k_dense_replace=rng.randint(0, layers - 1),
                   n_shared_experts=rng.choice([1, 1, 2, 3]), norm_topk_prob=k > 1 and rng.random() < 0.6,
                   routed_scaling_factor=rng.choice([1.0, 0.5, 1.7, 2.5]), tie_word_embeddings=rng.random() < 0.4,
                   rope_interleave=rng.random() < 0.8, rope_parameters=rope)
        storage = rng.choice(["float32", "float32", "bfloat16", "bfloat16-all", "fp8"])
        legacy = rng.choice([None, None, "type", "rope_type"])
        v = variant(f"random{seed}_{len(out)}", cfg, storage, {"legacy": legacy})
        if not problems(v) and signature(v["config"]) not in fixtures:
            out.append(v)
    return out


def all_variants(n_random, seed):
    return [variant(*f) for f in FIXED] + random_variants(n_random, seed)


def signature(c):
    """The shapes that tell two DeepSeek-V3 configs apart (config.json keys, either spelling)."""
    return (c.get("hidden_size"), c.get("num_attention_heads"), c.get("q_lora_rank"), c.get("kv_lora_rank"),
            c.get("qk_nope_head_dim"), c.get("qk_rope_head_dim"), c.get("v_head_dim"),
            c.get("n_routed_experts", c.get("num_local_experts")), c.get("num_experts_per_tok"), c.get("n_group"),
            c.get("topk_group"), c.get("moe_intermediate_size"))


def fixture_signatures():
    sigs = set()
    if os.path.isdir(FIXTURES):
        for root, _, files in os.walk(FIXTURES):
            if "config.json" in files and os.path.basename(root) in ("ckpt", "final"):
                with open(os.path.join(root, "config.json")) as f:
                    sigs.add(signature(json.load(f)))
    return sigs


def rope_of(c):
    return c.get("rope_parameters") or default_rope(10000.0)


def problems(v):
    """What would make a variant invalid for Transformers, or (other than its refusal) for mixtune (empty: fine)."""
    c, out = v["config"], []
    e, g, kg, k = c["n_routed_experts"], c["n_group"], c["topk_group"], c["num_experts_per_tok"]
    if c["num_key_value_heads"] != c["num_attention_heads"]:
        out.append("num_key_value_heads != num_attention_heads (MLA expands keys and values per query head)")
    if c["qk_rope_head_dim"] % 2 or c["qk_rope_head_dim"] < 2:
        out.append("qk_rope_head_dim odd or 0 (RoPE rotates pairs)")
    if g < 1 or e % g or e // g < 2:
        out.append("n_group must split the experts into groups of >= 2 (the group score is a top-2 sum)")
    elif not 1 <= kg <= g:
        out.append("topk_group outside [1, n_group]")
    elif not 1 <= k <= kg * (e // g):
        out.append("num_experts_per_tok outside [1, experts in the kept groups]")
    if k == e:
        out.append("top-k = every expert: the selection bias could change nothing")
    if k == 1 and c["norm_topk_prob"]:
        out.append("top-1 with norm_topk_prob: w = s / s, the router gets no gradient (finetune would compare "
                   "rounding noise)")
    if not 0 <= c["first_k_dense_replace"] < c["num_hidden_layers"]:
        out.append("first_k_dense_replace must leave a MoE layer")
    rope = rope_of(c)
    if rope["rope_type"] == "yarn" and "mscale_all_dim" in rope and "factor" not in rope:
        out.append("YaRN mscale_all_dim without factor")
    pad = c.get("pad_token_id")
    if (pad is not None and not 0 <= pad < c["vocab_size"]) or c["vocab_size"] < 8:
        out.append("vocabulary too small for the special ids")
    if v["pad_in_data"] and pad is None:
        out.append("pad_in_data without a pad_token_id")
    if v["storage"] not in STORAGE:
        out.append(f"storage {v['storage']!r} not one of {STORAGE}")
    if v["legacy"] not in (None, "type", "rope_type"):
        out.append("legacy must be 'type' or 'rope_type'")
    if v["mtp"] and v["storage"] == "fp8":
        out.append("MTP tensors are written unquantised: not with fp8")
    if not v["refuse"] and (c["attention_bias"] or c["n_shared_experts"] < 1
                            or v["config_extra"].get("scoring_func", "sigmoid") != "sigmoid"):
        out.append("a config mixtune refuses needs refuse: <field>")
    return out


def checks_of(v):
    if v["refuse"]:
        return ["refused"]
    names = ["score-fp32", "score-bf16", "convert", f"convert-{OTHER_DTYPE[v['storage']]}", "finetune"]
    names += ["finetune-pad-row"] if v["pad_in_data"] else []
    return names + (["fp8-hf-dequantize"] if v["storage"] == "fp8" else [])


def describe(v):
    c = v["config"]
    rope = rope_of(c)
    rope_text = rope["rope_type"] + "".join(f" {k}={rope[k]}" for k in ("factor", "mscale", "mscale_all_dim",
                                                                         "truncate") if k in rope)
    dense = c["first_k_dense_replace"]
    return (f"H {c['hidden_size']}, heads {c['num_attention_heads']}, q_lora {c['q_lora_rank']}, "
            f"kv_lora {c['kv_lora_rank']}, nope/rope/v {c['qk_nope_head_dim']}/{c['qk_rope_head_dim']}/"
            f"{c['v_head_dim']}, E {c['n_routed_experts']} top-{c['num_experts_per_tok']} groups "
            f"{c['topk_group']}/{c['n_group']}, shared {c['n_shared_experts']}, I {c['moe_intermediate_size']}/"
            f"{c['intermediate_size']}, layers {'D' * dense}{'E' * (c['num_hidden_layers'] - dense)}, "
            f"norm_topk {c['norm_topk_prob']}, scale {c['routed_scaling_factor']}, rope {rope_text}"
            f"{'' if c['rope_interleave'] else ' (not interleaved)'}, "
            f"{'tied' if c['tie_word_embeddings'] else 'untied'}, vocab {c['vocab_size']}, {v['storage']}"
            + (f", hub spellings ({v['legacy']})" if v["legacy"] else "") + (f", MTP {v['mtp']}" if v["mtp"] else "")
            + (f", pad {c['pad_token_id']}" if c.get("pad_token_id") is not None else "")
            + (f", bias std {v['bias_scale']}" if v["bias_scale"] != 0.1 else "")
            + (f", config {v['config_extra']}" if v["config_extra"] else "")
            + (f"; mixtune must refuse field '{v['refuse']}'" if v["refuse"] else ""))


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

def run_cmd(args, cwd=None, timeout=900):
    """(exit status, stdout, stderr) without raising: the refusal check wants the failure."""
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def legacy_config(path, rope_key, extra):
    """config.json rewritten with the spellings of deepseek-ai/DeepSeek-V3 and moonshotai/Moonlight-16B-A3B
    (hf-numerics.md §1.2, §5.1): torch_dtype, top-level rope_theta, rope_scaling keyed by `rope_key` (null for
    default RoPE), the hub keys Transformers ignores; then `extra` on top."""
    with open(path) as f:
        c = json.load(f)
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    rp = dict(c.pop("rope_parameters", None) or {})
    c["rope_theta"] = rp.pop("rope_theta", 10000.0)
    kind = rp.pop("rope_type", "default")
    c["rope_scaling"] = None if kind == "default" else dict(rp, **{rope_key: kind})
    c.update(scoring_func="sigmoid", topk_method="noaux_tc", seq_aux=True, aux_loss_alpha=0.001, moe_layer_freq=1,
             ep_size=1)
    for derived in ("num_mtp_layers", "head_dim", "qk_head_dim"):  # not in hub configs; Transformers derives them
        c.pop(derived, None)
    c.update(extra)
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def edit_config(path, extra):
    with open(path) as f:
        c = json.load(f)
    c.update(extra)
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def rows_for(v, gen, torch):
    """(score rows [ROWS, SEQ] with labels, finetune row [1, SEQ] with labels): ids avoid pad_token_id except in
    the pad_in_data variant's finetune row, which holds it three times."""
    c = v["config"]
    vocab, pad = c["vocab_size"], c.get("pad_token_id")

    def ids(n):
        if pad is None:
            return torch.randint(0, vocab, (n, SEQ), generator=gen)
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
        # The checkpoints Transformers' reference loads, per dtype: the stored one, or for FP8 its ceil-block
        # dequantisation rounded once to that dtype (f32 products, as a dequantising load in that dtype computes).
        fp8 = v["storage"] == "fp8"
        self.ref_ckpts = {dt: os.path.join(self.dir, f"ckpt_dequantized_{dt}") if fp8 else self.ckpt
                          for dt in ("float32", "bfloat16")}
        self.fp8_tensors = {}  # stored name -> (shape, scale shape), FP8 only
        self.make()

    # -- the checkpoint under test
    def make(self):
        torch, v = self.torch, self.v
        cfg = {k: x for k, x in v["config"].items()}
        fam_idx = sum(map(ord, v["name"])) % 997
        for attempt in range(20):
            seed = 200000 + 1000 * fam_idx + attempt
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            config = self.tf.DeepseekV3Config(**cfg)
            model = eager_experts(self.tf.DeepseekV3ForCausalLM(config).float())
            self.fx.perturb(model, "deepseek_v3", gen)
            with torch.no_grad():
                for n, b in model.named_buffers():
                    if n.endswith("e_score_correction_bias"):
                        b.copy_(v["bias_scale"] * torch.randn(b.shape, generator=gen))
            (self.score_ids, self.score_labels), (self.ft_ids, self.ft_labels) = rows_for(v, gen, torch)
            for d in [self.ckpt] + list(self.ref_ckpts.values()):
                shutil.rmtree(d, ignore_errors=True)
            self.save(model, gen)
            ref = self.load(torch.float32)
            probe = RouterProbe(torch, ref, ref.config)
            with torch.no_grad():
                out = ref(input_ids=self.score_ids, labels=self.score_labels, use_cache=False)
                ref(input_ids=self.ft_ids, use_cache=False)
            probe.remove()
            self.seed, self.probe, self.hf_loss = seed, probe, float(out.loss)
            why = []
            if probe.min_gap <= TOL["router_gap"]:
                why.append(f"a routing gap of {probe.min_gap:.2e}")
            if probe.bias_flips == 0:
                why.append("no token whose experts the bias changes")
            if v["need_mask_flips"] and probe.mask_flips == 0:
                why.append("no token whose experts a 0.0 mask would change")
            if v["refuse"] or not why:
                break
            print(f"{v['name']}: seed {seed} has {', '.join(why)}, redrawn", flush=True)
        p = self.probe
        self.facts = dict(seed=self.seed, router_gap=None if math.isinf(p.min_gap) else p.min_gap,
                          routed_tokens=p.tokens, bias_flips=p.bias_flips, mask_flips=p.mask_flips,
                          hf_score_loss=self.hf_loss,
                          attn_implementation=getattr(ref.config, "_attn_implementation", None),
                          experts_implementation=getattr(ref.config, "_experts_implementation", None),
                          parameters=sum(q.numel() for q in ref.parameters()),
                          stored={f: os.path.getsize(os.path.join(self.ckpt, f))
                                  for f in sorted(os.listdir(self.ckpt))})
        print(f"{v['name']}: seed {self.seed}, routing gap {p.min_gap:.3g}, tokens the bias moves {p.bias_flips} "
              f"of {p.tokens}, a 0.0 mask would move {p.mask_flips}; {self.facts}", flush=True)

    def save(self, model, gen):
        torch, v = self.torch, self.v
        src = os.path.join(self.dir, "ckpt_fp32_source")
        shutil.rmtree(src, ignore_errors=True)
        if v["storage"] == "float32":
            model.save_pretrained(self.ckpt)
        elif v["storage"] == "bfloat16-all":  # Module.to: the fp32 bias is rounded and stored BF16 too
            model.to(torch.bfloat16).save_pretrained(self.ckpt)
            model.float()
        elif v["storage"] == "bfloat16":  # as a bf16 load saves it: _keep_in_fp32_modules_strict keeps the bias F32
            model.save_pretrained(src)
            self.tf.DeepseekV3ForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(self.ckpt)
        else:
            model.save_pretrained(src)
            self.save_fp8(src)
        path = os.path.join(self.ckpt, "config.json")
        if v["legacy"]:
            legacy_config(path, v["legacy"], v["config_extra"])
        elif v["config_extra"]:
            edit_config(path, v["config_extra"])
        if v["mtp"]:
            self.add_mtp_layers(gen)

    def save_fp8(self, src):
        """Every projection F8_E4M3 + weight_scale_inv over 128x128 blocks (ceil-sized: partial edge blocks), the
        bias F32, the rest bf16, as make_family_fixtures.make_quantized; and beside it the correct dequantisation
        (f32(fp8) x scale_inv in f32, rounded once to bf16 or kept f32) as plain bf16 and fp32 checkpoints,
        Transformers' references."""
        torch, fx = self.torch, self.fx
        q_tensors, dequant = {}, {}
        for n, t in fx.read_ckpt(src).items():
            if fx.fp8_target(n, t):
                q, s = fx.fp8_quantize(t, FP8_BLOCK)
                q_tensors[n], q_tensors[n[:-len("weight")] + "weight_scale_inv"] = q, s
                dequant[n] = fx.fp8_dequantize(q, s, FP8_BLOCK)
                self.fp8_tensors[n] = (list(q.shape), list(s.shape))
            elif n.endswith("e_score_correction_bias"):
                q_tensors[n] = dequant[n] = t.float()
            else:
                q_tensors[n] = t.to(torch.bfloat16)
                dequant[n] = q_tensors[n].float()
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        qcfg = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
        bf16 = {n: t if n.endswith("e_score_correction_bias") else t.to(torch.bfloat16) for n, t in dequant.items()}
        for d, tensors, dt, quant in ((self.ckpt, q_tensors, "bfloat16", qcfg),
                                      (self.ref_ckpts["bfloat16"], bf16, "bfloat16", None),
                                      (self.ref_ckpts["float32"], dequant, "float32", None)):
            os.makedirs(d)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(dict(cfg, dtype=dt, **({"quantization_config": quant} if quant else {})), f, indent=2,
                          sort_keys=True)
            gen_cfg = os.path.join(src, "generation_config.json")
            if os.path.isfile(gen_cfg):
                shutil.copy(gen_cfg, d)
            fx.save_tensors(tensors, os.path.join(d, "model.safetensors"))

    def add_mtp_layers(self, gen):
        """The hub's MTP layout (DeepSeek-V3's model.layers.61): num_nextn_predict_layers layers after the decoder
        layers, each with the last decoder layer's tensor names and shapes plus enorm, hnorm, eh_proj, embed_tokens
        and shared_head.{norm, head}, random values, in a second shard with an index, as the hub shards them."""
        torch, fx, c = self.torch, self.fx, self.v["config"]
        layers, h, vocab = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
        main = os.path.join(self.ckpt, "model.safetensors")
        tensors = fx.read_ckpt(self.ckpt)
        dt = tensors["model.embed_tokens.weight"].dtype
        last = f"model.layers.{layers - 1}."
        mtp = {}
        for j in range(self.v["mtp"]):
            p = f"model.layers.{layers + j}."
            for n, t in tensors.items():
                if n.startswith(last):
                    mtp[p + n[len(last):]] = torch.randn(t.shape, generator=gen).to(t.dtype)
            for n, shape in (("enorm.weight", [h]), ("hnorm.weight", [h]), ("eh_proj.weight", [h, 2 * h]),
                             ("embed_tokens.weight", [vocab, h]), ("shared_head.norm.weight", [h]),
                             ("shared_head.head.weight", [vocab, h])):
                mtp[p + n] = torch.randn(shape, generator=gen).to(dt)
        names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        os.rename(main, os.path.join(self.ckpt, names[0]))
        fx.save_tensors(mtp, os.path.join(self.ckpt, names[1]))
        size = sum(t.numel() * t.element_size() for t in list(tensors.values()) + list(mtp.values()))
        index = dict(metadata=dict(total_size=size),
                     weight_map=dict({n: names[0] for n in tensors}, **{n: names[1] for n in mtp}))
        with open(os.path.join(self.ckpt, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
        edit_config(os.path.join(self.ckpt, "config.json"), {"num_nextn_predict_layers": self.v["mtp"]})
        self.mtp_names = sorted(mtp)

    def load(self, dtype, path=None):
        """Transformers' load of `path` (default: the reference checkpoint of `dtype`) in `dtype`, on the per-expert
        loop."""
        ref = self.ref_ckpts["float32" if dtype == self.torch.float32 else "bfloat16"]
        m = self.tf.DeepseekV3ForCausalLM.from_pretrained(path or ref, dtype=dtype, experts_implementation=EXPERTS)
        m = eager_experts(m)
        m.eval()
        return m

    def stored_dtype(self):
        return self.torch.float32 if self.v["storage"] == "float32" else self.torch.bfloat16


# ---------------------------------------------------------------------------------------------------------------
# Checks: each returns (passed, detail). score and convert are verify_gpt_oss_unseen's (they ask the Variant for
# Transformers' loads); the finetune comparison adds the buffers.

def check_convert(var, binary, to_dtype=None):
    ok, detail = G.check_convert(var, binary, to_dtype)
    if var.v["mtp"] and to_dtype is None:
        out = os.path.join(var.dir, "convert_same")
        written = set()
        for fn in os.listdir(out):
            if fn.endswith(".safetensors"):
                with open(os.path.join(out, fn), "rb") as f:
                    n = int.from_bytes(f.read(8), "little")
                    written |= set(json.loads(f.read(n))) - {"__metadata__"}
        kept = sorted(set(var.mtp_names) & written)
        ok = ok and not kept
        detail += f"; MTP tensors in the source {len(var.mtp_names)}, in the converted files {len(kept)} (must be 0)"
    return ok, detail


def check_finetune(var, binary, whole_pad_row):
    """One mixtune finetune step vs one torch AdamW step. whole_pad_row False: the pad_token_id embedding row (if
    any) is left out of the comparison (reported by finetune-pad-row)."""
    torch = var.torch
    run = os.path.join(var.dir, "finetune_run")
    shutil.rmtree(run, ignore_errors=True)
    data = os.path.join(var.dir, "finetune.jsonl")
    H.write_jsonl(data, var.ft_ids, var.ft_labels)
    recipe = os.path.join(var.dir, "finetune.yaml")
    y = H.yaml_float
    with open(recipe, "w") as f:
        f.write(f"model: {{path: {var.ckpt}, dtype: float32}}\n"
                f"data: {{train: {data}, seq_len: {SEQ}, pack: false}}\n"
                "train: {micro_batch_size: 1, grad_accum: 1, max_steps: 1, seed: 1, device: cpu, log_every: 1}\n"
                f"optimizer: {{name: adamw, lr: {y(ADAMW['lr'])}, betas: [{y(ADAMW['betas'][0])}, "
                f"{y(ADAMW['betas'][1])}], eps: {y(ADAMW['eps'])}, weight_decay: {y(ADAMW['weight_decay'])}, "
                "decay_norms_and_biases: true}\n"
                "schedule: {name: constant}\n"
                "clip: {max_grad_norm: 0}\n"
                "moe: {bias_update_rate: 0.0}\n"
                f"checkpoint: {{dir: {run}}}\n")
    H.sh([binary, "finetune", recipe], cwd=var.dir)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
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
    biases = {n: b.detach() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    got = var.load(torch.float32, os.path.join(run, "final")).state_dict()
    pad = var.v["config"].get("pad_token_id")
    worst, worst_name, bad, ill, total, missing, untested = 0.0, None, 0, 0, 0, [], []
    for n, w in want.items():
        if n not in got:
            missing.append(n)
            continue
        g, gr = got[n].float(), grads[n]
        diff = (g - w).abs()
        if not whole_pad_row and pad is not None and n == "model.embed_tokens.weight":
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
    moved = [n for n, b in biases.items() if n not in got or not torch.equal(got[n].float(), b.float())]
    rel = abs(got_loss - ref_loss) / abs(ref_loss)
    ok = not missing and not moved and rel <= TOL["loss_rel"] and bad == 0 and not untested
    detail = (f"step loss {got_loss:.7f} vs {ref_loss:.7f} rel {rel:.1e}; weights: {bad} of {total} outside the "
              f"bound, worst well-conditioned {worst:.1e} ({worst_name}), {ill} ill-conditioned (|g| < 1e-6); "
              f"{len(biases) - len(moved)} of {len(biases)} e_score_correction_bias unchanged")
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


def check_fp8_hf_dequantize(var):
    """Transformers' own FP8 loads (FineGrainedFP8Config(dequantize=True), in bf16 and in fp32) against the
    ceil-block references of that dtype: the tensors that differ must be the predicted misreads, or the load must
    raise where one is predicted."""
    torch = var.torch
    verdicts = {n: fp8_misread(*shapes) for n, shapes in var.fp8_tensors.items()}
    raises = sorted(n for n, x in verdicts.items() if x == "raises")
    predicted = sorted({in_memory_name(n) for n, x in verdicts.items() if x == "misread"})
    ok, out = True, []
    for dt in (torch.bfloat16, torch.float32):
        name = str(dt).replace("torch.", "")
        try:
            m = var.tf.DeepseekV3ForCausalLM.from_pretrained(
                var.ckpt, dtype=dt, quantization_config=var.tf.FineGrainedFP8Config(dequantize=True))
        except Exception as e:  # noqa: BLE001 -- the predicted failure, when a block does not divide
            ok = ok and bool(raises)
            out.append(f"{name}: raised {type(e).__name__}: {str(e)[:120]}")
            continue
        got, ref = m.state_dict(), var.load(dt).state_dict()
        if set(got) != set(ref):
            ok = False
            out.append(f"{name}: tensor names differ from the reference: {sorted(set(got) ^ set(ref))[:4]}")
            continue
        differ = sorted(n for n in ref if got[n].dtype != ref[n].dtype or got[n].shape != ref[n].shape
                        or not torch.equal(got[n], ref[n]))
        ok = ok and differ == predicted and not raises
        out.append(f"{name}: {len(differ)} of {len(ref)} tensors differ ({', '.join(differ) or 'none'})")
    return ok, (f"Transformers' dequantising load against the ceil-block dequantisation; predicted misreads (a "
                f"dimension > {FP8_BLOCK} not a multiple of it): {', '.join(predicted) or 'none'}"
                + (f"; predicted to raise on {raises[:3]}" if raises else "") + "; " + "; ".join(out))


def check_refused(var, binary):
    """mixtune score and convert each refuse the checkpoint in one stderr line naming the config field."""
    field = var.v["refuse"]
    data = os.path.join(var.dir, "score.jsonl")
    H.write_jsonl(data, var.score_ids, var.score_labels)
    want = f"mixtune: error: {os.path.join(var.ckpt, 'config.json')}: field '{field}'"
    ok, out = True, []
    for cmd in (["score", "--model", var.ckpt, "--data", data],
                ["convert", "--in", var.ckpt, "--out", os.path.join(var.dir, "convert_refused")]):
        rc, _, err = run_cmd([binary] + cmd)
        lines = [line for line in err.splitlines() if line.strip()]
        good = rc != 0 and len(lines) == 1 and lines[0].startswith(want)
        ok = ok and good
        out.append(f"{cmd[0]} exit {rc}, {len(lines)} stderr line(s)" + (f": {lines[-1][:200]}" if lines else ""))
    return ok, (f"Transformers ran it (loss {var.hf_loss:.5f}); expects '{want}...'; " + "; ".join(out))


# ---------------------------------------------------------------------------------------------------------------

def main(argv=None):
    a, variants, binary = H.parse_args(__doc__, all_variants, problems, print_list, argv)
    if binary is None:
        return a.list_status

    import torch
    import transformers
    import make_family_fixtures as fx  # its perturb, fp8_quantize / fp8_dequantize, fp8_target, read_ckpt, save_tensors

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(a.work, exist_ok=True)
    work = os.path.abspath(a.work)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; {len(variants)} variants; "
          f"fixtures' shapes: {sorted(fixture_signatures(), key=str)}", flush=True)
    results = []
    for v in variants:
        t0 = time.monotonic()
        print(f"== {v['name']}: {describe(v)}", flush=True)
        try:
            var = Variant(v, work, torch, transformers, fx)
        except Exception as e:  # noqa: BLE001 -- reported as the variant's build failure
            H.build_failure(results, v["name"], e)
            continue
        if v["refuse"]:
            runs = [("refused", lambda: check_refused(var, binary))]
        else:
            other = OTHER_DTYPE[v["storage"]]
            runs = [("score-fp32", lambda: G.check_score(var, binary, "float32")),
                    ("score-bf16", lambda: G.check_score(var, binary, "bfloat16")),
                    ("convert", lambda: check_convert(var, binary)),
                    (f"convert-{other}", lambda: check_convert(var, binary, other)),
                    ("finetune", lambda: check_finetune(var, binary, whole_pad_row=False))]
            if v["pad_in_data"]:
                runs.append(("finetune-pad-row", lambda: check_finetune(var, binary, whole_pad_row=True)))
            if v["storage"] == "fp8":
                runs.append(("fp8-hf-dequantize", lambda: check_fp8_hf_dequantize(var)))
        H.run_checks(results, v["name"], runs, t0, INFO_CHECKS)
        with open(os.path.join(var.dir, "facts.json"), "w") as f:
            json.dump(dict(variant=v, facts=var.facts), f, indent=2)
        results[-1]["facts"] = var.facts
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(dict(transformers=transformers.__version__, torch=torch.__version__, tolerances=TOL,
                       results=results), f, indent=2)
    counted, fails, over = H.print_table(results)
    print(f"\n(INFO: reported, not counted; INFO!: outside its bounds or prediction: {over})")
    print(f"verify-dsv3: {counted - fails} passed, {fails} failed ({work}/results.json)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
