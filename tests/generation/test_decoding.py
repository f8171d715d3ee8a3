"""Greedy decoding with the key/value cache == recomputing the prefix; batching changes nothing."""

from __future__ import annotations

import pytest
import torch

import scratchformer as sf

BOS, EOS, PAD = 1, 2, 0


def random_model(seed: int, norm_first: bool = False) -> sf.Transformer:
    torch.manual_seed(seed)
    cfg = sf.TransformerConfig(
        src_vocab_size=25,
        tgt_vocab_size=25,
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.0,
        norm_first=norm_first,
    )
    return sf.Transformer(cfg).eval()


def sources(gen: torch.Generator, lengths=(7, 3, 5, 1)) -> torch.Tensor:
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, 25, (n,), generator=gen)
    return src


@pytest.mark.parametrize("seed", range(4))
def test_cached_equals_uncached(seed: int) -> None:
    model = random_model(seed, norm_first=bool(seed % 2))
    src = sources(torch.Generator().manual_seed(seed))
    cached, cached_logits = sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, return_logits=True)
    plain, plain_logits = sf.greedy_decode(
        model, src, bos_id=BOS, eos_id=EOS, use_cache=False, return_logits=True
    )
    assert torch.equal(cached, plain)
    # Compare the logits of rows still decoding (finished rows are padding from then on).
    alive = torch.ones_like(cached, dtype=torch.bool)
    alive[:, 1:] = (cached[:, :-1] != EOS).cumprod(dim=1).bool()
    assert (cached_logits - plain_logits).abs()[alive].max().item() <= 1e-5


def test_batch_equals_one_by_one() -> None:
    model = random_model(7)
    src = sources(torch.Generator().manual_seed(7))
    batch = sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_a=0, max_len_b=12)
    for i in range(src.shape[0]):
        n = int((src[i] != PAD).sum())
        single = sf.greedy_decode(
            model, src[i : i + 1, :n], bos_id=BOS, eos_id=EOS, max_len_a=0, max_len_b=12
        )
        got = batch[i, : single.shape[1]]
        assert torch.equal(got, single[0])
        assert torch.all(batch[i, single.shape[1] :] == PAD)


def test_finished_sentences_stop_growing_and_pad_is_never_generated() -> None:
    model = random_model(3)
    # Make EOS the favourite right after a specific token: bias the output layer.
    with torch.no_grad():
        model.generator.bias[EOS] += 8.0
    src = sources(torch.Generator().manual_seed(3))
    out = sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_b=15)
    for row in out.tolist():
        assert EOS in row
        after = row[row.index(EOS) + 1 :]
        assert all(t == PAD for t in after)
        assert PAD not in row[: row.index(EOS)] and BOS not in row


def test_decoder_cache_reorder_selects_batch_rows() -> None:
    model = random_model(1)
    src = sources(torch.Generator().manual_seed(1))
    memory = model.encode(src)
    cache = sf.DecoderCache(len(model.decoder.layers))
    model.decode(torch.full((4, 1), BOS), memory, src != PAD, cache=cache)
    k_before = cache.layers[0].self_attn.k.clone()
    cache.reorder(torch.tensor([2, 2, 0]))
    assert len(cache) == 1
    assert torch.equal(cache.layers[0].self_attn.k, k_before[[2, 2, 0]])
    assert cache.layers[1].cross_attn.k.shape[0] == 3


def test_cached_decoding_feeds_one_position_per_step() -> None:
    """The prefix is never recomputed: every decoder self-attention call sees one new query."""
    model = random_model(2)
    seen: list[int] = []
    attention = model.decoder.layers[0].self_attn  # its query (B, T, D): T new positions
    hook = attention.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        out = sf.greedy_decode(
            model, sources(torch.Generator().manual_seed(2)), bos_id=BOS, eos_id=EOS, max_len_b=6
        )
    finally:
        hook.remove()
    assert len(seen) == out.shape[1] and set(seen) == {1}


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_chunked_cached_decode_equals_full_decode(positional: str) -> None:
    torch.manual_seed(0)
    cfg = sf.TransformerConfig(
        src_vocab_size=25,
        tgt_vocab_size=25,
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.0,
        positional=positional,
        max_len=32,
    )
    model = sf.Transformer(cfg).eval()
    src = sources(torch.Generator().manual_seed(4))
    tgt = torch.randint(3, 25, (src.shape[0], 6), generator=torch.Generator().manual_seed(5))
    memory = model.encode(src)
    full = model.decode(tgt, memory, src != PAD)
    cache = sf.DecoderCache(len(model.decoder.layers))
    chunks = [model.decode(tgt[:, a:b], memory, src != PAD, cache=cache) for a, b in [(0, 3), (3, 4), (4, 6)]]
    assert len(cache) == 6
    assert (torch.cat(chunks, dim=1) - full).abs().max().item() <= 1e-5


def test_bos_equal_to_pad_decodes_the_same_cached_and_uncached() -> None:
    """T5's convention (decoder start = pad): no target padding mask hides the start token."""
    model = random_model(5)
    src = sources(torch.Generator().manual_seed(5))
    cached, lc = sf.greedy_decode(model, src, bos_id=PAD, eos_id=EOS, return_logits=True)
    plain, lp = sf.greedy_decode(model, src, bos_id=PAD, eos_id=EOS, use_cache=False, return_logits=True)
    assert torch.equal(cached, plain)
    assert (lc[:, 0] - lp[:, 0]).abs().max().item() <= 1e-5
