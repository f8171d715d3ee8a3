"""Our translators as CTranslate2 models (formats/ctranslate2_export.py), run by the engine itself
against our Translator: two tiny models trained here (pre-LN with final LayerNorms, post-LN; the
paper's interleaved positions) translate toy sentences of many lengths identically, greedy and beam,
up to ties (a line may differ only where our model scores both outputs within 1e-4: generation/
scoring.py), and score every token as ours does in every configuration; int8 mostly agrees. Our
Hugging Face (Marian) export goes through CTranslate2's own converter and translates identically
too. Each check is shown to fail when the export is wrong."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402
from tasks.test_translation import LEXICON  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from scratchformer.core.transformer import Transformer, TransformerConfig  # noqa: E402
from scratchformer.data.tokenization import save_hf_tokenizer, train_bpe  # noqa: E402
from scratchformer.formats import ctranslate2_export  # noqa: E402
from scratchformer.formats.ctranslate2_export import (  # noqa: E402
    ctranslate2_options,
    translate_like_ours,
    write_ctranslate2,
)
from scratchformer.generation.scoring import TieReport, same_up_to_ties  # noqa: E402
from scratchformer.tasks.shared import pad_ids  # noqa: E402
from scratchformer.tasks.translation import Translator  # noqa: E402

DECODING = {"beam_size": 3, "length_penalty": 1.0, "max_len_a": 1.5, "max_len_b": 5}
CPU = torch.device("cpu")


def toy_pairs(n: int, seed: int, longest: int) -> tuple[list[str], list[str]]:
    """Toy German of 1 to ``longest`` words in any order, and its word-by-word English."""
    rng = random.Random(seed)
    source, target = [], []
    for _ in range(n):
        words, end = [rng.choice(list(LEXICON)) for _ in range(rng.randint(1, longest))], rng.choice(".!")
        source.append(" ".join(words).capitalize() + end)
        target.append(" ".join(LEXICON[w] for w in words).capitalize() + end)
    return source, target


# As long as the models learn from (1 to 8 words): every translation ends with EOS, none is a
# degenerate repetition run to the length limit, where two hypotheses can tie at every step and the
# kernels pick either (test_the_length_limit_cuts_as_ours reaches the limit with a tight rule instead).
TEXTS, REFERENCES = toy_pairs(100, 5, longest=8)
TIGHT = {**DECODING, "max_len_a": 0.5, "max_len_b": 1}  # half the source's tokens and one: most are cut


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models train and decode fastest on one thread (and a busy machine does not stall them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_translator(
    tokenizer: Tokenizer, pairs: tuple[list[str], list[str]], norm_first: bool
) -> Translator:
    """A 2 + 2 layer model (D = 32, shared and tied embeddings) trained briefly (150 steps of 64
    pairs: with 32, the model trained under ATEN_CPU_CAPABILITY=default still ran some sentences to
    the limit): about four fifths of TEXTS come out right, nearly all end with EOS, nearly all differ."""
    vocab = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab,
        vocab,
        d_model=32,
        num_heads=2,
        d_ff=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.0,
        norm_first=norm_first,
        share_embeddings=True,
        tie_output=True,
        max_len=64,
    )
    model = Transformer(config)
    sources = [e.ids + [2] for e in tokenizer.encode_batch(pairs[0], add_special_tokens=False)]
    targets = [[1, *e.ids, 2] for e in tokenizer.encode_batch(pairs[1], add_special_tokens=False)]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(150):
        index = rng.sample(range(len(sources)), 64)
        s, t = (pad_ids([ids[i] for i in index], CPU, 0) for ids in (sources, targets))
        loss = torch.nn.functional.cross_entropy(
            model(s, t[:, :-1]).reshape(-1, vocab), t[:, 1:].reshape(-1), ignore_index=0
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return Translator(model.eval(), tokenizer, DECODING, CPU)


@pytest.fixture(scope="module")
def trained() -> Iterator[dict[str, Translator]]:
    pairs = toy_pairs(1000, 0, longest=8)
    tokenizer = train_bpe(pairs[0] + pairs[1], 400)
    tokenizer.encode_special_tokens = True
    with one_thread():
        yield {
            "pre": train_translator(tokenizer, pairs, True),
            "post": train_translator(tokenizer, pairs, False),
        }


def export(translator: Translator, directory: Path, **options: Any) -> Path:
    eos, max_len = translator.eos, translator.model.config.max_len
    return write_ctranslate2(
        translator.model,
        translator.tokenizer,
        translator.special_ids,
        directory,
        tokenizer_files=lambda d: save_hf_tokenizer(translator.tokenizer, d, max_len, eos=eos),
        decoding=translator.decoding,
        **options,
    )


def engine(directory: Path, compute_type: str = "float32") -> Any:
    return ctranslate2.Translator(str(directory), device="cpu", compute_type=compute_type, intra_threads=1)


def ct2_tokens(directory: Path, translator: Translator, beams: int, **options: Any) -> list[list[int]]:
    """The README's recipe: AutoTokenizer, translate_batch in our batches and limits; the best
    hypotheses' ids with EOS (the engine returns the end token; translate_like_ours drops it)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    sources = [tokenizer.convert_ids_to_tokens(tokenizer.encode(t)) for t in TEXTS]
    best = translate_like_ours(
        engine(directory, **options), sources, translator.decoding, translator.model.config.max_len, beams
    )
    return [[*tokenizer.convert_tokens_to_ids(h), translator.eos] for h in best]


