"""docs/peft-format.md as code: which adapter tensor belongs to which base parameter, and the weight delta it makes.

Used by peft_probe.py (which checks these rules against the installed PEFT) and make_peft_fixture.py (which checks
every fixture against them). Nothing here imports PEFT: the rules are written from the document, so a PEFT that
behaves differently makes the comparison fail instead of being copied.
"""
import json
import math
import os
import re

import torch
from safetensors import safe_open

PREFIX = "base_model.model."


def version_tuple(v):
    """'0.19.1', '0.20.1.dev0@abc' -> (0, 19, 1)."""
    nums = re.findall(r"\d+", v.split("@")[0])[:3]
    return tuple(int(n) for n in nums) + (0,) * (3 - len(nums))


def expert_axes(is_transposed, peft_version):
    """(in_axis, out_axis) of a 3-D expert parameter [E, d1, d2] as the given PEFT version reads it.

    >= 0.19.1: from the module's is_transposed (False: [E, out, in]; True: [E, in, out]).
    0.19.0: swapped iff is_transposed (the bug fixed by PEFT #3165).  <= 0.18: always in = d1, out = d2."""
    v = version_tuple(peft_version)
    if v >= (0, 19, 1):
        return (1, 2) if is_transposed else (2, 1)
    if v >= (0, 19, 0):
        return (2, 1) if is_transposed else (1, 2)
    return (1, 2)


def module_table(model):
    """module path -> dict(linear, params (registration order), is_transposed, shapes), captured BEFORE PEFT wraps."""
    table = {}
    for name, mod in model.named_modules():
        params = [(n, tuple(p.shape)) for n, p in mod.named_parameters(recurse=False)]
        table[name] = dict(linear=isinstance(mod, torch.nn.Linear), params=[n for n, _ in params],
                           shapes=dict(params), is_transposed=getattr(mod, "is_transposed", None))
    return table


def _param_matches(key, targets):
    return any(key == t or key.endswith("." + t) for t in targets)


def saved_root(path, modules_to_save):
    """The module PEFT wraps in a ModulesToSaveWrapper for this path (PEFT: name.endswith(entry), no dot rule), or
    None. The outermost matching ancestor wins, as PEFT wraps it first."""
    parts = path.split(".")
    for n in range(1, len(parts) + 1):
        root = ".".join(parts[:n])
        if any(root.endswith(t) for t in modules_to_save or []):
            return root
    return None


def resolve_key(key, table, target_parameters, modules_to_save=None):
    """Saved key -> (target, ab): target = dict(kind 'linear'|'param'|'full', module, param, full), ab 'A'|'B'|'W'.

    Nested ParamWrappers: of the k targeted parameters of one module (registration order), the i-th is saved under
    'base_layer.' * (k - 1 - i). A module in modules_to_save is saved whole under its own names ('W', kind 'full';
    module = the wrapped module, param = the name inside it)."""
    if not key.startswith(PREFIX):
        raise ValueError(f"{key}: does not start with {PREFIX!r}")
    m = re.fullmatch(r"(.*)\.lora_([AB])\.weight", key[len(PREFIX):])
    if not m:
        full = key[len(PREFIX):]
        root = saved_root(full.rpartition(".")[0], modules_to_save)
        owner, _, leaf = full.rpartition(".")
        if root is None or owner not in table or leaf not in table[owner]["shapes"]:
            raise ValueError(f"{key}: neither a lora_A/lora_B weight nor a parameter of a modules_to_save module")
        return dict(kind="full", module=root, param=full[len(root) + 1:], full=full,
                    shape=table[owner]["shapes"][leaf]), "W"
    path, ab = m.group(1), m.group(2)
    depth = 0
    while path.endswith(".base_layer"):
        path = path[: -len(".base_layer")]
        depth += 1
    if path not in table:
        raise ValueError(f"{key}: no module {path!r} in the base model")
    info = table[path]
    targeted = [p for p in info["params"] if _param_matches(f"{path}.{p}", target_parameters or [])]
    if info["linear"] and depth == 0 and not targeted:
        return dict(kind="linear", module=path, param="weight", full=f"{path}.weight"), ab
    if not targeted:
        raise ValueError(f"{key}: module {path!r} is neither an nn.Linear target nor holds a target parameter")
    i = len(targeted) - 1 - depth
    if i < 0:
        raise ValueError(f"{key}: nesting depth {depth} but only {len(targeted)} targeted parameters in {path!r}")
    p = targeted[i]
    return dict(kind="param", module=path, param=p, full=f"{path}.{p}"), ab


