#!/usr/bin/env bash
# mixtune vs Transformers v5 on the same GPU, one after the other: runs `mixtune bench` and every Transformers
# baseline of the workload (bench/hf_baseline.py) with the same shapes, and prints the bench/compare.py table
# (ratios against the fastest baseline; every baseline listed).
#
#   bench/side_by_side.sh MIXTUNE_BIN WORKLOAD [FLAGS...] [--mixtune FLAGS...] [--hf FLAGS...]
#
# WORKLOAD (Transformers baselines in brackets; names for HF_VARIANTS):
#   standard    12 layers, seq 4096, micro-batch 1, grad-accum 8, bf16 on both sides [bf16]
#   fp32master  4 layers, seq 4096, grad-accum 8; mixtune --precision fp32-master against every fp32-master
#               baseline: [autocast: fp32 + bf16 autocast (experts in fp32, kept for continuity); fsdp2mp: FSDP2
#               MixedPrecisionPolicy on one rank; master: bf16 params + fp32 master copy, fp32 grad accumulation;
#               master-bf16acc: the same, bf16 grad accumulation]
#   long        longest trainable sequence, bench/longest_seq.py on each side: mixtune --recompute full,
#               selective, none; Transformers gradient checkpointing on, off; search to 1,024 tokens
#   standard2   the standard workload on 2 GPUs: mixtune launch --nproc 2 -- bench --ep 2 against torchrun
#               [ddp: DDP, all-reduce on the last micro-batch; fsdp2: FSDP2, gradient sync on the last
#               micro-batch; fsdp2-every: FSDP2 reduce-scatter after every micro-batch]
#   fp32master2 standard2 with fp32 masters: mixtune fp32-master against [fsdp2mp: FSDP2 mixed precision, sync on
#               the last micro-batch; fsdp2mp-every: the same, every micro-batch; ddp-master: DDP + fp32 master
#               copy (bf16 grad accumulation)]
#   full8       8 GPUs (kind nvidia-h200-x8), all 48 layers: mixtune --ep 8 --recompute selective against
#               [fsdp2-every] (add --hf --gradient-checkpointing if the baseline runs out of memory)
#   custom      the standard defaults; give the flags you want to change [bf16]
#   gptoss      a gpt-oss-20b slice: mixtune bench --preset gpt-oss-20b against hf_baseline.py --family gpt-oss
#               (GptOssConfig, eager attention, grouped_mm experts, fused AdamW: Transformers' defaults for
#               GPT-OSS), LAYERS layers (default 5: the most that fit Transformers on an 80 GB H100, arithmetic
#               below), seq 4096, micro-batch 1, grad-accum 8, real router, bf16 on both sides [bf16]
#   gptoss-long the long workload on the gptoss slice (LAYERS, default 5): bench/longest_seq.py --family gpt-oss
#               on each side
#   moonlight   issue 40: a Moonlight-16B-A3B slice: mixtune bench --preset moonlight-16b-a3b against hf_baseline.py
#               --family moonlight (DeepseekV3Config, sdpa, grouped_mm experts, fused AdamW), LAYERS layers (default
#               10: layer 0 dense, 9 MoE; the most that fit Transformers on an 80 GB H100 with room to spare,
#               arithmetic below), seq 4096, micro-batch 1, grad-accum 8, real router, bf16 on both sides [bf16]
#   dsv3        issue 40: a DeepSeek-V3 slice: mixtune bench --preset deepseek-v3 against hf_baseline.py --family
#               deepseek-v3 (the same Transformers settings), LAYERS layers (default 3: the model's three dense MLA
#               layers; its first MoE layer alone, 11.3 B parameters, fits no single GPU on either side, arithmetic
#               below), seq 4096, micro-batch 1, grad-accum 8, bf16 on both sides [bf16]
#   nemotron    issue 41: a Nemotron 3 Nano slice: mixtune bench --preset nemotron-3-nano-30b-a3b against
#               hf_baseline.py --family nemotron-h (NemotronHConfig, sdpa, grouped_mm experts, fused AdamW; the Mamba2
#               mixers on Transformers' torch SSD path unless mamba_ssm is installed: the record says which), LAYERS
#               layers (default 6: MEMEM*, the pattern's first repeating group, 3 Mamba2 + 2 MoE + 1 attention; the
#               most that fit Transformers' torch SSD path on an 80 GB H100, arithmetic below), seq 4096, micro-batch
#               1, grad-accum 8, real router, bf16 on both sides [bf16]
#   nemotron-long the long workload on the nemotron slice (LAYERS, default 6): bench/longest_seq.py --family
#               nemotron-h on each side
#   lora        issue 39: LoRA r 16 / alpha 32 on attention (q/k/v/o) + experts of Qwen3-30B-A3B, the base frozen
#               bf16, LAYERS layers (default 48: the full depth, for an H200), seq 4096, micro-batch 1, grad-accum 2,
#               3 timed steps after 1 warm-up: mixtune bench --lora-r 16 --lora-targets q_proj,k_proj,v_proj,o_proj,
#               experts (recompute none unless --mixtune --recompute is given; an 80 GB card needs --recompute full
#               at 48 layers: bench --plan-only says) against [lora: hf_baseline.py --peft lora --lora-targets
#               attn,experts --gradient-checkpointing, PEFT's ParamWrapper experts]
# FLAGS before any marker go to both sides (--layers --seq --micro-batch --grad-accum --steps --warmup);
# after --mixtune to mixtune only (e.g. --recompute full); after --hf to every baseline (e.g.
# --gradient-checkpointing). A flag given explicitly replaces the workload's default (--steps 5 --warmup 2).
# Giving --precision, --parallel, --fsdp2, --ddp, --grad-sync or --master-grad-accum for Transformers (common
# or --hf) replaces the workload's baselines with that one.
# Output in $OUT (default bench/out): NAME-mixtune.json/.log, NAME-hf-VARIANT.json/.log (NAME-hf.json/.log
# when the workload has one baseline), NAME.md (the block for bench/RESULTS.md), NAME-env.txt. A side that
# fails is recorded as failed; the others still run.
# Environment: SIDES (both | mixtune | hf), ORDER (auto | mixtune-first | hf-first; auto: the first run in a
# fresh $OUT picks by the parity of the UTC minute, each later run there takes the other order; the order is
# written to NAME.md and NAME-env.txt), HF_VARIANTS (names of the workload's baselines to run, space-separated),
# RUN_TIMEOUT_S (per run: 100 s for fp32master, 130 s for standard2/fp32master2, else 270: a workload fits one
# 10-minute call even if every run hits it), NAME (file prefix, default the workload), BUDGET_S (long: seconds
# per side; default 280 for mixtune and 230 for Transformers with both sides, 540 with one),
# LONG_MIXTUNE_CONFIGS (full,selective,none), LONG_HF_CONFIGS (on,off), LAYERS (long: 4; gptoss, gptoss-long:
# 5; moonlight: 10; dsv3: 3; nemotron, nemotron-long: 6), DRY2=1
# (standard2/fp32master2/full8 as a functional check on ONE GPU: both ranks share it, Transformers over gloo
# (--ranks-share-gpu --dist-backend gloo --vocab 8192), mixtune over host-staged collectives
# (--gpu-collectives host); 1 layer, seq 1024, grad-accum 2, 1 warm-up + 1 step; never a measurement),
# LIB_DIR (prepended to LD_LIBRARY_PATH; default .carry/lib when it exists), PYTHON (python3).
# Sets NCCL_NVLS_ENABLE=0.
# Exit status: 0 when every run succeeded, 1 otherwise, 2 on a usage error.
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -lt 2 || "$1" == "-h" || "$1" == "--help" ]] && usage
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
WORKLOAD=$2
shift 2
PY=${PYTHON:-python3}
SIDES=${SIDES:-both}
ORDER=${ORDER:-auto}
NAME=${NAME:-$WORKLOAD}
OUTDIR=${OUT:-bench/out}
DRY2=${DRY2:-0}
export NCCL_NVLS_ENABLE=0
case "$SIDES" in both|mixtune|hf) ;; *) echo "side_by_side: SIDES must be both, mixtune or hf, found '$SIDES'" >&2; exit 2;; esac
case "$ORDER" in auto|mixtune-first|hf-first) ;; *) echo "side_by_side: ORDER must be auto, mixtune-first or hf-first, found '$ORDER'" >&2; exit 2;; esac
case "$WORKLOAD" in standard|fp32master|long|custom|standard2|fp32master2|full8|gptoss|gptoss-long|lora|moonlight|dsv3|nemotron|nemotron-long) ;; *) echo "side_by_side: unknown workload '$WORKLOAD' (standard, fp32master, long, custom, standard2, fp32master2, full8, gptoss, gptoss-long, lora, moonlight, dsv3, nemotron, nemotron-long)" >&2; exit 2;; esac
LONG=0
[[ "$WORKLOAD" == long || "$WORKLOAD" == gptoss-long || "$WORKLOAD" == nemotron-long ]] && LONG=1
# The model: mixtune's preset and the same shapes for Transformers (hf_baseline.py --family).
PRESET=qwen3-30b-a3b; FAMILY=qwen3-moe
# gpt-oss-20b slice of N layers on an 80 GB H100 (79.1 GiB usable), Transformers bf16 with fused AdamW:
#   parameters: 823.19 M per layer (q/k/v/o 26.54 M with biases; 32 experts x (2880 x 5760 + 2880 x 2880 + biases)
#     = 796.5 M; router 0.09 M) + 1158.3 M embedding and LM head; bf16 parameter + gradient + AdamW exp_avg and
#     exp_avg_sq = 8 bytes each: 6.13 GiB per layer + 8.63 GiB.
#   activations kept per layer at seq 4096, micro-batch 1: eager attention's softmax output [64, 4096, 4097] bf16
#     = 2.00 GiB (sliding layers too: the window is a mask) + q, k, v, repeated k/v, RoPE and o inputs 0.2 GiB + the
#     grouped_mm experts on 4 x 4096 rows (gathered input, gate_up output, clamped SwiGLU terms, down input and
#     output) 0.8 GiB + two fp32 RMSNorm intermediates 0.2 GiB = 3.17 GiB per layer.
#   LM head at its backward: bf16 logits [4096, 201088] (kept by the output) 1.6 GiB + fp32 log-softmax, its
#     gradient and the input gradient 3 x 3.1 GiB = 10.7 GiB (more than a layer's eager backward, ~4 x 2 GiB).
#   total 8.63 + 9.30 N + 10.7 GiB + allocator slack: N = 5 -> 65.9 GiB (fills ~85%), N = 6 -> 75.2 GiB (leaves
#   under 4 GiB for fragmentation and the CUDA context: out of memory in practice), so N = 5.
if [[ "$WORKLOAD" == gptoss || "$WORKLOAD" == gptoss-long ]]; then PRESET=gpt-oss-20b; FAMILY=gpt-oss; fi
# Moonlight-16B-A3B slice of N layers (layer 0 dense, then MoE) on an 80 GB H100, Transformers bf16, fused AdamW:
#   parameters (hf_baseline.py --print-flops): 671.1 M embedding + LM head; dense layer 83.0 M (MLA 13.76 M: q_proj
#     2048 x 3072, kv_a 2048 x 576, kv_b 512 x 4096, o 2048 x 2048; MLP 3 x 2048 x 11264 = 69.2 M); MoE layer
#     584.8 M (64 experts x 3 x 2048 x 1408 = 553.6 M, 2 shared 17.3 M, router 0.13 M, MLA 13.76 M); bf16 parameter,
#     gradient and AdamW moments = 8 bytes each: 5.00 + 0.62 + 4.36 (N - 1) GiB.
#   activations kept per MoE layer at seq 4096, micro-batch 1 (grouped_mm on 6 x 4096 rows: gathered input 2048 wide,
#     gate_up output 2816, SiLU(gate) and the product 1408 each, down output 2048 = 0.45 GiB; the router's fp32 input
#     copy, the shared experts 0.12 GiB; MLA: q, kv_a, kv_b outputs, the latent norm, RoPE copies, the concatenated
#     query and key (192 wide), sdpa's output and o_proj's input 0.19 GiB; two RMSNorms' fp32 input and bf16 output
#     0.09 GiB) = 0.85 GiB; the dense layer 0.63 GiB (its SwiGLU's four [4096, 11264] tensors 0.34 GiB).
#   LM head at its backward: bf16 logits [4096, 163840] 1.25 GiB + fp32 log-softmax, its gradient and the input
#     gradient 3 x 2.5 GiB = 8.75 GiB.
#   total 5.00 + 0.62 + 8.75 + (N - 1)(4.36 + 0.85) + 0.63 GiB: N = 10 -> 61.9 GiB, N = 11 -> 67.1 GiB, N = 12 -> 72.3
#   GiB. The gpt-oss slice's 65.9 GiB estimate was its measured peak allocated, and it reserved 8 GiB more (74.1):
#   N = 11 would reserve ~75 of 79.1 GiB, N = 12 cannot; so N = 10 (mixtune's plan: 58.3 GiB).
# DeepSeek-V3 slice: one MoE layer holds 256 x 3 x 7168 x 2048 = 11.27 B expert parameters, 84 GiB at 8 bytes on
#   either side (mixtune: bf16 parameter, expert gradient and moments) before any activation, and Transformers adds
#   the expert stack's 14 GiB weight gradient on every micro-batch after the first: no single GPU (80 GB H100, 141 GB
#   H200) holds the first four layers (15.11 B parameters, 112.6 GiB static) for Transformers. The three dense
#   layers (3.60 B parameters: 1.85 B embedding + LM head, 0.58 B per layer: MLA 187 M with q LoRA 1536 and 128
#   heads, MLP 3 x 7168 x 18432 = 396 M) are the V3-shaped slice that fits: 26.8 GiB static + activations 2.1 GiB
#   per layer (128-head MLA 1.2 GiB, SwiGLU 0.56 GiB, norms 0.33 GiB) + LM head 6.9 GiB = 40 GiB (mixtune's plan:
#   41.9 GiB, its non-expert gradients being fp32).
if [[ "$WORKLOAD" == moonlight ]]; then PRESET=moonlight-16b-a3b; FAMILY=moonlight; fi
if [[ "$WORKLOAD" == dsv3 ]]; then PRESET=deepseek-v3; FAMILY=deepseek-v3; fi
# Nemotron 3 Nano slice of N layers (the first N letters of MEMEM*EMEMEM*...) on an 80 GB H100 (79.1 GiB usable),
# Transformers bf16, fused AdamW, the Mamba2 mixers on its torch SSD path (no mamba_ssm on the GPU machines):
#   parameters (hf_baseline.py --print-flops; bench/hf_nemotron_h.py): 704.6 M embedding + LM head; Mamba2 layer
#     38.7 M (in_proj 2688 x 10304, out_proj 4096 x 2688, conv, gated norm); MoE layer 1297.5 M (128 experts x 2 x
#     2688 x 1856 = 1277.2 M, shared 20.0 M, router 0.3 M); attention layer 23.4 M; bf16 parameter, gradient and
#     AdamW moments = 8 bytes each: 5.25 GiB + 0.29 GiB per M, 9.67 GiB per E, 0.17 GiB per *. N = 6 (MEMEM*):
#     3.44 B parameters, 25.6 GiB; N = 7 (+E): 4.74 B, 35.3 GiB; N = 12: 7.45 B, 55.5 GiB.
#   the torch SSD path at seq 4096 (32 chunks of 128, 64 heads, head_dim 64, state 128, all fp32): it forms
#     G = C[:, :, :, None] * B[:, :, None] of shape [chunks, 128, 128, heads, state] = 32 x 128 x 128 x 64 x 128 x 4 B =
#     16 GiB before summing over the state, then three products of [chunks, 128, 128 or heads, heads or 128, 64,
#     (128)] = 8 GiB each (Y_diag, the chunk states, C x states). The forward holds one of them at a time (16 GiB
#     transient); the backward of each product materialises BOTH operands' gradients at the product's full shape
#     before summing them down (autograd reduces a broadcast gradient after the node returns): 2 x 16 = 32 GiB at
#     the G product, a transient of every Mamba2 layer's backward.
#   activations kept per layer at seq 4096, micro-batch 1: Mamba2 ~1.8 GiB (in_proj output 84 MB, conv output 50 MB,
#     the fp32 x, x dt, B and C after repeat_interleave to 64 heads (134 MB each), the [heads, chunks, 128, 128]
#     decay L, G and M (134 MB each), the chunk states (2 x 138 MB), the fp32 gated norm's five [4096, 4096]
#     tensors, the norms); MoE ~1.0 GiB (grouped_mm on 6 x 4096 rows: gathered input 2688 wide, up output 1856,
#     ReLU² terms, down output and its fp32 weighting; the shared expert 3712 wide; the router's fp32 input);
#     attention ~0.2 GiB.
#   LM head at its backward: bf16 logits [4096, 131072] 1 GiB + the fp32 copy (NemotronHForCausalLM upcasts), the
#     fp32 log-softmax, its gradient 3 x 2 GiB = 7 GiB (freed before the layers' backward).
#   peak = static + kept activations + the 32 GiB transient: N = 6 -> 25.6 + 7.6 + 32 = 65 GiB (the LM head's
#   41 GiB earlier), with the allocator's 16 GiB blocks ~70 GiB reserved; N = 7 -> 35.3 + 8.6 + 32 = 76 GiB, over
#   what 79.1 GiB leaves for fragmentation and the CUDA context; so N = 6, the pattern's first group MEMEM*
#   (mixtune's plan at 6 layers is far smaller: its SSD kernel keeps only the [chunks, heads, 64, 128] states).
#   An H200 (139.8 GiB) holds N = 13 (MEMEM*EMEMEM*, two groups: 55.7 + 16.2 + 32 = 104 GiB): LAYERS=13.
#   The long workload: the 32 GiB grows with the sequence (8 MiB per token), so Transformers' longest at 6 layers
#   on an H100 is near 5k tokens without checkpointing and 6k with ((79.1 - 1.5 - 25.6) GiB / ~10 or ~8.5 MiB).
if [[ "$WORKLOAD" == nemotron || "$WORKLOAD" == nemotron-long ]]; then PRESET=nemotron-3-nano-30b-a3b; FAMILY=nemotron-h; fi
[[ -n "${SEQS:-}" ]] && { echo "side_by_side: SEQS is gone: the long workload searches (bench/longest_seq.py); set LONG_*_CONFIGS, LAYERS, BUDGET_S" >&2; exit 2; }
NPROC=1
if [[ "$WORKLOAD" == standard2 || "$WORKLOAD" == fp32master2 ]]; then NPROC=2; fi
if [[ "$WORKLOAD" == full8 ]]; then NPROC=8; fi
if [[ "$DRY2" == 1 && $NPROC -eq 1 ]]; then
  echo "side_by_side: DRY2=1 is for the multi-GPU workloads (standard2, fp32master2, full8)" >&2; exit 2
