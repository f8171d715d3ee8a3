"""ONNX exports run by ONNX Runtime, proven equal to the PyTorch models (built and, for the translator,
trained here; no download): the text classifier, the sentence encoder and the masked LM on random ids
and on real tokenised text, padded, at two batch sizes and lengths from one exported file; the
translator's encoder and cached decoder step by step, and greedy translations equal to
``Translator.translate(beam_size=1)``. A changed weight shows that the comparison can fail."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

from helpers import random_padding, randomize_norms  # noqa: E402
from tasks.test_translation import toy_pairs  # noqa: E402

from scratchformer.core.attention import MultiHeadAttention  # noqa: E402
from scratchformer.core.transformer import Transformer, TransformerConfig  # noqa: E402
from scratchformer.data.tokenization import TextTokenizer, train_bpe, train_wordpiece  # noqa: E402
from scratchformer.fast import optimize  # noqa: E402
from scratchformer.formats.hf_files import write_directory  # noqa: E402
from scratchformer.formats.onnx_export import (  # noqa: E402
    GraphAttention,
    OnnxTextModel,
    export_classifier_onnx,
    export_copy,
    export_masked_lm_onnx,
    export_sentence_encoder_onnx,
    onnx_session,
)
from scratchformer.formats.onnx_translator import OnnxTranslator, export_translator_onnx  # noqa: E402
from scratchformer.generation import DecoderCache, KVCache, greedy_decode  # noqa: E402
from scratchformer.models.classifier import ClassifierConfig, TextClassifier  # noqa: E402
from scratchformer.models.contextual import ContextualEncoder, EncoderConfig  # noqa: E402
from scratchformer.models.masked_lm import MaskedLanguageModel  # noqa: E402
from scratchformer.models.pooling import pool  # noqa: E402
from scratchformer.tasks.classification import LoadedClassifier  # noqa: E402
from scratchformer.tasks.sentence_embedding import SentenceEncoder  # noqa: E402
from scratchformer.tasks.shared import pad_ids  # noqa: E402
from scratchformer.tasks.translation import Translator  # noqa: E402

TOL = 1e-4
SHAPES = ((3, 11), (6, 29))  # two batch sizes and lengths, one exported file
WORDS = (
    "the a this film movie story plot actor music was is were great terrible boring wonderful slow "
    "and but not very really i we loved hated it ending scenes funny sad long short"
).split()


def texts(n: int, seed: int, longest: int = 24) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))).capitalize() + rng.choice(".!?")
        for _ in range(n)
    ]


def diff(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def random_batch(batch: int, length: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids in [0, V) and the (B, L) bool mask of random right padding (some rows full)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g), random_padding(batch, length, g)


def feeds(ids: torch.Tensor, mask: torch.Tensor, types: bool = False) -> dict[str, np.ndarray]:
    out = {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy()}
    return {**out, "token_type_ids": np.zeros_like(out["input_ids"])} if types else out


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models on a busy machine: one thread each (two threads fight over two busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def wordpiece() -> Any:
    return train_wordpiece(texts(300, 0), vocab_size=160)


@pytest.fixture(scope="module")
def classifier(wordpiece: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[LoadedClassifier, Path]:
    """A 3-class classifier (token types, pre-LN, embedding norm; fast paths on), its head + tail
    tokenizer (16 tokens) and its export."""
    torch.manual_seed(0)
    encoder = EncoderConfig(
        wordpiece.get_vocab_size(),
        d_model=32,
        num_heads=4,
        num_layers=2,
        d_ff=64,
        max_len=32,
        dropout=0.0,
        type_vocab_size=2,
        norm_first=True,
        embedding_norm=True,
    )
    model = TextClassifier(ClassifierConfig(encoder, num_classes=3, head_dropout=0.0))
    randomize_norms(model, torch.Generator().manual_seed(1))
    model = optimize(model.eval())
    tokenizer = TextTokenizer(wordpiece, 16, truncation="head_tail", head_length=4)
    loaded = LoadedClassifier(model, tokenizer, ["bad", "fine", "good"], torch.device("cpu"))
    directory = tmp_path_factory.mktemp("onnx") / "classifier"
    export_classifier_onnx(model, tokenizer, directory, loaded.label_names)
    return loaded, directory


@pytest.fixture(scope="module")
def sentence_encoder(
    wordpiece: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[SentenceEncoder, Path]:
    """RoBERTa-like positions (they skip padding); SentenceEncoder switches on its packing fast path."""
    torch.manual_seed(2)
    config = EncoderConfig(
        wordpiece.get_vocab_size(),
        d_model=48,
        num_heads=4,
        num_layers=2,
        d_ff=96,
        max_len=32,
        dropout=0.0,
        type_vocab_size=2,
        positions_skip_padding=True,
    )
    tokenizer = TextTokenizer(copy.deepcopy(wordpiece), 24)
    model = SentenceEncoder(ContextualEncoder(config), tokenizer, "mean", normalize=True)
    directory = tmp_path_factory.mktemp("onnx") / "sentence"
    export_sentence_encoder_onnx(model.encoder, tokenizer, directory, model.pooling, model.normalize)
    return model, directory


@pytest.fixture(scope="module")
def masked_lm(wordpiece: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskedLanguageModel, Path]:
    """Sinusoidal positions, scaled embeddings, post-LN, GELU; the output tied to the embedding."""
    torch.manual_seed(3)
    config = EncoderConfig(
        wordpiece.get_vocab_size(),
        d_model=32,
        num_heads=2,
        num_layers=2,
        d_ff=64,
        max_len=32,
        dropout=0.0,
        positional="sinusoidal",
    )
    model = MaskedLanguageModel(config).eval()
    randomize_norms(model, torch.Generator().manual_seed(4))
    directory = tmp_path_factory.mktemp("onnx") / "mlm"
    export_masked_lm_onnx(model, TextTokenizer(copy.deepcopy(wordpiece), 32), directory)
    return model, directory


def train_toy_translator() -> Translator:
    """A two-decoder-layer Transformer taught the toy language pair for 40 steps (about a second)."""
    sources, targets = toy_pairs(300, 0)
    tokenizer = train_bpe(sources + targets, 300)
    V = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    config = TransformerConfig(
        V,
        V,
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_encoder_layers=1,
        num_decoder_layers=2,
        dropout=0.0,
        max_len=64,
        norm_first=True,
        share_embeddings=True,
        tie_output=True,
    )
    model = Transformer(config)
    ids = [e.ids for e in tokenizer.encode_batch(sources + targets, add_special_tokens=False)]
    src, tgt = [x + [2] for x in ids[: len(sources)]], [[1] + x + [2] for x in ids[len(sources) :]]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        index = torch.randint(0, len(src), (32,), generator=g).tolist()
        s, t = pad_ids([src[i] for i in index]), pad_ids([tgt[i] for i in index])
        logits = model(s, t[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), t[:, 1:].reshape(-1), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    decoding = {"beam_size": 1, "max_len_a": 1.5, "max_len_b": 5}
    return Translator(optimize(model.eval()), tokenizer, decoding, torch.device("cpu"))


@pytest.fixture(scope="module")
def translator(tmp_path_factory: pytest.TempPathFactory) -> tuple[Translator, OnnxTranslator]:
    model = train_toy_translator()
    directory = tmp_path_factory.mktemp("onnx") / "translator"
    export_translator_onnx(model.model, model.tokenizer, directory, model.special_ids, model.decoding)
    return model, OnnxTranslator(directory, threads=1)


@torch.no_grad()
def test_classifier_equals_pytorch_on_random_ids(classifier: tuple[LoadedClassifier, Path]) -> None:
    loaded, directory = classifier
    session = onnx_session(directory / "model.onnx", threads=1)
    for i, (B, L) in enumerate(SHAPES):
        ids, mask = random_batch(B, L, loaded.model.config.encoder.vocab_size, seed=i)
        types = (torch.rand(B, L, generator=torch.Generator().manual_seed(i)) < 0.5).long()
        logits, probs = session.run(None, {**feeds(ids, mask), "token_type_ids": types.numpy()})
        expected = loaded.model(ids, mask, types)
        assert logits.shape == (B, 3) and diff(logits, expected) < TOL
        assert diff(probs, expected.softmax(-1)) < TOL


@torch.no_grad()
def test_classifier_equals_pytorch_on_text(classifier: tuple[LoadedClassifier, Path]) -> None:
    """Tokenised by the export's own settings (head + tail truncation at 16 tokens), then ONNX Runtime."""
    loaded, directory = classifier
    runner = OnnxTextModel(directory, threads=1)
    assert runner.description["labels"] == ["bad", "fine", "good"]
    for n, seed in ((2, 10), (7, 11)):
        batch = texts(n, seed) + [" ".join(WORDS), "Great!"]  # one cut to 16 tokens, one padded
        inputs = runner.inputs(batch)
        expected_ids = loaded.tokenizer(batch).ids
        assert np.array_equal(inputs["input_ids"], expected_ids.numpy())  # the same ids, truncated alike
        assert inputs["attention_mask"].min() == 0 and inputs["input_ids"].shape[1] == 16  # padded and cut
        assert diff(runner(batch)["probabilities"], loaded.probabilities(batch)) < TOL


