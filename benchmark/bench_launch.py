"""JIT launch overhead and compile/cache times.

In one run on one GPU:
- eager host µs per launch of a bf16 elementwise add (n elements) through the native launcher
  and through the cuda-python fallback, each with prebuilt arguments and with the arguments
  taken from the tensors on every call (data_ptr() + current stream), side by side with
  ``torch.add(x, y, out=out)`` of the same size. Host µs = wall time of a loop of launches with
  no sync inside / launches, median of repeats (loops short enough not to fill the launch queue);
- cold NVRTC compile of one instantiation (empty cache; in-process and in a fresh process that
  also pays imports and loading libnvrtc), a warm cache hit (in-process and in a fresh process),
  and get_kernel's first (module load) and memoized calls.

    python benchmark/bench_launch.py --json benchmark/results/h200/bench_launch.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from slim_kernel import jit
from slim_kernel.jit import cache, runtime
from slim_kernel.jit.spec import KernelInstance

LAUNCHES, REPEATS, WARMUP = 200, 25, 50
TARGETS = {"cold_nvrtc_compile_s": 5.0, "warm_hit_ms": 20.0, "native_vs_torch_ratio": 1.2}

ADD_SOURCE = r"""
// bench_launch: out[i] = x[i] + y[i] over n bf16 elements (the same work as torch.add).
#include <cuda_bf16.h>
extern "C" __global__ void bench_add(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ y,
                                     __nv_bfloat16* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}
"""


def host_us(fn) -> float:
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(LAUNCHES):
            fn()
        samples.append((time.perf_counter() - t) / LAUNCHES * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def launch_overheads(src_dir: Path, n: int, dev: int) -> dict:
    inst = KernelInstance.make(str(src_dir / "bench_add.cuh"), "bench_add", "pppi")
    x = torch.randn(n, device=f"cuda:{dev}", dtype=torch.bfloat16)
    y = torch.randn(n, device=f"cuda:{dev}", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    grid, block = ((n + 255) // 256, 1, 1), (256, 1, 1)
    try:
        from torch._C import _cuda_getCurrentRawStream as raw_stream
    except ImportError:
        def raw_stream(d):
            return torch.cuda.current_stream(d).cuda_stream

    rows = {"torch.add(out=)": host_us(lambda: torch.add(x, y, out=out))}
    ref = x.float() + y.float()
    launchers = ["native", "python"] if runtime.native_module()[0] is not None else ["python"]
    for name in launchers:
        kernel = jit.get_kernel(inst, dev, launcher=name)
        launch = kernel.launch
        args = (x.data_ptr(), y.data_ptr(), out.data_ptr(), n)
        stream = raw_stream(dev)
        out.zero_()
        launch(grid, block, args, stream=stream)
        torch.cuda.synchronize()
        assert torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2), f"{name} launcher computed a wrong sum"
        rows[f"{name} (prebuilt args)"] = host_us(
            lambda launch=launch, args=args, stream=stream: launch(grid, block, args, stream=stream))
        rows[f"{name} (args from tensors)"] = host_us(
            lambda launch=launch: launch(grid, block, (x.data_ptr(), y.data_ptr(), out.data_ptr(), n),
                                         stream=raw_stream(dev)))
    return rows


_FRESH = r"""
import json, sys, time
t0 = time.perf_counter()
from slim_kernel.jit import cache
from slim_kernel.jit.spec import KernelInstance
inst = KernelInstance(sys.argv[1], sys.argv[2], tuple((k, int(v) if v.lstrip('-').isdigit() else v)
                      for k, v in json.loads(sys.argv[3])), sys.argv[4])
