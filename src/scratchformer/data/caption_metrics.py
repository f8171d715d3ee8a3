"""Captioning metrics: BLEU-1..4 and CIDEr-D as the captioning literature reports them
(:func:`caption_scores`, the COCO caption evaluation code's scorers), and CIDEr-D as a per-caption
training reward (:class:`CiderD`, self-critical training). Both compare the words of
:func:`~scratchformer.data.captions.caption_words`. (Translation's sacreBLEU and chrF are
:func:`scratchformer.tasks.translation.bleu_and_chrf`.)
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Sequence
from typing import Any

from scratchformer.data.captions import caption_words

__all__ = ["CiderD", "caption_scores", "check_meteor", "exact_matches"]


def caption_scores(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], meteor: bool = False
) -> dict[str, Any]:
    """BLEU-1..4 and CIDEr-D (x100) as the captioning literature reports them: the COCO caption
    evaluation code's scorers (``pycocoevalcap`` Bleu(4) and Cider, which is CIDEr-D: sigma 6,
    clipped counts, document frequencies from these references), each hypothesis against all of its
    image's references; and the exact-match rate (the hypothesis equals one of its references).
    ``meteor``: METEOR 1.5 (x100) too, by the jar ``pycocoevalcap`` ships (:func:`check_meteor`: it
    needs Java).

    Tokenisation (both sides alike): :func:`~scratchformer.data.captions.caption_words`, i.e. COCO's
    PTB tokenisation done in Python (lower case, punctuation split off and removed), not its Java
    tokenizer.
    """
    try:
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
    except ImportError as e:
        raise ImportError(
            "captioning metrics need pycocoevalcap: pip install 'scratchformer[captioning]'"
        ) from e
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(
            f"{len(hypotheses)} hypotheses for {len(references)} reference lists (need the same, > 0)"
        )
    res = {i: [" ".join(caption_words(h))] for i, h in enumerate(hypotheses)}
    gts = {i: [" ".join(caption_words(r)) for r in refs] for i, refs in enumerate(references)}
    if meteor:
        check_meteor()
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    exact = sum(res[i][0] in gts[i] for i in res)
    return {
        **{f"bleu{n}": 100 * b for n, b in enumerate(bleu, 1)},
        "cider": 100 * float(cider),
        **({"meteor": 100 * _meteor(gts, res)} if meteor else {}),
        "exact_match": exact / len(res),
        "n": len(res),
        "tokenisation": "caption_words: lower case, punctuation split off and removed (PTB's list)",
    }


def check_meteor() -> None:
    """Refuse METEOR, in one line, where it cannot run: it is a Java program (``meteor-1.5.jar``,
    shipped with ``pycocoevalcap``, with its English paraphrase table; no network)."""
    if shutil.which("java") is None:
        raise RuntimeError("METEOR needs Java: no `java` on PATH (e.g. apt install default-jre-headless)")


def _meteor(gts: dict[int, list[str]], res: dict[int, list[str]]) -> float:
    """Corpus METEOR (0..1) of ``res`` against ``gts``: pycocoevalcap's wrapper of METEOR 1.5
    (English, normalised), its Java process closed afterwards."""
    from pycocoevalcap.meteor.meteor import Meteor

    scorer = Meteor()
    try:
        score, _ = scorer.compute_score(gts, res)
    finally:
        del scorer  # its __del__ ends the Java process
    return float(score)


class CiderD:
    """CIDEr-D of hypotheses against fixed reference sets, as a per-caption training reward.

    The same formula as ``pycocoevalcap``'s Cider (n = 1..4, tf-idf vectors, clipped counts, the
    Gaussian length penalty with sigma 6, x10), but with document frequencies computed once from
    ``references`` (e.g. the training captions) and each reference set's vectors precomputed, so
    scoring a batch of samples is cheap. With ``references`` equal to the evaluated images'
    references, its mean equals pycocoevalcap's corpus CIDEr-D (a test checks this).
    """

    def __init__(self, references: Sequence[Sequence[str]], n: int = 4, sigma: float = 6.0):
        self.n, self.sigma = n, sigma
        tokenised = [[caption_words(r) for r in refs] for refs in references]
        self.df: Counter[tuple[str, ...]] = Counter()
        for refs in tokenised:
            self.df.update({g for words in refs for g in self._ngrams(words)})
        self.log_n = math.log(float(len(references)))
        self.refs = [[self._vector(words) for words in refs] for refs in tokenised]

    def _ngrams(self, words: list[str]) -> Counter[tuple[str, ...]]:
        return Counter(
            tuple(words[i : i + k]) for k in range(1, self.n + 1) for i in range(len(words) - k + 1)
        )

    def _vector(self, words: list[str]) -> tuple[list[dict[tuple[str, ...], float]], list[float], int]:
        vec: list[dict[tuple[str, ...], float]] = [{} for _ in range(self.n)]
        norm = [0.0] * self.n
        length = 0
        for gram, tf in self._ngrams(words).items():
            k = len(gram) - 1
            vec[k][gram] = w = tf * (self.log_n - math.log(max(1.0, self.df[gram])))
            norm[k] += w * w
            length += tf if k == 1 else 0  # pycocoevalcap counts the length in bigrams
        return vec, [math.sqrt(x) for x in norm], length

    def score(self, hypothesis: str, image: int) -> float:
        """CIDEr-D (x10, as pycocoevalcap: 10 = perfect consensus) of ``hypothesis`` for reference set
        ``image``."""
        vec, norm, length = self._vector(caption_words(hypothesis))
        total = 0.0
        for ref_vec, ref_norm, ref_length in self.refs[image]:
            penalty = math.exp(-((length - ref_length) ** 2) / (2 * self.sigma**2))
            for k in range(self.n):
                value = sum(
                    min(w, ref_vec[k].get(g, 0.0)) * ref_vec[k].get(g, 0.0) for g, w in vec[k].items()
                )
                if norm[k] and ref_norm[k]:
                    value /= norm[k] * ref_norm[k]
                total += value * penalty
        return 10.0 * total / (self.n * len(self.refs[image]))


def exact_matches(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> list[bool]:
    """Whether each hypothesis equals one of its references, word for word
    (:func:`~scratchformer.data.captions.caption_words`):
    what :func:`caption_scores` counts as an exact match."""
    return [caption_words(h) in [caption_words(r) for r in refs] for h, refs in zip(hypotheses, references)]
