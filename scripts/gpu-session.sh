#!/usr/bin/env bash
# One GPU-machine call: unpack the carried binaries, run the CUDA differential and training tests,
# then the requested side-by-side benchmarks against Transformers v5. Everything lands in $OUT.
#
#   scripts/gpu-session.sh CARRY_TARBALL STAGE...
#
# CARRY_TARBALL: .carry/gpu.tar.xz made by scripts/gpu-pack.sh (bin/ with mixtune, mixtune_tests and the
# kernel benches, lib/ with the non-system shared libraries they need); `-` for stages that run no mixtune binary
# (peft-probe, hf-lora).
# STAGES: tests (Cuda* gtests) | standard (~2 min) |
#         fp32master (~3–4 min; 5 runs of at most 100 s each: mixtune --precision fp32-master against every fp32-master baseline of
#         Transformers — fp32 + autocast, FSDP2 mixed precision on one rank, bf16 + fp32 master copy with fp32 and with
#         bf16 gradient accumulation — the ratio against the fastest) |
#         long (at most ~9.5 min: the longest trainable sequence by search to 1,024 tokens, 280 s for mixtune, 230 s for
#         Transformers:
#         mixtune --recompute full, selective, none; Transformers gradient checkpointing on, off; the ratio of the
#         best configurations) |
#         hf-smoke (~1–2 min: every bench/hf_baseline.py mode at 1 layer (Moonlight 2, Nemotron-H 6), seq 512, one
#         step after one warm-up, OK/FAIL per mode, incl. DDP and FSDP2 with two ranks sharing the GPU over gloo and FSDP2 mixed precision on
#         one rank; a functional check) | hf-dry2 (~2–3 min: the standard2 and fp32master2 Transformers baselines
#         with both ranks on this ONE GPU over gloo, 1 layer, seq 1024: a functional check, NOT a two-GPU
#         measurement; DRY2_SIDES=both adds mixtune over host-staged collectives) | long-smoke (~1 min: the
#         longest-sequence search end to end at 1 layer, capped at 4,096 tokens, one configuration per side) |
#         fp32master-smoke (~1.5 min: the fp32master workload's five runs at 1 layer, seq 512: its plumbing) |
#         mixtune-standard (mixtune side only) |
#         standard2 | fp32master2 (two GPUs, kind nvidia-h200-x2: EP 2 against DDP and FSDP2, the best of them) |
#         mixtune-standard2 (the mixtune side of standard2) |
#         mixtune-standard2-noshard, mixtune-fp32master2-noshard (the same with --no-shard-optimizer) |
#         mixtune-standard2-a2a (the same with the per-slot all_to_all dispatch) | mixtune-standard2-selective |
#         nccl-probe (PyTorch's NCCL all-gather / reduce-scatter at the EP 2 sizes, two GPUs) |
#         mixtune-long (the long workload, mixtune side only: its three recompute configurations; BUDGET_S default 240) |
#         full8 (eight GPUs, 48 layers, EP 8 against FSDP2; kind nvidia-h200-x8) |
#         kernels (grouped GEMM + flash-attention microbenchmarks) | kernels-gemm (grouped GEMM only; GEMM_TOKENS, GEMM_ARGS e.g. --no-check; 4096 and 8192
#         tokens) | mixtune-standard-lead (each step queued behind a LEAD_MS=300 GPU spin: phases_ms without the
#         host's enqueue rate) | mixtune-standard-idle (a LEAD_MS host sleep before each step instead) | profile (ncu: every kernel's time in one
#         standard-shaped step of 2 layers and 2 micro-batches, profile.csv; ~20 s) | kernels-wgrad1, mixtune-standard-wgrad1
#         (the same with MIXTUNE_WGRAD_BLOCKS_PER_SM=1) | quickstart (needs .carry/qs.tar.xz) |
#         sustained-gemm (8192³ bf16 matmuls for GEMM_SECONDS=10, TFLOP/s per second) | kernels-energy (grouped GEMM and
#         flash kernels each run ENERGY_SECONDS=2 s: sustained TFLOP/s, pJ per FLOP) | standard-promptN (the standard
#         workload with labels -100 on the first N% of each row, both sides) | kernels-dynamic, mixtune-standard-dynamic
#         (the grouped forward/dgrad's claimed tiles: bench --alternate at skewed / uniform / balanced routing, and
#         the standard step with MIXTUNE_GROUPED_DYNAMIC=1) | kernels-flash-persistent
#         (the flash backward one block per item vs persistent) | launch-gap (a kernel boundary's cost with and without
#         programmatic dependent launch) | kernels-memory (the memory-bound kernels against the copy rate) |
#         profile-bytes (ncu: time and HBM bytes read/written of the GEMM, attention, norm and permute kernels) |
#         kernels-flash-heads, mixtune-standard-headsG (the flash backward's query heads per item: every G per
#         shape, and the standard step with G forced) | kernels-flash-fwd-early, mixtune-standard-late (the flash
#         forward's softmax pinned before the P·V wait, or not) | kernels-projections (the attention projections' GEMMs,
#         q, k, v separate and stacked as one QKV GEMM) | mixtune-standard-balanced (the standard step with the routes
#         made perfectly balanced after the router: what the real router's uneven loads cost) | copy-power (a copy
#         confined to fewer SMs: bandwidth, power, pJ per byte; ENERGY_SECONDS per row) | ep2-host-budget (two ranks
#         sharing the GPU over host-staged collectives, EP 2 at the real shapes, LAYERS=4: the expert row budget and
#         host reads per step, headroom 1.15 and 0) | mpirun-ep2-host (the same two ranks started by Open MPI's mpirun:
#         the bootstrap through MPI on the GPU engine; LAYERS=2) | gemm-algos (the projections' and LM head's cuBLASLt GEMMs
#         with each of the heuristic's first ALGO_RANKS=8 algorithms: time, sustained TFLOP/s and pJ/FLOP over
#         ENERGY_MS=700 ms per row, and the LM head at 4,095 rows as training runs it; bench/gemm_algos.py
#         tabulates) | mixtune-standard-algoN (the standard step with every GEMM on the heuristic's N-th algorithm). `profile` also writes profile_sequence.md (every launch in order).
#         hf-realistic (tools/hf_reference/make_realistic_fixture.py on the GPU, then the GpuVsTransformers tests
#         against it; ~3 min) | mixtune-standard-det (the standard step with and without --deterministic, twice each:
#         what train.deterministic costs). `tests` unpacks .carry/qsdata.tar.xz (quickstart data + the Qwen3
#         tokenizer) for CudaTrainer.PureBf16TracksCpuFp32OnQuickstartData when it is there.
#         mixtune-standard-ab (the standard step with the old binary in .carry/mixtune-old.tar.xz and the new one,
#         alternating AB_ORDER="old new old new": a refactor's cost in one call).
#         gptoss (~2–3 min: a gpt-oss-20b slice, LAYERS=5 layers, seq 4096, micro-batch 1, grad-accum 8, mixtune
#         --preset gpt-oss-20b against Transformers' GPT-OSS defaults: eager attention, grouped_mm, fused AdamW) |
#         gptoss-long (at most ~9.5 min: the longest trainable sequence of that slice on each side, as long) |
#         moonlight (~2–4 min, issue 40: a Moonlight-16B-A3B slice, LAYERS=10 layers (1 dense + 9 MoE), seq 4096,
#         micro-batch 1, grad-accum 8, real router: mixtune --preset moonlight-16b-a3b against Transformers'
#         DeepseekV3Config with sdpa, grouped_mm, fused AdamW; each side at most RUN_TIMEOUT_S=270 s) |
#         dsv3 (~2–4 min, issue 40: a DeepSeek-V3 slice, LAYERS=3, its three dense MLA layers (a MoE layer of V3 fits
#         no single GPU with AdamW), the same settings: mixtune --preset deepseek-v3 against Transformers) |
#         nemotron (~2–4 min, issue 41: a Nemotron 3 Nano slice, LAYERS=6 layers MEMEM* (3 Mamba2 + 2 MoE + 1
#         attention; an H200 holds LAYERS=13), seq 4096, micro-batch 1, grad-accum 8, real router: mixtune --preset
#         nemotron-3-nano-30b-a3b against Transformers' NemotronHConfig with sdpa, grouped_mm, fused AdamW and its
#         torch SSD path for the Mamba2 mixers where mamba_ssm is not installed (the record says which path ran)) |
#         nemotron-long (at most ~9.5 min: the longest trainable sequence of that slice on each side, as long) |
#         verify-gpt-oss (~2–4 min, CPU: tools/hf_reference/verify_gpt_oss_unseen.py, Transformers-made GPT-OSS
#         checkpoints of shapes the fixtures lack against mixtune score, convert and one finetune step; VERIFY_ARGS
#         e.g. "--random 4 --seed 7"; the PASS/FAIL table in verify-gpt-oss.md) |
#         verify-dsv3 (~0.5 min for the default 12 variants, CPU: tools/hf_reference/verify_deepseek_v3_unseen.py,
#         Transformers-made DeepSeek-V3 checkpoints of shapes the fixtures lack — FP8 with partial blocks, MTP layers
#         present, hub spellings — against mixtune score, convert and one finetune step, plus configs mixtune must
#         refuse in one line; VERIFY_ARGS e.g. "--random 4 --seed 7"; the PASS/FAIL table in verify-dsv3.md) |
#         verify-nemotron (issue 41: tools/hf_reference/verify_nemotron_h_unseen.py, Transformers-made Nemotron-H
#         checkpoints of unseen shapes against mixtune: score fp32, convert, one finetune step; CPU; VERIFY_ARGS as
#         verify-dsv3; the table in verify-nemotron.md) |
#         verify-lora (~2–5 min, CPU: tools/hf_reference/verify_lora_unseen.py, PEFT-made adapters on Transformers-made
#         Qwen3-MoE, Qwen3 and GPT-OSS checkpoints of shapes the fixtures lack against mixtune score --adapter, merge,
#         one finetune step from the adapter, PEFT's load of our final/, and one-line refusals; VERIFY_ARGS e.g.
#         "--random 4 --seed 7"; the PASS/FAIL table in verify-lora.md) |
#         gptoss-recipe (~1–2 min: recipes/gpt-oss-20b.yaml on one GPU at a 2-layer slice, 12 steps; needs
#         .carry/gptoss-tok.tar.xz, the gpt-oss tokenizer + chat template, and .carry/qsdata.tar.xz) |
#         peft-probe (~1–2 min, CPU, no binary needed: tools/hf_reference/peft_probe.py checks docs/peft-format.md
#         against this machine's PEFT, PASS/FAIL table in peft-probe.md; then make_peft_fixture.py writes the LoRA
#         fixtures to $OUT/peft_fixtures/{qwen3_moe,gpt_oss}_lora/ for tests/fixtures) |
#         hf-lora (no binary needed: the Transformers + PEFT LoRA baseline alone, Qwen3-30B-A3B shapes, LAYERS=48
#         layers, seq 4096, r 16 alpha 32 on attention + experts, gradient checkpointing, GRAD_ACCUM=2, STEPS=3;
#         hf-lora.json; an 80 GB card may not hold 48 layers: LAYERS=24 there) |
#         lora-recipe (~2–3 min: recipes/qwen3-30b-a3b-lora.yaml on one GPU at a 2-layer slice, 12 steps, then
#         Transformers + PEFT load the adapter and give mixtune's logits; needs .carry/qsdata.tar.xz) |
#         nemotron-recipe (~1–2 min, issue 41: recipes/nemotron-3-nano-30b-a3b.yaml on one GPU at a LAYERS=6-layer slice,
#         50 bf16 steps at seq 2048 on the CUDA Mamba2 kernels, metrics in nemotron-recipe-metrics.jsonl; then
#         Transformers loads the saved checkpoint and scores rows like `mixtune score --dtype float32`; needs
#         .carry/qsdata.tar.xz) |
#         dsv3-recipe (~1 min: recipes/moonlight-16b-a3b.yaml on one GPU at a LAYERS=3-layer slice, 50 bf16 steps at
#         seq 2048 with the aux-loss-free bias update, metrics in dsv3-recipe-metrics.jsonl; then Transformers loads the
#         saved checkpoint and scores rows like `mixtune score --dtype float32`; needs .carry/qsdata.tar.xz) |
#         lora (~6–9 min: issue 39's side by side, bench/side_by_side.sh lora: mixtune bench --lora-r 16 on attention +
#         experts against that baseline, LAYERS=48, seq 4096, grad-accum 2; on an 80 GB card LAYERS=24, or
#         LORA_RECOMPUTE=full for mixtune's full depth) | lora-tests (the CudaLora* gtests alone).
#         CLOCKS=1 logs clocks/power.
set -uo pipefail
[[ $# -lt 2 ]] && { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
TARBALL=$1
shift
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
G=/tmp/mixtune-gpu
if [[ "$TARBALL" != - ]]; then
  rm -rf "$G" && mkdir -p "$G" && tar xJf "$TARBALL" -C "$G" || { echo "cannot unpack $TARBALL" >&2; exit 2; }
fi
BIN=$G/gpu/bin
export MIXTUNE_COMMIT=$(cat "$G/gpu/COMMIT" 2>/dev/null || echo unknown)
export LIB_DIR=$G/gpu/lib
export LD_LIBRARY_PATH="$LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
# CLOCKS=1: log SM clock, power and throttle reasons every 100 ms; bench/clock_log.py summarises them per stage
# (and per side of a side-by-side) at the end.
SMI_PID=
if [[ "${CLOCKS:-0}" == 1 ]]; then
  export CLOCK_MARKS=$OUT/clock-marks.txt
  : > "$CLOCK_MARKS"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active,temperature.gpu \
    --format=csv,noheader -lms 100 \
    > "$OUT/clocks.csv" & SMI_PID=$!
fi
rc=0
for stage in "$@"; do
  echo "=== stage $stage ($(date -u +%H:%M:%S))"
  [[ -n "$SMI_PID" ]] && echo "$(date -u +%H:%M:%S.%N) stage $stage" >> "$CLOCK_MARKS"
  case "$stage" in
    tests) [[ -f .carry/qsdata.tar.xz ]] && mkdir -p /tmp/qsdata && tar xJf .carry/qsdata.tar.xz -C /tmp/qsdata \
             && export MIXTUNE_QUICKSTART_DATA=/tmp/qsdata/qsdata  # CudaTrainer.PureBf16TracksCpuFp32OnQuickstartData
           MIXTUNE_TEST_BINARY=$BIN/mixtune GTEST_FILTER=${GTEST_FILTER:-Cuda*} bash scripts/gpu-check.sh "$BIN" "$LIB_DIR" 2>&1 | tee "$OUT/tests.log" \
             | tail -60 || rc=1 ;;
    standard|fp32master|long|standard2|fp32master2|full8|gptoss|gptoss-long|moonlight|dsv3|nemotron|nemotron-long)
               OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" "$stage" || rc=1 ;;
    lora)  # issue 39: mixtune LoRA against Transformers + PEFT, one GPU
      if [[ -n "${LORA_RECOMPUTE:-}" ]]; then
        OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" lora --mixtune --recompute "$LORA_RECOMPUTE" || rc=1
      else
        OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" lora || rc=1
      fi ;;
    lora-tests)
      MIXTUNE_TEST_BINARY=$BIN/mixtune GTEST_FILTER='CudaLora*' bash scripts/gpu-check.sh "$BIN" "$LIB_DIR" 2>&1 \
        | tee "$OUT/lora-tests.log" | tail -60 || rc=1 ;;
    verify-gpt-oss)  # Transformers-made GPT-OSS checkpoints of unseen shapes: score, convert, one finetune step
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/verify_gpt_oss_unseen.py "$BIN/mixtune" /tmp/verify-gpt-oss \
        ${VERIFY_ARGS:-} > "$OUT/verify-gpt-oss.log" 2>&1 || rc=1
      sed -n '/^variant  */,$p' "$OUT/verify-gpt-oss.log" | tee "$OUT/verify-gpt-oss.md"
      grep -q '^verify-gpt-oss:' "$OUT/verify-gpt-oss.log" || tail -30 "$OUT/verify-gpt-oss.log"
      cp /tmp/verify-gpt-oss/results.json "$OUT/verify-gpt-oss.json" 2>/dev/null ;;
    verify-dsv3)  # Transformers-made DeepSeek-V3 checkpoints of unseen shapes: score, convert, finetune, refusals
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/verify_deepseek_v3_unseen.py "$BIN/mixtune" /tmp/verify-dsv3 \
        ${VERIFY_ARGS:-} > "$OUT/verify-dsv3.log" 2>&1 || rc=1
      sed -n '/^variant  */,$p' "$OUT/verify-dsv3.log" | tee "$OUT/verify-dsv3.md"
      grep -q '^verify-dsv3:' "$OUT/verify-dsv3.log" || tail -30 "$OUT/verify-dsv3.log"
      cp /tmp/verify-dsv3/results.json "$OUT/verify-dsv3.json" 2>/dev/null ;;
    verify-nemotron)  # Transformers-made Nemotron-H checkpoints of unseen shapes: score, convert, finetune (issue 41)
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/verify_nemotron_h_unseen.py "$BIN/mixtune" /tmp/verify-nemotron \
        ${VERIFY_ARGS:-} > "$OUT/verify-nemotron.log" 2>&1 || rc=1
      sed -n '/^variant  */,$p' "$OUT/verify-nemotron.log" | tee "$OUT/verify-nemotron.md"
      grep -q '^verify-nemotron' "$OUT/verify-nemotron.log" || tail -30 "$OUT/verify-nemotron.log"
      cp /tmp/verify-nemotron/results.json "$OUT/verify-nemotron.json" 2>/dev/null ;;
    verify-lora)  # PEFT-made adapters on unseen checkpoints: score, merge, one finetune step, PEFT loads ours, refusals
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/verify_lora_unseen.py "$BIN/mixtune" /tmp/verify-lora \
        ${VERIFY_ARGS:-} > "$OUT/verify-lora.log" 2>&1 || rc=1
      sed -n '/^variant  */,$p' "$OUT/verify-lora.log" | tee "$OUT/verify-lora.md"
      grep -q '^verify-lora:' "$OUT/verify-lora.log" || tail -30 "$OUT/verify-lora.log"
      cp /tmp/verify-lora/results.json "$OUT/verify-lora.json" 2>/dev/null ;;
    gptoss-recipe)  # recipes/gpt-oss-20b.yaml on one GPU: a 2-layer slice of gpt-oss-20b (random weights, the real
      # gpt-oss tokenizer and harmony template from .carry/gptoss-tok.tar.xz), the quickstart's chat data, 12 steps at
      # seq 1024; then Transformers loads the saved checkpoint and scores a row like mixtune does.
      R=/tmp/gptoss-recipe && rm -rf "$R" && mkdir -p "$R" && tar xJf .carry/gptoss-tok.tar.xz -C "$R" \
        && tar xJf .carry/qsdata.tar.xz -C "$R" \
        && "$BIN/mixtune" init --preset gpt-oss-20b --layers 2 --seed 7 --tokenizer "$R/gptoss-tok" "$R/base" \
        && cp "$R/gptoss-tok/chat_template.jinja" "$R/base/" \
        && { time "$BIN/mixtune" finetune recipes/gpt-oss-20b.yaml --set model.path="$R/base" \
               --set data.train="$R/qsdata/train.jsonl" --set parallel.ep=1 --set train.max_steps=12 \
               --set data.seq_len=1024 --set train.grad_accum=2 --set train.log_every=1 \
               --set optimizer.lr=1.0e-4 --set schedule.warmup_steps=2 --set checkpoint.dir="$R/run"; } \
             > "$OUT/gptoss-recipe.log" 2>&1; grc=$?
      tail -20 "$OUT/gptoss-recipe.log"; [[ $grc -eq 0 ]] || rc=1
      cp "$R/run/metrics.jsonl" "$OUT/gptoss-recipe-metrics.jsonl" 2>/dev/null
      python3 -c 'import sys, torch; from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16); print("transformers loads", sys.argv[1], type(m).__name__, sum(p.numel() for p in m.parameters()), "parameters")' \
        "$R/run/final" 2>&1 | tail -2 | tee -a "$OUT/gptoss-recipe.log" ;;
    lora-recipe)  # recipes/qwen3-30b-a3b-lora.yaml on one GPU at a 2-layer slice of qwen3-30b-a3b (random bf16
      # weights), the quickstart's chat data and Qwen3 tokenizer, 12 steps at the recipe's seq 4096 (grad_accum 2); then
      # Transformers + PEFT load the saved adapter and give mixtune's logits (check_mixtune_adapter.py, CPU, fp32).
      R=/tmp/lora-recipe && rm -rf "$R" && mkdir -p "$R" && tar xJf .carry/qsdata.tar.xz -C "$R" \
        && "$BIN/mixtune" init --preset qwen3-30b-a3b --layers 2 --seed 7 --dtype bfloat16 \
             --tokenizer "$R/qsdata/tokenizer" "$R/base" \
        && { time "$BIN/mixtune" finetune recipes/qwen3-30b-a3b-lora.yaml --set model.path="$R/base" \
               --set data.train="$R/qsdata/train.jsonl" --set train.max_steps=12 --set train.grad_accum=2 \
               --set train.log_every=1 --set schedule.warmup_steps=2 --set optimizer.lr=1.0e-3 \
               --set checkpoint.every_steps=6 --set checkpoint.dir="$R/run"; } > "$OUT/lora-recipe.log" 2>&1; lrc=$?
      tail -25 "$OUT/lora-recipe.log"; [[ $lrc -eq 0 ]] || rc=1
      cp "$R/run/metrics.jsonl" "$OUT/lora-recipe-metrics.jsonl" 2>/dev/null
      ls -la "$R/run/final" 2>&1 | tee -a "$OUT/lora-recipe.log"
      python3 -c 'import json, random; random.seed(1); [print(json.dumps({"input_ids": [random.randrange(151936) for _ in range(64)]})) for _ in range(2)]' \
        > "$R/check.jsonl"
      "$BIN/mixtune" score --model "$R/base" --adapter "$R/run/final" --data "$R/check.jsonl" --dtype float32 \
        --logits "$R/mixtune-logits.npy" >> "$OUT/lora-recipe.log" 2>&1 || rc=1
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/check_mixtune_adapter.py --base "$R/base" --adapter "$R/run/final" \
        --data "$R/check.jsonl" --logits "$R/mixtune-logits.npy" 2>&1 | tail -4 | tee -a "$OUT/lora-recipe.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
    nemotron-recipe)  # recipes/nemotron-3-nano-30b-a3b.yaml on one GPU: a LAYERS=6-layer slice (MEMEM*) of
      # nemotron-3-nano-30b-a3b (random bf16 weights, zero selection biases) with the vocabulary widened to the Qwen3
      # tokenizer's 151,936 rows (the quickstart's chat data; the preset's 131,072 is smaller), 50 bf16 steps at seq 2048
      # (grad_accum 2) on the CUDA Mamba2 kernels; then Transformers loads final/ and scores rows on the CPU in fp32
      # against `mixtune score --dtype float32` (check_mixtune_checkpoint.py: loss rel <= 1e-5, logits max abs <= 1e-4).
      R=/tmp/nemotron-recipe && rm -rf "$R" && mkdir -p "$R" && tar xJf .carry/qsdata.tar.xz -C "$R" \
        && "$BIN/mixtune" init --preset nemotron-3-nano-30b-a3b --layers "${LAYERS:-6}" --dtype bfloat16 "$R/preset" \
        && python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["vocab_size"] = 151936; json.dump(c, open(sys.argv[2], "w"), indent=1)' \
             "$R/preset/config.json" "$R/config.json" \
        && "$BIN/mixtune" init --config "$R/config.json" --seed 7 --dtype bfloat16 --tokenizer "$R/qsdata/tokenizer" \
             "$R/base" \
        && { time "$BIN/mixtune" finetune recipes/nemotron-3-nano-30b-a3b.yaml --set model.path="$R/base" \
               --set data.train="$R/qsdata/train.jsonl" --set parallel.ep=1 --set train.max_steps=50 \
               --set data.seq_len=2048 --set train.grad_accum=2 --set train.log_every=1 --set optimizer.lr=1.0e-4 \
               --set schedule.warmup_steps=5 --set checkpoint.dir="$R/run"; } > "$OUT/nemotron-recipe.log" 2>&1; nrc=$?
      tail -12 "$OUT/nemotron-recipe.log"; [[ $nrc -eq 0 ]] || rc=1
      cp "$R/run/metrics.jsonl" "$OUT/nemotron-recipe-metrics.jsonl" 2>/dev/null
      python3 -c 'import json, sys; m = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]; s = [r for r in m if "loss" in r]; print("nemotron-recipe:", len(s), "steps, loss", s[0]["loss"], "->", s[-1]["loss"], "; tokens/s", s[-1].get("tokens_per_s"))' \
        "$R/run/metrics.jsonl" 2>&1 | tee -a "$OUT/nemotron-recipe.log"
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/check_mixtune_checkpoint.py --binary "$BIN/mixtune" \
        --model "$R/run/final" --work "$R/check" --vocab 151669 2>&1 | tail -6 | tee -a "$OUT/nemotron-recipe.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
    dsv3-recipe)  # recipes/moonlight-16b-a3b.yaml on one GPU: a LAYERS=3-layer slice of moonlight-16b-a3b (random
      # bf16 weights: layer 0 dense, the rest MoE; zero selection biases), the quickstart's chat data and Qwen3
      # tokenizer (its ChatML template, from tokenizer_config.json), 50 steps at seq 2048 (grad_accum 2) with the recipe's
      # moe.bias_update_rate 0.001 (the aux-loss-free update on the GPU); then Transformers loads final/ and scores rows
      # on the CPU in fp32 against `mixtune score --dtype float32` (check_mixtune_checkpoint.py: loss rel <= 1e-5,
      # logits max abs <= 1e-4, every MoE layer's bias moved).
      R=/tmp/dsv3-recipe && rm -rf "$R" && mkdir -p "$R" && tar xJf .carry/qsdata.tar.xz -C "$R" \
        && "$BIN/mixtune" init --preset moonlight-16b-a3b --layers "${LAYERS:-3}" --seed 7 --dtype bfloat16 \
             --tokenizer "$R/qsdata/tokenizer" "$R/base" \
        && { time "$BIN/mixtune" finetune recipes/moonlight-16b-a3b.yaml --set model.path="$R/base" \
               --set data.train="$R/qsdata/train.jsonl" --set parallel.ep=1 --set train.max_steps=50 \
               --set data.seq_len=2048 --set train.grad_accum=2 --set train.log_every=1 --set optimizer.lr=1.0e-4 \
               --set schedule.warmup_steps=5 --set checkpoint.dir="$R/run"; } > "$OUT/dsv3-recipe.log" 2>&1; drc=$?
      tail -20 "$OUT/dsv3-recipe.log"; [[ $drc -eq 0 ]] || rc=1
      cp "$R/run/metrics.jsonl" "$OUT/dsv3-recipe-metrics.jsonl" 2>/dev/null
      python3 -c 'import json, sys; m = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]; s = [r for r in m if "loss" in r]; print("dsv3-recipe:", len(s), "steps, loss", s[0]["loss"], "->", s[-1]["loss"], "; load max/mean", s[0].get("expert_load_max_over_mean"), "->", s[-1].get("expert_load_max_over_mean"))' \
        "$R/run/metrics.jsonl" 2>&1 | tee -a "$OUT/dsv3-recipe.log"
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/check_mixtune_checkpoint.py --binary "$BIN/mixtune" \
        --model "$R/run/final" --work "$R/check" --vocab 151669 --expect-bias-moved 2>&1 | tail -8 \
        | tee -a "$OUT/dsv3-recipe.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1 ;;
    hf-smoke) OUT=$OUT bash bench/hf_smoke.sh || rc=1 ;;
    hf-lora)  # issue 39's baseline: Transformers + PEFT LoRA on a frozen bf16 Qwen3-30B-A3B slice, one GPU
      PYTHONUNBUFFERED=1 python3 bench/hf_baseline.py --layers ${LAYERS:-48} --seq 4096 --micro-batch 1 \
        --grad-accum ${GRAD_ACCUM:-2} --steps ${STEPS:-3} --warmup 1 --peft lora --lora-r 16 --lora-alpha 32 \
        --lora-targets attn,experts --gradient-checkpointing --json-out "$OUT/hf-lora.json" \
        > "$OUT/hf-lora.log" 2>&1 || rc=1
      grep -E 'PEFT|tokens/s|OOM|FAILED' "$OUT/hf-lora.log" | tail -5
      python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("hf-lora:", j.get("gpu"), "layers", j["model"]["layers"], "tokens/s", j.get("tokens_per_s_per_gpu"), "peak GiB", round((j.get("peak_allocated_bytes") or 0) / 2**30, 2), "lora", j.get("lora"), "oom", j.get("oom"), "error", j.get("error"))' \
        "$OUT/hf-lora.json" 2>/dev/null || tail -20 "$OUT/hf-lora.log" ;;
    peft-probe)  # docs/peft-format.md against this machine's PEFT (CPU, fp32), then the LoRA fixtures
      OUT=$OUT PYTHONUNBUFFERED=1 python3 tools/hf_reference/peft_probe.py --keep /tmp/peft-probe \
        > "$OUT/peft-probe.log" 2>&1 || rc=1
      grep -E '^versions:|^\[(PASS|FAIL)\]|^peft-probe' "$OUT/peft-probe.log" | tail -40
      [[ -f "$OUT/peft-probe.md" ]] || tail -30 "$OUT/peft-probe.log"
      rm -rf "$OUT/peft_fixtures"
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/make_peft_fixture.py "$OUT/peft_fixtures" \
        > "$OUT/peft_fixtures.log" 2>&1 || { rc=1; grep -B2 -A12 Traceback "$OUT/peft_fixtures.log" | tail -40; }
      tail -6 "$OUT/peft_fixtures.log"; du -sh "$OUT/peft_fixtures" 2>/dev/null ;;
    hf-realistic)  # Transformers' bf16 reference at a 2-layer Qwen3-30B-A3B slice, then the CUDA engine against it
      PYTHONUNBUFFERED=1 python3 tools/hf_reference/make_realistic_fixture.py /tmp/hf-realistic \
        > "$OUT/hf_realistic_fixture.log" 2>&1 || { rc=1; tail -20 "$OUT/hf_realistic_fixture.log"; }
      tail -4 "$OUT/hf_realistic_fixture.log"; cp /tmp/hf-realistic/meta.json "$OUT/hf_realistic_meta.json" 2>/dev/null
      MIXTUNE_HF_REALISTIC=/tmp/hf-realistic GTEST_FILTER='GpuVsTransformers*' bash scripts/gpu-check.sh "$BIN" \
        "$LIB_DIR" 2>&1 | tee "$OUT/hf_realistic_tests.log" | grep -E 'check|caught|traj|OK|FAIL|summary' | tail -150 || rc=1 ;;
    mixtune-standard-det)  # what train.deterministic costs: the standard step with and without it, alternating
      n=0 det_layers=()  # an 80 GB card cannot hold the 12-layer step's 74.7 GiB with the deterministic workspace
      (( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) < 100000 )) && det_layers=(--layers 8)
      for d in ${DET_ORDER:-off on}; do
        n=$((n + 1)); flag=(); [[ $d == on ]] && flag=(--deterministic)
        SIDES=mixtune NAME=mixtune-standard-det-$n-$d OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" standard \
          "${det_layers[@]}" --mixtune "${flag[@]}" > "$OUT/mixtune-standard-det-$n-$d.out" 2>&1 || { rc=1; tail -5 "$OUT/mixtune-standard-det-$n-$d.out"; }
      done
      python3 - "$OUT" <<'PY' || rc=1
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/mixtune-standard-det-*-mixtune.json")):
    j = json.load(open(f))
    print(f.split("/")[-1], "deterministic" if j.get("deterministic") else "fast", "tokens/s", round(j["tokens_per_s_per_gpu"]),
          "step ms", round(1000 * j.get("step_time_s", 0), 1), "peak GiB", round(j.get("peak_allocated_bytes", 0) / 2**30, 2),
          "attention ms", j.get("phases_ms", {}).get("attention"), "loss first/last", repr(j.get("loss_first")),
          repr(j.get("loss_last")))
