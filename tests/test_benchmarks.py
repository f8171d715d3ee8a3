"""The benchmark suite at its "smoke" size, so that it cannot rot (the full size is not a test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.harness import Case, Group, run_group
from benchmarks.suite import padded_lengths


def test_smoke_run_writes_table_chart_and_raw_timings(tmp_path: Path) -> None:
    groups = "peak,inference,training,seq2seq,decoding,precision"
    raw = run.main(["--size", "smoke", "--only", groups, "--repeats", "2", "--out", str(tmp_path)])
    md = (tmp_path / "smoke-cpu.md").read_text()
    for header in ("matmul peak", "encoder inference B4xT16, 25% padding", "encoder training step",
                   "encoder-decoder training step", "decoding batch 2", "bf16 vs fp32", "Targets (issue 7)"):
        assert header in md
    assert (tmp_path / "smoke-cpu.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "smoke-cpu.json").read_text())
    assert saved["command"] == raw["command"]
    cases = [c for g in saved["groups"] for c in g["cases"]]
    assert len(cases) >= 40
    assert all(len(c["times_s"]) == g["repeats"] >= 2 and min(c["times_s"]) > 0
               for g in saved["groups"] for c in g["cases"])
    impls = {c["impl"] for c in cases}
    assert {"scratchformer Encoder, skip_padding", "torch.nn fast path", "transformers BertModel",
            "torch.nn.Transformer", "greedy, recompute prefix", "beam 5, KV cache"} <= impls
    assert saved["targets"] and all(t["value"] > 0 for t in saved["targets"])


def test_interleaving_and_padding_lengths() -> None:
    order: list[str] = []
    group = Group("g", [Case("r", name, lambda name=name: order.append(name), 1) for name in "abc"], repeats=2)
    run_group(group, run.torch.device("cpu"), log=lambda _: None)
    assert order == list("abc" "bca" "cab")  # rotated every round, warm-up round included
    assert all(len(c.times) == 2 for c in group.cases)
    lengths = padded_lengths(32, 128, 0.25)
    assert sum(lengths) == 32 * 128 * 3 // 4 and max(lengths) <= 128 and min(lengths) >= 64


def test_bad_arguments_are_named() -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--only", "inference,bogus"])
