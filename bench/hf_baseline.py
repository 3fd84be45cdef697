#!/usr/bin/env python3
"""Transformers v5 training baseline for `mixtune bench` (run on the GPU machine: torch 2.11, transformers 5.17).

Random-weight Qwen3-30B-A3B layer shapes sliced to --layers N (full vocabulary, untied lm_head), built with
Qwen3MoeConfig + AutoModelForCausalLM.from_config(dtype, attn_implementation="sdpa",
experts_implementation="grouped_mm"), trained on seeded random token ids with fused torch AdamW (lr 1e-5).
One step = grad_accum micro-batches (loss / grad_accum, backward) + optimizer.step + zero_grad(set_to_none=True).

Prints one JSON object on stdout (progress goes to stderr) with the keys of the `mixtune bench` contract
(tool "transformers"; phases_ms omitted) and writes it to --json-out too. On CUDA out-of-memory it still writes
the JSON, with "oom": true, and exits 3; any other failure writes "error" and exits 1.

  python3 bench/hf_baseline.py --layers 12 --seq 4096 --micro-batch 1 --grad-accum 8 --steps 5 --warmup 2
  python3 bench/hf_baseline.py --layers 4 --precision fp32-autocast        # fp32 weights, bf16 autocast
  python3 bench/hf_baseline.py --print-flops --layers 12 --seq 4096        # FLOP formula only (no torch needed)
  torchrun --nproc-per-node 2 bench/hf_baseline.py --fsdp2 --layers 12     # PyTorch FSDP2 over 2 GPUs

--fsdp2 (under torchrun): every decoder layer and then the root wrapped with torch.distributed.fsdp.fully_shard
(FSDP2, no expert parallelism: Transformers replicates experts, here they are sharded like every parameter);
--precision bf16 keeps bf16 parameters and states, fp32-autocast becomes FSDP2 mixed precision (fp32 sharded
masters, param_dtype bf16, reduce_dtype fp32). Each rank trains on its own random tokens with grad_accum
micro-batches per step (gradients reduce-scattered every micro-batch, FSDP2's default); rank 0 prints the JSON
with per-GPU tokens/s and the largest peak memory over the ranks.

torch and transformers are imported inside main() so that compare.py (and a machine without torch) can import the
FLOP formula from this file.
"""
import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time

# Qwen3-30B-A3B shapes (config.json of Qwen/Qwen3-30B-A3B; hf-numerics.md §3.1).
QWEN3_30B_A3B = dict(
    hidden=2048, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8, moe_inter=768, vocab=151936,
    rms_norm_eps=1e-6, rope_theta=1e6, intermediate=6144,
)
PEAK_989 = 989.0  # H100/H200 dense bf16 peak, TFLOP/s (the NVIDIA suites' MFU denominator)
EXIT_OOM = 3


def flops_per_token(layers, seq, hidden, heads, kv_heads, head_dim, top_k, moe_inter, vocab):
    """NeMo/Megatron model FLOPs per trained token, router GEMM excluded, recompute not counted.

    per layer: 6 x (q, k, v, o projection params) + 6 x (top_k x 3 x H x I expert params)
               + 6 x S x Hq x D (causal attention core: QK^T and PV, half of the S x S square)
    plus 6 x V x H for the LM head.
    """
    attn_proj = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = top_k * 3 * hidden * moe_inter
    core = seq * heads * head_dim
    return layers * (6 * (attn_proj + experts) + 6 * core) + 6 * vocab * hidden


def qwen3_flops_per_token(layers, seq):
    s = QWEN3_30B_A3B
    return flops_per_token(layers, seq, s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["top_k"],
                           s["moe_inter"], s["vocab"])


def qwen3_param_count(layers):
    """Parameters of the sliced model as HF builds it: embeddings, lm_head, final norm, and per layer q/k/v/o,
    q_norm/k_norm, two RMSNorms, the router (E x H, no bias) and the experts (gate_up 2I x H, down H x I)."""
    s = QWEN3_30B_A3B
    h, hq, hkv, d, e, i, v = (s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["experts"], s["moe_inter"],
                              s["vocab"])
    per_layer = (2 * h * hq * d + 2 * h * hkv * d) + 2 * d + 2 * h + e * h + e * 3 * h * i
    return layers * per_layer + 2 * v * h + h


