#!/usr/bin/env python3
"""Checks docs/peft-format.md against the PEFT installed here (run on the GPU machine; CPU, fp32).

For a tiny random Qwen3-MoE and a tiny random GPT-OSS it wraps the model with PEFT LoRA on q/k/v/o_proj plus
target_parameters on the fused experts (and two narrower cases), then prints and checks:
  * versions (torch, transformers, peft) and whether Transformers carries its ParamWrapper monkey patch;
  * every adapter parameter (name, shape), each ParamWrapper's parameter/in/out/nesting;
  * save_pretrained: the safetensors keys + shapes and adapter_config.json;
  * names: the saved keys are exactly the ones the document predicts (peft_layout.doc_keys);
  * merge: merge_and_unload's weights = base + the document's delta (shapes and values);
  * forward: PEFT's logits = a plain model holding the document's merged weights;
  * gradients: PEFT's lora_A/lora_B gradients = the document's dA/dB from the merged weights' gradients;
  * round trip: PeftModel.from_pretrained(saved dir) gives the same logits;
  * writer: an adapter written from the document alone (its config fields, names, layouts, new random tensors)
    loads with PeftModel.from_pretrained and gives the document's logits (what mixtune's saver must pass).
Exits 1 with the failing check named if anything disagrees. The markdown summary goes to stdout and, when OUT is
set, to $OUT/peft-probe.md (full details in $OUT/peft-probe.json).

Usage: peft_probe.py [--keep DIR]   (DIR keeps the saved adapters)
"""
import argparse
import json
import os
import sys
import tempfile
import traceback

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peft_layout as L  # noqa: E402

import peft  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# fp32 throughout; the document's merge is done in float64 and cast, PEFT's in fp32: differences are roundings.
TOL_MERGE_REL = 1e-6     # max |merged - expected| / max |expected| per tensor
TOL_LOGITS = 1e-4        # abs, the bar for logits
TOL_GRAD_REL = 1e-4      # max |g - expected| / max |expected| per tensor

# 2I != H and I != H, so that every in/out confusion changes a shape (not only values).
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=1, tie_word_embeddings=False,
        initializer_range=0.1, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        vocab_size=128, hidden_size=64, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        tie_word_embeddings=False, initializer_range=0.1, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)),
}
# (name, family, r, alpha, use_rslora, target_modules, target_parameters, modules_to_save). The last two cases
# train the router in full (issue 39's `router` target) through PEFT's modules_to_save.
CASES = [
    ("qwen3_attn_experts", "qwen3_moe", 4, 8, False, ATTN, EXPERTS, None),
    ("gpt_oss_attn_experts", "gpt_oss", 4, 8, False, ATTN, EXPERTS, None),
    ("qwen3_down_only_rslora", "qwen3_moe", 3, 5, True, ["q_proj"], ["mlp.experts.down_proj"], None),
    ("qwen3_experts_router_full", "qwen3_moe", 4, 8, False, ["q_proj"], EXPERTS, ["gate"]),
    ("gpt_oss_router_full", "gpt_oss", 2, 4, False, ["o_proj"], [], ["router"]),
]


class Check:
    def __init__(self):
        self.rows = []  # (case, check, ok, detail)

    def add(self, case, name, ok, detail):
        self.rows.append((case, name, bool(ok), detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {case}: {name}: {detail}", flush=True)

    @property
    def failed(self):
        return [r for r in self.rows if not r[2]]


def versions():
    v = dict(python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__,
             peft=peft.__version__)
    try:
        import transformers.integrations.peft as tp
        v["transformers_patch_moe_parameter_targeting"] = hasattr(tp, "patch_moe_parameter_targeting")
        v["transformers_patch_mixtral_moe_parameter_targeting"] = hasattr(tp, "patch_mixtral_moe_parameter_targeting")
    except Exception as e:  # noqa: BLE001
        v["transformers_integrations_peft"] = f"import failed: {e}"
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        for mt in ("qwen3_moe", "gpt_oss"):
            v[f"conversion_mapping_{mt}"] = get_checkpoint_conversion_mapping(mt) is not None
    except Exception as e:  # noqa: BLE001
        v["conversion_mapping"] = f"unavailable: {e}"
    from peft.tuners.lora.layer import ParamWrapper
    # Transformers' patch wraps update_layer with functools.wraps, which leaves __wrapped__ behind.
    v["param_wrapper_update_layer_patched"] = hasattr(ParamWrapper.update_layer, "__wrapped__")
    return v


def build(family, seed):
    cfg_name, cls_name, kw = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, cfg_name).from_dict(dict(kw))  # as make_model_fixtures.py (num_experts)
    model = getattr(transformers, cls_name)(config).float()
    return config, model


def fresh(family, config, state):
    model = getattr(transformers, FAMILIES[family][1])(config).float()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing[:4]} unexpected {unexpected[:4]}")
    return model


