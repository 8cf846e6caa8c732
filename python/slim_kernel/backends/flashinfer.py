"""flashinfer backend: its unit (``BACKEND``), its per-call eligibility checks and every read of
flashinfer's private internals (the fused-A programs' tiles and dispatch; bmm_fp8's in
:mod:`.flashinfer_fastpath`). Importing this module does not import flashinfer: ``BACKEND.load``
does, on first use.

A private read that stops working (a release that renames or reshapes what it reads) is recorded,
listed by ``slim-kernel info`` (``BACKEND.health``) and warned about once at run time: the estimate
then treats flashinfer's fused-A call as a program it cannot know, never silently as another one.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from typing import NamedTuple

import torch

from .. import knobs
from ..backend import Backend
from ..devices import on_device
from ..models import MAX_M
from ..names import FLASHINFER_FUSED_A_PROGRAMS as FLASHINFER_PROGRAMS
from ..names import FLASHINFER_PDL_VARIANT as PDL_VARIANT
from ..names import FLASHINFER_ROUTERS, FUSED_A, ROUTER, flashinfer_router_name
from ..pdl import launch_pdl
from .flashinfer_fastpath import bmm_fp8 as _bmm_fp8
from .flashinfer_fastpath import fast_path_state  # noqa: F401

_BROKEN_READS: dict[str, str] = {}  # private read -> why it failed (info lists them; one warning each)


def _read_failed(what: str, exc: BaseException) -> None:
    if what not in _BROKEN_READS:
        _BROKEN_READS[what] = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"slim_kernel: flashinfer's {what} cannot be read ({_BROKEN_READS[what]}): the routing "
                      "estimate treats its fused-A call as a program it cannot know", RuntimeWarning, stacklevel=3)

# flashinfer launches on the current device (runtime-API launches, torch.cuda.current_blas_handle(),
# per-stream workspaces): every call here runs with the tensors' device current (slim_kernel/devices.py).
bmm_fp8 = on_device(_bmm_fp8)  # this backend's bmm_fp8: the fast path, on out's device


def router_kernel(e: int, k: int, out_dtype: torch.dtype):
    """flashinfer's fixed-shape router GEMM for (E, K, out dtype) (M 1..16), or None where the
    installed flashinfer does not ship it."""
    import flashinfer.gemm

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

    variant = None if variant == PDL_VARIANT else variant  # the same call, launched with PDL
    if not hasattr(rg, "_tinygemm2_wgmma_identifier"):  # 0.7.2-0.7.3: the reference kernel serves every call
        if hasattr(rg, "get_tinygemm2_module"):
            return REFERENCE_TILE if variant is None else None
        _read_failed("fused-A dispatch", AttributeError("routergemm has neither _tinygemm2_wgmma_identifier "
                                                        "nor get_tinygemm2_module"))
        return None
    program = _default_program(m, n, k, False) if variant is None else fused_a_program(variant, k, False)
    if program is None:
        return REFERENCE_TILE if variant is None else None
    try:
        from flashinfer.jit import cake_tinygemm2_wgmma as programs

        tile = rg._tinygemm2_wgmma_tile(program)
        tokens, rows = rg._TINYGEMM2_WGMMA_TILES[tile]
        cluster = min(4, -(-k // 256)) if tile in rg._WGMMA_CLUSTER_TILES else 1
        return FusedATile(tile, int(tokens), int(rows), int(getattr(programs, program).dynamic_smem_bytes), cluster)
    except Exception as exc:  # noqa: BLE001  (private helpers: a later release may rename or reshape them)
        _read_failed(f"tile table of program {program}", exc)
        return None


tinygemm_bf16 = None  # flashinfer.gemm.tinygemm_bf16, bound on first use


def prepare_fused_a(args, variant: str | None = None, pdl: bool | None = None):
    global tinygemm_bf16
    if tinygemm_bf16 is None:
        from flashinfer.gemm import tinygemm_bf16
    tiny = tinygemm_bf16
    output, mat_a, mat_b = args
    pdl = launch_pdl(device=output.device) if pdl is None else pdl
    if variant == PDL_VARIANT:
        variant, pdl = None, knobs.pdl()
    program = fused_a_program(variant, mat_a.shape[1], pdl) if variant else None
    if program is not None:
        from flashinfer.gemm.routergemm import get_tinygemm2_wgmma_op

        op = get_tinygemm2_wgmma_op()

        def run_program(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
            op(program, mat_a.contiguous(), mat_b.t(), None, output)
        return on_device(run_program, output.device)

    def run(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
        # tinygemm computes input @ weight.T with a contiguous (N, K) weight: mat_b.T, no copy.
        tiny(mat_a.contiguous(), mat_b.t(), output, use_pdl=pdl)
    return on_device(run, output.device)


def first_use_builds(calls, device: torch.device) -> dict:
    """``{module: loader}``: the flashinfer modules the calls ``(op, m, n, k)`` build on first use, in either
    launch context: flashinfer's RMSNorm (the PDL launch context's producer), the fixed-shape router
    module, and per fused-A call the program ``tinygemm_bf16``
    picks and every pinned program. Each builds (nvcc, 10-50 s) and loads one module, so
    ``slim-kernel tune`` runs them side by side before it times anything instead of one after
    another inside the timing loop. Where flashinfer's layout differs from 0.7.4's, a module it
    cannot name here is left to its first call."""

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
    flashinfer whose private dispatch helpers this does not read: recorded, with one warning)."""
    from flashinfer.gemm import routergemm as rg

    identify = getattr(rg, "_tinygemm2_wgmma_identifier", None)  # absent before 0.7.4: the reference kernel
    if identify is None:
        return None
    try:
        enabled = getattr(rg, "_tinygemm2_wgmma_enabled", None)  # its switch: the env var, CUDA >= 12.8
        if enabled is not None and not enabled(os.environ.get("FLASHINFER_DISABLE_TINYGEMM2_WGMMA", "0"), (9, 0)):
            return None
        return identify(m, n, k, False, pdl)
    except Exception as exc:  # noqa: BLE001  (private helpers: their signatures may change)
        _read_failed("fused-A dispatch (_tinygemm2_wgmma_identifier)", exc)
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