PY
      ;;
    mixtune-standard-ab)  # a refactor's cost: the standard step with the old binary (.carry/mixtune-old.tar.xz) and the new
      # one, alternating (AB_ORDER, default "old new old new"), same call, same card
      mkdir -p "$G/old" && tar xJf .carry/mixtune-old.tar.xz -C "$G/old" || { echo "no .carry/mixtune-old.tar.xz" >&2; rc=1; continue; }
      n=0
      for v in ${AB_ORDER:-old new old new}; do
        n=$((n + 1)); b="$BIN/mixtune"; [[ $v == old ]] && b="$G/old/old/mixtune"
        SIDES=mixtune NAME=mixtune-standard-ab-$n-$v OUT=$OUT bash bench/side_by_side.sh "$b" standard \
          > "$OUT/mixtune-standard-ab-$n-$v.out" 2>&1 || { rc=1; tail -5 "$OUT/mixtune-standard-ab-$n-$v.out"; }
      done
      python3 - "$OUT" "$(cat "$G/old/old/COMMIT" 2>/dev/null)" "$MIXTUNE_COMMIT" <<'PY' || rc=1
import glob, json, sys
print("old commit", sys.argv[2], "new commit", sys.argv[3])
for f in sorted(glob.glob(sys.argv[1] + "/mixtune-standard-ab-*-mixtune.json")):
    j = json.load(open(f))
    print(f.split("/")[-1], "tokens/s", round(j["tokens_per_s_per_gpu"]), "step ms", round(1000 * j.get("step_time_s", 0), 1),
          "peak GiB", round(j.get("peak_allocated_bytes", 0) / 2**30, 2), "loss first/last", repr(j.get("loss_first")),
          repr(j.get("loss_last")))
