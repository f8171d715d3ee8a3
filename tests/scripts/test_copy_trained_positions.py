"""scripts/experiments/copy_trained_positions.py: the position-copy experiment the pretraining guide
(docs/guides/pretraining.md) measures."""

import json
import subprocess
from pathlib import Path

import torch
from forked import run_cli
from safetensors.torch import load_file, save_file

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "copy_trained_positions.py"
KEY = "bert.embeddings.position_embeddings.weight"


def _run(*args: object) -> subprocess.CompletedProcess:
    """``python scripts/experiments/copy_trained_positions.py ARGS``, forked from a process that has imported
    torch once (tests/forked.py)."""
    return run_cli(list(map(str, args)), script=SCRIPT)


def _encoder(directory: Path, rows: int = 10, trained: int = 4) -> dict[str, torch.Tensor]:
    directory.mkdir()
    state = {KEY: torch.randn(rows, 3), "bert.embeddings.word_embeddings.weight": torch.randn(7, 3)}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": trained}))
    (directory / "config.json").write_text("{}")
    return state


def test_untrained_rows_repeat_the_trained_ones_and_the_rest_is_kept(tmp_path):
    state = _encoder(tmp_path / "src")
    assert _run(tmp_path / "src", tmp_path / "dst").returncode == 0
    copied = load_file(str(tmp_path / "dst" / "model.safetensors"))
    table = state[KEY]
    expected = torch.cat([table[:4], table[:4], table[:2]])  # rows 4..9 repeat rows 0..3
    torch.testing.assert_close(copied[KEY], expected, rtol=0, atol=0)
    torch.testing.assert_close(
        copied["bert.embeddings.word_embeddings.weight"],
        state["bert.embeddings.word_embeddings.weight"],
        rtol=0,
        atol=0,
    )
    assert (tmp_path / "dst" / "config.json").is_file() and (
        tmp_path / "dst" / "tokenizer_config.json"
    ).is_file()
    torch.testing.assert_close(
        load_file(str(tmp_path / "src" / "model.safetensors"))[KEY], table
    )  # source untouched


def test_bad_arguments_are_refused_before_writing(tmp_path):
    _encoder(tmp_path / "src")
    result = _run(tmp_path / "src", tmp_path / "dst", "--trained", 10)
    assert result.returncode != 0 and "--trained must be in [1, 9]" in result.stderr
    assert not (tmp_path / "dst").exists()
    (tmp_path / "taken").mkdir()
    assert "exists" in _run(tmp_path / "src", tmp_path / "taken").stderr
    (tmp_path / "src" / "tokenizer_config.json").unlink()
    assert "no model_max_length to read: give --trained P" in _run(tmp_path / "src", tmp_path / "dst").stderr
    assert _run(tmp_path / "src", tmp_path / "dst", "--trained", 4).returncode == 0