def ct2_translate(directory: Path, translator: Translator, beams: int, **options: Any) -> list[str]:
    """:func:`ct2_tokens` decoded, as the README's recipe does."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    best = ct2_tokens(directory, translator, beams, **options)
    return [tokenizer.decode(h, skip_special_tokens=True) for h in best]


def our_tokens(translator: Translator, beams: int) -> list[list[int]]:
    """Our best hypotheses of TEXTS (ids with EOS), as translate decodes them."""
    generated = translator.generate(TEXTS, translator.generation_config(beams))
    return [n[0].tokens + [translator.eos] for n in generated]


def up_to_ties(
    translator: Translator, ours: list[list[int]], theirs: list[list[int]], what: str
) -> TieReport:
    """The beam-identity rule (generation/scoring.py): every line identical, or both outputs scored by
    our model within 1e-4 (length-normalised, our length penalty); printed with the differing lines."""
    report = same_up_to_ties(
        translator.model,
        translator.encode_sources(TEXTS),
        ours,
        theirs,
        bos_id=translator.bos,
        length_penalty=translator.decoding["length_penalty"],
    )
    print(f"{what}: {report.describe(translator.tokenizer.decode)}")
    return report


def identical(ours: list[str], theirs: list[str], what: str) -> float:
    """The fraction of identical lines, printed with the first differing ones."""
    differ = [(t, o, c) for t, o, c in zip(TEXTS, ours, theirs) if o != c]
    print(f"{what}: {len(ours) - len(differ)} of {len(ours)} lines identical")
    for text, mine, engines in differ[:5]:
        print(f"  {text!r}\n    ours: {mine!r}\n    ct2:  {engines!r}")
    return 1 - len(differ) / len(ours)


def max_score_difference(translator: Translator, directory: Path) -> float:
    """Per-token log-probabilities of our greedy translations, ours against CTranslate2's score_batch
    (which adds the decoder start and </s> itself)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    config = translator.generation_config(1, max_new_tokens=12)
    targets = [h[0].tokens for h in translator.generate(TEXTS[:16], config)]  # (EOS left out)
    sources = translator.encode_sources(TEXTS[:16])
    with torch.no_grad():
        tgt = pad_ids([[translator.bos, *t] for t in targets], CPU, 0)
        log_probs = torch.log_softmax(translator.model(pad_ids(sources, CPU, 0), tgt), dim=-1)
    scored = engine(directory).score_batch(
        [tokenizer.convert_ids_to_tokens(s) for s in sources],
        [tokenizer.convert_ids_to_tokens(t) for t in targets],
    )
    worst = 0.0
    for row, (target, result) in enumerate(zip(targets, scored)):
        mine = log_probs[row, torch.arange(len(target) + 1), torch.tensor([*target, translator.eos])]
        assert len(result.log_probs) == len(target) + 1
        worst = max(worst, float((mine - torch.tensor(result.log_probs)).abs().max()))
    return worst


@pytest.mark.parametrize("layout", ["pre", "post"])
def test_ctranslate2_translates_as_ours(trained, layout, tmp_path: Path) -> None:
    translator = trained[layout]
    directory = export(translator, tmp_path / "ct2")
    assert {p.name for p in directory.iterdir()} >= {
        "model.bin",
        "config.json",
        "tokenizer.json",
        "README.md",
    }
    assert "max_decoding_length=min(int(1.5 * len(src) + 5), 63) - 1" in (directory / "README.md").read_text()
    with one_thread():
        assert max_score_difference(translator, directory) < 1e-4
        for beams in (1, 3):
            ours, theirs = our_tokens(translator, beams), ct2_tokens(directory, translator, beams)
            report = up_to_ties(translator, ours, theirs, f"{layout}, beam {beams}")
            assert report.ok, report.describe(translator.tokenizer.decode)
            ours = translator.translate(TEXTS, beam_size=beams)
            unended = [o for o in ours if o[-1:] not in ".!"]  # run to the length limit
            assert len(set(ours)) >= 90 and len(unended) <= 2, unended
            assert sum(o == r for o, r in zip(ours, REFERENCES)) >= 55  # mostly right: not degenerate
    print(f"{layout}: e.g. {TEXTS[0]!r} -> {ours[0]!r}")


