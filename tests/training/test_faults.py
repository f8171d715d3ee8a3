"""Fault injection: a real training process killed with SIGKILL at random moments, several times,
then resumed each time, ends exactly where an uninterrupted run ends (weights bit for bit, the
same logged losses), and every kill leaves a loadable checkpoint (or none, before the first save)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from scratchformer.training.checkpoint import load_training_state, resolve_checkpoint

WORKER = Path(__file__).parent / "fault_worker.py"
KILLS = 3


def launch(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]


def is_train_record(record: dict) -> bool:
    return "loss" in record and "step" in record and record.get("kind", "train") == "train"


def train_records(out: Path) -> list[dict]:
    return [
        r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if is_train_record(r)
    ]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in train_records(out)}


def logged_step(out: Path) -> int:
    """The last training step in ``out/metrics.jsonl`` so far (0 before any; a line being written is
    skipped)."""
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if is_train_record(record):
            steps.append(record["step"])
    return max(steps)


def kill_after_step(proc: subprocess.Popen, out: Path, step: int, rng: random.Random) -> None:
    """SIGKILL ``proc`` at a random moment up to 40 ms (about a step) after it logs ``step``: in a step,
    in the log or in a checkpoint save. Timed by the run's progress, not the clock, so a faster machine
    (or a shorter resumed run) cannot finish before the kill."""
    while logged_step(out) < step:
        if proc.poll() is not None:
            finish(proc)
            raise AssertionError(f"the run ended before logging step {step}")
        time.sleep(0.002)
    time.sleep(rng.uniform(0.0, 0.04))
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_sigkill_at_random_moments_then_resume_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    full = tmp_path / "full"
    uninterrupted = launch(full)  # beside the killed runs: both mostly sleep (SlowToyTask)
    total = 48  # 4 epochs of 12 batches (fault_worker.py; checked below)

    rng = random.Random(1234)
    killed = tmp_path / "killed"
    span = (
        total - 4
    ) // KILLS  # one kill in each of KILLS stretches, at least 3 steps apart: a resumed run's
    for i in range(KILLS):  # log (stale until it rewinds) never already shows the next kill's step
        kill_after_step(launch(killed), killed, 2 + i * span + rng.randrange(span - 2), rng)
        if (killed / "last").exists() or (killed / "last.old").exists():  # a save happened: it is whole
            state = load_training_state(resolve_checkpoint(killed / "last"), map_location="cpu")
            assert state["step"] > 0
            load_file(str(resolve_checkpoint(killed / "last") / "model.safetensors"))
    finish(launch(killed))  # resume to the end
    finish(uninterrupted)
    assert max(losses(full)) == total

    a, b = (
        load_file(str(full / "last" / "model.safetensors")),
        load_file(str(killed / "last" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(killed) == losses(full)
    steps = [r["step"] for r in train_records(killed)]
    assert steps == sorted(set(steps)), (
        "each resume rewinds the log to its checkpoint: no step is logged twice"
    )
    leftovers = [p.name for p in killed.iterdir() if p.name.startswith(".") or p.name.endswith(".old")]
    assert leftovers == []
