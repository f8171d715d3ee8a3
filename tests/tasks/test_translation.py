"""Translation end to end on a tiny synthetic language pair built here; loaders, loss, CLI."""

from __future__ import annotations

import gzip
import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch

from scratchformer.cli import main
from scratchformer.data.parallel_texts import load_parallel_texts
from scratchformer.data.tokenization import train_bpe
from scratchformer.tasks.translation import (
    TranslationRecipe,
    Translator,
    bleu_and_chrf,
    label_smoothed_loss,
    load_translator,
    train_translation,
    translation_attention,
)
from scratchformer.training import TrainConfig

# A toy "German": every word maps to one English word, and the word order is kept.
LEXICON = {
    "ein": "a",
    "hund": "dog",
    "katze": "cat",
    "läuft": "runs",
    "schläft": "sleeps",
    "rot": "red",
    "blau": "blue",
    "groß": "big",
    "klein": "small",
    "mann": "man",
}


def toy_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        words = [
            "ein",
            rng.choice(["groß", "klein", "rot", "blau"]),
            rng.choice(["hund", "katze", "mann"]),
            rng.choice(["läuft", "schläft"]),
        ]
        src.append(" ".join(words).capitalize() + ".")
        tgt.append(" ".join(LEXICON[w] for w in words).capitalize() + ".")
    return src, tgt


def write(path: Path, lines: list[str]) -> str:
    with (
        gzip.open(path, "wt", encoding="utf-8") if path.suffix == ".gz" else open(path, "w", encoding="utf-8")
    ) as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def tiny_recipe(tmp_path: Path, **train) -> TranslationRecipe:
    paths = {}
    for split, n, seed in (("train", 400, 0), ("valid", 40, 1), ("test", 40, 2)):
        s, t = toy_pairs(n, seed)
        paths[split] = (write(tmp_path / f"{split}.de.gz", s), write(tmp_path / f"{split}.en", t))
    return TranslationRecipe(
        train_source=paths["train"][0],
        train_target=paths["train"][1],
        valid_source=paths["valid"][0],
        valid_target=paths["valid"][1],
        test_source=paths["test"][0],
        test_target=paths["test"][1],
        vocab_size=400,
        max_length=24,
        max_tokens=400,
        average_last=2,
        model={
            "d_model": 32,
            "num_heads": 2,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            "d_ff": 64,
            "dropout": 0.0,
            "norm_first": True,
            "share_embeddings": True,
            "tie_output": True,
            "max_len": 64,
        },
        decoding={"beam_size": 3, "length_penalty": 1.0, "max_len_a": 1.5, "max_len_b": 5},
        train=TrainConfig(
            **{
                "out_dir": str(tmp_path / "run"),
                "max_steps": 300,
                "lr": 1e-2,
                "warmup_steps": 20,
                "schedule": "inverse_sqrt",
                "eval_every": 50,
                "best_metric": "bleu",
                "best_mode": "max",
                "progress": False,
                "seed": 0,
                **train,
            }
        ),
    )


def test_tiny_translation_is_learned_and_decoded(tiny_translation) -> None:
    _, report, run = tiny_translation  # conftest.py: tiny_recipe trained once for the session
    assert report["test"]["bleu"] > 90.0, report
    assert report["test_checkpoint"] in ("best", "averaged")
    translator = load_translator(run / report["test_checkpoint"], device="cpu")
    assert translator.translate(["Ein rot hund läuft."]) == ["A red dog runs."]
    assert translator.translate(["Ein rot hund läuft."], beam_size=1) == ["A red dog runs."]
    assert len(list(run.glob("step-*"))) == 2  # kept for averaging


