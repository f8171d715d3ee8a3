"""A classifier export that is what it claims: pooling "pooler" is ``BertForSequenceClassification``,
proven against transformers (the model, AutoTokenizer and the text-classification pipeline) on a
tiny model built here; other poolings are refused; and our commands read our exports (0.8.0's too,
any BertForSequenceClassification, the encoder of a masked-LM or classifier export, our Marian
export), while an ONNX or CTranslate2 folder is named with the engine that runs it."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

transformers = pytest.importorskip("transformers")

from scratchformer.cli import main  # noqa: E402
from scratchformer.data.tokenization import TextTokenizer, save_hf_tokenizer, train_wordpiece  # noqa: E402
from scratchformer.formats.hf_bert import bert_export  # noqa: E402
from scratchformer.formats.hf_classifier import classifier_from_pretrained  # noqa: E402
from scratchformer.formats.hf_files import CheckpointError, write_export  # noqa: E402
from scratchformer.models.classifier import ClassifierConfig, TextClassifier  # noqa: E402
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig  # noqa: E402
from scratchformer.tasks.classification import LoadedClassifier, load_classifier  # noqa: E402
from scratchformer.training.checkpoint import save_checkpoint  # noqa: E402

LABELS = ["negative", "neutral", "positive"]
WORDS = (
    "the a film movie plot acting actor scene story was is were superb dull wonderful boring great "
    "awful and but it i loved hated two hours never get back of this that music ending".split()
)
TEXTS = [
    "A wonderful film, the acting was superb.",
    "Two hours I will never get back.",
    "Dull.",
    "The plot was great but the ending was awful, and the music of this movie was boring; "
    "I loved the actor and hated the story, two hours of scenes that were never superb.",  # > max_length
    "the story was superb and the acting great",
    "Ünïcödé 🙂 film",
]
MAX_LENGTH = 20


def corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "." for _ in range(n)]


def tiny_classifier(pooling: str = "pooler", truncation: str = "head", seed: int = 5) -> LoadedClassifier:
    """Post-LN with the paper's sinusoidal positions and sqrt(D) scale (exported as BERT by exact
    rewrites), no token types; random weights with noisy biases and LayerNorms (transformers
    initialises them to 0 and 1, where a wrong mapping would go unseen), in eval mode."""
    tokenizer = TextTokenizer(
        train_wordpiece(corpus(300, 1), vocab_size=150), MAX_LENGTH, truncation=truncation, head_length=8
    )
    encoder = EncoderConfig(
        tokenizer.vocab_size, d_model=32, num_heads=4, num_layers=2, d_ff=64, norm_first=False,
        positional="sinusoidal", scale_embedding=True, embedding_norm=True, pad_id=tokenizer.pad_id,
        max_len=32, dropout=0.1,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = TextClassifier(ClassifierConfig(encoder, len(LABELS), pooling, head_dropout=0.1))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator) if p.dim() == 1 else 0.0)
        model.head.weight.mul_(8.0)  # probabilities that differ from text to text
    return LoadedClassifier(model.eval(), tokenizer, list(LABELS), torch.device("cpu"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[LoadedClassifier, Path, Path]:
    """(the classifier, its export, the same model as our checkpoint)."""
    tmp = tmp_path_factory.mktemp("clf")
    classifier = tiny_classifier()
    config = {
        "kind": "text_classifier",
        "model": classifier.model.config.to_dict(),
        "labels": classifier.label_names,
        "tokenizer": classifier.tokenizer.settings(),
    }
    checkpoint = save_checkpoint(
        tmp / "ckpt",
        classifier.model,
        config,
        extra_files=lambda d: classifier.tokenizer.save(d / "tokenizer.json"),
    )
    return classifier, classifier.save_pretrained(tmp / "hf"), checkpoint


def transformers_probabilities(hf_model, directory: Path, texts: list[str]) -> torch.Tensor:
    """softmax(logits) of transformers' model on AutoTokenizer's padded, truncated batch."""
    batch = transformers.AutoTokenizer.from_pretrained(directory)(
        texts, padding=True, truncation=True, return_tensors="pt"
    )
    with torch.no_grad():
        return torch.softmax(hf_model(**batch).logits, dim=-1)


def parity_gap(classifier: LoadedClassifier, directory: Path, hf_model=None) -> float:
    """The largest difference between our probabilities and AutoModelForSequenceClassification's."""
    hf_model = hf_model or transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    theirs = transformers_probabilities(hf_model, directory, TEXTS)
    return float((classifier.probabilities(TEXTS) - theirs).abs().max())


