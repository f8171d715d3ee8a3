"""The command line's conventions: the exit-code table, ``--version``, exports that do not lie and
that the commands read back, and the messages that name what a directory holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scratchformer import __version__
from scratchformer.cli import EXIT_BAD_INPUT, EXIT_BUG, EXIT_INTERRUPTED, main, tools
from scratchformer.formats.hf_bert import bert_config, load_bert_encoder
from scratchformer.formats.hf_files import CheckpointError, write_export
from scratchformer.models.classifier import ClassifierConfig, TextClassifier
from scratchformer.models.contextual import EncoderConfig
from scratchformer.tasks.classification import LoadedClassifier, load_classifier
from scratchformer.tasks.shared.kinds import checkpoint_kind

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0.1.0"
TEXTS = ["the plot was superb", "a dull film", "superb acting but a dull and dull plot"]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- the exit-code table -----------------------------------------------------------------------


def _raising(error: BaseException):
    def command(args) -> int:
        raise error

    return command


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted"),
        (ValueError("bad value"), EXIT_BAD_INPUT, "error: bad value"),
        (TypeError("bad type"), EXIT_BAD_INPUT, "error: bad type"),
        (FileNotFoundError("no such file: x"), EXIT_BAD_INPUT, "error: no such file: x"),
        (SystemExit("error: give --config"), EXIT_BAD_INPUT, "error: give --config"),
        (  # an optional package missing is the machine's set-up, not a bug: what to install
            ImportError("captioning metrics need pycocoevalcap: pip install 'scratchformer[captioning]'"),
            EXIT_BAD_INPUT,
            "error: captioning metrics need pycocoevalcap: pip install 'scratchformer[captioning]'",
        ),
        (
            ZeroDivisionError("oops"),
            EXIT_BUG,
            "error: oops (ZeroDivisionError: a bug; --debug for the traceback)",
        ),
        (RuntimeError("deep"), EXIT_BUG, "error: deep (RuntimeError: a bug; --debug for the traceback)"),
    ],
)
def test_the_exit_code_table(monkeypatch, capsys, error: BaseException, code: int, line: str) -> None:
    """0 done, 2 bad input, 130 interrupted, 1 a bug: each one line on stderr."""
    monkeypatch.setattr(tools, "_shapes", _raising(error))
    monkeypatch.delenv("SCRATCHFORMER_DEBUG", raising=False)
    got, _, err = run(["shapes", "--count", "1"], capsys)
    assert (got, err) == (code, line + "\n")
    if not isinstance(error, SystemExit):
        with pytest.raises(type(error)):  # --debug: the exception itself, for the traceback
            main(["shapes", "--count", "1", "--debug"])


def test_usage_errors_exit_2_and_ok_exits_0(tmp_path: Path, capsys) -> None:
    assert run(["shapes", "--count", "0"], capsys)[0] == EXIT_BAD_INPUT
    assert run(["no-such-command"], capsys)[0] == EXIT_BAD_INPUT
    assert run(["shapes", "--count", "1", "--out", str(tmp_path / "s")], capsys)[0] == 0


def test_version(capsys) -> None:
    code, out, _ = run(["--version"], capsys)
    assert (code, out) == (0, f"scratchformer {__version__}\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--seed", "1e23"], "argument --seed: must be an integer, got '1e23'"),
        (["demo", "--seed", str(10**23)], "argument --seed: must be in [0, 2**63 - 1]"),
        (["demo", "--seed", "-1"], "argument --seed: must be in [0, 2**63 - 1]"),
        (["shapes", "--seed", str(2**63)], "argument --seed: must be in [0, 2**63 - 1]"),
        (
            ["translate", "--checkpoint", "x", "--sampling", "--seed", str(2**64)],
            "argument --seed: must be in",
        ),
        (["demo", "--threads", "-1"], "argument --threads: must be >= 0, got -1"),
    ],
)
def test_seeds_and_threads_are_checked_by_the_parser(argv: list[str], message: str, capsys) -> None:
    code, _, err = run(argv, capsys)
    assert code == EXIT_BAD_INPUT and message in err and "Overflow" not in err


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("nope", "--device 'nope': not a device (auto, cpu, cuda, cuda:N or mps)"),
        ("cuda:99", "--device 'cuda:99': "),
        ("meta", "--device 'meta': not supported"),
    ],
)
def test_a_device_the_machine_lacks_is_one_line(tmp_path: Path, device: str, message: str, capsys) -> None:
    code, _, err = run(["classify", "--checkpoint", str(tmp_path), "--device", device, "a text"], capsys)
    assert code == EXIT_BAD_INPUT and err.startswith("error: " + message) and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_refused(tmp_path: Path, capsys) -> None:
    code, _, err = run(["features", "--images", "x", "--out", "y", "--device", "cuda"], capsys)
    assert (code, err) == (
        2,
        "error: --device 'cuda': CUDA is not available on this machine (use cpu or auto)\n",
    )


def test_resume_with_overwrite_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    code, _, err = run(["train", "classifier", "--train", "missing.jsonl", "--resume", "--overwrite"], capsys)
    assert code == EXIT_BAD_INPUT and "--resume continues the run in OUT and --overwrite replaces it" in err


# ---- exports that do not lie, and that the commands read back ------------------------------------


def bert_like_classifier(pooling: str = "pooler") -> LoadedClassifier:
    """The fixture classifier's tokenizer on a random post-LN encoder (one BERT can express)."""
    fixture = load_classifier(FIXTURES / "text_classifier", device="cpu")
    encoder = EncoderConfig(
        fixture.tokenizer.vocab_size, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=24,
        norm_first=False, embedding_norm=True, positional="sinusoidal", pad_id=fixture.tokenizer.pad_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = TextClassifier(ClassifierConfig(encoder, num_classes=3, pooling=pooling, head_dropout=0.0)).eval()
    return LoadedClassifier(model, fixture.tokenizer, ["sad", "neutral", "happy"], torch.device("cpu"))


@pytest.fixture
def export(tmp_path: Path) -> tuple[LoadedClassifier, Path]:
    classifier = bert_like_classifier()
    return classifier, classifier.save_pretrained(tmp_path / "hf")


def test_an_export_is_a_sequence_classifier_with_our_labels(export) -> None:
    """BertForSequenceClassification, whose head is ours: id2label may name our labels."""
    _, directory = export
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "sad", "1": "neutral", "2": "happy"}
    assert config["scratchformer_classifier"]["labels"] == ["sad", "neutral", "happy"]
    assert not (directory / "classifier_head.safetensors").exists()