def batch(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (2, 12), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    return ids, labels


def wrapper_facts(pm):
    from peft.tuners.lora.layer import ParamWrapper
    facts = []
    for name, mod in pm.named_modules():
        if isinstance(mod, ParamWrapper):
            facts.append(dict(module=name, parameter_name=mod.parameter_name, num_experts=mod.num_experts,
                              in_features=mod.in_features, out_features=mod.out_features,
                              swapped=getattr(mod, "_did_swap_in_out_features", None),
                              base_layer=type(mod.base_layer).__name__,
                              is_transposed=getattr(mod.get_base_layer(), "is_transposed", None)))
    return facts


def run_case(case, family, r, alpha, rslora, tmods, tparams, saved, keep, chk, report):
    pv = peft.__version__
    config, model = build(family, seed=1234)
    table = L.module_table(model)
    base_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids, labels = batch(7, config.vocab_size)
    info = dict(case=case, family=family, r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=tmods,
                target_parameters=tparams, modules_to_save=saved,
                experts_layout={k: dict(shapes={p: list(s) for p, s in v["shapes"].items()},
                                        is_transposed=v["is_transposed"], order=v["params"])
                                for k, v in table.items() if k.endswith("mlp.experts")})
    report["cases"][case] = info

    lcfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, use_rslora=rslora, target_modules=tmods,
                      target_parameters=tparams or None, modules_to_save=saved, init_lora_weights=False,
                      task_type="CAUSAL_LM")
    torch.manual_seed(99)
    pm = get_peft_model(model, lcfg)
    pm.train()
    with torch.no_grad():  # the trained copy of a modules_to_save module starts equal to the base: move it away
        for n, p in pm.named_parameters():
            if ".modules_to_save." in n:
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    info["adapter_parameters"] = {n: list(p.shape) for n, p in pm.named_parameters() if p.requires_grad}
    info["wrappers"] = wrapper_facts(pm)
    print(f"\n## {case}: adapter parameters", flush=True)
    for n, s in info["adapter_parameters"].items():
        print(f"  {n} {s}")
    for w in info["wrappers"]:
        print(f"  ParamWrapper {w}")
    nonzero_b = all(float(p.detach().abs().max()) > 0 for n, p in pm.named_parameters() if "lora_B" in n)
    chk.add(case, "lora_B non-zero (init_lora_weights=False)", nonzero_b, "every lora_B has non-zero entries")

    out = pm(input_ids=ids, labels=labels, use_cache=False)
    logits = out.logits.detach().clone()
    out.loss.backward()
    lora_grads = {n: p.grad.detach().clone() for n, p in pm.named_parameters() if p.requires_grad and p.grad is not None}

    sdir = os.path.join(keep, case, "peft_saved")
    pm.save_pretrained(sdir)
    scfg, tensors, meta = L.read_adapter(sdir)
    info["saved_keys"] = {k: list(v.shape) for k, v in tensors.items()}
    info["saved_dtypes"] = sorted({str(v.dtype) for v in tensors.values()})
    info["saved_metadata"] = meta
    info["adapter_config"] = scfg
    print(f"\n## {case}: adapter_model.safetensors (metadata {meta})")
    for k, s in info["saved_keys"].items():
        print(f"  {k} {s}")
    print(f"## {case}: adapter_config.json\n{json.dumps(scfg, indent=2, sort_keys=True)}", flush=True)

    # Names: exactly the predicted set.
    predicted = {k for k, _, _ in L.doc_keys(table, tmods, tparams, saved)}
    got = set(tensors)
    chk.add(case, "saved key names", predicted == got,
            "as predicted" if predicted == got else
            f"missing {sorted(predicted - got)[:6]} unexpected {sorted(got - predicted)[:6]}")

    # Merge by the document vs merge_and_unload.
    merged_doc, deltas, problems = L.merged_state(base_sd, tensors, scfg, table, pv)
    chk.add(case, "shapes (A [E·r, in], B [out, r·E] per the version rule)", not problems,
            "; ".join(problems) if problems else f"{len(deltas)} targets")

    # Forward: PEFT's logits vs a plain model holding the document's merged weights; gradients likewise.
    ref = fresh(family, config, merged_doc)
    ref.train()
    ref.zero_grad()
    rout = ref(input_ids=ids, labels=labels, use_cache=False)
    d_logits = float((rout.logits.detach() - logits).abs().max())
    chk.add(case, "forward = plain model with the document's merged weights", d_logits <= TOL_LOGITS,
            f"max |Δlogits| {d_logits:.2e} (tol {TOL_LOGITS})")
    rout.loss.backward()
    params = dict(ref.named_parameters())
    wgrads = {name: params[name].grad for name in deltas}
    want = L.lora_grads_from_weight_grads(wgrads, tensors, scfg, table, pv)
    worst, worst_key = 0.0, None
    for key, g in want.items():
        live = L.live_name(key, L.resolve_key(key, table, tparams, saved)[0])
        if live not in lora_grads:
            worst, worst_key = float("inf"), f"{live} has no gradient"
            break
        e = L.max_rel(lora_grads[live], g)
        if e > worst:
            worst, worst_key = e, key
    chk.add(case, "gradients dA = s·Bᵀ·G, dB = s·G·Aᵀ (rank-major B); full modules: G", worst <= TOL_GRAD_REL,
            f"worst rel {worst:.2e} at {worst_key} (tol {TOL_GRAD_REL})")

    # Round trip through PEFT's loader.
    pm2 = PeftModel.from_pretrained(fresh(family, config, base_sd), sdir)
    pm2.train()
    with torch.no_grad():
        l2 = pm2(input_ids=ids, use_cache=False).logits
    d_rt = float((l2 - logits).abs().max())
    chk.add(case, "PeftModel.from_pretrained(saved) logits", d_rt <= 1e-5, f"max |Δ| {d_rt:.2e}")

    # merge_and_unload vs the document's merge.
    merged = pm.merge_and_unload()
    msd = merged.state_dict()
    same_keys = set(msd) == set(base_sd)
    chk.add(case, "merge_and_unload keeps the plain parameter names", same_keys,
            "same names as the base" if same_keys else f"differs: {sorted(set(msd) ^ set(base_sd))[:6]}")
    worst, worst_key, changed = 0.0, None, []
    for name, w in merged_doc.items():
        if name not in msd:
            continue
        if not torch.equal(msd[name], base_sd[name]):
            changed.append(name)
        e = L.max_rel(msd[name], w) if name in deltas else float((msd[name] - w).abs().max())
        if e > worst:
            worst, worst_key = e, name
    untouched_ok = set(changed) <= set(deltas)
    chk.add(case, "merge_and_unload = base + document delta", worst <= TOL_MERGE_REL and untouched_ok,
            f"worst rel {worst:.2e} at {worst_key}; changed {len(changed)} tensors, document targets {len(deltas)}"
            + ("" if untouched_ok else f"; changed but not targeted: {sorted(set(changed) - set(deltas))[:4]}"))
    mdir = os.path.join(keep, case, "merged_saved")
    merged.save_pretrained(mdir)
    mkeys = {}
    for fn in sorted(os.listdir(mdir)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(mdir, fn), framework="pt") as f:
                for k in f.keys():
                    if ".layers.0." in k and ("experts" in k or "q_proj" in k):
                        mkeys[k] = list(f.get_slice(k).get_shape())
    info["merged_save_layer0_keys"] = mkeys

    # Writer: an adapter made from the document only, loaded by PEFT.
    g = torch.Generator().manual_seed(4321)
    wtensors = {}
    for key, target, ab in L.doc_keys(table, tmods, tparams, saved):
        if ab == "W":
            shape = target["shape"]
        else:
            a_shape, b_shape = L.expected_shapes(target, table, r, pv)
            shape = a_shape if ab == "A" else b_shape
        wtensors[key] = 0.2 * torch.randn(shape, generator=g)
    wdir = os.path.join(keep, case, "doc_written")
    os.makedirs(wdir, exist_ok=True)
    wcfg = L.doc_config(r, alpha, tmods, tparams, "tiny-random", pv, use_rslora=rslora, modules_to_save=saved)
    with open(os.path.join(wdir, "adapter_config.json"), "w") as f:
        json.dump(wcfg, f, indent=2, sort_keys=True)
    save_file(wtensors, os.path.join(wdir, "adapter_model.safetensors"), metadata={"format": "pt"})
    try:
        pm3 = PeftModel.from_pretrained(fresh(family, config, base_sd), wdir)
        pm3.train()
        loaded = {n: p for n, p in pm3.named_parameters() if "lora_" in n or ".modules_to_save." in n}
        with torch.no_grad():
            l3 = pm3(input_ids=ids, use_cache=False).logits
        wmerged, _, wprob = L.merged_state(base_sd, wtensors, wcfg, table, pv)
        with torch.no_grad():
            l3ref = fresh(family, config, wmerged)(input_ids=ids, use_cache=False).logits
        d_w = float((l3 - l3ref).abs().max())
        chk.add(case, "document-written adapter loads in PEFT with the document's logits",
                d_w <= TOL_LOGITS and not wprob and len(loaded) == len(wtensors),
                f"max |Δlogits| {d_w:.2e}; {len(loaded)} adapter tensors in the model, {len(wtensors)} written"
                + (f"; {wprob}" if wprob else ""))
    except Exception as e:  # noqa: BLE001
        chk.add(case, "document-written adapter loads in PEFT", False, f"{type(e).__name__}: {e}")


