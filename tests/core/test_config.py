"""One config base, one builder: the three model configurations share their common fields by
inheritance (no copy that can drift), validate them the same way, and build their stacks,
positions and tied output head with the same code."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import scratchformer as sf

CONFIGS = {
    sf.TransformerConfig: dict(src_vocab_size=20, tgt_vocab_size=20),
    sf.EncoderConfig: dict(vocab_size=20),
    sf.CaptioningConfig: dict(vocab_size=20),
}
SHARED = [f.name for f in dataclasses.fields(sf.ModelConfig)]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_shared_fields_come_from_the_base(cls: type) -> None:
    assert issubclass(cls, sf.ModelConfig)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    base = {f.name: f for f in dataclasses.fields(sf.ModelConfig)}
    for name in SHARED:
        assert fields[name].type == base[name].type, name
    # a field every model has is declared once, in the base; one two models have means the same in both
    everywhere = set.intersection(*({f.name for f in dataclasses.fields(c)} for c in CONFIGS))
    assert everywhere - {"vocab_size"} <= set(
        SHARED
    )  # (vocab_size: one V here, src/tgt in TransformerConfig)
    for other in CONFIGS:
        for name in set(fields) & {f.name for f in dataclasses.fields(other)}:
            assert fields[name].type == {f.name: f for f in dataclasses.fields(other)}[name].type, name


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_heads", 4.0, "num_heads must be positive"),
        ("d_model", 0, "d_model must be positive"),
        ("dropout", 1.0, r"dropout must be in \[0, 1\)"),
        ("attention_dropout", -0.1, r"attention_dropout must be in \[0, 1\)"),
        ("layer_norm_eps", math.nan, "layer_norm_eps must be positive"),
        ("activation", "swish", "activation: expected one of"),
        ("positional", "rotary", "positional: expected one of"),
        ("pad_id", 20, r"pad_id=20 is outside the vocabulary \[0, 20\)"),
    ],
)
def test_every_config_validates_the_shared_fields_alike(
    cls: type, field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cls(**CONFIGS[cls], **{field: value})


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_round_trip_and_unknown_fields(cls: type) -> None:
    config = cls(**CONFIGS[cls], d_model=32, num_heads=4, d_ff=64, bias=False)
    assert cls.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"unknown key 'dmodel'; did you mean d_model\?"):
        cls.from_dict({**config.to_dict(), "dmodel": 32})


def test_bias_reaches_every_model() -> None:
    """EncoderConfig had no ``bias`` field before the base existed: now every model honours it."""
    models = [
        sf.Transformer(sf.TransformerConfig(20, 20, d_model=16, num_heads=2, d_ff=32, bias=False)),
        sf.ContextualEncoder(sf.EncoderConfig(20, d_model=16, num_heads=2, d_ff=32, bias=False)),
        sf.CaptioningTransformer(sf.CaptioningConfig(20, d_model=16, num_heads=2, d_ff=32, bias=False)),
    ]
    for model in models:  # every linear map of the layers (not the patch embedding or the output head)
        linear = [
            m
            for stack in (model.encoder, getattr(model, "decoder", model.encoder))
            for m in stack.modules()
            if isinstance(m, torch.nn.Linear)
        ]
        assert linear and all(m.bias is None for m in linear), type(model).__name__


@pytest.mark.parametrize(
    ("norm_first", "final_norm", "layers", "expected"),
    [
        (False, None, 2, False),
        (True, None, 2, True),
        (True, None, 0, False),
        (False, True, 2, True),
        (True, False, 2, False),
    ],
)
def test_one_final_norm_rule(norm_first: bool, final_norm: bool | None, layers: int, expected: bool) -> None:
    config = sf.TransformerConfig(
        20,
        20,
        d_model=16,
        num_heads=2,
        d_ff=32,
        norm_first=norm_first,
        final_norm=final_norm,
        num_encoder_layers=layers,
    )
    model = sf.Transformer(config)
    assert (model.encoder.norm is not None) == expected
    captioner = sf.CaptioningTransformer(
        sf.CaptioningConfig(
            20,
            d_model=16,
            num_heads=2,
            d_ff=32,
            norm_first=norm_first,
            final_norm=final_norm,
            num_encoder_layers=layers,
        )
    )
    assert (captioner.encoder.norm is not None) == expected


def test_tied_output_head_shares_the_embedding() -> None:
    config = sf.TransformerConfig(20, 20, d_model=16, num_heads=2, d_ff=32, tie_output=True)
    model = sf.Transformer(config)
    assert model.generator.weight is model.tgt_embed.weight and model.generator.bias is None
    untied = config.build_output(20)
    assert untied.weight is not model.tgt_embed.weight and untied.bias is not None


def test_models_pickle_and_numpy_sizes_are_accepted() -> None:
    import pickle

    import numpy as np

    config = sf.TransformerConfig(
        np.int64(20),
        20,
        d_model=np.int64(16),
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    for model in (sf.Transformer(config), sf.optimize(sf.Transformer(config))):
        copy = pickle.loads(pickle.dumps(model))  # torch.save(model), multiprocessing spawn
        assert type(copy.encoder) is type(model.encoder)
        assert all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(), model.state_dict().values()))
