"""``python -m scratchformer ARGV`` (or ``python SCRIPT ARGV``) for many command lines, without
importing torch for each.

A command that loads a checkpoint imports torch, the tokenizers and the models: about 3 s of a
2-core CPU before it says a word. The misuse suite runs over a hundred such command lines, so it
forks each from a server process that has imported them once (multiprocessing's ``forkserver``,
which never runs a tensor operation itself, so no thread pool is forked half-used). The child is a
process of its own, as under ``python -m``: its own working folder, environment, stdin, stdout
and stderr (files), ``scratchformer.__main__`` run by ``runpy``, and its exit status from
``sys.exit``. What a fork cannot show, that parsing and refusing leave torch unimported, is
tests/cli/test_fast_cli.py's; tests/cli/test_misuse_subprocess.py runs a few cases both ways.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import wait
from pathlib import Path

# What the commands import once their arguments are checked (the CLI's lazy imports).
PRELOAD = [
    "torch",
    "scratchformer.cli",
    "scratchformer.formats.hf_bert",
    "scratchformer.tasks.classification",
    "scratchformer.tasks.translation",
    "scratchformer.tasks.captioning.ensemble",
    "scratchformer.tasks.sentence_embedding",
    "scratchformer.tasks.masked_lm",
    "scratchformer.training",
    "safetensors.torch",
]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)
# Process.start() polls every other live child (multiprocessing.process._cleanup), and a child's
# exit status can be read from its pipe once: a thread that starts a process while another reads
# its own child's status can take that status, and the other then reads EOF and reports 255.
# Starting and reading under one lock (waiting outside it) keeps run_cli safe to call from threads.
_START_OR_POLL = threading.Lock()


def _child(
    script: str | None, argv: list[str], cwd: str, env: dict[str, str], stdin: str, stdout: str, stderr: str
) -> None:
    """In the forked process: become ``python -m scratchformer ARGV`` (``python SCRIPT ARGV``) and
    exit with its status."""
    import runpy
    import traceback

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in ((0, stdin, os.O_RDONLY), (1, stdout, os.O_WRONLY), (2, stderr, os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stdin, as Python opens it)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, errors="backslashreplace", buffering=1)  # noqa: SIM115
    sys.argv = [script or sys.executable, *argv]
    code = 0
    try:
        if script is None:
            runpy.run_module("scratchformer", run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(script))  # as python SCRIPT sets it
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:  # sys.exit("message"), as Python reports it
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_cli(
    argv: list[str],
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    input: bytes = b"",  # noqa: A002 (subprocess.run's name)
    timeout: float = 300,
    script: str | Path | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, scratchformer, *argv], input=input, capture_output=True)``
    (``[python, script, *argv]`` with ``script``), forked from the preloaded server; stdout and
    stderr come back as text (UTF-8)."""
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as folder:
        files = {name: Path(folder) / name for name in ("stdin", "stdout", "stderr")}
        files["stdin"].write_bytes(input)
        files["stdout"].touch()
        files["stderr"].touch()
        process = _CONTEXT.Process(
            target=_child,
            args=(
                None if script is None else str(script),
                list(argv),
                str(cwd or os.getcwd()),
                dict(os.environ if env is None else env),
                *(str(files[name]) for name in ("stdin", "stdout", "stderr")),
            ),
        )
        with _START_OR_POLL:
            process.start()
        wait([process.sentinel], timeout)
        with _START_OR_POLL:
            code = process.exitcode
            if code is None:
                process.kill()
                process.join()
        if code is None:
            raise subprocess.TimeoutExpired(["scratchformer", *argv], timeout)
        return subprocess.CompletedProcess(
            ["scratchformer", *argv],
            code,
            files["stdout"].read_text(encoding="utf-8", errors="replace"),
            files["stderr"].read_text(encoding="utf-8", errors="replace"),
        )
