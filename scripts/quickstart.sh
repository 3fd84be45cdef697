#!/usr/bin/env bash
# The README's main job: install, build, then create a small Qwen3-MoE, inspect it and score it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build mixtune
RUN=runs/quickstart
mkdir -p "$RUN"
./build/mixtune init --preset qwen3-moe-test --seed 1234 "$RUN/model"
./build/mixtune inspect "$RUN/model"
# A few pre-tokenized rows to score (labels -100 mark tokens that are not scored).
cat > "$RUN/score.jsonl" <<'JSONL'
{"input_ids": [1, 17, 42, 99, 7, 3, 250, 12], "labels": [-100, -100, 42, 99, 7, 3, 250, 12]}
{"input_ids": [1, 5, 6, 7, 8, 9, 10, 11], "labels": [1, 5, 6, 7, 8, 9, 10, 11]}
JSONL
./build/mixtune score --model "$RUN/model" --data "$RUN/score.jsonl"
./build/mixtune convert --in "$RUN/model" --out "$RUN/model-bf16" --dtype bfloat16
./build/mixtune score --model "$RUN/model-bf16" --data "$RUN/score.jsonl"
