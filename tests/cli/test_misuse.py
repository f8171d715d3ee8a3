"""The misuse catalogue: what scratchformer refuses, and how it says so.

Each case is something a user did (a bad flag, a bad recipe, a damaged or foreign checkpoint, an
interrupted save, a wrong call) and each must end in one clear error naming the problem, before
any work starts; never a silent wrong answer, a NaN, a traceback from deep inside, or a lost run.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from tasks.test_text_classification import tiny_recipe as tiny_classifier_recipe

import scratchformer as sf
from scratchformer.cli import main
from scratchformer.data.captions import load_caption_folder
from scratchformer.data.labelled_texts import load_labelled_texts
from scratchformer.tasks import classification
from scratchformer.tasks.captioning import CaptioningRecipe
from scratchformer.tasks.classification import ClassifierRecipe, load_classifier, train_classifier
from scratchformer.tasks.translation import TranslationRecipe
from scratchformer.training import TrainConfig
from scratchformer.training.checkpoint import load_weights, save_checkpoint
from scratchformer.training.recipe import load_recipe

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0.1.0"


def cli(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and stderr of ``scratchformer ARGV`` (argparse's own errors included)."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: usage line + error line, exit 2
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


# ---- bad flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--steps", "-5"], "argument --steps: must be >= 1, got -5"),
        (
            ["classify", "--checkpoint", "x", "--batch-size", "-3", "a text"],
            "argument --batch-size: must be >= 1",
        ),
        (["translate", "--checkpoint", "x", "--batch-size", "0"], "argument --batch-size: must be >= 1"),
        (["evaluate", "--checkpoint", "x", "--batch-size", "-1"], "argument --batch-size: must be >= 1"),
        (["translate", "--checkpoint", "x", "--beam", "0"], "argument --beam: must be >= 1"),
        (["train", "classifier", "--train", "x.jsonl", "--epochs", "0"], "argument --epochs: must be >= 1"),
    ],
)
def test_bad_flags_are_refused_by_the_parser(argv: list[str], message: str, capsys) -> None:
    code, err = cli(argv, capsys)
    assert code == 2 and message in err


def test_a_cli_error_is_one_line_and_debug_shows_the_traceback(tmp_path: Path, capsys) -> None:
    code, err = cli(["classify", "--checkpoint", str(tmp_path / "none"), "a text"], capsys)
    assert code == 2 and err.strip().count("\n") == 0 and err.startswith("error: no checkpoint at")
    with pytest.raises(FileNotFoundError):
        main(["classify", "--checkpoint", str(tmp_path / "none"), "a text", "--debug"])


def test_run_checks_come_before_any_data_work(tmp_path: Path, capsys) -> None:
    """The training file does not exist: each error below must be found first."""
    missing = str(tmp_path / "no-such-file.jsonl")
    base = ["train", "classifier", "--train", missing, "--out", str(tmp_path / "run")]
    if not torch.cuda.is_available():
        code, err = cli([*base, "--device", "cuda"], capsys)
        assert code == 2 and "CUDA is not available" in err
    code, err = cli([*base, "--precision", "fp16", "--device", "cpu"], capsys)
    assert code == 2 and "fp16" in err and "needs a CUDA device" in err
    code, err = cli([*base, "--resume"], capsys)
    assert code == 2 and "no resumable checkpoint" in err
    (tmp_path / "run" / "best").mkdir(parents=True)  # a run's checkpoint (its config records its training)
    (tmp_path / "run" / "best" / "config.json").write_text('{"kind": "text_classifier", "training": {}}')
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    code, err = cli(base, capsys)
    assert code == 2 and "holds an earlier run (best, metrics.jsonl)" in err and "--overwrite" in err
    code, err = cli([*base, "--overwrite"], capsys)  # now the run may start: it fails on the data
    assert code == 2 and "data file not found" in err
    assert (tmp_path / "run" / "best").exists()  # replaced only once training starts: not lost to a typo


def test_overwrite_replaces_the_earlier_run_when_training_starts(tmp_path: Path) -> None:
    recipe = tiny_classifier_recipe(tmp_path)
    recipe.train.epochs = 1
    train_classifier(recipe)
    (tmp_path / "run" / "test_hypotheses.txt").write_text("left by an earlier run\n")
    with pytest.raises(FileExistsError, match="holds an earlier run"):
        train_classifier(recipe)
    recipe.train.overwrite = True
    train_classifier(recipe)
    assert not (tmp_path / "run" / "test_hypotheses.txt").exists() and (tmp_path / "run" / "best").is_dir()


# ---- bad recipes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"grad_clip": -1.0}, "grad_clip must be positive"),
        ({"min_lr_ratio": -0.5}, r"min_lr_ratio must be in \[0, 1\]"),
        ({"eval_every": -1}, "eval_every must be an integer >= 0"),
        ({"save_every": -2}, "save_every must be an integer >= 0"),
        ({"warmup_steps": 1.5}, "warmup_steps must be an integer >= 0"),
        ({"betas": [0.9, 1.0]}, r"betas must be two numbers in \[0, 1\)"),
        ({"lr": float("nan")}, "lr must be a finite number, got nan"),
        ({"adam_eps": float("inf")}, "adam_eps must be a finite number, got inf"),
        ({"grad_clip": float("inf")}, "grad_clip must be a finite number"),
        ({"betas": [0.9, float("nan")]}, r"betas must be a finite number, got \(0.9, nan\)"),
    ],
)
def test_train_settings_that_would_train_silently_wrong(train: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**train)


def _classifier(**fields) -> ClassifierRecipe:
    return ClassifierRecipe(train_file="x.jsonl", **fields)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _classifier(valid_size=-1), "valid_size must be an integer >= 0"),
        (
            lambda: _classifier(train=TrainConfig(best_metric="acuracy")),
            r"best_metric: expected one of \('loss', 'accuracy'",
        ),
        (lambda: _classifier(model={"dropout": 1.5}), r"model: dropout must be in \[0, 1\)"),
        (lambda: _classifier(model={"num_heads": 4.5}), "model: num_heads must be positive"),
        (
            lambda: _classifier(model={"layer_norm_eps": float("nan")}),
            "model.layer_norm_eps must be a finite number, got NaN",
        ),
        (lambda: _classifier(model={"layer_norm_eps": -1.0}), "model: layer_norm_eps must be positive"),
        (
            lambda: _classifier(model={"d_modle": 64}),
            r"model: unknown key 'd_modle'; did you mean d_model\?",
        ),
        (
            lambda: _classifier(max_length=64, truncation="head", model={"max_len": 32}),
            "model.max_len=32 is shorter than max_length=64",
        ),
        (lambda: _classifier(label_names=["neg", "neg"]), "label_names: expected at least two distinct"),
        (
            lambda: TranslationRecipe("a", "b", "c", "d", decoding={"beam_size": 0}),
            "decoding.beam_size must be >= 1",
        ),
        (
            lambda: TranslationRecipe("a", "b", "c", "d", decoding={"beam": 4}),
            "decoding: unknown key 'beam'",
        ),
        (
            lambda: TranslationRecipe("a", "b", "c", "d", max_length=300),
            "max_length=300 tokens per side exceeds",
        ),
        (lambda: TranslationRecipe("a", "b", "c", "d", train=TrainConfig(best_metric="BLEU")), "best_metric"),
        (lambda: CaptioningRecipe(decoding={"max_len_b": 5}), "decoding: unknown key 'max_len_b'"),
        (lambda: CaptioningRecipe(model={"patch_size": 7}), "model: patch_size=7 must divide image_size=64"),
        (
            lambda: TranslationRecipe("a", "b", "c", "d", decoding={"beam_size": 3.0}),
            "decoding.beam_size: expected a finite integer",
        ),
    ],
)
def test_recipes_are_checked_whole_before_any_work(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_valid_recipes_whose_sizes_come_from_the_data_are_accepted() -> None:
    import numpy as np

    CaptioningRecipe(data="folder", image_size=224, model={"patch_size": 14})  # 224 = 16 x 14
    CaptioningRecipe(data="folder", model={"patch_size": 16})  # the images decide their size
    CaptioningRecipe(data="cs231n", model={"patch_size": 7})  # features: no patches at all
    assert TrainConfig(seed=-3, eval_every=np.int64(5)).eval_every == 5


def test_recipe_files_name_themselves_in_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"train_file": "x.jsonl",')
    with pytest.raises(ValueError, match=f"{broken}: not a JSON recipe"):
        load_recipe(ClassifierRecipe, broken)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"train_file": "x.jsonl", "train": {"epoch": 3}}))
    with pytest.raises(ValueError, match=f"{typo}: train: unknown key 'epoch'"):
        load_recipe(ClassifierRecipe, typo)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"train_file": "x.jsonl"}).encode())
    assert load_recipe(ClassifierRecipe, bom).train_file == "x.jsonl"  # a BOM is not an error


# ---- damaged and foreign checkpoints -----------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A classifier checkpoint as this release writes it (with the weights' SHA-256)."""
    loaded = load_classifier(FIXTURES / "text_classifier", device="cpu")
    config = {k: v for k, v in json.loads((FIXTURES / "text_classifier" / "config.json").read_text()).items()}
    return save_checkpoint(
        tmp_path / "ckpt",
        loaded.model,
        config,
        extra_files=lambda d: shutil.copy(FIXTURES / "text_classifier" / "tokenizer.json", d),
    )