# ---- per-call eligibility (the op modules' KernelSpec.check; no flashinfer import) ----

def bmm_fp8_check(out, A, B, A_scale, B_scale) -> str | None:
    # cuBLASLt fp8: no e5m2 x e5m2, 16-byte aligned leading dimensions.
    if A.dtype == torch.float8_e5m2 and B.dtype == torch.float8_e5m2:
        return "cuBLASLt has no e5m2 x e5m2 fp8 GEMM"
    if A.shape[2] % 16:
        return f"k={A.shape[2]} is not a multiple of 16"
    if B.shape[2] % 8:
        return f"n={B.shape[2]} is not a multiple of 8"
    return None


ROUTER_MAX_M = 16  # flashinfer's fixed-shape routers: M 1..16
FUSED_A_MAX_M = MAX_M  # tinygemm_bf16 serves any M; past the decode window the op's other backends serve


def router_check(output, hidden_states, router_weights) -> str | None:
    m, k = hidden_states.shape
    if not 1 <= m <= ROUTER_MAX_M:
        return f"M={m} is outside 1..{ROUTER_MAX_M}"
    e, out = router_weights.shape[0], str(output.dtype).removeprefix("torch.")
    if (e, k, out) not in FLASHINFER_ROUTERS:
        shipped = ", ".join(f"{e}x{k} {o}" for e, k, o in sorted(FLASHINFER_ROUTERS))
        return f"flashinfer ships no router for E={e} K={k} {out} out (it has {shipped})"
    if not router_weights.is_contiguous():
        return "router_weights is not contiguous"
    return _alignment_reason("hidden_states", hidden_states, "router_weights", router_weights)


def fused_a_check(output, mat_a, mat_b) -> str | None:
    m, k = mat_a.shape
    n = mat_b.shape[1]
    if not 1 <= m <= FUSED_A_MAX_M:
        return f"M={m} is outside 1..{FUSED_A_MAX_M}"
    if k % 64:
        return f"K={k} is not a multiple of 64"
    if n % 16:
        return f"N={n} is not a multiple of 16"
    if not mat_b.t().is_contiguous():
        return "mat_b is not the transpose of a contiguous (N, K) weight"
    return _alignment_reason("mat_a", mat_a, "mat_b", mat_b)


