#!/usr/bin/env bash
# specgen bench on the bundled request set with Gemma 3 270M base (gemma3-270m):
# plain vs prompt lookup (k = 8) and, when the requantized draft exists,
# plain vs that draft model (k = 4). Records, CSV and the log go to
# benchmarks/results/ (git-ignored). Usage:
#   benchmarks/bench_default.sh [MAX_TOKENS] [REPEATS]
# Make the draft first (see /work/shared/BENCHMARKING.md, "A second draft"):
#   DRAFT=/tmp/models/draft-q4_0.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_TOKENS=${1:-48}
REPEATS=${2:-1}
DRAFT=${DRAFT:-/tmp/models/draft-q4_0.gguf}
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=benchmarks/results/bench-$STAMP
mkdir -p benchmarks/results
configs=(-C lookup:k=8)
if [[ -f "$DRAFT" ]]; then
  configs+=(-C "draft=$DRAFT:k=4")
fi
set -x
python -m specgen bench -m gemma3-270m "${configs[@]}" --max-tokens "$MAX_TOKENS" --repeats "$REPEATS" \
  --out "$OUT.jsonl" --csv "$OUT.csv" --json >"$OUT.json" 2>"$OUT.log"
set +x
cat "$OUT.log"
echo "summary JSON: $OUT.json · records: $OUT.jsonl · CSV: $OUT.csv"
