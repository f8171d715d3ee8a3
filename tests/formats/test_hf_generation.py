"""A translator's decoding defaults through its Hugging Face (Marian) export: transformers' generate,
with nothing but the exported generation_config.json, against our Translator on 50 sentences.

What is proven, for our limit L = a * S + b (S: the padded length of the batch's sources) against
the exported ``max_length`` (the largest L any source can get, so never earlier than ours):

    the same limit        identical, greedy and beam
    greedy, ours < L      identical (the same argmax at every step)
    greedy, ours at L     HF continues ours (ours is HF's first L - 1 tokens, then the forced EOS)
    beam, ours < L        identical, or HF's is longer than L: up to step L - 2 both searches are
                          the same, at L - 1 HF ends a subset of the hypotheses ours ends (with the
                          same scores: ours scores a forced EOS with log p(EOS)), then more, longer
    beam, ours at L       no claim (counted)

and for the model card's recipe, ``max_length = 1 + a * S + b`` per batch of ours: greedy identical;
beam, ours < L: identical or HF's at L, ours at L: HF's at L too (HF scores the forced EOS 0, not
log p(EOS), which can only favour the hypotheses ended at L).

"Identical" is up to ties everywhere (generation/scoring.py): a line whose two outputs differ counts
as identical only when our model scores both within 1e-4 (length-normalised log-probability).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tasks.test_translation import LEXICON, tiny_recipe  # noqa: E402

from scratchformer.formats.hf_files import CheckpointError  # noqa: E402
from scratchformer.formats.hf_generation import DEFAULT_DECODING, longest_new_tokens  # noqa: E402
from scratchformer.generation import GenerationConfig  # noqa: E402
from scratchformer.generation.scoring import TieReport, same_up_to_ties  # noqa: E402
from scratchformer.tasks.translation import Translator, load_translator, train_translation  # noqa: E402

RULE = {"length_penalty": 1.0, "max_len_a": 0.3, "max_len_b": 2}  # tight: many translations reach it
BATCH = 8  # our Translator's batches: sentences sorted by length, BATCH at a time
EOS = 2


def toy_sentences(n: int, seed: int) -> list[str]:
    """Toy German of 1 to 14 words: sources of many lengths (the model learnt sentences of 4)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(list(LEXICON)) for _ in range(rng.randint(1, 14))).capitalize() + "."
        for _ in range(n)
    ]


