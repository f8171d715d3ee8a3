"""Training metrics: one JSON object per line (``metrics.jsonl``), and curves drawn from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scratchformer.training.checkpoint import write_text_atomically

__all__ = ["MetricsLog", "plot_curves"]


class MetricsLog:
    """Append-only JSONL log; ``records`` reads it back (so a resumed run keeps its history)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def records(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (a resumed run rewrites them)."""
        kept = [r for r in self.records() if r.get("step", 0) <= step]
        write_text_atomically(self.path, "".join(json.dumps(r) + "\n" for r in kept))  # a kill never cuts it short


def plot_curves(records: list[dict[str, Any]], path: str | Path, title: str = "") -> None:
    """Training loss (and eval metrics) against the optimizer step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "loss" in r]
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    eval_keys = sorted({k for r in evals for k in r if k.startswith("eval/")})
    fig, axes = plt.subplots(1, 2 if eval_keys else 1, figsize=(11 if eval_keys else 6, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=0.8, label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title or "training loss")
    ax.grid(alpha=0.3)
    if eval_keys:
        ax2 = axes[0][1]
        for key in eval_keys:
            points = [(r["step"], r[key]) for r in evals if key in r]
            ax2.plot(*zip(*points), marker="o", ms=3, label=key.removeprefix("eval/"))
        ax2.set_xlabel("step")
        ax2.set_title("evaluation")
        ax2.grid(alpha=0.3)
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