@pytest.mark.parametrize("layout", ["pre", "post"])
def test_the_length_limit_cuts_as_ours(trained, layout, tmp_path: Path) -> None:
    """A tight length rule (a * S + b = S / 2 + 1 new tokens): many translations end at the limit,
    and greedy search, CTranslate2's max_decoding_length cuts them as ours (identical up to ties).
    Beam search is only counted here: at the limit the engines differ by design (ours forces EOS
    there and scores it, CTranslate2 stops without EOS), and so does CTranslate2's stopping rule
    (patience) when many hypotheses finish early: see ctranslate2_options."""
    tight = Translator(trained[layout].model, trained[layout].tokenizer, TIGHT, CPU)
    directory = export(tight, tmp_path / "ct2")
    with one_thread():
        ours, theirs = our_tokens(tight, 1), ct2_tokens(directory, tight, 1)
        assert sum(cut_at_limit(tight, o) for o in ours) >= 30  # at the limit: no full stop
        report = up_to_ties(tight, ours, theirs, f"{layout}, greedy, tight")
        assert report.ok, report.describe(tight.tokenizer.decode)
        report = up_to_ties(tight, our_tokens(tight, 3), ct2_tokens(directory, tight, 3), "beam 3, tight")
        print(f"{layout}, beam 3 at a tight limit: {report.identical} of 100 lines identical")


def cut_at_limit(translator: Translator, tokens: list[int]) -> bool:
    """A translation that ends without its full stop: EOS forced at the length limit."""
    return translator.tokenizer.decode(tokens[:-1])[-1:] not in ".!"


def test_int8_runs_and_mostly_agrees(trained, tmp_path: Path) -> None:
    translator = trained["pre"]
    before = {k: v.clone() for k, v in translator.model.state_dict().items()}
    with one_thread():
        ours = translator.translate(TEXTS, beam_size=1)
        on_load = ct2_translate(export(translator, tmp_path / "fp32"), translator, 1, compute_type="int8")
        on_disk = ct2_translate(export(translator, tmp_path / "int8", quantization="int8"), translator, 1)
    after = translator.model.state_dict()  # (CTranslate2 quantizes its arrays in place: copies of ours)
    assert all(torch.equal(before[k], after[k]) for k in before)
    agree = [identical(ours, theirs, "int8") for theirs in (on_load, on_disk)]
    print(f"int8 greedy: identical {agree[0]:.2f} (quantized on loading), {agree[1]:.2f} (on disk)")
    assert min(agree) >= 0.7
    assert (tmp_path / "int8" / "model.bin").stat().st_size < (
        tmp_path / "fp32" / "model.bin"
    ).stat().st_size / 2


CONFIGURATIONS = {
    "post-LN, final norms": dict(norm_first=False, final_norm=True),
    "pre-LN, no final norms": dict(norm_first=True, final_norm=False),
    "learned positions, gelu, no biases": dict(positional="learned", activation="gelu", bias=False),
    "separate, untied, unscaled, silu": dict(
        share_embeddings=False,
        tie_output=False,
        output_bias=True,
        scale_embedding=False,
        activation="silu",
        sinusoidal_layout="halves",
        layer_norm_eps=1e-6,
    ),
}


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_every_configuration_scores_as_ours(trained, name, tmp_path: Path) -> None:
    tokenizer = trained["pre"].tokenizer
    vocab = tokenizer.get_vocab_size()
    config = TransformerConfig(
        vocab, vocab, d_model=32, num_heads=4, d_ff=48, num_encoder_layers=2, num_decoder_layers=1,
        dropout=0.0, **CONFIGURATIONS[name],
    )  # fmt: skip
    torch.manual_seed(1)
    model = Transformer(config).eval()
    with torch.no_grad():  # noise on LayerNorms and biases (initialised to 1 and 0, a wrong map would hide)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    translator = Translator(model, tokenizer, DECODING, CPU)
    with one_thread():
        assert max_score_difference(translator, export(translator, tmp_path / "ct2")) < 1e-4


