#!/usr/bin/env bash
# Packs what a GPU-machine call needs from a local CUDA build into .carry/gpu.tar.xz (stripped binaries
# plus the non-system shared libraries the Ubuntu GPU machine lacks), small enough to carry.
#   scripts/gpu-pack.sh BUILD_DIR
set -euo pipefail
BUILD=${1:?usage: scripts/gpu-pack.sh BUILD_DIR}
rm -rf .carry/gpu && mkdir -p .carry/gpu/bin .carry/gpu/lib
for b in mixtune mixtune_tests mixtune_bench_grouped_gemm mixtune_bench_flash_attention mixtune_bench_ssd_scan mixtune_bench_memory_kernels mixtune_bench_projections mixtune_bench_launch_gap mixtune_bench_copy_power; do
  [[ -x "$BUILD/$b" ]] && strip -o ".carry/gpu/bin/$b" "$BUILD/$b"
done
for l in libgomp.so.1 libopenblas.so.0 libonig.so.5 libutf8proc.so.2 libyaml-cpp.so.0.7 libgfortran.so.5 libquadmath.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$l" .carry/gpu/lib/
done
# The commit the binaries were built from (+dirty when the working tree had changes), for the results.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] && commit="$commit+dirty"
echo "$commit" > .carry/gpu/COMMIT
(cd .carry && tar cJf gpu.tar.xz gpu)
ls -la .carry/gpu.tar.xz
