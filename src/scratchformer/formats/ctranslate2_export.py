"""Our translation :class:`~scratchformer.Transformer` as a CTranslate2 model directory, written
directly with CTranslate2's specification API (as its own fairseq and OpenNMT-py converters fill it)::

    model.bin, config.json, shared_vocabulary.json   the engine's files (ctranslate2.Translator)
    tokenizer.json, tokenizer_config.json            transformers.AutoTokenizer (appends </s>)
    README.md                                        how to translate with it, and with which options

Every weight goes over as it is: W^Q, W^K, W^V stay stacked (CTranslate2's fused self-attention
matrix; cross-attention takes [W^K; W^V] as one), the LayerNorms keep their places (pre- or
post-LN, and a final one after a stack when the model has it, post-LN included), and the positions
are stored as our table, so the paper's interleaved sin/cos layout (which CTranslate2's built-in
sinusoids, all sines then all cosines, starting at position 1, do not follow) is exact; a learned
table likewise. Decoding reproduces ours with the options of :func:`ctranslate2_options`: CTranslate2's
``max_decoding_length`` is one number per batch where ours is ``a * S + b`` for the batch's padded
source length S (EOS included), so translate in the batches our translator makes
(:func:`translate_like_ours`). Greedy search is then the same; beam search nearly always (its
stopping rule is CTranslate2's own: see :func:`ctranslate2_options`).

The layers' code needs only CTranslate2's spec classes; the tokenizer's Hugging Face files come from
the caller (``tokenizer_files``: the models layer does not read ``data/``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scratchformer.core.embedding import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from scratchformer.core.transformer import Transformer
from scratchformer.formats.hf_files import check_new_directory, write_directory

__all__ = [
    "QUANTIZATIONS",
    "check_ctranslate2_can_express",
    "ctranslate2_options",
    "ctranslate2_vocabularies",
    "transformer_spec",
    "translate_like_ours",
    "write_ctranslate2",
]

QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}  # gelu: the exact (erf) one, as ours


# Decoding options of ours that CTranslate2 has no exact counterpart for, and their "off" values.
_NOT_EXPORTED = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "do_sample": False}


def ctranslate2_options(
    decoding: dict[str, Any],
    source_length: int,
    max_len: int | None = None,
    beam_size: int | None = None,
    never: Sequence[str] = ("<s>", "<pad>"),
) -> dict[str, Any]:
    """``translate_batch`` options that decode as our translator does, for a batch whose longest
    source has ``source_length`` tokens (EOS included; our ``a * S + b`` counts the padded length).
    ``decoding``: the recipe's section (``min_new_tokens`` too: ``min_decoding_length``; n-gram and
    repetition rules and sampling are refused, CTranslate2 applies them otherwise); ``never``: the
    tokens ours never generates (BOS and pad; an opus-mt model's start token is its pad).

    ``max_decoding_length`` is one less than our new-token limit: we force EOS as the last new token
    (within ``max_len - 1``, the model's positions), CTranslate2 stops after its last token without
    one. ``return_end_token`` keeps </s> in the hypothesis, so the length penalty divides by the
    length with EOS, as ours (strip it, or decode with ``skip_special_tokens=True``); we never emit
    BOS or pad, nor may it (``suppress_sequences``); EOS may come first (``min_decoding_length=0``).

    Beam search cannot be matched in every case. CTranslate2 stops a sentence once ``beam_size *
    patience`` hypotheses have finished (with ``length_penalty=0``: once the top beam has); ours
    (Hugging Face's rule) once ``beam_size`` have and the best live one, normalised at its length,
    cannot beat the worst of them, so a longer hypothesis with a better score can still win.
    ``patience=1.5`` follows ours closest: on Multi30k's 1,000 test lines (beam 5, a model of BLEU
    20), 21 translations differed with patience 1, each scoring worse than ours (CTranslate2 stopped
    too early), 13 with 1.25, 7 with 1.5 and 8 with 2, each scoring better than ours (it searched on
    where ours had stopped); on toy models 99.0-99.4% of lines were identical with 1, 99.8-100% with
    1.5. Greedy search is identical. At the length limit we score the forced EOS, CTranslate2 ends
    without one, so a hypothesis cut there may rank differently. Suppressed tokens are removed
    before the softmax there, after it here (a difference of p(BOS) + p(pad) in the scores)."""
    used = sorted(k for k, off in _NOT_EXPORTED.items() if decoding.get(k, off) != off)
    if used:
        raise ValueError(f"decoding: {used} have no exact CTranslate2 counterpart (leave them out)")
    a, b = float(decoding.get("max_len_a", 1.2)), int(decoding.get("max_len_b", 10))
    new_tokens = int(a * source_length + b)
    if max_len is not None:
        new_tokens = min(new_tokens, max_len - 1)
    return {
        "beam_size": int(beam_size or decoding.get("beam_size", 5)),
        "length_penalty": float(decoding.get("length_penalty", 1.0)),
        "patience": 1.5,
        "max_decoding_length": max(1, new_tokens - 1),
        "min_decoding_length": int(decoding.get("min_new_tokens", 0)),
        "return_end_token": True,
        "suppress_sequences": [[token] for token in never],
        "max_input_length": 0,
    }


def translate_like_ours(
    translator: Any,
    sources: Sequence[Sequence[str]],
    decoding: dict[str, Any],
    max_len: int,
    beam_size: int | None = None,
    batch_size: int = 64,
    end_token: str = "</s>",
    never: Sequence[str] = ("<s>", "<pad>"),
    **options: Any,
) -> list[list[str]]:
    """Translate token lists ``sources`` (each with its ``end_token``, as ``AutoTokenizer.encode``
    gives them) with a ``ctranslate2.Translator`` in the batches our Translator makes: sorted by
    length, ``batch_size`` at a time, each with the limit of its longest source
    (:func:`ctranslate2_options` with ``never``, then ``options`` on top); a source longer than
    ``max_len`` cut to its first ``max_len - 1`` tokens and the end token, as ours. Returns each
    source's best hypothesis, in input order, without the end token."""
    cut = [list(s) if len(s) <= max_len else [*s[: max_len - 1], end_token] for s in sources]
    order = sorted(range(len(cut)), key=lambda i: len(cut[i]))
    out: list[list[str]] = [[] for _ in cut]
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        settings = ctranslate2_options(decoding, max(len(cut[i]) for i in index), max_len, beam_size, never)
        results = translator.translate_batch([cut[i] for i in index], **{**settings, **options})
        for i, result in zip(index, results):
            best = result.hypotheses[0]
            out[i] = best[:-1] if best and best[-1] == end_token else best
    return out


def ctranslate2_vocabularies(model: Transformer, tokenizer: Any) -> tuple[list[str], list[str]]:
    """(source tokens, target tokens) by id: a ``tokenizers.Tokenizer``'s vocabulary for both
    sides, or a Marian tokenizer's ``vocab`` and ``target_vocab``. A ``ValueError`` if their sizes
    are not the model's."""
    if hasattr(tokenizer, "target_vocab"):  # scratchformer.data.MarianTokenizer (opus-mt)
        source, target = (_by_id(v) for v in (tokenizer.vocab, tokenizer.target_vocab))
    else:
        source = target = _by_id(tokenizer.get_vocab(with_added_tokens=True))
    c = model.config
    if (len(source), len(target)) != (c.src_vocab_size, c.tgt_vocab_size):
        raise ValueError(
            f"the tokenizer has {len(source)} source and {len(target)} target tokens, the model "
            f"{c.src_vocab_size} and {c.tgt_vocab_size}: it does not belong to this model"
        )
    return source, target


def _by_id(vocab: dict[str, int]) -> list[str]:
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError("the tokenizer's ids are not 0, 1, ..., V - 1 (a gap or a duplicate)")
    return tokens


def check_ctranslate2_can_express(model: Transformer, special_ids: dict[str, int], target: list[str]) -> None:
    """A ``ValueError`` naming every option of ``model`` (and special id) that a CTranslate2
    Transformer has no place for."""
    c = model.config
    problems = [
        text
        for bad, text in (
            (
                c.num_encoder_layers == 0,
                "num_encoder_layers=0 (CTranslate2's encoder needs at least one layer)",
            ),
            (
                not all(
                    0 <= special_ids.get(k, 0 if k == "pad" else -1) < len(target)
                    for k in ("bos", "eos", "pad")
                ),
                f"special ids {special_ids} (bos, eos and pad must be target tokens)",
            ),
            ("<unk>" not in target, "no '<unk>' token (CTranslate2's vocabularies need one)"),
        )
        if bad
    ]
    if problems:
        raise ValueError("this model cannot be written as a CTranslate2 model: " + "; ".join(problems))


def _array(t: Tensor) -> np.ndarray:
    """A float32 copy: CTranslate2's quantization scales its arrays in place (ours must not change)."""
    return t.detach().to("cpu", torch.float32).contiguous().numpy().copy()


def _linear(spec: Any, weight: Tensor, bias: Tensor | None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _layer_norm(spec: Any, norm: Any) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _attention(spec: Any, attn: Any, norm: Any, cross: bool) -> None:
    """Self-attention: linear[0] = [W^Q; W^K; W^V]; cross-attention: linear[0] = W^Q, linear[1] =
    [W^K; W^V] (read from the memory); the last one W^O. ``norm`` is the sub-layer's LayerNorm."""
    w, b, d = attn.qkv_proj.weight, attn.qkv_proj.bias, attn.d_model
    if cross:
        _linear(spec.linear[0], w[:d], None if b is None else b[:d])
        _linear(spec.linear[1], w[d:], None if b is None else b[d:])
    else:
        _linear(spec.linear[0], w, b)
    _linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)
    _layer_norm(spec.layer_norm, norm)


def _feed_forward(spec: Any, ff: Any, norm: Any) -> None:
    _linear(spec.linear_0, ff.linear1.weight, ff.linear1.bias)
    _linear(spec.linear_1, ff.linear2.weight, ff.linear2.bias)
    _layer_norm(spec.layer_norm, norm)


def _positions(positions: Any) -> np.ndarray:
    """Our table, (max_len, D): the sinusoids in the model's own layout, or the learned weights."""
    if isinstance(positions, SinusoidalPositionalEncoding):
        return _array(positions.table)
    if isinstance(positions, LearnedPositionalEmbedding):
        return _array(positions.weight)
    raise ValueError(f"positions: {type(positions).__name__} is not supported")


def _stack(spec: Any, model: Transformer, side: str) -> None:
    """The embeddings, positions, layers and final LayerNorm of one stack ("encoder" or "decoder")."""
    c = model.config
    stack, embed, positions = (
        (model.encoder, model.src_embed, model.src_pos)
        if side == "encoder"
        else (model.decoder, model.tgt_embed, model.tgt_pos)
    )
    (spec.embeddings[0] if side == "encoder" else spec.embeddings).weight = _array(embed.weight)
    spec.scale_embeddings = c.scale_embedding  # True: times sqrt(D), as ours
    spec.position_encodings.encodings = _positions(positions)
    for layer_spec, layer in zip(spec.layer, stack.layers):
        _attention(layer_spec.self_attention, layer.self_attn, layer.norm1, cross=False)
        if side == "decoder":
            _attention(layer_spec.attention, layer.cross_attn, layer.norm2, cross=True)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.norm3 if side == "decoder" else layer.norm2)
    if stack.norm is not None:
        _layer_norm(spec.layer_norm, stack.norm)


def transformer_spec(
    model: Transformer, special_ids: dict[str, int], vocabularies: tuple[list[str], list[str]]
) -> Any:
    """The filled ``ctranslate2.specs.TransformerSpec`` of ``model`` (validated, not yet optimised)."""
    from ctranslate2 import specs

    c = model.config
    spec = specs.TransformerSpec.from_config(
        (c.num_encoder_layers, c.num_decoder_layers),
        c.num_heads,
        pre_norm=True,  # (the spec has a final LayerNorm only when pre-LN; the engine reads it either way)
        no_final_norm=not c.has_final_norm(c.num_decoder_layers),
        activation=getattr(specs.Activation, _ACTIVATIONS[c.activation]),
    )
    spec.encoder.pre_norm = spec.decoder.pre_norm = c.norm_first
    _stack(spec.encoder, model, "encoder")
    _stack(spec.decoder, model, "decoder")
    _linear(spec.decoder.projection, model.generator.weight, model.generator.bias)
    source, target = vocabularies
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    spec.config.bos_token = spec.config.decoder_start_token = target[special_ids["bos"]]
    spec.config.eos_token = target[special_ids["eos"]]
    spec.config.unk_token = "<unk>"
    spec.config.layer_norm_epsilon = c.layer_norm_eps
    spec.validate()
    return spec


def write_ctranslate2(
    model: Transformer,
    tokenizer: Any,
    special_ids: dict[str, int],
    directory: str | Path,
    quantization: str | None = None,
    *,
    tokenizer_files: Callable[[Path], None] | None = None,
    decoding: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a CTranslate2 model into a new ``directory`` (atomically: a temporary
    sibling renamed into place) with the tokenizer's files and a README.md on how to translate.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (one vocabulary for both sides) or a Marian tokenizer
            (``vocab`` / ``target_vocab``); its size must be the model's.
        special_ids: pad / bos (the decoder's first token) / eos.
        quantization: the weights' type on disk (``QUANTIZATIONS``; None: as the model's, float32);
            ``ctranslate2.Translator(..., compute_type=...)`` may convert again when loading.
        tokenizer_files: writes the Hugging Face tokenizer files into the folder it is given (for a
            ``tokenizers.Tokenizer``: ``save_hf_tokenizer`` with ``eos``, so that ``encode`` appends
            </s>); default: the tokenizer's own ``save(folder)`` (a Marian tokenizer copies its files).
        decoding: the recipe's decoding section, for the README's options (default: beam 5,
            length penalty 1, a = 1.2, b = 10; see :func:`ctranslate2_options`).

    Raises:
        ValueError: an option CTranslate2 cannot express (all named), a tokenizer that does not fit,
            an unknown quantization, a decoding option without a CTranslate2 counterpart.
        FileExistsError: ``directory`` exists and is not empty.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization: expected one of {QUANTIZATIONS} or None, got {quantization!r}")
    vocabularies = ctranslate2_vocabularies(model, tokenizer)
    check_ctranslate2_can_express(model, special_ids, vocabularies[1])
    if tokenizer_files is None and not hasattr(tokenizer, "target_vocab"):
        raise ValueError(
            "tokenizer_files: a tokenizers.Tokenizer needs a writer of its Hugging Face files, e.g. "
            "lambda d: save_hf_tokenizer(tokenizer, d, max_length, eos=special_ids['eos'])"
        )
    target = vocabularies[1]
    never = [
        target[special_ids[k]]
        for k in ("bos", "pad")
        if special_ids.get(k, special_ids["eos"]) != special_ids["eos"]
    ]
    readme = _readme(model, decoding or {}, quantization, list(dict.fromkeys(never)))
    directory = check_new_directory(directory)
    spec = transformer_spec(model, special_ids, vocabularies)
    spec.optimize(quantization)

    def fill(tmp: Path) -> None:
        spec.save(str(tmp))
        (tokenizer_files or (lambda folder: _save_marian_tokenizer(tokenizer, folder)))(tmp)
        (tmp / "README.md").write_text(readme)

    return write_directory(directory, fill)


def _save_marian_tokenizer(tokenizer: Any, folder: Path) -> None:
    """A Marian tokenizer's files, and a tokenizer_config.json that names its class (opus-mt's often
    do not: AutoTokenizer then goes by config.json's model_type, which CTranslate2's lacks)."""
    tokenizer.save(folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    path.write_text(json.dumps({"tokenizer_class": "MarianTokenizer", **config}, indent=2) + "\n")


def _readme(model: Transformer, decoding: dict[str, Any], quantization: str | None, never: list[str]) -> str:
    """How to translate with the folder, with the options that decode as our translator does (a
    ``ValueError`` if there are none: see :func:`ctranslate2_options`)."""
    o = ctranslate2_options(decoding, 1, model.config.max_len, never=never)
    a, b = float(decoding.get("max_len_a", 1.2)), int(decoding.get("max_len_b", 10))
    limit = f"min(int({a} * len(src) + {b}), {model.config.max_len - 1}) - 1"
    return f"""# A scratchformer translation model for CTranslate2

Weights: {quantization or "float32"}. Translate (`pip install ctranslate2 transformers`), FOLDER this folder:

```python
import ctranslate2, transformers

tok = transformers.AutoTokenizer.from_pretrained(FOLDER)  # encode appends </s>
translator = ctranslate2.Translator(FOLDER, compute_type="float32")  # or "int8"
src = tok.convert_ids_to_tokens(tok.encode(text))
out = translator.translate_batch(
    [src],
    beam_size={o["beam_size"]},
    length_penalty={o["length_penalty"]},
    patience={o["patience"]},
    max_decoding_length={limit},
    min_decoding_length={o["min_decoding_length"]},
    return_end_token=True,
    suppress_sequences={o["suppress_sequences"]},
)
text = tok.decode(tok.convert_tokens_to_ids(out[0].hypotheses[0]), skip_special_tokens=True)
```

These options decode as scratchformer's translator does (its `decoding` section; `beam_size=1`:
greedy): at most a * S + b new tokens, EOS included, S the source length with its </s> (in a
batch, the longest source's: use that one number for the batch); the length penalty divides a
hypothesis' log-probability by its length with EOS (`return_end_token=True`); {" and ".join(never)} are never
generated. A source longer than {model.config.max_len} tokens must be cut to its first
{model.config.max_len - 1} and </s>, as the translator does. Beam search may still differ on a few
sentences (well under 1% in our tests): CTranslate2 stops once beam_size * patience hypotheses have
finished, scratchformer once beam_size have and no live one could still win; and a hypothesis cut
at the length limit is scored without the EOS scratchformer forces there.
"""
