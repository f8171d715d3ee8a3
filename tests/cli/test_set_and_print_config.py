"""``scratchformer train TASK --set KEY=VALUE`` (any recipe field, typed and checked as the file's)
and ``--print-config`` (the resolved recipe as JSON, to save and rerun)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from scratchformer.cli import main
from scratchformer.tasks.captioning import CaptioningRecipe
from scratchformer.tasks.classification import ClassifierRecipe
from scratchformer.training.recipe import load_recipe, parse_set

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TASKS = {  # command -> (module, training function)
    "classifier": ("classification", "train_classifier"),
    "translation": ("translation", "train_translation"),
    "mlm": ("masked_lm", "pretrain_mlm"),
    "captioner": ("captioning", "train_captioner"),
}


@pytest.fixture
def trained(monkeypatch) -> list:
    """The recipes the ``train`` commands would have trained (nothing trains)."""
    recipes: list = []
    for module, function in TASKS.values():
        monkeypatch.setattr(
            importlib.import_module(f"scratchformer.tasks.{module}"),
            function,
            lambda recipe, data_dir, resume: recipes.append(recipe) or {},
        )
    return recipes


def train(task: str, recipe: str, *flags: str) -> int:
    return main(["train", task, "--config", str(RECIPES / f"{recipe}.json"), *flags])


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("train.lr=3e-4", ["train", "lr"], 3e-4),
        ("train.tensorboard=true", ["train", "tensorboard"], True),
        ("train.max_steps=null", ["train", "max_steps"], None),
        ("train.betas=[0.9, 0.98]", ["train", "betas"], [0.9, 0.98]),
        ('text_field="007"', ["text_field"], "007"),  # JSON text: a string
        ("text_field=007", ["text_field"], "007"),  # no JSON: the text itself
        ("train.out_dir=runs/a=b", ["train", "out_dir"], "runs/a=b"),  # the first = splits
        ("model.dropout=NaN", ["model", "dropout"], "NaN"),  # not JSON: a string (refused later)
        ("train.device=", ["train", "device"], ""),
    ],
)
def test_a_set_is_a_dotted_key_and_a_json_value(text: str, key: list, value) -> None:
    assert parse_set(text) == (key, value)


def test_every_section_can_be_set(trained) -> None:
    sets = [
        "train.lr=3e-4",
        "train.betas=[0.8, 0.9]",
        "model.dropout=0.2",
        "decoding.beam_size=4",
        "shapes.train_size=50",
        'splits.test=["test"]',
        "scst.steps=3",
        "batch_size=16",
    ]
    assert train("captioner", "shapes_captioning", *(f"--set={s}" for s in sets)) == 0
    (recipe,) = trained
    assert (recipe.train.lr, recipe.train.betas) == (3e-4, (0.8, 0.9))
    assert recipe.model["dropout"] == 0.2 and recipe.model["d_model"] == 128  # the rest of the file's
    assert recipe.decoding == {"beam_size": 4, "length_penalty": 1.0}
    assert recipe.shapes == {"seed": 0, "train_size": 50, "valid_size": 300, "test_size": 1000}
    assert recipe.splits == {"train": "train", "valid": "dev", "test": ["test"]}  # the default's
    assert (recipe.scst, recipe.batch_size) == ({"steps": 3}, 16)


def test_a_set_into_a_section_the_file_lacks_starts_from_the_default(tmp_path: Path, trained) -> None:
    config = tmp_path / "r.json"
    config.write_text('{"data": "shapes"}')
    assert main(["train", "captioner", "--config", str(config), "--set", "decoding.beam_size=5"]) == 0
    assert trained[0].decoding == {"beam_size": 5, "length_penalty": 1.0}


def test_the_flags_win_over_set(trained) -> None:
    """The flags are shorthands for --set, applied after every --set."""
    flags = ["--set", "train.epochs=5", "--set", "train.out_dir=a", "--set", "train.progress=true"]
    assert train("translation", "multi30k_de_en", *flags, "--epochs", "3", "--out", "b", "--no-progress") == 0
    assert train("mlm", "imdb_mlm", "--set", 'train_files=["x.txt"]', "--texts", "y.txt") == 0
    assert train("classifier", "imdb", "--set", "train_file=x.jsonl", "--train", "y.jsonl") == 0
    translation, mlm, classifier = trained
    config = translation.train
    assert (config.epochs, config.max_steps, config.out_dir, config.progress) == (3, None, "b", False)
    assert mlm.train_files == ["y.txt"] and classifier.train_file == "y.jsonl"


def test_resume_with_a_set_overwrite_is_refused_as_with_the_flag(trained, capsys) -> None:
    assert train("classifier", "imdb", "--resume", "--set", "train.overwrite=true") == 2
    assert (
        "--resume continues the run in OUT and --set train.overwrite=true replaces it"
        in capsys.readouterr().err
    )
    assert not trained


def test_no_progress_hides_the_bar(trained) -> None:
    assert train("classifier", "imdb") == 0
    assert train("classifier", "imdb", "--no-progress") == 0
    assert [r.train.progress for r in trained] == [True, False]


def test_a_classifier_needs_no_file_to_be_set(trained) -> None:
    assert main(["train", "classifier", "--set", "train_file=x.jsonl", "--set", "train.lr=1e-3"]) == 0
    assert (trained[0].train_file, trained[0].train.lr, trained[0].batch_size) == ("x.jsonl", 1e-3, 32)


@pytest.mark.parametrize(
    ("task", "recipe", "setting", "message"),
    [
        (
            "translation",
            "multi30k_de_en",
            "train.lrr=1",
            r"--set train.lrr=1: train: unknown key 'lrr'; did you mean lr\?",
        ),
        ("translation", "multi30k_de_en", "lr=1", "lr is a field of the train section: train.lr=1"),
        (
            "captioner",
            "shapes_captioning",
            "modle.dropout=0.2",
            r"--set modle.dropout=0.2: unknown key 'modle'; did you mean model\?",
        ),
        (
            "classifier",
            "imdb",
            "decoding.beam_size=4",
            "--set decoding.beam_size=4: unknown key 'decoding'; known: ",
        ),
        ("classifier", "imdb", "batch_size.x=1", "batch_size is not a section"),
        ("classifier", "imdb", "train.lr.x=1", "train.lr is not a section"),
        ("classifier", "imdb", "train.lr", "expected KEY=VALUE"),
        ("classifier", "imdb", "=1", "expected KEY=VALUE"),
        ("classifier", "imdb", "train.lr=abc", "lr must be a number, got 'abc'"),
        ("classifier", "imdb", "train.lr=0", "lr must be positive"),
        ("classifier", "imdb", "train.lr=Infinity", "lr must be a number, got 'Infinity'"),
        ("classifier", "imdb", "train.epochs=1.5", r"epochs must be an integer >= 1, got 1.5"),
        ("classifier", "imdb", "train.betas=0.9", r"betas must be \[a number, a number\]"),
        ("classifier", "imdb", "train=3", "'train' must be an object"),
        ("classifier", "imdb", "batch_size=0", "batch_size must be an integer >= 1"),
        ("classifier", "imdb", "text_field=3", "text_field must be a string, got 3"),
        ("classifier", "imdb", "lowercase=1", "lowercase must be true or false, got 1"),
        ("classifier", "imdb", "model=null", "model must be an object, got None"),
        ("classifier", "imdb", "model.dropuot=0.2", r"model: unknown key 'dropuot'; did you mean dropout"),
        ("translation", "multi30k_de_en", "decoding.beam=4", "decoding: unknown key 'beam'"),
        ("captioner", "shapes_captioning", "scst.steps=0", "scst: expected"),
        ("captioner", "shapes_captioning", "splits.test=3", "splits.test: expected a split name"),
    ],
)
def test_a_bad_set_is_one_line_before_any_work(
    task: str, recipe: str, setting: str, message: str, trained, capsys
) -> None:
    assert train(task, recipe, "--set", setting) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert not trained


@pytest.mark.parametrize(
    ("task", "recipe"),
    [
        ("classifier", "imdb"),
        ("classifier", "imdb_finetune"),
        ("translation", "multi30k_de_en"),
        ("mlm", "imdb_mlm"),
        ("captioner", "shapes_captioning"),
        ("captioner", "flickr8k"),
    ],
)
def test_print_config_round_trips(task: str, recipe: str, tmp_path: Path, trained, capsys) -> None:
    """--print-config prints the whole resolved recipe (defaults, --set, flags) and trains nothing;
    printed, saved and printed again, it is the same JSON."""
    assert train(task, recipe, "--set", "train.lr=3e-4", "--epochs", "2", "--print-config") == 0
    printed = capsys.readouterr().out
    resolved = json.loads(printed)
    assert not trained
    assert resolved["train"]["lr"] == 3e-4 and resolved["train"]["max_steps"] is None
    assert resolved["train"]["log_every"] is not None and "deterministic" in resolved["train"]  # defaults
    (tmp_path / "r.json").write_text(printed)
    assert main(["train", task, "--config", str(tmp_path / "r.json"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_print_config_without_a_file_and_only_on_rank_0(monkeypatch, trained, capsys) -> None:
    assert main(["train", "classifier", "--train", "x.jsonl", "--print-config"]) == 0
    default = json.loads(json.dumps(ClassifierRecipe(train_file="x.jsonl").to_dict()))  # betas: a list
    assert json.loads(capsys.readouterr().out) == default
    monkeypatch.setattr("scratchformer.training.distributed.is_main", lambda: False)
    assert main(["train", "classifier", "--train", "x.jsonl", "--print-config"]) == 0
    assert capsys.readouterr().out == "" and not trained


def test_a_classifier_needs_a_recipe_or_a_training_file(capsys) -> None:
    assert main(["train", "classifier", "--epochs", "2"]) == 2
    assert "error: give --config RECIPE.json or --train FILE" in capsys.readouterr().err


# ---- the recipe file, which --set follows ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"data": "shapes", "label_smoothing": NaN}', "NaN is not JSON"),
        ('{"label_smoothing": -Infinity}', "-Infinity is not JSON"),
        ('{"batch_size": 8, "batch_size": 16}', r"\['batch_size'\] given twice"),
        ('{"train": {"lr": 1e-3, "lr": 1e-4}}', r"\['lr'\] given twice"),
        ('{"batch_sise": 8}', r"unknown key 'batch_sise'; did you mean batch_size\?"),
        ('{"train": {"epoch": 3}}', r"train: unknown key 'epoch'; did you mean epochs\?"),
        ('{"memory": 3}', "memory"),
        ('{"features": 3}', "features must be a string, got 3"),
        ('{"pca_features": "no"}', "pca_features must be true or false, got 'no'"),
        ('{"shapes": null}', "shapes must be an object, got None"),
    ],
)
def test_a_recipe_file_is_refused_as_a_set_is(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_recipe(CaptioningRecipe, path)


def test_sets_leave_the_callers_data_alone(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"model": {"d_model": 64}}))
    recipe = load_recipe(CaptioningRecipe, path, ["model.dropout=0.2", "model.d_model=32"])
    assert recipe.model == {"d_model": 32, "dropout": 0.2}
    assert load_recipe(CaptioningRecipe, path).model == {"d_model": 64}
