"""Experiment (GPU machine): what a stream capture says about the kernel a GEMM would follow.

Question: can a launch under capture tell whether its producer is PDL-aware (launched with
programmatic stream serialization, as flashinfer's rmsnorm(enable_pdl=True) is), so that the
PDL attribute is used only where it pays? Prints, per scenario, the dependency nodes the next
captured launch would get, their kernel names, their incoming edge types and PDL attribute, and
the host cost of one probe.

    python3 benchmark/probe_capture.py
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import torch
    from cuda.bindings import driver as cu

    out = {}

    def probe(stream):
        err, status, _id, _graph, deps, edges, n = cu.cuStreamGetCaptureInfo(stream.cuda_stream)
        nodes = []
        for node in list(deps)[:n]:
            d = {}
            _, typ = cu.cuGraphNodeGetType(node)
            d["type"] = str(typ)
            if typ == cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                try:
                    _, params = cu.cuGraphKernelNodeGetParams(node)
                    _, name = cu.cuFuncGetName(params.func)
                    d["name"] = (name.decode() if isinstance(name, bytes) else str(name))[:80]
                except Exception as exc:  # noqa: BLE001
                    d["name_error"] = repr(exc)
                try:
                    r = cu.cuGraphKernelNodeGetAttribute(
                        node, cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
                    d["pss_attr"] = int(r[1].programmaticStreamSerializationAllowed)
                except Exception as exc:  # noqa: BLE001
                    d["pss_error"] = repr(exc)
            try:
                cnt = cu.cuGraphNodeGetDependencies(node)[-1]
                r = cu.cuGraphNodeGetDependencies(node, cnt)
                d["in_edges"] = [int(e.type) for e in list(r[2])[:cnt]]
            except Exception as exc:  # noqa: BLE001
                d["in_edges_error"] = repr(exc)
            nodes.append(d)
        edge_types = [int(e.type) for e in list(edges)[:n]] if edges else []
        from slim_kernel.pdl import follows_pdl_launch  # the shipped decision, for comparison

        return {"status": str(status), "n": n, "out_edges": edge_types, "nodes": nodes,
                "follows_pdl_launch": follows_pdl_launch(stream.cuda_stream)}

    x = torch.randn(4, 7168, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    gamma = torch.ones(7168, device="cuda", dtype=torch.bfloat16)
    try:
        import flashinfer

        def rms(src, dst):
            flashinfer.norm.rmsnorm(src, gamma, out=dst, enable_pdl=True)
    except Exception as exc:  # noqa: BLE001
        out["flashinfer"] = repr(exc)
        rms = None
    import slim_kernel as sk
    w = torch.randn(256, 7168, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(4, 256, device="cuda")
    sk.dsv3_router_gemm(x, w, torch.float32, output=logits)  # compile outside the capture
    if rms:
        rms(x, y)
    torch.cuda.synchronize()
    scenarios = {
        "plain": lambda: torch.mul(x, 1.0, out=y),
        "rmsnorm_pdl_first": (lambda: rms(x, y)) if rms else None,
        "plain_then_rmsnorm_pdl": (lambda: (torch.mul(x, 1.0, out=y), rms(y, x))) if rms else None,
        "ours_pdl_after_plain": lambda: (torch.mul(x, 1.0, out=y), sk.dsv3_router_gemm(y, w, torch.float32,
                                                                                       output=logits)),
    }
    s = torch.cuda.Stream()
    for name, fn in scenarios.items():
        if fn is None:
            continue
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=s):
                fn()
                out[name] = probe(s)
                t0 = time.perf_counter()
                for _ in range(200):
                    probe(s)
                out[name]["probe_us"] = (time.perf_counter() - t0) / 200 * 1e6
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": repr(exc)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
