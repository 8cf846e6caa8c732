#!/usr/bin/env bash
# One command on a GPU machine: install the project (and a folder of wheels, if given), run the GPU
# tests and the benchmarks, leave logs + JSON + PNG in $OUT (default /tmp/slim_out), print a summary last.
#
#   bash benchmark/gpu_run.sh WHEELS [STAGE ...]      stages: tests bench eager tune cold ncu timeline aot
#                                                     (default: tests bench)
#
# WHEELS: a folder of wheels to install first into a private site dir (for a machine without a
# package index: flashinfer-python, apache-tvm-ffi, ... fetched elsewhere with `pip download`), or
# `none` to use what is installed. flashinfer and sglang are used as installed; SGLANG_KERNELS=DIR
# names a directory holding sglang's JIT kernels (the `sglang` package's kernels/ tree) instead.
#   BENCH_ARGS="--models kimi-k3 --ms 1-16 --large-ms="   narrows the bench stage (bench_gemm.py options; split on
#       spaces, no quotes inside); its shapes' sglang modules are built in the background during set-up
#   TUNE_ARGS="--model kimi-k3"   what the tune stage measures (slim-kernel tune options; default: kimi-k3)
#   TEST_K="stream"               narrows the tests stage (pytest -k)
#   COLD_ARGS="--procs 8"         cold_start.py options of the cold stage (N ranks on one JIT cache; default one per GPU)
#   PROFILE_ARGS / PM_ARGS        profile_gemm.py options of the ncu stage (PM_ARGS adds a PM-sampling pass)
#   TIMELINE_ARGS="--case fused_a:2624,6144@1,8 --impls default,anchor:sglang:fused_a"   timeline.py options
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:?usage: bash benchmark/gpu_run.sh WHEELS|none [STAGE ...]}
shift
STAGES=${*:-tests bench}
OUT=${OUT:-/tmp/slim_out}; mkdir -p "$OUT"
# Per-wheel-folder flashinfer workspace: a warm machine keeps /tmp, and modules built by another version must not serve
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fiws-$(basename "$WHEELS") FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
export SLIM_KERNEL_CACHE_DIR=${SLIM_KERNEL_CACHE_DIR:-/tmp/slim_cache} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export SGLANG_JIT_CACHE_DIR=${SGLANG_JIT_CACHE_DIR:-/tmp/sgl_jit}
t0=$(date +%s)
stamp() { echo "[gpu_run +$(( $(date +%s) - t0 ))s] $*"; }
LOG="$OUT/gpu_tests.log"  # info, warm-up, pytest -m gpu, AOT baseline check (the 8-file limit)

