"""What the trace-analysis speed-ups (performance review, 2026-12-03) must not change: the
analysis, the linked workload IR and the simulation of shipped traces, pinned by digest; and
the faster alignment and dependency code against the plain versions they replace.

The digests were taken with the code before the review. A change that means to alter one of
these results updates its digest: ``python tests/test_perf_pins.py`` prints the current ones.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import DLRM_DIR, REPO, SHARED_DATA

TRACES = SHARED_DATA / "traces"

# case → (paths, digests of: analyze JSON, linked workload IR, simulate stats, simulate trace)
PINNED: dict[str, tuple[tuple[Path, ...], tuple[str, str, str, str]]] = {
    "dlrm_8xv100": (
        (DLRM_DIR,),
        ("f54c3ada2275f4b7", "55e9cdc828c83a14", "8a90280e59feb24f", "91fc34c48f331bed"),
    ),
    "param_linear_2080ti": (
        (TRACES / "param_linear_2080ti",),
        ("4c4a13764bb5f281", "ab08f45b67f56176", "9c7d47b9fc5145cb", "da33ee42e1bb1f80"),
    ),
    "benchmark_simple_add_et": (
        (TRACES / "hta_misc/benchmark_simple_add_trace.json.gz", TRACES / "hta_misc/benchmark_simple_add_et.json.gz"),
        ("d77b5b4a36ab4403", "7eca886891bc86f1", "bb0a8bdda18bf98d", "5e2237c414e04448"),
    ),
    "hta_resnet50_ddp_a100": (
        (TRACES / "hta_resnet50_ddp_a100",),
        ("890732a79bdbe9bc", "4bd7a9c2a1f27118", "9cf0a247b7da9902", "3c0b457d3a628773"),
    ),
}  # fmt: skip


def _digest(doc: Any) -> str:
    text = json.dumps(doc, sort_keys=True, default=str)
    # paths differ between checkouts: the digest sees them relative to the repo and shared/
    text = text.replace(str(SHARED_DATA), "<shared>").replace(str(REPO), "<repo>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def digests(paths: tuple[Path, ...]) -> tuple[str, str, str, str]:
    from trainsim.analyze.report import analyze_paths
    from trainsim.ir.serialize import workload_to_dict
    from trainsim.sim import HostMode, SimOptions, simulate

    a = analyze_paths(paths)
    sims = [simulate(a.workload, SimOptions(overheads=m)).to_dict() for m in (HostMode.STATS, HostMode.TRACE)]
    return (_digest(a.to_dict()), _digest(workload_to_dict(a.workload)), _digest(sims[0]), _digest(sims[1]))


@pytest.mark.parametrize("case", sorted(PINNED))
def test_shipped_trace_results_are_pinned(case: str) -> None:
    paths, expected = PINNED[case]
    if not all(p.exists() for p in paths):
        pytest.skip("../shared/data is not beside the repository")
    got = digests(paths)
    names = ("analyze JSON", "workload IR", "simulate (stats)", "simulate (trace)")
    assert got == expected, [f"{n}: {g} (pinned {e})" for n, g, e in zip(names, got, expected, strict=True) if g != e]


def _difflib_pairs(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [(m.a + i, m.b + i) for m in sm.get_matching_blocks() for i in range(m.size)]


names = st.lists(st.sampled_from(["aten::mm", "aten::add", "aten::view", "aten::relu", "x"]), max_size=40)


@settings(max_examples=400, deadline=None)
@given(a=names, b=names, twice=st.booleans())
def test_aligned_pairs_are_difflibs(a: list[str], b: list[str], twice: bool) -> None:
    from trainsim.ingest.link import _aligned_pairs

    a = a * 2 if twice else a
    assert _aligned_pairs(a, b) == _difflib_pairs(a, b)


@settings(max_examples=300, deadline=None)
@given(a=names.filter(bool), data=st.data())
def test_aligned_pairs_of_a_window_cut_from_the_repeated_sequence_are_difflibs(a: list[str], data: Any) -> None:
    """The shape of the shipped traces: the Kineto window is a run of the doubled ET thread,
    give or take an op at either end (DLRM's main thread: ``ProfilerStep#`` first)."""
    from trainsim.ingest.link import _aligned_pairs

    aa = a * 2
    lo = data.draw(st.integers(0, len(aa) - 1))
    hi = data.draw(st.integers(lo, len(aa)))
    b = [*data.draw(st.lists(st.just("ProfilerStep#3"), max_size=1)), *aa[lo:hi], *data.draw(names)[:2]]
    assert _aligned_pairs(aa, b) == _difflib_pairs(aa, b)


def test_dlrm_alignment_is_difflibs() -> None:
    """Every thread pair of the 8 DLRM ranks: the alignment the linking uses is difflib's."""
    from collections import defaultdict

    from trainsim.ingest import link as lk
    from trainsim.ingest import load_traces
    from trainsim.ingest.execution_trace import parse_execution_trace

    loaded = load_traces([DLRM_DIR])
    ets = lk._assign_ranks([parse_execution_trace(b.name, b.data) for b in loaded.et_blobs], loaded.traces)
    pairs = 0
    for rank, et in ets.items():
        w = loaded.chosen[rank]
        events = [e for e in loaded.traces[rank].cpu if e.pid == et.pid and w.start <= float(e.ts) < w.end]  # type: ignore[arg-type]
        k_threads: dict[object, list] = defaultdict(list)
        for e in events:
            k_threads[(e.pid, e.tid)].append(e)
        e_threads: dict[int, list] = defaultdict(list)
        for n in et.ops:
            e_threads[n.tid].append(n)
        for lst in k_threads.values():
            lst.sort(key=lk._kineto_order)
        for lst in e_threads.values():
            lst.sort(key=lambda n: (n.rf_id if n.rf_id is not None else -1, n.id))
        for etid, ktid in lk._map_threads(e_threads, k_threads):
            a = [n.name for n in e_threads[etid]] * 2
            b = [e.name for e in k_threads[ktid]]
            assert lk._aligned_pairs(a, b) == _difflib_pairs(a, b)
            pairs += 1
    assert pairs == 16


def _reference_data_dependencies(et: Any) -> dict[int, tuple[int, ...]]:
    """data_dependencies as written before the review (every ancestor set walked)."""
    from trainsim.ingest.execution_trace import _ancestors, start_order

    by_id = {n.id: n for n in et.nodes}
    writers: dict[Any, list[int]] = {}
    deps: dict[int, tuple[int, ...]] = {}
    for n in start_order(et):
        ancestors = _ancestors(n, by_id)
        found: list[int] = []
        for t in n.input_tensors():
            history = writers.get(t.key) if t.key is not None else None
            if not history:
                continue
            for w in reversed(history):
                if w not in ancestors:
                    if w not in found:
                        found.append(w)
                    break
        if found:
            deps[n.id] = tuple(found)
        for t in n.output_tensors():
            if t.key is not None:
                writers.setdefault(t.key, []).append(n.id)
    return deps


def test_data_dependencies_of_shipped_execution_traces_are_the_reference(shared_data: Path) -> None:
    from trainsim.ingest.execution_trace import data_dependencies, parse_execution_trace
    from trainsim.ingest.sources import BlobKind, read_path

    blobs = [b for p in (DLRM_DIR, shared_data / "traces" / "param_et_schemas", shared_data / "traces" / "param_linear_2080ti")
             for b in read_path(p) if b.kind is BlobKind.EXECUTION_TRACE]  # fmt: skip
    assert len(blobs) >= 13
    for b in blobs:
        et = parse_execution_trace(b.name, b.data)
        deps = data_dependencies(et)
        assert deps and deps == _reference_data_dependencies(et), b.name


if __name__ == "__main__":  # print the current digests (to update PINNED after a meant change)
    for case, (paths, _) in sorted(PINNED.items()):
        print(case, digests(paths))


def _archive_outcome(read: Any, path: Path, raw: bytes) -> tuple[Any, list[str]]:
    from trainsim.errors import TraceFormatError

    skipped: list[str] = []
    try:
        return read(path, raw, skipped), skipped
    except TraceFormatError as e:
        return f"error: {e}", skipped


def test_gzipped_archives_read_in_memory_as_streamed(tmp_path: Path) -> None:
    """A .tar.gz decompressed at once gives the blobs, the left-out names and the errors of
    the streaming read (every archive case of test_sources, and the shipped archives)."""
    from trainsim.ingest import sources

    from .test_sources import BAD_INPUTS

    cases = [(n, c) for _, n, c, _ in BAD_INPUTS if c is not None and n.endswith((".tar.gz", ".tgz"))]
    cases += [(p.name, p.read_bytes()) for p in sorted(DLRM_DIR.glob("*.tar.gz"))]
    if TRACES.is_dir():
        cases += [(p.name, p.read_bytes()) for p in sorted(TRACES.rglob("*")) if p.name.endswith((".tar.gz", ".tgz"))]
    assert len(cases) >= 12
    for name, raw in cases:
        path = tmp_path / name
        streamed = _archive_outcome(lambda p, r, s: sources._read_tar(p, r, s, "r:*"), path, raw)
        assert _archive_outcome(sources._read_archive, path, raw) == streamed, name


def test_loading_and_linking_run_without_the_cyclic_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_traces and attach_execution_traces build tens of thousands of acyclic objects: the
    collector is paused while they run (as decode_kineto and the simulator pause it) and its
    state restored after."""
    import gc

    from trainsim.ingest import link, load_traces, multirank

    seen: dict[str, bool] = {}

    def spy(module: Any, name: str) -> None:
        inner = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen[name] = gc.isenabled()
            return inner(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    spy(multirank, "build_workload")
    spy(link, "_annotate")
    assert gc.isenabled()
    link.attach_execution_traces(load_traces([DLRM_DIR]))
    assert seen == {"build_workload": False, "_annotate": False} and gc.isenabled()
