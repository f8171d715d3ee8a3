"""Which int8 matrix product should an int8 decoder step use on this CPU? For each linear map of a
translator's decoder step (D=256, d_ff=1024, V=8000 by default) at 5 and 160 rows, three ways:

- ``fp32``: x W^T + b in fp32 (MKL), the reference of time and of error;
- ``fbgemm``: PyTorch's dynamic quantization (``quantize_int8``'s kernel: int8 weights, one scale
  per row; the input quantized per call, 7-bit on CPUs without VNNI);
- ``onednn``: oneDNN's quantized linear (``torch.ops.onednn.qlinear_pointwise``, what the X86
  inductor quantizer lowers to): the same int8 weights, the input quantized per call to uint8.

::

    python -m benchmarks.int8_kernels [--threads 2] [--d-model 256 --d-ff 1024 --vocab 8000] \\
        [--out FILE]

Prints one JSON line per shape (``--out`` also writes them there, the machine in each): each way's
median microseconds (the input's quantization included) and its largest error against fp32,
relative to fp32's largest output. On CPUs without VNNI
(AVX2 only) oneDNN multiplies uint8 by int8 with ``vpmaddubsw``, whose int16 sums saturate:
its error is the known pitfall of int8 there.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from benchmarks.harness import Case, Group, run_group


def onednn_linear(linear: nn.Linear, rows: int) -> Callable[[Tensor], Tensor]:
    """``linear`` by oneDNN's int8 GEMM: W to int8 with one scale per row (symmetric), x to uint8
    with one scale and zero point per call (asymmetric, its min and max)."""
    weight = linear.weight.detach()
    w_scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
    w_int8 = (weight / w_scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(w_int8, [rows, weight.shape[1]])
    w_zero = torch.zeros(weight.shape[0], dtype=torch.long)
    bias = None if linear.bias is None else linear.bias.detach()

    def forward(x: Tensor) -> Tensor:
        low, high = torch.aminmax(x)
        low, high = low.clamp(max=0), high.clamp(min=0)
        scale = ((high - low) / 255).clamp_min(1e-12)
        zero = (-low / scale).round()
        x_uint8 = (x / scale + zero).round_().clamp_(0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise.tensor(
            x_uint8, scale, zero.long(), packed, w_scale, w_zero, bias, 1.0, 0, torch.float32, "none", [], ""
        )

    return forward


def fbgemm_linear(linear: nn.Linear) -> nn.Module:
    """``linear`` dynamically quantized by :func:`~scratchformer.fast.quantized.quantize_int8`."""
    from scratchformer.fast.quantized import quantize_int8

    return quantize_int8(nn.Sequential(linear))[0]


def measure(in_features: int, out_features: int, rows: int, repeats: int) -> dict:
    """One linear map (weights as a trained Transformer's: N(0, 1/sqrt(in))) at ``rows`` rows."""
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features)
    nn.init.normal_(linear.weight, std=in_features**-0.5)
    x = torch.randn(rows, in_features)
    ways: dict[str, Callable[[Tensor], Tensor]] = {"fp32": linear, "fbgemm": fbgemm_linear(linear)}
    try:
        ways["onednn"] = onednn_linear(linear, rows)
    except (AttributeError, RuntimeError) as error:  # a torch without oneDNN's int8 ops
        print(f"onednn: not available ({error})")
    reference = linear(x)
    shape = f"{rows} x {in_features} -> {out_features}"
    cases = [Case(shape, name, partial(way, x), rows) for name, way in ways.items()]
    run_group(Group("int8 kernels", cases, repeats, warmup=5), torch.device("cpu"), log=lambda line: None)
    row: dict = {"rows": rows, "in": in_features, "out": out_features}
    for case in cases:
        row[f"{case.impl}_us"] = round(case.median * 1e6, 1)
        error = (ways[case.impl](x) - reference).abs().max() / reference.abs().max()
        row[f"{case.impl}_error"] = round(float(error), 5)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.int8_kernels", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--out", help="also write the JSON lines to this file")
    args = parser.parse_args(argv)
    from benchmarks.report import JsonLines

    torch.set_num_threads(args.threads)
    D, F, V = args.d_model, args.d_ff, args.vocab
    with torch.inference_mode(), JsonLines(args.out) as lines:
        for rows in (5, 160):
            for features in ((D, 3 * D), (D, F), (F, D), (D, V)):
                lines.add({"threads": args.threads, **measure(*features, rows, args.repeats)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
