"""Sentence embeddings from a BERT-family checkpoint, as sentence-transformers computes them:
our encoder, mean (or [CLS]) pooling over real tokens, L2 normalisation if the directory's
modules.json lists it (a plain Hugging Face directory: mean pooling, not normalised)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from scratchformer.data.tokenization import TextTokenizer
from scratchformer.fast import optimize
from scratchformer.formats.hf_bert import (
    CheckpointError,
    load_bert_encoder,
    read_json,
    refuse_engine_export,
    require_file,
)
from scratchformer.models.contextual import ContextualEncoder
from scratchformer.models.pooling import pool

__all__ = ["SentenceEncoder", "is_sentence_encoder_dir"]


def is_sentence_encoder_dir(directory: str | Path) -> bool:
    """A sentence-transformers directory (it has modules.json)?"""
    return (Path(directory) / "modules.json").is_file()


def _modules(directory: Path) -> dict[str, Path | None]:
    """The sentence-transformers modules of ``directory`` (kind -> folder), from modules.json; without
    one, a plain Hugging Face directory, which sentence-transformers mean-pools and does not
    normalise. Any other module (Dense, ...) would change the vectors: a CheckpointError."""
    path = directory / "modules.json"
    if not path.is_file():
        return {"Transformer": directory, "Pooling": None}
    listing = read_json(path, list)
    kinds = [
        str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else "?"
        for module in listing
    ]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise CheckpointError(
            f"{path}: modules {kinds} are not supported (Transformer, Pooling, optionally Normalize)"
        )
    return {kind: directory / module.get("path", "") for kind, module in zip(kinds, listing)}


def _pooling_mode(folder: Path | None) -> str:
    """ "mean" or "cls" from a Pooling module's config.json: ``pooling_mode`` (a name or a list;
    sentence-transformers 5 on) or the older ``pooling_mode_*`` flags; no config: mean."""
    path = folder / "config.json" if folder is not None else None
    cfg = read_json(path) if path is not None and path.is_file() else {}
    if "pooling_mode" in cfg:
        modes = cfg["pooling_mode"]
    elif any(key.startswith("pooling_mode_") for key in cfg):
        modes = [
            key.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
            for key, on in cfg.items()
            if key.startswith("pooling_mode_") and on is True
        ]
    else:
        modes = ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if modes not in (["mean"], ["cls"]):  # several modes are concatenated: a longer vector than ours
        raise CheckpointError(f"{path}: pooling {modes} is not supported (one of 'mean', 'cls')")
    return modes[0]


def _max_length(folder: Path, encoder: ContextualEncoder) -> int:
    """Tokens per text as sentence-transformers takes them: sentence_bert_config.json's
    ``max_seq_length``, else tokenizer_config.json's ``model_max_length``, within the positions."""
    limit = None
    for name, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        if limit is None and (folder / name).is_file():
            limit = read_json(folder / name).get(key)
    return min(encoder.config.max_len, int(limit)) if limit is not None else encoder.config.max_len


class SentenceEncoder:
    """Sentence embeddings: our encoder, then mean (or [CLS]) pooling over real tokens, then L2
    normalisation (what sentence-transformers computes for all-MiniLM-L6-v2; ``from_pretrained``
    reads them from the directory as sentence-transformers does). The encoder is switched to the
    fast paths in place (``optimize(encoder, skip_padding=True)``): pooling reads real tokens only.

    Example:
        >>> model = SentenceEncoder.from_pretrained("path/to/all-MiniLM-L6-v2")
        >>> vectors = model.encode(["A man plays guitar.", "Someone is making music."])  # (2, 384)
        >>> float(vectors[0] @ vectors[1])  # cosine similarity (vectors are unit length)
    """

    def __init__(
        self,
        encoder: ContextualEncoder,
        tokenizer: TextTokenizer,
        pooling: str = "mean",
        normalize: bool = True,
        device: torch.device | str = "cpu",
    ):
        self.encoder = optimize(encoder.to(device).eval(), skip_padding=True)
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.device = torch.device(device)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: torch.device | str = "cpu") -> SentenceEncoder:
        """A sentence-transformers directory, or a plain Hugging Face BERT-family one: our exports
        too (a masked LM's or a classifier's encoder: the ``bert.`` tensors, the task head left out),
        mean-pooled and not normalised, as sentence-transformers reads such a directory."""
        refuse_engine_export(directory)  # an ONNX or CTranslate2 export: say how to run it
        modules = _modules(Path(directory))
        folder = modules["Transformer"]
        encoder = load_bert_encoder(folder)
        tokenizer = TextTokenizer.from_file(
            require_file(folder / "tokenizer.json", "tokenizer.json"), _max_length(folder, encoder)
        )
        return cls(encoder, tokenizer, _pooling_mode(modules["Pooling"]), "Normalize" in modules, device)

    @property
    def dim(self) -> int:
        return self.encoder.config.d_model

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False) -> Tensor:
        """Embed ``texts``: (N, D) float32, rows in the order of ``texts``.

        Texts are batched by length (less padding); the result does not depend on ``batch_size``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(texts, str):
            raise TypeError("texts: expected a sequence of str (a list of texts, not one string)")
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = torch.empty(len(texts), self.dim)
        starts = range(0, len(texts), batch_size)
        for start in tqdm(starts, desc="embedding", unit="batch", disable=not progress):
            idx = order[start : start + batch_size]
            batch = self.tokenizer([texts[i] for i in idx]).to(self.device)
            hidden = self.encoder(batch.ids, batch.padding_mask, batch.type_ids)
            out[idx] = pool(hidden, batch.padding_mask, self.pooling, self.normalize).float().cpu()
        return out

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of two texts."""
        u, v = self.encode([a, b])
        return float(torch.nn.functional.cosine_similarity(u, v, dim=0))

    def save_onnx(self, directory: str | Path) -> Path:
        """Write the encoder with its pooling and normalisation as one ONNX graph (input_ids,
        attention_mask (B, L) -> sentence_embedding (B, D)) with tokenizer.json, into a new
        ``directory`` (see :func:`~scratchformer.formats.onnx_export.export_sentence_encoder_onnx`)."""
        from scratchformer.formats.onnx_export import export_sentence_encoder_onnx

        return export_sentence_encoder_onnx(
            self.encoder, self.tokenizer, directory, self.pooling, self.normalize
        )
