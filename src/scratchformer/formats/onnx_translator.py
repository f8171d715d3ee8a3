"""ONNX export of the translator (the encoder-decoder :class:`~scratchformer.Transformer`) as two graphs
with a key/value cache, the split of Hugging Face optimum's encoder / decoder-with-past, and
:class:`OnnxTranslator`, greedy translation with ``tokenizers``, NumPy and ONNX Runtime only::

    encoder.onnx   input_ids (B, S) int64, attention_mask (B, S) int64 (1 = real token) ->
                   last_hidden_state (B, S, D), and for each decoder layer i the cross-attention keys
                   and values of the memory, computed once: present.{i}.encoder.key / .value (B, H, S, d_k)
    decoder.onnx   input_ids (B, 1) int64 (the newest token), encoder_attention_mask (B, S) int64,
                   past_key_values.{i}.decoder.key / .value (B, H, T, d_k) (the self-attention cache,
                   T = 0 at the first step), past_key_values.{i}.encoder.key / .value (B, H, S, d_k) ->
                   logits (B, V) of the next token, present.{i}.decoder.key / .value (B, H, T + 1, d_k)

The decoder reads its position from the cache's length T; it takes one token per call (greedy search,
sampling or beams reordering the cache rows all work on that). Graphs come from the core modules
(:func:`~scratchformer.formats.onnx_export.export_copy`), dynamo exporter, opset 18.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from scratchformer.core.transformer import Transformer
from scratchformer.formats.hf_files import check_new_directory, write_directory
from scratchformer.formats.onnx_export import (
    DESCRIPTION,
    ONNX_OPSET,
    export_copy,
    export_graph,
    onnx_session,
    plain_tokenizer,
    read_description,
)

__all__ = ["OnnxTranslator", "export_translator_onnx"]

DEFAULT_DECODING = {"max_len_a": 1.2, "max_len_b": 10}  # GenerationConfig's defaults (a * S + b new tokens)


def _cache_names(layers: int, prefix: str, side: str) -> list[str]:
    """e.g. past_key_values.0.decoder.key, past_key_values.0.decoder.value, past_key_values.1...."""
    return [f"{prefix}.{i}.{side}.{kv}" for i in range(layers) for kv in ("key", "value")]


class _GraphCache:
    """One attention layer's keys/values (B, H, T, d_k) as the graph sees them: graph inputs, extended
    by concatenation (the duck type of :class:`~scratchformer.generation.KVCache` that the core
    attention reads: ``k``, ``v``, ``append``)."""

    def __init__(self, k: Tensor, v: Tensor):
        self.k, self.v = k, v

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return self.k, self.v


class _LayerCache:
    def __init__(self, self_attn: _GraphCache, cross_attn: _GraphCache):
        self.self_attn, self.cross_attn = self_attn, cross_attn


class _EncoderGraph(nn.Module):
    """Source ids and mask -> memory (B, S, D) and every decoder layer's cross-attention keys/values."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(input_ids, attention_mask != 0)  # (B, S, D)
        out = [memory]
        for layer in self.model.decoder.layers:  # W^K and W^V of the cross-attention, as its first step
            attn = layer.cross_attn
            k, v = attn.project(memory, 1, 2).split(attn.d_model, dim=-1)
            out += [attn.split_heads(k), attn.split_heads(v)]  # (B, H, S, d_k) each
        return tuple(out)


