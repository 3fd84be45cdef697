"""The DeepSeek-V3 family of bench/hf_baseline.py: Moonlight-16B-A3B and DeepSeek-V3 shapes, their model FLOPs per
token and parameter counts, and the DeepseekV3Config that builds them in Transformers 5.17.

Pure Python (transformers is imported inside make_dsv3_config only), so that compare.py and --print-flops run
without torch. The shapes are mixtune's presets (src/models/families/deepseek_v3.cpp, moonlight_config and
deepseek_v3_config; hf-numerics.md §5) field for field, so `mixtune bench --preset moonlight-16b-a3b|deepseek-v3
--layers N` and `hf_baseline.py --family moonlight|deepseek-v3 --layers N` build the same slice: the first N
layers, the first first_k_dense_replace of them dense.
"""

# Moonlight-16B-A3B (moonshotai/Moonlight-16B-A3B config.json): a plain q_proj (q_lora_rank null), one dense layer,
# 64 routed experts top-6 in one group, 2 shared experts, default RoPE (theta 50000, no rope_scaling).
MOONLIGHT_16B_A3B = dict(
    hidden=2048, heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, intermediate=11264, moe_inter=1408, experts=64, top_k=6, shared_experts=2, n_group=1,
    topk_group=1, routed_scaling_factor=2.446, first_k_dense_replace=1, vocab=163840, rms_norm_eps=1e-5,
    max_position_embeddings=8192, bos_token_id=163584, eos_token_id=163585, initializer_range=0.02,
    rope={"rope_type": "default", "rope_theta": 50000.0},
)
# DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): q LoRA 1536, three dense layers, 256 routed experts top-8 in 8
# groups (4 kept), 1 shared expert, YaRN RoPE (factor 40 over 4096, mscale 1 / 1: softmax scale 192^-1/2 · 1.3689²).
DEEPSEEK_V3 = dict(
    hidden=7168, heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, intermediate=18432, moe_inter=2048, experts=256, top_k=8, shared_experts=1, n_group=8,
    topk_group=4, routed_scaling_factor=2.5, first_k_dense_replace=3, vocab=129280, rms_norm_eps=1e-6,
    max_position_embeddings=163840, bos_token_id=0, eos_token_id=1, initializer_range=0.02,
    rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
          "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
)
DSV3_SHAPES = {"moonlight": MOONLIGHT_16B_A3B, "deepseek-v3": DEEPSEEK_V3}  # hf_baseline.py --family -> shapes
DSV3_PRESETS = {"moonlight": "moonlight-16b-a3b", "deepseek-v3": "deepseek-v3"}  # mixtune bench --preset


def dsv3_moe_layers(family, layers):
    """MoE layers of an N-layer slice: every layer from first_k_dense_replace on."""
    return max(0, layers - DSV3_SHAPES[family]["first_k_dense_replace"])


def mla_projection_params(s):
    """Weights of MLA's projections: q (q_proj H -> Hq·192, or q_a_proj H -> r and q_b_proj r -> Hq·192),
    kv_a_proj_with_mqa H -> kv_lora + rope, kv_b_proj kv_lora -> Hq·(nope + v), o_proj Hq·v -> H."""
    h, hq, r = s["hidden"], s["heads"], s["q_lora_rank"]
    d = s["qk_nope_head_dim"] + s["qk_rope_head_dim"]
    q = h * hq * d if r is None else h * r + r * hq * d
    kv = h * (s["kv_lora_rank"] + s["qk_rope_head_dim"]) + s["kv_lora_rank"] * hq * (s["qk_nope_head_dim"] +
                                                                                      s["v_head_dim"])
    return q + kv + hq * s["v_head_dim"] * h


def dsv3_flops_per_token(family, layers, seq, vocab=None):
    """NeMo/Megatron model FLOPs per trained token (3 x forward), router GEMM excluded, recompute not counted; the
    same count as mixtune's (models/decoder_costs.cpp over layers/costs/: attention_cost.cpp's MLA, mlp_cost.cpp,
    moe_cost.cpp):

    per layer: 6 x MLA's projection weights (mla_projection_params)
               + 6 x (S / 2) x Hq x (192 + 128), the attention core: QK^T at the qk width 192 and PV at the value
                 width 128 over S / 2 keys per query (causal)
               + 6 x 3 x H x I on a dense layer (the first first_k_dense_replace; I = intermediate_size), or
                 6 x (top_k + n_shared) x 3 x H x I_moe on a MoE layer (routed top-k and the shared experts)
    plus 6 x V x H for the LM head. Norms, RoPE, the router's scoring and the SwiGLU elementwise work are not counted.
    """
    s = DSV3_SHAPES[family]
    h = s["hidden"]
    core = 6 * (seq / 2) * s["heads"] * (s["qk_nope_head_dim"] + s["qk_rope_head_dim"] + s["v_head_dim"])
    attention = 6 * mla_projection_params(s) + core
    dense = 6 * 3 * h * s["intermediate"]
    moe = 6 * (s["top_k"] + s["shared_experts"]) * 3 * h * s["moe_inter"]
    n_moe = dsv3_moe_layers(family, layers)
    return layers * attention + (layers - n_moe) * dense + n_moe * moe + 6 * (vocab or s["vocab"]) * h


