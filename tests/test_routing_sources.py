"""The routing sources without a GPU: tuned tables (written, merged, refused; v1 tables still read), the shipped
table, the estimate's place among them, and the tools that compare tables."""

from __future__ import annotations

import functools
import json
import sys
import warnings
from pathlib import Path

import pytest
from _tables import H200, V074, entry, header, table_file, v1_file

from slim_kernel import models, routing, tune
from slim_kernel.names import FUSED_A, ROUTER


@pytest.fixture
def tuned_cache(tmp_path, monkeypatch):
    """An empty cache directory, routing as if flashinfer 0.7.4 were installed."""
    monkeypatch.setenv("SLIM_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(routing, "installed_versions", functools.cache(lambda: V074))
    routing.reload()
    yield tmp_path
    routing.reload()


def test_tuned_table_is_written_atomically_merged_and_preferred(tuned_cache):
    path = routing.tuned_path(H200, V074)
    assert path.parent == tuned_cache / routing.TUNED_DIR and "nvidia-h200-132sm" in path.name
    tune.write_table(path, header(), [entry(1), entry(2)])
    tune.write_table(path, header(), [entry(2, us={"jit:ring_c8": 2.0}), entry(1, shape={"n": 1536, "k": 5120},
                                                                                 op=FUSED_A)])
    data = json.loads(path.read_text())
    assert data["schema"] == 2 and len(data["measurements"][0]["entries"]) == 3 and not list(path.parent.glob(".tune-*"))  # merged, no temp file left
    routing.reload()
    dec = routing.lookup(ROUTER, {"e": 144, "k": 5120, "out": "float32"}, 2, False, H200)
    assert dec.source == "tuned" and dec.point.best("jit") == ("ring_c8", 2.0)
    # past the M it measured the tuned table says nothing: the shipped table or the estimate does
    assert routing.lookup(ROUTER, {"e": 144, "k": 5120, "out": "float32"}, 5, False, H200).source == "estimate"


@pytest.mark.parametrize("corrupt", [
    lambda d: d.update(schema=7),
    lambda d: d["measurements"][0]["entries"][0].update(m="1"),
    lambda d: d["measurements"][0]["entries"][0].update(m=500),
    lambda d: d["measurements"][0]["entries"][0]["us"].update({"torch": -1.0}),
    lambda d: d["measurements"][0]["entries"][0]["us"].update({"torch": float("inf")}),
    lambda d: d["measurements"][0]["entries"][0]["us"].update({"torch": 1e9}),
    lambda d: d["measurements"][0]["entries"][0].update(shape=[1, 2]),
    lambda d: d["measurements"][0]["entries"].append("x"),
    lambda d: d["measurements"][0].update(device="NVIDIA H100"),  # measured on another device
    lambda d: d["measurements"][0].update(versions={"flashinfer": "0.7.2.post1"}),  # under another flashinfer
    lambda d: d["measurements"].append(dict(d["measurements"][0], sms=78)),  # two devices' measurements
], ids=["schema", "m-type", "m-range", "negative", "inf", "absurd", "shape-type", "entry-type", "device", "version",
        "two-devices"])
def test_a_bad_tuned_table_is_refused_with_a_warning_never_a_crash(tuned_cache, corrupt):
    path = routing.tuned_path(H200, V074)
    tune.write_table(path, header(), [entry(1)])
    data = json.loads(path.read_text())
    corrupt(data)
    path.write_text(json.dumps(data))
    routing.reload()
    with pytest.warns(RuntimeWarning, match="ignoring the tuned routing table"):
        assert routing.tuned_table(H200, V074) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dec = routing.lookup(ROUTER, {"e": 144, "k": 5120, "out": "float32"}, 1, False, H200)
    assert dec is None or dec.source != "tuned"


def test_truncated_or_non_json_tuned_table_is_refused(tuned_cache):
    path = routing.tuned_path(H200, V074)
    path.parent.mkdir(parents=True)
    for text in ("{", "[]", "\\x00\\x01", '{"schema": 1}', '{"schema": 2}'):
        path.write_text(text)
        routing.reload()
        with pytest.warns(RuntimeWarning):
            assert routing.tuned_table(H200, V074) is None


def test_write_table_refuses_what_selection_would_refuse(tuned_cache):
    path = routing.tuned_path(H200, V074)
    tune.write_table(path, header(), [entry(1)])
    before = path.read_text()
    with pytest.raises(ValueError):
        tune.write_table(path, header(), [entry(1, us={"torch": float("nan")})])
    assert path.read_text() == before  # the previous table stays in force


def test_unmeasured_shapes_are_estimated_from_every_measured_shape_and_say_so(tuned_cache):
    shipped = routing.table("sm_90")
    shape = {"e": 144, "k": 5120, "out": "float32"}
    assert shipped.lookup(ROUTER, shape, 4, V074, False) is None  # no table has it: never another shape's point
    dec = routing.lookup(ROUTER, shape, 4, False, H200)
    assert dec.source == "estimate" and dec.estimated and "slim-kernel tune" in dec.match
    assert all(c.partition(":")[0] in ("jit", "flashinfer", "torch") for c, _ in dec.point.us)
    # another GPU of the same SM count: the nearest measured GPU's point, flagged as an estimate
    h200_nvl = routing.Device("NVIDIA H200 NVL", 132, "sm_90", 4800)
    dec = routing.lookup(ROUTER, {"e": 256, "k": 7168, "out": "float32"}, 4, False, h200_nvl)
    assert dec.source == "shipped" and dec.estimated and "measured on NVIDIA H200," in dec.match
    # another SM count (an H20's 78): re-derived for that grid, not the H200's numbers
    h20 = routing.Device("NVIDIA H20", 78, "sm_90")
    assert routing.lookup(ROUTER, {"e": 256, "k": 7168, "out": "float32"}, 4, False, h20).source == "estimate"


def test_info_json_explains_every_estimate(monkeypatch):
    import torch

    import slim_kernel.ops  # noqa: F401
    from slim_kernel import devices, info, registry

    monkeypatch.setattr(registry, "arch", lambda device: "sm_90")
    monkeypatch.setattr(registry, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(devices, "routing_device", lambda device: routing.Device("NVIDIA H20", 78, "sm_90"))
    rows = info._picks(torch.device("cuda", 0))
    shapes = {(r["op"], json.dumps(r["shape"], sort_keys=True)) for r in rows}
    assert shapes >= {(s.op, json.dumps(s.key(), sort_keys=True)) for s in models.all_shapes()}
    for r in rows:  # another SM count: every pick is an estimate, explained, with the tune command
        assert r["source"] in ("estimate", "priority") and r["estimate"] == (r["source"] == "estimate")
        assert r["why"] and r["tune"].startswith("slim-kernel tune --")


def test_tune_reports_how_its_picks_compare_with_the_shipped_table():
    """The shipped table's own entries agree with it everywhere; one point where another candidate is now
    faster reports what the shipped pick costs there; shapes the shipped table lacks are not counted."""
    shipped = json.loads((Path(routing.__file__).parent / "tables" / "routing_sm90.json").read_text())
    entries = [dict(e, us=dict(e["us"])) for e in routing.flat_entries(shipped)[:40]]
    assert tune.against_shipped(entries, "sm_90").startswith("the same pick as the shipped table (NVIDIA H200) at 40 of 40")
    slowest = max(entries[3]["us"], key=entries[3]["us"].get)
    entries[3]["us"][slowest] = min(entries[3]["us"].values()) / 1.25
    report = tune.against_shipped(entries + [entry(versions=V074)], "sm_90")
    assert "at 39 of 40 points; its pick at most 1.25x this one's (1 points over 1.02x)" in report
    assert tune.against_shipped([entry(versions=V074)], "sm_90") is None and tune.against_shipped(entries, "sm_75") is None
    # a tune on the H100 compares with the H100's group, the one selection read there before it
    h100 = routing.tables("sm_90")[1]
    own = [{"op": p.op, "shape": dict(p.shape), "m": p.m, "pdl": p.pdl, "us": dict(p.us), "versions": p.versions}
           for p in h100.points[:40]]
    assert tune.against_shipped(own, "sm_90", H100).startswith(
        "the same pick as the shipped table (NVIDIA H100 80GB HBM3) at 40 of 40")


def test_compare_tables_reports_both_directions_and_refuses_a_bad_table(tmp_path, capsys, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import compare_tables

    a = table_file([entry(1), entry(2, us={"jit:direct_c8": 3.0, "torch": 2.7})])
    b = v1_file([entry(1), entry(2), entry(3)])  # a v1 table compares with a v2 one
    for name, data in (("a.json", a), ("b.json", b), ("bad.json", {**a, "schema": 9})):
        (tmp_path / name).write_text(json.dumps(data))
    monkeypatch.setattr(sys, "argv", ["compare_tables.py", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert compare_tables.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["a.json: the same pick as b.json at 1 of 2 points; its pick at most 1.11x this one's (1 points over 1.02x)",
                   "b.json: the same pick as a.json at 1 of 2 points; its pick at most 2.33x this one's (1 points over 1.02x)"]
    monkeypatch.setattr(sys, "argv", ["compare_tables.py", str(tmp_path / "a.json"), str(tmp_path / "bad.json")])
    assert compare_tables.main() == 2 and "bad.json" in capsys.readouterr().err


def test_a_schema_1_tuned_table_in_the_cache_is_read_and_tune_rewrites_it_as_schema_2(tuned_cache):
    path = routing.tuned_path(H200, V074)
    assert path.name == "nvidia-h200-132sm-sm_90-fi0-7-4.json"  # the name tables tuned before v2 have
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(v1_file([entry(2, us={"jit:ring_c8": 2.0, "torch": 7.0})])))
    routing.reload()
    dec = routing.lookup(ROUTER, {"e": 144, "k": 5120, "out": "float32"}, 2, False, H200)
    assert dec.source == "tuned" and dec.point.best("jit") == ("ring_c8", 2.0) and dec.point.versions == V074
    tune.write_table(path, header(), [entry(3)])
    data = json.loads(path.read_text())
    assert data["schema"] == 2 and [e["m"] for e in data["measurements"][0]["entries"]] == [2, 3]
    assert data["measurements"][0]["versions"] == {"flashinfer": "0.7.4"}


def test_the_shipped_table_of_the_device_serves_and_an_unknown_device_is_estimated(monkeypatch):
    """Several devices in one shipped table: each GPU reads its own measurements; another GPU with an SM count
    of one of them reads those (an estimate); any other is estimated from the nearest SM count's."""
    shipped = routing.table("sm_90")
    h100 = routing.Table({"arch": "sm_90", "device": "NVIDIA H100 80GB HBM3", "sms": 132}, shipped.points, "h100")
    h20 = routing.Table({"arch": "sm_90", "device": "NVIDIA H20", "sms": 78}, shipped.points[:10], "h20")
    monkeypatch.setattr(routing, "tables", lambda arch: (shipped, h100, h20) if arch == "sm_90" else ())
    assert routing.shipped_for(routing.Device("NVIDIA H100 80GB HBM3", 132, "sm_90")) is h100
    assert routing.shipped_for(H200) is shipped
    assert routing.shipped_for(routing.Device("NVIDIA H200 NVL", 132, "sm_90")) is shipped  # same SMs: an estimate
    assert routing.shipped_for(routing.Device("NVIDIA H800", 114, "sm_90")) is None
    assert routing.nearest_shipped(routing.Device("NVIDIA H800", 114, "sm_90")) is shipped
    assert routing.nearest_shipped(routing.Device("NVIDIA H20 96GB", 80, "sm_90")) is h20


H100 = routing.Device("NVIDIA H100 80GB HBM3", 132, "sm_90", 3350)


def test_the_h100_reads_its_own_group_of_the_shipped_table(tuned_cache):
    """The shipped table holds the H100 beside the H200: each reads its own measurements, exactly, and where
    the two GPUs rank the candidates differently each gets its own pick."""
    h200, h100 = routing.tables("sm_90")[:2]
    assert (h200.device, h100.device) == ("NVIDIA H200", "NVIDIA H100 80GB HBM3") and h100.sms == 132
    assert routing.shipped_for(H100) is h100 and routing.shipped_for(H200) is h200
    differ = 0
    for p in h100.points:
        if p.versions != V074:
            continue
        dec = routing.lookup(p.op, dict(p.shape), p.m, p.pdl, H100)
        assert dec.source == "shipped" and not dec.estimated and dec.match == "exact" and dec.point is p
        other = routing.lookup(p.op, dict(p.shape), p.m, p.pdl, H200)
        differ += other.point.us[0][0] != p.us[0][0]
    assert differ > 0  # the H100 ranks differently at some points: the table keeps both


@pytest.mark.parametrize("name,sms,gbps,nearest", [
    ("NVIDIA H800", 132, 3350, "NVIDIA H100 80GB HBM3"),  # same SMs, the H100's bandwidth
    ("NVIDIA H200 NVL", 132, 4800, "NVIDIA H200"),
    ("NVIDIA GH200 144G HBM3e", 132, 4900, "NVIDIA H200"),
    ("NVIDIA GH200 480GB", 132, 4000, "NVIDIA H100 80GB HBM3"),  # 4.0 TB/s: nearer the H100's 3.35 than 4.8
    ("NVIDIA H100 PCIe", 114, 2000, "NVIDIA H100 80GB HBM3"),
    ("NVIDIA H20", 78, 4000, "NVIDIA H100 80GB HBM3"),
    ("NVIDIA H20", 78, None, "NVIDIA H200"),  # bandwidth unknown: the SM count alone, a tie kept in table order
])
def test_a_gpu_no_group_names_reads_the_nearest_by_sm_count_and_bandwidth(tuned_cache, name, sms, gbps, nearest):
    device = routing.Device(name, sms, "sm_90", gbps)
    assert routing.nearest_shipped(device).device == nearest
    dec = routing.lookup(ROUTER, {"e": 256, "k": 7168, "out": "float32"}, 4, False, device)
    assert dec.estimated and (dec.source == "estimate") == (sms != 132)
    if sms == 132:
        assert f"measured on {nearest}," in dec.match


@pytest.mark.parametrize("name,clock,bus,gbps", [
    ("NVIDIA H100 80GB HBM3", 2619000, 5120, 3352),  # memory clock (kHz) and bus width (bits) as torch reports them
    ("NVIDIA H100 PCIe", 0, 0, 2000), ("NVIDIA H20", 0, 0, 4000), ("NVIDIA H200", 0, 0, 4800),
    ("NVIDIA GH200 480GB", 0, 0, 4000), ("NVIDIA GH200 144G HBM3e", 0, 0, 4900), ("NVIDIA RTX PRO 6000", 0, 0, None),
])
def test_a_devices_memory_bandwidth_comes_from_its_properties_else_its_name(name, clock, bus, gbps):
    from slim_kernel.decision import memory_gbps

    assert memory_gbps(name, clock, bus) == gbps


@pytest.mark.parametrize("device,own", [(H100, True), (routing.Device("NVIDIA H20", 78, "sm_90", 4000), False)],
                         ids=["H100", "H20"])
def test_info_says_whose_measurements_route_the_gpu(monkeypatch, capsys, device, own):
    import torch

    import slim_kernel.ops  # noqa: F401
    from slim_kernel import cli, devices, info, registry

    monkeypatch.setattr(registry, "arch", lambda d: "sm_90")
    monkeypatch.setattr(registry, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(devices, "routing_device", lambda d: device)
    shipped = info._tables(torch.device("cuda", 0))["shipped"]
    if own:
        assert shipped == {"device": device.name, "rule": "this GPU's own measurements"}
    else:
        assert shipped["device"] == "NVIDIA H100 80GB HBM3" and shipped["rule"].startswith("the estimate, placed on its 78 SMs")
    rows = info._picks(torch.device("cuda", 0))
    sources = {r["source"] for r in rows if r["shape"] == {"e": 256, "k": 7168, "out": "float32"}}
    assert sources == ({"shipped"} if own else {"estimate"})
    assert all(r["estimate"] != own for r in rows if r["shape"] == {"e": 256, "k": 7168, "out": "float32"})

    collect = info.collect

    def with_the_gpu(shapes=None):  # the report of a machine with this GPU (its picks are checked above)
        report, errors = collect(shapes)
        report["devices"].append({"device": "cuda:0", "name": device.name, "capability": "9.0", "sms": device.sms,
                                  "ops": {}, "routing_tables": info._tables(torch.device("cuda", 0)), "picks": []})
        return report, errors
    monkeypatch.setattr(info, "collect", with_the_gpu)
    capsys.readouterr()
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "; ".join(f"{t.device}, {len(t.points)} points" for t in routing.tables("sm_90")) in out  # both GPUs
    rule = "this GPU's own measurements" if own else "the estimate, placed on its 78 SMs"
    assert f"  shipped table for this GPU: NVIDIA H100 80GB HBM3 ({rule}" in out, out


def test_the_estimate_on_the_h100_learns_its_own_group_first_then_shapes_only_the_h200_measured(tuned_cache):
    h200, h100 = routing.tables("sm_90")[:2]
    assert routing.shipped_by_nearness(H100) == [h100, h200] and routing.shipped_by_nearness(H200) == [h200, h100]
    only = next(p for p in h200.points if p.op == ROUTER and p.versions == V074 and not p.pdl and p.m == 4
                and h100.point(p.op, dict(p.shape), p.m, p.versions, p.pdl) is None)  # a shape the H100 runs lack
    dec = routing.lookup(ROUTER, dict(only.shape), 4, False, H100)
    shapes = len({p.shape for p in h200.points if p.op == ROUTER and p.versions == V074 and not p.pdl and p.m == 4})
    assert dec.source == "estimate" and f"at the {shapes} measured shapes" in dec.match  # the H200's shapes count too
    assert dec.point.us[0][0] == only.us[0][0]  # the H200's fastest at that very shape leads
