"""One rank of benchmark/cold_start.py (which launches it): the first call of every routed instance (role
``ours``) or of the anchors (``anchors``), each checked against float64; writes its result as JSON.

    python3 benchmark/cold_start_rank.py ours|anchors --out F --device D --ms 1,2,... [--sglang DIR] [--rotate]

Times are seconds from the launch (the launcher's time.monotonic() in COLD_START_T0, a system-wide clock);
RANK and WORLD_SIZE come from the environment, torch.distributed style.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import types
from pathlib import Path

from cold_start import T0_ENV, ms_list


def shapes() -> list[tuple[str, dict]]:
    """DeepSeek-V3's shapes (slim_kernel/models.py), as (op, routing shape key)."""
    from slim_kernel.models import model_shapes

    return [(s.op, s.key()) for s in model_shapes("deepseek-v3")]


def routed_calls(device, ms: list[int]) -> list[dict]:
    """Every (op, shape, M, launch context) of the DeepSeek-V3 shapes the routing table picks for."""
    from slim_kernel import info

    wanted = shapes()
    return [r for r in info._picks(device) if r["m"] in ms and (r["op"], r["shape"]) in wanted]


def _instance(row: dict) -> str | None:
    """The JIT kernel instance a "jit:<variant>" pick compiles (entry and defines), else None."""
    from slim_kernel.backends import jit as jb

    backend, _, variant = row["pick"].partition(":")
    if backend != "jit":
        return None
    shape = row["shape"]
    inst = jb.config_for(row["op"], row["m"], variant)[1].instance(
        row["op"], row["m"], shape.get("out", "bfloat16"), (shape.get("e") or shape["n"], shape["k"]))
    return f"{inst.entry} {dict(inst.defines)}"


def _operands(shape: dict, m: int, gen, device, weights: dict):
    """(weight (N, K), activation (M, K), output (M, N)) of a call at ``shape``: bf16 random; weights per (N, K)."""
    import torch

    n, k = shape.get("e") or shape["n"], shape["k"]
    if (n, k) not in weights:
        weights[n, k] = torch.randn(n, k, generator=gen, device=device).bfloat16()
    x = torch.randn(m, k, generator=gen, device=device).bfloat16()
    return weights[n, k], x, torch.empty(m, n, device=device, dtype=getattr(torch, shape.get("out", "bfloat16")))


def _call(result: dict, row: dict, fn, w, x, out, since) -> None:
    """Run ``fn`` once (output poisoned first) to the device's completion, check what it wrote (its return
    value, else ``out``) against float64 with the tests' tolerance (tests/_inputs.py), record it."""
    import torch

    from _inputs import TOL, rel_err

    out.fill_(float("nan"))
    t = time.monotonic()
    res = fn()
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    seconds = time.monotonic() - t
    res = res if isinstance(res, torch.Tensor) else out
    err = rel_err(res, x.double() @ w.double().t())
    result["calls"].append({**row, "seconds": round(seconds, 4), "done_s": since(),
                            "rel_err": err if math.isfinite(err) else None, "ok": err <= TOL[res.dtype]})
    result.setdefault("first_result_s", since())


def run_ours(result: dict, device, ms: list[int], since, rotate: bool) -> None:
    import torch

    import slim_kernel as sk
    from slim_kernel import knobs
    from slim_kernel.names import ROUTER

    sk.dsv3_router_gemm  # noqa: B018 - imports the ops
    result["import_s"] = since()
    calls = sorted(routed_calls(device, ms), key=lambda r: not r["pdl"])  # one knob change: PDL rows first
    if rotate and calls:
        cut = result["rank"] * len(calls) // int(os.environ["WORLD_SIZE"])
        calls = calls[cut:] + calls[:cut]
    gen, weights = torch.Generator(device=device).manual_seed(result["rank"]), {}
    for row in calls:
        w, x, out = _operands(row["shape"], row["m"], gen, device, weights)
        if knobs.pdl_setting() != row["pdl"]:
            knobs.set_pdl(row["pdl"])
        if row["op"] == ROUTER:
            fn = functools.partial(sk.dsv3_router_gemm, x, w, out.dtype, out)
        else:
            fn = functools.partial(sk.dsv3_fused_a_gemm, x, w.t(), out)
        _call(result, {**row, "instance": _instance(row)}, fn, w, x, out, since)


def run_anchors(result: dict, device, ms: list[int], since, sglang: str | None) -> None:
    import importlib.util

    import torch

    imports = result["imports"] = {}
    if importlib.util.find_spec("flashinfer") is not None:
        t = time.monotonic()
        import flashinfer.gemm  # noqa: F401
        imports["flashinfer"] = round(time.monotonic() - t, 4)
    from anchors import Anchors

    from slim_kernel import models

    t = time.monotonic()
    anchors = Anchors(result["notes"], sglang)
    imports["anchors_init"] = round(time.monotonic() - t, 4)  # Anchors(): sglang's modules, flashinfer.norm
    gen, weights = torch.Generator(device=device).manual_seed(result["rank"]), {}
    for op, shape in shapes():
        spec = models.Shape.from_key(op, shape)
        for m in ms:
            w, x, out = _operands(shape, m, gen, device, weights)
            w_arg = w if op == models.ROUTER else w.t()
            impls = anchors.for_shape(spec, types.SimpleNamespace(m=m, out_dtype=out.dtype))
            for name, impl in impls.items():
                if name == "torch":
                    continue
                try:
                    _call(result, {"op": op, "shape": shape, "m": m, "pick": name},
                          functools.partial(impl, out, x, w_arg), w, x, out, since)
                except Exception as exc:  # noqa: BLE001 - an anchor that cannot run: noted, the others go on
                    result["notes"].append(f"{name} {op} {shape} M={m}: {type(exc).__name__}: {exc}")


def worker(args) -> int:
    t0 = float(os.environ[T0_ENV])

    def since() -> float:
        return round(time.monotonic() - t0, 4)

    result = {"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]), "pid": os.getpid(),
              "role": args.role, "device": f"cuda:{args.device}", "calls": [], "notes": []}
    try:
        import torch

        result["torch_import_s"] = since()
        device = torch.device("cuda", args.device)
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
        result["cuda_init_s"] = since()
        if args.role == "ours":
            run_ours(result, device, args.ms, since, args.rotate)
        else:
            run_anchors(result, device, args.ms, since, args.sglang)
        result["all_results_s"] = since()
    except Exception as exc:  # noqa: BLE001 - reported with the rank's partial result
        result["error"] = f"{type(exc).__name__}: {exc}"
    Path(args.out).write_text(json.dumps(result))
    return 1 if "error" in result else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=("ours", "anchors"))
    p.add_argument("--out", required=True, help="the result JSON")
    p.add_argument("--device", type=int, required=True, help="CUDA device index")
    p.add_argument("--ms", type=ms_list, required=True, help="M values")
    p.add_argument("--sglang", help="a standalone copy of sglang's JIT kernels")
    p.add_argument("--rotate", action="store_true", help="start the call list RANK/WORLD_SIZE of the way in")
    return worker(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
