"""JIT launchers on a GPU: both launchers run kernels correctly, eagerly, on side streams, from
fresh threads, under CUDA-graph capture, with PDL, with > 48 KiB dynamic shared memory and with
thread-block clusters. Run on the GPU machine with the package installed (the native launcher
must be importable): ``python -m pytest tests/test_jit_gpu.py -m gpu``."""

from __future__ import annotations

import threading

import pytest
import torch
from jit_fixtures import instances as fx

from slim_kernel import jit
from slim_kernel.jit import _pylauncher, runtime

pytestmark = pytest.mark.gpu
LAUNCHERS = ("native", "python")


@pytest.fixture(params=LAUNCHERS)
def launcher(request):
    if request.param == "native" and runtime.native_module()[0] is None:
        pytest.fail(f"{runtime.native_module()[1]}: install the package (pip install --no-build-isolation .) "
                    "and run pytest without PYTHONPATH=python")
    return request.param


@pytest.fixture
def dev():
    return torch.cuda.current_device()


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _axpby_ref(x, y, alpha, repeat, bias):
    return y.double() + bias + repeat * alpha * x.double()


def _axpby_inputs(n, device, gen):
    x = torch.randn(n, generator=gen).to(device=device, dtype=torch.bfloat16)
    y = torch.randn(n, generator=gen).to(device=device, dtype=torch.bfloat16)
    out = torch.full((n + 64,), float("nan"), device=device, dtype=torch.bfloat16)  # poisoned, with a tail
    return x, y, out


