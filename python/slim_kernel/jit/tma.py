"""TMA tensor maps: ``tensor_map(...)`` -> :class:`TensorMap`, a kernel argument of signature code ``t``.

The map is encoded on the host by ``cuTensorMapEncodeTiled`` (through the launcher in use: the
native module or the cuda-python fallback) and passed by value; the kernel declares it as
``const __grid_constant__ TmaDesc m`` with ``struct __align__(64) TmaDesc { unsigned long long v[16]; };``
and hands ``&m`` to ``cp.async.bulk.tensor``. Every argument is checked here, so a mistake is a
ValueError naming the argument instead of the driver's bare CUDA_ERROR_INVALID_VALUE.
"""

from __future__ import annotations

import operator

from . import _pylauncher, runtime
from .spec import TENSOR_MAP_BYTES

# name -> (CUtensorMapDataType, element bytes). TMA moves bytes: fp8 (e4m3 / e5m2) tensors are u8.
DTYPES = {"u8": (0, 1), "u16": (1, 2), "u32": (2, 4), "i32": (3, 4), "u64": (4, 8), "i64": (5, 8),
          "f16": (6, 2), "f32": (7, 4), "f64": (8, 8), "bf16": (9, 2)}
SWIZZLES = {"none": 0, "32B": 1, "64B": 2, "128B": 3}  # CUtensorMapSwizzle
SWIZZLE_SPAN = {"32B": 32, "64B": 64, "128B": 128}
L2_PROMOTIONS = {"none": 0, "64B": 1, "128B": 2, "256B": 3}  # CUtensorMapL2promotion
OOB_FILLS = {"zero": 0, "nan": 1}  # CUtensorMapFloatOOBfill: NONE (zeros), NAN_REQUEST_ZERO_FMA
FLOAT_DTYPES = ("f16", "f32", "f64", "bf16")
MAX_RANK = 5


class TensorMap(bytes):
    """One encoded CUtensorMap: the 128 bytes the driver wrote, plus what they describe.

    A ``bytes`` subclass, so the launchers copy it into the kernel parameter as is (a ``t``
    argument is any ``bytes`` of exactly 128). It holds the raw address ``ptr``: keep the tensor
    alive, and do not move it, while kernels use the map. Immutable.
    """

    def __new__(cls, data: bytes, *, ptr: int, dtype: str, dims: tuple[int, ...], strides_bytes: tuple[int, ...],
                box: tuple[int, ...], swizzle: str, l2_promotion: str, oob: str):
        if not isinstance(data, bytes) or len(data) != TENSOR_MAP_BYTES:
            raise ValueError(f"a tensor map is {TENSOR_MAP_BYTES} bytes, got {type(data).__name__} {data!r:.40}")
        self = super().__new__(cls, data)
        self.__dict__.update(ptr=ptr, dtype=dtype, dims=dims, strides_bytes=strides_bytes, box=box,
                             swizzle=swizzle, l2_promotion=l2_promotion, oob=oob)
        return self

    def __setattr__(self, name, value):
        raise AttributeError("TensorMap is immutable")

    def __delattr__(self, name):
        raise AttributeError("TensorMap is immutable")

    def __repr__(self) -> str:
        return (f"TensorMap({self.dtype}, ptr={self.ptr:#x}, dims={self.dims}, strides_bytes={self.strides_bytes}, "
                f"box={self.box}, swizzle={self.swizzle}, l2_promotion={self.l2_promotion}, oob={self.oob})")


def _ints(value, what: str) -> tuple[int, ...]:
    try:
        return tuple(operator.index(v) for v in value)
    except TypeError:
        raise TypeError(f"{what} must be a tuple of ints, got {value!r}") from None


def _choice(value, table: dict, what: str):
    if value not in table:
        raise ValueError(f"{what} must be one of {', '.join(table)}, got {value!r}")
    return table[value]


