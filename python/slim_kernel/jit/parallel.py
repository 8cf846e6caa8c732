"""Compile kernel instances into the cache in parallel (worker processes). Torch-free."""

from __future__ import annotations

import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed

from .cache import load_or_compile
from .compiler import CompileError, CompilerUnavailableError
from .spec import KernelInstance


def _compile_one(instance: KernelInstance, arch: str, compiler: str) -> tuple[bool, str | None]:
    """``(compiled by this call, why it is not in the cache or None)``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a store failure is reported per entry instead
            entry = load_or_compile(instance, arch, compiler)
    except (CompileError, CompilerUnavailableError, OSError) as exc:
        return False, str(exc)
    if entry.path is None:
        return True, f"compiled but not stored: {entry.store_error}"
    return entry.compiled, None


def compile_all(todo: list, compiler: str, jobs: int, bar=None) -> dict:
    """``{(instance, arch): (compiled by this run, why it failed)}``."""
    results = {}
    workers = min(jobs, len(todo))
    if workers <= 1:
        for job in todo:
            results[job] = _compile_one(*job, compiler)
            if bar is not None:
                bar.update(1)
        return results
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
        futures = {pool.submit(_compile_one, *job, compiler): job for job in todo}
        for fut in as_completed(futures):
            try:
                results[futures[fut]] = fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died: report it with the others
                results[futures[fut]] = (False, f"compile worker failed: {exc!r}")
            if bar is not None:
                bar.update(1)
    return results