def test_a_transformers_pipeline_sees_our_labels(export) -> None:
    transformers = pytest.importorskip("transformers")
    classifier, directory = export
    pipe = transformers.pipeline("text-classification", model=str(directory), tokenizer=str(directory))
    assert [answer["label"] for answer in pipe(TEXTS)] == [label for label, _ in classifier.predict(TEXTS)]


def test_an_export_transformers_has_no_class_for_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="a classifier with mean pooling has no Hugging Face .*--format onnx"
    ):
        bert_like_classifier("mean").save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_load_classifier_and_classify_read_the_export(export, capsys) -> None:
    classifier, directory = export
    again = load_classifier(directory, device="cpu")
    assert again.label_names == classifier.label_names
    assert torch.allclose(again.probabilities(TEXTS), classifier.probabilities(TEXTS), atol=1e-5)
    code, out, err = run(["classify", "--checkpoint", str(directory), TEXTS[0]], capsys)
    assert (code, err) == (0, "") and out.split("\t")[0] == classifier.predict(TEXTS[:1])[0][0]
    assert checkpoint_kind(str(directory)) == "text_classifier"


def test_a_classifier_export_without_its_head_is_named(export) -> None:
    from safetensors.torch import load_file, save_file

    _, directory = export
    state = load_file(str(directory / "model.safetensors"))
    save_file(
        {k: v for k, v in state.items() if not k.startswith("classifier.")},
        str(directory / "model.safetensors"),
    )
    with pytest.raises(CheckpointError, match="lacks the class head"):
        load_classifier(directory)