@torch.no_grad()
def test_sentence_encoder_equals_pytorch(sentence_encoder: tuple[SentenceEncoder, Path]) -> None:
    model, directory = sentence_encoder
    session = onnx_session(directory / "model.onnx", threads=1)
    for i, (B, L) in enumerate(SHAPES):
        ids, mask = random_batch(B, L, model.encoder.config.vocab_size, seed=20 + i)
        (got,) = session.run(None, feeds(ids, mask, types=True))
        assert got.shape == (B, 48) and diff(got, pool(model.encoder(ids, mask), mask, "mean", True)) < TOL
    runner = OnnxTextModel(directory, threads=1)
    for n, seed in ((3, 21), (9, 22)):
        batch = texts(n, seed, longest=40)  # some cut at 24 tokens
        got = runner(batch)["sentence_embedding"]
        assert diff(got, model.encode(batch, batch_size=4)) < TOL
        assert diff(np.linalg.norm(got, axis=1), 1.0) < TOL


@torch.no_grad()
def test_masked_lm_equals_pytorch(masked_lm: tuple[MaskedLanguageModel, Path]) -> None:
    model, directory = masked_lm
    session = onnx_session(directory / "model.onnx", threads=1)
    V = model.config.vocab_size
    for i, (B, L) in enumerate(SHAPES):
        ids, mask = random_batch(B, L, V, seed=30 + i)
        mask[-1] = False  # a row of padding only: its queries attend to nothing and get zeros, not NaN
        (logits,) = session.run(None, feeds(ids, mask))
        assert logits.shape == (B, L, V) and diff(logits, model(ids, mask)) < TOL
    runner = OnnxTextModel(directory, threads=1)
    for n, seed in ((1, 31), (5, 32)):
        inputs = runner.inputs(texts(n, seed))
        ids, mask = torch.from_numpy(inputs["input_ids"]), torch.from_numpy(inputs["attention_mask"]).bool()
        assert diff(runner(texts(n, seed))["logits"], model(ids, mask)) < TOL


