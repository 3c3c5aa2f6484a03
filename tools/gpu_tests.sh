#!/usr/bin/env bash
# GPU tests on a CUDA machine, in the machine's own Python (it may have no network, so no venvs):
# build the extension there, check its fat binary, run the @pytest.mark.gpu tests. `nox -s gpu` calls this.
#   bash tools/gpu_tests.sh --fast [pytest args]   the fast tier: sm_90 build, every backend × format it serves
#                                                  once (tests marked fast)
#   bash tools/gpu_tests.sh [pytest args]          the full matrix, sharded over pytest-xdist workers
#   bash tools/gpu_tests.sh tests/x.py::test_y ...  only those tests (paths given replace the default set)
# B12X_CUDA_ARCHS (default: 90 for --fast, every architecture otherwise), B12X_GPU_WORKERS (default 12),
# B12X_TEST_TIMES=FILE (each test's seconds as it finishes), B12X_WHEEL (tools/gpu_env.sh) pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
marker="gpu"
if [ "${1:-}" = "--fast" ]; then
  shift
  marker="gpu and fast"
  export B12X_CUDA_ARCHS="${B12X_CUDA_ARCHS:-90}"
fi
source tools/gpu_env.sh
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
install_kernels
so=$(cd /tmp && python3 -c "import b12x_kernels._C as c; print(c.__file__)")
cuobjdump --list-elf "$so"
workers=()
if python3 -c "import xdist" 2>/dev/null; then
  workers=(-n "${B12X_GPU_WORKERS:-12}")  # tests, not files, go to workers: four files hold 90% of them
  # Each worker's CPU side (references, quantizers, float64 oracles) on its share of the cores: torch's default, a
  # thread a core in every worker, runs twelve times as many threads as cores, and the references slow down with it.
  # On an H100 a 1024-token CUTLASS MoE test took about 40 s that way and under 1 s with a share each; the whole
  # suite now takes about 2½ minutes there.
  share=$(( $(nproc) / ${B12X_GPU_WORKERS:-12} ))
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( share > 0 ? share : 1 ))}"
fi
# Test paths among the arguments (not an option's value: --deselect tests/x.py::t stays an option) replace the
# default set (tests/kernels tests/core); tests/conftest.py starts the
# longest files first.
options=() paths=()
takes_value=""
for arg in "$@"; do
  if [ -n "$takes_value" ]; then  # the value of the option before it (--deselect tests/x.py::t stays an option)
    options+=("$arg")
    takes_value=""
  elif [[ "$arg" == tests/* ]]; then
    paths+=("$arg")
  else
    options+=("$arg")
    case "$arg" in --deselect|--ignore|--ignore-glob|-k|-m|-n|-p|--timeout) takes_value=1 ;; esac
  fi
done
[ ${#paths[@]} -gt 0 ] || paths=(tests/kernels tests/core)
python3 -m pytest -m "$marker" -q -p no:cacheprovider ${workers[@]+"${workers[@]}"} "${paths[@]}" ${options[@]+"${options[@]}"}
echo "gpu tests ($marker): $(( $(date +%s) - start )) s"
