"""Several GPUs (``-m gpu``, needs 2 CUDA devices): every op with its tensors on one device while
the other is current, both ways; eager, torch.compile'd, and captured in a CUDA graph on the tensors'
device; PDL on, off and auto (the ``pdl`` fixture); each GEMM right after the kernel that writes its
activation, a plain one or flashinfer's ``rmsnorm(enable_pdl=True)``; default routing and each backend
pinned; random inputs, NaN-poisoned outputs, float64 references. The rules under test are in
python/slim_kernel/devices.py.

    python -m pytest tests/test_multi_gpu.py -m gpu
"""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

import slim_kernel as sk
from slim_kernel import devices, registry
from slim_kernel.jit import runtime
from slim_kernel.names import BMM_FP8, FUSED_A, ROUTER
from slim_kernel.pdl import launch_pdl

from _inputs import TOL, bmm_fp8_inputs, bmm_fp8_ref, fused_a_ref, randn, rel_err, router_ref

N_DEVICES = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(N_DEVICES < 2, reason=f"needs 2 CUDA devices, {N_DEVICES} visible")]
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
K = 7168
DIRECTIONS = [(1, 0), (0, 1)]  # (the tensors' device, the current device)
DIRECTION_IDS = ["data1-cur0", "data0-cur1"]
BACKENDS = [None, "jit", "flashinfer", "torch"]
FP8_TOL = 2e-2  # fp8 inputs, 16-bit output: test_ops_gpu's bound for bmm_fp8
ROUTER_M = {torch.float32: 3, torch.bfloat16: 8}
FUSED_A_M = 5


def _router(x, w, out, backend):
    sk.dsv3_router_gemm(x, w, out.dtype, out, backend=backend)


def _fused_a(x, wt, out, backend):
    sk.dsv3_fused_a_gemm(x, wt, out, backend=backend)


def _bmm_fp8(A, B, sa, sb, out, backend):
    sk.bmm_fp8(A, B, sa, sb, out.dtype, out, backend=backend)


@functools.cache
def _compiled(fn):
    return torch.compile(fn, fullgraph=True)


def _eager(fn):
    return fn


def _producer(kind: str, gen, device: torch.device):
    """produce(src, x): the kernel(s) writing x right before a GEMM reads it. "pdl": an elementwise kernel,
    then flashinfer's rmsnorm(enable_pdl=True) (a PDL-aware kernel is recognised under capture only
    after a predecessor: slim_kernel/pdl.py)."""
    if kind == "plain":
        return lambda src, x: torch.mul(src, 1.0, out=x)
    if not HAS_FLASHINFER:
        pytest.skip("flashinfer is not installed: no PDL-aware producer (rmsnorm(enable_pdl=True))")
    import flashinfer.norm

    gamma = randn((K,), gen, device=device)

    def produce(src, x):
        tmp = torch.mul(src, 1.0)
        flashinfer.norm.rmsnorm(tmp, gamma, 1e-6, out=x, enable_pdl=True)
    return produce


class Step:
    """One decode-step slice on cuda:``data``: producer -> router (fp32 out), producer -> router (bf16 out),
    producer -> fused-A, then bmm_fp8; the GEMMs run with whatever device the caller made current."""

    def __init__(self, data: int, gen, producer: str, backend):
        dev = self.device = torch.device("cuda", data)
        self.produce = _producer(producer, gen, dev)
        self.w, self.wf = randn((256, K), gen, device=dev), randn((2112, K), gen, device=dev)
        ms = [ROUTER_M[torch.float32], ROUTER_M[torch.bfloat16], FUSED_A_M]
        self.src = [randn((m, K), gen, device=dev) for m in ms]
        self.x = [torch.empty(m, K, dtype=torch.bfloat16, device=dev) for m in ms]
        self.outs = [torch.empty(ms[0], 256, device=dev), torch.empty(ms[1], 256, dtype=torch.bfloat16, device=dev),
                     torch.empty(ms[2], 2112, dtype=torch.bfloat16, device=dev),
                     torch.empty(16, 4, 128, dtype=torch.bfloat16, device=dev)]
        self.bmm = bmm_fp8_inputs(16, 4, 512, 128, gen, device=dev)
        gemms = [(ROUTER, _router, (self.x[0], self.w, self.outs[0])),
                 (ROUTER, _router, (self.x[1], self.w, self.outs[1])),
                 (FUSED_A, _fused_a, (self.x[2], self.wf.t(), self.outs[2]))]
        self.gemms = [(fn, (*args, _pin(op, backend, dev, args))) for op, fn, args in gemms]
        self.last = (_bmm_fp8, (*self.bmm, self.outs[3], _pin(BMM_FP8, backend, dev, (*self.bmm, self.outs[3]))))

    def refill(self, gen) -> None:
        """New inputs in the same buffers (a graph replays on them); poisoned outputs."""
        for src in self.src:
            src.copy_(randn(src.shape, gen, device=self.device))
        for dst, new in zip(self.bmm, bmm_fp8_inputs(16, 4, 512, 128, gen, device=self.device)):
            dst.copy_(new)
        for out in self.outs:
            out.fill_(float("nan"))

    def run(self, wrap=_eager) -> None:
        cur = devices.current()
        for (fn, args), src, x in zip(self.gemms, self.src, self.x):
            with torch.cuda.device(self.device):  # the producer is not under test: on its own device
                self.produce(src, x)
            assert devices.current() == cur
            wrap(fn)(*args)
        fn, args = self.last
        wrap(fn)(*args)

    def check(self, what: str) -> None:
        torch.cuda.synchronize(self.device)
        x, (A, B, sa, sb) = self.x, self.bmm
        errors = {"router fp32": (rel_err(self.outs[0], router_ref(x[0], self.w)), TOL[torch.float32]),
                  "router bf16": (rel_err(self.outs[1], router_ref(x[1], self.w)), TOL[torch.bfloat16]),
                  "fused_a": (rel_err(self.outs[2], fused_a_ref(x[2], self.wf.t())), TOL[torch.bfloat16]),
                  "bmm_fp8": (rel_err(self.outs[3], bmm_fp8_ref(A, B, sa, sb)), FP8_TOL)}
        wrong = {name: f"{err:.3g} > {tol}" for name, (err, tol) in errors.items() if not err <= tol}
        assert not wrong, f"{what}: relative error {wrong}"


