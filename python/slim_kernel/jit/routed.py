"""Which JIT kernel instance serves a call, and every instance the routing can pick for given shapes.

Torch-free. One call of a JIT op at (shape, M) runs the configuration of :func:`config_for`: the
tile rules in force (``SLIM_KERNEL_JIT_CONFIG_<OP>``, :func:`set_config`), else the variant the
routing table names for the JIT backend at that point (:func:`routed_variant`), else the
catalogue's fallback. :func:`routed_instances` lists those instances for every M of the JIT window,
both launch contexts (with and without PDL) and the installed flashinfer version: what
``slim-kernel precompile --model/--router/--fused-a`` compiles and ``slim-kernel info`` checks in the
cache. It lists the JIT instance of every point, also where another backend ranks first, so the
JIT can serve any of them (a pinned ``backend="jit"``, flashinfer missing) without compiling.
"""

from __future__ import annotations

import dataclasses
import os

from .. import knobs, routing
from . import catalogue as cat
from . import rules as tile_rules
from .arch import Limits, limits
from .spec import KernelInstance

_RULES: dict[str, tile_rules.Rules | None] = {}  # op -> rules set at run time or from the environment


def env_var(op: str) -> str:
    return knobs.jit_config_var(op)


def rules(op: str) -> tile_rules.Rules | None:
    """The tile rules in force for ``op`` (set_config, else the environment), or None (routing decides)."""
    if op not in _RULES:
        text = os.environ.get(env_var(op))
        try:
            _RULES[op] = tile_rules.parse_rules(text, op) if text else None
        except ValueError as exc:
            raise ValueError(f"{env_var(op)}: {exc}") from None
    return _RULES[op]


def set_config(op: str, text_or_rules) -> None:
    """Replace ``op``'s tile rules (a rule string, parsed rules, or None: back to the routing table)."""
    _RULES[op] = tile_rules.parse_rules(text_or_rules, op) if isinstance(text_or_rules, str) else text_or_rules
    knobs.bump()


def launch_reason(cfg: cat.GemmConfig, op: str, m: int, shape: tuple[int, int], lim: Limits) -> str | None:
    """Why ``cfg`` cannot launch for ``op`` at ``m`` and (N, K) on a device of limits ``lim`` (its ``sms``
    SMs, shared memory per CTA, threads and registers per block, cluster size), or None: it fits."""
    grid, block, cluster = cfg.geometry(*shape, lim.sms or 1)
    smem, threads = cfg.smem(m, shape), block[0] * block[1] * block[2]
    registers = getattr(cfg, "registers", None)
    regs = registers(m, shape) if registers else 0
    size = cluster[0] * cluster[1] * cluster[2] if cluster else 1
    if smem > lim.smem_per_block:
        return f"needs {smem} bytes of shared memory per CTA, the device allows {lim.smem_per_block}"
    if threads > lim.threads_per_block or regs * threads > lim.regs_per_block:
        return f"needs {threads} threads x {regs} registers per CTA, the device allows {lim.threads_per_block} " \
               f"threads and {lim.regs_per_block} registers"
    if size > min(lim.max_cluster, lim.sms or size):
        return f"needs clusters of {size} CTAs, the device allows {min(lim.max_cluster, lim.sms or size)}"
    return None


def config_for(op: str, m: int, variant: str | None, shape: tuple[int, int] | None = None,
               lim: Limits | None = None) -> tuple[str, cat.GemmConfig]:
    """(label, config) serving ``op`` at ``m`` and the call's (N, K): the rules in force, else ``variant``
    where it serves there, else the fallback. With the device's limits ``lim`` (and ``shape``) only a
    configuration that fits them (``catalogue.launch_reason``) is taken: the routed one, the fallback, else
    the first in catalogue order that fits; the fallback where none does (the caller's check then declines)."""
    r = rules(op)
    if r is not None:
        return "rules", tile_rules.rule_for(r, m)
    order = [variant or "", cat.FALLBACK_VARIANT] + (list(cat.VARIANTS[op]) if lim is not None else [])
    for name in order:
        cfg = cat.VARIANTS[op].get(name)
        if cfg is not None and cat.variant_serves(cfg, op, m, shape) and (
                lim is None or shape is None or launch_reason(cfg, op, m, shape, lim) is None):
            return name, cfg
    return cat.FALLBACK_VARIANT, cat.VARIANTS[op][cat.FALLBACK_VARIANT]


def target_device(arch: str) -> routing.Device:
    """The GPU info routes for on ``arch``: the visible GPU of that arch, else the device the shipped table
    was measured on first (with that arch), else the arch's reference part (jit.arch.LIMITS)."""
    return target_devices(arch)[0]


