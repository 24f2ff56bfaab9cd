"""Session-30 walkthrough findings on messages: each bad input is one true line."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.errors import ConfigError


def test_end_stage_layers_beyond_the_model_are_said_plainly():
    """It said "leave -8 of llama2-7b's 32 layers for 1 other stage(s)"."""
    with pytest.raises(ConfigError, match=r"^plan: first/last stage layers \(40, 0\) are more than llama2-7b's 32 layers$"):
        Plan(tp=4, pp=2, first_stage_layers=40, global_batch=8).validate(get_model("llama2-7b"))


def test_a_bad_timing_is_named_once():
    """It said "timing: timing must be ..."."""
    from trainsim.comm.readers import read_comm_dataset

    with pytest.raises(ConfigError, match=r"^timing must be 'min' or 'out-of-place', got 'foo'$"):
        read_comm_dataset([], timing="foo")


def test_a_kernel_model_archive_given_as_comm_models_is_named(tmp_path: Path):
    """It said "not UTF-8 text (byte 14)"."""
    from trainsim.comm.registry import load_model

    npz = tmp_path / "models.npz"
    with zipfile.ZipFile(npz, "w") as z:
        z.writestr("manifest.json", "{}")
    with pytest.raises(ConfigError, match=r"a zip archive \(kernel models from trainsim fit are \.npz\), not a comm model"):
        load_model(npz)


def test_scheduler_and_headroom_messages_do_not_contradict_themselves():
    """``inproc://`` said "unknown scheme 'inproc'; expected ... inproc://…"; ``100%`` said
    "expected ... a percentage (10%)"."""
    from trainsim.builders.memory import headroom_bytes
    from trainsim.search.llm import scheduler_address

    with pytest.raises(ConfigError, match=r"an in-process address names its scheduler") as e:
        scheduler_address("inproc://")
    assert "unknown scheme" not in str(e.value)
    with pytest.raises(ConfigError, match=r"a percentage must be at least 0 and below 100%$"):
        headroom_bytes("100%", 80e9)
    assert headroom_bytes("10%", 80e9) == 8_000_000_000
