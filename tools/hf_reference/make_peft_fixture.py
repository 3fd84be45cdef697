#!/usr/bin/env python3
"""LoRA fixtures made by Hugging Face PEFT on the existing tiny checkpoints (run where transformers 5.17 + peft +
torch exist: the GPU machine; everything on the CPU in float32).

    make_peft_fixture.py OUTDIR [--families nemotron_h,...]   (the repository root must be the working directory)

For each base fixture (qwen3_moe/moe_gqa_aux, gpt_oss/yarn_window_aux, nemotron_h/hybrid_all_kinds: its ckpt/ and
the input_ids/labels of its plain.safetensors) and each variant it writes OUTDIR/<family>_lora/<variant>/:
  adapter/                  PeftModel.save_pretrained(): adapter_config.json + adapter_model.safetensors
  reference.safetensors     input_ids, labels, logits (base + adapter, train mode, use_cache=False),
                            grad.<saved adapter key> for every lora_A / lora_B (fp32, of the model's loss)
  merged.safetensors        merge_and_unload()'s tensors that differ from the base (in-memory v5 names)
  merged_ckpt/              (attn_experts only) merge_and_unload().save_pretrained(max_shard_size="40KB")
  meta.json                 versions, seed, LoRA settings, loss / ce_loss / aux_loss, router gap, the checks below
Variants: attn_experts (r 4, alpha 8, q/k/v/o_proj + target_parameters mlp.experts.gate_up_proj and down_proj)
and attn_only (r 3, alpha 5, use_rslora, q/k/v/o_proj); Nemotron-H has its own (FAMILY_VARIANTS). Every A and B is drawn at random (B = 0 would hide a wrong
layout): A ~ N(0, 0.1²), B scaled so that the delta's std is ~0.3 × the std of the weight it adds to.
Seeds are redrawn until every routing top-k decision of the adapted model has a gap >= 1e-4.
Checked before anything is written (docs/peft-format.md through peft_layout.py): the base + the document's delta
gives PEFT's logits (1e-4) and merge_and_unload's weights (1e-6 relative), the document's dA/dB equal PEFT's
gradients (1e-4 relative), and PeftModel.from_pretrained(adapter/) gives the same logits (1e-5).
"""
import argparse
import json
import math
import os
import shutil
import sys
import traceback

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peft_layout as L  # noqa: E402

import peft  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
BASES = {  # family -> (base fixture variant dir, HF class, router module suffix, how its top-k is taken)
    "qwen3_moe": ("tests/fixtures/qwen3_moe/moe_gqa_aux", "Qwen3MoeForCausalLM", "mlp.gate", "softmax"),
    "gpt_oss": ("tests/fixtures/gpt_oss/yarn_window_aux", "GptOssForCausalLM", "mlp.router", "biased_logits"),
    "nemotron_h": ("tests/fixtures/nemotron_h/hybrid_all_kinds", "NemotronHForCausalLM", "mixer.gate",
                   "sigmoid_biased"),
}
# name -> (r, alpha, use_rslora, target_modules, target_parameters, save the merged checkpoint)
VARIANTS = {
    "attn_experts": (4, 8, False, ATTN, EXPERTS, True),
    "attn_only": (3, 5, True, ATTN, [], False),
}
# Families with their own variants instead of VARIANTS (other module names). Nemotron-H (issue 39): every target
# mixtune takes, the Mamba2 mixer's in_proj included (PEFT refuses out_proj and conv1d on Mamba models); its experts
# are up-only (mixer.experts.up_proj [E, I, H]). lora_peft_fixture_test.cpp reads tests/fixtures/nemotron_h_lora/.
FAMILY_VARIANTS = {
    "nemotron_h": {
        "all_targets": (4, 8, False, ATTN + ["in_proj", "up_proj", "down_proj"],
                        ["mixer.experts.up_proj", "mixer.experts.down_proj"], False),
    },
}
A_STD = 0.1
DELTA_OVER_WEIGHT = 0.3
TOL_LOGITS, TOL_MERGE_REL, TOL_GRAD_REL, TOL_RELOAD = 1e-4, 1e-6, 1e-4, 1e-5


