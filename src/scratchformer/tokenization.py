"""Text to padded tensors with a Hugging Face ``tokenizers`` tokenizer (WordPiece, BPE, ...).

The tokenizer itself (normalisation, pre-tokenisation, the subword model, [CLS]/[SEP] templates)
is Hugging Face's; this wrapper adds what the models need: truncation to a maximum length,
padding to the longest sequence of the batch, and the (B, L) tensors with a bool padding mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

__all__ = ["TextTokenizer", "TokenBatch"]

_PAD_CANDIDATES = ("[PAD]", "<pad>", "<PAD>")


@dataclass
class TokenBatch:
    """ids (B, L) long; padding_mask (B, L) bool, True at real tokens; type_ids (B, L) long."""

    ids: Tensor
    padding_mask: Tensor
    type_ids: Tensor

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(self.ids.to(device), self.padding_mask.to(device), self.type_ids.to(device))


class TextTokenizer:
    """Wraps ``tokenizers.Tokenizer``: truncates to ``max_length`` tokens (special tokens
    included) and pads each batch to its longest sequence.

    Args:
        tokenizer: a Hugging Face ``tokenizers.Tokenizer``.
        max_length: longest output sequence, special tokens included.
        pad_token: the padding token; by default the tokenizer's own, else "[PAD]" or "<pad>".
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int, pad_token: str | None = None):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if pad_token is None:
            configured = tokenizer.padding
            candidates = ([configured["pad_token"]] if configured else []) + list(_PAD_CANDIDATES)
            pad_token = next((t for t in candidates if tokenizer.token_to_id(t) is not None), None)
            if pad_token is None:
                raise ValueError(f"the tokenizer has no padding token (looked for {candidates})")
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"pad_token {pad_token!r} is not in the tokenizer's vocabulary")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_token = pad_token
        self.pad_id: int = pad_id
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to the longest in the batch

    @classmethod
    def from_file(cls, path: str | Path, max_length: int, pad_token: str | None = None) -> TextTokenizer:
        """Load a ``tokenizer.json``."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        return cls(Tokenizer.from_file(str(path)), max_length, pad_token)

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def __call__(self, texts: Sequence[str]) -> TokenBatch:
        """Tokenize a batch of texts into padded (B, L) tensors."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts: expected a sequence of str (a list of texts, not one string)")
        if len(texts) == 0:
            raise ValueError("texts: expected at least one text, got an empty sequence")
        encodings = self.tokenizer.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.bool)
        types = torch.tensor([e.type_ids for e in encodings], dtype=torch.long)
        return TokenBatch(ids, mask, types)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
