#!/usr/bin/env bash
# Test a tree on a GPU, then optionally sanitize and measure it (after kernel changes):
#   bash tools/gpu_bench.sh OUT_DIR [--bench] [--sanitize]
# GPU tests (tools/gpu_tests.sh), then optionally compute-sanitizer memcheck over every CUDA path and the
# benchmarks (prefill dispatched table and plot, the plan check with its measured table, tile configurations,
# fused MoE). Logs and results go to OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: tools/gpu_bench.sh OUT_DIR [--bench] [--sanitize]}"
shift
mkdir -p "$out"
bash tools/gpu_tests.sh -q --timeout 300 > "$out/gpu_tests.log" 2>&1
echo "gpu tests: exit $? ($(grep -cE '^(FAILED|ERROR)' "$out/gpu_tests.log") failed or errors)"
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src:$PWD/benchmarks"
for arg in "$@"; do
  case "$arg" in
    --sanitize)
      compute-sanitizer --tool memcheck python3 benchmarks/sanitize_decode.py > "$out/sanitize.log" 2>&1
      echo "sanitizer: $(tail -1 "$out/sanitize.log")" ;;
    --bench)
      python3 benchmarks/prefill_linear.py --out "$out/prefill.json" --png "$out/prefill.png" > "$out/prefill.log" 2>&1
      python3 benchmarks/plan_check.py --out "$out/plan_check.json" --png "$out/plan_check.png" \
        --emit-table "$out/timings.json" > "$out/plan_check.log" 2>&1
      python3 benchmarks/prefill_linear.py --tile-configs --out "$out/tiles.json" > "$out/tiles.log" 2>&1
      python3 benchmarks/moe.py --out "$out/moe.json" --png "$out/moe.png" > "$out/moe.log" 2>&1
      echo "benchmarks: $(ls "$out")" ;;
  esac
done
