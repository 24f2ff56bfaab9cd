"""Ground-truth LLM cases (trainsim.validate.llm_cases): counts and fields checked against the
raw CSVs read independently with the csv module; malformed files give one-line errors naming
file, row and column. Tests on the real files skip when ../shared/data is absent."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from trainsim.errors import ConfigError, TraceFormatError
from trainsim.hardware import get_system
from trainsim.validate.llm_cases import (
    FILES,
    ground_truth_files,
    read_cases,
    read_seed001,
    read_vtrain,
)

COUNTS = {"vtrain-multi": 109, "vtrain-single": 1440, "seed001": 10}


@pytest.fixture(scope="module")
def gt(shared_data: Path) -> Path:
    d = shared_data / "ground_truth"
    if not d.is_dir():
        pytest.skip("../shared/data/ground_truth is absent")
    return d


def _raw(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8-sig", newline="") as fh:
        return list(csv.DictReader(fh))


# --- the real files --------------------------------------------------------------------------


@pytest.mark.shared_data
def test_row_counts_and_ids(gt):
    files = ground_truth_files(gt)
    assert set(files) == set(FILES) == set(COUNTS)
    assert len(read_vtrain(files["vtrain-multi"])) == COUNTS["vtrain-multi"]
    assert len(read_vtrain(files["vtrain-single"])) == COUNTS["vtrain-single"]
    assert len(read_seed001(files["seed001"])) == COUNTS["seed001"]
    cases = read_cases(gt, list(FILES))
    assert len(cases) == sum(COUNTS.values())
    assert len({c.id for c in cases}) == len(cases)
    for tag, n in COUNTS.items():
        rows = [c.row for c in cases if c.id.split(":")[0] == tag]
        assert rows == list(range(1, n + 1))
    assert [c.id for c in read_cases(gt.parent, ["seed001"])] == [f"seed001:{i}" for i in range(1, 11)]  # fmt: skip


@pytest.mark.shared_data
@pytest.mark.parametrize("tag", ["vtrain-multi", "vtrain-single"])
def test_vtrain_rows_field_by_field(gt, tag):
    path = gt / FILES[tag]
    raw = _raw(path)
    cases = read_vtrain(path)
    assert len(cases) == len(raw)
    for i in (0, 1, len(raw) // 2, len(raw) - 1):
        r, c = raw[i], cases[i]
        assert c.id == f"{tag}:{i + 1}" and c.row == i + 1 and c.source == str(path)
        m, p = c.model, c.plan
        assert (m.hidden, m.heads, m.layers, m.seq_len) == (
            int(r["hidden size"]), int(r["attention heads"]), int(r["# layers"]), int(r["sequence length"]),
        )  # fmt: skip
        assert (p.tp, p.dp, p.pp, p.micro_batch, p.batch) == (
            int(r["tensor parallelism"]), int(r["data parallelism"]), int(r["pipeline parallelism"]),
            int(r["micro batch"]), int(r["global batch"]),
        )  # fmt: skip
        assert p.gpus == int(r["# GPUs"])
        assert c.measured_s == pytest.approx(float(r["iteration time (ms)"]) / 1000, rel=1e-12)
        assert m.name == f"gpt-{r['hidden size']}h-{r['# layers']}l"
        assert (m.vocab, m.activation, m.norm, m.position, m.bias, m.tied_embeddings) == (
            50257, "gelu", "layernorm", "learned", True, True,
        )  # fmt: skip
        assert (p.recompute, p.dtype, p.attention, p.schedule, p.zero) == ("full", "fp16", "fused", "1f1b", 0)  # fmt: skip
        assert c.system == "vtrain-a100" and c.reference == {}


@pytest.mark.shared_data
def test_vtrain_models_match_the_stated_parameter_counts(gt):
    """The multi-node file states each model's size; tied embeddings reproduce it within 2 %."""
    path = gt / FILES["vtrain-multi"]
    for r, c in zip(_raw(path), read_vtrain(path), strict=True):
        assert c.model.params() / 1e9 == pytest.approx(
            float(r["Parameters (billion)"]), rel=0.02
        ), c.id