TEXTS = toy_sentences(50, 0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Translator:
    """Our recipe, post-LN (Marian's), a few steps: translations that end with EOS."""
    tmp = tmp_path_factory.mktemp("mt")
    recipe = tiny_recipe(tmp, max_steps=40, eval_every=40)
    recipe.model["norm_first"], recipe.average_last = False, 0
    report = train_translation(recipe)
    return load_translator(tmp / "run" / report["test_checkpoint"], device="cpu")


@pytest.fixture(scope="module")
def exports(trained, tmp_path_factory) -> dict[int, tuple[Translator, Path, Any, Any]]:
    """beams -> (our translator with RULE, its export, transformers' model and tokenizer of it)."""
    out = {}
    for beams in (1, 3):
        translator = Translator(
            trained.model, trained.tokenizer, {"beam_size": beams, **RULE}, torch.device("cpu")
        )
        directory = translator.save_pretrained(tmp_path_factory.mktemp("hf") / f"mt-beam{beams}")
        hf = transformers.MarianMTModel.from_pretrained(directory).eval()
        out[beams] = translator, directory, hf, transformers.AutoTokenizer.from_pretrained(directory)
    return out


@pytest.fixture(scope="module")
def at_bound(exports) -> dict[int, list[list[int]]]:
    """beams -> our translations within the exported max_length (the same limit for every source)."""
    return {
        beams: our_tokens(translator, TEXTS, max_new_tokens=hf.generation_config.max_length - 1)
        for beams, (translator, _, hf, _) in exports.items()
    }


def hf_tokens(hf: Any, tokenizer: Any, texts: list[str], **kwargs: Any) -> list[list[int]]:
    """generate's output after the decoder start, up to and with the first EOS (beam search fills
    finished rows with EOS, not pad, when the pad id is 0)."""
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        rows = hf.generate(**batch, **kwargs).tolist()
    return [row[1 : row.index(EOS) + 1] if EOS in row else row[1:] for row in rows]


def our_tokens(translator: Translator, texts: list[str], **options: Any) -> list[list[int]]:
    config = translator.generation_config(**options)
    return [n[0].tokens + [EOS] for n in translator.generate(texts, config, batch_size=BATCH)]


def up_to_ties(translator: Translator, ours: list[list[int]], theirs: list[list[int]]) -> TieReport:
    """The beam-identity rule: each line identical, or both outputs within 1e-4 by our model's score."""
    report = same_up_to_ties(
        translator.model,
        translator.encode_sources(TEXTS),
        ours,
        theirs,
        bos_id=translator.bos,
        length_penalty=RULE["length_penalty"],
    )
    print(report.describe(translator.tokenizer.decode))
    return report


def same(report: TieReport) -> set[int]:
    """The lines identical or tied."""
    return set(range(report.lines)) - {d.line for d in report.different}


def our_batches(translator: Translator, texts: list[str]) -> list[list[int]]:
    """The indices of each batch our Translator decodes (sorted by source length, BATCH at a time)."""
    lengths = [len(s) for s in translator.encode_sources(texts)]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    return [order[i : i + BATCH] for i in range(0, len(order), BATCH)]


def limit(translator: Translator, texts: list[str]) -> int:
    """New tokens (EOS included) our rule allows a batch of ``texts``: a * S + b, S the longest
    source with its EOS, within the model's positions."""
    d, cap = translator.decoding, translator.model.config.max_len - 1
    longest = max(len(s) for s in translator.encode_sources(texts))
    return max(1, min(int(d["max_len_a"] * longest + d["max_len_b"]), cap))


def limits(translator: Translator, texts: list[str]) -> list[int]:
    out = [0] * len(texts)
    for index in our_batches(translator, texts):
        for i in index:
            out[i] = limit(translator, [texts[j] for j in index])
    return out


def test_generation_config_carries_our_decoding(exports, trained, tmp_path: Path) -> None:
    translator, directory, hf, _ = exports[3]
    written = json.loads((directory / "generation_config.json").read_text())
    bound = longest_new_tokens(RULE["max_len_a"], RULE["max_len_b"], 64)
    assert bound == int(0.3 * 64 + 2) == 21  # a source is cut to max_len = 64 tokens
    assert written == {
        "decoder_start_token_id": 1,
        "eos_token_id": EOS,
        "pad_token_id": 0,
        "forced_eos_token_id": EOS,
        "bad_words_ids": [[0], [1]],
        "num_beams": 3,
        "length_penalty": 1.0,
        "early_stopping": False,
        "max_length": 1 + bound,
        "scratchformer_max_len_a": 0.3,
        "scratchformer_max_len_b": 2,
    }
    config = hf.generation_config  # as transformers reads it
    assert (config.num_beams, config.max_length, config.early_stopping) == (3, 22, False)
    assert all(limit(translator, [t]) <= bound for t in [*TEXTS, " ".join(["ein hund"] * 80)])
    greedy = json.loads((exports[1][1] / "generation_config.json").read_text())
    assert "length_penalty" not in greedy and greedy["num_beams"] == 1  # no "flag ignored" warning
    for beams in (1, 3):  # our loader reads the exact rule back, and translates as the original
        reloaded = load_translator(exports[beams][1], device="cpu")
        assert reloaded.decoding == {"beam_size": beams, **RULE}
    some = TEXTS[:16]
    assert reloaded.translate(some, batch_size=BATCH) == translator.translate(some, batch_size=BATCH)
    card = (directory / "README.md").read_text()
    assert "`0.3 * S + 2` new tokens" in card and "max_length=1 + min(int(0.3 * S + 2), 63)" in card
    assert "`max_length` is 22" in card and 'load_translator("mt-beam3")' in card
    # a decoding section that leaves keys out: exported as Translator.generation_config fills them
    defaults = Translator(trained.model, trained.tokenizer, {}, torch.device("cpu"))
    mine, ours = defaults.generation_config(), GenerationConfig()
    assert DEFAULT_DECODING == {
        "beam_size": mine.num_beams,
        "length_penalty": ours.length_penalty,
        "max_len_a": ours.max_len_a,
        "max_len_b": ours.max_len_b,
    }
    assert (
        load_translator(defaults.save_pretrained(tmp_path / "d"), device="cpu").decoding == DEFAULT_DECODING
    )


@pytest.mark.parametrize("beams", [1, 3])
def test_generate_with_the_exported_config_equals_ours(exports, at_bound, beams) -> None:
    translator, _, hf, tokenizer = exports[beams]
    theirs = hf_tokens(hf, tokenizer, TEXTS)  # nothing but generation_config.json
    report = up_to_ties(translator, at_bound[beams], theirs)
    assert report.ok, report.describe(translator.tokenizer.decode)  # the same limit: identical
    ours, at = our_tokens(translator, TEXTS), limits(translator, TEXTS)  # ours: a * S + b
    short = [i for i in range(len(TEXTS)) if len(ours[i]) < at[i]]
    full = [i for i in range(len(TEXTS)) if len(ours[i]) == at[i]]
    assert len(short) + len(full) == len(TEXTS) and len(short) >= 10 and len(full) >= 10, (short, full)
    equal = same(up_to_ties(translator, ours, theirs))
    continued = [i for i in full if theirs[i][: at[i] - 1] == ours[i][:-1] and i not in equal]
    print(
        f"beams={beams}: ours ended before a*S+b {len(short)}, at it {len(full)}; HF identical "
        f"{len(equal)}, continuing ours {len(continued)}, other {len(TEXTS) - len(equal) - len(continued)}"
    )
    if beams == 1:
        assert set(short) <= equal and set(full) <= equal | set(continued)
        assert continued
    else:
        assert all(i in equal or len(theirs[i]) > at[i] for i in short)
    # the card's recipe: max_length = 1 + a * S + b per batch, for the batches ours decodes
    exact = [[] for _ in TEXTS]
    for index in our_batches(translator, TEXTS):
        batch = [TEXTS[i] for i in index]
        for i, tokens in zip(index, hf_tokens(hf, tokenizer, batch, max_length=1 + limit(translator, batch))):
            exact[i] = tokens
    report = up_to_ties(translator, ours, exact)
    if beams == 1:
        assert report.ok, report.describe(translator.tokenizer.decode)
    else:  # at the limit transformers scores the forced EOS 0, ours log p(EOS)
        assert all(i in same(report) or len(exact[i]) == at[i] for i in short)
        assert all(len(exact[i]) == at[i] for i in full)
        print(f"beams={beams}, per-batch max_length: identical or tied {len(same(report))}")


def test_the_comparison_fails_when_the_decoding_differs(exports, at_bound) -> None:
    """The exported stopping rule and length penalty matter (fairseq's early stop, or no penalty,
    and some line differs), and so does one weight (EOS's output bias)."""
    translator, _, hf, tokenizer = exports[3]
    for wrong in ({"early_stopping": True}, {"length_penalty": 0.0}):  # real differences, not ties
        assert not up_to_ties(translator, at_bound[3], hf_tokens(hf, tokenizer, TEXTS, **wrong)).ok, wrong
    translator, _, hf, tokenizer = exports[1]
    try:
        with torch.no_grad():
            hf.final_logits_bias[0, EOS] -= 2.0
        assert not up_to_ties(translator, at_bound[1], hf_tokens(hf, tokenizer, TEXTS)).ok
    finally:
        with torch.no_grad():
            hf.final_logits_bias[0, EOS] += 2.0


def test_bad_length_rules_are_named(exports, tmp_path: Path) -> None:
    translator, directory, _, _ = exports[3]
    for decoding, message in (
        ({**translator.decoding, "max_len_a": -1.0}, "max_len_a must be .*>= 0"),
        ({**translator.decoding, "beams": 4}, "beams"),
        ({**translator.decoding, "beam_size": "4"}, "beam_size must be an integer >= 1, got '4'"),
        ({**translator.decoding, "length_penalty": float("nan")}, "length_penalty must be a finite number"),
    ):
        bad = Translator(translator.model, translator.tokenizer, decoding, torch.device("cpu"))
        with pytest.raises(ValueError, match=message):
            bad.save_pretrained(tmp_path / "bad")
        assert not (tmp_path / "bad").exists()
    for edit, message in (
        ({"scratchformer_max_len_b": "5"}, "max_len_b must be an integer >= 0, got '5'"),
        ({"scratchformer_max_len_a": None}, "max_len_a must be a finite number >= 0"),
        ({"scratchformer_max_len_a": 0.3, "scratchformer_max_len_b": 2, "drop": True}, "without its pair"),
    ):
        copy = Path(shutil.copytree(directory, tmp_path / f"edited{len(message)}"))
        gen = json.loads((copy / "generation_config.json").read_text())
        gen.update({k: v for k, v in edit.items() if k != "drop"})
        if "drop" in edit:
            del gen["scratchformer_max_len_b"]
        (copy / "generation_config.json").write_text(json.dumps(gen))
        with pytest.raises(CheckpointError, match=message):
            load_translator(copy, device="cpu")
