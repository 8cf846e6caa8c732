"""Eager per-call host cost of the public ops vs the libraries they route to, and its targets.

For each shape, in one run: our public op per backend, the backend function called
directly, the direct flashinfer call, and torch (F.linear / torch.bmm) of the same shape.
bmm_fp8 (the MLA shapes, 16 heads x T {1, 16, 64, 512} x (K, N) {(128, 512), (512, 128)}):
sk.bmm_fp8 vs flashinfer.bmm_fp8(backend="cublas") vs the fast path's runner call alone, plus
sk.bmm_fp8 with the public call swapped in (what serves when the fast path is off).
Host µs/call = wall time of a loop of eager calls (no sync inside) / calls, median of
repeats, variants interleaved in each repeat; graph µs/call = CUDA-graph replay of the same
calls. The JSON records the flashinfer version and the fast-path state. cProfile tops for two ops.

    python benchmark/bench_eager.py --json OUT.json [--png OUT.png]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import slim_kernel as sk
from slim_kernel.backends import flashinfer_fastpath as fp

DEV = "cuda"
CALLS, REPEATS, GRAPH_CALLS = 200, 15, 50


def host_us(variants: dict) -> dict:
    """Median host µs/call per variant; variants interleaved so host noise hits them alike."""
    for fn in variants.values():
        for _ in range(30):
            fn()
    torch.cuda.synchronize()
    samples = {label: [] for label in variants}
    for _ in range(REPEATS):
        for label, fn in variants.items():
            t = time.perf_counter()
            for _ in range(CALLS):
                fn()
            samples[label].append((time.perf_counter() - t) / CALLS * 1e6)
            torch.cuda.synchronize()
    return {label: statistics.median(v) for label, v in samples.items()}


def graph_us(fn) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(REPEATS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    return statistics.median(samples)


def _fp8(shape, dtype=torch.float8_e4m3fn):
    return torch.randn(shape, device=DEV).to(dtype)


def _with_public_path(call):
    """``call`` with the bmm_fp8 fast path swapped out for the public call (what serves when it is off)."""
    def run():
        saved, fp._serve = fp._serve, fp._public_call
        try:
            call()
        finally:
            fp._serve = saved
    return run


def bmm_fp8_cases(fi: bool):
    """The MLA shapes: 16 heads x T x (K, N); sk.bmm_fp8 vs flashinfer.bmm_fp8 vs its runner alone."""
    if fi:
        import flashinfer

        fp.decide()  # import flashinfer, detect the internals (the first call of each case verifies)
    for tokens in (1, 16, 64, 512):
        for k, n in ((128, 512), (512, 128)):
            A, W = _fp8((16, tokens, k)), _fp8((16, n, k))
            B, s = W.transpose(-2, -1), torch.ones(1, device=DEV)
            out = torch.empty(16, tokens, n, device=DEV, dtype=torch.bfloat16)
            a16, b16 = A.bfloat16(), B.bfloat16()
            v = {"torch.bmm (bf16)": lambda a16=a16, b16=b16: torch.bmm(a16, b16)}
            if fi:
                v["sk.bmm_fp8"] = lambda A=A, B=B, s=s, out=out: sk.bmm_fp8(A, B, s, s, torch.bfloat16, out)
                v["flashinfer.bmm_fp8"] = lambda A=A, B=B, s=s, out=out: flashinfer.bmm_fp8(
                    A, B, s, s, torch.bfloat16, out, backend="cublas")
                direct = fp._direct
                if direct is not None:  # the floor: what the fast path calls, workspace prefetched
                    ws = direct.workspace("bmm_fp8_workspace", direct.workspace_size, A.device)
                    if direct.heuristic is not None:
                        v["runner only"] = lambda h=direct.heuristic, A=A, B=B, s=s, out=out, ws=ws: h(
                            A, B, out, s, s, ws)
                    else:
                        v["runner only"] = lambda r=direct.runner, i=[A, B, s, s, out, ws]: r(inputs=i, tactic=-1)
                v["backend fn"] = lambda A=A, B=B, s=s, out=out: fp.bmm_fp8(out, A, B, s, s)
                v["sk.bmm_fp8 public path"] = _with_public_path(v["sk.bmm_fp8"])
            v["sk.bmm_fp8 torch"] = lambda A=A, B=B, s=s, out=out: sk.bmm_fp8(
                A, B, s, s, torch.bfloat16, out, backend="torch")
            yield f"bmm_fp8 h16 t{tokens} k{k} n{n}", v


def cases():
    """(case name, {variant: zero-arg callable}) for every measured shape."""
    fi = importlib.util.find_spec("flashinfer") is not None
    if fi:
        from flashinfer.gemm import mm_M1_16_K7168_N256, tinygemm_bf16
    jitb = importlib.import_module("slim_kernel.backends.jit") if _jit_ok() else None
    yield from bmm_fp8_cases(fi)
    for m in (1, 16):
        h, Wr = torch.randn(m, 7168, device=DEV, dtype=torch.bfloat16), torch.randn(256, 7168, device=DEV,
                                                                                    dtype=torch.bfloat16)
        out = torch.empty(m, 256, device=DEV)
        v = {"F.linear": lambda h=h, Wr=Wr: F.linear(h, Wr)}
        if fi:
            v["flashinfer mm_M1_16_K7168_N256"] = lambda h=h, Wr=Wr, out=out: mm_M1_16_K7168_N256(
                h, Wr.t(), out, launch_with_pdl=False)
            v["sk.router flashinfer"] = lambda h=h, Wr=Wr, out=out: sk.dsv3_router_gemm(
                h, Wr, torch.float32, out, backend="flashinfer")
        if jitb:
            v["sk.router jit"] = lambda h=h, Wr=Wr, out=out: sk.dsv3_router_gemm(h, Wr, torch.float32, out,
                                                                                backend="jit")
            fn = jitb.prepare_router((out, h, Wr), None)
            v["backend fn jit"] = lambda h=h, Wr=Wr, out=out, fn=fn: fn(out, h, Wr)
        yield f"router M{m} E256 fp32", v
        a, Wa = torch.randn(m, 7168, device=DEV, dtype=torch.bfloat16), torch.randn(2112, 7168, device=DEV,
                                                                                    dtype=torch.bfloat16)
        outa = torch.empty(m, 2112, device=DEV, dtype=torch.bfloat16)
        v = {"F.linear": lambda a=a, Wa=Wa: F.linear(a, Wa)}
        if fi:
            v["flashinfer tinygemm_bf16"] = lambda a=a, Wa=Wa, outa=outa: tinygemm_bf16(a, Wa, outa)
            v["sk.fused_a flashinfer"] = lambda a=a, Wa=Wa, outa=outa: sk.dsv3_fused_a_gemm(
                a, Wa.t(), outa, backend="flashinfer")
        if jitb:
            v["sk.fused_a jit"] = lambda a=a, Wa=Wa, outa=outa: sk.dsv3_fused_a_gemm(a, Wa.t(), outa, backend="jit")
            fn = jitb.prepare_fused_a((outa, a, Wa.t()), None)
            v["backend fn jit"] = lambda a=a, Wa=Wa, outa=outa, fn=fn: fn(outa, a, Wa.t())
        yield f"fused_a M{m} N2112", v


def _jit_ok() -> bool:
    try:
        from slim_kernel.jit import available
        return available() is None
    except ImportError:
        return False


def profile(fn, calls=3000) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    return [line for line in buf.getvalue().splitlines() if line.strip()][-14:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--png")
    args = parser.parse_args()
    results, profiles = [], {}
    for name, variants in cases():
        row = {"case": name, "host_us": {}, "graph_us": {}, "errors": {}}
        for label, fn in list(variants.items()):
            try:
                row["graph_us"][label] = round(graph_us(fn), 3)
            except Exception as exc:  # record and go on: one broken backend must not hide the rest
                row["errors"][label] = f"{type(exc).__name__}: {exc}"[:300]
                del variants[label]
        row["host_us"] = {label: round(us, 2) for label, us in host_us(variants).items()}
        results.append(row)
        for label in ("sk.bmm_fp8", "sk.router jit"):
            if label in variants and label not in profiles and label not in row["errors"]:
                profiles[label] = profile(variants[label])
    targets = check_targets(results)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "slim_kernel": sk.__version__,
            "command": " ".join(["python", *sys.argv]), "calls": CALLS, "repeats": REPEATS,
            "flashinfer": fp.fast_path_state()["flashinfer"], "bmm_fp8_fast_path": fp.fast_path_state()}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results, "targets": targets, "profiles": profiles}, f, indent=1)
    if args.png:
        plot(results, args.png)
    print(f"{'case':<32} {'variant':<32} {'host us':>8} {'graph us':>9}")
    for row in results:
        for label, us in row["host_us"].items():
            print(f"{row['case']:<32} {label:<32} {us:8.1f} {row['graph_us'][label]:9.2f}")
        for label, err in row["errors"].items():
            print(f"{row['case']:<32} {label:<32} ERROR {err[:80]}")
    for t in targets:
        print(f"target {t['what']}: {t['value']:.2f} <= {t['limit']:.2f}: {'MET' if t['met'] else 'MISSED'}")
    print(bmm_fp8_table(results, meta))
    return 0


def bmm_fp8_table(results, meta) -> str:
    """The short bmm_fp8 table printed last: eager medians and graph replay, µs per call."""
    state = meta["bmm_fp8_fast_path"]
    lines = [f"bmm_fp8, flashinfer {meta['flashinfer']}, fast path {state['bmm_fp8_fast_path']}"
             + (f" ({state['reason']})" if state["reason"] else f" (workspace {state['workspace']})"),
             f"{'case':<26}{'sk':>8}{'fi':>8}{'sk/fi':>7}{'runner':>8}{'public':>8}{'graph sk':>10}{'graph fi':>10}"]
    for row in results:
        h, g = row["host_us"], row["graph_us"]
        if not row["case"].startswith("bmm_fp8") or "sk.bmm_fp8" not in h or "flashinfer.bmm_fp8" not in h:
            continue
        cells = [h["sk.bmm_fp8"], h["flashinfer.bmm_fp8"], h["sk.bmm_fp8"] / h["flashinfer.bmm_fp8"],
                 h.get("runner only", float("nan")), h.get("sk.bmm_fp8 public path", float("nan")),
                 g["sk.bmm_fp8"], g["flashinfer.bmm_fp8"]]
        lines.append(f"{row['case'].removeprefix('bmm_fp8 '):<26}" + "".join(
            f"{c:>{w}.{d}f}" for c, w, d in zip(cells, (8, 8, 7, 8, 8, 10, 10), (1, 1, 2, 1, 1, 2, 2))))
    return "\n".join(lines)


def check_targets(results) -> list[dict]:
    """The eager-cost targets (``sk.bmm_fp8`` under 20 host µs and half flashinfer's call, its public path no
    slower than that call), each from numbers measured in this run."""
    out = []
    for row in results:
        h, g = row["host_us"], row["graph_us"]
        if "sk.bmm_fp8" in h and "flashinfer.bmm_fp8" in h:  # bmm_fp8's fast path against flashinfer's call
            out.append({"what": f"{row['case']}: sk.bmm_fp8 host us", "value": h["sk.bmm_fp8"], "limit": 20.0})
            out.append({"what": f"{row['case']}: sk.bmm_fp8 host us vs 0.5x flashinfer.bmm_fp8",
                        "value": h["sk.bmm_fp8"], "limit": 0.5 * h["flashinfer.bmm_fp8"]})
            if "sk.bmm_fp8 public path" in h:  # what serves when the fast path is off
                out.append({"what": f"{row['case']}: sk.bmm_fp8 public path host us vs flashinfer.bmm_fp8",
                            "value": h["sk.bmm_fp8 public path"], "limit": h["flashinfer.bmm_fp8"]})
        if "sk.bmm_fp8" in g and "flashinfer.bmm_fp8" in g:
            out.append({"what": f"{row['case']}: sk.bmm_fp8 graph us vs flashinfer.bmm_fp8 + 0.1",
                        "value": g["sk.bmm_fp8"], "limit": g["flashinfer.bmm_fp8"] + 0.1})
        for op in ("router", "fused_a"):
            label = f"sk.{op} jit"
            if label in h and "F.linear" in h:
                out.append({"what": f"{row['case']}: {label} host us vs 1.5x F.linear", "value": h[label],
                            "limit": 1.5 * h["F.linear"]})
            if label in g and "backend fn jit" in g:
                out.append({"what": f"{row['case']}: {label} graph us vs backend fn + 0.1", "value": g[label],
                            "limit": g["backend fn jit"] + 0.1})
    for t in out:
        t["met"] = t["value"] <= t["limit"]
    return out


def plot(results, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 0.45 * sum(len(r["host_us"]) for r in results) + 1))
    labels, values = [], []
    for row in results:
        for label, us in row["host_us"].items():
            labels.append(f"{row['case']} | {label}")
            values.append(us)
    ax.barh(range(len(values)), values, color=["tab:green" if "sk." in lab else "tab:gray" for lab in labels])
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("eager host time per call (µs), H200 host")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