@pytest.mark.shared_data
def test_seed001_rows_field_by_field(gt):
    path = gt / FILES["seed001"]
    raw = _raw(path)
    cases = read_seed001(path)
    assert len(cases) == len(raw)
    for i, (r, c) in enumerate(zip(raw, cases, strict=True), 1):
        m, p = c.model, c.plan
        assert c.id == f"seed001:{i}" and c.row == i
        assert m.name == r["model"]
        assert (m.hidden, m.seq_len, m.heads, m.layers, m.vocab) == (
            int(r["hidden"]), int(r["seq_len"]), int(r["heads"]), int(r["layers"]), int(r["vocab_unpadded"]),
        )  # fmt: skip
        assert (m.norm, m.activation) == (r["norm"], r["activation"])
        assert (m.position, m.tied_embeddings, m.bias) == ("rotary", False, True)
        assert (p.pp, p.tp, p.dp, p.gpus) == (
            int(r["pp"]),
            int(r["tp"]),
            int(r["dp"]),
            int(r["num_gpus"]),
        )
        assert (p.micro_batch, p.grad_accum, p.batch) == (
            int(r["micro_batch"]), int(r["grad_accum_steps"]), int(r["global_batch"]),
        )  # fmt: skip
        flash, fused = r["flash_attention"] == "true", r["fused_softmax"] == "true"
        assert p.attention == ("flash" if flash else "fused" if fused else "unfused")
        assert (p.zero, p.dtype, p.recompute, p.schedule) == (int(r["zero_stage"]), r["precision"], "full", "1f1b")  # fmt: skip
        assert p.partition == "001"  # GPT-NeoX's pipeline split, 001 Eq. 3–5
        assert c.system == r["cluster"].lower()
        assert get_system(c.system).gpus_per_node == int(r["gpus_per_node"])
        assert c.measured_s == float(r["min_iteration_s"])
        assert c.reference == {"paper001_error_pct": float(r["paper_predicted_error_pct"])}
    assert [c.plan.attention for c in cases].count("flash") == 2  # the Llemma-7B rows


# --- the catalog system ----------------------------------------------------------------------


def test_vtrain_system():
    s = get_system("vtrain-a100")
    assert s.gpus_per_node == 8 and s.device == "a100-sxm4-80gb"
    assert s.node_tier.bandwidth_per_gpu_GBps == 300  # NVLink 3 link rate (vTrain's 150 is effective)
    assert s.cluster_tier.bandwidth_per_gpu_Bps == pytest.approx(800e9 / 8 / 8)  # 800 Gb/s per node


# --- malformed files (no shared data needed) -------------------------------------------------

V_HEADER = "\ufeff# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"  # fmt: skip
V_ROW = "8,32,4,1024,16,24,1024,2,2,2,219.7"

S_HEADER = "model,hidden,seq_len,heads,layers,vocab_unpadded,pp,tp,dp,num_gpus,micro_batch,grad_accum_steps,global_batch,fused_softmax,flash_attention,norm,activation,zero_stage,optimizer,precision,cluster,gpu,gpus_per_node,min_iteration_s,avg_iteration_s,max_iteration_s,paper_predicted_error_pct"  # fmt: skip
S_ROW = "Llemma-7B,4096,4096,32,32,50257,4,2,2,16,4,8,64,false,true,rmsnorm,gelu,1,FusedAdam,fp16,Perlmutter,A100-SXM4-40GB,4,9.57,9.59,9.63,1.30"  # fmt: skip


