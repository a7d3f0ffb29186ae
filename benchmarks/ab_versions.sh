#!/bin/bash
# Two checkouts of specgen side by side (interleaved, 3 repeats): decode tok/s of
# `specgen run` plain and with prompt lookup on the copy-heavy prompt, 128 tokens, 2 threads,
# on Gemma 3 270M base (no chat template: raw completion in every version).
#   git worktree add --detach /tmp/old REV; bash benchmarks/ab_versions.sh /tmp/old "$PWD"
set -euo pipefail
P="$(cd "$(dirname "$0")" && pwd)/prompts/copy_code.txt"
for rep in 1 2 3; do
  for tree in "$1" "$2"; do
    for mode in --no-spec --lookup; do
      out=$(cd /tmp && PYTHONPATH="$tree" python -m specgen run -m gemma3-270m -f "$P" -n 128 -t 2 -c 2048 --ignore-eos --json $mode < /dev/null 2>/dev/null)
      echo "$tree $mode $(echo "$out" | python -c 'import json,sys; o=json.load(sys.stdin); print(round(o["timings"]["tokens_per_s"],1), o["spec"]["k_hist"])')"
    done
  done
done