def scaling(config, r):
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("adapter_config.json: rank_pattern/alpha_pattern are not covered by these rules")
    alpha = config["lora_alpha"]
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def expected_shapes(target, table, r, peft_version):
    """(A shape, B shape) the document predicts for this target."""
    info = table[target["module"]]
    shape = info["shapes"][target["param"]]
    if target["kind"] == "linear" or len(shape) == 2:
        out_f, in_f = shape
        return (r, in_f), (out_f, r)
    in_ax, out_ax = expert_axes(bool(info["is_transposed"]), peft_version)
    e = shape[0]
    return (e * r, shape[in_ax]), (shape[out_ax], r * e)


def per_expert(A, B, e_count):
    """lora_A [E*r, in] (expert-major rows), lora_B [out, r*E] (column j*E + e) -> A_e [E, r, in], B_e [E, out, r]."""
    a = A.reshape(e_count, -1, A.shape[-1])
    b = B.reshape(B.shape[0], -1, e_count).permute(2, 0, 1)
    return a, b


def delta(target, table, A, B, s, peft_version):
    """The weight delta in the base parameter's own layout."""
    info = table[target["module"]]
    shape = info["shapes"][target["param"]]
    if target["kind"] == "linear" or len(shape) == 2:
        return s * (B.double() @ A.double())
    a, b = per_expert(A.double(), B.double(), shape[0])
    d = s * torch.bmm(b, a)  # [E, out, in]
    in_ax, out_ax = expert_axes(bool(info["is_transposed"]), peft_version)
    return d if out_ax == 1 else d.transpose(1, 2)


def group_pairs(tensors, table, config):
    """{target full name: dict(target, A, B | W, keys)} from a saved adapter's tensors."""
    pairs = {}
    for key, t in tensors.items():
        target, ab = resolve_key(key, table, config.get("target_parameters"), config.get("modules_to_save"))
        entry = pairs.setdefault(target["full"], dict(target=target, keys={}))
        entry[ab] = t
        entry["keys"][ab] = key
    for name, entry in pairs.items():
        if entry["target"]["kind"] != "full" and ("A" not in entry or "B" not in entry):
            raise ValueError(f"{name}: lora_A or lora_B missing")
    return pairs


def merged_state(base_sd, tensors, config, table, peft_version):
    """base_sd with every target's delta added (in float64, cast back): the document's merge.

    Returns (merged state dict, {param full name: delta}, problems: list of strings)."""
    problems = []
    merged = dict(base_sd)
    deltas = {}
    for name, entry in group_pairs(tensors, table, config).items():
        target = entry["target"]
        if target["kind"] == "full":  # trained in full: the saved tensor replaces the weight
            w = base_sd[name]
            if tuple(entry["W"].shape) != tuple(w.shape):
                problems.append(f"{name}: saved {tuple(entry['W'].shape)}, the parameter is {tuple(w.shape)}")
                continue
            merged[name] = entry["W"].to(w.dtype)
            deltas[name] = entry["W"].double() - w.double()
            continue
        shape = table[target["module"]]["shapes"][target["param"]]
        e_count = shape[0] if (target["kind"] == "param" and len(shape) == 3) else 1
        r = entry["A"].shape[0] // e_count
        if r != config["r"]:
            problems.append(f"{name}: rank {r} from lora_A {tuple(entry['A'].shape)} != config r {config['r']}")
        want_a, want_b = expected_shapes(target, table, r, peft_version)
        got_a, got_b = tuple(entry["A"].shape), tuple(entry["B"].shape)
        if (got_a, got_b) != (want_a, want_b):
            problems.append(f"{name}: saved A {got_a} B {got_b}, the document says A {want_a} B {want_b}")
            continue
        d = delta(target, table, entry["A"], entry["B"], scaling(config, r), peft_version)
        if tuple(d.shape) != tuple(shape):
            problems.append(f"{name}: delta {tuple(d.shape)} does not fit the parameter {shape}")
            continue
        w = base_sd[name]
        merged[name] = (w.double() + d).to(w.dtype)
        deltas[name] = d
    return merged, deltas, problems


