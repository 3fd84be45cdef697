#!/usr/bin/env python3
"""Transformers v5 training baseline for `mixtune bench` (run on the GPU machine: torch 2.11, transformers 5.17).

Random-weight layer shapes of a real model sliced to --layers N (full vocabulary, untied lm_head), built with
AutoModelForCausalLM.from_config(dtype, attn_implementation, experts_implementation="grouped_mm"), trained on
seeded random token ids with fused torch AdamW (lr 1e-5). --family picks the model:
  qwen3-moe (default)  Qwen3-30B-A3B through Qwen3MoeConfig, attention "sdpa" (`mixtune bench --preset
                       qwen3-30b-a3b`)
  gpt-oss              gpt-oss-20b through GptOssConfig (`mixtune bench --preset gpt-oss-20b`): hidden 2880, 64 query
                       / 8 key-value heads of 64, 32 experts top-4 of intermediate 2880 with biases and the clamped
                       SwiGLU (limit 7.0), vocab 201088, sinks, a 128-key sliding window on the even layers
                       (layer_types alternating from sliding), YaRN RoPE (theta 150000, factor 32, original 4096,
                       no truncation), router aux loss off as in the hub config (output_router_logits false, coef
                       0.9). Attention "eager", Transformers' default for GPT-OSS: GptOssPreTrainedModel sets
                       _supports_sdpa = False (models/gpt_oss/modeling_gpt_oss.py of 5.17), so sdpa is refused;
                       eager builds the full [heads, S, S + 1] score matrix on every layer, the sliding ones
                       included (the window is a mask).
  moonlight            Moonlight-16B-A3B through DeepseekV3Config (`mixtune bench --preset moonlight-16b-a3b`):
                       hidden 2048, MLA with 16 heads (plain q_proj, kv LoRA 512, qk 128+64, v 128), layer 0 dense
                       (intermediate 11264), then 64 experts top-6 of intermediate 1408 + 2 shared, sigmoid router
                       (one group), vocab 163840, RoPE theta 50000. Attention "sdpa".
  deepseek-v3          DeepSeek-V3 through DeepseekV3Config (`mixtune bench --preset deepseek-v3`): hidden 7168, MLA
                       with 128 heads (q LoRA 1536, kv LoRA 512, qk 128+64, v 128), layers 0-2 dense (intermediate
                       18432), then 256 experts top-8 of intermediate 2048 + 1 shared, 8 groups keeping 4, vocab
                       129280, YaRN RoPE (factor 40). Attention "sdpa". One MoE layer alone holds 11.3 B parameters:
                       beyond one GPU with bf16 AdamW, so the side-by-side slice is the three dense layers.
                       Both through bench/hf_deepseek_v3.py (shapes, FLOPs, parameter count, config); no router
                       aux loss (DeepseekV3ForCausalLM computes none); --peft lora is not wired for them.
  nemotron-h           NVIDIA Nemotron 3 Nano (30B-A3B) through NemotronHConfig (`mixtune bench --preset
                       nemotron-3-nano-30b-a3b`), through bench/hf_nemotron_h.py: hidden 2688, the first N letters of
                       hybrid_override_pattern MEMEM*EMEMEM*... (M Mamba2: 64 heads x 64, 8 groups, state 128, conv 4,
                       chunk 128; E: 128 ReLU² experts top-6 of 1856 + 1 shared of 3712, sigmoid router, scale 2.5;
                       *: 32/2 heads x 128 without positional encoding), vocab 131072, untied. Attention "sdpa",
                       experts grouped_mm (NemotronHExperts is @use_experts_implementation(has_gate=False): up and
                       down only). The Mamba2 mixers run the fused mamba_ssm kernels when installed, else
                       Transformers' torch SSD path; the record says which ("hf"."mamba"). No router aux loss;
                       --peft lora is not wired.
One step = grad_accum micro-batches (loss / grad_accum, backward) + optimizer.step + zero_grad(set_to_none=True).

Prints one JSON object on stdout (progress goes to stderr) with the keys of the `mixtune bench` contract
(tool "transformers"; phases_ms omitted) and writes it to --json-out too. On CUDA out-of-memory it still writes
the JSON, with "oom": true, and exits 3; any other failure writes "error" and exits 1; bad arguments exit 2.

Precision (--precision):
  bf16              bf16 parameters, gradients and AdamW moments (from_pretrained(dtype=bf16) + Trainer)
  fp32-autocast     fp32 parameters and moments, forward under torch.autocast(bf16): grouped_mm is not
                    autocast-aware, so the experts run in fp32 (the slow path; kept for continuity)
  fp32-master-copy  bf16 parameters for compute, an fp32 master copy held by the optimizer: gradients
                    accumulated in fp32 (--master-grad-accum fp32, post-accumulate-grad hooks; or bf16: autograd's
                    bf16 .grad, copied once per step), fused AdamW on the fp32 masters (fp32 moments), masters
                    copied back to the bf16 parameters with torch._foreach_copy_
  fp32-mp           FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): fp32 sharded parameters are
                    the masters, bf16 compute, fp32 gradients and moments; needs --parallel fsdp2 (one process
                    without torchrun makes a one-rank process group)

LoRA (--peft lora, with --precision bf16 and --parallel none): Transformers + PEFT (get_peft_model, LoraConfig
r --lora-r, lora_alpha --lora-alpha, dropout 0, bias none) on the bf16 model, which stays frozen (no gradients, no
optimizer state); --lora-targets attn = target_modules q_proj/k_proj/v_proj/o_proj (lora.Linear), experts =
target_parameters mlp.experts.gate_up_proj / mlp.experts.down_proj (lora.ParamWrapper: each forward materialises
W + B·A for every expert of the layer, then the unchanged grouped_mm experts run on it; docs/peft-format.md). PEFT
upcasts the adapters to fp32 (autocast_adapter_dtype); fused AdamW over the adapter parameters only. Full depth at
seq 4096 needs --gradient-checkpointing (the ParamWrapper keeps W + ΔW of every layer for the backward otherwise).
FLOPs: "flops_per_token" stays the full fine-tune count (the same number as mixtune bench's record and every other
mode here); "lora_flops_factor" = (2 + lora_params / frozen_params) / 3 (NeMo's LoRA convention, anchors.md: the
frozen weights' weight-gradient GEMMs are not done; parameter counts over the whole model, not per token) and
"lora_model_tflops_per_gpu" = model TFLOP/s × that factor; --print-flops --peft lora prints both without torch.

Parallelism (--parallel, under `torchrun --nproc-per-node N`; without torchrun a one-rank group):
  none    one process, one GPU
  ddp     torch DistributedDataParallel(gradient_as_bucket_view=True, broadcast_buffers=False)
  fsdp2   torch.distributed.fsdp.fully_shard on every decoder layer, then the root (Transformers has no expert
          parallelism that moves tokens: the experts are sharded like every parameter)
--grad-sync last (default): gradients are reduced on the last micro-batch only (DDP: no_sync() around the
others; FSDP2: set_requires_gradient_sync(False) before the others, True before the last); every: after each
micro-batch. --ranks-share-gpu --dist-backend gloo: every rank on GPU (local rank mod GPU count) with gloo
collectives (NCCL refuses two ranks on one GPU): a functional check of the multi-GPU code, never a measurement
(the JSON says "functional_check": true).

  python3 bench/hf_baseline.py --layers 12 --seq 4096 --micro-batch 1 --grad-accum 8 --steps 5 --warmup 2
  python3 bench/hf_baseline.py --layers 4 --precision fp32-master-copy
  python3 bench/hf_baseline.py --layers 4 --precision fp32-mp --parallel fsdp2        # one rank, no torchrun
  torchrun --nproc-per-node 2 bench/hf_baseline.py --parallel ddp --layers 12
  torchrun --nproc-per-node 2 bench/hf_baseline.py --parallel fsdp2 --precision fp32-mp --grad-sync every
  torchrun --nproc-per-node 2 bench/hf_baseline.py --parallel ddp --ranks-share-gpu --dist-backend gloo \\
      --layers 1 --seq 512 --grad-accum 2 --steps 1 --warmup 1 --no-gemm-ceiling     # functional check, one GPU
  python3 bench/hf_baseline.py --print-flops --layers 12 --seq 4096        # FLOP formula only (no torch needed)
  python3 bench/hf_baseline.py --family gpt-oss --layers 5 --seq 4096 --micro-batch 1 --grad-accum 8
  python3 bench/hf_baseline.py --family gpt-oss --print-flops --layers 5 --seq 4096
  python3 bench/hf_baseline.py --family moonlight --layers 10 --seq 4096 --micro-batch 1 --grad-accum 8
  python3 bench/hf_baseline.py --family deepseek-v3 --print-flops --layers 3 --seq 4096
  python3 bench/hf_baseline.py --family nemotron-h --layers 6 --seq 4096 --micro-batch 1 --grad-accum 8
  python3 bench/hf_baseline.py --family nemotron-h --print-flops --layers 6 --seq 4096
  python3 bench/hf_baseline.py --layers 48 --seq 4096 --grad-accum 1 --peft lora --lora-r 16 --lora-alpha 32 \
      --lora-targets attn,experts --gradient-checkpointing            # Qwen3-30B-A3B full depth, LoRA

Each rank trains on its own random tokens; rank 0 prints the JSON with per-GPU tokens/s and the largest peak
memory over the ranks. torch and transformers are imported inside run() so that compare.py (and a machine
without torch) can import the FLOP formula from this file.
"""
import argparse
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time

