"""The nvJitLink process of `ltoir`: links one input of LTO IR at a time to PTX.

Run by path (stdlib and `cuda.bindings` only, so it starts without the package on `sys.path`),
with its address-space limit in bytes as its argument, applied before anything else.
Frames on stdin: u8 input (0 a fatbin, 1 raw LTO IR), u16 targets length, u64 input length,
u64 most PTX bytes wanted, then the targets ("sm_90a", or several separated by commas: tried in
turn while nvJitLink answers that the input's arch does not fit) and the input. Frames on
stdout: u8 status, u64 length, then the PTX or a one-line message. The first frame out, before
any request, says whether nvJitLink loads (READY with its version, or UNAVAILABLE with why).
"""

from __future__ import annotations

import struct
import sys

REQUEST = struct.Struct("<BHQQ")
REPLY = struct.Struct("<BQ")
READY, UNAVAILABLE, PTX, FAILED = range(4)
FATBIN_INPUT, LTOIR_INPUT = range(2)
ARCH_ERRORS = ("ARCH_MISMATCH", "UNSUPPORTED_ARCH")  # the next target may fit
OLDEST_SM = 75  # the oldest target nvJitLink 13 links for; older LTO IR (cuFFT's lto_50) links for it


def _reply(out, status: int, data: bytes) -> None:
    out.write(REPLY.pack(status, len(data)) + data)
    out.flush()


def _read(inp, n: int) -> bytes | None:
    data = inp.read(n)
    return data if len(data) == n else None


def _link(nvjitlink, arch: str, kind: int, data: bytes, most: int) -> tuple[int, bytes]:
    handle = nvjitlink.create(4, [f"-arch={arch}", "-lto", "-ptx", "-O0"])
    try:
        input_type = nvjitlink.InputType.FATBIN if kind == FATBIN_INPUT else nvjitlink.InputType.LTOIR
        nvjitlink.add_data(handle, input_type, data, len(data), "entry")
        nvjitlink.complete(handle)
        size = nvjitlink.get_linked_ptx_size(handle)
        if size > most:
            return FAILED, f"its PTX would be {size:,} bytes, over the {most:,}-byte limit".encode()
        ptx = bytearray(size)
        nvjitlink.get_linked_ptx(handle, ptx)
        return PTX, bytes(ptx)
    except nvjitlink.nvJitLinkError as exc:
        log = bytearray(nvjitlink.get_error_log_size(handle))
        nvjitlink.get_error_log(handle, log)
        first = next((line for line in log.decode("utf-8", "replace").splitlines() if line.strip()), "")
        return FAILED, f"{exc}: {first}".strip(": ").encode()
    finally:
        nvjitlink.destroy(handle)


def _arch_for(arch: str) -> str:
    digits = "".join(c for c in arch[3:] if c.isdigit())
    return f"sm_{OLDEST_SM}" if digits and int(digits) < OLDEST_SM else arch


def main() -> None:
    if len(sys.argv) > 1:
        try:
            import resource
        except ImportError:  # not POSIX: the deadline of each entry still bounds it
            pass
        else:
            limit = int(sys.argv[1])
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    try:
        from cuda.bindings import nvjitlink

        version = ".".join(map(str, nvjitlink.version()))
    except Exception as exc:  # not installed, or the library does not load
        _reply(out, UNAVAILABLE, f"{type(exc).__name__}: {exc}".encode())
        return
    _reply(out, READY, version.encode())
    while (head := _read(inp, REQUEST.size)) is not None:
        kind, targets_len, size, most = REQUEST.unpack(head)
        targets, data = _read(inp, targets_len), _read(inp, size)
        if targets is None or data is None:
            return
        for arch in targets.decode().split(","):
            try:
                status, reply = _link(nvjitlink, _arch_for(arch), kind, data, most)
            except Exception as exc:  # anything else nvJitLink raises on this input: reported, not fatal
                status, reply = FAILED, f"{type(exc).__name__}: {exc}".encode()
            if status == PTX or not any(e.encode() in reply for e in ARCH_ERRORS):
                break
        _reply(out, status, reply)


if __name__ == "__main__":
    main()
