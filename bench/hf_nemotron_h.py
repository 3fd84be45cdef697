"""The Nemotron-H family of bench/hf_baseline.py: NVIDIA Nemotron 3 Nano (30B-A3B) shapes, the slice's layer pattern,
its model FLOPs per token and parameter count, the NemotronHConfig that builds it in Transformers 5.17, and which
Mamba2 path Transformers runs.

Pure Python (transformers is imported inside make_nemotron_h_config and mamba_path only), so that compare.py and
--print-flops run without torch. The shapes are mixtune's preset (src/models/families/nemotron_h.cpp,
nemotron_3_nano_config; hf-numerics.md §6) field for field. A slice of N layers is the first N letters of
hybrid_override_pattern, repeated cyclically past its 52 (config_json_set_layers in src/models/spec/config_writer.cpp),
so `mixtune bench --preset nemotron-3-nano-30b-a3b --layers N` and `hf_baseline.py --family nemotron-h --layers N`
build the same layers: M a Mamba2 mixer, E sigmoid-routed ReLU² experts + a ReLU² shared expert, * GQA attention
without positional encoding, - a dense ReLU² MLP (none in Nano). Every layer is one pre-norm + one mixer.

The Mamba2 mixer in Transformers: with mamba_ssm and causal_conv1d importable (or the hub kernel
kernels-community/mamba-ssm), training runs the fused mamba_split_conv1d_scan_combined; without them the chunked
SSD written in plain torch ops (NemotronHMamba2Mixer.torch_forward in earlier versions; in 5.17 the reference torch
fallbacks of mamba_chunk_scan_combined and causal_conv1d_fn, which it warns of at run time). That path materialises, per chunk
of 128 tokens, fp32 products of shape [chunk, chunk, heads, state or head_dim] before reducing them (side_by_side.sh
counts what that costs); mamba_path() says which one this machine runs.
"""

