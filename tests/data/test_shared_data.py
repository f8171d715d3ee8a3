"""Checks on the real shared data (../shared/data, or $SCRATCHFORMER_DATA); skipped only where it is
absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from scratchformer.data.labelled_texts import default_data_dir, load_labelled_texts
from scratchformer.tasks.classification import ClassifierRecipe

REPO = Path(__file__).resolve().parents[2]
DATA = default_data_dir() if default_data_dir().is_absolute() else (REPO / default_data_dir())
needs_imdb = pytest.mark.skipif(
    not (DATA / "imdb" / "train.jsonl.gz").is_file(), reason=f"no IMDB data under {DATA}"
)


@needs_imdb
@pytest.mark.parametrize("split, positives", [("train", 12_498), ("test", 12_496)])
def test_imdb_loads_completely(split: str, positives: int) -> None:
    data = load_labelled_texts(DATA / "imdb" / f"{split}.jsonl.gz", label_names=["negative", "positive"])
    assert len(data) == 24_996 and sum(data.labels) == positives and data.skipped == {}
    assert any("<br />" in t for t in data.texts[:200])  # raw text, line-break tags included


def test_committed_imdb_recipe_is_valid() -> None:
    recipe = ClassifierRecipe.from_json(REPO / "recipes" / "imdb.json")
    assert (
        recipe.train_file == "{data}/imdb/train.jsonl.gz" and recipe.test_file == "{data}/imdb/test.jsonl.gz"
    )
    assert recipe.label_names == ["negative", "positive"]
    assert recipe.pretrained is None  # from scratch