fi
if [[ "$SIDES" != hf && ! -x "$BIN" ]]; then
  echo "side_by_side: mixtune binary $BIN not found or not executable" >&2; exit 2
fi
BIN_ABS=$BIN
[[ -x "$BIN" ]] && BIN_ABS=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
# The commit the results name: MIXTUNE_COMMIT, else the COMMIT file scripts/gpu-pack.sh packs beside bin/ (a
# binary run straight from its unpacked tarball), else the baseline's git HEAD (bench/compare.py's fallback).
if [[ -z "${MIXTUNE_COMMIT:-}" && -x "$BIN" && -f "$(dirname "$BIN_ABS")/../COMMIT" ]]; then
  MIXTUNE_COMMIT=$(head -c 64 "$(dirname "$BIN_ABS")/../COMMIT" | tr -cd 'A-Za-z0-9+._-')
  export MIXTUNE_COMMIT
fi
LIB_DIR=${LIB_DIR:-}
[[ -z "$LIB_DIR" && -d .carry/lib ]] && LIB_DIR=.carry/lib
if [[ -n "$LIB_DIR" ]]; then
  [[ -d "$LIB_DIR" ]] || { echo "side_by_side: LIB_DIR $LIB_DIR not found" >&2; exit 2; }
  LIB_ABS=$(cd "$LIB_DIR" && pwd)
  export LD_LIBRARY_PATH="$LIB_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
