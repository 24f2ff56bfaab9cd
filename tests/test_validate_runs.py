"""``trainsim validate llm --files my_runs.csv``: a user's own measured iterations as cases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.errors import TraceFormatError
from trainsim.validate.llm_cases import (
    RUN_BOOL_FIELDS,
    RUN_CHOICE_FIELDS,
    RUN_FLOAT_FIELDS,
    RUN_INT_FIELDS,
    read_cases,
    read_runs,
)  # fmt: skip
from trainsim.validate.llm_suite import run_llm_suite

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _csv(tmp_path: Path, text: str, name: str = "my_runs.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_every_plan_field_can_be_given() -> None:
    """A Plan field added later must be readable from a runs CSV too."""
    readable = {*RUN_INT_FIELDS, *RUN_BOOL_FIELDS, *RUN_FLOAT_FIELDS, *RUN_CHOICE_FIELDS}
    assert readable == {f.name for f in dataclasses.fields(Plan)}


def test_rows_become_cases_with_predicts_defaults(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    yaml_src = Path(__file__).resolve().parents[1] / "src/trainsim/hardware/data/system_azure_nd_a100_v4.yaml"
    (tmp_path / "sys" / "mine.yaml").write_text(yaml_src.read_text(encoding="utf-8"), encoding="utf-8")
    p = _csv(tmp_path, "id,model,system,gpus,tp,micro_batch,global_batch,recompute,sp,iteration_ms\n"
                       "base,llama2-7b,dgx-a100,8,2,1,64,selective,true,9000\n"
                       ",llama2-7b,sys/mine.yaml,16,,,,,,12000\n")  # fmt: skip
    a, b = read_runs(p)
    assert a.id == "my_runs:base" and a.measured_s == 9.0 and a.system == "dgx-a100"
    assert a.plan == Plan(tp=2, dp=4, micro_batch=1, global_batch=64, recompute="selective", sp=True)
    assert b.id == "my_runs:2" and b.plan == Plan(dp=16) and b.system == str(tmp_path / "sys" / "mine.yaml")
    # the suite predicts them as predict does
    doc = run_llm_suite(DATA, files=str(p))
    got = {c["id"]: c for c in doc["cases"]}
    expect = predict_llm(a.model, a.plan, "dgx-a100").iteration_time_s
    assert got["my_runs:base"]["predicted_s"] == pytest.approx(expect, rel=1e-12)
    assert got["my_runs:base"]["err_pct"] == pytest.approx(100 * (expect - 9.0) / 9.0)
    assert set(doc["groups"]) == {"my_runs"} and doc["groups"]["my_runs"]["target_mape_pct"] is None


def test_a_runs_file_beside_the_shipped_sets_and_a_stem_that_is_a_tag(tmp_path: Path) -> None:
    p = _csv(tmp_path, "model,system,iteration_s\ngpt2,dgx-a100,0.5\n", name="seed001.csv")
    cases = read_cases(DATA / "ground_truth", ["h100-gpt2", str(p)])
    assert cases[-1].id == "runs-seed001:1"  # not mixed into the shipped set's group


@pytest.mark.parametrize(("text", "message"), [
    ("model,system,tpp,iteration_ms\nllama2-7b,dgx-a100,1,9\n", "line 1: unknown column 'tpp'"),
    ("model,system,gpus\nllama2-7b,dgx-a100,8\n", "as one column, iteration_ms or iteration_s (found neither)"),
    ("model,system,iteration_ms,iteration_s\nllama2-7b,dgx-a100,9,9\n", "found iteration_ms, iteration_s"),
    ("model,system,gpus,tp,iteration_ms\nllama2-7b,dgx-a100,8,3,9\n", "column 'gpus': 8 GPUs is not a multiple of tp×cp×pp = 3"),
    ("model,system,iteration_ms\nllama9-7b,dgx-a100,9\n", "row 1 (line 2): unknown model 'llama9-7b'"),
    ("model,system,iteration_ms\nllama2-7b,nosuch,9\n", "row 1 (line 2): unknown system"),
    ("model,system,recompute,iteration_ms\nllama2-7b,dgx-a100,some,9\n", "column 'recompute': 'some' is not one of"),
    ("model,system,iteration_ms\nllama2-7b,dgx-a100,-9\n", "column 'iteration_ms': '-9' is not a positive"),
    ("model,system,tp,iteration_ms\nllama2-7b,dgx-a100,3,9\n", "tp 3 does not divide llama2-7b's 32 attention heads"),
    ("id,model,system,iteration_ms\nx,llama2-7b,dgx-a100,9\nx,llama2-7b,dgx-a100,9\n", "row 2 (line 3), column 'id': id 'x' is row 1's too"),
])  # fmt: skip
def test_a_bad_row_names_its_file_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    p = _csv(tmp_path, text)
    with pytest.raises(TraceFormatError) as e:
        read_runs(p)
    assert str(e.value).startswith(str(p)) and message in str(e.value)


def test_validate_search_ranks_the_runs_of_one_model_gpus_batch_and_system(tmp_path: Path) -> None:
    from trainsim.validate.search_suite import run_search_suite

    p = _csv(tmp_path, "model,system,gpus,tp,pp,micro_batch,global_batch,iteration_s\n"
                       "llama2-7b,dgx-a100,16,1,1,1,64,9.0\n"
                       "llama2-7b,dgx-a100,16,2,1,2,64,8.0\n"
                       "llama2-7b,dgx-a100,16,4,1,4,64,11.0\n"
                       "llama2-7b,dgx-h100,16,2,1,2,64,4.0\n")  # another cluster: not in the group  # fmt: skip
    doc = run_search_suite(DATA, files=str(p))
    (g,) = doc["cases"]
    assert g["file"] == "my_runs" and g["plans"] == 3 and g["measured_best_s"] == 8.0
    assert g["spearman"] is not None
