"""The offline demo learns its synthetic task; the CLI prints its result."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from scratchformer.cli import main
from scratchformer.tasks.demo import BOS, EOS, FIRST_DIGIT, PAD, DemoConfig, make_batch


def test_make_batch_targets_are_reversed_inputs() -> None:
    src, tgt_in, tgt_out = make_batch("reverse", 8, 2, 6, torch.Generator().manual_seed(0))
    for s, ti, to in zip(src.tolist(), tgt_in.tolist(), tgt_out.tolist()):
        digits = [t for t in s if t != PAD]
        assert all(t >= FIRST_DIGIT for t in digits)
        assert to[: len(digits) + 1] == digits[::-1] + [EOS]
        assert ti[: len(digits) + 1] == [BOS] + digits[::-1]
    _, _, sorted_out = make_batch("sort", 4, 3, 3, torch.Generator().manual_seed(1))
    for row in sorted_out.tolist():
        assert row[:3] == sorted(row[:3])


def test_demo_config_rejects_unknown_task() -> None:
    with pytest.raises(ValueError, match="task"):
        DemoConfig(task="add")


def test_demo_cli_learns_reversal(capsys) -> None:
    """The real demo (full size): greedy decoding of held-out inputs must be near perfect."""
    assert main(["demo", "--no-progress"]) == 0
    out = capsys.readouterr().out
    accuracy = float(re.search(r"exact-match accuracy ([\d.]+)%", out).group(1))
    assert accuracy >= 95.0, out


def test_module_entry_point_help() -> None:
    result = subprocess.run([sys.executable, "-m", "scratchformer", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "demo" in result.stdout


@pytest.mark.parametrize("task, recipe, module, function", [
    ("translation", "multi30k_de_en", "translation", "train_translation"),
    ("mlm", "imdb_mlm", "masked_lm", "pretrain_mlm"),
    ("captioner", "shapes_captioning", "captioning", "train_captioner"),
    ("captioner", "flickr8k", "captioning", "train_captioner"),
])
def test_train_epochs_flag_replaces_the_recipe_max_steps(task, recipe, module, function, monkeypatch, capsys) -> None:
    """A recipe's max_steps would end the run first: --epochs N alone clears it; --max-steps still wins."""
    import importlib
    from pathlib import Path

    trained = []
    monkeypatch.setattr(importlib.import_module(f"scratchformer.tasks.{module}"), function,
                        lambda recipe, data_dir, resume: trained.append(recipe.train) or {})
    config = str(Path(__file__).resolve().parents[1] / "recipes" / f"{recipe}.json")
    for flags in ([], ["--epochs", "3"], ["--epochs", "3", "--max-steps", "7"]):
        assert main(["train", task, "--config", config, *flags]) == 0
    default, epochs, both = trained
    assert default.max_steps is not None
    assert (epochs.epochs, epochs.max_steps) == (3, None)
    assert (both.epochs, both.max_steps) == (3, 7)
