"""The lock file itself (scratchformer.files.locks); what it guards is tested where it is used:
tests/training/test_run_folder.py (a run's folder), tests/data/test_feature_file_locks.py (a
features file)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from scratchformer.files import locks


def test_two_processes_cannot_both_take_a_lock(tmp_path: Path) -> None:
    """The lock is made whole and linked into place: of processes racing for it, one wins."""
    code = (  # locks.py imports nothing of the package: loaded alone, it starts in a blink
        "import importlib.util, sys, time\n"
        "spec = importlib.util.spec_from_file_location('locks', sys.argv[3])\n"
        "locks = importlib.util.module_from_spec(spec); spec.loader.exec_module(locks)\n"
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
        "try:\n    locks.acquire(sys.argv[1], 'x'); print('won'); time.sleep(2)\n"
        "except FileExistsError:\n    print('lost')\n"
    )
    start = str(time.time() + 2)
    env = os.environ
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "lock"), start, locks.__file__],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    results = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert results == ["lost", "lost", "lost", "won"]
    assert not (tmp_path / "lock").exists()  # released at exit