PY
      ;;
    fp32master-smoke) NAME=fp32master-smoke OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" fp32master --layers 1 \
               --seq 512 --grad-accum 2 --steps 1 --warmup 1 || rc=1 ;;  # the workload's plumbing, tiny: not a measurement
    hf-dry2) for w in standard2 fp32master2; do  # functional check: two ranks on one GPU, not a measurement
               DRY2=1 SIDES=${DRY2_SIDES:-hf} OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" "$w" || rc=1
             done ;;
    long-smoke) for side in hf mixtune; do  # the search end to end, tiny: 1 layer, capped at 4,096 tokens
               cfg=none; [[ $side == hf ]] && cfg=off
               python3 bench/longest_seq.py --side $side --bin "$BIN/mixtune" --configs $cfg --layers 1 --start 2048 \
                 --max-seq 4096 --budget-s 90 --out "$OUT" --tag long-smoke-$side || rc=1
             done
             python3 bench/compare.py "$OUT/long-smoke-mixtune.json" "$OUT/long-smoke-hf.json" || rc=1 ;;
    mixtune-standard2-dp) SIDES=mixtune NAME=mixtune-standard2-dp OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" \
               standard2 --mixtune --ep 1 || rc=1 ;;
    mixtune-standard2-blocking) MIXTUNE_NCCL_BLOCKING=1 SIDES=mixtune NAME=mixtune-standard2-blocking OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard2 || rc=1 ;;
    mixtune-long) SIDES=mixtune NAME=mixtune-long BUDGET_S=${BUDGET_S:-240} OUT=$OUT bash bench/side_by_side.sh \
               "$BIN/mixtune" long || rc=1 ;;
    mixtune-standard2-selective) SIDES=mixtune NAME=mixtune-standard2-selective OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard2 --mixtune --recompute selective || rc=1 ;;
    mixtune-standard2-a2a) SIDES=mixtune NAME=mixtune-standard2-a2a OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" \
               standard2 --mixtune --ep-dispatch all_to_all || rc=1 ;;
    nccl-probe) torchrun --nproc-per-node 2 bench/nccl_probe.py > "$OUT/nccl-probe.json" 2> "$OUT/nccl-probe.err" || rc=1
               cat "$OUT/nccl-probe.json"; tail -3 "$OUT/nccl-probe.err" ;;
    mixtune-standard2) SIDES=mixtune NAME=mixtune-standard2 OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" standard2 \
               || rc=1 ;;
    mixtune-standard2-noshard|mixtune-fp32master2-noshard)  # the same without ZeRO-1 (optimizer state whole on both GPUs)
               w=${stage#mixtune-}; w=${w%-noshard}
               SIDES=mixtune NAME=$stage OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" "$w" --mixtune \
               --no-shard-optimizer || rc=1 ;;
    mixtune-standard) SIDES=mixtune NAME=mixtune-standard OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    mixtune-standard-lead) MIXTUNE_BENCH_LEAD_MS=${LEAD_MS:-300} SIDES=mixtune NAME=mixtune-standard-lead OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    mixtune-standard-idle) MIXTUNE_BENCH_IDLE_MS=${LEAD_MS:-300} SIDES=mixtune NAME=mixtune-standard-idle OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    kernels) "$BIN/mixtune_bench_grouped_gemm" > "$OUT/grouped_gemm.json" 2>&1; "$BIN/mixtune_bench_flash_attention" \
               > "$OUT/flash_attention.json" 2>&1; tail -12 "$OUT"/grouped_gemm.json "$OUT"/flash_attention.json ;;
    profile) ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base "$BIN/mixtune" bench \
               --preset qwen3-30b-a3b --layers 2 --seq 4096 --micro-batch 1 --grad-accum 2 --steps 1 --warmup 1 \
               ${PRECISION:+--precision $PRECISION} > "$OUT/profile.csv" 2> "$OUT/profile.err" || rc=1
             python3 bench/kernel_profile.py "$OUT/profile.csv" > "$OUT/profile.md"; head -40 "$OUT/profile.md"
             python3 bench/kernel_profile.py "$OUT/profile.csv" --sequence 100000 > "$OUT/profile_sequence.md" ;;
    mixtune-standard-balanced) SIDES=mixtune NAME=mixtune-standard-balanced OUT=$OUT bash bench/side_by_side.sh \
               "$BIN/mixtune" standard --mixtune --balanced-router || rc=1 ;;
    copy-power) "$BIN/mixtune_bench_copy_power" --seconds ${ENERGY_SECONDS:-2} > "$OUT/copy_power.json" 2>&1
             cat "$OUT/copy_power.json" ;;
    kernels-projections) "$BIN/mixtune_bench_projections" > "$OUT/projections.json" 2>&1; cat "$OUT/projections.json" ;;
    gemm-algos) for ((r = 0; r < ${ALGO_RANKS:-8}; r++)); do
               MIXTUNE_GEMM_ALGO_RANK=$r "$BIN/mixtune_bench_projections" --reps 20 --energy-ms ${ENERGY_MS:-700} \
                 > "$OUT/gemm_algos_rank$r.json" 2>&1 || { rc=1; tail -3 "$OUT/gemm_algos_rank$r.json"; }
               MIXTUNE_GEMM_ALGO_RANK=$r "$BIN/mixtune_bench_projections" --tokens 4095 --head-only 1 --reps 5 \
                 --energy-ms ${ENERGY_MS:-700} > "$OUT/gemm_algos_head4095_rank$r.json" 2>&1 || rc=1
             done
             python3 bench/gemm_algos.py "$OUT"/gemm_algos_rank*.json | tee "$OUT/gemm_algos.md" || rc=1
             python3 bench/gemm_algos.py "$OUT"/gemm_algos_head4095_rank*.json | tee "$OUT/gemm_algos_head4095.md" || rc=1 ;;
    ep2-host-budget) for h in 1.15 0; do  # two ranks sharing the GPU (host-staged): the expert row budget at real shapes
               "$BIN/mixtune" launch --nproc 2 -- bench --ep 2 --gpu-collectives host --layers ${LAYERS:-4} --grad-accum 4 \
                 --steps 3 --warmup 1 --ep-row-headroom $h --json-out "$OUT/ep2_host_headroom$h.json" \
                 > "$OUT/ep2_host_headroom$h.log" 2>&1 || rc=1
               python3 -c "import json,sys; j=json.load(open(sys.argv[1])); a=j['all_to_all']; print(sys.argv[2], {k: a[k] for k in ('host_count_reads_per_step','host_wait_for_counts_ms_per_step','row_budget')}, 'peak', j.get('peak_allocated_bytes'), 'loss', j.get('loss_first'), j.get('loss_last'))" \
                 "$OUT/ep2_host_headroom$h.json" "headroom $h" || tail -5 "$OUT/ep2_host_headroom$h.log"
             done ;;
    mpirun-ep2-host) # the same job started by Open MPI's mpirun (bootstrap through MPI, no MASTER_ADDR/PORT)
               ldd "$BIN/mixtune" | grep -E "libmpi|not found"
               env -u MASTER_ADDR -u MASTER_PORT mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
                 -x LD_LIBRARY_PATH "$BIN/mixtune" bench --ep 2 --gpu-collectives host --layers ${LAYERS:-2} \
                 --grad-accum 4 --steps 3 --warmup 1 --json-out "$OUT/mpirun_ep2_host.json" \
                 > "$OUT/mpirun_ep2_host.log" 2>&1 || rc=1
               python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('mpirun:', j.get('ranks_from'), 'tokens/s per GPU', j.get('tokens_per_s_per_gpu'), 'loss', j.get('loss_first'), j.get('loss_last'))" \
                 "$OUT/mpirun_ep2_host.json" || tail -8 "$OUT/mpirun_ep2_host.log" ;;
    profile-bytes) ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
               --kernel-name regex:'grouped|flash|rmsnorm|combine|gather|swiglu|gated' --csv --print-units base "$BIN/mixtune" \
               bench --preset qwen3-30b-a3b --layers 2 --seq 4096 --micro-batch 1 --grad-accum 2 --steps 1 --warmup 1 \
               > "$OUT/profile_bytes.csv" 2> "$OUT/profile_bytes.err" || rc=1
             python3 bench/kernel_profile.py "$OUT/profile_bytes.csv" > "$OUT/profile_bytes.md"
             head -30 "$OUT/profile_bytes.md" ;;
    kernels-wgrad1) MIXTUNE_WGRAD_BLOCKS_PER_SM=1 "$BIN/mixtune_bench_grouped_gemm" > "$OUT/grouped_gemm_wgrad1.json" 2>&1
               tail -12 "$OUT/grouped_gemm_wgrad1.json" ;;
    mixtune-standard-wgrad1) MIXTUNE_WGRAD_BLOCKS_PER_SM=1 SIDES=mixtune NAME=mixtune-standard-wgrad1 OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    quickstart)  # the README quickstart's fine-tune on the GPU (data and tokenizer carried in .carry/qs.tar.xz)
      Q=/tmp/mixtune-qs && rm -rf "$Q" && mkdir -p "$Q" && tar xJf .carry/qs.tar.xz -C "$Q" && rm -rf runs/quickstart \
        && mkdir -p runs && cp -r "$Q/runs/quickstart" runs/ \
        && "$BIN/mixtune" init --preset qwen3-moe-tiny --seed 1234 --dtype float32 --tokenizer "$Q/tok" runs/quickstart/base \
        && { time "$BIN/mixtune" finetune recipes/quickstart.yaml; } > "$OUT/quickstart.log" 2>&1; qrc=$?
      tail -25 "$OUT/quickstart.log"; [[ $qrc -eq 0 ]] || rc=1
      cp runs/quickstart/finetune/metrics.jsonl "$OUT/quickstart-metrics.jsonl" 2>/dev/null
      python3 -c 'import json,sys; ex=json.loads(open("runs/quickstart/data/eval.jsonl").readline()); json.dump([m for m in ex["messages"] if m["role"]!="assistant"], open("/tmp/qs-prompt.json","w")); print("question:", ex["messages"][-2]["content"], "| expected:", ex["messages"][-1]["content"])'
      "$BIN/mixtune" generate --model runs/quickstart/finetune/final --chat /tmp/qs-prompt.json --temperature 0 \
        --max-new-tokens 24 --no-thinking ;;
    kernels-gemm) for t in ${GEMM_TOKENS:-4096 8192}; do "$BIN/mixtune_bench_grouped_gemm" --tokens $t ${GEMM_ARGS:-} > "$OUT/grouped_gemm_$t.json" 2>&1
                 grep -o '"op": "[a-z_0-9]*", \("gflop": [0-9.]*, \)\{0,1\}"ms": [0-9.]*, "\(tflops\|gbps\)": [0-9.]*' "$OUT/grouped_gemm_$t.json"; done ;;
    mixtune-standard-unpaired) SIDES=mixtune NAME=mixtune-standard-unpaired OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard --mixtune --no-pair-expert-wgrad || rc=1 ;;
    mixtune-standard-mma) MIXTUNE_GROUPED_GEMM=mma SIDES=mixtune NAME=mixtune-standard-mma OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    mixtune-standard-dynamic) MIXTUNE_GROUPED_DYNAMIC=1 SIDES=mixtune NAME=mixtune-standard-dynamic OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    kernels-dynamic)  # static vs claimed tiles alternating in one process, three routings (bench/NOTES.md 79-80)
               for r in skewed uniform balanced; do f=; [[ $r != skewed ]] && f=--$r
                 "$BIN/mixtune_bench_grouped_gemm" --tokens 4096 --no-check --alternate ${ALTERNATE:-5} $f \
                   > "$OUT/grouped_gemm_dynamic_$r.json" 2>&1
                 echo "$r:"; grep -E '"claimed_over_static"|tail_cost_1.0' "$OUT/grouped_gemm_dynamic_$r.json"; done ;;
    kernels-energy) "$BIN/mixtune_bench_grouped_gemm" --tokens 8192 --no-check --energy-seconds ${ENERGY_SECONDS:-2} \
               > "$OUT/grouped_gemm_energy.json" 2>&1; "$BIN/mixtune_bench_flash_attention" --energy-seconds \
               ${ENERGY_SECONDS:-2} > "$OUT/flash_attention_energy.json" 2>&1
             python3 bench/energy_table.py "$OUT/grouped_gemm_energy.json" "$OUT/flash_attention_energy.json" \
               | tee "$OUT/kernels-energy.md" ;;
    standard-prompt*)  # the standard workload as SFT data: the first N% of each row's labels -100 on both sides
               pct=${stage#standard-prompt}
               NAME=$stage OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" standard --prompt-fraction \
               "$(python3 -c "print($pct / 100)")" || rc=1 ;;
    kernels-flash-persistent)  # the sm90 flash backward one block per item (P=0) and persistent (P=1, the
               # default; MIXTUNE_FLASH_BWD_PERSISTENT), alternating, single and packed documents; JSON lines in flash-ab.jsonl
               for p in 0 1 0 1; do for args in "--seq 4096 --reps 50 --energy-seconds 2" "--seq 8192 --reps 20" \
                   "--seq 16384 --reps 5" "--seq 4096 --doc-len 512 --reps 50" "--seq 4096 --doc-len 2048 --reps 50"; do
                 r=$(MIXTUNE_FLASH_BWD_PERSISTENT=$p "$BIN/mixtune_bench_flash_attention" $args 2>&1 | tr -d '\n')
                 echo "{\"persistent\": $p, \"args\": \"$args\", \"result\": $r}" | tee -a "$OUT/flash-ab.jsonl" \
                   | grep -o '"persistent": [01], "args": "[^"]*"\|"backward": {[^}]*}'
               done; done ;;
    kernels-flash-heads)  # the sm90 flash backward's query heads per item (bench/NOTES.md 83): every G alternating
               # in one process per shape (backward_by_heads), then G = 1 against the default rule's choice sustained
               for args in "--seq 4096" "--seq 4096 --doc-len 512" "--seq 4096 --doc-len 2048" "--seq 8192" \
                   "--seq 16384 --reps 4" "--seq 1024 --batch 4"; do
                 r=$("$BIN/mixtune_bench_flash_attention" $args --bwd-heads-sweep ${SWEEP:-5} 2>&1 | tr -d '\n')
                 echo "{\"args\": \"$args\", \"result\": $r}" | tee -a "$OUT/flash-heads.jsonl" \
                   | grep -o '"args": "[^"]*"\|"backward_by_heads": .*"backward_heads_per_item": [0-9]*'
               done
               for g in 1 0 1 0; do
                 r=$("$BIN/mixtune_bench_flash_attention" --seq 4096 --bwd-heads $g --energy-seconds 2 2>&1 | tr -d '\n')
                 echo "{\"bwd_heads\": $g, \"result\": $r}" | tee -a "$OUT/flash-heads-energy.jsonl" \
                   | grep -o '"bwd_heads": [0-9]*\|"backward_heads_per_item": [0-9]*\|"backward": {[^}]*}'
               done ;;
    kernels-flash-fwd-early)  # the sm90 flash forward's softmax left to ptxas / pinned before the P·V wait (bench/NOTES.md
               # 85), alternating in one process per shape (forward_by_softmax), then sustained with each
               for args in "--seq 4096" "--seq 4096 --doc-len 512" "--seq 8192" "--seq 16384 --reps 4"; do
                 r=$("$BIN/mixtune_bench_flash_attention" $args --fwd-early-ab ${ROUNDS:-5} 2>&1 | tr -d '\n')
                 echo "{\"args\": \"$args\", \"result\": $r}" | tee -a "$OUT/flash-fwd-early.jsonl" \
                   | grep -o '"args": "[^"]*"\|"forward_by_softmax": {[^}]*}[^}]*}'
               done
               for e in 0 1 0 1; do
                 r=$(MIXTUNE_FLASH_FWD_EARLY_SOFTMAX=$e "$BIN/mixtune_bench_flash_attention" --seq 4096 --energy-seconds 2 2>&1 | tr -d '\n')
                 echo "{\"early\": $e, \"result\": $r}" | tee -a "$OUT/flash-fwd-early-energy.jsonl" \
                   | grep -o '"early": [01]\|"forward": {[^}]*}'
               done ;;
    mixtune-standard-late)  # the standard step with the flash forward's softmax left to ptxas
               MIXTUNE_FLASH_FWD_EARLY_SOFTMAX=0 SIDES=mixtune NAME=$stage OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    mixtune-standard-algo*)  # the standard step with every cuBLASLt GEMM on the heuristic's N-th algorithm
               MIXTUNE_GEMM_ALGO_RANK=${stage#mixtune-standard-algo} SIDES=mixtune NAME=$stage OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    mixtune-standard-heads*)  # the standard step with the flash backward's heads per item forced (…-heads1: G = 1)
               MIXTUNE_FLASH_BWD_HEADS=${stage#mixtune-standard-heads} SIDES=mixtune NAME=$stage OUT=$OUT \
               bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    launch-gap) "$BIN/mixtune_bench_launch_gap" | tee "$OUT/launch_gap.json" || rc=1 ;;
    kernels-memory) "$BIN/mixtune_bench_memory_kernels" > "$OUT/memory_kernels.json" 2>&1 || rc=1
               cat "$OUT/memory_kernels.json" ;;
    sustained-gemm) python3 bench/sustained_gemm.py --seconds ${GEMM_SECONDS:-10} > "$OUT/sustained_gemm.json" \
               || rc=1; python3 -c 'import json,sys; print(" ".join(str(w["tflops"]) for w in json.load(open(sys.argv[1]))["windows"]))' \
               "$OUT/sustained_gemm.json" ;;
    *) echo "unknown stage $stage" >&2; rc=2 ;;
  esac
done
if [[ -n "$SMI_PID" ]]; then
  echo "$(date -u +%H:%M:%S.%N) end" >> "$CLOCK_MARKS"
  kill "$SMI_PID" 2>/dev/null
  python3 bench/clock_log.py "$OUT/clocks.csv" "$CLOCK_MARKS" | tee "$OUT/clocks.md"
fi
# One archive comes back more reliably than many small files (the device tool limits the file count).
(cd "$OUT" && tar czf /tmp/gpu-session.tgz --exclude=gpu-session.tgz . && find . -type f ! -name '*.md' -delete \
  && mv /tmp/gpu-session.tgz .)
ls -la "$OUT"
exit $rc
