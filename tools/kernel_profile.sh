#!/usr/bin/env bash
# Profile the tensor-core kernels on a GPU after a change to them: build sm_90 from the tree (and keep the wheel in
# OUT/whl, to install again with B12X_WHEEL), the kernels' GPU tests, the wgmma-vs-mma.sync-vs-bf16 layer benchmark,
# Nsight Compute on the wgmma kernel and on the one-token path, the decode step's kernels, and compute-sanitizer over
# the tensor-core kernels. Every step has a time limit; logs and JSON under OUT.
#   bash tools/kernel_profile.sh OUT
# Steps are skipped by SKIP="tests bench sweep pdl linears ncu ncu_wgmma decode model sanitize" (ncu_wgmma: the wgmma
# kernel's profile within ncu); TESTS (TESTS_S: its time limit), BENCH, SWEEP, PDL, LINEARS (mma_linear.py's
# arguments), PDL_MODEL (model_decode.py's), NCU_WGMMA, NCU_MMA, DECODE, MODEL override their arguments; NCU_EXTRA
# adds Nsight Compute arguments to the wgmma profile (e.g. "--section SourceCounters": where the warps stall: a
# summary); NCU_SOURCE="KERNEL_REGEX CASE" saves one launch's report with every SASS instruction's stall samples
# (ncu_source.csv). Everything but the wheel is packed into OUT/results.tar.gz at the end (one file to copy back).
set -uo pipefail
cd "$(dirname "$0")/.."
top="${1:?usage: tools/kernel_profile.sh OUT}"
out="$top/work"
mkdir -p "$out"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 B12X_CUDA_ARCHS="${B12X_CUDA_ARCHS:-90}" CMAKE_BUILD_PARALLEL_LEVEL=16
source tools/gpu_env.sh
if [ -n "$B12X_WHEEL" ]; then
  install_kernels > "$out/build.log" 2>&1
