"""Real checkpoint formats both ways, proven against ``transformers`` on random models built here
(configs in code, ``save_pretrained`` to a temp dir, sentencepiece models trained here; no hub
download): Marian (opus-mt) into our Transformer; RoBERTa, XLM-R and DistilBERT into our
ContextualEncoder; ours out as Marian and BERT directories."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

from tasks.test_translation import tiny_recipe  # noqa: E402

from scratchformer.cli import main  # noqa: E402
from scratchformer.core.embedding import SinusoidalPositionalEncoding, sinusoidal_table  # noqa: E402
from scratchformer.core.transformer import Transformer, TransformerConfig  # noqa: E402
from scratchformer.data.marian_tokenizer import MarianTokenizer  # noqa: E402
from scratchformer.data.tokenization import TextTokenizer, train_wordpiece  # noqa: E402
from scratchformer.formats.hf_bert import load_bert_encoder  # noqa: E402
from scratchformer.formats.hf_files import CheckpointError  # noqa: E402
from scratchformer.formats.marian import load_marian  # noqa: E402
from scratchformer.generation import GenerationConfig, beam_search, generate, greedy_decode  # noqa: E402
from scratchformer.generation.scoring import same_up_to_ties  # noqa: E402
from scratchformer.models.classifier import ClassifierConfig, TextClassifier  # noqa: E402
from scratchformer.models.contextual import EncoderConfig  # noqa: E402
from scratchformer.tasks.classification import LoadedClassifier  # noqa: E402
from scratchformer.tasks.sentence_embedding import SentenceEncoder  # noqa: E402
from scratchformer.tasks.translation import Translator, load_translator, train_translation  # noqa: E402

WORDS_DE = (
    "ein eine der die das mann frau kind hund katze fährt läuft spielt schläft im auf dem schnee park "
    "rot blau groß klein zwei drei und mit über brücke straße wasser ball".split()
)
WORDS_EN = (
    "a the man woman child dog cat rides runs plays sleeps in on snow park red blue big small two "
    "three and with over bridge street water ball".split()
)
TEXTS = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee, und ein Kind schaut zu.",
    "Hallo!",
    ">>fra<< Ein Test.",
    "Ünïcödé 🙂 über die Brücke",
]


def sentences(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 9))).capitalize() + rng.choice(".!?,")
        for _ in range(n)
    ]


def train_spm(texts: list[str], path: Path) -> list[str]:
    """A small unigram sentencepiece model at ``path``; returns its pieces (specials left out)."""
    prefix = path.with_suffix("")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(prefix),
        vocab_size=80,
        character_coverage=1.0,
        minloglevel=2,
    )
    prefix.with_suffix(".model").rename(path)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not processor.is_control(i) and not processor.is_unknown(i)
    ]


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Noise on every bias and LayerNorm: Hugging Face initialises them to 0 (and 1), under which a
    wrong mapping of those tensors would go unseen. The weight matrices are random already."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=generator))


@pytest.fixture(scope="module")
def marian(tmp_path_factory) -> tuple[Path, transformers.MarianMTModel]:
    """A random Marian model as ``save_pretrained`` writes it, with sentencepiece files and vocab.json."""
    directory = tmp_path_factory.mktemp("opus-mt-tiny")
    pieces = train_spm(sentences(WORDS_DE, 400, 0), directory / "source.spm")
    pieces += train_spm(sentences(WORDS_EN, 400, 1), directory / "target.spm")
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in [*dict.fromkeys(pieces), ">>fra<<", "<pad>"]:
        vocab.setdefault(piece, len(vocab))
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        scale_embedding=True,
        activation_function="swish",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.15,
    )  # logits of unit scale, so that the source matters
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(config).eval()
    perturb(hf, 0)
    with torch.no_grad():
        hf.final_logits_bias.normal_(0.0, 0.1)
        hf.final_logits_bias[0, 0] += EOS_BOOST  # beam search ends sentences at different lengths
    hf.generation_config.update(num_beams=4, max_length=64, bad_words_ids=[[pad]])
    hf.save_pretrained(directory)
    return directory, hf


EOS_BOOST = 2.5


class EndAtLimit(transformers.LogitsProcessor):
    """Our (and fairseq's) length limit: the last step may only emit EOS, with its log-probability.
    Hugging Face's ``forced_eos_token_id`` gives it log-probability 0 instead; used in its place."""

    def __init__(self, limit: int, eos: int):
        self.limit, self.eos = limit, eos

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] < self.limit:  # input_ids: the decoder start and the tokens so far
            return scores
        out = torch.full_like(scores, float("-inf"))
        out[:, self.eos] = scores[:, self.eos]
        return out


