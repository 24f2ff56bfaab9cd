"""``trainsim shard`` messages that read true as printed: infeasible sharders name their tables
with enough digits, the table view shows the whole reason, long rank lists are summarised,
infeasible JSON entries carry every key, and absurd spec sizes are rejected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainsim.builders.dlrm import DLRMSpec, TableSpec, load_dlrm_spec
from trainsim.cli.shard_cmd import _per_rank
from trainsim.errors import ConfigError
from trainsim.search.sharders import SHARDERS, _gbs, greedy, select_sharder

_ENTRY = "from trainsim.cli.main import app_entry; app_entry()"
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "dlrm_tables.json"
CAP = 25.62e9
# 25.6 GB alone, and tables that tip whichever rank holds it over a 25.62 GB cap
BIG = DLRMSpec((TableSpec("huge_ids", 200_000_000, 32, 1.0), TableSpec("small", 100_000, 16, 2.0),
                TableSpec("tip", 1_000_000, 8, 5.0)), batch=4096)  # fmt: skip
# heavy tables placed first by lookup volume, leaving no rank 25.6 GB free
PACKED = DLRMSpec((TableSpec("huge_ids", 200_000_000, 32, 1.0), TableSpec("a", 12_000_000, 64, 30.0),
                   TableSpec("b", 11_000_000, 64, 28.0)), batch=4096)  # fmt: skip


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _ENTRY, "shard", *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("a", "b"), [(25.63e9, 25.62e9), (25.6e9 + 1, 25.6e9), (512_000e9, 84.8e9), (3.1e9, 2.9e9)]
)
def test_gb_strings_keep_different_values_apart(a: float, b: float) -> None:
    x, y = _gbs(a, b)
    assert x != y and float(x.replace(",", "")) > float(y.replace(",", ""))


def test_gb_strings_stay_short_when_they_can() -> None:
    assert _gbs(512_000e9, 84.81e9) == ["512,000", "84.8"]
    assert _gbs(0.256e9, 0.1e9) == ["0.256", "0.1"]


def test_naive_over_the_cap_reads_true_and_names_the_tables() -> None:
    with pytest.raises(ConfigError) as e:
        SHARDERS["naive"](BIG, 2, capacity_bytes=CAP)
    msg = str(e.value)
    assert "rank 0 would hold 25.63 GB" in msg and "over the 25.62 GB cap" in msg
    assert "'huge_ids'" in msg and "'tip'" in msg


def test_greedy_says_why_no_rank_has_room() -> None:
    with pytest.raises(ConfigError) as e:
        SHARDERS["lookup_greedy"](PACKED, 2, capacity_bytes=CAP)
    msg = str(e.value)
    assert "table 'huge_ids' (25.6 GB) fits on no rank under the 25.62 GB cap" in msg
    assert "no rank has 25.6 GB free" in msg and "ranks hold" in msg and "GB of other tables" in msg
    with pytest.raises(ConfigError, match=r"table 'huge_ids' .* it alone is over the cap"):
        SHARDERS["size_greedy"](PACKED, 2, capacity_bytes=20e9)
    # five ranks filled to 0.6 of 1.0 by the first five tables; no names given: the index
    with pytest.raises(
        ConfigError, match=r"table #5 .*most free: 0.4 GB; the emptiest of 5 ranks holds 0.6 GB"
    ):
        greedy([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 5, sizes=[0.6e9] * 5 + [0.5e9], capacity_bytes=1e9)


def test_infeasible_json_entries_carry_every_key() -> None:
    res = select_sharder(BIG, 2, device="h100-sxm5-80gb", system="dgx-h100", capacity_bytes=CAP)
    keys = {
        "name",
        "predicted_step_s",
        "assignment",
        "embedding_load_s",
        "imbalance",
        "provenance",
        "comm",
    }
    feasible = [r for r in res if r["predicted_step_s"] is not None]
    infeasible = [r for r in res if r["predicted_step_s"] is None]
    assert feasible and infeasible
    assert all(keys <= set(r) for r in res)
    assert all(r["error"] and all(r[k] is None for k in keys - {"name"}) for r in infeasible)


def test_table_view_prints_the_whole_reason(tmp_path: Path) -> None:
    f = tmp_path / "big.json"
    f.write_text(json.dumps({"batch": 4096, "tables": [{"name": t.name, "rows": t.rows, "dim": t.dim,
                                                        "pooling": t.pooling} for t in BIG.tables]}))  # fmt: skip
    p = _cli(str(f), "--world", "2", "--system", "dgx-h100", "--capacity-gb", "25.62")
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("infeasible naive"))
    assert line.endswith("over the 25.62 GB cap") and "25.63 GB" in line


@pytest.mark.parametrize(
    ("per", "expected"),
    [
        ([2, 0, 1], "2 0 1"),
        ([1] * 16, " ".join(["1"] * 16)),
        (
            [1] * 26 + [0] * 974,
            "1 1 1 1 1 1 1 1 … (26 of 1000 ranks hold tables, 1 each; 974 empty)",
        ),
        ([3, 0] * 10, "3 0 3 0 3 0 3 0 … (10 of 20 ranks hold tables, 3 each; 10 empty)"),
        ([1, 2] * 10, "1 2 1 2 1 2 1 2 … (20 of 20 ranks hold tables, 1–2 each; 0 empty)"),
    ],
)
def test_long_rank_lists_are_summarised(per: list[int], expected: str) -> None:
    assert _per_rank(per) == expected


def test_world_1000_prints_a_short_cell() -> None:
    p = _cli(str(EXAMPLE), "--world", "1000", "--system", "dgx-h100", "--sharders", "naive")
    assert p.returncode == 0, p.stderr
    assert "26 of 1000 ranks hold tables" in p.stdout and " 0 0 0 0 0 0 0 0 0 0 " not in p.stdout


# --- absurd sizes in the spec -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "suffix", "needle"),
    [
        (
            '{"batch": 64, "tables": [{"rows": 1e30, "dim": 8, "pooling": 1}]}',
            ".json",
            "at most 2**63 - 1, got 1e+30",
        ),
        (
            '{"batch": 64, "tables": [{"rows": 1000000000000000000000000000000, "dim": 8, "pooling": 1}]}',
            ".json",
            "at most 2**63 - 1",
        ),
        (
            '{"batch": 64, "tables": [{"rows": 1e17, "dim": 8, "pooling": 1}]}',
            ".json",
            "not an exact integer",
        ),
        (
            '{"batch": 64, "tables": [{"rows": 10, "dim": 8.5, "pooling": 1}]}',
            ".json",
            "tables[0].dim",
        ),
        (
            "batch: 64\ntables:\n  - {rows: 1.0e+30, dim: 8, pooling: 1}\n",
            ".yaml",
            "tables[0].rows",
        ),
        (
            '{"batch": 1e20, "tables": [{"rows": 10, "dim": 8, "pooling": 1}]}',
            ".json",
            "field batch",
        ),
    ],
)
def test_absurd_sizes_are_one_line_errors_naming_file_and_field(tmp_path: Path, text: str, suffix: str,
                                                                 needle: str) -> None:  # fmt: skip
    f = tmp_path / f"spec{suffix}"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_dlrm_spec(f)
    msg = str(e.value)
    assert str(f) in msg and needle in msg and "\n" not in msg


def test_exact_float_sizes_still_load(tmp_path: Path) -> None:
    f = tmp_path / "spec.json"
    f.write_text('{"batch": 64.0, "tables": [{"rows": 1e6, "dim": 8, "pooling": 1}]}')
    s = load_dlrm_spec(f)
    assert s.batch == 64 and s.tables[0].rows == 1_000_000 and isinstance(s.tables[0].rows, int)
