"""The nvJitLink process of `ltoir`: links one fatbin of LTO IR at a time to PTX.

Run by path (stdlib and `cuda.bindings` only, so it starts without the package on `sys.path`),
with its address-space limit in bytes as its argument, applied before anything else. Frames on stdin: u16 arch length, u64 fatbin length,
u64 most PTX bytes wanted, then the arch ("sm_90a") and the fatbin. Frames on stdout: u8
status, u64 length, then the PTX or a one-line message. The first frame out, before any
request, says whether nvJitLink loads (READY with its version, or UNAVAILABLE with why).
"""

from __future__ import annotations

import struct
import sys

REQUEST = struct.Struct("<HQQ")
REPLY = struct.Struct("<BQ")
READY, UNAVAILABLE, PTX, FAILED = range(4)
OLDEST_SM = 75  # the oldest target nvJitLink 13 links for; older LTO IR (cuFFT's lto_50) links for it


def _reply(out, status: int, data: bytes) -> None:
    out.write(REPLY.pack(status, len(data)) + data)
    out.flush()


def _read(inp, n: int) -> bytes | None:
    data = inp.read(n)
    return data if len(data) == n else None


def _link(nvjitlink, arch: str, fatbin: bytes, most: int) -> tuple[int, bytes]:
    handle = nvjitlink.create(4, [f"-arch={arch}", "-lto", "-ptx", "-O0"])
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.FATBIN, fatbin, len(fatbin), "entry")
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
        arch_len, size, most = REQUEST.unpack(head)
        arch, fatbin = _read(inp, arch_len), _read(inp, size)
        if arch is None or fatbin is None:
            return
        try:
            status, data = _link(nvjitlink, _arch_for(arch.decode()), fatbin, most)
        except Exception as exc:  # anything else nvJitLink raises on this input: reported, not fatal
            status, data = FAILED, f"{type(exc).__name__}: {exc}".encode()
        _reply(out, status, data)


if __name__ == "__main__":
    main()