class RouterMargin:
    """Smallest gap at the k-th routing decision (Qwen3: softmax probabilities; GPT-OSS: biased logits; Nemotron-H:
    sigmoid scores + e_score_correction_bias, n_group 1)."""

    def __init__(self, model, suffix, how, k):
        self.how, self.k, self.min_gap, self.handles = how, k, float("inf"), []
        for name, mod in model.named_modules():
            if name.endswith(suffix) and isinstance(getattr(mod, "weight", None), torch.Tensor):
                self.handles.append(mod.register_forward_pre_hook(self.hook))

    def hook(self, mod, args):
        x = args[0].detach().double().reshape(-1, mod.weight.shape[1])
        z = x @ mod.weight.detach().double().t()
        if self.how == "softmax":
            z = torch.softmax(z, -1)
        elif self.how == "sigmoid_biased":
            z = torch.sigmoid(z) + mod.e_score_correction_bias.detach().double()
        else:
            z = z + mod.bias.detach().double()
        if self.k < z.shape[-1]:
            v = torch.sort(z, dim=-1, descending=True).values
            self.min_gap = min(self.min_gap, float((v[:, self.k - 1] - v[:, self.k]).min()))

    def remove(self):
        for h in self.handles:
            h.remove()


def ce_loss(logits, labels):
    z = logits.float()[:, :-1].reshape(-1, logits.shape[-1])
    y = labels[:, 1:].reshape(-1)
    n = int((y != -100).sum())
    return float(F.cross_entropy(z, y, ignore_index=-100, reduction="sum")) / max(n, 1), n


def losses(out, labels):
    aux = getattr(out, "aux_loss", None)
    ce, n = ce_loss(out.logits.detach(), labels)
    return dict(loss=float(out.loss), aux_loss=None if aux is None else float(aux), ce_loss=ce, tokens=n)


def load_base(cls, ckpt):
    model = cls.from_pretrained(ckpt, dtype=torch.float32)
    model.train()  # as the base fixtures' batches (no dropout in these models)
    return model


def plain_batch(base_dir):
    with safe_open(os.path.join(base_dir, "plain.safetensors"), framework="pt") as f:
        return f.get_tensor("input_ids"), f.get_tensor("labels")


def randomise(pm, table, cfg, w_std, gen):
    """A ~ N(0, A_STD²); B ~ N(0, σ²) with σ chosen so that s·sqrt(r)·A_STD·σ = DELTA_OVER_WEIGHT·std(W)."""
    params = dict(pm.named_parameters())
    with torch.no_grad():
        for key, target, ab in L.doc_keys(table, cfg["target_modules"], cfg["target_parameters"]):
            if L.live_name(key) not in params:
                raise RuntimeError(f"docs/peft-format.md predicts {key}; PEFT has no parameter {L.live_name(key)}")
            p = params[L.live_name(key)]
            if ab == "A":
                p.copy_(A_STD * torch.randn(p.shape, generator=gen))
                continue
            shape = table[target["module"]]["shapes"][target["param"]]
            e_count = shape[0] if (target["kind"] == "param" and len(shape) == 3) else 1
            r = p.shape[1] // e_count
            sigma = DELTA_OVER_WEIGHT * w_std[target["full"]] / (L.scaling(cfg, r) * math.sqrt(r) * A_STD)
            p.copy_(sigma * torch.randn(p.shape, generator=gen))


def variants_of(family):
    return FAMILY_VARIANTS.get(family, VARIANTS)


