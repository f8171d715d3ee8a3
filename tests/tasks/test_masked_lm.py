"""Masked-language-model pretraining: BERT's corruption measured over many batches, the tied head,
memorising a tiny corpus, exact resumption, and the exported checkpoint read by our classifier and
sentence encoder and by ``transformers.BertForMaskedLM`` (logits equal)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from scratchformer.cli import main
from scratchformer.data.labelled_texts import load_texts
from scratchformer.data.masking import IGNORE, continuation_table, mask_tokens
from scratchformer.data.tokenization import train_wordpiece
from scratchformer.fast import optimize
from scratchformer.formats.hf_bert import load_bert_encoder, masked_lm_export
from scratchformer.formats.hf_classifier import classifier_from_pretrained
from scratchformer.models.contextual import EncoderConfig
from scratchformer.models.masked_lm import MaskedLanguageModel
from scratchformer.tasks.classification import ClassifierRecipe
from scratchformer.tasks.masked_lm import MaskedLMTask, MLMRecipe, Sequences, load_masked_lm, pretrain_mlm
from scratchformer.tasks.sentence_embedding import SentenceEncoder
from scratchformer.training import Trainer
from scratchformer.training.checkpoint import load_training_state

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PAD, CLS, SEP, MASK = 0, 2, 3, 4
SPECIAL = {PAD, 1, CLS, SEP, MASK}


def special_batch(
    generator: torch.Generator, batch: int = 64, length: int = 60
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, L) of [CLS] tokens [SEP] [PAD]..., and the maskable positions (the tokens)."""
    lengths = torch.randint(3, length + 1, (batch,), generator=generator)
    ids = torch.randint(5, 500, (batch, length), generator=generator)
    position = torch.arange(length)
    ids[:, 0] = CLS
    ids[position >= lengths[:, None]] = PAD
    ids[torch.arange(batch), lengths - 1] = SEP
    maskable = (position > 0) & (position < (lengths - 1)[:, None])
    return ids, maskable


def test_masking_statistics_are_berts_over_many_batches() -> None:
    g = torch.Generator().manual_seed(0)
    replacements = torch.arange(5, 500)
    chosen = masked = randomised = kept = maskable_total = 0
    for _ in range(60):
        ids, maskable = special_batch(g)
        inputs, targets = mask_tokens(ids, maskable, MASK, replacements, g)
        picked = targets != IGNORE
        assert not (picked & ~maskable).any()  # never [CLS], [SEP] or padding
        assert torch.equal(targets[picked], ids[picked])  # the target is the original token
        assert torch.equal(inputs[~picked], ids[~picked])  # nothing else changes
        assert set(inputs[picked & (inputs != MASK)].tolist()).isdisjoint(
            {PAD, CLS, SEP}
        )  # no special as a random token
        maskable_total += int(maskable.sum())
        chosen += int(picked.sum())
        masked += int((inputs[picked] == MASK).sum())
        same = inputs[picked] == ids[picked]
        kept += int(same.sum())
        randomised += int((~same & (inputs[picked] != MASK)).sum())
    assert chosen / maskable_total == pytest.approx(0.15, abs=0.004)
    # a random replacement equals the original 1 time in 495: counted as kept, hence the tolerance
    assert masked / chosen == pytest.approx(0.8, abs=0.01)
    assert randomised / chosen == pytest.approx(0.1, abs=0.01)
    assert kept / chosen == pytest.approx(0.1, abs=0.01)


