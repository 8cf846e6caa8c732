"""JIT backend: our CUDA kernels (``jit/kernels/``, catalogued in ``jit/catalogue.py``) for both GEMM ops.

``prepare_<op>(args, variant)`` is called once per call signature (the op layer caches the
result): it picks the kernel configuration (``jit/routed.py``: ``SLIM_KERNEL_JIT_CONFIG_<OP>``
rules, else the routing table's ``variant``, else the catalogue's fallback), compiles/loads the
instance and returns ``fn(output, *inputs)`` with the launch geometry bound, so a call is one
launch. Under ``SLIM_KERNEL_JIT=cache-or-fallback`` an instance missing from the cache makes it
decline the call (``registry.CallNotServed``: the next backend serves it); under ``cache-only``
the call raises. Importing this module imports only torch; the JIT runtime loads on the first prepare.

Environment (read when a call is first planned; ``set_config`` changes the rules at run time):
  SLIM_KERNEL_JIT_CONFIG_DSV3_ROUTER_GEMM   tile rules, e.g. "8:kernel=narrow,rows=2;64:rt=1,stages=8"
  SLIM_KERNEL_JIT_CONFIG_DSV3_FUSED_A_GEMM  (syntax: jit/rules.py)
"""

from __future__ import annotations

import torch

from .. import devices, knobs
from ..backend import Backend
from ..errors import CallNotServed
from ..jit import catalogue as cat
from ..jit.arch import limits
from ..jit.routed import config_for, env_var, launch_reason, rules, set_config  # noqa: F401  (the backend's config API)
from ..names import FUSED_A, ROUTER
from ..pdl import launch_pdl

_INT32_MAX = 2**31 - 1
_LIMITS: dict[int, object] = {}


def _limits(device_index: int):
    """The device's SM count and limits (``jit.arch.device_limits``), read once per device."""
    got = _LIMITS.get(device_index)
    if got is None:
        from ..jit.arch import device_limits

        got = _LIMITS[device_index] = device_limits(device_index)
    return got


try:  # the raw stream handle without building a torch.cuda.Stream object
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # pragma: no cover - older/newer torch
    def _raw_stream(device_index: int) -> int:
        return torch.cuda.current_stream(device_index).cuda_stream


def _prepare(op: str, output: torch.Tensor, act: torch.Tensor, n: int, ldw: int, variant: str | None,
             pdl: bool | None):
    """fn(output, act, w) launching the configured kernel for this call signature and launch
    context (``pdl``: with PDL or not; None: as slim_kernel.pdl decides now)."""
    from ..jit import get_kernel
    from ..jit.cache import CacheMissError
    from ..jit.runtime import KernelLoadError, carveout_percent

    m, k = act.shape
    dev = devices.index(act.device)  # the tensors' device: kernel, SM count, stream (slim_kernel/devices.py)
    lim = _limits(dev)
    _, cfg = config_for(op, m, variant, (n, k), lim)  # one that fits the device
    why = launch_reason(cfg, op, m, (n, k), lim)
    if why is not None:  # rules sized for another device, or nothing fits: the next backend serves
        raise CallNotServed(f"JIT config {cfg} at M={m}, N={n}, K={k} {why}")
    out_dtype = str(output.dtype).removeprefix("torch.")
    try:
        kernel = get_kernel(cfg.instance(op, m, out_dtype, (n, k)), dev)
    except CacheMissError as exc:
        if knobs.jit_mode() != "cache-or-fallback":
            raise
        raise CallNotServed(f"cannot serve this call without compiling: {exc}") from None
    except KernelLoadError as exc:  # a cubin this driver cannot run: the next backend serves
        raise CallNotServed(str(exc)) from None
    sms = lim.sms
    grid, block, cluster = cfg.geometry(n, k, sms)
    smem = cfg.smem(m, (n, k))
    why = kernel.launch_reason(block[0] * block[1] * block[2], smem)
    if why is not None:  # the driver's own answer disagrees with the catalogue's: the next backend serves
        raise CallNotServed(f"JIT config {cfg} at M={m}, N={n}, K={k}: {why}")
    carveout = kernel.launch_carveout(carveout_percent(smem, grid[0] * grid[1] * grid[2], sms, lim.smem_per_sm,
                                                       knobs.smem_room(), cluster is not None))
    launch = kernel.launch
    lda = act.stride(0) if m > 1 else k
    ldo = output.stride(0)
    pdl = launch_pdl(device=dev) if pdl is None else pdl

    def run(output, act, w):
        launch(grid, block, (act.data_ptr(), w.data_ptr(), output.data_ptr(), m, n, k, lda, ldw, ldo),
               stream=_raw_stream(dev), smem=smem, pdl=pdl, cluster=cluster, carveout=carveout)
    return run


