"""The converters left models/ for formats/ in 0.11 (scratchformer/models/_moved.py): each old import
path still works for one release, as the very module of its new one, and says so with a
DeprecationWarning that points at the importing line; nothing of ours uses an old path."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

import scratchformer
from scratchformer.formats import hf_classifier
from scratchformer.formats.hf_bert import bert_export
from scratchformer.formats.hf_files import write_export
from scratchformer.models import classifier
from scratchformer.models._moved import GONE_IN, MOVED
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_is_the_new_module(old: str, monkeypatch) -> None:
    new = importlib.import_module(f"scratchformer.formats.{MOVED[old]}")
    monkeypatch.delitem(sys.modules, f"scratchformer.models.{old}", raising=False)  # import it afresh
    message = rf"scratchformer\.models\.{old} moved to {new.__name__}; the old path goes in 0\.12"
    with pytest.warns(DeprecationWarning, match=message) as seen:
        module = importlib.import_module(f"scratchformer.models.{old}")
    assert module is new and getattr(scratchformer.models, old) is new
    assert {w.filename for w in seen if w.category is DeprecationWarning} == {importlib.__file__}
    for name in new.__all__:  # so `from scratchformer.models.OLD import NAME` gives the same object
        assert getattr(module, name) is getattr(new, name), name


def test_the_warning_names_the_line_that_imports_the_old_path(monkeypatch) -> None:
    """Python shows a DeprecationWarning by default only where it is raised in __main__: it must be
    raised at the user's import, not inside our shim or the import machinery."""
    monkeypatch.delitem(sys.modules, "scratchformer.models.marian", raising=False)
    with pytest.warns(DeprecationWarning) as seen:
        from scratchformer.models.marian import load_marian  # the line  # noqa: F401
    (warning,) = [w for w in seen if w.category is DeprecationWarning]
    assert (
        warning.filename == __file__
        and "from scratchformer.models.marian import"
        in Path(__file__).read_text().splitlines()[warning.lineno - 1]
    )


@pytest.mark.parametrize("name", ["hf_classifier_export", "is_classifier_export", "load_classifier_export"])
def test_the_classifier_modules_moved_names_warn_and_are_the_same(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"formats.hf_classifier.{name}"):
        assert getattr(classifier, name) is getattr(hf_classifier, name)
    with pytest.raises(AttributeError, match="no attribute 'hf_classifier_exprot'"):
        classifier.hf_classifier_exprot  # noqa: B018


def test_from_pretrained_encoder_warns_and_gives_what_classifier_from_pretrained_gives(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    config = EncoderConfig(
        40, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=24, norm_first=False,
        embedding_norm=True, type_vocab_size=2, pooler=True, pad_id=0,
    )  # fmt: skip
    directory = write_export(tmp_path / "bert", *bert_export(ContextualEncoder(config)))
    torch.manual_seed(1)
    new = hf_classifier.classifier_from_pretrained(directory, 3, "pooler", dropout=0.2)
    torch.manual_seed(1)
    with pytest.warns(DeprecationWarning, match="classifier_from_pretrained"):
        old = classifier.TextClassifier.from_pretrained_encoder(directory, 3, "pooler", dropout=0.2)
    assert old.config == new.config and old.config.encoder.dropout == 0.2
    for (name, a), b in zip(old.state_dict().items(), new.state_dict().values()):
        assert torch.equal(a, b), name


def test_nothing_of_ours_uses_an_old_path() -> None:
    """The package, tests, scripts, benchmarks, examples and docs name formats/ (the CHANGELOG keeps
    history); only the shims, their table and this file name the old paths."""
    old = re.compile(
        r"scratchformer[./]models[./](" + "|".join(MOVED) + r")\b"
        r"|models/(" + "|".join(MOVED) + r")\.py"
        r"|from_pretrained_encoder\(|models\.classifier import[^\n]*_export"
    )
    allowed = {Path(__file__), *(ROOT / "src/scratchformer/models").glob("*.py")}
    found = [
        f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
        for folder in ("src", "tests", "scripts", "benchmarks", "examples", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".md", ".txt", ".json")
        and path not in allowed
        and not any(part == "_build" or part.endswith(".egg-info") for part in path.parts)  # built files
        for text in [path.read_text(encoding="utf-8")]
        for m in old.finditer(text)
    ]
    assert not found, "\n".join(found)


def test_the_old_paths_go_in_0_12() -> None:
    """One release with the old paths, then none: at 0.12 delete the shims (models/_moved.py and the
    modules it names, models.classifier's __getattr__ and from_pretrained_encoder), the exceptions in
    tests/test_layout.py, and this file."""
    release = tuple(int(part) for part in scratchformer.__version__.split(".")[:2])
    assert release < GONE_IN, f"scratchformer {scratchformer.__version__} still has the paths {sorted(MOVED)}"