def generate_as_ours(hf: transformers.MarianMTModel, limit: int, **kwargs) -> Any:
    """``generate`` with our length rule (see :class:`EndAtLimit`) and ``early_stopping=False``; its
    own forced EOS would come one token later, after every sentence has ended."""
    return hf.generate(
        max_new_tokens=limit + 1,
        early_stopping=False,
        logits_processor=transformers.LogitsProcessorList([EndAtLimit(limit, hf.config.eos_token_id)]),
        **kwargs,
    )


def padded_batch(ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.full((len(ids), max(map(len, ids))), pad)
    for i, row in enumerate(ids):
        out[i, : len(row)] = torch.tensor(row)
    return out, out != pad


def marian_inputs(directory: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, src mask, tgt, tgt mask): a padded batch, tgt starting with the decoder start (pad), T != S."""
    tokenizer = MarianTokenizer(directory)
    pad, eos = tokenizer.vocab["<pad>"], tokenizer.vocab["</s>"]
    src, src_mask = padded_batch([e.ids + [eos] for e in tokenizer.encode_batch(TEXTS)], pad)
    rng = random.Random(0)
    tgt, tgt_mask = padded_batch(
        [[pad] + [rng.randrange(1, pad) for _ in range(n)] for n in (3, 11, 1, 6, 8)], pad
    )
    tgt_mask[:, 0] = True  # the decoder start is the pad id, but a real position
    return src, src_mask, tgt, tgt_mask


def use_exact_positions(ours: Transformer, hf: transformers.MarianMTModel, length: int) -> None:
    """float64 runs: both models get the float64 table (HF stores float32; the formula written here
    with numpy, all sines then all cosines, as Marian's)."""
    d = ours.config.d_model
    angle = np.arange(length)[:, None] / np.power(10000.0, np.arange(0, d, 2) / d)[None, :]
    table = torch.from_numpy(np.concatenate([np.sin(angle), np.cos(angle)], axis=1))
    for module in (hf.model.encoder.embed_positions, hf.model.decoder.embed_positions):
        module.weight.data = table.clone()
    for module in (ours.src_pos, ours.tgt_pos):
        module.table = sinusoidal_table(length, d, torch.float64, layout="halves")


def max_diff_where(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b).abs()[mask].max())


def exported_logits(theirs: torch.Tensor, hf, vocab: int) -> torch.Tensor:
    """transformers' logits of our export, less the id appended after our V (marian_layout): that
    one is -inf everywhere, and there are as many logits as config.vocab_size says (transformers'
    beam search from 4.50 to 5.17 sizes its scores by it)."""
    assert theirs.shape[-1] == hf.config.vocab_size == hf.config.decoder_vocab_size == vocab + 1
    assert bool((theirs[..., vocab:] == float("-inf")).all())
    return theirs[..., :vocab]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_marian_encoder_states_and_logits_equal_transformers(marian, dtype, tolerance) -> None:
    directory, hf = marian
    ours, special, _ = load_marian(directory)
    assert special == {"pad": hf.config.pad_token_id, "bos": hf.config.pad_token_id, "eos": 0}
    c = ours.config
    assert (c.sinusoidal_layout, c.activation, c.output_bias, c.scale_embedding) == (
        "halves",
        "silu",
        True,
        True,
    )
    saved = [m.weight.data for m in (hf.model.encoder.embed_positions, hf.model.decoder.embed_positions)]
    hf, ours = hf.to(dtype), ours.to(dtype)
    if dtype == torch.float64:
        use_exact_positions(ours, hf, 64)
    src, src_mask, tgt, tgt_mask = marian_inputs(directory)
    assert src.shape[1] != tgt.shape[1] and not src_mask.all() and not tgt_mask.all()
    try:
        with torch.no_grad():
            ref = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt)
            memory, logits = ours.encode(src), ours(src, tgt)
        assert max_diff_where(memory, ref.encoder_last_hidden_state, src_mask) < tolerance
        assert max_diff_where(logits, ref.logits, tgt_mask) < tolerance
        assert float(ref.logits.abs().max()) > 1.0  # not vacuous: logits of unit scale
    finally:  # the fixture's model as it was, for the other tests
        hf.float()
        hf.model.encoder.embed_positions.weight.data, hf.model.decoder.embed_positions.weight.data = saved


