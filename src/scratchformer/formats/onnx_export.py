"""ONNX export of the encoder models, run by ONNX Runtime and Hugging Face ``tokenizers`` alone.

One directory per model, written atomically (a temporary sibling renamed into place)::

    model.onnx          input_ids (B, L) int64, attention_mask (B, L) int64 (1 = real token, 0 = padding),
                        token_type_ids (B, L) int64 (only if the encoder has token types) ->
                          text classifier:   logits (B, C), probabilities (B, C)
                          sentence encoder:  sentence_embedding (B, D) (pooled, normalised if asked)
                          masked LM:         logits (B, L, V)
    tokenizer.json      the tokenizer (Hugging Face ``tokenizers``)
    onnx_export.json    the kind, the inputs and outputs, the tokenizer's settings (max_length,
                        truncation, pad), the labels or the pooling

The graph comes from ``torch.onnx.export(..., dynamo=True)`` (torch.export, then onnxscript), opset
18, with dynamic batch and length axes (B >= 1, L up to the model's ``max_len``). It is traced from a
copy of the model (:func:`export_copy`) with the speed paths of :mod:`scratchformer.fast` switched back
to the core modules (their packing reads the padding mask on the host, which a graph cannot) and the
attention written out as ONNX Runtime runs it fastest (:class:`GraphAttention`): the same values at
every real token. :class:`OnnxTextModel` runs an export on text; :func:`onnx_session` opens any graph.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.core.masks import fold_causal
from scratchformer.formats.hf_files import check_new_directory, write_directory
from scratchformer.models.classifier import TextClassifier
from scratchformer.models.contextual import ContextualEncoder
from scratchformer.models.masked_lm import MaskedLanguageModel
from scratchformer.models.pooling import POOLING_MODES, pool

__all__ = [
    "ONNX_OPSET",
    "GraphAttention",
    "OnnxTextModel",
    "export_classifier_onnx",
    "export_copy",
    "export_graph",
    "export_masked_lm_onnx",
    "export_sentence_encoder_onnx",
    "onnx_session",
    "plain_tokenizer",
]

ONNX_OPSET = 18
DESCRIPTION = "onnx_export.json"
MASK_NOTE = "int64 (batch, length), 1 = real token, 0 = padding"
_EXTERNAL_DATA_BYTES = 1_500_000_000  # above this the weights go to model.onnx.data (protobuf's 2 GB limit)


def _require_exporter() -> None:
    """The dynamo exporter needs onnx and onnxscript (the ``serve`` extra): a clear error before any work."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"ONNX export needs onnx and onnxscript ({e}); pip install 'scratchformer[serve]'"
        ) from None


