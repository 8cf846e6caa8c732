"""The benchmark helpers that need no GPU: profile_gemm's case specs, trim_bundle's wheel rewrite and
pm_series' reading of an ncu PM-sampling raw page."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import pm_series  # noqa: E402
import profile_gemm  # noqa: E402
import trim_bundle  # noqa: E402


def test_profile_cases_parse_and_reject():
    assert profile_gemm.parse_case("fused_a@1,8,16") == ("dsv3_fused_a_gemm", 2112, "bfloat16", [1, 8, 16])
    assert profile_gemm.parse_case("router:384@4,8") == ("dsv3_router_gemm", 384, "float32", [4, 8])
    assert profile_gemm.parse_case("router:256:bfloat16@9-11") == ("dsv3_router_gemm", 256, "bfloat16", [9, 10, 11])
    for bad, match in [("router@1", "expected"), ("fused_a:3@1", "expected"), ("router:x@1", "expected"),
                       ("router:384:half@1", "float32 or bfloat16"), ("bmm@1", "expected")]:
        with pytest.raises(ValueError, match=match):
            profile_gemm.parse_case(bad)


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr("pkg-1.0.dist-info/RECORD", "stale,,\n")


def test_trim_bundle_drops_the_prefix_and_rewrites_a_matching_record(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    members = {"flashinfer/__init__.py": b"x = 1\n", "flashinfer/moe_ep/kernel_src/a.py": b"big" * 1000,
               "flashinfer/moe_ep/api.py": b"y = 2\n", "pkg-1.0.dist-info/METADATA": b"Name: pkg\n"}
    _wheel(src / "flashinfer_python-1.0-py3-none-any.whl", members)
    _wheel(src / "other-1.0-py3-none-any.whl", {"other/__init__.py": b""})
    assert trim_bundle.main([str(src), str(dst), "flashinfer/moe_ep/kernel_src/"]) == 0
    with zipfile.ZipFile(dst / "flashinfer_python-1.0-py3-none-any.whl") as z:
        names = set(z.namelist())
        record = list(csv.reader(io.StringIO(z.read("pkg-1.0.dist-info/RECORD").decode())))
        data = {n: z.read(n) for n in names}
    assert names == set(members) - {"flashinfer/moe_ep/kernel_src/a.py"} | {"pkg-1.0.dist-info/RECORD"}
    listed = {row[0]: row for row in record}
    assert set(listed) == names
    for name in names - {"pkg-1.0.dist-info/RECORD"}:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data[name]).digest()).rstrip(b"=").decode()
        assert listed[name][1:] == [f"sha256={digest}", str(len(data[name]))]
    assert (dst / "other-1.0-py3-none-any.whl").read_bytes() == (src / "other-1.0-py3-none-any.whl").read_bytes()
    assert trim_bundle.main([str(src)]) == 2  # usage


def _pm_page(path: Path, dram: str) -> None:
    head = ["ID", "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg", "Kernel Name",
            *pm_series.SERIES.values(), "gpu__time_duration.sum", "profiler__pmsampler_interval_time"]
    row = ["0", '12  "<default domain>:dsv3_router_gemm M=8 jit:direct_c8:none:none" ', "dsv3_router_gemm_kernel",
           dram, "(0; 1; 2; 3; 4; 5; 6; 7; 8)", "128 (0; 0; 0; 128; 0; 0; 0; 0; 0)", "6.43", "1.50 (1.50)"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerows([head, [""] * len(head), row])


def test_pm_series_cuts_each_kernel_to_its_samples(tmp_path, capsys):
    _pm_page(tmp_path / "pm.csv", "(0; 0; 0; 0.2; 5; 73; 0.4; 0; 0)")
    assert pm_series.main(str(tmp_path / "pm.csv")) == 0
    out = json.loads(capsys.readouterr().out)
    (k,) = out["kernels"]
    assert k["nvtx"] == "dsv3_router_gemm M=8 jit:direct_c8" and k["kernel"] == "dsv3_router_gemm_kernel"
    assert (k["duration_us"], k["interval_us"], k["samples_from"]) == (6.43, 1.5, 2)
    assert k["dram_read_pct"] == [0.0, 0.2, 5.0, 73.0, 0.4, 0.0]  # two samples each side of the busy ones
    assert k["l2_throughput_pct"] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0] and k["ctas_launched"][1] == 128


def test_pm_series_refuses_a_page_without_the_series(tmp_path):
    (tmp_path / "ncu.csv").write_text('"ID","Kernel Name"\n"",""\n"0","k"\n')
    with pytest.raises(ValueError, match="not a PM-sampling raw page"):
        pm_series.main(str(tmp_path / "ncu.csv"))