else
  python3 -m pip wheel -q --no-build-isolation --no-deps --no-cache-dir -w "$top/whl" ./packages/b12x-kernels \
    > "$out/build.log" 2>&1 && python3 -m pip install -q --no-deps --force-reinstall "$top"/whl/*.whl >> "$out/build.log" 2>&1
fi
say "build: exit $? $(tail -1 "$out/build.log")"
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
if ! skip tests; then
  timeout "${TESTS_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 --timeout 200 ${TESTS:-tests/kernels/test_wgmma_gemm.py} \
    > "$out/tests.log" 2>&1
  say "tests: exit $?"; grep -E "passed|failed|^FAILED|^ERROR" "$out/tests.log" | tail -15
fi
if ! skip bench; then
  timeout 200 python3 benchmarks/wgmma_linear.py --out "$out/wgmma.json" --png "$out/wgmma.png" \
    ${BENCH:---formats NVFP4,FP8 --ms 1,16,64,128,256,1024,4096 --replays 20} > "$out/bench.log" 2>&1
  say "bench: exit $?"; tail -30 "$out/bench.log"
fi
if ! skip sweep; then
  timeout 240 python3 benchmarks/mma_linear.py --model 8b --sweep --rt 1 --out "$out/sweep.json" \
    ${SWEEP:---formats NVFP4,IQ2_XS,FP8,Q8_0 --ms 1,4 --replays 20} > "$out/sweep.log" 2>&1
  say "sweep: exit $?"; grep -E "^M=" "$out/sweep.log" | cut -c1-150
fi
if ! skip pdl; then  # programmatic dependent launch against plain launches, same run (mma_linear) and one after the other (model)
  timeout 150 python3 benchmarks/mma_linear.py --model 8b --pdl-ab --rt 1 --out "$out/pdl_linear.json" \
    ${PDL:---formats NVFP4,FP8,IQ2_XS --ms 1,4,16 --replays 20} > "$out/pdl_linear.log" 2>&1
  say "pdl linear: exit $?"; grep -E "^M=" "$out/pdl_linear.log" | cut -c1-150
  for flag in 0 1; do
    B12X_PDL=$flag timeout 150 python3 benchmarks/model_decode.py --out "$out/pdl_model_$flag.json" \
      --png "$out/pdl_model_$flag.png" ${PDL_MODEL:---models llama8b --formats NVFP4,FP8 --batches 1,4 --budget-s 90} \
      > "$out/pdl_model_$flag.log" 2>&1
    say "model decode, B12X_PDL=$flag: exit $?"; grep -E "tok/s" "$out/pdl_model_$flag.log" | tail -12
  done
fi
if ! skip linears; then  # the tensor-core GEMM, the 8B layer and each linear alone: default and balanced configs
  timeout 200 python3 benchmarks/mma_linear.py --model 8b --per-linear --balance-ab --rt 1 --out "$out/linears.json" \
    ${LINEARS:---formats NVFP4,FP8,Q8_0,IQ2_XS,MXFP4 --ms 1,4,8 --replays 20} > "$out/linears.log" 2>&1
  say "linears: exit $?"; grep -E "^M=|^    [a-z_]+ " "$out/linears.log" | cut -c1-150
fi
if ! skip ncu && ! skip ncu_wgmma; then
  timeout 120 ncu --clock-control none -k regex:wgmma_gemm_kernel --launch-skip 1 ${NCU_EXTRA:-} --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section MemoryWorkloadAnalysis python3 benchmarks/wgmma_profile.py ${NCU_WGMMA:-NVFP4:28672x4096:1024:16:1} \
    > "$out/ncu_wgmma.log" 2>&1
  say "ncu wgmma: exit $?"
fi
if ! skip ncu; then
  if [ -n "${NCU_SOURCE:-}" ]; then
    # where the warps stall, per SASS instruction (with its CUDA line: the build has -lineinfo): NCU_SOURCE is a
    # kernel regex and a case of NCU_SOURCE_SCRIPT (default wgmma_profile.py), e.g. "wgmma_gemm_kernel
    # NVFP4:28672x4096:128:8:1", or with NCU_SOURCE_SCRIPT=mma_profile.py "mma_gemm_kernel
    # NVFP4:28672x4096:1:auto:auto". The text mode's SourceCounters section prints only a summary; the source page
    # of the saved report has every instruction.
    read -r src_kernel src_case <<< "$NCU_SOURCE"
    timeout 150 ncu --clock-control none -k "regex:$src_kernel" --launch-skip 1 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --import-source yes -f -o "$out/ncu_source" \
      python3 benchmarks/${NCU_SOURCE_SCRIPT:-wgmma_profile.py} $src_case > "$out/ncu_source.log" 2>&1 &&
      timeout 60 ncu -i "$out/ncu_source.ncu-rep" --page source --csv --print-source sass > "$out/ncu_source.csv" 2>&1
    say "ncu source ($src_kernel $src_case): exit $?"
  fi
  timeout 150 ncu --clock-control none -k regex:mma_gemm_kernel --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
    python3 benchmarks/mma_profile.py ${NCU_MMA:-NVFP4:28672x4096:1:auto:auto NVFP4:4096x4096:1:auto:auto \
    IQ2_XS:28672x4096:1:auto:auto FP8:4096x14336:1:auto:auto} > "$out/ncu_mma.log" 2>&1
  say "ncu mma: exit $?"
  grep -E "_kernel<|Duration|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|No Eligible|Grid Size|Waves Per SM|Warp Cycles Per Issued" \
    "$out"/ncu_*.log | cut -c1-160
fi
if ! skip decode; then
  timeout 150 python3 benchmarks/decode_kernels.py --out "$out/decode_kernels.json" ${DECODE:-} \
    > "$out/decode_kernels.md" 2>&1
  say "decode kernels: exit $?"; grep -E "^###" "$out/decode_kernels.md"
fi
if ! skip model; then
  timeout 280 python3 benchmarks/model_decode.py --out "$out/model_decode.json" --png "$out/model_decode.png" \
    ${MODEL:---budget-s 200} > "$out/model_decode.log" 2>&1
  say "model decode: exit $?"; grep -E "tok/s" "$out/model_decode.log" | tail -30
fi
if ! skip sanitize; then
  for tool in memcheck synccheck; do
    timeout 120 compute-sanitizer --tool $tool python3 benchmarks/sanitize_mma.py > "$out/sanitize_$tool.log" 2>&1
    say "sanitizer $tool: exit $? $(tail -2 "$out/sanitize_$tool.log" | tr '\n' ' ')"
  done
fi
tar -czf "$top/results.tar.gz" -C "$out" . && rm -rf "$out"
say "done"
