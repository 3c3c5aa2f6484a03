#!/usr/bin/env bash
# Check a tree on a GPU (tools/measure_tables.sh measures it): the full GPU suite (12 xdist workers, each
# test's seconds logged), then, with OLD_ROOT set, tools/bit_identity.py (a refactor's results against the tree it
# started from, bit for bit; OLD_WHEEL: the old tree's b12x_kernels wheel when the kernels' interface changed),
# then, with the time left, more tables (measure_tables.sh without its fast tier).
#   bash tools/gpu_check.sh OUT [seconds=540] [moe shapes=-] [linear groups=-]
# OUT gets: run.log, times.txt, and what measure_tables.sh writes when tables run.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: tools/gpu_check.sh OUT [seconds] [moe shapes] [linear groups]}"
total="${2:-540}" moe_shapes="${3:--}" linear_shapes="${4:--}"
source tools/gpu_env.sh
start_budget "$out"
export B12X_TEST_TIMES="$out/times.txt"
export PYTHONUNBUFFERED=1 B12X_CUDA_ARCHS="${B12X_CUDA_ARCHS:-90}"
say "full GPU suite (budget $(( $(left) - ${RESERVE_S:-60} )) s)"
timeout $(( $(left) - ${RESERVE_S:-60} )) bash tools/gpu_tests.sh -q --timeout 300 2>&1 | grep -vE "^\.+|^tests/.*PASSED"
say "suite: exit ${PIPESTATUS[0]}"
if [ -n "${OLD_ROOT:-}" ]; then
  old_kernels=""
  if [ -n "${OLD_WHEEL:-}" ]; then
    old_kernels=/tmp/old_kernels
    python3 -m pip install -q --no-deps --no-cache-dir --target "$old_kernels" "$OLD_WHEEL"
  fi
  timeout $(( $(left) - 10 )) python3 tools/bit_identity.py "$OLD_ROOT" . $old_kernels
  say "bit identity: exit $?"
fi
if [ "$moe_shapes$linear_shapes" != "--" ] && [ "$(left)" -gt 90 ]; then
  bash tools/measure_tables.sh "$out" $(( $(left) - 5 )) "$moe_shapes" "$linear_shapes" --no-tests
fi
say "done"
