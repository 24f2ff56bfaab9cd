"""LLM plan search: the plan space, screening, ranking, the CLI, and the search validation suite."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.cli.main import _register, app
from trainsim.errors import ConfigError
from trainsim.hardware import get_device, get_system
from trainsim.search.llm import MEMORY_REASON, scheduler_address, screen_plans, search_llm
from trainsim.search.space import PlanSpace, reason_key

SMALL = PlanSpace(gpus=16, global_batch=64, tp=(1, 2, 4), pp=(1, 2, 4), micro_batch=(1, 2), zero=(0, 1),
                  recompute=("none", "full"), schedule=("1f1b",))  # fmt: skip


def test_space_enumerates_every_combination_once():
    model = get_model("llama2-7b")
    got = list(SMALL.plans(model, 8))
    valid = [p for p, _ in got if p is not None]
    assert len(valid) == len(set(valid))  # no plan twice
    assert all(p.gpus == 16 and p.batch == 64 for p in valid)
    assert all(not (p.sp and p.tp == 1) for p in valid)  # SP without TP is not a distinct plan
    # every (tp, pp, mb, zero, recompute, sp) combination is either valid or has a reason
    assert len(got) == sum(1 for _ in SMALL.plans(model, 8))
    # sp=True with tp=1 dropped; zero 1 dropped where dp = 16 / (tp·pp) is 1 (tp 4 pp 4: sp on, off)
    assert len(got) == 3 * 3 * 2 * 2 * 2 * 2 - 1 * 3 * 1 * 2 * 2 * 2 - 2 * 2 * 2
    assert all(p.zero == 0 for p in valid if p.dp * p.cp == 1)
    assert any(p.zero == 1 for p in valid if p.dp > 1)


def test_interleaving_without_pipeline_stages_is_no_plan_of_its_own():
    """With pp 1 interleaving has nothing to interleave: no "interleaved needs stages" noise in
    the infeasible counts while another schedule is tried; interleaved alone stays infeasible.
    GPipe stays a plan of its own in either order (review: a first-listed gpipe stood for 1F1B
    and the search dropped a 1F1B plan that fits, GPipe holding every micro-batch)."""
    model = get_model("llama2-7b")
    for order in (("1f1b", "gpipe", "interleaved"), ("interleaved", "gpipe", "1f1b")):
        space = replace(SMALL, gpus=1, global_batch=8, tp=(1,), pp=(1,), schedule=order)
        got = list(space.plans(model, 8))
        assert not [why for p, why in got if p is None]
        assert {p.schedule for p, _ in got if p is not None} == {"1f1b", "gpipe"}
        assert len(got) == 2 * 2 * 2  # schedule x micro-batch x recompute (no SP at tp 1, ZeRO 1 = 0 at dp 1)
    only = list(replace(space, schedule=("interleaved",)).plans(model, 8))
    assert only and all(p is None and "interleaved schedule needs two or more" in why for p, why in only)
    # with stages the schedules stay distinct plans
    staged = [p for p, _ in replace(space, gpus=2, pp=(2,)).plans(model, 8) if p is not None]
    assert {p.schedule for p in staged} == {"1f1b", "gpipe", "interleaved"}


def test_one_chunk_per_stage_is_the_1f1b_plan_not_a_second_one():
    """Walkthrough finding: ``--vpp 1`` listed every 1F1B plan twice (the same time), the
    interleaved copy with interleaving's micro-batch restriction; interleaved alone keeps it."""
    model = get_model("llama2-7b")
    space = replace(SMALL, pp=(2,), schedule=("1f1b", "interleaved"), vpp=(1, 2))
    plans = [p for p, _ in space.plans(model, 8) if p is not None]
    assert {(p.schedule, p.vpp) for p in plans} == {("1f1b", 1), ("interleaved", 2)}
    alone = [p for p, _ in replace(space, schedule=("interleaved",)).plans(model, 8) if p is not None]
    assert {p.vpp for p in alone} == {1, 2}


def test_dist_optimizer_applies_to_the_zero1_plans():
    space = replace(SMALL, zero=(0, 1, 2), dist_optimizer=True)
    valid = [p for p, _ in space.plans(get_model("llama2-7b"), 8) if p is not None]
    assert {(p.zero, p.dist_optimizer) for p in valid} == {(0, False), (1, True), (2, False)}
    # ... and asking for it without ZeRO-1 in the list is an error, not a silent no-op
    _register()
    res = CliRunner().invoke(app, ["search", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--zero", "0,2",
                                   "--dist-optimizer"])  # fmt: skip
    assert res.exit_code == 2 and "--dist-optimizer changes the ZeRO-1 plans, and --zero 0,2 tries none" in res.stderr