class _DecoderGraph(nn.Module):
    """One decoding step: the newest token (B, 1), the source mask and the caches -> next-token logits
    (B, V) and the self-attention caches one position longer (as
    :meth:`~scratchformer.Transformer.decode` with a cache)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, encoder_attention_mask: Tensor, *caches: Tensor
    ) -> tuple[Tensor, ...]:
        m, n = self.model, len(self.model.decoder.layers)
        past, cross = caches[: 2 * n], caches[2 * n :]
        x = m.tgt_pos(m.tgt_embed(input_ids), offset=past[0].shape[2])  # position T: the cache's length
        memory_mask = encoder_attention_mask != 0  # (B, S), True at real source tokens
        present = []
        for i, layer in enumerate(m.decoder.layers):
            cache = _LayerCache(_GraphCache(*past[2 * i : 2 * i + 2]), _GraphCache(*cross[2 * i : 2 * i + 2]))
            x = layer(x, None, memory_key_padding_mask=memory_mask, cache=cache)  # causal: one query sees all
            present += [cache.self_attn.k, cache.self_attn.v]
        x = m.decoder.norm(x) if m.decoder.norm is not None else x
        return (m.generator(x[:, -1]), *present)


def _check_special_ids(special: dict[str, int], vocab: int) -> dict[str, int]:
    if not {"pad", "bos", "eos"} <= set(special):
        raise ValueError(f"special_ids: expected pad, bos and eos, got {sorted(special)}")
    bad = {k: v for k, v in special.items() if not (isinstance(v, int) and 0 <= v < vocab)}
    if bad or special["bos"] == special["eos"]:
        raise ValueError(f"special_ids: {special} must be distinct bos/eos ids in [0, {vocab})")
    return {k: special[k] for k in ("pad", "bos", "eos")}


def _export_graphs(model: Transformer, directory: Path) -> None:
    """encoder.onnx and decoder.onnx of ``model`` (core modules, eval mode) into ``directory``; traced
    on 2 sources of 7 tokens (one padded) and 3 cached positions, with dynamic batch, source and cache
    lengths."""
    c, n = model.config, len(model.decoder.layers)
    heads, d_k = c.num_heads, c.d_model // c.num_heads
    batch, src = torch.export.Dim("batch"), torch.export.Dim("source", max=c.max_len)
    past = torch.export.Dim("past", max=c.max_len - 1)
    ids = torch.arange(3, 17).reshape(2, 7) % c.src_vocab_size
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    past_in, cross_in = (
        _cache_names(n, "past_key_values", "decoder"),
        _cache_names(n, "past_key_values", "encoder"),
    )
    export_graph(
        _EncoderGraph(model),
        (ids, mask),
        directory / "encoder.onnx",
        ["input_ids", "attention_mask"],
        ["last_hidden_state", *_cache_names(n, "present", "encoder")],
        {"input_ids": {0: batch, 1: src}, "attention_mask": {0: batch, 1: src}},
    )
    step = (
        ids[:, :1] % c.tgt_vocab_size,
        mask,
        *[torch.randn(2, heads, 3, d_k) for _ in past_in],
        *[torch.randn(2, heads, 7, d_k) for _ in cross_in],
    )
    step_shapes = {
        "input_ids": {0: batch},
        "encoder_attention_mask": {0: batch, 1: src},
        "caches": tuple([{0: batch, 2: past}] * len(past_in) + [{0: batch, 2: src}] * len(cross_in)),
    }
    names = ["input_ids", "encoder_attention_mask", *past_in, *cross_in]
    outputs = ["logits", *_cache_names(n, "present", "decoder")]
    export_graph(_DecoderGraph(model), step, directory / "decoder.onnx", names, outputs, step_shapes)


def export_translator_onnx(
    model: Transformer,
    tokenizer: Any,
    directory: str | Path,
    special_ids: dict[str, int] | None = None,
    decoding: dict[str, Any] | None = None,
) -> Path:
    """Write encoder.onnx, decoder.onnx (with the key/value cache), tokenizer.json and onnx_export.json
    into a new ``directory`` (atomically). ``tokenizer``: a ``tokenizers.Tokenizer`` (our BPE; a Marian
    sentencepiece tokenizer is refused); ``special_ids``: pad / bos / eos (default 0 / 1 / 2, our BPE's);
    ``decoding``: the recipe's section, whose max_len_a and max_len_b :class:`OnnxTranslator` uses."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model: expected a Transformer, got {type(model).__name__}")
    c = model.config
    if c.max_len < 8:  # the example traced: 7 source tokens, 3 cached positions
        raise ValueError(f"model: max_len={c.max_len} is too short to export (at least 8 positions)")
    inner = plain_tokenizer(tokenizer)
    if inner.get_vocab_size() > min(c.src_vocab_size, c.tgt_vocab_size):
        raise ValueError(
            f"tokenizer: {inner.get_vocab_size()} tokens, more than the model's vocabularies "
            f"({c.src_vocab_size}, {c.tgt_vocab_size})"
        )
    special = _check_special_ids(special_ids or {"pad": 0, "bos": 1, "eos": 2}, c.tgt_vocab_size)
    decoding = {**DEFAULT_DECODING, **{k: v for k, v in (decoding or {}).items() if k in DEFAULT_DECODING}}
    check_new_directory(directory)
    description = {
        "format": "scratchformer-onnx",
        "kind": "translator",
        "encoder": "encoder.onnx",
        "decoder": "decoder.onnx",
        "opset": ONNX_OPSET,
        "tokenizer": {
            "file": "tokenizer.json",
            "source": "ids without special tokens, cut to max_len - 1, + eos",
        },
        "special_ids": special,
        "decoding": decoding,
        "max_len": c.max_len,
        "num_decoder_layers": c.num_decoder_layers,
        "num_heads": c.num_heads,
        "head_dim": c.d_model // c.num_heads,
    }
    clone = export_copy(model)

    def fill(tmp: Path) -> None:
        _export_graphs(clone, tmp)
        Tokenizer.from_str(inner.to_str()).save(str(tmp / "tokenizer.json"))
        (tmp / DESCRIPTION).write_text(json.dumps(description, indent=2) + "\n")

    return write_directory(directory, fill)


class OnnxTranslator:
    """Greedy translation with an :func:`export_translator_onnx` directory: ``tokenizers``, NumPy and
    ONNX Runtime only, by our decoding rules (those of
    :meth:`~scratchformer.tasks.translation.Translator.translate` with ``beam_size=1``): start from
    bos; never bos or pad; stop at eos, forced after at most ``max_len_a * S + max_len_b`` new
    tokens (S: the padded source length of the batch; within the model's max_len); sources sorted by
    length and batched. ``threads``: as :func:`~scratchformer.formats.onnx_export.onnx_session`.

    Example:
        >>> OnnxTranslator("exports/multi30k-onnx").translate(["Ein Mann fährt Fahrrad."])
    """

    def __init__(self, directory: str | Path, threads: int = 0):
        directory = Path(directory)
        d = self.description = read_description(directory, ("translator",))
        self.encoder = onnx_session(directory / d["encoder"], threads)
        self.decoder = onnx_session(directory / d["decoder"], threads)
        self.tokenizer = Tokenizer.from_file(str(directory / d["tokenizer"]["file"]))
        self.tokenizer.encode_special_tokens = True  # "</s>" in a text is text, as the Translator reads it
        self.pad, self.bos, self.eos = (d["special_ids"][k] for k in ("pad", "bos", "eos"))
        n = d["num_decoder_layers"]
        self.cross_out, self.cross_in = (
            _cache_names(n, "present", "encoder"),
            _cache_names(n, "past_key_values", "encoder"),
        )
        self.past_in, self.present = (
            _cache_names(n, "past_key_values", "decoder"),
            _cache_names(n, "present", "decoder"),
        )

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids as the Translator makes them: no special tokens, cut to max_len - 1, then eos."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts: expected a sequence of str (a list of texts, not one string)")
        limit = self.description["max_len"] - 1
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids[:limit] + [self.eos] for e in encodings]

    def new_tokens(
        self, source_length: int, max_len_a: float | None = None, max_len_b: int | None = None
    ) -> int:
        """At most ``a * S + b`` new tokens, the last one eos, within the model's max_len."""
        a = self.description["decoding"]["max_len_a"] if max_len_a is None else max_len_a
        b = self.description["decoding"]["max_len_b"] if max_len_b is None else max_len_b
        return max(1, min(int(a * source_length + b), self.description["max_len"] - 1))

    def start(self, src: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """src (B, S) padded ids -> (the (B, S) int64 mask, the decoder's first cache feeds: the
        memory's cross-attention keys/values and empty self-attention caches)."""
        mask = (src != self.pad).astype(np.int64)
        outputs = self.encoder.run(
            self.cross_out, {"input_ids": src.astype(np.int64), "attention_mask": mask}
        )
        d = self.description
        empty = np.zeros((src.shape[0], d["num_heads"], 0, d["head_dim"]), dtype=np.float32)
        return mask, {**dict(zip(self.cross_in, outputs)), **{name: empty for name in self.past_in}}

    def step(
        self, tokens: np.ndarray, mask: np.ndarray, caches: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """tokens (B, 1) the newest -> (next-token logits (B, V), the caches for the next step)."""
        logits, *present = self.decoder.run(
            ["logits", *self.present], {"input_ids": tokens, "encoder_attention_mask": mask, **caches}
        )
        return logits, {**caches, **dict(zip(self.past_in, present))}

    def greedy(
        self, src: np.ndarray, max_len_a: float | None = None, max_len_b: int | None = None
    ) -> list[list[int]]:
        """src (B, S) right-padded ids -> each row's new tokens up to and with its eos."""
        steps = self.new_tokens(src.shape[1], max_len_a, max_len_b)
        mask, caches = self.start(src)
        tokens = np.full((src.shape[0], 1), self.bos, dtype=np.int64)
        finished = np.zeros(src.shape[0], dtype=bool)
        never = sorted({self.bos, self.pad} - {self.eos})
        out: list[list[int]] = [[] for _ in range(src.shape[0])]
        for step in range(steps):
            logits, caches = self.step(tokens, mask, caches)
            logits[:, never] = -np.inf
            best = np.full(len(logits), self.eos) if step == steps - 1 else logits.argmax(axis=-1)
            for i in np.flatnonzero(~finished):
                out[i].append(int(best[i]))
            finished |= best == self.eos
            if finished.all():
                break
            tokens = np.where(finished, self.pad, best)[:, None].astype(np.int64)
        return out

    def translate(self, texts: Sequence[str], batch_size: int = 64) -> list[str]:
        """Greedy translations of ``texts``, batched by source length, in input order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sources = self.encode_sources(texts)
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out = [""] * len(sources)
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            src = np.full((len(index), max(len(sources[i]) for i in index)), self.pad, dtype=np.int64)
            for row, i in enumerate(index):
                src[row, : len(sources[i])] = sources[i]
            for i, ids in zip(index, self.greedy(src)):
                out[i] = self.tokenizer.decode(ids[:-1])
        return out
