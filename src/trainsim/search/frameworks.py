"""Which plans a training framework can run: ``trainsim search --framework``.

The plan space is the union of what frameworks offer; a user who trains with one of them wants
its plans ranked, not a plan it has no switch for (ZeRO-2 under pipeline parallelism ranked
first, then found to need another framework). Each rule names the framework's own limit:

``megatron`` (Megatron-LM / Megatron-core)
    Data parallelism is DDP (ZeRO 0) or the distributed optimizer (``--use-distributed-optimizer``:
    ZeRO-1 with the gradients reduce-scattered, so its ZeRO-1 plans are ``dist_optimizer``).
    Its newer FSDP options (``--use-torch-fsdp2``, Megatron-FSDP) are left out: their plans are
    ``torchtitan``'s kind. Pipeline schedules: 1F1B and interleaved 1F1B (no GPipe). Context
    parallelism: every ``--cp-comm-type`` modelled (``p2p``, ``allgather``, ``a2a``).
``deepspeed`` (DeepSpeed with Megatron-DeepSpeed's tensor parallelism)
    Its pipeline engine takes ZeRO-1 at most (``PipelineEngine`` asserts ``zero_stage < 2``);
    its one schedule is 1F1B (``TrainSchedule``: no interleaving, no GPipe); its context
    parallelism is DeepSpeed-Ulysses' all-to-all (``cp_comm`` a2a; it calls it sequence
    parallelism), no ring or K/V all-gather, and not beside Megatron's sequence parallelism
    (Megatron-DeepSpeed raises: "not compatible with Megatron-LM's sequence parallel"). Its ZeRO-1
    all-gathers the updated weights inside the optimizer step: no ``overlap_param_gather``.
``torchtitan`` (PyTorch FSDP2, DTensor TP/CP, ``torch.distributed.pipelining``)
    Data parallelism is DDP (ZeRO 0) or FSDP2, which shards parameters: ZeRO-3
    (``reshard_after_forward=True``) or ZeRO-2 (``False``); no ZeRO-1 mode. Its tensor
    parallelism always shards the norms' sequence (``SequenceParallel``), so TP without SP
    is not one of its plans. Schedules: 1F1B, interleaved 1F1B, GPipe. Context parallelism is
    PyTorch's ``context_parallel`` (``--parallelism.context_parallel_rotate_method``):
    ``allgather`` (its default, ``cp_comm`` all_gather) or ``alltoall`` (the K/V shards passed
    round the ranks, a ring: ``p2p``); no Ulysses head split. Costed as TransformerEngine's
    variants (its all-gather starts after the rank's first block, which may hide some of it:
    not modelled).
``any`` (the default)
    Every plan :meth:`~trainsim.builders.plan.Plan.validate` accepts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainsim.builders.plan import Plan
from trainsim.errors import ConfigError

FRAMEWORKS = ("any", "megatron", "deepspeed", "torchtitan")

_NAMES = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed", "torchtitan": "torchtitan"}


def check_framework(name: str) -> None:
    if name not in FRAMEWORKS:
        raise ConfigError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {name!r}")


def framework_plan(plan: Plan, framework: str) -> tuple[Plan | None, str]:
    """``(plan as the framework runs it, "")``, or ``(None, why it cannot)``. Megatron's ZeRO-1
    is its distributed optimizer, so a ZeRO-1 plan comes back with ``dist_optimizer`` set."""
    if framework == "any":
        return plan, ""
    sharded = plan.dp * plan.cp > 1  # with one data-parallel rank a ZeRO stage shards nothing
    who = _NAMES[framework]
    if framework == "megatron":
        if sharded and plan.zero >= 2:
            return None, (f"{who} shards no gradients or parameters (ZeRO-{plan.zero}; its data parallelism "
                          "is DDP or the distributed optimizer, ZeRO-1)")  # fmt: skip
        if plan.schedule == "gpipe":
            return None, f"{who} has no GPipe schedule (it runs 1F1B and interleaved 1F1B)"
        # every cp_comm: Megatron-core's --cp-comm-type p2p, allgather, a2a
        if plan.zero == 1 and not plan.dist_optimizer:
            return replace(plan, dist_optimizer=True), ""
        return plan, ""
    if framework == "deepspeed":
        if plan.overlap_param_gather:
            return None, (f"{who} all-gathers the updated weights inside its optimizer step: no Megatron-core "
                          "--overlap-param-gather (overlap_param_gather)")  # fmt: skip
        if sharded and plan.pp > 1 and plan.zero >= 2:
            return None, f"the {who} pipeline engine shards no gradients or parameters (ZeRO-{plan.zero} with pp {plan.pp})"
        if plan.pp > 1 and plan.schedule != "1f1b":
            return None, f"the {who} pipeline engine has no interleaved or GPipe schedule ({plan.schedule} here)"
        if plan.cp > 1 and plan.cp_comm != "a2a":
            return None, (f"{who} runs context parallelism as the Ulysses all-to-all only (cp {plan.cp} with "
                          f"{plan.cp_comm}: --cp-comm-type a2a)")  # fmt: skip
        if plan.cp > 1 and plan.sp:  # Megatron-DeepSpeed raises at initialisation
            return None, (f"{who} Ulysses sequence parallelism (cp {plan.cp}) does not run with Megatron sequence "
                          "parallelism (sp): Megatron-DeepSpeed refuses --sequence-parallel with it")  # fmt: skip
        return plan, ""
    # torchtitan
    if sharded and plan.zero == 1:
        return None, f"{who} has no optimizer-only sharding (ZeRO-1; FSDP2 is ZeRO-2 or ZeRO-3, DDP ZeRO 0)"
    if plan.tp > 1 and not plan.sp:
        return None, f"{who} tensor parallelism is sequence-parallel (tp {plan.tp} without sp)"
    if plan.cp > 1 and plan.cp_comm == "a2a":
        return None, f"{who} context parallelism rotates or all-gathers K/V (cp {plan.cp}): no Ulysses all-to-all (a2a)"
    return plan, ""


def framework_note(ranked: list[dict[str, Any]]) -> str | None:
    """With ``--framework any``: which ranked plans (their ``plan_fields``) no framework but
    torchtitan runs (ZeRO-2/3 with pipeline parallelism), a limit otherwise found at launch."""
    picks = [i for i, p in enumerate(ranked, 1) if p["pp"] > 1 and p["zero"] >= 2 and p["dp"] * p["cp"] > 1]
    if not picks:
        return None
    which = ", ".join(f"#{i}" for i in picks[:8]) + (", ..." if len(picks) > 8 else "")
    return (f"plan(s) {which} shard gradients or parameters (ZeRO-2/3) under pipeline parallelism, which "
            "Megatron-LM and DeepSpeed do not offer (torchtitan's FSDP2 does): --framework megatron, deepspeed "
            "or torchtitan ranks only the plans that framework runs")  # fmt: skip
