#!/usr/bin/env bash
# One GPU-machine call: unpack the carried binaries, run the CUDA differential and training tests,
# then the requested side-by-side benchmarks against Transformers v5. Everything lands in $OUT.
#
#   scripts/gpu-session.sh CARRY_TARBALL STAGE...
#
# CARRY_TARBALL: .carry/gpu.tar.xz made by scripts/gpu-pack.sh (bin/ with mixtune, mixtune_tests and the
# kernel benches, lib/ with the non-system shared libraries they need).
# STAGES: tests (Cuda* gtests) | standard | fp32master | long | mixtune-standard (mixtune side only) |
#         kernels (grouped GEMM + flash-attention microbenchmarks)
set -uo pipefail
[[ $# -lt 2 ]] && { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
TARBALL=$1
shift
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
G=/tmp/mixtune-gpu
rm -rf "$G" && mkdir -p "$G" && tar xJf "$TARBALL" -C "$G" || { echo "cannot unpack $TARBALL" >&2; exit 2; }
BIN=$G/gpu/bin
export LIB_DIR=$G/gpu/lib
export LD_LIBRARY_PATH="$LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
rc=0
for stage in "$@"; do
  echo "=== stage $stage ($(date -u +%H:%M:%S))"
  case "$stage" in
    tests) GTEST_FILTER=${GTEST_FILTER:-Cuda*} bash scripts/gpu-check.sh "$BIN" "$LIB_DIR" 2>&1 | tee "$OUT/tests.log" \
             | tail -60 || rc=1 ;;
    standard|fp32master|long) OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" "$stage" || rc=1 ;;
    mixtune-standard) SIDES=mixtune NAME=mixtune-standard OUT=$OUT bash bench/side_by_side.sh "$BIN/mixtune" standard || rc=1 ;;
    kernels) "$BIN/mixtune_bench_grouped_gemm" > "$OUT/grouped_gemm.json" 2>&1; "$BIN/mixtune_bench_flash_attention" \
               > "$OUT/flash_attention.json" 2>&1; tail -5 "$OUT"/grouped_gemm.json "$OUT"/flash_attention.json ;;
    *) echo "unknown stage $stage" >&2; rc=2 ;;
  esac
done
# One archive comes back more reliably than many small files (the device tool limits the file count).
(cd "$OUT" && tar czf /tmp/gpu-session.tgz --exclude=gpu-session.tgz . && find . -type f ! -name '*.md' -delete \
  && mv /tmp/gpu-session.tgz .)
ls -la "$OUT"
exit $rc
