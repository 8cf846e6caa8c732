"""JIT backend: our CUDA kernels (``slim_kernel/jit/kernels/``) served through the JIT runtime.

Both ops are the same skinny GEMM, ``out(M, N) = act(M, K) @ W(N, K)^T`` with M <= 16
(kernel body: ``kernels/common.cuh``): the router with W = the (E, K) router weight and fp32
or bf16 out, fused-A with W = ``mat_b.T`` (the contiguous (N, K) weight) and bf16 out.

Importing this module imports only torch: the JIT runtime (``slim_kernel.jit``) is imported
on the first launch. The per-call path is one dict lookup for the launch plan plus the launch.

Knobs (environment, read at import; ``set_config``/``set_pdl`` change them at run time):
  SLIM_KERNEL_PDL=0|1                       programmatic dependent launch (default 1)
  SLIM_KERNEL_JIT_CONFIG_DSV3_ROUTER_GEMM   tile rules, e.g. "rt=1,stages=8,warps=4,split=0"
  SLIM_KERNEL_JIT_CONFIG_DSV3_FUSED_A_GEMM  or per M: "8:rt=1,warps=8,split=1;16:rt=4,split=4"
A rule "MAXM:k=v,..." applies to M <= MAXM (first match); rt and stages are compile-time
(each value is one more kernel instance), warps and split (cluster size along K, 0 = fill
the SMs, at most 8) are launch-time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

ROUTER = "dsv3_router_gemm"
FUSED_A = "dsv3_fused_a_gemm"
MAX_M = 16
VEC = 8  # bf16 elements per 16-byte load: K and row strides must be multiples of this
MAX_CLUSTER = 8  # portable cluster size: the most split=0 picks
MAX_SPLIT = 16  # explicit split may use non-portable clusters (the launcher allows them)
MAX_SMEM = 227 * 1024
SIGNATURE = "pppiiiiii"  # act, w, out, M, N, K, ld_act, ld_w, ld_out
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class GemmConfig:
    rt: int = 1  # 16-row weight tiles per CTA (compile-time)
    stages: int = 4  # per-warp cp.async ring depth in 32-k blocks (compile-time)
    warps: int = 4  # warps per CTA (launch-time)
    split: int = 0  # CTAs per cluster splitting K; 0 = as many as fill the SMs (launch-time)
    push: int = 0  # cluster reduction: 0 pull (barrier + DSMEM loads), 1 push (st.async + mbarrier)
    # 1: skinny_bulk (a producer warp streams rows with cp.async.bulk into a `stages`-deep ring of
    # `kc`-wide stages, `warps` consumer warps; rt 1..2, pull reduction); 0: skinny_gemm
    # 2: the same with direct activations (consumers load them from global memory; weights-only ring)
    bulk: int = 0
    kc: int = 256  # bulk only: k per ring stage (compile-time)
    rot: int = 0  # 1: each CTA starts its K walk at its own offset (compile-time)

    def __post_init__(self):
        if not (1 <= self.rt <= 8 and 2 <= self.stages <= 16 and 1 <= self.warps <= 8
                and 0 <= self.split <= MAX_SPLIT and self.push in (0, 1) and self.bulk in (0, 1, 2) and self.rot in (0, 1)
                and 32 <= self.kc <= 4096 and self.kc % 32 == 0):
            raise ValueError(f"bad JIT GEMM config {self}: need rt 1..8, stages 2..16, warps 1..8, "
                             f"split 0..{MAX_SPLIT}, push 0|1, bulk 0..2, kc 32..4096 in steps of 32")
        if self.bulk and (self.rt > 2 or self.push):
            raise ValueError(f"bad JIT GEMM config {self}: bulk=1 needs rt 1..2 and push=0")


# Defaults, chosen from the H200 runs in benchmark/results/h200/tuning/ (cold, CUDA-graph replay; see
# NOTES_kernels.md there): the per-thread cp.async kernel (skinny_gemm) beat every bulk-copy variant.
#   router: 16-row CTAs, clusters of 8 along K (128 CTAs), 4 warps x 8 stages: 4.6-5.3 us without
#           PDL, 3.0-3.5 with; bulk variants 5.0-8.5 / 3.4-3.8.
#   fused-A: one 16-row CTA per SM (132 CTAs, no cluster), 8 warps split K, 8 stages: 10.4-12.9 us;
#           bulk copies 11.5-14 (best 1-D bulk: 11.6-12.6 with 2 KB row copies).
DEFAULT_RULES = {
    ROUTER: ((MAX_M, GemmConfig(rt=1, stages=8, warps=4, split=0)),),
    FUSED_A: ((MAX_M, GemmConfig(rt=1, stages=8, warps=8, split=1)),),
}
_SOURCES = {
    ROUTER: ("dsv3_router_gemm.cuh", "dsv3_router_gemm_kernel"),
    FUSED_A: ("dsv3_fused_a_gemm.cuh", "dsv3_fused_a_gemm_kernel"),
}
_OUT_DTYPES = {ROUTER: (torch.float32, torch.bfloat16), FUSED_A: (torch.bfloat16,)}


def parse_rules(text: str) -> tuple[tuple[int, GemmConfig], ...]:
    """"rt=1,warps=4" or "8:rt=1,split=1;16:rt=4" -> ((max_m, GemmConfig), ...), sorted by max_m."""
    rules = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        max_m, sep, body = part.partition(":")
        if not sep:
            max_m, body = str(MAX_M), part
        fields = {}
        for item in filter(None, (f.strip() for f in body.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key.strip() not in GemmConfig.__dataclass_fields__:
                raise ValueError(f"bad JIT config item {item!r} in {text!r} "
                                 f"(keys: {', '.join(GemmConfig.__dataclass_fields__)})")
            fields[key.strip()] = int(value)
        rules.append((int(max_m), GemmConfig(**fields)))
    rules.sort(key=lambda r: r[0])
    if not rules or rules[-1][0] < MAX_M:
        raise ValueError(f"JIT config {text!r} must cover M up to {MAX_M}")
    return tuple(rules)


def _env_rules(op: str):
    text = os.environ.get(f"SLIM_KERNEL_JIT_CONFIG_{op.upper()}")
    return parse_rules(text) if text else DEFAULT_RULES[op]


_RULES = {op: _env_rules(op) for op in _SOURCES}
PDL = os.environ.get("SLIM_KERNEL_PDL", "1").strip() not in ("0", "false", "off", "")
_PLANS: dict = {}  # (op, m, n, k, out dtype, device index) -> _Plan


def set_config(op: str, rules: str | tuple | None) -> None:
    """Replace an op's tile rules (a rule string, parsed rules, or None for the defaults)."""
    _RULES[op] = DEFAULT_RULES[op] if rules is None else parse_rules(rules) if isinstance(rules, str) else rules
    _PLANS.clear()