def lora_grads_from_weight_grads(weight_grads, tensors, config, table, peft_version):
    """dA, dB implied by the gradients w.r.t. the effective (merged) weights: dB_e = s G_e A_eᵀ, dA_e = s B_eᵀ G_e.

    weight_grads: {param full name: grad in the parameter's layout}. Returns {saved key: grad}."""
    out = {}
    for name, entry in group_pairs(tensors, table, config).items():
        target = entry["target"]
        g = weight_grads[name].double()
        if target["kind"] == "full":
            out[entry["keys"]["W"]] = g
            continue
        shape = table[target["module"]]["shapes"][target["param"]]
        A, B = entry["A"].double(), entry["B"].double()
        if target["kind"] == "linear" or len(shape) == 2:
            r = A.shape[0]
            s = scaling(config, r)
            out[entry["keys"]["A"]] = s * B.t() @ g
            out[entry["keys"]["B"]] = s * g @ A.t()
            continue
        e_count = shape[0]
        r = A.shape[0] // e_count
        s = scaling(config, r)
        in_ax, out_ax = expert_axes(bool(table[target["module"]]["is_transposed"]), peft_version)
        g_oi = g if out_ax == 1 else g.transpose(1, 2)  # [E, out, in]
        a, b = per_expert(A, B, e_count)  # [E, r, in], [E, out, r]
        da = s * torch.bmm(b.transpose(1, 2), g_oi)  # [E, r, in]
        db = s * torch.bmm(g_oi, a.transpose(1, 2))  # [E, out, r]
        out[entry["keys"]["A"]] = da.reshape(e_count * r, -1)
        out[entry["keys"]["B"]] = db.permute(1, 2, 0).reshape(db.shape[1], r * e_count)  # column j*E + e
    return out


def doc_config(r, alpha, target_modules, target_parameters, base, peft_version, use_rslora=False,
               modules_to_save=None):
    """adapter_config.json with exactly the fields docs/peft-format.md says mixtune writes."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "revision": None,
        "inference_mode": True, "r": r, "lora_alpha": alpha, "use_rslora": use_rslora, "rank_pattern": {},
        "alpha_pattern": {}, "target_modules": list(target_modules), "target_parameters": list(target_parameters),
        "exclude_modules": None, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "lora_bias": False,
        "use_dora": False, "init_lora_weights": True, "modules_to_save": modules_to_save, "layers_to_transform": None,
        "layers_pattern": None, "peft_version": peft_version,
    }


def doc_keys(table, target_modules, target_parameters, modules_to_save=None):
    """Saved key names the document predicts for a model: [(key, target, 'A' | 'B' | 'W')], in model order."""
    keys, full = [], []
    for path, info in table.items():
        if not path:
            continue
        root = saved_root(path, modules_to_save)
        if root is not None:  # inside a fully trained module: its own names, no LoRA inside it
            for p in info["params"]:
                name = f"{path}.{p}"
                full.append((f"{PREFIX}{name}", dict(kind="full", module=root, param=name[len(root) + 1:],
                                                     full=name, shape=info["shapes"][p]), "W"))
            continue
        leaf = path.rsplit(".", 1)[-1]
        if info["linear"] and leaf in target_modules:
            keys.append((f"{PREFIX}{path}", dict(kind="linear", module=path, param="weight", full=f"{path}.weight")))
            continue
        targeted = [p for p in info["params"] if _param_matches(f"{path}.{p}", target_parameters)]
        for i, p in enumerate(targeted):
            nest = ".base_layer" * (len(targeted) - 1 - i)
            keys.append((f"{PREFIX}{path}{nest}", dict(kind="param", module=path, param=p, full=f"{path}.{p}")))
    return [(f"{k}.lora_{ab}.weight", t, ab) for k, t in keys for ab in "AB"] + full


def read_adapter(d):
    """(adapter_config.json as a dict, {key: tensor}, safetensors metadata) of an adapter directory."""
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    tensors = {}
    with safe_open(os.path.join(d, "adapter_model.safetensors"), framework="pt") as f:
        meta = f.metadata()
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    return cfg, tensors, meta


def live_name(key, target=None, adapter="default"):
    """Saved key -> the PeftModel parameter name: the adapter name goes back in after lora_A / lora_B; a
    modules_to_save tensor (target kind 'full') lives under <module>.modules_to_save.<adapter>.<name>."""
    if target is not None and target["kind"] == "full":
        return f"{PREFIX}{target['module']}.modules_to_save.{adapter}.{target['param']}"
    return re.sub(r"\.lora_([AB])\.weight$", rf".lora_\1.{adapter}.weight", key)


def max_rel(a, b):
    """max |a - b| / max |b| (0 when both are 0)."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
