"""The tests mirror the package: tests/core/ for src/scratchformer/core/, and so on; tests/scripts/
checks scripts/ and benchmarks/; the tests here check the repository as a whole (layout, style,
docs). This file's folder is on sys.path (pytest puts a conftest.py's folder there), so every test
imports the shared ``helpers`` module."""

import os
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Under pytest-xdist (pyproject.toml: -n auto, one worker per core) each worker computes with one
# thread: two workers of two threads on two cores spin-wait for each other's cores (OpenMP), and the
# suite takes twice as long. Set before any test module imports torch; the processes a test starts
# inherit it.
WORKER_THREADS = 0  # 0: not a worker, torch's own default
if os.environ.get("PYTEST_XDIST_WORKER"):
    WORKER_THREADS = int(os.environ.setdefault("OMP_NUM_THREADS", "1"))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(WORKER_THREADS)

# The files that share a session fixture go to one xdist worker, which computes it once:
# conftest.demo_verbatim and conftest.tiny_translation.
SHARED_WORKER = {
    "tests/test_docs.py": "demo_verbatim",
    "tests/cli/test_demo_and_cli.py": "demo_verbatim",
    "tests/tasks/test_translation.py": "tiny_translation",
    "tests/cli/test_generation_cli.py": "tiny_translation",
    "tests/scripts/test_fast_beam_parity.py": "tiny_translation",
    "tests/scripts/test_translation_ensemble.py": "tiny_translation",
}
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
    "generation/test_fast_beam.py",
    "data/test_pooling_and_tokenization.py",
    "scripts/test_serving_benchmark.py",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kernels: depends on the CPU's kernels; CI runs it twice (.ci/run)")


@pytest.fixture(autouse=True)
def _worker_threads():
    """A test that set torch's thread count (a command's --threads, a trainer's ``threads``) leaves
    its worker as it found it."""
    yield
    torch = sys.modules.get("torch")
    if WORKER_THREADS and torch is not None and torch.get_num_threads() != WORKER_THREADS:
        torch.set_num_threads(WORKER_THREADS)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` (pyproject.toml's), with the files of SHARED_WORKER grouped."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileSharingFixtures(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    return LoadFileSharingFixtures(config, log)


def worker_scope(nodeid: str) -> str:
    """What goes to one worker: the test's file, or the group of files that share its fixture."""
    file = nodeid.split("::", 1)[0]
    return SHARED_WORKER.get(file, file)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else ""
        if any(fnmatch(where, pattern) for pattern in KERNEL_SENSITIVE):
            item.add_marker(pytest.mark.kernels)


@pytest.fixture(scope="session")
def demo_verbatim(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """README's main job, ``scratchformer demo`` as a shell runs it, once for the session (its ~20
    s of training): the finished process and its working folder. Getting Started's verbatim test
    and the demo's learning test both read it."""
    work = tmp_path_factory.mktemp("demo")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-c", DEMO_COMMAND], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    return done, work


DEMO_COMMAND = "scratchformer demo"  # as README.md and docs/getting-started.md write it


@pytest.fixture(scope="session")
def tiny_translation(tmp_path_factory) -> tuple:
    """tests/tasks/test_translation.py's tiny recipe trained once for the session (300 steps): the
    recipe, its report and its run folder. Read it, never write into it."""
    from tasks.test_translation import tiny_recipe

    from scratchformer.tasks.translation import train_translation

    tmp = tmp_path_factory.mktemp("tiny-translation")
    recipe = tiny_recipe(tmp)
    return recipe, train_translation(recipe), tmp / "run"