def prepare_router(args, variant: str | None, pdl: bool | None = None):
    output, hidden_states, router_weights = args
    return _prepare(ROUTER, output, hidden_states, router_weights.shape[0], router_weights.stride(0), variant, pdl)


def prepare_fused_a(args, variant: str | None, pdl: bool | None = None):
    # mat_b (K, N) column-major is the (N, K) weight read row by row: row stride = mat_b.stride(1).
    output, mat_a, mat_b = args
    return _prepare(FUSED_A, output, mat_a, mat_b.shape[1], mat_b.stride(1), variant, pdl)


# ---- per-call eligibility (the op modules' KernelSpec.check; pure torch, no runtime) ----

def _operand_reason(name: str, t: torch.Tensor, rows: int, k: int, row_stride: int, k_stride: int) -> str | None:
    if k > 1 and k_stride != 1:
        return f"{name} is not unit-stride along K (strides {t.stride()})"
    if rows > 1 and (row_stride % cat.VEC or row_stride > _INT32_MAX):
        return f"{name} row stride {row_stride} is not a multiple of {cat.VEC} below 2**31"
    if t.data_ptr() % 16:
        return f"{name} is not 16-byte aligned"
    return None


def _common_reason(output, act, n) -> str | None:
    m, k = act.shape
    if not 1 <= m <= cat.MAX_M:
        return f"M={m} is outside 1..{cat.MAX_M}"
    if k % cat.VEC:
        return f"K={k} is not a multiple of {cat.VEC}"
    if n > _INT32_MAX or k > _INT32_MAX or output.stride(0) > _INT32_MAX:
        return "a dimension does not fit in int32"
    if n > 1 and output.stride(1) != 1:
        return "output is not row-major"
    return _operand_reason("activation", act, m, k, act.stride(0), act.stride(1))


def _fast_ok(output, act, w, n, k, w_row_stride, w_k_stride) -> bool:
    """The common case in one expression (the per-call check runs once per call signature)."""
    m = act.shape[0]
    a0, a1 = act.stride()
    return (m <= cat.MAX_M and not k & 7 and (a1 == 1 or k == 1) and (m == 1 or not a0 & 7)
            and (w_k_stride == 1 or k == 1) and not w_row_stride & 7
            and (output.stride(1) == 1 or n == 1) and not (act.data_ptr() | w.data_ptr()) & 15
            and max(a0, w_row_stride, output.stride(0), n, k) <= _INT32_MAX)


def router_check(output, hidden_states, router_weights) -> str | None:
    e, k = router_weights.shape
    ws = router_weights.stride()
    if _fast_ok(output, hidden_states, router_weights, e, k, ws[0], ws[1]):
        return None
    return (_common_reason(output, hidden_states, e)
            or _operand_reason("router_weights", router_weights, e, k, ws[0], ws[1]))


def fused_a_check(output, mat_a, mat_b) -> str | None:
    k, n = mat_b.shape
    bs = mat_b.stride()
    if _fast_ok(output, mat_a, mat_b, n, k, bs[1], bs[0]):
        return None
    return (_common_reason(output, mat_a, n)
            or _operand_reason("mat_b.T", mat_b, n, k, bs[1], bs[0]))


