"""Readers of collective measurements, on the published files and on broken copies of them."""

from __future__ import annotations

import pytest

from trainsim.comm import read_comm_dataset, read_seed001_errors
from trainsim.comm.readers import read_nccl_tests, sniff_format
from trainsim.errors import TraceFormatError
from trainsim.ir.kinds import CollectiveKind as C

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def azure(shared_data):
    return shared_data / "comm" / "nccl_tests_allreduce_a100_40gb_azure"


def test_azure_logs_ranks_hosts_and_collective(azure):
    ds = read_comm_dataset([azure])
    assert ds.device == "A100-SXM4-40GB" and ds.formats == {"nccl-tests"}
    layout = {(k.nodes, k.gpus_per_node) for k in ds.cases()}
    # 1..8 GPUs in one node; 16..128 GPUs 8 per node. The 128-rank log splices MPI tags into
    # host names ("node-[1,0]<stdout>:00000C") and has CRLF line ends: still 16 hosts.
    assert layout == {(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8), (16, 8)}
    assert {k.kind for k in ds.cases()} == {
        C.ALL_REDUCE
    }  # from busbw/algbw = 2(n-1)/n; 1 GPU from its siblings
    m, t = ds.arrays(next(k for k in ds.cases() if k.group_size == 16))
    assert m.size == 25 and m[0] == 1024 and m[-1] == 16 * 2**30
    assert t[-1] == pytest.approx(250681e-6)  # min(out-of-place 251757, in-place 250681) us


def test_out_of_place_timing_and_one_rank(azure):
    got = read_nccl_tests(azure / "nccl_128.log", timing="out-of-place")
    assert got.samples[0].duration_s == pytest.approx(
        1242.3e-6
    )  # the warm-up outlier is kept as measured
    one = read_nccl_tests(
        azure / "nccl_1.log", kind=C.ALL_REDUCE
    )  # in-place with 1 rank is a no-op: out-of-place kept
    assert one.samples[0].duration_s == pytest.approx(4.47e-6)


def test_single_one_rank_log_cannot_tell_its_collective(azure):
    with pytest.raises(TraceFormatError, match="kind="):
        read_comm_dataset([azure / "nccl_1.log"])


def test_seed001_csvs(shared_data):
    ds = read_comm_dataset([shared_data / "calibration" / "gh200-120gb_vista" / "nccl"])
    assert ds.device == "NVIDIAGH200120GB"
    assert {k.label for k in ds.cases()} == {"all_gather 2x1", "all_gather 4x1", "all_gather 8x1", "all_reduce 2x1",
                                            "all_reduce 4x1", "all_reduce 8x1", "send 2x1"}  # fmt: skip
    key = next(k for k in ds.cases() if k.label == "all_reduce 2x1")
    assert ds.series_of(key) == ["allreduce", "allreduce_large"]
    m, t = ds.arrays(key, "allreduce")
    assert m[0] == 20971520 * 2 and t[0] == pytest.approx(
        1020.6648e-6
    )  # shape counts fp16 elements


def test_seed001_error_table_holds_fractions(shared_data):
    rows = read_seed001_errors(
        shared_data
        / "calibration"
        / "a100-sxm4-80gb_perlmutter"
        / "nccl"
        / "NVIDIAA100-SXM4-80GB.csv"
    )
    worst = {(e.series, e.nodes, e.gpus_per_node): e.error_pct for e in rows}
    assert worst[("allgather_large", 1, 4)] == pytest.approx(76.767, abs=1e-3)  # README: "76.8 %"


def test_vtrain_lut_in_nanoseconds(shared_data):
    ds = read_comm_dataset(
        [shared_data / "comm" / "vtrain_allreduce_lut_a100" / "AR_GPU8_1M_1024M_LUT"]
    )
    (key,) = ds.cases()
    assert (key.kind, key.nodes, key.gpus_per_node) == (C.ALL_REDUCE, 1, 8)
    m, t = ds.arrays(key)
    assert m.size == 1024 and m[0] == 2**20 and t.max() < 0.1  # ns became seconds