from hf_deepseek_v3 import DSV3_PRESETS, DSV3_SHAPES, dsv3_description, dsv3_flops_per_token, dsv3_moe_layers, \
    dsv3_param_count, make_dsv3_config
from hf_nemotron_h import NEMOTRON_PRESETS, NEMOTRON_SHAPES, make_nemotron_h_config, mamba_path, \
    nemotron_description, nemotron_flops_per_token, nemotron_layer_counts, nemotron_layer_pattern, \
    nemotron_moe_layers, nemotron_param_count

# Qwen3-30B-A3B shapes (config.json of Qwen/Qwen3-30B-A3B; hf-numerics.md §3.1).
QWEN3_30B_A3B = dict(
    hidden=2048, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8, moe_inter=768, vocab=151936,
    rms_norm_eps=1e-6, rope_theta=1e6, intermediate=6144,
)
# gpt-oss-20b shapes: the config.json of openai/gpt-oss-20b, as mixtune's preset holds it
# (src/models/families/gpt_oss.cpp, gpt_oss_base + gpt_oss_preset(24, 32); hf-numerics.md §4.1).
GPT_OSS_20B = dict(
    hidden=2880, heads=64, kv_heads=8, head_dim=64, experts=32, top_k=4, moe_inter=2880, vocab=201088,
    sliding_window=128, rms_norm_eps=1e-5, router_aux_loss_coef=0.9, swiglu_limit=7.0,
    max_position_embeddings=131072, eos_token_id=200002, pad_token_id=199999, initializer_range=0.02,
)
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
FAMILIES = ("qwen3-moe", "gpt-oss") + tuple(DSV3_SHAPES) + tuple(NEMOTRON_SHAPES)
PRESETS = {"qwen3-moe": "qwen3-30b-a3b", "gpt-oss": "gpt-oss-20b", **DSV3_PRESETS,
           **NEMOTRON_PRESETS}  # mixtune bench --preset
# Transformers' own default for GPT-OSS is eager; DeepSeek-V3's sdpa takes the qk width 192 and value width 128 as
# they are (only flash_attention_2 pads the value); Nemotron-H's NoPE GQA layers run sdpa (_supports_sdpa).
DEFAULT_ATTN = {"qwen3-moe": "sdpa", "gpt-oss": "eager", "moonlight": "sdpa", "deepseek-v3": "sdpa",
                "nemotron-h": "sdpa"}