def markdown(report, chk):
    v = report["versions"]
    lines = ["# PEFT probe", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {val} |" for k, val in v.items()]
    for case, info in report["cases"].items():
        lines += ["", f"## {case} ({info['family']}, r {info['r']}, alpha {info['lora_alpha']}, "
                      f"rslora {info['use_rslora']}, modules_to_save {info['modules_to_save']})", ""]
        for m, e in info.get("experts_layout", {}).items():
            if m.startswith("model.layers.0."):
                lines.append(f"experts `{m}`: order {e['order']}, shapes {e['shapes']}, "
                             f"is_transposed {e['is_transposed']}")
        for w in info.get("wrappers", [])[:2]:
            lines.append(f"ParamWrapper `{w['module']}` parameter `{w['parameter_name']}`: E {w['num_experts']}, "
                         f"in {w['in_features']}, out {w['out_features']}, swapped {w['swapped']}, "
                         f"wraps {w['base_layer']}")
        lines += ["", "| saved key (layer 0) | shape |", "|---|---|"]
        lines += [f"| `{k}` | {s} |" for k, s in info.get("saved_keys", {}).items() if ".layers.0." in k]
        if "merged_save_layer0_keys" in info:
            lines += ["", "merged save_pretrained, layer 0 (a few): " + ", ".join(
                f"`{k}` {s}" for k, s in list(info["merged_save_layer0_keys"].items())[:6])]
        if "adapter_config" in info:
            lines += ["", "adapter_config.json:", "```", json.dumps(info["adapter_config"], indent=1, sort_keys=True),
                      "```"]
    lines += ["", "| case | check | result | detail |", "|---|---|---|---|"]
    lines += [f"| {c} | {n} | {'PASS' if ok else '**FAIL**'} | {d} |" for c, n, ok, d in chk.rows]
    lines += ["", f"peft-probe: {sum(r[2] for r in chk.rows)} passed, {len(chk.failed)} failed"]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", default=None, help="directory for the saved adapters (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(4)
    keep = args.keep or tempfile.mkdtemp(prefix="peft-probe-")
    chk = Check()
    report = dict(versions=versions(), cases={})
    print("versions:", json.dumps(report["versions"]), flush=True)
    for case, family, r, alpha, rslora, tmods, tparams, saved in CASES:
        try:
            run_case(case, family, r, alpha, rslora, tmods, tparams, saved, keep, chk, report)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            traceback.print_exc()
            chk.add(case, "ran to the end", False, f"{type(e).__name__}: {e}")
    report["checks"] = [dict(case=c, check=n, ok=ok, detail=d) for c, n, ok, d in chk.rows]
    md = markdown(report, chk)
    print("\n" + md)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "peft-probe.md"), "w") as f:
            f.write(md)
        with open(os.path.join(out, "peft-probe.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
    if chk.failed:
        print("peft-probe: docs/peft-format.md disagrees with PEFT " + peft.__version__ + " on: "
              + "; ".join(f"{c}: {n}" for c, n, _, _ in chk.failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
