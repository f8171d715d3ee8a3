"""The benchmark suite at its "smoke" size, so that it cannot rot (the full size is not a test)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from machine_switch import machine_has_native_bf16

from benchmarks import run
from benchmarks.harness import Case, Group, run_group
from benchmarks.suite import padded_lengths


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=pytest.mark.machine)])
def test_smoke_run_writes_table_chart_and_raw_timings(tmp_path: Path, native: bool, monkeypatch) -> None:
    """Every row in both precisions; where this CPU would emulate bf16 (AVX2 only), the bf16 groups
    are a note instead (test_bf16_rows_are_a_note_where_bf16_would_be_emulated), the rest the same.
    Both cases on every machine: bf16 rows run only where this CPU has native bf16 (else minutes)."""
    if native and not machine_has_native_bf16():
        pytest.skip("bf16 rows: this CPU has no native bf16 (emulated, they would take minutes)")
    monkeypatch.setattr(run, "native_bf16", lambda device: native)
    groups = "peak,inference,training,seq2seq,decoding,precision"
    raw = run.main(
        ["--size", "smoke", "--only", groups, "--repeats", "2", "--in-process", "--out", str(tmp_path)]
    )
    md = (tmp_path / "smoke-cpu.md").read_text()
    bf16 = ("encoder inference B4xT16, bf16", "encoder training step (forward, backward, AdamW), bf16")
    bf16 += ("decoding batch 2, 4 new tokens, bf16", "bf16 vs fp32")
    for header in (
        "matmul peak",
        "encoder inference B4xT16, 25% padding, fp32",
        "encoder-decoder training step",
        "Targets (issue 17)",
        *(bf16 if native else ("## inference, bf16\n\n(not run: this CPU has no AMX or AVX512_BF16",)),
    ):
        assert header in md
    assert (tmp_path / "smoke-cpu.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "smoke-cpu.json").read_text())
    assert saved["command"] == raw["command"]
    cases = [c for g in saved["groups"] for c in g["cases"]]
    assert len(cases) >= (80 if native else 45)  # (fp32 rows, the peak's two)
    assert all(
        len(c["times_s"]) == g["repeats"] >= 2 and min(c["times_s"]) > 0
        for g in saved["groups"]
        for c in g["cases"]
    )
    impls = {c["impl"] for c in cases}
    assert {
        "scratchformer Encoder, skip_padding",
        "torch.nn fast path",
        "transformers BertModel",
        "torch.nn.Transformer",
        "greedy, recompute prefix",
        "beam 5, KV cache",
    } <= impls
    by_precision = {
        p: [c for g in saved["groups"] if g["precision"] == p for c in g["cases"]] for p in ("fp32", "bf16")
    }
    assert len(by_precision["fp32"]) >= 40
    assert len(by_precision["bf16"]) == (len(by_precision["fp32"]) if native else 0)  # both, or a note
    assert all(c["precision"] == p for p, cs in by_precision.items() for c in cs)
    targets = saved["targets"]
    assert targets and all(t["value"] > 0 for t in targets)
    precisions = {"fp32", "bf16"} if native else {"fp32"}
    assert {t["target"].split(": ")[0].rsplit(", ", 1)[-1] for t in targets} == precisions


@pytest.mark.machine
@pytest.mark.skipif(
    os.environ.get("ATEN_CPU_CAPABILITY") == "default",
    reason="torch.compile's inductor generates no code for the plain C kernels (the pass on AVX2 CPUs)",
)
def test_one_precision_and_the_compile_time(tmp_path: Path) -> None:
    # bf16 where this CPU computes it, else fp32 (emulated bf16 would take minutes here)
    p, other = ("bf16", "fp32") if machine_has_native_bf16() else ("fp32", "bf16")
    run.main(
        ["--size", "smoke", "--only", "compile", "--precision", p, "--repeats", "1", "--out", str(tmp_path)]
    )
    md = (tmp_path / f"smoke-cpu-{p}.md").read_text()
    assert f"torch.compile vs eager, {p}" in md and other not in md.split("## ", 2)[-1]
    assert re.search(r"the first call compiled in \d+\.\d s", md)


def test_interleaving_and_padding_lengths() -> None:
    order: list[str] = []
    group = Group(
        "g", [Case("r", name, lambda name=name: order.append(name), 1) for name in "abc"], repeats=2
    )
    run_group(group, run.torch.device("cpu"), log=lambda _: None)
    assert order == list("abcbcacab")  # rotated every round, warm-up round included
    assert all(len(c.times) == 2 for c in group.cases)
    lengths = padded_lengths(32, 128, 0.25)
    assert sum(lengths) == 32 * 128 * 3 // 4 and max(lengths) <= 128 and min(lengths) >= 64


def test_bad_arguments_are_named() -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--only", "inference,bogus"])


def test_profile_of_one_row_names_every_implementation(tmp_path: Path) -> None:
    from benchmarks import profile

    profile.main(
        [
            "--size",
            "smoke",
            "--group",
            "training",
            "--row",
            "B2xT16",
            "--precision",
            "bf16",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    text = (tmp_path / "profile-training-B2xT16-bf16.txt").read_text()
    for impl in (
        "scratchformer Encoder",
        "torch.nn",
        "scratchformer ContextualEncoder",
        "transformers BertModel",
    ):
        assert f"== {impl}: " in text
    assert "aten::" in text
    with pytest.raises(SystemExit):
        profile.main(["--size", "smoke", "--group", "training", "--row", "B9xT9", "--out", str(tmp_path)])


def test_bf16_rows_are_a_note_where_bf16_would_be_emulated(monkeypatch) -> None:
    """On a CPU without native bf16 the bf16 groups (and bf16 vs fp32) are not run, and say why."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(run, "native_bf16", lambda device: False)
    for name, precision in (("inference", "bf16"), ("training", "bf16"), ("precision", "")):
        group = run.emulated_bf16(name, precision, cpu)
        assert group is not None and not group.cases and "no AMX or AVX512_BF16" in group.note
    assert run.emulated_bf16("inference", "fp32", cpu) is None
    monkeypatch.setattr(run, "native_bf16", lambda device: True)
    assert (
        run.emulated_bf16("inference", "bf16", cpu) is None
        and run.emulated_bf16("precision", "", cpu) is None
    )


