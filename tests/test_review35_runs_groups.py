"""``validate search --files my_runs.csv``: two config files that name different models alike
are ranked apart, and a file's groups on several systems say which system each is."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.validate.search_suite import run_search_suite

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def test_same_named_models_from_two_configs_are_not_one_group(tmp_path: Path) -> None:
    yaml = (ROOT / "examples" / "models" / "gpt-1.3b.yaml").read_text(encoding="utf-8")
    assert "hidden: 2048" in yaml
    for folder, text in (("a", yaml), ("b", yaml.replace("hidden: 2048", "hidden: 2560"))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m.yaml").write_text(text, encoding="utf-8")
    runs = tmp_path / "runs.csv"
    runs.write_text("id,model,system,gpus,tp,global_batch,iteration_ms\n"
                    "a1,a/m.yaml,dgx-a100,8,2,64,1000\na2,a/m.yaml,dgx-a100,8,1,64,900\n"
                    "b1,b/m.yaml,dgx-a100,8,2,64,1500\nb2,b/m.yaml,dgx-a100,8,1,64,1400\n"
                    "c1,a/m.yaml,perlmutter,8,2,64,1000\nc2,a/m.yaml,perlmutter,8,1,64,900\n",
                    encoding="utf-8")  # fmt: skip
    doc = run_search_suite(DATA, files=str(runs))
    # one group per (model config, system), two plans each; before, a/ and b/ made one of four
    assert [g["plans"] for g in doc["cases"]] == [2, 2, 2]
    assert [g["model"] for g in doc["cases"]] == [
        "gpt-1.3b (config 1 of 2 so named) on dgx-a100",
        "gpt-1.3b (config 1 of 2 so named) on perlmutter",
        "gpt-1.3b (config 2 of 2 so named) on dgx-a100",
    ]
    assert [g["measured_best_s"] for g in doc["cases"]] == pytest.approx([0.9, 0.9, 1.4])


def test_a_file_of_one_model_and_system_keeps_its_plain_model_name(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    runs.write_text("model,system,gpus,tp,global_batch,iteration_ms\n"
                    "gpt3-1.3b,dgx-a100,8,2,64,1000\ngpt3-1.3b,dgx-a100,8,1,64,900\n", encoding="utf-8")  # fmt: skip
    (g,) = run_search_suite(DATA, files=str(runs))["cases"]
    assert g["model"] == "gpt3-1.3b" and g["plans"] == 2


def test_two_runs_files_of_one_stem_are_two_sets_with_distinct_ids(tmp_path: Path) -> None:
    from trainsim.validate.llm_cases import read_cases

    for folder, ms in (("a", 1000), ("b", 2000)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "runs.csv").write_text(f"model,system,iteration_ms\ngpt3-1.3b,dgx-a100,{ms}\n",
                                                    encoding="utf-8")  # fmt: skip
    cases = read_cases(
        DATA / "ground_truth", [str(tmp_path / "a" / "runs.csv"), str(tmp_path / "b" / "runs.csv")]
    )
    # before, both were "runs:1" in one group "runs"
    assert [(c.id, c.measured_s) for c in cases] == [("runs:1", 1.0), ("runs-2:1", 2.0)]
