"""Text to padded tensors with a Hugging Face ``tokenizers`` tokenizer (WordPiece, BPE, ...).

The tokenizer itself (normalisation, pre-tokenisation, the subword model, [CLS]/[SEP] templates)
is Hugging Face's; this wrapper adds what the models need: truncation to a maximum length (the
head, or head + tail as Sun et al. 2019 found best for long reviews), padding to the longest
sequence of the batch, and the (B, L) tensors with a bool padding mask.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from torch import Tensor

__all__ = [
    "BPE_SPECIAL_TOKENS",
    "SPECIAL_TOKENS",
    "TRUNCATIONS",
    "TextTokenizer",
    "TokenBatch",
    "read_tokenizer",
    "save_hf_tokenizer",
    "train_bpe",
    "train_wordpiece",
]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BPE_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0, 1, 2, 3: pad, BOS, EOS, unknown
TRUNCATIONS = ("head", "head_tail")

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
        truncation: "head" keeps the first ``max_length`` tokens; "head_tail" keeps the first
            ``head_length`` and the last ``max_length - head_length`` (the [CLS] at the start and
            the [SEP] at the end survive either way).
        head_length: for "head_tail"; default ``max_length // 4``.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_length: int,
        pad_token: str | None = None,
        truncation: str = "head",
        head_length: int | None = None,
    ):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation: expected one of {TRUNCATIONS}, got {truncation!r}")
        head_length = max_length // 4 if head_length is None else head_length
        if truncation == "head_tail" and not 0 < head_length < max_length:
            raise ValueError(f"head_length must be in (0, max_length={max_length}), got {head_length}")
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
        self.truncation = truncation
        self.head_length = head_length
        self._untruncated: Tokenizer | None = None  # built by full_lengths when first asked
        tokenizer.no_padding()  # we pad ourselves, to the longest sequence of each batch
        self._set_truncation()

    def _set_truncation(self) -> None:
        """The Tokenizer cuts to max_length itself for "head"; "head_tail" cuts in :meth:`encode`."""
        if self.truncation == "head":
            self.tokenizer.enable_truncation(max_length=self.max_length)  # from the right, no stride
        else:
            self.tokenizer.no_truncation()

    @classmethod
    def from_file(
        cls, path: str | Path, max_length: int, pad_token: str | None = None, **kwargs
    ) -> TextTokenizer:
        """Load a ``tokenizer.json`` (keyword arguments as the constructor's)."""
        return cls(read_tokenizer(path), max_length, pad_token, **kwargs)

    def settings(self) -> dict[str, object]:
        """What to store beside tokenizer.json to rebuild this wrapper."""
        return {
            "max_length": self.max_length,
            "pad_token": self.pad_token,
            "truncation": self.truncation,
            "head_length": self.head_length,
        }

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, truncated, not padded."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts: expected a sequence of str (a list of texts, not one string)")
        if len(texts) == 0:
            raise ValueError("texts: expected at least one text, got an empty sequence")
        self._set_truncation()  # again: another wrapper of the same Tokenizer may have changed it
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        if self.truncation == "head_tail":
            tail = self.max_length - self.head_length
            ids = [x if len(x) <= self.max_length else x[: self.head_length] + x[-tail:] for x in ids]
        return ids

    def full_lengths(self, texts: Sequence[str]) -> list[int]:
        """Tokens in each text before truncation (special tokens included): a text with more than
        ``max_length`` is cut by :meth:`encode`, and a caller can say so."""
        if self._untruncated is None:  # a copy without truncation; ours keeps its settings
            self._untruncated = Tokenizer.from_str(self.tokenizer.to_str())
            self._untruncated.no_truncation()
        return [len(e.ids) for e in self._untruncated.encode_batch(list(texts))]

    def pad(self, sequences: Sequence[Sequence[int]]) -> TokenBatch:
        """Right-pad id lists to the longest: (B, L) ids, padding mask (True = real), zero type ids."""
        longest = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), longest), self.pad_id, dtype=torch.long)
        for i, s in enumerate(sequences):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        lengths = torch.tensor([len(s) for s in sequences])
        mask = torch.arange(longest)[None, :] < lengths[:, None]
        return TokenBatch(ids, mask, torch.zeros_like(ids))

    def __call__(self, texts: Sequence[str]) -> TokenBatch:
        """Tokenize a batch of texts into padded (B, L) tensors."""
        return self.pad(self.encode(texts))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def read_tokenizer(path: str | Path) -> Tokenizer:
    """A Hugging Face ``tokenizer.json``; a missing or unreadable file is an error naming it."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception  # noqa: BLE001
        raise ValueError(f"{path}: not a tokenizer.json ({e})") from None


def train_wordpiece(
    texts: Sequence[str], vocab_size: int, lowercase: bool = True, min_frequency: int = 2
) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer with Hugging Face ``tokenizers``.

    HTML line breaks (``<br />``, as in IMDB reviews) become spaces; BERT's normaliser cleans
    control characters, splits Chinese characters and (optionally) lowercases and strips accents;
    every sequence becomes ``[CLS] ... [SEP]``.
    """
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(r"<br\s*/?>"), " "), normalizers.BertNormalizer(lowercase=lowercase)]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS)
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def train_bpe(texts: Sequence[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """Train a (joint) byte-level BPE tokenizer (GPT-2 style) that detokenizes back to plain text.

    Byte level: any string is representable (a character never seen in training becomes its
    UTF-8 bytes, not an unknown token), so decoding reproduces the (NFKC-normalised) input
    exactly. Cased. No special tokens are added to encodings; the translation task adds BOS/EOS
    itself. Ids: <pad> 0, <s> 1, </s> 2, <unk> 3 (never produced).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def save_hf_tokenizer(tokenizer: Tokenizer, directory: Path, max_length: int, eos: int | None = None) -> None:
    """Write ``tokenizer.json`` and a ``tokenizer_config.json`` with which ``transformers.AutoTokenizer``
    loads it as a fast tokenizer; ``eos``: append that token to every encoding (Marian's convention;
    our translator adds it itself). The special tokens are those of the vocabulary that exist."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: the caller's keeps its settings
    if eos is not None:
        eos_token = tokenizer.id_to_token(eos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {eos_token}", pair=f"$A $B {eos_token}", special_tokens=[(eos_token, eos)]
        )
    tokenizer.save(str(directory / "tokenizer.json"))
    names = {
        "pad_token": ("[PAD]", "<pad>"),
        "unk_token": ("[UNK]", "<unk>"),
        "cls_token": ("[CLS]",),
        "sep_token": ("[SEP]",),
        "mask_token": ("[MASK]",),
        "bos_token": ("<s>",),
        "eos_token": ("</s>",),
    }
    config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length}
    for key, candidates in names.items():
        found = next((t for t in candidates if tokenizer.token_to_id(t) is not None), None)
        if found is not None:
            config[key] = found
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
