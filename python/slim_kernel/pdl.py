"""PDL per launch: the knob, refined under CUDA-graph capture by the kernel the launch follows.

A launch with the PDL attribute after a producer that never triggers its dependents (a torch
elementwise kernel) buys nothing and cost ~0.2 us per GEMM in the H200 decode-step runs; after a
PDL-aware producer (flashinfer's ``rmsnorm(enable_pdl=True)``) it hides the weight fetch behind the
producer. Under capture the driver shows what the next node will depend on: a kernel that was
itself launched with PDL has a programmatic in-edge (``benchmark/probe_capture.py`` shows it). So in
``auto`` mode (knobs.pdl_auto) a captured launch uses PDL exactly when its one predecessor has
such an edge. A PDL-aware producer that is the first node of its graph has no edge and is not
recognised (the launch then goes without PDL: correct, 0.5-1 us slower). Eager launches keep the
knob (no capture info; one stream-capture check per call).

The answer is part of the PDL-sensitive ops' plan key (ops/_dispatch.py): the routing table has
points for both contexts (``pdl: true`` measured after the PDL-aware producer with PDL launches,
``pdl: false`` after a plain producer without), the registry looks up the one in force, and the
JIT backend binds it into the launch.
"""

from __future__ import annotations

import torch

from . import devices, knobs

_PROGRAMMATIC = 1  # CUgraphDependencyType CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC


def follows_pdl_launch(stream: int) -> bool | None:
    """Under capture: whether the one kernel the next launch on ``stream`` depends on was launched
    with PDL. None when the driver cannot say (not capturing, no cuda-bindings, a driver error)."""
    try:
        from cuda.bindings import driver as cu

        # cuda-bindings 12.x names the edge-aware calls _v3 / _v2; 13.x gives the plain names those
        get_info = getattr(cu, "cuStreamGetCaptureInfo_v3", cu.cuStreamGetCaptureInfo)
        get_deps = getattr(cu, "cuGraphNodeGetDependencies_v2", cu.cuGraphNodeGetDependencies)
        err, status, _id, _graph, deps, _edges, n = get_info(stream)
        if err != cu.CUresult.CUDA_SUCCESS or status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            return None
        if n != 1:
            return False  # the graph's first node or a join: nothing to overlap with
        node = list(deps)[0]
        err, kind = cu.cuGraphNodeGetType(node)
        if err != cu.CUresult.CUDA_SUCCESS or kind != cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
            return False
        count = get_deps(node)[-1]
        if not count:
            return False
        edges = get_deps(node, count)[2]
        return any(int(e.type) == _PROGRAMMATIC for e in list(edges)[:count])
    except Exception:  # noqa: BLE001 - an unknown driver/binding: keep the knob's choice
        return None


def launch_pdl(stream: int | None = None, device: int | torch.device | None = None) -> bool:
    """Whether this launch uses PDL. ``device``: the tensors' device (default the current one);
    ``stream``: the raw handle the launch goes to (default that device's current stream). Under
    auto, the capture state is that stream's, not the current device's (slim_kernel/devices.py)."""
    if not knobs.pdl():
        return False
    if not knobs.pdl_auto():
        return True
    index = devices.other(device)
    if index is None:
        return _captured_pdl(stream)
    with torch.cuda.device(index):
        return _captured_pdl(stream)


def _captured_pdl(stream: int | None) -> bool:
    """Auto mode on the current device: the knob (True) unless its current stream is capturing."""
    if not torch.cuda.is_current_stream_capturing():
        return True
    if stream is None:
        stream = torch.cuda.current_stream().cuda_stream
    aware = follows_pdl_launch(stream)
    return True if aware is None else aware
