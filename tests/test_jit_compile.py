"""JIT compiler front (CPU): every kernel compiles to an sm_90a cubin with NVRTC and with nvcc,
within the resource limits its source declares; arch names; compiler selection and errors."""

from __future__ import annotations

import pytest
from jit_fixtures import instances as fx

from slim_kernel.jit import cache, compiler
from slim_kernel.jit.arch import arch_for_capability, normalize_arch, sm_version
from slim_kernel.jit.resources import check_limits, cubin_sm, parse_ptxas_log
from slim_kernel.jit.sources import declared_limits, shipped_sources, source_closure, source_path
from slim_kernel.jit.spec import KernelInstance

COMPILERS = ("nvrtc", "nvcc")


def _shipped_instances() -> list[KernelInstance]:
    try:
        from slim_kernel.backends.jit import all_instances
    except ImportError:
        return []
    return list(all_instances())


SHIPPED = _shipped_instances()
FIXTURES = [make() for make in fx.ALL]


def _id(inst: KernelInstance) -> str:
    return inst.entry + "[" + ",".join(f"{k}={v}" for k, v in inst.defines) + "]"


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    """One cache for the module, so the limits test reuses the compile test's entries."""
    mp = pytest.MonkeyPatch()
    mp.setenv(cache.ENV_CACHE_DIR, str(tmp_path_factory.mktemp("jit_cache")))
    cache.clear_memory()
    yield
    mp.undo()
    cache.clear_memory()


@pytest.fixture(params=COMPILERS)
def compiler_name(request):
    try:
        compiler.get_compiler(request.param)
    except compiler.CompilerUnavailableError as exc:
        pytest.fail(f"{request.param} must be usable on CI: {exc}")
    return request.param


@pytest.mark.parametrize("inst", SHIPPED + FIXTURES, ids=_id)
def test_compiles_for_sm90a_within_declared_limits(inst, compiler_name, module_cache):
    entry = cache.get_entry(inst, "9.0a", compiler_name)
    assert entry.cubin[:4] == b"\x7fELF"
    assert cubin_sm(entry.cubin) == 90
    assert entry.header["arch"] == "sm_90a" and entry.header["compiler"].startswith(compiler_name)
    usage = entry.usage
    assert usage is not None and usage.registers > 0, "ptxas -v report missing from the compile log"
    limits = declared_limits(inst)
    assert limits, f"{inst.source} declares no '// slim:limits ...' line"
    assert check_limits(usage, limits) == [], f"{_id(inst)} with {compiler_name}: {usage}"


def test_every_shipped_entry_source_has_instances():
    """Every shipped kernel source with an extern "C" entry is reachable from all_instances()."""
    if not SHIPPED:
        pytest.skip("slim_kernel.backends.jit.all_instances() not available yet")
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


def test_defines_reach_the_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    src = tmp_path / "needs_define.cuh"
    src.write_text('#if NEED != 7\n#error NEED must be 7\n#endif\nextern "C" __global__ void k(int* p) { p[0] = NEED; }\n')
    for name in COMPILERS:
        cache.compile_cubin(KernelInstance.make(str(src), "k", "p", NEED=7), "sm_90a", name)
        with pytest.raises(compiler.CompileError, match="NEED must be 7"):
            cache.compile_cubin(KernelInstance.make(str(src), "k", "p", NEED=8), "sm_90a", name)


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
