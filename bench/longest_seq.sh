#!/usr/bin/env bash
# Longest sequence one side can train: 4 layers, micro-batch 1, grad-accum 1, 2 timed steps after 1 warm-up,
# trying seq 32768, 49152, 65536, 98304, 131072, 196608, ... until a run fails (OOM, timeout or error).
#
#   bench/longest_seq.sh SIDE [EXTRA_ARGS...]
#
# SIDE is the path of the mixtune binary (runs `SIDE bench --preset qwen3-30b-a3b ...`) or `hf`
# (runs `python3 bench/hf_baseline.py ...`). EXTRA_ARGS go to that side unchanged, e.g.
#   bench/longest_seq.sh build/mixtune --recompute full
#   bench/longest_seq.sh hf --gradient-checkpointing
# Output in $OUT (default bench/out): TAG-SEQ.json / TAG-SEQ.log per attempt and TAG.json, the summary
# {"kind": "longest_seq", "tool", "longest_seq", "best": <record of that run>, "stopped_by", "attempts"}
# that bench/compare.py reads. Prints the summary. Exit status 0 when at least one length trained, else 1
# (2 on a usage error).
# Environment: LAYERS (4), SEQS (space-separated lengths), RUN_TIMEOUT_S (240, per attempt),
# BUDGET_S (560: no attempt starts after that many seconds, and an attempt's timeout is cut to what is
# left, so one call stays under 10 minutes), TAG (longest-mixtune / longest-hf), PYTHON (python3).
set -uo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
SIDE=$1
shift
[[ $# -gt 0 && "$1" == "--" ]] && shift
EXTRA=("$@")
PY=${PYTHON:-python3}
LAYERS=${LAYERS:-4}
SEQS=${SEQS:-"32768 49152 65536 98304 131072 196608 262144 393216 524288 786432 1048576"}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-240}
BUDGET_S=${BUDGET_S:-560}
OUTDIR=${OUT:-bench/out}
mkdir -p "$OUTDIR" || { echo "longest_seq: cannot create $OUTDIR" >&2; exit 2; }
OUTDIR=$(cd "$OUTDIR" && pwd)

if [[ "$SIDE" == "hf" ]]; then
  TOOL=transformers
  TAG=${TAG:-longest-hf}
  [[ -f "$HERE/hf_baseline.py" ]] || { echo "longest_seq: $HERE/hf_baseline.py not found" >&2; exit 2; }
else
  TOOL=mixtune
  TAG=${TAG:-longest-mixtune}
  [[ -x "$SIDE" ]] || { echo "longest_seq: mixtune binary $SIDE not found or not executable" >&2; exit 2; }
fi

side_command() {  # side_command SEQ JSON -> fills CMD
  local seq=$1 json=$2
  local common=(--layers "$LAYERS" --seq "$seq" --micro-batch 1 --grad-accum 1 --steps 2 --warmup 1 --json-out "$json")
  if [[ "$TOOL" == transformers ]]; then
    CMD=("$PY" "$HERE/hf_baseline.py" "${common[@]}" "${EXTRA[@]}")
  else
    CMD=("$SIDE" bench --preset qwen3-30b-a3b "${common[@]}" "${EXTRA[@]}")
  fi
}

# classify JSON LOG RC -> ok | oom | timeout | error  (same rules as the summary below)
classify() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import json, re, sys
path, log, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    rec = json.load(open(path))
except (OSError, ValueError):
    rec = {}
text = ""
try:
    text = open(log, errors="replace").read()[-20000:]
except OSError:
    pass
tps = rec.get("tokens_per_s_per_gpu")
if rc == 0 and not rec.get("oom") and not rec.get("error") and isinstance(tps, (int, float)) and tps > 0:
    print("ok")
elif rec.get("oom") or re.search(r"out of memory|outofmemory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
                                 r"|\bOOM\b", text, re.I):
    print("oom")
elif rc in (124, 137):
    print("timeout")
else:
    print("error")
EOF
}

