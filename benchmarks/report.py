"""The results: a markdown table per group, the targets of issue 17, a bar chart of the ratios."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import torch

from benchmarks.harness import Case, Group
from benchmarks.suite import BERT, FAST, OURS, OURS_BERT, OURS_BERT_SKIP, OURS_SKIP, gpu_peak_tflops

MATMUL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def machine_description(device: torch.device) -> str:
    """One line: CPU model and its matmul-relevant flags, cores, threads, torch and transformers
    versions, GPU if used."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())  # the first processor's
    except OSError:
        pass
    cpu = info.get("model name") or platform.processor() or platform.machine()
    present = set(info.get("flags", "").split())
    flags = " ".join(f for f in MATMUL_FLAGS if f in present) if present else "unknown"
    import transformers

    text = (
        f"{cpu} (flags: {flags or 'none of ' + ' '.join(MATMUL_FLAGS)}), {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads; "
        f"torch {torch.__version__}, transformers {transformers.__version__}; "
        f"Python {platform.python_version()}"
    )
    if device.type == "cuda":
        text += f"; GPU {torch.cuda.get_device_name(device)}"
    return text


class JsonLines:
    """Rows printed as JSON lines as they come, each with the machine, and written to ``out`` (if
    given) at the end: ``with JsonLines(out) as lines: lines.add(row)``."""

    def __init__(self, out: str | Path | None):
        self.out, self.lines = out, []
        self.machine = machine_description(torch.device("cpu"))

    def add(self, row: dict) -> None:
        self.lines.append(json.dumps({"machine": self.machine, **row}))
        print(self.lines[-1], flush=True)

    def __enter__(self) -> JsonLines:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.out and exc[0] is None:
            Path(self.out).write_text("\n".join(self.lines) + "\n")


def measured_peaks(groups: list[Group]) -> dict[str, float]:
    """FLOP/s of the fastest large matmul round, per precision ("fp32", "bf16")."""
    peaks = {}
    for group in groups:
        if group.name == "matmul peak":
            for case in group.cases:
                peaks[case.precision] = case.flops / min(case.times)
    return peaks


def _find(group: Group, impl: str) -> Case | None:
    return next((c for c in group.cases if c.impl == impl), None)


def _ratio(case: Case, ref: Case) -> float:
    """How many times faster ``case`` is than ``ref`` (throughput ratio, from the medians)."""
    return (
        (case.tokens / case.median) / (ref.tokens / ref.median) if case.tokens else ref.median / case.median
    )


def _ms(case: Case) -> str:
    return f"{case.median * 1e3:.1f} ({min(case.times) * 1e3:.1f}-{max(case.times) * 1e3:.1f})"


