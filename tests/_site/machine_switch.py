"""The tests' switch for what ``precision: "auto"`` decides, and their record of who asks.

``scratchformer.training.precision.cpu_has_native_bf16`` is the one place where the package asks the
machine whether it multiplies bf16 in hardware (AMX or AVX512_BF16): ``"auto"`` resolves by it, and
an explicit bf16 is warned about by it. Two environment variables, set by tests/conftest.py only
(the package never reads them), act on it in the test process and in every Python process the
tests start (this folder is put on their ``PYTHONPATH``; its sitecustomize.py calls
:func:`install`; the forked command lines of tests/forked.py inherit it from their server):

    SCRATCHFORMER_TESTS_NATIVE_BF16  "yes" or "no": the package hears this answer instead of the
                                     machine's (``pytest --native-bf16``: the other machine kind's
                                     choices, .ci/run's second pass)
    SCRATCHFORMER_TESTS_MACHINE_LOG  a file: each time the package asks the machine itself, one line
                                     is appended (tests/conftest.py fails a test that asked without
                                     the ``machine`` marker)

The record hooks torch's own answers (``torch.cpu._is_avx512_bf16_supported``,
``_is_amx_tile_supported``) and counts only the package's calls: a test that mocks them (as
tests/training/test_precision.py does, to play each kind of CPU) asks no machine, and torch's own
calls (the inductor compiler's) are not the package's choices.
"""

from __future__ import annotations

import os
import sys
from importlib.abc import MetaPathFinder
from types import ModuleType

FORCE = "SCRATCHFORMER_TESTS_NATIVE_BF16"
LOG = "SCRATCHFORMER_TESTS_MACHINE_LOG"
PRECISION = "scratchformer.training.precision"
_TORCH_ANSWERS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


_INSTALLED: set[tuple[str, str]] = set()


def install() -> None:
    """Act on the package's question wherever it is imported in this process (now or later), as
    the two variables say now (again after they changed: once for each setting)."""
    forced, log = os.environ.get(FORCE), os.environ.get(LOG)
    if forced not in (None, "yes", "no"):
        raise ValueError(f"{FORCE}: expected 'yes' or 'no', got {forced!r}")
    if forced and (FORCE, forced) not in _INSTALLED:
        _INSTALLED.add((FORCE, forced))
        _after_import(PRECISION, lambda module: _force(module, forced == "yes"))
    if log and (LOG, log) not in _INSTALLED:
        _INSTALLED.add((LOG, log))
        _after_import("torch.cpu", lambda module: _record(module, log))


def _force(precision: ModuleType, native: bool) -> None:
    if not hasattr(precision, "machine_has_native_bf16"):
        precision.machine_has_native_bf16 = precision.cpu_has_native_bf16
    precision.cpu_has_native_bf16 = lambda: native


def machine_has_native_bf16() -> bool:
    """The machine's own answer, whatever the switch says (for a test that times bf16: emulated,
    it would take minutes)."""
    import scratchformer.training.precision as precision

    return getattr(precision, "machine_has_native_bf16", precision.cpu_has_native_bf16)()


def _record(torch_cpu: ModuleType, log: str) -> None:
    for name in _TORCH_ANSWERS:
        answer = getattr(torch_cpu, name)
        if getattr(answer, "recorded", False):
            continue

        def recorded(answer=answer, name=name) -> bool:
            if sys._getframe(1).f_globals.get("__name__") == PRECISION:  # the package asks
                with open(os.environ.get(LOG, log), "a") as f:
                    f.write(f"{os.getpid()} {name}\n")
            return answer()

        recorded.recorded = True
        setattr(torch_cpu, name, recorded)


def _after_import(name: str, then) -> None:
    """``then(module)`` once module ``name`` is imported: now if it is, else right after its code ran."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport(MetaPathFinder):
    """Finds nothing itself: wraps the spec the other finders give ``name`` so that ``then`` runs
    on the module as soon as its own code has run."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    self.then(module)

                spec.loader.exec_module = exec_module
                return spec
        return None
