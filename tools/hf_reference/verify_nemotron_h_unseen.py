#!/usr/bin/env python3
"""Nemotron-H checkpoints made by Transformers itself, of shapes the fixtures do not have, checked against mixtune.

Run on the GPU machine (torch 2.11, transformers 5.17; all the math on the CPU, fp32 unless stated):
    verify_nemotron_h_unseen.py MIXTUNE_BINARY WORK_DIR [--random N] [--seed S] [--only NAME ...]
    verify_nemotron_h_unseen.py --list [--random N] [--seed S]     # the variants and their checks; no torch needed

Each variant is a NemotronHConfig the fixtures (tests/fixtures/nemotron_h, make_family_fixtures.py) do not cover:
other layer patterns (M E * - in other orders and counts), Mamba2 shapes (heads x head_dim, state, groups 1 to 4,
conv kernels 2 to 4, chunk sizes that do and do not divide the 32-token rows, one chunk longer than the row),
in_proj/out_proj biases (use_bias), no conv bias, an active dt floor (time_step_min), expert counts, top-k and
group-limited routing (n_group > 1), MHA / GQA / MQA attention with head_dim x heads != hidden, stored in float32 or
bfloat16, and one config.json in the hub's spellings (hybrid_override_pattern, mamba_* aliases, norm_eps,
torch_dtype). The fixed variants below are followed by --random N drawn from --seed.

Transformers builds each model (make_family_fixtures.build_model with use_mamba_kernels=False, so its torch SSD path
runs, which make_family_fixtures.MambaPathProbe also forces and checks; norms, biases and the selection bias perturbed
as make_family_fixtures.perturb does) and writes it with save_pretrained. A seed is redrawn until no top-k decision of
the stored model on the test rows is within 1e-4. Checks per variant:
  score-fp32         `mixtune score --dtype float32 --logits` on 2 rows of 32 tokens (labels -100 on a few) vs
                     Transformers' fp32 forward of the stored checkpoint: loss rel <= 1e-5, logits max abs <= 1e-4
  score-bf16         (INFO: reported, not counted) the same in bf16 on both sides: loss rel <= 1e-2, logits rel L2
                     <= 0.75 x Transformers' own bf16-vs-fp32 logits error (the parity test's bound)
  convert            `mixtune convert` keeping the dtype, loaded by Transformers: the same tensor names, every tensor
                     and the logits identical to Transformers' load of the source
  convert-<dtype>    `mixtune convert --dtype` to the other float dtype: identical to Transformers' own cast at load
  finetune           one `mixtune finetune` step (CPU engine, float32; AdamW lr 1e-3, betas (0.9, 0.95), eps 1e-8,
                     weight decay 0.01 on every parameter; constant lr; no clipping) on one 32-token row vs one
                     torch.optim.AdamW step of Transformers' fp32 model on the same row: step loss rel <= 1e-5; every
                     weight abs <= 1e-5, except where torch's gradient is nonzero and below 1e-6 (held to 2 x lr); every
                     parameter tensor with nonzero gradients must keep at least half of them well-conditioned
Prints a PASS/FAIL table (INFO rows never fail) and WORK_DIR/results.json; exit status 0 when every counted check
passed, 1 otherwise, 2 on a usage error. Each variant's files stay in WORK_DIR/<variant>/.
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
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "fixtures", "nemotron_h"))

SEQ = 32          # tokens per row (a multiple of 8: finetune rounds rows up to 8)
ROWS = 2          # score rows
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
TOL = dict(loss_rel=1e-5, logits_abs=1e-4, bf16_loss_rel=1e-2, bf16_logits_of_e16=0.75, step_abs=1e-5,
           ill_grad=1e-6, ill_tensor_share=0.5, router_gap=1e-4)
STORAGE = ("float32", "bfloat16")
INFO_CHECKS = ("score-bf16",)
KIND_OF = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}  # make_family_fixtures.NEMH_KIND_NAMES keys

# Every variant's config starts from these (the fixtures' conventions: bos 1, eos 2, pad 0).
BASE = dict(vocab_size=128, layer_norm_epsilon=1e-5, initializer_range=0.3, attention_bias=False,
            max_position_embeddings=4096, mlp_hidden_act="relu2", mlp_bias=False, use_mamba_kernels=False,
            mamba_hidden_act="silu", use_conv_bias=True, use_bias=False, n_shared_experts=1, n_group=1, topk_group=1,
            norm_topk_prob=True, routed_scaling_factor=1.0, time_step_min=0.001, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)

# (name, pattern, NemotronHConfig keywords over BASE, storage, options). Options: legacy (config.json rewritten with
# the hub's spellings).
FIXED = [
    ("groups4_state8_chunk5_grouped_router",
     "MEME*-",
     dict(hidden_size=48, mamba_num_heads=8, mamba_head_dim=8, n_groups=4, ssm_state_size=8, conv_kernel=3,
          chunk_size=5, num_attention_heads=6, num_key_value_heads=3, head_dim=8, intermediate_size=24,
          n_routed_experts=6, num_experts_per_tok=3, n_group=3, topk_group=2, moe_intermediate_size=16,
          moe_shared_expert_intermediate_size=24, routed_scaling_factor=2.5),
     "float32", {}),
    ("proj_bias_no_conv_bias_dt_floor_one_chunk_bf16",
     "M-*M",
     dict(hidden_size=40, mamba_num_heads=2, mamba_head_dim=16, n_groups=1, ssm_state_size=32, conv_kernel=2,
          chunk_size=64, use_bias=True, use_conv_bias=False, time_step_min=0.3, num_attention_heads=4,
          num_key_value_heads=2, head_dim=12, intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=8, moe_shared_expert_intermediate_size=8, norm_topk_prob=False,
          routed_scaling_factor=1.7),
     "bfloat16", {}),
    ("hub_spellings_mha_chunk7",
     "*EMM",
     dict(hidden_size=32, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, ssm_state_size=12, conv_kernel=4,
          chunk_size=7, num_attention_heads=4, num_key_value_heads=4, head_dim=12, intermediate_size=16,
          n_routed_experts=5, num_experts_per_tok=2, moe_intermediate_size=24, moe_shared_expert_intermediate_size=16,
          routed_scaling_factor=2.5),
     "float32", {"legacy": True}),
    # Top-1 without normalisation: normalised, the one weight is s/s = 1 and the router's gradient only rounding
    # residue (~1e-9), which one AdamW step turns into ±lr moves that no comparison can check (session 37's run).
    ("mqa_top1_nano_like_pattern",
     "MEMEM*EM",
     dict(hidden_size=64, mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4,
          chunk_size=8, num_attention_heads=4, num_key_value_heads=1, head_dim=16, intermediate_size=32,
          n_routed_experts=4, num_experts_per_tok=1, moe_intermediate_size=16, moe_shared_expert_intermediate_size=32,
          routed_scaling_factor=2.5, norm_topk_prob=False),
     "float32", {}),
]


# ---------------------------------------------------------------------------------------------------------------
# Variants (pure Python: --list works without torch)

def variant(name, pattern, config, storage, options=None):
    cfg = dict(BASE)
    cfg.update(config)
    return dict(name=name, pattern=pattern, config=cfg, storage=storage,
                legacy=bool((options or {}).get("legacy")))


def random_variants(n, seed):
    """n random configs from a seeded generator, each valid (problems() empty) and unlike every fixture."""
    rng = random.Random(seed)
    fixtures = fixture_signatures()
    out = []
    while len(out) < n:
        groups = rng.choice([1, 2, 4])
        heads = groups * rng.choice([1, 2, 3])
        kv = rng.choice([1, 2, 4])
        experts = rng.randint(2, 9)
        pattern = "M" + "".join(rng.choice("MMEE*-") for _ in range(rng.randint(1, 5)))
        cut = rng.randint(0, len(pattern) - 1)
        pattern = pattern[cut:] + pattern[:cut]  # the Mamba2 layer anywhere
        cfg = dict(hidden_size=rng.choice([16, 24, 32, 48, 64]), mamba_num_heads=heads,
                   mamba_head_dim=rng.choice([4, 8, 12, 16]), n_groups=groups, ssm_state_size=rng.choice([4, 8, 16]),
                   conv_kernel=rng.randint(2, 4), chunk_size=rng.choice([3, 4, 5, 8, 16, 40]),
                   use_bias=rng.random() < 0.3, use_conv_bias=rng.random() < 0.8,
                   time_step_min=rng.choice([0.001, 0.01, 0.2]), num_attention_heads=kv * rng.choice([1, 2, 3]),
                   num_key_value_heads=kv, head_dim=rng.choice([6, 8, 12, 16]),
                   intermediate_size=rng.choice([8, 16, 24]), n_routed_experts=experts,
                   num_experts_per_tok=rng.randint(1, min(experts, 3)), moe_intermediate_size=rng.choice([8, 16]),
                   moe_shared_expert_intermediate_size=rng.choice([8, 16, 24]),
                   norm_topk_prob=rng.random() < 0.5, routed_scaling_factor=rng.choice([1.0, 1.7, 2.5]))
        v = variant(f"random{seed}_{len(out)}", pattern, cfg, rng.choice(STORAGE))
        if not problems(v) and signature(v["config"], pattern) not in fixtures:
            out.append(v)
    return out


def all_variants(n_random, seed):
    return [variant(*f) for f in FIXED] + random_variants(n_random, seed)


def pattern_of_json(c):
    letters = {"mamba": "M", "linear_attention": "M", "moe": "E", "attention": "*", "full_attention": "*", "mlp": "-"}
    kinds = c.get("layers_block_type") or c.get("layer_types")
    return "".join(letters[k] for k in kinds) if kinds else c.get("hybrid_override_pattern", "ME*-")


def signature(c, pattern):
    """The shapes that tell two Nemotron-H configs apart (config.json keys, either spelling)."""
    return (pattern, c.get("hidden_size"), c.get("mamba_num_heads"), c.get("mamba_head_dim"),
            c.get("n_groups", c.get("mamba_n_groups")), c.get("ssm_state_size"),
            c.get("chunk_size", c.get("mamba_chunk_size")), c.get("n_routed_experts"), c.get("num_experts_per_tok"))


def fixture_signatures():
    sigs = set()
    if os.path.isdir(FIXTURES):
        for v in sorted(os.listdir(FIXTURES)):
            path = os.path.join(FIXTURES, v, "ckpt", "config.json")
            if os.path.isfile(path):
                with open(path) as f:
                    c = json.load(f)
                sigs.add(signature(c, pattern_of_json(c)))
    return sigs


def problems(v):
    """What would make a variant invalid for Transformers or mixtune (empty: fine)."""
    c, out = v["config"], []
    if not v["pattern"] or set(v["pattern"]) - set(KIND_OF):
        out.append("pattern must be a non-empty string of M E * -")
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        out.append("num_attention_heads not a multiple of num_key_value_heads")
    if c["mamba_num_heads"] % c["n_groups"]:
        out.append("mamba_num_heads not a multiple of n_groups")
    e, g = c["n_routed_experts"], c["n_group"]
    if e % g or e // g < 2:
        out.append("n_routed_experts must split into n_group groups of >= 2 (HF takes the top 2 of each)")
    elif not 1 <= c["topk_group"] <= g or not 1 <= c["num_experts_per_tok"] <= c["topk_group"] * (e // g):
        out.append("topk_group / num_experts_per_tok outside what the groups hold")
    if v["storage"] not in STORAGE:
        out.append(f"storage {v['storage']!r} not one of {STORAGE}")
    return out


def checks_of(v):
    other = {"float32": "bfloat16", "bfloat16": "float32"}[v["storage"]]
    return ["score-fp32", "score-bf16", "convert", f"convert-{other}", "finetune"]


def describe(v):
    c = v["config"]
    route = (f"E {c['n_routed_experts']} top-{c['num_experts_per_tok']}"
             + (f" in {c['n_group']} groups keep {c['topk_group']}" if c["n_group"] > 1 else "")
             + f" x {c['routed_scaling_factor']}{'' if c['norm_topk_prob'] else ' unnormalised'}")
    return (f"{v['pattern']}: H {c['hidden_size']}, mamba {c['mamba_num_heads']}x{c['mamba_head_dim']} state "
            f"{c['ssm_state_size']} groups {c['n_groups']} conv {c['conv_kernel']} chunk {c['chunk_size']}"
            f"{' +proj bias' if c['use_bias'] else ''}{'' if c['use_conv_bias'] else ' -conv bias'} dt>="
            f"{c['time_step_min']}, attn {c['num_attention_heads']}/{c['num_key_value_heads']}x{c['head_dim']}, "
            f"{route}, I {c['moe_intermediate_size']} shared {c['moe_shared_expert_intermediate_size']} dense "
            f"{c['intermediate_size']}, {v['storage']}" + (", hub spellings" if v["legacy"] else ""))


def print_list(variants):
    fixtures = fixture_signatures()
    bad = 0
    for v in variants:
        p = problems(v) + (["same shapes as a fixture"] if signature(v["config"], v["pattern"]) in fixtures else [])
        bad += bool(p)
        print(f"{v['name']}: {describe(v)}\n    checks: {', '.join(checks_of(v))}"
              + (f"\n    INVALID: {'; '.join(p)}" if p else ""))
    print(f"{len(variants)} variants, {sum(len(checks_of(v)) for v in variants)} checks; fixtures read: "
          f"{len(fixtures)} ({FIXTURES})" + (f"; {bad} invalid" if bad else ""))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------------------------
# Helpers

def legacy_config(path):
    """config.json rewritten with the spellings of NVIDIA's hub checkpoints (hf-numerics.md §1.2, §6.1)."""
    with open(path) as f:
        c = json.load(f)
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    c["hybrid_override_pattern"] = pattern_of_json(c)
    c.pop("layers_block_type", None)
    c["num_hidden_layers"] = len(c["hybrid_override_pattern"])
    for v5, hub in (("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"),
                    ("chunk_size", "mamba_chunk_size")):
        c[hub] = c.pop(v5)
    c["norm_eps"] = c["layer_norm_epsilon"]
    c["rope_theta"] = 10000
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def rows_for(v, gen, torch):
    """(score rows [ROWS, SEQ] with labels, finetune row [1, SEQ] with labels)."""
    vocab = v["config"]["vocab_size"]
    score_ids = torch.randint(3, vocab, (ROWS, SEQ), generator=gen)
    score_labels = score_ids.clone()
    score_labels[0, :4] = -100
    score_labels[1, SEQ // 2] = -100
    ft_ids = torch.randint(3, vocab, (1, SEQ), generator=gen)
    ft_labels = ft_ids.clone()
    ft_labels[0, :5] = -100
    return (score_ids, score_labels), (ft_ids, ft_labels)


class Variant:
    def __init__(self, v, work, torch, transformers, fx):
        self.v, self.torch, self.tf, self.fx = v, torch, transformers, fx
        self.dir = os.path.join(work, v["name"])
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.make()

    def make(self):
        torch, v, fx = self.torch, self.v, self.fx
        fam = dict(config="NemotronHConfig", model="NemotronHForCausalLM",
                   base=dict(v["config"], layers_block_type=[KIND_OF[ch] for ch in v["pattern"]]))
        fam_idx = sum(map(ord, v["name"])) % 997
        for attempt in range(20):
            seed = 300000 + 1000 * fam_idx + attempt
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            _, model = fx.build_model(fam, {})
            fx.perturb(model, "nemotron_h", gen)
            (self.score_ids, self.score_labels), (self.ft_ids, self.ft_labels) = rows_for(v, gen, torch)
            shutil.rmtree(self.ckpt, ignore_errors=True)
            if v["storage"] == "float32":
                model.save_pretrained(self.ckpt)
            else:
                model.to(torch.bfloat16).save_pretrained(self.ckpt)
            if v["legacy"]:
                legacy_config(os.path.join(self.ckpt, "config.json"))
            ref = self.load(torch.float32)
            margin = fx.RouterMargin(ref, "nemotron_h", ref.config, "mixer.gate")
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
                          layers_block_type=list(ref.config.layers_block_type),
                          parameters=sum(p.numel() for p in ref.parameters()))
        print(f"{v['name']}: seed {self.seed}, router gap {self.gap:.3g}; {self.facts}", flush=True)

    def load(self, dtype, path=None):
        m = self.tf.NemotronHForCausalLM.from_pretrained(path or self.ckpt, dtype=dtype)
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
    if dtype_name == "float32":
        d = float(np.abs(mine - ref).max())
        ok = rel <= TOL["loss_rel"] and d <= TOL["logits_abs"]
        return ok, (f"loss {got['loss']:.7f} vs {ref_loss:.7f}: rel {rel:.1e} (<= {TOL['loss_rel']:g}); "
                    f"logits max abs {d:.1e} (<= {TOL['logits_abs']:g})")
    with torch.no_grad():
        ref32 = var.load(torch.float32)(input_ids=var.score_ids, use_cache=False).logits.float().numpy()
    e16 = float(np.linalg.norm(ref - ref32) / max(np.linalg.norm(ref32), 1e-30))
    l2 = float(np.linalg.norm(mine - ref) / max(np.linalg.norm(ref), 1e-30))
    ok = rel <= TOL["bf16_loss_rel"] and l2 <= TOL["bf16_logits_of_e16"] * e16
    return ok, (f"loss {got['loss']:.5f} vs {ref_loss:.5f}: rel {rel:.1e} (<= {TOL['bf16_loss_rel']:g}); logits rel "
                f"L2 {l2:.1e} = {l2 / max(e16, 1e-30):.2f} of Transformers' bf16 error {e16:.1e} "
                f"(<= {TOL['bf16_logits_of_e16']:g})")