LORA_FAMILIES = ("qwen3-moe", "gpt-oss")  # --peft lora: the families whose LoRA targets and counts are wired
PEAK_989 = 989.0  # H100/H200 dense bf16 peak, TFLOP/s (the NVIDIA suites' MFU denominator)
EXIT_OOM = 3
PRECISIONS = ("bf16", "fp32-autocast", "fp32-master-copy", "fp32-mp")
PARALLEL = ("none", "ddp", "fsdp2")
LORA_TARGETS = {  # --lora-targets word -> (target_modules, target_parameters), the same names in both families
    "attn": (["q_proj", "k_proj", "v_proj", "o_proj"], []),
    "experts": ([], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
}


def attention_pairs_per_query(seq, window=None):
    """Visible (query, key) pairs of one row per query, as the area of the visible region: causal S^2 / 2 (the
    Megatron convention, half of the S x S square); a window of W keys (Transformers: key > query - W) removes the
    (S - W)^2 / 2 beyond it, leaving (2 S W - W^2) / 2. Both conventions drop half of the diagonal (the exact
    counts are S (S + 1) / 2 and (2 S W - W^2 + W) / 2); mixtune's cost model (layers/costs/attention_cost.cpp)
    counts the same way."""
    if window is None or window >= seq:
        return seq / 2
    return (2 * seq * window - window * window) / (2 * seq)


def flops_per_token(layers, seq, hidden, heads, kv_heads, head_dim, top_k, moe_inter, vocab, windows=None):
    """NeMo/Megatron model FLOPs per trained token, router GEMM excluded, recompute not counted.

    per layer: 6 x (q, k, v, o projection params) + 6 x (top_k x 3 x H x I expert params)
               + 12 x P x Hq x D, the attention core (QK^T and PV) over P = attention_pairs_per_query keys per
               query: 6 x S x Hq x D on a causal layer (P = S / 2)
    plus 6 x V x H for the LM head. windows: per layer, its sliding window or None (all causal when omitted).
    Biases, norms, RoPE, softmax and the SwiGLU elementwise work are not counted.
    """
    attn_proj = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = top_k * 3 * hidden * moe_inter
    if windows is None:
        core = seq * heads * head_dim
        return layers * (6 * (attn_proj + experts) + 6 * core) + 6 * vocab * hidden
    if len(windows) != layers:
        raise ValueError(f"windows: {len(windows)} entries for {layers} layers")
    cores = sum(12 * attention_pairs_per_query(seq, w) * heads * head_dim for w in windows)
    return layers * 6 * (attn_proj + experts) + cores + 6 * vocab * hidden


def qwen3_flops_per_token(layers, seq, vocab=None):
    s = QWEN3_30B_A3B
    return flops_per_token(layers, seq, s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["top_k"],
                           s["moe_inter"], vocab or s["vocab"])


def qwen3_param_count(layers, vocab=None):
    """Parameters of the sliced model as HF builds it: embeddings, lm_head, final norm, and per layer q/k/v/o,
    q_norm/k_norm, two RMSNorms, the router (E x H, no bias) and the experts (gate_up 2I x H, down H x I)."""
    s = QWEN3_30B_A3B
    h, hq, hkv, d, e, i, v = (s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["experts"], s["moe_inter"],
                              vocab or s["vocab"])
    per_layer = (2 * h * hq * d + 2 * h * hkv * d) + 2 * d + 2 * h + e * h + e * 3 * h * i
    return layers * per_layer + 2 * v * h + h


def gpt_oss_layer_types(layers):
    """gpt-oss-20b's layer_types: even layers slide, odd layers attend to every earlier position."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


def gpt_oss_flops_per_token(layers, seq, vocab=None):
    """flops_per_token for the gpt-oss-20b slice: the 128-key window counted on the sliding layers."""
    s = GPT_OSS_20B
    windows = [s["sliding_window"] if t == "sliding_attention" else None for t in gpt_oss_layer_types(layers)]
    return flops_per_token(layers, seq, s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["top_k"],
                           s["moe_inter"], vocab or s["vocab"], windows=windows)


def gpt_oss_param_count(layers, vocab=None):
    """Parameters of the sliced model as HF builds it: embeddings, lm_head, final norm, and per layer q/k/v/o with
    their biases, the sinks (one per query head), two RMSNorms, the router (E x H + E bias) and the experts
    (gate_up H x 2I + 2I bias, down I x H + H bias, per expert)."""
    s = GPT_OSS_20B
    h, hq, hkv, d, e, i, v = (s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["experts"], s["moe_inter"],
                              vocab or s["vocab"])
    attention = (2 * h * hq * d + 2 * h * hkv * d) + (hq * d + 2 * hkv * d + h) + hq
    per_layer = attention + 2 * h + (e * h + e) + e * (h * 2 * i + 2 * i + i * h + h)
    return layers * per_layer + 2 * v * h + h


def family_flops_per_token(family, layers, seq, vocab=None):
    if family in DSV3_SHAPES:
        return dsv3_flops_per_token(family, layers, seq, vocab)
    if family in NEMOTRON_SHAPES:
        return nemotron_flops_per_token(family, layers, seq, vocab)
    return gpt_oss_flops_per_token(layers, seq, vocab) if family == "gpt-oss" else \
        qwen3_flops_per_token(layers, seq, vocab)


def family_param_count(family, layers, vocab=None):
    if family in DSV3_SHAPES:
        return dsv3_param_count(family, layers, vocab)
    if family in NEMOTRON_SHAPES:
        return nemotron_param_count(family, layers, vocab)
    return gpt_oss_param_count(layers, vocab) if family == "gpt-oss" else qwen3_param_count(layers, vocab)


def family_moe_layers(family, layers):
    """Layers of the slice with routed experts (two grouped_mm calls each in a forward)."""
    if family in NEMOTRON_SHAPES:
        return nemotron_moe_layers(family, layers)
    return dsv3_moe_layers(family, layers) if family in DSV3_SHAPES else layers


def layer_pattern(family, layers):
    """The slice's layer kinds as a pattern string (Nemotron-H's hybrid_override_pattern letters), or None for the
    families whose layers are all alike."""
    return nemotron_layer_pattern(family, layers) if family in NEMOTRON_SHAPES else None


def preset_layer_pattern(preset, layers):
    """layer_pattern for a mixtune preset name (compare.py describes both sides' records with it)."""
    for family, name in PRESETS.items():
        if preset == name and isinstance(layers, int) and layers > 0:
            return layer_pattern(family, layers)
    return None


def lora_param_count(family, layers, r, targets):
    """LoRA parameters of --lora-targets: r x (in + out) per nn.Linear (q, k, v, o) and per expert of each fused
    expert parameter (gate_up H -> 2I, down I -> H; PEFT's ParamWrapper has E x r rows/columns per parameter)."""
    s = family_shapes(family)
    h, hq, hkv, d, e, i = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["experts"], s["moe_inter"]
    per_layer = 0
    if "attn" in targets.split(","):
        per_layer += r * ((h + hq * d) + 2 * (h + hkv * d) + (hq * d + h))
    if "experts" in targets.split(","):
        per_layer += e * r * ((h + 2 * i) + (i + h))
    return layers * per_layer


def lora_flops_factor(lora_params, frozen_params):
    """NeMo's LoRA FLOP convention: the full fine-tune count x (2 + lora / frozen) / 3."""
    return (2 + lora_params / frozen_params) / 3


def family_shapes(family):
    if family in DSV3_SHAPES:
        return DSV3_SHAPES[family]
    if family in NEMOTRON_SHAPES:
        return NEMOTRON_SHAPES[family]
    return GPT_OSS_20B if family == "gpt-oss" else QWEN3_30B_A3B


def preset_flops_per_token(preset, layers, seq):
    """The formula for a mixtune preset name (compare.py's consistency check), or None for another model."""
    for family, name in PRESETS.items():
        if preset == name:
            return family_flops_per_token(family, layers, seq)
    return None


def log(msg):
    rank = os.environ.get("RANK")
    who = f"[hf_baseline{' rank ' + rank if rank not in (None, '0') else ''}]"
    print(f"{who} {msg}", file=sys.stderr, flush=True)


def git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("MIXTUNE_COMMIT")
    if env:
        return env
    try:
        r = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=FAMILIES, default="qwen3-moe",
                    help="qwen3-moe: Qwen3-30B-A3B shapes (default); gpt-oss: gpt-oss-20b shapes; moonlight: "
                         "Moonlight-16B-A3B shapes; deepseek-v3: DeepSeek-V3 shapes; nemotron-h: Nemotron 3 Nano "
                         "(30B-A3B) shapes, the first --layers letters of its layer pattern")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    ap.add_argument("--precision", choices=PRECISIONS, default="bf16",
                    help="bf16 | fp32-autocast | fp32-master-copy | fp32-mp (see the module docstring)")
    ap.add_argument("--parallel", choices=PARALLEL, default=None,
                    help="none (one process) | ddp | fsdp2 (under torchrun; without it a one-rank group)")
    ap.add_argument("--fsdp2", action="store_const", dest="parallel_alias", const="fsdp2",
                    help="same as --parallel fsdp2")
    ap.add_argument("--ddp", action="store_const", dest="parallel_alias", const="ddp", help="same as --parallel ddp")
    ap.add_argument("--grad-sync", choices=("last", "every"), default=None,
                    help="ddp/fsdp2: reduce gradients on the last micro-batch only (default) or after every one")
    ap.add_argument("--master-grad-accum", choices=("fp32", "bf16"), default=None,
                    help="fp32-master-copy: accumulate micro-batch gradients in fp32 (default; hooks) or in the "
                         "bf16 .grad (copied to fp32 once per step)")
    ap.add_argument("--reshard-after-forward", choices=("auto", "true", "false"), default=None,
                    help="fsdp2, decoder layers: auto (default) = true with several ranks, false with one (then the "
                         "bf16 copies also stay between the micro-batches of a step)")
    ap.add_argument("--dist-backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--ranks-share-gpu", action="store_true",
                    help="rank r on GPU (local rank mod GPU count); needs --dist-backend gloo: functional check only")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="HF per-decoder-layer activation checkpointing, use_reentrant=False")
    ap.add_argument("--peft", choices=("none", "lora"), default="none",
                    help="lora: Transformers + PEFT LoRA on a frozen bf16 model (see the module docstring)")
    ap.add_argument("--lora-r", type=int, default=None, help="--peft lora: rank (default 16)")
    ap.add_argument("--lora-alpha", type=int, default=None, help="--peft lora: lora_alpha (default 32)")
    ap.add_argument("--lora-targets", default=None,
                    help="--peft lora: comma list of attn (q/k/v/o_proj) and experts (target_parameters "
                         "mlp.experts.gate_up_proj, down_proj); default attn,experts")
    ap.add_argument("--experts-implementation", default="grouped_mm")
    ap.add_argument("--attn-implementation", default=None,
                    help="default: the family's Transformers default (gpt-oss eager, the others sdpa)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda:0", help="one-process runs (torchrun ranks use LOCAL_RANK)")
    ap.add_argument("--prompt-fraction", type=float, default=0.0,
                    help="labels -100 on the first F of each row's tokens (a chat prompt's share of SFT data)")
    ap.add_argument("--no-gemm-ceiling", action="store_true",
                    help="skip the dense 8192^3 GEMM ceiling measurement (MFU vs ceiling not reported)")
    ap.add_argument("--vocab", type=int, default=None,
                    help="functional checks only: a smaller vocabulary (the record is marked functional_check)")
    ap.add_argument("--label", default=None, help="the baseline's name in compare.py's tables")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--print-flops", action="store_true", help="print the FLOP formula result and exit")
    a = ap.parse_args(argv)
    for name in ("layers", "seq", "micro_batch", "grad_accum", "steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, found {getattr(a, name)}")
    if a.warmup < 0:
        ap.error(f"--warmup must be >= 0, found {a.warmup}")
    if not 0.0 <= a.prompt_fraction < 1.0:
        ap.error(f"--prompt-fraction must be in [0, 1), found {a.prompt_fraction}")
    if a.vocab is not None and a.vocab < 2:
        ap.error(f"--vocab must be >= 2, found {a.vocab}")
    a.attn_implementation = a.attn_implementation or DEFAULT_ATTN[a.family]
    if a.family == "gpt-oss" and a.attn_implementation == "sdpa":
        ap.error("--attn-implementation sdpa: Transformers 5.17 refuses it for GPT-OSS (GptOssPreTrainedModel."
                 "_supports_sdpa = False: sdpa has no attention sinks); eager is its default (also "
                 "flex_attention or a flash kernel from the hub)")
    # --parallel and its aliases: one meaning only.
    if a.parallel is not None and a.parallel_alias is not None and a.parallel != a.parallel_alias:
        ap.error(f"--parallel {a.parallel} contradicts --{a.parallel_alias}")
    a.parallel = a.parallel or a.parallel_alias or "none"
    # Every combination that would measure something other than what it names is refused here.
    if a.precision == "fp32-mp" and a.parallel != "fsdp2":
        ap.error("--precision fp32-mp is FSDP2's MixedPrecisionPolicy: add --parallel fsdp2 (without torchrun it "
                 "runs as one rank)")
    if a.parallel == "fsdp2" and a.precision == "fp32-autocast":
        ap.error("under --parallel fsdp2 fp32 masters are --precision fp32-mp (MixedPrecisionPolicy: fp32 sharded "
                 "masters, bf16 compute); fp32-autocast is the one-process autocast baseline (earlier versions "
                 "turned fp32-autocast into FSDP2 mixed precision silently)")
    if a.parallel == "fsdp2" and a.precision == "fp32-master-copy":
        ap.error("--precision fp32-master-copy keeps its own fp32 copy; under FSDP2 use --precision fp32-mp")
    if a.master_grad_accum is not None and a.precision != "fp32-master-copy":
        ap.error("--master-grad-accum applies to --precision fp32-master-copy only")
    if a.precision == "fp32-master-copy":
        a.master_grad_accum = a.master_grad_accum or "fp32"
        if a.parallel == "ddp" and a.master_grad_accum == "fp32":
            ap.error("--precision fp32-master-copy with --parallel ddp needs --master-grad-accum bf16 (DDP reduces "
                     "the bf16 .grad buckets; the fp32 hooks would take the gradients before DDP sees them)")
    if a.grad_sync is not None and a.parallel == "none":
        ap.error("--grad-sync applies to --parallel ddp or fsdp2 only")
    if a.parallel != "none":
        a.grad_sync = a.grad_sync or "last"
    if a.reshard_after_forward is not None and a.parallel != "fsdp2":
        ap.error("--reshard-after-forward applies to --parallel fsdp2 only")
    if a.parallel == "fsdp2":
        a.reshard_after_forward = a.reshard_after_forward or "auto"
    if a.ranks_share_gpu and a.parallel == "none":
        ap.error("--ranks-share-gpu needs --parallel ddp or fsdp2 under torchrun")
    if a.ranks_share_gpu and a.dist_backend != "gloo":
        ap.error("--ranks-share-gpu needs --dist-backend gloo (NCCL refuses two ranks on one GPU: 'Duplicate GPU "
                 "detected')")
    if a.dist_backend != "nccl" and a.parallel == "none":
        ap.error("--dist-backend applies to --parallel ddp or fsdp2 only")
    if a.peft == "none":
        for name in ("lora_r", "lora_alpha", "lora_targets"):
            if getattr(a, name) is not None:
                ap.error(f"--{name.replace('_', '-')} applies to --peft lora only")
    else:
        if a.family not in LORA_FAMILIES:
            ap.error(f"--peft lora is not wired for --family {a.family} (its LoRA parameter count and targets are "
                     f"Qwen3-MoE's and GPT-OSS's)")
        if a.precision != "bf16":
            ap.error("--peft lora trains adapters on a frozen bf16 model: --precision bf16 only (PEFT keeps the "
                     "adapters in fp32 itself)")
        if a.parallel != "none":
            ap.error("--peft lora is measured on one GPU (--parallel none); DDP/FSDP2 with PEFT is not wired here")
        a.lora_r = 16 if a.lora_r is None else a.lora_r
        a.lora_alpha = 32 if a.lora_alpha is None else a.lora_alpha
        a.lora_targets = a.lora_targets or "attn,experts"
        words = [w.strip() for w in a.lora_targets.split(",") if w.strip()]
        unknown = [w for w in words if w not in LORA_TARGETS]
        if unknown or not words:
            ap.error(f"--lora-targets: expected a comma list of {', '.join(LORA_TARGETS)}, found {a.lora_targets!r}")
        a.lora_targets = ",".join(w for w in LORA_TARGETS if w in words)  # canonical order, no repeats
        if a.lora_r < 1 or a.lora_alpha <= 0:
            ap.error(f"--lora-r must be >= 1 and --lora-alpha > 0, found {a.lora_r} and {a.lora_alpha}")
    return a


