"""One answer to "what kind of checkpoint is this?": :func:`~scratchformer.tasks.shared.kinds.checkpoint_kind`
and its one set of names, :data:`~scratchformer.tasks.shared.kinds.KINDS`, which the command line, the
exports, the server and its page all use."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import scratchformer
from scratchformer.tasks.shared.kinds import KINDS, checkpoint_kind

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0.1.0"
PACKAGE = Path(scratchformer.__file__).parent


def test_the_kind_of_every_checkpoint_we_read_is_found(tmp_path: Path) -> None:
    """Ours (the kind in config.json), a Marian directory, a sentence-transformers folder, a Hugging
    Face BertForSequenceClassification, a plain BERT (an encoder)."""
    import transformers

    from scratchformer.formats.hf_bert import default_model_dir

    fixtures = [FIXTURES / kind for kind in ("translation", "text_classifier", "captioning")]
    assert [checkpoint_kind(p) for p in fixtures] == ["translation", "text_classifier", "captioning"]
    (tmp_path / "mlm").mkdir()
    (tmp_path / "mlm" / "config.json").write_text(json.dumps({"kind": "masked_lm"}))
    assert checkpoint_kind(tmp_path / "mlm") == "masked_lm"
    (tmp_path / "marian").mkdir()
    (tmp_path / "marian" / "config.json").write_text(json.dumps({"model_type": "marian"}))
    assert checkpoint_kind(tmp_path / "marian") == "translation"
    minilm = default_model_dir()  # all-MiniLM-L6-v2 (the test extra's package): modules.json
    assert minilm is None or checkpoint_kind(minilm) == "embedding"
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "clf")
    transformers.BertModel(config).save_pretrained(tmp_path / "bert")
    assert checkpoint_kind(tmp_path / "clf") == "text_classifier"
    assert checkpoint_kind(tmp_path / "bert") == "embedding"


def test_a_kind_nobody_knows_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"kind": "speech"}))
    with pytest.raises(ValueError, match="holds a 'speech' checkpoint"):
        checkpoint_kind(tmp_path)


def kind_tables(source: str) -> list[tuple[int, list[str]]]:
    """The literal tuples, lists, sets and dict keys of ``source`` that name two or more kinds: each
    as (line, its strings)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)) or items is None:
            continue
        strings = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        if len(set(strings) & set(KINDS)) >= 2:
            found.append((node.lineno, strings))
    return found


def foreign_names(source: str) -> list[str]:
    """Names in a table of kinds that are not kinds (a second set of kind names)."""
    return [
        f"line {line}: {sorted(set(strings) - set(KINDS))}"
        for line, strings in kind_tables(source)
        if not set(strings) <= set(KINDS)
    ]


def test_one_set_of_kind_names_in_the_package() -> None:
    """Every table of kinds in the package (the exports', the server's, the ONNX reader's) draws its
    names from KINDS, and the page's panels are the kinds the server serves."""
    bad = {
        str(path.relative_to(PACKAGE)): found
        for path in PACKAGE.rglob("*.py")
        if (found := foreign_names(path.read_text(encoding="utf-8")))
    }
    assert not bad, bad
    page = (PACKAGE / "serve" / "static" / "app.js").read_text(encoding="utf-8")
    panels = re.search(r"const PANELS = \{([^}]*)\}", page)
    assert panels is not None
    assert set(re.findall(r"(\w+):", panels.group(1))) <= set(KINDS)


def test_a_second_set_of_names_is_caught() -> None:
    """The check is not vacuous: yesterday's export table (a "sentence_encoder") is reported."""
    source = 'FORMATS = {"translation": ("hf",), "text_classifier": ("hf",), "sentence_encoder": ("onnx",)}'
    assert foreign_names(source) == ["line 1: ['sentence_encoder']"]
    assert foreign_names('FORMATS = {"translation": 1, "embedding": 2}') == []


def test_one_function_says_the_kind() -> None:
    """No second detector: ``def checkpoint_kind`` once, and none of the old names."""
    defs = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        for name in re.findall(r"^\s*def (\w*kind\w*)\(", path.read_text(encoding="utf-8"), re.M)
        if name in ("checkpoint_kind", "detect_kind", "_export_kind", "kind_of")
    ]
    assert defs == ["tasks/shared/kinds.py: checkpoint_kind"], defs


def test_the_old_path_tasks_common_warns_and_is_the_new_package(monkeypatch) -> None:
    """``scratchformer.tasks.common`` (until 0.13) is ``tasks.shared`` itself, with a warning."""
    import importlib
    import sys

    import pytest

    from scratchformer.tasks import shared

    monkeypatch.delitem(sys.modules, "scratchformer.tasks.common", raising=False)
    message = (
        r"scratchformer\.tasks\.common moved to scratchformer\.tasks\.shared; the old path goes in 0\.13"
    )
    with pytest.warns(DeprecationWarning, match=message) as seen:
        module = importlib.import_module("scratchformer.tasks.common")
    assert module is shared and module.checkpoint_kind is shared.checkpoint_kind
    assert module.TrainingRun is shared.TrainingRun and module.pad_ids is shared.pad_ids
    assert {w.filename for w in seen if w.category is DeprecationWarning} == {importlib.__file__}
