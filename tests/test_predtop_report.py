"""``validate predtop``'s printed summary and its option checks (walkthrough and review, 2026-12-02)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from trainsim.errors import ConfigError


def _printed(doc: dict) -> str:
    from trainsim.cli.validate_cmd import _print_predtop_summary

    buf = io.StringIO()
    _print_predtop_summary(Console(file=buf, width=200), doc)
    return buf.getvalue()


def test_targets_whose_cases_did_not_run_are_not_judged():
    # one DAG Transformer case at 10 %: nothing at 30 %, no row with all three models
    doc = {"summary": {"cases": 1, "mape_pct": 12.0, "median_abs_err_pct": 12.0, "max_abs_err_pct": 12.0,
                       "errors_of": "the DAG Transformer's MRE per case", "dag_transformer_wins": 0,
                       "cases_compared": 0, "gpt_dag_transformer_mre_at_30pct": None, "wall_s": 1230.0,
                       "acceptance_mre_at_30pct_le_4": False, "acceptance_wins_ge_75pct": False}}  # fmt: skip
    text = _printed(doc)
    assert "mean 12 %" in text and "20 min" in text and "1.23e+03" not in text  # 1,230 s
    assert "wins: not counted (a row needs all three models" in text
    assert "at 30 % training: gpt" not in text
    assert text.count("not judged (its cases were not run)") == 2 and "not met" not in text


def test_run_targets_are_judged():
    doc = {"summary": {"cases": 2, "mape_pct": 3.0, "median_abs_err_pct": 3.0, "max_abs_err_pct": 3.3,
                       "errors_of": "the DAG Transformer's MRE per case", "dag_transformer_wins": 1,
                       "cases_compared": 2, "gpt_dag_transformer_mre_at_30pct": 3.3, "wall_s": 12.0,
                       "acceptance_mre_at_30pct_le_4": True, "acceptance_wins_ge_75pct": False}}  # fmt: skip
    text = _printed(doc)
    assert "lowest MRE in 1 of 2 rows" in text and "gpt 3.3 %" in text
    assert "≤ 4 % at 30 % training on each family: met" in text and "≥ 75 % of the rows: not met" in text


def test_a_quick_epoch_count_is_refused_beside_a_results_folder(tmp_path):
    """Cases are keyed without the epoch count: a 5-epoch check resumed into a folder would be
    read back as the suite's figures."""
    from trainsim.learn.suite import run_predtop_suite

    with pytest.raises(ConfigError, match="--epochs 5 with --resume would mix a quick check"):
        run_predtop_suite(tmp_path, resume=str(tmp_path / "r"), epochs=5)
    with pytest.raises(ConfigError, match="--epochs 7 with --resume would mix a quick check"):
        run_predtop_suite(tmp_path, resume=str(tmp_path / "r"), epochs=7, protocol=True)
    assert not (tmp_path / "r").exists()