def test_cli_translate_evaluate_attention(tiny_translation, tmp_path: Path, capsys, monkeypatch) -> None:
    recipe, report, run = tiny_translation
    checkpoint = str(run / report["test_checkpoint"])
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", iter(["Ein klein katze schläft.\n", "Ein blau mann läuft.\n"]))
    assert main(["translate", "--checkpoint", checkpoint, "--beam", "3", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.splitlines() == ["A small cat sleeps.", "A blue man runs."]

    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                checkpoint,
                "--source",
                recipe.test_source,
                "--reference",
                recipe.test_target,
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    scores = json.loads(capsys.readouterr().out)
    assert scores["bleu"] > 90 and scores["chrf"] > 90 and scores["n"] == 40
    padded = tmp_path / "padded.de"  # spaces and \r around each line: read as the test set is read, stripped
    padded.write_text(
        "".join(
            f"  {line}\r\n" for line in load_parallel_texts(recipe.test_source, recipe.test_target).sources
        )
    )
    evaluate, seen = Translator.evaluate, []
    monkeypatch.setattr(
        Translator,
        "evaluate",
        lambda self, sources, *a, **k: seen.append(sources) or evaluate(self, sources, *a, **k),
    )
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                checkpoint,
                "--source",
                str(padded),
                "--reference",
                recipe.test_target,
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    assert seen == [load_parallel_texts(recipe.test_source, recipe.test_target).sources]
    assert json.loads(capsys.readouterr().out)["bleu"] == scores["bleu"]

    assert (
        main(["attention", "--checkpoint", checkpoint, "Ein rot hund läuft.", "--out", str(tmp_path / "att")])
        == 0
    )
    pngs = sorted(p.name for p in (tmp_path / "att").glob("*.png"))
    assert pngs == [
        "decoder-layer0-cross_attn.png",
        "decoder-layer0-self_attn.png",
        "encoder-layer0-self_attn.png",
    ]


def test_label_smoothed_loss_matches_the_formula() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=gen)
    target = torch.tensor([[3, 1, 0, 0], [5, 6, 2, 0]])  # 0 = pad
    eps, V = 0.1, 7
    logp = torch.log_softmax(logits, dim=-1)
    real = target != 0
    per_token = -(1 - eps) * logp.gather(-1, target[..., None]).squeeze(-1) - eps / V * logp.sum(-1)
    expected = per_token[real].mean()
    assert label_smoothed_loss(logits, target, eps, 0).item() == pytest.approx(expected.item(), rel=1e-6)
    # Padding positions change nothing.
    logits2 = logits.clone()
    logits2[~real] = 100.0
    assert label_smoothed_loss(logits2, target, eps, 0).item() == pytest.approx(expected.item(), rel=1e-6)


def test_bleu_is_sacrebleu() -> None:
    sacrebleu = pytest.importorskip("sacrebleu")
    hyps, refs = ["The cat sat on the mat.", "A dog runs."], ["The cat sat on a mat.", "A dog runs fast."]
    ours = bleu_and_chrf(hyps, refs)
    assert ours["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert ours["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert "13a" in ours["bleu_signature"] and "mixed" in ours["bleu_signature"]  # cased, 13a tokenisation


def test_parallel_loader_errors_and_filters(tmp_path: Path) -> None:
    src = write(tmp_path / "a.de", ["eins", "", "drei"])
    tgt = write(tmp_path / "a.en", ["one", "two", "three"])
    data = load_parallel_texts(src, tgt)
    assert (
        data.sources == ["eins", "drei"] and data.targets == ["one", "three"] and data.skipped == {"empty": 1}
    )
    short = write(tmp_path / "b.en", ["one", "two"])
    with pytest.raises(ValueError, match=r"differ in length: .*a.de has 3 lines, .*b.en has 2"):
        load_parallel_texts(src, short)


def test_bpe_round_trips_text() -> None:
    texts = ["Ein Mann fährt mit dem Fahrrad über eine Brücke.", "Zwei Hunde spielen im Schnee!"] * 20
    tokenizer = train_bpe(texts, vocab_size=200)
    for text in texts[:2] + ["Unbekannte Wörter: Straßenbahn, Ärger."]:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]


def test_special_tokens_written_in_a_text_are_text() -> None:
    """ "</s>" typed in a sentence must not end it (EOS), nor "<pad>" vanish as padding."""
    from scratchformer.tasks.translation import _encode

    tokenizer = train_bpe(["The tag ends a line and starts one."] * 20, vocab_size=200)
    text = "The tag </s> ends a line, <s> starts one, <pad> and <unk> too."
    ids = _encode(tokenizer, [text])[0]
    assert not {0, 1, 2, 3} & set(ids) and tokenizer.decode(ids) == text


def test_streamed_lines_are_stripped_as_training_reads_them() -> None:
    """Byte-level BPE sees a leading space or a \\r as input: read as load_parallel_texts reads files."""
    from scratchformer.tasks.translation import read_lines

    assert list(read_lines(iter([" Ein Hund.\r\n", "Zwei Katzen. \n", "Ein Mann."]), 2)) == [
        ["Ein Hund.", "Zwei Katzen."],
        ["Ein Mann."],
    ]


def test_committed_recipe_is_valid() -> None:
    recipe = TranslationRecipe.from_json(
        Path(__file__).resolve().parents[2] / "recipes" / "multi30k_de_en.json"
    )
    assert recipe.train.schedule == "inverse_sqrt" and recipe.label_smoothing == 0.1
    assert math.isclose(recipe.decoding["beam_size"], 5)


def test_decoding_is_chosen_on_the_validation_set(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, max_steps=60, eval_every=30)  # half-trained: the options score differently
    recipe.decoding_grid = {"beam_size": [1, 3], "length_penalty": [0.0, 2.0]}
    report = train_translation(recipe)
    search = report["decoding_search"]
    assert [(t["beam_size"], t["length_penalty"]) for t in search] == [(1, 0.0), (1, 2.0), (3, 0.0), (3, 2.0)]
    best = max(search, key=lambda t: t["bleu"])
    assert report["decoding"] == {
        **recipe.decoding,
        "beam_size": best["beam_size"],
        "length_penalty": best["length_penalty"],
    }
    translator = load_translator(tmp_path / "run" / report["test_checkpoint"], device="cpu")
    assert translator.decoding == report["decoding"]  # the checkpoint decodes with the winner
    valid = load_parallel_texts(recipe.valid_source, recipe.valid_target)
    assert translator.evaluate(valid.sources, valid.targets)["bleu"] == pytest.approx(
        best["bleu"]
    )  # recomputed independently
    test = load_parallel_texts(recipe.test_source, recipe.test_target)
    assert report["test"]["bleu"] == pytest.approx(translator.evaluate(test.sources, test.targets)["bleu"])


@pytest.mark.parametrize(
    "grid, message",
    [
        ([4], "decoding_grid: expected an object"),
        ({"beam_size": []}, "decoding_grid.beam_size: expected a non-empty list"),
        ({"beam_size": [0]}, "decoding.beam_size must be >= 1"),
        ({"beams": [2]}, "decoding: unknown key 'beams'"),
    ],
)
def test_bad_decoding_grid_is_refused(tmp_path: Path, grid, message) -> None:
    recipe = tiny_recipe(tmp_path)
    recipe.decoding_grid = grid
    with pytest.raises(ValueError, match=message):
        recipe.validate()


def test_an_ensemble_of_one_translator_is_that_translator(tiny_translation) -> None:
    """A one-member Ensemble (forced: load_translator([A]) returns A itself) decodes as the model:
    the same texts and, up to float rounding, the same scores, for beam, greedy and sampling."""
    from scratchformer.generation import Ensemble

    _, report, run = tiny_translation
    single = load_translator(run / report["test_checkpoint"], device="cpu")
    assert load_translator([run / report["test_checkpoint"]], device="cpu").members == 1
    one = Translator(Ensemble([single.model]), single.tokenizer, single.decoding, single.device)
    assert one.members == 1
    texts = ["Ein rot hund läuft.", "Ein klein katze schläft.", "Ein groß mann läuft."]
    for config in (
        single.generation_config(3, num_return_sequences=2),
        single.generation_config(1),
        single.generation_config(1, do_sample=True, num_return_sequences=2),
    ):
        ours, theirs = one.generate(texts, config, seed=5), single.generate(texts, config, seed=5)
        assert [[h.text for h in n] for n in ours] == [[h.text for h in n] for n in theirs]
        for a, b in zip(ours, theirs):
            assert [h.log_prob for h in a] == pytest.approx([h.log_prob for h in b], abs=1e-4)


def test_translate_and_evaluate_take_several_checkpoints(tiny_translation, tmp_path: Path, capsys) -> None:
    recipe, _, run = tiny_translation
    first, second = (str(p) for p in sorted(run.glob("step-*")))  # two models, one tokenizer
    ensemble = load_translator([first, second], device="cpu")
    assert ensemble.members == 2
    texts = ["Ein klein katze schläft.", "Ein blau mann läuft."]
    expected = ensemble.translate(texts)
    twice = load_translator([first, first], device="cpu")  # two copies of a model are that model
    assert twice.translate(texts) == load_translator(first, device="cpu").translate(texts)

    capsys.readouterr()
    argv = ["translate", "--checkpoint", first, "--checkpoint", second, "--device", "cpu", "--json"]
    for text, wanted in zip(texts, expected):
        assert main([*argv, text]) == 0
        assert json.loads(capsys.readouterr().out)["translation_text"] == wanted
    test = load_parallel_texts(recipe.test_source, recipe.test_target)
    argv = ["evaluate", "--checkpoint", first, "--checkpoint", second, "--source", recipe.test_source]
    assert main([*argv, "--reference", recipe.test_target, "--device", "cpu", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["bleu"] == pytest.approx(ensemble.evaluate(test.sources, test.targets)["bleu"])

    # members of another vocabulary are refused, naming the member; so is one model's business
    other = tmp_path / "other"
    shutil.copytree(first, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = [k for k, v in vocab.items() if v > 10][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match="ensemble member 2 has another tokenizer"):
        load_translator([first, str(other)], device="cpu")
    with pytest.raises(ValueError, match="one model's: give one checkpoint"):
        ensemble.save_pretrained(tmp_path / "export")
    with pytest.raises(ValueError, match="one model's"):
        translation_attention(ensemble, "Ein rot hund läuft.")
    assert ensemble.with_precision("int8").translate(texts[:1])[0]  # each member converted


@pytest.mark.machine  # two code paths compared: on the other kind's kernels too
def test_a_session_translates_texts_joining_at_any_step_as_generate_does_alone(tiny_translation) -> None:
    """Continuous batching on a trained model (:meth:`Translator.session`): texts that join the
    running search one a step, and two at once, get the translations ``generate`` gives each alone
    (beam with its n best, greedy, seeded sampling)."""
    _, report, run = tiny_translation
    translator = load_translator(run / report["test_checkpoint"], device="cpu")
    texts = ["Ein rot hund läuft.", "Ein klein katze schläft.", "Ein groß mann läuft.", "Ein hund.",
             "Ein rot katze läuft und ein klein hund schläft.", "Ein mann schläft."]  # fmt: skip
    for config in (
        translator.generation_config(3, num_return_sequences=2),
        translator.generation_config(1),
        translator.generation_config(1, do_sample=True, num_return_sequences=2),
    ):
        expected = [translator.generate([t], config, seed=3)[0] for t in texts]
        session, got, arrivals = translator.session(config, seed=3), {}, [[0], [1, 2], [], [3], [4], [5]]
        for step in range(100):
            if step < len(arrivals) and arrivals[step]:
                session.join([texts[i] for i in arrivals[step]], arrivals[step])
            got.update(session.step())
            if step >= len(arrivals) and not session.live:
                break
        assert [[g.text for g in got[i]] for i in range(len(texts))] == [
            [g.text for g in e] for e in expected
        ]
        for i, e in enumerate(expected):
            assert [g.tokens for g in got[i]] == [g.tokens for g in e]
            assert [g.score for g in got[i]] == pytest.approx([g.score for g in e], abs=1e-4)