def _broken_copy(src, tmp_path, old, new):
    f = tmp_path / src.name
    f.write_text(src.read_text().replace(old, new, 1))
    return f


def test_bad_nccl_row_names_file_and_line(azure, tmp_path):
    f = _broken_copy(azure / "nccl_2.log", tmp_path, "     float     sum ", "     float     sum x")
    with pytest.raises(TraceFormatError, match=r"nccl_2\.log: line \d+: cannot read"):
        read_comm_dataset([f])


def test_bad_seed001_row_names_line(shared_data, tmp_path):
    src = (
        shared_data
        / "calibration"
        / "gh200-120gb_vista"
        / "nccl"
        / "NVIDIAGH200120GB_p2p_fp16_2_1.csv"
    )
    f = _broken_copy(src, tmp_path, "2097152,2,1,98.4958", "2097152,2,one,98.4958")
    with pytest.raises(TraceFormatError, match="line 2: expected 4 numbers"):
        read_comm_dataset([f])


def test_unknown_file_named_explicitly_is_an_error(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello\n")
    assert sniff_format(f) is None
    with pytest.raises(TraceFormatError, match="not a known collective-benchmark format"):
        read_comm_dataset([f])
    with pytest.raises(TraceFormatError, match="no such file"):
        read_comm_dataset([tmp_path / "missing.log"])


def test_two_systems_are_not_pooled_into_one_dataset(shared_data, tmp_path):
    """Review 2026-11-27: vTrain's A100 and V100 tables (and the Azure logs) were fitted as one
    system, a 1x2 all-reduce pooling 2,076 rows from three setups. Two folders measuring one case
    need one stated device; stated devices must agree; one folder pools its own files."""
    comm = shared_data / "comm"
    with pytest.raises(TraceFormatError, match=r"all_reduce 1x2 is measured in .*vtrain_allreduce_lut_a100 too"):
        read_comm_dataset([comm / "vtrain_allreduce_lut_a100", comm / "vtrain_allreduce_lut_v100"])
    with pytest.raises(TraceFormatError, match="fit one system"):
        read_comm_dataset([comm])
    assert len(read_comm_dataset([comm / "vtrain_allreduce_lut_a100"]).cases()) == 7
    # the same log copied into another folder names the same device: pooled
    log = comm / "nccl_tests_allreduce_a100_40gb_azure" / "nccl_8.log"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "nccl_8.log").write_bytes(log.read_bytes())
    both = read_comm_dataset([log, tmp_path / "a" / "nccl_8.log"])
    assert len(both.samples) == 2 * len(read_comm_dataset([log]).samples)
    # ... but not when it claims another GPU
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "nccl_8.log").write_text(log.read_text().replace("A100-SXM4-40GB", "H100 80GB HBM3"))
    with pytest.raises(TraceFormatError, match=r"measured on .*H100.* but other inputs on A100-SXM4-40GB"):
        read_comm_dataset([log, tmp_path / "b" / "nccl_8.log"])


def test_a_log_cut_at_a_row_boundary_is_refused_as_truncated(azure, tmp_path):
    """A log that ends on a whole row before its header's maxBytes, without nccl-tests' summary,
    is truncated: fitting it would carry 512 KiB of measurements to gigabytes (walkthrough)."""
    lines = (azure / "nccl_8.log").read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.log"
    cut.write_text("".join(lines[:30]))
    with pytest.raises(TraceFormatError, match=r"before its header's maxBytes 1,073,741,824.*truncated"):
        read_nccl_tests(cut, kind=C.ALL_REDUCE)
    # the whole log, and one whose summary line alone was dropped, still read
    assert read_nccl_tests(azure / "nccl_8.log").samples
    whole = tmp_path / "no_summary.log"
    whole.write_text("".join(x for x in lines if "Avg bus bandwidth" not in x))
    assert len(read_nccl_tests(whole).samples) == len(read_nccl_tests(azure / "nccl_8.log").samples)


