# Sourced by the GPU scripts (gpu_tests.sh, gpu_check.sh, measure_tables.sh, kernel_ab.sh, kernel_profile.sh): what a
# GPU machine without network access needs besides its own Python and CUDA.
# - Python packages brought as wheels in .whl/ (gguf: the tests' oracle; nvidia-cutlass: CUTLASS's headers for a
#   source build), installed under /tmp/site.
# - install_kernels: b12x-kernels from B12X_WHEEL (a wheel built earlier for this Python; default: the cp312 one in
#   .whl/) when it imports here, with the tree's Python modules over the wheel's, otherwise built from the tree
#   (B12X_CUDA_ARCHS, CMAKE_BUILD_PARALLEL_LEVEL).
if ls .whl/gguf-*.whl > /dev/null 2>&1 && ! python3 -c "import gguf" 2> /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf-*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# CUTLASS's headers for a source build of the extension (the nvidia-cutlass wheel; pip's build isolation would fetch it)
if ls .whl/nvidia_cutlass-*.whl > /dev/null 2>&1 && [ -z "${B12X_CUTLASS_DIR:-}" ]; then
  [ -d /tmp/site/cutlass_library ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/nvidia_cutlass-*.whl
  export B12X_CUTLASS_DIR=/tmp/site/cutlass_library/source
fi
export B12X_WHEEL="${B12X_WHEEL:-$(ls .whl/b12x_kernels-*cp312*.whl 2> /dev/null | head -1)}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-16}"

install_kernels() {
  local start=$(date +%s)
  # the import check needs b12x_formats (b12x_kernels reads its format ids)
  if [ -n "$B12X_WHEEL" ] && python3 -m pip install -q --no-deps --no-cache-dir --force-reinstall "$B12X_WHEEL" \
      && (cd /tmp && PYTHONPATH="$OLDPWD/packages/b12x-formats/src${PYTHONPATH:+:$PYTHONPATH}" \
          python3 -c "import b12x_kernels as k; assert k._C is not None, k.unavailable_reason()"); then
    # a wheel built from this tree's csrc may predate its Python: the tree's modules replace the wheel's
    local site=$(cd /tmp && python3 -c 'import importlib.util as u; print(u.find_spec("b12x_kernels").submodule_search_locations[0])')
    cp packages/b12x-kernels/src/b12x_kernels/*.py "$site/"
    echo "b12x-kernels from $B12X_WHEEL (Python modules from the tree)"
  else
    python3 -m pip install -q --no-build-isolation --no-deps --no-cache-dir ./packages/b12x-kernels
    echo "build: $(( $(date +%s) - start )) s"
  fi
}

# A run within a time budget (gpu_check.sh, measure_tables.sh; `total` seconds, set before): start_budget OUT logs
# everything to OUT/run.log too; `left` says the seconds the budget still holds, `say` prints with the seconds so far.
start_budget() {
  mkdir -p "$1"
  t0=$(date +%s)
  exec > >(tee -a "$1/run.log") 2>&1
}
left() { echo $(( total - ($(date +%s) - t0) )); }
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