def test_masking_is_fixed_by_the_seed_and_whole_words_are_chosen_whole() -> None:
    g = torch.Generator().manual_seed(1)
    ids, maskable = special_batch(g, batch=200)
    replacements = torch.arange(5, 500)
    first = mask_tokens(ids, maskable, MASK, replacements, torch.Generator().manual_seed(7))
    second = mask_tokens(ids, maskable, MASK, replacements, torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(first, second))

    continuation = (torch.rand(ids.shape, generator=g) < 0.5) & maskable
    continuation[:, 1] = False  # every sequence starts a word
    _, targets = mask_tokens(ids, maskable, MASK, replacements, g, continuation=continuation)
    picked = targets != IGNORE
    words = starts = 0
    for row in range(ids.shape[0]):
        for j in range(2, ids.shape[1]):
            if continuation[row, j]:
                assert picked[row, j] == picked[row, j - 1], "a word was split"
        words += int((maskable[row] & ~continuation[row]).sum())
        starts += int((picked[row] & ~continuation[row]).sum())
    assert starts / words == pytest.approx(0.15, abs=0.02)  # the rate is per word


def test_continuation_table_marks_wordpiece_suffixes() -> None:
    table = continuation_table({"[PAD]": 0, "play": 1, "##ing": 2, "##": 3, "#": 4})
    assert table.tolist() == [False, False, True, False, False]


