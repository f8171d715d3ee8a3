"""Would ``torch.compile`` speed up a decoding step? One step of a trained translator's decoder at
batch 1 and batch 32 (beam 5: 5 and 160 rows), three ways, interleaved in one process:

- ``eager``: :class:`~scratchformer.generation.fast_step.DecoderStep`, what ``fast_beam_search`` runs;
- ``static``: the same step written as one function of tensors at static shapes, as a compiled
  step needs it (the self-attention cache at its final length and masked past position t, t a
  tensor, the memory's keys/values and mask as arguments), run eagerly;
- ``compiled``: that function compiled by inductor (freezing on, static shapes, ``fullgraph``).

::

    python -m benchmarks.compiled_step --checkpoint runs/multi30k/best [--threads 2] [--repeats 300]

Prints one JSON line per batch (``--out FILE`` also writes them there): the machine, each way's
median milliseconds a step, the compile seconds, and the largest difference of the compiled logits
from ``eager``'s. ``--backend eager`` runs dynamo without
inductor (the tests' quick check of the function).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from benchmarks.harness import Case, Group, run_group
from scratchformer.core.feedforward import ACTIVATIONS


def static_step(model: torch.nn.Module) -> Callable[..., Tensor]:
    """The decoder step of ``model`` (a :class:`~scratchformer.core.transformer.Transformer` with
    sinusoidal positions, eval mode) as one function of tensors:

    tokens (N,), t (1,) the position, k_cache/v_cache lists of (N, H, L, d_k), memory_k/memory_v
    lists of (Bs, H, S, d_k), memory_mask (Bs, 1, 1, S) True = real, beams -> logits (N, V)."""
    layers, D = list(model.decoder.layers), model.config.d_model
    H, d_k = layers[0].self_attn.num_heads, layers[0].self_attn.d_k

    def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
        scores = torch.matmul(q * scale, k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def sublayer(layer, x: Tensor, f: Callable[[Tensor], Tensor], norm) -> Tensor:
        return x + f(norm(x)) if layer.norm_first else norm(x + f(x))

    def step(tokens, t, k_cache, v_cache, memory_k, memory_v, memory_mask, beams: int) -> Tensor:
        N, L = tokens.shape[0], k_cache[0].shape[2]
        x = F.embedding(tokens, model.tgt_embed.weight) * model.tgt_embed.scale
        x = x + model.tgt_pos.table.index_select(0, t)  # (N, D)
        seen = (torch.arange(L, device=t.device) <= t)[None, None, None, :]  # positions 0..t
        for i, layer in enumerate(layers):
            sa, ca, ff = layer.self_attn, layer.cross_attn, layer.feed_forward

            def self_attention(y: Tensor, i: int = i, sa=sa) -> Tensor:
                q, k, v = F.linear(y, sa.qkv_proj.weight, sa.qkv_proj.bias).view(N, 3, H, 1, d_k).unbind(1)
                k_cache[i].index_copy_(2, t, k)
                v_cache[i].index_copy_(2, t, v)
                out = attend(q, k_cache[i], v_cache[i], seen, sa.scale).reshape(N, D)
                return F.linear(out, sa.out_proj.weight, sa.out_proj.bias)

            def cross_attention(y: Tensor, i: int = i, ca=ca) -> Tensor:
                w, b = ca.qkv_proj.weight[:D], None if ca.qkv_proj.bias is None else ca.qkv_proj.bias[:D]
                q = F.linear(y, w, b).view(N // beams, beams, H, d_k).transpose(1, 2)
                out = attend(q, memory_k[i], memory_v[i], memory_mask, ca.scale)
                return F.linear(out.transpose(1, 2).reshape(N, D), ca.out_proj.weight, ca.out_proj.bias)

            def feed_forward(y: Tensor, ff=ff) -> Tensor:
                h = ACTIVATIONS[ff.activation](F.linear(y, ff.linear1.weight, ff.linear1.bias))
                return F.linear(h, ff.linear2.weight, ff.linear2.bias)

            x = sublayer(layer, x, self_attention, layer.norm1)
            x = sublayer(layer, x, cross_attention, layer.norm2)
            x = sublayer(layer, x, feed_forward, layer.norm3)
        if model.decoder.norm is not None:
            x = model.decoder.norm(x)
        return model.generator(x)

    return step


def measure(model, Bs: int, S: int, length: int, position: int, repeats: int, backend: str) -> dict:
    """One step at position ``position`` for Bs sentences of S source tokens, 5 beams each."""
    from scratchformer.generation.fast_step import DecoderStep

    beams, N = 5, Bs * 5
    torch.manual_seed(0)
    memory, mask = torch.randn(Bs, S, model.config.d_model), torch.ones(Bs, S, dtype=torch.bool)
    mask[0, S // 2 :] = False  # one padded sentence
    tokens = torch.randint(3, model.config.tgt_vocab_size, (N, 1))
    eager = DecoderStep(model, memory, mask, N, length)
    for t in range(position):
        eager(tokens, t, beams)  # fills the cache up to the position
    # the static function's state: the eager step's cache and memory, laid out as it wants them
    H = eager.heads
    k_cache = [c.k[:N].clone() for c in eager.caches]  # positions past the filled ones zeroed:
    v_cache = [c.v[:N].clone() for c in eager.caches]  # weight 0 times an unset NaN would be NaN
    for cache in k_cache + v_cache:
        cache[:, :, position:] = 0
    memory_k = [k.view(Bs, H, S, -1) for k, _ in eager.memory_kv]
    memory_v = [v.view(Bs, H, S, -1) for _, v in eager.memory_kv]
    position_t, memory_mask = torch.tensor([position]), mask[:, None, None, :]
    state = (tokens[:, 0], position_t, k_cache, v_cache, memory_k, memory_v, memory_mask)
    function = static_step(model)
    start = time.perf_counter()
    compiled = torch.compile(function, backend=backend, fullgraph=True, dynamic=False)
    out = compiled(*state, beams)
    compile_s = time.perf_counter() - start
    ways = {
        "eager": lambda: eager(tokens, position, beams),
        "static": lambda: function(*state, beams),
        "compiled": lambda: compiled(*state, beams),
    }
    group = Group("decoder step", [Case("step", name, run, N) for name, run in ways.items()], repeats, 0)
    run_group(group, torch.device("cpu"), log=lambda line: None)
    ms = {case.impl: case.median * 1e3 for case in group.cases}
    return {
        "rows": N,
        "source_tokens": S,
        **{f"{name}_ms": round(value, 3) for name, value in ms.items()},
        "compiled_over_eager": round(ms["eager"] / ms["compiled"], 3),
        "compile_s": round(compile_s, 1),
        "max_logit_difference": float((out - eager(tokens, position, beams)).abs().max()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compiled_step", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--checkpoint", required=True, help="a trained translation checkpoint directory")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=300, help="timed steps of each way")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (eager: quick)")
    parser.add_argument("--out", help="also write the JSON lines to this file")
    args = parser.parse_args(argv)
    from torch._inductor import config as inductor_config

    from benchmarks.report import JsonLines
    from scratchformer.tasks.translation import load_translator

    torch.set_num_threads(args.threads)
    inductor_config.freezing = True
    model = load_translator(args.checkpoint, device="cpu").model.eval()
    with torch.inference_mode(), JsonLines(args.out) as lines:
        for Bs, S in ((1, 16), (32, 24)):
            row = measure(model, Bs, S, length=40, position=8, repeats=args.repeats, backend=args.backend)
            lines.add({"threads": args.threads, "backend": args.backend, **row})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
