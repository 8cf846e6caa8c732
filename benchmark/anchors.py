"""What a user would otherwise run, loaded for the GEMM benchmark (GPU machine).

* flashinfer as installed (0.7.4 or 0.7.2.post1 in separate runs): its fixed-shape router GEMMs
  ``mm_M1_16_K{K}_N{E}[_bf16]`` where it ships the shape, and ``tinygemm_bf16``, each with and
  without PDL;
* sglang's own JIT GEMMs, from an installed ``sglang`` or a directory given with ``--sglang``
  (a standalone copy of its ``sglang/kernels``): 0.5.23's ``tiny_gemm_bf16`` (its router path since
  0.5.20; also a generic skinny GEMM) and ``dsv3_fused_a_gemm``, 0.5.19's ``dsv3_router_gemm``;
  PDL on, as sglang runs them on Hopper;
* torch: ``torch.mm(..., out_dtype=float32)`` (fp32 out) and ``F.linear`` (bf16 out).

:meth:`Anchors.for_shape` returns ``{name: fn(out, x, w_arg)}`` for one point (``w_arg`` is the
op's weight argument: the router's (E, K) weight, fused-A's (K, N) column-major view; an anchor
that allocates its result returns it); an anchor that cannot load is a note in the report and its
column is absent.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib import metadata

import torch
import torch.nn.functional as F

ROUTER = "dsv3_router_gemm"


def columns(impls: dict) -> dict:
    """``{name: fn}`` of :meth:`Anchors.for_shape` as the benchmarks' columns, ``anchor:<name>``."""
    return {f"anchor:{name}": fn for name, fn in impls.items()}


def _sglang_router_serves(e: int, k: int) -> bool:
    """sglang's ``dsv3_router_gemm`` builds only for 256 or 384 experts and K a multiple of 1024 (its docstring and
    static_assert): elsewhere its module fails to compile, so it is no anchor there."""
    return e in (256, 384) and k % 1024 == 0


class Anchors:
    def __init__(self, notes: list[str], sglang_dir: str | None):
        self.notes = notes
        self.fi_gemm = None
        self.flashinfer_version = None
        if importlib.util.find_spec("flashinfer") is None:
            notes.append("flashinfer is not installed: its columns and the PDL-aware producer are absent")
        else:
            try:
                import flashinfer.gemm

                self.fi_gemm = flashinfer.gemm
                self.flashinfer_version = metadata.version("flashinfer-python")
            except Exception as exc:  # noqa: BLE001 - report any import failure and go on
                notes.append(f"flashinfer unusable ({type(exc).__name__}: {exc}): its columns are absent")
        self.sgl = self._load_sglang(sglang_dir)

    def _load_sglang(self, sglang_dir: str | None):
        if sglang_dir:
            sys.path.insert(0, os.path.abspath(sglang_dir))
        if importlib.util.find_spec("sglang") is None:
            self.notes.append("sglang is not installed and no --sglang directory was given: its columns are absent")
            return None
        try:
            os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
            from sglang.kernels.jit.utils import parallel_compile
            from sglang.kernels.ops.gemm import dsv3_fused_a_gemm as sgl_fa
            from sglang.kernels.ops.gemm import dsv3_router_gemm as sgl_router
            from sglang.kernels.ops.gemm import tiny_gemm as sgl_tiny
        except Exception as exc:  # noqa: BLE001
            self.notes.append(f"sglang's JIT kernels unusable ({type(exc).__name__}: {exc}): their columns are absent")
            return None
        return sgl_tiny, sgl_router, sgl_fa, parallel_compile

    def versions(self) -> dict:
        return {"flashinfer": self.flashinfer_version or "not installed",
                "sglang_anchors": "0.5.23 (tiny_gemm, fused_a), 0.5.19 (dsv3_router_gemm)" if self.sgl else "absent"}

    def warm_sglang(self, shapes) -> None:
        """Build every sglang module the run uses, in parallel, before any timing."""
        if self.sgl is None:
            return
        tiny, router, fa, parallel_compile = self.sgl
        jobs = []
        for s in shapes:
            out = getattr(torch, s.out)
            if tiny.can_use_tiny_gemm(s.n, s.k, 16):
                split = tiny._default_n_gemm_n_split(s.n, s.k, 16) if s.k > s.n else tiny._default_k_gemm_n_split(s.n, s.k)
                jobs.append(lambda s=s, o=out, sp=split: tiny._jit_tiny_gemm_module(s.n, s.k, 16, sp, o, torch.bfloat16))
            if s.op == ROUTER:
                if _sglang_router_serves(s.n, s.k):
                    jobs.append(lambda s=s: router.dsv3_router_gemm_module(s.n, s.k, True, s.out == "float32"))
            else:
                jobs.append(lambda s=s: fa.dsv3_fused_a_gemm_module(s.k, s.n, True))
        try:
            parallel_compile(jobs)
        except Exception as exc:  # noqa: BLE001 - a module that does not build: its anchor fails its check
            self.notes.append(f"sglang module build failed ({type(exc).__name__}: {exc})")

    def for_shape(self, shape, tp) -> dict:
        m, out_dtype = tp.m, tp.out_dtype
        router = shape.op == ROUTER
        nk = (lambda w: w) if router else (lambda w: w.t())  # the (N, K) weight from the op's argument
        impls = {}
        fi = self.fi_gemm
        if fi is not None and router and m <= 16:
            from slim_kernel.names import FLASHINFER_ROUTERS, flashinfer_router_name

            kern = getattr(fi, flashinfer_router_name(shape.n, shape.k, shape.out), None)
            if kern is not None and (shape.n, shape.k, shape.out) in FLASHINFER_ROUTERS:
                impls["flashinfer"] = lambda o, x, w: kern(x, w.t(), o, launch_with_pdl=False)
                impls["flashinfer_pdl"] = lambda o, x, w: kern(x, w.t(), o, launch_with_pdl=True)
        elif fi is not None and not router and shape.k % 64 == 0 and shape.n % 16 == 0:
            impls["flashinfer"] = lambda o, x, w: fi.tinygemm_bf16(x, w.t(), o, use_pdl=False)
            impls["flashinfer_pdl"] = lambda o, x, w: fi.tinygemm_bf16(x, w.t(), o, use_pdl=True)
        if self.sgl is not None and m <= 16:
            tiny, sgl_router, _, _ = self.sgl
            if tiny.can_use_tiny_gemm(shape.n, shape.k, 16):
                impls["sglang:tiny_gemm"] = lambda o, x, w: tiny.tiny_gemm_bf16(x, nk(w), o, max_m=16)
            if router:
                if _sglang_router_serves(shape.n, shape.k):
                    impls["sglang:router"] = lambda o, x, w: sgl_router.dsv3_router_gemm(x, w, out_dtype, output=o)
            else:
                # what sglang's MLA calls: dsv3_fused_a_gemm(hidden_states, weight.T), output allocated inside
                impls["sglang:fused_a"] = lambda o, x, w: torch.ops.sglang.jit_dsv3_fused_a_gemm(x, w)
        if out_dtype == torch.float32:  # as a user writes it: the result allocated by the call
            impls["torch"] = lambda o, x, w: torch.mm(x, nk(w).t(), out_dtype=torch.float32)
        else:
            impls["torch"] = lambda o, x, w: F.linear(x, nk(w))
        return impls

