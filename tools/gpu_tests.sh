#!/usr/bin/env bash
# GPU tests on a CUDA machine, in the machine's own Python (the lent device has no network, so no venvs):
# build the extension there, check its fat binary, run every @pytest.mark.gpu test. `nox -s gpu` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-16}"
python3 -m pip install -q --no-build-isolation --no-deps --no-cache-dir ./packages/b12x-kernels
export PYTHONPATH="$PWD/packages/b12x-formats/src:$PWD/packages/b12x-core/src${PYTHONPATH:+:$PYTHONPATH}"
so=$(cd /tmp && python3 -c "import b12x_kernels._C as c; print(c.__file__)")
cuobjdump --list-elf "$so"
python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels tests/core "$@"