mkdir -p "$OUTDIR" || { echo "side_by_side: cannot create $OUTDIR" >&2; exit 2; }
OUTDIR=$(cd "$OUTDIR" && pwd)

# Split the flags into the three sections.
COMMON=(); MIX=(); HF=(); section=common
for arg in "$@"; do
  case "$arg" in
    --mixtune) section=mix ;;
    --hf) section=hf ;;
    *) case $section in common) COMMON+=("$arg");; mix) MIX+=("$arg");; hf) HF+=("$arg");; esac ;;
  esac
done

has_flag() {  # has_flag FLAG ARGS... : is FLAG (or FLAG=...) among ARGS?
  local flag=$1; shift
  local a
  for a in "$@"; do [[ "$a" == "$flag" || "$a" == "$flag="* ]] && return 0; done
  return 1
}

# Which side runs first. auto: alternate within one $OUT (a counter file), the first run by the UTC minute.
COUNTER="$OUTDIR/.side_by_side_runs"
if [[ "$ORDER" == auto ]]; then
  if [[ -s "$COUNTER" ]]; then n=$(( $(cat "$COUNTER") + 0 )); else n=$(( $(date -u +%s) / 60 % 2 )); fi
  echo $(( n + 1 )) > "$COUNTER"
  if (( n % 2 == 0 )); then FIRST=mixtune; else FIRST=hf; fi
  ORDER_TEXT="$([[ $FIRST == mixtune ]] && echo "mixtune first" || echo "Transformers first") (ORDER=auto, alternating in this OUT)"
