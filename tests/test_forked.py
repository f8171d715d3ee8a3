"""tests/forked.py's run_cli, called from several threads at once as the misuse suite calls it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from forked import run_cli


def test_every_exit_status_comes_back_when_threads_fork_at_once(tmp_path: Path) -> None:
    """Each of 300 forked scripts exits with its own status, 2 threads at a time. Without
    run_cli's lock one thread's Process.start() read another's status first, and that one saw 255
    (about 1 run in 100 here: a CI run failed on it)."""
    script = tmp_path / "exit_with.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    wanted = [n % 7 + 2 for n in range(300)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        codes = list(pool.map(lambda code: run_cli([str(code)], script=script).returncode, wanted))
    assert codes == wanted
