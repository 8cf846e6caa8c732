"""`slim-kernel tune` end to end on the GPU (``-m gpu``): the table it writes is what selection uses in a
fresh process, an interrupted or failed run leaves the previous table in force, and a table of
another device is not used."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0), reason="needs a CUDA GPU, SM >= 9.0")]

SHAPE = "144,5120,float32"  # no model names it: before the tune, an estimate decides

PICK = r"""
import json, sys, torch
import slim_kernel.ops
from slim_kernel import registry
m = int(sys.argv[1])
x = torch.randn(m, 5120, device="cuda").bfloat16(); w = torch.randn(144, 5120, device="cuda").bfloat16()
out = torch.empty(m, 144, device="cuda")
sel = registry.select("dsv3_router_gemm", x.device, (out, x, w), pdl=False)
dec = registry.decision("dsv3_router_gemm", x.device, (out, x, w), False)
best = dec.point.best(sel.spec.backend.value)
print(json.dumps({"source": dec.source, "backend": sel.spec.backend.value, "variant": best[0], "us": best[1],
                  "table": dict(dec.point.us)}))
"""


def _env(cache):
    return {**os.environ, "SLIM_KERNEL_CACHE_DIR": str(cache)}


def _tune(cache, *args, **kw):
    return subprocess.Popen([sys.executable, "-m", "slim_kernel", "tune", "--router", SHAPE, *args], env=_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _pick(cache, m):
    proc = subprocess.run([sys.executable, "-c", PICK, str(m)], env=_env(cache), capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tuned_table_is_used_by_a_fresh_process_and_survives_failed_runs(tmp_path):
    assert _pick(tmp_path, 4)["source"] == "estimate"
    proc = _tune(tmp_path, "--ms", "1,4")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    tables = list((tmp_path / "routing").glob("*.json"))
    assert len(tables) == 1
    data = json.loads(tables[0].read_text())
    assert data["schema"] == 2 and len(data["measurements"]) == 1
    group = data["measurements"][0]
    assert group["device"] == torch.cuda.get_device_name()
    assert group["sms"] == torch.cuda.get_device_properties(0).multi_processor_count
    for m in (1, 4):
        pick = _pick(tmp_path, m)
        entry = next(e for e in group["entries"] if e["m"] == m and not e["pdl"])
        # configurations that launch one kernel at this call were timed once and share its time
        fastest = {name for name, us in entry["us"].items() if us == min(entry["us"].values())}
        picked = f"{pick['backend']}:{pick['variant']}" if pick["variant"] else pick["backend"]
        assert pick["source"] == "tuned" and picked in fastest, (picked, fastest)  # what it measured fastest
    before = tables[0].read_bytes()
    # interrupted: killed while measuring another M; failed: a device that does not exist
    proc = _tune(tmp_path, "--ms", "1-16", start_new_session=True)
    time.sleep(8)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    failed = _tune(tmp_path, "--ms", "2", "--device", f"cuda:{torch.cuda.device_count()}")
    assert failed.wait(timeout=300) == 2
    assert tables[0].read_bytes() == before and _pick(tmp_path, 4)["source"] == "tuned"
    assert not list((tmp_path / "routing").glob(".tune-*"))


def test_a_table_of_another_device_is_not_used(tmp_path):
    from slim_kernel import devices, routing

    rdev = devices.routing_device(torch.device("cuda", 0))
    path = routing.tuned_path(rdev, routing.installed_versions(), tmp_path)
    path.parent.mkdir(parents=True)
    entry = {"op": "dsv3_router_gemm", "shape": {"e": 144, "k": 5120, "out": "float32"}, "m": 4, "pdl": False,
             "us": {"torch": 1.0}}
    path.write_text(json.dumps({"schema": routing.SCHEMA, "measurements": [
        {"arch": rdev.arch, "device": "NVIDIA H20", "sms": 78, "versions": dict(routing.installed_versions()),
         "entries": [entry]}]}))
    pick = _pick(tmp_path, 4)
    assert pick["source"] != "tuned"
