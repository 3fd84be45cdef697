#!/usr/bin/env bash
# The README's main job on a fresh Debian 12 machine: install, build, fetch the real Qwen3 tokenizer, build a
# chat dataset from Debian's quiz/riddle files (+ generated arithmetic), create a small Qwen3-MoE with that
# tokenizer, fine-tune it (recipes/quickstart.yaml), then ask it a held-out question.
# Output: runs/quickstart/finetune/{final/ (HF checkpoint), metrics.jsonl, loss.png}.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/fetch-data.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build mixtune
RUN=runs/quickstart
rm -rf "$RUN"  # the demo always starts over (finetune refuses to overwrite a run without --resume)
mkdir -p "$RUN"
node tools/quickstart_data/make_chat_data.mjs --out "$RUN/data"
./build/mixtune init --preset qwen3-moe-tiny --seed 1234 --dtype float32 \
  --tokenizer .deps/data/tokenizers/qwen3 "$RUN/base"
./build/mixtune inspect "$RUN/base"
time ./build/mixtune finetune recipes/quickstart.yaml
echo "--- loss (first and last steps, from $RUN/finetune/metrics.jsonl):"
head -n 1 "$RUN/finetune/metrics.jsonl"
tail -n 1 "$RUN/finetune/metrics.jsonl"
# A held-out question (the eval split's first) answered by the fine-tuned model, greedy.
node -e '
  const fs = require("fs");
  const ex = JSON.parse(fs.readFileSync(process.argv[1], "utf8").split("\n")[0]);
  const turns = ex.messages.filter((m) => m.role !== "assistant");
  fs.writeFileSync(process.argv[2], JSON.stringify(turns));
  console.log("--- question: " + turns[turns.length - 1].content);
  console.log("--- expected: " + ex.messages[ex.messages.length - 1].content);
' "$RUN/data/eval.jsonl" "$RUN/prompt.json"
echo -n "--- answer:   "
./build/mixtune generate --model "$RUN/finetune/final" --chat "$RUN/prompt.json" --temperature 0 --max-new-tokens 24 --no-thinking
echo "--- checkpoint: $RUN/finetune/final   loss curve: $RUN/finetune/loss.png"
