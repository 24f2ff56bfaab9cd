"""Review 39, a new user's walkthrough of that day's features (helper ux39).

* an output that is the command's own stdout (``--timeline /dev/stdout``, ``--save-workload
  /dev/stdout``) is refused in one line before the work: the table or JSON goes there too
  (into a pipe, ``--format json`` printed the timeline and the prediction as two JSON documents
  one after the other; under ``> t.json`` the timeline was refused as 'not a timeline trainsim
  wrote', which does not say why); ``/dev/null`` under ``> /dev/null`` still passes;
* predict's table says where the activations come from (``provenance.activations``: the
  measured census of transformers' modules under ``--impl hf``, Korthikanti's formula
  otherwise), as the JSON did alone;
* under ``--impl hf`` a sliding-window layer's census part (SDPA's additive mask, growing with
  s², while the time is FlashAttention's windowed kernel) is stated in a note, and notes are
  printed as text, not rich markup (a ``[b, 1, s, s]`` in a note vanished);
* the expert-GEMM note says "the one local expert" at one expert a rank.
Real processes, real pipes and files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import expert_gemms_note

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT / "examples" / "data" / "param_dlrm_8xv100"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
PREDICT = ["predict", "llama2-7b", "--gpus", "8", "--tp", "2", "--global-batch", "16"]


def _trainsim(args: list[str], stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], stdout=stdout, stderr=subprocess.PIPE,
                          env=ENV, timeout=300, check=False)  # fmt: skip


def _one_line_error(r: subprocess.CompletedProcess[bytes]) -> str:
    err = r.stderr.decode()
    assert r.returncode == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainsim: error:"), err
    return lines[0]


def test_timeline_into_stdout_redirected_to_a_file_says_why(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    with out.open("wb") as f:
        r = _trainsim([*PREDICT, "--timeline", "/dev/stdout"], stdout=f)
    assert "is this command's stdout" in _one_line_error(r)
    assert out.read_bytes() == b""


def test_timeline_into_stdout_pipe_with_json_is_refused_not_two_documents() -> None:
    r = _trainsim([*PREDICT, "--timeline", "/dev/stdout", "--format", "json"])
    assert "is this command's stdout" in _one_line_error(r)
    assert r.stdout == b""


def test_save_workload_into_stdout_is_refused() -> None:
    r = _trainsim(["analyze", str(DLRM), "--save-workload", "/dev/stdout", "--format", "json"])
    assert "--save-workload /dev/stdout: is this command's stdout" in _one_line_error(r)


def test_timeline_into_dev_null_under_dev_null_still_runs() -> None:
    r = _trainsim([*PREDICT, "--timeline", "/dev/null"], stdout=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr.decode()


def test_predict_table_states_where_the_activations_come_from() -> None:
    hf = [*PREDICT[:2], "--system", "dgx-h100", "--gpus", "8", "--impl", "hf", "--zero", "3", "--recompute", "full"]
    table = _trainsim(hf)
    assert table.returncode == 0, table.stderr.decode()
    row = next(ln for ln in table.stdout.decode().splitlines() if "activations from" in ln)
    assert "measured census of transformers' modules (llama, checkpointed; CPU)" in row
    doc = json.loads(_trainsim([*hf, "--format", "json"]).stdout)
    assert doc["provenance"]["activations"].startswith("hf-activation-census:llama:checkpointed")
    fused = _trainsim(PREDICT).stdout.decode()
    assert "Korthikanti et al. 2022's formula (Megatron's fused kernels)" in fused


def test_hf_window_memory_note_is_printed_with_its_brackets() -> None:
    r = _trainsim(["predict", "gemma3-12b", "--system", "dgx-h100", "--gpus", "1", "--impl", "hf",
                   "--seq-len", "8192", "--global-batch", "1"])  # fmt: skip
    assert r.returncode == 0, r.stderr.decode()
    note = next(ln for ln in r.stderr.decode().splitlines() if ln.startswith("note: --impl hf memory"))
    assert "keeps 0.19 GiB a micro-batch more than a full one" in note
    assert "the additive [b, 1, s, s] mask" in note
    # at the window's own length transformers still masks (kv_length >= sliding_window): the note
    # says so; shorter, there is no window part and no note
    r = _trainsim(["predict", "gemma2-9b", "--system", "dgx-h100", "--gpus", "1", "--impl", "hf",
                   "--seq-len", "4096", "--global-batch", "1"])  # fmt: skip
    assert r.returncode == 0 and "exactly the sliding window (4,096 tokens)" in r.stderr.decode()
    r = _trainsim(["predict", "gemma2-9b", "--system", "dgx-h100", "--gpus", "1", "--impl", "hf",
                   "--seq-len", "4095", "--global-batch", "1"])  # fmt: skip
    assert r.returncode == 0 and "--impl hf memory" not in r.stderr.decode()


def test_expert_gemm_note_of_one_local_expert() -> None:
    m = get_model("mixtral-8x7b")
    grouped = Plan(tp=2, pp=4, ep=8, dp=4, global_batch=256, moe_grouped_gemm=True)
    assert expert_gemms_note(m, grouped, "ampere").startswith("--moe-grouped-gemm: the one local expert's GEMMs")
    seq = Plan(tp=2, pp=4, ep=8, dp=4, global_batch=256)
    assert expert_gemms_note(m, seq, "ampere").startswith("the one local expert runs as Megatron-core's SequentialMLP")
    assert expert_gemms_note(m, Plan(ep=2, dp=2, global_batch=8), "ampere").startswith("the 4 local experts run as")