def _doctored(azure, out, *, redop, bus_factor):
    """The 8-rank all-reduce log made to read as another collective's: its redop column and
    busbw = algbw · bus_factor, without its 'Collective test starting' line."""
    lines = []
    for line in (azure / "nccl_8.log").read_text(encoding="utf-8").splitlines():
        if "Collective test starting" in line:
            continue
        t = line.split()
        if t and t[0].isdigit() and len(t) >= 11:
            t[3], t[6], t[10] = redop, f"{float(t[5]) * bus_factor:.2f}", f"{float(t[9]) * bus_factor:.2f}"
            lines.append("  " + " ".join(t))
        else:
            lines.append(line)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def _as_all_gather(azure, out):
    """What an all_gather_perf log without its starting line prints: redop none, factor 7/8."""
    return _doctored(azure, out, redop="none", bus_factor=7 / 8)


def test_the_file_name_names_a_collective_the_log_leaves_open(azure, tmp_path):
    """The docs and the error said the file name is read; it was not (walkthrough, 2026-12-02).
    It decides what the bus-bandwidth factor leaves open (all_gather and all_to_all share it)."""
    named = _as_all_gather(azure, tmp_path / "all_gather_perf_8.log")
    assert {s.kind for s in read_comm_dataset([named]).samples} == {C.ALL_GATHER}
    with pytest.raises(TraceFormatError, match="cannot tell which collective"):
        read_comm_dataset([_as_all_gather(azure, tmp_path / "mystery_8.log")])


def test_a_kind_that_contradicts_the_logs_redop_is_refused(azure):
    """Over 2 ranks all-reduce's and broadcast's bus factors are both 1: --kind broadcast was
    accepted for an all-reduce log; its redop (sum) says it reduces."""
    with pytest.raises(TraceFormatError, match=r"--kind broadcast contradicts the log: it reduces \(redop sum\)"):
        read_comm_dataset([azure / "nccl_2.log"], kind=C.BROADCAST)


def _with_factor_one(azure, out, redop):
    """The 8-rank log with busbw = algbw (a factor-1 collective's) and the given redop."""
    return _doctored(azure, out, redop=redop, bus_factor=1.0)


def test_a_factor_of_one_is_read_with_the_redop_and_the_file_name(azure, tmp_path):
    """A factor of 1 was read as broadcast whatever the redop: a reduce_perf log became a
    broadcast (review, 2026-12-02). An op leaves it open: the name decides, else it is asked."""
    kinds = lambda p, **kw: {s.kind for s in read_comm_dataset([p], **kw).samples}  # noqa: E731
    assert kinds(_with_factor_one(azure, tmp_path / "a_8.log", "none")) == {C.BROADCAST}
    assert kinds(_with_factor_one(azure, tmp_path / "reduce_perf_8.log", "sum")) == {C.REDUCE}
    with pytest.raises(TraceFormatError, match="cannot tell which collective"):
        read_comm_dataset([_with_factor_one(azure, tmp_path / "b_8.log", "sum")])
    # sendrecv_perf prints its op in the redop column: --kind send is no contradiction
    assert kinds(_with_factor_one(azure, tmp_path / "c_8.log", "sum"), kind=C.SEND) == {C.SEND}


def test_a_log_that_leaves_its_collective_open_takes_its_siblings_unchecked(azure, tmp_path):
    """The deferred read passed the siblings' kind as if it were --kind, so its checks blamed a
    flag nobody gave."""
    folder = tmp_path / "logs"
    folder.mkdir()
    for n in ("nccl_2.log", "nccl_8.log"):
        (folder / n).write_bytes((azure / n).read_bytes())
    assert {s.kind for s in read_comm_dataset([folder]).samples} == {C.ALL_REDUCE}
