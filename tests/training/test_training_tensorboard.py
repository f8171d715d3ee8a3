"""TensorBoard (``tensorboard: true``): the event files in ``out_dir/tensorboard/``, read back by
TensorBoard's own reader, hold the numbers of metrics.jsonl at the same steps, also after a resume;
without the package the run fails before any work, naming it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from test_training import ToyTask, toy_config, toy_model

from scratchformer.training import Trainer, check_run


def logged(out: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's numbers by name, as (step, value) in order, rounded to float32 like TensorBoard's."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        for key, value in record.items():
            if key not in ("step", "epoch"):
                series.setdefault(key, []).append((record["step"], float(np.float32(value))))
    return series


def events(out: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of ``out/tensorboard``, as TensorBoard's reader gives them (purged steps hidden)."""
    reader = EventAccumulator(str(out / "tensorboard"), size_guidance={SCALARS: 0})  # 0: keep every event
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def test_the_event_files_hold_the_logged_values(tmp_path: Path) -> None:
    Trainer(toy_model(), ToyTask(), toy_config(tmp_path, eval_every=4, tensorboard=True)).fit()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    seen, expected = events(tmp_path), logged(tmp_path)
    assert sorted(seen) == ["eval/loss", "items_per_s", "loss", "lr"] == sorted(expected)
    assert [step for step, _ in seen["loss"]] == list(range(1, 13))
    assert [step for step, _ in seen["eval/loss"]] == [4, 8, 12]
    for tag in seen:
        assert seen[tag] == expected[tag], tag


def test_a_resumed_run_replaces_the_events_after_its_checkpoint(tmp_path: Path) -> None:
    """Killed after step 13, resumed from step 10: steps 11 to 13 are in TensorBoard once, as logged."""

    class Stop(Exception):
        pass

    def crash_at_13(step: int, loss: float) -> None:
        if step == 13:
            raise Stop

    config = toy_config(tmp_path, epochs=5, save_every=5, eval_every=4, tensorboard=True)
    with pytest.raises(Stop):
        Trainer(toy_model(), ToyTask(), config).fit(on_step=crash_at_13)
    assert [step for step, _ in events(tmp_path)["loss"]] == list(range(1, 14))
    time.sleep(
        1.1
    )  # event files are read in name order, and their names start with the second of their making
    Trainer(toy_model(), ToyTask(), config).fit(resume=True)
    seen, expected = events(tmp_path), logged(tmp_path)
    assert [step for step, _ in seen["loss"]] == list(range(1, 21))
    for tag in seen:
        assert seen[tag] == expected[tag], tag


def test_without_the_package_the_run_fails_before_any_work(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    config = toy_config(tmp_path / "run", tensorboard=True)
    with pytest.raises(ImportError, match=r'tensorboard package: pip install -e "\.\[tensorboard\]"'):
        check_run(config, resume=False)
    with pytest.raises(ImportError, match="tensorboard"):
        Trainer(toy_model(), ToyTask(), config).fit()
    assert not (tmp_path / "run").exists()
