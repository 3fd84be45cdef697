#!/usr/bin/env bash
# Compiles the Hopper (sm_90a) wgmma kernels with ptxas verbose output and fails when ptxas serialises their
# wgmma instructions (any info C751x "Potential Performance Loss": C7518, a wgmma or wgmma wait inside a
# branch ptxas cannot prove warpgroup-uniform — the grouped wgrad ran that way unnoticed from session 4 to 8;
# C7515, a non-wgmma write of accumulator registers inside the pipeline — the wgrad again, sessions 4 to 9,
# because this check looked for C7518 only) or when a kernel spills registers.
#   scripts/check-sm90-ptxas.sh NVCC SOURCE_DIR
# Registered as the ctest `ptxas_sm90_kernels` when the CUDA backend is built (CMakeLists.txt).
set -uo pipefail
NVCC=${1:?usage: check-sm90-ptxas.sh NVCC SOURCE_DIR}
SRC=${2:?usage: check-sm90-ptxas.sh NVCC SOURCE_DIR}
files=(grouped_gemm_sm90 grouped_gemm_wgrad_sm90 flash_attention_fwd_sm90 flash_attention_bwd_sm90
       flash_attention_bwd_sm90_mla)
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
rc=0
for f in "${files[@]}"; do
  src="$SRC/src/kernels/cuda/$f.cu"
  [[ -f "$src" ]] || { echo "check-sm90-ptxas: $src not found" >&2; exit 2; }
  if ! "$NVCC" -std=c++20 -O3 -DNDEBUG -DFMT_HEADER_ONLY=1 -DMIXTUNE_HAVE_CUDA=1 -I"$SRC/src" \
      --generate-code=arch=compute_90a,code=sm_90a -Xptxas -v -c "$src" -o "$tmp/$f.o" > "$tmp/$f.log" 2>&1; then
    echo "check-sm90-ptxas: $f.cu does not compile:" >&2; tail -20 "$tmp/$f.log" >&2; exit 2
  fi
  ok=1
  if grep -qE "C751[0-9]" "$tmp/$f.log"; then
    echo "$f.cu: ptxas serialises wgmma:"; grep -E "C751[0-9]" "$tmp/$f.log" | sed 's/^/  /'; ok=0
  fi
  spills=$(grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$tmp/$f.log" | head -3)
  if [[ -n "$spills" ]]; then echo "$f.cu: register spills:"; echo "$spills" | sed 's/^/  /'; ok=0; fi
  kernels=$(grep -c "Compiling entry function" "$tmp/$f.log")
  if [[ $ok -eq 1 ]]; then echo "$f.cu: $kernels kernels, no wgmma serialisation, no spills"; else rc=1; fi
done
exit $rc
