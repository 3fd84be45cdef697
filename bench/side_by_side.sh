#!/usr/bin/env bash
# mixtune vs Transformers v5 on the same GPU, one after the other: runs `mixtune bench`, then
# bench/hf_baseline.py, with the same workload, and prints the bench/compare.py table.
#
#   bench/side_by_side.sh MIXTUNE_BIN WORKLOAD [FLAGS...] [--mixtune FLAGS...] [--hf FLAGS...]
#
# WORKLOAD: standard   12 layers, seq 4096, micro-batch 1, grad-accum 8, bf16 on both sides
#           fp32master 4 layers, seq 4096, micro-batch 1, grad-accum 8; mixtune --precision fp32-master
#                      vs HF --precision fp32-autocast (fp32 weights, bf16 autocast)
#           long       bench/longest_seq.sh for both sides (4 layers, seq 32768, 49152, 65536, ...)
#           standard2  the standard workload on 2 GPUs: mixtune launch --nproc 2 -- bench --ep 2 against
#                      torchrun --nproc-per-node 2 hf_baseline.py --fsdp2 (per-GPU figures)
#           fp32master2  standard2 with fp32 masters (mixtune fp32-master, HF FSDP2 mixed precision)
#           full8      8 GPUs (kind nvidia-h200-x8), all 48 layers: mixtune --ep 8 --recompute selective against
#                      torchrun FSDP2 (add --hf --gradient-checkpointing if the baseline runs out of memory)
#           custom     the standard defaults; give the flags you want to change
# FLAGS before any marker go to both sides (--layers --seq --micro-batch --grad-accum --steps --warmup, and
# --precision bf16); flags after --mixtune go to mixtune only (e.g. --recompute full, --balanced-router),
# after --hf to the HF baseline only (e.g. --gradient-checkpointing). A flag given explicitly replaces the
# workload's default. Defaults: --steps 5 --warmup 2.
# Output in $OUT (default bench/out): NAME-mixtune.json/.log, NAME-hf.json/.log, NAME.md (the block for
# bench/RESULTS.md), NAME-env.txt. A side that fails is recorded as failed in the table; the other still runs.
# Environment: SIDES (both | mixtune | hf), RUN_TIMEOUT_S (270 per side), NAME (file prefix, default the
# workload), BUDGET_S (long: per side, default 280 with both sides, 560 with one), LIB_DIR (prepended to
# LD_LIBRARY_PATH; default .carry/lib when it exists), PYTHON (python3). Sets NCCL_NVLS_ENABLE=0.
# Exit status: 0 when every side that ran succeeded, 1 otherwise, 2 on a usage error.
set -uo pipefail

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -lt 2 || "$1" == "-h" || "$1" == "--help" ]] && usage
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$1
WORKLOAD=$2
shift 2
PY=${PYTHON:-python3}
SIDES=${SIDES:-both}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-270}
NAME=${NAME:-$WORKLOAD}
OUTDIR=${OUT:-bench/out}
export NCCL_NVLS_ENABLE=0
case "$SIDES" in both|mixtune|hf) ;; *) echo "side_by_side: SIDES must be both, mixtune or hf, found '$SIDES'" >&2; exit 2;; esac
case "$WORKLOAD" in standard|fp32master|long|custom|standard2|fp32master2|full8) ;; *) echo "side_by_side: unknown workload '$WORKLOAD' (standard, fp32master, long, custom, standard2, fp32master2, full8)" >&2; exit 2;; esac
NPROC=1
if [[ "$WORKLOAD" == standard2 || "$WORKLOAD" == fp32master2 ]]; then NPROC=2; fi
if [[ "$WORKLOAD" == full8 ]]; then NPROC=8; fi
if [[ "$SIDES" != hf && ! -x "$BIN" ]]; then
  echo "side_by_side: mixtune binary $BIN not found or not executable" >&2; exit 2
fi
BIN_ABS=$BIN
[[ -x "$BIN" ]] && BIN_ABS=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
# The commit the results name: MIXTUNE_COMMIT, else the COMMIT file scripts/gpu-pack.sh packs beside bin/ (a
# binary run straight from its unpacked tarball), else the baseline's git HEAD (bench/compare.py's fallback).
if [[ -z "${MIXTUNE_COMMIT:-}" && -x "$BIN" && -f "$(dirname "$BIN_ABS")/../COMMIT" ]]; then
  MIXTUNE_COMMIT=$(head -c 64 "$(dirname "$BIN_ABS")/../COMMIT" | tr -cd 'A-Za-z0-9+._-')
  export MIXTUNE_COMMIT
