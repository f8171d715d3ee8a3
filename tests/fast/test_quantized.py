"""Int8 and bf16 serving (fast/quantized.py, Translator.with_precision), checked against the fp32
model on a tiny translator trained here: logits within a measured bound, the same translations, the
same BLEU; every linear map really int8; the original model untouched; bad requests refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from tasks.test_translation import tiny_recipe, toy_pairs
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from scratchformer.core.attention import MultiHeadAttention
from scratchformer.fast import FastMultiHeadAttention
from scratchformer.fast.quantized import QuantizedMultiHeadAttention, model_precision, quantize_int8
from scratchformer.generation.cache import DecoderCache
from scratchformer.tasks.shared import pad_ids
from scratchformer.tasks.translation import Translator, bleu_and_chrf, load_translator, train_translation

# ||int8 logits - fp32 logits|| / ||fp32 logits|| over the real target positions. Measured on this
# model: 0.022 (one scale per weight row), 0.025 (one per matrix); bf16: 0.006. Int8 rounding
# leaves about 0.5-1 % relative error in each linear map (weights and inputs on a 255-step grid,
# step max|w| / 127), and the logits pass through 9 maps in a row (two layers); 0.05 is twice the
# measurement and ten times below what a wrong slice of [W^Q; W^K; W^V] gives (0.62, see below).
INT8_BOUND = 0.05
BF16_BOUND = 0.02  # bf16 keeps 8 mantissa bits: 0.4 % per rounding


@pytest.fixture(scope="module")
def translator(tmp_path_factory: pytest.TempPathFactory) -> Translator:
    """The tiny recipe (pre-LN, shared embeddings, tied output), 40 steps: it ends its sentences."""
    tmp = tmp_path_factory.mktemp("int8")
    recipe = tiny_recipe(tmp, max_steps=40, eval_every=40)
    recipe.average_last = 0
    report = train_translation(recipe)
    return load_translator(Path(tmp) / "run" / report["test_checkpoint"], device="cpu")


@pytest.fixture(scope="module")
def pairs() -> tuple[list[str], list[str]]:
    return toy_pairs(40, 2)  # the recipe's test split


@pytest.fixture(scope="module")
def batch(translator: Translator, pairs: tuple[list[str], list[str]]) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher forcing on the test pairs: src (B, S), tgt (B, T) starting with BOS, and the real
    target positions (B, T)."""
    sources, references = pairs
    src = pad_ids(translator.encode_sources(sources), pad_id=translator.pad)
    tgt = pad_ids(
        [[translator.bos, *ids] for ids in translator.encode_sources(references)], pad_id=translator.pad
    )
    return src, tgt, tgt != translator.pad


