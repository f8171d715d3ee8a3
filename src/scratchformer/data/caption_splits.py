"""A captioning run's splits, from each kind of data a captioning recipe names: "train", "valid"
and the test splits ("test", or "test-NAME" for each of several), as :class:`CaptionExamples`, and
the vocabulary of the training captions.

Paths here are resolved ones (the task replaces a recipe's ``{data}``); the photographs' features
come from the caller too (the image encoder is a model, above this layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scratchformer.data.caption_corpora import CaptionCorpus
from scratchformer.data.captions import CaptionExamples, Vocabulary, load_caption_folder, load_cs231n_captions
from scratchformer.data.image_features import ImageFeatures

__all__ = [
    "cs231n_splits",
    "folder_splits",
    "photo_split_names",
    "photo_splits",
    "photos_folder",
    "training_vocabulary",
]


def training_vocabulary(splits: dict[str, CaptionExamples], min_count: int) -> Vocabulary:
    """The caption vocabulary of the training split's references (words seen ``min_count`` times)."""
    return Vocabulary.build((c for refs in splits["train"].references for c in refs), min_count)


def cs231n_splits(
    folder: str | Path, pca_features: bool = True, max_train: int | None = None, valid_size: int = 500
) -> tuple[dict[str, CaptionExamples], Vocabulary]:
    """cs231n's COCO features (:func:`load_cs231n_captions`): its train split (the first ``max_train``
    images; None: all), and its val split cut in two, valid (the first ``valid_size`` images) and
    test (the rest); with cs231n's vocabulary."""
    train, vocab = load_cs231n_captions(folder, "train", pca_features, max_train)
    val, _ = load_cs231n_captions(folder, "val", pca_features)
    rest = range(valid_size, len(val))
    return {
        "train": train,
        "valid": val.subset(range(min(valid_size, len(val)))),
        "test": val.subset(rest),
    }, vocab


def folder_splits(
    image_dir: str | Path, captions: dict[str, str | None], image_size: int | None = None
) -> dict[str, CaptionExamples]:
    """A folder of per-image files with a captions TSV per split (split -> TSV; None: no such split),
    read by :func:`load_caption_folder` (``image_size``: resize the images)."""
    return {name: load_caption_folder(tsv, image_dir, image_size)[0] for name, tsv in captions.items() if tsv}


def photo_split_names(splits: dict[str, Any]) -> dict[str, str]:
    """A recipe's ``splits`` section ({"train": NAME, "valid": NAME, "test": NAME or [NAMES]}) as the
    run's split -> the corpus's split name: "test" for one test split, "test-NAME" for each of several."""
    names = {"train": splits["train"], "valid": splits["valid"]}
    tests = splits.get("test") or []
    tests = [tests] if isinstance(tests, str) else list(tests)
    names.update({("test" if len(tests) == 1 else f"test-{t}"): t for t in tests})
    return names


def photos_folder(corpora: Sequence[CaptionCorpus]) -> tuple[Path, list[str]]:
    """The one image folder of ``corpora`` and every photo they caption (each once, in order)."""
    folders = {c.image_dir for c in corpora}
    if len(folders) != 1:
        raise ValueError(f"the splits' photos are in different folders {sorted(map(str, folders))}")
    return folders.pop(), list(dict.fromkeys(n for c in corpora for n in c.names))


def photo_splits(
    corpora: dict[str, CaptionCorpus], features: ImageFeatures, memory: str = "regions"
) -> dict[str, CaptionExamples]:
    """Each corpus's photos as their features (``memory``: "regions" or "pooled", see
    :meth:`ImageFeatures.select`), with their captions and photo paths."""
    return {
        key: CaptionExamples(
            features.select(c.names, memory), c.references, [c.image_dir / n for n in c.names]
        )
        for key, c in corpora.items()
    }