def test_the_task_never_targets_special_tokens_even_spelled_in_the_text() -> None:
    texts = ["a good film [SEP] a bad film", "the [MASK] end", "plain words only"] * 20
    tokenizer = train_wordpiece(texts, 60)
    recipe = MLMRecipe(train_files=["unused.txt"], max_length=8, max_tokens=64, mask_rate=0.5)
    sequences = Sequences(
        tokenizer, texts, recipe.max_length
    )  # texts longer than 8 tokens: several sequences
    assert max(sequences.lengths) == 8 and len(sequences) > len(texts)
    config = EncoderConfig(**recipe.model_fields(), vocab_size=tokenizer.get_vocab_size(), pad_id=0)
    task = MaskedLMTask(tokenizer, sequences, sequences, config, recipe)
    special = [tokenizer.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    assert set(task.replacements.tolist()).isdisjoint(special)
    chosen = 0
    for seed, index in task.batches(epoch=0, seed=3):
        ids, _, _ = sequences.batch(index, task.pad_id)
        inputs, _, targets = task._corrupt(sequences, index, seed, torch.device("cpu"))
        picked = targets != IGNORE
        assert not torch.isin(ids[picked], torch.tensor(special)).any()  # literal [SEP]/[MASK] in a text too
        replaced = picked & (inputs != ids) & (inputs != task.mask_id)
        assert not torch.isin(inputs[replaced], torch.tensor(special)).any()
        chosen += int(picked.sum())
    assert chosen > 0


def bert_like(**overrides) -> EncoderConfig:
    fields = dict(
        vocab_size=50,
        d_model=16,
        num_heads=2,
        num_layers=2,
        d_ff=32,
        max_len=24,
        dropout=0.0,
        activation="gelu",
        norm_first=False,
        embedding_norm=True,
        scale_embedding=False,
        pad_id=0,
    )
    return EncoderConfig(**{**fields, **overrides})


def test_the_head_is_tied_to_the_token_embedding() -> None:
    model = MaskedLanguageModel(bert_like())
    assert model.head.embedding is model.encoder.embeddings.token.weight
    d, v = 16, 50
    assert (
        model.num_parameters() == model.encoder.num_parameters() + (d * d + d) + 2 * d + v
    )  # no second V x D
    tokens = torch.randint(1, 50, (2, 7))
    model(tokens, positions=torch.ones(2, 7, dtype=torch.bool)).sum().backward()
    assert model.encoder.embeddings.token.weight.grad.abs().sum() > 0
    logits = model(tokens)  # (B, L, V): the head is h E^T + b
    hidden = model.head.norm(torch.nn.functional.gelu(model.head.dense(model.encoder(tokens))))
    torch.testing.assert_close(logits, hidden @ model.encoder.embeddings.token.weight.T + model.head.bias)


def memorise_corpus(path: Path, sentences: int = 10) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    lines = [" ".join(rng.sample(words, 12)) for _ in range(sentences)]
    path.write_text("\n".join(lines[i % sentences] for i in range(400)) + "\n")
    return path


def tiny_recipe(tmp_path: Path, **train) -> MLMRecipe:
    return MLMRecipe(
        train_files=[str(memorise_corpus(tmp_path / "corpus.txt"))],
        valid_size=20,
        vocab_size=100,
        max_length=32,
        max_tokens=1024,
        model={"d_model": 64, "num_heads": 2, "num_layers": 2, "d_ff": 128},
        train={
            "out_dir": str(tmp_path / "run"),
            "max_steps": 300,
            "lr": 3e-3,
            "warmup_steps": 30,
            "eval_every": 100,
            "log_every": 10,
            "progress": False,
            **train,
        },
    )


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("mlm")
    report = pretrain_mlm(tiny_recipe(tmp), resume=False)
    return tmp, report


def test_a_tiny_corpus_is_memorised_in_seconds(pretrained) -> None:
    tmp, report = pretrained
    assert report["best_valid"]["accuracy"] > 0.95
    assert report["best_valid"]["perplexity"] < 1.5
    evals = [
        json.loads(line)
        for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()
        if "eval/loss" in line
    ]
    assert evals[0]["eval/loss"] > 2 * evals[-1]["eval/loss"]


def test_the_exported_encoder_loads_into_the_classifier_and_the_sentence_encoder(pretrained) -> None:
    tmp, report = pretrained
    export = Path(report["export"])
    model, tokenizer, _ = load_masked_lm(tmp / "run" / "best")
    assert model.head.embedding is model.encoder.embeddings.token.weight  # tied after loading
    assert optimize(model).head.embedding is model.encoder.embeddings.token.weight  # and on the fast path
    tokens = torch.tensor([tokenizer.encode("w1 w2 w3 w4").ids])
    expected = model.encoder(tokens)

    classifier = classifier_from_pretrained(export, num_classes=3, dropout=0.2).eval()
    assert classifier.config.encoder.dropout == 0.2 and classifier.config.encoder.num_layers == 2
    torch.testing.assert_close(classifier.encoder(tokens), expected, atol=1e-5, rtol=1e-5)

    sentences = SentenceEncoder.from_pretrained(export)
    vector = sentences.encode(["w1 w2 w3 w4"])
    # a plain BERT directory (no modules.json): mean pooling, not normalised, as sentence-transformers
    # reads it
    torch.testing.assert_close(vector, expected.mean(dim=1), atol=1e-5, rtol=1e-5)

    recipe = ClassifierRecipe(train_file="unused.jsonl", pretrained=str(export), model={"dropout": 0.1})
    assert recipe.model == {"dropout": 0.1}
    with pytest.raises(ValueError, match=r"\['d_model'\] cannot change a pretrained encoder"):
        ClassifierRecipe(train_file="unused.jsonl", pretrained=str(export), model={"d_model": 8})


@pytest.mark.parametrize("positional, scale", [("learned", False), ("sinusoidal", True)])
def test_bert_for_masked_lm_reproduces_our_logits(tmp_path: Path, positional: str, scale: bool) -> None:
    transformers = pytest.importorskip("transformers")
    from scratchformer.formats.hf_files import write_export

    torch.manual_seed(0)
    model = MaskedLanguageModel(
        bert_like(positional=positional, scale_embedding=scale, type_vocab_size=0)
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(
                    0.1 * torch.randn_like(p)
                )  # LayerNorm gains/biases away from 1/0: a misplaced one shows
    write_export(tmp_path / "hf", *masked_lm_export(model))
    ref = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(1, 50, (3, 11))
    tokens[1, 7:] = 0
    real = tokens != 0
    with torch.no_grad():
        theirs = ref(input_ids=tokens, attention_mask=real.long()).logits
        ours = model(tokens, real)
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)
    assert (
        ref.cls.predictions.decoder.weight.data_ptr() == ref.bert.embeddings.word_embeddings.weight.data_ptr()
    )
    torch.testing.assert_close(
        load_bert_encoder(tmp_path / "hf")(tokens, real)[real],
        model.encoder(tokens, real)[real],
        atol=1e-5,
        rtol=1e-5,
    )


def test_resume_of_mlm_training_is_exact(tmp_path: Path, monkeypatch) -> None:
    vocabulary = (
        tmp_path / "tokenizer.json"
    )  # one WordPiece for both runs (its training is not deterministic)
    train_wordpiece(load_texts(memorise_corpus(tmp_path / "corpus.txt")), 100).save(str(vocabulary))
    full = tiny_recipe(tmp_path / "full", max_steps=20, eval_every=10)
    full.tokenizer = str(vocabulary)
    pretrain_mlm(full)

    class Stop(Exception):
        pass

    half = tiny_recipe(tmp_path / "half", max_steps=20, eval_every=10, save_every=10)
    half.tokenizer = str(vocabulary)
    fit = Trainer.fit

    def stop_after_10(self, resume=False, on_step=None):
        def on(step, loss):
            if step == 10:
                raise Stop

        return fit(self, resume, on)

    monkeypatch.setattr(Trainer, "fit", stop_after_10)
    with pytest.raises(Stop):
        pretrain_mlm(half)
    monkeypatch.undo()
    assert load_training_state(tmp_path / "half" / "run" / "last")["step"] == 10
    pretrain_mlm(half, resume=True)

    def losses(run: Path) -> list[float]:
        return [
            json.loads(line)["loss"]
            for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line
        ]

    assert losses(tmp_path / "half" / "run") == losses(tmp_path / "full" / "run")  # bit for bit
    a, _, _ = load_masked_lm(tmp_path / "full" / "run" / "last")
    b, _, _ = load_masked_lm(tmp_path / "half" / "run" / "last")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_bad_recipes_fail_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="norm_first=True"):
        MLMRecipe(train_files=["x.txt"], model={"norm_first": True})
    with pytest.raises(ValueError, match="mask_fraction"):
        MLMRecipe(train_files=["x.txt"], mask_fraction=0.95, random_fraction=0.1)
    with pytest.raises(ValueError, match="train_files"):
        MLMRecipe(train_files=[])
    with pytest.raises(ValueError, match="max_tokens"):
        MLMRecipe(train_files=["x.txt"], max_length=512, max_tokens=100)
    config = tmp_path / "r.json"
    config.write_text(
        json.dumps(
            {"train_files": [str(tmp_path / "missing.txt")], "train": {"out_dir": str(tmp_path / "o")}}
        )
    )
    assert main(["train", "mlm", "--config", str(config)]) == 2  # one line, no traceback