def dsv3_param_count(family, layers, vocab=None):
    """Parameters of the sliced model as Transformers builds it (model.parameters()): embeddings, lm_head, final
    norm; per layer MLA's projections and its latent norms (q_a_layernorm with a q LoRA, kv_a_layernorm), two
    RMSNorms, and either the dense MLP (gate, up, down) or the MoE: the experts (gate_up 2I x H, down H x I per
    expert), the router weight (E x H) and the shared experts (n_shared x I wide). The router's
    e_score_correction_bias is a buffer, not a parameter."""
    s = DSV3_SHAPES[family]
    h, e, i = s["hidden"], s["experts"], s["moe_inter"]
    attention = mla_projection_params(s) + (s["q_lora_rank"] or 0) + s["kv_lora_rank"] + 2 * h
    dense = 3 * h * s["intermediate"]
    moe = e * 3 * h * i + e * h + 3 * h * i * s["shared_experts"]
    n_moe = dsv3_moe_layers(family, layers)
    return layers * attention + (layers - n_moe) * dense + n_moe * moe + 2 * (vocab or s["vocab"]) * h + h


def dsv3_description(family, layers):
    """One phrase for the baseline's configuration paragraph."""
    s = DSV3_SHAPES[family]
    q = "plain q_proj" if s["q_lora_rank"] is None else f"q LoRA {s['q_lora_rank']}"
    rope = s["rope"]["rope_type"] + f" RoPE (theta {s['rope']['rope_theta']:g}" + (
        f", factor {s['rope']['factor']:g})" if "factor" in s["rope"] else ")")
    n_moe = dsv3_moe_layers(family, layers)
    return (f"DeepseekV3Config with {DSV3_PRESETS[family]}'s shapes, {layers} layers ({layers - n_moe} dense, {n_moe} "
            f"MoE); MLA ({s['heads']} heads, {q}, kv LoRA {s['kv_lora_rank']}, qk {s['qk_nope_head_dim']}+"
            f"{s['qk_rope_head_dim']}, v {s['v_head_dim']}, interleaved {rope}); {s['experts']} experts top-"
            f"{s['top_k']} + {s['shared_experts']} shared, sigmoid router over {s['n_group']} group(s) keeping "
            f"{s['topk_group']}, scale {s['routed_scaling_factor']:g}")


def make_dsv3_config(a, log):
    """DeepseekV3Config with the family's shapes, sliced to a.layers (first_k_dense_replace as in the model)."""
    from transformers import DeepseekV3Config
    s = DSV3_SHAPES[a.family]
    vocab = a.vocab or s["vocab"]
    cfg = DeepseekV3Config(
        vocab_size=vocab, hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        moe_intermediate_size=s["moe_inter"], num_hidden_layers=a.layers, num_attention_heads=s["heads"],
        num_key_value_heads=s["heads"], n_shared_experts=s["shared_experts"], n_routed_experts=s["experts"],
        routed_scaling_factor=s["routed_scaling_factor"], kv_lora_rank=s["kv_lora_rank"],
        q_lora_rank=s["q_lora_rank"], qk_rope_head_dim=s["qk_rope_head_dim"], v_head_dim=s["v_head_dim"],
        qk_nope_head_dim=s["qk_nope_head_dim"], n_group=s["n_group"], topk_group=s["topk_group"],
        num_experts_per_tok=s["top_k"], first_k_dense_replace=s["first_k_dense_replace"], norm_topk_prob=True,
        hidden_act="silu", max_position_embeddings=max(s["max_position_embeddings"], a.seq),
        initializer_range=s["initializer_range"], rms_norm_eps=s["rms_norm_eps"], use_cache=False,
        bos_token_id=min(s["bos_token_id"], vocab - 1), eos_token_id=min(s["eos_token_id"], vocab - 1),
        tie_word_embeddings=False, rope_parameters=dict(s["rope"]), rope_interleave=True, attention_bias=False,
        attention_dropout=0.0,
    )
    rp = getattr(cfg, "rope_parameters", None) or {}
    checks = {"rope_type": (rp.get("rope_type"), s["rope"]["rope_type"]),
              "rope_theta": (rp.get("rope_theta"), s["rope"]["rope_theta"]),
              "rope factor": (rp.get("factor"), s["rope"].get("factor")),
              "qk_head_dim": (getattr(cfg, "qk_head_dim", None), s["qk_nope_head_dim"] + s["qk_rope_head_dim"]),
              "q_lora_rank": (cfg.q_lora_rank, s["q_lora_rank"]),
              "n_routed_experts": (cfg.n_routed_experts, s["experts"]),
              "first_k_dense_replace": (cfg.first_k_dense_replace, s["first_k_dense_replace"]),
              "rope_interleave": (cfg.rope_interleave, True),
              "tie_word_embeddings": (cfg.tie_word_embeddings, False)}
    for name, (found, want) in checks.items():
        if found != want:
            raise RuntimeError(f"DeepseekV3Config field {name}: expected {want}, found {found}")
    log(f"DeepseekV3Config: {dsv3_description(a.family, a.layers)}")
    return cfg
