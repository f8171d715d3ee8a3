"""The training runs of tests/training/test_distributed.py, one process per rank (launched by torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/training/ddp_worker.py OUT SCENARIO...

Scenarios (each writes under OUT/SCENARIO/):
    equivalence  dropout 0, batch 4 per rank, 2 micro-batches accumulated, 12 steps; every rank
                 writes its final parameters (params-rankR.safetensors) and the losses.
    full         dropout 0.2, 5 epochs, save_every 5: the uninterrupted run.
    crash        as full, but rank 1 raises at step 13 (after last/ was saved at step 10).
    resume       continues crash/ (last/, step 10) with every rank's weights scrambled first.
    on_main      every rank writes the WordPiece tokenizer that on_main gave it, and the error it
                 got when the function run on rank 0 raised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from scratchformer.data.tokenization import train_wordpiece
from scratchformer.training import TrainConfig, Trainer, distributed

N_EXAMPLES = 64


class EqualBatchTask:
    """Regression of a fixed random linear map. Batches are consecutive slices of one random
    permutation per epoch, all of the same size: with batch b, slices 2k and 2k+1 together are
    slice k of batch 2b, so two ranks with b see exactly the data of one process with 2b."""

    def __init__(self, batch: int):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(N_EXAMPLES, 6, generator=gen)
        self.y = self.x @ torch.randn(6, 1, generator=gen) + 0.1 * torch.randn(N_EXAMPLES, 1, generator=gen)
        if N_EXAMPLES % batch:
            raise ValueError(f"batch {batch} must divide {N_EXAMPLES}")
        self.batch = batch

    def batches(self, epoch: int, seed: int) -> list[list[int]]:
        perm = torch.randperm(
            N_EXAMPLES, generator=torch.Generator().manual_seed(seed * 100 + epoch)
        ).tolist()
        return [perm[i : i + self.batch] for i in range(0, N_EXAMPLES, self.batch)]

    def loss(self, model: nn.Module, batch: list[int], device: torch.device) -> tuple[Tensor, int]:
        return nn.functional.mse_loss(model(self.x[batch].to(device)), self.y[batch].to(device)), len(batch)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        return {"loss": nn.functional.mse_loss(model(self.x.to(device)), self.y.to(device)).item()}

    def checkpoint_config(self) -> dict[str, Any]:
        return {"kind": "toy"}

    def save_files(self, directory: Path) -> None:
        pass


def toy_model(dropout: float) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1))


def equivalence_config(out: Path, **overrides: Any) -> TrainConfig:
    settings: dict[str, Any] = {
        "out_dir": str(out),
        "epochs": 3,
        "lr": 1e-2,
        "warmup_steps": 3,
        "log_every": 1,
        "progress": False,
        "seed": 7,
        "grad_accum": 2,
        "device": "cpu",
    }
    return TrainConfig(**{**settings, **overrides})


def resume_config(out: Path) -> TrainConfig:
    return TrainConfig(
        out_dir=str(out),
        epochs=5,
        lr=3e-3,
        warmup_steps=3,
        log_every=1,
        progress=False,
        seed=7,
        grad_accum=2,
        save_every=5,
        eval_every=4,
        device="cpu",
    )


def write_losses(out: Path, losses: list[float]) -> None:
    (out / f"losses-rank{distributed.world().rank}.json").write_text(json.dumps(losses))


def run(out: Path, scenario: str) -> None:
    rank = distributed.world().rank
    if scenario == "equivalence":
        model = toy_model(dropout=0.0)
        result = Trainer(model, EqualBatchTask(batch=4), equivalence_config(out)).fit()
        save_file(
            {k: v.contiguous() for k, v in model.state_dict().items()},
            str(out / f"params-rank{rank}.safetensors"),
        )
        write_losses(out, result.losses)
    elif scenario == "full":
        write_losses(out, Trainer(toy_model(0.2), EqualBatchTask(batch=4), resume_config(out)).fit().losses)
    elif scenario == "crash":

        def fail_on_rank_1(step: int, loss: float) -> None:
            if step == 13 and rank == 1:
                raise RuntimeError("deliberate failure on rank 1 at step 13")

        Trainer(toy_model(0.2), EqualBatchTask(batch=4), resume_config(out)).fit(on_step=fail_on_rank_1)
    elif scenario == "resume":
        model = toy_model(0.2)
        with torch.no_grad():  # resuming must not depend on any rank's fresh weights
            for p in model.parameters():
                p.add_(1.0 + rank)
        result = Trainer(model, EqualBatchTask(batch=4), resume_config(out.parent / "crash")).fit(resume=True)
        out.mkdir(parents=True, exist_ok=True)
        write_losses(out, result.losses)
    elif scenario == "on_main":
        out.mkdir(parents=True, exist_ok=True)
        texts = [f"review {i} of a film that was {'great' if i % 3 else 'dull'} and long" for i in range(200)]
        tokenizer = distributed.on_main(lambda: train_wordpiece(texts, 120))
        (out / f"tokenizer-rank{rank}.json").write_text(tokenizer.to_str())
        try:
            distributed.on_main(lambda: 1 // 0)
        except (ZeroDivisionError, RuntimeError) as error:
            (out / f"error-rank{rank}.txt").write_text(f"{type(error).__name__}: {error}")
    else:
        raise ValueError(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    root = Path(sys.argv[1])
    distributed.init("cpu")
    for name in sys.argv[2:]:
        run(root / name, name)
    distributed.destroy()