def test_an_export_of_an_export_is_the_same_model(export, tmp_path: Path, capsys) -> None:
    classifier, directory = export
    assert run(["export", "--checkpoint", str(directory), "--out", str(tmp_path / "again")], capsys)[0] == 0
    again = load_classifier(tmp_path / "again", device="cpu")
    assert torch.allclose(again.probabilities(TEXTS), classifier.probabilities(TEXTS), atol=1e-5)


def plain_bert_export(tmp_path: Path) -> Path:
    """A Hugging Face BERT directory that is not a classifier (an encoder alone: BertModel, no labels)."""
    directory = bert_like_classifier().save_pretrained(tmp_path / "bert")
    config = json.loads((directory / "config.json").read_text())
    for key in ("scratchformer_classifier", "id2label", "label2id", "problem_type", "classifier_dropout"):
        del config[key]
    (directory / "config.json").write_text(json.dumps(config | {"architectures": ["BertModel"]}))
    return directory


@pytest.mark.parametrize(
    "command",
    [
        "classify",
        "evaluate",
        "export",
        "translate",
        "caption",
    ],
)
def test_commands_handed_a_hugging_face_directory_say_what_it_is(
    tmp_path: Path, command: str, capsys
) -> None:
    directory = plain_bert_export(tmp_path)
    argv = {
        "classify": ["classify", "--checkpoint", str(directory), "a text"],
        "evaluate": ["evaluate", "--checkpoint", str(directory), "--data", "x.jsonl"],
        "export": ["export", "--checkpoint", str(directory), "--out", str(tmp_path / "out")],
        "translate": ["translate", "--checkpoint", str(directory)],
        "caption": ["caption", "--checkpoint", str(directory), "x.png"],
    }[command]
    code, _, err = run(argv, capsys)
    assert code == EXIT_BAD_INPUT and err.count("\n") == 1
    assert "None" not in err, err
    assert (
        f"{directory} is a Hugging Face BERT export (config.json model_type 'bert'), not a scratchformer"
        in err
    )


def test_a_config_with_no_kind_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="config.json records no 'kind' .nor a Hugging Face 'model_type'."):
        checkpoint_kind(str(tmp_path))
    with pytest.raises(ValueError, match="records no 'kind'.*expected a scratchformer text_classifier"):
        load_classifier(tmp_path)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "config.json: no model_type .not a Hugging Face model directory."),
        (
            {"kind": "text_classifier"},
            "a scratchformer 'text_classifier' checkpoint's config .no model_type.",
        ),
        ({"model_type": "gpt2"}, "config.json: model_type 'gpt2'; expected a BERT-family model_type"),
    ],
)
def test_an_unsupported_model_type_names_what_was_found(config: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        bert_config(config)


def test_a_scratchformer_checkpoint_as_an_encoder_says_so() -> None:
    with pytest.raises(CheckpointError, match="'text_classifier' checkpoint's config .no model_type."):
        load_bert_encoder(FIXTURES / "text_classifier")


# ---- export cleanup ----------------------------------------------------------------------------


def test_the_temporaries_of_a_killed_export_are_removed_by_the_next(tmp_path: Path) -> None:
    left = tmp_path / ".hf.tmp-abc123"  # what write_export leaves when killed before its rename
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"half")
    other = tmp_path / ".other.tmp-xyz"  # another export's: not ours to remove
    other.mkdir()
    write_export(tmp_path / "hf", {"model_type": "bert"}, {"w": torch.zeros(2)})
    assert not left.exists() and other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-xyz", "hf"]