def _alignment_reason(act_name: str, act, w_name: str, w) -> str | None:
    # the backend passes act.contiguous(): a contiguous view is passed as is, and flashinfer's
    # 16-byte loads fault on one that is not 16-byte aligned (e.g. a one-row slice)
    if act.is_contiguous() and act.data_ptr() % 16:
        return f"{act_name} is contiguous but not 16-byte aligned"
    if w.data_ptr() % 16:
        return f"{w_name} is not 16-byte aligned"
    return None


# ---- the backend unit (slim_kernel/backend.py) ----

OPAQUE_MARGIN = 0.2  # log-regret added to the fused-A call where its program cannot be known
# rows of N per CTA of each pinned fused-A program (names.FLASHINFER_FUSED_A_PROGRAMS) where the installed
# flashinfer cannot say: grids of 164 and 41 CTAs at N=2624 (ncu on the H200), one CTA per SM at a time
PINNED_ROWS_PER_CTA = {"s8il": 16, "cn16": 64}


class FlashinferBackend(Backend):
    """flashinfer's own calls (``flashinfer``) and, for fused-A, its pinned sm_90a programs (``flashinfer:<program>``)."""

    name = "flashinfer"

    def probe(self) -> str | None:
        return None if importlib.util.find_spec("flashinfer") is not None else "flashinfer-python is not installed"

    def load(self) -> None:
        import flashinfer.gemm  # noqa: F401  (a broken install fails here, once)

    def offers(self, op, variant, m, nk) -> bool:
        return variant is None or (op == FUSED_A and (variant in FLASHINFER_PROGRAMS or variant == PDL_VARIANT))

    def reader(self, op: str, arch: str):
        """``fused_a_tile`` where flashinfer is installed and importable and the call is fused-A on sm_90."""
        if op != FUSED_A or arch != "sm_90" or self.version() is None:
            return None
        try:
            self.load()
        except Exception:  # noqa: BLE001  (selection reports a broken install when it loads the backend)
            return None
        return fused_a_tile

    def grid(self, op, variant, n, k, m, sms, reader):
        from ..jit.arch import limits

        sm90, tile = limits("sm_90"), reader(m, n, k, variant) if reader is not None and op == FUSED_A else None
        if tile is not None:  # the program the installed flashinfer runs, its tile named by flashinfer itself
            ctas = tile.cluster * -(-m // tile.tokens) * -(-n // tile.rows)
            return ctas, sms * max(1, sm90.smem_per_sm // (tile.smem + sm90.smem_reserved_per_cta))
        rows = PINNED_ROWS_PER_CTA.get(variant or "") if op == FUSED_A else None
        return (-(-n // rows), sms) if rows else None  # a pinned program: its tile, one CTA per SM at a time

    def body(self, op, variant, n, k, m, reader) -> str:
        tile = reader(m, n, k, variant) if reader is not None and op == FUSED_A else None
        return tile.name if tile is not None else ""

    def margin(self, op, variant, reader) -> float:
        return OPAQUE_MARGIN if op == FUSED_A and variant in (None, PDL_VARIANT) and reader is None else 0.0

    def describe(self, op, n, k, m, sms, reader) -> str | None:
        tile = reader(m, n, k, None) if reader is not None and op == FUSED_A else None
        if tile is None:
            return None
        ctas, at_once = self.grid(op, None, n, k, m, sms, reader)
        return f"flashinfer {self.version()} runs its {tile.name} program here ({ctas} CTAs, {at_once} at a time)"

    def tune_candidates(self, op, target, args, pdl, prepare, point) -> dict:
        out = {"flashinfer": target(args, None, pdl) if prepare else target}
        if op == FUSED_A and prepare:
            for name in FLASHINFER_PROGRAMS:
                if fused_a_program(name, point.shape.k, pdl) is not None:
                    out[f"flashinfer:{name}"] = target(args, name, pdl)
            if not pdl and knobs.pdl():  # after a PDL-aware producer the own call already launches with PDL
                out[f"flashinfer:{PDL_VARIANT}"] = target(args, PDL_VARIANT, pdl)
        return out

    def first_use_builds(self, calls, device) -> dict:
        return first_use_builds([(op, m, n, k) for op, m, n, k, _ in calls], device)

    def health(self) -> list[str]:
        return [f"flashinfer's {what} cannot be read: {why}" for what, why in _BROKEN_READS.items()]


BACKEND = FlashinferBackend()