fi
LIB_DIR=${LIB_DIR:-}
[[ -z "$LIB_DIR" && -d .carry/lib ]] && LIB_DIR=.carry/lib
if [[ -n "$LIB_DIR" ]]; then
  [[ -d "$LIB_DIR" ]] || { echo "side_by_side: LIB_DIR $LIB_DIR not found" >&2; exit 2; }
  LIB_ABS=$(cd "$LIB_DIR" && pwd)
  export LD_LIBRARY_PATH="$LIB_ABS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
mkdir -p "$OUTDIR" || { echo "side_by_side: cannot create $OUTDIR" >&2; exit 2; }
OUTDIR=$(cd "$OUTDIR" && pwd)

# Split the flags into the three sections.
COMMON=(); MIX=(); HF=(); section=common
for arg in "$@"; do
  case "$arg" in
    --mixtune) section=mix ;;
    --hf) section=hf ;;
    *) case $section in common) COMMON+=("$arg");; mix) MIX+=("$arg");; hf) HF+=("$arg");; esac ;;
  esac
done

has_flag() {  # has_flag FLAG ARGS... : is FLAG (or FLAG=...) among ARGS?
  local flag=$1; shift
  local a
  for a in "$@"; do [[ "$a" == "$flag" || "$a" == "$flag="* ]] && return 0; done
  return 1
}

# Workload defaults, applied only where the flag was not given.
declare -A DEF=([--layers]=12 [--seq]=4096 [--micro-batch]=1 [--grad-accum]=8 [--steps]=5 [--warmup]=2)
MIX_PRECISION=bf16; HF_PRECISION=bf16
if [[ "$WORKLOAD" == fp32master ]]; then
  DEF[--layers]=4; MIX_PRECISION=fp32-master; HF_PRECISION=fp32-autocast
fi
if [[ "$WORKLOAD" == fp32master2 ]]; then MIX_PRECISION=fp32-master; HF_PRECISION=fp32-autocast; fi
if [[ "$WORKLOAD" == full8 ]]; then
  DEF[--layers]=48
  has_flag --recompute "${MIX[@]}" || MIX+=(--recompute selective)
fi
if [[ $NPROC -gt 1 ]]; then
  has_flag --ep "${MIX[@]}" || MIX+=(--ep "$NPROC")
  HF+=(--fsdp2)
fi
MIX_ARGS=("${COMMON[@]}"); HF_ARGS=("${COMMON[@]}")
for flag in --layers --seq --micro-batch --grad-accum --steps --warmup; do
  has_flag "$flag" "${COMMON[@]}" "${MIX[@]}" || MIX_ARGS+=("$flag" "${DEF[$flag]}")
  has_flag "$flag" "${COMMON[@]}" "${HF[@]}" || HF_ARGS+=("$flag" "${DEF[$flag]}")
done
has_flag --precision "${COMMON[@]}" "${MIX[@]}" || MIX_ARGS+=(--precision "$MIX_PRECISION")
has_flag --precision "${COMMON[@]}" "${HF[@]}" || HF_ARGS+=(--precision "$HF_PRECISION")
MIX_ARGS+=("${MIX[@]}"); HF_ARGS+=("${HF[@]}")

{
  date -u '+%Y-%m-%dT%H:%M:%SZ'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(nvidia-smi failed)"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1
  echo "mixtune: $BIN_ABS"
} > "$OUTDIR/$NAME-env.txt"
cat "$OUTDIR/$NAME-env.txt"

FAILED=0
MJ="$OUTDIR/$NAME-mixtune.json"; HJ="$OUTDIR/$NAME-hf.json"