def lora_target_lists(a):
    """(target_modules, target_parameters) of --lora-targets."""
    modules, params = [], []
    for w in a.lora_targets.split(","):
        modules += LORA_TARGETS[w][0]
        params += LORA_TARGETS[w][1]
    return modules, params


def functional_check(a):
    return bool(a.ranks_share_gpu or a.dist_backend != "nccl" or a.vocab is not None)


def baseline_label(a):
    """Short name of the baseline (compare.py's tables)."""
    if a.label:
        return a.label
    prec = {"bf16": "bf16", "fp32-autocast": "fp32 + bf16 autocast",
            "fp32-master-copy": f"bf16 + fp32 master copy ({a.master_grad_accum} grad accum)",
            "fp32-mp": "FSDP2 mixed precision (fp32 masters)"}[a.precision]
    if a.parallel == "ddp":
        par = f"DDP, sync {a.grad_sync}"
    elif a.parallel == "fsdp2":
        par = f"FSDP2, sync {a.grad_sync}" if a.precision != "fp32-mp" else f"sync {a.grad_sync}"
    else:
        par = ""
    gc = "checkpointing" if a.gradient_checkpointing else ""
    extra = ", ".join(x for x in (par, gc) if x)
    if a.peft == "lora":
        prec = f"PEFT LoRA r {a.lora_r} ({a.lora_targets.replace(',', '+')}), frozen bf16"
    return f"{prec} [{extra}]" if extra else prec


def configuration_text(a, world):
    """Everything that defines this baseline, in one paragraph (compare.py prints it)."""
    prec = {
        "bf16": "bf16 parameters, gradients and AdamW moments (no fp32 master weights)",
        "fp32-autocast": "fp32 parameters, gradients and AdamW moments; forward under torch.autocast(bf16) "
                         "(grouped_mm is not autocast-aware: the experts run in fp32)",
        "fp32-master-copy": "bf16 parameters for compute; fp32 master copy in the optimizer (fused AdamW on the fp32 "
                            "masters, fp32 moments; masters copied back to bf16 after each step); micro-batch "
                            "gradients accumulated in "
                            + ("fp32 (post-accumulate-grad hooks)" if a.master_grad_accum == "fp32"
                               else "the bf16 .grad, copied to fp32 once per step"),
        "fp32-mp": "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): fp32 sharded parameters as "
                   "masters, bf16 compute, fp32 gradients and AdamW moments",
    }[a.precision]
    if a.parallel == "ddp":
        par = (f"DDP over {world} rank(s) (gradient_as_bucket_view, broadcast_buffers=False, default buckets), "
               + ("all-reduce on the last micro-batch only (no_sync() around the others)" if a.grad_sync == "last"
                  else "all-reduce after every micro-batch"))
    elif a.parallel == "fsdp2":
        raf = resolved_reshard_after_forward(a, world)
        par = (f"FSDP2 fully_shard on each decoder layer then the root, {world} rank(s), decoder layers "
               f"reshard_after_forward={raf}, "
               + ("gradients reduced on the last micro-batch only (set_requires_gradient_sync(False) before the "
                  "others" + (", set_reshard_after_backward(False) too" if not raf else "") + ")"
                  if a.grad_sync == "last" else "gradients reduce-scattered after every micro-batch"))
    else:
        par = "one process, one GPU"
    if a.ranks_share_gpu or a.dist_backend != "nccl":
        par += f"; {a.dist_backend} collectives" + (", all ranks sharing one GPU" if a.ranks_share_gpu else "")
    attn = f"attention {a.attn_implementation}, experts {a.experts_implementation}"
    if a.family == "gpt-oss":
        attn = (f"GptOssConfig with gpt-oss-20b's shapes, {a.layers} layers (layer_types alternating from sliding, "
                f"window {GPT_OSS_20B['sliding_window']}; YaRN RoPE; sinks; biases; clamped SwiGLU); "
                f"attention {a.attn_implementation}"
                + (" (Transformers' default for GPT-OSS, which refuses sdpa; the full [heads, S, S+1] scores on "
                   "every layer, the window as a mask)" if a.attn_implementation == "eager" else "")
                + f", experts {a.experts_implementation}; router aux loss off (output_router_logits false, as "
                  f"gpt-oss-20b's config.json)")
    elif a.family in DSV3_SHAPES:
        attn = (f"{dsv3_description(a.family, a.layers)}; attention {a.attn_implementation}, experts "
                f"{a.experts_implementation}; no router aux loss (DeepseekV3ForCausalLM computes none)")
    elif a.family in NEMOTRON_SHAPES:  # run() appends the Mamba2 path once the model is built
        attn = (f"{nemotron_description(a.family, a.layers)}; attention {a.attn_implementation}, experts "
                f"{a.experts_implementation}; no router aux loss (NemotronHForCausalLM computes none); fp32 logits "
                f"(NemotronHForCausalLM upcasts them)")
    if a.peft == "lora":
        modules, params = lora_target_lists(a)
        prec = (f"PEFT LoRA r {a.lora_r}, alpha {a.lora_alpha}, dropout 0 on a frozen bf16 model (no gradients or "
                f"optimizer state for it); target_modules {modules or 'none'}, target_parameters {params or 'none'}"
                f" (ParamWrapper: W + B·A materialised per layer and forward); adapters fp32 (PEFT's "
                f"autocast_adapter_dtype); AdamW over the adapter parameters only")
    parts = [prec, par, attn,
             f"torch.optim.AdamW fused, lr {a.lr:g}, weight decay 0.01, betas (0.9, 0.999), eps 1e-8",
             "no gradient clipping",
             "gradient checkpointing per decoder layer (use_reentrant=False)" if a.gradient_checkpointing
             else "no gradient checkpointing",
             "PYTORCH_ALLOC_CONF " + (os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
                                      or "default")]
    if a.vocab is not None:
        parts.append(f"vocabulary {a.vocab} (functional check)")
    return "; ".join(parts)