def test_the_comparisons_fail_when_the_export_is_wrong(trained, tmp_path: Path, monkeypatch) -> None:
    translator = trained["pre"]
    wrong = copy.deepcopy(translator.model)
    with torch.no_grad():
        wrong.decoder.layers[1].norm3.weight[5] += 0.5  # one weight of one LayerNorm
    mutated = Translator(wrong, translator.tokenizer, DECODING, CPU)
    with one_thread():
        assert max_score_difference(translator, export(mutated, tmp_path / "weight")) > 1e-3
        # CTranslate2's own sinusoids instead of our table: all sines first, from position 1
        monkeypatch.setattr(ctranslate2_export, "_positions", lambda positions: "__optional")
        directory = export(translator, tmp_path / "positions")
        assert max_score_difference(translator, directory) > 1e-1
        ours = translator.translate(TEXTS, beam_size=1)
        assert identical(ours, ct2_translate(directory, translator, 1), "no position table") < 0.9
        beam = our_tokens(translator, 3)
        assert not up_to_ties(translator, beam, ct2_tokens(directory, translator, 3), "no positions").ok
    changed = copy.deepcopy(beam)  # the rule itself: one changed token in one line is a real difference
    changed[7][1] = 300 if changed[7][1] != 300 else 301
    report = up_to_ties(translator, beam, changed, "one token changed")
    assert [d.line for d in report.different] == [7] and report.different[0].gap > 1e-2


def test_options_and_refusals(trained, tmp_path: Path) -> None:
    options = ctranslate2_options(DECODING, 7, max_len=64)
    assert options["max_decoding_length"] == int(1.5 * 7 + 5) - 1 and options["return_end_token"]
    assert ctranslate2_options(DECODING, 60, max_len=64)["max_decoding_length"] == 62  # within max_len - 1
    assert ctranslate2_options(DECODING, 7, never=["<pad>"])["suppress_sequences"] == [["<pad>"]]
    with pytest.raises(ValueError, match=r"\['no_repeat_ngram_size', 'repetition_penalty'\] have no exact"):
        ctranslate2_options({**DECODING, "repetition_penalty": 1.2, "no_repeat_ngram_size": 3}, 7)
    translator = trained["pre"]
    vocab = translator.tokenizer.get_vocab_size()
    no_encoder = Transformer(
        TransformerConfig(vocab, vocab, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=0)
    )
    bad = Translator(no_encoder, translator.tokenizer, DECODING, CPU, {"pad": 0, "bos": vocab, "eos": 2})
    with pytest.raises(
        ValueError, match=r"num_encoder_layers=0 \(CTranslate2.*; special ids .*bos, eos and pad"
    ):
        export(bad, tmp_path / "x")
    small = Transformer(TransformerConfig(vocab - 1, vocab - 1, d_model=16, num_heads=2, d_ff=32))
    with pytest.raises(ValueError, match="does not belong to this model"):
        export(Translator(small, translator.tokenizer, DECODING, CPU), tmp_path / "x")
    with pytest.raises(ValueError, match="quantization: expected one of"):
        export(translator, tmp_path / "x", quantization="int4")
    with pytest.raises(ValueError, match="tokenizer_files"):
        write_ctranslate2(translator.model, translator.tokenizer, translator.special_ids, tmp_path / "x")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.tmp-*"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("")
    with pytest.raises(FileExistsError, match="not empty"):
        export(translator, tmp_path / "full")


def test_marian_export_converts_with_ctranslate2s_converter(trained, tmp_path: Path) -> None:
    """``ct2-transformers-converter --model EXPORT``: the converter's opus-mt assumptions (<pad> last,
    a zero decoder start) met by the export's layout, so it translates and scores as ours."""
    from ctranslate2.converters import TransformersConverter

    translator = trained["post"]  # Marian is post-LN
    hf = translator.save_pretrained(tmp_path / "hf")
    with one_thread():
        TransformersConverter(str(hf)).convert(str(tmp_path / "ct2"))
        for name in (
            "tokenizer.json",
            "tokenizer_config.json",
        ):  # the converter writes the engine's files only
            (tmp_path / "ct2" / name).write_bytes((hf / name).read_bytes())
        assert max_score_difference(translator, tmp_path / "ct2") < 1e-4
        for beams in (1, 3):
            ours, theirs = our_tokens(translator, beams), ct2_tokens(tmp_path / "ct2", translator, beams)
            report = up_to_ties(translator, ours, theirs, f"converted, beam {beams}")
            assert report.ok, report.describe(translator.tokenizer.decode)
        # without the start token folded into position 0, CTranslate2's zero start is wrong
        state = load_file(hf / "model.safetensors")
        del state["model.decoder.embed_positions.weight"]  # transformers computes the plain table
        save_file(state, str(hf / "model.safetensors"), metadata={"format": "pt"})
        TransformersConverter(str(hf)).convert(str(tmp_path / "unfolded"))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tmp_path / "unfolded" / name).write_bytes((hf / name).read_bytes())
        assert max_score_difference(translator, tmp_path / "unfolded") > 1e-2


