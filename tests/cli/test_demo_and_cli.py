"""The offline demo learns its synthetic task; the CLI prints its result."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scratchformer.cli import main
from scratchformer.tasks import demo
from scratchformer.tasks.demo import BOS, EOS, FIRST_DIGIT, PAD, DemoConfig, make_batch, run_demo


def assert_png(path, min_side: int = 300) -> None:
    """``path`` is a PNG that PIL can read, of a sensible size."""
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert min(image.size) >= min_side and max(image.size) <= 3000, image.size


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


def test_demo_cli_learns_reversal(demo_verbatim) -> None:
    """The real demo (full size, ``scratchformer demo`` as README.md runs it): greedy decoding of
    held-out inputs must be near perfect, and the picture it draws shows why: the last decoder
    layer's cross-attention is an anti-diagonal."""
    done, work = demo_verbatim
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    accuracy = float(re.search(r"exact-match accuracy ([\d.]+)%", out).group(1))
    assert accuracy >= 95.0, out
    assert out.rstrip("\n").splitlines()[-1] == f"attention map: {DemoConfig.figure}"
    assert_png(work / DemoConfig.figure)
    mirror = re.search(r"\(the anti-diagonal\): ([\d.]+)% \((\d+) -> (\d+)\)", out)
    assert float(mirror.group(1)) > 50.0, out  # output digit t looks at source digit n-1-t
    assert len(mirror.group(2)) >= 8 and mirror.group(3) == mirror.group(2)[::-1], out


def test_demo_cli_prints_the_attention_it_draws(capsys, monkeypatch, tmp_path) -> None:
    """A short run in-process: the map drawn is the last decoder layer's cross-attention (4 heads
    averaged, rows summing to 1) of a held-out input fed with its right answer, and the printed
    anti-diagonal share is the mean weight on column n-1-t of the answer's rows t."""
    results = []
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: results.append(run_demo(*a, **k)) or results[-1])
    figure = tmp_path / "figures" / "attention.png"
    assert main(["demo", "--no-progress", "--steps", "20", "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip("\n").splitlines()[-1] == f"attention map: {figure}"
    assert_png(figure)
    (result,) = results
    attention = result.attention
    n = len(attention.source)
    assert n >= 3 and attention.target == attention.source[::-1]
    assert attention.layer == 2 and attention.heads == 4
    weights = attention.weights  # (n + 1, n): the answer's digits and </s>, by the source digits
    assert weights.shape == (n + 1, n)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(n + 1))
    on_mirror = torch.stack([weights[t, n - 1 - t] for t in range(n)]).mean().item()
    assert attention.mirror_mass == pytest.approx(on_mirror)
    assert f"(the anti-diagonal): {on_mirror:.1%} ({attention.source} -> {attention.target})" in out


def test_demo_no_figure_writes_nothing(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--no-progress", "--steps", "2", "--no-figure"]) == 0
    out = capsys.readouterr().out
    assert "attention map" not in out and "exact-match accuracy" in out
    assert list(tmp_path.iterdir()) == []


def test_demo_draws_its_default_figure_and_sort(monkeypatch, tmp_path) -> None:
    """Untrained and small (the drawing, not the learning): the default path, relative to the cwd,
    with its folders made; sorting draws the same map and claims no anti-diagonal."""
    monkeypatch.chdir(tmp_path)
    result = run_demo(DemoConfig(task="sort", steps=1, eval_size=8), progress=False)
    assert result.figure == Path(DemoConfig.figure) and (tmp_path / DemoConfig.figure).is_file()
    assert_png(tmp_path / DemoConfig.figure)
    attention = result.attention
    assert attention.target == "".join(sorted(attention.source)) and attention.mirror_mass is None
    assert "sort" in attention.title and "mirrored" not in attention.title


def test_module_entry_point_help() -> None:
    result = subprocess.run([sys.executable, "-m", "scratchformer", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "demo" in result.stdout


@pytest.mark.parametrize(
    "task, recipe, module, function",
    [
        ("translation", "multi30k_de_en", "translation", "train_translation"),
        ("mlm", "imdb_mlm", "masked_lm", "pretrain_mlm"),
        ("captioner", "shapes_captioning", "captioning", "train_captioner"),
        ("captioner", "flickr8k", "captioning", "train_captioner"),
    ],
)
def test_train_epochs_flag_replaces_the_recipe_max_steps(
    task, recipe, module, function, monkeypatch, capsys
) -> None:
    """A recipe's max_steps would end the run first: --epochs N alone clears it; --max-steps still wins."""
    import importlib
    from pathlib import Path

    trained = []
    monkeypatch.setattr(
        importlib.import_module(f"scratchformer.tasks.{module}"),
        function,
        lambda recipe, data_dir, resume: trained.append(recipe.train) or {},
    )
    config = str(Path(__file__).resolve().parents[2] / "recipes" / f"{recipe}.json")
    for flags in ([], ["--epochs", "3"], ["--epochs", "3", "--max-steps", "7"]):
        assert main(["train", task, "--config", config, *flags]) == 0
    default, epochs, both = trained
    assert default.max_steps is not None
    assert (epochs.epochs, epochs.max_steps) == (3, None)
    assert (both.epochs, both.max_steps) == (3, 7)
