"""Why ``ImageTop`` (the fine-tuned top of EfficientNet-Lite) computes in fp32 on a CPU even under bf16
autocast: one training step's forward and backward pass of the top ``--stages`` stages and head for
``--batch`` photos, fp32 against the same under bf16 autocast, interleaved in one process (medians).

    python -m benchmarks.image_top [--stages 3] [--batch 32] [--repeats 5]

On a CPU with native bf16 (AMX) oneDNN's bf16 depthwise convolutions are slower than fp32 (see the
captioning guide); the decoder still trains in bf16 there.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ beside src/

from benchmarks.harness import interleaved_medians  # noqa: E402
from scratchformer.models.image_encoder import ImageTop  # noqa: E402


def step(top: ImageTop, regions: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The top's layers, forward and backward, with autocast as asked (``ImageTop.forward`` itself
    turns autocast off on a CPU); the (B, 1280, G, G) output."""
    x = regions.transpose(1, 2).reshape(-1, top.in_channels, top.in_side, top.in_side)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        x = top.layers(x)
    x.float().square().mean().backward()
    return x.detach()


def measure(encoder: str, stages: int, batch: int, repeats: int) -> dict[str, float]:
    """Median seconds of a step in fp32 and under bf16 autocast, interleaved, and their ratio."""
    torch.manual_seed(0)
    top = ImageTop(encoder, stages)
    regions = torch.randn(batch, top.in_side**2, top.in_channels)
    times = interleaved_medians(
        {"fp32": lambda: step(top, regions, False), "bf16": lambda: step(top, regions, True)}, repeats
    )
    return {**times, "ratio": times["bf16"] / times["fp32"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoder", default="efficientnet-lite2")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    row = measure(args.encoder, args.stages, args.batch, args.repeats)
    print(
        f"{args.encoder}, top {args.stages} stages, {args.batch} photos, forward + backward; "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(f"  fp32: {row['fp32'] * 1e3:8.1f} ms   bf16 autocast: {row['bf16'] * 1e3:8.1f} ms")
    print(f"  bf16 autocast / fp32: {row['ratio']:.2f}x the time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
