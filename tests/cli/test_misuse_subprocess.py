"""The misuse suite, driven as a user drives it: ``python -m scratchformer ARGV`` in a subprocess.

Each case is a command line (with the files it names, made once per module, and a stdin) and the
words its error must contain. Every case must exit with code 2 (bad input or usage), print no
traceback, say what is wrong in one line (``error: ...``; argparse's usage errors: its usage lines
and one ``scratchformer CMD: error: ...`` line) and change none of the files it was given.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from forked import run_cli

from scratchformer.tasks.classification import load_classifier
from scratchformer.training.checkpoint import save_checkpoint

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0.1.0"
USAGE, ERROR = "usage", "error"  # how the error is reported: argparse's usage + error, or one line


def _classifier_checkpoint(directory: Path) -> Path:
    """The v0.1.0 fixture classifier saved as this release writes it (with its weights' SHA-256)."""
    loaded = load_classifier(FIXTURES / "text_classifier", device="cpu")
    config = json.loads((FIXTURES / "text_classifier" / "config.json").read_text())
    return save_checkpoint(
        directory,
        loaded.model,
        config,
        extra_files=lambda d: shutil.copy(FIXTURES / "text_classifier" / "tokenizer.json", d),
    )


def _damaged(world: Path, name: str, damage) -> None:
    directory = shutil.copytree(world / "ckpt", world / name)
    damage(directory)


def _edit_config(edit):
    def damage(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        edit(config)
        (directory / "config.json").write_text(json.dumps(config))

    return damage


def _flip_a_byte(directory: Path) -> None:
    data = bytearray((directory / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (directory / "model.safetensors").write_bytes(bytes(data))


def _truncate(directory: Path) -> None:
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[: len(data) // 2])


def _bert_exports(world: Path) -> None:
    """A classifier export (``hf_clf``: BertForSequenceClassification), the same without its head,
    a plain BERT export (BertModel), and what CTranslate2 and ONNX exports look like."""
    from safetensors.torch import load_file, save_file

    from scratchformer.models.classifier import ClassifierConfig, TextClassifier
    from scratchformer.models.contextual import EncoderConfig
    from scratchformer.tasks.classification import LoadedClassifier

    fixture = load_classifier(FIXTURES / "text_classifier", device="cpu")
    encoder = EncoderConfig(
        fixture.tokenizer.vocab_size, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=24,
        norm_first=False, embedding_norm=True, pad_id=fixture.tokenizer.pad_id,
    )  # fmt: skip
    model = TextClassifier(ClassifierConfig(encoder, num_classes=2, pooling="pooler")).eval()
    LoadedClassifier(model, fixture.tokenizer, ["neg", "pos"], torch.device("cpu")).save_pretrained(
        world / "hf_clf"
    )
    headless = shutil.copytree(world / "hf_clf", world / "hf_headless") / "model.safetensors"
    state = load_file(str(headless))
    save_file({k: v for k, v in state.items() if not k.startswith("classifier.")}, str(headless))
    shutil.copytree(world / "hf_clf", world / "hf_bert")

    def plain_bert(config: dict) -> None:  # the encoder alone: no head, no labels
        for key in ("scratchformer_classifier", "id2label", "label2id", "problem_type", "classifier_dropout"):
            config.pop(key)
        config["architectures"] = ["BertModel"]

    _edit_config(plain_bert)(world / "hf_bert")
    for engine, files in {
        "ct2": ("model.bin", "config.json"),
        "onnx": ("model.onnx", "tokenizer.json"),
    }.items():
        (world / engine).mkdir()
        for name in files:
            (world / engine / name).write_text("{}")


def _recipes_and_data(world: Path) -> None:
    recipes = {
        "unknown.json": {"train_file": "x.jsonl", "colour": "red"},
        "typo_train.json": {"train_file": "x.jsonl", "train": {"epoch": 3}},
        "dropout.json": {"train_file": "x.jsonl", "model": {"dropout": 1.5}},
        "labels.json": {"train_file": "x.jsonl", "label_names": ["neg", "neg"]},
        "metric.json": {"train_file": "x.jsonl", "train": {"best_metric": "acuracy"}},
        "clip.json": {"train_file": "x.jsonl", "train": {"grad_clip": -1}},
        "list.json": ["train_file", "x.jsonl"],
    }
    for name, recipe in recipes.items():
        (world / name).write_text(json.dumps(recipe))
    (world / "broken.json").write_text('{"train_file": "x.jsonl",')
    (world / "texts.jsonl").write_text('{"text": "a fine film", "label": "positive"}\n')
    (world / "binary.jsonl").write_bytes(b"\x00\x01\x02\xff\xfe" * 50)
    (world / "a_file.txt").write_text("not a folder\n")


def _boundary_cases(world: Path) -> None:
    """Issue 41's last boundary cases: recipes with an empty out_dir, NaN, a misspelt model key, a
    max_len shorter than max_length; run folders whose training state is damaged; a folder of the
    user's own files named as a run's outputs; a folder that holds a captions.tsv already."""
    recipes = {
        "out_empty.json": '{"train_file": "x.jsonl", "train": {"out_dir": ""}}',
        "nan_lr.json": '{"train_file": "x.jsonl", "train": {"lr": NaN}}',
        "inf_betas.json": '{"train_file": "x.jsonl", "train": {"betas": [0.9, Infinity]}}',
        "inf_dropout.json": '{"train_file": "x.jsonl", "model": {"dropout": -Infinity}}',
        "model_typo.json": '{"train_file": "x.jsonl", "model": {"d_modle": 64}}',
        "max_len.json": '{"train_file": "x", "max_length": 64, "head_length": 8, "model": {"max_len": 32}}',
        "mlm_typo.json": '{"train_files": ["x.txt"], "model": {"num_layer": 2}}',
        "mt_max_len.json": json.dumps(
            {f"{s}_{side}": "x" for s in ("train", "valid") for side in ("source", "target")}
            | {"max_length": 64, "model": {"max_len": 32}}
        ),
    }
    for name, text in recipes.items():
        (world / name).write_text(text)
    full = dict.fromkeys(("optimizer", "scheduler", "step", "epoch", "next_group", "best", "rng"), 0)
    states = {
        "truncated": lambda path: path.write_bytes(_torch_bytes(full)[:200]),
        "a_list": lambda path: torch.save([1, 2, 3], path),
        "partial": lambda path: torch.save({"step": 1}, path),
        "a_pickle": lambda path: path.write_bytes(pickle.dumps(full)),
    }
    for name, write in states.items():
        shutil.copytree(world / "ckpt", world / f"run_{name}" / "last")
        write(world / f"run_{name}" / "last" / "training_state.pt")
    for folder, names in {
        "mine": ("report.json", "metrics.jsonl", "curves.png"),
        "mine_best": ("best/a",),
    }.items():
        for name in names:
            (world / folder / name).parent.mkdir(parents=True, exist_ok=True)
            (world / folder / name).write_text("the user's own\n")
    (world / "scenes").mkdir()
    (world / "scenes" / "captions.tsv").write_text("mine.png\ta caption of mine\n")
    (world / "scenes_png").mkdir()
    (world / "scenes_png" / "test_heldout-0000.png").write_bytes(b"mine")


def _torch_bytes(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Every file the cases name: checkpoints (intact, damaged, foreign), exports, recipes, data."""
    world = tmp_path_factory.mktemp("world")
    _classifier_checkpoint(world / "ckpt")
    _damaged(world, "flipped", _flip_a_byte)
    _damaged(world, "truncated", _truncate)
    _damaged(world, "badjson", lambda d: (d / "config.json").write_text("{not json"))
    _damaged(world, "nokind", _edit_config(lambda c: c.pop("kind")))
    _damaged(world, "labels3", _edit_config(lambda c: c["labels"].append("neutral")))
    _damaged(world, "padid", _edit_config(lambda c: c["model"]["encoder"].update(pad_id=1)))
    _damaged(world, "badtok", lambda d: (d / "tokenizer.json").write_text('{"version": '))
    _damaged(world, "notok", lambda d: (d / "tokenizer.json").unlink())
    _damaged(world, "huge", _edit_config(lambda c: c["model"]["encoder"].update(d_model=2**18, d_ff=2**19)))
    _bert_exports(world)
    _recipes_and_data(world)
    _boundary_cases(world)
    return world


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


M = "{w}/missing"  # a path that does not exist
CASES: list[tuple[str, list[str], str, str]] = [
    # ---- bad flags: argparse's usage errors --------------------------------------------------
    ("no-command", [], USAGE, "the following arguments are required: command"),
    ("unknown-command", ["trian"], USAGE, "invalid choice: 'trian'"),
    ("unknown-flag", ["demo", "--stpes", "5"], USAGE, "unrecognized arguments: --stpes"),
    ("steps-negative", ["demo", "--steps", "-5"], USAGE, "argument --steps: must be >= 1, got -5"),
    ("steps-zero", ["demo", "--steps", "0"], USAGE, "argument --steps: must be >= 1, got 0"),
    ("steps-text", ["demo", "--steps", "many"], USAGE, "argument --steps: invalid positive value: 'many'"),
    ("demo-task", ["demo", "--task", "copy"], USAGE, "argument --task: invalid choice: 'copy'"),
    ("seed-float", ["demo", "--seed", "1e23"], USAGE, "argument --seed: must be an integer, got '1e23'"),
    ("seed-huge", ["demo", "--seed", str(10**23)], USAGE, "argument --seed: must be in [0, 2**63 - 1]"),
    ("seed-negative", ["demo", "--seed", "-1"], USAGE, "argument --seed: must be in [0, 2**63 - 1]"),
    ("shapes-seed", ["shapes", "--seed", str(2**63)], USAGE, "argument --seed: must be in [0, 2**63 - 1]"),
    ("threads-negative", ["demo", "--threads", "-1"], USAGE, "argument --threads: must be >= 0, got -1"),
    ("shapes-count", ["shapes", "--count", "0"], USAGE, "argument --count: must be >= 1, got 0"),
    ("shapes-split", ["shapes", "--split", "test"], USAGE, "argument --split: invalid choice: 'test'"),
    ("classify-batch", ["classify", "--checkpoint", "x", "--batch-size", "-3", "a"], USAGE, "--batch-size"),
    ("translate-batch", ["translate", "--checkpoint", "x", "--batch-size", "0"], USAGE, "must be >= 1"),
    ("evaluate-batch", ["evaluate", "--checkpoint", "x", "--batch-size", "-1"], USAGE, "must be >= 1"),
    ("beam-zero", ["translate", "--checkpoint", "x", "--beam", "0"], USAGE, "argument --beam: must be >= 1"),
    ("top-k", ["translate", "--checkpoint", "x", "--top-k", "-1"], USAGE, "argument --top-k: must be >= 0"),
    ("max-new", ["translate", "--checkpoint", "x", "--max-new-tokens", "0"], USAGE, "--max-new-tokens"),
    ("sample-seed", ["translate", "--checkpoint", "x", "--sampling", "--seed", str(2**64)], USAGE, "--seed"),
    ("precision", ["classify", "--checkpoint", "x", "--precision", "fp8"], USAGE, "invalid choice: 'fp8'"),
    ("eval-precision", ["evaluate", "--checkpoint", "x", "--precision", "fp8"], USAGE, "invalid choice"),
    ("export-format", ["export", "--checkpoint", "x", "--out", "y", "--format", "tflite"], USAGE, "'tflite'"),
    ("export-no-out", ["export", "--checkpoint", "x"], USAGE, "the following arguments are required: --out"),
    ("no-checkpoint", ["classify", "a text"], USAGE, "the following arguments are required: --checkpoint"),
    (
        "attention-text",
        ["attention", "--checkpoint", "x"],
        USAGE,
        "the following arguments are required: text",
    ),
    ("train-no-task", ["train"], USAGE, "the following arguments are required"),
    (
        "train-epochs",
        ["train", "classifier", "--train", "x", "--epochs", "0"],
        USAGE,
        "--epochs: must be >= 1",
    ),
    ("train-steps", ["train", "classifier", "--train", "x", "--max-steps", "0"], USAGE, "--max-steps"),
    ("train-threads", ["train", "classifier", "--train", "x", "--threads", "-2"], USAGE, "--threads"),
    ("train-precision", ["train", "classifier", "--train", "x", "--precision", "fp8"], USAGE, "'fp8'"),
    ("features-no-out", ["features", "--images", "x"], USAGE, "the following arguments are required: --out"),
    # ---- bad flags found by the command, before any work ---------------------------------------
    (
        "sampling-only",
        ["translate", "--checkpoint", M, "--temperature", "0.5"],
        ERROR,
        "only with --sampling",
    ),
    ("resume-overwrite", ["train", "classifier", "--train", M, "--resume", "--overwrite"], ERROR, "--resume"),
    ("device-typo", ["classify", "--checkpoint", "{w}/ckpt", "--device", "gpu", "a"], ERROR, "'gpu': not a"),
    (
        "device-meta",
        ["features", "--images", M, "--out", "{o}/f", "--device", "meta"],
        ERROR,
        "not supported",
    ),
    (
        "device-index",
        ["classify", "--checkpoint", "{w}/ckpt", "--device", "cuda:99", "a"],
        ERROR,
        "'cuda:99'",
    ),
    (
        "fp16-on-cpu",
        ["train", "classifier", "--train", M, "--precision", "fp16", "--device", "cpu"],
        ERROR,
        "fp16",
    ),
    (
        "resume-nothing",
        ["train", "classifier", "--train", M, "--out", "{o}", "--resume"],
        ERROR,
        "no resumable",
    ),
    ("train-nothing", ["train", "classifier"], ERROR, "give --config RECIPE.json or --train FILE"),
    ("eval-no-data", ["evaluate", "--checkpoint", "{w}/ckpt"], ERROR, "--data FILE is required"),
    (
        "eval-decoding",
        ["evaluate", "--checkpoint", "{w}/ckpt", "--data", "x", "--beam", "2"],
        ERROR,
        "decoding",
    ),
    # ---- missing or wrong files --------------------------------------------------------------------
    ("train-missing", ["train", "classifier", "--train", M, "--out", "{o}"], ERROR, "not found"),
    ("recipe-missing", ["train", "classifier", "--config", M], ERROR, "missing"),
    ("recipe-broken", ["train", "classifier", "--config", "{w}/broken.json"], ERROR, "broken.json"),
    ("recipe-list", ["train", "classifier", "--config", "{w}/list.json"], ERROR, "list.json"),
    ("recipe-unknown", ["train", "classifier", "--config", "{w}/unknown.json"], ERROR, "colour"),
    ("recipe-typo", ["train", "classifier", "--config", "{w}/typo_train.json"], ERROR, "'epoch'"),
    ("recipe-dropout", ["train", "classifier", "--config", "{w}/dropout.json"], ERROR, "dropout must be in"),
    ("recipe-labels", ["train", "classifier", "--config", "{w}/labels.json"], ERROR, "label_names"),
    ("recipe-metric", ["train", "classifier", "--config", "{w}/metric.json"], ERROR, "best_metric"),
    (
        "recipe-clip",
        ["train", "classifier", "--config", "{w}/clip.json"],
        ERROR,
        "grad_clip must be positive",
    ),
    ("mlm-recipe-missing", ["train", "mlm", "--config", M], ERROR, "missing"),
    ("eval-data-missing", ["evaluate", "--checkpoint", "{w}/ckpt", "--data", M], ERROR, "missing"),
    (
        "eval-data-binary",
        ["evaluate", "--checkpoint", "{w}/ckpt", "--data", "{w}/binary.jsonl"],
        ERROR,
        "binary",
    ),
    ("features-missing", ["features", "--images", M, "--out", "{o}/f.safetensors"], ERROR, "missing"),
    ("caption-missing", ["caption", "--checkpoint", M, "x.png"], ERROR, "no checkpoint at"),
    ("embed-missing", ["embed", "--model", M, "a text"], ERROR, "missing"),
    ("similarity-missing", ["similarity", "--model", M, "a", "b"], ERROR, "missing"),
    # ---- damaged and foreign checkpoints ------------------------------------------------------------
    ("ckpt-missing", ["classify", "--checkpoint", M, "a text"], ERROR, "no checkpoint at"),
    ("ckpt-flipped", ["classify", "--checkpoint", "{w}/flipped", "a text"], ERROR, "SHA-256"),
    ("ckpt-truncated", ["classify", "--checkpoint", "{w}/truncated", "a text"], ERROR, "truncated"),
    (
        "ckpt-badjson",
        ["classify", "--checkpoint", "{w}/badjson", "a text"],
        ERROR,
        "config.json: not valid JSON",
    ),
    ("ckpt-nokind", ["classify", "--checkpoint", "{w}/nokind", "a text"], ERROR, "records no 'kind'"),
    ("ckpt-labels", ["classify", "--checkpoint", "{w}/labels3", "a"], ERROR, "'neutral'] do not match"),
    (
        "ckpt-padid",
        ["classify", "--checkpoint", "{w}/padid", "a text"],
        ERROR,
        "does not belong to this model",
    ),
    ("ckpt-badtok", ["classify", "--checkpoint", "{w}/badtok", "a text"], ERROR, "not a tokenizer.json"),
    ("ckpt-notok", ["classify", "--checkpoint", "{w}/notok", "a text"], ERROR, "tokenizer.json"),
    ("eval-nokind", ["evaluate", "--checkpoint", "{w}/nokind", "--data", "x"], ERROR, "records no 'kind'"),
    ("translate-clf", ["translate", "--checkpoint", "{w}/ckpt", "a"], ERROR, "'text_classifier' checkpoint"),
    ("caption-clf", ["caption", "--checkpoint", "{w}/ckpt", "x.png"], ERROR, "'text_classifier' checkpoint"),
    ("attention-clf", ["attention", "--checkpoint", "{w}/ckpt", "a"], ERROR, "'text_classifier' checkpoint"),
    ("embed-clf", ["embed", "--model", "{w}/ckpt", "a text"], ERROR, "'text_classifier' checkpoint's config"),
    # ---- exports --------------------------------------------------------------------------------
    (
        "classify-hf-bert",
        ["classify", "--checkpoint", "{w}/hf_bert", "a"],
        ERROR,
        "is a Hugging Face BERT export",
    ),
    (
        "evaluate-hf-bert",
        ["evaluate", "--checkpoint", "{w}/hf_bert", "--data", "x"],
        ERROR,
        "Hugging Face BERT",
    ),
    (
        "export-hf-bert",
        ["export", "--checkpoint", "{w}/hf_bert", "--out", "{o}/x"],
        ERROR,
        "Hugging Face BERT",
    ),
    ("classify-headless", ["classify", "--checkpoint", "{w}/hf_headless", "a"], ERROR, "the class head"),
    (
        "export-mean",
        ["export", "--checkpoint", "{w}/ckpt", "--out", "{o}/x"],
        ERROR,
        "a classifier with mean pooling has no Hugging Face sequence-classification class",
    ),
    (
        "classify-ct2",
        ["classify", "--checkpoint", "{w}/ct2", "a"],
        ERROR,
        "is a CTranslate2 model (model.bin)",
    ),
    ("translate-onnx", ["translate", "--checkpoint", "{w}/onnx", "a"], ERROR, "run it with onnxruntime"),
    ("embed-ct2", ["embed", "--model", "{w}/ct2", "a"], ERROR, "run it with CTranslate2"),
    ("export-over", ["export", "--checkpoint", "{w}/ckpt", "--out", "{w}/hf_clf"], ERROR, "already exists"),
    ("export-onto-file", ["export", "--checkpoint", "{w}/ckpt", "--out", "{w}/a_file.txt"], ERROR, "exists"),
    ("export-pre-ln", ["export", "--checkpoint", "{w}/ckpt", "--out", "{o}/x"], ERROR, "norm_first=True"),
    ("export-missing", ["export", "--checkpoint", M, "--out", "{o}/x"], ERROR, "no checkpoint at"),
    # ---- the last boundary cases (issue 41) -------------------------------------------------------
    ("train-out-empty", ["train", "classifier", "--train", "{w}/texts.jsonl", "--out", ""], ERROR, "out_dir"),
    ("recipe-out-empty", ["train", "classifier", "--config", "{w}/out_empty.json"], ERROR, "must name a"),
    ("shapes-out-empty", ["shapes", "--out", ""], USAGE, "argument --out: must name a file or folder"),
    ("features-out-empty", ["features", "--images", "{w}", "--out", ""], USAGE, "argument --out: must"),
    ("export-out-empty", ["export", "--checkpoint", "{w}/ckpt", "--out", " "], USAGE, "argument --out"),
    (
        "resume-truncated",
        ["train", "classifier", "--train", "{w}/texts.jsonl", "--out", "{w}/run_truncated", "--resume"],
        ERROR,
        "run_truncated/last/training_state.pt is damaged: not the zip archive torch.save writes",
    ),
    (
        "resume-pickle",
        ["train", "classifier", "--train", "{w}/texts.jsonl", "--out", "{w}/run_a_pickle", "--resume"],
        ERROR,
        "run_a_pickle/last/training_state.pt is damaged",
    ),
    (
        "resume-list",
        ["train", "classifier", "--train", "{w}/texts.jsonl", "--out", "{w}/run_a_list", "--resume"],
        ERROR,
        "training_state.pt is not a training state: it holds a list",
    ),
    (
        "resume-partial",
        ["train", "classifier", "--train", "{w}/texts.jsonl", "--out", "{w}/run_partial", "--resume"],
        ERROR,
        "training_state.pt is not a training state: it lacks ['optimizer', 'scheduler', 'epoch'",
    ),
    (
        "overwrite-foreign",
        ["train", "classifier", "--train", "{w}/texts.jsonl", "--out", "{w}/mine", "--overwrite"],
        ERROR,
        "--overwrite would delete curves.png, metrics.jsonl, report.json in",
    ),
    (
        "overwrite-foreign-best",
        ["train", "classifier", "--train", "{w}/texts.jsonl", "--out", "{w}/mine_best", "--overwrite"],
        ERROR,
        "holds no run of scratchformer",
    ),
    ("shapes-over", ["shapes", "--out", "{w}/scenes", "--count", "1"], ERROR, "already holds captions.tsv"),
    ("shapes-over-png", ["shapes", "--out", "{w}/scenes_png"], ERROR, "holds test_heldout-0000.png"),
    ("shapes-onto-file", ["shapes", "--out", "{w}/a_file.txt"], ERROR, "a_file.txt is a file, not a folder"),
    ("ckpt-huge", ["classify", "--checkpoint", "{w}/huge", "a"], ERROR, "parameters that needs about"),
    ("eval-huge", ["evaluate", "--checkpoint", "{w}/huge", "--data", "{w}/texts.jsonl"], ERROR, "GiB"),
    (
        "export-huge",
        ["export", "--checkpoint", "{w}/huge", "--out", "{o}/x", "--format", "onnx"],
        ERROR,
        "cannot be loaded here",
    ),
    (
        "recipe-model-typo",
        ["train", "classifier", "--config", "{w}/model_typo.json"],
        ERROR,
        "model: unknown key 'd_modle'; did you mean d_model?",
    ),
    ("mlm-model-typo", ["train", "mlm", "--config", "{w}/mlm_typo.json"], ERROR, "did you mean num_layers?"),
    (
        "set-model-typo",
        ["train", "classifier", "--train", "x", "--set", "model.d_modle=8"],
        ERROR,
        "d_model?",
    ),
    ("recipe-nan", ["train", "classifier", "--config", "{w}/nan_lr.json"], ERROR, "train.lr: NaN is not"),
    ("recipe-inf", ["train", "classifier", "--config", "{w}/inf_betas.json"], ERROR, "train.betas[1]"),
    ("recipe-inf-model", ["train", "classifier", "--config", "{w}/inf_dropout.json"], ERROR, "model.dropout"),
    ("set-inf", ["train", "classifier", "--train", "x", "--set", "train.adam_eps=1e999"], ERROR, "adam_eps"),
    (
        "recipe-max-len",
        ["train", "classifier", "--config", "{w}/max_len.json"],
        ERROR,
        "model.max_len=32 is shorter than max_length=64",
    ),
    (
        "set-max-len",
        ["train", "classifier", "--train", "{w}/texts.jsonl", "--set", "model.max_len=16"],
        ERROR,
        "model.max_len=16 is shorter than max_length=512",
    ),
    ("mt-max-len", ["train", "translation", "--config", "{w}/mt_max_len.json"], ERROR, "max_len=32"),
]


def test_the_suite_is_large_enough() -> None:
    assert len(CASES) >= 60 and len({name for name, *_ in CASES}) == len(CASES)


def _run_case(world: Path, base: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess, bool]:
    """Run one case in its own copy of the world; (the finished process, its input files unchanged)."""
    mine = shutil.copytree(world, base / "world")
    before = _hashes(mine)
    argv = [a.replace("{w}", str(mine)).replace("{o}", str(base / "out")) for a in argv]
    env = {k: v for k, v in os.environ.items() if k != "SCRATCHFORMER_DEBUG"}
    # cwd: the working folder; a refusal writes nothing there either (--out "")
    done = run_cli(argv, cwd=base, env=env)
    return done, _hashes(mine) == before and [p.name for p in base.iterdir()] == ["world"]


@pytest.fixture(scope="module")
def outcomes(world: Path, tmp_path_factory, request) -> dict:
    """The selected cases, two at a time, each a process forked from one that has imported torch
    and the commands' modules (forked.py: ~0.3 s a case instead of ~3 s)."""
    from concurrent.futures import ThreadPoolExecutor

    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_misuse_from_the_command_line"
    }
    base = tmp_path_factory.mktemp("cases")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {
            name: pool.submit(_run_case, world, base / name, argv)
            for name, argv, *_ in CASES
            if name in selected
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize(("name", "argv", "how", "message"), CASES, ids=[c[0] for c in CASES])
def test_misuse_from_the_command_line(outcomes: dict, name, argv, how, message) -> None:
    done, unchanged = outcomes[name]
    err = done.stderr
    assert done.returncode == 2, (done.returncode, err)
    assert "Traceback" not in err and done.stdout == "", err
    lines = err.splitlines()
    if how == USAGE:  # argparse: its usage lines, then one "scratchformer ...: error: ..." line
        assert lines[0].startswith("usage: scratchformer") and ": error: " in lines[-1], err
        assert lines[-1].startswith("scratchformer") and message in lines[-1], err
    else:
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
        assert "None" not in lines[0] and "; --debug" not in lines[0], err
    assert unchanged  # no input file changed, none added, nothing written into the working folder


@pytest.mark.parametrize("name", ["unknown-flag", "ckpt-flipped", "recipe-model-typo", "resume-pickle"])
def test_a_forked_case_is_what_python_m_scratchformer_prints(world: Path, tmp_path: Path, name: str) -> None:
    """forked.run_cli is ``python -m scratchformer`` without the import time: the same exit status,
    stdout and stderr, for a usage error, a damaged checkpoint, a bad recipe and a damaged run."""
    (argv,) = [argv for case, argv, *_ in CASES if case == name]
    argv = [a.replace("{w}", str(world)).replace("{o}", str(tmp_path / "out")) for a in argv]
    env = {k: v for k, v in os.environ.items() if k != "SCRATCHFORMER_DEBUG"}
    real = subprocess.run(
        [sys.executable, "-m", "scratchformer", *argv],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    forked = run_cli(argv, cwd=tmp_path, env=env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert real.returncode == 2 and real.stderr


def test_a_byte_order_mark_is_no_part_of_the_first_text(world: Path, tmp_path: Path) -> None:
    """A UTF-8 BOM before stdin's first line (or a file's) is dropped: classify (TSV and JSON),
    translate and embed answer and echo "a fine film", not "\\ufeffa fine film"."""
    from concurrent.futures import ThreadPoolExecutor

    bom = "\ufeff".encode()
    translator = str(FIXTURES / "translation")
    runs = {  # name: (argv, stdin)
        "classify": (["classify", "--checkpoint", str(world / "ckpt")], bom + b"a fine film\nbad\n"),
        "classify-json": (
            ["classify", "--checkpoint", str(world / "ckpt"), "--json"],
            bom + b"a fine film\n",
        ),
        "embed-json": (["embed", "--model", str(world / "hf_bert"), "--json"], bom + b"a fine film\n"),
        "translate-json": (["translate", "--checkpoint", translator, "--json"], bom + b"ein Hund\n"),
    }
    for name, text in {"source.txt": "ein Hund\n", "reference.txt": "a dog\n"}.items():
        (tmp_path / name).write_text(text)
        (tmp_path / f"bom_{name}").write_bytes(bom + text.encode())
    for prefix in ("", "bom_"):  # a file given by path: the same hypotheses with the mark as without
        runs[f"evaluate-{prefix}file"] = (
            ["evaluate", "--checkpoint", translator, "--json", "--output", str(tmp_path / f"{prefix}hyp.txt")]
            + ["--source", str(tmp_path / f"{prefix}source.txt")]
            + ["--reference", str(tmp_path / f"{prefix}reference.txt")],
            b"",
        )

    def run(argv: list[str], stdin: bytes) -> subprocess.CompletedProcess:
        return run_cli(argv, input=stdin)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        done = {name: pool.submit(run, *case) for name, case in runs.items()}
        done = {name: future.result() for name, future in done.items()}
    for name, process in done.items():
        assert process.returncode == 0, (name, process.stderr)
        assert "\ufeff" not in process.stdout, name
    out = {name: process.stdout.splitlines() for name, process in done.items()}
    assert out["classify"][0].split("\t")[2] == "a fine film" and out["classify"][1].endswith("\tbad")
    assert json.loads(out["classify-json"][0])["text"] == "a fine film"
    assert json.loads(out["embed-json"][0])["text"] == "a fine film"
    assert json.loads(out["translate-json"][0])["source"] == "ein Hund"
    assert json.loads(out["evaluate-file"][0]) == json.loads(out["evaluate-bom_file"][0])
    assert (tmp_path / "hyp.txt").read_text() == (tmp_path / "bom_hyp.txt").read_text()