def test_infeasible_reasons_are_counted_and_generic():
    model = get_model("gpt3-350m")  # 24 layers, 16 heads (per the GPT-3 paper's corrected row)
    space = PlanSpace(gpus=96, global_batch=96, tp=(3,), pp=(32,), micro_batch=(1,), zero=(0,),
                      recompute=("none",), schedule=("1f1b",), sp=(False,))  # fmt: skip
    reasons = [why for p, why in space.plans(model, 8)]
    assert reasons and all(reasons)
    assert reason_key("plan: tp 3 does not divide gpt3-1.3b's 16 attention heads") == \
        "tp N does not divide the model's N attention heads"  # fmt: skip


# with two multi-token-prediction depths too: the search's screen is predict's, MTP and all
@pytest.mark.parametrize("mtp", [0, 2])
def test_screening_agrees_with_predict_closed_form(mtp):
    model, system = replace(get_model("llama2-7b"), mtp_layers=mtp), get_system("dgx-a100")
    plans = [p for p, _ in SMALL.plans(model, 8) if p is not None][:12]
    screened = screen_plans(model, system, list(enumerate(plans)))
    for s in screened:
        r = predict_llm(model, plans[s.index], system, simulate=False)
        assert s.closed_form_s == pytest.approx(r.iteration_time_s, rel=1e-12)
        assert s.memory_bytes == pytest.approx(r.peak_memory.total_bytes, rel=1e-12)


def test_search_ranks_simulated_plans_and_counts_everything():
    model = get_model("llama2-7b")
    r = search_llm(model, "dgx-a100", SMALL, workers=1, progress=False, top_k=5, simulate_top=8)
    times = [p["iteration_time_s"] for p in r["plans"]]
    assert times == sorted(times) and len(times) == 5
    assert (
        r["evaluated"] + sum(n for why, n in r["infeasible"].items() if why != MEMORY_REASON)
        == r["enumerated"]
    )
    assert r["feasible"] + r["infeasible"].get(MEMORY_REASON, 0) <= r["evaluated"]
    # the best simulated plan is no slower than any other finalist when predicted alone
    best = Plan(**r["plans"][0]["plan_fields"])
    assert predict_llm(model, best, "dgx-a100").iteration_time_s == pytest.approx(
        times[0], rel=1e-9
    )


def test_search_in_processes_matches_one_process():
    model = get_model("llama2-7b")
    a = search_llm(model, "dgx-a100", SMALL, workers=1, progress=False, top_k=3, simulate_top=3)
    b = search_llm(model, "dgx-a100", SMALL, workers=2, progress=False, top_k=3, simulate_top=3)
    assert [p["plan"] for p in a["plans"]] == [p["plan"] for p in b["plans"]]
    assert a["infeasible"] == b["infeasible"]


def test_memory_constraint_prunes():
    model = get_model("llama2-70b")
    space = PlanSpace(gpus=8, global_batch=8, tp=(1,), pp=(1,), micro_batch=(1,), zero=(0,),
                      recompute=("none",), schedule=("1f1b",), sp=(False,))  # fmt: skip
    r = search_llm(model, "dgx-a100", space, workers=1, progress=False)
    assert r["plans"] == [] and r["infeasible"] == {MEMORY_REASON: 1}