def test_the_parity_script_reports(trained) -> None:
    """scripts/parity/ct2_parity.py's report, on the toy sentences (its main reads a checkpoint and
    Multi30k)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "parity" / "ct2_parity.py"
    spec = importlib.util.spec_from_file_location("ct2_parity", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with one_thread():
        report = script.parity(trained["post"], TEXTS[:40], REFERENCES[:40], show=2)
    assert report["identical"]["float32_greedy"] == 1.0 and report["identical"]["float32_beam"] >= 0.97
    assert report["up_to_ties"]["float32_greedy"] == report["up_to_ties"]["float32_beam"] == 1.0
    assert all({"tied", "ours_score", "ct2_score"} <= set(d) for d in report["differing"]["int8_beam"])
    assert report["differing"]["float32_greedy"] == [] and len(report["differing"]["int8_beam"]) <= 2
    assert set(report["bleu"]) == {
        f"{w}_{s}" for w in ("ours", "ct2_float32", "ct2_int8") for s in ("greedy", "beam")
    }
    assert report["bleu"]["ours_greedy"] == report["bleu"]["ct2_float32_greedy"] > 10


def _small_export(trained, directory: Path, seed: int, **options) -> tuple[Translator, Path, int]:
    """(a small random translator on the trained tokenizer, its Marian export in ``directory``, V)."""
    tokenizer = trained["post"].tokenizer
    vocab = tokenizer.get_vocab_size()
    sizes = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0)
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(vocab, vocab, **sizes, **options)).eval()
    translator = Translator(model, tokenizer, DECODING, CPU)
    return translator, translator.save_pretrained(directory), vocab


def _loads_back_the_same(translator: Translator, directory: Path, vocab: int) -> Translator:
    """The export loaded by load_translator: V source and target ids, the same logits (1e-5)."""
    from scratchformer.tasks.translation import load_translator

    back = load_translator(directory, device="cpu")
    assert (back.model.config.src_vocab_size, back.model.config.tgt_vocab_size) == (vocab, vocab)
    src, tgt = pad_ids(translator.encode_sources(TEXTS[:6]), CPU, 0), pad_ids([[1, 40, 41, 42]] * 6, CPU, 0)
    with torch.no_grad():
        assert float((translator.model(src, tgt) - back.model(src, tgt)).abs().max()) < 1e-5
    return back


@pytest.mark.parametrize("share, tie", [(True, True), (True, False), (False, True), (False, False)])
def test_the_marian_layout_loads_back_as_it_was(trained, share, tie, tmp_path: Path) -> None:
    """The export's extra source row and its folded start token are undone on loading: the same
    sharing, sizes and function (marian_layout.undo_ctranslate2_layout)."""
    from scratchformer.formats.marian_layout import LAYOUT_KEY

    translator, directory, vocab = _small_export(
        trained, tmp_path / "hf", 2, share_embeddings=share, tie_output=tie
    )
    written = json.loads((directory / "config.json").read_text())
    assert written["vocab_size"] == written["decoder_vocab_size"] == vocab + 1
    assert written[LAYOUT_KEY] == {
        "appended_source_rows": 1,
        "appended_target_rows": 1,
        "decoder_start_folded": True,
        "share_embeddings": share,
        "tie_output": tie,
    }
    back = _loads_back_the_same(translator, directory, vocab)
    assert (back.model.config.share_embeddings, back.model.config.tie_output) == (share, tie)


def test_an_export_of_0_11_without_the_target_row_still_loads(trained, tmp_path: Path) -> None:
    """Exports of 0.11 and before appended the extra row to the source side only (no
    "appended_target_rows"): they load as they did, with the same function."""
    from scratchformer.formats.marian_layout import LAYOUT_KEY

    translator, directory, vocab = _small_export(trained, tmp_path / "hf", 4, tie_output=False)
    config = json.loads((directory / "config.json").read_text())
    del config[LAYOUT_KEY]["appended_target_rows"]
    config["decoder_vocab_size"] = vocab
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(directory / "model.safetensors"))
    for name in ("model.decoder.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = tensors[name][:vocab].contiguous()
    tensors["final_logits_bias"] = tensors["final_logits_bias"][:, :vocab].contiguous()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    _loads_back_the_same(translator, directory, vocab)
