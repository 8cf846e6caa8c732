"""What a user would otherwise run, loaded for the GEMM benchmark (GPU machine).

* flashinfer as installed (0.7.4 or 0.7.2.post1 in separate runs): the router kernels
  ``mm_M1_16_K7168_N256/_N384[_bf16]`` and ``tinygemm_bf16``, with and without PDL, and its
  ``rmsnorm(..., enable_pdl=True)`` as the PDL-aware producer;
* sglang's own JIT GEMMs (standalone copy, ../shared/anchors/sglang_jit, carried into the checkout, or
  an installed sglang that has ``sglang.kernels.ops.gemm``):
  0.5.23's ``tiny_gemm_bf16`` (its router path since 0.5.20; also a generic skinny GEMM) and
  ``dsv3_fused_a_gemm``, 0.5.19's ``dsv3_router_gemm``; PDL on, as sglang runs them on Hopper;
* torch: ``F.linear`` (bf16 out) and ``torch.mm(..., out_dtype=float32)``.

Every factory returns ``{name: make(w) -> call()}`` for one case; a failed import is a note in
the report and the columns are absent.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib import metadata

import torch
import torch.nn.functional as F


class Anchors:
    def __init__(self, notes: list[str], sglang_dir: str | None):
        self.notes = notes
        self.fi = self.fi_norm = None
        self.flashinfer_version = None
        if importlib.util.find_spec("flashinfer") is None:
            notes.append("flashinfer is not installed: its columns and the PDL-aware producer are absent")
        else:
            try:
                import flashinfer.norm

                from slim_kernel.backends import flashinfer as fib

                self.fi, self.fi_norm = fib, flashinfer.norm
                self.flashinfer_version = metadata.version("flashinfer-python")
            except Exception as exc:  # noqa: BLE001 - report any import failure and go on
                notes.append(f"flashinfer unusable ({type(exc).__name__}: {exc}): its columns are absent")
        self.sgl = None
        if sglang_dir or importlib.util.find_spec("sglang") is not None:  # a standalone copy, else the package
            try:
                if sglang_dir:
                    sys.path.insert(0, os.path.abspath(sglang_dir))
                os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
                os.environ.setdefault("SGLANG_JIT_CACHE_DIR", "/tmp/sgl_jit_cache")
                from sglang.kernels.jit.utils import parallel_compile
                from sglang.kernels.ops.gemm import dsv3_fused_a_gemm as sgl_fa
                from sglang.kernels.ops.gemm import dsv3_router_gemm as sgl_router
                from sglang.kernels.ops.gemm import tiny_gemm as sgl_tiny

                self.sgl = (sgl_tiny, sgl_router, sgl_fa, parallel_compile)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"sglang anchors unusable ({type(exc).__name__}: {exc}): their columns are absent")
        else:
            notes.append("no --sglang directory and no sglang package: the sglang anchor columns are absent")

    def versions(self) -> dict:
        return {"flashinfer": self.flashinfer_version or "not installed",
                "sglang_anchors": "0.5.23 (tiny_gemm, fused_a), 0.5.19 (dsv3_router_gemm)" if self.sgl else "absent"}

    def warm_sglang(self, router_cases, fused_a_n: int, k: int) -> None:
        """Build every sglang module the run uses, in parallel, before any timing."""
        if self.sgl is None:
            return
        tiny, router, fa, parallel_compile = self.sgl
        jobs = [lambda: fa.dsv3_fused_a_gemm_module(k, fused_a_n, True)]
        n_split = tiny._default_n_gemm_n_split(fused_a_n, k, 16)
        jobs.append(lambda: tiny._jit_tiny_gemm_module(fused_a_n, k, 16, n_split, torch.bfloat16, torch.bfloat16))
        for e, dt in router_cases:
            split = tiny._default_n_gemm_n_split(e, k, 16)
            jobs.append(lambda e=e, dt=dt, s=split: tiny._jit_tiny_gemm_module(e, k, 16, s, dt, torch.bfloat16))
            jobs.append(lambda e=e, dt=dt: router.dsv3_router_gemm_module(e, k, True, dt == torch.float32))
        try:
            parallel_compile(jobs)
        except Exception as exc:  # noqa: BLE001
            self.notes.append(f"sglang module build failed ({type(exc).__name__}: {exc}): its columns are absent")
            self.sgl = None

    # ---- producers: the kernel that writes the GEMM's activation x ----
    def producers(self, x: torch.Tensor, gen: torch.Generator) -> dict:
        src = torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32).to(x.dtype)
        out = {"plain": lambda: torch.mul(src, 1.0, out=x)}  # a PDL-unaware elementwise kernel
        if self.fi_norm is not None:
            gamma = torch.randn(x.shape[1], generator=gen, device=x.device, dtype=torch.float32).to(x.dtype)
            out["pdl"] = lambda: self.fi_norm.rmsnorm(src, gamma, 1e-6, out=x, enable_pdl=True)
        return out

    # ---- GEMM anchors: name -> (weight (N, K) -> call) ----
    def router(self, e: int, dt: torch.dtype, x: torch.Tensor, out: torch.Tensor) -> dict:
        impls = {}
        if self.fi is not None and (e, dt) in self.fi.ROUTER_KERNELS and x.shape[0] <= 16:
            kern = self.fi.ROUTER_KERNELS[(e, dt)]
            impls["flashinfer"] = lambda w: (lambda: kern(x, w.t(), out, launch_with_pdl=False))
            impls["flashinfer_pdl"] = lambda w: (lambda: kern(x, w.t(), out, launch_with_pdl=True))
        if self.sgl is not None and x.shape[0] <= 16:
            tiny, router, _, _ = self.sgl
            impls["sglang:tiny_gemm"] = lambda w: (lambda: tiny.tiny_gemm_bf16(x, w, out, max_m=16))
            impls["sglang:router"] = lambda w: (lambda: router.dsv3_router_gemm(x, w, dt, output=out))
        if dt == torch.float32:
            impls["torch"] = lambda w: (lambda: torch.mm(x, w.t(), out_dtype=torch.float32))
        else:
            impls["torch"] = lambda w: (lambda: F.linear(x, w))
        return impls

    def fused_a(self, x: torch.Tensor, out: torch.Tensor) -> dict:
        impls = {}
        if self.fi is not None:  # tinygemm_bf16 takes any M (0.7.4 has programs for M up to 64)
            impls["flashinfer"] = lambda w: (lambda: self.fi.tinygemm_bf16(x, w, out, use_pdl=False))
            impls["flashinfer_pdl"] = lambda w: (lambda: self.fi.tinygemm_bf16(x, w, out, use_pdl=True))
        if self.sgl is not None and x.shape[0] <= 16:
            tiny, _, fa, _ = self.sgl
            impls["sglang:tiny_gemm"] = lambda w: (lambda: tiny.tiny_gemm_bf16(x, w, out, max_m=16))
            # what sglang's MLA calls: dsv3_fused_a_gemm(hidden_states, weight.T), output allocated inside
            impls["sglang:fused_a"] = lambda w: (lambda: torch.ops.sglang.jit_dsv3_fused_a_gemm(x, w.t()))
        impls["torch"] = lambda w: (lambda: F.linear(x, w))
        return impls


def warm_all(sglang_dir: str) -> None:
    """Build every sglang module the GEMM benchmark times (benchmark/gpu_run.sh runs this in the background)."""
    notes: list[str] = []
    anchors = Anchors(notes, sglang_dir)
    anchors.warm_sglang([(e, dt) for e in (256, 384) for dt in (torch.float32, torch.bfloat16)], 2112, 7168)
    print("sglang modules:", "; ".join(notes) or "built")
