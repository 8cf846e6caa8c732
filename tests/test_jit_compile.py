"""JIT compiler front (CPU): every kernel compiles to an sm_90a cubin within the resource limits its
source declares (no spills) with nvcc and with each NVRTC of pyproject.toml's [tool.slim-kernel]
nvrtc-versions (the nvidia-cuda-nvrtc wheels, installed side by side: the floor 13.0 and "newest", the
newest release on the index, resolved by pip when the test runs); arch names; compiler selection and
errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jit_fixtures import instances as fx
from jit_fixtures.nvrtc_wheels import NEWEST, requirement

from slim_kernel.jit import cache, compiler
from slim_kernel.jit.arch import arch_for_capability, normalize_arch, sm_version
from slim_kernel.jit.catalogue import all_instances
from slim_kernel.jit.resources import check_limits, parse_ptxas_log
from slim_kernel.jit.sources import declared_limits, shipped_sources, source_closure, source_path
from slim_kernel.jit.spec import KernelInstance

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra brings tomli
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
COMPILERS = ("nvrtc", "nvcc")
NVRTC_VERSIONS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["slim-kernel"]["nvrtc-versions"]
TOOLCHAINS = ("nvcc", *(f"nvrtc-{v}" for v in NVRTC_VERSIONS))


def installed_nvrtc(target: Path) -> str:
    """The version of the nvidia-cuda-nvrtc wheel pip installed into ``target``."""
    (info,) = target.glob("nvidia_cuda_nvrtc-*.dist-info")
    return info.name.removeprefix("nvidia_cuda_nvrtc-").removesuffix(".dist-info")
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

SHIPPED = [inst for _, inst in all_instances()]
FIXTURES = [make() for make in fx.ALL] + fx.k_fitted()


def _id(inst: KernelInstance) -> str:
    return inst.label


@pytest.fixture(params=COMPILERS)
def compiler_name(request):
    """Skipped where that compiler is missing, except on CI, where it must work (tests/conftest.py)."""
    return request.param


def _unusable(why: str):
    """Skip, except on CI, where every toolchain must be there (the test extra and the machine's nvcc)."""
    if CI:
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def compile_reports(tmp_path_factory):
    """toolchain -> what compiling every instance with it reported (tests/jit_fixtures/compile_all.py,
    in a process of its own, in parallel), computed on first use. NVRTC X.Y is the nvidia-cuda-nvrtc
    X.Y.* wheel, pip-installed into a directory put first on PYTHONPATH (one libnvrtc per process)."""
    base, reports = tmp_path_factory.mktemp("toolchains"), {}

    def report(toolchain: str) -> dict:
        if toolchain in reports:
            return reports[toolchain]
        name, _, version = toolchain.partition("-")
        env = dict(os.environ, SLIM_KERNEL_CACHE_DIR=str(base / toolchain / "cache"))
        env.pop("SLIM_KERNEL_JIT", None)
        if version:
            target = base / toolchain / "site"
            wanted = requirement(version)
            pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                                  wanted], capture_output=True, text=True, timeout=900)
            if pip.returncode:
                reports[toolchain] = {"unusable": f"cannot install {wanted}: {pip.stderr[-1500:]}"}
                return reports[toolchain]
            resolved = installed_nvrtc(target)
            print(f"{toolchain}: nvidia-cuda-nvrtc {resolved}")  # shown with -rA / on failure
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
        elif compiler.find_nvcc() is None:
            reports[toolchain] = {"unusable": "nvcc not found"}
            return reports[toolchain]
        out = base / toolchain / "report.json"
        proc = subprocess.run([sys.executable, str(fx.HERE / "compile_all.py"), name, str(out)], env=env,
                              capture_output=True, text=True, timeout=3000)
        assert proc.returncode == 0, proc.stderr[-4000:]
        reports[toolchain] = json.loads(out.read_text()) | ({"wheel": resolved} if version else {})
        return reports[toolchain]

    return report


@pytest.mark.slow
@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_the_toolchain_is_the_one_asked_for(toolchain, compile_reports):
    report = compile_reports(toolchain)
    if "unusable" in report:
        _unusable(report["unusable"])
    name, _, version = toolchain.partition("-")
    if version == NEWEST:  # the release pip resolved: its X.Y is the compiler's
        version = ".".join(report["wheel"].split(".")[:2])
    assert report["compiler"].startswith(f"{name} {version} ".replace("  ", " ")), report["compiler"]


@pytest.mark.slow
@pytest.mark.parametrize("toolchain", TOOLCHAINS)
@pytest.mark.parametrize("inst", SHIPPED + FIXTURES, ids=_id)
def test_compiles_for_sm90a_within_declared_limits(inst, toolchain, compile_reports):
    report = compile_reports(toolchain)
    if "unusable" in report:
        _unusable(report["unusable"])
    result = report["instances"][inst.label]
    assert "error" not in result, result.get("error")
    assert result["elf"] and result["header_arch"] == "sm_90a"
    assert result["usage"] is not None and result["usage"]["registers"] > 0, "ptxas -v report missing"
    assert result["limits"], f"{inst.source} declares no '// slim:limits ...' line"
    assert result["problems"] == [], f"{inst.label} with {report['compiler']}: {result['usage']}"


