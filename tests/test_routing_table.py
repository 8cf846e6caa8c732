"""The committed routing table (CPU): complete, consistent with the catalogue, deterministic, shown by info."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from importlib import resources
from pathlib import Path

import pytest

from slim_kernel import models, registry, routing
from slim_kernel.jit import catalogue as cat
from slim_kernel.names import FLASHINFER_FUSED_A_PROGRAMS as FLASHINFER_PROGRAMS
from slim_kernel.names import FLASHINFER_PDL_VARIANT as PDL_VARIANT
from slim_kernel.names import FUSED_A, ROUTER

BACKENDS = {b.value for b in registry.KernelBackend}


DEVICES = ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]  # the GPUs the shipped table measured, the reference first


@pytest.fixture(scope="module", params=DEVICES, ids=["H200", "H100"])
def table(request):
    """Each measured GPU's part of the shipped table."""
    found = {t.device: t for t in routing.tables("sm_90")}
    assert list(found) == DEVICES, "python/slim_kernel/tables/routing_sm90.json holds the H200, then the H100"
    return found[request.param]


MEASURED_MS = set(models.MEASURED_MS)
MEASURED_VERSIONS = {"0.7.2.post1", "0.7.4"}  # flashinfer versions the shipped table has (benchmark/make_routing.py RESULTS)


def test_every_measured_model_shape_is_complete_at_every_m_both_contexts_and_versions(table):
    """What the table must hold comes from the table: a model shape it measured (a campaign of
    ``bench_gemm.py`` on its models) at every M of the campaign, in both contexts, on every version; any
    other shape in both contexts at the same M. A model named in models.py that no campaign measured yet
    is served by the estimate (`slim-kernel info` says so): naming it needs no GPU."""
    from slim_kernel import models

    points = defaultdict(set)
    for p in table.points:
        points[(p.op, p.shape, p.versions, p.pdl)].add(p.m)
    assert set(table.versions_of("flashinfer")) == MEASURED_VERSIONS
    measured = {(op, shape) for op, shape, _, _ in points}
    named = {(s.op, tuple(sorted(s.key().items()))): s for s in models.all_shapes()}
    assert set(named) & measured, "the shipped table measured the models' shapes"
    for key in set(named) & measured:
        for versions in table.versions:
            for pdl in (True, False):
                ms = points.get((*key, versions, pdl), set())
                assert ms >= MEASURED_MS, f"{named[key].label()} {versions} pdl={pdl}: missing M {sorted(MEASURED_MS - ms)}"
    more = measured - set(named)  # shapes the checks of the estimate measured (bench_gemm.py --unnamed-*)
    assert more or table.device != DEVICES[0], "the table holds shapes no model names"
    for op, shape in more:
        for versions in {v for o, s, v, _ in points if (o, s) == (op, shape)}:
            assert points[(op, shape, versions, True)] == points[(op, shape, versions, False)] != set(), (op, shape)


@pytest.mark.parametrize("device", [0, 1], ids=["H200", "H100"])
def test_a_schema_1_table_gives_the_same_pick_at_every_point(device):
    """The loader reads v1 tables (tuned tables in users' caches are v1): each device's part of the shipped
    table written back as v1 (one ``flashinfer`` column per entry) routes every point to the same candidates."""
    table = routing.tables("sm_90")[device]
    data = json.loads(resources.files("slim_kernel").joinpath("tables", "routing_sm90.json").read_text())
    data["measurements"] = [g for g in data["measurements"] if g["device"] == table.device]
    group = data["measurements"][0]
    v1 = {"schema": 1, "arch": group["arch"], "device": group["device"], "sms": group["sms"],
          "entries": [{**e, "flashinfer": dict(e["versions"])["flashinfer"]} for e in routing.flat_entries(data)]}
    (old,) = routing.parse(json.loads(json.dumps(v1)), "v1")
    assert len(old.points) == len(table.points) and old.versions == table.versions
    for p in table.points:
        dec = old.lookup(p.op, dict(p.shape), p.m, p.versions, p.pdl)
        assert dec.match == "exact" and dec.point.us == p.us, p.describe()
    # ... and so does one naming the configurations by their names before the naming rule (aliases)
    from slim_kernel import tune

    before = {op: {new: old for old, new in cat.ALIASES[op].items()} for op in cat.ALIASES}
    for e in v1["entries"]:
        e["us"] = {f"jit:{before[e['op']].get(c[4:], c[4:])}" if c.startswith("jit:") else c: u for c, u in e["us"].items()}
    assert any("jit:ring_c8" in e["us"] for e in v1["entries"])
    costs = tune.pick_costs(routing.flat_entries(v1), table)
    assert len(costs) == len(table.points) and set(costs) == {1.0}