def test_a_failed_group_is_a_note_and_the_others_are_kept(tmp_path: Path, monkeypatch) -> None:
    """One builder raising costs its own rows only: the reports name its error, the other groups
    keep their timings, and the run exits 1. Reports are written after each job (partial first)."""
    progress: list[str] = []
    write = run.write_reports

    def recording(*args, **kwargs):
        raw = write(*args, **kwargs)
        progress.append(raw["progress"])
        return raw

    def broken(size, device, precision):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setitem(run.BUILDERS, "training", broken)
    monkeypatch.setattr(run, "write_reports", recording)
    monkeypatch.setattr(run, "native_bf16", lambda device: False)
    argv = ["--size", "smoke", "--only", "peak,training", "--precision", "fp32", "--repeats", "1"]
    with pytest.raises(SystemExit, match="1 of 2 jobs failed"):
        run.main([*argv, "--in-process", "--out", str(tmp_path)])
    assert progress == ["partial: 1 of 2 jobs", ""]
    saved = json.loads((tmp_path / "smoke-cpu-fp32.json").read_text())
    peak, training = saved["groups"]
    assert peak["name"] == "matmul peak" and all(c["times_s"] for c in peak["cases"])
    assert training["cases"] == []
    assert training["note"] == "failed: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert f"({training['note']})" in (tmp_path / "smoke-cpu-fp32.md").read_text()
    with pytest.raises(SystemExit):  # nothing left to run is refused before any work
        run.parse_args(["--only", "gpt2"])
