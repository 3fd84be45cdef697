#!/usr/bin/env bash
# mixtune as an installed library (issue 43; ctest install_consumer): `cmake --install` into a fresh prefix, the
# example project examples/consumer configured with find_package(mixtune) against it, built and run on a
# Transformers-made fixture (its 5 fine-tuning steps checked against Transformers' losses), the installed CLI
# run from the prefix, and the Python tests (tests/python) run against the installed module.
#   scripts/check-install.sh BUILD_DIR SOURCE_DIR [PYTHON (the interpreter the module was built for)]
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
py=${3:-/usr/bin/python3}
[[ -x $py ]] || py=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in bin/mixtune include/mixtune/mixtune.h include/mixtune/version.h; do
  [[ -e $prefix/$f ]] || { echo "check-install: $f is not installed"; exit 1; }
done
config=$(find "$prefix" -name mixtuneConfig.cmake | head -1)
[[ -n $config ]] || { echo "check-install: no mixtuneConfig.cmake installed"; exit 1; }
ls "$prefix"/lib*/libmixtune.so* > /dev/null || { echo "check-install: libmixtune.so is not installed"; exit 1; }
# The library exports the public API only.
if nm -D --defined-only "$prefix"/lib*/libmixtune.so | c++filt | grep -E ' T mt::' | head -3 | grep -q .; then
  echo "check-install: libmixtune.so exports internal mt:: symbols"; exit 1
fi

"$prefix/bin/mixtune" --help | grep -q finetune

# The consumer project: configured against the prefix only (no path into the source or build tree).
cmake -S "$src/examples/consumer" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" > "$work/consumer-configure.log"
cmake --build "$work/consumer" > "$work/consumer-build.log"
fx=$src/tests/fixtures/qwen3_moe
cat > "$work/recipe.yaml" <<YAML
model: {path: $fx/moe_gqa_aux/ckpt, dtype: float32}
data: {train: $fx/train5/train.jsonl, seq_len: 16, pack: true}
train: {micro_batch_size: 1, grad_accum: 1, max_steps: 5, seed: 7, device: cpu}
optimizer: {lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.01}
schedule: {name: constant}
clip: {max_grad_norm: 0}
checkpoint: {dir: $work/run}
YAML
"$work/consumer/mixtune_consumer" "$fx/moe_gqa_aux/ckpt" "$work/recipe.yaml" "$work/saved" > "$work/consumer.jsonl"
"$py" - "$work/consumer.jsonl" "$fx/train5/meta.json" "$work/saved" <<'PY'
import json, os, sys
events = [json.loads(line) for line in open(sys.argv[1])]
meta = json.load(open(sys.argv[2]))
kinds = [e["event"] for e in events]
assert kinds == ["inspect", "score", "step", "step", "step", "step", "step", "done"], kinds
assert events[0]["architecture"] == "Qwen3MoeForCausalLM", events[0]
steps = [e for e in events if e["event"] == "step"]
for got, want in zip(steps, meta["steps"]):  # Transformers' 5 AdamW steps on the same batch
    assert abs(got["loss"] - want["loss"]) <= 1e-4 * abs(want["loss"]), (got, want)
done = events[-1]
assert done["steps"] == 5 and done["loss_after"] < events[1]["loss"], (events[1], done)
assert os.path.exists(os.path.join(sys.argv[3], "config.json")), "the consumer's save has no config.json"
print("check-install: consumer ok, step losses", [round(s["loss"], 6) for s in steps])
PY

pydir=$prefix/lib/python3/dist-packages
if [[ -d $pydir/mixtune ]]; then
  PYTHONPATH=$pydir MIXTUNE_SOURCE_DIR=$src "$py" -m unittest discover -s "$src/tests/python" -v 2>&1 | tail -15
  status=${PIPESTATUS[0]}
  [[ $status -eq 0 ]] || { echo "check-install: the Python tests failed"; exit 1; }
else
  echo "check-install: no Python module in this build (python3-dev, pybind11-dev missing): Python tests not run"
fi
echo "check-install: ok"
