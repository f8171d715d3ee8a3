"""On a CUDA GPU: does a run interrupted and resumed equal the uninterrupted one, in fp32, fp16 and bf16?

A toy regression (dropout, gradient accumulation 2, clipping at 1.0) trains 20 optimizer steps on
``--device`` with ``deterministic: true``; a second run is stopped after step 13 and resumed from its
``last/`` checkpoint (saved every 5 steps). Printed per precision, as JSON Lines: whether the resumed
losses equal the uninterrupted run's bit for bit, the GradScaler's skipped steps (fp16), and the
first clipped gradient norms, which under fp16 must be the unscaled ones (close to fp32's, not
thousands of times larger).

    python scripts/parity/cuda_resume_check.py            # needs a CUDA GPU
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

import scratchformer.training.trainer as trainer_module
from scratchformer.training import TrainConfig, Trainer


class ToyTask:
    """y = x W on 64 fixed random rows, 8 rows a batch, shuffled per epoch by the seed."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 6, generator=gen)
        self.y = self.x @ torch.randn(6, 1, generator=gen)

    def batches(self, epoch: int, seed: int) -> list[list[int]]:
        order = torch.randperm(64, generator=torch.Generator().manual_seed(seed * 100 + epoch)).tolist()
        return [order[i : i + 8] for i in range(0, 64, 8)]

    def loss(self, model, batch, device):
        return nn.functional.mse_loss(model(self.x[batch].to(device)).float(), self.y[batch].to(device)), len(
            batch
        )

    def evaluate(self, model, device):
        return {"loss": nn.functional.mse_loss(model(self.x.to(device)).float(), self.y.to(device)).item()}

    def checkpoint_config(self):
        return {"kind": "toy"}

    def save_files(self, directory: Path) -> None:
        pass


class Stop(Exception):
    pass


def toy_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    norms: list[float] = []
    clip = nn.utils.clip_grad_norm_

    def recording_clip(parameters, max_norm):
        norm = clip(parameters, max_norm)
        norms.append(float(norm))
        return norm

    trainer_module.nn.utils.clip_grad_norm_ = recording_clip  # what the trainer clips: the norm it sees
    root = Path(tempfile.mkdtemp())
    for precision in ("fp32", "fp16", "bf16"):
        config = dict(
            epochs=5,
            grad_accum=2,
            lr=3e-3,
            warmup_steps=3,
            progress=False,
            seed=7,
            save_every=5,
            eval_every=4,
            precision=precision,
            device=args.device,
            deterministic=True,
            grad_clip=1.0,
        )
        norms.clear()
        full = Trainer(
            toy_model(), ToyTask(), TrainConfig(out_dir=str(root / precision / "full"), **config)
        ).fit()
        first_norms = norms[:3]

        def stop_after_13(step: int, loss: float) -> None:
            if step == 13:
                raise Stop

        cut = TrainConfig(out_dir=str(root / precision / "cut"), **config)
        try:
            Trainer(toy_model(), ToyTask(), cut).fit(on_step=stop_after_13)
        except Stop:
            pass
        resumed = Trainer(toy_model(), ToyTask(), cut).fit(resume=True)
        print(
            json.dumps(
                {
                    "precision": precision,
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                    "steps": full.step,
                    "resumed_steps": len(resumed.losses),
                    "resume_equals_uninterrupted": resumed.losses == full.losses[-len(resumed.losses) :]
                    and resumed.best == full.best,
                    "skipped_steps": full.skipped_steps,
                    "first_clipped_norms": [round(n, 4) for n in first_norms],
                }
            )
        )
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
