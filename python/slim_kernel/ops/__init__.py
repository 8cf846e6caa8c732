"""The public ops. Each module holds one op's validation, custom op, fake and backend specs."""

from ..names import OPS
from .bmm_fp8 import bmm_fp8
from .dsv3_fused_a_gemm import dsv3_fused_a_gemm
from .dsv3_router_gemm import dsv3_router_gemm

__all__ = ["OPS", "bmm_fp8", "dsv3_fused_a_gemm", "dsv3_router_gemm"]
