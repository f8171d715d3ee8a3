"""benchmarks/image_top.py times what it names: its bf16 step computes in bf16 (the top's own forward
would not), its fp32 step is the top's forward, at toy sizes."""

from __future__ import annotations

import torch

from benchmarks import image_top
from scratchformer.models.image_encoder import ImageTop


def test_the_bf16_step_is_bf16_and_the_fp32_step_is_the_top() -> None:
    torch.manual_seed(0)
    top = ImageTop("efficientnet-lite0", 1)
    regions = torch.randn(2, 49, 192)
    fp32, bf16 = image_top.step(top, regions, False), image_top.step(top, regions, True)
    assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(fp32.flatten(2).transpose(1, 2), top(regions), rtol=0, atol=0)


def test_the_command_prints_the_ratio(capsys) -> None:
    args = ["--encoder", "efficientnet-lite0", "--stages", "1", "--batch", "2", "--repeats", "1"]
    assert image_top.main(args) == 0
    assert "bf16 autocast / fp32:" in capsys.readouterr().out
