"""DLRM builder (builders/dlrm.py), sharders (search/sharders.py) and ``trainsim shard``."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainsim.builders.dlrm import (
    DLRM_2022_REUSE,
    DLRMSpec,
    TableSpec,
    build_dlrm_workload,
    load_dlrm_spec,
    predict_dlrm_step,
    random_tables,
    sim_options,
    table_costs,
)
from trainsim.errors import ConfigError
from trainsim.ir.kinds import CollectiveKind
from trainsim.ir.serialize import workload_from_dict, workload_to_dict
from trainsim.search.sharders import SHARDERS, greedy, select_sharder
from trainsim.sim import simulate

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "dlrm_tables.json"
CPU = next((REPO / "src" / "trainsim" / "bench" / "data").glob("cpu_quick_*.device.yaml"))
GPU = "a100-sxm4-80gb"


@pytest.fixture(scope="module")
def spec() -> DLRMSpec:
    return DLRMSpec(random_tables(20, seed=3), batch=2048)


# --- random tasks and spec files --------------------------------------------------------------


def test_random_tables_follow_the_published_distributions():
    ts = random_tables(400, seed=0, max_rows=10**6)
    assert ts == random_tables(400, seed=0, max_rows=10**6) and ts != random_tables(400, seed=1)
    heavy = sum(t.pooling >= 20 for t in ts) / len(ts)
    assert 0.15 < heavy < 0.28  # 166/788 heavy tables in the 2022 data (000 §II-A)
    assert sum(t.pooling <= 1 for t in ts) / len(ts) > 0.3  # "especially [0, 1]"
    assert all(1_000 <= t.rows <= 10**6 and t.dim in (16, 32, 64, 128) for t in ts)
    for t in ts:
        assert t.reuse is not None and len(t.reuse) == len(DLRM_2022_REUSE)
        assert sum(t.reuse) == pytest.approx(1.0, abs=1e-3)
    mean = [sum((t.reuse or ())[b] for t in ts) / len(ts) for b in range(3)]
    assert mean == pytest.approx(DLRM_2022_REUSE[:3], abs=0.05)  # jitter around the histogram
    assert all(t.pooling >= 20 for t in random_tables(30, seed=0, heavy=True))


def test_example_spec_loads():
    s = load_dlrm_spec(EXAMPLE)
    assert len(s.tables) == 26 and s.batch == 4096 and s.bottom_mlp == (512, 256, 64)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ([], "mapping"),
        ({"tables": []}, "batch"),
        ({"batch": 8, "tables": []}, "field tables"),
        ({"batch": 0, "tables": [{"rows": 5, "dim": 4, "pooling": 1}]}, "field batch"),
        ({"batch": 8, "tables": [{"rows": 5.5, "dim": 4, "pooling": 1}]}, "tables[0].rows"),
        ({"batch": 8, "tables": [{"rows": 5, "pooling": 1}]}, "tables[0].dim"),
        ({"batch": 8, "tables": [{"rows": 5, "dim": 4, "pooling": -1}]}, "tables[0].pooling"),
        ({"batch": 8, "tables": [{"rows": 5, "dim": 4, "pooling": 1, "reuse": [0, 0]}]}, "reuse"),
        ({"batch": 8, "tables": [{"rows": 5, "dim": 4, "pooling": 1, "hot": 1}]}, "tables[0].hot"),
        ({"batch": 8, "tables": [{"rows": 5, "dim": 4, "pooling": 1}], "bottom": [1]}, "'bottom'"),
        ({"batch": 8, "tables": [{"rows": 5, "dim": 4, "pooling": 1}], "top_mlp": []}, "top_mlp"),
        (
            {"batch": 8, "tables": [{"rows": 5, "dim": 4, "pooling": 1}], "interaction": "dot"},
            "dot",
        ),
    ],
)
def test_spec_file_errors_name_the_field(tmp_path, doc, needle):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        load_dlrm_spec(f)
    assert str(f) in str(e.value) and needle in str(e.value)


def test_spec_yaml_and_unreadable(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("batch: 64\ntables:\n  - {rows: 100, dim: 8, pooling: 2.5}\n")
    assert load_dlrm_spec(f).tables == (TableSpec("t0", 100, 8, 2.5),)
    with pytest.raises(ConfigError, match="cannot read"):
        load_dlrm_spec(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid"):
        load_dlrm_spec(tmp_path / "x.json")


# --- sharders --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SHARDERS))
@pytest.mark.parametrize("world", [1, 3, 8])
def test_sharders_give_valid_assignments(spec, name, world):
    a = SHARDERS[name](spec, world, seed=1, device=GPU)
    assert len(a) == len(spec.tables) and all(isinstance(r, int) and 0 <= r < world for r in a)
    assert a == SHARDERS[name](spec, world, seed=1, device=GPU)  # deterministic


def test_naive_and_random_semantics(spec):
    assert SHARDERS["naive"](spec.tables, 3) == [i % 3 for i in range(len(spec.tables))]
    many = random_tables(400, seed=0)
    a, b = SHARDERS["random"](many, 4, seed=0), SHARDERS["random"](many, 4, seed=1)
    assert a != b and all(60 < a.count(r) < 140 for r in range(4))


def test_greedy_is_within_the_list_scheduling_bounds():
    costs = [7.0, 5.0, 5.0, 4.0, 4.0, 3.0, 3.0, 3.0, 2.0]
    world = 3
    a = greedy(costs, world)
    load = [sum(c for c, r in zip(costs, a, strict=True) if r == k) for k in range(world)]
    opt = min(
        max(sum(c for c, r in zip(costs, p, strict=True) if r == k) for k in range(world))
        for p in itertools.product(range(world), repeat=len(costs))
    )
    assert max(load) <= 4 / 3 * opt  # LPT (Graham 1969)
    assert max(load) <= sum(costs) / world + max(costs)


@pytest.mark.parametrize("name", [n for n in SHARDERS if n not in ("naive", "random")])
def test_cost_sharders_balance_their_cost(spec, name):
    from trainsim.search import sharders as sh

    cost = {
        "size_greedy": lambda t: t.rows,
        "lookup_greedy": lambda t: t.pooling * t.dim,
        "norm_lookup_greedy": lambda t: t.pooling / t.rows,
    }
    world = 4
    a = sh.SHARDERS[name](spec, world, device=GPU)
    if name in cost:
        c = [cost[name](t) for t in spec.tables]
    elif name == "size_lookup_greedy":
        import math

        c = [t.pooling * t.dim * math.log10(t.rows) for t in spec.tables]
    else:
        c = table_costs(spec, device=GPU)
    load = [sum(x for x, r in zip(c, a, strict=True) if r == k) for k in range(world)]
    assert max(load) <= sum(c) / world + max(c) + 1e-12


def test_capacity_cap(spec):
    sizes = [t.nbytes() for t in spec.tables]
    cap = max(*sizes, 1.2 * sum(sizes) / 4)
    a = SHARDERS["size_greedy"](spec, 4, capacity_bytes=cap)
    assert all(sum(s for s, r in zip(sizes, a, strict=True) if r == k) <= cap for k in range(4))
    with pytest.raises(ConfigError, match="fits on no rank"):
        SHARDERS["lookup_greedy"](spec, 4, capacity_bytes=max(sizes) / 2)
    with pytest.raises(ConfigError, match="over the"):
        SHARDERS["naive"](spec, 1, capacity_bytes=sum(sizes) / 2)


def test_predicted_greedy_needs_device_and_batch(spec):
    with pytest.raises(ConfigError, match="device"):
        SHARDERS["predicted_greedy"](spec, 2)
    with pytest.raises(ConfigError, match="batch"):
        SHARDERS["predicted_greedy"](spec.tables, 2, device=GPU)
    assert SHARDERS["predicted_greedy"](spec.tables, 2, device=GPU, batch=spec.batch) == SHARDERS[
        "predicted_greedy"
    ](spec, 2, device=GPU)


# --- workload and prediction ------------------------------------------------------------------------


@pytest.mark.parametrize("device", [GPU, str(CPU)])
def test_workload_is_valid_ir_and_simulates(spec, device):
    world = 4
    a = SHARDERS["naive"](spec, world)
    w = build_dlrm_workload(spec, a, world, device=device)
    assert workload_from_dict(workload_to_dict(w)) == w  # round trip through the IR schema
    assert [rg.rank for rg in w.ranks] == list(range(world))
    for rg in w.ranks:
        ks = rg.kernels()
        assert all(k.predicted_s is not None and k.predicted_s > 0 and k.provenance for k in ks)
        colls = [
            (k.collective.group, k.collective.seq, k.collective.kind) for k in ks if k.collective
        ]
        assert colls == [("emb", 0, CollectiveKind.ALL_TO_ALLV), ("emb", 1, CollectiveKind.ALL_TO_ALLV),
                         ("dp", 0, CollectiveKind.ALL_REDUCE)]  # fmt: skip
    # what each rank receives in the forward all-to-all is what the others sent it
    fwd = {rg.rank: next(k.collective for k in rg.kernels() if k.collective) for rg in w.ranks}
    for r in range(world):
        assert fwd[r].out_bytes == sum((fwd[s].peer_bytes or ())[r] for s in range(world))
    res = simulate(w, sim_options(w))
    assert res.predicted_step_s > 0
    assert predict_dlrm_step(spec, a, world, device=device) == pytest.approx(res.predicted_step_s)


def test_cpu_step_is_the_sum_of_synchronised_segments(spec):
    """On a CPU every op shares one stream and the collectives synchronise the ranks, so the step
    is the slowest rank's lookups between each pair of collectives plus the common work."""
    world = 2
    a = [0] * (len(spec.tables) - 1) + [1]
    w = build_dlrm_workload(spec, a, world, device=CPU)
    seg: list[dict[str, float]] = [{} for _ in range(world)]
    for rg in w.ranks:
        for op in rg.ops:
            part = op.name.split(":")[0]
            seg[rg.rank][part] = seg[rg.rank].get(part, 0.0) + sum(
                k.predicted_s or 0 for k in op.kernels
            )
    per_rank_max = sum(max(s.get(p, 0.0) for s in seg) for p in ("embedding_fwd", "embedding_bwd"))
    common = sum(v for p, v in seg[0].items() if not p.startswith("embedding"))
    assert simulate(w, sim_options(w)).predicted_step_s == pytest.approx(
        per_rank_max + common, rel=1e-9
    )


