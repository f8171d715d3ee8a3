"""The tokenisation of a Marian (opus-mt) checkpoint directory, as ``transformers.MarianTokenizer``
does it, with ``sentencepiece``::

    text -> pieces (source.spm) -> ids (vocab.json; unknown pieces -> <unk>)      encode
    ids  -> pieces (vocab.json)  -> text (sentencepiece detokenisation)           decode

A leading target-language code (``>>fra<<``, multilingual models) stays one token. EOS is not
added here: the translator appends it, as it does for our own tokenizers. Shared vocabularies
detokenise with the source model, separate ones (``target_vocab.json``) with target.spm, both as
Hugging Face does. The methods are those of ``tokenizers.Tokenizer`` that translation uses, so a
:class:`~scratchformer.tasks.translation.Translator` takes either.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MarianTokenizer", "PieceEncoding"]


@dataclass
class PieceEncoding:
    """One text's ``ids`` and the ``tokens`` (pieces) they stand for."""

    ids: list[int]
    tokens: list[str]


class MarianTokenizer:
    """source.spm / target.spm + vocab.json (and target_vocab.json when the vocabularies are separate)."""

    def __init__(
        self, directory: str | Path, unk_token: str = "<unk>", specials: Sequence[str] = ("<pad>", "</s>")
    ):
        try:
            import sentencepiece
        except ImportError:
            raise ImportError("Marian checkpoints need sentencepiece: pip install sentencepiece") from None
        directory = Path(directory)
        paths = {name: directory / name for name in ("source.spm", "target.spm", "vocab.json")}
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"Marian tokenizer files not found: {', '.join(missing)}")
        self.vocab: dict[str, int] = _read_vocab(paths["vocab.json"])
        target_vocab = directory / "target_vocab.json"
        self.separate_vocabs = target_vocab.is_file()
        self.target_vocab = _read_vocab(target_vocab) if self.separate_vocabs else self.vocab
        self.id_to_piece = {i: piece for piece, i in self.target_vocab.items()}
        if unk_token not in self.vocab:
            raise ValueError(f"{paths['vocab.json']}: no {unk_token!r} entry")
        self.unk_id = self.vocab[unk_token]
        self.special_ids = {self.target_vocab[t] for t in (unk_token, *specials) if t in self.target_vocab}
        settings = [
            directory / n
            for n in ("tokenizer_config.json", "special_tokens_map.json")
            if (directory / n).is_file()
        ]
        self.files = [*paths.values(), *([target_vocab] if self.separate_vocabs else []), *settings]
        self.source = sentencepiece.SentencePieceProcessor(model_file=str(paths["source.spm"]))
        self.target = sentencepiece.SentencePieceProcessor(model_file=str(paths["target.spm"]))

    def save(self, directory: Path) -> None:
        """Copy the tokenizer's files into ``directory``."""
        for path in self.files:
            shutil.copyfile(path, directory / path.name)

    def get_vocab_size(self) -> int:
        return len(self.vocab)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)

    def encode(self, text: str) -> PieceEncoding:
        """Source text -> ids, without EOS."""
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:  # a target-language code, e.g. >>fra<<
            code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + self.source.encode(text, out_type=str)
        return PieceEncoding([self.vocab.get(p, self.unk_id) for p in pieces], pieces)

    def encode_target(self, text: str) -> PieceEncoding:
        """Target-side text (a forced prefix) -> ids: target.spm and the target vocabulary, as Hugging
        Face's ``text_target``."""
        pieces = self.target.encode(text, out_type=str)
        unk = self.target_vocab.get("<unk>", self.unk_id)
        return PieceEncoding([self.target_vocab.get(p, unk) for p in pieces], pieces)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[PieceEncoding]:
        """``add_special_tokens`` is accepted as ``tokenizers`` has it; EOS is never added here."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Target ids -> text; ``skip_special_tokens`` drops <pad>, </s>, <unk> (Hugging Face's
        ``skip_special_tokens=True``), otherwise they are written out by name."""
        spm = self.target if self.separate_vocabs else self.source
        text, run = "", []
        for i in ids:
            if i in self.special_ids:
                if not skip_special_tokens:
                    text, run = text + spm.decode_pieces(run) + self.id_to_piece[i] + " ", []
                continue
            run.append(self.id_to_piece.get(i) or spm.id_to_piece(i))
        return (text + spm.decode_pieces(run)).replace("▁", " ").strip()


def _read_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise ValueError(f"{path}: expected a JSON object of piece -> id")
    return vocab
