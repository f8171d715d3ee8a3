"""Marian translation checkpoints (``Helsinki-NLP/opus-mt-*``, as ``transformers`` saves them) in and out
of our :class:`~scratchformer.Transformer`.

A Marian model is the paper's Transformer (post-LN, sinusoidal positions, shared and tied
embeddings) with four differences, each a visible :class:`~scratchformer.TransformerConfig` field::

    sinusoidal_layout="halves"   all sines, then all cosines (the paper interleaves them)
    activation="silu"            Marian's "swish"
    output_bias=True             final_logits_bias, added to the tied output projection
    scale_embedding              from config.json (opus-mt: True, times sqrt(D) as the paper)

and decoding starts from the padding token (``decoder_start_token_id`` = pad). The weights::

    model.shared (or encoder/decoder.embed_tokens)  -> src_embed (tgt_embed)
    model.{encoder,decoder}.layers.i.self_attn.{q,k,v}_proj -> ...self_attn.qkv_proj (stacked)
    model.{encoder,decoder}.layers.i.self_attn.out_proj     -> ...self_attn.out_proj
    model.decoder.layers.i.encoder_attn.*                   -> decoder.layers.i.cross_attn.*
    self_attn_layer_norm / encoder_attn_layer_norm / final_layer_norm -> norm1 / norm2 / norm2 or norm3
    fc1, fc2                                                -> feed_forward.linear1, linear2
    lm_head (tied: the target embedding), final_logits_bias -> generator.weight, generator.bias

Export writes the same names back. Our models use the paper's interleaved positions, which Marian
cannot express; they are exported exactly all the same by a change of basis: the D coordinates of
the residual stream are permuted (sines first, then cosines) in every weight that reads or writes
it. LayerNorm is blind to the order of coordinates and every other map just follows, so the
exported network computes the same function (up to float rounding). The embeddings are laid out so
that CTranslate2's ``ct2-transformers-converter`` reads the export as it reads opus-mt models and
computes the same function too (:mod:`~scratchformer.formats.marian_layout`).

Pre-LN models go in and out as Pegasus (``PegasusForConditionalGeneration``), Marian's pre-LN sibling:
the same names, a LayerNorm before each sublayer, one after each stack (``model.encoder.layer_norm``,
``model.decoder.layer_norm``: our ``norm_first=True, final_norm=True``) and one embedding matrix.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scratchformer.core.attention import fuse_qkv
from scratchformer.core.transformer import Transformer, TransformerConfig
from scratchformer.formats.hf_files import (
    CheckpointError,
    fit_state,
    model_type,
    read_json,
    read_weights,
    split_qkv,
)
from scratchformer.formats.marian_layout import ctranslate2_layout, undo_ctranslate2_layout

__all__ = ["is_marian_dir", "load_marian", "marian_config", "marian_export", "map_marian_weights"]

_ATTENTION = {
    f"{hf}.{x}_proj": f"{ours}.{x}_proj"
    for x in ("q", "k", "v", "out")
    for hf, ours in (("self_attn", "self_attn"), ("encoder_attn", "cross_attn"))
}
_ENCODER_LAYER = {
    **{k: v for k, v in _ATTENTION.items() if k.startswith("self_attn")},
    "self_attn_layer_norm": "norm1",
    "fc1": "feed_forward.linear1",
    "fc2": "feed_forward.linear2",
    "final_layer_norm": "norm2",
}
_DECODER_LAYER = {
    **_ATTENTION,
    "self_attn_layer_norm": "norm1",
    "encoder_attn_layer_norm": "norm2",
    "fc1": "feed_forward.linear1",
    "fc2": "feed_forward.linear2",
    "final_layer_norm": "norm3",
}
_LAYERS = {"encoder": _ENCODER_LAYER, "decoder": _DECODER_LAYER}
_LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)")
_FINAL_NORM = re.compile(r"model\.(encoder|decoder)\.layer_norm\.(weight|bias)")  # Pegasus
_FAMILIES = ("marian", "pegasus")  # post-LN, pre-LN with a LayerNorm after each stack
_POSITIONS = re.compile(r"model\.(encoder|decoder)\.embed_positions\.weight")  # a formula, recomputed
_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}


def is_marian_dir(directory: str | Path) -> bool:
    """A Hugging Face Marian directory, or one of its pre-LN sibling Pegasus (config.json with
    model_type "marian" or "pegasus")?"""
    return model_type(directory) in _FAMILIES


def marian_config(hf: dict[str, Any]) -> tuple[TransformerConfig, dict[str, int]]:
    """A Marian ``config.json`` -> (our config, the special ids pad / bos (= decoder start) / eos)."""
    if hf.get("model_type") not in _FAMILIES:
        raise CheckpointError(
            f"config.json: model_type {hf.get('model_type')!r} is not 'marian' or 'pegasus'"
        )
    pegasus = hf["model_type"] == "pegasus"
    try:
        act = _ACTIVATIONS.get(hf.get("activation_function", "swish"))
        if act is None:
            raise CheckpointError(
                f"config.json: activation_function {hf['activation_function']!r} is not supported "
                f"(supported: {sorted(_ACTIVATIONS)})"
            )
        for field in ("attention_heads", "ffn_dim"):
            if hf[f"encoder_{field}"] != hf[f"decoder_{field}"]:
                raise CheckpointError(f"config.json: encoder_{field} != decoder_{field} is not supported")
        share = pegasus or hf.get("share_encoder_decoder_embeddings", True)
        pad = hf["pad_token_id"]
        config = TransformerConfig(
            src_vocab_size=hf["vocab_size"],
            tgt_vocab_size=hf["vocab_size"] if share else hf["decoder_vocab_size"],
            d_model=hf["d_model"],
            num_heads=hf["encoder_attention_heads"],
            d_ff=hf["encoder_ffn_dim"],
            num_encoder_layers=hf["encoder_layers"],
            num_decoder_layers=hf["decoder_layers"],
            dropout=hf.get("dropout", 0.1),
            attention_dropout=hf.get("attention_dropout", 0.0),
            activation=act,
            norm_first=pegasus,
            final_norm=pegasus,
            layer_norm_eps=1e-5,
            max_len=hf.get("max_position_embeddings", 1024),
            positional="sinusoidal",
            sinusoidal_layout="halves",
            scale_embedding=hf.get("scale_embedding", False),
            output_bias=True,
            pad_id=pad,
            share_embeddings=share,
            tie_output=hf.get("tie_word_embeddings", True),
        )
    except KeyError as e:
        raise CheckpointError(f"config.json: missing required field {e.args[0]!r}") from e
    special = {"pad": pad, "bos": hf.get("decoder_start_token_id", pad), "eos": hf.get("eos_token_id", 0)}
    return config, special


def map_marian_weights(
    hf_state: dict[str, Tensor], config: TransformerConfig
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename Marian tensors to ours. Returns (our state dict, unexpected Marian names)."""
    ours: dict[str, Tensor] = {}
    unexpected = []
    for name, tensor in hf_state.items():
        layer = _LAYER.fullmatch(name)
        if layer and layer[3] in _LAYERS[layer[1]]:
            ours[f"{layer[1]}.layers.{layer[2]}.{_LAYERS[layer[1]][layer[3]]}.{layer[4]}"] = tensor
        elif _FINAL_NORM.fullmatch(name):
            ours[name.replace("model.", "", 1).replace("layer_norm", "norm")] = tensor
        elif name == "model.shared.weight":  # untied, transformers saves it beside the two it never reads
            if "model.encoder.embed_tokens.weight" not in hf_state:
                ours["src_embed.weight"] = tensor
        elif name == "model.encoder.embed_tokens.weight":
            ours["src_embed.weight"] = tensor
        elif name == "model.decoder.embed_tokens.weight":
            ours["tgt_embed.weight"] = tensor
        elif name == "lm_head.weight":
            ours["generator.weight"] = tensor
        elif name == "final_logits_bias":
            ours["generator.bias"] = tensor.reshape(-1)
        elif not _POSITIONS.fullmatch(name):
            unexpected.append(name)
    if (
        config.share_embeddings and "src_embed.weight" in ours
    ):  # one matrix, saved once under any of its names
        ours["tgt_embed.weight"] = ours["src_embed.weight"]
    if config.tie_output and "tgt_embed.weight" in ours:
        ours["generator.weight"] = ours["tgt_embed.weight"]
    fuse_qkv(ours)  # q, k, v -> the stacked [W^Q; W^K; W^V]
    return ours, unexpected


