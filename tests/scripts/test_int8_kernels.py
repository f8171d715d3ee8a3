"""benchmarks/int8_kernels.py: each way's error is measured against fp32 (zero for fp32 itself, small
for the kernel our int8 uses), at toy sizes."""

from __future__ import annotations

import json

import torch

from benchmarks import int8_kernels


def test_the_errors_are_measured_against_fp32() -> None:
    with torch.inference_mode():
        row = int8_kernels.measure(64, 96, rows=5, repeats=2)
    assert (row["rows"], row["in"], row["out"]) == (5, 64, 96)
    assert row["fp32_error"] == 0.0
    # int8 weights and a 7- or 8-bit input: ~1% of the largest output, never 0, never 20%
    assert 1e-4 < row["fbgemm_error"] < 0.05
    assert all(row[f"{way}_us"] > 0 for way in ("fp32", "fbgemm"))


def test_a_wrong_kernel_is_seen(monkeypatch) -> None:
    """The error can fail: a 'kernel' 10% off (as a saturating one) is seen."""
    monkeypatch.setattr(int8_kernels, "fbgemm_linear", lambda linear: lambda x: 0.9 * linear(x))
    with torch.inference_mode():
        row = int8_kernels.measure(64, 96, rows=5, repeats=1)
    assert row["fbgemm_error"] > 0.05


def test_the_command_writes_its_lines(tmp_path, capsys) -> None:
    out = tmp_path / "int8.jsonl"
    assert (
        int8_kernels.main(
            ["--d-model", "32", "--d-ff", "64", "--vocab", "50", "--repeats", "1", "--out", str(out)]
        )
        == 0
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["rows"], r["in"], r["out"]) for r in lines] == [
        (rows, i, o) for rows in (5, 160) for i, o in ((32, 96), (32, 64), (64, 32), (32, 50))
    ]
    assert all("machine" in r and r["fp32_error"] == 0.0 for r in lines)
    assert capsys.readouterr().out.count("\n") >= len(lines)
