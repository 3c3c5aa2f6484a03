#!/usr/bin/env bash
# Builds the SM90 mixed-input GEMM probe (4 CUTLASS kernels, each its own translation unit, compiled in parallel)
# and runs it: OUT_DIR/sm90_mixed.json, OUT_DIR/sm90_mixed.log (everything printed), OUT_DIR/compile.log.
#
#   CUTLASS_DIR=/tmp/site/cutlass_library/source bash benchmarks/sm90_mixed/build_and_run.sh OUT_DIR [mixed_gemm args]
#
# CUTLASS_DIR: the CUTLASS source tree (include/, tools/util/include/); default: the `source` folder of the
#   installed `cutlass_library` package (the nvidia-cutlass wheel).
# NVCC: default $CUDACXX, else nvcc on PATH, else /usr/local/cuda/bin/nvcc. cuBLAS: the toolkit's, else
#   CUBLAS_DIR (include/ and lib/), else an installed nvidia-cublas wheel.
# EXTRA_NVCCFLAGS: e.g. -DSM90_MIXED_FP8_SHUFFLE=0 (e4m3 weight not reordered). BUILD_DIR: default a temp dir.
# JOBS: parallel compiles (default: the core count). RUN_TIMEOUT: seconds for one run of the program (300).
# BUILD_ONLY=1: compile and link into BUILD_DIR, run nothing; PREBUILT=1: run BUILD_DIR's program without compiling
#   (build while the GPU does other work, time it when the GPU is idle).
set -o pipefail

OUT=${1:?usage: build_and_run.sh OUT_DIR [mixed_gemm arguments]}
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/sm90_mixed.log
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }
T0=$(date +%s)

# ---- tools and headers
if [ -z "${CUTLASS_DIR:-}" ]; then
  CUTLASS_DIR=$(python3 - <<'EOF' 2>/dev/null
import importlib.util, os
s = importlib.util.find_spec("cutlass_library")
print(os.path.join(os.path.dirname(s.origin), "source") if s and s.origin else "")
EOF
)
fi
if [ ! -f "${CUTLASS_DIR:-}/include/cutlass/cutlass.h" ] || [ ! -d "$CUTLASS_DIR/tools/util/include/cutlass" ]; then
  say "no CUTLASS headers: set CUTLASS_DIR to a tree with include/ and tools/util/include/ (got '${CUTLASS_DIR:-}')"
  exit 1
fi
NVCC=${NVCC:-${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}}
if [ ! -x "$NVCC" ]; then say "nvcc not found (NVCC, CUDACXX, PATH, /usr/local/cuda/bin/nvcc)"; exit 1; fi
# The toolkit's root as nvcc itself sees it (nvcc on PATH may be a wrapper script or a link).
CUDA_ROOT=$("$NVCC" -dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
[ -d "$CUDA_ROOT/include" ] || CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
CUDA_ROOT=$(cd "$CUDA_ROOT" && pwd)

CUBLAS_INC=(-I"$CUDA_ROOT/include")
CUBLAS_LINK=(-Xlinker -rpath -Xlinker "$CUDA_ROOT/lib64")
if [ -n "${CUBLAS_DIR:-}" ]; then
  CUBLAS_INC=(-I"$CUBLAS_DIR/include")
  CUBLAS_LINK+=(-L"$CUBLAS_DIR/lib" -Xlinker -rpath -Xlinker "$CUBLAS_DIR/lib")
elif [ ! -f "$CUDA_ROOT/include/cublas_v2.h" ] && [ ! -f "$CUDA_ROOT/targets/x86_64-linux/include/cublas_v2.h" ]; then
  CB=$(python3 - <<'EOF' 2>/dev/null
import importlib.util, os
for name in ("nvidia.cu13", "nvidia.cublas"):
    try:
        s = importlib.util.find_spec(name)
    except Exception:
        s = None
    for d in (s.submodule_search_locations or []) if s else []:
        if os.path.exists(os.path.join(d, "include", "cublas_v2.h")):
            print(d); raise SystemExit
EOF
)
  if [ -z "$CB" ]; then say "cuBLAS headers not found in $CUDA_ROOT; set CUBLAS_DIR"; exit 1; fi
  [ -e "$CB/lib/libcublas.so" ] || ln -sf "$(ls "$CB"/lib/libcublas.so.* | head -1)" "$CB/lib/libcublas.so" 2>/dev/null
  CUBLAS_INC=(-I"$CB/include")
  CUBLAS_LINK+=(-L"$CB/lib" -Xlinker -rpath -Xlinker "$CB/lib")
fi

BUILD=${BUILD_DIR:-$(mktemp -d /tmp/sm90_mixed_build.XXXXXX)}
mkdir -p "$BUILD"
say "nvcc: $NVCC ($("$NVCC" --version | tail -1))"
say "CUTLASS: $CUTLASS_DIR"
say "build: $BUILD, $(nproc) cores"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv 2>&1 | tee -a "$LOG"

# ---- compile: one process per translation unit, JOBS at a time
if [ "${PREBUILT:-0}" != 1 ]; then
FLAGS=(-gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --expt-relaxed-constexpr -DNDEBUG
       -I"$CUTLASS_DIR/include" -I"$CUTLASS_DIR/tools/util/include" "${CUBLAS_INC[@]}" ${EXTRA_NVCCFLAGS:-})
UNITS=(kernel_fp8_128x128 kernel_fp8_128x256 kernel_int4_128x128 kernel_int4_128x256 reorder mixed_gemm)
: > "$OUT/compile.log"
JOBS=${JOBS:-$(nproc)}  # parallel compiles (each CUTLASS unit needs about 5 GB)
for u in "${UNITS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  (
    s=$(date +%s)
    extra=()
    [[ $u == kernel_* ]] && extra=(-Xptxas -v)
    "$NVCC" "${FLAGS[@]}" "${extra[@]}" -c "$HERE/$u.cu" -o "$BUILD/$u.o" > "$BUILD/$u.log" 2>&1
    rc=$?
    echo "$rc $(( $(date +%s) - s ))" > "$BUILD/$u.rc"
  ) &
