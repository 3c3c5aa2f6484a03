#!/usr/bin/env bash
# Build, test and measure the tensor-core GEMM on a GPU: build (B12X_CUDA_ARCHS, default 90), its GPU tests (linear
# and the grouped MoE), then the per-layer benchmark with the arguments given (e.g. --formats NVFP4 --ms 1,32 --sweep).
# MOE="args" runs benchmarks/moe.py with them (e.g. MOE="--shapes qwen3 --cases MXFP4:bf16"). Logs under OUT.
#   bash tools/mma_bench.sh OUT [benchmark args...]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: tools/mma_bench.sh OUT [benchmark args]}"
shift
mkdir -p "$out"
export CMAKE_BUILD_PARALLEL_LEVEL=16 B12X_CUDA_ARCHS="${B12X_CUDA_ARCHS:-90}" PYTHONUNBUFFERED=1
start=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps --no-cache-dir ./packages/b12x-kernels > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src:$PWD/benchmarks"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider --timeout 300 tests/kernels/test_mma_gemm.py tests/kernels/test_mma_moe.py ${TESTS_EXTRA:-} > "$out/tests.log" 2>&1
  echo "tests: exit $? after $(( $(date +%s) - start )) s"; grep -E "passed|failed|Error" "$out/tests.log" | tail -15
fi
if [ "$#" -gt 0 ]; then
  python3 benchmarks/mma_linear.py --out "$out/mma.json" "$@" 2>&1 | tee "$out/bench.log"
fi
if [ -n "${MOE:-}" ]; then
  python3 benchmarks/moe.py --out "$out/moe.json" --png "$out/moe.png" $MOE 2>&1 | tee "$out/moe.log"
fi
echo "total: $(( $(date +%s) - start )) s"
if [ -n "${PROFILE:-}" ]; then
  ncu --clock-control none -k regex:mma_gemm --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section SchedulerStats --section LaunchStats python3 benchmarks/mma_profile.py $PROFILE > "$out/ncu.log" 2>&1
  echo "ncu: exit $?"; grep -E "mma_gemm_kernel|DRAM Throughput|Duration|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall|No Eligible|Warp Cycles Per Issued" "$out/ncu.log" | head -80
fi
if [ -n "${SANITIZE:-}" ]; then
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool $tool python3 benchmarks/sanitize_mma.py > "$out/sanitize_$tool.log" 2>&1
    echo "sanitizer $tool: exit $? $(tail -2 "$out/sanitize_$tool.log" | tr '\n' ' ')"
  done
fi
