#!/usr/bin/env bash
# Measure on a GPU (tools/gpu_check.sh runs the full GPU suite): the fast GPU tier, then the measured tables the
# plans choose from and the plan check on them, in one pass per format × mode: each backend alone, its entry merged
# into b12x_core's own timings.json, then the dispatched op (the plan that entry gives) timed beside them. MoE:
# Qwen3-30B-A3B-, gpt-oss- and DeepSeek-V3-like; linear: Llama-3.1-8B's and 70B's four linears. Every step has a share
# of the time given (seconds), so the run ends within it; a step cut short keeps what it measured (the table is
# merged as it goes).
#   bash tools/measure_tables.sh OUT [seconds=570] [moe shapes=qwen3,gptoss] [linear groups=8b] [--no-tests]
# linear groups: "shapes[@ms]" separated by ";" (e.g. "8b;70b@1,16,256,4096"), each given LINEAR_SHARES percent
# (comma-separated, in order) of the time left; MOE_SHARE percent goes to MoE first; MOE_CASES picks its cases,
# MOE_BACKENDS its backends (tensor_core_moe+held: the held block rows tensor_core_moe takes where they are faster;
# tensor_core_moe_wgmma: the Hopper grouped GEMM, which a plan takes only where this measures it faster), MOE_TS its
# token counts (moe.py's default: 1-4096);
# PLAN_FORMATS (comma-separated) measures only those linear formats (their entries merged into the table),
# PLAN_ACTIVATIONS only those activation modes (plan_check.py --activations: bf16, "fp8 static", fp8, mxfp8, nvfp4).
# OUT gets: run.log (everything), times.txt (each test's seconds), clocks.csv (unix s, SM MHz, °C, W once a
# second; `benchmarks/clocks.py OUT/linear_0.json OUT/clocks.csv` names the timings taken at low clocks), moe.json
# and linear_<group>.json (raw rows), timings.json (commit it as packages/b12x-core/src/b12x_core/timings.json),
# rows.md (docs tables).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: tools/measure_tables.sh OUT [seconds] [moe shapes] [linear shapes] [--no-tests]}"
total="${2:-570}" moe_shapes="${3:-qwen3,gptoss}" linear_shapes="${4:-8b}" tests="${5:-}"
source tools/gpu_env.sh
start_budget "$out"
export B12X_TEST_TIMES="$out/times.txt"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
# SM clock, temperature and power once a second for the whole run (unix time first: plan_check.py's rows keep
# `timed_at` per backend to join them). One 70B timing of a full run measured 1.2x its time alone, and clocks ranged
# 1500-1980 MHz across short runs: this says whether the card, not the kernel, set such a number.
(while sleep 1; do
   echo "$(date +%s),$(nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader,nounits)"
 done > "$out/clocks.csv" 2>/dev/null) &
clock_log=$!
trap 'kill $clock_log 2>/dev/null' EXIT
if [ "$tests" != "--no-tests" ]; then
  say "fast tier"
  timeout 240 bash tools/gpu_tests.sh --fast --timeout 200
  say "fast tier: exit $?"
else
  B12X_CUDA_ARCHS="${B12X_CUDA_ARCHS:-90}" install_kernels
fi
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
table=packages/b12x-core/src/b12x_core/timings.json
cases="${MOE_CASES:-MXFP4:bf16,MXFP4:mxfp8,NVFP4:bf16,NVFP4:nvfp4,NVFP4:mxfp8,IQ2_XS:bf16,IQ2_XXS:bf16,Q8_0:bf16}"
if [ "$moe_shapes" != "-" ]; then
  moe_budget=$(( $(left) * ${MOE_SHARE:-40} / 100 ))
  say "MoE $moe_shapes (budget ${moe_budget} s)"
  timeout $(( moe_budget + 90 )) python3 benchmarks/moe.py --shapes "$moe_shapes" \
    --backends "${MOE_BACKENDS:-triton_moe,tensor_core_moe,tensor_core_moe+held,auto}" ${MOE_TS:+--ts "$MOE_TS"} \
    --cases "$cases" --out "$out/moe.json" --png "" --emit-table "$table" \
    --budget-s "$moe_budget"
  say "MoE: exit $?"
fi
# linear groups: "shapes[@ms]" separated by ";", each given LINEAR_SHARES (percent of the time left, in order)
IFS=';' read -ra groups <<< "$linear_shapes"
IFS=',' read -ra shares <<< "${LINEAR_SHARES:-}"
for i in "${!groups[@]}"; do
  [ "${groups[$i]}" = "-" ] && continue
  shapes="${groups[$i]%%@*}" ms_arg=()
  [[ "${groups[$i]}" == *@* ]] && ms_arg=(--ms "${groups[$i]#*@}")
  budget=$(( ($(left) - 60) * ${shares[$i]:-100} / 100 ))
  say "linear $shapes (budget ${budget} s)"
  timeout $(( budget + 60 )) python3 benchmarks/plan_check.py --shapes "$shapes" "${ms_arg[@]}" ${PLAN_FORMATS:+--formats "$PLAN_FORMATS"} \
    ${PLAN_ACTIVATIONS:+--activations "$PLAN_ACTIVATIONS"} \
    --out "$out/linear_$i.json" --png "" --emit-table "$table" --budget-s "$budget"
  say "linear $shapes: exit $?"
done
cp "$table" "$out/timings.json"
python3 benchmarks/report.py --linear "$out"/linear_*.json --moe "$out/moe.json" > "$out/rows.md" 2>&1
say "done"