def check_convert(var, binary, to_dtype=None):
    torch = var.torch
    out = os.path.join(var.dir, "convert_" + (to_dtype or "same"))
    shutil.rmtree(out, ignore_errors=True)
    sh([binary, "convert", "--in", var.ckpt, "--out", out] + (["--dtype", to_dtype] if to_dtype else []))
    dt = var.stored_dtype() if to_dtype is None else (torch.float32 if to_dtype == "float32" else torch.bfloat16)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    src = var.load(dt)
    conv = var.load(dt, out)
    ok, detail = same_models(var, src, conv)
    return ok, f"to {to_dtype or 'the same dtype'} ({cfg.get('dtype', cfg.get('torch_dtype'))}): {detail}"


def check_finetune(var, binary):
    """One mixtune finetune step vs one torch AdamW step."""
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
    worst, worst_name, bad, ill, total, missing, untested = 0.0, None, 0, 0, 0, [], []
    for n, w in want.items():
        if n not in got:
            missing.append(n)
            continue
        g, gr = got[n].float(), grads[n]
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
    ok = not missing and rel <= TOL["loss_rel"] and bad == 0 and not untested
    detail = (f"step loss {got_loss:.7f} vs {ref_loss:.7f} rel {rel:.1e}; weights: {bad} of {total} outside the "
              f"bound, worst well-conditioned {worst:.1e} ({worst_name}), {ill} ill-conditioned (|g| < 1e-6)")
    if missing:
        detail += f"; missing in final/: {missing[:3]}"
    if untested:
        detail += f"; mostly ill-conditioned, so not really compared: {untested[:3]}"
    return ok, detail