@torch.no_grad()
def test_graph_attention_equals_the_core_attention() -> None:
    """The attention traced into the graphs (an additive bias, no NaN guard) against the core's fused
    kernel: key padding with a query that sees no key, causal masks with T = S and T < S (a cache)."""
    torch.manual_seed(5)
    core = MultiHeadAttention(32, 4).eval()
    graph = export_copy(core)
    assert type(graph) is GraphAttention
    x, memory = torch.randn(3, 6, 32), torch.randn(3, 9, 32)
    keys = random_padding(3, 9, torch.Generator().manual_seed(6))
    keys[2] = False
    assert diff(graph(x, memory, key_padding_mask=keys)[0], core(x, memory, key_padding_mask=keys)[0]) < 1e-6
    assert diff(graph(x, is_causal=True)[0], core(x, is_causal=True)[0]) < 1e-6
    past = torch.randn(3, 4, 5, 8)
    outputs = []
    for attention in (core, graph):
        cache = KVCache(past.clone(), past.clone())
        outputs.append(attention(x, is_causal=True, cache=cache)[0])  # 6 queries after 5 cached keys
    assert diff(*outputs) < 1e-6


def test_exports_are_opset_18_with_dynamic_axes(
    classifier: tuple[LoadedClassifier, Path], translator: tuple[Translator, OnnxTranslator]
) -> None:
    _, directory = classifier
    graph = onnx.load(str(directory / "model.onnx"))
    assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= 17
    dims = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input
    }
    assert dims == {name: ["batch", "length"] for name in ("input_ids", "attention_mask", "token_type_ids")}
    assert sorted(p.name for p in directory.iterdir()) == ["model.onnx", "onnx_export.json", "tokenizer.json"]
    description = json.loads((directory / "onnx_export.json").read_text())
    assert description["tokenizer"]["truncation"] == "head_tail" and description["pooling"] == "mean"
    decoder = translator[1].decoder
    shapes = {i.name: i.shape for i in decoder.get_inputs()}
    assert shapes["past_key_values.1.decoder.key"] == ["batch", 4, "past", 8]
    assert shapes["past_key_values.1.encoder.value"] == ["batch", 4, "source", 8]


@torch.no_grad()
def test_translator_encoder_and_cached_decoder_equal_pytorch_step_by_step(
    translator: tuple[Translator, OnnxTranslator],
) -> None:
    torch_model, onnx_model = translator[0].model, translator[1]
    for i, (B, S) in enumerate(((2, 5), (5, 13))):
        src, mask = random_batch(B, S, torch_model.config.src_vocab_size, seed=40 + i)
        src = src.clamp(min=3).masked_fill(~mask, 0)
        memory = torch_model.encode(src, mask)
        (hidden,) = onnx_model.encoder.run(["last_hidden_state"], feeds(src, mask))
        assert diff(hidden[mask.numpy()], memory[mask]) < TOL
        onnx_mask, caches = onnx_model.start(src.numpy())
        cache, tokens = DecoderCache(len(torch_model.decoder.layers)), torch.full((B, 1), 1)
        for _ in range(6):
            expected = torch_model.decode(tokens[:, -1:], memory, mask, cache=cache)[:, -1]
            logits, caches = onnx_model.step(tokens[:, -1:].numpy(), onnx_mask, caches)
            assert diff(logits, expected) < TOL
            assert caches["past_key_values.1.decoder.key"].shape == (B, 4, tokens.shape[1], 8)
            tokens = torch.cat([tokens, expected.argmax(-1, keepdim=True)], dim=1)


