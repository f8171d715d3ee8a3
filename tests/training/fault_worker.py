"""A small training run for tests/training/test_faults.py: ``python fault_worker.py OUT_DIR``.

It resumes OUT_DIR/last when there is one (the run was killed after a save), else starts afresh
(replacing whatever a run killed before its first save left). Each step sleeps a little, so that
a kill lands at a random point: in a step, in the log, or in the middle of a checkpoint save.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import nn

from scratchformer.training import TrainConfig, Trainer


class SlowToyTask:
    """Regression of a fixed random map; dropout in the model, so the RNG state matters."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(96, 6, generator=gen)
        self.y = self.x @ torch.randn(6, 1, generator=gen)

    def batches(self, epoch: int, seed: int) -> list[list[int]]:
        perm = torch.randperm(
            len(self.x), generator=torch.Generator().manual_seed(seed * 100 + epoch)
        ).tolist()
        return [perm[i : i + 8] for i in range(0, len(perm), 8)]

    def loss(self, model: nn.Module, batch: list[int], device: torch.device) -> tuple[torch.Tensor, int]:
        time.sleep(0.03)
        return nn.functional.mse_loss(model(self.x[batch]), self.y[batch]), len(batch)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        return {"loss": nn.functional.mse_loss(model(self.x), self.y).item()}

    def checkpoint_config(self) -> dict[str, str]:
        return {"kind": "toy"}

    def save_files(self, directory: Path) -> None:
        (directory / "extra.txt").write_text("tokenizer stand-in")


def main(out: Path) -> None:
    resume = any((out / name / "training_state.pt").is_file() for name in ("last", "last.old"))
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    config = TrainConfig(
        out_dir=str(out),
        epochs=4,
        lr=3e-3,
        warmup_steps=3,
        log_every=1,
        save_every=2,
        eval_every=8,
        progress=False,
        seed=7,
        device="cpu",  # the task keeps its tensors on the CPU
        overwrite=not resume,
    )
    Trainer(model, SlowToyTask(), config).fit(resume=resume)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