def check_args(ptr, dims, strides_bytes, box, dtype, swizzle, l2_promotion, oob) -> tuple:
    """The validated arguments of ``cuTensorMapEncodeTiled`` as the launchers take them:
    ``(dtype enum, ptr, dims, strides_bytes, box, swizzle enum, l2 enum, oob enum)``."""
    dtype_enum, elsize = _choice(dtype, DTYPES, "dtype")
    swizzle_enum = _choice(swizzle, SWIZZLES, "swizzle")
    l2_enum = _choice(l2_promotion, L2_PROMOTIONS, "l2_promotion")
    oob_enum = _choice(oob, OOB_FILLS, "oob")
    if oob == "nan" and dtype not in FLOAT_DTYPES:
        raise ValueError(f"oob='nan' needs a floating-point dtype ({', '.join(FLOAT_DTYPES)}), got {dtype!r}")
    if isinstance(ptr, bool):
        raise TypeError("ptr must be an int device address (tensor.data_ptr()), got a bool")
    try:
        ptr = operator.index(ptr)
    except TypeError:
        raise TypeError(f"ptr must be an int device address (tensor.data_ptr()), got {type(ptr).__name__}") from None
    if not 0 < ptr < 1 << 64 or ptr % 16:
        raise ValueError(f"ptr must be a non-null 16-byte aligned device address, got {ptr:#x}")
    dims, strides_bytes, box = _ints(dims, "dims"), _ints(strides_bytes, "strides_bytes"), _ints(box, "box")
    rank = len(dims)
    if not 1 <= rank <= MAX_RANK:
        raise ValueError(f"dims must have 1 to {MAX_RANK} entries (innermost first), got {dims}")
    for i, d in enumerate(dims):
        if not 1 <= d <= 1 << 32:
            raise ValueError(f"dims[{i}] must be in 1..2**32, got {d}")
    if len(strides_bytes) != rank - 1:
        raise ValueError(f"strides_bytes must have {rank - 1} entries (the byte strides of dims 1..{rank - 1}; "
                         f"dim 0 is contiguous), got {strides_bytes}")
    for i, s in enumerate(strides_bytes):
        if not 0 < s < 1 << 40 or s % 16:
            raise ValueError(f"strides_bytes[{i}] (dim {i + 1}) must be a positive multiple of 16 below 2**40, got {s}")
    if strides_bytes and strides_bytes[0] < dims[0] * elsize:
        raise ValueError(f"strides_bytes[0]={strides_bytes[0]} is shorter than one row of dims[0] * {elsize} = "
                         f"{dims[0] * elsize} bytes (strides are in bytes, not elements)")
    if len(box) != rank:
        raise ValueError(f"box must have {rank} entries like dims, got {box}")
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            raise ValueError(f"box[{i}] must be in 1..256, got {b}")
    inner = box[0] * elsize
    if inner % 16:
        raise ValueError(f"box[0] * {elsize} bytes = {inner} must be a multiple of 16")
    if swizzle in SWIZZLE_SPAN and inner > SWIZZLE_SPAN[swizzle]:
        raise ValueError(f"box[0] * {elsize} bytes = {inner} exceeds the {swizzle} swizzle span "
                         f"(box[0] <= {SWIZZLE_SPAN[swizzle] // elsize} for {dtype})")
    return dtype_enum, ptr, dims, strides_bytes, box, swizzle_enum, l2_enum, oob_enum


def tensor_map(ptr: int, dims: tuple[int, ...], strides_bytes: tuple[int, ...], box: tuple[int, ...], *,
               dtype: str = "bf16", swizzle: str = "128B", l2_promotion: str = "256B", oob: str = "zero",
               launcher: str | None = None) -> TensorMap:
    """Encode a tiled TMA tensor map (``cuTensorMapEncodeTiled``) for the tensor at device address ``ptr``.

    ``dims``: the tensor's sizes in elements, innermost (contiguous) first, rank 1 to 5;
    ``strides_bytes``: the byte strides of dims 1..rank-1 (multiples of 16); ``box``: the tile one
    TMA copy moves, per dim (1..256; ``box[0] * element size`` a multiple of 16 and, when
    swizzled, at most the swizzle span). Element strides are 1, no interleave. ``dtype`` one of
    :data:`DTYPES`; ``swizzle`` none|32B|64B|128B; ``l2_promotion`` none|64B|128B|256B; ``oob``
    zero (out-of-bounds elements read as 0) or nan (floating-point dtypes). ``launcher`` picks
    native or python like :func:`slim_kernel.jit.get_kernel`. Needs the driver (initializes it),
    not a context. Each call is a driver call: encode once per tensor, not per launch.

    A row-major bf16 ``[M, K]`` tensor ``w``: ``tensor_map(w.data_ptr(), (K, M), (w.stride(0) * 2,), (64, 128))``.
    """
    args = check_args(ptr, dims, strides_bytes, box, dtype, swizzle, l2_promotion, oob)
    name = runtime.launcher_name(launcher)
    why = runtime.driver_error(name)
    if why is not None:
        raise RuntimeError(f"slim_kernel: cannot encode a tensor map: {why}")
    impl = runtime.native_module()[0] if name == "native" else _pylauncher
    data = impl.encode_tensor_map(*args)
    return TensorMap(data, ptr=args[1], dtype=dtype, dims=args[2], strides_bytes=args[3], box=args[4],
                     swizzle=swizzle, l2_promotion=l2_promotion, oob=oob)