else
  FIRST=${ORDER%-first}
  ORDER_TEXT="$([[ $FIRST == mixtune ]] && echo "mixtune first" || echo "Transformers first") (ORDER=$ORDER)"
fi
[[ "$SIDES" != both ]] && ORDER_TEXT="one side only ($SIDES)"

# Workload defaults, applied only where the flag was not given.
declare -A DEF=([--layers]=12 [--seq]=4096 [--micro-batch]=1 [--grad-accum]=8 [--steps]=5 [--warmup]=2)
MIX_PRECISION=bf16
# The Transformers baselines: "name|flags".
VARIANTS=("bf16|--precision bf16")
case "$WORKLOAD" in
  fp32master)
    DEF[--layers]=4; MIX_PRECISION=fp32-master
    VARIANTS=("autocast|--precision fp32-autocast"
              "fsdp2mp|--precision fp32-mp --parallel fsdp2"
              "master|--precision fp32-master-copy --master-grad-accum fp32"
              "master-bf16acc|--precision fp32-master-copy --master-grad-accum bf16") ;;
  standard2)
    VARIANTS=("ddp|--precision bf16 --parallel ddp --grad-sync last"
              "fsdp2|--precision bf16 --parallel fsdp2 --grad-sync last"
              "fsdp2-every|--precision bf16 --parallel fsdp2 --grad-sync every") ;;
  fp32master2)
    MIX_PRECISION=fp32-master
    VARIANTS=("fsdp2mp|--precision fp32-mp --parallel fsdp2 --grad-sync last"
              "fsdp2mp-every|--precision fp32-mp --parallel fsdp2 --grad-sync every"
              "ddp-master|--precision fp32-master-copy --master-grad-accum bf16 --parallel ddp --grad-sync last") ;;
  gptoss)
    DEF[--layers]=${LAYERS:-5} ;;
  moonlight)
    DEF[--layers]=${LAYERS:-10} ;;
  dsv3)
    DEF[--layers]=${LAYERS:-3} ;;
  nemotron)
    DEF[--layers]=${LAYERS:-6} ;;
  lora)
    DEF[--layers]=${LAYERS:-48}; DEF[--grad-accum]=2; DEF[--steps]=3; DEF[--warmup]=1
    has_flag --lora-r "${MIX[@]}" || MIX+=(--lora-r 16 --lora-alpha 32 --lora-targets q_proj,k_proj,v_proj,o_proj,experts)
    has_flag --recompute "${MIX[@]}" || MIX+=(--recompute none)
    VARIANTS=("lora|--precision bf16 --peft lora --lora-r 16 --lora-alpha 32 --lora-targets attn,experts --gradient-checkpointing") ;;
  full8)
    DEF[--layers]=48
    has_flag --recompute "${MIX[@]}" || MIX+=(--recompute selective)
    VARIANTS=("fsdp2-every|--precision bf16 --parallel fsdp2 --grad-sync every") ;;
