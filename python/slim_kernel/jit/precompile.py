"""`slim-kernel precompile [--arch 9.0a ...] [--ops ...]`: fill the JIT cache ahead of time.

Compiles every kernel instantiation the ops can launch (``slim_kernel.jit.catalogue.all_instances()``)
for the listed archs, in parallel, with no GPU needed, so an image can ship a warm cache. A second
run finds everything cached and says so.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from .arch import normalize_arch
from .cache import ENV_CACHE_DIR, cache_root, get_entry, is_cached
from .compiler import COMPILER_NAMES, ENV_COMPILER, CompileError, CompilerUnavailableError, get_compiler
from .spec import KernelInstance


def add_arguments(parser) -> None:
    parser.add_argument("--arch", action="append", metavar="ARCH",
                        help="target arch, e.g. 9.0a or sm_100a (repeatable; default: the visible GPUs, "
                             "else 9.0a)")
    parser.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (default: all JIT ops)")
    parser.add_argument("--compiler", choices=COMPILER_NAMES,
                        help=f"force a compiler (default: ${ENV_COMPILER} or automatic)")
    parser.add_argument("--cache-dir", help=f"cache directory (default: ${ENV_CACHE_DIR} or the user cache dir)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="parallel compiles (default: the number of cores)")


def _default_archs() -> list[str]:
    try:
        import torch

        if torch.cuda.is_available():
            from .arch import arch_for_device

            return sorted({arch_for_device(i) for i in range(torch.cuda.device_count())})
    except Exception:  # noqa: BLE001 - no torch/driver: fall through
        pass
    print("no GPU visible and no --arch: compiling for sm_90a (Hopper)", file=sys.stderr)
    return ["sm_90a"]


def load_instances(ops: list[str] | None) -> list[KernelInstance]:
    """The instances of ``ops`` (all JIT ops when None), from the kernel catalogue."""
    from . import catalogue

    known = tuple(catalogue.SOURCES)
    unknown = [op for op in ops or () if op not in known]
    if unknown:
        raise ValueError(f"--ops: unknown op(s) {', '.join(unknown)}; JIT ops are {', '.join(known)}")
    return [inst for _, inst in catalogue.all_instances(tuple(ops) if ops else known)]


def _compile_one(instance: KernelInstance, arch: str, compiler: str | None) -> tuple[bool, float, str | None]:
    start = time.perf_counter()
    try:
        entry = get_entry(instance, arch, compiler)
    except (CompileError, CompilerUnavailableError, OSError) as exc:
        return False, time.perf_counter() - start, str(exc)
    return entry.compiled, time.perf_counter() - start, None


class _Progress:
    """tqdm when installed, else one line per finished compile."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="kernel", desc="compiling", file=sys.stderr)
        except ImportError:
            self.bar = None

    def step(self, label: str, seconds: float, error: str | None) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label[:60])
            self.bar.update(1)
            if error:
                self.bar.write(f"FAILED {label}: {error}")
            return
        state = f"FAILED: {error}" if error else f"{seconds:.2f} s"
        print(f"[{self.done}/{self.total}] {label}  {state}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _label(instance: KernelInstance, arch: str) -> str:
    defines = ",".join(f"{k}={v}" for k, v in instance.defines)
    return f"{instance.entry}[{defines}] {arch}"


def run(args) -> int:
    if args.cache_dir:
        os.environ[ENV_CACHE_DIR] = args.cache_dir  # inherited by the worker processes
    try:
        archs = [normalize_arch(a) for a in (args.arch or _default_archs())]
        instances = load_instances(args.ops)
        compiler = get_compiler(args.compiler)
    except (RuntimeError, ValueError) as exc:
        print(f"slim-kernel precompile: {exc}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("slim-kernel precompile: --jobs must be >= 1", file=sys.stderr)
        return 2
    jobs = [(inst, arch) for arch in dict.fromkeys(archs) for inst in instances]
    todo = [(inst, arch) for inst, arch in jobs if not is_cached(inst, arch, compiler)]
    root = cache_root()
    print(f"{len(jobs)} instantiations ({len(instances)} kernels x {', '.join(dict.fromkeys(archs))}), "
          f"compiler {compiler.fingerprint()}, cache {root}")
    if not todo:
        print(f"nothing to do: all {len(jobs)} are already cached")
        return 0
    print(f"{len(jobs) - len(todo)} already cached, compiling {len(todo)} with {min(args.jobs, len(todo))} jobs")
    start = time.perf_counter()
    progress = _Progress(len(todo))
    failures = 0
    if min(args.jobs, len(todo)) == 1:
        results = ((inst, arch, _compile_one(inst, arch, compiler.name)) for inst, arch in todo)
        for inst, arch, (_, seconds, error) in results:
            failures += error is not None
            progress.step(_label(inst, arch), seconds, error)
    else:
        ctx = multiprocessing.get_context("forkserver")
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(todo)), mp_context=ctx) as pool:
            futures = {pool.submit(_compile_one, inst, arch, compiler.name): (inst, arch) for inst, arch in todo}
            for fut in as_completed(futures):
                inst, arch = futures[fut]
                _, seconds, error = fut.result()
                failures += error is not None
                progress.step(_label(inst, arch), seconds, error)
    progress.close()
    elapsed = time.perf_counter() - start
    print(f"compiled {len(todo) - failures} of {len(todo)} in {elapsed:.1f} s"
          + (f"; {failures} FAILED" if failures else ""))
    return 1 if failures else 0