def test_parity_fails_when_a_mapping_is_wrong(marian) -> None:
    """Mutations: each breaks the 1e-5 parity above by far (the test can fail)."""
    directory, hf = marian
    src, src_mask, tgt, tgt_mask = marian_inputs(directory)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits

    def diff(mutate) -> float:
        ours = load_marian(directory)[0]
        with torch.no_grad():
            mutate(ours)
            return max_diff_where(ours(src, tgt), ref, tgt_mask)

    def swap_key_value(m):  # W^K and W^V of one cross-attention exchanged
        w = m.decoder.layers[0].cross_attn.qkv_proj.weight
        d = m.config.d_model
        w[d:] = torch.cat([w[2 * d :].clone(), w[d : 2 * d].clone()])

    def interleaved_positions(m):
        m.src_pos = SinusoidalPositionalEncoding(m.config.d_model, 64, layout="interleaved")
        m.tgt_pos = SinusoidalPositionalEncoding(m.config.d_model, 64, layout="interleaved")

    assert diff(lambda m: None) < 1e-5
    assert diff(swap_key_value) > 1e-3  # each at least 100x the tolerance
    assert diff(lambda m: m.generator.bias.zero_()) > 1e-3  # final_logits_bias dropped
    assert diff(interleaved_positions) > 1e-3


def test_marian_tokenizer_equals_transformers(marian) -> None:
    directory, _ = marian
    theirs, ours = transformers.MarianTokenizer.from_pretrained(directory), MarianTokenizer(directory)
    for text in TEXTS:
        assert ours.encode(text).ids + [0] == theirs(text).input_ids, text
    assert ours.encode(">>fra<< Ein Test.").tokens[0] == ">>fra<<"
    rng = random.Random(1)
    for _ in range(20):
        ids = [rng.randrange(len(ours.vocab)) for _ in range(rng.randint(1, 12))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            ), ids


