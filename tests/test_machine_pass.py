"""CI runs the machine-dependent tests twice: once as they are, once as the other machine kind, its
kernels and its precision choices (.ci/run). The tests marked by file (tests/conftest.py) name no
file that is gone, the second pass is really there, a test that lets ``auto`` choose without the
``machine`` marker fails, and ``--native-bf16`` reaches the package in the test process and in the
processes a test starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import conftest
import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import subprocess, sys
import pytest, torch
from scratchformer.training.precision import resolve_precision

CHILD = ("import torch; from scratchformer.training.precision import resolve_precision as r; "
         "print(r('auto', torch.device('cpu')))")

def auto_here():
    return resolve_precision("auto", torch.device("cpu"))

def auto_in_a_child():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    return done.stdout.strip()

def test_unmarked_asks_here():
    auto_here()

def test_unmarked_asks_in_a_child():
    auto_in_a_child()

def test_unmarked_asks_for_fp32():
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"

@pytest.mark.machine
def test_marked_asks():
    auto_here()

@pytest.mark.machine
def test_hears(request):
    expected = {"yes": "bf16", "no": "fp32"}[request.config.getoption("--native-bf16")]
    assert auto_here() == expected and auto_in_a_child() == expected
"""


def run_probe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest, with this suite's conftest as a plugin, on PROBE (the machine's own oneDNN: no cap)."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(conftest.TESTS), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rf", *args]
    return subprocess.run([*command, "test_probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_a_test_that_lets_auto_choose_needs_the_marker(tmp_path: Path) -> None:
    done = run_probe(tmp_path, "-k", "not hears")
    lines = done.stdout.splitlines()
    failed = {line.split("::")[1].split(" ")[0] for line in lines if line.startswith("FAILED")}
    assert failed == {"test_unmarked_asks_here", "test_unmarked_asks_in_a_child"}, done.stdout
    assert "2 failed, 2 passed" in done.stdout and "mark it @pytest.mark.machine" in done.stdout


def test_native_bf16_reaches_the_package_here_and_in_child_processes(tmp_path: Path) -> None:
    for answer in ("yes", "no"):
        done = run_probe(tmp_path, "-k", "hears", f"--native-bf16={answer}")
        assert "1 passed" in done.stdout, done.stdout + done.stderr


def test_every_kernel_sensitive_pattern_names_test_files() -> None:
    for pattern in conftest.KERNEL_SENSITIVE:
        assert list(conftest.TESTS.glob(pattern)), (
            f"tests/conftest.py KERNEL_SENSITIVE: {pattern} matches no file"
        )


def test_ci_runs_them_again_as_the_other_kind() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'python -m pytest -m machine --native-bf16="$native"' in ci
    for setting in ("ATEN_CPU_CAPABILITY=avx2", "ONEDNN_MAX_CPU_ISA=AVX2", "MKL_ENABLE_INSTRUCTIONS=AVX2"):
        assert setting in ci  # the AVX2 kernels, on an AVX-512 machine
    assert "ATEN_CPU_CAPABILITY=default" in ci  # plain C kernels, on an AVX2-only one
    assert "native=no" in ci and "native=yes" in ci and "amx_tile|avx512_bf16" in ci
    assert "--durations=25" in ci


def test_the_second_pass_imports_the_files_that_can_hold_machine_tests(tmp_path: Path) -> None:
    """``-m machine`` skips importing a test file that is neither kernel-sensitive nor marks a test by
    hand; a full collection refuses a machine test in a file that the second pass would skip."""
    hand, plain = tmp_path / "test_hand.py", tmp_path / "test_plain.py"
    hand.write_text("import pytest\n\n@pytest.mark.machine\ndef test_a(): ...\n")
    plain.write_text("def test_a(): ...\n")
    assert conftest.second_pass_reads(hand) and not conftest.second_pass_reads(plain)
    assert conftest.second_pass_reads(conftest.TESTS / "tasks" / "test_golden_runs.py")  # by file

    class Item:  # what the hook reads of a collected test
        def __init__(self, path: Path, marked: bool) -> None:
            self.path, self.marked = path, marked

        def get_closest_marker(self, name: str) -> object:
            return self.marked or None

        def add_marker(self, marker: object) -> None:
            self.marked = True

    conftest.pytest_collection_modifyitems(None, [Item(hand, True), Item(plain, False)])
    with pytest.raises(pytest.UsageError, match="test_plain.py"):  # marked some other way
        conftest.pytest_collection_modifyitems(None, [Item(plain, True)])
