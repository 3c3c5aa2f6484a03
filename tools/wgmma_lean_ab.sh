#!/usr/bin/env bash
# One device call for the experimental lean wgmma kernel (B12X_WGMMA_LEAN, csrc/wgmma_common.cuh: the same copies
# and wgmmas from 16-20% fewer instructions a K chunk, by SASS): builds the default and the lean sm_90 wheels, runs
# the wgmma GPU tests on the lean one, then times benchmarks/wgmma_linear.py on each build in turn (same call; bf16
# F.linear in each run). Only if the lean build is never slower may it become the default (delete the switch then).
#   bash tools/wgmma_lean_ab.sh OUT [wgmma_linear.py arguments]
# OUT gets build_{default,lean}.log, tests.log, wgmma_{default,lean}.{json,log}.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: tools/wgmma_lean_ab.sh OUT [wgmma_linear.py arguments]}"
shift
mkdir -p "$out"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
source tools/device_env.sh
export PYTHONUNBUFFERED=1 B12X_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=16
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--formats NVFP4,FP8,Q8_0 --ms 16,32,64,128,256 --replays 20)
for build in default lean; do
  flag=OFF
  [ "$build" = lean ] && flag=ON
  B12X_WGMMA_LEAN=$flag python3 -m pip wheel -q --no-build-isolation --no-deps --no-cache-dir -w "/tmp/whl_$build" \
    ./packages/b12x-kernels > "$out/build_$build.log" 2>&1
  say "build $build: exit $?"
done
for build in lean default; do  # the lean build's tests first, then each build's timings
  python3 -m pip install -q --no-deps --force-reinstall /tmp/whl_$build/*.whl >> "$out/build_$build.log" 2>&1
  (cd /tmp && python3 -c "import b12x_kernels as k; print('$build build, wgmma_lean =', k.wgmma_lean())")
  if [ "$build" = lean ]; then
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 --timeout 200 tests/kernels/test_wgmma_gemm.py \
      > "$out/tests.log" 2>&1
    say "lean tests: exit $?"; grep -E "passed|failed|^FAILED" "$out/tests.log" | tail -8
  fi
  timeout 200 python3 benchmarks/wgmma_linear.py --out "$out/wgmma_$build.json" --png "" "${args[@]}" \
    > "$out/wgmma_$build.log" 2>&1
  say "wgmma_linear, $build build: exit $?"; grep -E "^M=" "$out/wgmma_$build.log" | cut -c1-150
done
