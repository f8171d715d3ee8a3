"""benchmarks/compiled_step.py: its static-shape step computes DecoderStep's logits (so that what it
times is the same step), run through dynamo with the quick eager backend on a toy model."""

from __future__ import annotations

import pytest
import torch

import scratchformer as sf
from benchmarks import compiled_step


@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
def test_the_static_step_is_the_decoder_step(norm_first: bool) -> None:
    torch.manual_seed(0)
    config = sf.TransformerConfig(
        50, 50, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=1, num_decoder_layers=2,
        dropout=0.0, norm_first=norm_first, final_norm=norm_first, max_len=64,
    )  # fmt: skip
    model = sf.Transformer(config).eval()
    with torch.inference_mode():
        row = compiled_step.measure(model, Bs=2, S=6, length=12, position=4, repeats=2, backend="eager")
    assert row["rows"] == 10 and row["source_tokens"] == 6
    assert all(row[f"{way}_ms"] > 0 for way in ("eager", "static", "compiled"))
    # the same formula in another order of operations: fp32 rounding on logits of magnitude ~1
    assert row["max_logit_difference"] < 1e-5


def test_a_wrong_mask_is_seen(monkeypatch) -> None:
    """The check can fail: a static step that ignores the padding mask differs from DecoderStep."""
    torch.manual_seed(1)
    config = sf.TransformerConfig(
        50, 50, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0
    )
    model = sf.Transformer(config).eval()
    step = compiled_step.static_step

    def unmasked(model):
        function = step(model)
        return lambda *state: function(*state[:6], torch.ones_like(state[6]), state[7])

    monkeypatch.setattr(compiled_step, "static_step", unmasked)
    with torch.inference_mode():
        row = compiled_step.measure(model, Bs=2, S=6, length=12, position=3, repeats=1, backend="eager")
    assert row["max_logit_difference"] > 1e-3
