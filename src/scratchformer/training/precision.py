"""Which number format a run computes in: ``"auto"`` picks bf16 where the device computes it
natively and fp32 elsewhere.

bf16 halves the memory traffic of every matrix product, and where the hardware multiplies bf16
(Intel AMX or AVX512_BF16 on a CPU; a CUDA GPU of compute capability 8.0 or more) a training step
runs up to twice as fast as in fp32. Where it does not (AVX2-only CPUs: AMD before Zen 4, most
desktop and laptop chips, Intel servers before Cooper Lake), PyTorch emulates it, and the same step
runs about 20 times *slower* than in fp32. So a recipe says ``"precision": "auto"`` and the machine
decides; an explicit ``"bf16"`` on such a CPU still runs, after :func:`bf16_warning` has said so.

``"fp64"`` is for tests: every kernel computes in double precision, so a run gives the same
numbers to ~1e-12 on any CPU (tests/tasks/test_golden_runs.py).
"""

from __future__ import annotations

import os
import sys

import torch

from scratchformer.training.config import PRECISIONS, TrainConfig

__all__ = [
    "announce",
    "at_least_fp32",
    "bf16_warning",
    "cpu_has_native_bf16",
    "native_bf16",
    "no_native_bf16",
    "resolve_precision",
]

# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) below which it has no bf16 instructions
_ONEDNN_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpu_has_native_bf16() -> bool:
    """True where this CPU multiplies bf16 in hardware (AMX tiles or AVX512_BF16), and oneDNN is
    not capped below those instructions (``ONEDNN_MAX_CPU_ISA``, e.g. AVX2 to try AVX2 kernels)."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in _ONEDNN_WITHOUT_BF16:
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def native_bf16(device: torch.device) -> bool:
    """True where ``device`` computes bf16 natively: a CUDA GPU that supports it, a CPU with AMX
    or AVX512_BF16 (:func:`cpu_has_native_bf16`); False elsewhere (Apple's MPS included)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_native_bf16()
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision a run on ``device`` computes in: ``precision`` itself, but ``"auto"`` becomes
    ``"bf16"`` where the device has native bf16 (:func:`native_bf16`) and ``"fp32"`` elsewhere."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def no_native_bf16(device: torch.device) -> str:
    """What ``device`` lacks to compute bf16 natively, for a message (where :func:`native_bf16` is
    False)."""
    return "this CPU has no AMX or AVX512_BF16" if device.type == "cpu" else f"{device} has no native bf16"


def bf16_warning(precision: str, device: torch.device) -> str | None:
    """One line saying that bf16 will be many times slower than fp32 on ``device`` (None where it
    is not bf16, or the device computes bf16 natively)."""
    if precision != "bf16" or native_bf16(device):
        return None
    return (
        f"warning: precision 'bf16': {no_native_bf16(device)}, so bf16 is emulated and runs many "
        "times (~20x) slower than fp32 here; 'auto' or 'fp32' is faster"
    )


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32 where it is narrower (bf16, fp16 logits before a loss), else as it is (fp64
    stays fp64, so an fp64 run computes its loss in fp64 too)."""
    return x if x.dtype == torch.float64 else x.float()


def announce(config: TrainConfig, precision: str, device: torch.device, steps: str) -> None:
    """Before a run's first step, on stderr: where and how it computes (with its progress bar), and
    (always) a warning where bf16 will be emulated, many times slower than fp32."""
    warning = bf16_warning(precision, device)
    if warning:
        print(warning, file=sys.stderr)
    if config.progress:
        asked = " (auto)" if config.precision == "auto" else ""
        threads = torch.get_num_threads()
        print(
            f"training on {device}, precision {precision}{asked}, {threads} threads, {steps}", file=sys.stderr
        )
