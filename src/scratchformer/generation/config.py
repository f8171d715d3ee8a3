"""One set of decoding options for every encoder-decoder model, named as Hugging Face's
``GenerationConfig`` where it has the option, and fairseq's ``max_len_a``/``max_len_b``."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

__all__ = ["GenerationConfig"]


@dataclass(frozen=True)
class GenerationConfig:
    """How to decode. Every option is checked when the config is made; an error names it.

    Attributes:
        decoder_start_token_id, eos_token_id: the first token fed to the decoder (BOS; Marian: pad)
            and the end of a sentence.
        max_new_tokens: at most this many tokens after the prefix; None: ``max_len_a * S + max_len_b``
            (fairseq; S the padded source length), always within the model's ``max_len``.
        min_new_tokens: EOS is not allowed before this many tokens after the prefix.
        num_beams: 1 = greedy (or sampling); more = beam search.
        length_penalty: hypotheses are ranked by ``log_prob / length ** length_penalty``.
        num_return_sequences: hypotheses per source: the n best of the beam, or n samples.
        do_sample: draw each token from the (warped) distribution instead of taking the best.
        temperature: logits / temperature before sampling (> 0; towards 0: greedy).
        top_k: sample among the k most likely tokens only (0 = all).
        top_p: nucleus sampling: among the smallest set of most likely tokens whose probability
            reaches top_p (1 = all; towards 0: greedy).
        repetition_penalty: scores of tokens already in the output divided by it when positive,
            multiplied when negative (CTRL; Hugging Face's rule). 1 = off.
        no_repeat_ngram_size: no n-gram of this size occurs twice in the output (0 = off).
    """

    decoder_start_token_id: int = 1
    eos_token_id: int = 2
    max_new_tokens: int | None = None
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_new_tokens: int = 0
    num_beams: int = 1
    length_penalty: float = 1.0
    num_return_sequences: int = 1
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    def __post_init__(self) -> None:
        ints = {
            "decoder_start_token_id": 0,
            "eos_token_id": 0,
            "max_len_b": 0,
            "min_new_tokens": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "top_k": 0,
            "no_repeat_ngram_size": 0,
        }
        for name, least in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if self.max_new_tokens is not None and (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, numbers.Integral)
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be an integer >= 1 (or None), got {self.max_new_tokens!r}")
        for name in ("max_len_a", "length_penalty", "temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be True or False, got {self.do_sample!r}")
        if self.max_len_a < 0:
            raise ValueError(f"max_len_a must be >= 0, got {self.max_len_a}")
        if not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0, got {self.temperature} (for greedy decoding use do_sample=False)"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        if self.do_sample and self.num_beams > 1:
            raise ValueError(
                f"do_sample with num_beams={self.num_beams}: sampling inside beams is not supported"
            )
        if not self.do_sample and self.num_return_sequences > self.num_beams:
            raise ValueError(
                f"num_return_sequences={self.num_return_sequences} > num_beams={self.num_beams}: beam "
                "search returns at most num_beams hypotheses (or set do_sample=True)"
            )
        if self.max_new_tokens is not None and self.min_new_tokens >= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens={self.min_new_tokens} must be < max_new_tokens={self.max_new_tokens} "
                "(the last new token is EOS)"
            )

    @classmethod
    def from_decoding(cls, decoding: dict[str, Any], **fields: Any) -> GenerationConfig:
        """From a recipe's ``decoding`` section (beam_size, length_penalty, max_len_a, max_len_b),
        then ``fields`` (None values are left out, so unset CLI flags keep the recipe's)."""
        renamed = {"beam_size": "num_beams"}
        base = {renamed.get(k, k): v for k, v in decoding.items()}
        return cls(**{**base, **{k: v for k, v in fields.items() if v is not None}})

    def replace(self, **changes: Any) -> GenerationConfig:
        return dataclasses.replace(self, **changes)
