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