def resolved_reshard_after_forward(a, world):
    if a.reshard_after_forward == "true":
        return True
    if a.reshard_after_forward == "false":
        return False
    return world > 1


def model_record(a):
    """The "model" object of the record: the mixtune preset these shapes are, the slice and its size."""
    preset = PRESETS[a.family]
    shapes = family_shapes(a.family)
    m = {"preset": preset if a.vocab is None else f"{preset}, vocab {a.vocab}",
         "layers": a.layers, "params": family_param_count(a.family, a.layers, a.vocab),
         "hidden": shapes["hidden"], "experts": shapes["experts"], "top_k": shapes["top_k"]}
    if a.family == "gpt-oss":
        m["family"] = a.family
        m["sliding_window"] = shapes["sliding_window"]
        m["layer_types"] = gpt_oss_layer_types(a.layers)
    elif a.family in DSV3_SHAPES:
        m["family"] = a.family
        m["dense_layers"] = a.layers - dsv3_moe_layers(a.family, a.layers)
        m["moe_layers"] = dsv3_moe_layers(a.family, a.layers)
    elif a.family in NEMOTRON_SHAPES:
        counts = nemotron_layer_counts(a.family, a.layers)
        m["family"] = a.family
        m["layer_pattern"] = nemotron_layer_pattern(a.family, a.layers)
        m.update(mamba2_layers=counts["M"], moe_layers=counts["E"], attention_layers=counts["*"],
                 dense_layers=counts["-"])
    return m


def base_result(a, command):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return {
        "tool": "transformers",
        "commit": git_commit(),
        "gpu": "unknown",
        "command": command,
        "baseline": baseline_label(a),
        "model": model_record(a),
        "seq": a.seq, "micro_batch": a.micro_batch, "grad_accum": a.grad_accum, "steps": a.steps,
        "warmup": a.warmup, "precision": a.precision,
        "parallel": a.parallel,
        "grad_sync": a.grad_sync,
        "master_grad_accum": a.master_grad_accum,
        "recompute": "full" if a.gradient_checkpointing else "none",
        "router": "real",
        "prompt_fraction": a.prompt_fraction,
        "flops_per_token": family_flops_per_token(a.family, a.layers, a.seq, a.vocab),
        "functional_check": functional_check(a),
        "peft": a.peft,
        "configuration": configuration_text(a, world),
        "oom": False,
    }


def gpu_energy_joules(device_index):
    """The GPU's NVML energy counter (joules since the driver loaded), as mixtune bench reads it
    (kernels/cuda/gpu_energy.h); None where NVML or the counter is unavailable."""
    import ctypes

    import torch
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        handle = ctypes.c_void_p()
        uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None)  # NVML: "GPU-<uuid>"
        found = uuid is not None and nvml.nvmlDeviceGetHandleByUUID(
            ctypes.c_char_p(f"GPU-{uuid}".encode()), ctypes.byref(handle)) == 0
        if not found and nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(device_index), ctypes.byref(handle)) != 0:
            return None
        mj = ctypes.c_ulonglong()
        if nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(mj)) != 0:
            return None
        return mj.value / 1000.0
    except Exception:  # an optional metric: never fails the baseline
        return None


def emit(result, json_out):
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if json_out:
        tmp = json_out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, json_out)  # never leave a half-written file behind


def measure_gemm_ceiling(torch, device, n=8192, iters=10, trials=5):
    """Best-of-trials dense bf16 torch.matmul n^3 rate in TFLOP/s (same measurement as mixtune's start-up one)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize(device)
    best = 0.0
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        best = max(best, 2.0 * n ** 3 * iters / seconds / 1e12)
    del a, b, c
    return best


def make_config(a):
    if a.family in DSV3_SHAPES:
        return make_dsv3_config(a, log)
    if a.family in NEMOTRON_SHAPES:
        return make_nemotron_h_config(a, log)
    return make_gpt_oss_config(a) if a.family == "gpt-oss" else make_qwen3_config(a)


def make_gpt_oss_config(a):
    """GptOssConfig with gpt-oss-20b's config.json values, sliced to a.layers (layer_types sliced with it)."""
    from transformers import GptOssConfig
    s = GPT_OSS_20B
    vocab = a.vocab or s["vocab"]
    kw = dict(
        vocab_size=vocab, hidden_size=s["hidden"], intermediate_size=s["moe_inter"], num_hidden_layers=a.layers,
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
        num_local_experts=s["experts"], num_experts_per_tok=s["top_k"], sliding_window=s["sliding_window"],
        layer_types=gpt_oss_layer_types(a.layers), rope_parameters=dict(GPT_OSS_ROPE),
        max_position_embeddings=max(s["max_position_embeddings"], a.seq), rms_norm_eps=s["rms_norm_eps"],
        attention_bias=True, attention_dropout=0.0, router_aux_loss_coef=s["router_aux_loss_coef"],
        output_router_logits=False, tie_word_embeddings=False, initializer_range=s["initializer_range"],
        hidden_act="silu", use_cache=False, eos_token_id=min(s["eos_token_id"], vocab - 1),
        pad_token_id=min(s["pad_token_id"], vocab - 1),
    )
    try:  # the hub config carries swiglu_limit; Transformers hard-codes the same 7.0 in GptOssExperts
        cfg = GptOssConfig(swiglu_limit=s["swiglu_limit"], **kw)
    except Exception as e:  # noqa: BLE001 -- a strict config's own exception type; retried without the key
        log(f"GptOssConfig(swiglu_limit=...) rejected ({e}); without it (GptOssExperts.limit is 7.0 anyway)")
        cfg = GptOssConfig(**kw)
    rp = getattr(cfg, "rope_parameters", None) or {}
    checks = {"rope_type": (rp.get("rope_type"), "yarn"), "rope_theta": (rp.get("rope_theta"), 150000.0),
              "rope factor": (rp.get("factor"), 32.0), "head_dim": (getattr(cfg, "head_dim", None), s["head_dim"]),
              "num_local_experts": (getattr(cfg, "num_local_experts", None), s["experts"]),
              "sliding_window": (cfg.sliding_window, s["sliding_window"]),
              "layer_types": (list(cfg.layer_types), gpt_oss_layer_types(a.layers)),
              "output_router_logits": (cfg.output_router_logits, False),
              "tie_word_embeddings": (cfg.tie_word_embeddings, False)}
    for name, (found, want) in checks.items():
        if found != want:
            raise RuntimeError(f"GptOssConfig field {name}: expected {want}, found {found}")
    return cfg


