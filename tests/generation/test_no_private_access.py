"""generation/ and fast/ reach the core, and each other's modules, through public names: no attribute
access ``x._name`` where ``x`` is not ``self`` or ``cls`` and ``_name`` is not defined in the same
module (``super()._attend`` in a class that defines ``_attend`` is its own), and no import of
another module's private name. Torch's private names a speed path needs are listed in ``TORCH``,
each with the one function that holds it and why; the list has no stale entry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import scratchformer

PACKAGE = Path(scratchformer.__file__).parent
FOLDERS = ("generation", "fast")
_NO_PUBLIC_VERSION = "torch's in-place version counter (autograd's own check): no public name gives it"
_ONEDNN = "oneDNN's packed GEMM has no public torch API (these are the ops torch's inductor emits)"
_INT8 = "a dynamically quantized Linear's packed weight has no public name (its forward reads the same)"
_HOOKS = "nn.Module has no public way to ask whether hooks watch a module"
TORCH: dict[tuple[str, str, str], str] = {  # (module, function, expression): why
    ("generation/fast_step.py", "_weight_version", "weight._version"): _NO_PUBLIC_VERSION,
    ("generation/fast_step.py", "_onednn_pack", "torch.ops.mkldnn._reorder_linear_weight"): _ONEDNN,
    ("generation/fast_step.py", "_onednn_product", "torch.ops.mkldnn._linear_pointwise"): _ONEDNN,
    ("generation/fast_step.py", "_int8", "linear._packed_params"): _INT8,
    ("generation/fast_step.py", "_int8", "params._packed_params"): _INT8,
    ("fast/encoder.py", "_watched", "m._forward_hooks"): _HOOKS,
    ("fast/encoder.py", "_watched", "m._forward_pre_hooks"): _HOOKS,
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.AST) -> set[str]:
    """Every name the module defines: functions, classes, assigned names and attributes, imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def private_accesses(source: str) -> list[tuple[str, str]]:
    """(enclosing function or "<module>", expression) of every access to another module's private
    name in ``source``: ``x._name`` (x not self or cls, _name not defined here) and
    ``from m import _name``."""
    tree = ast.parse(source)
    defined, found = _defined(tree), []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((function, ast.unparse(node)))
        if isinstance(node, ast.ImportFrom):
            found.extend(
                (function, f"from {node.module} import {a.name}") for a in node.names if _private(a.name)
            )
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def all_accesses() -> set[tuple[str, str, str]]:
    return {
        (path.relative_to(PACKAGE).as_posix(), function, expression)
        for folder in FOLDERS
        for path in sorted((PACKAGE / folder).glob("*.py"))
        for function, expression in private_accesses(path.read_text(encoding="utf-8"))
    }


def test_generation_and_fast_use_public_names_only() -> None:
    found = all_accesses()
    unlisted = sorted(found - set(TORCH))
    assert not unlisted, "private names read from outside their module:\n" + "\n".join(map(str, unlisted))
    assert not set(TORCH) - found, f"stale entries: {sorted(set(TORCH) - found)}"


@pytest.mark.parametrize(
    "line",
    [
        "def _f(attn, x):\n    return attn._project(x, 0, 1)\n",
        "def _f(attn):\n    return type(attn)._project\n",
        "def _f(weight):\n    return weight._version\n",
        "from scratchformer.core.attention import _HALF\n",
    ],
)
def test_the_check_catches_an_injected_access(line: str) -> None:
    """The check is not vacuous: one private access added to a real module is reported."""
    source = (PACKAGE / "generation" / "fast_beam.py").read_text(encoding="utf-8")
    assert private_accesses(source) == []
    assert len(private_accesses(source + "\n\n" + line)) == 1


def test_own_names_are_not_reported() -> None:
    source = (
        "class A(Base):\n    def _attend(self):\n        return super()._attend() + self._x + cls._y\n\n"
        "_KEPT = {}\n\ndef f(module):\n    return module._KEPT\n"
    )
    assert private_accesses(source) == []