esac
for f in --precision --parallel --fsdp2 --ddp --grad-sync --master-grad-accum; do
  if has_flag "$f" "${COMMON[@]}" "${HF[@]}"; then VARIANTS=("hf|"); break; fi
done
if [[ "$DRY2" == 1 ]]; then
  DEF[--layers]=1; DEF[--seq]=1024; DEF[--grad-accum]=2; DEF[--steps]=1; DEF[--warmup]=1
  HF+=(--ranks-share-gpu --dist-backend gloo --no-gemm-ceiling --vocab 8192)
  has_flag --gpu-collectives "${MIX[@]}" || MIX+=(--gpu-collectives host)
  export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
  NAME=${NAME%-dry2}-dry2
fi
# Each run's bound: the whole workload stays inside one 10-minute call even if every run hits it.
case "$WORKLOAD" in
  fp32master) RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-100} ;;           # 5 runs of ~20-60 s
  standard2|fp32master2) RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-130} ;;  # 4 runs of ~40-80 s
  lora) RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-280} ;;  # 2 runs at full depth (load + 4 steps of 2 micro-batches each)
  *) RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-270} ;;
esac
if [[ -n "${HF_VARIANTS:-}" ]]; then
  KEEP=()
  for v in "${VARIANTS[@]}"; do
    for want in $HF_VARIANTS; do [[ "${v%%|*}" == "$want" ]] && KEEP+=("$v"); done
  done
  [[ ${#KEEP[@]} -eq 0 ]] && { echo "side_by_side: HF_VARIANTS='$HF_VARIANTS' names none of: ${VARIANTS[*]%%|*}" >&2; exit 2; }
  VARIANTS=("${KEEP[@]}")
fi
if [[ $NPROC -gt 1 ]]; then
  has_flag --ep "${MIX[@]}" || MIX+=(--ep "$NPROC")
fi
MIX_ARGS=("${COMMON[@]}"); HF_ARGS=(--family "$FAMILY" "${COMMON[@]}")
for flag in --layers --seq --micro-batch --grad-accum --steps --warmup; do
  has_flag "$flag" "${COMMON[@]}" "${MIX[@]}" || MIX_ARGS+=("$flag" "${DEF[$flag]}")
  has_flag "$flag" "${COMMON[@]}" "${HF[@]}" || HF_ARGS+=("$flag" "${DEF[$flag]}")
done
has_flag --precision "${COMMON[@]}" "${MIX[@]}" || MIX_ARGS+=(--precision "$MIX_PRECISION")
MIX_ARGS+=("${MIX[@]}"); HF_ARGS+=("${HF[@]}")

{
  date -u '+%Y-%m-%dT%H:%M:%SZ'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(nvidia-smi failed)"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1
  echo "mixtune: $BIN_ABS"
  echo "order: $ORDER_TEXT"
  echo "model: mixtune --preset $PRESET, Transformers --family $FAMILY"
  [[ $LONG == 0 ]] && echo "baselines: ${VARIANTS[*]%%|*}"
  [[ "$DRY2" == 1 ]] && echo "DRY2: functional check on one GPU, not a measurement"
} > "$OUTDIR/$NAME-env.txt"
cat "$OUTDIR/$NAME-env.txt"

FAILED=0

failure_record() {  # failure_record TOOL JSON LOG RC : make sure JSON holds a record that says why the side failed
  "$PY" - "$@" <<'EOF'
import json, os, re, sys
tool, path, log, rc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    rec = json.load(open(path))
    if not isinstance(rec, dict):
        raise ValueError("not an object")
except (OSError, ValueError):
    rec = {"tool": tool}
try:
    lines = [l.strip() for l in open(log, errors="replace") if l.strip()]
except OSError:
    lines = []
if rc in (124, 137):
    why = f"timed out (rc {rc})"
else:
    why = f"rc {rc}: " + (lines[-1][:300] if lines else "no output")
if any(re.search(r"out of memory|outofmemory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED", l, re.I)
       for l in lines[-50:]):
    rec["oom"] = True
rec["failed"] = True
rec.setdefault("error", why)
rec.setdefault("tool", tool)
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(rec, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print(f"   {tool} FAILED: {rec['error']}")
EOF
}

run_side() {  # run_side TOOL JSON LOG CMD... : runs one bench side under a timeout
  local tool=$1 json=$2 log=$3; shift 3
  rm -f "$json"
  echo "== $tool: $*"
  local t0=$SECONDS
  # CLOCK_MARKS (set by scripts/gpu-session.sh with CLOCKS=1): segment marks for bench/clock_log.py.
  [[ -n "${CLOCK_MARKS:-}" ]] && echo "$(date -u +%H:%M:%S.%N) $NAME $tool" >> "$CLOCK_MARKS"
  timeout -k 15 "$RUN_TIMEOUT_S" "$@" --json-out "$json" > "$log" 2>&1
  local rc=$?
  [[ -n "${CLOCK_MARKS:-}" ]] && echo "$(date -u +%H:%M:%S.%N) (after $NAME $tool)" >> "$CLOCK_MARKS"
  echo "   rc $rc after $(( SECONDS - t0 )) s (log $log)"
  if [[ $rc -ne 0 || ! -s "$json" ]]; then
    tail -n 5 "$log" | sed 's/^/   | /'
    failure_record "$tool" "$json" "$log" "$rc"
    FAILED=1
  fi
}

COMPARE_ARGS=()
if [[ $LONG == 1 ]]; then
  # Per side; both sides with the env file, the comparison and a try's kill grace stay inside one 10-minute call.
  if [[ "$SIDES" != both ]]; then BUDGET_MIX=${BUDGET_S:-540}; BUDGET_HF=${BUDGET_S:-540}
  else BUDGET_MIX=${BUDGET_S:-280}; BUDGET_HF=${BUDGET_S:-230}; fi
  MJ="$OUTDIR/$NAME-mixtune.json"; HJ="$OUTDIR/$NAME-hf.json"
  LONG_COMMON=(--family "$FAMILY")
  if [[ -n "${LAYERS:-}" ]]; then LONG_COMMON+=(--layers "$LAYERS")
  elif [[ "$WORKLOAD" == gptoss-long ]]; then LONG_COMMON+=(--layers 5)  # the gptoss slice
  elif [[ "$WORKLOAD" == nemotron-long ]]; then LONG_COMMON+=(--layers 6); fi  # the nemotron slice
  LONG_MIX=(--side mixtune --bin "$BIN_ABS" --configs "${LONG_MIXTUNE_CONFIGS:-full,selective,none}")
  LONG_HF=(--side hf --configs "${LONG_HF_CONFIGS:-on,off}")
  has_flag --recompute "${COMMON[@]}" "${MIX[@]}" && LONG_MIX=(--side mixtune --bin "$BIN_ABS")
  has_flag --gradient-checkpointing "${COMMON[@]}" "${HF[@]}" && LONG_HF=(--side hf)
  long_side() {  # long_side mixtune|hf
    local side=$1 t0=$SECONDS
    [[ -n "${CLOCK_MARKS:-}" ]] && echo "$(date -u +%H:%M:%S.%N) $NAME $side" >> "$CLOCK_MARKS"
    if [[ $side == mixtune ]]; then
      echo "== mixtune longest sequence (budget ${BUDGET_MIX}s)"
      rm -f "$MJ"
      "$PY" "$HERE/longest_seq.py" "${LONG_MIX[@]}" "${LONG_COMMON[@]}" --budget-s "$BUDGET_MIX" --out "$OUTDIR" \
        --tag "$NAME-mixtune" -- "${COMMON[@]}" "${MIX[@]}" || FAILED=1
    else
      echo "== Transformers longest sequence (budget ${BUDGET_HF}s)"
      rm -f "$HJ"
      "$PY" "$HERE/longest_seq.py" "${LONG_HF[@]}" "${LONG_COMMON[@]}" --budget-s "$BUDGET_HF" --out "$OUTDIR" \
        --tag "$NAME-hf" --python "$PY" -- "${COMMON[@]}" "${HF[@]}" || FAILED=1
    fi
    echo "   $side done after $(( SECONDS - t0 )) s"
  }
  ORDERED=(mixtune hf); [[ "$FIRST" == hf ]] && ORDERED=(hf mixtune)
  for side in "${ORDERED[@]}"; do
    [[ "$SIDES" == both || "$SIDES" == "$side" ]] && long_side "$side"
  done
  COMPARE_ARGS=("$MJ" "$HJ")
else
  MJ="$OUTDIR/$NAME-mixtune.json"
  MIX_CMD=("$BIN_ABS" bench --preset "$PRESET" "${MIX_ARGS[@]}")
  HF_LAUNCH=("$PY")
  if [[ $NPROC -gt 1 ]]; then
    MIX_CMD=("$BIN_ABS" launch --nproc "$NPROC" -- bench --preset "$PRESET" "${MIX_ARGS[@]}")
    HF_LAUNCH=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC")
  fi
  HJS=(); CMDS=(--command "$MJ=$(printf '%q ' "${MIX_CMD[@]}")")
  run_mixtune() {
    [[ "$SIDES" == hf ]] && return
    run_side mixtune "$MJ" "$OUTDIR/$NAME-mixtune.log" "${MIX_CMD[@]}"
  }
  run_hf() {
    local v name flags json log
    for v in "${VARIANTS[@]}"; do
      name=${v%%|*}; flags=${v#*|}
      if [[ ${#VARIANTS[@]} -eq 1 ]]; then json="$OUTDIR/$NAME-hf.json"; log="$OUTDIR/$NAME-hf.log"
      else json="$OUTDIR/$NAME-hf-$name.json"; log="$OUTDIR/$NAME-hf-$name.log"; fi
      # shellcheck disable=SC2206  # the variant's flags are plain words
      local cmd=("${HF_LAUNCH[@]}" "$HERE/hf_baseline.py" "${HF_ARGS[@]}" $flags)
      HJS+=("$json")
      CMDS+=(--command "$json=$(printf '%q ' "${cmd[@]}")")
      [[ "$SIDES" == mixtune ]] && continue
      run_side "transformers ($name)" "$json" "$log" "${cmd[@]}"
    done
  }
  if [[ "$FIRST" == hf ]]; then run_hf; run_mixtune; else run_mixtune; run_hf; fi
  COMPARE_ARGS=("$MJ" "${HJS[@]}" "${CMDS[@]}")
fi

NOTES=()
[[ "$DRY2" == 1 ]] && NOTES+=(--note "DRY2: every rank on one GPU (Transformers over gloo, mixtune over host-staged collectives): a functional check of the multi-GPU code, not a measurement")
"$PY" "$HERE/compare.py" "${COMPARE_ARGS[@]}" --markdown --title "$NAME" --order "$ORDER_TEXT" "${NOTES[@]}" \
  > "$OUTDIR/$NAME.md" || FAILED=1
echo
"$PY" "$HERE/compare.py" "${COMPARE_ARGS[@]}" --order "$ORDER_TEXT" "${NOTES[@]}" || FAILED=1
echo
echo "markdown block for bench/RESULTS.md: $OUTDIR/$NAME.md"
exit $FAILED
