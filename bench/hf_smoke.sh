#!/usr/bin/env bash
# A functional check of every bench/hf_baseline.py mode on ONE GPU in about a minute (1 layer, seq 512,
# grad-accum 2, 1 warm-up + 1 timed step, no GEMM ceiling): prints OK or FAIL per mode. Not a measurement.
#
#   bench/hf_smoke.sh            (scripts/gpu-session.sh stage hf-smoke)
#
# Modes: one process: fp32-autocast; fp32-master-copy with fp32 and (with gradient checkpointing) bf16 gradient
# accumulation; FSDP2 mixed precision on one rank (a one-rank process group, sync and reshard on the last
# micro-batch). Two ranks under torchrun sharing the GPU over gloo (--ranks-share-gpu --dist-backend gloo,
# vocabulary 8192): DDP bf16 (no_sync), FSDP2 bf16 (set_requires_gradient_sync), FSDP2 mixed precision, DDP with
# the fp32 master copy. GPT-OSS (--family gpt-oss: eager attention, grouped_mm), bf16 with and without gradient
# checkpointing. DeepSeek-V3 family (DeepseekV3Config, sdpa, grouped_mm): Moonlight at 2 layers (its dense layer and
# one MoE layer), DeepSeek-V3 at 1 (dense). Nemotron-H (--family nemotron-h: NemotronHConfig, sdpa, grouped_mm; the
# Mamba2 mixers on whichever path Transformers finds) at 6 layers, MEMEM* (every kind of its layers), without and with
# gradient checkpointing. PEFT LoRA (attn + experts, frozen bf16): Qwen3-MoE with gradient checkpointing, GPT-OSS
# without
# (SMOKE_MODES="lora-gc gptoss-lora" runs only those). Modes run two at a time (SMOKE_PARALLEL=1: one at a time); each under SMOKE_TIMEOUT_S
# (150). A mode passes when it exits 0 with a record of positive tokens/s and finite losses.
# Output in $OUT (default bench/out): smoke-MODE.json/.log, smoke.txt (the OK/FAIL lines).
# Exit status: 0 when every mode passed, 1 otherwise.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
OUTDIR=${OUT:-bench/out}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
TIMEOUT=${SMOKE_TIMEOUT_S:-150}
PAR=${SMOKE_PARALLEL:-2}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} NCCL_NVLS_ENABLE=0
COMMON=(--layers 1 --seq 512 --micro-batch 1 --grad-accum 2 --steps 1 --warmup 1 --no-gemm-ceiling)
TWO=(--ranks-share-gpu --dist-backend gloo --vocab 8192)
# name|launcher (1: python, 2: torchrun two ranks)|flags
MODES=(
  "autocast|1|--precision fp32-autocast"
  "master-fp32acc|1|--precision fp32-master-copy --master-grad-accum fp32"
  "master-bf16acc-gc|1|--precision fp32-master-copy --master-grad-accum bf16 --gradient-checkpointing"
  "fsdp2mp-1rank|1|--precision fp32-mp --parallel fsdp2 --grad-sync last"
  "ddp-bf16-2r|2|--precision bf16 --parallel ddp --grad-sync last"
  "fsdp2-bf16-2r|2|--precision bf16 --parallel fsdp2 --grad-sync last"
  "fsdp2mp-2r|2|--precision fp32-mp --parallel fsdp2 --grad-sync last"
  "ddp-master-2r|2|--precision fp32-master-copy --master-grad-accum bf16 --parallel ddp --grad-sync last"
  "gptoss-bf16|1|--family gpt-oss --precision bf16"
  "gptoss-gc|1|--family gpt-oss --precision bf16 --gradient-checkpointing"
  "moonlight-bf16|1|--family moonlight --precision bf16 --layers 2"
  "dsv3-bf16|1|--family deepseek-v3 --precision bf16"
  "lora-gc|1|--peft lora --lora-r 16 --lora-alpha 32 --lora-targets attn,experts --gradient-checkpointing"
  "gptoss-lora|1|--family gpt-oss --peft lora --lora-targets attn,experts"
  "nemotron-bf16|1|--family nemotron-h --precision bf16 --layers 6"
  "nemotron-gc|1|--family nemotron-h --precision bf16 --layers 6 --gradient-checkpointing"
)
[[ -n "${SMOKE_MODES:-}" ]] && { KEEP=(); for m in "${MODES[@]}"; do for w in $SMOKE_MODES; do [[ ${m%%|*} == "$w" ]] && KEEP+=("$m"); done; done; MODES=("${KEEP[@]}"); }