def test_onnx_translator_translates_as_the_translator(translator: tuple[Translator, OnnxTranslator]) -> None:
    torch_model, onnx_model = translator
    sources = toy_pairs(12, 5)[0] + [
        "Ein blau mann schläft.",
        "Hallo Welt, wie geht es dir?",
        "x",
        "</s> <pad>",
    ]
    expected = torch_model.translate(sources, beam_size=1, batch_size=5)
    assert onnx_model.translate(sources, batch_size=5) == expected
    assert sum(t.endswith(".") for t in expected) >= 10  # the model ends sentences: eos, not only the limit
    src = pad_ids(onnx_model.encode_sources(sources))  # the length limit: a * S + b = 3, the last forced eos
    limited = greedy_decode(torch_model.model, src, bos_id=1, eos_id=2, max_len_a=0.0, max_len_b=3)
    got = onnx_model.greedy(src.numpy(), max_len_a=0.0, max_len_b=3)
    assert [row[: row.index(2) + 1] for row in limited.tolist()] == got
    assert max(len(row) for row in got) == 3


@torch.no_grad()
def test_a_changed_weight_fails_the_comparison(
    classifier: tuple[LoadedClassifier, Path], translator: tuple[Translator, OnnxTranslator]
) -> None:
    """The parity checks above can fail: one weight changed after the export shows beyond 1e-4."""
    loaded, directory = classifier
    changed = copy.deepcopy(loaded.model)
    changed.encoder.encoder.layers[1].feed_forward.linear2.weight[0, 0] += 0.5
    ids, mask = random_batch(*SHAPES[1], changed.config.encoder.vocab_size, seed=50)
    logits, _ = onnx_session(directory / "model.onnx", threads=1).run(None, feeds(ids, mask, types=True))
    assert diff(logits, loaded.model(ids, mask)) < TOL < diff(logits, changed(ids, mask))

    torch_model, onnx_model = copy.deepcopy(translator[0].model), translator[1]
    torch_model.decoder.layers[1].cross_attn.qkv_proj.weight[40, 0] += 0.5  # a key of the memory
    src = pad_ids(onnx_model.encode_sources(["Ein rot hund läuft.", "Ein klein katze schläft."]))
    memory, tokens = torch_model.encode(src), torch.full((2, 1), 1)
    logits, _ = onnx_model.step(tokens.numpy(), *onnx_model.start(src.numpy()))
    assert diff(logits, torch_model.decode(tokens, memory, src != 0)[:, -1]) > TOL


def test_bad_input_is_refused_before_any_work(
    classifier: tuple[LoadedClassifier, Path], tmp_path: Path
) -> None:
    loaded, directory = classifier
    with pytest.raises(FileExistsError, match="not empty"):
        export_classifier_onnx(loaded.model, loaded.tokenizer, directory)
    with pytest.raises(ValueError, match="3 classes, got 2 names"):
        export_classifier_onnx(loaded.model, loaded.tokenizer, tmp_path / "a", ["x", "y"])
    with pytest.raises(ValueError, match="expected a TextClassifier"):
        export_classifier_onnx(loaded.model.encoder, loaded.tokenizer, tmp_path / "a")
    with pytest.raises(ValueError, match="pooling"):
        export_sentence_encoder_onnx(loaded.model.encoder, loaded.tokenizer, tmp_path / "a", "max")
    with pytest.raises(ValueError, match="tokenizers.Tokenizer"):
        export_masked_lm_onnx(
            MaskedLanguageModel(EncoderConfig(50, d_model=8, num_heads=2)), object(), tmp_path
        )
    with pytest.raises(ValueError, match="threads"):
        onnx_session(directory / "model.onnx", threads=-1)
    with pytest.raises(ValueError, match="expected one of \\['translator'\\]"):
        OnnxTranslator(directory)
    with pytest.raises(ValueError, match="special_ids"):
        export_translator_onnx(
            Transformer(TransformerConfig(200, 200, d_model=8, num_heads=2, d_ff=8)),
            loaded.tokenizer,
            tmp_path / "a",
            {"pad": 0, "bos": 2, "eos": 2},
        )
    assert not list(tmp_path.iterdir())  # nothing written

    def fail(tmp: Path) -> None:
        (tmp / "model.onnx").write_bytes(b"half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_directory(tmp_path / "out", fail)
    assert not list(tmp_path.iterdir())  # no half export, no temporary left
