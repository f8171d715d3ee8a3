"""Recipe values that used to train silently wrong, or fail only after training: each is now one
clear error naming the field, before the work it would spoil (or, for checkpoint averaging, an
honest report of what was averaged)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from test_text_classification import tiny_recipe as tiny_classifier_recipe
from test_translation import tiny_recipe as tiny_translation_recipe

from scratchformer.cli import main
from scratchformer.tasks import classification, translation
from scratchformer.tasks.classification import ClassifierRecipe, train_classifier
from scratchformer.tasks.translation import train_translation
from scratchformer.training import TrainConfig


def refuse(*_, **__):
    raise AssertionError("work started before the recipe's inputs were checked")


# ---- the train section: integers are integers, numbers are numbers -----------------------------


@pytest.mark.parametrize(
    ("train", "message"),
    [
        (
            {"epochs": 1.5},
            "epochs must be an integer >= 1, got 1.5",
        ),  # the last step never came: no checkpoint
        ({"max_steps": 2.5}, "max_steps must be an integer >= 1, got 2.5"),
        ({"grad_accum": 2.0}, "grad_accum must be an integer >= 1"),
        ({"log_every": 2.5}, "log_every must be an integer >= 1"),
        ({"keep_checkpoints": True}, "keep_checkpoints must be an integer >= 0"),
        ({"seed": 1.5}, "seed must be an integer, got 1.5"),
        ({"seed": "0"}, "seed must be an integer, got '0'"),
        ({"lr": "0.001"}, "lr must be a number, got '0.001'"),
        ({"weight_decay": True}, "weight_decay must be a number, got True"),
        ({"grad_clip": "1.0"}, "grad_clip must be a number or null, got '1.0'"),
        ({"adam_eps": None}, "adam_eps must be a number, got None"),
        ({"betas": ["0.9", 0.98]}, r"betas must be \[a number, a number\]"),
        ({"betas": [0.9]}, r"betas must be \[a number, a number\]"),
        ({"progress": "false"}, "progress must be true or false, got 'false'"),
        ({"device": 0}, "device must be a string, got 0"),
    ],
)
def test_train_fields_have_their_types(train: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**train)


def test_train_fields_of_the_right_kind_are_accepted() -> None:
    config = TrainConfig(
        lr=1, grad_clip=None, max_steps=None, betas=[0.9, 0.98], seed=np.int64(-3), weight_decay=np.float32(0)
    )
    assert config.betas == (0.9, 0.98) and config.lr == 1
    assert (
        json.loads(json.dumps(asdict(config)))["seed"] == -3
    )  # numpy numbers become Python's: saved in config.json
    assert TrainConfig(max_steps=np.int64(5), epochs=2, threads=0).max_steps == 5
    assert (
        TrainConfig(out_dir=Path("runs/x")).out_dir == "runs/x"
    )  # the API takes paths (kept as strings: JSON)


def test_a_fractional_epochs_in_a_recipe_stops_the_cli_before_any_work(tmp_path: Path, capsys) -> None:
    recipe = {
        "train_file": str(tmp_path / "train.jsonl"),
        "train": {"out_dir": str(tmp_path / "run"), "epochs": 1.5},
    }
    config = tmp_path / "recipe.json"
    config.write_text(json.dumps(recipe))
    assert main(["train", "classifier", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "epochs must be an integer >= 1, got 1.5" in err
    assert not (tmp_path / "run").exists()


# ---- classification recipes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"label_names": "neg"},
            "label_names: expected at least two distinct names .*got 'neg'",
        ),  # trained on 'n', 'e', 'g'
        ({"label_names": [0, 1]}, "label_names: expected at least two distinct names"),
        ({"valid_size": 0}, "valid_size must be >= 1 without a valid_file"),
        (
            {"truncation": "head_tail", "max_length": 32, "head_length": 32},
            r"head_length must be in \(0, max_length=32\)",
        ),
        ({"truncation": "head_tail", "head_length": 0}, r"head_length must be in \(0, max_length=512\)"),
        (
            {"pretrained": "bert-dir", "tokenizer": "tokenizer.json"},
            "tokenizer: a pretrained encoder brings its own",
        ),
        ({"head_dropout": "0.1"}, r"head_dropout must be in \[0, 1\), got '0.1'"),
    ],
)
def test_classifier_recipe_is_refused_on_construction(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClassifierRecipe(train_file="x.jsonl", **fields)


def test_classifier_settings_that_are_fine() -> None:
    ClassifierRecipe(train_file="x.jsonl", valid_file="v.jsonl", valid_size=0)  # nothing held out
    ClassifierRecipe(
        train_file="x.jsonl", truncation="head", max_length=32, head_length=128
    )  # head_length unused
    ClassifierRecipe(train_file="x.jsonl", label_names=["neg", "pos"], pretrained="bert-dir")


TASKS = {
    "classification": (tiny_classifier_recipe, train_classifier, classification, "load_labelled_texts"),
    "translation": (tiny_translation_recipe, train_translation, translation, "load_parallel_texts"),
}


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ("classification", "test_file"),
        ("classification", "valid_file"),
        ("classification", "tokenizer"),
        ("translation", "test_source"),
        ("translation", "test_target"),
        ("translation", "train_target"),
        ("translation", "tokenizer"),
    ],
)
def test_inputs_are_found_before_any_work(tmp_path: Path, monkeypatch, task: str, field: str) -> None:
    make_recipe, train, module, loader = TASKS[task]
    recipe = make_recipe(tmp_path)
    setattr(recipe, field, str(tmp_path / "missing.txt"))
    monkeypatch.setattr(module, loader, refuse)
    with pytest.raises(FileNotFoundError, match=f"{field}: .*file not found: .*missing.txt"):
        train(recipe)
    assert not (tmp_path / "run").exists()


def test_cli_missing_test_file_is_one_line_before_training(tmp_path: Path, capsys) -> None:
    config = tmp_path / "recipe.json"
    recipe = tiny_classifier_recipe(tmp_path).to_dict()
    recipe["train"] = {k: v for k, v in recipe["train"].items() if k != "betas"}
    config.write_text(json.dumps(recipe))
    assert (
        main(
            [
                "train",
                "classifier",
                "--config",
                str(config),
                "--max-steps",
                "5",
                "--test",
                str(tmp_path / "no.jsonl"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "test_file: data file not found" in err
    assert not (tmp_path / "run").exists()


def test_valid_size_that_leaves_no_training_text_is_named_before_the_tokenizer(
    tmp_path: Path, monkeypatch
) -> None:
    recipe = tiny_classifier_recipe(tmp_path)  # 600 training texts
    recipe.valid_size = 600
    monkeypatch.setattr(classification, "train_wordpiece", refuse)
    with pytest.raises(ValueError, match="valid_size=600 leaves no training text out of 600"):
        train_classifier(recipe)


# ---- translation recipes -----------------------------------------------------------------------


def test_a_test_source_without_its_target_is_refused(tmp_path: Path) -> None:
    recipe = tiny_translation_recipe(tmp_path)
    recipe.test_target = None  # the test set was silently skipped
    with pytest.raises(ValueError, match="test_source and test_target: give both or neither"):
        recipe.validate()


# ---- checkpoint averaging ----------------------------------------------------------------------


def test_averaging_fewer_snapshots_than_asked_is_reported_and_warned(tmp_path: Path) -> None:
    recipe = tiny_classifier_recipe(tmp_path)
    recipe.average_last = 5
    recipe.test_file = None
    recipe.train.max_steps, recipe.train.eval_every = 4, 2  # two evaluations: two snapshots
    with pytest.warns(UserWarning, match="average_last=5: the run kept only 2 evaluated checkpoint"):
        report = train_classifier(recipe)
    assert report["averaged_valid"]["checkpoints"] == 2
    assert json.loads((tmp_path / "run" / "report.json").read_text())["averaged_valid"]["checkpoints"] == 2