failure_record() {  # failure_record TOOL JSON LOG RC : make sure JSON holds a record that says why the side failed
  "$PY" - "$@" <<'EOF'
import json, os, re, sys
tool, path, log, rc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    rec = json.load(open(path))
    if not isinstance(rec, dict):
        raise ValueError("not an object")
except (OSError, ValueError):
    rec = {"tool": tool}
try:
    lines = [l.strip() for l in open(log, errors="replace") if l.strip()]
except OSError:
    lines = []
if rc in (124, 137):
    why = f"timed out (rc {rc})"
else:
    why = f"rc {rc}: " + (lines[-1][:300] if lines else "no output")
if any(re.search(r"out of memory|outofmemory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED", l, re.I)
       for l in lines[-50:]):
    rec["oom"] = True
rec["failed"] = True
rec.setdefault("error", why)
rec.setdefault("tool", tool)
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(rec, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print(f"   {tool} FAILED: {rec['error']}")
EOF
}

run_side() {  # run_side TOOL JSON LOG CMD... : runs one bench side under a timeout
  local tool=$1 json=$2 log=$3; shift 3
  rm -f "$json"
  echo "== $tool: $*"
  local t0=$SECONDS
  # CLOCK_MARKS (set by scripts/gpu-session.sh with CLOCKS=1): segment marks for bench/clock_log.py.
  [[ -n "${CLOCK_MARKS:-}" ]] && echo "$(date -u +%H:%M:%S.%N) $NAME $tool" >> "$CLOCK_MARKS"
  timeout -k 15 "$RUN_TIMEOUT_S" "$@" --json-out "$json" > "$log" 2>&1
  local rc=$?
  [[ -n "${CLOCK_MARKS:-}" ]] && echo "$(date -u +%H:%M:%S.%N) (after $NAME $tool)" >> "$CLOCK_MARKS"
  echo "   rc $rc after $(( SECONDS - t0 )) s (log $log)"
  if [[ $rc -ne 0 || ! -s "$json" ]]; then
    tail -n 5 "$log" | sed 's/^/   | /'
    failure_record "$tool" "$json" "$log" "$rc"
    FAILED=1
  fi
}

if [[ "$WORKLOAD" == long ]]; then
  if [[ "$SIDES" == both ]]; then export BUDGET_S=${BUDGET_S:-280}; else export BUDGET_S=${BUDGET_S:-560}; fi
  MJ="$OUTDIR/$NAME-mixtune.json"; HJ="$OUTDIR/$NAME-hf.json"
  LONG_MIX=("${COMMON[@]}" "${MIX[@]}"); LONG_HF=("${COMMON[@]}" "${HF[@]}")
  if [[ "$SIDES" != hf ]]; then
    echo "== mixtune longest sequence (budget ${BUDGET_S}s)"
    OUT="$OUTDIR" TAG="$NAME-mixtune" "$HERE/longest_seq.sh" "$BIN_ABS" "${LONG_MIX[@]}" || FAILED=1
  fi
  if [[ "$SIDES" != mixtune ]]; then
    echo "== Transformers longest sequence (budget ${BUDGET_S}s)"
    OUT="$OUTDIR" TAG="$NAME-hf" "$HERE/longest_seq.sh" hf "${LONG_HF[@]}" || FAILED=1
  fi
  CMD_M="bench/longest_seq.sh $(printf '%q ' "$BIN" "${LONG_MIX[@]}")"
  CMD_H="bench/longest_seq.sh hf $(printf '%q ' "${LONG_HF[@]}")"
else
  MIX_CMD=("$BIN_ABS" bench --preset qwen3-30b-a3b "${MIX_ARGS[@]}")
  HF_CMD=("$PY" "$HERE/hf_baseline.py" "${HF_ARGS[@]}")
  if [[ $NPROC -gt 1 ]]; then
    MIX_CMD=("$BIN_ABS" launch --nproc "$NPROC" -- bench --preset qwen3-30b-a3b "${MIX_ARGS[@]}")
    HF_CMD=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" "$HERE/hf_baseline.py" "${HF_ARGS[@]}")
  fi
  [[ "$SIDES" != hf ]] && run_side mixtune "$MJ" "$OUTDIR/$NAME-mixtune.log" "${MIX_CMD[@]}"
  [[ "$SIDES" != mixtune ]] && run_side transformers "$HJ" "$OUTDIR/$NAME-hf.log" "${HF_CMD[@]}"
  CMD_M="$(printf '%q ' "${MIX_CMD[@]}")"
  CMD_H="$(printf '%q ' "${HF_CMD[@]}")"
fi

"$PY" "$HERE/compare.py" "$MJ" "$HJ" --markdown --title "$NAME" --command-a "${CMD_M% }" --command-b "${CMD_H% }" \
  > "$OUTDIR/$NAME.md" || FAILED=1
echo
"$PY" "$HERE/compare.py" "$MJ" "$HJ" || FAILED=1
echo
echo "markdown block for bench/RESULTS.md: $OUTDIR/$NAME.md"
exit $FAILED
