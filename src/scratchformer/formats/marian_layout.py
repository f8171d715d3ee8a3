"""The embedding layout of our Marian exports, chosen so that CTranslate2's converter
(``ct2-transformers-converter``) reads them as it reads opus-mt models, and transformers still
computes exactly our function; and its inverse, for loading such an export back.

The converter assumes opus-mt's conventions: "<pad>" is the last id (it drops the last row of
every embedding and of the output projection, and the last vocabulary entry only if it is "<pad>"),
and the decoder starts from a zero vector (``start_from_zero_embedding``: position 0 gets the
position encoding alone, whatever the start token). Ours: <pad> is id 0 and the decoder starts
from <s>, whose embedding is not zero. So the export writes::

    encoder embedding     ours, with one zero row appended (the row the converter drops; no token
                          has its id, so the tokenizer's V entries are all kept)
    decoder embedding     ours, with the start token's row zero, and (where the two vocabularies
                          have one size) the same zero row appended
    decoder positions     our table, with sqrt(D) * (the start token's vector) added to row 0: the
                          decoder's first input, start embedding + position 0, is unchanged for
                          transformers, and is what CTranslate2's zero start gives
    output projection     ours, always written out (lm_head): untied from the changed rows; with
                          the appended row, a zero row and a bias of -inf (never chosen: the
                          softmax over the V real ids is unchanged, and the converter drops it)

Why the target side gets the extra row too: transformers' beam search from 4.50 to 5.17 sizes its
scores by ``config.vocab_size`` (the source's, V + 1), not by the logits; with V + 1 outputs too,
its beam search runs on every version.

Position 0 of the decoder only ever holds the start token, so nothing else changes; transformers
reads ``embed_positions`` from the file. An opus-mt model (pad last, a zero start row) needs neither
change and is written as it came. ``config.json`` records what was changed under
:data:`LAYOUT_KEY`, which :func:`undo_ctranslate2_layout` reverses.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from scratchformer.core.embedding import sinusoidal_table
from scratchformer.core.transformer import TransformerConfig
from scratchformer.formats.hf_files import CheckpointError

__all__ = ["LAYOUT_KEY", "ctranslate2_layout", "undo_ctranslate2_layout"]

LAYOUT_KEY = "scratchformer_marian_layout"
_ENCODER, _DECODER = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
_DECODER_POSITIONS = "model.decoder.embed_positions.weight"


def ctranslate2_layout(
    state: dict[str, Tensor], c: TransformerConfig, special: dict[str, int]
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Marian's embedding, position and output tensors from our ``state`` (our names, coordinates
    already in Marian's order), and the config.json entries that go with them."""
    source, target, output = (state[k] for k in ("src_embed.weight", "tgt_embed.weight", "generator.weight"))
    bias = state.get("generator.bias", output.new_zeros(c.tgt_vocab_size))
    start = special["bos"]
    appended = 0 if special["pad"] == c.src_vocab_size - 1 else 1  # opus-mt: <pad> is last already
    appended_target = appended if c.tgt_vocab_size == c.src_vocab_size else 0
    folded = bool(target[start].any())
    if appended:
        source = torch.cat([source, source.new_zeros(appended, c.d_model)])
    if appended_target:  # the same id on the target side, its logit -inf
        target, output = (torch.cat([t, t.new_zeros(appended_target, c.d_model)]) for t in (target, output))
        bias = torch.cat([bias, bias.new_full((appended_target,), float("-inf"))])
    tensors: dict[str, Tensor] = {"final_logits_bias": bias.reshape(1, -1).clone()}
    if folded:
        scale = math.sqrt(c.d_model) if c.scale_embedding else 1.0
        positions = sinusoidal_table(c.max_len, c.d_model, layout="halves")
        positions[0] += scale * target[start]
        target = target.clone()
        target[start] = 0.0
        tensors[_DECODER_POSITIONS] = positions
    share = c.share_embeddings and not (appended or folded)
    tie = c.tie_output and not folded
    tensors.update({_ENCODER: source, _DECODER: target})
    if share:
        tensors["model.shared.weight"] = source
    if not tie:
        tensors["lm_head.weight"] = output
    entries: dict[str, Any] = {
        "vocab_size": c.src_vocab_size + appended,
        "decoder_vocab_size": c.tgt_vocab_size + appended_target,
        "share_encoder_decoder_embeddings": share,
        "tie_word_embeddings": tie,
    }
    if appended or folded:
        entries[LAYOUT_KEY] = {
            "appended_source_rows": appended,
            "appended_target_rows": appended_target,
            "decoder_start_folded": folded,
            "share_embeddings": c.share_embeddings,
            "tie_output": c.tie_output,
        }
    return tensors, entries


def undo_ctranslate2_layout(
    hf_config: dict[str, Any], hf_state: dict[str, Tensor]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config.json, tensors) of an export as our model had them before :func:`ctranslate2_layout`:
    the appended rows dropped (the target's where the export has them: those of 0.11 and before have
    none), the start token's row restored (from the output projection or the source embedding it was
    tied or shared with, else from position 0), sharing and tying as they were. Anything else is
    returned as it is."""
    layout = hf_config.get(LAYOUT_KEY)
    if layout is None:
        return hf_config, hf_state
    try:
        appended, folded = int(layout["appended_source_rows"]), bool(layout["decoder_start_folded"])
        appended_target = int(layout.get("appended_target_rows", 0))
        share, tie = bool(layout["share_embeddings"]), bool(layout["tie_output"])
        source, target = hf_state[_ENCODER], hf_state[_DECODER].clone()
        start = hf_config["decoder_start_token_id"]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"config.json: {LAYOUT_KEY} {layout!r} is incomplete ({e!r})") from e
    state = dict(hf_state)
    state[_ENCODER] = source = source[: source.shape[0] - appended]
    if appended_target:  # its rows of the decoder embedding and output projection, its bias
        target = target[: target.shape[0] - appended_target]
        if "lm_head.weight" in state:
            state["lm_head.weight"] = state["lm_head.weight"][:-appended_target]
        if "final_logits_bias" in state:
            state["final_logits_bias"] = state["final_logits_bias"][:, :-appended_target]
    if folded:
        if tie and "lm_head.weight" in state:
            target[start] = state["lm_head.weight"][start]
        elif share and source.shape == target.shape:
            target[start] = source[start]
        else:
            row = state[_DECODER_POSITIONS][0]
            formula = sinusoidal_table(1, row.shape[0], layout="halves")[0]  # 0 ... 0, 1 ... 1: exact
            scale = math.sqrt(hf_config["d_model"]) if hf_config.get("scale_embedding") else 1.0
            target[start] = (row - formula) / scale
    state[_DECODER] = target
    config = {k: v for k, v in hf_config.items() if k != LAYOUT_KEY}
    config.update(
        vocab_size=source.shape[0],
        decoder_vocab_size=target.shape[0],
        share_encoder_decoder_embeddings=share,
        tie_word_embeddings=tie,
    )
    return config, state
