"""The measurements behind three claims of the speed page (docs/speed.md), each against its reference
in one process (medians of interleaved repeats):

1. LayerNorm: the core module (the formula written out) vs ``FastLayerNorm`` (ATen's kernel), fp32
   and bf16, forward and forward + backward, at B32 x T128 x 512.
2. One query attending to S cached keys (a decoding step at batch 8, 8 heads, d_k 64) in bf16:
   ATen's fused kernel vs ``FastMultiHeadAttention``'s explicit formula in fp32.
3. bf16 error against fp64 of our encoder and of ``torch.nn``'s fast path (the benchmark's 6-layer
   encoder, the same weights, W^Q scaled by 6 so that attention is sharp, as in trained models):
   the fast path rounds the scores to bf16 before the softmax, our fused kernel keeps them in fp32.

    python -m benchmarks.fast_path_micro [--repeats 9]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and tests/ beside src/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import copy_into_reference, encoder_layer_pairing  # noqa: E402

import scratchformer as sf  # noqa: E402
from benchmarks.harness import interleaved_medians  # noqa: E402
from benchmarks.suite import SIZES, Models, fast_path  # noqa: E402


def layer_norm(repeats: int) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        core = sf.LayerNorm(512).to(dtype)
        fast = sf.optimize(copy.deepcopy(core))
        x = torch.randn(32, 128, 512, dtype=dtype)
        xg, grad = x.clone().requires_grad_(True), torch.randn_like(x)

        def step(module: torch.nn.Module) -> Callable[[], object]:
            return lambda: module(xg).backward(grad)

        with torch.inference_mode():
            fwd = interleaved_medians({"core": lambda: core(x), "fast": lambda: fast(x)}, repeats)
        both = interleaved_medians({"core": step(core), "fast": step(fast)}, repeats)
        print(
            f"LayerNorm {str(dtype)[6:]}: forward core {fwd['core'] * 1e3:.2f} ms, "
            f"fast {fwd['fast'] * 1e3:.2f} ms "
            f"({fwd['core'] / fwd['fast']:.1f}x); forward + backward core {both['core'] * 1e3:.2f} ms, "
            f"fast {both['fast'] * 1e3:.2f} ms ({both['core'] / both['fast']:.1f}x)"
        )


def single_query(repeats: int) -> None:
    for S in (24, 64):
        q = torch.randn(8, 8, 1, 64).bfloat16()
        k, v = torch.randn(8, 8, S, 64).bfloat16(), torch.randn(8, 8, S, 64).bfloat16()
        with torch.inference_mode():
            t = interleaved_medians(
                {
                    "fused": lambda: F.scaled_dot_product_attention(q, k, v),
                    "explicit fp32": lambda: sf.scaled_dot_product_attention(
                        q.float(), k.float(), v.float(), need_weights=True
                    )[0].bfloat16(),
                },
                repeats * 20,
            )
        print(
            f"one bf16 query, {S} keys: fused kernel {t['fused'] * 1e6:.0f} us, explicit in fp32 "
            f"{t['explicit fp32'] * 1e6:.0f} us ({t['fused'] / t['explicit fp32']:.1f}x)"
        )


def bf16_error() -> None:
    size = SIZES["full"]
    models = Models(size, torch.device("cpu"))
    with torch.no_grad():
        for layer in models.ours.layers:
            layer.self_attn.qkv_proj.weight[: size.d_model] *= 6.0
    for ours_layer, ref_layer in zip(models.ours.layers, models.torch.layers):
        copy_into_reference(encoder_layer_pairing(ours_layer, ref_layer))
    for B, T in size.shapes[:2]:
        x = torch.randn(B, T, size.d_model, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            exact = copy.deepcopy(models.ours).double()(x.double())
            ours = copy.deepcopy(models.ours).bfloat16()(x.bfloat16()).double()
            with fast_path(True):
                ref = copy.deepcopy(models.torch).bfloat16().eval()(x.bfloat16()).double()
        rel = [((y - exact).norm() / exact.norm()).item() for y in (ours, ref)]
        print(f"bf16 B{B}xT{T}, relative error vs fp64: ours {rel[0]:.4f}, torch.nn fast path {rel[1]:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    layer_norm(args.repeats)
    single_query(args.repeats)
    bf16_error()


if __name__ == "__main__":
    main()
