"""``Plan.cp_comm`` (Megatron-core's ``--cp-comm-type``): how context-parallel ranks exchange K/V.

``p2p`` (the default, TransformerEngine's ring, overlapped with the attention blocks),
``all_gather`` (K/V all-gathered before the attention, exposed; dK/dV reduce-scattered) and
``a2a`` (DeepSpeed-Ulysses: Q, K, V and the output all-to-all'd between the sequence split and
a head split, exposed; the attention over the whole sequence on heads / (tp·cp) heads). Until
2026-12-04 every CP plan was the ring (a windowed model's windowed layers the all-gather).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.llm import stage_costs
from trainsim.builders.llm_comm import PlanComm
from trainsim.builders.memory import memory_per_gpu
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.errors import ConfigError
from trainsim.hardware import get_device, get_system
from trainsim.search.frameworks import framework_plan
from trainsim.search.llm import search_llm
from trainsim.search.space import PlanSpace

SYSTEM = "dgx-h100"
SEQ = 32768


def _plan(cp: int, cp_comm: str = "p2p", **kw: object) -> Plan:
    base: dict[str, object] = {"cp": cp, "micro_batch": 1, "seq_len": SEQ, "cp_comm": cp_comm}
    return Plan(**{**base, **kw})  # type: ignore[arg-type]


def _core(model, plan: Plan, phase: str = "fwd"):
    lc = LayerCoster(model, plan, OpCoster(get_device("h100-sxm5-80gb")))
    return [o for o in lc.attention_core(phase) if o.category == "attention"]


CP_PLANS = [
    {"cp": 2},
    {"cp": 4, "tp": 2, "sp": True, "recompute": "selective"},
    {"cp": 8, "dp": 2, "global_batch": 4, "recompute": "full"},
    {"cp": 4, "pp": 2, "global_batch": 8, "attention": "fused", "seq_len": 16384},
]


@pytest.mark.parametrize("kw", CP_PLANS)
def test_p2p_is_the_default_and_the_ring(kw: dict[str, object]) -> None:
    """A plan that names p2p is the plan that names nothing (the ring: its send/recv steps, no
    all-gather or all-to-all); predictions before and after the field were compared bit for bit
    on these plans and a windowed model's (the commit's report)."""
    model = get_model("llama3-8b")
    base = {"micro_batch": 1, "seq_len": SEQ, **kw}
    a = predict_llm(model, Plan(**base), SYSTEM).to_dict()  # type: ignore[arg-type]
    b = predict_llm(model, Plan(**base, cp_comm="p2p"), SYSTEM).to_dict()  # type: ignore[arg-type]
    a.pop("timings_s"), b.pop("timings_s")
    assert a == b
    (st, *_) = stage_costs(model, Plan(**base), get_system(SYSTEM))  # type: ignore[arg-type]
    names = {c.name for c in st.comm}
    assert "cp_ring" in names and not any(n.startswith(("cp_a2a", "cp_kv_all_gather")) for n in names)


@pytest.mark.parametrize("cp_comm", ["all_gather", "a2a"])
def test_other_exchanges_at_cp_1_are_p2p(cp_comm: str) -> None:
    """Without context parallelism the exchange changes nothing: the same prediction and label."""
    for model in (get_model("llama3-8b"), get_model("gemma3-12b")):
        plan = Plan(tp=2, dp=4, micro_batch=1, seq_len=8192)
        a = predict_llm(model, plan, SYSTEM).to_dict()
        b = predict_llm(model, replace(plan, cp_comm=cp_comm), SYSTEM).to_dict()  # type: ignore[arg-type]
        a.pop("timings_s"), b.pop("timings_s")
        assert a == b and replace(plan, cp_comm=cp_comm).label() == plan.label()  # type: ignore[arg-type]


def test_a2a_refuses_heads_cp_does_not_divide() -> None:
    """TransformerEngine's a2a asserts that cp divides each TP rank's attention and KV heads."""
    llama3 = get_model("llama3-8b")  # 32 heads, 8 KV heads
    _plan(8, "a2a").validate(llama3)  # 32 and 8 heads per rank
    with pytest.raises(ConfigError, match=r"^plan: cp_comm a2a .* KV heads .*cp 8 does not divide llama3-8b's 4 KV heads per rank \(tp 2\)$"):
        _plan(8, "a2a", tp=2).validate(llama3)
    with pytest.raises(ConfigError, match=r"^plan: cp_comm a2a .* attention heads .*cp 8 does not divide gpt3-1.3b's 4 attention heads per rank \(tp 4\)$"):
        _plan(8, "a2a", tp=4, seq_len=2048).validate(get_model("gpt3-1.3b"))  # 16 heads, MHA
    _plan(8, "p2p", tp=2).validate(llama3)  # the ring and the all-gather split no heads
    _plan(8, "all_gather", tp=2).validate(llama3)
    with pytest.raises(ConfigError, match=r"^plan: cp_comm must be one of p2p, all_gather, a2a, got 'ring'$"):
        _plan(2, "ring").validate(llama3)


def test_a2a_attention_runs_the_whole_sequence_on_a_heads_slice() -> None:
    """Ulysses: one kernel over all s tokens on heads / (tp·cp) heads, the ring's FLOPs; a window
    at its unsplit share on every rank (FlashAttention's window_size), not the busiest chunk's."""
    llama3 = get_model("llama3-8b")
    for tp, cp in ((1, 4), (2, 2), (1, 8)):
        (ring,) = _core(llama3, _plan(cp, tp=tp))
        (uly,) = _core(llama3, _plan(cp, "a2a", tp=tp))
        (one,) = _core(llama3, Plan(tp=tp * cp, micro_batch=1, seq_len=SEQ))  # the same kernel shape
        assert uly.flops == pytest.approx(ring.flops, rel=1e-12) and uly.seconds == one.seconds
        assert uly.launches == 1 and ring.launches == cp
    gemma = get_model("gemma3-12b")  # 16 heads, 8 KV heads; a 1,024-token window on 40 of 48 layers
    (w,) = _core(gemma, _plan(4, "a2a"))
    (full,) = _core(replace(gemma, sliding_window=0, sliding_layers=0), _plan(4, "a2a"))
    assert w.seconds == pytest.approx(full.seconds * gemma.window_work_fraction(SEQ), rel=1e-12)
    assert gemma.window_work_fraction(SEQ) < gemma.cp_window_work_fraction(SEQ, 4)  # no busiest-rank skew


@pytest.mark.parametrize("cp_comm,names", [
    ("a2a", {"cp_a2a_q": 2, "cp_a2a_k": 2, "cp_a2a_v": 2, "cp_a2a_out": 2}),
    ("all_gather", {"cp_kv_all_gather": 4, "cp_dkv_reduce_scatter": 2}),
])  # fmt: skip
def test_exposed_exchanges_on_every_layer(cp_comm: str, names: dict[str, int]) -> None:
    """a2a: Q, K, V and the output all-to-all'd in the forward, the output's gradient and dQ,
    dK, dV in the backward; all_gather: K and V gathered (again in the backward, their
    gradients reduce-scattered). No ring, nothing overlapped: each adds in full to its pass."""
    system = get_system(SYSTEM)
    model = get_model("llama3-8b")
    plan = _plan(4, cp_comm)
    (st,) = stage_costs(model, plan, system)
    got = {n: [c.name for c in st.comm].count(n) for n in names}
    assert got == names and "cp_ring" not in {c.name for c in st.comm}
    comm = PlanComm(model, plan, system)
    assert comm.cp_layer("fwd") is None
    f, b = comm.cp_exposed_layer("fwd"), comm.cp_exposed_layer("bwd")
    assert f is not None and b is not None and f.layers == b.layers == 1.0
    assert st.cp_comm_s[0] == pytest.approx(st.layers * f.exposed_s, rel=1e-6)
    assert st.cp_comm_s[1] == pytest.approx(st.layers * b.exposed_s, rel=1e-6)
    if cp_comm == "a2a":  # a rank's [b, s/cp, heads, d] tensors: Q and the output 4x K and V (GQA 32/8)
        q, k = (next(c for c in f.comm if c.name == n) for n in ("cp_a2a_q", "cp_a2a_k"))
        assert q.bytes == 4 * k.bytes == SEQ / 4 * 4096 * 2 and q.kind == "all_to_all" and q.group_size == 4
    else:  # the ring's work: the same attention operators
        assert _core(model, plan) == _core(model, _plan(4))


def test_a2a_comm_grows_with_cp_across_nodes() -> None:
    """The cp group placed over nodes (tp 4 innermost: cp 2 on one node, 4 on two, 8 on four):
    the all-to-alls cost more than on one node although each rank moves half the bytes, and at
    a fixed sequence per rank they grow with cp (more of each exchange leaves the node)."""
    model, system = get_model("llama2-7b"), get_system(SYSTEM)

    def a2a(cp: int, seq: int) -> tuple[float, int]:
        f = PlanComm(model, _plan(cp, "a2a", tp=4, seq_len=seq), system).cp_exposed_layer("fwd")
        assert f is not None
        return f.exposed_s, f.comm[0].per_node

    (one, pn1), (two, pn2) = a2a(2, SEQ), a2a(4, SEQ)
    assert pn1 == 2 and pn2 == 2 and two > 2 * one  # cp 2: both ranks on one node; cp 4: two nodes
    weak = [a2a(cp, 8192 * cp)[0] for cp in (2, 4, 8)]
    assert weak == sorted(weak) and weak[0] < weak[1] < weak[2]
    # and the prediction carries it: cp 4 over two nodes exposes more than cp 2 on one
    r2 = predict_llm(model, _plan(2, "a2a", tp=4, dp=2, seq_len=SEQ), SYSTEM, simulate=False)
    r4 = predict_llm(model, _plan(4, "a2a", tp=4, seq_len=SEQ), SYSTEM, simulate=False)
    assert r4.breakdown["cp_communication_s"] > r2.breakdown["cp_communication_s"] > 0


def test_memory_is_the_rings_outside_the_attention() -> None:
    """The sequence stays split outside the attention core: the model states are p2p's, and so
    are a2a's activations; the schemes differ in the attention's transient buffers and the
    all-gather's saved per-step outputs (tests/test_cp_memory.py; until 2026-12-04 every
    scheme's memory was the ring's, buffers included)."""
    model = get_model("llama3-8b")
    for cp_comm in ("all_gather", "a2a"):
        for kw in ({"cp": 4}, {"cp": 2, "tp": 2, "sp": True}, {"cp": 4, "attention": "unfused", "seq_len": 8192}):
            a, b = _plan(**{"cp_comm": "p2p", **kw}), _plan(**{"cp_comm": cp_comm, **kw})  # type: ignore[arg-type]
            for x, y in zip(memory_per_gpu(model, a), memory_per_gpu(model, b), strict=True):
                assert (x.weights_bytes, x.gradients_bytes, x.optimizer_bytes) == (y.weights_bytes, y.gradients_bytes, y.optimizer_bytes)
                assert (x.activations_bytes == y.activations_bytes) == (cp_comm == "a2a")


def test_predict_notes_the_scheme_and_the_cli_takes_megatrons_spelling() -> None:
    from trainsim.cli.main import _register, app

    notes = {c: predict_llm(get_model("llama3-8b"), _plan(4, c), SYSTEM, simulate=False).warnings
             for c in ("p2p", "all_gather", "a2a")}  # fmt: skip
    assert any("costed as TransformerEngine's p2p ring" in w for w in notes["p2p"])
    assert any("costed as TransformerEngine's KV all-gather CP (--cp-comm-type allgather)" in w for w in notes["all_gather"])
    assert any("costed as DeepSpeed-Ulysses" in w and "on 8 of 32 heads (2 KV)" in w for w in notes["a2a"])
    gemma = predict_llm(get_model("gemma3-12b"), _plan(4, "a2a"), SYSTEM, simulate=False).warnings
    assert any("sliding window" in w and "a2a (Ulysses)" in w for w in gemma)
    _register()
    args = ["predict", "llama3-8b", "--system", SYSTEM, "--cp", "4", "--seq-len", str(SEQ), "--closed-form",
            "--format", "json"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--cp-comm-type", "allgather"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert "cp4-allgather" in doc["plan"]
    ref = predict_llm(get_model("llama3-8b"), _plan(4, "all_gather"), SYSTEM, simulate=False)
    assert doc["iteration_time_s"] == ref.iteration_time_s


@pytest.mark.parametrize(("framework", "cp_comm", "runs"), [
    ("megatron", "p2p", True), ("megatron", "all_gather", True), ("megatron", "a2a", True),
    ("deepspeed", "a2a", True), ("deepspeed", "p2p", False), ("deepspeed", "all_gather", False),
    ("torchtitan", "p2p", True), ("torchtitan", "all_gather", True), ("torchtitan", "a2a", False),
])  # fmt: skip
def test_frameworks_cp_exchanges(framework: str, cp_comm: str, runs: bool) -> None:
    plan = Plan(tp=1, cp=2, dp=4, cp_comm=cp_comm)  # type: ignore[arg-type]
    got, why = framework_plan(plan, framework)
    assert (got is not None) == runs and bool(why) == (not runs)
    assert "'s " not in why  # a possessive reads as "the model's" in the search's reason keys
    # Megatron-DeepSpeed refuses its Ulysses beside Megatron's sequence parallelism
    sp = replace(plan, tp=2, sp=True, dp=2)
    assert (framework_plan(sp, framework)[0] is not None) == (runs and framework != "deepspeed")


def test_search_ranks_both_exchanges_as_predict_times_them() -> None:
    """``--cp-comm-type p2p,a2a``: cp 1 plans once, cp > 1 plans with each exchange; each ranked
    plan's time is predict's. The default space tries the ring only."""
    model = get_model("llama3-8b")
    kw: dict[str, object] = {"gpus": 8, "global_batch": 8, "seq_len": 16384, "tp": (1, 2), "pp": (1,),
                             "cp": (1, 2, 4), "micro_batch": (1,), "zero": (1,), "recompute": ("full",),
                             "schedule": ("1f1b",), "sp": (True, False), "dist_optimizer": True}  # fmt: skip
    default = [p for p, _ in PlanSpace(**kw).plans(model, 8) if p is not None]  # type: ignore[arg-type]
    both = [p for p, _ in PlanSpace(**kw, cp_comm=("p2p", "a2a")).plans(model, 8) if p is not None]  # type: ignore[arg-type]
    assert {p.cp_comm for p in default} == {"p2p"}
    assert [p for p in both if p.cp == 1] == [p for p in default if p.cp == 1]
    assert len([p for p in both if p.cp > 1]) == 2 * len([p for p in default if p.cp > 1])
    r = search_llm(model, SYSTEM, PlanSpace(**kw, cp_comm=("p2p", "a2a")), workers=1, progress=False,  # type: ignore[arg-type]
                   top_k=100, simulate_top=100)  # fmt: skip
    kinds = {(p["plan_fields"]["cp"] > 1, p["plan_fields"]["cp_comm"]) for p in r["plans"]}
    assert {(True, "p2p"), (True, "a2a"), (False, "p2p")} <= kinds
    assert any("-a2a-" in p["plan"] for p in r["plans"])
    for p in r["plans"]:
        plan = Plan(**p["plan_fields"])
        assert predict_llm(model, plan, SYSTEM).iteration_time_s == pytest.approx(p["iteration_time_s"], rel=1e-9)


def test_search_cli_takes_the_exchanges() -> None:
    from trainsim.cli.main import _register, app

    _register()
    args = ["search", "llama3-8b", "--system", SYSTEM, "--gpus", "8", "--global-batch", "8", "--seq-len", "16384",
            "--tp", "1", "--pp", "1", "--cp", "2,4", "--micro-batch", "1", "--zero", "1", "--dist-optimizer",
            "--recompute", "full", "--schedule", "1f1b", "--workers", "1", "--format", "json"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--cp-comm-type", "p2p,allgather,a2a"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {p["plan_fields"]["cp_comm"] for p in doc["plans"]} == {"p2p", "all_gather", "a2a"}
    res = CliRunner().invoke(app, [*args, "--cp-comm-type", "p2p,ring"])
    assert res.exit_code == 2 and "--cp-comm-type must be among p2p, all_gather, a2a" in res.stderr
