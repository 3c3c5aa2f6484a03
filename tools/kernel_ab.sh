#!/usr/bin/env bash
# A kernel change against the kernels it replaces, in one run on a GPU: builds b12x-kernels twice in parallel (the
# working tree's, and the same package with the CUDA sources in BASE_CSRC), then runs each command once a build,
# the base build first. In a command, {ab} is "base" or "new" (name the output files by it); a command without {ab}
# runs once, on the new build. Benchmarks then time both kernels in the same run against the same bf16 baseline.
#   git archive HEAD packages/b12x-kernels/csrc | tar -x -C .ab    # the base sources (.ab is git-ignored)
#   bash tools/kernel_ab.sh .ab/packages/b12x-kernels/csrc "python3 benchmarks/mma_linear.py --out \$OUT/x_{ab}.json"
# The GPU machine's copy of the tree carries .ab (and .whl for the tests' wheels). The new build's wheel is left in
# /tmp/ab_new for tools/gpu_tests.sh (B12X_WHEEL) and installed; the base build goes to /tmp/ab_base, first on
# PYTHONPATH while its commands run. B12X_CUDA_ARCHS defaults to 90.
set -euo pipefail
cd "$(dirname "$0")/.."
base_csrc="${1:?usage: tools/kernel_ab.sh BASE_CSRC COMMAND...}"
shift
source tools/gpu_env.sh
export B12X_CUDA_ARCHS="${B12X_CUDA_ARCHS:-90}" CMAKE_BUILD_PARALLEL_LEVEL=8 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
rm -rf /tmp/ab_pkg /tmp/ab_base /tmp/ab_new
cp -r packages/b12x-kernels /tmp/ab_pkg
rm -rf /tmp/ab_pkg/build /tmp/ab_pkg/csrc
cp -r "$base_csrc" /tmp/ab_pkg/csrc
wheel() { python3 -m pip wheel -q --no-build-isolation --no-deps --no-cache-dir -w "$2" "$1" > "$2.log" 2>&1; }
wheel /tmp/ab_pkg /tmp/ab_base_whl & base_pid=$!
wheel ./packages/b12x-kernels /tmp/ab_new & new_pid=$!
wait $base_pid || { cat /tmp/ab_base_whl.log; exit 1; }
wait $new_pid || { cat /tmp/ab_new.log; exit 1; }
echo "both builds: $(( $(date +%s) - start )) s"
python3 -m pip install -q --no-deps --no-cache-dir --force-reinstall /tmp/ab_new/b12x_kernels-*.whl
python3 -m pip install -q --no-deps --no-cache-dir --target /tmp/ab_base /tmp/ab_base_whl/b12x_kernels-*.whl
for cmd in "$@"; do
  runs="base new"
  [[ "$cmd" == *"{ab}"* ]] || runs="new"  # without {ab}: once, on the new build (its tests, say)
  for ab in $runs; do
    echo "== $ab: ${cmd//\{ab\}/$ab}"
    if [ $ab = base ]; then
      PYTHONPATH="/tmp/ab_base:$PYTHONPATH" bash -c "${cmd//\{ab\}/$ab}" || echo "exit $? ($ab)"
    else
      bash -c "${cmd//\{ab\}/$ab}" || echo "exit $? ($ab)"
    fi
  done
done
