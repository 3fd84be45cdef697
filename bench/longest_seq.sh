#!/usr/bin/env bash
# Longest trainable sequence of one side: a wrapper of bench/longest_seq.py (search to 1,024 tokens over the
# side's configurations; see that file), kept for the command line of earlier sessions.
#
#   bench/longest_seq.sh SIDE [EXTRA_ARGS...]
#
# SIDE is the path of the mixtune binary (configurations --recompute full, selective, none) or `hf`
# (Transformers, gradient checkpointing on, off). EXTRA_ARGS go to every try of that side; a --recompute or
# --gradient-checkpointing among them searches that one configuration only, e.g.
#   bench/longest_seq.sh build/mixtune --recompute full
#   bench/longest_seq.sh hf --gradient-checkpointing
# Output in $OUT (default bench/out): TAG-CONFIG-SEQ.json/.log per try and TAG.json, the summary that
# bench/compare.py reads. Exit status 0 when every configuration converged, else 1 (2 on a usage error).
# Environment: LAYERS (4), CONFIGS (comma-separated: full,selective,none | on,off), RUN_TIMEOUT_S (240, per try),
# BUDGET_S (270 for the side), TAG (longest-mixtune / longest-hf), PYTHON (python3), OUT. SEQS (a fixed list
# of lengths) is gone: the search picks the lengths.
set -uo pipefail
if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
[[ -n "${SEQS:-}" ]] && { echo "longest_seq: SEQS is gone: bench/longest_seq.py searches; set CONFIGS, LAYERS, BUDGET_S" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
SIDE=$1
shift
[[ $# -gt 0 && "$1" == "--" ]] && shift
ARGS=()
if [[ "$SIDE" == hf ]]; then ARGS=(--side hf); else ARGS=(--side mixtune --bin "$SIDE"); fi
[[ -n "${CONFIGS:-}" ]] && ARGS+=(--configs "$CONFIGS")
exec "${PYTHON:-python3}" "$HERE/longest_seq.py" "${ARGS[@]}" -- "$@"