t1 = time.perf_counter()
entry = cache.get_entry(inst, sys.argv[5], "nvrtc")
t2 = time.perf_counter()
print(json.dumps({"compiled": entry.compiled, "import_s": t1 - t0, "get_entry_s": t2 - t1}))
"""


def fresh_process(inst: KernelInstance, arch: str, cache_dir: Path) -> dict:
    env = dict(os.environ, SLIM_KERNEL_CACHE_DIR=str(cache_dir))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _FRESH, inst.source, inst.entry,
                           json.dumps([[k, str(v)] for k, v in inst.defines]), inst.signature, arch],
                          capture_output=True, text=True, env=env, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t
    return result


def compile_times(src_dir: Path, arch: str, dev: int | None) -> dict:
    from slim_kernel.jit.catalogue import all_instances

    _, inst = all_instances()[0]  # a shipped kernel instance: what a cold first call compiles
    res = {"instance": f"{inst.entry} {dict(inst.defines)}", "arch": arch,
           "compiler": jit.get_compiler("nvrtc").fingerprint()}
    saved = os.environ.get(cache.ENV_CACHE_DIR)
    with tempfile.TemporaryDirectory(prefix="slim_bench_cache_") as tmp:
        os.environ[cache.ENV_CACHE_DIR] = str(Path(tmp) / "inproc")
        cache.clear_memory()
        t = time.perf_counter()
        entry = cache.get_entry(inst, arch, "nvrtc")
        res["cold_compile_inprocess_s"] = time.perf_counter() - t
        assert entry.compiled
        hits = []
        for _ in range(20):
            cache.clear_memory()
            t = time.perf_counter()
            assert not cache.get_entry(inst, arch, "nvrtc").compiled
            hits.append((time.perf_counter() - t) * 1e3)
        res["warm_hit_inprocess_ms"] = statistics.median(hits)
        t = time.perf_counter()
        cache.get_entry(inst, arch, "nvrtc")
        res["memory_hit_us"] = (time.perf_counter() - t) * 1e6
        fresh_dir = Path(tmp) / "fresh"
        cold = fresh_process(inst, arch, fresh_dir)
        assert cold["compiled"]
        res["cold_compile_fresh_process_s"] = cold["get_entry_s"]
        res["cold_fresh_process_total_s"] = cold["process_s"]
        warm = fresh_process(inst, arch, fresh_dir)
        assert not warm["compiled"]
        res["warm_hit_fresh_process_ms"] = warm["get_entry_s"] * 1e3
        # get_kernel: first call with a warm cache (key + read + cuModuleLoadData), then memoized
        if dev is not None:
            runtime.clear_loaded()
            t = time.perf_counter()
            jit.get_kernel(inst, dev)
            res["get_kernel_first_ms"] = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            for _ in range(1000):
                jit.get_kernel(inst, dev)
            res["get_kernel_memoized_us"] = (time.perf_counter() - t) * 1e3  # s / 1000 calls -> us
    if saved is None:
        os.environ.pop(cache.ENV_CACHE_DIR, None)
    else:
        os.environ[cache.ENV_CACHE_DIR] = saved
    cache.clear_memory()
    res["cold_nvrtc_compile_s"] = max(res["cold_compile_inprocess_s"], res["cold_compile_fresh_process_s"])
    res["warm_hit_ms"] = max(res["warm_hit_inprocess_ms"], res["warm_hit_fresh_process_ms"])
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="write the results here")
    parser.add_argument("-n", type=int, default=4096, help="elements of the elementwise add (default 4096)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_launch: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.cuda.current_device()
    arch = jit.arch_for_device(dev)
    src_dir = Path(tempfile.mkdtemp(prefix="slim_bench_src_"))
    (src_dir / "bench_add.cuh").write_text(ADD_SOURCE)
    try:
        launch = launch_overheads(src_dir, args.n, dev)
        comp = compile_times(src_dir, arch, dev)
    finally:
        shutil.rmtree(src_dir, ignore_errors=True)
    torch_us = launch["torch.add(out=)"]
    native_us = launch.get("native (args from tensors)")
    checks = {
        "cold_nvrtc_compile_s": [comp["cold_nvrtc_compile_s"], TARGETS["cold_nvrtc_compile_s"]],
        "warm_hit_ms": [comp["warm_hit_ms"], TARGETS["warm_hit_ms"]],
        "native_vs_torch_ratio": [native_us / torch_us if native_us else None, TARGETS["native_vs_torch_ratio"]],
    }
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": torch.cuda.get_device_name(dev), "arch": arch, "torch": torch.__version__,
        "elements": args.n, "launches_per_sample": LAUNCHES, "repeats": REPEATS,
        "host_us_per_launch": launch, "compile": comp, "runtime_info": jit.runtime_info(),
        "targets": {k: {"measured": v, "target": t, "met": v is not None and v <= t} for k, (v, t) in checks.items()},
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"{report['device']} ({arch}), torch {torch.__version__}, n={args.n} bf16")
    print(f"{'eager launch':<32}{'host us/launch':>16}{'vs torch':>10}")
    for name, us in launch.items():
        print(f"{name:<32}{us:>16.2f}{us / torch_us:>9.2f}x")
    print(f"cold NVRTC compile ({comp['instance']}): in-process {comp['cold_compile_inprocess_s']:.2f} s, "
          f"fresh process {comp['cold_compile_fresh_process_s']:.2f} s (process total {comp['cold_fresh_process_total_s']:.2f} s)")
    print(f"warm cache hit: in-process {comp['warm_hit_inprocess_ms']:.2f} ms, fresh process "
          f"{comp['warm_hit_fresh_process_ms']:.2f} ms; memory hit {comp['memory_hit_us']:.1f} us; "
          f"get_kernel first {comp['get_kernel_first_ms']:.2f} ms, memoized {comp['get_kernel_memoized_us']:.3f} us")
    for name, t in report["targets"].items():
        measured = "n/a" if t["measured"] is None else f"{t['measured']:.3f}"
        print(f"target {name}: {measured} <= {t['target']}: {'MET' if t['met'] else 'MISSED'}")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
