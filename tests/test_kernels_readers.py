"""Readers of kernel measurements: paper 001's operator CSVs and error tables, our own format."""

from __future__ import annotations

import csv
import json

import pytest

from trainsim.errors import TraceFormatError
from trainsim.ir.kinds import KernelFamily as F
from trainsim.kernels import Phase, read_kernel_dataset, read_seed001_errors, write_kernel_dataset
from trainsim.kernels.readers import SCHEMA

A100 = "calibration/a100-sxm4-80gb_perlmutter/operator"
GH200 = "calibration/gh200-120gb_vista/operator"


@pytest.mark.shared_data
def test_seed001_operator_csv(shared_data):
    path = shared_data / A100 / "NVIDIAA100-SXM4-80GB_linear1_fp16.csv"
    ds = read_kernel_dataset([path])
    rows = list(csv.reader(path.open()))[1:]
    assert len(ds) == 2 * len(rows) == 2 * 1755  # one sample per phase
    first = [s for s in ds if s.origin.endswith(":2")]
    fwd = next(s for s in first if s.key.phase is Phase.FWD)
    bwd = next(s for s in first if s.key.phase is Phase.BWD)
    assert fwd.features == {"mp": 1.0, "b": 2.0, "l": 1024.0, "dim": 5632.0}
    assert fwd.duration_s == pytest.approx(1728.8e-6) and bwd.duration_s == pytest.approx(3552.4e-6)
    assert fwd.family is F.GEMM and fwd.key.dtype == "fp16" and ds.device == "NVIDIAA100-SXM4-80GB"


@pytest.mark.shared_data
@pytest.mark.parametrize("folder", [A100, GH200])
def test_every_operator_file_is_read(shared_data, folder):
    ds = read_kernel_dataset([shared_data / folder])
    files = list((shared_data / folder).glob("*_fp16.csv"))
    expected = 0
    for p in files:
        header, *rows = list(csv.reader(p.open()))
        expected += len(rows) * sum(h.endswith("dur(us)") or h == "dur" for h in header)
    assert len(ds) == expected
    fams = {s.key.op: s.family for s in ds}
    assert (
        fams["flash_atten"] is F.ATTENTION
        and fams["layernorm"] is F.NORM
        and fams["gelu"] is F.ELEMENTWISE
    )
    assert {s.family for s in ds if s.key.op == "embedding"} == {F.EMBEDDING_FWD, F.EMBEDDING_BWD}
    assert {s.key.phase for s in ds if s.key.op.endswith("optimizer")} == {Phase.STEP}


@pytest.mark.shared_data
def test_paper_error_table(shared_data):
    errs = {
        (e.op, e.phase): e
        for e in read_seed001_errors(shared_data / A100 / "NVIDIAA100-SXM4-80GB.csv")
    }
    assert len(errs) == 39
    fa = errs[("flash_atten", Phase.FWD)]
    assert fa.model == "xgboost" and fa.error_pct == pytest.approx(11.866712, rel=1e-6)
    assert errs[("firstStage_optimizer", Phase.STEP)].model == "xgboost"


@pytest.mark.shared_data
def test_our_format_round_trip(shared_data, tmp_path):
    ds = read_kernel_dataset([shared_data / A100 / "NVIDIAA100-SXM4-80GB_layernorm_fp16.csv"])
    ds.fingerprint = "abc123"
    out = write_kernel_dataset(ds, tmp_path / "ln.jsonl")
    first = json.loads(out.read_text().splitlines()[0])
    assert (
        first["schema"] == SCHEMA
        and first["op"] == "layernorm"
        and first["fingerprint"] == "abc123"
    )
    back = read_kernel_dataset([out])
    assert (
        back.formats == {"kernel-jsonl"}
        and back.device == ds.device
        and back.fingerprint == "abc123"
    )
    assert [(s.key, s.features, s.duration_s, s.family) for s in back] == [
        (s.key, s.features, s.duration_s, s.family) for s in ds
    ]


def test_our_csv_format(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("device,op,phase,dtype,duration_s,m,n,k\nH100,gemm,fwd,bf16,1e-4,4096,4096,4096\n")
    ds = read_kernel_dataset([p])
    (s,) = ds.samples
    assert (
        s.family is F.GEMM
        and s.key.dtype == "bf16"
        and s.features == {"m": 4096.0, "n": 4096.0, "k": 4096.0}
    )


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (
            {
                "op": "gemm",
                "phase": "fwd",
                "features": {"m": 1, "n": 1, "k": 1, "q": 2},
                "duration_s": 1e-5,
            },
            "no input",
        ),
        (
            {
                "op": "gemm",
                "phase": "fwd",
                "features": {"m": 1, "n": 1, "k": 1},
                "duration_s": -1.0,
            },
            "positive",
        ),
        (
            {
                "op": "gemm",
                "phase": "fwd",
                "family": "norm",
                "features": {"m": 1},
                "duration_s": 1e-5,
            },
            "belongs to family",
        ),
        (
            {"op": "nosuchop", "phase": "fwd", "features": {}, "duration_s": 1e-5},
            "unknown operator",
        ),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, line, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"schema": SCHEMA, **line}) + "\n")
    with pytest.raises(TraceFormatError, match=match) as e:
        read_kernel_dataset([p])
    assert "bad.jsonl" in str(e.value) and "line 1" in str(e.value)


def test_unknown_file_named_explicitly_is_an_error(tmp_path):
    p = tmp_path / "notes.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="not a known kernel-measurement format"):
        read_kernel_dataset([p])


def test_a_renamed_duration_column_is_named_in_the_header(tmp_path):
    """A paper-001 operator CSV whose F_dur(us) was renamed: the error names the header column
    (it named a data line and called the column an input)."""
    from trainsim.errors import TraceFormatError
    from trainsim.kernels import read_kernel_dataset

    p = tmp_path / "NVIDIAA100-SXM4-80GB_gelu_fp16.csv"
    p.write_text("mp,b,l,dim,Fdur,B_dur(us)\n1,2,1024,2048,10.0,20.0\n")
    with pytest.raises(TraceFormatError, match=r"line 1: header column\(s\) 'Fdur' are neither inputs of gelu"):
        read_kernel_dataset([p])
