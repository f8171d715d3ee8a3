"""tools/ became viz/ in 0.12 (scratchformer/tools/_moved.py), and its caption figures the captioning
task's figures module: each old import path still works for one release, as the very module of its
new one, and says so with a DeprecationWarning that points at the importing line; nothing of ours
uses an old path."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

import scratchformer
from scratchformer.tools._moved import GONE_IN, MOVED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_is_the_new_module(old: str, monkeypatch) -> None:
    new = importlib.import_module(MOVED[old])
    monkeypatch.delitem(sys.modules, f"scratchformer.tools.{old}", raising=False)  # import it afresh
    message = rf"scratchformer\.tools\.{old} moved to {re.escape(new.__name__)}; the old path goes in 0\.13"
    with pytest.warns(DeprecationWarning, match=message) as seen:
        module = importlib.import_module(f"scratchformer.tools.{old}")
    assert module is new and getattr(scratchformer.tools, old) is new
    assert {w.filename for w in seen if w.category is DeprecationWarning} == {importlib.__file__}
    for name in new.__all__:  # so `from scratchformer.tools.OLD import NAME` gives the same object
        assert getattr(module, name) is getattr(new, name), name


def test_the_warning_names_the_line_that_imports_the_old_path(monkeypatch) -> None:
    """Python shows a DeprecationWarning by default only where it is raised in __main__: it must be
    raised at the user's import, not inside our shim or the import machinery."""
    monkeypatch.delitem(sys.modules, "scratchformer.tools.attention_maps", raising=False)
    with pytest.warns(DeprecationWarning) as seen:
        from scratchformer.tools.attention_maps import record_attention  # the line  # noqa: F401
    (warning,) = [w for w in seen if w.category is DeprecationWarning]
    assert (
        warning.filename == __file__
        and "from scratchformer.tools.attention_maps import"
        in Path(__file__).read_text().splitlines()[warning.lineno - 1]
    )


def test_the_old_package_imports_its_modules_by_name(monkeypatch) -> None:
    """``from scratchformer.tools import caption_figures``, as 0.11 allowed: the module, warned about."""
    monkeypatch.delitem(sys.modules, "scratchformer.tools.caption_figures", raising=False)
    monkeypatch.delattr(scratchformer.tools, "caption_figures", raising=False)
    with pytest.warns(DeprecationWarning, match="tasks.captioning.figures") as seen:
        from scratchformer.tools import caption_figures  # the line
    assert caption_figures is importlib.import_module("scratchformer.tasks.captioning.figures")
    (warning,) = [w for w in seen if w.category is DeprecationWarning]
    assert warning.filename == __file__


def test_nothing_of_ours_uses_an_old_path() -> None:
    """The package, tests, scripts, benchmarks, examples and docs name viz/ and the captioning task's
    figures (the CHANGELOG keeps history); only the shims, the import rule that allows them
    (tests/test_layout.py) and this file name the old paths."""
    old = re.compile(r"scratchformer\.tools\b|tools[./](" + "|".join(MOVED) + r")\b")
    allowed = {
        Path(__file__),
        ROOT / "tests/test_layout.py",
        *(ROOT / "src/scratchformer/tools").glob("*.py"),
    }
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


def test_the_old_paths_go_in_0_13() -> None:
    """One release with the old paths, then none: at 0.13 delete src/scratchformer/tools/, its entries
    in tests/test_layout.py (ALLOWED, DEPRECATED), and this folder."""
    release = tuple(int(part) for part in scratchformer.__version__.split(".")[:2])
    assert release < GONE_IN, f"scratchformer {scratchformer.__version__} still has the paths {sorted(MOVED)}"
