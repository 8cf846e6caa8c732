"""`slim-kernel precompile [--arch 9.0a ...] [--model NAME | --router E,K[,OUT] | --fused-a N,K ...] [--ops ...]`:
fill the JIT cache ahead of time.

With shapes (a model's, or given one by one: ``slim_kernel/models.py``) it compiles exactly the
instances the routing can pick for them on each listed arch (``jit/routed.py``: every M of the JIT
window, both launch contexts, the installed flashinfer version, the tile rules in force; for the
visible GPU of that arch, else every GPU a shipped table measured on it); without,
every kernel instantiation of the catalogue. In parallel, with no GPU needed, so an image can ship
a warm cache and serve with ``SLIM_KERNEL_JIT=cache-only``. At the end every entry is re-read from disk and
verified, and one summary line counts those: compiled by this run, or already present (before the
run, or published meanwhile by a concurrent run). Progress: a bar on a terminal, elsewhere (Docker builds,
CI logs) a line every few seconds with the count and the elapsed time; ``--no-progress`` silences both.

Exit status: 0 every instantiation is verified in the cache; 1 some could not be compiled or
stored (each one named with the reason: read-only or full file system, permissions, a file where
a directory belongs, ...); 2 bad input (unknown op, malformed or unsupported arch, no compiler).
"""

from __future__ import annotations

import os
import sys
import time

from ..models import add_shape_arguments, shapes_from_args
from .arch import normalize_arch, sm_version
from .cache import ENV_CACHE_DIR, cache_root, os_reason, prepare_dir, verify_on_disk
from .compiler import COMPILER_NAMES, ENV_COMPILER, get_compiler
from .parallel import compile_all
from .spec import KernelInstance

# The shipped kernels use SM 9.0 PTX (griddepcontrol for PDL, ...); the op specs say min_sm=(9, 0).
MIN_SM = 90
TUNE_MS = "1-16,17,20,24,28,32,40,48,56,64"  # what the shipped table measures
LINE_EVERY_S = 5.0  # where stderr is not a terminal: a progress line this often


def add_arguments(parser) -> None:
    parser.add_argument("--arch", action="append", metavar="ARCH",
                        help="target arch, SM >= 9.0, e.g. 9.0a or sm_100a (repeatable; default: the visible "
                             "GPUs, else 9.0a)")
    add_shape_arguments(parser)
    parser.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (default: all JIT ops)")
    parser.add_argument("--compiler", choices=COMPILER_NAMES,
                        help=f"force a compiler (default: ${ENV_COMPILER} or automatic)")
    parser.add_argument("--cache-dir", help=f"cache directory (default: ${ENV_CACHE_DIR} or the user cache dir)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="parallel compiles (default: the number of cores)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress (a bar on a terminal, else a line every few seconds)")
    parser.add_argument("--tune", action="store_true",
                        help="first measure the shapes on this GPU (`slim-kernel tune`; needs the GPU the image "
                             "will serve on), then compile what that table routes")
    parser.add_argument("--tune-ms", default=TUNE_MS, help=f"M values --tune measures (default {TUNE_MS})")


def catalogue() -> list[tuple[str, KernelInstance]]:
    """``(op, instance)`` for every kernel instantiation the ops can launch: the one place precompile
    reads the kernel catalogue from."""
    from .catalogue import all_instances

    return all_instances()


def load_instances(ops: list[str] | None) -> list[KernelInstance]:
    """The instances of ``ops`` (all when None); ValueError naming unknown ops."""
    try:
        pairs = catalogue()
    except ImportError as exc:
        raise RuntimeError(f"the kernel catalogue cannot be loaded: {exc}") from exc
    known = sorted({op for op, _ in pairs})
    unknown = [op for op in ops or () if op not in known]
    if unknown:
        raise ValueError(f"--ops: unknown op(s) {', '.join(unknown)}; JIT ops are {', '.join(known)}")
    return [inst for op, inst in pairs if not ops or op in ops]


def instances_for(arch: str, ops: list[str] | None, shapes: list | None) -> list[KernelInstance]:
    """What to compile for ``arch``: the routed instances of ``shapes``, or (None) the whole catalogue."""
    everything = load_instances(ops)  # also names unknown ops
    if shapes is None:
        return everything
    from .routed import routed_instances

    return [inst for op, inst in routed_instances(arch, shapes) if not ops or op in ops]


def _scope(shapes: list | None) -> str:
    if shapes is None:
        return "every catalogued instance"
    return f"routed for {'; '.join(s.label() for s in shapes)}"


def supported_arch(arch: str) -> str:
    """``arch`` normalized; ValueError when malformed or older than the kernels support."""
    arch = normalize_arch(arch)
    if sm_version(arch) < MIN_SM:
        raise ValueError(f"arch {arch} is not supported: the JIT kernels need SM >= {MIN_SM // 10}.{MIN_SM % 10} "
                         "(e.g. 9.0a, 10.0a, 12.0a)")
    return arch


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


class LineProgress:
    """Progress where stderr is not a terminal (Docker builds, CI logs): one line every ``every`` seconds
    (and at the end) with the count and the elapsed time; the bar's ``update``/``close`` interface."""

    def __init__(self, total: int, every: float | None = None, stream=None):
        self.total, self.stream = total, stream or sys.stderr
        self.every = LINE_EVERY_S if every is None else every
        self.done, self.start = 0, time.perf_counter()
        self.last = self.start

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            self._line(now)

    def _line(self, now: float) -> None:
        print(f"precompile: {self.done} of {self.total} compiled, {now - self.start:.0f} s", file=self.stream,
              flush=True)

    def close(self) -> None:
        if self.done and self.last != self.start:  # said something before: say where it ended
            self._line(time.perf_counter())


def _progress_bar(total: int, wanted: bool):
    """On a terminal a tqdm bar on stderr (where tqdm is installed), elsewhere a line every few seconds;
    None when not wanted or nothing to compile."""
    if not wanted or not total:
        return None
    if not sys.stderr.isatty():
        return LineProgress(total)
    try:
        from tqdm import tqdm
    except ImportError:
        return LineProgress(total)
    return tqdm(total=total, unit="kernel", desc="compiling", file=sys.stderr, leave=False)


def _tune(shapes, ms_text: str) -> None:
    """`slim-kernel tune` of ``shapes`` on this GPU (RuntimeError/ValueError saying why it cannot)."""
    if not shapes:
        raise ValueError("--tune needs the shapes to measure (--model, --router or --fused-a)")
    from .. import tune

    path, data, notes = tune.tune(shapes, tune.parse_ms(ms_text), progress=True)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"tune: {len(data['measurements'][0]['entries'])} points in {path}")