def make_variant(family, vname, out_dir, vidx, report):
    base_dir, cls_name, router_suffix, router_how = BASES[family]
    r, alpha, rslora, tmods, tparams, save_merged_ckpt = variants_of(family)[vname]
    cls = getattr(transformers, cls_name)
    ckpt = os.path.join(base_dir, "ckpt")
    ids, labels = plain_batch(base_dir)
    for attempt in range(20):
        seed = 500 + 100 * vidx + attempt
        base = load_base(cls, ckpt)
        table = L.module_table(base)
        base_sd = {k: v.detach().clone() for k, v in base.state_dict().items()}
        lcfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, use_rslora=rslora, target_modules=tmods,
                          target_parameters=tparams or None, init_lora_weights=False, task_type="CAUSAL_LM")
        torch.manual_seed(seed)
        pm = get_peft_model(base, lcfg)
        pm.train()
        cfg = dict(r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=tmods, target_parameters=tparams)
        w_std = {t["full"]: float(base_sd[t["full"]].std()) for _, t, _ in L.doc_keys(table, tmods, tparams)}
        randomise(pm, table, cfg, w_std, torch.Generator().manual_seed(seed))
        margin = RouterMargin(pm, router_suffix, router_how, base.config.num_experts_per_tok)
        with torch.no_grad():
            pm(input_ids=ids, use_cache=False)
        margin.remove()
        if margin.min_gap > 1e-4:
            break
        print(f"{family}/{vname}: seed {seed} has router gap {margin.min_gap:.2e}, retrying", flush=True)
    print(f"{family}/{vname}: seed {seed}, router gap {margin.min_gap:.3e}", flush=True)

    vdir = os.path.join(out_dir, f"{family}_lora", vname)
    shutil.rmtree(vdir, ignore_errors=True)
    os.makedirs(vdir)
    try:
        write_variant(pm, base, cls, ckpt, table, base_sd, ids, labels, vdir, family, vname, base_dir, seed, margin,
                      report)
    except Exception:
        shutil.rmtree(vdir, ignore_errors=True)  # a variant that fails a check leaves nothing behind
        raise


