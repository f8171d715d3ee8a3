"""scripts/parity/fast_beam_parity.py: the fast beam search against the readable one on a test split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "parity"))
import fast_beam_parity  # noqa: E402


def test_the_tiny_translator_translates_the_same_both_ways(tiny_translation, tmp_path: Path) -> None:
    recipe, report, run = tiny_translation
    out = tmp_path / "parity.json"
    checkpoint = str(run / report["test_checkpoint"])
    assert (
        fast_beam_parity.main(
            [
                "--checkpoint",
                checkpoint,
                "--source",
                recipe.test_source,
                "--batch-size",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["lines"] == 40 and result["same_up_to_ties"] == 1.0 and result["different"] == []
    assert result["seconds_fast"] > 0 and result["seconds_reference"] > 0


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        fast_beam_parity.main(["--checkpoint", str(tmp_path / "none"), "--source", str(tmp_path / "x")])
