"""Checkpoints written by the previous release still load, and give the outputs they gave then.

tests/fixtures/v0.1.0/ holds tiny translation, classifier and captioning checkpoints written by
scratchformer 0.1.0 (before the redesign; its parameter names had W^Q, W^K, W^V as separate
``q_proj``/``k_proj``/``v_proj`` matrices), with the logits and decodings 0.1.0 produced for fixed
inputs (tests/fixtures/v0.1.0/made_with.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import scratchformer as sf
from scratchformer.core.attention import fuse_qkv
from scratchformer.tasks.captioning import load_captioner
from scratchformer.tasks.classification import load_classifier
from scratchformer.tasks.translation import load_translator

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0.1.0"


def _expected(kind: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / kind / "expected.safetensors"))


@pytest.mark.parametrize("kind", ["translation", "text_classifier", "captioning"])
def test_fixture_has_the_old_parameter_names(kind: str) -> None:
    """Otherwise the tests below would not prove that old names still load."""
    names = load_file(str(FIXTURES / kind / "model.safetensors")).keys()
    assert any(n.endswith("self_attn.q_proj.weight") for n in names)
    assert not any("qkv_proj" in n for n in names)


def test_translation_checkpoint_of_0_1_0() -> None:
    translator = load_translator(FIXTURES / "translation", device="cpu")
    expected, decoded = (
        _expected("translation"),
        json.loads((FIXTURES / "translation" / "expected.json").read_text()),
    )
    with torch.no_grad():
        logits = translator.model.eval()(expected["src"], expected["tgt"])
    assert (logits - expected["logits"]).abs().max().item() <= 1e-5
    assert translator.translate(decoded["sources"]) == decoded["beam"]
    assert translator.translate(decoded["sources"], beam_size=1) == decoded["greedy"]


def test_classifier_checkpoint_of_0_1_0() -> None:
    classifier = load_classifier(FIXTURES / "text_classifier", device="cpu")
    expected = _expected("text_classifier")
    with torch.no_grad():
        logits = classifier.model.eval()(expected["ids"], expected["mask"])
    assert (logits - expected["logits"]).abs().max().item() <= 1e-5


def test_captioning_checkpoint_of_0_1_0() -> None:
    captioner = load_captioner(FIXTURES / "captioning", device="cpu")
    expected, decoded = (
        _expected("captioning"),
        json.loads((FIXTURES / "captioning" / "expected.json").read_text()),
    )
    with torch.no_grad():
        logits = captioner.model.eval()(expected["images"], expected["captions"])
    assert (logits - expected["logits"]).abs().max().item() <= 1e-5
    assert captioner.caption(expected["images"]) == decoded["beam"]
    assert captioner.caption(expected["images"], beam_size=1) == decoded["greedy"]


def test_separate_qkv_matrices_load_into_the_stacked_weight() -> None:
    """load_state_dict (strict) accepts W^Q, W^K, W^V under their 0.1 names, stacked in that order."""
    torch.manual_seed(0)
    mha = sf.MultiHeadAttention(16, 4)
    w_q, w_k, w_v = torch.randn(3, 16, 16)
    b_q, b_k, b_v = torch.randn(3, 16)
    old = {
        "q_proj.weight": w_q,
        "k_proj.weight": w_k,
        "v_proj.weight": w_v,
        "q_proj.bias": b_q,
        "k_proj.bias": b_k,
        "v_proj.bias": b_v,
        "out_proj.weight": torch.eye(16),
        "out_proj.bias": torch.zeros(16),
    }
    mha.load_state_dict(old)
    assert torch.equal(mha.qkv_proj.weight, torch.cat([w_q, w_k, w_v]))
    assert torch.equal(mha.qkv_proj.bias, torch.cat([b_q, b_k, b_v]))
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        out, _ = mha(x, need_weights=True)
        scores = (x @ w_q.T + b_q).view(2, 3, 4, 4).transpose(1, 2) @ (x @ w_k.T + b_k).view(
            2, 3, 4, 4
        ).permute(0, 2, 3, 1)
        heads = torch.softmax(scores / 2.0, -1) @ (x @ w_v.T + b_v).view(2, 3, 4, 4).transpose(1, 2)
    assert (out - heads.transpose(1, 2).reshape(2, 3, 16)).abs().max() <= 1e-5  # the paper's formula, by hand

    incomplete = {k: v for k, v in old.items() if k != "k_proj.weight"}
    with pytest.raises(RuntimeError, match="qkv_proj.weight"):  # not silently half-loaded
        sf.MultiHeadAttention(16, 4).load_state_dict(incomplete)


def test_fuse_qkv_renames_under_every_prefix_only() -> None:
    state = {
        f"layers.{i}.attn.{p}_proj.weight": torch.full((2, 2), float(i)) for i in range(2) for p in "qkv"
    }
    state["layers.0.other.q_proj.weight"] = torch.zeros(1)  # no k/v partners: left alone
    fuse_qkv(state)
    assert sorted(state) == [
        "layers.0.attn.qkv_proj.weight",
        "layers.0.other.q_proj.weight",
        "layers.1.attn.qkv_proj.weight",
    ]
    assert state["layers.1.attn.qkv_proj.weight"].shape == (6, 2)


def test_fuse_qkv_leaves_what_it_cannot_stack_for_the_error_report() -> None:
    mismatched = {
        "a.q_proj.weight": torch.zeros(4, 4),
        "a.k_proj.weight": torch.zeros(4, 3),
        "a.v_proj.weight": torch.zeros(4, 4),
    }
    fuse_qkv(mismatched)
    assert sorted(mismatched) == ["a.k_proj.weight", "a.q_proj.weight", "a.v_proj.weight"]
    both = {
        "a.qkv_proj.weight": torch.ones(12, 4),
        **{f"a.{x}_proj.weight": torch.zeros(4, 4) for x in "qkv"},
    }
    fuse_qkv(both)  # never overwrites a stacked weight that is already there
    assert torch.equal(both["a.qkv_proj.weight"], torch.ones(12, 4)) and "a.q_proj.weight" in both
