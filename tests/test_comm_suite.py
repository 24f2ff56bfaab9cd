"""The comm validation suite on the shared data: acceptance figures as a table of tolerances."""

from __future__ import annotations

import pytest

from trainsim.validate.comm_suite import run_comm_suite

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def suite(shared_data):
    return run_comm_suite(shared_data)


def test_shape(suite):
    assert suite["suite"] == "comm"
    assert {"median_abs_err_pct", "mape_pct", "max_abs_err_pct"} <= set(suite["summary"])
    groups = {c["group"] for c in suite["cases"]}
    assert groups == {"azure-heldout", "azure-extrapolation", "seed001", "vtrain"}
    usable = [c for c in suite["cases"] if "unusable" not in c]
    assert all(c["points"] > 0 and c["abs_err_pct"] >= 0 for c in usable)
    # only paper 001's GH200 all_gather 8x1 sweep is unusable: every row beats the links
    assert [c["name"] for c in suite["cases"] if "unusable" in c] == ["NVIDIAGH200120GB allgather_large 8x1"]


# (summary key, bound %): the acceptance figures, pooled over the cases of each group.
ACCEPTANCE = [
    ("azure_heldout_gmae_ge64KiB_pct", 5.0),
    ("azure_heldout_gmae_pct", 10.0),
    ("azure_extrapolation_gmae_pct", 10.0),
]


@pytest.mark.parametrize(("key", "bound"), ACCEPTANCE)
def test_acceptance(suite, key, bound):
    assert suite["summary"][key] <= bound


def test_seed001_cases_beside_the_paper(suite):
    cases = [c for c in suite["cases"] if c["group"] == "seed001"]
    assert len(cases) == 31 and all(c["paper_error_pct"] is not None for c in cases)
    # Known exception (docs/communication.md): A100 all_gather 1x4, whose timings scatter by 10x
    # at one size. GH200 all_gather 8x1 is unusable (every row faster than the links allow,
    # once the gathered output is counted as group size x shard). Everything else is under 10 %.
    over = set(suite["summary"]["seed001_cases_over_10pct"])
    assert over <= {"NVIDIAA100-SXM4-80GB allgather_large 1x4"}
    cases = [c for c in cases if "unusable" not in c]
    beaten = [c for c in cases if c["mape_pct"] <= (c["paper_error_pct"] or 0) or c["mape_pct"] < 2]
    assert len(beaten) >= 20
    # the family is chosen on the training rows only (inner split), never on the test rows
    assert all(c["family"] in c["inner_heldout_pct"] for c in cases)
    assert all(c["inner_heldout_pct"][c["family"]] <= min(c["inner_heldout_pct"].values()) for c in cases)
    # the 1x4 sweep's contended rows: no function of size gets near 10 %, but the monotone
    # regressor beats the piecewise curve and the paper's forest (76.8 %)
    ag = next(c for c in cases if c["name"] == "NVIDIAA100-SXM4-80GB allgather_large 1x4")
    assert ag["family"] == "monotone" and ag["mape_pct"] < min(70.0, ag["piecewise_mape_pct"], 100 * 0.7677)
    # and the data's own scatter says why: the median of each held-out size's five nearest
    # training sizes errs by more than our curve does
    assert ag["neighbour_mape_pct"] > 50 and ag["mape_pct"] < ag["neighbour_mape_pct"]
    assert suite["summary"]["seed001_cases_over_10pct_noise_floor_over_10pct"] == [ag["name"]]


def test_neighbour_median_is_the_local_scatter():
    import numpy as np

    from trainsim.validate.comm_suite import _neighbour_median

    m = np.array([1.0, 2, 4, 8, 16, 32, 64])
    t = np.array([10.0, 11, 12, 100, 13, 14, 15])  # one outlier among smooth neighbours
    # 8 → its neighbours 2, 4, 16, 32 (and itself when trained): the median ignores the outlier
    assert _neighbour_median(np.delete(m, 3), np.delete(t, 3), np.array([8.0]), k=4)[0] == pytest.approx(12.5)
    assert _neighbour_median(m, t, np.array([1.0]), k=1)[0] == 10.0
    assert _neighbour_median(m[:2], t[:2], np.array([64.0]), k=5)[0] == pytest.approx(10.5)  # k > rows


def test_the_table_prints_paper_001_beside_ours(suite, capsys):
    # the generic table takes the first case's columns (Azure's), which have no paper error:
    # paper 001's sweeps get their own table, ours beside the paper's and the neighbours'
    from trainsim.cli.validate_cmd import _print_table

    _print_table(suite)
    out = capsys.readouterr().out
    assert "paper 001's NCCL sweeps" in out and "neighbours' median" in out
    paper_table = out[out.index("paper 001's NCCL sweeps"):]
    row = next(line for line in paper_table.splitlines() if "NVIDIAA100-SXM4-80GB allgather_large 1x4" in line)
    assert "58.9" in row and "76.8" in row and "80.2" in row