@pytest.mark.parametrize("device", [GPU, str(CPU)])
def test_imbalanced_assignment_is_slower(device):
    spec = DLRMSpec(random_tables(24, seed=5, heavy=True), batch=4096)
    balanced = SHARDERS["predicted_greedy"](spec, 4, device=device)
    one = predict_dlrm_step(spec, [0] * 24, 4, device=device)
    assert one > 1.2 * predict_dlrm_step(spec, balanced, 4, device=device)


def test_tbe_batches_tables_and_fuses_the_update(spec):
    a = SHARDERS["naive"](spec, 2)
    per_table = build_dlrm_workload(spec, a, 2, device=CPU)
    tbe = build_dlrm_workload(spec, a, 2, device=CPU, tbe=True)

    def emb_ops(w, part):
        return [op for op in w.ranks[0].ops if op.name.startswith(part)]

    n0 = a.count(0)
    assert len(emb_ops(per_table, "embedding_fwd")) == n0
    assert len(emb_ops(per_table, "embedding_bwd")) == 2 * n0  # sparse gradient + SGD update
    assert len(emb_ops(tbe, "embedding_fwd")) == len(emb_ops(tbe, "embedding_bwd")) == 1
    assert sum(table_costs(spec, device=CPU, tbe=True)) < sum(table_costs(spec, device=CPU))