def _write(tmp_path: Path, name: str, *lines: str) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _error(fn, path: Path) -> str:
    with pytest.raises(TraceFormatError) as e:
        fn(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_vtrain_tolerates_bom_whitespace_and_blank_lines(tmp_path):
    header = "\ufeff" + ",".join(f" {h} " for h in V_HEADER.lstrip("\ufeff").split(","))
    p = _write(tmp_path, "v.csv", header, "", " " + V_ROW.replace(",", " , "), "", V_ROW)
    cases = read_vtrain(p)
    assert [c.id for c in cases] == ["v:1", "v:2"]
    assert cases[0].plan.gpus == 8 and cases[0].measured_s == pytest.approx(0.2197)


def test_vtrain_missing_column(tmp_path):
    header = V_HEADER.replace(",micro batch", "")
    row = V_ROW.replace(",4,1024", ",1024", 1)
    msg = _error(read_vtrain, _write(tmp_path, "v.csv", header, row))
    assert "missing column 'micro batch'" in msg


def test_vtrain_non_numeric_value(tmp_path):
    bad = V_ROW.replace(",16,24,", ",sixteen,24,")
    msg = _error(read_vtrain, _write(tmp_path, "v.csv", V_HEADER, V_ROW, bad))
    assert "row 2 (line 3), column 'attention heads'" in msg and "'sixteen' is not a number" in msg


def test_vtrain_gpus_mismatch(tmp_path):
    msg = _error(read_vtrain, _write(tmp_path, "v.csv", V_HEADER, "4" + V_ROW[1:]))
    assert "row 1 (line 2), column '# gpus'" in msg and "tp×pp×dp = 2×2×2 = 8" in msg


def test_vtrain_batch_not_divisible(tmp_path):
    msg = _error(
        read_vtrain, _write(tmp_path, "v.csv", V_HEADER, V_ROW.replace("8,32,4", "8,36,4"))
    )
    assert "row 1 (line 2), column 'global batch'" in msg


def test_vtrain_plan_errors_name_the_row(tmp_path):
    # tp 2 does not divide 15 heads (hidden 1020 keeps hidden % heads == 0)
    msg = _error(
        read_vtrain, _write(tmp_path, "v.csv", V_HEADER, V_ROW.replace("1024,16", "1020,15"))
    )
    assert "row 1 (line 2)" in msg and "attention heads" in msg


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ((), "empty file"),
        ((V_HEADER,), "no data rows"),
        ((V_HEADER, V_ROW + ",9"), "row 1 (line 2): 12 fields, header has 11"),
        ((V_HEADER, V_ROW.replace("219.7", "-1")), "column 'iteration time (ms)'"),
        ((V_HEADER, V_ROW.replace("219.7", "")), "empty value"),
        ((V_HEADER, V_ROW.replace("8,32,4", "8,32,2.5")), "'2.5' is not an integer"),
    ],
)
def test_vtrain_malformed(tmp_path, lines, expected):
    p = tmp_path / "v.csv"
    p.write_text("\n".join(lines), encoding="utf-8")
    assert expected in _error(read_vtrain, p)


def test_seed001_reads_a_row(tmp_path):
    (c,) = read_seed001(_write(tmp_path, "s.csv", S_HEADER, S_ROW))
    assert c.id == "seed001:1" and c.system == "perlmutter" and c.plan.attention == "flash"
    assert c.plan.grad_accum == 8 and c.reference == {"paper001_error_pct": 1.30}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (",false,true,", ",nope,true,", "column 'fused_softmax': 'nope' is not a boolean"),
        (
            ",Perlmutter,",
            ",Frontier,",
            "column 'cluster': 'frontier' is not one of perlmutter, vista",
        ),
        (",16,4,8,64,", ",32,4,8,64,", "column 'num_gpus'"),
        (",16,4,8,64,", ",16,4,8,96,", "column 'global_batch'"),
        (",A100-SXM4-40GB,4,", ",A100-SXM4-40GB,8,", "column 'gpus_per_node'"),
        (",rmsnorm,", ",batchnorm,", "column 'norm'"),
        (",9.57,", ",x,", "column 'min_iteration_s'"),
    ],
)
def test_seed001_malformed(tmp_path, old, new, expected):
    assert old in S_ROW
    msg = _error(read_seed001, _write(tmp_path, "s.csv", S_HEADER, S_ROW.replace(old, new, 1)))
    assert "row 1 (line 2)" in msg and expected in msg


def test_ground_truth_lookup_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        ground_truth_files(tmp_path / "nowhere")
    _write(tmp_path, FILES["seed001"], S_HEADER, S_ROW)
    with pytest.raises(ConfigError, match=re.escape(FILES["vtrain-multi"])):
        ground_truth_files(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown ground-truth tag.*vtrain-multi"):
        read_cases(tmp_path, ["vtrain"])
    assert [c.id for c in read_cases(tmp_path, ["seed001"])] == ["seed001:1"]
    with pytest.raises(ConfigError, match="no ground-truth tag given"):
        read_cases(tmp_path, [])