def make_qwen3_config(a):
    from transformers import Qwen3MoeConfig
    s = QWEN3_30B_A3B
    kw = dict(
        vocab_size=a.vocab or s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=a.layers, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"], moe_intermediate_size=s["moe_inter"], num_experts=s["experts"],
        num_experts_per_tok=s["top_k"], norm_topk_prob=True, output_router_logits=False,
        router_aux_loss_coef=0.001, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=s["rms_norm_eps"],
        hidden_act="silu", attention_bias=False, use_sliding_window=False, tie_word_embeddings=False,
        use_cache=False, initializer_range=0.02, max_position_embeddings=max(40960, a.seq),
        bos_token_id=min(151643, (a.vocab or s["vocab"]) - 1), eos_token_id=min(151645, (a.vocab or s["vocab"]) - 1),
    )
    try:  # v5 spelling
        cfg = Qwen3MoeConfig(rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"]}, **kw)
    except (TypeError, ValueError) as e:
        log(f"Qwen3MoeConfig(rope_parameters=...) rejected ({e}); using rope_theta=")
        cfg = Qwen3MoeConfig(rope_theta=s["rope_theta"], **kw)
    rp = getattr(cfg, "rope_parameters", None)
    theta = rp.get("rope_theta") if isinstance(rp, dict) else getattr(cfg, "rope_theta", None)
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    checks = {"rope_theta": (theta, s["rope_theta"]), "head_dim": (getattr(cfg, "head_dim", None), s["head_dim"]),
              "num_experts": (experts, s["experts"]), "norm_topk_prob": (cfg.norm_topk_prob, True),
              "tie_word_embeddings": (cfg.tie_word_embeddings, False)}
    for name, (found, want) in checks.items():
        if found != want:
            raise RuntimeError(f"Qwen3MoeConfig field {name}: expected {want}, found {found}")
    return cfg


def build_model(torch, a, cfg, dtype, device):
    """Returns (model, how the experts implementation was requested). Builds directly on the GPU."""
    from transformers import AutoModelForCausalLM
    kwargs = dict(dtype=dtype, attn_implementation=a.attn_implementation)
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, experts_implementation=a.experts_implementation, **kwargs)
            how = "from_config(experts_implementation=...)"
        except TypeError as e:
            log(f"from_config(experts_implementation=...) rejected ({e}); setting config._experts_implementation")
            cfg._experts_implementation = a.experts_implementation
            model = AutoModelForCausalLM.from_config(cfg, **kwargs)
            how = "config._experts_implementation"
    active = getattr(model.config, "_experts_implementation", None)
    if active != a.experts_implementation and hasattr(model, "set_experts_implementation"):
        log(f"experts implementation after from_config is {active!r}; calling model.set_experts_implementation")
        model.set_experts_implementation(a.experts_implementation)
        how = "model.set_experts_implementation"
    p = next(model.parameters())
    if p.device != device:
        log(f"parameters were built on {p.device}; moving to {device}")
        model.to(device)
    other = sorted(n for n, q in model.named_parameters() if q.dtype != dtype)
    if other:  # e.g. a module Transformers keeps in fp32: recorded, and the master copy covers it too
        log(f"WARNING: {len(other)} parameter(s) not in {dtype} (first: {other[0]})")
    return model, how, other