def probe() -> str | None:
    """Cheap availability check (None = usable): a compiler and the driver are there."""
    try:
        from ..jit import available
    except ImportError as exc:
        return f"JIT runtime missing: {exc}"
    return available()


# ---- the backend unit (slim_kernel/backend.py) ----

ASSUMED_REGS = 128  # an uncapped kernel's registers per thread where the catalogue does not say
SM90 = limits("sm_90")  # the estimate places grids on the SMs of the architecture the tables measured


class JitBackend(Backend):
    """Our kernels: one table candidate per configuration of ``jit/catalogue.py`` (``jit:<variant>``)."""

    name = "jit"
    measured_only = True  # configurations sized on sm_90: elsewhere only pinned or after `slim-kernel tune`

    def probe(self) -> str | None:
        return probe()

    def canonical(self, op: str, variant: str | None) -> str | None:
        return cat.VARIANTS[op].canonical(variant) if op in cat.VARIANTS else variant

    def offers(self, op: str, variant: str | None, m: int, nk: tuple[int, int]) -> bool:
        cfg = cat.VARIANTS.get(op, {}).get(variant or "")
        return cfg is not None and cat.variant_serves(cfg, op, m, nk)

    def grid(self, op, variant, n, k, m, sms, reader):
        cfg = cat.VARIANTS.get(op, {}).get(variant or "")
        if cfg is None:
            return None
        dims, block, _ = cfg.geometry(n, k, sms)
        ctas = dims[0] * dims[1] * dims[2]
        threads = block[0] * block[1] * block[2]
        registers = getattr(cfg, "registers", None)
        regs = registers(m, (n, k)) if registers else ASSUMED_REGS
        per_sm = max(1, min(SM90.threads_per_sm // threads, SM90.regs_per_sm // (threads * regs),
                            SM90.smem_per_sm // (cfg.smem(m, (n, k)) + SM90.smem_reserved_per_cta), 32))
        return ctas, sms * per_sm

    def body(self, op, variant, n, k, m, reader) -> str:
        """Narrow configurations have a straight-line body for the K they are fitted to
        (``Narrow.exact_for``) and a generic one."""
        exact_for = getattr(cat.VARIANTS.get(op, {}).get(variant or ""), "exact_for", None)
        return "exact" if exact_for is not None and exact_for((n, k)) else ""

    def lane_fill(self, op, variant, k) -> float:
        fill = getattr(cat.VARIANTS.get(op, {}).get(variant or ""), "lane_fill", None)
        return fill(k) if fill else 1.0

    def tune_candidates(self, op, target, args, pdl, prepare, point) -> dict:
        """One fn per distinct kernel (``catalogue.first_alike``): configurations that launch the same
        kernel at this call share it, so tune checks and times it once."""
        lim = _limits(devices.index(point.device))
        nk = (point.shape.n, point.shape.k)
        alike = cat.first_alike(op, point.m, point.shape.out, nk, lim.sms)
        out: dict = {}
        for name, first in alike.items():
            if launch_reason(cat.VARIANTS[op][name], op, point.m, nk, lim) is not None:
                continue  # cannot launch on this device: never timed, never picked
            out[f"jit:{name}"] = target(args, name, pdl) if first == name else out[f"jit:{first}"]
        return out

    def first_use_builds(self, calls, device) -> dict:
        """Every JIT instance the calls ``(op, m, n, k, out)`` may run, compiled in parallel (one loader)."""
        if not calls:
            return {}
        return {"jit": lambda: _precompile(calls, device)}


def _precompile(calls, device) -> None:
    import os

    from ..jit import arch_for_device
    from ..jit.compiler import get_compiler
    from ..jit.parallel import compile_all

    arch = arch_for_device(devices.index(device))
    jobs = list(dict.fromkeys(
        (cfg.instance(op, m, out, (n, k)), arch)
        for op, m, n, k, out in calls for cfg in cat.VARIANTS[op].values() if cat.variant_serves(cfg, op, m, (n, k))))
    compile_all(jobs, get_compiler().name, os.cpu_count() or 1, None)


BACKEND = JitBackend()