START=$SECONDS
ATTEMPTS_FILE="$OUTDIR/$TAG.attempts"
: > "$ATTEMPTS_FILE"
STOP_STATUS=exhausted
STOP_SEQ=""
for seq in $SEQS; do
  left=$(( BUDGET_S - (SECONDS - START) ))
  if (( left < 30 )); then STOP_STATUS=budget; STOP_SEQ=$seq; echo "== seq $seq: time budget spent, stopping"; break; fi
  limit=$(( left < RUN_TIMEOUT_S ? left : RUN_TIMEOUT_S ))
  json="$OUTDIR/$TAG-$seq.json"
  log="$OUTDIR/$TAG-$seq.log"
  rm -f "$json"
  side_command "$seq" "$json"
  echo "== seq $seq (timeout ${limit}s): ${CMD[*]}"
  t0=$SECONDS
  timeout -k 15 "$limit" "${CMD[@]}" > "$log" 2>&1
  rc=$?
  wall=$(( SECONDS - t0 ))
  st=$(classify "$json" "$log" "$rc")
  echo "$seq $st $rc $wall" >> "$ATTEMPTS_FILE"
  echo "   -> $st (rc $rc, ${wall}s)"
  if [[ "$st" != ok ]]; then
    tail -n 5 "$log" | sed 's/^/   | /'
    STOP_STATUS=$st; STOP_SEQ=$seq
    break
  fi
done

side_command SEQ "$OUTDIR/$TAG-SEQ.json"
TEMPLATE=$(printf '%q ' "${CMD[@]}")
"$PY" - "$OUTDIR" "$TAG" "$TOOL" "$LAYERS" "$STOP_STATUS" "$STOP_SEQ" "$ATTEMPTS_FILE" "$TEMPLATE" "${EXTRA[@]}" <<'EOF'
import json, os, sys
outdir, tag, tool, layers, stop_status, stop_seq, attempts_file, template = sys.argv[1:9]
extra = sys.argv[9:]
attempts, best, longest = [], None, None
for line in open(attempts_file):
    seq, st, rc, wall = line.split()
    a = {"seq": int(seq), "status": st, "rc": int(rc), "wall_s": int(wall)}
    try:
        rec = json.load(open(os.path.join(outdir, f"{tag}-{seq}.json")))
    except (OSError, ValueError):
        rec = None
    if rec:
        for k in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "peak_allocated_bytes", "peak_reserved_bytes",
                  "error"):
            if k in rec:
                a[k] = rec[k]
    attempts.append(a)
    if st == "ok":
        longest, best = int(seq), rec
summary = {
    "kind": "longest_seq", "tool": tool, "layers": int(layers), "micro_batch": 1, "grad_accum": 1,
    "steps": 2, "warmup": 1, "extra_args": extra, "longest_seq": longest, "best": best,
    "stopped_by": {"status": stop_status, "seq": int(stop_seq) if stop_seq else None},
    "attempts": attempts, "command": template.strip(),
}
for k in ("commit", "gpu", "transformers_version", "torch_version"):
    if best and k in best:
        summary[k] = best[k]
if not longest:
    summary["failed"] = True
    summary["error"] = f"no length trained (first attempt: {attempts[0]['status'] if attempts else 'none'})"
tmp = os.path.join(outdir, tag + ".json.tmp")
with open(tmp, "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
os.replace(tmp, os.path.join(outdir, tag + ".json"))
print(f"{tool}: longest seq trained = {longest} (stopped by {stop_status}"
      + (f" at {stop_seq}" if stop_seq else "") + ")")
if best:
    print(f"  at that seq: {best.get('tokens_per_s_per_gpu', 0):,.0f} tokens/s, "
          f"{best.get('model_tflops_per_gpu', 0):.1f} model TFLOP/s, "
          f"peak allocated {best.get('peak_allocated_bytes', 0) / 2**30:.1f} GiB")
sys.exit(0 if longest else 1)
EOF