def set_pdl(enabled: bool) -> None:
    global PDL
    PDL = bool(enabled)


def config_for(op: str, m: int) -> GemmConfig:
    return next(cfg for max_m, cfg in _RULES[op] if m <= max_m)


def instance(op: str, m: int, out_dtype: torch.dtype, cfg: GemmConfig):
    from ..jit.spec import KernelInstance

    source, entry = _SOURCES[op]
    defines = {"SK_NT": 1 if m <= 8 else 2, "SK_RT": cfg.rt, "SK_STAGES": cfg.stages, "SK_PUSH": cfg.push}
    if cfg.rot:
        defines["SK_ROT"] = 1
    if cfg.bulk:
        defines.update(SK_BULK=1, SK_KC=cfg.kc)
        if cfg.bulk == 2:
            defines["SK_ACTW"] = cfg.warps
    if op == ROUTER:
        defines["SK_OUT_BF16"] = int(out_dtype == torch.bfloat16)
    return KernelInstance.make(source, entry, SIGNATURE, **defines)


def all_instances() -> list:
    """Every kernel instantiation the ops can launch with the current rules (for precompile)."""
    seen = []
    for op, rules in _RULES.items():
        lo = 1
        for max_m, cfg in rules:
            for m in sorted({lo, max_m} & set(range(1, MAX_M + 1))):
                for dt in _OUT_DTYPES[op]:
                    inst = instance(op, m, dt, cfg)
                    if inst not in seen:
                        seen.append(inst)
            lo = max_m + 1
    return seen