def test_auto_model_for_sequence_classification_gives_our_probabilities(exported) -> None:
    classifier, directory, _ = exported
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["problem_type"] == "single_label_classification"
    assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert not (directory / "classifier_head.safetensors").exists()  # the head is the model's own
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    assert type(hf).__name__ == "BertForSequenceClassification"
    assert hf.config.id2label == dict(enumerate(LABELS))
    batch = transformers.AutoTokenizer.from_pretrained(directory)(TEXTS, truncation=True)
    assert batch.input_ids == classifier.tokenizer.encode(TEXTS)  # the long text cut as ours cuts it
    assert max(classifier.tokenizer.full_lengths(TEXTS)) > MAX_LENGTH  # so truncation was exercised
    probabilities = classifier.probabilities(TEXTS)
    assert float(probabilities.max(-1).values.min()) < 0.9 and len(set(probabilities.argmax(-1).tolist())) > 1
    assert parity_gap(classifier, directory, hf) < 1e-5


def test_the_text_classification_pipeline_shows_our_labels_and_probabilities(exported) -> None:
    classifier, directory, _ = exported
    pipe = transformers.pipeline(
        "text-classification", model=str(directory), tokenizer=str(directory), top_k=None
    )
    ours = classifier.probabilities(TEXTS)
    for batch_size in (1, 4):  # 4: padded batches
        answers = pipe(TEXTS, truncation=True, batch_size=batch_size)
        for row, answer in zip(ours, answers):
            assert {a["label"] for a in answer} == set(LABELS)
            scores = torch.tensor([next(a["score"] for a in answer if a["label"] == name) for name in LABELS])
            assert float((scores - row).abs().max()) < 1e-5


def test_the_parity_check_fails_on_a_wrong_export(exported, monkeypatch) -> None:
    """The comparison above can fail: a perturbed class bias, or the pooler without its tanh."""
    classifier, directory, _ = exported
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    with torch.no_grad():
        hf.classifier.bias[0] += 0.5
    assert parity_gap(classifier, directory, hf) > 1e-3
    monkeypatch.setattr(ContextualEncoder, "pool", lambda self, hidden: self.pooler(hidden[:, 0]))
    assert parity_gap(classifier, directory) > 1e-3


