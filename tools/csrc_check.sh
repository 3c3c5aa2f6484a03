#!/usr/bin/env bash
# Before a GPU build: csrc/*.cu through nvcc's front end (host and device code for sm_90a, no ptxas), in parallel, on
# any machine with nvcc, so a compile error (a name clash in a file the last build did not compile, say) costs a few
# minutes here instead of a GPU machine's build. Exit status 1 if any file fails.
#   bash tools/csrc_check.sh [csrc/x.cu ...]   default: every .cu file of b12x-kernels
set -uo pipefail
cd "$(dirname "$0")/../packages/b12x-kernels"
[ $# -gt 0 ] && files=("$@") || files=(csrc/*.cu)
log=$(mktemp -d)
# CUTLASS's headers for csrc/sm90_mixed_*.cu: B12X_CUTLASS_DIR, else the nvidia-cutlass wheel of this Python
cutlass="${B12X_CUTLASS_DIR:-$(python3 -c "import importlib.util as u, os; s = u.find_spec('cutlass_library'); \
print(os.path.join(os.path.dirname(s.origin), 'source') if s else '')" 2> /dev/null)}"
export B12X_CUTLASS_FLAGS="-I$cutlass/include -I$cutlass/tools/util/include"
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -I{} sh -c \
  'nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -Icsrc $B12X_CUTLASS_FLAGS -DNDEBUG --cuda -o /dev/null {} \
     > "$0/$(basename {}).log" 2>&1 || echo "FAILED {}" >> "$0/failed"' "$log"
if [ -s "$log/failed" ]; then
  cat "$log"/*.log | grep -E "error" | sort -u | head -40
  cat "$log/failed"
  exit 1
fi
echo "csrc: ${#files[@]} files pass nvcc's front end (sm_90a)"
