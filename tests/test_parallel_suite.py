"""The suite runs on every core (pyproject.toml: pytest-xdist, -n auto --dist loadfile), each worker
with one thread, and the files that share a session fixture on one worker (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import SHARED_WORKER, TESTS, worker_scope

ROOT = TESTS.parent


def test_pyproject_runs_the_suite_on_every_core_file_by_file() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    (addopts,) = re.findall(r'^addopts = "(.*)"$', pyproject, flags=re.M)
    assert "-n auto" in addopts and "--dist loadfile" in addopts
    assert '"pytest-xdist' in pyproject


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="runs in an xdist worker (-n 0 here)")
def test_a_worker_computes_with_one_thread_and_so_do_its_processes() -> None:
    assert torch.get_num_threads() == 1
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True
    )
    assert child.stdout.strip() == "1", child.stderr


def test_files_that_share_a_session_fixture_go_to_one_worker() -> None:
    groups: dict[str, set[str]] = {}
    for file, fixture in SHARED_WORKER.items():
        assert (ROOT / file).is_file(), file  # a renamed file would silently build its fixture twice
        assert re.search(rf"\b{fixture}\b", (ROOT / file).read_text()), (file, fixture)
        groups.setdefault(fixture, set()).add(worker_scope(f"{file}::test_x[a-b]"))
    assert all(scopes == {fixture} for fixture, scopes in groups.items()), groups
    assert len(groups) >= 2
    other = "tests/core/test_attention_parity.py"
    assert worker_scope(f"{other}::test_x") == worker_scope(f"{other}::test_y") == other
    assert worker_scope(f"{other}::test_x") != worker_scope("tests/core/test_embedding.py::test_x")
