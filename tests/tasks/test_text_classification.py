"""Classification end to end on tiny data built here; loaders, batching, metrics, CLI."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from scratchformer.cli import main
from scratchformer.data.batching import length_bucketed_batches
from scratchformer.data.labelled_texts import load_labelled_texts
from scratchformer.models.classifier import ClassifierConfig, TextClassifier
from scratchformer.models.contextual import EncoderConfig
from scratchformer.tasks.classification import (
    ClassifierRecipe,
    classification_metrics,
    load_classifier,
    train_classifier,
)
from scratchformer.training import TrainConfig

POSITIVE = ["great", "wonderful", "superb", "loved", "brilliant"]
NEGATIVE = ["awful", "boring", "terrible", "hated", "dull"]
FILLER = ["the", "film", "plot", "actor", "was", "a", "and", "scene", "movie", "story", "it"]


def synthetic_reviews(n: int, seed: int) -> list[dict]:
    """Label 1 iff the review contains a positive word (never both kinds); HTML breaks included."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = rng.choices(FILLER, k=rng.randint(3, 12))
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        rows.append(
            {"text": " ".join(words) + (" <br /><br />the end" if rng.random() < 0.3 else ""), "label": label}
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    with gzip.open(path, "wt") if path.suffix == ".gz" else open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def tiny_recipe(tmp_path: Path) -> ClassifierRecipe:
    return ClassifierRecipe(
        train_file=str(write_jsonl(tmp_path / "train.jsonl.gz", synthetic_reviews(600, 0))),
        test_file=str(write_jsonl(tmp_path / "test.jsonl", synthetic_reviews(200, 1))),
        valid_size=100,
        label_names=["negative", "positive"],
        vocab_size=200,
        max_length=24,
        truncation="head",
        batch_size=32,
        head_dropout=0.0,
        model={
            "d_model": 32,
            "num_heads": 2,
            "num_layers": 1,
            "d_ff": 64,
            "dropout": 0.0,
            "norm_first": True,
        },
        train=TrainConfig(
            out_dir=str(tmp_path / "run"),
            epochs=4,
            lr=5e-3,
            warmup_steps=10,
            eval_every=20,
            best_metric="accuracy",
            best_mode="max",
            progress=False,
            seed=3,
        ),
    )


def test_tiny_task_is_learned_perfectly_and_reloads(tmp_path: Path) -> None:
    report = train_classifier(tiny_recipe(tmp_path))
    assert report["test"]["accuracy"] == 1.0
    assert report["best_valid"]["accuracy"] == 1.0
    assert (tmp_path / "run" / "best" / "tokenizer.json").is_file()
    clf = load_classifier(tmp_path / "run" / "best", device="cpu")
    (label, prob), (label2, _) = clf.predict(["the plot was superb", "a dull film"])
    assert (label, label2) == ("positive", "negative") and prob > 0.9
    assert "<br" not in clf.tokenizer.decode(clf.tokenizer.encode(["a <br /> b"])[0])


def test_checkpoint_averaging_is_evaluated_and_chosen_by_validation(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path)
    recipe.average_last = 3
    report = train_classifier(recipe)
    assert len(list((tmp_path / "run").glob("step-*"))) == 3
    assert report["averaged_valid"]["accuracy"] >= 0.99
    assert report["test_checkpoint"] in ("best", "averaged")
    assert (tmp_path / "run" / report["test_checkpoint"] / "model.safetensors").is_file()
    assert report["test"]["accuracy"] == 1.0


def test_cli_train_evaluate_classify(tmp_path: Path, capsys) -> None:
    recipe = tiny_recipe(tmp_path).to_dict()
    recipe["train"] = {k: v for k, v in recipe["train"].items() if k != "betas"}
    config = tmp_path / "recipe.json"
    config.write_text(json.dumps(recipe))
    assert (
        main(
            ["train", "classifier", "--config", str(config), "--out", str(tmp_path / "cli"), "--epochs", "4"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["test"]["accuracy"] == 1.0

    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(tmp_path / "cli" / "best"),
                "--data",
                recipe["test_file"],
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "accuracy 1.0000" in out and "confusion matrix" in out

    assert (
        main(
            [
                "classify",
                "--checkpoint",
                str(tmp_path / "cli" / "best"),
                "--device",
                "cpu",
                "loved it",
                "boring",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["positive", "negative"]
    assert (
        main(
            [
                "classify",
                "--checkpoint",
                str(tmp_path / "cli" / "best"),
                "--device",
                "cpu",
                "--json",
                "loved it",
                "boring",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # JSON Lines, pipeline keys
    assert [(r["text"], r["label"]) for r in rows] == [("loved it", "positive"), ("boring", "negative")]
    assert all(0.5 < r["score"] <= 1.0 for r in rows)


def test_mean_pooling_classifier_ignores_extra_padding() -> None:
    torch.manual_seed(0)
    model = TextClassifier(
        ClassifierConfig(EncoderConfig(vocab_size=50, d_model=32, num_heads=4, num_layers=2, d_ff=64), 3)
    ).eval()
    tokens = torch.randint(1, 50, (4, 9))
    tokens[1, 5:] = 0
    padded = torch.cat([tokens, torch.zeros(4, 7, dtype=torch.long)], dim=1)
    assert (model(padded) - model(tokens)).abs().max().item() <= 1e-6


def test_pooler_pooling_is_bert_sequence_classification() -> None:
    """Pooling "pooler": head(dropout(tanh(W_p h_[CLS] + b_p))), the encoder's pooler (switched on by
    the config), as transformers' BertForSequenceClassification computes it; unknown poolings named."""
    torch.manual_seed(0)
    encoder = EncoderConfig(vocab_size=50, d_model=32, num_heads=4, num_layers=2, d_ff=64, pad_id=0)
    config = ClassifierConfig(encoder, 3, pooling="pooler")
    assert config.encoder.pooler and not encoder.pooler  # the caller's config is left as it was
    assert ClassifierConfig.from_dict(config.to_dict()) == config
    model = TextClassifier(config).eval()
    tokens = torch.randint(1, 50, (4, 9))
    tokens[1, 5:] = 0
    hidden = model.encoder(tokens)
    expected = model.head(torch.tanh(model.encoder.pooler(hidden[:, 0])))
    assert (model(tokens) - expected).abs().max().item() <= 1e-6
    assert (model(tokens) - model.head(hidden[:, 0])).abs().max().item() > 1e-3  # not "cls"
    with pytest.raises(ValueError, match=r"pooling: expected one of \('mean', 'cls', 'pooler'\), got 'max'"):
        ClassifierConfig(encoder, 3, pooling="max")
    with pytest.raises(ValueError, match=r"pooling: expected one of \('mean', 'cls', 'pooler'\)"):
        ClassifierRecipe(train_file="x.jsonl", pooling="max").validate()
    ClassifierRecipe(train_file="x.jsonl", pooling="pooler").validate()


def test_loader_errors_name_file_and_line(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "fine", "label": 1}\n{"text": "oops", "label": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: malformed JSON"):
        load_labelled_texts(bad_json)
    out_of_range = write_jsonl(
        tmp_path / "range.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 5}]
    )
    with pytest.raises(ValueError, match=r"range.jsonl:2: label 5 is outside the classes \[0, 2\)"):
        load_labelled_texts(out_of_range, label_names=["neg", "pos"])
    unknown = write_jsonl(tmp_path / "unknown.jsonl", [{"text": "a", "label": "meh"}])
    with pytest.raises(ValueError, match=r"label 'meh' is not one of the classes \['neg', 'pos'\]"):
        load_labelled_texts(unknown, label_names=["neg", "pos"])
    missing = write_jsonl(tmp_path / "missing.jsonl", [{"review": "a", "label": 0}])
    with pytest.raises(ValueError, match=r"missing field 'text'"):
        load_labelled_texts(missing)
    with pytest.raises(FileNotFoundError, match="data file not found"):
        load_labelled_texts(tmp_path / "nope.jsonl")


def test_loader_counts_skips(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"text": "good", "label": 1}\n{"text": "   ", "label": 0}\nnot json\n{"text": "bad", "label": 7}\n'
        '{"text": "meh", "label": 0}\n'
    )
    data = load_labelled_texts(path, label_names=["neg", "pos"], on_error="skip")
    assert data.texts == ["good", "meh"] and data.labels == [1, 0]
    assert data.skipped == {"empty text": 1, "malformed": 1, "bad label": 1}


def test_csv_with_custom_columns_and_string_labels(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text('review,sentiment\n"Great, really",pos\nAwful,neg\n"so ""quoted""",pos\n')
    data = load_labelled_texts(path, text_field="review", label_field="sentiment")
    assert data.label_names == ["neg", "pos"]
    assert data.texts == ["Great, really", "Awful", 'so "quoted"'] and data.labels == [1, 0, 1]


def test_metrics_match_scikit_learn() -> None:
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    y_true = [rng.randrange(3) for _ in range(300)]
    y_pred = [t if rng.random() < 0.7 else rng.randrange(3) for t in y_true]
    ours = classification_metrics(y_true, y_pred, ["a", "b", "c"])
    p, r, f, s = sklearn_metrics.precision_recall_fscore_support(y_true, y_pred)
    assert ours["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(y_true, y_pred))
    assert ours["macro_f1"] == pytest.approx(sklearn_metrics.f1_score(y_true, y_pred, average="macro"))
    assert ours["confusion"] == sklearn_metrics.confusion_matrix(y_true, y_pred).tolist()
    for i, name in enumerate("abc"):
        m = ours["per_class"][name]
        assert (m["precision"], m["recall"], m["f1"], m["support"]) == pytest.approx((p[i], r[i], f[i], s[i]))
    y_true, y_pred = [t + 1 for t in y_true], [t + 1 for t in y_pred]  # labels 1..3: class 0 never occurs
    ours = classification_metrics(y_true, y_pred, ["0", "a", "b", "c"])
    assert ours["macro_f1"] == pytest.approx(sklearn_metrics.f1_score(y_true, y_pred, average="macro"))
    assert classification_metrics([1, 2], [1, 2], ["0", "1", "2"])["macro_f1"] == 1.0  # not 2/3


def test_length_bucketed_batches() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 200) for _ in range(1000)]
    batches = length_bucketed_batches(lengths, 16, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(1000))  # every example once
    assert batches == length_bucketed_batches(lengths, 16, seed=1, epoch=0)  # deterministic
    assert batches != length_bucketed_batches(lengths, 16, seed=1, epoch=1)  # reshuffled per epoch

    def padded(bs):
        return sum(len(b) * max(lengths[i] for i in b) for b in bs)

    naive = [list(range(i, min(i + 16, 1000))) for i in range(0, 1000, 16)]
    assert padded(batches) < 0.6 * padded(naive)

    by_tokens = length_bucketed_batches(lengths, max_tokens=800, seed=1)
    assert sorted(i for b in by_tokens for i in b) == list(range(1000))
    assert all(len(b) * max(lengths[i] for i in b) <= 800 for b in by_tokens)
    with pytest.raises(ValueError, match="exactly one"):
        length_bucketed_batches(lengths, 16, max_tokens=100)


def test_a_given_tokenizer_makes_fresh_runs_use_one_vocabulary(tmp_path: Path, monkeypatch) -> None:
    """WordPiece training is not reproducible across processes (docs/guides/training.md); a recipe's
    ``tokenizer`` reuses a saved one instead, so every fresh run gets the same ids."""
    from scratchformer.tasks import classification

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = tiny_recipe(tmp_path / "a")
    first.train.epochs = 1
    train_classifier(first)
    saved = tmp_path / "a" / "run" / "best" / "tokenizer.json"

    def no_training(*args, **kwargs):
        raise AssertionError("the recipe gives a tokenizer: none may be trained")

    monkeypatch.setattr(classification, "train_wordpiece", no_training)
    second = tiny_recipe(tmp_path / "b")
    second.train.epochs, second.tokenizer = 1, str(saved)
    train_classifier(second)
    assert (tmp_path / "b" / "run" / "best" / "tokenizer.json").read_text() == saved.read_text()


def test_a_run_whose_metric_stops_improving_ends_early_and_says_so(tmp_path: Path) -> None:
    """train.patience 1 and a learning rate too small to move the accuracy: the second evaluation is
    no better than the first, so the run ends there, and report.json and metrics.jsonl say so."""
    import dataclasses

    recipe = tiny_recipe(tmp_path)
    recipe.train = dataclasses.replace(recipe.train, lr=1e-12, patience=1)
    report = train_classifier(recipe)
    assert report["stopped_early"] == {"step": 40, "best_step": 20, "patience": 1}, report.get(
        "stopped_early"
    )
    assert json.loads((tmp_path / "run" / "report.json").read_text())["stopped_early"]["step"] == 40
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in log) == 40 and any("early_stop" in r for r in log)


def test_the_resolved_recipe_is_saved_in_the_run_folder_and_reruns(tmp_path: Path, capsys) -> None:
    """OUT/recipe.json holds the whole recipe as it ran, defaults included; --config reads it back."""
    from scratchformer.cli import main

    recipe = tiny_recipe(tmp_path)
    recipe.train.max_steps = 2
    train_classifier(recipe)
    saved = tmp_path / "run" / "recipe.json"
    assert json.loads(saved.read_text()) == json.loads(json.dumps(recipe.to_dict()))
    capsys.readouterr()
    assert main(["train", "classifier", "--config", str(saved), "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(saved.read_text())


INPUTS = {
    "classifier": ["train_file"],
    "translation": ["train_source", "train_target", "valid_source", "valid_target"],
    "mlm": ["train_files"],
}


@pytest.mark.parametrize("task", list(INPUTS))
def test_a_model_too_large_for_memory_is_refused_first(task: str, tmp_path: Path, capsys) -> None:
    """d_model 100,000 (10^11 parameters or more): refused at once, naming the figure, before the
    tokenizer is trained or the data read (the input files exist, empty)."""
    import re
    import time

    from scratchformer.cli import main
    from scratchformer.training.distributed import device_for

    recipe = {}
    for key in INPUTS[task]:
        (tmp_path / key).write_text("")
        recipe[key] = [str(tmp_path / key)] if key == "train_files" else str(tmp_path / key)
    (tmp_path / "r.json").write_text(json.dumps({**recipe, "model": {"d_model": 100_000, "num_heads": 4}}))
    start = time.perf_counter()
    code = main(["train", task, "--config", str(tmp_path / "r.json"), "--out", str(tmp_path / "run")])
    assert code == 2 and time.perf_counter() - start < 20
    error = capsys.readouterr().err
    device = device_for("auto").type  # the device the recipe's "auto" trains on
    pattern = rf"parameters trained with AdamW needs about [\d,.]+ GiB, but {device} memory is"
    assert re.search(pattern, error), error
    assert not (tmp_path / "run").exists()