# NVIDIA-Nemotron-3-Nano-30B-A3B (config.json as mixtune's nemotron_3_nano_config holds it): 52 layers = 23 Mamba2 +
# 23 MoE + 6 attention; d_inner = mamba_num_heads x mamba_head_dim = 4096 (Transformers does not read `expand`).
NEMOTRON_3_NANO = dict(
    hidden=2688, pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    heads=32, kv_heads=2, head_dim=128,
    mamba_heads=64, mamba_head_dim=64, n_groups=8, ssm_state=128, conv_kernel=4, chunk=128, use_conv_bias=True,
    use_bias=False, time_step_min=1e-3, time_step_max=0.1, time_step_floor=1e-4,
    experts=128, top_k=6, moe_inter=1856, shared_inter=3712, n_group=1, topk_group=1, routed_scaling_factor=2.5,
    norm_topk_prob=True, intermediate=1856, vocab=131072, layer_norm_epsilon=1e-5, max_position_embeddings=4096,
    initializer_range=0.02, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
NEMOTRON_SHAPES = {"nemotron-h": NEMOTRON_3_NANO}  # hf_baseline.py --family -> shapes
NEMOTRON_PRESETS = {"nemotron-h": "nemotron-3-nano-30b-a3b"}  # mixtune bench --preset
# hybrid_override_pattern letter -> Transformers v5 layers_block_type name, and the legacy names v5 still reads.
LAYER_TYPES = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
LEGACY_LAYER_TYPES = {"mamba": "M", "attention": "*"}
KIND_NAMES = {"M": "Mamba2", "E": "MoE", "*": "attention", "-": "MLP"}


def nemotron_layer_pattern(family, layers):
    """The slice's pattern: the first N letters of the model's, repeated cyclically past its end (mixtune's
    config_json_set_layers)."""
    p = NEMOTRON_SHAPES[family]["pattern"]
    return "".join(p[i % len(p)] for i in range(layers))


def nemotron_layer_counts(family, layers):
    """Layers of each kind in the slice: {"M": .., "E": .., "*": .., "-": ..}."""
    pattern = nemotron_layer_pattern(family, layers)
    return {k: pattern.count(k) for k in LAYER_TYPES}


def nemotron_moe_layers(family, layers):
    return nemotron_layer_counts(family, layers)["E"]


def mamba2_dims(s):
    """(d_inner, conv_dim, in_proj width): d_inner = heads x head_dim, conv_dim = d_inner + 2 x groups x state
    (x, B, C through the depthwise conv), in_proj = z (d_inner) + xBC (conv_dim) + dt (one per head)."""
    d_inner = s["mamba_heads"] * s["mamba_head_dim"]
    conv_dim = d_inner + 2 * s["n_groups"] * s["ssm_state"]
    return d_inner, conv_dim, d_inner + conv_dim + s["mamba_heads"]


def mamba2_flops(s):
    """Forward FLOPs per token of one Mamba2 mixer as mixtune counts them (layers/costs/mamba2_cost.cpp of branch
    mamba-block, mamba2_flops_per_token): in_proj 2 H W and out_proj 2 d_inner H; the depthwise conv 2 conv_dim K;
    the chunked scan at chunk Q: per group C·Bᵀ over a chunk (2 Q N), per head the masked (C·Bᵀ)·X (2 Q P) and
    the chunk-state and state-output products (2 P N each)."""
    h = s["hidden"]
    d_inner, conv_dim, width = mamba2_dims(s)
    q, n, p, nh, g = s["chunk"], s["ssm_state"], s["mamba_head_dim"], s["mamba_heads"], s["n_groups"]
    gemms = 2 * h * width + 2 * d_inner * h
    conv = 2 * conv_dim * s["conv_kernel"]
    scan = g * 2 * q * n + nh * 2 * q * p + nh * 4 * p * n
    return gemms + conv + scan


def nemotron_flops_per_token(family, layers, seq, vocab=None):
    """NeMo/Megatron model FLOPs per trained token (3 x forward), router GEMM excluded, recompute not counted; the
    same count as mixtune's (models/decoder_costs.cpp over layers/costs/):

    per layer, by kind:
      M  3 x mamba2_flops (in_proj, out_proj, conv, chunked scan)
      E  6 x top_k x 2 x H x I_moe + 6 x 2 x H x I_shared: ReLU² experts are up + down only (mlp_cost.cpp's
         first-GEMM width I for relu2), the routed top-k and the one shared expert
      *  6 x (q, k, v, o projection weights) + 6 x (S / 2) x Hq x (D + D), the causal attention core (NoPE GQA)
      -  6 x 2 x H x I (a dense ReLU² MLP)
    plus 6 x V x H for the LM head. Norms, the gated norm, the router's scoring, the SSD's exponentials and the ReLU²
    elementwise work are not counted.
    """
    s = NEMOTRON_SHAPES[family]
    h = s["hidden"]
    n = nemotron_layer_counts(family, layers)
    hq, hkv, d = s["heads"], s["kv_heads"], s["head_dim"]
    attention = 6 * (2 * h * hq * d + 2 * h * hkv * d) + 6 * (seq / 2) * hq * (d + d)
    moe = 6 * (s["top_k"] * 2 * h * s["moe_inter"] + 2 * h * s["shared_inter"])
    mlp = 6 * 2 * h * s["intermediate"]
    return (n["M"] * 3 * mamba2_flops(s) + n["E"] * moe + n["*"] * attention + n["-"] * mlp
            + 6 * (vocab or s["vocab"]) * h)


def mamba2_params(s):
    """One Mamba2 mixer's parameters in Transformers (NemotronHMamba2Mixer): in_proj [W, H] (+ bias with use_bias),
    conv1d weight [conv_dim, 1, K] + bias [conv_dim] (use_conv_bias), dt_bias, A_log and D [heads] each, the gated
    RMSNorm's weight [d_inner], out_proj [H, d_inner] (+ bias with use_bias)."""
    h = s["hidden"]
    d_inner, conv_dim, width = mamba2_dims(s)
    bias = (width + h) if s["use_bias"] else 0
    return (width * h + conv_dim * s["conv_kernel"] + (conv_dim if s["use_conv_bias"] else 0)
            + 3 * s["mamba_heads"] + d_inner + d_inner * h + bias)


def nemotron_param_count(family, layers, vocab=None):
    """Parameters of the sliced model as Transformers builds it (model.parameters()): embeddings, lm_head (untied:
    NemotronHForCausalLM._tied_weights_keys = {}), norm_f; per layer its RMSNorm [H] and the mixer: Mamba2
    (mamba2_params), MoE (experts up_proj [E, I, H] + down_proj [E, H, I], router weight [E, H], the shared expert's
    up [I_s, H] + down [H, I_s]; the router's e_score_correction_bias is a buffer), attention (q, k, v, o; no bias)
    or a dense MLP (up + down)."""
    s = NEMOTRON_SHAPES[family]
    h, e = s["hidden"], s["experts"]
    n = nemotron_layer_counts(family, layers)
    moe = e * 2 * h * s["moe_inter"] + e * h + 2 * h * s["shared_inter"]
    attention = 2 * h * s["heads"] * s["head_dim"] + 2 * h * s["kv_heads"] * s["head_dim"]
    mlp = 2 * h * s["intermediate"]
    per_kind = n["M"] * mamba2_params(s) + n["E"] * moe + n["*"] * attention + n["-"] * mlp
    return per_kind + layers * h + 2 * (vocab or s["vocab"]) * h + h


def nemotron_description(family, layers):
    """One phrase for the baseline's configuration paragraph."""
    s = NEMOTRON_SHAPES[family]
    n = nemotron_layer_counts(family, layers)
    kinds = ", ".join(f"{n[k]} {KIND_NAMES[k]}" for k in LAYER_TYPES if n[k])
    d_inner, _, _ = mamba2_dims(s)
    return (f"NemotronHConfig with {NEMOTRON_PRESETS[family]}'s shapes, {layers} layers "
            f"{nemotron_layer_pattern(family, layers)} ({kinds}); Mamba2 {s['mamba_heads']} heads x "
            f"{s['mamba_head_dim']} (d_inner {d_inner}), {s['n_groups']} groups, state {s['ssm_state']}, conv "
            f"{s['conv_kernel']}, chunk {s['chunk']}; attention {s['heads']}/{s['kv_heads']} heads x "
            f"{s['head_dim']}, no positional encoding; {s['experts']} ReLU² experts top-{s['top_k']} of "
            f"{s['moe_inter']} + 1 shared of {s['shared_inter']}, sigmoid router over {s['n_group']} group(s), scale "
            f"{s['routed_scaling_factor']:g}")


def make_nemotron_h_config(a, log):
    """NemotronHConfig with the family's shapes, sliced to a.layers (hybrid_override_pattern cut as mixtune cuts
    it). The pattern is given as hybrid_override_pattern, which NemotronHConfig turns into layers_block_type (v5
    names: linear_attention, moe, full_attention, mlp); use_mamba_kernels stays at its default (True): the path the
    mixers take depends on what is installed (mamba_path)."""
    from transformers import NemotronHConfig
    s = NEMOTRON_SHAPES[a.family]
    vocab = a.vocab or s["vocab"]
    pattern = nemotron_layer_pattern(a.family, a.layers)
    cfg = NemotronHConfig(
        vocab_size=vocab, hidden_size=s["hidden"], hybrid_override_pattern=pattern, num_hidden_layers=a.layers,
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
        max_position_embeddings=max(s["max_position_embeddings"], a.seq), attention_bias=False,
        attention_dropout=0.0, intermediate_size=s["intermediate"], mlp_hidden_act="relu2", mlp_bias=False,
        ssm_state_size=s["ssm_state"], mamba_num_heads=s["mamba_heads"], mamba_head_dim=s["mamba_head_dim"],
        mamba_hidden_act="silu", n_groups=s["n_groups"], conv_kernel=s["conv_kernel"], chunk_size=s["chunk"],
        use_conv_bias=s["use_conv_bias"], use_bias=s["use_bias"], time_step_min=s["time_step_min"],
        time_step_max=s["time_step_max"], time_step_floor=s["time_step_floor"], n_routed_experts=s["experts"],
        n_shared_experts=1, moe_intermediate_size=s["moe_inter"],
        moe_shared_expert_intermediate_size=s["shared_inter"], num_experts_per_tok=s["top_k"],
        routed_scaling_factor=s["routed_scaling_factor"], n_group=s["n_group"], topk_group=s["topk_group"],
        norm_topk_prob=s["norm_topk_prob"], layer_norm_epsilon=s["layer_norm_epsilon"],
        initializer_range=s["initializer_range"], tie_word_embeddings=False, use_cache=False,
        residual_in_fp32=False, pad_token_id=min(s["pad_token_id"], vocab - 1),
        bos_token_id=min(s["bos_token_id"], vocab - 1), eos_token_id=min(s["eos_token_id"], vocab - 1),
    )
    types = list(getattr(cfg, "layers_block_type", None) or [])
    letters = {v: k for k, v in LAYER_TYPES.items()}
    letters.update(LEGACY_LAYER_TYPES)
    found_pattern = "".join(letters.get(t, "?") for t in types)
    d_inner, conv_dim, _ = mamba2_dims(s)
    checks = {"layers_block_type": (found_pattern, pattern),
              "num_hidden_layers": (cfg.num_hidden_layers, a.layers),
              "hidden_size": (cfg.hidden_size, s["hidden"]),
              "mamba_num_heads x mamba_head_dim": (cfg.mamba_num_heads * cfg.mamba_head_dim, d_inner),
              "n_groups": (cfg.n_groups, s["n_groups"]), "ssm_state_size": (cfg.ssm_state_size, s["ssm_state"]),
              "conv_kernel": (cfg.conv_kernel, s["conv_kernel"]), "chunk_size": (cfg.chunk_size, s["chunk"]),
              "num_key_value_heads": (cfg.num_key_value_heads, s["kv_heads"]),
              "head_dim": (cfg.head_dim, s["head_dim"]),
              "n_routed_experts": (cfg.n_routed_experts, s["experts"]),
              "num_experts_per_tok": (cfg.num_experts_per_tok, s["top_k"]),
              "moe_intermediate_size": (cfg.moe_intermediate_size, s["moe_inter"]),
              "moe_shared_expert_intermediate_size": (cfg.moe_shared_expert_intermediate_size, s["shared_inter"]),
              "routed_scaling_factor": (cfg.routed_scaling_factor, s["routed_scaling_factor"]),
              "n_group": (cfg.n_group, s["n_group"]),
              "moe_latent_size": (getattr(cfg, "moe_latent_size", None), None),
              "mlp_hidden_act": (cfg.mlp_hidden_act, "relu2"),
              "tie_word_embeddings": (cfg.tie_word_embeddings, False)}
    for name, (found, want) in checks.items():
        if found != want:
            raise RuntimeError(f"NemotronHConfig field {name}: expected {want}, found {found}")
    log(f"NemotronHConfig: {nemotron_description(a.family, a.layers)}; conv_dim {conv_dim}; use_mamba_kernels "
        f"{getattr(cfg, 'use_mamba_kernels', None)}")
    return cfg


def mamba_path(model):
    """Which Mamba2 path the built model trains with, as modeling_nemotron_h decides it: its module-level
    is_fast_path_available (set when the mixers are built: mamba_ssm's selective_state_update,
    mamba_chunk_scan_combined and mamba_split_conv1d_scan_combined, causal_conv1d's fn and update, from the installed
    packages or, with the `kernels` package, the hub) selects cuda_kernels_forward (training: the fused
    mamba_split_conv1d_scan_combined); otherwise torch_forward, the chunked SSD in torch ops. Returns a dict for
    the record."""
    import importlib
    import importlib.util
    mod = importlib.import_module(type(model).__module__)
    fast = getattr(mod, "is_fast_path_available", None)
    mixers = [layer.mixer for layer in model.model.layers if type(layer.mixer).__name__.endswith("Mamba2Mixer")]
    on_cuda = bool(mixers) and "cuda" in mixers[0].in_proj.weight.device.type
    if not mixers:
        path = "none (no Mamba2 layer in the slice)"
    elif fast and on_cuda:
        path = "fused: cuda_kernels_forward, mamba_split_conv1d_scan_combined (mamba_ssm)"
    else:
        how = ("NemotronHMamba2Mixer.torch_forward" if hasattr(type(mixers[0]), "torch_forward") else
               "the reference torch fallbacks of mamba_chunk_scan_combined / causal_conv1d_fn")
        path = f"torch: {how}, the chunked SSD in torch ops (mamba_ssm / causal_conv1d kernels not available)"
    installed = {name: importlib.util.find_spec(name) is not None for name in ("mamba_ssm", "causal_conv1d", "kernels")}
    return {"path": path, "is_fast_path_available": fast, "module": mod.__name__,
            "use_mamba_kernels": getattr(model.config, "use_mamba_kernels", None), "installed": installed,
            "mamba_layers": len(mixers)}