def _launch_axpby(kernel, x, y, out, n, alpha, repeat, **kw):
    kernel.launch(((n + 255) // 256, 1, 1), (256, 1, 1), (x.data_ptr(), y.data_ptr(), out.data_ptr(), n, alpha, repeat),
                  stream=kw.pop("stream", None) or _stream(), **kw)


def test_launch_is_correct_and_memoized(launcher, dev, gen):
    n = 100_003
    kernel = jit.get_kernel(fx.axpby(bias=1), dev, launcher=launcher)
    assert kernel.launcher == launcher and kernel.arch == jit.arch_for_device(dev)
    assert jit.get_kernel(fx.axpby(bias=1), dev, launcher=launcher) is kernel
    x, y, out = _axpby_inputs(n, f"cuda:{dev}", gen)
    _launch_axpby(kernel, x, y, out, n, 0.75, 3)
    torch.cuda.synchronize()
    assert _rel_err(out[:n], _axpby_ref(x, y, 0.75, 3, 1)) <= 5e-3
    assert out[n:].isnan().all(), "wrote past n"


def test_both_launchers_agree_bitwise(dev, gen):
    if runtime.native_module()[0] is None:
        pytest.fail(runtime.native_module()[1])
    n = 4097
    x, y, a = _axpby_inputs(n, f"cuda:{dev}", gen)
    b = a.clone()
    _launch_axpby(jit.get_kernel(fx.axpby(), dev, launcher="native"), x, y, a, n, -1.25, 2)
    _launch_axpby(jit.get_kernel(fx.axpby(), dev, launcher="python"), x, y, b, n, -1.25, 2)
    torch.cuda.synchronize()
    assert torch.equal(a[:n], b[:n])


def test_side_stream_and_fresh_thread(launcher, dev, gen):
    n = 8191
    kernel = jit.get_kernel(fx.axpby(), dev, launcher=launcher)
    x, y, out = _axpby_inputs(n, f"cuda:{dev}", gen)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _launch_axpby(kernel, x, y, out, n, 2.0, 1, stream=side.cuda_stream)
    side.synchronize()
    assert _rel_err(out[:n], _axpby_ref(x, y, 2.0, 1, 0)) <= 5e-3

    out2 = torch.full_like(out, float("nan"))
    errors = []

    def worker():  # a thread on which neither torch nor we made any context current
        try:
            _launch_axpby(kernel, x, y, out2, n, 2.0, 1, stream=side.cuda_stream)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    side.synchronize()
    assert torch.equal(out[:n], out2[:n])


def test_pdl_chain_is_ordered(launcher, dev, gen):
    """out1 = x + y; out2 = out1 + y, launched with PDL: the second waits (griddepcontrol.wait)."""
    n = 1 << 20
    kernel = jit.get_kernel(fx.axpby(), dev, launcher=launcher)
    x, y, out1 = _axpby_inputs(n, f"cuda:{dev}", gen)
    out2 = torch.full_like(out1, float("nan"))
    for _ in range(3):
        _launch_axpby(kernel, x, y, out1, n, 1.0, 4, pdl=True)
        _launch_axpby(kernel, out1, y, out2, n, 1.0, 4, pdl=True)
    torch.cuda.synchronize()
    ref1 = (y.double() + 4 * x.double()).to(torch.bfloat16)
    assert _rel_err(out1[:n], ref1) <= 5e-3
    assert _rel_err(out2[:n], y.double() + 4 * out1[:n].double()) <= 5e-3


@pytest.mark.parametrize("pdl", [False, True])
def test_cuda_graph_capture_and_replay(launcher, dev, gen, pdl):
    n = 65_537
    kernel = jit.get_kernel(fx.axpby(), dev, launcher=launcher)
    x, y, out1 = _axpby_inputs(n, f"cuda:{dev}", gen)
    out2 = torch.full_like(out1, float("nan"))
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (loads, smem limit)
        _launch_axpby(kernel, x, y, out1, n, 0.5, 1, stream=side.cuda_stream)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _launch_axpby(kernel, x, y, out1, n, 0.5, 1, pdl=pdl)
        _launch_axpby(kernel, out1, y, out2, n, 0.5, 1, pdl=pdl)
    for _ in range(2):
        x.copy_(torch.randn(n, generator=gen).to(x.device, torch.bfloat16))
        out1.fill_(float("nan"))
        out2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(out1[:n], _axpby_ref(x, y, 0.5, 1, 0)) <= 5e-3
        assert _rel_err(out2[:n], _axpby_ref(out1[:n], y, 0.5, 1, 0)) <= 5e-3


def _smem_cluster_expected(blocks, words, device):
    i = torch.arange(words, device=device, dtype=torch.float32)
    return torch.cat([2.0 * (words - 1 - i) + b for b in range(blocks)])


@pytest.mark.parametrize("cluster", [None, (2, 1, 1), (4, 1, 1)])
def test_large_dynamic_smem_and_clusters(launcher, dev, cluster):
    major, _ = torch.cuda.get_device_capability(dev)
    if cluster is not None and major < 9:
        pytest.skip("thread-block clusters need SM >= 9.0")
    blocks, words = 8, 25_600  # 100 KiB of dynamic shared memory per block
    kernel = jit.get_kernel(fx.smem_cluster(), dev, launcher=launcher)
    out = torch.full((blocks * words,), float("nan"), device=f"cuda:{dev}")
    info = torch.full((2 * blocks,), -1, device=f"cuda:{dev}", dtype=torch.int32)
    kernel.launch((blocks, 1, 1), (256, 1, 1), (out.data_ptr(), info.data_ptr(), words), stream=_stream(),
                  smem=words * 4, cluster=cluster)
    torch.cuda.synchronize()
    assert kernel.impl.smem_limit >= words * 4
    assert torch.equal(out, _smem_cluster_expected(blocks, words, out.device))
    size = cluster[0] if cluster else 1
    ranks = [b % size for b in range(blocks)]
    expected_info = [v for r in ranks for v in (r, size)] if major >= 9 else [0, 1] * blocks
    assert info.tolist() == expected_info


@pytest.mark.parametrize("carveout", [0, 37, 100])
def test_launch_carveout_eager_and_in_a_graph(launcher, dev, carveout):
    """A launch's own carveout is a hint: any percent runs a 100 KiB-smem kernel correctly, with a
    cluster and PDL, eagerly and replayed from a graph, and sets no function attribute."""
    driver = (runtime.native_module()[0] if launcher == "native" else _pylauncher).driver_version()
    runtime._LAUNCH_CARVEOUT.clear()
    assert runtime.launch_carveout_supported(launcher) == (driver >= 12060)
    if driver < 12060:
        pytest.skip(f"driver {driver} takes no launch carveout")
    blocks, words = 8, 25_600
    kernel = jit.get_kernel(fx.smem_cluster(), dev, launcher=launcher)
    out = torch.full((blocks * words,), float("nan"), device=f"cuda:{dev}")
    info = torch.full((2 * blocks,), -1, device=f"cuda:{dev}", dtype=torch.int32)
    expected = _smem_cluster_expected(blocks, words, out.device)

    def launch():
        kernel.launch((blocks, 1, 1), (256, 1, 1), (out.data_ptr(), info.data_ptr(), words), stream=_stream(),
                      smem=words * 4, cluster=(2, 1, 1), pdl=True, carveout=carveout)
    launch()
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and info.tolist() == [v for b in range(blocks) for v in (b % 2, 2)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert kernel.carveout == -1  # no function attribute was set for it


def test_bad_launch_names_the_cuda_error(launcher, dev, gen):
    kernel = jit.get_kernel(fx.axpby(), dev, launcher=launcher)
    x, y, out = _axpby_inputs(256, f"cuda:{dev}", gen)
    with pytest.raises(RuntimeError, match=r"launch of fixture_axpby .*CUDA_ERROR_INVALID_VALUE"):
        kernel.launch((1, 1, 1), (2048, 1, 1), (x.data_ptr(), y.data_ptr(), out.data_ptr(), 256, 1.0, 1),
                      stream=_stream())
    with pytest.raises(TypeError, match="argument 0"):
        kernel.launch((1, 1, 1), (256, 1, 1), (x, y, out, 256, 1.0, 1), stream=_stream())
    _launch_axpby(kernel, x, y, out, 256, 1.0, 1)  # the context is still usable
    torch.cuda.synchronize()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_device(launcher, gen):
    n = 5000
    kernel = jit.get_kernel(fx.axpby(), 1, launcher=launcher)
    x, y, out = _axpby_inputs(n, "cuda:1", gen)
    with torch.cuda.device(0):  # the current device is not the kernel's: the launcher switches context
        _launch_axpby(kernel, x, y, out, n, 1.5, 1, stream=torch.cuda.current_stream(1).cuda_stream)
    torch.cuda.synchronize(1)
    assert _rel_err(out[:n], _axpby_ref(x, y, 1.5, 1, 0)) <= 5e-3


def test_available_and_info_on_gpu():
    assert jit.available() is None
    info = jit.runtime_info()
    assert info["driver"] == "ok"
    assert info["launcher"] == "native" or info["launcher"].startswith("python (cuda-python fallback")


def test_first_load_inside_graph_capture(launcher, dev, gen):
    """An op first called inside torch.cuda.graph (global capture mode) compiles, loads and raises
    the smem limit there: module loads run in relaxed capture mode, so the capture survives."""
    n = 4099
    x, y, out = _axpby_inputs(n, f"cuda:{dev}", gen)
    blocks, words = 2, 20_000
    info = torch.full((2 * blocks,), -1, device=f"cuda:{dev}", dtype=torch.int32)
    big = torch.full((blocks * words,), float("nan"), device=f"cuda:{dev}")
    bias = 11 if launcher == "native" else 12  # an instance not loaded by any other test
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel = jit.get_kernel(fx.axpby(bias=bias), dev, launcher=launcher)
        _launch_axpby(kernel, x, y, out, n, 1.0, 1)
        fresh = jit.get_kernel(fx.smem_cluster(), dev, launcher=launcher)
        fresh.launch((blocks, 1, 1), (128, 1, 1), (big.data_ptr(), info.data_ptr(), words), stream=_stream(),
                     smem=112 * 1024)  # above every other test's: the limit is raised inside the capture
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(out[:n], _axpby_ref(x, y, 1.0, 1, bias)) <= 5e-3
    assert torch.equal(big, _smem_cluster_expected(blocks, words, big.device))