def assert_up_to_ties(model, src, ours, theirs, bos: int, length_penalty: float) -> None:
    """n-best lists (n per source, flattened) the same up to ties: a differing hypothesis must score
    within 1e-4 by our model (generation/scoring.py, the beam's length-normalised score)."""
    rows = torch.arange(src.shape[0]).repeat_interleave(len(ours) // src.shape[0])
    report = same_up_to_ties(model, src[rows], ours, theirs, bos_id=bos, length_penalty=length_penalty)
    assert report.ok, report.describe()


def generated(sequences: torch.Tensor, pad: int) -> list[list[int]]:
    """HF's output rows without the decoder start and the padding after EOS."""
    return [[t for t in row[1:] if t != pad] for row in sequences.tolist()]


@pytest.mark.parametrize("beams, length_penalty", [(1, 1.0), (4, 1.0), (4, 0.6)])
def test_greedy_and_beam_search_equal_generate(marian, beams, length_penalty) -> None:
    """Same tokens, and for beams the same n-best lists and scores. HF's stopping rule with
    early_stopping=False is ours; at the length limit HF forces EOS with score 0 where ours (and
    fairseq's) adds log p(EOS): the test runs HF with our rule (:class:`EndAtLimit`)."""
    directory, hf = marian
    ours, special, _ = load_marian(directory)
    pad, eos, limit = special["pad"], special["eos"], 20
    src, src_mask, _, _ = marian_inputs(directory)
    settings = dict(
        num_beams=beams,
        length_penalty=length_penalty,
        do_sample=False,
        bad_words_ids=[[pad]],
        num_return_sequences=beams,
        output_scores=True,
        return_dict_in_generate=True,
    )
    boost = EOS_BOOST if beams == 1 else 0.0  # greedy: without the boost, sentences run to the limit
    try:
        with torch.no_grad():
            hf.final_logits_bias[0, eos] -= boost
            ours.generator.bias[eos] -= boost
            ref = generate_as_ours(hf, limit, input_ids=src, attention_mask=src_mask, **settings)
            theirs = generated(ref.sequences, pad)
            assert all(t[-1] == eos for t in theirs), theirs
            if beams == 1:
                mine = greedy_decode(ours, src, bos_id=pad, eos_id=eos, max_len_a=0, max_len_b=limit)
                assert generated(torch.cat([src[:, :1], mine], 1), pad) == theirs
                assert len({tuple(t) for t in theirs}) > 2 and all(len(t) == limit for t in theirs)
                return
    finally:
        with torch.no_grad():
            hf.final_logits_bias[0, eos] += boost
    hyps = beam_search(
        ours,
        src,
        bos_id=pad,
        eos_id=eos,
        beam_size=beams,
        length_penalty=length_penalty,
        max_len_a=0,
        max_len_b=limit,
        n_best=beams,
    )
    assert_up_to_ties(ours, src, [h.tokens for n_best in hyps for h in n_best], theirs, pad, length_penalty)
    scores = torch.tensor([h.score for n_best in hyps for h in n_best])
    assert torch.allclose(scores, ref.sequences_scores, atol=1e-5, rtol=0)
    assert len({len(t) for t in theirs}) > 2  # hypotheses of many lengths


@pytest.mark.parametrize(
    "options",
    [
        {"num_beams": 4, "length_penalty": 0.6, "num_return_sequences": 4, "no_repeat_ngram_size": 2},
        {"num_beams": 4, "num_return_sequences": 2, "min_new_tokens": 6, "repetition_penalty": 1.3},
        {"repetition_penalty": 1.5},
        {"no_repeat_ngram_size": 3, "min_new_tokens": 4},
        {"do_sample": True, "top_k": 1},
    ],
)
def test_generate_options_equal_hugging_face(marian, options) -> None:
    """generate() with n-best, no_repeat_ngram_size, min_new_tokens, repetition_penalty and top-k=1
    sampling: the same tokens as transformers' generate, and for beams the same scores (1e-5)."""
    directory, hf = marian
    ours, special, _ = load_marian(directory)
    pad, eos, limit = special["pad"], special["eos"], 20
    src, src_mask, _, _ = marian_inputs(directory)
    config = GenerationConfig(decoder_start_token_id=pad, eos_token_id=eos, max_new_tokens=limit, **options)
    beams = options.get("num_beams", 1) > 1
    boost = 0.0 if beams else EOS_BOOST  # greedy and sampling: without the boost, sentences run long
    try:
        with torch.no_grad():
            hf.final_logits_bias[0, eos] -= boost
            ours.generator.bias[eos] -= boost
            mine = generate(ours, src, config, seed=0)
            extra = (
                {"top_p": 1.0, "temperature": 1.0} if options.get("do_sample") else {}
            )  # not the saved defaults
            ref = generate_as_ours(
                hf,
                limit,
                input_ids=src,
                attention_mask=src_mask,
                bad_words_ids=[[pad]],
                output_scores=True,
                return_dict_in_generate=True,
                **{"num_beams": 1, **options, **extra},
            )
    finally:
        with torch.no_grad():
            hf.final_logits_bias[0, eos] += boost
    tokens = [h.tokens for n in mine for h in n]
    if beams and "repetition_penalty" not in options:  # (a penalty changes the ranking score: exact)
        assert_up_to_ties(ours, src, tokens, generated(ref.sequences, pad), pad, config.length_penalty)
    else:
        assert tokens == generated(ref.sequences, pad)
    if beams:
        scores = torch.tensor([h.score for n in mine for h in n])
        assert torch.allclose(scores, ref.sequences_scores, atol=1e-5, rtol=0)


def test_translate_a_marian_directory_python_and_cli(marian, capsys, tmp_path: Path) -> None:
    directory, hf = marian
    translator = load_translator(directory, device="cpu")
    assert translator.decoding["beam_size"] == 4  # from generation_config.json
    texts = TEXTS[:3]
    tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    with torch.no_grad():
        out = generate_as_ours(hf, 63, **tokenizer(texts, return_tensors="pt", padding=True))
    expected = tokenizer.batch_decode(out, skip_special_tokens=True)
    assert all(expected), expected  # not vacuous
    assert translator.translate(texts) == expected
    assert translator.translate(texts, batch_size=2) == expected  # two batches, ours sorted by length
    for prefix in ("dog", "the big"):  # a forced prefix is tokenised on the target side, as HF's text_target
        assert translator.tokenizer.encode_target(prefix).ids == tokenizer(text_target=prefix).input_ids[:-1]
        assert all(t.startswith(prefix) for t in translator.translate(texts, prefix=prefix))
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(directory), "--device", "cpu", texts[1]]) == 0
    assert capsys.readouterr().out.splitlines() == [expected[1]]
    (tmp_path / "src.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(expected) + "\n")
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(directory),
                "--source",
                str(tmp_path / "src.txt"),
                "--reference",
                str(tmp_path / "ref.txt"),
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert json.loads(printed)["bleu"] == pytest.approx(100.0), (printed, expected)
    translator.save_pretrained(tmp_path / "again")  # written back: weights and sentencepiece files
    again = transformers.MarianMTModel.from_pretrained(tmp_path / "again").eval()
    batch = transformers.MarianTokenizer.from_pretrained(tmp_path / "again")(
        texts, return_tensors="pt", padding=True
    )
    with torch.no_grad():
        assert torch.equal(generate_as_ours(again, 63, **batch), out)


def test_marian_with_separate_vocabularies(tmp_path: Path) -> None:
    """share_encoder_decoder_embeddings=False: vocab.json + target_vocab.json, source.spm + target.spm,
    decoder_vocab_size; logits, tokenisation both ways and translations as transformers'."""
    src_pieces = train_spm(sentences(WORDS_DE, 400, 0), tmp_path / "source.spm")
    tgt_pieces = train_spm(sentences(WORDS_EN, 400, 1), tmp_path / "target.spm")
    vocabs = []
    for name, pieces in (("vocab.json", src_pieces), ("target_vocab.json", tgt_pieces)):
        vocab = {"</s>": 0, "<unk>": 1, "<pad>": 2}
        for piece in pieces:
            vocab.setdefault(piece, len(vocab))
        (tmp_path / name).write_text(json.dumps(vocab, ensure_ascii=False))
        vocabs.append(vocab)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}))
    config = transformers.MarianConfig(
        vocab_size=len(vocabs[0]),
        decoder_vocab_size=len(vocabs[1]),
        share_encoder_decoder_embeddings=False,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=2,
        eos_token_id=0,
        decoder_start_token_id=2,
        scale_embedding=True,
        dropout=0.0,
        init_std=0.15,
    )
    torch.manual_seed(4)
    hf = transformers.MarianMTModel(config).eval()
    perturb(hf, 4)
    with torch.no_grad():
        hf.final_logits_bias.normal_(0.0, 0.1)
        hf.final_logits_bias[0, 0] += EOS_BOOST
    hf.save_pretrained(tmp_path)
    ours, special, _ = load_marian(tmp_path)
    assert (ours.config.src_vocab_size, ours.config.tgt_vocab_size) == (len(vocabs[0]), len(vocabs[1]))
    theirs_tok, ours_tok = transformers.MarianTokenizer.from_pretrained(tmp_path), MarianTokenizer(tmp_path)
    for text in TEXTS:
        assert ours_tok.encode(text).ids + [0] == theirs_tok(text).input_ids
    ids = list(range(len(vocabs[1])))
    assert ours_tok.decode(ids) == theirs_tok.decode(
        ids, skip_special_tokens=True
    )  # target vocabulary and spm
    batch = theirs_tok(TEXTS[:3], return_tensors="pt", padding=True)
    tgt, tgt_mask = padded_batch([[2, 5, 9, 11], [2, 7], [2, 8, 8]], 2)
    tgt_mask[:, 0] = True
    with torch.no_grad():
        ref = hf(**batch, decoder_input_ids=tgt).logits
        assert max_diff_where(ours(batch.input_ids, tgt), ref, tgt_mask) < 1e-5
        expected = theirs_tok.batch_decode(generate_as_ours(hf, 63, **batch), skip_special_tokens=True)
    assert all(expected), expected
    assert load_translator(tmp_path, device="cpu").translate(TEXTS[:3], beam_size=1) == expected