def run(args) -> int:
    if args.cache_dir:
        os.environ[ENV_CACHE_DIR] = args.cache_dir  # inherited by the worker processes
    try:
        shapes = shapes_from_args(args)
        if args.tune:
            _tune(shapes, args.tune_ms)  # its table decides what the routing picks below
        archs = list(dict.fromkeys(supported_arch(a) for a in (args.arch or _default_archs())))
        jobs = [(inst, arch) for arch in archs for inst in instances_for(arch, args.ops, shapes)]
        compiler = get_compiler(args.compiler)
    except (RuntimeError, ValueError) as exc:
        print(f"slim-kernel precompile: {exc}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("slim-kernel precompile: --jobs must be >= 1", file=sys.stderr)
        return 2
    root = cache_root()
    todo = [job for job in jobs if verify_on_disk(*job, compiler) is not None]
    for arch in dict.fromkeys(arch for _, arch in todo):  # fail in a moment, not after every compile
        try:
            prepare_dir(arch)
        except OSError as exc:
            print(f"slim-kernel precompile: cannot store {arch} entries in the cache {root}: {os_reason(exc)}",
                  file=sys.stderr)
            return 1
    start = time.perf_counter()
    bar = _progress_bar(len(todo), not args.no_progress)
    results = compile_all(todo, compiler.name, args.jobs, bar)
    if bar is not None:
        bar.close()
    # What counts is what is on disk now, re-read, not what the compiles reported.
    missing = {job: why for job in jobs if (why := verify_on_disk(*job, compiler)) is not None}
    compiled = sum(results.get(job, (False,))[0] for job in jobs if job not in missing)
    for job, why in missing.items():
        reported = results.get(job, (False, None))[1]
        print(f"FAILED {job[0].label} {job[1]}: {reported or f'not in the cache after the run ({why})'}", file=sys.stderr)
    verified = len(jobs) - len(missing)
    print(f"precompile: {verified} of {len(jobs)} verified in the cache {root} ({compiled} compiled by this run, "
          f"{verified - compiled} already present{f', {len(missing)} FAILED' if missing else ''}); "
          f"{_scope(shapes)}; {', '.join(archs)}; {compiler.fingerprint()}; {time.perf_counter() - start:.1f} s")
    return 1 if missing else 0