if [[ "$WHEELS" != none ]]; then
  ls "$WHEELS"/*.whl >/dev/null || { echo "no wheels in $WHEELS"; exit 2; }
  rm -rf /tmp/site  # a warm machine keeps the previous call's packages: never mix two flashinfer versions
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
SGL=${SGLANG_KERNELS:+$(cd "$SGLANG_KERNELS" && pwd)}

# flashinfer and sglang JIT-build each module on first use (10-50 s each): build the ones the run
# needs in the background while the project installs and the tests run, into the caches they reuse.
warm_pids=()
while read -r step; do
  python3 benchmark/warm_flashinfer.py "$step" >>/tmp/warm.log 2>&1 & warm_pids+=($!)
done < <(python3 benchmark/warm_flashinfer.py --list 2>/dev/null | grep -v unavailable)
(cd benchmark && PYTHONPATH=../python${PYTHONPATH:+:$PYTHONPATH} python3 bench_gemm.py --warm-anchors \
    ${SGL:+--sglang "$SGL"} ${BENCH_ARGS:-}) >>/tmp/warm.log 2>&1 & warm_pids+=($!)

stamp "installing slim-kernel"
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -5
(cd /tmp && python3 -m slim_kernel info) >"$LOG" 2>&1; head -12 "$LOG"
# every JIT instance, in parallel, into the cache the tests and benchmarks use (else each compiles on first call)
python3 -m slim_kernel precompile --no-progress >>/tmp/warm.log 2>&1 & warm_pids+=($!)
stamp "waiting for the flashinfer / sglang modules"; wait "${warm_pids[@]}"; tee -a "$LOG" </tmp/warm.log

summary=()
stamp "smoke test of every JIT configuration (one process each)"
rm -f /tmp/smoke_bad.txt  # a warm machine keeps /tmp: never skip by an earlier call's list
python3 benchmark/smoke_kernels.py --bad-file /tmp/smoke_bad.txt 2>&1 | tee -a "$LOG" | grep -v "^smoke OK"
if [[ " $STAGES " == *" tests "* ]]; then
  # The kernel matrix runs in its own process: a kernel that traps poisons its CUDA context.
  n=0
  for part in "tests --ignore=tests/test_kernels_gpu.py" "tests/test_kernels_gpu.py"; do
    stamp "pytest -m gpu $part"
    n=$((n + 1))  # straight into $OUT: a run stopped at its time limit still brings the log back
    python3 -m pytest $part -m gpu ${TEST_K:+-k "$TEST_K"} -q -p no:cacheprovider --maxfail=50 -o addopts="" -rfEs \
        >"$OUT/pytest_gpu_$n.log" 2>&1
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_$n.log" | head -12
    summary+=("pytest -m gpu $part: $(tail -1 "$OUT/pytest_gpu_$n.log")")
  done
  stamp "pytest done"
fi
if [[ " $STAGES " == *" bench "* ]]; then
  stamp "bench_gemm (decode step: every model's shapes, candidates and anchors)"
  python3 benchmark/bench_gemm.py --json "$OUT/bench_gemm.json" --png "$OUT/bench_gemm.png" \
      --table "$OUT/routing_sm90.json" --skip-variants /tmp/smoke_bad.txt ${SGL:+--sglang "$SGL"} ${BENCH_ARGS:-} \
      2>&1 | tee -a "$LOG" | tail -150
fi
if [[ " $STAGES " == *" eager "* ]]; then
  stamp "bench_eager (bmm_fp8 host cost)"
  python3 benchmark/bench_eager.py --json "$OUT/bench_eager.json" --png "$OUT/bench_eager.png" 2>&1 | tee -a "$LOG" | tail -30
fi
if [[ " $STAGES " == *" tune "* ]]; then
  stamp "slim-kernel tune ${TUNE_ARGS:---model kimi-k3} (into a fresh cache dir)"
  rm -rf /tmp/tune_cache
  (cd /tmp && SLIM_KERNEL_CACHE_DIR=/tmp/tune_cache python3 -m slim_kernel tune ${TUNE_ARGS:---model kimi-k3}) 2>&1 \
      | tee -a "$LOG" | tail -5
  cp /tmp/tune_cache/routing/*.json "$OUT/" 2>/dev/null
fi
if [[ " $STAGES " == *" cold "* ]]; then
  stamp "cold start of N ranks on one JIT cache (cold_start.py ${COLD_ARGS:-})"
  python3 benchmark/cold_start.py --json "$OUT/cold_start.json" ${SGL:+--sglang "$SGL"} ${COLD_ARGS:-} 2>&1 \
      | tee -a "$LOG" | tail -60
fi
if [[ " $STAGES " == *" ncu "* ]]; then
  stamp "ncu profile"
  ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel --csv \
      --metrics "$(cd benchmark && python3 profile_gemm.py --metrics)" \
      python3 benchmark/profile_gemm.py ${SGL:+--sglang "$SGL"} ${PROFILE_ARGS:-} >"$OUT/ncu.csv" 2>>"$LOG"
  python3 benchmark/ncu_table.py "$OUT/ncu.csv" 2>&1 | tee -a "$LOG" | tail -60
  if [[ -n "${PM_ARGS:-}" ]]; then
    stamp "ncu PM sampling"
    ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel --section PmSampling \
        --pm-sampling-interval "${PM_INTERVAL:-1000}" -f -o /tmp/pm python3 benchmark/profile_gemm.py ${SGL:+--sglang "$SGL"} \
        $PM_ARGS >>"$LOG" 2>&1 || stamp "PM sampling failed (log)"
    ncu -i /tmp/pm.ncu-rep --page raw --csv --print-metric-instances values >/tmp/pm.csv 2>>"$LOG" \
        && python3 benchmark/pm_series.py /tmp/pm.csv 2>&1 >"$OUT/pm_series.json" | tee -a "$LOG" | tail -20
  fi
fi
if [[ " $STAGES " == *" timeline "* ]]; then
  stamp "kernel timeline of the decode step (timeline.py ${TIMELINE_ARGS:-})"
  python3 benchmark/timeline.py --json "$OUT/timeline.json" ${SGL:+--sglang "$SGL"} ${TIMELINE_ARGS:---case fused_a@1} \
      2>>"$LOG" | tee -a "$LOG" | tail -80
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