def write_variant(pm, base, cls, ckpt, table, base_sd, ids, labels, vdir, family, vname, base_dir, seed, margin,
                  report):
    r, alpha, rslora, tmods, tparams, save_merged_ckpt = variants_of(family)[vname]
    pv = peft.__version__
    pm.zero_grad(set_to_none=True)
    out = pm(input_ids=ids, labels=labels, use_cache=False)
    logits = out.logits.detach().float().clone()
    vals = losses(out, labels)
    out.loss.backward()
    live_grads = {n: p.grad.detach().float().clone() for n, p in pm.named_parameters()
                  if "lora_" in n and p.grad is not None}

    adir = os.path.join(vdir, "adapter")
    pm.save_pretrained(adir)
    if os.path.exists(os.path.join(adir, "README.md")):  # PEFT's model card template: nothing a test reads
        os.remove(os.path.join(adir, "README.md"))
    acfg, tensors, _ = L.read_adapter(adir)
    checks = {}
    grads = {}
    for key in tensors:
        if L.live_name(key) not in live_grads:
            raise RuntimeError(f"{key}: PEFT parameter {L.live_name(key)} has no gradient")
        grads["grad." + key] = live_grads[L.live_name(key)]
    if len(grads) != len(live_grads):
        raise RuntimeError(f"{len(live_grads)} LoRA gradients but {len(grads)} saved tensors")

    # The document's merge and gradients against PEFT's.
    merged_doc, deltas, problems = L.merged_state(base_sd, tensors, acfg, table, pv)
    if problems:
        raise RuntimeError("docs/peft-format.md disagrees with the saved adapter: " + "; ".join(problems))
    ref = cls(base.config).float()
    ref.load_state_dict(merged_doc)
    ref.train()
    rout = ref(input_ids=ids, labels=labels, use_cache=False)
    checks["doc_forward_max_abs"] = float((rout.logits.detach() - logits).abs().max())
    rout.loss.backward()
    rparams = dict(ref.named_parameters())
    want = L.lora_grads_from_weight_grads({n: rparams[n].grad for n in deltas}, tensors, acfg, table, pv)
    checks["doc_grad_max_rel"] = max(L.max_rel(grads["grad." + k], g) for k, g in want.items())

    # PEFT's own reload of what it saved.
    pm2 = PeftModel.from_pretrained(load_base(cls, ckpt), adir)
    pm2.train()
    with torch.no_grad():
        checks["reload_max_abs"] = float((pm2(input_ids=ids, use_cache=False).logits - logits).abs().max())

    # merge_and_unload: the changed tensors, against the document.
    merged = pm.merge_and_unload()
    msd = merged.state_dict()
    changed = {n: t.detach().float().contiguous() for n, t in msd.items() if not torch.equal(t, base_sd[n])}
    checks["merged_changed"] = sorted(changed)
    checks["merge_max_rel"] = max(L.max_rel(msd[n], merged_doc[n]) for n in deltas)
    checks["merge_untargeted_changed"] = sorted(set(changed) - set(deltas))
    failures = [f"{k} {checks[k]:.2e} > {tol}" for k, tol in (
        ("doc_forward_max_abs", TOL_LOGITS), ("doc_grad_max_rel", TOL_GRAD_REL), ("reload_max_abs", TOL_RELOAD),
        ("merge_max_rel", TOL_MERGE_REL)) if checks[k] > tol]
    if checks["merge_untargeted_changed"]:
        failures.append(f"merge changed untargeted tensors {checks['merge_untargeted_changed'][:4]}")
    if failures:
        raise RuntimeError(f"{family}/{vname}: " + "; ".join(failures))

    save_file(dict(input_ids=ids.contiguous(), labels=labels.contiguous(), logits=logits.contiguous(),
                   **{k: v.contiguous() for k, v in grads.items()}),
              os.path.join(vdir, "reference.safetensors"), metadata={"format": "pt"})
    save_file(changed, os.path.join(vdir, "merged.safetensors"), metadata={"format": "pt"})
    if save_merged_ckpt:
        merged.save_pretrained(os.path.join(vdir, "merged_ckpt"), max_shard_size="40KB")
    meta = dict(family=family, variant=vname, base=ckpt, batch=os.path.join(base_dir, "plain.safetensors"),
                seed=seed, router_min_gap=margin.min_gap if margin.min_gap != float("inf") else None,
                lora=dict(r=r, lora_alpha=alpha, use_rslora=rslora, scaling=L.scaling(acfg, r),
                          target_modules=tmods, target_parameters=tparams, a_std=A_STD,
                          delta_over_weight=DELTA_OVER_WEIGHT),
                fp32=vals, checks=checks, adapter_keys={k: list(v.shape) for k, v in tensors.items()},
                versions=dict(peft=pv, transformers=transformers.__version__, torch=torch.__version__),
                tolerances=dict(logits=TOL_LOGITS, merge_rel=TOL_MERGE_REL, grad_rel=TOL_GRAD_REL,
                                reload=TOL_RELOAD))
    with open(os.path.join(vdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    report[f"{family}/{vname}"] = dict(loss=vals["loss"], **{k: v for k, v in checks.items()
                                                              if not isinstance(v, list)})
    print(f"{family}/{vname}: {vals} checks {report[f'{family}/{vname}']}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--families", default=",".join(BASES),
                    help="comma-separated subset of " + ", ".join(BASES) + " (default: all)")
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in BASES]
    if unknown:
        ap.error(f"--families: unknown {', '.join(unknown)}")
    torch.set_num_threads(4)
    os.makedirs(args.out, exist_ok=True)
    print("peft", peft.__version__, "transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    report, failed = {}, 0
    for family in families:
        for vidx, vname in enumerate(variants_of(family)):
            try:
                make_variant(family, vname, args.out, vidx, report)
            except Exception:  # noqa: BLE001 - one broken variant must not hide the others
                failed += 1
                traceback.print_exc()
    with open(os.path.join(args.out, "peft_fixtures_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"peft fixtures: {len(report)} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
