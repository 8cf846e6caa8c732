import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A fresh seed per test, printed on failure, so each run draws new random inputs."""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
