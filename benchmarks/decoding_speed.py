"""Decoding speed as ratios measured in one run: the KV cache vs recomputing the prefix, and
beam search vs greedy.

    python -m benchmarks.decoding_speed [--batch 32] [--new-tokens 64] [--repeats 5]

A base-sized-in-width model (D=512, 8 heads, 6+6 layers, FFN 2048, V=8000; random weights, EOS
disabled so every row generates exactly --new-tokens tokens). The implementations are timed
round by round, interleaved (``benchmarks.harness.interleaved_times``), and the median is reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

import torch

import scratchformer as sf
from benchmarks.harness import interleaved_times
from scratchformer.generation import beam_search

BOS, EOS = 1, 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(0)
    cfg = sf.TransformerConfig(
        src_vocab_size=8000,
        tgt_vocab_size=8000,
        num_encoder_layers=args.layers,
        num_decoder_layers=args.layers,
        dropout=0.0,
        max_len=512,
    )
    model = sf.optimize(sf.Transformer(cfg).eval())
    with torch.no_grad():
        model.generator.bias[EOS] = -1e4  # never finish early: exactly --new-tokens steps
    src = torch.randint(3, 8000, (args.batch, 24))
    limits = {"max_len_a": 0.0, "max_len_b": args.new_tokens}

    runs = {
        "greedy, KV cache": lambda: sf.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, **limits),
        "greedy, recompute prefix": lambda: sf.greedy_decode(
            model, src, bos_id=BOS, eos_id=EOS, use_cache=False, **limits
        ),
        "beam 5, KV cache": lambda: beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=5, **limits),
    }
    for name, run in runs.items():  # warm-up
        out = run()
        if name.startswith("greedy"):
            assert out.shape[1] == args.new_tokens  # type: ignore[union-attr]
    times = interleaved_times(runs, args.repeats, warmup=0)

    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; "
        f"batch {args.batch}, {args.new_tokens} new tokens, {args.layers}+{args.layers} layers, D=512"
    )
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"  {name:<26} median {median[name]:.3f} s  (min {min(t):.3f}, max {max(t):.3f})")
    print(
        "cache speed-up (recompute / cache): "
        f"{median['greedy, recompute prefix'] / median['greedy, KV cache']:.1f}x"
    )
    print(
        "beam 5 cost per sentence relative to greedy: "
        f"{median['beam 5, KV cache'] / median['greedy, KV cache']:.1f}x"
    )


if __name__ == "__main__":
    main()
