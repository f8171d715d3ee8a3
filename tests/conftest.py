"""The tests mirror the package: tests/core/ for src/scratchformer/core/, and so on; tests/scripts/
checks scripts/ and benchmarks/; the tests here check the repository as a whole (layout, style,
docs). This file's folder is on sys.path (pytest puts a conftest.py's folder there), so every test
imports the shared ``helpers`` module."""

from fnmatch import fnmatch
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# The tests whose results depend on the CPU's kernels (their order of adding, their rounding): the
# golden runs and every parity test against another engine or library. .ci/run runs them a second
# time under other kernels (`-m kernels`: AVX2 code on an AVX-512 machine, plain C on an AVX2 one),
# so a developer on either machine kind sees what the other would see.
KERNEL_SENSITIVE = (
    "tasks/test_golden_runs.py",
    "core/test_*parity*.py",
    "fast/test_*.py",
    "formats/test_*.py",
    "generation/test_ensemble.py",
    "generation/test_scoring.py",
    "tasks/test_translation_ties.py",
    "generation/test_beam_search.py",
    "data/test_pooling_and_tokenization.py",
    "scripts/test_serving_benchmark.py",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kernels: depends on the CPU's kernels; CI runs it twice (.ci/run)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else ""
        if any(fnmatch(where, pattern) for pattern in KERNEL_SENSITIVE):
            item.add_marker(pytest.mark.kernels)
