"""IR construction, validation and JSON round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.errors import GraphError
from trainsim.ir import (
    Collective,
    CollectiveKind,
    Kernel,
    KernelFamily,
    Op,
    OpCategory,
    RankGraph,
    SyncKind,
    SyncPoint,
    TensorMeta,
    Workload,
    load_workload,
    save_workload,
    workload_from_dict,
    workload_to_dict,
)


def test_dlrm_round_trip_is_identity(dlrm_loaded, tmp_path):
    w = dlrm_loaded.workload
    assert workload_from_dict(workload_to_dict(w)) == w
    path = tmp_path / "w.json"
    save_workload(w, path)
    assert load_workload(path) == w


def test_validation_rejects_bad_graphs():
    k = Kernel(id=0, name="k", family=KernelFamily.GEMM, stream=7, duration_s=1e-6)
    with pytest.raises(GraphError, match="duplicate op id"):
        RankGraph(rank=0, ops=(Op(0, "a", 1, OpCategory.COMPUTE), Op(0, "b", 1, OpCategory.COMPUTE)))
    with pytest.raises(GraphError, match="unknown ops"):
        RankGraph(rank=0, ops=(Op(0, "a", 1, OpCategory.COMPUTE, deps=(5,)),))
    with pytest.raises(GraphError, match="depends on itself"):
        Op(3, "a", 1, OpCategory.COMPUTE, deps=(3,))
    with pytest.raises(GraphError, match="non-negative"):
        Kernel(id=1, name="k", family=KernelFamily.GEMM, stream=7, duration_s=-1.0)
    with pytest.raises(GraphError, match="non-negative"):
        Kernel(id=1, name="k", family=KernelFamily.GEMM, stream=7, duration_s=float("nan"))
    with pytest.raises(GraphError, match="duplicate kernel id"):
        RankGraph(rank=0, ops=(Op(0, "a", 1, OpCategory.COMPUTE, kernels=(k, k)),))
    with pytest.raises(GraphError, match="not in"):
        RankGraph(rank=0, ops=(Op(0, "a", 1, OpCategory.COMPUTE, kernels=(k,)),), streams=(3,))
    with pytest.raises(GraphError, match="duplicate rank"):
        Workload(ranks=(RankGraph(rank=1, ops=()), RankGraph(rank=1, ops=())))
    with pytest.raises(GraphError, match="schema_version"):
        workload_from_dict({"schema_version": "0.1", "ranks": []})


def test_measured_step_spans_earliest_start_to_latest_end():
    w = Workload(
        ranks=(
            RankGraph(rank=0, ops=(), step_start_s=0.001, step_end_s=0.010),
            RankGraph(rank=1, ops=(), step_start_s=0.000, step_end_s=0.012),
        )
    )
    assert w.measured_step_s == pytest.approx(0.012)
    assert w.rank(0).measured_step_s == pytest.approx(0.009)


_durations = st.one_of(st.none(), st.floats(min_value=0, max_value=10, allow_nan=False))


@st.composite
def workloads(draw) -> Workload:
    ranks = []
    for r in range(draw(st.integers(1, 3))):
        ops, kid = [], 0
        for i in range(draw(st.integers(0, 6))):
            kernels = []
            for _ in range(draw(st.integers(0, 3))):
                coll = None
                if draw(st.booleans()):
                    coll = Collective(
                        kind=draw(st.sampled_from(list(CollectiveKind))), group="g",
                        group_ranks=(0, 1), bytes=draw(st.integers(0, 1 << 40)),
                        seq=draw(st.integers(0, 100)), dtype="float",
                        peer_bytes=draw(st.one_of(st.none(), st.tuples(st.integers(0, 9)))),
                    )  # fmt: skip
                kernels.append(
                    Kernel(
                        id=kid, name=draw(st.text(max_size=8)),
                        family=draw(st.sampled_from(list(KernelFamily))),
                        stream=draw(st.integers(0, 3)), start_s=draw(_durations),
                        duration_s=draw(_durations), features={"m": draw(st.integers(0, 99))},
                        collective=coll,
                    )  # fmt: skip
                )
                kid += 1
            syncs = tuple(
                SyncPoint(kind=draw(st.sampled_from(list(SyncKind))), stream=draw(st.integers(0, 3)))
                for _ in range(draw(st.integers(0, 2)))
            )
            deps = tuple(sorted(set(draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=2))) - {i})) if i else ()
            ops.append(
                Op(
                    id=i, name=draw(st.text(max_size=8)), thread=draw(st.integers(0, 2)),
                    category=draw(st.sampled_from(list(OpCategory))), start_s=draw(_durations),
                    duration_s=draw(_durations), kernels=tuple(kernels), syncs=syncs, deps=deps,
                    inputs=(TensorMeta((draw(st.integers(0, 9)), 2), "float", 7),),
                    seq_nr=draw(st.one_of(st.none(), st.integers(0, 1 << 40))), moved_data=draw(st.booleans()),
                )  # fmt: skip
            )
        ranks.append(RankGraph(rank=r, ops=tuple(ops), represents=draw(st.integers(1, 64))))
    return Workload(ranks=tuple(ranks), process_groups={"g": (0, 1)}, metadata={"source": "test"})


@settings(max_examples=60, deadline=None)
@given(workloads())
def test_json_round_trip_property(w):
    import json

    assert workload_from_dict(json.loads(json.dumps(workload_to_dict(w)))) == w


def test_a_malformed_saved_workload_names_the_file_rank_and_op(tmp_path):
    """Walkthrough 2026-11-27: a saved IR with a missing field said only `KeyError: 'name'`."""
    import json

    w = Workload(ranks=(RankGraph(rank=3, ops=(Op(0, "aten::mm", 1, OpCategory.COMPUTE, start_s=0.0, duration_s=1e-3),
                                               Op(1, "aten::add", 1, OpCategory.COMPUTE, start_s=2e-3, duration_s=1e-3))),))  # fmt: skip
    doc = workload_to_dict(w)
    cases = (("noname", lambda d: d["ranks"][0]["ops"][1].pop("name"), r"rank 3, op 1: missing field 'name'"),
             ("negative", lambda d: d["ranks"][0]["ops"][0].update(duration_s=-1.0),
              r"rank 3, op 0 \(aten::mm\): .*non-negative"),
             ("norank", lambda d: d["ranks"][0].pop("rank"), r"rank 0: missing field 'rank'"))  # fmt: skip
    for name, edit, message in cases:
        bad = json.loads(json.dumps(doc))
        edit(bad)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(GraphError, match=rf"{name}\.json: malformed workload JSON: {message}"):
            load_workload(path)
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(GraphError, match=r"list\.json: not a workload"):
        load_workload(tmp_path / "list.json")