def test_assignment_errors(spec):
    with pytest.raises(ConfigError, match="entries"):
        build_dlrm_workload(spec, [0], 2, device=GPU)
    with pytest.raises(ConfigError, match=r"not in 0\.\.1"):
        build_dlrm_workload(spec, [2] * len(spec.tables), 2, device=GPU)


def test_table_costs_grow_with_pooling_and_report_cpu_provenance():
    spec = DLRMSpec((TableSpec("a", 10**5, 64, 2.0), TableSpec("b", 10**5, 64, 40.0)), batch=4096)
    for dev in (GPU, CPU):
        a, b = table_costs(spec, device=dev)
        assert 0 < a < b
    w = build_dlrm_workload(spec, [0, 1], 2, device=CPU)
    provs = {k.provenance for rg in w.ranks for k in rg.kernels()}
    assert {p.split(":")[0] for p in provs} == {"spec-based", "estimate"}


def test_select_sharder_ranks_by_predicted_time(spec):
    res = select_sharder(spec, 4, device=GPU, system="dgx-a100")
    assert {r["name"] for r in res} == set(SHARDERS)
    times = [r["predicted_step_s"] for r in res]
    assert times == sorted(times)
    best = res[0]
    assert best["imbalance"] >= 1.0 and len(best["embedding_load_s"]) == 4


# --- CLI ---------------------------------------------------------------------------------------------

_ENTRY = "from trainsim.cli.main import app_entry; app_entry()"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _ENTRY, *args], capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip


def test_cli_shard_json():
    p = _cli("shard", str(EXAMPLE), "--world", "2", "--device", str(CPU), "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["best"] == doc["sharders"][0]["name"]
    assert {s["name"] for s in doc["sharders"]} == set(SHARDERS)
    for s in doc["sharders"]:
        assert {"name", "predicted_step_s", "assignment"} <= set(s)
        assert len(s["assignment"]) == 26 and s["predicted_step_s"] > 0


def test_cli_shard_bad_spec_is_one_line_exit_1(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"batch": 8, "tables": [{"rows": -1, "dim": 4, "pooling": 1}]}))
    p = _cli("shard", str(f), "--device", GPU)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "tables[0].rows" in lines[0]


def test_mean_reuse_is_the_input_the_learned_embedding_models_read():
    """The builder passes each table's lookups per distinct row (``reuse``), as the bench
    measures it; without it the learned CPU models assumed every lookup a different row."""
    from trainsim.builders.dlrm import mean_reuse

    dlrm2022 = (0.342, 0.144, 0.149, 0.138, 0.112, 0.068, 0.029, 0.010, 0.004, 0.002, 0.001, 0.001)
    big = TableSpec("t", rows=10**7, dim=64, pooling=20)
    assert mean_reuse(big, 2048) == pytest.approx(1.0, abs=0.01)  # uniform, far more rows than lookups
    assert mean_reuse(TableSpec("t", rows=1000, dim=64, pooling=20), 2048) == pytest.approx(40.96)  # every row hit
    assert mean_reuse(TableSpec("t", rows=10**7, dim=64, pooling=20, reuse=dlrm2022), 2048) == pytest.approx(11.33, rel=1e-3)
    spec = DLRMSpec(tables=(TableSpec("t", rows=10**5, dim=64, pooling=20, reuse=dlrm2022),), batch=2048)
    w = build_dlrm_workload(spec, [0], 1, device=CPU)
    emb = [k for r in w.ranks for op in r.ops for k in op.kernels if k.name.startswith("embedding_bag")]
    assert emb and all(k.features.get("reuse") == pytest.approx(11.33, rel=1e-3) for k in emb)


TBE_DATA = REPO / "src" / "trainsim" / "bench" / "data" / "cpu_tbe_f97e94a9cbddf655.jsonl.gz"


@pytest.fixture(scope="module")
def tbe_model(tmp_path_factory):
    """A quick (roofline-kind) fit of the shipped FBGEMM TBE rows."""
    from trainsim.bench.opspecs import register_bench_ops
    from trainsim.hardware import get_device
    from trainsim.kernels import fit_kernels, read_kernel_dataset, save_model

    register_bench_ops()
    result = fit_kernels(read_kernel_dataset([TBE_DATA]), device=get_device(str(CPU)), kinds=("roofline",))
    return save_model(result.model, tmp_path_factory.mktemp("tbe") / "tbe.npz")


def test_tbe_tables_are_timed_with_the_tbe_kernel_where_calibrated(tbe_model):
    from trainsim.builders.dlrm import Coster, _table_kernels

    t = TableSpec("t", rows=10**6, dim=64, pooling=20)
    with_tbe = Coster(CPU, kernel_models=tbe_model)
    fwd, bwd = _table_kernels(with_tbe, t, 4096, "fp32", tbe=True)
    assert [k.op for k in fwd + bwd] == ["embedding_tbe", "embedding_tbe"]
    assert all(k.provenance.startswith("calibrated") for k in fwd + bwd)
    fwd, bwd = _table_kernels(with_tbe, t, 4096, "fp32", tbe=False)  # nn.EmbeddingBag + a sparse update
    assert [k.op for k in fwd] == ["embedding_bag"] and len(bwd) == 2
    fwd, _ = _table_kernels(Coster(CPU), t, 4096, "fp32", tbe=True)  # no calibrated TBE model: fall back
    assert fwd[0].op == "embedding_bag"


def test_cpu_embedding_suite_measures_tbe_when_fbgemm_loads():
    from trainsim.bench.suites.base import SweepSpec
    from trainsim.bench.suites.embedding import embedding_cases, tbe_available

    ops = {c.op for c in embedding_cases(SweepSpec(device="cpu", quick=True))}
    assert ops == ({"embedding_bag", "embedding_tbe"} if tbe_available() else {"embedding_bag"})
    assert {c.op for c in embedding_cases(SweepSpec(device="cuda", quick=True))} == {"embedding_bag"}