def _pin(op: str, backend, device: torch.device, args) -> str | None:
    """``backend`` for ``op`` (None where the op has no such backend: bmm_fp8 has no JIT kernel); a pinned
    backend that cannot serve here skips the test with the registry's reason."""
    if backend is None:
        return None
    reasons = {spec.backend.value: reason for spec, reason in registry.explain(op, device, (args[-1], *args[:-1]))}
    if backend not in reasons:
        return None
    if reasons[backend] is not None:
        pytest.skip(f"{op}: backend {backend!r} cannot serve on {device}: {reasons[backend]}")
    return backend


@pytest.fixture
def dynamo_room():
    """Room for one compiled entry per (device, pinned backend) of each GEMM wrapper."""
    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    with torch._dynamo.config.patch(**{name: 64}):
        yield


@pytest.mark.parametrize("backend", BACKENDS, ids=[str(b) for b in BACKENDS])
@pytest.mark.parametrize("producer", ["plain", "pdl"])
@pytest.mark.parametrize("mode", ["eager", "compile", "graph"])
@pytest.mark.parametrize("data,cur", DIRECTIONS, ids=DIRECTION_IDS)
def test_ops_on_the_tensors_device(data, cur, mode, producer, backend, pdl, gen, dynamo_room):
    step = Step(data, gen, producer, backend)
    what = f"{mode} on cuda:{data} with cuda:{cur} current, pdl={pdl}, {producer} producer, backend={backend}"
    held = torch.cuda.memory_allocated(cur)
    with torch.cuda.device(cur):
        if mode != "graph":
            for _ in range(2):
                step.refill(gen)
                step.run(_compiled if mode == "compile" else _eager)
                step.check(what)
        else:
            step.refill(gen)
            step.run()  # eager first: selection, compiles and loads happen outside the capture
            torch.cuda.synchronize(data)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(data)):  # makes cuda:data current
                with torch.cuda.device(cur):
                    step.run()
            for _ in range(2):
                step.refill(gen)
                graph.replay()
                step.check(what)
    assert torch.cuda.memory_allocated(cur) == held, f"{what}: memory left on the current device cuda:{cur}"


@pytest.mark.parametrize("producer", ["plain", "pdl"])
@pytest.mark.parametrize("data,cur", DIRECTIONS, ids=DIRECTION_IDS)
def test_pdl_decision_reads_the_tensors_device_stream(data, cur, producer, gen, pdl_auto):
    """Under auto, a launch captured on cuda:data uses PDL exactly after a PDL-aware producer, even while
    cuda:cur (not capturing) is current; a launch on cuda:cur itself is eager (the knob: PDL)."""
    dev = torch.device("cuda", data)
    produce = _producer(producer, gen, dev)
    src, x = randn((4, K), gen, device=dev), torch.empty(4, K, dtype=torch.bfloat16, device=dev)
    seen = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(cur), torch.cuda.graph(graph, stream=torch.cuda.Stream(data)):
        torch.mul(src, 1.0, out=x)  # a predecessor: the producer is not the graph's first node
        produce(src, x)
        with torch.cuda.device(cur):
            seen += [launch_pdl(device=dev), launch_pdl(device=torch.device("cuda", cur))]
    assert seen == [producer == "pdl", True]


@pytest.mark.parametrize("pins", [("jit", "torch"), ("flashinfer", "jit"), ("torch", "flashinfer")],
                         ids=lambda p: f"{p[0]}-{p[1]}")
def test_a_pinned_backend_per_device(pins, gen):
    """cuda:0 and cuda:1 pinned to different backends, calls interleaved, each with the other device current."""
    steps = {d: Step(d, gen, "plain", pins[d]) for d in (0, 1)}
    for rnd in range(2):
        for d, step in steps.items():
            with torch.cuda.device(1 - d):
                step.refill(gen)
                step.run()
            step.check(f"round {rnd} on cuda:{d} pinned to {pins[d]}")


def test_loaded_kernels_stay_on_their_device(gen):
    """The same JIT instances used on both devices are loaded once per device, each into its own device's
    context (a module loaded for cuda:0 is never launched on cuda:1)."""
    for data, cur in DIRECTIONS:
        step = Step(data, gen, "plain", "jit")
        with torch.cuda.device(cur):
            step.refill(gen)
            step.run()
        step.check(f"jit on cuda:{data} with cuda:{cur} current")
    by_device: dict[int, set] = {}
    for (instance, dev, _), kernel in runtime._KERNELS.items():
        assert kernel.device_index == dev == kernel.impl.device, kernel
        by_device.setdefault(dev, set()).add(instance)
    assert by_device.get(0) and by_device.get(1)
    for a, b in ((0, 1), (1, 0)):
        for instance in by_device[a] & by_device[b]:
            assert runtime.get_kernel(instance, a).impl is not runtime.get_kernel(instance, b).impl
