"""No function of generation/ is longer than 60 lines, counted as tests/test_layout.py counts them
(from the ``def`` line to the function's last line, docstring included; decorators not)."""

from __future__ import annotations

import ast
from pathlib import Path

import scratchformer

GENERATION = Path(scratchformer.__file__).parent / "generation"
MAX_LINES = 60


def long_functions(source: str, limit: int = MAX_LINES) -> dict[str, int]:
    """name@line -> length of every function (methods and nested ones too) over ``limit`` lines."""
    return {
        f"{node.name}@{node.lineno}": node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > limit
    }


def test_no_function_of_generation_is_over_60_lines() -> None:
    paths = sorted(GENERATION.glob("*.py"))
    assert len(paths) > 10  # the walk saw the package
    found = {f"{p.name}:{name}": n for p in paths for name, n in long_functions(p.read_text()).items()}
    assert not found, f"functions over {MAX_LINES} lines: {found}"


def test_the_count_catches_a_long_function() -> None:
    """A 61-line function is reported, a 60-line one is not (the count includes the def line)."""
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    at_limit = f'def f():\n    """Doc."""\n{body}'
    assert long_functions(at_limit) == {}
    assert long_functions(at_limit + "    return x0\n") == {"f@1": 61}
