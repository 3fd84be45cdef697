#!/usr/bin/env bash
# Runs on the GPU machine (Transformers 5.17, tokenizers 0.23, torch 2.11): produces every reference file
# the CPU test suite checks against, as one archive in $OUT. Tokenizer files travel gzipped in .carry/tok/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/out}
WORK=/tmp/hf_reference
rm -rf "$WORK" && mkdir -p "$WORK/tok" "$WORK/fixtures"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, transformers, tokenizers, safetensors; print(torch.__version__, transformers.__version__, tokenizers.__version__, safetensors.__version__)"; which mpirun && mpirun --version | head -2; ls /usr/lib/x86_64-linux-gnu | grep -E 'libcudnn.so|libnccl.so' | head; cmake --version | head -1; ninja --version; g++ --version | head -1; } 2>&1 | tee "$WORK/fixtures/environment.txt"
for f in .carry/tok/*.json.gz; do n=$(basename "$f" .json.gz); gunzip -c "$f" > "$WORK/tok/$n.json"; done
export PYTHONUNBUFFERED=1
python3 tools/hf_reference/make_model_fixtures.py "$WORK/fixtures/qwen3_moe" 2>&1 | tee "$WORK/fixtures/model_fixtures.log"
rc1=${PIPESTATUS[0]}
python3 tools/hf_reference/make_tokenizer_goldens.py tests/fixtures/tokenizer/corpus.json "$WORK/fixtures/tokenizer" \
  qwen3="$WORK/tok/qwen3.json" deepseek_v3="$WORK/tok/deepseek_v3.json" gptoss="$WORK/tok/gptoss.json" 2>&1 | tee "$WORK/fixtures/tokenizer_goldens.log"
rc2=${PIPESTATUS[0]}
rc3=skipped
# With a mixtune binary carried in .carry/bin (and its non-system libraries in .carry/lib), check its outputs
# with Transformers: converted checkpoints load, and `score` matches on a larger random checkpoint.
if [[ -x .carry/bin/mixtune ]]; then
  LD_LIBRARY_PATH="$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python3 tools/hf_reference/verify_mixtune.py \
    .carry/bin/mixtune "$WORK/fixtures/qwen3_moe" /tmp/verify 2>&1 | tee "$WORK/fixtures/verify_mixtune.log"
  rc3=${PIPESTATUS[0]}
fi
tar czf "$OUTDIR/reference.tar.gz" -C "$WORK" fixtures
echo "model fixtures rc=$rc1 tokenizer goldens rc=$rc2 verify rc=$rc3"
