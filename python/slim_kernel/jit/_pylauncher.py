"""The fallback launcher: the same Kernel interface as ``slim_kernel._native``, through cuda-python.

Used when the native module is absent (pure wheel) or ``SLIM_KERNEL_LAUNCHER=python``. Arguments
are packed by the signature with one ``struct.pack_into`` into a parameter block whose address
goes to ``cuLaunchKernelEx`` (no per-argument cuda-python marshalling). The block holds one
8-byte slot per parameter.
"""

from __future__ import annotations

import ctypes
import struct
import threading

DEFAULT_SMEM_LIMIT = 48 * 1024
_SLOT = {"p": "Q", "i": "i4x", "l": "q", "f": "f4x"}


def _driver():
    from cuda.bindings import driver

    return driver


def driver_error() -> str | None:
    """None when cuda-python and libcuda are usable, else why not (does not initialize CUDA)."""
    try:
        _driver()
    except ImportError as exc:
        return f"cuda-python is not installed ({exc}); pip install cuda-bindings"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"cannot load the CUDA driver (libcuda.so.1): {exc}"
    return None


def driver_version() -> int:
    """cuDriverGetVersion() (initializes nothing); 0 where these bindings predate the launch carveout
    attribute (cuda-python < 12.6), so no launch is given one."""
    cu = _driver()
    if not hasattr(cu.CUlaunchAttributeID, "CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT"):
        return 0
    return _check(cu, cu.cuDriverGetVersion(), "cuDriverGetVersion")


def _name(cu, err) -> str:
    try:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        return f"{name.decode()} ({text.decode()})"
    except Exception:  # noqa: BLE001
        return str(err)


def _check(cu, result, what: str):
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"slim_kernel: {what} failed: {_name(cu, err)}")
    return result[1] if len(result) == 2 else result[1:] or None


def _dim3(value, what: str) -> tuple[int, int, int]:
    if isinstance(value, int):
        value = (value,)
    try:
        dims = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{what} must be a tuple of 1 to 3 positive ints, got {value!r}") from None
    if not 1 <= len(dims) <= 3 or any(d <= 0 or d > 0xFFFFFFFF for d in dims):
        raise ValueError(f"{what} must be a tuple of 1 to 3 positive ints, got {value!r}")
    return dims + (1,) * (3 - len(dims))


