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