def test_candidates_name_existing_backends_and_configurations(table):
    for p in table.points:
        assert p.us, p
        for cand, us in p.us:
            backend, _, variant = cand.partition(":")
            assert backend in BACKENDS, cand
            assert us > 0
            if variant and backend == "flashinfer":
                assert p.op == FUSED_A, f"{p.describe()}: {cand}"
                # PDL_VARIANT: the own call launched with PDL, a candidate only where the context has none
                assert variant in FLASHINFER_PROGRAMS or (variant == PDL_VARIANT and not p.pdl), f"{p.describe()}: {cand}"
            elif variant:
                assert backend == "jit" and variant in cat.VARIANTS[p.op], f"{p.describe()}: {cand}"
                assert cat.variant_serves(cat.VARIANTS[p.op][variant], p.op, p.m), f"{p.describe()}: {cand}"
            if backend == "flashinfer":
                assert p.m <= (64 if p.op == FUSED_A else 16), f"flashinfer does not serve {p.describe()}"


def test_selection_is_deterministic(table):
    # Same query, same point and the same ranking; the fastest candidate first, ties by name.
    for p in table.points[:50]:
        a = table.lookup(p.op, dict(p.shape), p.m, p.versions, p.pdl)
        b = table.lookup(p.op, dict(p.shape), p.m, p.versions, p.pdl)
        assert a == b and a.match == "exact" and a.point is p
        assert [u for _, u in p.us] == sorted(u for _, u in p.us)


def test_table_file_is_what_make_routing_writes():
    from importlib import resources

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import make_routing

    text = resources.files("slim_kernel").joinpath("tables", "routing_sm90.json").read_text()
    assert make_routing.dumps_table(json.loads(text)) == text


