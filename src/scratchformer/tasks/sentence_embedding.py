"""Sentence embeddings from a BERT-family checkpoint, as sentence-transformers computes them:
our encoder, mean (or [CLS]) pooling over real tokens, L2 normalisation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from scratchformer.data.tokenization import TextTokenizer
from scratchformer.fast import optimize
from scratchformer.models.contextual import ContextualEncoder
from scratchformer.models.pooling import pool
from scratchformer.models.pretrained import CheckpointError, load_bert_encoder, read_json, require_file

__all__ = ["SentenceEncoder"]


def _sentence_settings(directory: Path, encoder: ContextualEncoder) -> tuple[int, str, bool]:
    """(max tokens, pooling mode, normalize) as sentence-transformers would use them."""
    max_length = encoder.config.max_len
    sbert = directory / "sentence_bert_config.json"
    if sbert.is_file():
        max_length = min(max_length, int(read_json(sbert).get("max_seq_length", max_length)))
    mode, normalize = "mean", True
    pooling = directory / "1_Pooling" / "config.json"
    if pooling.is_file():
        cfg = read_json(pooling)
        if cfg.get("pooling_mode_cls_token"):
            mode = "cls"
        elif not cfg.get("pooling_mode_mean_tokens", True):
            raise CheckpointError(f"{pooling}: only mean or CLS pooling is supported")
    modules = directory / "modules.json"
    if modules.is_file():
        normalize = any(m.get("type", "").endswith("Normalize") for m in json.loads(modules.read_text()))
    return max_length, mode, normalize


class SentenceEncoder:
    """Sentence embeddings: our encoder, then mean pooling over real tokens, then L2 normalisation
    (what sentence-transformers computes for all-MiniLM-L6-v2). The encoder is switched to the
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
        directory = Path(directory)
        encoder = load_bert_encoder(directory)
        max_length, mode, normalize = _sentence_settings(directory, encoder)
        tokenizer = TextTokenizer.from_file(require_file(directory / "tokenizer.json", "tokenizer.json"), max_length)
        return cls(encoder, tokenizer, mode, normalize, device)

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
