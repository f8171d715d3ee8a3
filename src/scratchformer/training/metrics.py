"""Training metrics: one JSON object per line (``metrics.jsonl``), the same numbers as TensorBoard
event files when asked, and curves drawn from the log."""

from __future__ import annotations

import json
import numbers
import shutil
from pathlib import Path
from typing import Any

from scratchformer.training.checkpoint import write_text_atomically

__all__ = ["MetricsLog", "RunLog", "TensorBoardLog", "plot_curves"]


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
        write_text_atomically(
            self.path, "".join(json.dumps(r) + "\n" for r in kept)
        )  # a kill never cuts it short


class TensorBoardLog:
    """The numbers of each log record as TensorBoard scalars, under the record's own names ("loss",
    "lr", "items_per_s", "eval/bleu", ...) at its step, in event files in ``directory``.

    ``purge_step``: a resumed run passes its first new step; TensorBoard then hides what earlier
    processes wrote from that step on (as :meth:`MetricsLog.truncate_after` drops it from the log).
    """

    NOT_SCALARS = ("step", "epoch")

    def __init__(self, directory: str | Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # (only here: tensorboard is an optional package)

        self.writer = SummaryWriter(log_dir=str(directory), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if (
                key not in self.NOT_SCALARS
                and isinstance(value, numbers.Real)
                and not isinstance(value, bool)
            ):
                self.writer.add_scalar(key, value, global_step=record["step"])
        self.writer.flush()  # on disk with the JSONL line (a killed run keeps both)

    def close(self) -> None:
        self.writer.close()


class RunLog:
    """Where the trainer's log records go: ``out_dir/metrics.jsonl``, and TensorBoard event files in
    ``out_dir/tensorboard/`` when ``tensorboard``. Written by rank 0 alone (the trainer's rule)."""

    def __init__(self, out_dir: str | Path, tensorboard: bool = False):
        self.jsonl = MetricsLog(Path(out_dir) / "metrics.jsonl")
        self.tensorboard_dir = Path(out_dir) / "tensorboard" if tensorboard else None
        self.tensorboard: TensorBoardLog | None = None

    def start(self, step: int) -> None:
        """Open the log of a run that continues after ``step`` (0: a fresh run, which starts afresh)."""
        if step:
            self.jsonl.truncate_after(step)
        elif self.jsonl.path.exists():
            self.jsonl.path.unlink()
        if self.tensorboard_dir is not None:
            if not step:
                shutil.rmtree(self.tensorboard_dir, ignore_errors=True)
            self.tensorboard = TensorBoardLog(self.tensorboard_dir, purge_step=step + 1 if step else None)

    def write(self, record: dict[str, Any]) -> None:
        self.jsonl.write(record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def records(self) -> list[dict[str, Any]]:
        return self.jsonl.records()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


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