def _edit_config(directory: Path, edit) -> None:
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))


def test_an_intact_checkpoint_loads(checkpoint: Path) -> None:
    assert "weights_sha256" in json.loads((checkpoint / "config.json").read_text())
    assert load_classifier(checkpoint, device="cpu").predict(["fine"])[0][0] in ("negative", "positive")


def test_flipped_bytes_in_the_weights_are_found(checkpoint: Path) -> None:
    data = bytearray((checkpoint / "model.safetensors").read_bytes())
    data[-100] ^= 0x40  # inside the tensor data: safetensors itself would load this silently
    (checkpoint / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is damaged: its SHA-256 differs"):
        load_classifier(checkpoint, device="cpu")


def test_a_truncated_weights_file_is_found(checkpoint: Path) -> None:
    data = (checkpoint / "model.safetensors").read_bytes()
    (checkpoint / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="is damaged"):
        load_classifier(checkpoint, device="cpu")


def test_a_foreign_tokenizer_is_refused(checkpoint: Path) -> None:
    shutil.copy(FIXTURES / "translation" / "tokenizer.json", checkpoint / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json does not belong to this model"):
        load_classifier(checkpoint, device="cpu")


def test_a_tampered_config_is_refused_before_anything_is_allocated(checkpoint: Path) -> None:
    # d_ff of 10^9 would allocate 2 x 32 x 10^9 floats (256 GB) per layer if the model were built
    _edit_config(checkpoint, lambda c: c["model"]["encoder"].update(d_ff=10**9))
    with pytest.raises(
        ValueError, match=r"config.json describes a model of [\d,]+ parameters .* cannot be loaded here"
    ):
        load_classifier(checkpoint, device="cpu")  # (the memory check, before the weights are compared)


def test_a_config_with_more_layers_than_the_weights_is_refused_before_allocation(checkpoint: Path) -> None:
    _edit_config(checkpoint, lambda c: c["model"]["encoder"].update(num_layers=40))  # the weights hold 1
    with pytest.raises(
        ValueError, match=r"config.json does not fit model.safetensors: missing \['encoder.encoder.layers.1"
    ):
        load_classifier(checkpoint, device="cpu")


@pytest.fixture
def hf_classifier(tmp_path: Path) -> Path:
    """A random ``BertForSequenceClassification`` (D=16, one layer), saved as transformers saves it,
    with a WordPiece tokenizer."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "clf")
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *map(str, range(36))]))
    transformers.BertTokenizerFast(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path / "clf")
    return tmp_path / "clf"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [  # 12 TB of d_model 10^6 ended as "a bug" (a failed allocation); 10^5 layers took minutes to build
        ("hidden_size", 10**6, r"model.safetensors does not fit the model from config.json; mis-shaped: "),
        ("num_hidden_layers", 10**5, r"config.json: num_layers must be at most 1,000 \(a layer count\)"),
        ("num_hidden_layers", 900, r"does not fit the model from config.json; missing: \[.*\.\.\. \d+ more"),
    ],
)
def test_an_edited_hugging_face_config_is_refused_in_one_line_before_allocation(
    hf_classifier: Path, field: str, value: int, message: str, capsys
) -> None:
    _edit_config(hf_classifier, lambda c: c.update({field: value}))
    code, err = cli(["classify", "--checkpoint", str(hf_classifier), "a text"], capsys)
    assert code == 2 and re.search(message, err) and err.count("\n") == 1, err


def test_a_broken_tokenizer_file_is_named(checkpoint: Path) -> None:
    (checkpoint / "tokenizer.json").write_text('{"version": ')
    with pytest.raises(ValueError, match="tokenizer.json: not a tokenizer.json"):
        load_classifier(checkpoint, device="cpu")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["labels"].append("neutral"),
            r"labels \['negative', 'positive', 'neutral'\] do not match",
        ),
        (lambda c: c["model"]["encoder"].update(pad_id=1), "does not belong to this model: .* pad id 0"),
        (lambda c: c["model"].update(extra=1), "unknown"),
    ],
)
def test_checkpoint_parts_must_agree(checkpoint: Path, edit, message: str) -> None:
    _edit_config(checkpoint, edit)
    with pytest.raises((ValueError, TypeError), match=message):
        load_classifier(checkpoint, device="cpu")


def test_a_broken_config_json_names_the_file(checkpoint: Path) -> None:
    (checkpoint / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        load_classifier(checkpoint, device="cpu")


# ---- interrupted saves -------------------------------------------------------------------------


def test_temporaries_of_an_interrupted_save_are_removed(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    (tmp_path / ".last.tmp-abc123").mkdir()  # what a kill during a save leaves
    save_checkpoint(tmp_path / "last", model, {"kind": "x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_a_save_killed_after_its_swap_is_cleaned_up_on_resume(tmp_path: Path) -> None:
    """Killed after the new checkpoint was swapped in but before last.old was removed, in the run's
    final save: the resumed run has nothing left to save, so the resume itself cleans up."""
    from scratchformer.training.checkpoint import finish_interrupted_save

    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path / "last", model, {"kind": "x"})
    save_checkpoint(tmp_path / "last.old", model, {"kind": "x"})  # what the kill leaves
    (tmp_path / ".last.tmp-abc123").mkdir()
    finish_interrupted_save(tmp_path / "last.missing")  # nothing whole there: nothing touched
    assert sorted(p.name for p in tmp_path.iterdir()) == [".last.tmp-abc123", "last", "last.old"]
    finish_interrupted_save(tmp_path / "last")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_a_crash_in_the_save_after_resuming_from_old_leaves_a_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """Resumed from last.old (last was missing): the next save must not delete last.old before the
    new checkpoint is in place."""
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path / "last", model, {"kind": "x"})
    (tmp_path / "last").rename(tmp_path / "last.old")  # an earlier swap died between its renames
    real_replace = __import__("os").replace

    def dying_replace(src, dst):
        if Path(src).name.startswith(".last.tmp-"):
            raise KeyboardInterrupt("killed while swapping in the new checkpoint")
        return real_replace(src, dst)

    monkeypatch.setattr("scratchformer.training.checkpoint.os.replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "last", model, {"kind": "x"})
    monkeypatch.undo()
    load_weights(torch.nn.Linear(2, 2), tmp_path / "last")  # a complete checkpoint is there


# ---- resuming ----------------------------------------------------------------------------------


def test_resume_reuses_the_checkpoint_tokenizer_and_checks_the_labels(tmp_path: Path, monkeypatch) -> None:
    recipe = tiny_classifier_recipe(tmp_path)
    recipe.train.epochs = 1
    train_classifier(recipe)
    tokenizer = (tmp_path / "run" / "last" / "tokenizer.json").read_text()

    def no_training(*args, **kwargs):
        raise AssertionError("a resumed run must not train a new tokenizer")

    monkeypatch.setattr(classification, "train_wordpiece", no_training)
    recipe.train.epochs = 2
    report = train_classifier(recipe, resume=True)
    assert (tmp_path / "run" / "last" / "tokenizer.json").read_text() == tokenizer
    assert report["test"]["accuracy"] > 0.5
    recipe.label_names = ["positive", "negative"]  # the order changed: ids would mean other classes
    with pytest.raises(ValueError, match="was trained with labels"):
        train_classifier(recipe, resume=True)


# ---- wrong calls -------------------------------------------------------------------------------


def test_small_api_misuses_are_named() -> None:
    model = sf.Transformer(
        sf.TransformerConfig(
            20, 20, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1
        )
    ).eval()
    for dtype in (torch.uint8, torch.int8, torch.int16):
        with pytest.raises(TypeError, match="expected integer token ids"):
            model(torch.ones(1, 3, dtype=dtype), torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="num_heads must be positive, got -2"):
        sf.MultiHeadAttention(16, -2)
    src = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="bos_id and eos_id are both 2"):
        sf.beam_search(model, src, bos_id=2, eos_id=2)
    with torch.no_grad():
        model.generator.weight.fill_(float("nan"))
    for decode in (sf.greedy_decode, sf.beam_search):
        with pytest.raises(FloatingPointError, match="logits are NaN at step 0"):
            decode(model, src, bos_id=1, eos_id=2)


def test_text_files_binary_or_with_a_bom(tmp_path: Path) -> None:
    binary = tmp_path / "data.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.raises(ValueError, match=f"{binary}: not a UTF-8 text file"):
        load_labelled_texts(binary)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n')
    assert load_labelled_texts(bom).texts == ["good", "bad"]


@pytest.mark.parametrize("gz", [False, True])
def test_a_bad_byte_past_the_checked_start_names_the_file(tmp_path: Path, gz: bool) -> None:
    """The first 64 KiB are checked when the file opens; a Latin-1 byte after them is still an error
    naming the file, for every reader of open_text (records, plain lines, parallel text)."""
    import gzip

    from scratchformer.data.labelled_texts import load_texts
    from scratchformer.data.parallel_texts import load_parallel_texts

    body = b'{"text": "a fine film", "label": 1}\n' * 3000 + '{"text": "caf\u00e9", "label": 0}\n'.encode(
        "latin-1"
    )
    for name, read in (
        ("late.jsonl", load_labelled_texts),
        ("late.txt", load_texts),
        ("late.de", lambda path: load_parallel_texts(path, path)),
    ):
        path = tmp_path / (name + (".gz" if gz else ""))
        path.write_bytes(gzip.compress(body) if gz else body)
        with pytest.raises(ValueError, match=f"{path}: not UTF-8 text past its first 64 KiB"):
            read(path)


def test_csv_rows_the_header_does_not_fit_are_malformed_not_cut(tmp_path: Path) -> None:
    """csv.DictReader files extra fields under None and fills missing ones with None: an unquoted
    comma would silently cut a review (or, with the text first, make its tail a new class)."""
    path = tmp_path / "reviews.csv"
    path.write_text("label,text\n1,A great film\n0,Dull, and far too long\n1\n")
    with pytest.raises(
        ValueError, match=f"{path}:3: more fields than the header's 2 \\(an unquoted comma\\?\\)"
    ):
        load_labelled_texts(path)
    data = load_labelled_texts(path, on_error="skip")
    assert data.texts == ["A great film"] and data.skipped == {"malformed": 2}  # line 4: fewer fields
    path.write_text("label,text\n1,A great film\n1\n")
    with pytest.raises(ValueError, match=f"{path}:3: fewer fields than the header's 2"):
        load_labelled_texts(path)


def test_parallel_text_keeps_the_last_lines_ending(tmp_path: Path) -> None:
    """The last line has no newline to strip: its own final characters stay (here an 'n' and a backslash)."""
    from scratchformer.data.parallel_texts import load_parallel_texts

    (tmp_path / "s.de").write_text("Ein Mann\nEine Frau lief davon")
    (tmp_path / "t.en").write_text("A man\nA woman ran down\\")
    pairs = load_parallel_texts(tmp_path / "s.de", tmp_path / "t.en")
    assert pairs.sources == ["Ein Mann", "Eine Frau lief davon"] and pairs.targets == [
        "A man",
        "A woman ran down\\",
    ]


@pytest.mark.parametrize("image_id", ["../outside/x.png", "/etc/passwd", "a/../../x.png"])
def test_caption_ids_cannot_leave_the_images_folder(tmp_path: Path, image_id: str) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "captions.tsv").write_text(f"{image_id}\ta caption\n")
    with pytest.raises(ValueError, match="is not a file name inside the images folder"):
        load_caption_folder(tmp_path / "captions.tsv", tmp_path / "images")


def test_hugging_face_datasets_get_the_jsonl_loaders_label_handling(monkeypatch) -> None:
    """Integer labels in numeric order ("10" after "2"), string labels, and -1 refused (on CUDA a
    label of -1 is a device-side assert); a stand-in ``datasets`` module, no download."""
    import sys
    import types

    from scratchformer.data.labelled_texts import load_hf_dataset

    class Split(dict):
        features = {"label": object()}  # no ClassLabel names

    rows: dict[str, list] = {}
    fake = types.SimpleNamespace(
        load_dataset=lambda name, split: Split(text=["a", "b", "c"], label=rows["label"])
    )
    monkeypatch.setitem(sys.modules, "datasets", fake)
    rows["label"] = [2, 10, 0]
    data = load_hf_dataset("x", "train")
    assert (
        data.label_names[:3] == ["0", "1", "2"] and data.label_names[10] == "10" and data.labels == [2, 10, 0]
    )
    rows["label"] = ["pos", "neg", "pos"]
    assert load_hf_dataset("x", "train").labels == [1, 0, 1]
    rows["label"] = [0, -1, 1]
    with pytest.raises(ValueError, match=r"x \[train\] row 1: label -1 is outside the classes"):
        load_hf_dataset("x", "train")


def test_a_validation_reference_longer_than_the_model_is_evaluated_not_a_crash(tmp_path: Path) -> None:
    from tasks.test_translation import tiny_recipe as tiny_translation_recipe

    from scratchformer.tasks.translation import train_translation

    recipe = tiny_translation_recipe(tmp_path, max_steps=4, eval_every=2)
    recipe.model["max_len"] = 32
    lines = Path(recipe.valid_target).read_text().splitlines()
    lines[-1] = " ".join(["a red dog runs"] * 30) + "."  # ~120 tokens: the model's max_len is 32
    Path(recipe.valid_target).write_text("\n".join(lines) + "\n")
    report = train_translation(recipe)
    assert report["best_valid"]["loss"] > 0 and (tmp_path / "run" / "best" / "model.safetensors").is_file()
