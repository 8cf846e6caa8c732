"""The names of the retired sgl-kernel AOT ops: the one list every layer reads.

Torch-free and import-free, so the audit, nox, CMake (through the AOT manifest) and the op
modules all take the names from here.
"""

from __future__ import annotations

ROUTER = "dsv3_router_gemm"
FUSED_A = "dsv3_fused_a_gemm"
BMM_FP8 = "bmm_fp8"

# The public ops, in the order `slim-kernel info` lists them.
OPS = (BMM_FP8, ROUTER, FUSED_A)
# What `slim-kernel audit` flags by default: the ops above and any other DeepSeek-V3 AOT op.
RETIRED_PATTERNS = (*OPS, "dsv3_*")

# The flashinfer backend's fused-A variants: a flashinfer 0.7.4 sm_90a tinygemm program pinned by
# its tile, for where the program flashinfer's own window table picks is slower (7168 -> 2112:
# it picks PACKED_U4_IL at M 9-12, where s8il is faster, and PACKED_S8_IL at M 17-31, where cn16
# is). flashinfer has no public way to choose one:
# the backend launches it through flashinfer's registered op, and a release without that program
# serves the public call.
FLASHINFER_FUSED_A_PROGRAMS = {"s8il": "PACKED_S8_IL", "cn16": "ACCUMULATORS_CN16"}
# fused-A candidate ``flashinfer:pdl``: flashinfer's own call launched with PDL after a plain producer (the knob
# permitting). The kernel waits on the grid dependency before it reads the activation, so this is correct after any
# producer; what it buys is the launch overlapping the producer's tail, which the decode-step runs measure per point.
FLASHINFER_PDL_VARIANT = "pdl"

# flashinfer's fixed-shape router GEMMs (M 1..16; SM 9.0-10.x): (E, K, out dtype), named
# mm_M1_16_K{K}_N{E}[_bf16] (the fp32-out name has no suffix; K7168_N128 is bf16-out only and
# keeps the plain name). The same set in 0.7.2 - 0.7.4.
FLASHINFER_ROUTERS = {
    (128, 7168, "bfloat16"), (256, 7168, "float32"), (256, 7168, "bfloat16"), (256, 6144, "float32"),
    (384, 7168, "float32"), (384, 7168, "bfloat16"), (896, 7168, "float32"), (896, 7168, "bfloat16"),
}


def flashinfer_router_name(e: int, k: int, out) -> str:
    out = str(out).removeprefix("torch.")
    bf16_suffix = out == "bfloat16" and (e, k) != (128, 7168)
    return f"mm_M1_16_K{k}_N{e}" + ("_bf16" if bf16_suffix else "")