def write_markdown(
    path: Path,
    groups: list[Group],
    machine: str,
    command: str,
    elapsed: float,
    met: list[dict[str, object]],
    progress: str = "",
) -> str:
    """The tables; ``progress`` (e.g. "partial: 3 of 13 jobs") is said after the command."""
    peaks = measured_peaks(groups)
    lines = [
        f"# scratchformer benchmark ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {machine}.  ",
        f"Command: `{command}` ({elapsed / 60:.1f} min{'; ' + progress if progress else ''}).  ",
        (
            "Implementations interleaved round by round in one process after a warm-up; median time over the "
            "rounds (min-max in brackets). Ratios are throughput ratios to the reference in the same run "
            "(> 1 = faster). GFLOP/s counts 2 x (linear-layer weights) x tokens + 4 x L^2 x D per layer and "
            "sequence for attention (x 3 for a training step), real tokens only; % of peak is against the "
            "matmul peak measured in the same run."
        ),
    ]
    if peaks:
        lines.append("")
        lines.append(
            "Measured matmul peak: " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peaks.items())
        )
    for group in groups:
        lines += ["", f"## {group.title}", ""]
        if not group.cases:  # a group not run: its note says why
            lines += [f"({group.note})"]
            continue
        if group.note:
            lines += [f"({group.note}; {group.repeats} rounds)", ""]
        else:
            lines += [f"({group.repeats} rounds)", ""]
        lines += [
            "| row | implementation | median ms (min-max) | tokens/s | vs reference | GFLOP/s | % of peak |",
            "|---|---|---|---|---|---|---|",
        ]
        for case in group.cases:
            refs = [r for r in (_find(group, name) for name in case.references) if r is not None]
            vs = "; ".join(f"**{_ratio(case, r):.2f}x** {r.impl}" for r in refs) or "-"
            gflops = f"{case.gflops:.0f}" if case.flops else "-"
            peak = peaks.get(case.precision)
            if case.flops and group.name == "matmul peak":
                pct = "100 (best round)" if peak else "-"
            elif (
                case.flops
                and case.precision == "bf16"
                and "GPT-2" in group.name
                and torch.cuda.is_available()
            ):
                card = gpu_peak_tflops(torch.device("cuda"))
                pct = f"{case.gflops / peak * 1e9 * 100:.0f}" if peak else "-"
                if card:
                    pct += f" (MFU {case.gflops / (card * 1e3) * 100:.0f}% of the card's {card:.0f} TFLOP/s)"
            else:
                pct = f"{case.gflops / peak * 1e9 * 100:.0f}" if case.flops and peak else "-"
            tps = f"{case.tokens_per_s:,.0f}" if case.tokens else "-"
            lines.append(f"| {case.row} | {case.impl} | {_ms(case)} | {tps} | {vs} | {gflops} | {pct} |")
    if met:
        lines += ["", "## Targets (issue 17)", "", "| target | measured | goal | met |", "|---|---|---|---|"]
        for t in met:
            lines.append(
                f"| {t['target']} | {t['value']:.2f} | {t['goal']} | {'yes' if t['met'] else '**no**'} |"
            )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def targets(groups: list[Group]) -> list[dict[str, object]]:
    """The issue's targets, each with the measured value (ratios: > 1 = ours faster), per precision."""
    out: list[dict[str, object]] = []
    peaks = measured_peaks(groups)
    batch_8 = any("batch 8," in g.name for g in groups)  # else (smoke sizes) every decoding group is scored

    def add(target: str, value: float, goal: float) -> None:
        out.append({"target": target, "value": value, "goal": f">= {goal}", "met": value >= goal})

    for g in groups:
        p = g.precision
        if g.name.startswith("encoder inference B"):
            row = g.name.removeprefix("encoder inference ")
            ours, fast, bert = _find(g, OURS_SKIP) or _find(g, OURS), _find(g, FAST), _find(g, BERT)
            ours_bert = _find(g, OURS_BERT_SKIP) or _find(g, OURS_BERT)
            if ours and fast:
                add(f"{row}, {p}: {ours.impl} vs {FAST}", _ratio(ours, fast), 1.0)
            if ours_bert and bert:
                add(f"{row}, {p}: {ours_bert.impl} vs {BERT}", _ratio(ours_bert, bert), 1.0)
            skip, plain = _find(g, OURS_SKIP), _find(g, OURS)
            if skip and plain:
                add(f"{row}, {p}: real tokens/s, skip_padding vs our padded", _ratio(skip, plain), 1.25)
            if plain and "padding" not in row and plain.tokens >= 4096 and peaks.get(p):
                add(
                    f"{row}, {p}: {OURS}, % of the measured {p} matmul peak",
                    plain.flops / plain.median / peaks[p] * 100,
                    {"fp32": 85.0, "bf16": 60.0}[p],
                )
        elif g.name.startswith("encoder training"):
            for ours_name, ref_name in ((OURS, "torch.nn"), (OURS_BERT, BERT)):
                ours, ref = _find(g, ours_name), _find(g, ref_name)
                if ours and ref:
                    add(f"training step, {p}: {ours_name} vs {ref_name}", _ratio(ours, ref), 1.0)
        elif g.name.startswith("encoder-decoder training"):
            ours, ref = g.cases[0], g.cases[1]
            add(f"training step, {p}: {ours.impl} vs {ref.impl}", _ratio(ours, ref), 1.0)
        elif g.name.startswith("decoding batch 8") or (g.name.startswith("decoding") and not batch_8):
            cache, recompute = _find(g, "greedy, KV cache"), _find(g, "greedy, recompute prefix")
            if cache and recompute:
                add(f"{g.name}, {p}: KV cache vs recompute", _ratio(cache, recompute), 6.0)
    return out


def write_png(path: Path, groups: list[Group], machine: str) -> None:
    """Horizontal bars: each case's throughput ratio to its first reference (1 = as fast)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ratios = [], []
    for group in groups:
        for case in group.cases:
            ref = next((r for r in (_find(group, n) for n in case.references) if r is not None), None)
            if ref is not None:
                labels.append(f"{group.title.removeprefix('encoder inference ')}: {case.impl} / {ref.impl}")
                ratios.append(_ratio(case, ref))
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(labels) + 1.6))
    colors = ["tab:green" if r >= 1 else "tab:red" for r in ratios]
    ax.barh(range(len(labels)), ratios, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("throughput ratio to the reference (same run; > 1 = faster)")
    for i, r in enumerate(ratios):
        ax.text(r, i, f" {r:.2f}x", va="center", fontsize=7)
    ax.set_title(machine, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
