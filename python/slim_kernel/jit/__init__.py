"""JIT runtime: kernel sources -> cubin (NVRTC or nvcc) -> cache -> launcher."""


def runtime_info() -> dict:
    return {}
