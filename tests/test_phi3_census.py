"""Phi-3's own kernel and activation censuses (``phi3``, transformers 5.24's ``Phi3ForCausalLM``;
it took Mistral's, LLaMA's calls with a window part, until 2026-12-04): its fused ``qkv_proj``
(q, k and v sliced from one ``T*qkv`` output), fused ``gate_up_proj`` and ``apply_rotary_pos_emb``
(the first ``rotary_dim`` dims rotate, the rest are concatenated back whatever the factor). Both
provenances (the built-in ``phi3-mini`` and a ``model_type: phi3`` config.json) take it; its
partial rotary changes the bytes; a whole-head rotary (Phi-3-mini's) is checked against a fresh
census at factor 1.0 and a partial one at another rotated width; predict's notes name the
census a model takes (they said "LLaMA" for any family but four)."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainsim.builders import eager
from trainsim.builders.eager import (
    HF_FAMILY_CENSUSES,
    _census,
    census_omissions,
    eager_bytes,
    family_of,
    symbols,
)
from trainsim.builders.memory import _hf_activation_family, hf_activation_parts
from trainsim.builders.models import get_model, hf_config_from_dict
from trainsim.builders.plan import Plan
from trainsim.builders.predict import dense_family_notes
from trainsim.builders.spec import ModelSpec

HF = Plan(tp=1, dp=1, micro_batch=1, global_batch=1, seq_len=4096, impl="hf")
KW: dict[str, Any] = {"tokens": 4096.0, "seq": 4096.0, "dtype_bytes": 2}
# microsoft/Phi-3-mini-4k-instruct's config.json (the sizes; its 2,047-token window)
PHI3_MINI = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
             "max_position_embeddings": 4096, "sliding_window": 2047, "tie_word_embeddings": False}  # fmt: skip
# the census script's tiny Phi-3 (scripts/hf_eager_census.py's PARTIAL_DIMS["phi3"], B 3 x L 20)
TINY = ModelSpec(name="tiny-phi3", hidden=48, layers=2, heads=9, kv_heads=3, head_dim=22, ffn_hidden=112, vocab=331,
                 seq_len=20, activation="swiglu", norm="rmsnorm", position="rotary", bias=False, hf_family="phi3")  # fmt: skip
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _specs() -> list[ModelSpec]:
    return [get_model("phi3-mini"), hf_config_from_dict(PHI3_MINI, Path("Phi-3-mini-4k-instruct/config.json"))]


def test_phi3_takes_its_own_census_in_both_provenances():
    for spec in _specs():
        assert spec.hf_family == "phi3" and family_of(spec) == "phi3", spec.name
        assert _hf_activation_family(spec, HF) == ("phi3", "")
        assert "full_rotary" in _census()["phi3"] and "window" in _census()["phi3"]
    # the two provenances are one model: the same bytes
    a, b = (eager_bytes(s, "layer", "bwd", **KW) for s in _specs())
    assert a == b


def test_phi3_layer_moves_more_than_mistral_s_at_the_same_shapes():
    """The fused qkv's slices: each one's backward writes a zero-filled T*(q + 2 kv) gradient,
    and autograd adds the three; the rotary's concatenation copies q and k, its empty pass-through
    slice's gradient is a zero-filled q- or k-wide buffer. Phi-3-mini at 4,096 tokens: backward
    about 23% more than Mistral's census (LLaMA's calls) gives, forward about 7%; the rest (LLaMA's
    embedding, norm, head and loss) the same; the kept activations more too (one more q-wide
    storage a layer: the rotated query's concatenation)."""
    phi3 = get_model("phi3-mini")
    mistral = replace(phi3, hf_family="mistral")
    (pf, pkf), (mf, mkf) = (eager_bytes(s, "layer", "fwd", **KW) for s in (phi3, mistral))
    (pb, pkb), (mb, mkb) = (eager_bytes(s, "layer", "bwd", **KW) for s in (phi3, mistral))
    assert pb > 1.2 * mb and pf > 1.05 * mf and pkb > mkb and pkf > mkf
    # at least the three T*qkv slice gradients (written) and their two adds (each two read, one written)
    qkv = 4096 * (phi3.q_width + 2 * phi3.kv_width) * 2
    assert pb - mb >= (3 + 2 * 3) * qkv
    assert all(eager_bytes(phi3, "rest", ph, **KW) == eager_bytes(mistral, "rest", ph, **KW) for ph in ("fwd", "bwd"))
    assert hf_activation_parts(phi3, HF)[0] > hf_activation_parts(mistral, HF)[0]


def test_partial_rotary_factor_changes_phi3_s_bytes():
    """Phi-4-mini-like 0.75 (96 of 128 dims; here 72 of Phi-3-mini's 96) against 1.0: the rotary's
    multiplies and halves are 0.75 as wide, and the pass-through is sliced and concatenated back;
    both are priced now (Mistral's census gave the two the same bytes), and no note says the
    partial rotary is left out."""
    phi3 = get_model("phi3-mini")
    part = replace(phi3, rope_fraction=0.75)
    assert part.rotary_dims == 72
    for ph in ("fwd", "bwd"):
        assert eager_bytes(part, "layer", ph, **KW)[0] < eager_bytes(phi3, "layer", ph, **KW)[0]
    assert not [s for s in census_omissions(part, 4096) if "partial rotary" in s]
    assert hf_activation_parts(part, HF) != hf_activation_parts(phi3, HF)
    # Mistral's census rotates whole heads: the same bytes either way, and the note
    m = replace(part, hf_family="mistral")
    assert eager_bytes(m, "layer", "bwd", **KW) == eager_bytes(replace(m, rope_fraction=1.0), "layer", "bwd", **KW)
    assert [s for s in census_omissions(m, 4096) if "partial rotary" in s]


def _script(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(SCRIPTS))
    sys.modules.pop("hf_eager_census", None)
    return importlib.import_module("hf_eager_census")


def _measured(tally: Counter[tuple[str, ...]], spec: ModelSpec, ph: str) -> float:
    """A census script tally's bytes in ``ph``, its sizes evaluated for ``spec`` (B 3 x L 20)."""
    sym, item = symbols(spec, 60.0, 20.0), {"bfloat16": 2, "float32": 4, "int64": 8, "bool": 1}
    return sum(v * sym[k[2]] * item[k[3]] for k, v in tally.items() if len(k) == 4 and k[0] == ph)


def test_whole_head_and_other_partial_rotary_match_fresh_censuses(monkeypatch):
    """The shipped census (taken with 12 of 22 dims rotating) priced for the tiny model itself at
    a whole-head rotary (Phi-3-mini's factor 1.0: part full_rotary) and at 10 of 22 dims moves,
    phase by phase, the bytes of a census taken afresh there (eager.symbols evaluating it)."""
    mod = _script(monkeypatch)
    full, _ = mod._layer_rest("phi3", factor=1.0)
    monkeypatch.setitem(mod.PARTIAL_DIMS, "phi3", (48, 9, 3, 22, 10))
    ten, _ = mod._layer_rest("phi3")
    for tally, fraction, rotated in ((full, 1.0, 22), (ten, 10.5 / 22, 10)):
        spec = replace(TINY, rope_fraction=fraction)
        assert spec.rotary_dims == rotated
        for ph in ("fwd", "bwd"):
            want = _measured(tally, spec, ph)
            got = eager_bytes(spec, "layer", ph, tokens=60.0, seq=20.0, dtype_bytes=2)[0]
            assert got == pytest.approx(want, rel=1e-12), (rotated, ph)


def test_phi3_reader_reads_head_dim_as_phi3_attention_does():
    """Phi3Attention takes ``getattr(config, "head_dim", hidden_size // num_attention_heads)``:
    a config's head_dim other than 3,072 / 24 = 128 sets the query, key and fused qkv widths."""
    transformers = pytest.importorskip("transformers")
    doc = {**PHI3_MINI, "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 96}
    spec = hf_config_from_dict(doc, Path("phi3/config.json"))
    cfg = transformers.Phi3Config(**{k: v for k, v in doc.items() if k != "model_type"})
    attn = transformers.models.phi3.modeling_phi3.Phi3Attention(cfg, 0)
    assert spec.d_head == attn.head_dim == 96
    assert spec.q_width + 2 * spec.kv_width == attn.qkv_proj.out_features == 96 * (24 + 16)
    assert symbols(spec, 1.0, 1.0)["T*qkv"] == attn.qkv_proj.out_features


def test_notes_name_the_census_a_model_takes():
    """The note on features a census lacks named "LLaMA" for every family but Qwen3(-MoE), Gemma 3
    and Mixtral: a GPT-2 or Mistral census with q/k norms said LLaMA's."""
    for name, fam, label in (("gpt2", "gpt2", "GPT-2"), ("mistral-7b", "mistral", "Mistral"),
                             ("llama3-8b", "llama", "LLaMA")):  # fmt: skip
        spec = replace(get_model(name), qk_norm="full", hf_family=fam)
        notes = [n for n in dense_family_notes(spec, replace(HF, seq_len=1024)) if "q/k norms" in n]
        assert len(notes) == 1 and f"HuggingFace's {label} modules" in notes[0], (name, notes)
    assert set(eager.CENSUS_LABELS) == set(HF_FAMILY_CENSUSES)  # every family has its name