def test_marian_checks(marian, tmp_path: Path) -> None:
    directory, hf = marian
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((directory / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(FileNotFoundError, match="pickle files are not loaded"):
        load_marian(pickled)
    bad = tmp_path / "bad"
    hf.config.activation_function = "tanh"
    try:
        hf.save_pretrained(bad)
    finally:
        hf.config.activation_function = "swish"
    with pytest.raises(CheckpointError, match="activation_function 'tanh' is not supported"):
        load_marian(bad)


def test_untied_marian_keeps_its_separate_embeddings(marian, tmp_path: Path) -> None:
    """A shared vocabulary with tie_word_embeddings false: transformers keeps the encoder's, decoder's
    and output matrices (and an unused model.shared) apart; they load apart, with the same logits."""
    _, hf = marian
    config = transformers.MarianConfig(**{**hf.config.to_dict(), "tie_word_embeddings": False})
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    assert model.model.encoder.embed_tokens.weight is not model.model.decoder.embed_tokens.weight
    perturb(model, 2)  # as fine-tuning would: every matrix its own
    model.save_pretrained(tmp_path)
    ours, special, _ = load_marian(tmp_path)
    assert not ours.config.share_embeddings and not ours.config.tie_output
    src, tgt = torch.tensor([[5, 6, 7, 8, 0]]), torch.tensor([[special["bos"], 9, 10, 11]])
    with torch.no_grad():
        diff = (model(input_ids=src, decoder_input_ids=tgt).logits - ours(src, tgt)).abs().max()
    assert float(diff) < 1e-4


def test_bert_decoders_are_refused(tmp_path: Path) -> None:
    """is_decoder (BertLMHeadModel, RobertaForCausalLM) makes attention causal: not our encoder."""
    transformers.BertModel(transformers.BertConfig(**BERT_SIZES, is_decoder=True)).save_pretrained(tmp_path)
    with pytest.raises(
        CheckpointError, match="config.json: is_decoder=true .causal self-attention. is not supported"
    ):
        load_bert_encoder(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "is_decoder": False, "add_cross_attention": True})
    )
    with pytest.raises(CheckpointError, match="config.json: add_cross_attention=true .* is not supported"):
        load_bert_encoder(tmp_path)


