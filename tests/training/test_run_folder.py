"""The output folder of a run, checked before any work: locked against a second run (a stale lock of a
dead process taken over, another host's refused), a file or an unwritable place refused, the device
and the memory there; and what the run writes readable as the umask says."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_training import ToyTask, toy_config, toy_model
from torch import nn

from scratchformer.training import Trainer, distributed, run_checks
from scratchformer.training.checkpoint import save_checkpoint
from scratchformer.training.run_checks import (
    LOCK,
    available_memory,
    check_memory,
    check_run,
    count_parameters,
    release_run,
    training_bytes,
)


def write_lock(out: Path, pid: int, host: str | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lock = out / LOCK
    owner = {"pid": pid, "host": host or socket.gethostname(), "started": "2026-01-01 00:00:00"}
    lock.write_text(json.dumps(owner))
    return lock


@pytest.fixture
def other_process():
    """A live process that is not this one (the owner of a lock)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- the lock


def test_a_second_run_into_a_folder_in_use_is_refused_naming_the_first(tmp_path: Path, other_process) -> None:
    lock = write_lock(tmp_path, other_process.pid)
    with pytest.raises(
        FileExistsError, match=rf"in use by another run \(process {other_process.pid} on host"
    ):
        check_run(toy_config(tmp_path), resume=False)
    with pytest.raises(FileExistsError, match="in use by another run"):  # resuming it too
        check_run(toy_config(tmp_path), resume=True)
    assert json.loads(lock.read_text())["pid"] == other_process.pid  # its lock untouched


def test_the_lock_comes_before_the_earlier_run_check_and_overwrite_does_not_break_it(
    tmp_path: Path, other_process
) -> None:
    """A live run that saved already is not 'an earlier run', and overwrite must not delete its files."""
    write_lock(tmp_path, other_process.pid)
    (tmp_path / "metrics.jsonl").write_text("")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="in use by another run"):
            check_run(toy_config(tmp_path, overwrite=overwrite), resume=False)
    assert (tmp_path / "metrics.jsonl").exists()


def test_a_stale_lock_of_a_dead_process_is_named_and_taken_over(tmp_path: Path, capsys) -> None:
    pid = dead_pid()
    lock = write_lock(tmp_path, pid)
    check_run(toy_config(tmp_path), resume=False)
    assert f"stale lock of process {pid}" in capsys.readouterr().err
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    release_run(tmp_path)
    assert not lock.exists()


def test_a_lock_from_another_host_is_refused_naming_it(tmp_path: Path) -> None:
    lock = write_lock(tmp_path, dead_pid(), host="elsewhere-7")
    with pytest.raises(FileExistsError, match=rf"on host elsewhere-7.*delete {lock}"):
        check_run(toy_config(tmp_path, overwrite=True), resume=False)


def test_an_unreadable_lock_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / LOCK).write_text("{half a lock")
    with pytest.raises(FileExistsError, match="unreadable lock file"):
        check_run(toy_config(tmp_path), resume=False)


def test_the_run_locks_its_folder_and_frees_it_at_the_end_also_after_an_error(tmp_path: Path) -> None:
    seen = []

    class Watching(ToyTask):
        def loss(self, model, batch, device):
            seen.append(json.loads((tmp_path / LOCK).read_text())["pid"])
            return super().loss(model, batch, device)

    Trainer(toy_model(), Watching(), toy_config(tmp_path, epochs=1)).fit()
    assert seen and set(seen) == {os.getpid()} and not (tmp_path / LOCK).exists()
    failing = ToyTask(nan_at_call=None)
    failing.loss = lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(toy_model(), failing, toy_config(tmp_path / "b")).fit()
    assert not (tmp_path / "b" / LOCK).exists()


def test_a_lock_taken_by_the_task_before_the_trainer_is_left_to_the_task(tmp_path: Path) -> None:
    check_run(toy_config(tmp_path), resume=False)  # what TrainingRun.run does first
    Trainer(toy_model(), ToyTask(), toy_config(tmp_path, epochs=1)).fit()
    assert (tmp_path / LOCK).exists()  # finish() and report.json still to come
    release_run(tmp_path)
    assert not (tmp_path / LOCK).exists()


# ---------------------------------------------------------------- the folder, the device, the memory


def test_an_output_folder_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        check_run(toy_config(tmp_path / "out"), resume=False)
    with pytest.raises(NotADirectoryError, match=r"out is a file, not a directory"):
        check_run(toy_config(tmp_path / "out" / "run"), resume=False)


def test_an_output_folder_that_cannot_be_written_is_refused(tmp_path: Path, monkeypatch) -> None:
    # (the tests may run as root, who writes anywhere: os.access is what a user would be told)
    monkeypatch.setattr(run_checks.os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(PermissionError, match=rf"{tmp_path} is not writable"):
        check_run(toy_config(tmp_path / "new" / "run"), resume=False)
    assert not (tmp_path / "new").exists()


def test_a_missing_device_is_refused_by_name() -> None:
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="MPS is not available"):
            distributed.device_for("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            distributed.device_for("cuda")
        assert distributed.device_for("auto").type in ("mps", "cpu")
    else:
        with pytest.raises(ValueError, match="GPUs are visible"):
            distributed.device_for(f"cuda:{torch.cuda.device_count()}")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        distributed.device_for("tpu")


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert distributed.device_for("auto").type == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert distributed.device_for("auto").type == "cpu"


def test_a_model_too_large_for_memory_is_refused_at_once_naming_the_figure() -> None:
    count_parameters(lambda: nn.Linear(2, 2))  # (the process's first meta operation imports torch parts)
    start = time.perf_counter()
    parameters = count_parameters(lambda: nn.Sequential(nn.Linear(100_000, 400_000), nn.Linear(10, 10)))
    assert parameters == 100_000 * 400_000 + 400_000 + 110
    shared = nn.Linear(3, 3)
    assert count_parameters(lambda: nn.Sequential(shared, shared)) == 12  # tied weights count once
    needed = training_bytes(parameters)
    assert needed == 16 * parameters and training_bytes(10, activation_bytes=5) == 165
    with pytest.raises(
        ValueError, match=r"4e\+10 parameters needs about 596\.1 GiB, but cpu memory is [\d,.]+ GiB"
    ):
        check_memory(needed, f"a model of {parameters:.2g} parameters", torch.device("cpu"))
    assert time.perf_counter() - start < 1
    assert available_memory(torch.device("cpu")) > 2**28
    check_memory(10**6, "a small model", torch.device("cpu"))


# ---------------------------------------------------------------- permissions


@pytest.mark.parametrize(("umask", "folder", "file"), [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_checkpoints_are_written_as_the_umask_says(
    tmp_path: Path, umask: int, folder: int, file: int
) -> None:
    previous = os.umask(umask)
    try:
        written = save_checkpoint(tmp_path / "ckpt", nn.Linear(2, 2), {"kind": "toy"}, {"step": 1})
    finally:
        os.umask(previous)
    assert stat.S_IMODE(written.stat().st_mode) == folder
    assert {stat.S_IMODE(p.stat().st_mode) for p in written.iterdir()} == {file}
