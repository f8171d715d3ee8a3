"""The layout shows the architecture, and this test keeps it so.

The import rule (docs/design.md), checked on every import statement of the package,
those inside functions included:

    core        imports nothing else of the package (the paper)
    fast        core, fast                 generation  core, generation
    models      core, fast, models         data        data
    tools       core, tools                training    training
    tasks       anything below, tasks.common, never another task
    cli.py, __main__.py, __init__.py: anything

Also: core/ stays readable (at most 930 lines, attention.py at most 200, one fused and one explicit
attention kernel, no speed machinery inside).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import scratchformer

PACKAGE = Path(scratchformer.__file__).parent
ALLOWED = {
    "core": {"core"},
    "fast": {"core", "fast"},
    "generation": {"core", "generation"},
    "models": {"core", "fast", "models"},
    "data": {"data"},
    "tools": {"core", "tools"},
    "training": {"training"},
    "tasks": {"core", "fast", "generation", "models", "data", "tools", "training", "tasks"},
}
TOP = {"cli", "__main__", "__init__"}  # may import anything


def imported_modules(source: str) -> list[str]:
    """Every ``scratchformer.*`` module a source file imports, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("scratchformer")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scratchformer"):
            found += [f"{node.module}.{a.name}" if node.module == "scratchformer" else node.module for a in node.names]
    return found


def violations(module: str, source: str) -> list[str]:
    """The imports of ``module`` (a dotted path below the package, e.g. "tasks.translation") that
    break the rule."""
    parts = module.split(".")
    if parts[0] in TOP:
        return []
    bad = []
    for target in imported_modules(source):
        target_parts = target.split(".")[1:]  # drop "scratchformer"
        layer = target_parts[0] if target_parts else "__init__"
        if layer not in ALLOWED[parts[0]]:
            bad.append(f"{module} imports {target} ({parts[0]} may import only {sorted(ALLOWED[parts[0]])})")
        elif parts[0] == "tasks" and layer == "tasks" and target_parts[1:2] not in ([parts[1]], ["common"]):
            bad.append(f"{module} imports {target} (a task never imports another task; share via tasks/common.py)")
    return bad


def package_modules() -> dict[str, str]:
    return {".".join(p.relative_to(PACKAGE).with_suffix("").parts): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_every_module_belongs_to_a_known_layer() -> None:
    for module in package_modules():
        top = module.split(".")[0]
        assert top in ALLOWED or top in TOP, f"{module}: not in any layer of the map; add it to docs/design.md and here"


def test_imports_follow_the_rule() -> None:
    bad = [v for module, source in package_modules().items() for v in violations(module, source)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("core.attention", "from scratchformer.fast import optimize"),
        ("core.encoder", "import scratchformer.models.contextual"),
        ("fast.encoder", "from scratchformer.generation.cache import KVCache"),
        ("training.trainer", "from scratchformer.models.classifier import TextClassifier"),
        ("data.shapes", "from scratchformer.core.masks import padding_mask"),
        ("tasks.captioning", "from scratchformer.tasks.translation import pad_ids"),
        ("tools.attention_maps", "    from scratchformer.tasks.translation import Translator"),  # inside a function
        ("models.classifier", "from scratchformer import Transformer"),
    ],
)
def test_the_rule_catches_a_violation(module: str, line: str) -> None:
    """The checker is not vacuous: one forbidden import, added to a real module, is reported."""
    source = package_modules()[module]
    injected = source + ("\n\ndef _f():\n" + line + "\n" if line.startswith(" ") else "\n" + line + "\n")
    assert violations(module, source) == []
    assert len(violations(module, injected)) == 1


def test_core_reads_in_one_sitting() -> None:
    lines = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "core").glob("*.py")}
    assert sum(lines.values()) <= 930, lines  # 900 until Marian's four options (0.3) came in
    assert lines["attention.py"] <= 200, lines


def test_core_has_one_attention_path_and_no_speed_machinery() -> None:
    core = {p.name: p.read_text() for p in (PACKAGE / "core").glob("*.py")}
    text = "\n".join(core.values())
    assert text.count("F.scaled_dot_product_attention(") == 1  # the fused kernel
    assert text.count("torch.softmax(") == 1  # the explicit formula
    for trick in ("autograd.Function", "data_ptr", "_version", "inplace=True", "Packing", "index_select(",
                  "new_empty(", "record_weights"):
        assert trick not in text, f"core/ contains {trick!r}: speed paths and tools live outside core/"