def test_classify_and_evaluate_print_the_same_on_the_export_as_on_the_checkpoint(
    exported, tmp_path: Path, capsys
) -> None:
    classifier, directory, checkpoint = exported
    outputs = []
    for source in (checkpoint, directory):
        assert main(["classify", "--checkpoint", str(source), "--json", *TEXTS]) == 0
        outputs.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    assert [(o["label"], o.get("truncated")) for o in outputs[0]] == [
        (o["label"], o.get("truncated")) for o in outputs[1]
    ]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(*outputs)) < 1e-5
    assert [o["label"] for o in outputs[1]] == [label for label, _ in classifier.predict(TEXTS)]
    data = tmp_path / "test.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t, "label": LABELS[i % 3]}) + "\n" for i, t in enumerate(TEXTS))
    )
    reports = []
    for source in (checkpoint, directory):
        assert main(["evaluate", "--checkpoint", str(source), "--data", str(data), "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0] == reports[1]


def test_poolings_transformers_has_no_class_for_are_refused(tmp_path: Path) -> None:
    for pooling in ("mean", "cls"):
        with pytest.raises(ValueError) as error:
            tiny_classifier(pooling).save_pretrained(tmp_path / pooling)
        message = str(error.value)
        assert (
            f"a classifier with {pooling} pooling has no Hugging Face sequence-classification class"
            in message
        )
        assert "BertForSequenceClassification classifies tanh(pooler([CLS]))" in message
        assert message.endswith("export it with --format onnx") and "\n" not in message
        assert not (tmp_path / pooling).exists()


def test_head_tail_truncation_is_refused_unless_the_export_cuts_the_head(tmp_path: Path) -> None:
    classifier = tiny_classifier(truncation="head_tail")
    with pytest.raises(
        ValueError, match=r"truncation 'head_tail' \(a long text's first 8 and last 12 tokens\)"
    ):
        classifier.save_pretrained(tmp_path / "x")
    directory = classifier.save_pretrained(tmp_path / "head", truncation="head")
    again = load_classifier(directory, device="cpu")
    assert again.tokenizer.truncation == "head" and classifier.tokenizer.truncation == "head_tail"
    assert parity_gap(again, directory) < 1e-5


def write_0_8_0_export(classifier: LoadedClassifier, directory: Path) -> Path:
    """A classifier export as 0.8.0 wrote it: BertModel + classifier_head.safetensors."""
    hf_config, state = bert_export(classifier.model.encoder)
    hf_config["scratchformer_pooling"] = classifier.model.config.pooling
    hf_config["scratchformer_classifier"] = {
        "labels": classifier.label_names,
        "head": "classifier_head.safetensors",
        "head_dropout": 0.0,
        "tokenizer": classifier.tokenizer.settings(),
    }
    head = {k: v.detach().contiguous() for k, v in classifier.model.head.state_dict().items()}

    def files(tmp: Path) -> None:
        save_file(head, str(tmp / "classifier_head.safetensors"))
        save_hf_tokenizer(classifier.tokenizer.tokenizer, tmp, max_length=classifier.tokenizer.max_length)

    return write_export(directory, hf_config, state, files)


def test_exports_of_0_8_0_are_still_read(tmp_path: Path, capsys) -> None:
    classifier = tiny_classifier("mean")
    directory = write_0_8_0_export(classifier, tmp_path / "old")
    again = load_classifier(directory, device="cpu")
    assert again.label_names == LABELS and again.model.config.pooling == "mean"
    assert float((again.probabilities(TEXTS) - classifier.probabilities(TEXTS)).abs().max()) < 1e-5
    assert main(["classify", "--checkpoint", str(directory), TEXTS[0]]) == 0
    assert capsys.readouterr().out.split("\t")[0] == classifier.predict(TEXTS[:1])[0][0]
    (directory / "classifier_head.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="the class head of a classifier export not found"):
        load_classifier(directory)


def hugging_face_classifier(directory: Path, tokenizer: TextTokenizer, **config) -> Path:
    """A BertForSequenceClassification made by transformers (random: its own init), our tokenizer files."""
    hf_config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, **config,
    )  # fmt: skip
    torch.manual_seed(1)
    model = transformers.BertForSequenceClassification(hf_config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(20.0)
        model.classifier.bias.normal_()
    model.save_pretrained(directory)
    save_hf_tokenizer(tokenizer.tokenizer, directory, max_length=MAX_LENGTH)
    return directory


def test_any_bert_for_sequence_classification_is_read(tmp_path: Path, capsys) -> None:
    tokenizer = tiny_classifier().tokenizer
    labels = {"0": "sad", "1": "happy"}
    directory = hugging_face_classifier(
        tmp_path / "hf", tokenizer, id2label=labels, label2id={"sad": 0, "happy": 1}
    )
    ours = load_classifier(directory, device="cpu")
    assert ours.label_names == ["sad", "happy"] and ours.tokenizer.max_length == MAX_LENGTH
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    theirs = transformers_probabilities(hf, directory, TEXTS)
    assert float((ours.probabilities(TEXTS) - theirs).abs().max()) < 1e-5
    assert main(["classify", "--checkpoint", str(directory), "--json", TEXTS[0]]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in ("sad", "happy")
    unnamed = hugging_face_classifier(tmp_path / "unnamed", tokenizer, num_labels=3)
    assert load_classifier(unnamed, device="cpu").label_names == ["LABEL_0", "LABEL_1", "LABEL_2"]


def test_classifiers_we_cannot_read_are_named(tmp_path: Path) -> None:
    tokenizer = tiny_classifier().tokenizer
    multi = hugging_face_classifier(tmp_path / "multi", tokenizer, problem_type="multi_label_classification")
    with pytest.raises(CheckpointError, match="problem_type 'multi_label_classification' is not supported"):
        load_classifier(multi)
    config = json.loads((multi / "config.json").read_text())
    (multi / "config.json").write_text(
        json.dumps(config | {"architectures": ["RobertaForSequenceClassification"]})
    )
    with pytest.raises(
        CheckpointError, match=r"\['RobertaForSequenceClassification'\]: only BertForSequence"
    ):
        load_classifier(multi)
    headless = hugging_face_classifier(tmp_path / "headless", tokenizer)
    state = load_file(str(headless / "model.safetensors"))
    save_file(
        {k: v for k, v in state.items() if not k.startswith("classifier.")},
        str(headless / "model.safetensors"),
    )
    with pytest.raises(CheckpointError, match=r"lacks the class head \(classifier.weight, classifier.bias\)"):
        load_classifier(headless)


def test_pooler_training_from_a_pretrained_encoder(tmp_path: Path) -> None:
    """Pooling "pooler" on a BERT checkpoint takes its pooler; on one without (add_pooling_layer=False)
    a new pooler is made, as BertForSequenceClassification.from_pretrained makes one."""
    tokenizer = tiny_classifier().tokenizer
    directory = hugging_face_classifier(tmp_path / "bert", tokenizer)
    pooler = load_file(str(directory / "model.safetensors"))["bert.pooler.dense.weight"]
    model = classifier_from_pretrained(directory, num_classes=2, pooling="pooler")
    assert torch.equal(model.encoder.pooler.weight, pooler) and model.config.encoder.pooler
    transformers.BertModel(
        transformers.BertConfig.from_pretrained(directory), add_pooling_layer=False
    ).save_pretrained(tmp_path / "no_pooler")
    fresh = classifier_from_pretrained(tmp_path / "no_pooler", num_classes=2, pooling="pooler")
    assert fresh.encoder.pooler is not None and fresh.config.encoder.pooler


def test_embed_reads_our_masked_lm_and_classifier_exports(exported, tmp_path: Path, capsys) -> None:
    """Mean pooling, not normalised (a plain BERT directory, as sentence-transformers reads it), of
    the encoder transformers' BertModel loads from each export."""
    from scratchformer.formats.hf_bert import masked_lm_export
    from scratchformer.models.masked_lm import MaskedLanguageModel

    classifier, directory, _ = exported
    torch.manual_seed(4)
    mlm = MaskedLanguageModel(classifier.model.config.encoder).eval()
    hf_config, state = masked_lm_export(mlm)
    tokenizer = classifier.tokenizer
    write_export(
        tmp_path / "mlm",
        hf_config,
        state,
        lambda tmp: save_hf_tokenizer(tokenizer.tokenizer, tmp, MAX_LENGTH),
    )
    texts = TEXTS[:3]
    for source in (directory, tmp_path / "mlm"):
        assert main(["embed", "--model", str(source), "--json", *texts]) == 0
        vectors = torch.tensor(
            [json.loads(line)["embedding"] for line in capsys.readouterr().out.splitlines()]
        )
        bert = transformers.AutoModel.from_pretrained(source).eval()
        batch = transformers.AutoTokenizer.from_pretrained(source)(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            states = bert(**batch).last_hidden_state
        mask = batch.attention_mask[..., None].float()
        assert float((vectors - (states * mask).sum(1) / mask.sum(1)).abs().max()) < 1e-5


def test_translate_reads_our_marian_export(tmp_path: Path, capsys) -> None:
    from scratchformer.core.transformer import Transformer, TransformerConfig
    from scratchformer.data.tokenization import train_bpe
    from scratchformer.tasks.translation import Translator, load_translator

    tokenizer = train_bpe(corpus(200, 2), vocab_size=300)
    vocab = tokenizer.get_vocab_size()
    config = TransformerConfig(
        vocab,
        vocab,
        d_model=32,
        num_heads=2,
        d_ff=64,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout=0.0,
    )
    torch.manual_seed(5)
    translator = Translator(
        Transformer(config),
        tokenizer,
        {"beam_size": 1, "max_len_a": 1.0, "max_len_b": 3},
        torch.device("cpu"),
    )
    directory = translator.save_pretrained(tmp_path / "marian")
    texts = ["the film was superb", "two hours of dull music"]
    argv = ["translate", "--checkpoint", str(directory), "--beam", "1", "--device", "cpu", "--json"]
    assert main([*argv, *texts[:1]]) == 0  # (the CPU's arithmetic: a GPU's may break a tie otherwise)
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["translation_text"] for line in lines] == translator.translate(
        texts[:1], beam_size=1
    )
    reloaded = load_translator(directory, device="cpu")
    assert reloaded.translate(texts, beam_size=1) == translator.translate(texts, beam_size=1)


def engine_folders(root: Path) -> dict[str, Path]:
    """What another engine's export looks like: CTranslate2 (model.bin, its config.json with no
    model_type) and ONNX (*.onnx beside a tokenizer.json)."""
    ct2, onnx = root / "ct2", root / "onnx"
    for folder in (ct2, onnx):
        folder.mkdir()
        (folder / "README.md").write_text("how to run it\n")
    (ct2 / "model.bin").write_bytes(b"\0" * 16)
    (ct2 / "config.json").write_text(json.dumps({"add_source_bos": False, "unk_token": "<unk>"}))
    (onnx / "model.onnx").write_bytes(b"\0" * 16)
    (onnx / "tokenizer.json").write_text("{}")
    return {"ct2": ct2, "onnx": onnx}


@pytest.mark.parametrize("command", ["classify", "evaluate", "translate", "embed", "export"])
def test_exports_for_other_engines_are_named_with_the_engine(command: str, tmp_path: Path, capsys) -> None:
    folders = engine_folders(tmp_path)
    for engine, words in (
        ("ct2", "is a CTranslate2 model (model.bin): run it with CTranslate2"),
        ("onnx", "is an ONNX export (model.onnx): run it with onnxruntime"),
    ):
        folder = str(folders[engine])
        argv = {
            "classify": ["classify", "--checkpoint", folder, "a text"],
            "evaluate": ["evaluate", "--checkpoint", folder, "--data", "x.jsonl"],
            "translate": ["translate", "--checkpoint", folder, "a text"],
            "embed": ["embed", "--model", folder, "a text"],
            "export": ["export", "--checkpoint", folder, "--out", str(tmp_path / "out")],
        }[command]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and "as its README.md shows" in err, err
