"""Style is checked, not hoped for: ``ruff check`` (the rules in pyproject.toml) and
``ruff format --check`` pass over everything Python in the repository, so CI fails on a style
regression like on any other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "scripts", "benchmarks", "examples", "docs", "README.md"]  # .md: its Python blocks


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401  (the test extra pins it)
    except ImportError:
        pytest.fail('ruff is not installed: pip install -e ".[test]"')
    return [sys.executable, "-m", "ruff"]  # this environment's ruff, the pinned one


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(command: list[str]) -> None:
    result = subprocess.run([*_ruff(), *command, *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, (
        f"ruff {' '.join(command)}:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
    )
