"""The tests mirror the package: tests/core/ for src/scratchformer/core/, and so on; tests/scripts/
checks scripts/ and benchmarks/; the tests here check the repository as a whole (layout, style,
docs). This file's folder is on sys.path (pytest puts a conftest.py's folder there), so every test
imports the shared ``helpers`` module."""

import atexit
import os
import subprocess
import sys
import tempfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# The machine switch and record (tests/_site/machine_switch.py): in this process, and through
# tests/_site/sitecustomize.py in every Python process the tests start. Each process of the suite
# (each xdist worker) keeps its own record of the package asking the machine whether it has native
# bf16; a test that asked without the `machine` marker fails (pytest_runtest_call below).
sys.path.insert(0, str(TESTS / "_site"))
import machine_switch  # noqa: E402

os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS / "_site"), os.environ.get("PYTHONPATH")]))
_record_fd, MACHINE_LOG = tempfile.mkstemp(prefix="scratchformer-machine-", suffix=".log")
os.close(_record_fd)
atexit.register(lambda: Path(MACHINE_LOG).unlink(missing_ok=True))
os.environ[machine_switch.LOG] = MACHINE_LOG
machine_switch.install()

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
# The tests whose outcome depends on the machine are marked `machine`: .ci/run runs them a second
# time as the other machine kind (`-m machine`): under its kernels (AVX2 code on an AVX-512 machine,
# plain C on an AVX2 one) and with its precision choices (`--native-bf16`: "auto" resolving as it
# would there), so a developer on either kind sees what the other would see. The marker is given
# by file to the tests whose results depend on the CPU's kernels (their order of adding, their
# rounding): the golden runs and every parity test against another engine or library; by hand to
# the others (`@pytest.mark.machine`: precision choices, thread counts).
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
    "generation/test_fast_rules.py",
    "generation/test_fast_step_mask.py",
    "generation/test_continuous.py",
    "data/test_pooling_and_tokenization.py",
    "scripts/test_serving_benchmark.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--native-bf16",
        choices=("yes", "no"),
        default=None,
        help="what the package hears when it asks whether this CPU computes bf16 natively "
        "(default: the machine's answer); .ci/run's second pass gives the other kind's",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "machine: the outcome depends on the machine (its kernels, its precision choice, its thread "
        "count); CI runs it twice, the second time as the other machine kind (.ci/run)",
    )
    native = config.getoption("--native-bf16")
    if native:  # before any test (and any process a test starts) imports the package
        os.environ[machine_switch.FORCE] = native
        machine_switch.install()


def machine_asked() -> int:
    """How often the package has asked this machine whether it computes bf16 natively (this
    process and the processes it started, as recorded so far)."""
    return Path(os.environ[machine_switch.LOG]).stat().st_size


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    item.stash[_ASKED_BEFORE] = machine_asked()  # the test's fixtures count as the test
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    if machine_asked() > item.stash[_ASKED_BEFORE] and item.get_closest_marker("machine") is None:
        pytest.fail(
            "this test asked whether the machine computes bf16 natively (precision 'auto', or an "
            "explicit bf16's warning), so its outcome depends on the machine: mark it "
            "@pytest.mark.machine (CI's second pass then plays the other kind), or ask for a "
            "precision that is the same everywhere ('fp32')",
            pytrace=False,
        )
    return result


_ASKED_BEFORE = pytest.StashKey[int]()


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


def kernel_sensitive(path: Path) -> bool:
    where = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    return any(fnmatch(where, pattern) for pattern in KERNEL_SENSITIVE)


def second_pass_reads(path: Path) -> bool:
    """Whether CI's second pass (``-m machine``) imports this test file: kernel-sensitive, or a
    file that marks a test ``machine`` by hand. Each worker would import the others only to
    deselect all their tests (10 s of the pass's 110 on a 2-core Xeon)."""
    return kernel_sensitive(path) or "mark.machine" in path.read_text(encoding="utf-8")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.option.markexpr != "machine" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_") or second_pass_reads(collection_path):
        return None
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if kernel_sensitive(item.path):
            item.add_marker(pytest.mark.machine)
    marked = {item.path for item in items if item.get_closest_marker("machine")}  # each file read once
    unread = sorted(str(path) for path in marked if not second_pass_reads(path))
    if unread:  # a marker given some other way than these two: the second pass would not see it
        raise pytest.UsageError(f"machine tests the second pass would not import: {', '.join(unread)}")


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
