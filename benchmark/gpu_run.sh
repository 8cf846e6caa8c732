#!/usr/bin/env bash
# One command on the GPU machine: install flashinfer (bundle) and the project, run the GPU
# tests and the benchmarks, leave logs + JSON + PNG in $OUT (<= 8 files), print a summary last.
#   [BUNDLE=.devwheels74] bash benchmark/gpu_run.sh [STAGE ...]   stages: tests bench launch eager aot (default: all)
# Needs the flashinfer bundle BUNDLE (default .devwheels: python3 ../shared/device/make-bundle.py;
# 0.7.4: FLASHINFER_VERSION=0.7.4 python3 ../shared/device/make-bundle.py .devwheels74) carried with the command.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/slim_out}; mkdir -p "$OUT"
STAGES=${*:-tests bench launch eager aot}
BUNDLE=${BUNDLE:-.devwheels}
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fiws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
export SLIM_KERNEL_CACHE_DIR=/tmp/slim_cache
t0=$(date +%s)
stamp() { echo "[gpu_run +$(( $(date +%s) - t0 ))s] $*"; }

if ls "$BUNDLE"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$BUNDLE"/*.whl
  export PYTHONPATH=/tmp/site
fi
# flashinfer JIT-builds each module on first use (30-50 s each): build the ones we use in the
# background while the project installs, into the same workspace the tests then reuse.
warm_pids=()
for step in bmm_fp8 router tinygemm; do
  python3 benchmark/warm_flashinfer.py $step >>/tmp/warm_flashinfer.log 2>&1 & warm_pids+=($!)
done

stamp "installing slim-kernel"
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -5
LOG="$OUT/gpu_tests.log"  # info, flashinfer warm-up, pytest -m gpu, AOT baseline check (8-file limit)
(cd /tmp && python3 -m slim_kernel info) | tee "$LOG"
(cd /tmp && python3 -c "from slim_kernel.backends.flashinfer_fastpath import fast_path_state as s; print('bmm_fp8 fast path (probe):', s(probe=True))") | tee -a "$LOG"
stamp "waiting for flashinfer modules"; wait "${warm_pids[@]}"; tee -a "$LOG" </tmp/warm_flashinfer.log

summary=()
if [[ " $STAGES " == *" tests "* ]]; then
  stamp "pytest -m gpu"
  python3 -m pytest tests -m gpu -q -p no:cacheprovider --maxfail=30 -o addopts="" -rfEs \
      >/tmp/pytest_gpu.log 2>&1
  cat /tmp/pytest_gpu.log >>"$LOG"
  summary+=("pytest -m gpu: $(tail -1 /tmp/pytest_gpu.log)")
  stamp "pytest done"
fi
if [[ " $STAGES " == *" bench "* && -f benchmark/bench_gemm.py ]]; then
  stamp "bench_gemm"
  python3 benchmark/bench_gemm.py --json "$OUT/bench_gemm.json" --png "$OUT/bench_gemm.png" 2>&1 | tail -40
  python3 benchmark/bench_floor.py --json "$OUT/bench_floor.json" 2>&1 | tail -6
fi
if [[ " $STAGES " == *" launch "* && -f benchmark/bench_launch.py ]]; then
  stamp "bench_launch"
  python3 benchmark/bench_launch.py --json "$OUT/bench_launch.json" 2>&1 | tail -20
fi
if [[ " $STAGES " == *" eager "* && -f benchmark/bench_eager.py ]]; then
  stamp "bench_eager"
  python3 benchmark/bench_eager.py --json "$OUT/bench_eager.json" --png "$OUT/bench_eager.png" 2>&1 | tail -40
fi
if [[ " $STAGES " == *" aot "* && -d csrc/aot_baseline ]]; then
  # Last: installing the AOT baseline replaces the shipped build in this environment.
  stamp "building the AOT baseline (sm_90a) and testing it against the JIT path"
  SLIM_KERNEL_AOT_BASELINE=ON SLIM_KERNEL_AOT_ARCHS=90a python3 -m pip install -q --no-build-isolation --no-deps . \
      >/tmp/aot_gpu.log 2>&1
  python3 -m pytest tests/test_aot_baseline_gpu.py -m gpu -q -p no:cacheprovider -o addopts="" -rfEs \
      >>/tmp/aot_gpu.log 2>&1
  cat /tmp/aot_gpu.log >>"$LOG"
  summary+=("aot baseline on GPU: $(tail -1 /tmp/aot_gpu.log)")
fi
stamp "done"
grep -E "^(FAILED|ERROR)" "$LOG" 2>/dev/null | head -20
printf '%s\n' "${summary[@]}"