def onnx_session(path: str | Path, threads: int = 0) -> Any:
    """An ``onnxruntime.InferenceSession`` on CPU for the graph at ``path``, all graph optimisations on;
    ``threads``: intra-op threads (0: ONNX Runtime's default, one per core), one inter-op thread."""
    import onnxruntime as ort

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be an integer >= 0 (0: ONNX Runtime's default), got {threads!r}")
    if not Path(path).is_file():
        raise FileNotFoundError(f"ONNX model not found: {path}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class GraphAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` (same parameters, same values) whose heads attend by the formula
    written out for the graph: softmax(q k^T / sqrt(d_k) + bias) v, the mask as an additive bias of 0
    or the dtype's minimum, built at the mask's broadcast shape (B, 1, 1, S), and a query that may
    attend to no key zeroed afterwards. The exporter's own rendering of the fused kernel adds a
    Where and a NaN check over every (B, H, T, S) score: ONNX Runtime then takes a quarter longer."""

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """q (B, H, T, d_k), k and v (B, H, S, d_k), mask (B|1, H|1, T|1, S) bool -> (B, H, T, d_k)."""
        if need_weights or (self.training and self.dropout):  # not in a graph: the core's kernels
            return super()._attend(q, k, v, mask, is_causal, need_weights)
        mask, _ = fold_causal(mask, is_causal, q.shape[-2], k.shape[-2], q.device, force=True)
        scores = torch.matmul(q * self.scale, k.transpose(-2, -1))  # (B, H, T, S)
        if mask is None:
            return torch.matmul(scores.softmax(dim=-1), v), None
        bias = torch.zeros_like(mask, dtype=scores.dtype).masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul((scores + bias).softmax(dim=-1), v)
        return out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0), None


def export_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` in eval mode for tracing: every fast module (a subclass of a core
    module with the same parameters, :func:`scratchformer.fast.optimize`) switched back to its core
    class, whose code a graph can hold, and attention to :class:`GraphAttention`."""
    clone = copy.deepcopy(module).eval()
    for m in clone.modules():
        if type(m).__module__.startswith("scratchformer.fast"):
            m.__class__ = type(m).__bases__[0]
        if type(m) is MultiHeadAttention:
            m.__class__ = GraphAttention
    return clone


def export_graph(
    module: nn.Module,
    args: tuple[Tensor, ...],
    path: Path,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_shapes: Any,
) -> None:
    """``torch.onnx.export(module, args, dynamo=True)`` to ``path`` at :data:`ONNX_OPSET`, weights
    inside the file unless they pass 1.5 GB; the exporter's notes on optional torchvision operators
    and on axis names are silenced."""
    _require_exporter()
    module.eval()
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.filterwarnings("ignore", message=r".*The axis name.*will not be used")
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_shapes=dynamic_shapes,
                opset_version=ONNX_OPSET,
                dynamo=True,
                external_data=size > _EXTERNAL_DATA_BYTES,
                verbose=False,
            )
    finally:
        registration.setLevel(level)


def plain_tokenizer(tokenizer: Any) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` of ``tokenizer`` (itself, or a wrapper's ``.tokenizer``, as
    :class:`~scratchformer.data.tokenization.TextTokenizer`'s); anything else is a ValueError."""
    inner = getattr(tokenizer, "tokenizer", tokenizer)
    if not isinstance(inner, Tokenizer):
        raise ValueError(
            f"tokenizer: expected a tokenizers.Tokenizer (or a TextTokenizer), got {type(tokenizer).__name__}"
            " (a sentencepiece tokenizer has no tokenizer.json to ship beside the graph)"
        )
    return inner


def _tokenizer_settings(tokenizer: Any, vocab_size: int, max_len: int) -> tuple[Tokenizer, dict[str, Any]]:
    """(the Tokenizer, what onnx_export.json records of it) from a TextTokenizer (its settings) or a
    plain Tokenizer (head truncation to the model's max_len, "[PAD]" or "<pad>")."""
    inner = plain_tokenizer(tokenizer)
    if inner.get_vocab_size() > vocab_size:
        raise ValueError(
            f"tokenizer: {inner.get_vocab_size()} tokens, but the model's vocabulary has only {vocab_size}"
        )
    if hasattr(tokenizer, "settings"):
        settings = dict(tokenizer.settings())
    else:
        pad = next((t for t in ("[PAD]", "<pad>") if inner.token_to_id(t) is not None), None)
        if pad is None:
            raise ValueError("tokenizer: no padding token ([PAD] or <pad>); pass a TextTokenizer naming it")
        settings = {"max_length": max_len, "pad_token": pad, "truncation": "head", "head_length": None}
    if settings["max_length"] > max_len:
        raise ValueError(
            f"tokenizer: max_length {settings['max_length']} exceeds the model's max_len={max_len}"
        )
    return inner, {"file": "tokenizer.json", **settings, "pad_id": inner.token_to_id(settings["pad_token"])}


class _TextGraph(nn.Module):
    """What the graph computes, from Hugging Face's inputs: int64 ids, an int64 attention mask (1 =
    real token) and, for an encoder with token types, their ids -> the outputs of ``kind``."""

    def __init__(self, model: nn.Module, kind: str, pooling: str = "mean", normalize: bool = False):
        super().__init__()
        self.model, self.kind, self.pooling, self.normalize = model, kind, pooling, normalize

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        """(B, L) int64 each -> logits (B, C) and probabilities | embedding (B, D) | logits (B, L, V)."""
        mask = attention_mask != 0  # (B, L) bool, True at real tokens
        if self.kind == "text_classifier":
            logits = self.model(input_ids, mask, token_type_ids)
            return logits, logits.softmax(dim=-1)
        if self.kind == "embedding":
            hidden = self.model(input_ids, mask, token_type_ids)
            return (pool(hidden, mask, self.pooling, self.normalize),)
        return (self.model.head(self.model.encoder(input_ids, mask, token_type_ids)),)  # masked LM


def _export_text_model(
    graph: _TextGraph,
    encoder: ContextualEncoder,
    tokenizer: Any,
    directory: str | Path,
    outputs: dict[str, str],
    extra: dict[str, Any],
) -> Path:
    """Export ``graph`` (reading ``encoder``'s config) with the tokenizer into a new ``directory``."""
    c = encoder.config
    if c.max_len < 2:  # the example traced is 2 x 2 at least (sizes 0 and 1 would fix the axes)
        raise ValueError(f"model: max_len={c.max_len} is too short to export (at least 2 positions)")
    inner, settings = _tokenizer_settings(tokenizer, c.vocab_size, c.max_len)
    check_new_directory(directory)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if c.type_vocab_size else [])
    length = min(8, c.max_len)  # the example: 2 x length
    ids = torch.arange(2 * length).reshape(2, length) % c.vocab_size
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length // 2 :] = 0
    args = (ids, mask, torch.zeros_like(ids))[: len(names)]
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("length", max=c.max_len)
    dynamic = {name: {0: batch, 1: tokens} for name in names}
    description = {
        "format": "scratchformer-onnx",
        "kind": graph.kind,
        "model": "model.onnx",
        "opset": ONNX_OPSET,
        "inputs": {
            name: MASK_NOTE if name == "attention_mask" else "int64 (batch, length)" for name in names
        },
        "outputs": outputs,
        "tokenizer": settings,
        **extra,
    }

    def fill(tmp: Path) -> None:
        export_graph(graph, args, tmp / "model.onnx", names, list(outputs), dynamic)
        Tokenizer.from_str(inner.to_str()).save(str(tmp / "tokenizer.json"))
        (tmp / DESCRIPTION).write_text(json.dumps(description, indent=2) + "\n")

    return write_directory(directory, fill)


def export_classifier_onnx(
    model: TextClassifier, tokenizer: Any, directory: str | Path, label_names: Sequence[str] | None = None
) -> Path:
    """Export a :class:`TextClassifier` to ``directory``: logits (B, C) and probabilities (B, C).
    ``tokenizer``: its TextTokenizer (the truncation settings are recorded) or a tokenizers.Tokenizer;
    ``label_names``: the C class names (default "0", "1", ...)."""
    if not isinstance(model, TextClassifier):
        raise ValueError(f"model: expected a TextClassifier, got {type(model).__name__}")
    C = model.config.num_classes
    labels = [str(i) for i in range(C)] if label_names is None else [str(n) for n in label_names]
    if len(labels) != C:
        raise ValueError(f"label_names: the model has {C} classes, got {len(labels)} names")
    outputs = {"logits": "float32 (batch, classes)", "probabilities": "float32 (batch, classes), softmax"}
    graph = _TextGraph(export_copy(model), "text_classifier")
    extra = {"labels": labels, "pooling": model.config.pooling}
    return _export_text_model(graph, model.encoder, tokenizer, directory, outputs, extra)


def export_sentence_encoder_onnx(
    encoder: ContextualEncoder,
    tokenizer: Any,
    directory: str | Path,
    pooling: str = "mean",
    normalize: bool = True,
) -> Path:
    """Export a sentence encoder (a :class:`ContextualEncoder`, ``pooling`` "mean" over real tokens or
    "cls", L2-normalised if ``normalize``, as :class:`~scratchformer.SentenceEncoder`) to ``directory``:
    sentence_embedding (B, D)."""
    if not isinstance(encoder, ContextualEncoder):
        raise ValueError(f"encoder: expected a ContextualEncoder, got {type(encoder).__name__}")
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling: expected one of {POOLING_MODES}, got {pooling!r}")
    outputs = {"sentence_embedding": "float32 (batch, width)" + (", unit length" if normalize else "")}
    graph = _TextGraph(export_copy(encoder), "embedding", pooling, normalize)
    extra = {"pooling": pooling, "normalize": normalize}
    return _export_text_model(graph, encoder, tokenizer, directory, outputs, extra)


def export_masked_lm_onnx(model: MaskedLanguageModel, tokenizer: Any, directory: str | Path) -> Path:
    """Export a :class:`MaskedLanguageModel` to ``directory``: logits (B, L, V) at every position."""
    if not isinstance(model, MaskedLanguageModel):
        raise ValueError(f"model: expected a MaskedLanguageModel, got {type(model).__name__}")
    outputs = {"logits": "float32 (batch, length, vocabulary)"}
    graph = _TextGraph(export_copy(model), "masked_lm")
    mask_token = plain_tokenizer(tokenizer).token_to_id("[MASK]")
    return _export_text_model(graph, model.encoder, tokenizer, directory, outputs, {"mask_id": mask_token})


def read_description(directory: str | Path, kinds: Sequence[str]) -> dict[str, Any]:
    """onnx_export.json of an export directory, checked to be one of ``kinds``."""
    path = Path(directory) / DESCRIPTION
    if not path.is_file():
        raise FileNotFoundError(f"{DESCRIPTION} not found in {directory}: not a scratchformer ONNX export")
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if isinstance(description, dict) and description.get("kind") == "sentence_encoder":
        description["kind"] = "embedding"  # what exports before 0.12 called a sentence encoder
    if not isinstance(description, dict) or description.get("kind") not in kinds:
        kind = description.get("kind") if isinstance(description, dict) else None
        raise ValueError(f"{path}: an export of kind {kind!r}, expected one of {list(kinds)}")
    return description


class OnnxTextModel:
    """An encoder export run on text with ``tokenizers`` and ONNX Runtime only: tokenised as the
    recorded settings say (truncated to max_length, head or head + tail), right-padded to the longest
    text, then the graph. ``threads``: as :func:`onnx_session`.

    Example:
        >>> model = OnnxTextModel("exports/imdb-onnx")
        >>> model(["A wonderful film."])["probabilities"]   # (1, C) numpy array
    """

    def __init__(self, directory: str | Path, threads: int = 0):
        self.description = read_description(directory, ("text_classifier", "embedding", "masked_lm"))
        self.session = onnx_session(Path(directory) / self.description["model"], threads)
        settings = self.settings = self.description["tokenizer"]
        self.tokenizer = Tokenizer.from_file(str(Path(directory) / settings["file"]))
        self.tokenizer.no_padding()
        if settings["truncation"] == "head":
            self.tokenizer.enable_truncation(max_length=settings["max_length"])
        else:
            self.tokenizer.no_truncation()

    def inputs(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The graph's inputs for ``texts``: (B, L) int64 arrays."""
        if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts: expected a non-empty sequence of str (a list of texts, not one string)")
        s = self.settings
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        if s["truncation"] == "head_tail":
            tail = s["max_length"] - s["head_length"]
            ids = [x if len(x) <= s["max_length"] else x[: s["head_length"]] + x[-tail:] for x in ids]
        longest = max(len(x) for x in ids)
        input_ids = np.full((len(ids), longest), s["pad_id"], dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)], mask[i, : len(x)] = x, 1
        feeds = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        return {name: feeds[name] for name in self.description["inputs"]}

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The outputs for ``texts``, by name (e.g. "probabilities" (B, C))."""
        names = list(self.description["outputs"])
        return dict(zip(names, self.session.run(names, self.inputs(texts))))
