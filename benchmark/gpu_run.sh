#!/usr/bin/env bash
# One command on the GPU machine: install the flashinfer bundle and the project, run the GPU tests
# and the benchmarks, leave logs + JSON + PNG in $OUT (<= 8 files), print a summary last.
#
#   bash benchmark/gpu_run.sh BUNDLE [STAGE ...]    stages: tests bench eager cold ncu aot (default: tests bench eager)
#   COLD_ARGS="--procs 8"  cold_start.py options for the cold stage (N ranks on one JIT cache; default one per GPU)
#   PROFILE_ARGS="--case fused_a@1,16 --case router:384@4,8 --impls jit:ring_c8,flashinfer"  narrows the ncu stage
#   (profile_gemm.py options); PM_ARGS (the same options) adds a PM-sampling pass (DRAM and L2 over time) of those
#   (PM_INTERVAL: the sampling interval, ncu units; 1000 gave 1.5 us samples on the H200)
#   BENCH_ARGS="--ops fused_a --ms 1,8,16 --large-ms="  narrows the bench stage (bench_gemm.py options; split on
#   spaces without quote removal, so no quotes inside: --large-ms= is none)
#   TEST_K="stream"  narrows the tests stage (pytest -k)
#
# BUNDLE: the flashinfer wheel folder carried with the command (.devwheels for 0.7.2.post1:
# `python3 ../shared/device/make-bundle.py`; .devwheels74 for 0.7.4: `FLASHINFER_VERSION=0.7.4
# python3 ../shared/device/make-bundle.py .devwheels74`; `benchmark/trim_bundle.py` makes a smaller copy when the
# tree plus bundle pass the 64 MiB a command takes), or `none`. sglang's JIT kernels (the
# anchors) are timed when .anchors/sglang_jit (a copy of ../shared/anchors/sglang_jit) is carried too.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:?usage: bash benchmark/gpu_run.sh BUNDLE [STAGE ...]}
shift
STAGES=${*:-tests bench eager}
OUT=${OUT:-/tmp/slim_out}; mkdir -p "$OUT"
# Per-bundle flashinfer workspace: a warm machine keeps /tmp, and modules built by another version must not serve
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fiws-$(basename "$BUNDLE") FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
export SLIM_KERNEL_CACHE_DIR=/tmp/slim_cache CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} SGLANG_JIT_CACHE_DIR=/tmp/sgl_jit
t0=$(date +%s)
stamp() { echo "[gpu_run +$(( $(date +%s) - t0 ))s] $*"; }
LOG="$OUT/gpu_tests.log"  # info, warm-up, pytest -m gpu, AOT baseline check (the 8-file limit)

