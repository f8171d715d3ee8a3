"""Parallel text: line i of the source file translates line i of the target file.

Files are plain or gzipped UTF-8. Different line counts are an error (the pairing would be off
from the first missing line on); empty lines are filtered and counted, as are pairs whose
tokenized length exceeds the limit (``filter_long``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scratchformer.data.labelled_texts import open_text

__all__ = ["ParallelTexts", "load_parallel_texts"]


@dataclass
class ParallelTexts:
    sources: list[str]
    targets: list[str]
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sources)


def load_parallel_texts(
    source_path: str | Path, target_path: str | Path, limit: int | None = None
) -> ParallelTexts:
    """Read two aligned files; drop (and count) pairs where either side is empty."""
    with open_text(source_path) as f:
        sources = [line.strip() for line in f]
    with open_text(target_path) as f:
        targets = [line.strip() for line in f]
    if len(sources) != len(targets):
        raise ValueError(
            f"parallel files differ in length: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    kept_s, kept_t, empty = [], [], 0
    for s, t in zip(sources, targets):
        if not s or not t:
            empty += 1
            continue
        kept_s.append(s)
        kept_t.append(t)
    if limit is not None:
        kept_s, kept_t = kept_s[:limit], kept_t[:limit]
    if not kept_s:
        raise ValueError(f"{source_path} / {target_path}: no non-empty sentence pairs")
    return ParallelTexts(kept_s, kept_t, {"empty": empty} if empty else {})
