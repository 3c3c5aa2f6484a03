#!/usr/bin/env bash
# (Run from the repository root as call1.sh, with decide.py = docs/results/ab_decide_h200_2026-12-05.py beside it.)
# Session 28, call 1: four builds (base = HEAD; lean = +B12X_LEAN_CHUNK; wg = lean + B12X_OUTLINED_EPILOGUE;
# all = wg + B12X_IQ2_REPLICAS 8), the A/Bs, IQ2's CUDA decode pass timed, the decision (decide.py), the final wheel.
set -uo pipefail
t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
exec > >(tee -a "$OUT/call1.log") 2>&1
R=/tmp/r1; rm -rf $R; mkdir -p $R
source tools/device_env.sh
export PYTHONUNBUFFERED=1 B12X_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=5
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
(while sleep 1; do echo "$(date +%s),$(nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader,nounits)"; done > "$R/clocks1.csv" 2>/dev/null) &
clock_log=$!; trap 'kill $clock_log 2>/dev/null' EXIT
declare -A defines=(
  [base]=""
  [lean]="wgmma_gemm.cu:B12X_LEAN_CHUNK 1"
  [wg]="wgmma_gemm.cu:B12X_LEAN_CHUNK 1;wgmma_gemm.cu:B12X_OUTLINED_EPILOGUE 1"
  [all]="wgmma_gemm.cu:B12X_LEAN_CHUNK 1;wgmma_gemm.cu:B12X_OUTLINED_EPILOGUE 1;mma_gemm.cuh:B12X_IQ2_REPLICAS 8"
)
pids=()
for v in base lean wg all; do
  rm -rf /tmp/pkg_$v /tmp/whl_$v /tmp/site_$v; cp -r packages/b12x-kernels /tmp/pkg_$v; rm -rf /tmp/pkg_$v/build
  IFS=';' read -ra defs <<< "${defines[$v]}"
  for d in "${defs[@]}"; do sed -i "1i #define ${d#*:}" "/tmp/pkg_$v/csrc/${d%%:*}"; done
  head -3 /tmp/pkg_$v/csrc/wgmma_gemm.cu | grep define; head -2 /tmp/pkg_$v/csrc/mma_gemm.cuh | grep define
  (python3 -m pip wheel -q --no-build-isolation --no-deps --no-cache-dir -w /tmp/whl_$v /tmp/pkg_$v > /tmp/whl_$v.log 2>&1 \
    && python3 -m pip install -q --no-deps --no-cache-dir --target /tmp/site_$v /tmp/whl_$v/b12x_kernels-*.whl) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p || echo "a build failed"; done
for v in base lean wg all; do ls /tmp/site_$v/b12x_kernels/_C*.so > /dev/null 2>&1 || { echo "no build: $v"; tail -30 /tmp/whl_$v.log; }; done
say "builds"
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src:$PWD/benchmarks:$PYTHONPATH"
on() { local v=$1; shift; PYTHONPATH="/tmp/site_$v:$PYTHONPATH" "$@"; }
for v in base lean wg; do
  on $v timeout 110 python3 benchmarks/wgmma_linear.py --formats NVFP4,FP8,IQ2_XS --ms 64,256,512,1024,4096 --no-ws --wide --replays 20 --out "$R/wgmma_$v.json" > "$R/wgmma_$v.log" 2>&1
  say "wgmma $v: exit $?"; tail -4 "$R/wgmma_$v.log"
done
for v in wg all; do
  on $v timeout 60 python3 benchmarks/mma_linear.py --model 8b --per-linear --formats IQ2_XS,IQ2_XXS --ms 1,4,8 --out "$R/replicas_$v.json" > "$R/replicas_$v.log" 2>&1
  say "replicas $v: exit $?"
done
on base timeout 50 python3 benchmarks/decode_pass.py --formats IQ2_XS,IQ2_XXS --programs 16x1x4,cuda --out "$R/decode_pass_iq2.json" > "$R/decode_pass_iq2.log" 2>&1
say "decode pass: exit $?"; tail -8 "$R/decode_pass_iq2.log"
python3 decide.py "$R" > "$R/decision.txt" 2>&1; cat "$R/decision.txt" | grep -v "^  "
final=$(cat /tmp/final_variant 2>/dev/null || echo base)
rm -rf /tmp/final_whl; cp -r /tmp/whl_$final /tmp/final_whl
cp /tmp/whl_$final/*.whl "$OUT/"; mkdir -p "$OUT/base"; cp /tmp/whl_base/*.whl "$OUT/base/"
for v in base lean wg all; do cp /tmp/whl_$v.log $R/ 2>/dev/null; done
tar -czf "$OUT/r1.tgz" -C /tmp r1; ls -la "$OUT" "$OUT/base"
say "done ($final)"
