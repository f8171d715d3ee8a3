"""The ``sf`` namespace (src/scratchformer/__init__.py) is lazy: ``import scratchformer`` reads no
torch, and each public name is imported from its module on first use, the same object as before."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import scratchformer as sf


def test_import_scratchformer_reads_no_torch_and_a_name_reads_it_on_use() -> None:
    code = (
        "import sys, scratchformer as sf\n"
        "print('torch' in sys.modules, sf.__version__)\n"
        "print(sf.Transformer.__module__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", sf.__version__, "scratchformer.core.transformer", "True"]


def test_every_public_name_is_its_modules_object() -> None:
    assert set(sf.__all__) == set(sf._MODULE_OF) and len(sf.__all__) == len(set(sf.__all__))
    for name in sf.__all__:
        assert getattr(sf, name) is getattr(importlib.import_module(sf._MODULE_OF[name]), name), name
    assert set(sf.__all__) <= set(dir(sf))
    namespace: dict = {}
    exec("from scratchformer import *", namespace)
    assert set(sf.__all__) <= set(namespace)


def test_the_names_type_checkers_see_are_the_names_imported() -> None:
    """The ``if TYPE_CHECKING:`` imports (what editors and type checkers read) name the same module
    for each name as the table the lazy ``__getattr__`` imports from."""
    tree = ast.parse(Path(sf.__file__).read_text())
    (block,) = [node for node in tree.body if isinstance(node, ast.If)]
    seen = {alias.name: node.module for node in block.body for alias in node.names}
    assert seen == sf._MODULE_OF


def test_subpackages_and_unknown_names() -> None:
    assert sf.training is importlib.import_module("scratchformer.training")
    with pytest.raises(AttributeError, match="has no attribute 'Transfomer'"):
        sf.Transfomer  # noqa: B018
    with pytest.raises(ImportError):
        from scratchformer import Transfomer  # noqa: F401
