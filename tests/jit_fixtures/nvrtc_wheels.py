"""The NVRTC wheels the no-spill compile checks install side by side (pyproject.toml's [tool.slim-kernel]
nvrtc-versions: "X.Y" is that release's newest wheel, "newest" the newest release on the index)."""

NEWEST = "newest"


def requirement(version: str) -> str:
    """The pip requirement of the nvidia-cuda-nvrtc wheel that ``version`` names."""
    return "nvidia-cuda-nvrtc" if version == NEWEST else f"nvidia-cuda-nvrtc=={version}.*"
