"""TMA tensor maps (CPU): argument checks of jit.tensor_map, the TensorMap type, and how the
fallback launcher lays out 't' parameters. The encoder and the launches themselves run against
the fake driver in test_jit_launcher.py; a real TMA copy runs in test_jit_gpu.py."""

from __future__ import annotations

import struct

import pytest

from slim_kernel import jit
from slim_kernel.jit import _pylauncher, tma
from slim_kernel.jit.spec import KernelInstance

GOOD = dict(ptr=0x10000, dims=(64, 20), strides_bytes=(128,), box=(64, 8))


def test_check_args_maps_names_to_driver_enums():
    assert tma.check_args(**GOOD, dtype="bf16", swizzle="128B", l2_promotion="256B", oob="zero") == (
        9, 0x10000, (64, 20), (128,), (64, 8), 3, 3, 0)
    assert tma.check_args(0x20, [16, 4, 2], [64, 256], [16, 4, 1], "f32", "64B", "none", "nan") == (
        7, 0x20, (16, 4, 2), (64, 256), (16, 4, 1), 2, 0, 1)
    assert tma.check_args(0x10, (256,), (), (256,), "u8", "none", "64B", "zero") == (
        0, 0x10, (256,), (), (256,), 0, 1, 0)


@pytest.mark.parametrize("change,error,match", [
    (dict(ptr=0x10008), ValueError, "ptr must be a non-null 16-byte aligned"),
    (dict(ptr=0), ValueError, "ptr must be a non-null"),
    (dict(ptr=1.0), TypeError, "ptr must be an int device address"),
    (dict(ptr=True), TypeError, "ptr must be an int"),
    (dict(dims=(), strides_bytes=(), box=()), ValueError, "dims must have 1 to 5 entries"),
    (dict(dims=(8,) * 6, strides_bytes=(16,) * 5, box=(8,) * 6), ValueError, "dims must have 1 to 5"),
    (dict(dims=(64, 0)), ValueError, r"dims\[1\] must be in 1..2\*\*32"),
    (dict(dims=(64, 2.0)), TypeError, "dims must be a tuple of ints"),
    (dict(strides_bytes=()), ValueError, "strides_bytes must have 1 entries"),
    (dict(strides_bytes=(136,)), ValueError, r"strides_bytes\[0\] \(dim 1\) must be a positive multiple of 16"),
    (dict(strides_bytes=(1 << 40,)), ValueError, "below 2\\*\\*40"),
    (dict(strides_bytes=(64,)), ValueError, "shorter than one row .* not elements"),
    (dict(box=(64,)), ValueError, "box must have 2 entries"),
    (dict(box=(64, 0)), ValueError, r"box\[1\] must be in 1..256"),
    (dict(box=(64, 257)), ValueError, r"box\[1\] must be in 1..256"),
    (dict(box=(4, 8), swizzle="none"), ValueError, "= 8 must be a multiple of 16"),
    (dict(box=(128, 8)), ValueError, r"exceeds the 128B swizzle span \(box\[0\] <= 64 for bf16\)"),
    (dict(box=(32, 8), swizzle="32B"), ValueError, "exceeds the 32B swizzle span"),
    (dict(dtype="fp8"), ValueError, "dtype must be one of u8, .*bf16"),
    (dict(swizzle="128"), ValueError, "swizzle must be one of none, 32B, 64B, 128B"),
    (dict(l2_promotion="32B"), ValueError, "l2_promotion must be one of none, 64B, 128B, 256B"),
    (dict(oob="nan", dtype="i32", box=(32, 8)), ValueError, "oob='nan' needs a floating-point dtype"),
    (dict(oob="inf"), ValueError, "oob must be one of zero, nan"),
])
def test_bad_arguments_name_the_argument(change, error, match):
    with pytest.raises(error, match=match):
        jit.tensor_map(**{**GOOD, **change})  # raised before any driver or launcher is touched


def test_swizzle_span_boundaries_are_allowed():
    for swizzle, cols in (("32B", 16), ("64B", 32), ("128B", 64), ("none", 256)):
        tma.check_args(0x10000, (256, 8), (512,), (cols, 8), "bf16", swizzle, "none", "zero")


def test_tensor_map_type():
    data = bytes(range(128))
    m = tma.TensorMap(data, ptr=0x10000, dtype="bf16", dims=(64, 20), strides_bytes=(128,), box=(64, 8),
                      swizzle="128B", l2_promotion="256B", oob="zero")
    assert isinstance(m, bytes) and m == data and len(m) == 128
    assert m.dims == (64, 20) and m.box == (64, 8) and m.ptr == 0x10000
    assert repr(m).startswith("TensorMap(bf16, ptr=0x10000, dims=(64, 20)")
    with pytest.raises(AttributeError, match="immutable"):
        m.ptr = 0
    with pytest.raises(ValueError, match="128 bytes"):
        tma.TensorMap(data[:64], ptr=0, dtype="bf16", dims=(), strides_bytes=(), box=(), swizzle="none",
                      l2_promotion="none", oob="zero")


def test_layout_aligns_tensor_maps_and_keeps_8_byte_slots():
    assert _pylauncher.layout("pilf") == ("<Qi4xqf4x", (0, 8, 16, 24), 32)
    fmt, offsets, size = _pylauncher.layout("ptitf")
    assert offsets == (0, 128, 256, 384, 512) and size == 520
    assert struct.calcsize(fmt) == size
    assert _pylauncher.layout("tt")[1:] == ((0, 128), 256)


def test_pack_args_places_tensor_map_bytes():
    a, b = bytes(range(128)), bytes(range(255, 127, -1))
    blob = _pylauncher.pack_args("ptitf", (0xDEADBEEF00, a, -3, b, 1.5))
    assert len(blob) == 520
    assert blob[:8] == (0xDEADBEEF00).to_bytes(8, "little") and blob[8:128] == bytes(120)
    assert blob[128:256] == a and blob[384:512] == b
    assert struct.unpack_from("<i", blob, 256)[0] == -3 and struct.unpack_from("<f", blob, 512)[0] == 1.5


@pytest.mark.parametrize("value,got", [
    (bytes(127), "127 bytes"), (bytes(129), "129 bytes"), (bytearray(128), "bytearray"), (0x1000, "int"),
])
def test_pack_args_rejects_what_is_not_a_tensor_map(value, got):
    with pytest.raises(TypeError, match=f"argument 1 \\(signature 't'\\) must be a TensorMap .*got {got}"):
        _pylauncher.pack_args("pt", (1, value))


def test_signature_code_t_and_its_limit():
    assert KernelInstance.make("x.cuh", "k", "tpt").signature == "tpt"
    with pytest.raises(ValueError, match="more than 16 tensor maps"):
        KernelInstance.make("x.cuh", "k", "t" * 17)
    with pytest.raises(ValueError, match="more than 16 tensor maps"):
        _pylauncher.check_signature("t" * 17)
    with pytest.raises(ValueError, match="outside 'pilft'"):
        _pylauncher.check_signature("px")
