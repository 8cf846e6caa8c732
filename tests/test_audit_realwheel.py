"""Real wheels, audited as a release engineer would.

The wheels of a CUDA inference image (torch, triton, numpy, flashinfer-python,
nvidia-cuda-nvrtc: clean; sgl-kernel 0.3.21: the three retired ops) are downloaded once
(`pip download --no-deps`, several GB) into the directory SLIM_KERNEL_WHEEL_CACHE names, and
skipped with the reason without it or offline:

    SLIM_KERNEL_WHEEL_CACHE=~/.cache/slim-kernel-wheels pytest -m realwheels tests/test_audit_realwheel.py

Other real AOT kernel wheels (point the env vars at downloaded copies):

    pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
        --python-version 3.10 sgl-kernel==0.3.21 sglang-kernel==0.4.10 -d /tmp/wheels
    SLIM_KERNEL_AOT_WHEEL=/tmp/wheels/sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl \
    SLIM_KERNEL_CLEAN_WHEEL=/tmp/wheels/sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl \
        pytest tests/test_audit_realwheel.py -m slow
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest
from _wheels import cached_download
from audit_fixtures.bounded import audit_cmd, run_bounded

import slim_kernel
from slim_kernel.cli import main

RETIRED = ["bmm_fp8", "dsv3_fused_a_gemm", "dsv3_router_gemm"]
pytestmark = pytest.mark.slow


def _wheel(var: str) -> str:
    path = os.environ.get(var)
    if not path or not os.path.exists(path):
        pytest.skip(f"set {var} to a downloaded wheel")
    return path


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the audit's pool workers)."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def test_aot_wheel_all_ops_in_every_host_and_device_layer(capsys):
    cpu = _cpu_seconds()
    assert main(["audit", "--json", "--no-progress", _wheel("SLIM_KERNEL_AOT_WHEEL")]) == 1
    cpu = _cpu_seconds() - cpu
    (res,) = json.loads(capsys.readouterr().out)["wheels"]
    assert res["ops_found"] == RETIRED
    for layer in ("elf-dynsym", "rodata-schema", "fatbin-kernel", "fatbin-tu"):
        assert sorted({f["op"] for f in res["findings"] if f["layer"] == layer}) == RETIRED, layer
    schemas = {f["evidence"] for f in res["findings"] if f["layer"] == "rodata-schema"}
    assert "dsv3_router_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()" in schemas
    assert all(r["kind"] in ("python", "metadata", "jit-source", "other") for r in res["routed"])
    # an error message naming the op is a mention, every other finding as before
    assert {m["evidence"] for m in res["mentions"]} == {"bmm_fp8_internal_cublaslt failed: "}
    assert cpu < 30  # CPU, not wall time (a loaded CI machine): about 5.5 s on 2 cores


@pytest.mark.parametrize(
    "var, ops",
    [  # ground truth: 0.4.4 still ships all three ops, 0.4.5 drops the router, 0.4.6 all
        ("SLIM_KERNEL_WHEEL_0_4_4", RETIRED),
        ("SLIM_KERNEL_WHEEL_0_4_5", ["bmm_fp8", "dsv3_fused_a_gemm"]),
        ("SLIM_KERNEL_WHEEL_0_4_6", []),
    ],
)
def test_sglang_kernel_ground_truth_without_cxxfilt(var, ops, monkeypatch, capsys):
    """sglang-kernel 0.4.4 / 0.4.5 / 0.4.6 (pip download sglang-kernel==0.4.x --no-deps): the
    ops found, with no c++filt on PATH; op names inside messages are mentions, not findings."""
    wheel = _wheel(var)
    monkeypatch.setenv("PATH", "")
    assert main(["audit", "--json", "--no-progress", wheel]) == (1 if ops else 0)
    (res,) = json.loads(capsys.readouterr().out)["wheels"]
    assert res["ops_found"] == ops and res["unreadable"] == []


def test_size_attributes_the_retired_ops_and_compares(capsys):
    aot, clean = _wheel("SLIM_KERNEL_AOT_WHEEL"), _wheel("SLIM_KERNEL_CLEAN_WHEEL")
    assert main(["size", "--json", "--no-progress", clean, "--baseline", aot]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["schema"] == 1
    per_op = rep["baseline"]["per_op"]
    assert sorted(per_op) == RETIRED and rep["subject"]["per_op"] == {}
    one_so = sum(v["members"].get("sgl_kernel/sm90/common_ops.abi3.so", 0) for v in per_op.values())
    assert 8e6 < one_so < 10e6  # "the three retired ops were 8.9 MB of one 361 MB .so"
    assert rep["comparison"]["file_bytes"]["bytes"] > 0


# (requirement, expected exit code, ops found): pinned, so the recorded numbers can be re-measured
IMAGE_WHEELS = [
    ("torch==2.14.1", 0, []),
    ("triton==3.9.0", 0, []),
    ("numpy==2.5.5", 0, []),
    ("flashinfer-python==0.7.4", 0, []),
    ("nvidia-cuda-nvrtc==13.5.37", 0, []),
    ("sgl-kernel==0.3.21", 1, RETIRED),
    # sgl-kernel's successor: the router dropped in 0.4.5, the other two in 0.4.6
    ("sglang-kernel==0.4.5", 1, ["bmm_fp8", "dsv3_fused_a_gemm"]),
    ("sglang-kernel==0.4.10", 0, []),
    ("flashinfer-cubin==0.6.13", 0, []),  # 15,970 shipped .cubin files
    ("vllm==0.34.0", 1, ["dsv3_fused_a_gemm"]),  # vLLM's own AOT copy of the kernel
    # torch's CUDA libraries: LZ4 fatbin entries of 50-130 MB, cubins with 6 MB of section names
    ("nvidia-nccl-cu12==2.27.7", 0, []),
    ("nvidia-nvshmem-cu12==3.8.0", 0, []),
    ("nvidia-cusparselt-cu12==0.8.1", 0, []),
    ("nvidia-cusparselt-cu13==0.10.0", 0, []),
    # LTO IR fatbin entries, read through nvJitLink: 6,573 (lto_75) and 206
    ("nvidia-cufft==12.5.0.14", 0, []),
    ("nvidia-cusparse==12.9.4.2", 0, []),
]


def cached_wheel(requirement: str) -> Path:
    """The wheel of `requirement` in SLIM_KERNEL_WHEEL_CACHE, downloaded once (skips without the
    variable, or when the download fails: offline)."""
    cache = os.environ.get("SLIM_KERNEL_WHEEL_CACHE")
    if not cache:
        pytest.skip("set SLIM_KERNEL_WHEEL_CACHE=DIR to download the real wheels (several GB) once into DIR")
    wheel, why = cached_download(requirement, Path(cache).expanduser())
    if wheel is None:
        pytest.skip(f"cannot download {requirement} (offline?): {why}")
    return wheel


@pytest.mark.realwheels
@pytest.mark.parametrize("requirement, code, ops", IMAGE_WHEELS, ids=[r for r, _, _ in IMAGE_WHEELS])
def test_wheels_of_an_inference_image(requirement, code, ops, tmp_path):
    """A verdict on each, every part of it read (a part that cannot be parsed would be listed, never
    a refusal), no temporary directory left, CPU time and peak RSS within the documented bounds."""
    wheel = cached_wheel(requirement)
    env = dict(
        os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(Path(slim_kernel.__file__).resolve().parents[1])
    )
    run = run_bounded(audit_cmd(wheel), timeout=600, address_space=8 << 30, env=env, keep_stdout=10**8)
    res = json.loads(run.stdout)["wheels"][0]
    print(
        f"{wheel.name}: exit {run.rc}, {run.wall:.1f} s wall, {run.cpu:.1f} s CPU, {run.peak_mib:.0f} MiB peak, "
        f"{len(res.get('unreadable', []))} unreadable, ops {res['ops_found']}"
    )
    assert run.rc == code, res.get("error", res.get("ops_found"))
    assert res["ops_found"] == ops
    assert res["unreadable"] == [], res["unreadable"][:5]
    assert list(tmp_path.iterdir()) == []
    assert run.peak < 512 << 20 and run.cpu < 120, (run.cpu, run.peak_mib)