def test_every_shipped_entry_source_has_instances():
    """Every shipped kernel source with an extern "C" entry is reachable from the catalogue."""
    used = {source_path(i).name for i in SHIPPED}
    entries = {p.name for p in shipped_sources() if 'extern "C"' in p.read_text()}
    assert entries <= used, f"kernel sources never instantiated: {sorted(entries - used)}"


def test_shipped_sources_resolve_their_includes():
    for path in shipped_sources():
        names = [name for name, _ in source_closure(path)]
        assert names[0] == path.name


def test_compile_error_carries_the_log(tmp_path, compiler_name, monkeypatch):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    src = tmp_path / "broken.cuh"
    src.write_text('extern "C" __global__ void broken(int* p) { p[0] = undefined_symbol; }\n')
    inst = KernelInstance.make(str(src), "broken", "p")
    with pytest.raises(compiler.CompileError, match="undefined_symbol"):
        cache.compile_cubin(inst, "sm_90a", compiler_name)
    assert cache.cached_counts(tmp_path).get("sm_90a", 0) == 0


def test_defines_reach_the_compiler(tmp_path, monkeypatch, compiler_name):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    src = tmp_path / "needs_define.cuh"
    src.write_text('#if NEED != 7\n#error NEED must be 7\n#endif\nextern "C" __global__ void k(int* p) { p[0] = NEED; }\n')
    cache.compile_cubin(KernelInstance.make(str(src), "k", "p", NEED=7), "sm_90a", compiler_name)
    with pytest.raises(compiler.CompileError, match="NEED must be 7"):
        cache.compile_cubin(KernelInstance.make(str(src), "k", "p", NEED=8), "sm_90a", compiler_name)


@pytest.mark.parametrize("text,expected", [
    ("9.0a", "sm_90a"), ("90a", "sm_90a"), ("sm_90a", "sm_90a"), ("SM_100a", "sm_100a"),
    ("10.0a", "sm_100a"), ("8.0", "sm_80"), ("compute_120a", "sm_120a"), ("12.0f", "sm_120f"),
])
def test_normalize_arch(text, expected):
    assert normalize_arch(text) == expected


@pytest.mark.parametrize("bad", ["", "hopper", "9", "sm_9x", "9.0b"])
def test_normalize_arch_rejects(bad):
    with pytest.raises(ValueError, match="arch must look like"):
        normalize_arch(bad)


def test_arch_for_capability():
    assert arch_for_capability(9, 0) == "sm_90a"
    assert arch_for_capability(10, 0) == "sm_100a"
    assert arch_for_capability(8, 9) == "sm_89"
    assert sm_version("sm_100a") == 100


def test_parse_ptxas_log_picks_the_entry():
    log = """ptxas info    : Compiling entry function 'other' for 'sm_90a'
ptxas info    : Used 200 registers
ptxas info    : Compiling entry function 'mine' for 'sm_90a'
ptxas info    : Function properties for mine
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
"""
    usage = parse_ptxas_log(log, "mine")
    assert (usage.registers, usage.spill_bytes, usage.stack_bytes, usage.smem_static, usage.cmem0) == (
        40, 12, 16, 1024, 400)
    assert check_limits(usage, {"max_registers": 40, "max_spill_bytes": 0, "max_smem_static": 512}) == [
        "smem_static 1024 > declared 512", "spill_bytes 12 > declared 0"]
    with pytest.raises(ValueError, match="no ptxas resource report"):
        parse_ptxas_log(log, "absent")


def test_declared_limits_rejects_typos(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text("// slim:limits max_regs=10\n")
    with pytest.raises(ValueError, match="bad slim:limits item"):
        declared_limits(src)
    src.write_text("// slim:limits max_registers=64 max_smem_static=0\n")
    assert declared_limits(src) == {"max_registers": 64, "max_smem_static": 0}


@pytest.mark.needs_compiler("nvrtc", "nvcc")
def test_forced_compiler_env(monkeypatch):
    monkeypatch.setenv(compiler.ENV_COMPILER, "nvcc")
    assert compiler.get_compiler().name == "nvcc"
    monkeypatch.setenv(compiler.ENV_COMPILER, "nvrtc")
    assert compiler.get_compiler().name == "nvrtc"
    monkeypatch.setenv(compiler.ENV_COMPILER, "clang")
    with pytest.raises(ValueError, match="SLIM_KERNEL_JIT_COMPILER must be one of"):
        compiler.get_compiler()


def test_no_compiler_names_what_is_missing(monkeypatch):
    def no_nvrtc():
        raise compiler.CompilerUnavailableError("libnvrtc not found (pip install nvidia-cuda-nvrtc)")

    monkeypatch.setattr(compiler, "_load_nvrtc", no_nvrtc)
    monkeypatch.setattr(compiler, "find_nvcc", lambda: None)
    monkeypatch.delenv(compiler.ENV_COMPILER, raising=False)
    compiler.reset()
    try:
        with pytest.raises(compiler.CompilerUnavailableError) as info:
            compiler.get_compiler()
        assert "nvrtc: libnvrtc not found" in str(info.value) and "nvcc: nvcc not found" in str(info.value)
        from slim_kernel.jit import available

        assert "no CUDA compiler" in available()
        monkeypatch.setenv(compiler.ENV_COMPILER, "nvcc")
        with pytest.raises(compiler.CompilerUnavailableError, match="'nvcc' is not usable"):
            compiler.get_compiler()
    finally:
        compiler.reset()