# .whl/: build requirements newer than the machine's (scikit-build-core), when carried
wheels=(); ls .whl/*.whl >/dev/null 2>&1 && wheels+=(.whl/*.whl)
if [[ "$BUNDLE" != none ]]; then
  ls "$BUNDLE"/*.whl >/dev/null || { echo "no wheels in $BUNDLE"; exit 2; }
  wheels+=("$BUNDLE"/*.whl)
fi
rm -rf /tmp/site  # a warm machine keeps the previous call's packages: never mix two flashinfer versions
if (( ${#wheels[@]} )); then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}"
  export PYTHONPATH=/tmp/site
fi
SGLANG=""
[[ -d .anchors/sglang_jit ]] && SGLANG=$PWD/.anchors/sglang_jit

# flashinfer and sglang JIT-build each module on first use (10-50 s each): build the ones the run
# needs in the background while the project installs and the tests run, into the caches they reuse.
warm_pids=()
for step in bmm_fp8 router rmsnorm tinygemm1 tinygemm1_pdl tinygemm16 tinygemm16_pdl; do
  python3 benchmark/warm_flashinfer.py $step >>/tmp/warm.log 2>&1 & warm_pids+=($!)
done
if [[ -n "$SGLANG" ]]; then
  (cd benchmark && python3 -c "from anchors import warm_all; warm_all('$SGLANG')") >>/tmp/warm.log 2>&1 & warm_pids+=($!)
fi

stamp "installing slim-kernel"
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -5
(cd /tmp && python3 -m slim_kernel info) >"$LOG" 2>&1; cat "$LOG"
stamp "waiting for the flashinfer / sglang modules"; wait "${warm_pids[@]}"; tee -a "$LOG" </tmp/warm.log

summary=()
stamp "smoke test of every JIT configuration (one process each)"
python3 benchmark/smoke_kernels.py --bad-file /tmp/bad_variants 2>&1 | tee -a "$LOG"
if [[ " $STAGES " == *" tests "* ]]; then
  # The kernel matrix runs in its own process: a kernel that traps poisons its CUDA context.
  for part in "tests --ignore=tests/test_kernels_gpu.py" "tests/test_kernels_gpu.py"; do
    stamp "pytest -m gpu $part"
    python3 -m pytest $part -m gpu ${TEST_K:+-k "$TEST_K"} -q -p no:cacheprovider --maxfail=50 -o addopts="" -rfEs \
        >/tmp/pytest_gpu.log 2>&1
    cat /tmp/pytest_gpu.log >>"$LOG"
    grep -E "^(FAILED|ERROR)" /tmp/pytest_gpu.log | head -12
    summary+=("pytest -m gpu $part: $(tail -1 /tmp/pytest_gpu.log)")
  done
  stamp "pytest done"
fi
if [[ " $STAGES " == *" bench "* ]]; then
  stamp "bench_gemm (decode step + back to back)"
  python3 benchmark/bench_gemm.py --json "$OUT/bench_gemm.json" --png "$OUT/bench_gemm.png" \
      --table "$OUT/routing_sm90.json" --skip-variants /tmp/bad_variants ${SGLANG:+--sglang "$SGLANG"} ${BENCH_ARGS:-} 2>&1 | tee -a "$LOG" | tail -80
fi
if [[ " $STAGES " == *" eager "* ]]; then
  stamp "bench_eager"
  python3 benchmark/bench_eager.py --json "$OUT/bench_eager.json" --png "$OUT/bench_eager.png" 2>&1 | tee -a "$LOG" | tail -30
fi
if [[ " $STAGES " == *" cold "* ]]; then
  stamp "cold start of N ranks on one JIT cache (cold_start.py ${COLD_ARGS:-})"
  python3 benchmark/cold_start.py --json "$OUT/cold_start.json" ${SGLANG:+--sglang "$SGLANG"} ${COLD_ARGS:-} 2>&1 \
      | tee -a "$LOG" | tail -60
fi
if [[ " $STAGES " == *" ncu "* ]]; then
  stamp "ncu profile"
  ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel --csv \
      --metrics "$(cd benchmark && python3 profile_gemm.py --metrics)" \
      python3 benchmark/profile_gemm.py ${SGLANG:+--sglang "$SGLANG"} ${PROFILE_ARGS:-} >"$OUT/ncu.csv" 2>>"$LOG"
  python3 benchmark/ncu_table.py "$OUT/ncu.csv" 2>&1 | tee -a "$LOG" | tail -60
  if [[ -n "${PM_ARGS:-}" ]]; then
    stamp "ncu PM sampling"
    ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel --section PmSampling \
        --pm-sampling-interval "${PM_INTERVAL:-1000}" -f -o /tmp/pm python3 benchmark/profile_gemm.py ${SGLANG:+--sglang "$SGLANG"} \
        $PM_ARGS >>"$LOG" 2>&1 || stamp "PM sampling failed (log)"
    ncu -i /tmp/pm.ncu-rep --page raw --csv --print-metric-instances values >/tmp/pm.csv 2>>"$LOG" \
        && python3 benchmark/pm_series.py /tmp/pm.csv 2>&1 >"$OUT/pm_series.json" | tee -a "$LOG" | tail -20
  fi
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
printf '%s\n' "${summary[@]}"