def _decoding(directory: Path, hf_config: dict[str, Any], config: TransformerConfig) -> dict[str, Any]:
    """Decoding defaults as ``generate`` would take them: generation_config.json, else the legacy
    fields of config.json (num_beams, max_length, length_penalty), else Hugging Face's defaults; the
    exact ``a * S + b`` length rule where our export wrote it."""
    path = directory / "generation_config.json"
    gen = {
        **{k: v for k, v in hf_config.items() if k in ("num_beams", "max_length", "length_penalty")},
        **(read_json(path) if path.is_file() else {}),
    }
    from scratchformer.formats.hf_generation import read_decoding

    return read_decoding(gen, config.max_len, path)  # our export: the exact a * S + b rule


def load_marian(directory: str | Path) -> tuple[Transformer, dict[str, int], dict[str, Any]]:
    """A Marian checkpoint directory -> (our Transformer in eval mode, special ids, decoding defaults).

    Raises:
        FileNotFoundError: no directory, config.json or model.safetensors (pickle files are refused).
        CheckpointError: a config field we cannot express, or tensors that do not fit (all listed).
    """
    directory = Path(directory)
    hf_config, hf_state = undo_ctranslate2_layout(*read_weights(directory))
    config, special = marian_config(hf_config)
    config = _sharing_as_saved(config, hf_state)
    state, unexpected = map_marian_weights(hf_state, config)
    model = fit_state(lambda: Transformer(config), state, unexpected, directory / "model.safetensors")
    return model.eval(), special, _decoding(directory, hf_config, config)


