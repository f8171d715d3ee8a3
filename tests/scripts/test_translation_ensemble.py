"""scripts/experiments/translation_ensemble.py: the Multi30k guide's ensemble table (single models, their
ensemble, their averaged weights), on the session's tiny translator."""

import subprocess
import sys
from pathlib import Path

from scratchformer.data.parallel_texts import load_parallel_texts
from scratchformer.tasks.translation import load_translator

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "translation_ensemble.py"


def test_every_system_gets_a_row_scored_as_evaluate_scores_it(tiny_translation) -> None:
    recipe, _, run = tiny_translation
    first, second = (str(p) for p in sorted(run.glob("step-*")))
    argv = ["--checkpoint", first, "--checkpoint", second, "--source", recipe.test_source]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv, "--reference", recipe.test_target],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "BLEU" not in line
    ]
    assert [r[0] for r in rows] == [
        f"| `{first}`",
        f"| `{second}`",
        "| ensemble of the 2 (`--checkpoint` x 2)",
        "| weights of the 2 averaged",
    ]
    test = load_parallel_texts(recipe.test_source, recipe.test_target)
    expected = load_translator([first, second], device="cpu").evaluate(test.sources, test.targets)["bleu"]
    assert float(rows[2][1]) == round(expected, 2)
