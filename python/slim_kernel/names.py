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