class _ContextScope:
    """Make ``ctx`` current for the scope when it is not already (torch normally did)."""

    def __init__(self, cu, ctx):
        self.cu, self.ctx, self.pushed = cu, ctx, False

    def __enter__(self):
        cu = self.cu
        _, cur = cu.cuCtxGetCurrent()
        if int(cur) != int(self.ctx):
            _check(cu, cu.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
            self.pushed = True

    def __exit__(self, *exc):
        if self.pushed:
            self.cu.cuCtxPopCurrent()


class _RelaxedCapture:
    """Relaxed stream-capture mode for this thread within the scope: module loads and function
    attributes are "potentially unsafe" during a global-mode capture (torch.cuda.graph's default)
    but are not stream work, so a first load inside a capture is allowed."""

    def __init__(self, cu):
        self.cu, self.previous = cu, None

    def __enter__(self):
        cu = self.cu
        err, previous = cu.cuThreadExchangeStreamCaptureMode(cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        if err == cu.CUresult.CUDA_SUCCESS:
            self.previous = previous

    def __exit__(self, *exc):
        if self.previous is not None:
            self.cu.cuThreadExchangeStreamCaptureMode(self.previous)


def layout(signature: str) -> tuple[str, tuple[int, ...], int]:
    """``(struct format, offset of each parameter, block size)`` of the parameter block: an
    8-byte slot per parameter."""
    return "<" + "".join(_SLOT[code] for code in signature), tuple(range(0, 8 * len(signature), 8)), 8 * len(signature)


def pack_args(signature: str, args: tuple) -> bytes:
    """The parameter block of :func:`layout` (same bytes as ``_native.pack_args``)."""
    if not isinstance(args, tuple):
        raise TypeError("args must be a tuple")
    if len(args) != len(signature):
        raise TypeError(f"kernel takes {len(signature)} arguments (signature '{signature}'), got {len(args)}")
    for i, (code, value) in enumerate(zip(signature, args)):
        if code == "p" and not isinstance(value, int):
            raise TypeError(f"kernel argument {i} (signature 'p') must be an int device pointer (tensor.data_ptr())")
        try:
            struct.pack("<" + _SLOT[code], value)
        except struct.error as exc:
            raise TypeError(f"kernel argument {i} (signature '{code}') is invalid: {exc}") from None
    return struct.pack(layout(signature)[0], *args)


def check_signature(signature: str) -> None:
    if set(signature) - set(_SLOT):
        raise ValueError(f"signature {signature} has a code outside 'pilf'")


def _init(cu) -> None:
    try:
        init = cu.cuInit(0)
    except Exception as exc:  # noqa: BLE001 - cuda-python raises its own types when libcuda is missing
        raise RuntimeError(f"slim_kernel: cannot initialize the CUDA driver: {type(exc).__name__}: {exc}") from exc
    _check(cu, init, "cuInit")


class Kernel:
    """One function of one cubin, loaded into device ``device``'s primary context."""

    def __init__(self, cubin: bytes, entry: str, signature: str, device: int):
        check_signature(signature)
        cu = _driver()
        self._cu = cu
        self.entry, self.signature, self.device = entry, signature, device
        _init(cu)
        with _RelaxedCapture(cu):
            dev = _check(cu, cu.cuDeviceGet(device), "cuDeviceGet")
            self._ctx = _check(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            self._ctx_int = int(self._ctx)
            with _ContextScope(cu, self._ctx):
                self._module = _check(cu, cu.cuModuleLoadData(cubin), f"cuModuleLoadData for {entry}")
                self._func = _check(cu, cu.cuModuleGetFunction(self._module, entry.encode()),
                                    f"cuModuleGetFunction({entry})")
        self._smem_limit = 0
        self._non_portable = False
        fmt, self._offsets, self._size = layout(signature)
        self._fmt = struct.Struct(fmt)
        self._configs: dict = {}  # (grid, block, stream, smem, pdl, cluster) -> CUlaunchConfig
        self._local = threading.local()  # per-thread parameter block (the driver copies it at launch)

    @property
    def smem_limit(self) -> int:
        return max(self._smem_limit, DEFAULT_SMEM_LIMIT)

    def attribute(self, attr: int) -> int:
        cu = self._cu
        with _ContextScope(cu, self._ctx):
            return _check(cu, cu.cuFuncGetAttribute(cu.CUfunction_attribute(attr), self._func), "cuFuncGetAttribute")

    def set_attribute(self, attr: int, value: int) -> None:
        cu = self._cu
        with _ContextScope(cu, self._ctx), _RelaxedCapture(cu):
            _check(cu, cu.cuFuncSetAttribute(self._func, cu.CUfunction_attribute(attr), value),
                   f"cuFuncSetAttribute({attr}={value}) for {self.entry}")

    def _params(self):
        """This thread's ``(storage, address of the pointer array)``."""
        local = self._local
        try:
            return local.storage, local.address
        except AttributeError:
            local.storage = storage = ctypes.create_string_buffer(max(self._size, 8))
            base = ctypes.addressof(storage)
            local.params = (ctypes.c_void_p * max(len(self._offsets), 1))(*[base + o for o in self._offsets])
            local.address = ctypes.addressof(local.params)
            return storage, local.address

    def _config(self, key, grid, block, stream, smem, pdl, cluster, carveout):
        """Build (and cache) the launch config; raise the function's limits the first time needed."""
        cu = self._cu
        g, b = _dim3(grid, "grid"), _dim3(block, "block")
        c = _dim3(cluster, "cluster") if cluster is not None else (1, 1, 1)
        if not isinstance(smem, int) or smem < 0:
            raise TypeError(f"smem must be a non-negative int, got {smem!r}")
        if carveout is not None:
            if type(carveout) is not int:
                raise TypeError(f"carveout must be an int percent from 0 to 100 or None, got {carveout!r}")
            if not 0 <= carveout <= 100:
                raise ValueError(f"carveout must be an int percent from 0 to 100 or None, got {carveout!r}")
        with _ContextScope(cu, self._ctx), _RelaxedCapture(cu):
            if smem > DEFAULT_SMEM_LIMIT and smem > self._smem_limit:  # once per new high-water mark
                _check(cu, cu.cuFuncSetAttribute(
                    self._func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                    f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={smem}) for {self.entry}")
                self._smem_limit = smem
            if c[0] * c[1] * c[2] > 8 and not self._non_portable:
                _check(cu, cu.cuFuncSetAttribute(
                    self._func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                    "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")
                self._non_portable = True
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
        cfg.sharedMemBytes = smem
        cfg.hStream = cu.CUstream(stream)
        attrs = []
        if pdl:
            a = cu.CUlaunchAttribute()
            a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            a.value.programmaticStreamSerializationAllowed = 1
            attrs.append(a)
        if cluster is not None:
            a = cu.CUlaunchAttribute()
            a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = c
            attrs.append(a)
        if carveout is not None:  # this launch's preferred carveout, over the function's (CUDA >= 12.6 drivers)
            a = cu.CUlaunchAttribute()
            a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
            a.value.sharedMemCarveout = carveout
            attrs.append(a)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        if key is not None:
            if len(self._configs) >= 256:
                self._configs.clear()
            self._configs[key] = cfg
        return cfg, g, b

    def launch(self, grid, block, args, *, stream: int, smem: int = 0, pdl: bool = False, cluster=None,
               carveout: int | None = None) -> None:
        cu = self._cu
        key = (grid, block, stream, smem, pdl, cluster, carveout)
        try:
            cfg = self._configs[key]
        except KeyError:
            cfg = self._config(key, grid, block, stream, smem, pdl, cluster, carveout)[0]
        except TypeError:  # unhashable (lists): build without caching
            cfg = self._config(None, grid, block, stream, smem, pdl, cluster, carveout)[0]
        storage, params = self._params()
        try:
            if type(args) is not tuple:
                raise TypeError
            self._fmt.pack_into(storage, 0, *args)
        except (struct.error, TypeError):
            pack_args(self.signature, args)  # raises the error naming the argument
            raise
        _, cur = cu.cuCtxGetCurrent()
        if int(cur) == self._ctx_int:
            (err,) = cu.cuLaunchKernelEx(cfg, self._func, params, 0)
        else:
            with _ContextScope(cu, self._ctx):
                (err,) = cu.cuLaunchKernelEx(cfg, self._func, params, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"slim_kernel: launch of {self.entry} (grid={tuple(grid) if not isinstance(grid, int) else grid}, "
                               f"block={tuple(block) if not isinstance(block, int) else block}, smem={smem}"
                               f"{', pdl' if pdl else ''}{', cluster' if cluster is not None else ''}"
                               f"{'' if carveout is None else f', carveout={carveout}'}) failed: "
                               f"{_name(cu, err)}")
