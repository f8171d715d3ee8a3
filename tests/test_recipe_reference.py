"""The recipe reference (docs/reference/recipes.md, its tables generated at build time by
docs/_ext/recipe_reference.py) describes every field of the classes that read recipes, and every
key that the shipped recipes use is a field the reference documents for that section."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from scratchformer.core.config import ModelConfig
from scratchformer.core.transformer import TransformerConfig
from scratchformer.data.shapes import shape_scene_splits
from scratchformer.models.captioning import CaptioningConfig
from scratchformer.models.classifier import ClassifierConfig
from scratchformer.models.contextual import EncoderConfig
from scratchformer.tasks.captioning import (
    AugmentOptions,
    CaptioningRecipe,
    CaptionSplits,
    FineTuneOptions,
    SelfCriticalOptions,
)
from scratchformer.tasks.classification import ClassifierRecipe
from scratchformer.tasks.masked_lm import MLMRecipe
from scratchformer.tasks.shared import DECODING_KEYS, DecodingOptions
from scratchformer.tasks.translation import TranslationRecipe
from scratchformer.training.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import recipe_reference as rr  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "recipes.md"
RECIPES = sorted((ROOT / "recipes").glob("*.json"))
DESCRIBED = [
    ClassifierRecipe,
    MLMRecipe,
    TranslationRecipe,
    CaptioningRecipe,
    TrainConfig,
    ModelConfig,
    EncoderConfig,
    TransformerConfig,
    CaptioningConfig,
    ClassifierConfig,
    DecodingOptions,
    CaptionSplits,
    SelfCriticalOptions,
    FineTuneOptions,
    AugmentOptions,
    shape_scene_splits,
]


def page_sections() -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """The page's level-2 sections: (text, its recipe-fields directives)."""
    parts = re.split(r"^## ", PAGE.read_text(encoding="utf-8"), flags=re.M)[1:]
    return [(part, rr.directive_blocks(part)) for part in parts]


def recipe_sections() -> dict[Path, tuple[type, list[tuple[str, dict[str, str]]]]]:
    """Each shipped recipe -> the recipe class the page says reads it (the section's table without a
    prefix) and the tables that document its sections (that section's, and the shared ones)."""
    shared = [
        block
        for _, blocks in page_sections()
        for block in blocks
        if not any("prefix" not in options for _, options in blocks)
    ]
    found: dict[Path, tuple[type, list[tuple[str, dict[str, str]]]]] = {}
    for text, blocks in page_sections():
        tops = [target for target, options in blocks if "prefix" not in options]
        if not tops:
            continue
        assert len(tops) == 1, f"one recipe class per section, got {tops}"
        intro = text.split("```", 1)[0]
        for name in re.findall(r"`recipes/(\w+\.json)`", intro):
            assert ROOT / "recipes" / name not in found, f"{name} is in two sections of the page"
            found[ROOT / "recipes" / name] = (rr.resolve(tops[0]), blocks + shared)
    return found


@pytest.mark.parametrize("obj", DESCRIBED, ids=lambda o: o.__qualname__)
def test_every_field_has_a_description(obj: Any) -> None:
    rows = rr.field_docs(obj)  # raises, naming them, if some have none
    assert rows and all(row.description.strip() for row in rows)
    if dataclasses.is_dataclass(obj):
        assert [row.name for row in rows] == [f.name for f in dataclasses.fields(obj)]


def test_every_table_on_the_page_renders() -> None:
    blocks = [block for _, blocks in page_sections() for block in blocks]
    assert len(blocks) >= 10
    for target, options in blocks:
        assert rr.block_rows(target, options), target


def test_every_recipe_file_is_on_the_page() -> None:
    sections = recipe_sections()
    assert RECIPES and set(RECIPES) == set(sections), "name it in its section of docs/reference/recipes.md"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_recipe_key_is_documented(path: Path) -> None:
    """Nested keys included; ``decoding_grid``'s keys are decoding keys."""
    recipe_cls, blocks = recipe_sections()[path]
    recipe_cls.from_json(path)  # the class the page names does read this recipe
    documented = {row.name for target, options in blocks for row in rr.block_rows(target, options)}
    missing = []

    def walk(prefix: str, section: dict[str, Any]) -> None:
        for key, value in section.items():
            name = prefix + key
            if name not in documented:
                missing.append(name)
            elif isinstance(value, dict):
                walk("decoding." if name == "decoding_grid" else name + ".", value)

    walk("", json.loads(path.read_text(encoding="utf-8")))
    assert not missing, f"{path.name}: {missing} are in no table of the reference for {recipe_cls.__name__}"


def test_the_decoding_keys_are_the_documented_ones() -> None:
    assert DECODING_KEYS == {
        "beam_size": int,
        "length_penalty": float,
        "max_len_a": float,
        "max_len_b": int,
        "no_repeat_ngram_size": int,
        "min_new_tokens": int,
    }
    assert [row.name for row in rr.field_docs(DecodingOptions)] == list(DECODING_KEYS)


def test_the_translation_model_default_the_page_gives_is_the_code_s() -> None:
    """The page shows max_len 256 for translation (the task's, not TransformerConfig's 1024)."""
    (block,) = [(t, o) for t, o in rr.directive_blocks(PAGE.read_text()) if t.endswith("TransformerConfig")]
    max_len = json.loads(next(r.default for r in rr.block_rows(*block) if r.name == "model.max_len"))
    files = {f"{s}_{side}": "x" for s in ("train", "valid") for side in ("source", "target")}
    TranslationRecipe(**files, max_length=max_len)
    with pytest.raises(ValueError, match=f"max_len={max_len}"):
        TranslationRecipe(**files, max_length=max_len + 1)


