"""Session-31 walkthrough findings (capture / analyze / replay): each with the case it broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.errors import ConfigError

DLRM = "examples/data/param_dlrm_8xv100"


def test_two_outputs_at_one_path_are_refused(tmp_path: Path) -> None:
    """analyze printed "wrote overhead_db" and "wrote kernel_samples" for one path; only the
    CSV survived."""
    from trainsim.cli.output import distinct_outputs

    x = tmp_path / "x.csv"
    with pytest.raises(ConfigError, match=r"^--export-kernels .*x\.csv: the same file as --overhead-db; "):
        distinct_outputs(((x, "--overhead-db"), (None, "--save-workload"), (x, "--export-kernels")))
    distinct_outputs(((x, "--overhead-db"), (tmp_path / "y.csv", "--export-kernels")))


def test_save_workload_replaces_only_a_file_trainsim_wrote(tmp_path: Path) -> None:
    """--save-workload overwrote any file silently (while --timeline refused a foreign one)."""
    import subprocess
    import sys

    def analyze(out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainsim", "analyze", DLRM, "--save-workload", str(out)],
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip

    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "data"}', encoding="utf-8")
    r = analyze(mine)
    assert r.returncode == 1 and "exists and is not a file trainsim wrote" in r.stderr
    assert mine.read_text(encoding="utf-8") == '{"my": "data"}'
    ir = tmp_path / "w.json"
    for _ in range(2):  # a workload trainsim wrote is replaced
        r = analyze(ir)
        assert r.returncode == 0, r.stderr