ENCODER_FAMILIES = {
    "roberta": lambda: transformers.RobertaConfig(
        pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5, max_position_embeddings=40, **BERT_SIZES
    ),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5, max_position_embeddings=40, **BERT_SIZES
    ),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=100,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=40,
        dropout=0.0,
        attention_dropout=0.0,
    ),
}
BERT_SIZES = dict(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


@pytest.mark.parametrize("family", sorted(ENCODER_FAMILIES))
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_encoder_families_equal_transformers(family, dtype, tolerance, tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = transformers.AutoModel.from_config(ENCODER_FAMILIES[family]()).eval()
    perturb(hf, 1)
    hf.save_pretrained(tmp_path)
    ours = load_bert_encoder(tmp_path).to(dtype)
    hf = hf.to(dtype)
    pad = hf.config.pad_token_id
    tokens, mask = padded_batch([[5, 17, 9, 33, 2], [7, 8, 2], [11, 12, 13, 14, 15, 16, 17, 18, 2]], pad)
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=mask, output_hidden_states=True)
        last, hidden = ours(tokens, mask, output_hidden_states=True)
    assert len(hidden) == len(ref.hidden_states)
    for mine, theirs in zip([*hidden[1:-1], last], ref.hidden_states[1:]):
        assert max_diff_where(mine, theirs, mask) < tolerance
    if family != "distilbert":
        assert ours.config.max_len == 40 - pad - 1  # positions counted from padding_idx + 1
        assert float((ours.pool(last) - ref.pooler_output).detach().abs().max()) < tolerance
    order = torch.argsort(mask, dim=1, stable=True)  # the same rows, padded on the left
    tokens, mask = tokens.gather(1, order), mask.gather(1, order)
    with torch.no_grad():  # RoBERTa and XLM-R count real tokens, BERT-style DistilBERT columns: as theirs
        assert (
            max_diff_where(
                ours(tokens, mask), hf(input_ids=tokens, attention_mask=mask).last_hidden_state, mask
            )
            < tolerance
        )


def test_roberta_sentence_embeddings_with_its_tokenizer_json(tmp_path: Path) -> None:
    """tokenizer.json (byte-level BPE, <s> ... </s>) read by our wrapper: same ids, same mean-pooled
    vectors."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(
        sentences(WORDS_EN, 300, 2),
        trainers.BpeTrainer(
            vocab_size=100, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    fast.save_pretrained(tmp_path)
    torch.manual_seed(1)
    config = transformers.RobertaConfig(
        pad_token_id=1,
        type_vocab_size=1,
        max_position_embeddings=66,
        **{**BERT_SIZES, "vocab_size": tok.get_vocab_size()},
    )
    hf = transformers.RobertaModel(config).eval()
    perturb(hf, 2)
    hf.save_pretrained(tmp_path)
    texts = [
        "a dog runs in the park.",
        "two cats",
        "the man rides over the bridge with a red ball and a blue one.",
    ]
    batch = fast(texts, padding=True, return_tensors="pt")
    ours = SentenceEncoder.from_pretrained(tmp_path)
    assert [ids for ids in ours.tokenizer.encode(texts)] == [fast(t).input_ids for t in texts]
    with torch.no_grad():
        states = hf(**batch).last_hidden_state
    mask = batch.attention_mask[..., None].float()
    expected = (states * mask).sum(1) / mask.sum(1)  # a plain directory: mean pooling, not normalised
    assert float((ours.encode(texts) - expected).abs().max()) < 1e-5
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(
        str(tmp_path), device="cpu"
    )  # (it says: mean pooling)
    assert float((ours.encode(texts) - reference.encode(texts, convert_to_tensor=True)).abs().max()) < 1e-5


@pytest.fixture(scope="module")
def trained_translator(tmp_path_factory) -> tuple[Path, Translator]:
    """Our recipe, post-LN (Marian's), the paper's interleaved positions, a few steps."""
    tmp = tmp_path_factory.mktemp("mt")
    recipe = tiny_recipe(tmp, max_steps=40, eval_every=40)
    recipe.model["norm_first"], recipe.average_last = False, 0  # one evaluation: nothing to average
    report = train_translation(recipe)
    checkpoint = tmp / "run" / report["test_checkpoint"]
    return checkpoint, load_translator(checkpoint, device="cpu")


def test_exported_translator_runs_in_transformers(trained_translator, tmp_path: Path, capsys) -> None:
    checkpoint, translator = trained_translator
    assert translator.model.config.sinusoidal_layout == "interleaved"  # exported by a change of basis
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = ["Ein rot hund läuft.", "Ein klein katze schläft und ein groß mann läuft."]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    assert [row[row != 0].tolist() for row in batch.input_ids] == translator.encode_sources(texts)
    tgt, tgt_mask = padded_batch([[1, 36, 310, 294], [1, 36, 316, 294, 281, 17, 2]], 0)
    with torch.no_grad():
        theirs = hf(**batch, decoder_input_ids=tgt).logits
        mine = translator.model(batch.input_ids, tgt)
        greedy = hf.generate(**batch, num_beams=1, max_new_tokens=20)
    assert max_diff_where(mine, exported_logits(theirs, hf, mine.shape[-1]), tgt_mask) < 1e-5
    translations = translator.translate(texts, beam_size=1)
    assert tokenizer.batch_decode(greedy, skip_special_tokens=True) == translations
    assert all(len(t.split()) >= 3 for t in translations), translations  # not vacuous: real sentences
    reloaded = load_translator(tmp_path / "hf", device="cpu")  # our loader reads our export too
    assert reloaded.encode_sources(texts) == translator.encode_sources(texts)
    assert reloaded.translate(texts) == translator.translate(texts)
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "hf")]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err


@pytest.mark.parametrize("share, tie", [(True, False), (False, True), (False, False)])
def test_every_embedding_sharing_exports(trained_translator, share, tie, tmp_path: Path) -> None:
    """Shared or separate embeddings, tied or separate output projection: each runs the same in
    transformers."""
    _, translator = trained_translator
    vocab = translator.model.config.src_vocab_size
    config = TransformerConfig(
        vocab,
        vocab,
        d_model=32,
        num_heads=2,
        d_ff=64,
        num_encoder_layers=1,
        num_decoder_layers=1,
        share_embeddings=share,
        tie_output=tie,
        dropout=0.0,
    )
    torch.manual_seed(3)
    model = Transformer(config).eval()
    perturb(model, 3)
    Translator(model, translator.tokenizer, translator.decoding, torch.device("cpu")).save_pretrained(
        tmp_path / "hf"
    )
    hf = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    src, src_mask = padded_batch(translator.encode_sources(["Ein rot hund läuft.", "Ein mann."]), 0)
    tgt, tgt_mask = padded_batch([[1, 36, 310, 294], [1, 36, 316]], 0)
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        assert max_diff_where(model(src, tgt), exported_logits(theirs, hf, vocab), tgt_mask) < 1e-5


def test_configurations_marian_cannot_express_are_named(trained_translator, tmp_path: Path) -> None:
    """Post-LN goes out as Marian, pre-LN as Pegasus; what neither has a place for is named, all at once."""
    _, translator = trained_translator
    sizes = {"d_model": 32, "num_heads": 2, "d_ff": 64, "num_encoder_layers": 1, "num_decoder_layers": 1}
    for options, message in (
        (
            {"norm_first": False, "final_norm": True, "positional": "learned"},
            r"a Marian checkpoint: final_norm=True with norm_first=False.*positional='learned'",
        ),
        (
            {"norm_first": True, "final_norm": False, "share_embeddings": False},
            r"a Pegasus checkpoint: norm_first=True without final_norm.*share_embeddings=False",
        ),
    ):
        model = Transformer(TransformerConfig(400, 400, **sizes, **options))
        with pytest.raises(ValueError, match=message):
            Translator(model, translator.tokenizer, translator.decoding, torch.device("cpu")).save_pretrained(
                tmp_path / "x"
            )
        assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_exported_classifier_encoder_runs_in_transformers(positional, tmp_path: Path) -> None:
    tokenizer = TextTokenizer(train_wordpiece(sentences(WORDS_EN, 300, 3), vocab_size=120), max_length=32)
    encoder = EncoderConfig(
        tokenizer.vocab_size,
        d_model=32,
        num_heads=4,
        num_layers=2,
        d_ff=64,
        norm_first=False,
        positional=positional,
        scale_embedding=True,
        embedding_norm=True,
        pad_id=tokenizer.pad_id,
        max_len=32,
        dropout=0.0,
    )
    torch.manual_seed(2)
    model = TextClassifier(ClassifierConfig(encoder, num_classes=3, pooling="pooler")).eval()
    LoadedClassifier(model, tokenizer, ["a", "b", "c"], torch.device("cpu")).save_pretrained(tmp_path / "hf")
    hf = transformers.AutoModel.from_pretrained(tmp_path / "hf").eval()  # the encoder of the classifier
    assert type(hf).__name__ == "BertModel"
    texts = ["a dog runs in the park.", "two red cats sleep"]
    batch = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(
        texts, padding=True, return_tensors="pt"
    )
    assert [
        row[m.bool()].tolist() for row, m in zip(batch.input_ids, batch.attention_mask)
    ] == tokenizer.encode(texts)
    mask = batch.attention_mask.bool()
    with torch.no_grad():
        mine = model.encoder(batch.input_ids, mask)
        theirs = hf(**batch).last_hidden_state
        again = load_bert_encoder(tmp_path / "hf")(batch.input_ids, mask)  # and back into ours
    assert max_diff_where(mine, theirs, mask) < 1e-5
    assert max_diff_where(mine, again, mask) < 1e-5


def test_trained_classifier_exports_through_the_cli(tmp_path: Path, capsys) -> None:
    """Our IMDB-style recipe made post-LN with BERT's pooler, trained; exported; transformers'
    BertForSequenceClassification gives our labels and probabilities."""
    from tasks.test_text_classification import tiny_recipe as classifier_recipe

    from scratchformer.tasks.classification import load_classifier, train_classifier

    recipe = classifier_recipe(tmp_path)
    recipe.pooling = "pooler"
    recipe.model.update(norm_first=False, embedding_norm=True, positional="sinusoidal")
    report = train_classifier(recipe)
    checkpoint = tmp_path / "run" / report["test_checkpoint"]
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "hf")]) == 0
    assert "wrote a Hugging Face" in capsys.readouterr().out
    ours = load_classifier(checkpoint, device="cpu")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    texts = ["the plot was superb", "a dull film", "superb acting but a dull and dull plot"]
    batch = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(
        texts, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        probabilities = torch.softmax(hf(**batch).logits, dim=-1)
    assert float((probabilities - ours.probabilities(texts)).abs().max()) < 1e-5
    assert probabilities.argmax(-1).tolist()[:2] == [1, 0]  # trained: the task is learned


def test_encoders_bert_cannot_express_are_named(tmp_path: Path) -> None:
    tokenizer = TextTokenizer(train_wordpiece(sentences(WORDS_EN, 100, 4), vocab_size=80), max_length=16)
    encoder = EncoderConfig(
        tokenizer.vocab_size, d_model=16, num_heads=2, num_layers=1, d_ff=32, norm_first=True
    )
    classifier = LoadedClassifier(
        TextClassifier(ClassifierConfig(encoder)), tokenizer, ["a", "b"], torch.device("cpu")
    )
    with pytest.raises(
        ValueError, match=r"norm_first=True \(BERT is post-LN\).*embedding_norm=False"
    ) as error:
        classifier.save_pretrained(tmp_path / "x")
    assert "a classifier with mean pooling has no Hugging Face" in str(error.value)  # every problem, one line
    assert not (tmp_path / "x").exists()


def test_an_export_is_written_as_the_umask_says(tmp_path: Path) -> None:
    """A shared folder can read an export: its folder and files follow the umask (safetensors alone
    writes 0600, mkdtemp 0700)."""
    import os

    import torch

    from scratchformer.formats.hf_files import write_export

    old = os.umask(0o022)
    try:
        out = write_export(tmp_path / "export", {"model_type": "bert"}, {"w": torch.zeros(2)})
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        "model.safetensors": 0o644,
        "config.json": 0o644,
    }