# The extractor itself, on small classes of this file.


@dataclasses.dataclass
class Tiny:
    """A small section.

    Attributes:
        size: its size,
            in tokens.
    """

    LIMIT: ClassVar[int] = 3  # not a field
    path: str  # where it is
    size: int = 3
    rate: float | None = 1e-4  # a rate
    # that goes on here
    names: list[str] = dataclasses.field(default_factory=lambda: ["a", "b"])  # some names
    pair: tuple[float, float] = (0.9, 0.98)  # two numbers
    flag: bool = False  # on or off
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)  # a nested section


@dataclasses.dataclass
class Wider(Tiny):
    size: int = 5
    extra: dict[str, Any] = dataclasses.field(default_factory=lambda: {"k": None})  # more


@dataclasses.dataclass
class Undescribed:
    a: int = 1  # described
    b: int = 2


@dataclasses.dataclass
class DescribedTwice:
    """Twice.

    Attributes:
        a: described here
    """

    a: int = 1  # and here


@dataclasses.dataclass
class DescribesAStranger:
    """A stranger.

    Attributes:
        a: a field
        z: no field
    """

    a: int = 1


@dataclasses.dataclass
class TwoPerEntry:
    """Two fields in one entry.

    Attributes:
        a, b: two at once
    """

    a: int = 1
    b: int = 2


def test_the_extractor_reads_name_type_default_and_description() -> None:
    rows = {row.name: row for row in rr.field_docs(Tiny)}
    assert list(rows) == ["path", "size", "rate", "names", "pair", "flag", "train"]
    assert {n: (r.type, r.default) for n, r in rows.items()} == {
        "path": ("str", "required"),
        "size": ("int", "3"),
        "rate": ("float | None", "0.0001"),
        "names": ("list[str]", '["a", "b"]'),
        "pair": ("tuple[float, float]", "[0.9, 0.98]"),
        "flag": ("bool", "false"),
        "train": ("TrainConfig", "{}"),
    }
    assert rows["path"].default_is_json is False and rows["size"].default_is_json is True
    assert rows["size"].description == "its size, in tokens."
    assert rows["rate"].description == "a rate that goes on here"
    assert rows["names"].description == "some names"


def test_a_redeclared_field_keeps_its_base_description() -> None:
    rows = {row.name: row for row in rr.field_docs(Wider)}
    assert (rows["size"].default, rows["size"].description) == ("5", "its size, in tokens.")
    assert (rows["extra"].type, rows["extra"].default) == ("dict[str, Any]", '{"k": null}')


def test_typed_dicts_and_functions() -> None:
    splits = {row.name: row for row in rr.field_docs(CaptionSplits)}
    assert {n: (r.type, r.default) for n, r in splits.items()} == {
        "train": ("str", "required"),
        "valid": ("str", "required"),
        "test": ("str | list[str]", "optional"),
    }
    shapes = {row.name: (row.type, row.default) for row in rr.field_docs(shape_scene_splits)}
    assert shapes == {
        "seed": ("int", "0"),
        "train_size": ("int", "20000"),
        "valid_size": ("int", "500"),
        "test_size": ("int", "1000"),
    }


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (Undescribed, r"no description for \['b'\]"),
        (DescribedTwice, "described twice"),
        (TwoPerEntry, "one field per entry"),
        (DescribesAStranger, r"describes \['z'\], which are no fields"),
    ],
)
def test_a_field_without_one_description_is_an_error(cls: type, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rr.field_docs(cls)


def test_table_options() -> None:
    rows = rr.table_rows(
        f"{__name__}.Tiny",
        prefix="x.",
        exclude="train, pair",
        defaults='{"size": 7}',
        default_text="path=from the data",
    )
    assert [r.name for r in rows] == ["x.path", "x.size", "x.rate", "x.names", "x.flag"]
    assert (rows[0].default, rows[0].default_is_json, rows[1].default) == ("from the data", False, "7")
    assert [r.name for r in rr.table_rows(f"{__name__}.Tiny", fields="flag, size")] == ["flag", "size"]
    with pytest.raises(ValueError, match="no field 'nope'"):
        rr.table_rows(f"{__name__}.Tiny", exclude="nope")


def test_the_directive_builds_a_table_and_fails_the_build_without_a_description(tmp_path: Path) -> None:
    sphinx_app = pytest.importorskip("sphinx.application")
    pytest.importorskip("myst_parser")
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path[:0] = [{str(ROOT / 'docs' / '_ext')!r}, "
        f"{str(Path(__file__).parent)!r}]\n"
        "extensions = ['myst_parser', 'recipe_reference']\n"
    )
    (src / "index.md").write_text(
        f"# T\n\n```{{recipe-fields}} {__name__}.Tiny\n:prefix: t.\n```\n\n"
        f"```{{recipe-fields}} {__name__}.Wider\n:prefix: w.\n```\n"
    )

    def build() -> str:
        warnings = io.StringIO()
        sphinx_app.Sphinx(
            str(src),
            str(src),
            str(tmp_path / "out"),
            str(tmp_path / "doctrees"),
            "html",
            status=None,
            warning=warnings,
            freshenv=True,
        ).build()
        return warnings.getvalue()

    assert build().strip() == ""
    html = (tmp_path / "out" / "index.html").read_text()
    assert "t.rate" in html and "a rate that goes on here" in html and "w.extra" in html
    (src / "index.md").write_text(f"# T\n\n```{{recipe-fields}} {__name__}.Undescribed\n```\n")
    assert "no description for ['b']" in build()  # an error: sphinx-build -W fails
