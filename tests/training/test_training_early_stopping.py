"""Early stopping (``patience``): the run ends after N evaluations in a row without improvement of
``best_metric``, says so in metrics.jsonl and in the fit result, leaves a resumable ``last/`` and
its snapshots for averaging, and a resumed run stops again or goes on as its patience says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_training import ToyTask, toy_config, toy_model

from scratchformer.training import TrainConfig, Trainer, load_training_state


class ScriptedEvalTask(ToyTask):
    """The toy regression, but its evaluations report the given values of "loss" in turn (then 9.0)."""

    def __init__(self, losses: list[float]):
        super().__init__()
        self.scripted = list(losses)

    def evaluate(self, model, device):
        return {"loss": self.scripted.pop(0) if self.scripted else 9.0}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_patience_stops_after_evaluations_in_a_row_without_improvement(tmp_path: Path) -> None:
    """12 steps, an evaluation every 2: losses 1.0 (best), 1.1, 0.5 (best: the count starts again), 0.6,
    0.7: the second evaluation in a row without improvement, at step 10, stops the run."""
    config = toy_config(tmp_path, eval_every=2, patience=2, keep_checkpoints=2)
    trainer = Trainer(toy_model(), ScriptedEvalTask([1.0, 1.1, 0.5, 0.6, 0.7]), config)
    result = trainer.fit()
    assert result.stopped_early == {"step": 10, "best_step": 6, "patience": 2}
    assert result.step == 10 and len(result.losses) == 10
    assert [e["step"] for e in result.evals] == [2, 4, 6, 8, 10] and result.best == {"step": 6, "loss": 0.5}

    logged = records(tmp_path)
    assert logged[-1] == {"step": 10, "early_stop": {"best_step": 6, "patience": 2}}
    assert [r["step"] for r in logged if "loss" in r] == list(range(1, 11))
    assert load_training_state(tmp_path / "last")["step"] == 10  # last/ is where the run stopped
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-0000008", "step-0000010"]
    assert not (tmp_path / "tensorboard").exists()  # (not asked for)

    chosen, averaged = trainer.average_last(2, result.best)  # averaging works on an early-stopped run
    assert averaged["checkpoints"] == 2 and chosen == "best"  # (the averaged weights evaluate to 9.0)


@pytest.mark.parametrize(
    ("losses", "stopped_early"),
    [
        ([1.0, 1.0], {"step": 8, "best_step": 4, "patience": 1}),  # a tie is no improvement
        ([1.0, 0.9, 0.8], None),  # every evaluation improves
        ([1.0, 0.9, 1.2], None),  # patience runs out at the last step: the run ended anyway
    ],
)
def test_patience_one(tmp_path: Path, losses: list[float], stopped_early: dict | None) -> None:
    result = Trainer(
        toy_model(), ScriptedEvalTask(losses), toy_config(tmp_path, eval_every=4, patience=1)
    ).fit()
    assert result.stopped_early == stopped_early
    assert result.step == (stopped_early or {"step": 12})["step"]
    assert any("early_stop" in r for r in records(tmp_path)) == (stopped_early is not None)


def test_a_resumed_early_stopped_run_stops_again_unless_given_more_patience(tmp_path: Path) -> None:
    scripted = [1.0, 1.1, 0.5, 0.6, 0.7]
    first = Trainer(
        toy_model(), ScriptedEvalTask(scripted), toy_config(tmp_path, eval_every=2, patience=2)
    ).fit()
    log = (tmp_path / "metrics.jsonl").read_text()

    again = Trainer(toy_model(), ScriptedEvalTask([]), toy_config(tmp_path, eval_every=2, patience=2)).fit(
        resume=True
    )
    assert again.step == 10 and again.losses == [] and again.stopped_early == first.stopped_early
    assert (tmp_path / "metrics.jsonl").read_text() == log  # nothing trained, nothing written

    longer = Trainer(toy_model(), ScriptedEvalTask([0.8]), toy_config(tmp_path, eval_every=2, patience=3))
    result = longer.fit(resume=True)  # patience may change on resume: one more evaluation without improvement
    assert result.step == 12 and len(result.losses) == 2 and result.stopped_early is None
    assert [r["step"] for r in records(tmp_path) if "loss" in r] == list(range(1, 13))


def test_patience_needs_evaluations_to_count() -> None:
    with pytest.raises(ValueError, match="patience=2 counts evaluations: it needs eval_every > 0"):
        TrainConfig(patience=2)
    with pytest.raises(ValueError, match="patience must be an integer >= 0"):
        TrainConfig(patience=-1, eval_every=5)
