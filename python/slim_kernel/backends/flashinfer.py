"""flashinfer backend. Importing this module imports flashinfer (so only on first use).

bmm_fp8 lives in :mod:`.flashinfer_fastpath` (importable without flashinfer, for `info`).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import flashinfer.gemm
import torch
from flashinfer.gemm import tinygemm_bf16

from ..devices import on_device
from ..names import FLASHINFER_FUSED_A_PROGRAMS as FLASHINFER_PROGRAMS
from ..names import FLASHINFER_ROUTERS, flashinfer_router_name
from ..pdl import launch_pdl
from .flashinfer_fastpath import bmm_fp8 as _bmm_fp8
from .flashinfer_fastpath import fast_path_state  # noqa: F401

# flashinfer launches on the current device (runtime-API launches, torch.cuda.current_blas_handle(),
# per-stream workspaces): every call here runs with the tensors' device current (slim_kernel/devices.py).
bmm_fp8 = on_device(_bmm_fp8)  # this backend's bmm_fp8: the fast path, on out's device


def router_kernel(e: int, k: int, out_dtype: torch.dtype):
    """flashinfer's fixed-shape router GEMM for (E, K, out dtype) (M 1..16), or None where the
    installed flashinfer does not ship it."""
    out = str(out_dtype).removeprefix("torch.")
    if (e, k, out) not in FLASHINFER_ROUTERS:
        return None
    return getattr(flashinfer.gemm, flashinfer_router_name(e, k, out), None)


# prepare_<op>(args, variant, pdl) is called once per call signature and launch context (the op
# layer caches what it returns), like the JIT backend's: the kernel and the PDL flag are bound
# here, so a call is the launch alone. ``pdl`` None (a direct call): slim_kernel.pdl decides now.
# The weights are parameters, never written by the kernel before, so PDL is safe.
def prepare_router(args, variant: str | None = None, pdl: bool | None = None):
    output, _, router_weights = args
    kernel = router_kernel(*router_weights.shape, output.dtype)
    if kernel is None:
        raise RuntimeError(f"this flashinfer has no {flashinfer_router_name(*router_weights.shape, output.dtype)}")
    pdl = launch_pdl(device=output.device) if pdl is None else pdl

    def run(output: torch.Tensor, hidden_states: torch.Tensor, router_weights: torch.Tensor) -> None:
        # flashinfer wants a dense (M, K) activation and the (K, E) column-major weight view.
        kernel(hidden_states.contiguous(), router_weights.t(), output, launch_with_pdl=pdl)
    return on_device(run, output.device)


def fused_a_program(variant: str, k: int, pdl: bool) -> str | None:
    """The flashinfer program name of ``variant`` for this K and launch context, or None where
    the installed flashinfer does not have it."""
    tile = FLASHINFER_PROGRAMS.get(variant)
    if tile is None:
        raise ValueError(f"unknown flashinfer fused-A variant {variant!r} (known: {', '.join(FLASHINFER_PROGRAMS)})")
    try:
        from flashinfer.gemm.routergemm import get_tinygemm2_wgmma_op  # noqa: F401
        from flashinfer.jit import cake_tinygemm2_wgmma as programs
    except ImportError:
        return None
    # flashinfer's naming: the 3-D-box build where the tile has one and K allows it (as its own
    # dispatch picks), no bias, PDL or not
    rest = "_NOBIAS" + ("_PDL" if pdl else "")
    names = ([tile + "_BOX3D" + rest] if k % 1024 == 0 else []) + [tile + rest]
    return next((name for name in names if hasattr(programs, name)), None)


class FusedATile(NamedTuple):
    """The launch of one of ``tinygemm_bf16``'s sm_90 programs: a CTA per ``tokens`` x ``rows`` tile of the
    output (``cluster`` CTAs each where the program splits K over a cluster), ``smem`` bytes of shared memory."""
    name: str
    tokens: int
    rows: int
    smem: int
    cluster: int = 1


# tinygemm_bf16's reference kernel (flashinfer's csrc/tinygemm2.cu: 8 tokens x 16 rows per CTA, 16 ring stages of
# 12 KiB on sm_90): what it runs where no generated sm_90a program serves the shape, and every shape before 0.7.4
REFERENCE_TILE = FusedATile("reference", 8, 16, 16 * 12288)


@functools.cache
def fused_a_tile(m: int, n: int, k: int, variant: str | None = None) -> FusedATile | None:
    """The tile of the sm_90 program the installed flashinfer runs for fused-A at (M, N, K): its own choice
    (``variant`` None: its window table, as ``tinygemm_bf16`` dispatches) or a pinned program; the same with PDL
    or without. None where this flashinfer's layout is not one this reads (its helpers are private: present in
    0.7.4, absent before). ``estimate.py`` places the call's grid on the device with it."""
    from flashinfer.gemm import routergemm as rg

    if not hasattr(rg, "_tinygemm2_wgmma_identifier"):  # 0.7.2-0.7.3: the reference kernel serves every call
        return REFERENCE_TILE if variant is None and hasattr(rg, "get_tinygemm2_module") else None
    program = _default_program(m, n, k, False) if variant is None else fused_a_program(variant, k, False)
    if program is None:
        return REFERENCE_TILE if variant is None else None
    try:
        from flashinfer.jit import cake_tinygemm2_wgmma as programs

        tile = rg._tinygemm2_wgmma_tile(program)
        tokens, rows = rg._TINYGEMM2_WGMMA_TILES[tile]
        cluster = min(4, -(-k // 256)) if tile in rg._WGMMA_CLUSTER_TILES else 1
        return FusedATile(tile, int(tokens), int(rows), int(getattr(programs, program).dynamic_smem_bytes), cluster)
    except Exception:  # noqa: BLE001  (private helpers: a later release may rename or reshape them)
        return None


def prepare_fused_a(args, variant: str | None = None, pdl: bool | None = None):
    output, mat_a, mat_b = args
    pdl = launch_pdl(device=output.device) if pdl is None else pdl
    program = fused_a_program(variant, mat_a.shape[1], pdl) if variant else None
    if program is not None:
        from flashinfer.gemm.routergemm import get_tinygemm2_wgmma_op

        op = get_tinygemm2_wgmma_op()

        def run_program(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
            op(program, mat_a.contiguous(), mat_b.t(), None, output)
        return on_device(run_program, output.device)

    def run(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
        # tinygemm computes input @ weight.T with a contiguous (N, K) weight: mat_b.T, no copy.
        tinygemm_bf16(mat_a.contiguous(), mat_b.t(), output, use_pdl=pdl)
    return on_device(run, output.device)


def first_use_builds(calls, device: torch.device) -> dict:
    """``{module: loader}``: the flashinfer modules the calls ``(op, m, n, k)`` build on first use, in either
    launch context: flashinfer's RMSNorm (the PDL launch context's producer), the fixed-shape router
    module, and per fused-A call the program ``tinygemm_bf16``
    picks and every pinned program. Each builds (nvcc, 10-50 s) and loads one module, so
    ``slim-kernel tune`` runs them side by side before it times anything instead of one after
    another inside the timing loop. Where flashinfer's layout differs from 0.7.4's, a module it
    cannot name here is left to its first call."""
    from ..names import ROUTER

    loaders: dict[str, object] = {"norm": lambda: _rmsnorm_once(device)} if calls else {}
    for op, m, n, k in calls:
        if op == ROUTER:
            for dtype in (torch.float32, torch.bfloat16):
                if router_kernel(n, k, dtype) is not None:  # one module serves every router
                    loaders.setdefault("router", lambda n=n, k=k, dtype=dtype: _router_once(n, k, dtype, device))
            continue
        for pdl in (False, True):
            names = {fused_a_program(v, k, pdl) for v in FLASHINFER_PROGRAMS} | {_default_program(m, n, k, pdl)}
            loaders.update((name, lambda name=name: _load_program(name, device)) for name in names if name)
    return loaders


def _default_program(m: int, n: int, k: int, pdl: bool) -> str | None:
    """The generated sm_90a program ``tinygemm_bf16`` runs at (M, N, K), or None (its reference kernel, or a
    flashinfer whose private dispatch helpers this does not read)."""
    try:
        from flashinfer.gemm import routergemm as rg

        enabled = getattr(rg, "_tinygemm2_wgmma_enabled", None)  # its switch: the env var, CUDA >= 12.8
        if enabled is not None and not enabled(os.environ.get("FLASHINFER_DISABLE_TINYGEMM2_WGMMA", "0"), (9, 0)):
            return None
        return rg._tinygemm2_wgmma_identifier(m, n, k, False, pdl)
    except Exception:  # noqa: BLE001  (a private helper: absent before 0.7.4, its signature may change)
        return None


def _load_program(name: str, device: torch.device) -> None:
    from flashinfer.jit import cake_tinygemm2_wgmma as programs

    record = getattr(programs, name)
    record.load(record.target_for(torch.cuda.get_device_capability(device)))


def _router_once(e: int, k: int, dtype: torch.dtype, device: torch.device) -> None:
    """One call of a fixed-shape router: builds the module every router shares."""
    x = torch.zeros(1, k, device=device, dtype=torch.bfloat16)
    w = torch.zeros(e, k, device=device, dtype=torch.bfloat16)
    with torch.cuda.device(device):
        router_kernel(e, k, dtype)(x, w.t(), torch.empty(1, e, device=device, dtype=dtype), launch_with_pdl=False)
        torch.cuda.synchronize(device)


def _rmsnorm_once(device: torch.device) -> None:
    """One call of the PDL launch context's producer (``timing.producers``): builds its module."""
    from ..timing import producers

    with torch.cuda.device(device):
        producers(torch.empty(1, 128, device=device, dtype=torch.bfloat16))["pdl"]()
        torch.cuda.synchronize(device)
