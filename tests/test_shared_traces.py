"""Every trace in ../shared/data/traces either loads, with the facts stated here, or fails with
the stated TraceFormatError and reason. One table; a new shipped trace needs a row.

Facts come from the data's README (step times, rank counts, iterations) and from the files
themselves (kernel counts of marker-delimited steps). Every loaded workload must also satisfy
the structural invariants of tests/test_fuzz_ingest.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from trainsim.errors import TraceFormatError, TraceMismatchError
from trainsim.ingest import load_traces

from .conftest import SHARED_DATA
from .test_fuzz_ingest import check_invariants

TRACES = SHARED_DATA / "traces"
pytestmark = pytest.mark.shared_data


@dataclass(frozen=True)
class Loads:
    ranks: tuple[int, ...]
    steps: int  # iteration windows found per rank
    from_marker: bool  # ProfilerStep#N windows (else detected or whole trace)
    kernels: dict[int, int] | None = None  # device activities in the chosen step, per rank
    world_size: int | None = None
    step_ms: tuple[float, float] | None = None  # measured step time range (README)
    cpu_step_ms: tuple[float, float] | None = None  # every rank's chosen CPU window (README)
    device: str = ""
    sampled: bool = False  # 'Ev Idx' coverage < 0.9: events were removed from the file
    et_blobs: int = 0
    collectives: tuple[int, int] | None = None  # (matched, instances)


@dataclass(frozen=True)
class Fails:
    error: type[TraceFormatError]
    fragment: str
    names: str = ""  # the file the message must name (relative to traces/)


ET_ONLY = Fails(
    TraceFormatError, "only execution traces given; analyze/replay need the Kineto trace too"
)
DLRM_KERNELS = {0: 261, 1: 262, 2: 262, 3: 273, 4: 273, 5: 261, 6: 262, 7: 262}
SAMPLED = "hta_misc/sampled_rank-{}.json.gz"


@dataclass(frozen=True)
class Case:
    paths: tuple[str, ...]
    expect: Loads | Fails
    why: str = field(default="", compare=False)


# fmt: off
CASES = [
    # PARAM DLRM, 8× V100: the main multi-rank case.
    Case(("param_dlrm_8xv100/dlrm_kineto.tar.gz",), Loads(tuple(range(8)), 1, True, DLRM_KERNELS, 8, cpu_step_ms=(12.5, 19.9), device="V100", collectives=(8, 8))),
    Case(("param_dlrm_8xv100",), Loads(tuple(range(8)), 1, True, DLRM_KERNELS, 8, device="V100", et_blobs=8, collectives=(8, 8)), "Kineto + ET archives"),
    Case(("param_dlrm_8xv100/dlrm_pytorch_et.tar.gz",), ET_ONLY),
    # PARAM single GPU: iterations without markers.
    Case(("param_linear_2080ti/linear_kineto.json.gz",), Loads((0,), 40, False, step_ms=(23.3, 25.7), device="2080 Ti")),
    Case(("param_linear_2080ti",), Loads((0,), 40, False, et_blobs=1), "Kineto + ET pair"),
    Case(("param_linear_2080ti/linear_et.json.gz",), ET_ONLY),
    Case(("param_resnet_2080ti/resnet_kineto.json.gz",), Loads((0,), 30, False, device="2080 Ti"), "DataLoader stalls make windows 124–829 ms"),
    Case(("param_resnet_2080ti",), Loads((0,), 30, False)),
    # Execution traces only (all schemas): clear refusal, Kineto is needed.
    Case(("param_et_schemas/resnet50_1gpu_et_1.0.3.json.gz",), ET_ONLY),
    Case(("param_et_schemas/resnet50_2gpu_et_1.1.0.json.gz",), ET_ONLY),
    Case(("param_et_schemas/resnet50_ddp_et_1.1.0.json.gz",), ET_ONLY),
    Case(("param_et_schemas/hf_gpt2_et.json.tar.gz",), ET_ONLY),
    Case(("param_et_schemas",), ET_ONLY),
    # HTA: one rank of larger jobs; peers absent, so collectives match on this rank only.
    Case(("hta_resnet50_ddp_a100/rank0_of_2.json.gz",), Loads((0,), 3, True, {0: 1258}, 2, (215.0, 226.0), device="A100", collectives=(7, 7))),
    Case(("hta_resnet50_ddp_a100",), Loads((0,), 3, True, {0: 1258}, 2)),
    Case(("hta_recsys_16rank_a100/rank0_of_16.json.gz",), Loads((0,), 5, True, {0: 1375}, 16, (209.0, 217.0), device="A100-SXM4-80GB", collectives=(15, 15))),
    Case(("hta_recsys_16rank_a100",), Loads((0,), 5, True, {0: 1375}, 16)),
    Case(("hta_resnet50_v100/rank0.json.gz",), Loads((0,), 5, True, {0: 1219}, 1, (95.0, 96.5), device="V100"), "µs with ns fractions; displayTimeUnit 'ns' is a hint"),
    Case(("hta_resnet50_v100",), Loads((0,), 5, True, {0: 1219}, 1)),
    # HTA critical-path fixtures: single iterations, used whole.
    Case(("hta_critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",), Loads((0,), 1, False, {0: 98}, device="A100")),
    Case(("hta_critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",), Loads((0,), 1, False, {0: 98})),
    Case(("hta_critical_path/end_to_end/simple_add/input/trace.json.gz",), Loads((0,), 1, False, {0: 98})),
    Case(("hta_critical_path/end_to_end/simple_add/output/overlaid_critical_path_trace.json.gz",), Loads((0,), 1, False, {0: 98})),
    Case(("hta_critical_path/cuda_event_sync/event_sync_trace.json.gz",), Loads((0,), 1, True, {0: 5})),
    Case(("hta_critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",), Loads((0,), 1, False, {0: 6})),
    Case(("hta_critical_path",), Fails(TraceMismatchError, "rank 0 appears twice"), "unrelated single-rank runs in one folder"),
    # HTA robustness set: ROCm, Triton, CPU-only, sampled.
    Case(("hta_misc/mi250_minitoy_train_ROCm6_2_kineto.json.gz",), Loads((0,), 2, True, {0: 16}, device="AMD Radeon Graphics"), "HIP runtime streams are hex strings"),
    Case(("hta_misc/triton_example.json.gz",), Loads((0,), 1, True, {0: 1}, device="A100")),
    Case(("hta_misc/benchmark_simple_add_trace.json.gz",), Loads((0,), 1, False, {0: 4})),
    Case(("hta_misc/benchmark_simple_add_et.json.gz",), ET_ONLY),
    Case(("hta_misc/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",), Loads((34,), 1, True, world_size=300, sampled=True), "CPU-only gloo; Ev Idx 6–7469 were cut out of the file"),
    Case((SAMPLED.format(0),), Loads((0,), 2, True, {0: 602}, 128, sampled=True)),
    Case((SAMPLED.format(1),), Loads((1,), 2, True, {1: 577}, 128, sampled=True)),
    Case((SAMPLED.format(0), SAMPLED.format(1)), Loads((0, 1), 2, True, {0: 602, 1: 577}, 128, sampled=True)),
    Case(("hta_misc",), Fails(TraceMismatchError, "cannot tell which rank this trace is", "hta_misc/mi250_minitoy_train_ROCm6_2_kineto.json.gz")),
    # Chakra: not a Kineto input.
    Case(("chakra_resnet50_rank0/json_trace.tar.gz",), Fails(TraceFormatError, "not a Kineto trace: no 'traceEvents' key (top-level keys: workload_graph)", "chakra_resnet50_rank0/json_trace.tar.gz:jsonData/chakra.0.json")),
    Case(("chakra_resnet50_rank0/allgather_2rank_et_1.0.2.tgz",), ET_ONLY),
    Case(("chakra_resnet50_rank0",), ET_ONLY),
]
# fmt: on


def test_the_table_covers_every_shipped_file():
    if not TRACES.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    listed = {p for c in CASES for p in c.paths}
    shipped = {str(p.relative_to(TRACES)) for p in TRACES.rglob("*") if p.is_file()}
    assert shipped <= listed, sorted(shipped - listed)


@pytest.mark.parametrize("case", CASES, ids=[" + ".join(c.paths) for c in CASES])
def test_shared_trace(case: Case):
    if not TRACES.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    paths = [TRACES / p for p in case.paths]
    expect = case.expect
    if isinstance(expect, Fails):
        with pytest.raises(expect.error) as info:
            load_traces(paths)
        assert type(info.value) is expect.error
        assert expect.fragment in info.value.problem
        assert info.value.path.startswith(str(TRACES / (expect.names or case.paths[0])))
        return
    loaded = load_traces(paths)
    w = loaded.workload
    assert tuple(r.rank for r in w.ranks) == expect.ranks
    assert {r: len(s) for r, s in loaded.steps.items()} == dict.fromkeys(expect.ranks, expect.steps)
    assert all(loaded.chosen[r].from_marker is expect.from_marker for r in expect.ranks)
    if expect.kernels is not None:
        assert {r.rank: len(r.kernels()) for r in w.ranks} == expect.kernels
    if expect.world_size is not None:
        assert {t.world_size for t in loaded.traces.values()} == {expect.world_size}
    if expect.step_ms is not None:
        lo, hi = expect.step_ms
        assert lo <= w.measured_step_s * 1e3 <= hi  # type: ignore[operator]
    if expect.cpu_step_ms is not None:
        lo, hi = expect.cpu_step_ms
        for r, s in loaded.chosen.items():
            assert lo - 0.05 <= (s.end - s.start) * loaded.traces[r].unit_to_s * 1e3 <= hi + 0.05
    assert expect.device in (w.metadata.get("device") or "")
    assert all(t.unit_to_s == 1e-6 for t in loaded.traces.values())  # every shipped trace is µs
    assert all(t.is_sampled is expect.sampled for t in loaded.traces.values())
    assert len(loaded.et_blobs) == expect.et_blobs
    if expect.collectives is not None:
        assert (loaded.match.matched, loaded.match.instances) == expect.collectives
    assert not check_invariants(loaded), check_invariants(loaded)
    assert loaded.warnings == []  # ranks of one job: their steps meet, one device


@pytest.mark.parametrize("paths", [(SAMPLED.format(0),), (SAMPLED.format(0), SAMPLED.format(1))])
def test_sampled_traces_give_no_step_time(paths):
    if not TRACES.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    loaded = load_traces([TRACES / p for p in paths])
    assert loaded.workload.measured_step_s is None
    assert loaded.match.instances == 0