def _sharing_as_saved(config: TransformerConfig, hf_state: dict[str, Tensor]) -> TransformerConfig:
    """Share (and tie) only the embedding matrices saved equal: with ``tie_word_embeddings: false``
    transformers keeps the encoder's, the decoder's and the output's apart, whatever
    ``share_encoder_decoder_embeddings`` says, and fine-tuning makes them differ."""
    source, target, output = (
        hf_state.get(name)
        for name in (
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        )
    )
    share = config.share_embeddings and (source is None or target is None or torch.equal(source, target))
    tie = config.tie_output and (target is None or output is None or torch.equal(target, output))
    return dataclasses.replace(config, share_embeddings=share, tie_output=tie)


def _halves_order(d_model: int) -> Tensor:
    """The permutation that takes interleaved sin/cos coordinates to halves: 0, 2, 4, ..., 1, 3, 5, ..."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _permute_width(state: dict[str, Tensor], order: Tensor) -> dict[str, Tensor]:
    """Re-order the residual stream's D coordinates: the columns of every weight that reads it
    (embeddings, W^Q/K/V, W1, the output projection), the rows of every one that writes it (W^O, W2
    and their biases), and LayerNorm's gamma and beta."""
    out = {}
    for name, t in state.items():
        if name.endswith(("embed.weight", "generator.weight", "qkv_proj.weight", "linear1.weight")):
            out[name] = t[:, order]
        elif (
            name.endswith(("out_proj.weight", "out_proj.bias", "linear2.weight", "linear2.bias"))
            or ".norm" in name
        ):
            out[name] = t[order]
        elif name.endswith(("qkv_proj.bias", "linear1.bias", "generator.bias")):
            out[name] = t
        else:
            raise AssertionError(f"_permute_width: no rule for {name}")
    return out


def marian_export(
    model: Transformer, special: dict[str, int], decoding: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, Any]]:
    """Our Transformer -> (config.json, its tensors, generation_config.json): a post-LN model as a
    Marian checkpoint, a pre-LN one (with the stacks' final LayerNorms) as Pegasus, Marian's pre-LN
    sibling. A configuration neither can express is a ``ValueError`` naming every such option."""
    _check_marian_can_express(model)
    if model.config.norm_first:
        config, state = _pegasus_config(model.config, special), _pegasus_state(model)
    else:
        state, layout = _marian_state(model, special)
        config = {**_marian_config(model.config, special), **layout}
    return config, state, _marian_generation(model.config, special, decoding)


def _check_marian_can_express(model: Transformer) -> None:
    """A ``ValueError`` naming every option of ``model`` that neither a Marian (post-LN) nor a Pegasus
    (pre-LN) checkpoint has a place for."""
    c = model.config
    final_norms = model.encoder.norm is not None, model.decoder.norm is not None
    problems = [
        text
        for bad, text in (
            (
                c.norm_first and not all(final_norms),
                "norm_first=True without final_norm (Pegasus, pre-LN, ends each stack with a LayerNorm)",
            ),
            (
                not c.norm_first and any(final_norms),
                "final_norm=True with norm_first=False (Marian has no LayerNorm after the stacks)",
            ),
            (
                c.norm_first and not c.share_embeddings,
                "share_embeddings=False with norm_first=True (Pegasus has one embedding matrix)",
            ),
            (
                c.positional != "sinusoidal",
                f"positional={c.positional!r} (Marian's and Pegasus's positions are sinusoidal)",
            ),
            (not c.bias, "bias=False (Marian's linear maps have biases)"),
            (c.layer_norm_eps != 1e-5, f"layer_norm_eps={c.layer_norm_eps} (Marian's LayerNorm uses 1e-5)"),
            (c.pad_id is None, "pad_id=None (Marian needs a padding id)"),
        )
        if bad
    ]
    if problems:
        family = "Pegasus" if c.norm_first else "Marian"
        raise ValueError(f"this model cannot be written as a {family} checkpoint: " + "; ".join(problems))