def probe_expert_ops(torch, model, device, autocast, vocab, tokens=256):
    """Counts the aten ops of one small no-grad forward, to show which kernels the experts really ran
    (grouped_mm: 2 grouped GEMMs per layer; eager: a per-expert loop of mm/linear calls) and which kernel sdpa
    picked (aten._scaled_dot_product_{flash,efficient,cudnn}_attention; its math fallback shows as bmm)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    counts = {}

    class OpCounter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func).rsplit(".", 1)[0]  # aten._grouped_mm.default -> aten._grouped_mm
            counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    ids = torch.randint(0, vocab, (1, tokens), device=device)
    with torch.no_grad(), autocast(), OpCounter():
        model(input_ids=ids, use_cache=False)
    # sdpa's kernel choice here is the no-grad one; with gradients it is the same unless a kernel lacks a backward.
    keep = {k: v for k, v in counts.items()
            if "grouped_mm" in k or "scaled_dot_product" in k or k in ("aten.mm", "aten.addmm", "aten.bmm")}
    return dict(sorted(keep.items()))


class MasterCopyAdamW:
    """bf16 model parameters with an fp32 master copy owned by the optimizer.

    fused torch.optim.AdamW runs on the fp32 masters (fp32 moments); after each step the masters are copied back
    into the bf16 parameters (round to nearest) with one torch._foreach_copy_. Gradients reach the fp32 master
    gradients either
      grad_accum="fp32": through a post-accumulate-grad hook on every bf16 parameter, which adds the micro-batch's
                         bf16 gradient into the fp32 master gradient (the first micro-batch of a step copies) and
                         frees the bf16 gradient at once (Megatron's main_grad scheme); or
      grad_accum="bf16": autograd (or DDP) accumulates the bf16 .grad over the micro-batches; step() copies them
                         into the fp32 master gradients with one torch._foreach_copy_.
    A parameter without a gradient in a step is an error (its master gradient would be stale).
    """

    def __init__(self, torch, named_params, lr, grad_accum, log_fn):
        self.torch = torch
        self.names = [n for n, p in named_params if p.requires_grad]
        self.params = [p for n, p in named_params if p.requires_grad]
        self.grad_accum = grad_accum
        with torch.no_grad():
            self.masters = [p.detach().float() for p in self.params]  # new fp32 tensors
            self.master_grads = [torch.zeros_like(m) for m in self.masters]
        for m, g in zip(self.masters, self.master_grads):
            m.requires_grad_(True)  # leaves outside any graph; the optimizer reads m.grad
            m.grad = g
        try:
            self.opt = torch.optim.AdamW(self.masters, lr=lr, fused=True)
            self.how = f"torch.optim.AdamW(fused=True, lr={lr:g}) on fp32 masters"
        except (RuntimeError, TypeError) as e:
            log_fn(f"fused AdamW rejected on the fp32 masters ({e}); using foreach")
            self.opt = torch.optim.AdamW(self.masters, lr=lr, foreach=True)
            self.how = f"torch.optim.AdamW(foreach=True, lr={lr:g}) on fp32 masters"
        self.fresh = [True] * len(self.params)
        self.hooks = []
        if grad_accum == "fp32":
            for i, p in enumerate(self.params):
                self.hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))

    def _make_hook(self, i):
        def hook(p):
            g = p.grad
            if g is None:
                return
            with self.torch.no_grad():
                if self.fresh[i]:
                    self.master_grads[i].copy_(g)
                    self.fresh[i] = False
                else:
                    self.master_grads[i].add_(g)
            p.grad = None  # the bf16 gradient is freed right away
        return hook

    def step(self):
        torch = self.torch
        if self.grad_accum == "fp32":
            missing = [n for n, f in zip(self.names, self.fresh) if f]
        else:
            missing = [n for n, p in zip(self.names, self.params) if p.grad is None]
        if missing:
            raise RuntimeError(f"fp32-master-copy: {len(missing)} parameter(s) got no gradient this step "
                               f"(first: {missing[0]}); their fp32 master gradients would be stale")
        with torch.no_grad():
            if self.grad_accum == "bf16":
                torch._foreach_copy_(self.master_grads, [p.grad for p in self.params])
            self.opt.step()
            torch._foreach_copy_(self.params, self.masters)
        self.fresh = [True] * len(self.params)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def init_distributed(torch, a, result):
    """Process group for --parallel ddp/fsdp2; returns (device, world, rank)."""
    import torch.distributed as dist
    if "WORLD_SIZE" not in os.environ:  # one process without torchrun: a one-rank group on loopback
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                           "LOCAL_RANK": "0"})
        device = torch.device(a.device)
        if device.index is None:
            device = torch.device("cuda", 0)
        result["process_group"] = "one rank, made by hf_baseline.py (no torchrun)"
    else:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        count = torch.cuda.device_count()
        if count < 1:
            raise RuntimeError("no CUDA device")
        if a.ranks_share_gpu:
            device = torch.device("cuda", local % count)
        else:
            if local >= count:
                raise RuntimeError(f"local rank {local} needs cuda:{local}, {count} GPU(s) here; a functional check "
                                   f"on fewer GPUs: --ranks-share-gpu --dist-backend gloo")
            device = torch.device("cuda", local)
        result["process_group"] = "torchrun"
    torch.cuda.set_device(device)
    if not dist.is_initialized():
        kw = {"backend": a.dist_backend}
        if a.dist_backend == "nccl":
            kw["device_id"] = device  # eager NCCL init on this GPU
        dist.init_process_group(**kw)
    return device, dist.get_world_size(), dist.get_rank()


def fsdp2_wrap(torch, a, model, world, result):
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy() if a.precision == "bf16" else \
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raf = resolved_reshard_after_forward(a, world)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=raf)
    fully_shard(model, mp_policy=mp)
    forced_sum = None
    if a.dist_backend == "gloo":  # gloo has no ReduceOp.AVG: SUM and a division instead
        mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if all(hasattr(m, "set_force_sum_reduction_for_comms") for m in mods):
            for m in mods:
                m.set_force_sum_reduction_for_comms(True)
            forced_sum = True
        else:
            log("WARNING: this torch has no FSDPModule.set_force_sum_reduction_for_comms; gloo may refuse AVG")
            forced_sum = False
    result["fsdp2"] = {
        "mp_policy": "none (bf16 params)" if a.precision == "bf16" else
        "param bf16, reduce fp32, fp32 sharded masters",
        "wrapped": "each decoder layer, then the root",
        "reshard_after_forward_layers": raf,
        "grad_sync": a.grad_sync,
        "reshard_after_backward_between_micro_batches": raf or a.grad_sync != "last",
        "force_sum_reduction": forced_sum,
    }
    return raf


def apply_lora(torch, a, model, result):
    """Wraps the bf16 model with PEFT LoRA in place; returns the PeftModel. Checks that only adapters train and
    that every targeted module really got its adapter."""
    import peft
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.tuners.lora.layer import ParamWrapper
    modules, params = lora_target_lists(a)
    cfg = LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                     target_modules=modules, target_parameters=params or None)
    pm = get_peft_model(model, cfg)  # autocast_adapter_dtype=True (the default): adapters upcast to fp32
    trainable = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
    not_lora = [n for n, _ in trainable if "lora_" not in n]
    if not_lora:
        raise RuntimeError(f"PEFT left {len(not_lora)} base parameter(s) trainable (first: {not_lora[0]})")
    lora_params = sum(p.numel() for _, p in trainable)
    frozen_params = sum(p.numel() for _, p in pm.named_parameters() if not p.requires_grad)
    linears = sum(isinstance(m, LoraLinear) for m in pm.modules())
    wrappers = sum(isinstance(m, ParamWrapper) for m in pm.modules())
    want_linears, want_wrappers = len(modules) * a.layers, len(params) * a.layers
    if (linears, wrappers) != (want_linears, want_wrappers):
        raise RuntimeError(f"PEFT made {linears} lora.Linear and {wrappers} ParamWrapper modules, expected "
                           f"{want_linears} and {want_wrappers} ({a.layers} layers)")
    factor = lora_flops_factor(lora_params, frozen_params)
    expected = lora_param_count(a.family, a.layers, a.lora_r, a.lora_targets)
    if lora_params != expected:
        log(f"WARNING: {lora_params} LoRA parameters, the formula gives {expected}")
    result["lora"] = {
        "peft_version": peft.__version__, "r": a.lora_r, "lora_alpha": a.lora_alpha, "targets": a.lora_targets,
        "target_modules": modules, "target_parameters": params, "lora_linear_modules": linears,
        "param_wrappers": wrappers, "trainable_params": lora_params, "frozen_params": frozen_params,
        "adapter_dtypes": sorted({str(p.dtype).replace("torch.", "") for _, p in trainable}),
        "flops_factor": factor,
    }
    result["lora_flops_factor"] = factor
    log(f"PEFT {peft.__version__} LoRA r {a.lora_r} alpha {a.lora_alpha} on {a.lora_targets}: {linears} "
        f"lora.Linear + {wrappers} ParamWrapper modules, {lora_params / 1e6:.1f} M trainable "
        f"({result['lora']['adapter_dtypes']}) over {frozen_params / 1e9:.3f} B frozen; FLOP factor {factor:.4f}")
    return pm


def run(a, result):
    import torch
    import transformers

    result["transformers_version"] = transformers.__version__
    result["torch_version"] = torch.__version__
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False: this baseline needs a CUDA GPU")
    world, rank = 1, 0
    if a.parallel != "none":
        device, world, rank = init_distributed(torch, a, result)
        result["gpus"] = world
        result["configuration"] = configuration_text(a, world)
    else:
        device = torch.device(a.device)
        if device.type != "cuda":
            raise RuntimeError(f"--device must be a CUDA device, found {a.device!r}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    a.device = str(device)
    result["gpu"] = torch.cuda.get_device_name(device)
    result["stage"] = "gemm_ceiling"

    if a.no_gemm_ceiling or a.ranks_share_gpu:
        ceiling = None
        log("GEMM ceiling not measured" + (" (ranks share the GPU)" if a.ranks_share_gpu else ""))
    else:
        ceiling = measure_gemm_ceiling(torch, device)
        log(f"dense bf16 GEMM 8192^3 ceiling: {ceiling:.1f} TFLOP/s on {result['gpu']}")
    result["gemm_ceiling_tflops"] = ceiling
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)  # the peak covers the whole run from model creation on
    free_b, total_b = torch.cuda.mem_get_info(device)
    result["memory"] = {"device_total_bytes": int(total_b), "free_before_model_bytes": int(free_b)}

    result["stage"] = "model"
    torch.manual_seed(a.seed)
    cfg = make_config(a)
    vocab = a.vocab or family_shapes(a.family)["vocab"]
    param_dtype = torch.float32 if a.precision in ("fp32-autocast", "fp32-mp") else torch.bfloat16
    model, how, other_dtype = build_model(torch, a, cfg, param_dtype, device)
    params_total = sum(p.numel() for p in model.parameters())
    named_params = list(model.named_parameters())  # before any wrapping: plain tensors, the names HF gives
    raf = None
    if a.parallel == "fsdp2":
        raf = fsdp2_wrap(torch, a, model, world, result)
    model.config.use_cache = False
    model.train()
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    experts_active = getattr(model.config, "_experts_implementation", None)
    attn_active = getattr(model.config, "_attn_implementation", None)
    # The first layer with routed experts (DeepSeek-V3's first first_k_dense_replace layers are dense; Nemotron-H's
    # experts are a layer's `mixer` on its E layers).
    experts_mod = next((m.experts for layer in model.model.layers
                        for m in (getattr(layer, "mlp", None), getattr(layer, "mixer", None))
                        if hasattr(m, "experts")), None)
    moe_layers = family_moe_layers(a.family, a.layers)
    grouped_fn = ("torch.nn.functional.grouped_mm" if hasattr(torch.nn.functional, "grouped_mm") else
                  "torch._grouped_mm" if hasattr(torch, "_grouped_mm") else "none")
    params = params_total
    result["model"]["params"] = params
    result["hf"] = {
        "experts_implementation": experts_active, "experts_requested_via": how,
        "attn_implementation": attn_active, "experts_class": type(experts_mod).__name__ if experts_mod else None,
        "grouped_mm_function": grouped_fn, "param_dtype": str(param_dtype).replace("torch.", ""),
        "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", a.gradient_checkpointing)),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "optimizer": f"torch.optim.AdamW(fused=True, lr={a.lr:g})",
        "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default",
        "dist_backend": a.dist_backend if a.parallel != "none" else None,
        "configuration": result["configuration"],
        "params_not_in_param_dtype": other_dtype,
    }
    log(f"{result['baseline']}: experts {experts_active} (requested via {how}; class "
        f"{result['hf']['experts_class']}; {grouped_fn}); attention: {attn_active}; params {params / 1e9:.3f} B; "
        f"dtype {param_dtype}; {world} rank(s)")
    if a.family in NEMOTRON_SHAPES:  # which Mamba2 path trains: the fused mamba_ssm kernels or the torch SSD
        mamba = mamba_path(model)
        result["hf"]["mamba"] = mamba
        result["configuration"] += f"; Mamba2 mixers: {mamba['path']}"
        result["hf"]["configuration"] = result["configuration"]
        log(f"Mamba2 path: {mamba['path']} (is_fast_path_available {mamba['is_fast_path_available']}; installed "
            f"{mamba['installed']}; use_mamba_kernels {mamba['use_mamba_kernels']})")
    if moe_layers == 0:  # e.g. DeepSeek-V3's three dense layers: no experts run, whatever the setting says
        log(f"no MoE layer in this {a.layers}-layer slice: experts implementation {experts_active!r} unused")
    elif experts_active != a.experts_implementation:
        raise RuntimeError(f"experts implementation: expected {a.experts_implementation!r}, found "
                           f"{experts_active!r}")
    if attn_active != a.attn_implementation:
        raise RuntimeError(f"attention implementation: expected {a.attn_implementation!r}, found {attn_active!r}")
    expected_params = family_param_count(a.family, a.layers, a.vocab)
    if params != expected_params:
        log(f"WARNING: parameter count {params} differs from the {PRESETS[a.family]} slice formula "
            f"{expected_params}")
        result["params_expected"] = expected_params
    peft_model = None
    if a.peft == "lora":
        result["stage"] = "peft"
        peft_model = apply_lora(torch, a, model, result)  # injects the adapters into `model` itself
        result["hf"]["optimizer"] = f"torch.optim.AdamW(fused=True, lr={a.lr:g}) over the LoRA parameters only"

    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) \
        if a.precision == "fp32-autocast" else contextlib.nullcontext
    result["stage"] = "probe"
    ops = probe_expert_ops(torch, model, device, autocast, vocab) if a.parallel != "fsdp2" else {}
    result["hf"]["probe_ops_256_tokens"] = ops
    grouped_calls = sum(v for k, v in ops.items() if "grouped_mm" in k)
    log(f"ops of one 256-token forward: {ops}")
    if a.experts_implementation == "grouped_mm" and a.parallel != "fsdp2" and grouped_calls != 2 * moe_layers:
        log(f"WARNING: expected {2 * moe_layers} grouped_mm calls (2 per MoE layer) in the probe forward, saw "
            f"{grouped_calls}: the experts may not be running through grouped_mm")

    train_model = peft_model if peft_model is not None else model
    if a.parallel == "ddp":
        result["stage"] = "ddp"
        from torch.nn.parallel import DistributedDataParallel as DDP
        train_model = DDP(model, device_ids=[device.index], output_device=device.index,
                          gradient_as_bucket_view=True, broadcast_buffers=False)
        result["ddp"] = {"gradient_as_bucket_view": True, "broadcast_buffers": False,
                         "find_unused_parameters": False, "grad_sync": a.grad_sync}

    result["stage"] = "optimizer"
    if a.precision == "fp32-master-copy":
        opt = MasterCopyAdamW(torch, named_params, a.lr, a.master_grad_accum, log)
        result["hf"]["optimizer"] = opt.how + f"; gradients accumulated in {a.master_grad_accum}"
    else:
        # LoRA: the adapters only (the frozen base has requires_grad False); otherwise every parameter
        trained = [p for p in model.parameters() if p.requires_grad] if a.peft == "lora" else list(model.parameters())
        try:
            opt = torch.optim.AdamW(trained, lr=a.lr, fused=True)
        except (RuntimeError, TypeError) as e:  # a torch without fused AdamW for DTensor parameters
            log(f"fused AdamW rejected ({e}); using foreach")
            opt = torch.optim.AdamW(trained, lr=a.lr, foreach=True)
            result["hf"]["optimizer"] = f"torch.optim.AdamW(foreach=True, lr={a.lr:g})"
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed + 7777 * rank)  # each rank its own tokens
    prompt_len = int(a.prompt_fraction * a.seq)  # same rounding as mixtune bench
    sync_last = a.parallel != "none" and a.grad_sync == "last"
    fsdp_keep_unsharded = a.parallel == "fsdp2" and sync_last and raf is False

    def train_step():
        total = torch.zeros((), device=device, dtype=torch.float32)
        for i in range(a.grad_accum):
            last = i == a.grad_accum - 1
            ctx = contextlib.nullcontext()
            if a.parallel == "fsdp2" and sync_last:
                model.set_requires_gradient_sync(last)
                if fsdp_keep_unsharded:  # one rank: keep the bf16 copies until the step's last backward
                    model.set_reshard_after_backward(last)
            elif a.parallel == "ddp" and sync_last and not last:
                ctx = train_model.no_sync()
            ids = torch.randint(0, vocab, (a.micro_batch, a.seq), device=device, generator=gen)
            labels = ids
            if prompt_len > 0:
                labels = ids.clone()
                labels[:, :prompt_len] = -100
            with ctx:
                with autocast():
                    out = train_model(input_ids=ids, labels=labels, use_cache=False)
                loss = out.loss / a.grad_accum
                loss.backward()
            total += loss.detach().float()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    losses = []
    result["stage"] = "warmup"
    for i in range(a.warmup):
        t0 = time.perf_counter()
        losses.append(train_step())
        torch.cuda.synchronize(device)
        if i == 0:  # weights + optimizer state (+ masters): what stays between steps
            result["memory"]["allocated_after_first_step_bytes"] = int(torch.cuda.memory_allocated(device))
        log(f"warm-up step {i + 1}/{a.warmup}: {time.perf_counter() - t0:.3f} s")

    result["stage"] = "timed"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
    torch.cuda.synchronize(device)
    joules0 = gpu_energy_joules(device.index)
    t0 = time.perf_counter()
    events[0].record()
    for i in range(a.steps):
        losses.append(train_step())
        events[i + 1].record()
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    joules1 = gpu_energy_joules(device.index)
    result.pop("stage")
    result["memory"].setdefault("allocated_after_first_step_bytes", int(torch.cuda.memory_allocated(device)))

    loss_values = [float(x.item()) for x in losses]
    step_time = elapsed / a.steps
    tokens_per_step = a.micro_batch * a.seq * a.grad_accum
    tps = tokens_per_step / step_time
    tflops = tps * result["flops_per_token"] / 1e12
    result.update({
        "tokens_per_s_per_gpu": tps,
        "step_time_s": step_time,
        "step_times_s": [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(a.steps)],
        "model_tflops_per_gpu": tflops,
        "mfu_vs_ceiling": tflops / ceiling if ceiling else None,
        "mfu_vs_989": tflops / PEAK_989,
        "loss_first": loss_values[0],
        "loss_last": loss_values[-1],
        "losses": loss_values,
    })
    if a.peft == "lora":  # NeMo's LoRA convention on top of the full fine-tune count (module docstring)
        result["lora_model_tflops_per_gpu"] = tflops * result["lora_flops_factor"]
        result["lora_mfu_vs_989"] = tflops * result["lora_flops_factor"] / PEAK_989
    if joules0 is not None and joules1 is not None and joules1 > joules0 and not a.ranks_share_gpu:
        energy = joules1 - joules0  # this rank's GPU, as mixtune's
        result.update({"energy_j_per_step": energy / a.steps, "mean_power_w": energy / elapsed,
                       "energy_pj_per_model_flop": energy / (tokens_per_step * a.steps * result["flops_per_token"])
                       * 1e12})
    mfu = f", MFU {100 * tflops / ceiling:.1f}% of ceiling" if ceiling else ""
    log(f"{tps:,.0f} tokens/s{' per GPU' if world > 1 else ''}, step {step_time:.3f} s, {tflops:.1f} model "
        f"TFLOP/s{mfu}, loss {loss_values[0]:.4f} -> {loss_values[-1]:.4f}"
        + (" (functional check, not a measurement)" if result["functional_check"] else ""))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.print_flops:
        f = family_flops_per_token(a.family, a.layers, a.seq, a.vocab)
        record = {"family": a.family, "preset": PRESETS[a.family], "layers": a.layers, "seq": a.seq,
                  "flops_per_token": f, "params": family_param_count(a.family, a.layers, a.vocab)}
        if layer_pattern(a.family, a.layers):
            record["layer_pattern"] = layer_pattern(a.family, a.layers)
        if a.peft == "lora":
            n = lora_param_count(a.family, a.layers, a.lora_r, a.lora_targets)
            record.update(lora_params=n, lora_flops_factor=lora_flops_factor(n, record["params"]))
        print(json.dumps(record))
        return 0
    command = shlex.join(["python3", sys.argv[0]] + list(argv))
    result = base_result(a, command)
    rc = 0
    try:
        run(a, result)
    except Exception as e:  # noqa: BLE001 -- every failure must still produce the JSON record
        text = f"{type(e).__name__}: {e}".strip()
        is_oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in text.lower()
        result["oom"] = is_oom
        result["error"] = text.splitlines()[0][:500] if text else type(e).__name__
        rc = EXIT_OOM if is_oom else 1
        log(f"{'OOM' if is_oom else 'FAILED'} during stage {result.get('stage')}: {result['error']}")
        if not is_oom:
            import traceback
            traceback.print_exc(file=sys.stderr)
    rank = int(os.environ.get("RANK", "0"))
    distributed = False
    try:
        import torch
        import torch.distributed as dist
        distributed = a.parallel != "none" and dist.is_available() and dist.is_initialized()
        if torch.cuda.is_available():
            dev = torch.device(a.device)
            peaks = [int(torch.cuda.max_memory_allocated(dev)), int(torch.cuda.max_memory_reserved(dev))]
            if distributed and rc == 0 and dist.get_world_size() > 1:  # per GPU: the largest over the ranks
                t = torch.tensor(peaks, dtype=torch.int64, device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                peaks = [int(x) for x in t.tolist()]
            result["peak_allocated_bytes"], result["peak_reserved_bytes"] = peaks
            if a.ranks_share_gpu:
                result["peak_note"] = "per rank; the ranks share one GPU"
    except Exception as e:  # noqa: BLE001 -- memory stats are best effort after a failure
        log(f"could not read memory statistics: {e}")
    if rank == 0:
        emit(result, a.json_out)
    if distributed:
        try:
            import torch.distributed as dist
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