done
wait
fail=0
for u in "${UNITS[@]}"; do
  read -r rc secs < "$BUILD/$u.rc" || { rc=1; secs=?; }
  { echo "==== $u.cu: rc=$rc, ${secs}s"; cat "$BUILD/$u.log"; } >> "$OUT/compile.log"
  say "compiled $u.cu: rc=$rc in ${secs}s"
  # registers and spills of each kernel (ptxas -v)
  grep -E "registers|spill stores" "$BUILD/$u.log" | sed 's/^ptxas info *: //; s/^ */    /' | tee -a "$LOG"
  if [ "$rc" != 0 ]; then fail=1; tail -30 "$BUILD/$u.log" | tee -a "$LOG"; fi
done
[ $fail = 0 ] || { say "build failed (compile.log)"; exit 1; }
objs=()
for u in "${UNITS[@]}"; do objs+=("$BUILD/$u.o"); done
if ! "$NVCC" -gencode=arch=compute_90a,code=sm_90a "${objs[@]}" -o "$BUILD/mixed_gemm" "${CUBLAS_LINK[@]}" -lcublas \
    >> "$OUT/compile.log" 2>&1; then
  say "link failed (compile.log)"; tail -20 "$OUT/compile.log" | tee -a "$LOG"; exit 1
fi
say "built in $(( $(date +%s) - T0 ))s"
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
[ -x "$BUILD/mixed_gemm" ] || { say "no program in $BUILD (PREBUILT=1 needs a BUILD_DIR that BUILD_ONLY=1 filled)"; exit 1; }

# ---- run; a kernel that faults the context (or hangs) is named in sm90_mixed.json.fault and left out of a rerun
JSON=$OUT/sm90_mixed.json
skip=""
rc=1
for attempt in 1 2 3; do
  args=("$JSON" "$@")
  [ -n "$skip" ] && args+=(--skip "${skip#,}")
  say "run $attempt: mixed_gemm ${args[*]}"
  timeout -k 10 "${RUN_TIMEOUT:-300}" "$BUILD/mixed_gemm" "${args[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && break
  f=$(head -1 "$JSON.fault" 2>/dev/null)
  if [ -z "$f" ] || [ "$f" = setup ] || [ "$f" = reference ]; then say "mixed_gemm exited $rc"; break; fi
  say "mixed_gemm exited $rc after a fault in '$f': running again without it"
  skip="$skip,$f"
done
say "done in $(( $(date +%s) - T0 ))s (rc=$rc)"
exit "$rc"
