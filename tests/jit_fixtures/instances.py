"""Kernel instances of the JIT runtime's own test kernels (tests/jit_fixtures/*.cuh)."""

from __future__ import annotations

from pathlib import Path

from slim_kernel.jit.spec import KernelInstance

HERE = Path(__file__).resolve().parent


def axpby(bias: int = 0) -> KernelInstance:
    """out[i] = alpha * x[i] * repeat + y[i] + BIAS over n bf16 elements (x, y, out, n, alpha, repeat)."""
    return KernelInstance.make(str(HERE / "fixture_axpby.cuh"), "fixture_axpby", "ppplfi", BIAS=bias)


def smem_cluster() -> KernelInstance:
    """(out fp32, info int32, words): dynamic smem round trip + cluster rank/size per block."""
    return KernelInstance.make(str(HERE / "fixture_smem_cluster.cuh"), "fixture_smem_cluster", "ppi")


def early_writer() -> KernelInstance:
    """(src, dst, n, delay_ns): dst = src after delay_ns, the dependents' launch triggered at entry."""
    return KernelInstance.make(str(HERE / "fixture_early_writer.cuh"), "fixture_early_writer", "ppll")


ALL = (axpby, smem_cluster, early_writer)


def k_fitted(k: int = 4096, n: int = 840) -> list[KernelInstance]:
    """The narrow configurations' straight-line instances fitted to a K below their own (catalogue
    ``Narrow.fitted_threads``; 840 rows: every row count divides it), every M they serve there, both outputs:
    compiled per call shape, so not in ``all_instances``, but held to the same limits."""
    from slim_kernel.jit import catalogue as cat

    return list(dict.fromkeys(  # configurations fitted alike (narrow_r2t896 at 6144 is narrow_r2t768k6) once
        cfg.instance(op, m, dt, (n, k)) for op, variants in cat.VARIANTS.items() for cfg in variants.values()
        if getattr(cfg, "fitted_threads", None) and 0 < cfg.fitted_threads(k) < cfg.threads
        for m in range(1, cfg.max_m((n, k)) + 1) for dt in cat.OUT_DTYPES[op]))
