"""Two systems' translations of the same texts compared "up to ties": a line counts as the same when
the texts are equal, or when our translator's model scores both within a tolerance, in the length-
normalised log-probability its beam ranks hypotheses by
(:func:`~scratchformer.generation.scoring.same_up_to_ties`); any other difference is a real one::

    report = same_translations_up_to_ties(translator, sources, ours, theirs)
    report.share, report.tied, report.different   # see TieReport
"""

from __future__ import annotations

from collections.abc import Sequence

from scratchformer.generation.scoring import TIE_TOLERANCE, TieReport, same_up_to_ties
from scratchformer.tasks.shared import pad_ids
from scratchformer.tasks.translation.translator import Translator, _encode

__all__ = ["same_translations_up_to_ties", "target_ids"]


def target_ids(translator: Translator, texts: Sequence[str]) -> list[list[int]]:
    """Each text as the translator's target tokens with EOS (as a hypothesis of its beam), cut to
    the ``max_len - 1`` tokens its decoder can produce."""
    target = getattr(translator.tokenizer, "encode_target", None)
    ids = [target(t).ids for t in texts] if target else _encode(translator.tokenizer, texts)  # type: ignore[arg-type]
    limit = translator.model.config.max_len - 2
    return [[*i[:limit], translator.eos] for i in ids]


def same_translations_up_to_ties(
    translator: Translator,
    sources: Sequence[str],
    ours: Sequence[str],
    theirs: Sequence[str],
    tolerance: float = TIE_TOLERANCE,
) -> TieReport:
    """Compare two systems' translations of ``sources``, line by line: differing texts are
    re-tokenised and scored by the translator's model with its decoding's ``length_penalty``;
    ``report.describe(translator.tokenizer.decode)`` lists the differing lines with both scores."""
    if not len(sources) == len(ours) == len(theirs):
        raise ValueError(
            f"expected one translation per source, got {len(ours)} and {len(theirs)} for {len(sources)}"
        )
    differ = [i for i in range(len(sources)) if ours[i] != theirs[i]]
    a = target_ids(translator, [ours[i] for i in differ])
    b = target_ids(translator, [theirs[i] for i in differ])
    same = [[translator.eos]] * len(sources)  # equal texts: equal (placeholder) ids, never scored
    mine, other = list(same), list(same)
    for j, i in enumerate(differ):
        mine[i], other[i] = a[j], b[j]
    src = pad_ids(translator.encode_sources(sources), translator.device, translator.pad)
    length_penalty = translator.generation_config().length_penalty
    return same_up_to_ties(
        translator.model,
        src,
        mine,
        other,
        bos_id=translator.bos,
        length_penalty=length_penalty,
        tolerance=tolerance,
    )