def target_devices(arch: str) -> list[routing.Device]:
    """The GPUs precompile routes for on ``arch``: the visible GPU of that arch; with none visible (an image
    built on a CPU machine), every device a shipped table of the arch was measured on, so the cache serves
    each of them; else the arch's reference part (jit.arch.LIMITS)."""
    want = routing_arch(arch)
    try:
        import torch

        if torch.cuda.is_available():
            from ..devices import routing_device

            for i in range(torch.cuda.device_count()):
                dev = routing_device(torch.device("cuda", i))
                if dev.arch == want:
                    return [dev]
    except Exception:  # noqa: BLE001 - no torch or driver: route for the shipped tables' devices
        pass
    reference = limits(want).sms or limits("sm_90").sms
    shipped = [routing.Device(t.device or "unknown", t.sms or reference, want, t.memory_gbps) for t in routing.tables(want)]
    return list(dict.fromkeys(shipped)) or [routing.Device("unknown", reference, want)]


def routing_arch(arch: str) -> str:
    """``sm_90a`` (a compile target) -> ``sm_90`` (what routing keys on)."""
    return arch.removesuffix("a").removesuffix("f")


def routed_variant(op: str, shape: dict, m: int, device: routing.Device, pdl: bool) -> str | None:
    """The JIT configuration routing names at this point (tuned, shipped or estimated; the registry
    binds the same: ``Decision.point.best("jit")``), or None where no source says anything."""
    dec = routing.lookup(op, shape, m, pdl, device)
    best = dec.point.best("jit") if dec is not None else None
    return best[0] if best else None


def cache_coverage(arch: str, shapes) -> dict:
    """``{"arch", "routed", "cached", "missing": [instance labels]}`` for :func:`routed_instances`, or
    ``{"arch", "error"}`` where no compiler (whose version keys the cache) is usable. Compiles nothing."""
    from .cache import is_cached
    from .compiler import CompilerUnavailableError, get_compiler

    try:
        compiler = get_compiler()
    except (CompilerUnavailableError, ValueError) as exc:
        return {"arch": arch, "error": f"cannot check without the compiler whose version keys the cache: {exc}"}
    pairs = routed_instances(arch, shapes)
    missing = [inst.label for _, inst in pairs if not is_cached(inst, arch, compiler)]
    row = {"arch": arch, "routed": len(pairs), "cached": len(pairs) - len(missing), "missing": missing}
    if missing:
        row.update(compiler_mismatch(arch, compiler.fingerprint()) or {})
    return row


def compiler_mismatch(arch: str, this: str) -> dict | None:
    """Where ``arch`` entries on disk were built by other compilers than ``this`` (the fingerprint that
    keys this process's lookups): who built them, and how to fix it; else None.

    Such entries are never served: the cache key pins the compiler name and version. Even nvcc and NVRTC
    of one release build different cubins (nvcc 13.0.88 and NVRTC 13.0 give 100 of the 998 instances of
    tests/test_jit_compile.py other register counts), the no-spill check holds per toolchain, and a cubin
    from a newer toolkit is not guaranteed to load on an older driver. Compiling with the compiler that
    built them is the way to use them."""
    from .cache import compilers_of_entries

    others = {name: n for name, n in compilers_of_entries(arch).items() if name != this}
    if not others:
        return None
    built = ", ".join(f"{n} by {name}" for name, n in sorted(others.items()))
    fix = (f"run `slim-kernel precompile` in the serving environment (the compiler it resolves is the one "
           f"that keys the cache), or serve with SLIM_KERNEL_JIT_COMPILER={_name(others)} where that "
           "compiler and version are installed")
    return {"this_compiler": this, "cache_compilers": others,
            "mismatch": f"cached {arch} entries were built by another compiler ({built}); this process compiles "
                        f"with {this}, whose entries only it serves: {fix}"}


def _name(fingerprints: dict) -> str:
    """The compiler name (nvrtc, nvcc) of the most common fingerprint, e.g. 'nvcc' of 'nvcc 13.0.88 (...)'."""
    return max(fingerprints.items(), key=lambda kv: kv[1])[0].split(" ", 1)[0]


def routed_instances(arch: str, shapes) -> list[tuple[str, KernelInstance]]:
    """``(op, instance)`` for every instance the JIT backend can launch on ``arch`` for ``shapes``
    (``models.Shape``s) at M = 1..MAX_M, in both launch contexts, on each of :func:`target_devices`: the
    configurations that fit the arch's limits."""
    out: list[tuple[str, KernelInstance]] = []
    for device in target_devices(arch):
        lim = dataclasses.replace(limits(arch), sms=device.sms)
        for shape in shapes:
            for m in range(1, cat.MAX_M + 1):
                for pdl in (True, False):
                    _, cfg = config_for(shape.op, m, routed_variant(shape.op, shape.key(), m, device, pdl),
                                        (shape.n, shape.k), lim)
                    pair = (shape.op, cfg.instance(shape.op, m, shape.out, (shape.n, shape.k)))
                    if pair not in out:
                        out.append(pair)
    return out
