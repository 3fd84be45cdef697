#!/usr/bin/env bash
# Runs the CUDA differential tests on a GPU machine and prints a summary. Builds nothing.
#
#   scripts/gpu-check.sh BUILD_DIR [LIB_DIR] [-- extra gtest args]
#
# BUILD_DIR holds mixtune_tests (a Debian-built binary carried to the GPU machine is fine: see
# docs in /work/shared/reference/data-and-deps.md §1.3). LIB_DIR (optional) holds carried non-system
# shared libraries (e.g. libonig.so.5); it is put first on LD_LIBRARY_PATH, as
# tools/hf_reference/run_reference.sh does with .carry/lib. CUDA libraries resolve from
# /usr/local/cuda/lib64 through the binary's rpath.
# Exit status: 0 when every Cuda* test ran and passed; 1 on a failure, a crash, or a skipped test
# (on a GPU machine a skip means the device was not usable); 2 on a usage or setup problem.
# Environment: GTEST_FILTER overrides the default filter 'Cuda*'.
set -uo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
BUILD=$1
shift
LIBDIR=""
if [[ $# -gt 0 && "$1" != "--" ]]; then LIBDIR=$1; shift; fi
[[ $# -gt 0 && "$1" == "--" ]] && shift
BIN="$BUILD/mixtune_tests"
if [[ ! -x "$BIN" ]]; then echo "gpu-check: $BIN not found or not executable" >&2; exit 2; fi
if [[ -n "$LIBDIR" ]]; then
  [[ -d "$LIBDIR" ]] || { echo "gpu-check: library directory $LIBDIR not found" >&2; exit 2; }
  export LD_LIBRARY_PATH="$(cd "$LIBDIR" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

echo "== device"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(nvidia-smi failed)"
missing=$(ldd "$BIN" 2>&1 | grep "not found" || true)
if [[ -n "$missing" ]]; then
  echo "gpu-check: $BIN has unresolved shared libraries (carry them in LIB_DIR):" >&2
  echo "$missing" >&2
  exit 2
fi
echo "cuBLASLt: $(ldd "$BIN" | grep -o 'libcublasLt[^ ]* => [^ ]*' || echo 'not linked')"

LOG=$(mktemp /tmp/gpu-check.XXXXXX.log)
echo "== tests (${GTEST_FILTER:-Cuda*}), log: $LOG"
start=$(date +%s)
"$BIN" --gtest_filter="${GTEST_FILTER:-Cuda*}" --gtest_color=no "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
secs=$(( $(date +%s) - start ))

passed=$(grep -c '^\[       OK \]' "$LOG")
# Each failed/skipped test appears twice (inline with its time, and in the final list): strip the time.
failed=$(grep '^\[  FAILED  \] [A-Za-z]' "$LOG" | sed 's/ ([0-9]* ms)$//' | sort -u)
skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' "$LOG" | sed 's/ ([0-9]* ms)$//' | sort -u)
nfailed=$(printf '%s' "$failed" | grep -c . || true)
nskipped=$(printf '%s' "$skipped" | grep -c . || true)
echo
echo "== summary: $passed passed, $nfailed failed, $nskipped skipped in ${secs}s (exit $rc)"
[[ -n "$failed" ]] && echo "$failed"
[[ -n "$skipped" ]] && echo "$skipped"
grep -E 'max-norm error|rel-L2 error' "$LOG" | head -40
if [[ $rc -ne 0 || $nfailed -ne 0 ]]; then exit 1; fi
if [[ $nskipped -ne 0 ]]; then echo "gpu-check: tests were skipped: no usable GPU?" >&2; exit 1; fi
if [[ $passed -eq 0 ]]; then echo "gpu-check: no test matched" >&2; exit 1; fi
exit 0
