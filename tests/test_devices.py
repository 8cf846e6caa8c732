"""The device-index rules of slim_kernel/devices.py without a GPU: index resolution, the device guard, and
the PDL decision reading the tensors' device (``fake_devices`` in conftest.py stands in for CUDA)."""

from __future__ import annotations

import pytest
import torch

from slim_kernel import devices
from slim_kernel import pdl as _pdl


@pytest.mark.parametrize("device, expected", [(None, 3), (1, 1), ("cuda:2", 2), ("cuda", 3),
                                              (torch.device("cuda", 0), 0), (torch.device("cuda"), 3)])
def test_index_resolves_the_current_device_only_when_none_is_named(fake_devices, device, expected):
    fake_devices["cur"] = 3
    assert devices.index(device) == expected


@pytest.mark.parametrize("device, error, match", [("cpu", ValueError, "must be a CUDA device, got cpu"),
                                                  (-1, ValueError, "non-negative CUDA index, got -1"),
                                                  (1.5, TypeError, "got float"), (True, TypeError, "got bool"),
                                                  ("gpu", ValueError, "like 'cuda:1', got 'gpu'")])
def test_index_names_the_bad_argument(fake_devices, device, error, match):
    with pytest.raises(error, match=match):
        devices.index(device)


@pytest.mark.parametrize("device, expected", [(None, None), (torch.device("cpu"), None), (torch.device("meta"), None),
                                              (torch.device("cuda", 0), None), (torch.device("cuda", 1), 1), (0, None),
                                              (2, 2), (torch.device("cuda"), None)])
def test_other_is_set_only_for_another_cuda_device(fake_devices, device, expected):
    assert devices.other(device) == expected


def _recorder(state, log):
    return lambda *args: log.append((state["cur"], args))


def test_on_device_per_call_follows_the_first_argument(fake_devices):
    log = []
    run = devices.on_device(_recorder(fake_devices, log))
    on_1 = type("T", (), {"get_device": lambda self: 1})()
    cpu = torch.zeros(1)
    run(on_1, "x")
    run(cpu, "y")
    fake_devices["cur"] = 1
    run(on_1, "z")
    assert [(cur, args[1]) for cur, args in log] == [(1, "x"), (0, "y"), (1, "z")]
    assert fake_devices["switches"] == [1] and fake_devices["cur"] == 1  # one switch, and restored after it


def test_on_device_fixed_switches_only_when_needed(fake_devices):
    log = []
    fn = _recorder(fake_devices, log)
    assert devices.on_device(fn, torch.device("cpu")) is fn
    run = devices.on_device(fn, torch.device("cuda", 1))
    run("a")
    fake_devices["cur"] = 1
    run("b")
    assert log == [(1, ("a",)), (1, ("b",))] and fake_devices["switches"] == [1]


@pytest.mark.parametrize("aware", [False, True])
def test_launch_pdl_reads_the_capture_of_the_tensors_device(fake_devices, monkeypatch, pdl_auto, aware):
    """cuda:1 capturing while cuda:0 is current: a launch for cuda:1 asks cuda:1's stream; one for cuda:0 is eager."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: fake_devices["cur"] == 1)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: type("S", (), {"cuda_stream": 100 + fake_devices["cur"]})())
    asked = []
    monkeypatch.setattr(_pdl, "follows_pdl_launch", lambda stream: asked.append(stream) or aware)
    assert _pdl.launch_pdl(device=torch.device("cuda", 1)) is aware
    assert asked == [101] and fake_devices["cur"] == 0
    assert _pdl.launch_pdl(device=torch.device("cuda", 0)) is True and asked == [101]
    assert _pdl.launch_pdl(stream=7, device=1) is aware and asked == [101, 7]