def relative_error(model: nn.Module, reference: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> float:
    """||logits - reference logits|| / ||reference logits|| at the real target positions."""
    src, tgt, real = batch
    with torch.no_grad():
        logits, expected = model(src, tgt).float()[real], reference(src, tgt)[real]
    return float((logits - expected).norm() / expected.norm())


@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_logits_are_close_to_fp32(translator: Translator, batch, per_channel: bool) -> None:
    int8 = quantize_int8(translator.model, per_channel=per_channel)
    assert 0 < relative_error(int8, translator.model, batch) < INT8_BOUND  # 0: nothing was quantized
    src, tgt, real = batch
    with torch.no_grad():
        same = int8(src, tgt).argmax(-1) == translator.model(src, tgt).argmax(-1)
    assert float(same[real].float().mean()) > 0.95


def test_a_wrong_slice_of_the_stacked_projection_fails_the_comparison(translator: Translator, batch) -> None:
    """The mutation check: a cross-attention query made with W^K (the rows a wrong ``project``
    would take) puts the logits far outside the bound."""
    mutated = copy.deepcopy(translator.model)
    attn, D = mutated.decoder.layers[0].cross_attn, translator.model.config.d_model
    with torch.no_grad():
        attn.qkv_proj.weight[:D] = attn.qkv_proj.weight[D : 2 * D].clone()
    assert relative_error(quantize_int8(mutated), translator.model, batch) > 4 * INT8_BOUND


def test_every_linear_map_is_int8(translator: Translator) -> None:
    model = translator.model
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    attentions = sum(isinstance(m, MultiHeadAttention) for m in model.modules())
    int8 = quantize_int8(model)
    assert not [name for name, m in int8.named_modules() if isinstance(m, nn.Linear)]
    quantized = [m for m in int8.modules() if isinstance(m, DynamicQuantizedLinear)]
    assert len(quantized) == linears + 2 * attentions  # each attention: W^Q rows, [W^K; W^V] rows
    assert isinstance(int8.generator, DynamicQuantizedLinear)  # the tied output projection too
    assert all(m.weight().dtype == torch.qint8 for m in quantized)
    assert model_precision(int8) == "int8" and model_precision(model) == "fp32"
    x = torch.randn(3, 5, model.config.d_model)
    for attn in (m for m in int8.modules() if isinstance(m, MultiHeadAttention)):
        assert isinstance(attn, QuantizedMultiHeadAttention)
        stacked = attn.qkv_proj(x)  # row scales: the split maps are the same int8 rows, exactly
        assert torch.equal(attn.q_proj(x), stacked[..., : attn.d_model])
        assert torch.equal(attn.kv_proj(x), stacked[..., attn.d_model :])


def test_every_kind_of_attention_call_works_in_int8() -> None:
    """Self-attention, cross-attention with key is value (the decoder's), with separate keys and
    values, and with the memory's keys/values cached: each as the fp32 layer within the bound."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    int8 = quantize_int8(attn)
    x, memory, values = torch.randn(2, 5, 32), torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    calls = [(x,), (x, memory), (x, memory, values)]
    for args in calls:
        with torch.no_grad():
            out, expected = int8(*args)[0], attn(*args)[0]
        assert 0 < float((out - expected).norm() / expected.norm()) < INT8_BOUND, len(args)
    cache = DecoderCache(1).layers[0].cross_attn
    with torch.no_grad():
        first = int8(x[:, :1], memory, static_kv=True, cache=cache)[0]
        again = int8(x[:, 1:2], None, static_kv=True, cache=cache)[0]
        assert torch.equal(first, int8(x[:, :1], memory)[0]) and torch.equal(
            again, int8(x[:, 1:2], memory)[0]
        )


@pytest.mark.parametrize("precision, margin", [("int8", 2.0), ("bf16", 1.0)])
def test_int8_and_bf16_translate_as_fp32(
    translator: Translator, pairs, precision: str, margin: float
) -> None:
    sources, references = pairs
    served = translator.with_precision(precision)
    assert model_precision(served.model) == precision
    for beam_size in (1, 3):
        fp32 = translator.translate(sources, beam_size=beam_size)
        other = served.translate(sources, beam_size=beam_size)
        assert all(len(t.split()) >= 3 for t in fp32), fp32  # not vacuous: real, ended sentences
        assert sum(a == b for a, b in zip(fp32, other)) >= 0.9 * len(sources)
        assert (
            abs(bleu_and_chrf(other, references)["bleu"] - bleu_and_chrf(fp32, references)["bleu"]) < margin
        )


def test_bf16_logits_and_decoding_step(translator: Translator, batch) -> None:
    """bf16 logits within their bound; a decoding step's single bf16 query takes the fast path
    (attention in fp32) and its next-token scores are those of the whole prefix."""
    bf16 = translator.with_precision("bf16").model
    assert relative_error(bf16, translator.model, batch) < BF16_BOUND
    assert all(type(m) is FastMultiHeadAttention for m in bf16.modules() if isinstance(m, MultiHeadAttention))
    src, tgt, _ = batch
    with torch.no_grad():
        memory = bf16.encode(src)
        whole = bf16.decode(tgt[:, :3], memory, bf16.source_padding_mask(src))[:, -1].float()
        cache = DecoderCache(len(bf16.decoder.layers))
        for t in range(3):
            step = bf16.decode(tgt[:, t : t + 1], memory, bf16.source_padding_mask(src), cache=cache)
    assert float((step[:, -1].float() - whole).norm() / whole.norm()) < BF16_BOUND


def test_the_original_translator_is_untouched(translator: Translator) -> None:
    state = {k: v.clone() for k, v in translator.model.state_dict().items()}
    classes = [type(m) for m in translator.model.modules()]
    int8, bf16 = translator.with_precision("int8"), translator.with_precision("bf16")
    assert int8.model is not translator.model and bf16.model is not translator.model
    assert [type(m) for m in translator.model.modules()] == classes
    assert all(torch.equal(v, state[k]) for k, v in translator.model.state_dict().items())
    assert translator.with_precision("fp32") is translator and bf16.with_precision("bf16") is bf16
    assert translator.model.generator.weight is translator.model.tgt_embed.weight  # still tied


def test_bad_requests_are_refused(translator: Translator) -> None:
    with pytest.raises(ValueError, match="expected 'auto', 'fp32', 'bf16' or 'int8', got 'fp16'"):
        translator.with_precision("fp16")
    with pytest.raises(ValueError, match="this translator is bf16; load it again"):
        translator.with_precision("bf16").with_precision("int8")
    with pytest.raises(ValueError, match="int8: the model is quantized already"):
        quantize_int8(quantize_int8(translator.model))
    devices = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])  # meta: any device but the CPU
    for device in devices:
        elsewhere = copy.deepcopy(translator.model).to(device)
        away = Translator(elsewhere, translator.tokenizer, translator.decoding, torch.device(device))
        with pytest.raises(ValueError, match=f"int8: dynamic quantization runs on the CPU only, .*{device}"):
            away.with_precision("int8")