def log(msg):
    print(f"[hf_baseline] {msg}", file=sys.stderr, flush=True)


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
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    ap.add_argument("--precision", choices=["bf16", "fp32-autocast"], default="bf16",
                    help="bf16: bf16 params, grads and AdamW states; fp32-autocast: fp32 params/states, "
                         "forward under torch.autocast(bf16)")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="HF per-decoder-layer activation checkpointing, use_reentrant=False")
    ap.add_argument("--experts-implementation", default="grouped_mm")
    ap.add_argument("--attn-implementation", default="sdpa")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--fsdp2", action="store_true", help="shard with FSDP2 over the torchrun ranks (LOCAL_RANK GPU)")
    ap.add_argument("--prompt-fraction", type=float, default=0.0,
                    help="labels -100 on the first F of each row's tokens (a chat prompt's share of SFT data)")
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
    return a


def base_result(a, command):
    return {
        "tool": "transformers",
        "commit": git_commit(),
        "gpu": "unknown",
        "command": command,
        "model": {"preset": "qwen3-30b-a3b", "layers": a.layers, "params": qwen3_param_count(a.layers),
                  "hidden": QWEN3_30B_A3B["hidden"], "experts": QWEN3_30B_A3B["experts"],
                  "top_k": QWEN3_30B_A3B["top_k"]},
        "seq": a.seq, "micro_batch": a.micro_batch, "grad_accum": a.grad_accum, "steps": a.steps,
        "warmup": a.warmup, "precision": a.precision,
        "recompute": "full" if a.gradient_checkpointing else "none",
        "router": "real",
        "prompt_fraction": a.prompt_fraction,
        "flops_per_token": qwen3_flops_per_token(a.layers, a.seq),
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
    from transformers import Qwen3MoeConfig
    s = QWEN3_30B_A3B
    kw = dict(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=a.layers, num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"], moe_intermediate_size=s["moe_inter"], num_experts=s["experts"],
        num_experts_per_tok=s["top_k"], norm_topk_prob=True, output_router_logits=False,
        router_aux_loss_coef=0.001, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=s["rms_norm_eps"],
        hidden_act="silu", attention_bias=False, use_sliding_window=False, tie_word_embeddings=False,
        use_cache=False, initializer_range=0.02, max_position_embeddings=max(40960, a.seq),
        bos_token_id=151643, eos_token_id=151645,
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
    return model, how


def probe_expert_ops(torch, model, device, autocast, tokens=256):
    """Counts the aten ops of one small no-grad forward, to show which kernels the experts really ran
    (grouped_mm: 2 grouped GEMMs per layer; eager: a per-expert loop of mm/linear calls)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    counts = {}

    class OpCounter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func).rsplit(".", 1)[0]  # aten._grouped_mm.default -> aten._grouped_mm
            counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    ids = torch.randint(0, QWEN3_30B_A3B["vocab"], (1, tokens), device=device)
    with torch.no_grad(), autocast(), OpCounter():
        model(input_ids=ids, use_cache=False)
    keep = {k: v for k, v in counts.items() if "grouped_mm" in k or k in ("aten.mm", "aten.addmm", "aten.bmm")}
    return dict(sorted(keep.items()))


def run(a, result):
    import torch
    import transformers

    result["transformers_version"] = transformers.__version__
    result["torch_version"] = torch.__version__
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False: this baseline needs a CUDA GPU")
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if a.fsdp2:
        import torch.distributed as dist
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=device)
        result["gpus"] = world
        result["parallel"] = "fsdp2"
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

    ceiling = measure_gemm_ceiling(torch, device)
    result["gemm_ceiling_tflops"] = ceiling
    log(f"dense bf16 GEMM 8192^3 ceiling: {ceiling:.1f} TFLOP/s on {result['gpu']}")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)  # the peak covers the whole run from model creation on

    result["stage"] = "model"
    torch.manual_seed(a.seed)
    cfg = make_config(a)
    param_dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    model, how = build_model(torch, a, cfg, param_dtype, device)
    params_total = sum(p.numel() for p in model.parameters())
    if a.fsdp2:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy() if a.precision == "bf16" else \
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        result["fsdp2"] = {"mp_policy": "none (bf16 params)" if a.precision == "bf16" else
                           "param bf16, reduce fp32, fp32 sharded masters",
                           "wrapped": "each decoder layer, then the root", "reshard_after_forward": True}
    model.config.use_cache = False
    model.train()
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    experts_active = getattr(model.config, "_experts_implementation", None)
    attn_active = getattr(model.config, "_attn_implementation", None)
    experts_mod = model.model.layers[0].mlp.experts if hasattr(model.model.layers[0].mlp, "experts") else None
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
    }
    log(f"experts implementation: {experts_active} (requested via {how}; class "
        f"{result['hf']['experts_class']}; {grouped_fn}); attention: {attn_active}; params {params / 1e9:.3f} B; "
        f"dtype {param_dtype}")
    if experts_active != a.experts_implementation:
        raise RuntimeError(f"experts implementation: expected {a.experts_implementation!r}, found "
                           f"{experts_active!r}")
    if attn_active != a.attn_implementation:
        raise RuntimeError(f"attention implementation: expected {a.attn_implementation!r}, found {attn_active!r}")
    expected_params = qwen3_param_count(a.layers)
    if params != expected_params:
        log(f"WARNING: parameter count {params} differs from the Qwen3-30B-A3B slice formula {expected_params}")
        result["params_expected"] = expected_params

    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) \
        if a.precision == "fp32-autocast" and not a.fsdp2 else contextlib.nullcontext
    result["stage"] = "probe"
    ops = probe_expert_ops(torch, model, device, autocast) if not a.fsdp2 else {}
    result["hf"]["probe_ops_256_tokens"] = ops
    grouped_calls = sum(v for k, v in ops.items() if "grouped_mm" in k)
    log(f"ops of one 256-token forward: {ops}")
    if a.experts_implementation == "grouped_mm" and not a.fsdp2 and grouped_calls != 2 * a.layers:
        log(f"WARNING: expected {2 * a.layers} grouped_mm calls (2 per layer) in the probe forward, saw "
            f"{grouped_calls}: the experts may not be running through grouped_mm")

    result["stage"] = "optimizer"
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, fused=True)
    except (RuntimeError, TypeError) as e:  # a torch without fused AdamW for DTensor parameters
        log(f"fused AdamW rejected ({e}); using foreach")
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, foreach=True)
        result["hf"]["optimizer"] = f"torch.optim.AdamW(foreach=True, lr={a.lr:g})"
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed + 7777 * rank)  # each rank its own tokens
    vocab = QWEN3_30B_A3B["vocab"]
    prompt_len = int(a.prompt_fraction * a.seq)  # same rounding as mixtune bench

    def train_step():
        total = torch.zeros((), device=device, dtype=torch.float32)
        for _ in range(a.grad_accum):
            ids = torch.randint(0, vocab, (a.micro_batch, a.seq), device=device, generator=gen)
            labels = ids
            if prompt_len > 0:
                labels = ids.clone()
                labels[:, :prompt_len] = -100
            with autocast():
                out = model(input_ids=ids, labels=labels, use_cache=False)
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
        log(f"warm-up step {i + 1}/{a.warmup}: {time.perf_counter() - t0:.3f} s")

    result["stage"] = "timed"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
    torch.cuda.synchronize(device)
    joules0 = gpu_energy_joules(device.index if device.index is not None else torch.cuda.current_device())
    t0 = time.perf_counter()
    events[0].record()
    for i in range(a.steps):
        losses.append(train_step())
        events[i + 1].record()
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    joules1 = gpu_energy_joules(device.index if device.index is not None else torch.cuda.current_device())
    result.pop("stage")

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
        "mfu_vs_ceiling": tflops / ceiling if ceiling > 0 else None,
        "mfu_vs_989": tflops / PEAK_989,
        "loss_first": loss_values[0],
        "loss_last": loss_values[-1],
        "losses": loss_values,
    })
    if joules0 is not None and joules1 is not None and joules1 > joules0:  # this rank's GPU, as mixtune's
        energy = joules1 - joules0
        result.update({"energy_j_per_step": energy / a.steps, "mean_power_w": energy / elapsed,
                       "energy_pj_per_model_flop": energy / (tokens_per_step * a.steps * result["flops_per_token"])
                       * 1e12})
    log(f"{tps:,.0f} tokens/s{' per GPU' if a.fsdp2 else ''}, step {step_time:.3f} s, {tflops:.1f} model TFLOP/s, "
        f"MFU {100 * tflops / ceiling:.1f}% of ceiling, loss {loss_values[0]:.4f} -> {loss_values[-1]:.4f}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.print_flops:
        f = qwen3_flops_per_token(a.layers, a.seq)
        print(json.dumps({"layers": a.layers, "seq": a.seq, "flops_per_token": f,
                          "params": qwen3_param_count(a.layers)}))
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
    try:
        import torch
        if torch.cuda.is_available():
            dev = torch.device(a.device)
            peaks = [int(torch.cuda.max_memory_allocated(dev)), int(torch.cuda.max_memory_reserved(dev))]
            if a.fsdp2 and rc == 0:  # per GPU: the largest over the ranks
                import torch.distributed as dist
                t = torch.tensor(peaks, dtype=torch.int64, device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                peaks = [int(x) for x in t.tolist()]
            result["peak_allocated_bytes"], result["peak_reserved_bytes"] = peaks
    except Exception as e:  # noqa: BLE001 -- memory stats are best effort after a failure
        log(f"could not read memory statistics: {e}")
    if rank == 0:
        emit(result, a.json_out)
    if a.fsdp2:
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
