#!/bin/bash
# Two checkouts of specgen side by side (interleaved, REPEATS rounds): decode tok/s of
# `specgen run -m MODEL` (raw completion in every version) plain and with prompt lookup on the copy-heavy prompt, N tokens, THREADS threads.
#   git worktree add --detach ../specgen-old REV
#   bash benchmarks/ab_versions.sh ../specgen-old .
#   MODEL=qwen2.5-coder-1.5b MODES=--draft=qwen2.5-coder-0.5b bash benchmarks/ab_versions.sh ../specgen-old .
# Environment: N (tokens, 128), REPEATS (3), MODES (a space-separated list, "--no-spec --lookup"), THREADS (2), MODEL (gemma3-270m).
set -euo pipefail
usage="usage: bash benchmarks/ab_versions.sh OLD_CHECKOUT NEW_CHECKOUT  (env: N, REPEATS, MODES, THREADS)"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,7p' "$0" | cut -c3-
  echo "$usage"
  exit 0
fi
if [[ $# -ne 2 ]]; then
  echo "$usage" >&2
  exit 2
fi
roots=()
for tree in "$1" "$2"; do
  if [[ ! -f "$tree/specgen/__init__.py" ]]; then
    echo "ab_versions: $tree holds no specgen checkout" >&2
    exit 2
  fi
  roots+=("$(cd "$tree" && pwd)")
done
P="$(cd "$(dirname "$0")" && pwd)/prompts/copy_code.txt"
N=${N:-128}
REPEATS=${REPEATS:-3}
MODES=${MODES:---no-spec --lookup}
THREADS=${THREADS:-2}
MODEL=${MODEL:-gemma3-270m}
for rep in $(seq "$REPEATS"); do
  for root in "${roots[@]}"; do
    for mode in $MODES; do
      # run from the checkout itself: `python -m specgen` imports the working directory's specgen first
      if ! out=$(cd "$root" && PYTHONPATH="$root" python -m specgen run -m "$MODEL" -f "$P" -n "$N" -t "$THREADS" -c 2048 --ignore-eos \
                 --json $mode < /dev/null 2>/dev/null); then
        echo "ab_versions: specgen run $mode failed in $root" >&2
        exit 1
      fi
      echo "$root $mode $(echo "$out" | python -c 'import json,sys; o=json.load(sys.stdin); print(round(o["timings"]["tokens_per_s"],1), o["spec"]["k_hist"])')"
    done
  done
done