def test_memory_headroom_makes_plans_that_fill_the_gpu_infeasible():
    model = get_model("llama2-7b")
    space = PlanSpace(gpus=16, global_batch=64, tp=(1, 2), pp=(1, 2), micro_batch=(1, 2, 4), zero=(0, 1, 3),
                      recompute=("none", "full"), schedule=("1f1b",), sp=(False,))  # fmt: skip
    base = search_llm(model, "dgx-a100", space, workers=1, progress=False, top_k=200, simulate_top=200)
    cap = get_device("a100-sxm4-80gb").memory_bytes
    assert base["memory_limit_bytes"] == cap
    mems = sorted(p["memory_per_gpu_bytes"] for p in base["plans"])
    headroom = cap - mems[len(mems) // 2]  # the limit falls on the median feasible plan
    r = search_llm(model, "dgx-a100", space, workers=1, progress=False, top_k=200, simulate_top=200,
                   memory_headroom_bytes=headroom)  # fmt: skip
    assert r["memory_limit_bytes"] == cap - headroom
    kept = {p["plan"] for p in base["plans"] if p["memory_per_gpu_bytes"] <= cap - headroom}
    assert {p["plan"] for p in r["plans"]} == kept and 0 < len(kept) < len(base["plans"])
    assert r["infeasible"][MEMORY_REASON] == base["infeasible"].get(MEMORY_REASON, 0) + len(base["plans"]) - len(kept)
    with pytest.raises(ConfigError, match="memory headroom must be at least 0 and below"):
        search_llm(model, "dgx-a100", space, workers=1, progress=False, memory_headroom_bytes=cap)


def test_cli_memory_headroom_flows_into_search_and_predict():
    _register()
    args = ["search", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--tp", "1,2", "--pp", "1",
            "--micro-batch", "1,4", "--zero", "0,3", "--recompute", "none", "--schedule", "1f1b", "--workers", "1",
            "--top-k", "50", "--simulate-top", "50", "--format", "json"]  # fmt: skip
    doc = json.loads(CliRunner().invoke(app, [*args, "--memory-headroom", "25%"]).stdout)
    cap = get_device("a100-sxm4-80gb").memory_bytes
    assert doc["memory_limit_bytes"] == pytest.approx(0.75 * cap)
    assert doc["plans"] and all(p["memory_per_gpu_bytes"] <= 0.75 * cap for p in doc["plans"])
    # a plan's keys have predict's types (closed forms a dict, provenance an object)
    first = doc["plans"][0]
    assert set(first["closed_form_s"]) == {"001_eq7", "003_eq4"} and isinstance(first["screened_s"], float)
    assert first["screened_s"] == pytest.approx(first["closed_form_s"]["001_eq7"], rel=1e-9)
    assert {"summary", "kernels", "collectives"} <= set(first["provenance"])
    plan = first["plan_fields"]
    pred = ["predict", "llama2-7b", "--gpus", "16", "--tp", str(plan["tp"]), "--zero", str(plan["zero"]),
            "--micro-batch", str(plan["micro_batch"]), "--global-batch", "64", "--closed-form", "--format", "json"]  # fmt: skip
    need = json.loads(CliRunner().invoke(app, pred).stdout)["memory_per_gpu_bytes"]
    room = (cap - need) / 2**30
    less, more = f"{room - 0.01:.4f}", f"{room + 0.01:.4f}"
    fits = json.loads(CliRunner().invoke(app, [*pred, "--memory-headroom", f"{less}GiB"]).stdout)
    over = json.loads(CliRunner().invoke(app, [*pred, "--memory-headroom", f"{more}GiB"]).stdout)
    assert fits["fits_in_memory"] and not over["fits_in_memory"]
    assert over["memory_limit_bytes"] == pytest.approx(cap - float(more) * 2**30, rel=1e-12)
    bad = CliRunner().invoke(app, [*pred[:-2], "--memory-headroom", "1.5"])
    assert bad.exit_code == 2 and "--memory-headroom '1.5': expected a fraction below 1" in bad.stderr  # a usage error


def test_objectives_need_their_inputs():
    model = get_model("llama2-7b")
    with pytest.raises(ConfigError, match="train-tokens"):
        search_llm(model, "dgx-a100", SMALL, objective="time-to-train", workers=1, progress=False)
    with pytest.raises(ConfigError, match="objective"):
        search_llm(model, "dgx-a100", SMALL, objective="speed", workers=1, progress=False)
    # the CLI says what is wrong first, before any note about the search
    _register()
    for extra, msg in ((["--objective", "time-to-train"], "objective time-to-train needs --train-tokens"),
                       (["--objective", "cost", "--gpu-hour-price", "-1"], "--gpu-hour-price must be a positive")):
        res = CliRunner().invoke(app, ["search", "llama2-7b", "--gpus", "8", "--global-batch", "64", "--simulate-top",
                                       "1", *extra])  # fmt: skip
        assert res.exit_code == 2 and msg in res.stderr  # a usage error
        assert "--simulate-top" not in res.output and "cost is counted" not in res.output
    r = search_llm(model, "dgx-a100", SMALL, objective="cost", train_tokens=1e9, gpu_hour_price=2.0,
                   workers=1, progress=False, top_k=2, simulate_top=2)  # fmt: skip
    p = r["plans"][0]
    tokens = 64 * 4096
    assert p["objective"] == pytest.approx(
        16 * 1e9 / tokens * p["iteration_time_s"] / 3600 * 2.0, rel=1e-9
    )


@pytest.mark.parametrize(
    ("address", "message"),
    [("notanaddress", "expected tcp://HOST:PORT"), ("tcp://host", "expected tcp://HOST:PORT"),
     ("tcp://h:notaport", "port must be 1-65535, got 'notaport'"), ("tcp://h:70000", "port must be"),
     ("http://h:8786", "unknown scheme 'http'"), ("tcp://:8786", "expected tcp://HOST:PORT"),
     ("tcp://h:8786/path", "expected tcp://HOST:PORT"),
     ("tcp://::1:8786", r"an IPv6 host goes in brackets: tcp://\[::1\]:8786")],
)  # fmt: skip
def test_malformed_scheduler_addresses_are_one_line_errors(address, message):
    """Review finding: these reached dask and came back as a ValueError traceback."""
    with pytest.raises(ConfigError, match=message):
        scheduler_address(address)
    _register()
    res = CliRunner().invoke(app, ["search", "llama2-7b", "--gpus", "16", "--global-batch", "64",
                                   "--scheduler", address])  # fmt: skip
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "--scheduler" in res.stderr, res.output


def test_scheduler_addresses_dask_accepts_pass():
    assert scheduler_address("10.0.0.1:8786") == "tcp://10.0.0.1:8786"
    assert scheduler_address("tls://sched.example:8786") == "tls://sched.example:8786"
    assert scheduler_address("tcp://[::1]:8786") == "tcp://[::1]:8786"
    assert scheduler_address("ucxx://h-1.example:8786") == "ucxx://h-1.example:8786"
    assert scheduler_address("inproc://10.0.0.1/1234/1") == "inproc://10.0.0.1/1234/1"


@pytest.mark.parametrize("flag", ["--train-tokens", "--gpu-hour-price"])
@pytest.mark.parametrize("value", ["0", "-1e9", "nan", "inf"])
def test_tokens_and_price_must_be_positive(flag, value):
    """Review finding: a negative price reversed the cost ranking; 0 was read as 'not given'."""
    _register()
    res = CliRunner().invoke(app, ["search", "llama2-7b", "--gpus", "16", "--global-batch", "64",
                                   "--objective", "cost", flag, value])  # fmt: skip
    assert res.exit_code == 2 and f"{flag} must be a positive number" in res.stderr  # a usage error


def test_cli_search_shows_the_objective_it_ranks_by():
    _register()
    args = ["search", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--tp", "1,2", "--pp", "1,2",
            "--micro-batch", "1", "--zero", "0", "--recompute", "none", "--schedule", "1f1b", "--workers", "1",
            "--top-k", "2", "--simulate-top", "2", "--objective", "cost"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "cost (GPU-hours per iteration)" in res.stdout and "cost is counted in GPU-hours per iteration: give" in res.stderr
    doc = json.loads(CliRunner().invoke(app, [*args, "--train-tokens", "1e9", "--format", "json"]).stdout)
    assert doc["objective_unit"] == "GPU-hours to train"
    p = doc["plans"][0]
    assert p["objective"] == pytest.approx(16 * 1e9 / (64 * 4096) * p["iteration_time_s"] / 3600, rel=1e-9)


def test_cli_search_json():
    _register()
    res = CliRunner().invoke(app, ["search", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--tp", "1,2",
                                   "--pp", "1,2", "--micro-batch", "1,2", "--zero", "0,1", "--recompute", "none",
                                   "--schedule", "1f1b", "--workers", "1", "--top-k", "3", "--simulate-top", "3",
                                   "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {"plans", "evaluated", "infeasible"} <= set(doc)
    assert all({"plan", "iteration_time_s", "memory_per_gpu_bytes"} <= set(p) for p in doc["plans"])
    assert {p["plan_fields"]["seq_len"] for p in doc["plans"]} == {4096}  # the model's, not 0 for 'default'



def test_search_suite(shared_data):
    from trainsim.validate.search_suite import run_search_suite

    r = run_search_suite(shared_data, files="vtrain-multi,seed001")
    multi = r["files"]["vtrain-multi"]
    assert multi["groups"] == 4 and multi["spearman_groups"] == 4
    for g in r["cases"]:
        assert g["regret_pct"] >= 0
        assert g["picked_best"] == (g["regret_pct"] == 0)
    # the summary is about regret; its MAPE (the contract's keys) is over the plans' prediction
    # errors, never the regret (a regret is not a prediction error)
    assert r["summary"]["mean_regret_pct"] == pytest.approx(sum(g["regret_pct"] for g in r["cases"]) / len(r["cases"]))
    assert r["summary"]["cases"] == len(r["cases"])
    errors = [abs(e["error_pct"]) for g in r["cases"] for e in g["plan_errors"]]
    assert r["summary"]["mape_pct"] == pytest.approx(sum(errors) / len(errors)) and r["summary"]["plans"] == len(errors)


def test_validate_search_prints_each_group_regret_and_each_file_figures(shared_data):
    _register()
    res = CliRunner().invoke(app, ["validate", "search", "--files", "vtrain-multi", "--data", str(shared_data)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())
    assert "regret %" in out and "Spearman" in out
    assert re.search(r"vtrain-multi: mean regret \d+\.\d\d %, median Spearman 0\.\d{3} \(target ≤ 1 %, Spearman ≥ 0\.9\)", out)


def test_cli_models_lists_the_catalog():
    _register()
    res = CliRunner().invoke(app, ["models", "--format", "json"])
    assert res.exit_code == 0, res.output
    names = {m["name"] for m in json.loads(res.stdout)["models"]}
    assert {"llama2-7b", "gpt3-175b", "mixtral-8x7b"} <= names


def _in_own_process(body: str, timeout: float = 180) -> str:
    """What ``body`` (run under ``if __name__ == '__main__':``, ``llm`` and the search types
    imported) prints, run in a process of its own that ends, every thread's stack printed, if it
    hangs. Dask's clients,
    clusters and event loops are process state that outlives a test: the CI run of 2026-11-27 hung
    in a test that made a LocalCluster in pytest's own process."""
    import subprocess
    import sys
    import textwrap

    script = (f"import faulthandler\nfaulthandler.dump_traceback_later({timeout - 10}, exit=True)\n"
              "import json\nimport distributed\nfrom trainsim.builders.models import get_model\n"
              "from trainsim.errors import ConfigError\nfrom trainsim.search import llm\n"
              "from trainsim.search.space import PlanSpace\nif __name__ == '__main__':\n"
              + textwrap.indent(textwrap.dedent(body), "    "))  # fmt: skip
    try:
        res = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        pytest.fail(f"did not end within {timeout:.0f} s; its stderr:\n{stderr}")
    assert res.returncode == 0, res.stderr
    return res.stdout


def _plans_of(result: dict) -> list[str]:
    return [p["plan"] for p in result["plans"]]


@pytest.mark.slow
def test_search_on_a_dask_cluster_matches_local():
    pytest.importorskip("distributed")
    local = search_llm(get_model("llama2-7b"), "dgx-a100", SMALL, workers=1, progress=False, top_k=3, simulate_top=3)
    out = _in_own_process(f"""
        space = {SMALL!r}
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
            r = llm.search_llm(get_model("llama2-7b"), "dgx-a100", space, scheduler=cl.scheduler_address,
                               progress=False, top_k=3, simulate_top=3)
        print(json.dumps({{"plans": [p["plan"] for p in r["plans"]], "infeasible": r["infeasible"],
                          "evaluated": r["evaluated"]}}))
    """)  # fmt: skip
    remote = json.loads(out)
    assert remote["plans"] == _plans_of(local) and remote["plans"]
    assert remote["infeasible"] == local["infeasible"] and remote["evaluated"] == local["evaluated"]


def test_cli_search_without_feasible_plans_fails_with_reasons():
    """Review finding: an empty plan space printed an empty table and exited 0; the reasons
    read 'zero must be N, N, N or N, got N' (--zero 4 is now refused up front)."""
    _register()
    res = CliRunner().invoke(app, ["search", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--tp", "1",
                                   "--pp", "1", "--micro-batch", "3", "--workers", "1"])  # fmt: skip
    assert res.exit_code == 1
    assert "no feasible plan" in str(res.exception) and "global batch 64 is not a multiple of micro_batch×dp = 48" in str(res.exception)
    res = CliRunner().invoke(app, ["search", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--tp", "1",
                                   "--pp", "1", "--micro-batch", "3", "--workers", "1",
                                   "--format", "json"])  # fmt: skip
    assert res.exit_code == 1, "no feasible plan fails in JSON as in a table (review finding: it exited 0)"
    doc = json.loads(res.stdout)
    assert doc["plans"] == [] and doc["infeasible_examples"]["global batch N is not a multiple of micro_batch×dp = N"].endswith("= 48")



def test_infeasible_line_reads_each_reason_once() -> None:
    """The infeasible line gave the generic reason and then its example ('N pipeline chunks
    exceed the model's N layers (e.g. 64 pipeline chunks ...)'): now the example alone."""
    _register()
    res = CliRunner().invoke(app, ["search", "gpt3-350m", "--gpus", "64", "--global-batch", "64", "--tp", "1",
                                   "--pp", "1,32", "--micro-batch", "1", "--schedule", "1f1b,interleaved",
                                   "--vpp", "2", "--zero", "0", "--sp", "off", "--recompute", "none", "--workers", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("infeasible: "))
    assert "2× such as 32 pipeline chunks (pp 32) exceed gpt3-350m's 24 layers" in line, line
    assert "N pipeline chunks" not in line and "e.g." not in line, line

# --- a Dask scheduler that is not one, or has no workers (review: hang or traceback) ---------


@pytest.fixture
def quick_deadlines(monkeypatch):
    from trainsim.search import llm

    monkeypatch.setattr(llm, "CONNECT_DEADLINE_S", 4.0)
    monkeypatch.setattr(llm, "WORKERS_DEADLINE_S", 2.0)


def _serve(reply: bytes | None):
    """A TCP server on localhost that answers every connection with ``reply`` (b"": nothing;
    None: closes it at once)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []

    def loop() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)
            try:
                if reply is None:
                    c.close()
                elif reply:
                    c.sendall(reply)
            except OSError:  # the client went away first
                pass

    threading.Thread(target=loop, daemon=True).start()
    return srv, conns


def _stop(srv, conns) -> None:
    """Close a :func:`_serve` server: shut down first, which wakes its thread from accept()."""
    import contextlib
    import socket

    with contextlib.suppress(OSError):
        srv.shutdown(socket.SHUT_RDWR)
    srv.close()
    for c in conns:
        c.close()


@pytest.mark.parametrize(("reply", "message"), [
    (b"SSH-2.0-OpenSSH_9.6\r\n" + bytes(range(256)) * 64, "did not answer as a Dask scheduler"),
    (b"", "connected, but nothing came within 4 s"),
    (None, "the port closed the connection without sending anything"),
], ids=["garbage", "silent", "closes"])  # fmt: skip
def test_a_port_that_is_no_dask_scheduler_is_a_one_line_error(quick_deadlines, reply, message):
    pytest.importorskip("distributed")
    srv, conns = _serve(reply)
    try:
        address = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
        t0 = time.perf_counter()
        with pytest.raises(ConfigError) as e:
            search_llm(get_model("gpt3-350m"), "dgx-a100", PlanSpace(gpus=8, global_batch=8), scheduler=address, progress=False)
        assert time.perf_counter() - t0 < 30
        assert "\n" not in str(e.value) and address in str(e.value) and message in str(e.value)
    finally:
        _stop(srv, conns)


def test_a_closed_port_is_a_one_line_error_at_once():  # the 20 s deadline: Dask alone retried 10 s
    import socket

    pytest.importorskip("distributed")
    with socket.socket() as s:  # bound, not listening: the port is held and refuses connections
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match=rf"^--scheduler tcp://127.0.0.1:{port}: cannot connect \(Connection refused\)$"):
            search_llm(get_model("gpt3-350m"), "dgx-a100", PlanSpace(gpus=8, global_batch=8),
                       scheduler=f"127.0.0.1:{port}", progress=False)  # fmt: skip
        assert time.perf_counter() - t0 < 8, "refused at once, not after 10 s of Dask's connect retries"


def test_the_probe_reads_dasks_frame_header() -> None:
    """Another protocol's bytes are refused before any Dask client is built (a client that fails
    mid-handshake is left to the garbage collector, which can deadlock Dask's loop runner)."""
    from trainsim.search.llm import _dask_header

    handshake = bytes.fromhex("3a00000000000000" "0100000000000000" "2a00000000000000") + b"\x83\xabcompression"
    assert _dask_header(handshake)
    assert not _dask_header(b"SSH-2.0-OpenSSH_9.6\r\n")  # a length of 3.3e18 bytes
    assert not _dask_header(b"HTTP/1.1 400 Bad Request\r\n")
    assert not _dask_header(handshake[:15])


@pytest.mark.parametrize("host", ["foo..bar", "x" * 64 + ".example"])
def test_a_host_name_that_cannot_be_encoded_is_a_one_line_error(host):
    """Review finding: IDNA's UnicodeError (not an OSError) escaped the probe as a traceback."""
    pytest.importorskip("distributed")
    with pytest.raises(ConfigError, match=rf"^--scheduler tcp://{host}:8786: cannot connect \(.*(label empty or too long|idna)"):
        search_llm(get_model("gpt3-350m"), "dgx-a100", PlanSpace(gpus=8, global_batch=8), scheduler=f"{host}:8786",
                   progress=False)  # fmt: skip


@pytest.mark.parametrize("protocol", ["tcp://", "inproc://"])
def test_a_scheduler_without_workers_is_a_one_line_error(protocol):
    pytest.importorskip("distributed")
    host = "127.0.0.1" if protocol == "tcp://" else None
    out = _in_own_process(f"""
        llm.CONNECT_DEADLINE_S, llm.WORKERS_DEADLINE_S = 4.0, 2.0
        with distributed.LocalCluster(n_workers=0, processes=False, protocol={protocol!r}, host={host!r},
                                      dashboard_address=None) as cluster:
            try:
                llm.search_llm(get_model("gpt3-350m"), "dgx-a100", PlanSpace(gpus=8, global_batch=8),
                               scheduler=cluster.scheduler_address, progress=False)
            except ConfigError as e:
                print("ConfigError:", e)
    """, timeout=120)  # fmt: skip
    (line,) = out.splitlines()
    assert line.startswith(f"ConfigError: --scheduler {protocol}") and "has no workers after 2 s" in line


def test_a_dask_scheduler_with_a_worker_screens_the_same_plans():
    pytest.importorskip("distributed")
    space = PlanSpace(gpus=8, global_batch=8)
    local = search_llm(get_model("gpt3-350m"), "dgx-a100", space, workers=1, progress=False, simulate_top=2)
    out = _in_own_process(f"""
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                      dashboard_address=None) as cluster:
            r = llm.search_llm(get_model("gpt3-350m"), "dgx-a100", {space!r}, scheduler=cluster.scheduler_address,
                               progress=False, simulate_top=2)
        print(json.dumps({{"plans": [p["plan"] for p in r["plans"]], "feasible": r["feasible"]}}))
    """)  # fmt: skip
    remote = json.loads(out)
    assert remote["plans"] == _plans_of(local) and remote["plans"]
    assert remote["feasible"] == local["feasible"]


# --- the kept screening pool (review findings of 2026-11-27) ------------------------------------

_TINY = PlanSpace(gpus=8, global_batch=32, tp=(1, 2), pp=(1, 2), micro_batch=(1, 2), zero=(0, 1),
                  recompute=("none",), schedule=("1f1b",))  # fmt: skip


def _tiny_search(workers: int) -> list[str]:
    r = search_llm(get_model("gpt2"), "dgx-a100", _TINY, workers=workers, progress=False, top_k=3, simulate_top=3)
    return [p["plan"] for p in r["plans"]]


def test_a_pool_whose_workers_died_while_idle_is_replaced(monkeypatch):
    import os
    import signal

    from trainsim.search import llm

    monkeypatch.setattr(llm, "_CHUNK", 2)  # several chunks: the pool screens them
    expected = _tiny_search(1)
    assert _tiny_search(2) == expected
    (pool,) = llm._POOL.values()  # the kept pool (one of 2 workers, or a larger one kept before)
    for pid in list(pool._processes):  # killed between searches (an interrupt, the OOM killer)
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    assert _tiny_search(2) == expected
    assert pool not in llm._POOL.values()


def test_searches_in_two_threads_with_different_worker_counts_both_finish(monkeypatch):
    """The second used to shut down the pool the first was waiting on: the first hung."""
    from concurrent.futures import ThreadPoolExecutor

    from trainsim.search import llm

    monkeypatch.setattr(llm, "_CHUNK", 2)
    expected = _tiny_search(1)
    with ThreadPoolExecutor(2) as threads:
        a, b = threads.submit(_tiny_search, 2), threads.submit(_tiny_search, 3)
        assert a.result(timeout=120) == expected and b.result(timeout=120) == expected


def test_screening_workers_exit_when_the_program_is_killed(tmp_path):
    """A kept pool outlives each search; SIGKILL runs no atexit, so the workers watch for it."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "keep.py"
    script.write_text(
        "import sys, time\n"
        "from trainsim.builders.models import get_model\n"
        "from trainsim.search import llm\n"
        "from trainsim.search.space import PlanSpace\n"
        "if __name__ == '__main__':\n"
        "    llm._CHUNK = 2\n"
        "    space = PlanSpace(gpus=8, global_batch=32, tp=(1, 2), pp=(1, 2), micro_batch=(1, 2))\n"
        "    llm.search_llm(get_model('gpt2'), 'dgx-a100', space, workers=2, progress=False, simulate_top=0, top_k=0)\n"
        "    print(' '.join(map(str, llm._POOL[2]._processes)), flush=True)\n"
        "    time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def alive(pid: int) -> bool:
        from pathlib import Path

        try:  # gone, or reaped between the two looks (CI 2026-11-27: /proc/PID/stat had vanished)
            os.kill(pid, 0)
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"  # a zombie has exited
        except (ProcessLookupError, FileNotFoundError):
            return False

    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)


def test_json_counts_are_integers():
    """Walkthrough finding: search and predict JSON gave bytes and parameter counts as floats
    (84810924032.0) beside ints of the same kind (memory_limit_bytes)."""
    from trainsim.cli.output import _clean

    r = predict_llm("llama2-7b", Plan(tp=2, pp=2, dp=4, micro_batch=2, global_batch=256), "dgx-a100")
    doc = _clean(r.to_dict())
    ints = [doc["memory_per_gpu_bytes"], doc["memory_capacity_bytes"], doc["memory_limit_bytes"],
            *doc["memory_per_stage_bytes"], *(s["params"] for s in doc["stages"]),
            *(v for k, v in doc["memory"].items() if k != "phase")]  # fmt: skip
    assert all(type(v) is int for v in ints) and doc["memory"]["phase"] == "backward"
    assert doc["memory_per_gpu_bytes"] == round(r.peak_memory.total_bytes)
    assert type(doc["iteration_time_s"]) is float and _clean({"x_bytes": float("nan")}) == {"x_bytes": None}



def test_plans_that_do_not_fit_are_not_timed() -> None:
    """Memory is screened first: past the limit a plan's closed form is not computed (inf), and
    the search's counts, ranking and answers equal those of screening every plan's time."""
    model, system = get_model("llama2-7b"), get_system("dgx-a100")
    plans = [p for p, _ in SMALL.plans(model, 8) if p is not None]
    every = screen_plans(model, system, list(enumerate(plans)))
    limit = sorted(s.memory_bytes for s in every)[len(every) // 2]  # half the plans fit
    cut = screen_plans(model, system, list(enumerate(plans)), memory_limit=limit)
    for a, b in zip(every, cut, strict=True):
        assert a.memory_bytes == b.memory_bytes and a.error == b.error
        assert b.closed_form_s == (a.closed_form_s if a.memory_bytes <= limit else math.inf)
    assert any(b.closed_form_s == math.inf for b in cut) and any(b.closed_form_s < math.inf for b in cut)


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_a_script_without_a_main_guard_searches_with_workers(tmp_path, how):
    """multiprocessing runs a program's __main__ again in each forkserver worker: a script
    without ``if __name__ == "__main__":`` ran its top level once per worker, whose nested
    search failed to start processes (BrokenProcessPool), and a program read from stdin named
    ``<stdin>``, a file the workers could not open. The workers now start without it."""
    import subprocess
    import sys

    code = (
        "from trainsim.builders.models import get_model\n"
        "from trainsim.search import llm\n"
        "from trainsim.search.space import PlanSpace\n"
        "print('top level', flush=True)\n"
        "llm._CHUNK = 2\n"
        "space = PlanSpace(gpus=8, global_batch=32, tp=(1, 2), pp=(1, 2), micro_batch=(1, 2))\n"
        "r = llm.search_llm(get_model('gpt2'), 'dgx-a100', space, workers=2, progress=False, top_k=1, simulate_top=1)\n"
        "print('best', r['plans'][0]['plan'], flush=True)\n"
    )
    script = tmp_path / "unguarded.py"
    script.write_text(code)
    args, stdin = ([sys.executable, str(script)], None) if how == "script" else ([sys.executable, "-"], code)
    done = subprocess.run(args, check=False, input=stdin, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("top level") == 1 and "best " in done.stdout
    assert "BrokenProcessPool" not in done.stderr