def _marian_state(model: Transformer, special: dict[str, int]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Our state dict under Marian's names (W^Q, W^K, W^V split; interleaved positions permuted; the
    embeddings as :func:`~scratchformer.formats.marian_layout.ctranslate2_layout` lays them out),
    and the config.json entries of that layout."""
    c = model.config
    state, hf_state = _layer_tensors(model)
    # Every name of the embeddings: transformers ties encoder/decoder to model.shared only when the
    # output is tied too (tie_word_embeddings), so each is written out.
    embeddings, entries = ctranslate2_layout(state, c, special)
    hf_state.update(embeddings)  # final_logits_bias among them
    return hf_state, entries


def _layer_tensors(model: Transformer) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(our state dict as float32, coordinates in Marian's order; the layers' tensors under Marian's
    names, W^Q, W^K, W^V split)."""
    c = model.config
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    if c.sinusoidal_layout == "interleaved":
        state = _permute_width(state, _halves_order(c.d_model))
    hf_state: dict[str, Tensor] = {}
    inverse = {stack: {ours: hf for hf, ours in table.items()} for stack, table in _LAYERS.items()}
    for name, tensor in split_qkv(state).items():
        layer = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
        if layer is not None:
            stack, i, module, kind = layer.groups()
            hf_state[f"model.{stack}.layers.{i}.{inverse[stack][module]}.{kind}"] = tensor
    return state, hf_state


def _pegasus_state(model: Transformer) -> dict[str, Tensor]:
    """Our pre-LN state dict under Pegasus's names: Marian's, the stacks' final LayerNorms
    (``model.{encoder,decoder}.layer_norm``) and the one embedding matrix (``model.shared``)."""
    c = model.config
    state, hf_state = _layer_tensors(model)
    for stack, kind in itertools.product(("encoder", "decoder"), ("weight", "bias")):
        hf_state[f"model.{stack}.layer_norm.{kind}"] = state[f"{stack}.norm.{kind}"]
    for name in ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens"):
        hf_state[f"{name}.weight"] = state["src_embed.weight"]
    if not c.tie_output:
        hf_state["lm_head.weight"] = state["generator.weight"]
    bias = state.get("generator.bias", torch.zeros(c.tgt_vocab_size))
    hf_state["final_logits_bias"] = bias.reshape(1, -1).clone()
    return hf_state


def _pegasus_config(c: TransformerConfig, special: dict[str, int]) -> dict[str, Any]:
    """Pegasus's config.json: Marian's, less the fields of separate vocabularies."""
    config = _marian_config(c, special)
    for name in ("decoder_vocab_size", "share_encoder_decoder_embeddings"):
        del config[name]
    return config | {"model_type": "pegasus", "architectures": ["PegasusForConditionalGeneration"]}


def _marian_config(c: TransformerConfig, special: dict[str, int]) -> dict[str, Any]:
    """Marian's config.json for our TransformerConfig ``c``."""
    pad, bos, eos = special["pad"], special["bos"], special["eos"]
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        "is_encoder_decoder": True,
        "vocab_size": c.src_vocab_size,
        "decoder_vocab_size": c.tgt_vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.num_encoder_layers,
        "decoder_layers": c.num_decoder_layers,
        "encoder_attention_heads": c.num_heads,
        "decoder_attention_heads": c.num_heads,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "activation_function": {"silu": "swish"}.get(c.activation, c.activation),
        "dropout": c.dropout,
        "attention_dropout": c.dropout if c.attention_dropout is None else c.attention_dropout,
        "activation_dropout": c.dropout,
        "max_position_embeddings": c.max_len,
        "scale_embedding": c.scale_embedding,
        "pad_token_id": pad,
        "eos_token_id": eos,
        "decoder_start_token_id": bos,
        "forced_eos_token_id": eos,
        "share_encoder_decoder_embeddings": c.share_embeddings,
        "tie_word_embeddings": c.tie_output,
        "dtype": "float32",
    }


def _marian_generation(
    c: TransformerConfig, special: dict[str, int], decoding: dict[str, Any]
) -> dict[str, Any]:
    """generation_config.json: our decoding defaults, as generate() reads them (a * S + b: the
    largest limit any source gets, and the exact rule under keys of ours; see hf_generation)."""
    from scratchformer.formats.hf_generation import hf_generation_config

    return hf_generation_config(decoding, special, c.max_len)