def smem_bytes(cfg: GemmConfig, nt: int, split: int = 1) -> int:
    """Mirror of skinny_main_bytes (+ the PUSH receive area) / bulk_smem_bytes in kernels/common.cuh."""
    if cfg.bulk:
        row = cfg.kc * 2 + 64
        return (cfg.stages * (16 * cfg.rt + (0 if cfg.bulk == 2 else 8 * nt)) * row + cfg.stages * 16 + cfg.warps * cfg.rt * nt * 4 * 32 * 4
                + 8 * nt * 16 * cfg.rt * 4)
    ring = cfg.stages * cfg.warps * (2 * cfg.rt + nt) * 512
    reduce = (cfg.warps + 1) * cfg.rt * nt * 128 * 4
    extra = 16 + split * -(-(nt * 8 * cfg.rt * 16) // split) * 4 if cfg.push and split > 1 else 0
    return max(ring, reduce) + extra


@dataclass(frozen=True)
class _Plan:
    launch: object  # bound LoadedKernel.launch
    grid: tuple
    block: tuple
    smem: int
    cluster: tuple | None


_SM_COUNT: dict[int, int] = {}


def _sm_count(device_index: int) -> int:
    n = _SM_COUNT.get(device_index)
    if n is None:
        n = _SM_COUNT[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return n


def plan(op: str, m: int, n: int, k: int, out_dtype: torch.dtype, device_index: int) -> _Plan:
    key = (op, m, n, k, out_dtype, device_index)
    p = _PLANS.get(key)
    if p is None:
        p = _PLANS[key] = _make_plan(op, m, n, k, out_dtype, device_index)
    return p


def launch_geometry(cfg: GemmConfig, n: int, k: int, sm_count: int) -> tuple[tuple, tuple, tuple | None]:
    """grid, block, cluster for one call (split = 0 fills the SMs with clusters along K)."""
    groups = -(-n // (16 * cfg.rt))
    blocks_k = -(-k // 32)
    split = cfg.split or min(MAX_CLUSTER, max(1, sm_count // groups))
    split = max(1, min(split, blocks_k // cfg.warps or 1))
    threads = 32 * (cfg.warps + (2 if cfg.bulk else 0))  # bulk: + the two producer warps
    return (groups, split, 1), (threads, 1, 1), ((1, split, 1) if split > 1 else None)


def _make_plan(op, m, n, k, out_dtype, device_index) -> _Plan:
    from ..jit import get_kernel

    cfg = config_for(op, m)
    grid, block, cluster = launch_geometry(cfg, n, k, _sm_count(device_index))
    smem = smem_bytes(cfg, 1 if m <= 8 else 2, grid[1])
    if smem > MAX_SMEM:
        raise ValueError(f"{op}: JIT config {cfg} needs {smem} bytes of shared memory (max {MAX_SMEM})")
    kernel = get_kernel(instance(op, m, out_dtype, cfg), device_index)
    return _Plan(kernel.launch, grid, block, smem, cluster)


try:  # the raw stream handle without building a torch.cuda.Stream object
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # pragma: no cover - older/newer torch
    def _raw_stream(device_index: int) -> int:
        return torch.cuda.current_stream(device_index).cuda_stream


def _run(op, output, act, w_ptr, ld_w, n):
    m, k = act.shape
    dev = act.device.index
    key = (op, m, n, k, output.dtype, dev)
    p = _PLANS.get(key) or plan(*key)
    p.launch(p.grid, p.block,
             (act.data_ptr(), w_ptr, output.data_ptr(), m, n, k, act.stride(0) if m > 1 else k, ld_w,
              output.stride(0)),
             stream=_raw_stream(dev), smem=p.smem, pdl=PDL, cluster=p.cluster)


def dsv3_router_gemm(output: torch.Tensor, hidden_states: torch.Tensor, router_weights: torch.Tensor) -> None:
    _run(ROUTER, output, hidden_states, router_weights.data_ptr(), router_weights.stride(0),
         router_weights.shape[0])


def dsv3_fused_a_gemm(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
    # mat_b (K, N) column-major is the (N, K) weight read row by row: row stride = mat_b.stride(1).
    _run(FUSED_A, output, mat_a, mat_b.data_ptr(), mat_b.stride(1), mat_b.shape[1])


# ---- per-call eligibility (used by the op modules' KernelSpec.check; pure torch, no runtime) ----

def _operand_reason(name: str, t: torch.Tensor, rows: int, k: int, row_stride: int, k_stride: int) -> str | None:
    if k > 1 and k_stride != 1:
        return f"{name} is not unit-stride along K (strides {t.stride()})"
    if rows > 1 and (row_stride % VEC or row_stride > _INT32_MAX):
        return f"{name} row stride {row_stride} is not a multiple of {VEC} below 2**31"
    if t.data_ptr() % 16:
        return f"{name} is not 16-byte aligned"
    return None


def _common_reason(output, act, n) -> str | None:
    m, k = act.shape
    if not 1 <= m <= MAX_M:
        return f"M={m} is outside 1..{MAX_M}"
    if k % VEC:
        return f"K={k} is not a multiple of {VEC}"
    if n > _INT32_MAX or k > _INT32_MAX or output.stride(0) > _INT32_MAX:
        return "a dimension does not fit in int32"
    if n > 1 and output.stride(1) != 1:
        return "output is not row-major"
    return _operand_reason("activation", act, m, k, act.stride(0), act.stride(1))


def _fast_ok(output, act, w, n, k, w_row_stride, w_k_stride) -> bool:
    """The common case in one expression (the per-call check is on the hot path)."""
    m = act.shape[0]
    a0, a1 = act.stride()
    return (m <= MAX_M and not k & 7 and (a1 == 1 or k == 1) and (m == 1 or not a0 & 7)
            and (w_k_stride == 1 or k == 1) and not w_row_stride & 7
            and (output.stride(1) == 1 or n == 1) and not (act.data_ptr() | w.data_ptr()) & 15
            and max(a0, w_row_stride, output.stride(0), n, k) <= _INT32_MAX)


def router_check(output, hidden_states, router_weights) -> str | None:
    e, k = router_weights.shape
    ws = router_weights.stride()
    if _fast_ok(output, hidden_states, router_weights, e, k, ws[0], ws[1]):
        return None
    return (_common_reason(output, hidden_states, e)
            or _operand_reason("router_weights", router_weights, e, k, router_weights.stride(0),
                               router_weights.stride(1)))


def fused_a_check(output, mat_a, mat_b) -> str | None:
    k, n = mat_b.shape
    bs = mat_b.stride()
    if _fast_ok(output, mat_a, mat_b, n, k, bs[1], bs[0]):
        return None
    return (_common_reason(output, mat_a, n)
            or _operand_reason("mat_b.T", mat_b, n, k, mat_b.stride(1), mat_b.stride(0)))


def probe() -> str | None:
    """Cheap availability check for `slim-kernel info` (None = usable)."""
    try:
        from ..jit import available
    except ImportError as exc:
        return f"JIT runtime missing: {exc}"
    return available()