def test_the_cli_pretrains_and_exports(tmp_path: Path, capsys) -> None:
    recipe = tiny_recipe(tmp_path, max_steps=5, eval_every=0)
    config = tmp_path / "r.json"
    config.write_text(
        json.dumps(
            {
                **{k: v for k, v in recipe.to_dict().items() if k != "train"},
                "train": {"out_dir": str(tmp_path / "run"), "max_steps": 5, "progress": False},
            }
        )
    )
    assert main(["train", "mlm", "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["best_valid"]["step"] == 5 and Path(report["export"], "model.safetensors").is_file()
    assert (
        main(["export", "--checkpoint", str(tmp_path / "run" / "best"), "--out", str(tmp_path / "hf")]) == 0
    )
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_load_texts_reads_jsonl_csv_and_plain_text(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n\n{"text": "  "}\n{"text": "two"}\n')
    (tmp_path / "b.csv").write_text("review,x\nthree,1\nfour,2\n")
    (tmp_path / "c.txt").write_text("five\n\nsix\n")
    assert load_texts(tmp_path / "a.jsonl") == ["one", "two"]
    assert load_texts(tmp_path / "b.csv", "review") == ["three", "four"]
    assert load_texts(tmp_path / "c.txt") == ["five", "six"]
    (tmp_path / "d.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:1: no string field 'text'"):
        load_texts(tmp_path / "d.jsonl")