run_mode() {  # run_mode SPEC : runs one mode, writes smoke-NAME.{json,log,rc,s}
  local spec=$1 name launcher flags
  name=${spec%%|*}; launcher=${spec#*|}; launcher=${launcher%%|*}; flags=${spec##*|}
  local json="$OUTDIR/smoke-$name.json" log="$OUTDIR/smoke-$name.log" t0=$SECONDS cmd
  rm -f "$json"
  if [[ $launcher == 2 ]]; then
    # shellcheck disable=SC2206
    cmd=("$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$HERE/hf_baseline.py" "${COMMON[@]}"
         "${TWO[@]}" $flags --label "smoke $name" --json-out "$json")
  else
    # shellcheck disable=SC2206
    cmd=("$PY" "$HERE/hf_baseline.py" "${COMMON[@]}" $flags --label "smoke $name" --json-out "$json")
  fi
  echo "\$ ${cmd[*]}" > "$log"
  timeout -k 10 "$TIMEOUT" "${cmd[@]}" >> "$log" 2>&1
  echo $? > "$OUTDIR/smoke-$name.rc"
  echo $(( SECONDS - t0 )) > "$OUTDIR/smoke-$name.s"
}

verdict() {  # verdict NAME : one OK/FAIL line
  "$PY" - "$OUTDIR" "$1" <<'EOF'
import json, math, os, sys
out, name = sys.argv[1], sys.argv[2]
def read(ext):
    try:
        return open(os.path.join(out, f"smoke-{name}.{ext}")).read().strip()
    except OSError:
        return ""
rc, secs = read("rc"), read("s")
try:
    rec = json.load(open(os.path.join(out, f"smoke-{name}.json")))
except (OSError, ValueError):
    rec = {}
tps = rec.get("tokens_per_s_per_gpu")
losses = rec.get("losses") or []
good = rc == "0" and isinstance(tps, (int, float)) and tps > 0 and losses and all(math.isfinite(x) for x in losses)
if good:
    peak = rec.get("peak_allocated_bytes") or 0
    print(f"OK   {name} ({secs} s): {rec.get('configuration', '')[:110]}...; loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"peak {peak / 2**30:.1f} GiB/rank")
else:
    why = rec.get("error")
    if not why:
        try:
            lines = [l.strip() for l in open(os.path.join(out, f"smoke-{name}.log"), errors="replace") if l.strip()]
            why = lines[-1][:300] if lines else "no output"
        except OSError:
            why = "no log"
    print(f"FAIL {name} (rc {rc or '?'}, {secs or '?'} s): {why}")
EOF
}

T0=$SECONDS
echo "hf-smoke: ${#MODES[@]} modes, $PAR at a time, timeout ${TIMEOUT}s each (a functional check, not a measurement)"
for ((i = 0; i < ${#MODES[@]}; i += PAR)); do
  pids=()
  for ((j = i; j < i + PAR && j < ${#MODES[@]}; j++)); do
    run_mode "${MODES[$j]}" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for ((j = i; j < i + PAR && j < ${#MODES[@]}; j++)); do verdict "${MODES[$j]%%|*}"; done
done | tee "$OUTDIR/smoke.txt"
FAILS=$(grep -c '^FAIL' "$OUTDIR/smoke.txt")
PASSES=$(grep -c '^OK' "$OUTDIR/smoke.txt")
echo "hf-smoke: $PASSES passed, $FAILS failed, $(( SECONDS - T0 )) s"
[[ $FAILS -eq 0 && $PASSES -eq ${#MODES[@]} ]]
