#!/usr/bin/env bash
# Before a GPU build: csrc/*.cu through nvcc's front end (host and device code for sm_90a, no ptxas), in parallel, on
# any machine with nvcc, so a compile error (a name clash in a file the last build did not compile, say) costs a few
# minutes here instead of a GPU machine's build. Exit status 1 if any file fails.
#   bash tools/csrc_check.sh [csrc/x.cu ...]   default: every .cu file of b12x-kernels
set -uo pipefail
cd "$(dirname "$0")/../packages/b12x-kernels"
[ $# -gt 0 ] && files=("$@") || files=(csrc/*.cu)
log=$(mktemp -d)
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -I{} sh -c \
  'nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -Icsrc --cuda -o /dev/null {} > "$0/$(basename {}).log" 2>&1 \
     || echo "FAILED {}" >> "$0/failed"' "$log"
if [ -s "$log/failed" ]; then
  cat "$log"/*.log | grep -E "error" | sort -u | head -40
  cat "$log/failed"
  exit 1
fi
echo "csrc: ${#files[@]} files pass nvcc's front end (sm_90a)"