# ---------------------------------------------------------------------------------------------------------------

def main(argv=None):
    a, variants, binary = H.parse_args(__doc__, all_variants, problems, print_list, argv)
    if binary is None:
        return a.list_status

    import torch
    import transformers
    sys.path.insert(0, HERE)
    import make_family_fixtures as fx  # its build_model, perturb, RouterMargin, MambaPathProbe

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(a.work, exist_ok=True)
    work = os.path.abspath(a.work)
    probe = fx.MambaPathProbe()
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
        other = {"float32": "bfloat16", "bfloat16": "float32"}[v["storage"]]
        runs = [("score-fp32", lambda: check_score(var, binary, "float32")),
                ("score-bf16", lambda: check_score(var, binary, "bfloat16")),
                ("convert", lambda: check_convert(var, binary)),
                (f"convert-{other}", lambda: check_convert(var, binary, other)),
                ("finetune", lambda: check_finetune(var, binary))]
        H.run_checks(results, v["name"], runs, t0, INFO_CHECKS)
        var.facts["mamba_path"] = probe.check()
        with open(os.path.join(var.dir, "facts.json"), "w") as f:
            json.dump(dict(variant=v, facts=var.facts), f, indent=2)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(dict(transformers=transformers.__version__, torch=torch.__version__, tolerances=TOL,
                       results=results), f, indent=2)
    counted, fails, over = H.print_table(results)
    print(f"\n(INFO: reported, not counted; INFO!: outside the parity tests' bf16 bounds: {over})")
    print(f"verify-nemotron-h: {counted - fails} passed, {fails} failed ({work}/results.json)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