def test_make_routing_without_arguments_reproduces_the_committed_table_and_summaries(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import make_routing

    table = tmp_path / "table.json"
    assert make_routing.main(["--table", str(table), "--summaries", str(tmp_path)]) == 0
    assert table.read_bytes() == make_routing.TABLE.read_bytes()
    for gpu in make_routing.RESULTS:  # one summary per GPU folder, beside its runs
        name = Path(gpu, make_routing.SUMMARY_NAME)
        assert (tmp_path / name).read_bytes() == (make_routing.RESULTS_ROOT / name).read_bytes(), name
    groups = json.loads(table.read_text())["measurements"]
    assert {(g["device"], g["versions"]["flashinfer"]) for g in groups} == {
        (device, v) for device in ("NVIDIA H200", "NVIDIA H100 80GB HBM3") for v in MEASURED_VERSIONS}
    assert groups[0]["device"] == "NVIDIA H200"  # the first folder's GPU stays the arch's reference
    assert all(g["sms"] == 132 and g["command"].startswith("python3 benchmark/bench_gemm.py") for g in groups)


def test_the_h100_summary_says_what_the_h100_group_picks_and_the_h200_summary_is_as_measured():
    """The H100 runs' default read the H200 table: their summary rows add the H100 group's pick and its time in
    the same run, which is the fastest of our columns there (the group is made of those rows)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import make_routing

    h100 = json.loads((make_routing.RESULTS_ROOT / "h100" / make_routing.SUMMARY_NAME).read_text())["rows"]
    h200 = json.loads(make_routing.SUMMARY.read_text())["rows"]
    assert len(h100) == 1200 and all("table_backend" in r for r in h100)
    assert not any("table_backend" in r for r in h200)
    runs = make_routing.merge_reports([make_routing.read_json(make_routing.RESULTS_ROOT / "h100" / name)
                                       for name in make_routing.RESULTS["h100"]])
    group = next(t for t in routing.tables("sm_90") if t.device == "NVIDIA H100 80GB HBM3")
    for run in runs:
        versions = tuple(sorted(make_routing.group_header(run)["versions"].items()))
        for row in run["rows"]:
            ours = make_routing.candidates(row["op"], row["us"], row["shape"])
            assert make_routing.table_pick(row, versions, group)[1] == min(ours.values()), row["shape"]


def test_make_routing_merges_runs_of_one_version_point_by_point():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import make_routing

    def row(m, producer, us):
        return {"op": ROUTER, "shape": {"e": 256, "k": 7168, "out": "float32", "m": m}, "cache": "cold",
                "pattern": "decode", "producer": producer, "us": us}

    full = {"command": "full", "versions": {"flashinfer": "0.7.4"},
            "rows": [row(1, "plain", {"default": 3.0, "torch": 9.0}), row(9, "plain", {"default": 5.0, "torch": 9.0})]}
    narrow = {"command": "narrow", "versions": {"flashinfer": "0.7.4"},
              "rows": [row(1, "plain", {"default": 2.0, "torch": 8.0}), row(2, "pdl", {"default": 2.5, "torch": 8.0})]}
    other = {"command": "other", "versions": {"flashinfer": "0.7.2.post1"}, "rows": [row(1, "plain", {"default": 4.0})]}
    merged = make_routing.merge_reports([full, narrow, other])
    assert [m["versions"]["flashinfer"] for m in merged] == ["0.7.4", "0.7.2.post1"]
    rows = {(r["shape"]["m"], r["producer"]): r["us"]["default"] for r in merged[0]["rows"]}
    assert rows == {(1, "plain"): 2.0, (9, "plain"): 5.0, (2, "pdl"): 2.5}
    assert merged[0]["command"] == "full ; then narrow" and full["rows"][0]["us"]["default"] == 3.0

    # a table: per version (make_routing: a version's runs replace it whole), or per point (the
    # benchmark's run of a few shapes refining the installed table)
    old = make_routing.build_table(merged, None, "old")
    new = {"command": "new", "versions": {"flashinfer": "0.7.4"}, "rows": [row(9, "plain", {"default": 1.0, "torch": 7.0})]}
    whole, refined = (make_routing.build_table([new], old, "new", per_point=p) for p in (False, True))
    points = {(dict(e["versions"])["flashinfer"], e["m"], e["pdl"]): e["us"]["torch"]
              for e in routing.flat_entries(refined)}
    assert points == {("0.7.4", 1, False): 8.0, ("0.7.4", 9, False): 7.0, ("0.7.4", 2, True): 8.0}
    assert {(dict(e["versions"])["flashinfer"], e["m"]) for e in routing.flat_entries(whole)} == {("0.7.4", 9)}


def test_info_json_carries_the_table():
    proc = subprocess.run([sys.executable, "-m", "slim_kernel", "info", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == 1
    tab = report["routing_tables"]["sm_90"]
    assert tab["entries"] == len(routing.table("sm_90").points) and "0.7.4" in tab["flashinfer_versions"]


def test_make_routing_plots_each_versions_merged_runs(tmp_path):
    """--plots: one PNG per flashinfer version, named after its first file, drawn from the merge."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import bench_gemm
    import make_routing

    first, later = tmp_path / "run_a.json", tmp_path / "run_b.json"
    assert bench_gemm.main(["--dry-run", "--json", str(first), "--models", "deepseek-v3"]) == 0
    data = json.loads(first.read_text())
    data["command"], data["rows"] = "a later run", data["rows"][:2]
    later.write_text(json.dumps(data))
    args = [str(first), str(later), "--table", str(tmp_path / "t.json"), "--summary", str(tmp_path / "s.json"), "--plots"]
    assert make_routing.main(args) == 0
    assert (tmp_path / "run_a.png").stat().st_size > 10_000 and not (tmp_path / "run_b.png").exists()
