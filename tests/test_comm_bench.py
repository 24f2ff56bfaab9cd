"""The comm micro-benchmark with gloo on two local processes: rows, resume, torn last line."""

from __future__ import annotations

import json

import pytest

from trainsim.bench.comm import run_comm_bench
from trainsim.comm import read_comm_dataset
from trainsim.ir.kinds import CollectiveKind as C

pytestmark = pytest.mark.slow


def test_gloo_bench_rows_resume_and_repair(tmp_path):
    path = tmp_path / "comm.jsonl"
    kinds = (C.ALL_REDUCE, C.ALL_TO_ALLV)
    r = run_comm_bench(path, kinds=kinds, sizes_bytes=[4096], warmup=1, iters=3)
    assert (r.samples, r.skipped, r.unsupported) == (2, 0, ())
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert {x["kind"] for x in rows} == {"all_reduce", "all_to_allv"}
    for x in rows:
        assert x["backend"] == "gloo" and x["gpus_per_node"] == 2 and len(x["times_s"]) == 3
        assert x["duration_s"] == sorted(x["times_s"])[1] and x["host"]["versions"]["torch"]
    ds = read_comm_dataset([path])  # the reader of every other dataset reads ours
    assert {k.kind for k in ds.cases()} == {C.ALL_REDUCE, C.ALL_TO_ALLV}

    again = run_comm_bench(
        path, kinds=kinds, sizes_bytes=[4096], warmup=1, iters=3
    )  # resume: nothing to do
    assert (again.samples, again.skipped) == (0, 2)

    with path.open("a") as fh:  # a crash mid-write leaves a torn line; resume cuts it off
        fh.write('{"schema": "trainsim.comm-bench/1", "kind": "all_re')
    again = run_comm_bench(path, kinds=kinds, sizes_bytes=[4096], warmup=1, iters=3)
    assert again.skipped == 2 and path.read_text().endswith("\n")
