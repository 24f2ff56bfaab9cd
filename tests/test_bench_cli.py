"""CLI contract of ``trainsim bench``: JSON alone on stdout, resumable, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainsim.bench.dataset import iter_rows

_ENTRY = "from trainsim.cli.main import app_entry; app_entry()"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _ENTRY, "bench", *args],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


@pytest.mark.slow
def test_kernel_suite_json_and_resume(tmp_path):
    path = tmp_path / "k.jsonl"
    args = ("index", "--op", "tril", "--quick", "--threads", "1", "--dataset", str(path),
            "--format", "json", "--no-progress")  # fmt: skip
    p = _cli(*args)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {"dataset", "samples", "device"} <= set(doc)
    rows = list(iter_rows(path))
    assert doc["samples"] == len(rows) == 40 and doc["skipped_existing"] == 0
    assert {r["op"] for r in rows} == {"tril"} and {r["threads"] for r in rows} == {1}
    assert doc["suites"]["index"]["rows"] == 40 and doc["noise_floor"] >= 0

    assert f"benchmarking 40 cases of index on cpu (quick) → {path}" in " ".join(p.stderr.split())
    p = _cli(*args)
    again = json.loads(p.stdout)
    assert (again["samples"], again["skipped_existing"]) == (0, 40)
    assert f"benchmarking 0 of 40 cases of index on cpu (quick) → {path} (40 already in it)" in " ".join(
        p.stderr.split()
    )  # the start line counts what is left, not every case

    # a second measurement of the same cases, half of them twice as slow, one case not in common
    other = tmp_path / "other.jsonl"
    twin = [dict(r, duration_s=r["duration_s"] * (2.0 if i % 2 else 1.0)) for i, r in enumerate(rows)]
    other.write_text("".join(json.dumps(r) + "\n" for r in [*twin, dict(rows[0], key="elsewhere")]))
    cmp = json.loads(_cli(*args, "--compare-with", str(other)).stdout)["compared_with"]
    assert cmp["cases"] == 40 and cmp["max_abs_pct"] == pytest.approx(100.0)
    assert cmp["geomean_abs_pct"] == pytest.approx(100.0 * (2.0**0.5 - 1.0))
    p = _cli(*args[:-3], "--compare-with", str(other))  # the table prints one line about it
    assert p.returncode == 0 and "40 common cases differ by a geometric mean of 41.4 %" in " ".join(p.stderr.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope",), "unknown bench suite"),
        (("comm", "gemm"), "separately"),
        (("index", "--op", "nope"), "their ops"),
        (("gemm", "--device", "tpu"), "cpu or cuda"),
        (("comm", "--compare-with", "k.jsonl"), "--compare-with apply to the kernel suites"),
        (("index", "--compare-with", "/no/such.jsonl"), "no such dataset file"),
        (("index", "--quick", "--density", "3"), "--density applies to full sweeps"),
        (("comm", "--density", "2"), "--density apply to the kernel suites"),
        (("index", "--density", "0"), "--density"),
    ],
)
def test_errors_are_one_line(tmp_path, args, message):
    p = _cli(*args, "--dataset", str(tmp_path / "k.jsonl"), "--no-progress")
    code = 1 if message == "no such dataset file" else 2  # the others are usage errors (the options alone)
    assert p.returncode == code and message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.splitlines()) == 1
    assert p.stdout == ""
